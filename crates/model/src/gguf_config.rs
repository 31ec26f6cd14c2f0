//! Reads a [`ModelConfig`] from GGUF metadata (`{arch}.embedding_length`, ...), refusing
//! unknown architectures and settings tandem would not compute faithfully (a value length
//! that differs from the key length, partial RoPE, a vocabulary size that disagrees with the
//! embedding).

use crate::config::{
    check_size, Activation, Architecture, BlockFeatures, MixtureOfExperts, ModelConfig, RopeConfig,
    RopeStyle, SlidingWindow, GGUF_ARCHITECTURES,
};
use crate::error::{ModelError, Result};
use crate::gguf::{Metadata, MetadataValue};

/// The architecture-level settings of a GGUF model. `vocab_size` comes from the embedding
/// tensor, which the caller knows.
pub fn config_from_gguf(md: &Metadata, vocab_size: usize) -> Result<ModelConfig> {
    let arch_name = md.str("general.architecture")?;
    let mut architecture = Architecture::from_gguf_name(arch_name).ok_or_else(|| {
        ModelError::UnsupportedArchitecture {
            name: arch_name.to_string(),
            field: "general.architecture".into(),
            supported: GGUF_ARCHITECTURES,
        }
    })?;
    let key = |k: &str| format!("{arch_name}.{k}");
    // llama.cpp files Mixtral as `llama` with experts.
    if architecture == Architecture::Llama && md.opt_u32(&key("expert_count"))?.unwrap_or(0) > 0 {
        architecture = Architecture::Mixtral;
    }
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
    let head_dim = head_dim(md, arch_name, hidden_size, num_heads)?;
    check_vocab_size(md, arch_name, vocab_size)?;
    let theta = md.opt_f32(&key("rope.freq_base"))?.unwrap_or(10_000.0);
    let style = match architecture {
        // convert_hf_to_gguf.py permutes llama q/k rows for the interleaved layout.
        Architecture::Llama | Architecture::Mixtral => RopeStyle::Interleaved,
        Architecture::Qwen2
        | Architecture::Qwen3
        | Architecture::Qwen3Moe
        | Architecture::Gemma3
        | Architecture::Phi3 => RopeStyle::Neox,
    };
    let num_layers = int("block_count")?;
    check_size(&key("block_count"), num_layers).map_err(ModelError::Config)?;
    let features = match architecture {
        Architecture::Gemma3 => {
            gemma3_features(md, arch_name, hidden_size, num_heads, head_dim, num_layers)?
        }
        // llama.cpp currently ignores Phi-3's window (with a warning); transformers applies
        // it, and so does tandem.
        Architecture::Phi3 => BlockFeatures {
            sliding_window: md
                .opt_u32(&key("attention.sliding_window"))?
                .filter(|&w| w > 0)
                .map(|w| SlidingWindow {
                    size: w as usize,
                    layers: vec![true; num_layers],
                }),
            ..BlockFeatures::default()
        },
        Architecture::Mixtral | Architecture::Qwen3Moe => BlockFeatures {
            moe: Some(experts(md, arch_name)?),
            ..BlockFeatures::default()
        },
        _ => BlockFeatures::default(),
    };
    let intermediate_size = match (md.opt_u32(&key("feed_forward_length"))?, &features.moe) {
        (Some(ff), _) => ff as usize,
        // A Qwen3-MoE file may carry only the experts' length.
        (None, Some(moe)) => moe.expert_ffn,
        (None, None) => int("feed_forward_length")?,
    };
    let config = ModelConfig {
        architecture,
        vocab_size,
        hidden_size,
        intermediate_size,
        num_layers,
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
        qk_norm: matches!(
            architecture,
            Architecture::Qwen3 | Architecture::Qwen3Moe | Architecture::Gemma3
        ),
        features,
    };
    config.validate().map_err(ModelError::Config)?;
    Ok(config)
}

/// The experts of a Mixtral (`llama` with `expert_count`) or `qwen3moe` file, as llama.cpp
/// reads them: `expert_count`, `expert_used_count`, the experts' width
/// (`expert_feed_forward_length`, else `feed_forward_length`), softmax routing with the chosen
/// weights renormalised unless `expert_weights_norm` is false. Shared experts and other
/// gating functions are refused.
fn experts(md: &Metadata, arch: &str) -> Result<MixtureOfExperts> {
    let key = |k: &str| format!("{arch}.{k}");
    if let Some(n) = md.opt_u32(&key("expert_shared_count"))?.filter(|&n| n > 0) {
        return Err(ModelError::Hyperparameter {
            key: key("expert_shared_count"),
            reason: format!("is {n}: shared experts are not supported"),
        });
    }
    // llama.cpp's gating functions: 0 unset (softmax for these architectures), 1 softmax,
    // 2 sigmoid, 3 softmax over the chosen experts' weights.
    if let Some(g) = md.opt_u32(&key("expert_gating_func"))?.filter(|&g| g > 1) {
        return Err(ModelError::Hyperparameter {
            key: key("expert_gating_func"),
            reason: format!("is {g}: only softmax gating (0 or 1) is supported"),
        });
    }
    let expert_ffn = match md.opt_u32(&key("expert_feed_forward_length"))? {
        Some(v) => v,
        None => md.u32(&key("feed_forward_length"))?,
    };
    Ok(MixtureOfExperts {
        num_experts: md.u32(&key("expert_count"))? as usize,
        experts_per_token: md.u32(&key("expert_used_count"))? as usize,
        expert_ffn: expert_ffn as usize,
        normalize_top_k: md.opt_bool(&key("expert_weights_norm"))?.unwrap_or(true),
    })
}

/// llama.cpp's Gemma 3 constants: every sixth layer global, the local layers' RoPE base.
const GEMMA3_PATTERN: usize = 6;
const GEMMA3_LOCAL_THETA: f32 = 10_000.0;
/// The layer count of Gemma 3 27B, whose query scale llama.cpp takes from hidden / heads.
const GEMMA3_27B_LAYERS: usize = 62;

/// What a `gemma3` file's block does beyond Llama's, as llama.cpp reads it: the window from
/// `attention.sliding_window` on every layer but each sixth (or as
/// `attention.sliding_window_pattern` says: one flag per layer, or a period), the local RoPE
/// base `rope.freq_base_swa` (default 10000) without scaling, the query scale
/// `1/sqrt(head_dim)` (27B: `1/sqrt(hidden / heads)`). The norm weights of a converted file
/// already hold `1 + w`.
fn gemma3_features(
    md: &Metadata,
    arch: &str,
    hidden_size: usize,
    num_heads: usize,
    head_dim: usize,
    num_layers: usize,
) -> Result<BlockFeatures> {
    let key = |k: &str| format!("{arch}.{k}");
    if md.opt_f32(&key("attn_logit_softcapping"))?.is_some() {
        return Err(ModelError::Hyperparameter {
            key: key("attn_logit_softcapping"),
            reason: "attention logit soft-capping is not supported".into(),
        });
    }
    let size = md.u32(&key("attention.sliding_window"))? as usize;
    let layers = swa_layers(md, &key("attention.sliding_window_pattern"), num_layers)?;
    let query_dim = if num_layers == GEMMA3_27B_LAYERS {
        hidden_size / num_heads
    } else {
        head_dim
    };
    Ok(BlockFeatures {
        embedding_scale: Some((hidden_size as f32).sqrt()),
        activation: Activation::GeluTanh,
        post_norms: true,
        attention_scale: Some(1.0 / (query_dim as f32).sqrt()),
        final_logit_softcap: md.opt_f32(&key("final_logit_softcapping"))?,
        sliding_window: Some(SlidingWindow { size, layers }),
        local_rope: Some(RopeConfig {
            theta: md
                .opt_f32(&key("rope.freq_base_swa"))?
                .unwrap_or(GEMMA3_LOCAL_THETA),
            style: RopeStyle::Neox,
            llama3_scaling: None,
        }),
        rope_linear_factor: None,
        moe: None,
    })
}

/// Which layers slide: `key` as one flag per layer, or as a period `p` (every layer but each
/// `p`-th), else Gemma 3's period 6.
fn swa_layers(md: &Metadata, key: &str, num_layers: usize) -> Result<Vec<bool>> {
    let bad = |reason: String| ModelError::Hyperparameter {
        key: key.to_string(),
        reason,
    };
    let period = match md.get(key) {
        None => GEMMA3_PATTERN,
        Some(MetadataValue::Array(flags)) => {
            let layers: Vec<bool> = flags
                .iter()
                .filter_map(|f| match f {
                    MetadataValue::Bool(b) => Some(*b),
                    _ => None,
                })
                .collect();
            if layers.len() != num_layers || layers.len() != flags.len() {
                return Err(bad(format!(
                    "must hold {num_layers} booleans (one per layer)"
                )));
            }
            return Ok(layers);
        }
        Some(_) => md.u32(key)? as usize,
    };
    if period == 0 {
        return Err(bad("must be positive".into()));
    }
    Ok((0..num_layers).map(|i| (i + 1) % period != 0).collect())
}

/// `attention.key_length`, else hidden / heads; `attention.value_length` and
/// `rope.dimension_count` must agree with it (tandem has one head size and rotates all of it).
fn head_dim(md: &Metadata, arch: &str, hidden_size: usize, num_heads: usize) -> Result<usize> {
    let key = |k: &str| format!("{arch}.{k}");
    let head_dim = match md.opt_u32(&key("attention.key_length"))? {
        Some(v) => v as usize,
        None if hidden_size.is_multiple_of(num_heads) => hidden_size / num_heads,
        None => {
            return Err(ModelError::Hyperparameter {
                key: key("attention.key_length"),
                reason: format!(
                    "is missing and embedding_length {hidden_size} is not a multiple of \
                     {num_heads} heads"
                ),
            })
        }
    };
    for k in ["attention.value_length", "rope.dimension_count"] {
        match md.opt_u32(&key(k))? {
            Some(v) if v as usize != head_dim => {
                return Err(ModelError::Hyperparameter {
                    key: key(k),
                    reason: format!("is {v}, but the head size is {head_dim} (must be equal)"),
                })
            }
            _ => {}
        }
    }
    Ok(head_dim)
}

/// `{arch}.vocab_size`, when present, must equal the embedding's rows.
fn check_vocab_size(md: &Metadata, arch: &str, embedding_rows: usize) -> Result<()> {
    let key = format!("{arch}.vocab_size");
    match md.opt_u32(&key)? {
        Some(v) if v as usize != embedding_rows => Err(ModelError::Hyperparameter {
            key,
            reason: format!("is {v}, but `token_embd.weight` has {embedding_rows} rows"),
        }),
        _ => Ok(()),
    }
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
