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
//!   small tokio runtime that leaves the cores to the kernels.
//!
//! The engine only ever sees token ids.

pub use tandem_engine as engine;

pub mod api;
pub mod config;
pub mod echo;
pub mod engine_thread;
pub mod error;
pub mod generation;
pub mod limits;
pub mod metrics;
pub mod prompt;
pub mod server;

pub use config::ServerConfig;
pub use error::{ApiError, ServerError};
pub use server::{serve, start, start_with_signals, RunningServer};
