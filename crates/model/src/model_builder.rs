//! Resolves a [`TensorSet`] into [`ModelWeights`] for a [`ModelConfig`]: finds each tensor
//! under the naming scheme of its file format and checks its shape.

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::host_model::HostModel;
use crate::transformer::{LayerWeights, ModelWeights};
use crate::weights::{TensorHandle, TensorSet};

/// How a file format names the tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameScheme {
    /// `token_embd.weight`, `blk.0.attn_q.weight`, ...
    Gguf,
    /// `model.embed_tokens.weight`, `model.layers.0.self_attn.q_proj.weight`, ...
    HuggingFace,
}

/// The tensors a decoder layer may have.
#[derive(Debug, Clone, Copy)]
enum Part {
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
    Gate,
    Up,
    Down,
}

impl NameScheme {
    fn embed(self) -> &'static str {
        match self {
            NameScheme::Gguf => "token_embd.weight",
            NameScheme::HuggingFace => "model.embed_tokens.weight",
        }
    }

    fn lm_head(self) -> &'static str {
        match self {
            NameScheme::Gguf => "output.weight",
            NameScheme::HuggingFace => "lm_head.weight",
        }
    }

    fn final_norm(self) -> &'static str {
        match self {
            NameScheme::Gguf => "output_norm.weight",
            NameScheme::HuggingFace => "model.norm.weight",
        }
    }

    fn layer(self, i: usize, part: Part) -> String {
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
            Part::Gate => ("ffn_gate.weight", "mlp.gate_proj.weight"),
            Part::Up => ("ffn_up.weight", "mlp.up_proj.weight"),
            Part::Down => ("ffn_down.weight", "mlp.down_proj.weight"),
        };
        match self {
            NameScheme::Gguf => format!("blk.{i}.{gguf}"),
            NameScheme::HuggingFace => format!("model.layers.{i}.{hf}"),
        }
    }
}

/// Resolves tensors by name and checks shapes.
struct Resolver<'a> {
    tensors: &'a TensorSet,
}

impl Resolver<'_> {
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<TensorHandle> {
        let t = self.tensors.require(name)?;
        if t.shape != [rows, cols] {
            return Err(ModelError::BadTensor {
                name: name.to_string(),
                reason: format!("shape {:?}, expected [{rows}, {cols}]", t.shape),
            });
        }
        t.matrix()?;
        self.tensors
            .handle(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let t = self.tensors.require(name)?;
        if t.shape != [len] {
            return Err(ModelError::BadTensor {
                name: name.to_string(),
                reason: format!("shape {:?}, expected [{len}]", t.shape),
            });
        }
        t.to_f32()
    }
}

fn layer_weights(
    r: &Resolver<'_>,
    c: &ModelConfig,
    s: NameScheme,
    i: usize,
) -> Result<LayerWeights> {
    let (h, q, kv, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
    let name = |p| s.layer(i, p);
    let qkv_bias = if c.qkv_bias {
        Some([
            r.vector(&name(Part::QBias), q)?,
            r.vector(&name(Part::KBias), kv)?,
            r.vector(&name(Part::VBias), kv)?,
        ])
    } else {
        None
    };
    let qk_norm = if c.qk_norm {
        Some([
            r.vector(&name(Part::QNorm), c.head_dim)?,
            r.vector(&name(Part::KNorm), c.head_dim)?,
        ])
    } else {
        None
    };
    Ok(LayerWeights {
        attn_norm: r.vector(&name(Part::AttnNorm), h)?,
        q: r.matrix(&name(Part::Q), q, h)?,
        k: r.matrix(&name(Part::K), kv, h)?,
        v: r.matrix(&name(Part::V), kv, h)?,
        o: r.matrix(&name(Part::O), h, q)?,
        qkv_bias,
        qk_norm,
        ffn_norm: r.vector(&name(Part::FfnNorm), h)?,
        gate: r.matrix(&name(Part::Gate), ff, h)?,
        up: r.matrix(&name(Part::Up), ff, h)?,
        down: r.matrix(&name(Part::Down), h, ff)?,
    })
}

/// Resolves a model's tensors to their roles after checking every shape.
/// `rope_freq_factors` (GGUF `rope_freqs`, `[head_dim / 2]`) divide the base frequencies
/// when present.
pub fn build_host_model(
    config: ModelConfig,
    tensors: TensorSet,
    scheme: NameScheme,
    rope_freq_factors: Option<&[f32]>,
) -> Result<HostModel> {
    config.validate().map_err(ModelError::Config)?;
    let r = Resolver { tensors: &tensors };
    let embed = r.matrix(scheme.embed(), config.vocab_size, config.hidden_size)?;
    let lm_head = match tensors.get(scheme.lm_head()) {
        Some(_) => r.matrix(scheme.lm_head(), config.vocab_size, config.hidden_size)?,
        None if config.tie_word_embeddings || scheme == NameScheme::Gguf => embed,
        None => return Err(ModelError::MissingTensor(scheme.lm_head().to_string())),
    };
    let final_norm = r.vector(scheme.final_norm(), config.hidden_size)?;
    let layers = (0..config.num_layers)
        .map(|i| layer_weights(&r, &config, scheme, i))
        .collect::<Result<Vec<_>>>()?;
    let mut inv_freqs = config.rope.inv_freqs(config.head_dim);
    if let Some(factors) = rope_freq_factors {
        if factors.len() != inv_freqs.len() || factors.iter().any(|f| !(f.is_finite() && *f > 0.0))
        {
            return Err(ModelError::Config(
                "rope frequency factors do not match head_dim".into(),
            ));
        }
        inv_freqs.iter_mut().zip(factors).for_each(|(f, d)| *f /= d);
    }
    let weights = ModelWeights {
        embed,
        lm_head,
        final_norm,
        layers,
        inv_freqs,
    };
    Ok(HostModel {
        config,
        tensors,
        weights,
    })
}
