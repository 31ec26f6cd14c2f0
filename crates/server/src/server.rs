//! Starting and stopping the server: the engine thread, a small tokio runtime on its own
//! thread for HTTP, and graceful shutdown (stop accepting, abort what is in flight, wait a
//! little for responses to end, return).

use std::net::SocketAddr;
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tandem_engine::engine::Engine;
use tandem_model::tokenizer::Tokenizer;
use tokio::sync::{oneshot, Notify};

use crate::api::{routes, AppState, ModelLimits};
use crate::config::ServerConfig;
use crate::engine_thread::{spawn_engine, EngineHandle, EngineSnapshot};
use crate::error::ServerError;
use crate::prompt::PromptBuilder;

/// How long in-flight responses get to finish after shutdown begins.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// A server running on its threads. Dropping it shuts it down without waiting.
#[derive(Debug)]
pub struct RunningServer {
    addr: SocketAddr,
    served_name: String,
    engine: EngineHandle,
    stop: Option<oneshot::Sender<()>>,
    http: Option<JoinHandle<Result<(), ServerError>>>,
    engine_thread: Option<JoinHandle<()>>,
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
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.join()
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
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.engine.shutdown();
    }
}

/// Runs the server until SIGINT or SIGTERM, then shuts down gracefully and returns `Ok`.
pub fn serve(
    engine: Engine,
    tokenizer: Arc<Tokenizer>,
    chat_template: Option<String>,
    config: ServerConfig,
) -> Result<(), ServerError> {
    start_with_signals(engine, tokenizer, chat_template, config)?.wait()
}

/// Starts the server with SIGINT/SIGTERM handlers installed (they begin a graceful
/// shutdown) and returns once it accepts connections; [`RunningServer::wait`] then blocks
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
    let limits = ModelLimits {
        vocab_size: engine.model_config().vocab_size,
        max_model_len: engine.scheduler().config().max_model_len,
        eos_token_ids: engine
            .scheduler()
            .config()
            .eos_token_ids
            .iter()
            .map(|t| t.0)
            .collect(),
    };
    let prompts = PromptBuilder::new(tokenizer.clone(), chat_template.as_deref())?;
    let bind_err = |source| ServerError::Bind {
        addr: config.addr.to_string(),
        source,
    };
    let listener = std::net::TcpListener::bind(config.addr).map_err(bind_err)?;
    listener.set_nonblocking(true).map_err(bind_err)?;
    let addr = listener.local_addr().map_err(bind_err)?;
    let (handle, engine_thread) =
        spawn_engine(engine, tokenizer, config.limits.max_waiting_requests)
            .map_err(|e| ServerError::Startup(e.to_string()))?;
    let threads = config.http_threads.max(1);
    let served_name = config.served_name().to_string();
    let app = Arc::new(AppState::new(handle.clone(), prompts, limits, config));
    let (stop, stop_rx) = oneshot::channel();
    let (ready_tx, ready_rx) = std_mpsc::channel();
    let engine_for_http = handle.clone();
    let http = std::thread::Builder::new()
        .name("tandem-http".into())
        .spawn(move || {
            run_http(
                app,
                listener,
                threads,
                stop_rx,
                signals,
                engine_for_http,
                ready_tx,
            )
        })
        .map_err(|e| ServerError::Startup(e.to_string()))?;
    let mut server = RunningServer {
        addr,
        served_name,
        engine: handle,
        stop: Some(stop),
        http: Some(http),
        engine_thread: Some(engine_thread),
    };
    match ready_rx.recv() {
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

/// The HTTP thread's body: a runtime with `threads` workers serving until `stop` fires (or
/// a signal, with `signals`). Reports readiness (or the startup error) on `ready`.
fn run_http(
    app: Arc<AppState>,
    listener: std::net::TcpListener,
    threads: usize,
    stop: oneshot::Receiver<()>,
    signals: bool,
    engine: EngineHandle,
    ready: std_mpsc::Sender<Result<(), ServerError>>,
) -> Result<(), ServerError> {
    let startup = |e: std::io::Error| ServerError::Startup(e.to_string());
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
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
            let shutdown = shutdown_signal(stop, signals)?;
            Ok::<_, std::io::Error>((listener, shutdown))
        };
        let (listener, shutdown) = match setup.await {
            Ok(x) => x,
            Err(e) => {
                let _ = ready.send(Err(startup(e)));
                return Ok(());
            }
        };
        let _ = ready.send(Ok(()));
        let stopped = Arc::new(Notify::new());
        let notify = stopped.clone();
        let graceful = async move {
            shutdown.await;
            // In-flight generations end (finish_reason "abort"), so their responses end.
            engine.shutdown();
            notify.notify_one();
        };
        let router = routes::router(app);
        let server = axum::serve(listener, router).with_graceful_shutdown(graceful);
        tokio::select! {
            r = server => r.map_err(startup),
            _ = async { stopped.notified().await; tokio::time::sleep(SHUTDOWN_GRACE).await } => Ok(()),
        }
    })
}

/// A future that resolves when `stop` fires or is dropped, or on SIGINT/SIGTERM when
/// `signals` is set. Signal handlers are installed before this returns.
fn shutdown_signal(
    stop: oneshot::Receiver<()>,
    signals: bool,
) -> std::io::Result<impl std::future::Future<Output = ()>> {
    #[cfg(unix)]
    let mut unix_signals = if signals {
        use tokio::signal::unix::{signal, SignalKind};
        Some((
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
        ))
    } else {
        None
    };
    Ok(async move {
        #[cfg(unix)]
        {
            let by_signal = async {
                match unix_signals.as_mut() {
                    Some((int, term)) => {
                        tokio::select! {
                            _ = int.recv() => {},
                            _ = term.recv() => {},
                        }
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = stop => {},
                _ = by_signal => eprintln!("tandem: shutting down"),
            }
        }
        #[cfg(not(unix))]
        {
            let by_signal = async {
                if signals {
                    let _ = tokio::signal::ctrl_c().await;
                } else {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                _ = stop => {},
                _ = by_signal => {},
            }
        }
    })
}
