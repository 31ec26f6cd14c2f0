//! Reading a PEFT LoRA adapter directory: `adapter_config.json` (`peft_config.rs`) and
//! `adapter_model.safetensors`, whose tensors are named
//! `base_model.model.model.layers.{l}.self_attn.q_proj.lora_A.weight` (`[r, in]`) and
//! `….lora_B.weight` (`[out, r]`).
//!
//! The targets are the attention's q/k/v/o and a dense MLP's gate/up/down projections, or,
//! for Phi-3, its fused `qkv_proj` and `gate_up_proj` (whose `B` rows are split as the
//! fused weights are) with `o_proj` and `down_proj`. A tensor of any other module (an
//! embedding, the LM head, an expert, a vision tower), of a module the config does not
//! target, a second correction of one projection, a shape of another model, or a value that
//! is not finite is refused with an error that names it, never ignored. Where the base
//! model's q and k rows are stored permuted for interleaved RoPE (GGUF files of Llama and
//! Mixtral, converted by llama.cpp), the rows of `B` are permuted the same way.

use std::collections::BTreeMap;
use std::path::Path;

use tandem_kernels::DType;

use super::peft_config::PeftConfig;
use super::{LoraAdapter, LoraPair, Projection, MAX_RANK};
use crate::config::{Architecture, ModelConfig, RopeStyle};
use crate::error::{ModelError, Result};
use crate::safetensors::add_safetensors_file;
use crate::weights::{TensorRef, TensorSet};

const WEIGHTS_FILE: &str = "adapter_model.safetensors";
/// What precedes a module's name in a tensor's name.
const PREFIX: &str = "base_model.model.";

/// Loads the PEFT adapter in `dir` for a model of configuration `config`.
pub fn load_peft_adapter(dir: &Path, config: &ModelConfig) -> Result<LoraAdapter> {
    let err = |reason: String| ModelError::Adapter {
        path: dir.to_path_buf(),
        reason,
    };
    let settings = PeftConfig::read(dir).map_err(err)?;
    let mut tensors = TensorSet::default();
    add_safetensors_file(&mut tensors, &dir.join(WEIGHTS_FILE))?;
    let mut halves: BTreeMap<(usize, String), [Option<Matrix>; 2]> = BTreeMap::new();
    for name in tensors.names() {
        let multimodal = config.architecture == Architecture::Gemma3;
        let t = TensorName::parse(name, config.num_layers, multimodal).map_err(err)?;
        if !settings.targets(&t.module, t.layer) {
            return Err(err(format!(
                "`{name}`: target_modules, layers_to_transform and exclude_modules leave its \
                 module out"
            )));
        }
        let matrix = Matrix::read(tensors.require(name)?).map_err(err)?;
        halves.entry((t.layer, t.module)).or_default()[t.half] = Some(matrix);
    }
    if halves.is_empty() {
        return Err(err(format!("{WEIGHTS_FILE} holds no LoRA tensors")));
    }
    let mut adapter = LoraAdapter::empty(config.num_layers);
    for ((layer, module), [a, b]) in halves {
        let (Some(a), Some(b)) = (a, b) else {
            return Err(err(format!("`{module}` lacks its lora_A or lora_B")));
        };
        let scale = settings.scale(&module, a.rows).map_err(err)?;
        let inner = module
            .split_once(&format!("layers.{layer}."))
            .map_or("", |(_, m)| m);
        let pairs =
            corrections(config, inner, a, b, scale).map_err(|e| err(format!("`{module}`: {e}")))?;
        for (p, pair) in pairs {
            if adapter.get(layer, p).is_some() {
                return Err(err(format!(
                    "`{module}`: a second correction of layer {layer}'s {p:?}"
                )));
            }
            adapter.set(layer, p, pair);
        }
    }
    Ok(adapter)
}

/// What a LoRA tensor's name says.
#[derive(Debug, PartialEq)]
struct TensorName {
    layer: usize,
    /// The module's name in the model, e.g. `model.layers.3.mlp.down_proj`.
    module: String,
    /// 0 for `lora_A`, 1 for `lora_B`.
    half: usize,
}

impl TensorName {
    /// Parses `base_model.model.model.layers.3.mlp.down_proj.lora_B.weight` (a `multimodal`
    /// model's text layers may sit under `model.language_model`).
    fn parse(
        name: &str,
        num_layers: usize,
        multimodal: bool,
    ) -> std::result::Result<TensorName, String> {
        let not_lora = || format!("`{name}` is not a LoRA weight (…lora_A.weight, …lora_B.weight)");
        let rest = name.strip_prefix(PREFIX).ok_or_else(not_lora)?;
        let (module, half) = match rest
            .strip_suffix(".weight")
            .and_then(|m| m.rsplit_once('.'))
        {
            Some((module, "lora_A")) => (module, 0),
            Some((module, "lora_B")) => (module, 1),
            _ => return Err(not_lora()),
        };
        let parts: Vec<&str> = module.split('.').collect();
        let at = parts.iter().position(|&p| p == "layers");
        let layer = at.and_then(|i| parts.get(i + 1)?.parse::<usize>().ok());
        let (Some(i), Some(layer)) = (at, layer) else {
            return Err(format!(
                "`{name}` names no layer: adapters of embeddings or the LM head are not supported"
            ));
        };
        let language_model = if multimodal {
            &["model", "language_model"][..]
        } else {
            &["model"][..]
        };
        if parts[..i] != ["model"] && parts[..i] != *language_model {
            return Err(format!("`{name}` is not in the language model's layers"));
        }
        if layer >= num_layers {
            return Err(format!(
                "`{name}`: layer {layer}, the model has {num_layers}"
            ));
        }
        Ok(TensorName {
            layer,
            module: module.to_string(),
            half,
        })
    }
}

/// A matrix read from the file, row-major, in its stored dtype.
struct Matrix {
    rows: usize,
    cols: usize,
    dtype: DType,
    data: Vec<u8>,
    /// The same values in f32.
    values: Vec<f32>,
}

impl Matrix {
    /// A 2-D f32, f16 or bf16 tensor of finite values.
    fn read(t: TensorRef<'_>) -> std::result::Result<Matrix, String> {
        let name = t.name;
        let [rows, cols] = *t.shape else {
            return Err(format!("`{name}` has shape {:?}, not 2-D", t.shape));
        };
        if !matches!(t.dtype, DType::F32 | DType::F16 | DType::BF16) {
            return Err(format!("`{name}` is {}, not f32, f16 or bf16", t.dtype));
        }
        let values = t.to_f32().map_err(|e| e.to_string())?;
        if let Some(v) = values.iter().find(|v| !v.is_finite()) {
            return Err(format!("`{name}` holds {v}"));
        }
        Ok(Matrix {
            rows,
            cols,
            dtype: t.dtype,
            data: t.data.to_vec(),
            values,
        })
    }
}

/// The projections that `inner` (a module's path inside its layer, e.g. `self_attn.q_proj`)
/// changes, with their corrections (a fused module gives several, sharing `A`).
fn corrections(
    config: &ModelConfig,
    inner: &str,
    a: Matrix,
    b: Matrix,
    scale: f32,
) -> std::result::Result<Vec<(Projection, LoraPair)>, String> {
    let phi3 = config.architecture == Architecture::Phi3;
    let dense = config.features.moe.is_none();
    use Projection::*;
    let projections: &[Projection] = match inner {
        "self_attn.q_proj" if !phi3 => &[Q],
        "self_attn.k_proj" if !phi3 => &[K],
        "self_attn.v_proj" if !phi3 => &[V],
        "self_attn.qkv_proj" if phi3 => &[Q, K, V],
        "self_attn.o_proj" => &[O],
        "mlp.gate_proj" if dense && !phi3 => &[Gate],
        "mlp.up_proj" if dense && !phi3 => &[Up],
        "mlp.gate_up_proj" if dense && phi3 => &[Gate, Up],
        "mlp.down_proj" if dense => &[Down],
        _ => {
            return Err(format!(
                "not a projection of this {:?} model tandem can adapt",
                config.architecture
            ))
        }
    };
    // A fused module's projections share their input and stack their outputs.
    let in_dim = projections[0].shape(config).0;
    let parts: Vec<(Projection, usize)> = (projections.iter())
        .map(|&p| (p, p.shape(config).1))
        .collect();
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
    let mut start = 0;
    let mut out = Vec::new();
    for (p, rows) in parts {
        let mut b_rows = b.values[start * rank..(start + rows) * rank].to_vec();
        start += rows;
        if config.rope.style == RopeStyle::Interleaved && matches!(p, Q | K) {
            b_rows = interleave_heads(&b_rows, rank, config.head_dim);
        }
        let b_t = super::BRows::F32(transpose(&b_rows, rows, rank));
        let (dtype, a) = (a.dtype, a.data.clone());
        out.push((
            p,
            LoraPair {
                rank,
                dtype,
                a,
                b_t,
                scale,
            },
        ));
    }
    Ok(out)
}

/// `m` (`[rows, cols]`) transposed to `[cols, rows]`.
fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..cols)
        .flat_map(|c| (0..rows).map(move |r| m[r * cols + c]))
        .collect()
}

/// The rows of `b` (`[heads · head_dim]` rows of `row` values) in the order llama.cpp's
/// converter stores q and k for interleaved RoPE: within each head, row `2i + s` is the
/// original row `s · head_dim / 2 + i`.
fn interleave_heads<T: Copy + Default>(b: &[T], row: usize, head_dim: usize) -> Vec<T> {
    let half = head_dim / 2;
    let mut out = vec![T::default(); b.len()];
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
        let want = TensorName {
            layer: 3,
            module: "model.layers.3.mlp.down_proj".into(),
            half: 1,
        };
        assert_eq!(TensorName::parse(n, 4, false), Ok(want));
        assert!(TensorName::parse(n, 3, false).is_err(), "layer 3 of 3");
        for bad in [
            "base_model.model.lm_head.lora_A.weight",
            "base_model.model.model.layers.0.mlp.down_proj.weight",
            "base_model.model.model.layers.0.mlp.down_proj.lora_A.bias",
            "base_model.model.vision_tower.encoder.layers.0.self_attn.q_proj.lora_A.weight",
            "model.layers.0.self_attn.q_proj.lora_A.weight",
            "base_model.model.layers.0.self_attn.q_proj.lora_A.weight",
        ] {
            assert!(TensorName::parse(bad, 4, true).is_err(), "{bad}");
        }
        let gemma = "base_model.model.model.language_model.layers.1.self_attn.q_proj.lora_A.weight";
        assert_eq!(TensorName::parse(gemma, 4, true).map(|t| t.layer), Ok(1));
        assert!(
            TensorName::parse(gemma, 4, false).is_err(),
            "a text-only model"
        );
    }

    #[test]
    fn interleaving_pairs_each_row_with_its_rotation_partner() {
        // One head of 4 rows of 1 value: rows 0 and 2 rotate together, 1 and 3.
        assert_eq!(interleave_heads(&[0, 1, 2, 3], 1, 4), vec![0, 2, 1, 3]);
    }
}
