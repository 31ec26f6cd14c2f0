//! Reading a Hugging Face model directory's `config.json` (+ `generation_config.json`) into a
//! [`ModelConfig`], for the architectures tandem implements.
//!
//! Both forms written by transformers are accepted: 4.x (`rope_theta` at the top level and
//! an optional `rope_scaling` object) and 5.x (`rope_parameters` holding `rope_type`,
//! `rope_theta` and the scaling fields). As in transformers, a non-empty `rope_scaling` wins
//! over `rope_parameters`, and `type` is the old spelling of `rope_type`.
//!
//! Defaults follow the transformers config classes: `num_key_value_heads` = heads,
//! `head_dim` = hidden / heads (Qwen3: 128), `tie_word_embeddings` = false,
//! `rms_norm_eps` = 1e-6, `rope_theta` = 10000. Anything tandem's forward pass cannot
//! reproduce exactly (o_proj/MLP biases, other activations, other RoPE types, partial
//! rotary) is a typed error rather than a silent approximation.
//!
//! The architecture must be named by exactly one supported class in `architectures` and/or a
//! supported `model_type` string, the two agreeing when both are given; `torch_dtype` must
//! be float32, float16 or bfloat16. Anything else is refused with the supported list.
//!
//! Mistral's `sliding_window` is honoured by the attention (every layer reads only the last
//! `sliding_window` positions). Qwen's `use_sliding_window` (on some layers only) equals
//! full attention while a sequence is no longer than the window, so `context_len` is capped
//! at the window instead. Gemma 3 has its own reader, `hf_gemma3.rs`.

use std::path::Path;

use serde_json::{Map, Value};

use crate::config::{
    check_size, Architecture, BlockFeatures, Llama3RopeScaling, ModelConfig, RopeConfig, RopeStyle,
    SlidingWindow, HF_CLASSES, HF_MODEL_TYPES,
};
use crate::error::{ModelError, Result};

/// Name of the model description inside a model directory.
pub const CONFIG_FILE: &str = "config.json";
/// Name of the optional generation defaults (stop tokens) inside a model directory.
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";
/// The `torch_dtype` values tandem reads (the safetensors types F32, F16, BF16).
pub const HF_DTYPES: &str = "float32, float16, bfloat16";
/// Largest config file read, in bytes.
const MAX_CONFIG_BYTES: u64 = 16 * 1024 * 1024;

/// What tandem takes from a Hugging Face model directory besides the weights.
#[derive(Debug, Clone, PartialEq)]
pub struct HfModelInfo {
    pub config: ModelConfig,
    /// Tokens that end generation: `generation_config.json`'s `eos_token_id` (an int or a
    /// list), else `config.json`'s; empty when neither names one. Each id is < vocab_size.
    pub eos_token_ids: Vec<u32>,
    /// `bos_token_id` from `generation_config.json`, else `config.json`.
    pub bos_token_id: Option<u32>,
    /// The stored weights' dtype as the config names it (`torch_dtype`, or 5.x `dtype`).
    pub torch_dtype: Option<String>,
}

/// Reads `config.json` and, if present, `generation_config.json` from `dir`.
pub fn load_hf_config(dir: &Path) -> Result<HfModelInfo> {
    let config = read_text(&dir.join(CONFIG_FILE))?
        .ok_or_else(|| ModelError::NotAModel(format!("no {CONFIG_FILE} in {}", dir.display())))?;
    let generation = read_text(&dir.join(GENERATION_CONFIG_FILE))?;
    parse_hf_config(&config, generation.as_deref())
}

/// Reads a small text file; `Ok(None)` if it does not exist.
fn read_text(path: &Path) -> Result<Option<String>> {
    let io_err = |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    };
    let size = match std::fs::metadata(path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(e)),
    };
    if size > MAX_CONFIG_BYTES {
        return Err(ModelError::Config(format!(
            "{} is {size} bytes, more than the {MAX_CONFIG_BYTES} accepted",
            path.display()
        )));
    }
    std::fs::read_to_string(path).map(Some).map_err(io_err)
}

/// Parses the text of `config.json` and, if given, of `generation_config.json`.
pub fn parse_hf_config(config_json: &str, generation_json: Option<&str>) -> Result<HfModelInfo> {
    let cfg = parse_object(config_json, CONFIG_FILE)?;
    let generation = generation_json
        .map(|text| parse_object(text, GENERATION_CONFIG_FILE))
        .transpose()?;
    let config = model_config(&cfg)?;
    config.validate().map_err(ModelError::Config)?;
    let pick = |key: &str| -> Result<Option<Vec<u32>>> {
        if let Some(v) = generation.as_ref().and_then(|g| present(g, key)) {
            return token_ids(v, GENERATION_CONFIG_FILE, key, config.vocab_size).map(Some);
        }
        present(&cfg, key)
            .map(|v| token_ids(v, CONFIG_FILE, key, config.vocab_size))
            .transpose()
    };
    let eos_token_ids = pick("eos_token_id")?.unwrap_or_default();
    let bos_token_id = match pick("bos_token_id")?.as_deref() {
        None => None,
        Some([id]) => Some(*id),
        Some(_) => return Err(field_err("bos_token_id", "must be a single token id")),
    };
    let torch_dtype = torch_dtype(&cfg)?;
    Ok(HfModelInfo {
        config,
        eos_token_ids,
        bos_token_id,
        torch_dtype,
    })
}

fn parse_object(text: &str, file: &str) -> Result<Map<String, Value>> {
    match serde_json::from_str(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ModelError::Config(format!("{file} is not a JSON object"))),
        Err(e) => Err(ModelError::Config(format!("{file} is not valid JSON: {e}"))),
    }
}

/// `num_hidden_layers`, checked before anything is built per layer.
pub(crate) fn layer_count(cfg: &Map<String, Value>) -> Result<usize> {
    let n = req_usize(cfg, "num_hidden_layers")?;
    check_size("num_hidden_layers", n).map_err(|e| field_err("num_hidden_layers", e))?;
    Ok(n)
}

pub(crate) fn field_err(field: &str, what: impl std::fmt::Display) -> ModelError {
    ModelError::Config(format!("field `{field}` {what}"))
}

/// The value of `key`, treating an explicit `null` like an absent key.
pub(crate) fn present<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

pub(crate) fn opt_usize(obj: &Map<String, Value>, key: &str) -> Result<Option<usize>> {
    opt_usize_labeled(obj, key, key)
}

/// Like [`opt_usize`]; errors name the field `label`.
fn opt_usize_labeled(obj: &Map<String, Value>, key: &str, label: &str) -> Result<Option<usize>> {
    present(obj, key)
        .map(|v| {
            v.as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| field_err(label, format!("must be a non-negative integer, not {v}")))
        })
        .transpose()
}

pub(crate) fn req_usize(obj: &Map<String, Value>, key: &str) -> Result<usize> {
    opt_usize(obj, key)?.ok_or_else(|| field_err(key, "is missing"))
}

pub(crate) fn opt_f64(obj: &Map<String, Value>, key: &str) -> Result<Option<f64>> {
    opt_f64_labeled(obj, key, key)
}

/// Like [`opt_f64`]; errors name the field `label` (e.g. `rope_parameters.rope_theta`).
pub(crate) fn opt_f64_labeled(
    obj: &Map<String, Value>,
    key: &str,
    label: &str,
) -> Result<Option<f64>> {
    present(obj, key)
        .map(|v| {
            v.as_f64()
                .filter(|x| x.is_finite())
                .ok_or_else(|| field_err(label, format!("must be a finite number, not {v}")))
        })
        .transpose()
}

pub(crate) fn opt_bool(obj: &Map<String, Value>, key: &str) -> Result<Option<bool>> {
    present(obj, key)
        .map(|v| {
            v.as_bool()
                .ok_or_else(|| field_err(key, format!("must be true or false, not {v}")))
        })
        .transpose()
}

pub(crate) fn opt_str<'a>(obj: &'a Map<String, Value>, key: &str) -> Result<Option<&'a str>> {
    present(obj, key)
        .map(|v| {
            v.as_str()
                .ok_or_else(|| field_err(key, format!("must be a string, not {v}")))
        })
        .transpose()
}

/// A token id or a list of them, each checked against the vocabulary.
fn token_ids(v: &Value, file: &str, key: &str, vocab: usize) -> Result<Vec<u32>> {
    let one = |x: &Value| -> Result<u32> {
        x.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|&n| (n as usize) < vocab)
            .ok_or_else(|| {
                field_err(
                    key,
                    format!("in {file}: {x} is not a token id below vocab_size {vocab}"),
                )
            })
    };
    match v {
        Value::Array(items) => items.iter().map(one).collect(),
        other => Ok(vec![one(other)?]),
    }
}

/// The architecture named by `architectures` (exactly one supported class) and
/// `model_type` (a supported string); when both are present they must agree.
fn architecture(cfg: &Map<String, Value>) -> Result<Architecture> {
    let by_class = match present(cfg, "architectures") {
        None => None,
        Some(Value::Array(list)) => Some(class_architecture(list)?),
        Some(v) => {
            return Err(field_err(
                "architectures",
                format!("must be a list of one class name, not {v}"),
            ))
        }
    };
    let by_type = match present(cfg, "model_type") {
        None => None,
        Some(Value::String(t)) => {
            let arch = Architecture::from_hf_model_type(t).ok_or_else(|| {
                ModelError::UnsupportedArchitecture {
                    name: t.clone(),
                    field: "model_type".into(),
                    supported: HF_MODEL_TYPES,
                }
            })?;
            Some((arch, t.as_str()))
        }
        Some(v) => {
            return Err(field_err(
                "model_type",
                format!("must be a string, not {v}"),
            ))
        }
    };
    match (by_class, by_type) {
        (Some((a, class)), Some((b, t))) if a != b => Err(field_err(
            "model_type",
            format!("`{t}` disagrees with `architectures` [\"{class}\"]"),
        )),
        (Some((a, _)), _) | (None, Some((a, _))) => Ok(a),
        (None, None) => Err(field_err(
            "architectures",
            "is missing (and so is `model_type`)",
        )),
    }
}

/// The architecture of an `architectures` list, which must hold one supported class name.
fn class_architecture(list: &[Value]) -> Result<(Architecture, &str)> {
    let class = match list {
        [Value::String(class)] => class,
        [] => {
            return Err(field_err(
                "architectures",
                format!("is an empty list (expected one of {HF_CLASSES})"),
            ))
        }
        [_] => {
            return Err(field_err(
                "architectures",
                format!("must hold a class name (a string), not {}", list[0]),
            ))
        }
        _ => {
            return Err(field_err(
                "architectures",
                format!("lists {} entries; expected exactly one", list.len()),
            ))
        }
    };
    let arch =
        Architecture::from_hf_class(class).ok_or_else(|| ModelError::UnsupportedArchitecture {
            name: class.clone(),
            field: "architectures".into(),
            supported: HF_CLASSES,
        })?;
    Ok((arch, class))
}

/// The stored dtype the config names (`torch_dtype`, or 5.x `dtype`), which must be one
/// tandem reads.
fn torch_dtype(cfg: &Map<String, Value>) -> Result<Option<String>> {
    let (field, value) = match (present(cfg, "torch_dtype"), present(cfg, "dtype")) {
        (Some(v), _) => ("torch_dtype", v),
        (None, Some(v)) => ("dtype", v),
        (None, None) => return Ok(None),
    };
    let Value::String(name) = value else {
        return Err(field_err(field, format!("must be a string, not {value}")));
    };
    if !HF_DTYPES.split(", ").any(|d| d == name) {
        return Err(ModelError::UnsupportedDtype {
            name: name.clone(),
            field: field.into(),
            supported: HF_DTYPES,
        });
    }
    Ok(Some(name.clone()))
}

/// Rejects options that change the computation in ways tandem does not implement.
fn check_unsupported(cfg: &Map<String, Value>, arch: Architecture) -> Result<()> {
    let act = opt_str(cfg, "hidden_act")?.unwrap_or("silu");
    if act != "silu" {
        return Err(field_err(
            "hidden_act",
            format!("`{act}` is not supported (silu)"),
        ));
    }
    if opt_bool(cfg, "mlp_bias")? == Some(true) {
        return Err(field_err("mlp_bias", "= true is not supported"));
    }
    // Llama and Qwen3 put this bias on q, k, v *and* o; Qwen2 ignores the field.
    if arch != Architecture::Qwen2 && opt_bool(cfg, "attention_bias")? == Some(true) {
        return Err(field_err(
            "attention_bias",
            "= true (a bias on o_proj as well as q/k/v) is not supported",
        ));
    }
    Ok(())
}

fn model_config(cfg: &Map<String, Value>) -> Result<ModelConfig> {
    let architecture = architecture(cfg)?;
    if architecture == Architecture::Gemma3 {
        return crate::hf_gemma3::gemma3_config(cfg);
    }
    check_unsupported(cfg, architecture)?;
    let hidden_size = req_usize(cfg, "hidden_size")?;
    let num_heads = req_usize(cfg, "num_attention_heads")?;
    let head_dim = match opt_usize(cfg, "head_dim")? {
        Some(d) => d,
        None if architecture == Architecture::Qwen3 => 128,
        None if num_heads > 0 && hidden_size % num_heads == 0 => hidden_size / num_heads,
        None => {
            return Err(field_err(
                "head_dim",
                format!(
                "is missing and hidden_size {hidden_size} is not a multiple of {num_heads} heads"
            ),
            ))
        }
    };
    let max_positions = req_usize(cfg, "max_position_embeddings")?;
    let rms_norm_eps = opt_f64(cfg, "rms_norm_eps")?.unwrap_or(1e-6) as f32;
    let num_layers = layer_count(cfg)?;
    let features = BlockFeatures {
        sliding_window: mistral_window(cfg, architecture, num_layers)?,
        moe: crate::hf_moe::hf_experts(cfg, architecture)?,
        ..BlockFeatures::default()
    };
    Ok(ModelConfig {
        architecture,
        vocab_size: req_usize(cfg, "vocab_size")?,
        hidden_size,
        intermediate_size: req_usize(cfg, "intermediate_size")?,
        num_layers,
        num_heads,
        num_kv_heads: opt_usize(cfg, "num_key_value_heads")?.unwrap_or(num_heads),
        head_dim,
        rms_norm_eps,
        rope: rope_config(cfg, max_positions)?,
        context_len: context_len(cfg, architecture, max_positions)?,
        tie_word_embeddings: opt_bool(cfg, "tie_word_embeddings")?.unwrap_or(false),
        qkv_bias: architecture == Architecture::Qwen2,
        qk_norm: matches!(architecture, Architecture::Qwen3 | Architecture::Qwen3Moe),
        features,
    })
}

/// Mistral's (read as Llama), Mixtral's and Phi-3's `sliding_window`: every layer attends to that
/// many positions.
fn mistral_window(
    cfg: &Map<String, Value>,
    arch: Architecture,
    num_layers: usize,
) -> Result<Option<SlidingWindow>> {
    if !matches!(
        arch,
        Architecture::Llama | Architecture::Mixtral | Architecture::Phi3
    ) {
        return Ok(None);
    }
    match opt_usize(cfg, "sliding_window")? {
        Some(0) => Err(field_err("sliding_window", "must be positive")),
        Some(size) => Ok(Some(SlidingWindow {
            size,
            layers: vec![true; num_layers],
        })),
        None => Ok(None),
    }
}

/// `max_position_embeddings`, capped at the attention window if the model slides one.
fn context_len(
    cfg: &Map<String, Value>,
    arch: Architecture,
    max_positions: usize,
) -> Result<usize> {
    let window = match arch {
        // Mistral (read as Llama) slides whenever `sliding_window` is set, which the
        // attention honours (`mistral_window`); Gemma 3 is read by `hf_gemma3`.
        Architecture::Llama | Architecture::Mixtral | Architecture::Gemma3 | Architecture::Phi3 => {
            None
        }
        Architecture::Qwen2 | Architecture::Qwen3 | Architecture::Qwen3Moe => {
            if opt_bool(cfg, "use_sliding_window")?.unwrap_or(false) {
                opt_usize(cfg, "sliding_window")?
            } else {
                None
            }
        }
    };
    match window {
        Some(0) => Err(field_err("sliding_window", "must be positive")),
        Some(w) => Ok(max_positions.min(w)),
        None => Ok(max_positions),
    }
}

/// The object holding the RoPE parameters and its field name: a non-empty `rope_scaling`
/// (4.x), else `rope_parameters` (5.x), else `None` (defaults only).
fn rope_params(cfg: &Map<String, Value>) -> Result<Option<(&Map<String, Value>, &'static str)>> {
    let params = match (
        present(cfg, "rope_scaling"),
        present(cfg, "rope_parameters"),
    ) {
        (Some(Value::Object(m)), _) if !m.is_empty() => Some((m, "rope_scaling")),
        (Some(v), _) if !v.is_object() => {
            return Err(field_err("rope_scaling", "must be an object"))
        }
        (_, Some(Value::Object(m))) => Some((m, "rope_parameters")),
        (_, Some(_)) => return Err(field_err("rope_parameters", "must be an object")),
        _ => None,
    };
    // transformers 5 nests one parameter set per layer type in some models; none of ours.
    if let Some((m, field)) = params {
        if let Some((key, _)) = m.iter().find(|(_, v)| v.is_object()) {
            return Err(field_err(
                &format!("{field}.{key}"),
                "per-layer-type RoPE parameters are not supported",
            ));
        }
    }
    Ok(params)
}

/// The RoPE parameters from either the 4.x or the 5.x layout.
fn rope_config(cfg: &Map<String, Value>, max_positions: usize) -> Result<RopeConfig> {
    let empty = Map::new();
    let (params, field) = rope_params(cfg)?.unwrap_or((&empty, "rope_parameters"));
    let sub = |key: &str| format!("{field}.{key}");
    let theta = match opt_f64_labeled(params, "rope_theta", &sub("rope_theta"))? {
        Some(t) => t,
        None => opt_f64(cfg, "rope_theta")?.unwrap_or(10000.0),
    };
    let partial = opt_f64_labeled(
        params,
        "partial_rotary_factor",
        &sub("partial_rotary_factor"),
    )?;
    if let Some(f) = partial.or(opt_f64(cfg, "partial_rotary_factor")?) {
        if f != 1.0 {
            return Err(field_err(
                "partial_rotary_factor",
                format!("= {f} is not supported"),
            ));
        }
    }
    let rope_type = match present(params, "rope_type").or_else(|| present(params, "type")) {
        None => "default",
        Some(Value::String(s)) => s.as_str(),
        Some(v) => {
            return Err(field_err(
                &sub("rope_type"),
                format!("must be a string, not {v}"),
            ))
        }
    };
    let llama3_scaling = match rope_type {
        "default" => None,
        "llama3" => Some(llama3_scaling(params, field, max_positions)?),
        other => {
            return Err(field_err(
                &sub("rope_type"),
                format!("`{other}` is not supported (default, llama3)"),
            ))
        }
    };
    Ok(RopeConfig {
        theta: theta as f32,
        style: RopeStyle::Neox,
        llama3_scaling,
    })
}

fn llama3_scaling(
    params: &Map<String, Value>,
    field: &str,
    max_positions: usize,
) -> Result<Llama3RopeScaling> {
    let num = |key: &str| -> Result<f64> {
        let name = format!("{field}.{key}");
        match present(params, key).map(Value::as_f64) {
            Some(Some(x)) if x.is_finite() && x > 0.0 => Ok(x),
            Some(_) => Err(field_err(&name, "must be a positive number")),
            None => Err(field_err(
                &name,
                "is missing (required for rope_type llama3)",
            )),
        }
    };
    let (factor, low, high) = (
        num("factor")?,
        num("low_freq_factor")?,
        num("high_freq_factor")?,
    );
    if high <= low {
        return Err(field_err(
            &format!("{field}.high_freq_factor"),
            format!("({high}) must exceed low_freq_factor ({low})"),
        ));
    }
    let label = format!("{field}.original_max_position_embeddings");
    let original = opt_usize_labeled(params, "original_max_position_embeddings", &label)?
        .unwrap_or(max_positions);
    if original == 0 {
        return Err(field_err(&label, "must be positive"));
    }
    Ok(Llama3RopeScaling {
        factor: factor as f32,
        low_freq_factor: low as f32,
        high_freq_factor: high as f32,
        original_max_position_embeddings: original,
    })
}
