//! Resolves a [`TensorSet`] into [`ModelWeights`] for a [`ModelConfig`]: finds each tensor
//! under the naming scheme of its file format, checks its type class and shape, and refuses
//! a set whose layer count, head counts or leftover tensors disagree with the config (the
//! checks of `tensor_check.rs`).

use crate::config::{Architecture, MixtureOfExperts, ModelConfig};
use crate::error::{ModelError, Result};
use crate::host_model::HostModel;
use crate::tensor_check::{
    check_attention_shapes, check_dtype, check_layer_count, Role, TensorUse,
};
pub use crate::tensor_names::NameScheme;
use crate::tensor_names::{ExpertPart, Part};
use crate::transformer::{ExpertWeights, FeedForward, GatedMlp, LayerWeights, ModelWeights};
use crate::weights::{TensorHandle, TensorSet};

/// Resolves tensors by name, checks their types and shapes, and records which it used.
struct Resolver<'a> {
    tensors: &'a TensorSet,
    scheme: NameScheme,
    used: TensorUse,
}

impl Resolver<'_> {
    fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<TensorHandle> {
        let t = self.tensors.require(name)?;
        self.used.claim(name);
        check_dtype(self.scheme, Role::Matrix, name, t.dtype)?;
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

    /// A norm's weight as the forward pass multiplies by it: Gemma's Hugging Face checkpoints
    /// store `w` for a factor `1 + w` (its GGUF files already hold `1 + w`).
    fn norm(&mut self, name: &str, len: usize, offset: f32) -> Result<Vec<f32>> {
        let mut w = self.vector(name, len)?;
        if offset != 0.0 {
            w.iter_mut().for_each(|v| *v += offset);
        }
        Ok(w)
    }

    fn vector(&mut self, name: &str, len: usize) -> Result<Vec<f32>> {
        let t = self.tensors.require(name)?;
        self.used.claim(name);
        check_dtype(self.scheme, Role::Vector, name, t.dtype)?;
        if t.shape != [len] {
            return Err(ModelError::BadTensor {
                name: name.to_string(),
                reason: format!("shape {:?}, expected [{len}]", t.shape),
            });
        }
        t.to_f32()
    }
}

/// Splits Phi-3's fused `qkv` and `gate_up` matrices of every layer into the q, k, v, gate
/// and up matrices the forward pass reads (views of the same bytes; gate is the first half,
/// as transformers' `chunk(2)` and llama.cpp's fused SwiGLU take it).
fn split_fused(c: &ModelConfig, tensors: &mut TensorSet, s: NameScheme) -> Result<()> {
    for i in 0..c.num_layers {
        let name = |p| s.layer(i, p);
        let qkv = [
            (name(Part::Q), c.q_dim()),
            (name(Part::K), c.kv_dim()),
            (name(Part::V), c.kv_dim()),
        ];
        tensors.split_rows(&name(Part::Qkv), &qkv)?;
        let gate_up = [
            (name(Part::Gate), c.intermediate_size),
            (name(Part::Up), c.intermediate_size),
        ];
        tensors.split_rows(&name(Part::GateUp), &gate_up)?;
    }
    Ok(())
}

/// Splits each GGUF layer's merged expert tensors (`blk.i.ffn_gate_exps.weight`,
/// `[experts, rows, cols]`) into one view per expert (`blk.i.ffn_gate_exps.weight[e]`).
fn split_experts(c: &ModelConfig, moe: &MixtureOfExperts, tensors: &mut TensorSet) -> Result<()> {
    for i in 0..c.num_layers {
        for part in [ExpertPart::Gate, ExpertPart::Up, ExpertPart::Down] {
            let views: Vec<String> = (0..moe.num_experts)
                .map(|e| NameScheme::Gguf.expert(c.architecture, i, e, part))
                .collect();
            let merged = NameScheme::merged_experts(i, part);
            if tensors.get(&merged).is_none() && tensors.get(&legacy_expert(i, part)).is_some() {
                return Err(ModelError::BadTensor {
                    name: legacy_expert(i, part),
                    reason: "one tensor per expert is an old Mixtral GGUF layout, which tandem \
                             does not read: convert the model again with a current llama.cpp \
                             (experts merged into `ffn_*_exps`)"
                        .into(),
                });
            }
            tensors.split_outer(&merged, &views)?;
        }
    }
    Ok(())
}

/// Expert 0's tensor in the per-expert GGUF layout of early Mixtral conversions
/// (`blk.i.ffn_gate.0.weight`).
fn legacy_expert(i: usize, part: ExpertPart) -> String {
    let name = match part {
        ExpertPart::Gate => "ffn_gate",
        ExpertPart::Up => "ffn_up",
        ExpertPart::Down => "ffn_down",
    };
    format!("blk.{i}.{name}.0.weight")
}

/// Layer `i`'s feed-forward matrices: one gated MLP, or a router and its experts.
fn feed_forward(r: &mut Resolver<'_>, c: &ModelConfig, i: usize) -> Result<FeedForward> {
    let (s, h) = (r.scheme, c.hidden_size);
    let Some(moe) = c.features.moe else {
        let ff = c.intermediate_size;
        return Ok(FeedForward::Dense(GatedMlp {
            gate: r.matrix(&s.layer(i, Part::Gate), ff, h)?,
            up: r.matrix(&s.layer(i, Part::Up), ff, h)?,
            down: r.matrix(&s.layer(i, Part::Down), h, ff)?,
        }));
    };
    let ff = moe.expert_ffn;
    let router = r.matrix(&s.router(c.architecture, i), moe.num_experts, h)?;
    let name = |e, part| s.expert(c.architecture, i, e, part);
    let experts = (0..moe.num_experts)
        .map(|e| {
            Ok(GatedMlp {
                gate: r.matrix(&name(e, ExpertPart::Gate), ff, h)?,
                up: r.matrix(&name(e, ExpertPart::Up), ff, h)?,
                down: r.matrix(&name(e, ExpertPart::Down), h, ff)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(FeedForward::Experts(ExpertWeights { router, experts }))
}

/// What is added to every stored norm weight (see [`Resolver::norm`]).
fn norm_offset(c: &ModelConfig, scheme: NameScheme) -> f32 {
    if c.architecture == Architecture::Gemma3 && scheme == NameScheme::HuggingFace {
        1.0
    } else {
        0.0
    }
}

fn layer_weights(r: &mut Resolver<'_>, c: &ModelConfig, i: usize) -> Result<LayerWeights> {
    let s = r.scheme;
    let (h, q, kv) = (c.hidden_size, c.q_dim(), c.kv_dim());
    let name = |p| s.layer(i, p);
    let off = norm_offset(c, s);
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
            r.norm(&name(Part::QNorm), c.head_dim, off)?,
            r.norm(&name(Part::KNorm), c.head_dim, off)?,
        ])
    } else {
        None
    };
    let (ffn_norm_part, post_norms) = if c.features.post_norms {
        let post = [
            r.norm(&name(Part::PostAttnNorm), h, off)?,
            r.norm(&name(Part::PostFfnNorm), h, off)?,
        ];
        (Part::PreFfnNorm, Some(post))
    } else {
        (Part::FfnNorm, None)
    };
    Ok(LayerWeights {
        attn_norm: r.norm(&name(Part::AttnNorm), h, off)?,
        q: r.matrix(&name(Part::Q), q, h)?,
        k: r.matrix(&name(Part::K), kv, h)?,
        v: r.matrix(&name(Part::V), kv, h)?,
        o: r.matrix(&name(Part::O), h, q)?,
        qkv_bias,
        qk_norm,
        ffn_norm: r.norm(&name(ffn_norm_part), h, off)?,
        post_norms,
        mlp: feed_forward(r, c, i)?,
    })
}

/// Resolves a model's tensors to their roles after checking every type and shape, and
/// refuses the set unless it holds exactly the layers the config declares, with head counts
/// that match the shapes, and no tensor left unused (but the format's known extras).
/// `rope_freq_factors` (GGUF `rope_freqs`, `[head_dim / 2]`) divide the base frequencies
/// when present.
pub fn build_host_model(
    config: ModelConfig,
    mut tensors: TensorSet,
    scheme: NameScheme,
    rope_freq_factors: Option<&[f32]>,
) -> Result<HostModel> {
    config.validate().map_err(ModelError::Config)?;
    if config.architecture == Architecture::Phi3 {
        split_fused(&config, &mut tensors, scheme)?;
    }
    if let (Some(moe), NameScheme::Gguf) = (&config.features.moe, scheme) {
        split_experts(&config, moe, &mut tensors)?;
    }
    check_layer_count(&config, &tensors, scheme)?;
    check_attention_shapes(&config, &tensors, scheme)?;
    let mut r = Resolver {
        tensors: &tensors,
        scheme,
        used: TensorUse::default(),
    };
    let embed = r.matrix(scheme.embed(), config.vocab_size, config.hidden_size)?;
    let lm_head = match tensors.get(scheme.lm_head()) {
        Some(_) => r.matrix(scheme.lm_head(), config.vocab_size, config.hidden_size)?,
        None if config.tie_word_embeddings || scheme == NameScheme::Gguf => embed,
        None => return Err(ModelError::MissingTensor(scheme.lm_head().to_string())),
    };
    let final_norm = r.norm(
        scheme.final_norm(),
        config.hidden_size,
        norm_offset(&config, scheme),
    )?;
    let layers = (0..config.num_layers)
        .map(|i| layer_weights(&mut r, &config, i))
        .collect::<Result<Vec<_>>>()?;
    r.used.check_all_used(&tensors, scheme, &config)?;
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
    if let Some(factor) = config.features.rope_linear_factor {
        inv_freqs.iter_mut().for_each(|f| *f /= factor);
    }
    let local_inv_freqs = config
        .features
        .local_rope
        .map(|rope| rope.inv_freqs(config.head_dim));
    let weights = ModelWeights {
        embed,
        lm_head,
        final_norm,
        layers,
        inv_freqs,
        local_inv_freqs,
    };
    Ok(HostModel {
        config,
        tensors,
        weights,
    })
}
