//! How each file format names a model's tensors and hyperparameters: the GGUF names
//! (`token_embd.weight`, `blk.0.attn_q.weight`, `llama.block_count`) and the Hugging Face ones
//! (`model.embed_tokens.weight`, `model.layers.0.self_attn.q_proj.weight`,
//! `num_hidden_layers`), so that errors can name exactly what the file says.

use crate::config::Architecture;

/// How a file format names the tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameScheme {
    /// `token_embd.weight`, `blk.0.attn_q.weight`, ...
    Gguf,
    /// `model.embed_tokens.weight`, `model.layers.0.self_attn.q_proj.weight`, ...
    HuggingFace,
}

/// The tensors a decoder layer may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    AttnNorm,
    Q,
    K,
    V,
    O,
    QBias,
    KBias,
    VBias,
    QNorm,
    KNorm,
    FfnNorm,
    /// Gemma 3's norms: on the attention output, before the MLP, on the MLP output.
    PostAttnNorm,
    PreFfnNorm,
    PostFfnNorm,
    /// Phi-3's fused q/k/v and gate/up matrices, split into Q, K, V and Gate, Up at load.
    Qkv,
    GateUp,
    Gate,
    Up,
    Down,
}

/// The matrices of a mixture-of-experts MLP: the router and each expert's gated MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertPart {
    Gate,
    Up,
    Down,
}

/// The hyperparameters whose values the tensors' shapes must agree with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hyper {
    Layers,
    Heads,
    KvHeads,
    HeadDim,
    Hidden,
    Vocab,
}

/// Tensors a GGUF file may hold beyond the layers': `rope_freqs.weight` (per-pair RoPE
/// frequency factors, Llama 3) is read by `loader::load_gguf_model`, not by the builder.
pub const GGUF_EXTRAS: &str = "rope_freqs.weight (read as RoPE frequency factors)";
/// Tensors a Hugging Face checkpoint may hold and that are ignored: the `inv_freq` buffer
/// older transformers versions saved; tandem recomputes it from the config.
pub const HF_EXTRAS: &str =
    "model.layers.N.self_attn.rotary_emb.inv_freq (ignored: recomputed from the config)";

impl NameScheme {
    pub fn embed(self) -> &'static str {
        match self {
            NameScheme::Gguf => "token_embd.weight",
            NameScheme::HuggingFace => "model.embed_tokens.weight",
        }
    }

    pub fn lm_head(self) -> &'static str {
        match self {
            NameScheme::Gguf => "output.weight",
            NameScheme::HuggingFace => "lm_head.weight",
        }
    }

    pub fn final_norm(self) -> &'static str {
        match self {
            NameScheme::Gguf => "output_norm.weight",
            NameScheme::HuggingFace => "model.norm.weight",
        }
    }

    /// The prefix every tensor of layer `i` starts with (`blk.3.`, `model.layers.3.`).
    pub fn layer_prefix(self, i: usize) -> String {
        match self {
            NameScheme::Gguf => format!("blk.{i}."),
            NameScheme::HuggingFace => format!("model.layers.{i}."),
        }
    }

    /// The layer index of a tensor name, if it belongs to a layer.
    pub fn layer_of(self, name: &str) -> Option<usize> {
        let rest = match self {
            NameScheme::Gguf => name.strip_prefix("blk.")?,
            NameScheme::HuggingFace => name.strip_prefix("model.layers.")?,
        };
        let (index, _) = rest.split_once('.')?;
        if index.len() > 1 && index.starts_with('0') {
            return None;
        }
        index.parse().ok()
    }

    pub fn layer(self, i: usize, part: Part) -> String {
        let (gguf, hf) = match part {
            Part::AttnNorm => ("attn_norm.weight", "input_layernorm.weight"),
            Part::Q => ("attn_q.weight", "self_attn.q_proj.weight"),
            Part::K => ("attn_k.weight", "self_attn.k_proj.weight"),
            Part::V => ("attn_v.weight", "self_attn.v_proj.weight"),
            Part::O => ("attn_output.weight", "self_attn.o_proj.weight"),
            Part::QBias => ("attn_q.bias", "self_attn.q_proj.bias"),
            Part::KBias => ("attn_k.bias", "self_attn.k_proj.bias"),
            Part::VBias => ("attn_v.bias", "self_attn.v_proj.bias"),
            Part::QNorm => ("attn_q_norm.weight", "self_attn.q_norm.weight"),
            Part::KNorm => ("attn_k_norm.weight", "self_attn.k_norm.weight"),
            Part::FfnNorm => ("ffn_norm.weight", "post_attention_layernorm.weight"),
            Part::PostAttnNorm => (
                "post_attention_norm.weight",
                "post_attention_layernorm.weight",
            ),
            Part::PreFfnNorm => ("ffn_norm.weight", "pre_feedforward_layernorm.weight"),
            Part::PostFfnNorm => ("post_ffw_norm.weight", "post_feedforward_layernorm.weight"),
            Part::Qkv => ("attn_qkv.weight", "self_attn.qkv_proj.weight"),
            Part::GateUp => ("ffn_up.weight", "mlp.gate_up_proj.weight"),
            Part::Gate => ("ffn_gate.weight", "mlp.gate_proj.weight"),
            Part::Up => ("ffn_up.weight", "mlp.up_proj.weight"),
            Part::Down => ("ffn_down.weight", "mlp.down_proj.weight"),
        };
        let suffix = match self {
            NameScheme::Gguf => gguf,
            NameScheme::HuggingFace => hf,
        };
        format!("{}{suffix}", self.layer_prefix(i))
    }

    /// The router of layer `i`'s experts: `blk.i.ffn_gate_inp.weight`, Mixtral's
    /// `block_sparse_moe.gate.weight`, Qwen3-MoE's `mlp.gate.weight`.
    pub fn router(self, arch: Architecture, i: usize) -> String {
        let suffix = match (self, arch) {
            (NameScheme::Gguf, _) => "ffn_gate_inp.weight",
            (NameScheme::HuggingFace, Architecture::Mixtral) => "block_sparse_moe.gate.weight",
            (NameScheme::HuggingFace, _) => "mlp.gate.weight",
        };
        format!("{}{suffix}", self.layer_prefix(i))
    }

    /// The GGUF tensor holding one matrix of all of layer `i`'s experts, `[experts, rows,
    /// cols]` (`blk.i.ffn_gate_exps.weight`); split into one view per expert at load.
    pub fn merged_experts(i: usize, part: ExpertPart) -> String {
        let name = match part {
            ExpertPart::Gate => "ffn_gate_exps",
            ExpertPart::Up => "ffn_up_exps",
            ExpertPart::Down => "ffn_down_exps",
        };
        format!("blk.{i}.{name}.weight")
    }

    /// Expert `e`'s matrix in layer `i`: in a Hugging Face checkpoint the stored tensor
    /// (Mixtral's `block_sparse_moe.experts.e.w1.weight` = gate, `w3` = up, `w2` = down;
    /// Qwen3-MoE's `mlp.experts.e.gate_proj.weight`), in a GGUF file the view of the merged
    /// tensor (`blk.i.ffn_gate_exps.weight[e]`).
    pub fn expert(self, arch: Architecture, i: usize, e: usize, part: ExpertPart) -> String {
        match self {
            NameScheme::Gguf => format!("{}[{e}]", NameScheme::merged_experts(i, part)),
            NameScheme::HuggingFace => {
                let (mixtral, qwen) = match part {
                    ExpertPart::Gate => ("w1", "gate_proj"),
                    ExpertPart::Up => ("w3", "up_proj"),
                    ExpertPart::Down => ("w2", "down_proj"),
                };
                let prefix = self.layer_prefix(i);
                match arch {
                    Architecture::Mixtral => {
                        format!("{prefix}block_sparse_moe.experts.{e}.{mixtral}.weight")
                    }
                    _ => format!("{prefix}mlp.experts.{e}.{qwen}.weight"),
                }
            }
        }
    }

    /// Whether `name` is a tensor this format may carry that the builder does not claim.
    pub fn is_allowed_extra(self, name: &str) -> bool {
        match self {
            NameScheme::Gguf => name == "rope_freqs.weight",
            NameScheme::HuggingFace => {
                self.layer_of(name).is_some() && name.ends_with(".self_attn.rotary_emb.inv_freq")
            }
        }
    }

    /// A description of [`NameScheme::is_allowed_extra`] for error messages.
    pub fn allowed_extras(self) -> &'static str {
        match self {
            NameScheme::Gguf => GGUF_EXTRAS,
            NameScheme::HuggingFace => HF_EXTRAS,
        }
    }

    /// The metadata key (GGUF) or `config.json` field (Hugging Face) of a hyperparameter.
    pub fn key(self, arch: Architecture, h: Hyper) -> String {
        match self {
            NameScheme::Gguf => {
                let k = match h {
                    Hyper::Layers => "block_count",
                    Hyper::Heads => "attention.head_count",
                    Hyper::KvHeads => "attention.head_count_kv",
                    Hyper::HeadDim => "attention.key_length",
                    Hyper::Hidden => "embedding_length",
                    Hyper::Vocab => "vocab_size",
                };
                format!("{}.{k}", arch.gguf_name())
            }
            NameScheme::HuggingFace => match h {
                Hyper::Layers => "num_hidden_layers",
                Hyper::Heads => "num_attention_heads",
                Hyper::KvHeads => "num_key_value_heads",
                Hyper::HeadDim => "head_dim",
                Hyper::Hidden => "hidden_size",
                Hyper::Vocab => "vocab_size",
            }
            .to_string(),
        }
    }
}
