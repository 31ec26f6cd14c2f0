//! Reading a Gemma 3 text model's `config.json` (`Gemma3ForCausalLM`, `model_type`
//! `gemma3_text`) into a [`ModelConfig`], with the defaults of transformers'
//! `Gemma3TextConfig`: `head_dim` 256, `query_pre_attn_scalar` 256, `sliding_window` 4096,
//! every sixth layer global (`sliding_window_pattern` 6, or an explicit `layer_types`),
//! `rope_theta` 1e6 for the global layers and `rope_local_base_freq` 1e4 for the local ones
//! (5.x: `rope_parameters.full_attention` / `.sliding_attention`), tied embeddings,
//! `gelu_pytorch_tanh`.
//!
//! What tandem does not compute is refused: attention logit soft-capping, bidirectional
//! attention, attention biases, another activation, RoPE types other than default (and
//! linear on the global layers).

use serde_json::{Map, Value};

use crate::config::{
    Activation, Architecture, BlockFeatures, ModelConfig, RopeConfig, RopeStyle, SlidingWindow,
};
use crate::error::Result;
use crate::hf_config::{
    field_err, layer_count, opt_bool, opt_f64, opt_f64_labeled, opt_str, opt_usize, present,
    req_usize,
};

/// Transformers' `Gemma3TextConfig` defaults.
const DEFAULT_HEAD_DIM: usize = 256;
const DEFAULT_QUERY_PRE_ATTN_SCALAR: f64 = 256.0;
const DEFAULT_SLIDING_WINDOW: usize = 4096;
const DEFAULT_PATTERN: usize = 6;
const DEFAULT_GLOBAL_THETA: f64 = 1_000_000.0;
const DEFAULT_LOCAL_THETA: f64 = 10_000.0;
const DEFAULT_MAX_POSITIONS: usize = 131_072;

/// The [`ModelConfig`] of a Gemma 3 text model.
pub(crate) fn gemma3_config(cfg: &Map<String, Value>) -> Result<ModelConfig> {
    check_unsupported(cfg)?;
    let hidden_size = req_usize(cfg, "hidden_size")?;
    let num_heads = req_usize(cfg, "num_attention_heads")?;
    let num_layers = layer_count(cfg)?;
    let head_dim = opt_usize(cfg, "head_dim")?.unwrap_or(DEFAULT_HEAD_DIM);
    let scalar = opt_f64(cfg, "query_pre_attn_scalar")?.unwrap_or(DEFAULT_QUERY_PRE_ATTN_SCALAR);
    if scalar <= 0.0 {
        return Err(field_err("query_pre_attn_scalar", "must be positive"));
    }
    let (global, local, linear) = rope(cfg)?;
    let features = BlockFeatures {
        embedding_scale: Some((hidden_size as f64).sqrt() as f32),
        activation: Activation::GeluTanh,
        post_norms: true,
        attention_scale: Some(scalar.powf(-0.5) as f32),
        final_logit_softcap: opt_f64(cfg, "final_logit_softcapping")?.map(|c| c as f32),
        sliding_window: Some(window(cfg, num_layers)?),
        local_rope: Some(local),
        rope_linear_factor: linear,
        moe: None,
    };
    Ok(ModelConfig {
        architecture: Architecture::Gemma3,
        vocab_size: req_usize(cfg, "vocab_size")?,
        hidden_size,
        intermediate_size: req_usize(cfg, "intermediate_size")?,
        num_layers,
        num_heads,
        num_kv_heads: opt_usize(cfg, "num_key_value_heads")?.unwrap_or(num_heads),
        head_dim,
        rms_norm_eps: opt_f64(cfg, "rms_norm_eps")?.unwrap_or(1e-6) as f32,
        rope: global,
        context_len: opt_usize(cfg, "max_position_embeddings")?.unwrap_or(DEFAULT_MAX_POSITIONS),
        tie_word_embeddings: opt_bool(cfg, "tie_word_embeddings")?.unwrap_or(true),
        qkv_bias: false,
        qk_norm: true,
        features,
    })
}

fn check_unsupported(cfg: &Map<String, Value>) -> Result<()> {
    let act = match opt_str(cfg, "hidden_activation")? {
        Some(a) => a,
        None => opt_str(cfg, "hidden_act")?.unwrap_or("gelu_pytorch_tanh"),
    };
    if act != "gelu_pytorch_tanh" {
        return Err(field_err(
            "hidden_activation",
            format!("`{act}` is not supported for Gemma 3 (gelu_pytorch_tanh)"),
        ));
    }
    if present(cfg, "attn_logit_softcapping").is_some() {
        return Err(field_err(
            "attn_logit_softcapping",
            "is not supported (attention logit soft-capping)",
        ));
    }
    for key in ["attention_bias", "use_bidirectional_attention"] {
        if opt_bool(cfg, key)? == Some(true) {
            return Err(field_err(key, "= true is not supported"));
        }
    }
    Ok(())
}

/// Which layers slide: `layer_types` when given, else every layer but each
/// `sliding_window_pattern`-th.
fn window(cfg: &Map<String, Value>, num_layers: usize) -> Result<SlidingWindow> {
    let size = opt_usize(cfg, "sliding_window")?.unwrap_or(DEFAULT_SLIDING_WINDOW);
    if size == 0 {
        return Err(field_err("sliding_window", "must be positive"));
    }
    let layers = match present(cfg, "layer_types") {
        Some(Value::Array(types)) => {
            if types.len() != num_layers {
                return Err(field_err(
                    "layer_types",
                    format!(
                        "lists {} layers, not num_hidden_layers = {num_layers}",
                        types.len()
                    ),
                ));
            }
            types
                .iter()
                .map(|t| match t.as_str() {
                    Some("sliding_attention") => Ok(true),
                    Some("full_attention") => Ok(false),
                    _ => Err(field_err(
                        "layer_types",
                        format!("holds {t} (expected sliding_attention or full_attention)"),
                    )),
                })
                .collect::<Result<Vec<_>>>()?
        }
        Some(v) => return Err(field_err("layer_types", format!("must be a list, not {v}"))),
        None => {
            let pattern = opt_usize(cfg, "sliding_window_pattern")?.unwrap_or(DEFAULT_PATTERN);
            if pattern == 0 {
                return Err(field_err("sliding_window_pattern", "must be positive"));
            }
            (0..num_layers).map(|i| (i + 1) % pattern != 0).collect()
        }
    };
    Ok(SlidingWindow { size, layers })
}

/// An object-valued field, `None` when absent or null.
fn object<'a>(
    m: &'a Map<String, Value>,
    key: &str,
    label: &str,
) -> Result<Option<&'a Map<String, Value>>> {
    match present(m, key) {
        None => Ok(None),
        Some(Value::Object(o)) => Ok(Some(o)),
        Some(v) => Err(field_err(label, format!("must be an object, not {v}"))),
    }
}

/// The global RoPE, the local one and the global layers' linear scaling factor, from the
/// 4.x fields (`rope_theta`, `rope_local_base_freq`, `rope_scaling`) or the 5.x
/// `rope_parameters` (one object per layer type); a non-empty `rope_scaling` wins for the
/// global layers, as in transformers.
fn rope(cfg: &Map<String, Value>) -> Result<(RopeConfig, RopeConfig, Option<f32>)> {
    let empty = Map::new();
    let params = object(cfg, "rope_parameters", "rope_parameters")?;
    let full_label = "rope_parameters.full_attention";
    let local_label = "rope_parameters.sliding_attention";
    let full = match params {
        Some(p) => object(p, "full_attention", full_label)?.unwrap_or(&empty),
        None => &empty,
    };
    let sliding = match params {
        Some(p) => object(p, "sliding_attention", local_label)?.unwrap_or(&empty),
        None => &empty,
    };
    let scaling = object(cfg, "rope_scaling", "rope_scaling")?.filter(|m| !m.is_empty());
    let (global_params, global_label) = match scaling {
        Some(s) => (s, "rope_scaling"),
        None => (full, full_label),
    };
    let global_theta = match opt_f64_labeled(full, "rope_theta", full_label)? {
        Some(t) => t,
        None => opt_f64(cfg, "rope_theta")?.unwrap_or(DEFAULT_GLOBAL_THETA),
    };
    let local_theta = match opt_f64_labeled(sliding, "rope_theta", local_label)? {
        Some(t) => t,
        None => opt_f64(cfg, "rope_local_base_freq")?.unwrap_or(DEFAULT_LOCAL_THETA),
    };
    let linear = match rope_type(global_params, global_label)? {
        "default" => None,
        "linear" => match present(global_params, "factor").and_then(Value::as_f64) {
            Some(f) if f.is_finite() && f > 0.0 => Some(f as f32),
            _ => {
                return Err(field_err(
                    &format!("{global_label}.factor"),
                    "must be a positive number for rope_type linear",
                ))
            }
        },
        other => {
            return Err(field_err(
                &format!("{global_label}.rope_type"),
                format!("`{other}` is not supported for Gemma 3 (default, linear)"),
            ))
        }
    };
    let local_type = rope_type(sliding, local_label)?;
    if local_type != "default" {
        return Err(field_err(
            &format!("{local_label}.rope_type"),
            format!("`{local_type}` is not supported (default)"),
        ));
    }
    let make = |theta: f64| RopeConfig {
        theta: theta as f32,
        style: RopeStyle::Neox,
        llama3_scaling: None,
    };
    Ok((make(global_theta), make(local_theta), linear))
}

fn rope_type<'a>(m: &'a Map<String, Value>, label: &str) -> Result<&'a str> {
    match present(m, "rope_type").or_else(|| present(m, "type")) {
        None => Ok("default"),
        Some(Value::String(s)) => Ok(s.as_str()),
        Some(v) => Err(field_err(
            &format!("{label}.rope_type"),
            format!("must be a string, not {v}"),
        )),
    }
}
