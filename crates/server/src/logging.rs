//! The server's log (README.md § Logs): `tracing` events written to stderr by
//! `tracing-subscriber`, as text or as one JSON object per line (`--log-format`), filtered by
//! `RUST_LOG` (`EnvFilter` syntax, e.g. `info,tandem::access=warn`) or else `--log-level`.
//!
//! Targets: `tandem::access` (one line per request, [`crate::access_log`]), `tandem::engine`
//! (the periodic throughput line, [`crate::engine_log`]), `tandem_server::*` (startup, drain,
//! connection errors).

use std::io::IsTerminal;
use std::str::FromStr;

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable: time, level, target, message, `key=value` fields.
    #[default]
    Text,
    /// One JSON object per line, the fields under `"fields"`.
    Json,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("unknown log format `{other}` (text or json)")),
        }
    }
}

/// Installs the global subscriber writing to stderr: the filter is `RUST_LOG` when set, else
/// `level` (e.g. `info`, `debug`, `tandem::access=warn,info`). Fails on a bad filter or when a
/// subscriber is already installed.
pub fn init(format: LogFormat, level: &str) -> Result<(), String> {
    let colours = std::io::stderr().is_terminal();
    install(format, level, std::io::stderr, colours)
}

/// [`init`] writing to `writer`, without colours (tests capture the log this way).
pub fn init_with_writer<W>(format: LogFormat, level: &str, writer: W) -> Result<(), String>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    install(format, level, writer, false)
}

/// Installs the subscriber; `colours`: ANSI colours in the text format (on a terminal only).
fn install<W>(format: LogFormat, level: &str, writer: W, colours: bool) -> Result<(), String>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.trim().is_empty() => EnvFilter::try_new(spec),
        _ => EnvFilter::try_new(level),
    }
    .map_err(|e| format!("bad log filter: {e}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colours)
        .with_writer(writer);
    let installed = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    installed.map_err(|e| format!("cannot install the logger: {e}"))
}
