//! Small random models of each architecture the CUDA runner serves, written as Hugging
//! Face directories for the forward program's test (`forward.rs`).

use std::path::Path;

use rand::rngs::StdRng;
use rand::Rng;
use serde_json::json;
use tandem_model::host_model::HostModel;
use tandem_model::model_builder::{build_host_model, NameScheme};

use super::{normal_ish, rng};
use crate::options::{CudaDtype, CudaWeights};
use half::bf16;

/// A small random model of one architecture, written as a Hugging Face directory.
pub(super) struct Spec {
    pub name: &'static str,
    /// Merged into config.json.
    pub config: serde_json::Value,
    pub hidden: usize,
    pub head_dim: usize,
    pub qkv_bias: bool,
    pub qk_norm: bool,
    pub tied: bool,
    pub layers: usize,
    /// Gemma 3's norms around the MLP (`pre_feedforward_layernorm` before it,
    /// `post_feedforward_layernorm` after it; `post_attention_layernorm` then norms the
    /// attention's output).
    pub gemma_norms: bool,
    /// A mixture of experts in place of the MLP: (count, per token, naming).
    pub experts: Option<(usize, usize, ExpertNames)>,
}

/// How a checkpoint names a layer's router and experts.
#[derive(Debug, Clone, Copy)]
pub(super) enum ExpertNames {
    /// `mlp.gate`, `mlp.experts.E.{gate,up,down}_proj` (Qwen3-MoE).
    Qwen,
    /// `block_sparse_moe.gate`, `block_sparse_moe.experts.E.{w1,w3,w2}` (Mixtral).
    Mixtral,
}

pub(super) const VOCAB: usize = 96;
const FF: usize = 96;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;

impl Spec {
    /// A two-layer model of hidden size 64 and heads of 32 (`config` must say so where the
    /// architecture's default head size differs), untied, with the Llama block.
    fn new(name: &'static str, config: serde_json::Value) -> Spec {
        Spec {
            name,
            config,
            hidden: 64,
            head_dim: 32,
            qkv_bias: false,
            qk_norm: false,
            tied: false,
            layers: 2,
            gemma_norms: false,
            experts: None,
        }
    }
}

pub(super) fn specs() -> Vec<Spec> {
    vec![
        Spec {
            tied: true,
            ..Spec::new(
                "llama",
                json!({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                       "head_dim": 32}),
            )
        },
        // Qwen2 has no head_dim: hidden / heads.
        Spec {
            hidden: 128,
            qkv_bias: true,
            ..Spec::new(
                "qwen2",
                json!({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}),
            )
        },
        Spec {
            qk_norm: true,
            tied: true,
            ..Spec::new(
                "qwen3",
                json!({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
                       "head_dim": 32}),
            )
        },
        // A window of 20 positions on every layer: late tokens see two partitions of the
        // context, neither of them the first.
        Spec::new(
            "mistral_swa",
            json!({"architectures": ["MistralForCausalLM"], "model_type": "mistral",
                   "head_dim": 32, "sliding_window": 20}),
        ),
        gemma3("gemma3", 32),
        // Gemma 3's real head size, which takes attention_tc_256 on tensor cores.
        gemma3("gemma3_wide", 256),
        // Eight experts of width 96, three per token, their weights renormalised.
        Spec {
            qk_norm: true,
            experts: Some((8, 3, ExpertNames::Qwen)),
            ..Spec::new(
                "qwen3_moe",
                json!({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                       "head_dim": 32, "num_experts": 8, "num_experts_per_tok": 3,
                       "moe_intermediate_size": FF, "norm_topk_prob": true,
                       "decoder_sparse_step": 1, "mlp_only_layers": []}),
            )
        },
        Spec {
            experts: Some((6, 2, ExpertNames::Mixtral)),
            ..Spec::new(
                "mixtral",
                json!({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                       "head_dim": 32, "num_local_experts": 6, "num_experts_per_tok": 2}),
            )
        },
    ]
}

/// Writes `spec` with random weights to `dir`. The weights are stored as `dtype`, and
/// the layers' matrices lie on the `grid` of a quantized format when one is given, so that
/// the CPU model and the device's conversion of them hold the same values.
pub(super) fn write_model(spec: &Spec, dtype: CudaDtype, grid: CudaWeights, dir: &Path) {
    std::fs::create_dir_all(dir).expect("model dir");
    let (q, kv) = (HEADS * spec.head_dim, KV_HEADS * spec.head_dim);
    let hidden = spec.hidden;
    // Gemma stores its norm weights as offsets from 1.
    let norm_mean = if spec.gemma_norms { 0.0 } else { 1.0 };
    let mut config = json!({
        "hidden_size": hidden, "num_hidden_layers": spec.layers, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "intermediate_size": FF, "vocab_size": VOCAB,
        "tie_word_embeddings": spec.tied, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 512, "torch_dtype": "float32"
    });
    for (k, v) in spec.config.as_object().expect("object") {
        config[k] = v.clone();
    }
    std::fs::write(dir.join("config.json"), config.to_string()).expect("config");
    let mut tensors: Vec<(String, Vec<usize>, f32, f32)> = vec![
        (
            "model.embed_tokens.weight".into(),
            vec![VOCAB, hidden],
            0.0,
            1.0,
        ),
        ("model.norm.weight".into(), vec![hidden], norm_mean, 0.2),
    ];
    if !spec.tied {
        tensors.push(("lm_head.weight".into(), vec![VOCAB, hidden], 0.0, 0.2));
    }
    for i in 0..spec.layers {
        let l = format!("model.layers.{i}");
        let a = format!("{l}.self_attn");
        let m = format!("{l}.mlp");
        tensors.extend([
            (
                format!("{l}.input_layernorm.weight"),
                vec![hidden],
                norm_mean,
                0.2,
            ),
            (
                format!("{l}.post_attention_layernorm.weight"),
                vec![hidden],
                norm_mean,
                0.2,
            ),
            (format!("{a}.q_proj.weight"), vec![q, hidden], 0.0, 0.25),
            (format!("{a}.k_proj.weight"), vec![kv, hidden], 0.0, 0.25),
            (format!("{a}.v_proj.weight"), vec![kv, hidden], 0.0, 0.25),
            (format!("{a}.o_proj.weight"), vec![hidden, q], 0.0, 0.15),
        ]);
        match spec.experts {
            None => tensors.extend([
                (format!("{m}.gate_proj.weight"), vec![FF, hidden], 0.0, 0.25),
                (format!("{m}.up_proj.weight"), vec![FF, hidden], 0.0, 0.25),
                (format!("{m}.down_proj.weight"), vec![hidden, FF], 0.0, 0.15),
            ]),
            Some((count, _, names)) => {
                let (block, [gate, up, down]) = match names {
                    ExpertNames::Qwen => (m.clone(), ["gate_proj", "up_proj", "down_proj"]),
                    ExpertNames::Mixtral => (format!("{l}.block_sparse_moe"), ["w1", "w3", "w2"]),
                };
                tensors.push((
                    format!("{block}.gate.weight"),
                    vec![count, hidden],
                    0.0,
                    0.3,
                ));
                for e in 0..count {
                    let x = format!("{block}.experts.{e}");
                    tensors.extend([
                        (format!("{x}.{gate}.weight"), vec![FF, hidden], 0.0, 0.25),
                        (format!("{x}.{up}.weight"), vec![FF, hidden], 0.0, 0.25),
                        (format!("{x}.{down}.weight"), vec![hidden, FF], 0.0, 0.15),
                    ]);
                }
            }
        }
        if spec.qkv_bias {
            for (p, len) in [("q", q), ("k", kv), ("v", kv)] {
                tensors.push((format!("{a}.{p}_proj.bias"), vec![len], 0.0, 0.3));
            }
        }
        if spec.gemma_norms {
            for p in ["pre", "post"] {
                let name = format!("{l}.{p}_feedforward_layernorm.weight");
                tensors.push((name, vec![hidden], 0.0, 0.2));
            }
        }
        if spec.qk_norm {
            for p in ["q", "k"] {
                tensors.push((
                    format!("{a}.{p}_norm.weight"),
                    vec![spec.head_dim],
                    norm_mean,
                    0.3,
                ));
            }
        }
    }
    write_safetensors(&dir.join("model.safetensors"), &tensors, dtype, grid);
}

pub(super) fn load(dir: &Path) -> HostModel {
    let info = tandem_model::hf_config::load_hf_config(dir).expect("load config");
    let set = tandem_model::safetensors::load_safetensors_dir(dir).expect("load weights");
    build_host_model(info.config, set, NameScheme::HuggingFace, None).expect("host model")
}

/// Tensors `(name, shape, mean, spread)` of random values, in F32 or BF16; the layers'
/// matrices (`*proj.weight`, the experts') on `grid`.
fn write_safetensors(
    path: &Path,
    tensors: &[(String, Vec<usize>, f32, f32)],
    dtype: CudaDtype,
    grid: CudaWeights,
) {
    let mut r = rng(0x5eed ^ tensors.len() as u64);
    let (mut header, mut data) = (serde_json::Map::new(), Vec::new());
    for (name, shape, mean, spread) in tensors {
        let n: usize = shape.iter().product();
        let start = data.len();
        let layer_matrix = name.ends_with("proj.weight") || name.contains(".experts.");
        let values = match layer_matrix {
            true => on_grid(&mut r, n, grid).unwrap_or_else(|| normal_ish(&mut r, n, *spread)),
            false => normal_ish(&mut r, n, *spread),
        };
        for v in values {
            let v = v + mean;
            match dtype {
                CudaDtype::F32 => data.extend_from_slice(&v.to_le_bytes()),
                CudaDtype::Bf16 => {
                    data.extend_from_slice(&bf16::from_f32(v).to_bits().to_le_bytes())
                }
            }
        }
        let kind = match dtype {
            CudaDtype::F32 => "F32",
            CudaDtype::Bf16 => "BF16",
        };
        let entry = json!({"dtype": kind, "shape": shape, "data_offsets": [start, data.len()]});
        header.insert(name.clone(), entry);
    }
    let mut head = serde_json::Value::Object(header).to_string().into_bytes();
    head.resize(head.len().next_multiple_of(8), b' ');
    let mut file = (head.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&head);
    file.extend_from_slice(&data);
    std::fs::write(path, file).expect("write weights");
}

/// `n` random values that `format` quantizes without loss (and bf16 holds exactly), in
/// blocks of 32: Q8_0 codes in -127..=127 with a block's largest magnitude 127 and a scale
/// of a power of two; Q4_1 codes 0..=15, both ends present, a power-of-two scale and a
/// minimum of -8 scales. `None` for dense weights.
fn on_grid(r: &mut StdRng, n: usize, format: CudaWeights) -> Option<Vec<f32>> {
    let (lo, hi, offset, scale) = match format {
        CudaWeights::Dense => return None,
        CudaWeights::Q8_0 => (-127, 127, 0, 2f32.powi(-9)),
        CudaWeights::Q4_1 => (0, 15, -8, 2f32.powi(-5)),
    };
    let mut out = Vec::with_capacity(n);
    for block in 0..n / 32 {
        let mut codes: Vec<i32> = (0..32).map(|_| r.random_range(lo..=hi)).collect();
        codes[block % 32] = hi;
        codes[(block + 7) % 32] = lo;
        out.extend(codes.iter().map(|&c| (c + offset) as f32 * scale));
    }
    Some(out)
}

/// Gemma 3 as its configs have it, with heads of `head_dim`: sliding layers around a global
/// one, with their own RoPE base; linear RoPE scaling on the global layer; GeGLU; the
/// embedding's scale; norms of each sub-layer's output; q/k norms; a query scale of its
/// own; and a soft cap on the logits (Gemma 2's, which the CPU implements too).
fn gemma3(name: &'static str, head_dim: usize) -> Spec {
    Spec {
        head_dim,
        qk_norm: true,
        tied: true,
        layers: 3,
        gemma_norms: true,
        ..Spec::new(
            name,
            json!({
                "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
                "head_dim": head_dim, "hidden_activation": "gelu_pytorch_tanh",
                "query_pre_attn_scalar": 24, "final_logit_softcapping": 5.0,
                "sliding_window": 8, "rms_norm_eps": 1e-6,
                "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
                "rope_parameters": {
                    "full_attention": {"factor": 4.0, "rope_theta": 1000000.0,
                                       "rope_type": "linear"},
                    "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}
                }
            }),
        )
    }
}
