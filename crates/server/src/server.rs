//! Starting and stopping the server: the engine thread, a small tokio runtime on its own
//! thread for HTTP serving connections (see [`crate::connections`]), and its end: a drain on
//! the first signal (see [`crate::drain`]), an immediate stop on a second one or on
//! [`RunningServer::shutdown`] (abort what is in flight, wait a little for responses to end).

use std::net::SocketAddr;
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tandem_engine::engine::Engine;
use tandem_model::tokenizer::Tokenizer;
use tokio::sync::mpsc as tmpsc;

use crate::api::{routes, AppState, ModelLimits};
use crate::config::ServerConfig;
use crate::connections::{ConnectionLimits, Connections};
use crate::drain::{Drain, Settled};
use crate::engine_thread::{spawn_engine, EngineHandle, EngineSnapshot};
use crate::error::ServerError;
use crate::prefill_peer::PrefillPeers;
use crate::prompt::PromptBuilder;

/// How long responses get to finish after the engine stops.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// The same after a second signal: enough for the aborted streams to send their last chunk.
const FORCED_GRACE: Duration = Duration::from_secs(1);

/// What ends the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Refuse new requests, let running ones finish (up to the shutdown timeout).
    Drain,
    /// Abort what runs and stop.
    Now,
}

/// A server running on its threads. Dropping it shuts it down without waiting.
#[derive(Debug)]
pub struct RunningServer {
    addr: SocketAddr,
    served_name: String,
    engine: EngineHandle,
    stop: tmpsc::UnboundedSender<Stop>,
    http: Option<JoinHandle<Result<(), ServerError>>>,
    engine_thread: Option<JoinHandle<()>>,
    /// Shared with the HTTP side, so that a drain turns `/health` 503 before `drain` returns.
    drain: Arc<Drain>,
}

impl RunningServer {
    /// The address it listens on (with the real port when the config asked for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The model name `/v1/models` lists.
    pub fn served_name(&self) -> &str {
        &self.served_name
    }

    /// The engine's current state (what `/health` reports).
    pub fn engine_snapshot(&self) -> EngineSnapshot {
        self.engine.snapshot()
    }

    /// Stops accepting, aborts everything in flight, and waits for both threads.
    pub fn shutdown(mut self) -> Result<(), ServerError> {
        let _ = self.stop.send(Stop::Now);
        self.join()
    }

    /// Begins a drain, as the first SIGTERM does (see [`crate::drain`]), and returns at once;
    /// [`RunningServer::wait`] then returns when it has ended.
    pub fn drain(&self) {
        self.drain.begin();
        let _ = self.stop.send(Stop::Drain);
    }

    /// Waits until the server stops (by a signal, when it listens for them).
    pub fn wait(mut self) -> Result<(), ServerError> {
        self.join()
    }

    fn join(&mut self) -> Result<(), ServerError> {
        let http = self.http.take().map(JoinHandle::join);
        self.engine.shutdown();
        if let Some(t) = self.engine_thread.take() {
            t.join()
                .map_err(|_| ServerError::Startup("the engine thread panicked".into()))?;
        }
        match http {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(ServerError::Startup("the HTTP thread panicked".into())),
            None => Ok(()),
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        let _ = self.stop.send(Stop::Now);
        self.engine.shutdown();
    }
}

/// Runs the server until SIGINT or SIGTERM, then drains and returns `Ok`.
pub fn serve(
    engine: Engine,
    tokenizer: Arc<Tokenizer>,
    chat_template: Option<String>,
    config: ServerConfig,
) -> Result<(), ServerError> {
    start_with_signals(engine, tokenizer, chat_template, config)?.wait()
}

/// Starts the server with SIGINT/SIGTERM handlers installed (the first begins a drain, a
/// second stops at once) and returns once it accepts connections; [`RunningServer::wait`] then blocks
/// until it has stopped.
pub fn start_with_signals(
    engine: Engine,
    tokenizer: Arc<Tokenizer>,
    chat_template: Option<String>,
    config: ServerConfig,
) -> Result<RunningServer, ServerError> {
    start_inner(engine, tokenizer, chat_template, config, true)
}

/// Starts the server and returns once it accepts connections. It runs until
/// [`RunningServer::shutdown`] (signals are left alone: for tests and embedding).
pub fn start(
    engine: Engine,
    tokenizer: Arc<Tokenizer>,
    chat_template: Option<String>,
    config: ServerConfig,
) -> Result<RunningServer, ServerError> {
    start_inner(engine, tokenizer, chat_template, config, false)
}

fn start_inner(
    engine: Engine,
    tokenizer: Arc<Tokenizer>,
    chat_template: Option<String>,
    config: ServerConfig,
    signals: bool,
) -> Result<RunningServer, ServerError> {
    config.limits.validate().map_err(ServerError::Startup)?;
    config
        .connections
        .validate()
        .map_err(ServerError::Startup)?;
    let prefill_peers = check_kv_transfer(&engine, &config)?;
    let limits = model_limits(&engine, &tokenizer);
    let model_config = engine.model_config().clone();
    let prompts = PromptBuilder::new(tokenizer.clone(), chat_template.as_deref())?;
    let bind_err = |source| ServerError::Bind {
        addr: config.addr.to_string(),
        source,
    };
    let listener = std::net::TcpListener::bind(config.addr).map_err(bind_err)?;
    listener.set_nonblocking(true).map_err(bind_err)?;
    let addr = listener.local_addr().map_err(bind_err)?;
    let (handle, engine_thread) = spawn_engine(
        engine,
        tokenizer,
        config.limits.max_waiting_requests,
        config.engine_log_interval,
        config.trace_file.clone(),
    )
    .map_err(|e| ServerError::Startup(e.to_string()))?;
    let drain = Arc::new(Drain::default());
    let http_config = HttpConfig {
        threads: config.http_threads.max(1),
        limits: config.connections.clone(),
        shutdown_timeout: config.shutdown_timeout,
        signals,
        drain: drain.clone(),
    };
    let served_name = config.served_name().to_string();
    let model = model_config.clone();
    let mut state = AppState::new(handle.clone(), prompts, (limits, model), config);
    state.prefill_peers = prefill_peers;
    let app = Arc::new(state);
    let (stop, stop_rx) = tmpsc::unbounded_channel();
    let (ready_tx, ready_rx) = std_mpsc::channel();
    let engine_for_http = handle.clone();
    let stop_for_signals = stop.clone();
    let http = std::thread::Builder::new()
        .name("tandem-http".into())
        .spawn(move || {
            let stops = (stop_for_signals, stop_rx);
            run_http(app, listener, http_config, stops, engine_for_http, ready_tx)
        })
        .map_err(|e| ServerError::Startup(e.to_string()))?;
    let server = RunningServer {
        addr,
        served_name,
        engine: handle,
        stop,
        http: Some(http),
        engine_thread: Some(engine_thread),
        drain,
    };
    await_ready(server, ready_rx)
}

/// The server once its HTTP thread says it is ready, or the startup error.
fn await_ready(
    mut server: RunningServer,
    ready: std_mpsc::Receiver<Result<(), ServerError>>,
) -> Result<RunningServer, ServerError> {
    match ready.recv() {
        Ok(Ok(())) => Ok(server),
        Ok(Err(e)) => {
            let _ = server.join();
            Err(e)
        }
        Err(_) => server.join().and(Err(ServerError::Startup(
            "the HTTP thread ended before it was ready".into(),
        ))),
    }
}

/// Checks that the engine can play the KV transfer roles `config` gives it, and makes the
/// prefill peers' clients.
fn check_kv_transfer(
    engine: &Engine,
    config: &ServerConfig,
) -> Result<Option<PrefillPeers>, ServerError> {
    let roles = config.kv_producer || !config.prefill_peers.is_empty();
    if roles && engine.runner().kv_block_format().is_none() {
        return Err(ServerError::Startup(format!(
            "disaggregated prefill moves KV blocks between CPU runners only, not {}",
            engine.runner().describe()
        )));
    }
    if roles && !engine.scheduler().prefix_caching() {
        return Err(ServerError::Startup(
            "disaggregated prefill needs the prefix cache: blocks are sent from it \
             (--kv-producer) and received into it (--prefill-peer)"
                .into(),
        ));
    }
    let (timeout, key) = (config.prefill_peer_timeout, config.api_key.clone());
    PrefillPeers::new(&config.prefill_peers, timeout, key).map_err(ServerError::Startup)
}

/// What requests are checked against: the model's vocabulary, length and end tokens. The ids
/// a request may name (bias, stop ids) are those the tokenizer can decode too (the loader
/// extends it over a padded embedding's rows, `Tokenizer::pad_to`; one built otherwise may
/// cover fewer).
fn model_limits(engine: &Engine, tokenizer: &Tokenizer) -> ModelLimits {
    ModelLimits {
        vocab_size: engine.model_config().vocab_size.min(tokenizer.vocab_size()),
        max_model_len: engine.scheduler().config().max_model_len,
        eos_token_ids: engine
            .scheduler()
            .config()
            .eos_token_ids
            .iter()
            .map(|t| t.0)
            .collect(),
        kv_block_size: engine.scheduler().config().block_size,
        kv_bytes_per_block: (engine.runner().kv_block_format()).map_or(0, |f| f.bytes_per_block),
    }
}

/// How the HTTP thread serves and stops.
struct HttpConfig {
    threads: usize,
    limits: ConnectionLimits,
    shutdown_timeout: Duration,
    signals: bool,
    drain: Arc<Drain>,
}

/// The HTTP thread's body: a runtime with `threads` workers serving until a [`Stop`] (from
/// [`RunningServer`] or, with `signals`, a signal). Reports readiness (or the startup error)
/// on `ready`.
fn run_http(
    app: Arc<AppState>,
    listener: std::net::TcpListener,
    config: HttpConfig,
    (stop_tx, stop): (tmpsc::UnboundedSender<Stop>, tmpsc::UnboundedReceiver<Stop>),
    engine: EngineHandle,
    ready: std_mpsc::Sender<Result<(), ServerError>>,
) -> Result<(), ServerError> {
    let startup = |e: std::io::Error| ServerError::Startup(e.to_string());
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.threads)
        .thread_name("tandem-http-worker")
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            let _ = ready.send(Err(startup(e)));
            return Ok(());
        }
    };
    runtime.block_on(async move {
        let setup = async {
            let listener = tokio::net::TcpListener::from_std(listener)?;
            if config.signals {
                forward_signals(stop_tx, config.drain.clone())?;
            }
            Ok::<_, std::io::Error>(listener)
        };
        let listener = match setup.await {
            Ok(x) => x,
            Err(e) => {
                let _ = ready.send(Err(startup(e)));
                return Ok(());
            }
        };
        let _ = ready.send(Ok(()));
        serve_until_stopped(app, listener, config, stop, engine).await;
        Ok(())
    })
}

/// Serves until a [`Stop`]: at once for [`Stop::Now`]; for [`Stop::Drain`] after the drain
/// (see [`crate::drain`]). Then stops the engine, closes the listener and lets responses end.
async fn serve_until_stopped(
    app: Arc<AppState>,
    listener: tokio::net::TcpListener,
    config: HttpConfig,
    mut stop: tmpsc::UnboundedReceiver<Stop>,
    engine: EngineHandle,
) {
    let drain = config.drain.clone();
    let connections = Connections::new(routes::router(app, drain.clone()), config.limits);
    let first = connections.accept_until(&listener, stop.recv()).await;
    let settled = match first {
        Some(Stop::Drain) => {
            drain.begin();
            tracing::info!(
                timeout = ?config.shutdown_timeout,
                "draining: /health answers 503, new requests are refused"
            );
            let forced = async { while stop.recv().await == Some(Stop::Drain) {} };
            let settle = drain.settle(&engine, config.shutdown_timeout, forced);
            let settled = connections.accept_until(&listener, settle).await;
            log_settled(settled, &engine);
            settled
        }
        _ => Settled::TimedOut,
    };
    // Aborts whatever still runs (finish_reason "abort"), so its response ends.
    engine.shutdown();
    drop(listener);
    let grace = if settled == Settled::Forced {
        FORCED_GRACE
    } else {
        SHUTDOWN_GRACE
    };
    connections.shut_down(grace).await;
    tracing::info!("stopped");
}

fn log_settled(settled: Settled, engine: &EngineHandle) {
    match settled {
        Settled::Idle => tracing::info!("drained: every admitted request finished"),
        Settled::TimedOut => tracing::warn!(
            aborted = engine.snapshot().in_flight,
            "--shutdown-timeout passed: aborting the requests still running"
        ),
        Settled::Forced => tracing::warn!(
            aborted = engine.snapshot().in_flight,
            "second signal: stopping at once"
        ),
    }
}

/// Installs SIGINT/SIGTERM handlers (Ctrl-C elsewhere) that send [`Stop::Drain`] on the
/// first signal and [`Stop::Now`] on later ones.
fn forward_signals(stop: tmpsc::UnboundedSender<Stop>, drain: Arc<Drain>) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut int = signal(SignalKind::interrupt())?;
        let mut term = signal(SignalKind::terminate())?;
        tokio::spawn(async move {
            let mut next = Stop::Drain;
            loop {
                tokio::select! {
                    _ = int.recv() => {},
                    _ = term.recv() => {},
                }
                tracing::info!(?next, "signal received");
                if next == Stop::Drain {
                    drain.begin();
                }
                if stop.send(next).is_err() {
                    return;
                }
                next = Stop::Now;
            }
        });
    }
    #[cfg(not(unix))]
    tokio::spawn(async move {
        let mut next = Stop::Drain;
        while tokio::signal::ctrl_c().await.is_ok() {
            if next == Stop::Drain {
                drain.begin();
            }
            if stop.send(next).is_err() {
                return;
            }
            next = Stop::Now;
        }
    });
    Ok(())
}
