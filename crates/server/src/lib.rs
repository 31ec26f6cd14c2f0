//! tandem's OpenAI-compatible HTTP server (ARCHITECTURE.md § Threads, § Request paths and § Request
//! bounds and errors).
//!
//! - [`engine_thread`]: the engine on its own OS thread; handlers reach it through
//!   channels (requests in, per-request outputs out, aborts in); a dropped client
//!   aborts its requests within one step;
//! - [`generation`]: one HTTP request's choices, the outputs of the engine thread's output
//!   processor (text from `tandem_text`: detokenizer + stop strings) -> updates, shared by
//!   streamed and non-streamed responses;
//!   [`echo`]: a choice's echoed prompt and prompt scores, on its first update;
//! - [`api`]: routes, validation (400 naming the field, 413, 404), API key, SSE;
//! - [`server`]: [`serve`] (until SIGINT/SIGTERM) and [`start`] (tests, embedding) on a
//!   small tokio runtime that leaves the cores to the kernels; [`connections`]: hyper serving
//!   each socket with timeouts and a connection cap; [`http_limits`]: body size and deadline
//!   before any handler; [`drain`]: the graceful end on SIGTERM;
//! - [`logging`]: the `tracing` subscriber; [`access_log`]: one line per request;
//!   [`engine_log`]: the periodic engine line.
//!
//! The engine only ever sees token ids.

pub use tandem_engine as engine;

pub mod access_log;
pub mod api;
pub mod config;
pub mod connections;
pub mod drain;
pub mod echo;
pub mod engine_log;
pub mod engine_thread;
pub mod error;
pub mod generation;
pub mod http_limits;
pub mod kv_transfer_stats;
pub mod limits;
pub mod logging;
pub mod metrics;
pub mod prefill_peer;
pub mod prompt;
pub mod server;
pub mod write_stall;

pub use config::ServerConfig;
pub use error::{ApiError, ServerError};
pub use server::{serve, start, start_with_signals, RunningServer};
