//! Reading a PEFT LoRA adapter directory: `adapter_config.json` and
//! `adapter_model.safetensors`, whose tensors are named
//! `base_model.model.model.layers.{l}.self_attn.q_proj.lora_A.weight` (`[r, in]`) and
//! `….lora_B.weight` (`[out, r]`).
//!
//! What is read: `r`, `lora_alpha`, `use_rslora`, and the per-module `rank_pattern` and
//! `alpha_pattern` (a key applies to the modules whose name is the key or ends with `.key`).
//! The targets are the projections q/k/v/o and gate/up/down, and Phi-3's fused `qkv_proj`
//! and `gate_up_proj`, whose `B` rows are split as the base model's fused weights are. What
//! changes the computation in other ways (DoRA, biases, `fan_in_fan_out`, fully trained
//! `modules_to_save`, adapters of embeddings or of experts) is refused with an error that
//! names it, never ignored.
//!
//! Where the base model's q and k rows are stored permuted for interleaved RoPE (GGUF files
//! of Llama and Mixtral, converted by llama.cpp), the rows of `B` are permuted the same way.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Map, Value};
use tandem_kernels::DType;

use super::{LoraAdapter, LoraPair, Projection, MAX_RANK};
use crate::config::{ModelConfig, RopeStyle};
use crate::error::{ModelError, Result};
use crate::safetensors::add_safetensors_file;
use crate::weights::TensorSet;

const CONFIG_FILE: &str = "adapter_config.json";
const WEIGHTS_FILE: &str = "adapter_model.safetensors";
/// Largest `adapter_config.json` read, in bytes.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Loads the PEFT adapter in `dir` for a model of configuration `config`.
pub fn load_peft_adapter(dir: &Path, config: &ModelConfig) -> Result<LoraAdapter> {
    let err = |reason: String| ModelError::Adapter {
        path: dir.to_path_buf(),
        reason,
    };
    let settings = Settings::read(dir).map_err(err)?;
    let mut tensors = TensorSet::default();
    add_safetensors_file(&mut tensors, &dir.join(WEIGHTS_FILE))?;
    let mut halves: BTreeMap<(usize, String), [Option<Matrix>; 2]> = BTreeMap::new();
    for name in tensors.names() {
        let (layer, module, half) = parse_name(name, config.num_layers).map_err(err)?;
        let t = tensors.require(name)?;
        let [rows, cols] = *t.shape else {
            return Err(err(format!("`{name}` has shape {:?}, not 2-D", t.shape)));
        };
        if !matches!(t.dtype, DType::F32 | DType::F16 | DType::BF16) {
            return Err(err(format!(
                "`{name}` is {}, not f32, f16 or bf16",
                t.dtype
            )));
        }
        let data = t.data.to_vec();
        let dtype = t.dtype;
        halves.entry((layer, module)).or_default()[half] = Some(Matrix {
            rows,
            cols,
            dtype,
            data,
        });
    }
    if halves.is_empty() {
        return Err(err(format!("{WEIGHTS_FILE} holds no LoRA tensors")));
    }
    let mut adapter = LoraAdapter::empty(config.num_layers);
    for ((layer, module), [a, b]) in halves {
        let at = format!("layer {layer} `{module}`");
        let (Some(a), Some(b)) = (a, b) else {
            return Err(err(format!("{at} lacks its lora_A or lora_B")));
        };
        let scale = settings.scale(layer, &module, a.rows).map_err(err)?;
        for (p, pair) in
            targets(config, &module, a, b, scale).map_err(|e| err(format!("{at}: {e}")))?
        {
            adapter.set(layer, p, pair);
        }
    }
    Ok(adapter)
}

/// The settings of `adapter_config.json` that tandem reads.
struct Settings {
    r: usize,
    alpha: f64,
    rslora: bool,
    rank_pattern: Vec<(String, usize)>,
    alpha_pattern: Vec<(String, f64)>,
}

impl Settings {
    fn read(dir: &Path) -> std::result::Result<Settings, String> {
        let path = dir.join(CONFIG_FILE);
        let size = std::fs::metadata(&path)
            .map_err(|e| format!("{CONFIG_FILE}: {e}"))?
            .len();
        if size > MAX_CONFIG_BYTES {
            return Err(format!(
                "{CONFIG_FILE} is {size} bytes (at most {MAX_CONFIG_BYTES})"
            ));
        }
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{CONFIG_FILE}: {e}"))?;
        let cfg: Map<String, Value> =
            serde_json::from_str(&text).map_err(|e| format!("{CONFIG_FILE}: {e}"))?;
        check_unsupported(&cfg)?;
        let r = positive_int(&cfg, "r")?;
        let alpha = match cfg.get("lora_alpha") {
            None | Some(Value::Null) => r as f64,
            Some(v) => v
                .as_f64()
                .filter(|a| a.is_finite())
                .ok_or("`lora_alpha` must be a number")?,
        };
        Ok(Settings {
            r,
            alpha,
            rslora: cfg
                .get("use_rslora")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            rank_pattern: pattern(&cfg, "rank_pattern", |v| v.as_u64().map(|r| r as usize))?,
            alpha_pattern: pattern(&cfg, "alpha_pattern", Value::as_f64)?,
        })
    }

    /// The scale of `module` of `layer`, whose `A` has `rank` rows: `alpha / r`, or
    /// `alpha / √r` with rsLoRA, each from its pattern when one matches.
    fn scale(&self, layer: usize, module: &str, rank: usize) -> std::result::Result<f32, String> {
        let full = format!("model.layers.{layer}.{module}");
        let matching = |key: &str| full == key || full.ends_with(&format!(".{key}"));
        let r = (self.rank_pattern.iter())
            .find(|(k, _)| matching(k))
            .map_or(self.r, |e| e.1);
        if r != rank {
            return Err(format!(
                "layer {layer} `{module}` has rank {rank}, the config says {r}"
            ));
        }
        let alpha = (self.alpha_pattern.iter())
            .find(|(k, _)| matching(k))
            .map_or(self.alpha, |e| e.1);
        let denominator = if self.rslora {
            (r as f64).sqrt()
        } else {
            r as f64
        };
        let scale = alpha / denominator;
        if scale.is_nan() || scale.abs() > MAX_SCALE {
            return Err(format!(
                "layer {layer} `{module}`: alpha {alpha} / {denominator} is not a scale in \
                 -{MAX_SCALE}..={MAX_SCALE}"
            ));
        }
        Ok(scale as f32)
    }
}

/// The largest scale (`alpha / r`) accepted: trained adapters use 1/512 to 512, and a scale
/// past 2^16 would turn activations into infinities.
const MAX_SCALE: f64 = 65536.0;

/// Refuses the settings that change the computation in ways tandem does not implement.
fn check_unsupported(cfg: &Map<String, Value>) -> std::result::Result<(), String> {
    let set = |key: &str| !matches!(cfg.get(key), None | Some(Value::Null | Value::Bool(false)));
    if let Some(kind) = cfg.get("peft_type").and_then(Value::as_str) {
        if kind != "LORA" {
            return Err(format!(
                "`peft_type` is {kind}; only LORA adapters are supported"
            ));
        }
    }
    for key in [
        "use_dora",
        "fan_in_fan_out",
        "lora_bias",
        "layer_replication",
    ] {
        if set(key) {
            return Err(format!("`{key}` is set, which is not supported"));
        }
    }
    if cfg
        .get("bias")
        .and_then(Value::as_str)
        .is_some_and(|b| b != "none")
    {
        return Err("`bias` other than \"none\" is not supported".into());
    }
    match cfg.get("modules_to_save") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Array(m)) if m.is_empty() => Ok(()),
        Some(m) => Err(format!(
            "`modules_to_save` ({m}) is not supported: only low-rank corrections"
        )),
    }
}

fn positive_int(cfg: &Map<String, Value>, key: &str) -> std::result::Result<usize, String> {
    let r = cfg
        .get(key)
        .and_then(Value::as_u64)
        .ok_or(format!("`{key}` must be a positive integer"))?;
    if r == 0 || r as usize > MAX_RANK {
        return Err(format!("`{key}` = {r} is outside 1..={MAX_RANK}"));
    }
    Ok(r as usize)
}

fn pattern<T>(
    cfg: &Map<String, Value>,
    key: &str,
    value: impl Fn(&Value) -> Option<T>,
) -> std::result::Result<Vec<(String, T)>, String> {
    match cfg.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Object(map)) => map
            .iter()
            .map(|(k, v)| {
                value(v)
                    .map(|v| (k.clone(), v))
                    .ok_or(format!("`{key}.{k}` is {v}"))
            })
            .collect(),
        Some(v) => Err(format!("`{key}` must be an object, not {v}")),
    }
}

/// `(layer, module, 0 for A or 1 for B)` of a tensor name such as
/// `base_model.model.model.layers.3.mlp.down_proj.lora_B.weight`.
fn parse_name(
    name: &str,
    num_layers: usize,
) -> std::result::Result<(usize, String, usize), String> {
    let parts: Vec<&str> = name.split('.').collect();
    let half = match parts.iter().rev().nth(1) {
        Some(&"lora_A") => 0,
        Some(&"lora_B") => 1,
        _ => {
            return Err(format!(
                "`{name}` is not a LoRA tensor (lora_A or lora_B weight)"
            ))
        }
    };
    let at = parts.iter().position(|&p| p == "layers");
    let layer = at.and_then(|i| parts.get(i + 1)?.parse::<usize>().ok());
    let (Some(i), Some(layer)) = (at, layer) else {
        return Err(format!(
            "`{name}` names no layer: adapters of embeddings or the LM head are not supported"
        ));
    };
    if layer >= num_layers {
        return Err(format!(
            "`{name}`: layer {layer}, the model has {num_layers}"
        ));
    }
    // The module path inside the layer, e.g. `self_attn.q_proj`.
    let module = parts[i + 2..parts.len() - 2].join(".");
    Ok((layer, module, half))
}

/// A matrix read from the file, row-major, in its stored dtype.
struct Matrix {
    rows: usize,
    cols: usize,
    dtype: DType,
    data: Vec<u8>,
}

/// The projections `module` changes, with their corrections (a fused module gives several,
/// sharing `A`).
fn targets(
    config: &ModelConfig,
    module: &str,
    a: Matrix,
    b: Matrix,
    scale: f32,
) -> std::result::Result<Vec<(Projection, LoraPair)>, String> {
    let (h, q, kv, ff) = (
        config.hidden_size,
        config.q_dim(),
        config.kv_dim(),
        config.intermediate_size,
    );
    let name = module.rsplit('.').next().unwrap_or(module);
    let moe = config.features.moe.is_some();
    let (in_dim, parts): (usize, Vec<(Projection, usize)>) = match name {
        "q_proj" => (h, vec![(Projection::Q, q)]),
        "k_proj" => (h, vec![(Projection::K, kv)]),
        "v_proj" => (h, vec![(Projection::V, kv)]),
        "o_proj" => (q, vec![(Projection::O, h)]),
        "qkv_proj" => (
            h,
            vec![(Projection::Q, q), (Projection::K, kv), (Projection::V, kv)],
        ),
        "gate_proj" if !moe => (h, vec![(Projection::Gate, ff)]),
        "up_proj" if !moe => (h, vec![(Projection::Up, ff)]),
        "gate_up_proj" if !moe => (h, vec![(Projection::Gate, ff), (Projection::Up, ff)]),
        "down_proj" if !moe => (ff, vec![(Projection::Down, h)]),
        _ => {
            return Err(
                "not a projection tandem can adapt (q/k/v/o, gate/up/down of a dense MLP)".into(),
            )
        }
    };
    let rank = a.rows;
    let out_dim: usize = parts.iter().map(|p| p.1).sum();
    if rank == 0 || rank > MAX_RANK || a.cols != in_dim || b.rows != out_dim || b.cols != rank {
        return Err(format!(
            "A is {}x{} and B {}x{}; expected A r x {in_dim} and B {out_dim} x r, r in 1..={MAX_RANK}",
            a.rows, a.cols, b.rows, b.cols
        ));
    }
    if a.dtype != b.dtype {
        return Err(format!(
            "A is {} and B {}; they must match",
            a.dtype, b.dtype
        ));
    }
    let row = b.data.len() / b.rows; // bytes of a row of B: `rank` elements
    let mut start = 0;
    let mut out = Vec::new();
    for (p, rows) in parts {
        let mut b_rows = b.data[start * row..(start + rows) * row].to_vec();
        start += rows;
        let rotated = matches!(p, Projection::Q | Projection::K);
        if config.rope.style == RopeStyle::Interleaved && rotated {
            b_rows = interleave_heads(&b_rows, row, config.head_dim);
        }
        let (dtype, a) = (a.dtype, a.data.clone());
        out.push((
            p,
            LoraPair {
                rank,
                dtype,
                a,
                b: b_rows,
                scale,
            },
        ));
    }
    Ok(out)
}

/// The rows of `b` (`[heads · head_dim]` rows of `row` bytes) in the order llama.cpp's
/// converter stores q and k for interleaved RoPE: within each head, row `2i + s` is the
/// original row `s · head_dim / 2 + i`.
fn interleave_heads(b: &[u8], row: usize, head_dim: usize) -> Vec<u8> {
    let half = head_dim / 2;
    let mut out = vec![0; b.len()];
    let heads = b
        .chunks_exact(head_dim * row)
        .zip(out.chunks_exact_mut(head_dim * row));
    for (head_in, head_out) in heads {
        for i in 0..half {
            for s in 0..2 {
                let (from, to) = ((s * half + i) * row, (2 * i + s) * row);
                head_out[to..to + row].copy_from_slice(&head_in[from..from + row]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_give_layer_module_and_half() {
        let n = "base_model.model.model.layers.3.mlp.down_proj.lora_B.weight";
        assert_eq!(parse_name(n, 4), Ok((3, "mlp.down_proj".into(), 1)));
        assert!(parse_name(n, 3).is_err());
        assert!(parse_name("base_model.model.lm_head.lora_A.weight", 4).is_err());
        assert!(parse_name("base_model.model.model.layers.0.mlp.down_proj.weight", 4).is_err());
    }

    #[test]
    fn interleaving_pairs_each_row_with_its_rotation_partner() {
        // One head of 4 rows of 1 byte: rows 0 and 2 rotate together, 1 and 3.
        assert_eq!(interleave_heads(&[0, 1, 2, 3], 1, 4), vec![0, 2, 1, 3]);
    }
}
