//! tandem's OpenAI-compatible HTTP server. (The server issue builds it; for now it only
//! fixes the crate graph: server -> engine -> model -> kernels.)

pub use tandem_engine as engine;

pub mod text;
