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
    #[error("unsupported architecture `{name}` in `{field}` (supported: {supported})")]
    UnsupportedArchitecture {
        name: String,
        /// The metadata key or config field that named it.
        field: String,
        supported: &'static str,
    },
    #[error("unsupported dtype `{name}` in `{field}` (supported: {supported})")]
    UnsupportedDtype {
        name: String,
        field: String,
        supported: &'static str,
    },
    #[error("`{key}` = {declared}, but the file holds tensors for {found}")]
    LayerCount {
        /// The metadata key or config field that declares the layer count.
        key: String,
        declared: usize,
        /// The layers whose tensors are present, e.g. "30 layers (blk.0 to blk.29)".
        found: String,
    },
    #[error("`{key}`: {reason}")]
    Hyperparameter { key: String, reason: String },
    #[error(
        "{} tensor(s) the {architecture} architecture does not use: {}{}",
        .names.len(),
        crate::tensor_check::list_names(.names),
        crate::tensor_check::allowed_note(.allowed)
    )]
    UnusedTensors {
        architecture: String,
        /// Sorted.
        names: Vec<String>,
        /// The extras this format may carry without error.
        allowed: &'static str,
    },
    #[error("missing tensor `{0}`")]
    MissingTensor(String),
    #[error("tensor `{name}`: {reason}")]
    BadTensor { name: String, reason: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// A request's extra template variables are not allowed (one names the template's own
    /// inputs or functions).
    #[error("chat_template_kwargs: {0}")]
    ChatTemplateKwargs(String),
    /// The chat template spent its budget for one rendering (a fault of the template, not of
    /// the conversation).
    #[error("chat template: over its budget for one rendering: {0}")]
    ChatTemplateBudget(String),
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
    #[error("LoRA adapter {}: {reason}", path.display())]
    Adapter { path: PathBuf, reason: String },
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;
