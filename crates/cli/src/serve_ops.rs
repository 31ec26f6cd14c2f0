//! `tandem serve`'s operational flags: connection timeouts and cap, the drain on SIGTERM, the
//! log (README.md § serve, § Logs).

use std::time::Duration;

use anyhow::{bail, Result};
use clap::Args;
use tandem_server::connections::{
    ConnectionLimits, DEFAULT_BODY_TIMEOUT, DEFAULT_HEADER_TIMEOUT, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_WRITE_TIMEOUT,
};
use tandem_server::logging::{self, LogFormat};
use tandem_server::ServerConfig;

#[derive(Debug, Args)]
pub struct OpsArgs {
    /// Seconds a connection may take to send a request head, also between two requests of a
    /// kept-alive connection (then it is closed).
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_HEADER_TIMEOUT.as_secs_f64())]
    header_timeout: f64,
    /// Seconds a request body may take to arrive in full (then 408 and the connection closes).
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_BODY_TIMEOUT.as_secs_f64())]
    body_timeout: f64,
    /// Seconds a response's writes may stay blocked because the client reads nothing (then
    /// the connection closes and its request is aborted); a slow reader that keeps reading
    /// is served at its pace.
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_WRITE_TIMEOUT.as_secs_f64())]
    write_timeout: f64,
    /// Connections served at once; more are answered 503 with Retry-After (except /health).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// Seconds a drain (first SIGTERM/SIGINT) lets running requests finish before aborting
    /// them; a second signal stops at once.
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    shutdown_timeout: f64,
    /// Require the API key on /metrics too (by default only the API routes need it).
    #[arg(long)]
    metrics_require_key: bool,
    /// Log format on stderr: text or json (one object per line).
    #[arg(long, value_name = "FORMAT", default_value = "text")]
    log_format: LogFormat,
    /// Log filter when RUST_LOG is unset (EnvFilter syntax: `info`, `debug`,
    /// `info,tandem::access=warn`).
    #[arg(long, value_name = "FILTER", default_value = "info")]
    log_level: String,
    /// Seconds between the engine's throughput lines while it is busy (0: none).
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    log_interval: f64,
}

fn seconds(flag: &str, s: f64) -> Result<Duration> {
    if !s.is_finite() || s < 0.0 {
        bail!("{flag} must be a non-negative number of seconds, got {s}");
    }
    Ok(Duration::from_secs_f64(s))
}

impl OpsArgs {
    /// Installs the logger (before anything logs).
    pub fn init_logging(&self) -> Result<()> {
        logging::init(self.log_format, &self.log_level).map_err(anyhow::Error::msg)
    }

    /// Sets the connection, drain and log settings of `config`.
    pub fn apply(&self, config: &mut ServerConfig) -> Result<()> {
        config.connections = ConnectionLimits {
            header_timeout: seconds("--header-timeout", self.header_timeout)?,
            body_timeout: seconds("--body-timeout", self.body_timeout)?,
            write_timeout: seconds("--write-timeout", self.write_timeout)?,
            max_connections: self.max_connections,
        };
        config.connections.validate().map_err(anyhow::Error::msg)?;
        config.shutdown_timeout = seconds("--shutdown-timeout", self.shutdown_timeout)?;
        config.metrics_require_key = self.metrics_require_key;
        let interval = seconds("--log-interval", self.log_interval)?;
        config.engine_log_interval = (!interval.is_zero()).then_some(interval);
        Ok(())
    }
}
