//! The server's validated, immutable settings.

use std::net::SocketAddr;

/// Default limit on a request body, in bytes.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 << 20;

/// Default limit on the sequences of one `/v1/score` request.
pub const DEFAULT_MAX_SCORE_ITEMS: usize = 64;

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
    /// Request bodies above this many bytes get 413.
    pub max_body_bytes: usize,
    /// Worker threads of the async runtime (the kernels need the cores; 1 or 2 suffice).
    pub http_threads: usize,
    /// Most sequences one `/v1/score` request may score.
    pub max_score_items: usize,
}

impl ServerConfig {
    /// Defaults: 127.0.0.1:8000, no API key, the given model name, 4 MiB bodies, 2 threads,
    /// 64 sequences per `/v1/score` request.
    pub fn new(model_name: impl Into<String>) -> ServerConfig {
        ServerConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 8000)),
            api_key: None,
            model_names: vec![model_name.into()],
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            http_threads: 2,
            max_score_items: DEFAULT_MAX_SCORE_ITEMS,
        }
    }

    /// The name `/v1/models` lists and responses carry.
    pub fn served_name(&self) -> &str {
        self.model_names.first().map_or("tandem", String::as_str)
    }
}
