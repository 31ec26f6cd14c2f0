//! The server's validated, immutable settings.

use std::net::SocketAddr;
use std::time::Duration;

pub use crate::connections::ConnectionLimits;

pub use crate::limits::{
    RequestLimits, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_GRAMMAR_BYTES, DEFAULT_MAX_SCORE_ITEMS,
    DEFAULT_MAX_WAITING_REQUESTS,
};

/// How the HTTP side runs. The engine's own limits live in the engine.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where to listen; port 0 picks a free port (read it back from
    /// [`crate::RunningServer::addr`]).
    pub addr: SocketAddr,
    /// When set, every route except `/health` requires `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// The model's names: the first is the one `/v1/models` lists; requests may use any.
    /// A request without `model` gets the first.
    pub model_names: Vec<String>,
    /// The LoRA adapters registered with the engine's runner, by name, in [`AdapterId`]
    /// order: a request whose `model` is one of them runs with that adapter, and
    /// `/v1/models` lists them after the base model (vLLM's `--lora-modules`).
    pub adapter_names: Vec<String>,
    /// Serve `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter` (vLLM's
    /// `VLLM_ALLOW_RUNTIME_LORA_UPDATING`): off by default, as they read the server's files.
    pub runtime_lora_updates: bool,
    /// How adapters loaded at run time are held (those of `adapter_names` are registered by
    /// whoever built the engine).
    pub lora_dtype: tandem_model::lora::LoraDtype,
    /// Serve `POST /v1/kv/prefill`: compute a prompt for a decode instance and answer its KV
    /// blocks (the prefill side of disaggregated serving, ARCHITECTURE.md § KV transfer).
    pub kv_producer: bool,
    /// The prefill instances (`host:port` each, plain HTTP) whose `POST /v1/kv/prefill`
    /// computes this server's prompts: their blocks are put into the prefix cache before the
    /// request runs, so this server computes only the last partial block (the decode side).
    pub prefill_peers: Vec<String>,
    /// How long a request waits on the prefill peer before computing its prompt here.
    pub prefill_peer_timeout: Duration,
    /// Worker threads of the async runtime (the kernels need the cores; 1 or 2 suffice).
    pub http_threads: usize,
    /// What one request may ask for, and the waiting queue's bound.
    pub limits: RequestLimits,
    /// Timeouts and the cap on connections (ARCHITECTURE.md § Connections and drain).
    pub connections: ConnectionLimits,
    /// How long a drain (SIGTERM) lets running requests finish before aborting them.
    pub shutdown_timeout: Duration,
    /// When false (the default, as vLLM), `/metrics` answers without the API key.
    pub metrics_require_key: bool,
    /// Period of the engine's throughput log line while it is busy; `None`: no such line.
    pub engine_log_interval: Option<Duration>,
    /// Where the step timeline goes when the engine records one (`--trace FILE`): written
    /// at exit and on every `POST /debug/trace`.
    pub trace_file: Option<std::path::PathBuf>,
}

/// Default `--shutdown-timeout`: what Kubernetes gives a pod by default before SIGKILL.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);
/// Default `--prefill-peer-timeout`.
pub const DEFAULT_PREFILL_PEER_TIMEOUT: Duration = Duration::from_secs(60);
/// Default period of the engine log line (vLLM's is 10 s too).
pub const DEFAULT_ENGINE_LOG_INTERVAL: Duration = Duration::from_secs(10);

impl ServerConfig {
    /// Defaults: 127.0.0.1:8000, no API key, the given model name, 2 threads, the default
    /// [`RequestLimits`] and [`ConnectionLimits`], a 30 s drain, an engine line every 10 s.
    pub fn new(model_name: impl Into<String>) -> ServerConfig {
        ServerConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 8000)),
            api_key: None,
            model_names: vec![model_name.into()],
            adapter_names: Vec::new(),
            runtime_lora_updates: false,
            lora_dtype: tandem_model::lora::LoraDtype::Auto,
            kv_producer: false,
            prefill_peers: Vec::new(),
            prefill_peer_timeout: DEFAULT_PREFILL_PEER_TIMEOUT,
            http_threads: 2,
            limits: RequestLimits::default(),
            connections: ConnectionLimits::default(),
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            metrics_require_key: false,
            engine_log_interval: Some(DEFAULT_ENGINE_LOG_INTERVAL),
            trace_file: None,
        }
    }

    /// The name `/v1/models` lists and responses carry.
    pub fn served_name(&self) -> &str {
        self.model_names.first().map_or("tandem", String::as_str)
    }
}
