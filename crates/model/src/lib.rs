//! tandem's model crate: configs, GGUF and safetensors loading, the tokenizer and chat
//! template, the transformer forward pass over a paged KV store, and teacher-forced scoring.
//! It knows nothing of requests or scheduling.

pub mod attention;
pub mod batch;
pub mod chat_template;
pub mod config;
pub mod cpu_runner;
mod decode_attention;
mod decode_partitions;
pub mod default_model;
pub mod error;
pub mod fake_runner;
pub mod gguf;
pub mod gguf_config;
pub mod hf_config;
mod hf_gemma3;
mod hf_moe;
pub mod host_model;
pub mod kv_store;
pub mod loader;
pub mod logit_processing;
pub mod logits;
pub mod lora;
pub mod model_builder;
mod packed_weights;
pub mod queued_runner;
pub mod row_sampling;
pub mod runner;
pub mod safetensors;
pub mod scoring;
mod scratch;
pub mod tensor_check;
pub mod tensor_names;
pub mod token_pick;
pub mod tokenizer;
pub mod transformer;
pub mod weights;

pub use config::{Architecture, ModelConfig};
pub use error::{ModelError, Result};
