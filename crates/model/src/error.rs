//! The model crate's error type.

use std::path::PathBuf;

pub use crate::gguf::GgufError;

/// Everything that can go wrong while loading a model or running it on bad input.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("GGUF: {0}")]
    Gguf(#[from] GgufError),
    #[error("safetensors: {0}")]
    Safetensors(String),
    #[error("model config: {0}")]
    Config(String),
    #[error("unsupported architecture `{0}` (supported: llama, qwen2, qwen3)")]
    UnsupportedArchitecture(String),
    #[error("missing tensor `{0}`")]
    MissingTensor(String),
    #[error("tensor `{name}`: {reason}")]
    BadTensor { name: String, reason: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    ChatTemplate(String),
    #[error("invalid forward batch: {0}")]
    Batch(String),
    #[error("input of {num_tokens} tokens exceeds the model's context length of {context_len}")]
    ContextTooLong {
        num_tokens: usize,
        context_len: usize,
    },
    #[error("default model: {0}")]
    DefaultModel(String),
    #[error("not a model: {0}")]
    NotAModel(String),
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;
