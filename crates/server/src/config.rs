//! The server's validated, immutable settings.

use std::net::SocketAddr;

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
    /// Worker threads of the async runtime (the kernels need the cores; 1 or 2 suffice).
    pub http_threads: usize,
    /// What one request may ask for, and the waiting queue's bound.
    pub limits: RequestLimits,
}

impl ServerConfig {
    /// Defaults: 127.0.0.1:8000, no API key, the given model name, 2 threads, the default
    /// [`RequestLimits`].
    pub fn new(model_name: impl Into<String>) -> ServerConfig {
        ServerConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 8000)),
            api_key: None,
            model_names: vec![model_name.into()],
            http_threads: 2,
            limits: RequestLimits::default(),
        }
    }

    /// The name `/v1/models` lists and responses carry.
    pub fn served_name(&self) -> &str {
        self.model_names.first().map_or("tandem", String::as_str)
    }
}
