//! Reads a [`ModelConfig`] from GGUF metadata (`{arch}.embedding_length`, ...).

use crate::config::{Architecture, ModelConfig, RopeConfig, RopeStyle};
use crate::error::{ModelError, Result};
use crate::gguf::Metadata;

/// The architecture-level settings of a GGUF model. `vocab_size` comes from the embedding
/// tensor, which the caller knows.
pub fn config_from_gguf(md: &Metadata, vocab_size: usize) -> Result<ModelConfig> {
    let arch_name = md.str("general.architecture")?;
    let architecture = Architecture::from_gguf_name(arch_name)
        .ok_or_else(|| ModelError::UnsupportedArchitecture(arch_name.to_string()))?;
    let key = |k: &str| format!("{arch_name}.{k}");
    let int = |k: &str| -> Result<usize> { Ok(md.u32(&key(k))? as usize) };
    let hidden_size = int("embedding_length")?;
    let num_heads = int("attention.head_count")?;
    if num_heads == 0 {
        return Err(ModelError::Config(
            "attention.head_count must be positive".into(),
        ));
    }
    let num_kv_heads = md
        .opt_u32(&key("attention.head_count_kv"))?
        .map_or(num_heads, |v| v as usize);
    let head_dim = md
        .opt_u32(&key("attention.key_length"))?
        .map_or(hidden_size / num_heads, |v| v as usize);
    let theta = md.opt_f32(&key("rope.freq_base"))?.unwrap_or(10_000.0);
    let style = match architecture {
        // convert_hf_to_gguf.py permutes llama q/k rows for the interleaved layout.
        Architecture::Llama => RopeStyle::Interleaved,
        Architecture::Qwen2 | Architecture::Qwen3 => RopeStyle::Neox,
    };
    let config = ModelConfig {
        architecture,
        vocab_size,
        hidden_size,
        intermediate_size: int("feed_forward_length")?,
        num_layers: int("block_count")?,
        num_heads,
        num_kv_heads,
        head_dim,
        rms_norm_eps: md.f32(&key("attention.layer_norm_rms_epsilon"))?,
        rope: RopeConfig {
            theta,
            style,
            llama3_scaling: None,
        },
        context_len: int("context_length")?,
        tie_word_embeddings: false,
        qkv_bias: architecture == Architecture::Qwen2,
        qk_norm: architecture == Architecture::Qwen3,
    };
    config.validate().map_err(ModelError::Config)?;
    Ok(config)
}

/// Linear RoPE scaling declared in the metadata, as a divisor of every frequency.
pub fn linear_rope_factor(md: &Metadata) -> Result<Option<f32>> {
    let arch = md.str("general.architecture")?;
    match md.opt_str(&format!("{arch}.rope.scaling.type"))? {
        None | Some("none") => Ok(None),
        Some("linear") => {
            let f = md.f32(&format!("{arch}.rope.scaling.factor"))?;
            if !(f.is_finite() && f > 0.0) {
                return Err(ModelError::Config(format!(
                    "rope scaling factor {f} is invalid"
                )));
            }
            Ok(Some(f))
        }
        Some(other) => Err(ModelError::Config(format!(
            "unsupported rope scaling type `{other}`"
        ))),
    }
}
