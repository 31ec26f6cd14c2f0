//! The architecture-level description of a model, independent of the file format it came from.

/// Transformer families tandem implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// Llama 2/3, Mistral, SmolLM2, TinyLlama.
    Llama,
    /// Qwen2: like Llama with a bias on the q/k/v projections.
    Qwen2,
    /// Qwen3: like Llama with RMSNorm on each head of q and k before RoPE.
    Qwen3,
    /// Gemma 3 (text): scaled embedding, four norms per layer, GeGLU, q/k norms, local
    /// sliding-window layers interleaved with global ones (see [`BlockFeatures`]).
    Gemma3,
    /// Phi-3: like Llama with q/k/v fused into one matrix and gate/up into another (split
    /// at load), and a sliding window on every layer where the config sets one.
    Phi3,
    /// Mixtral: Llama whose MLP is a sparse mixture of experts ([`MixtureOfExperts`]).
    /// llama.cpp files it as `llama` with `llama.expert_count` set.
    Mixtral,
    /// Qwen3-MoE: Qwen3 whose MLP is a sparse mixture of experts.
    Qwen3Moe,
}

impl Architecture {
    /// Parses the GGUF `general.architecture` name.
    pub fn from_gguf_name(name: &str) -> Option<Architecture> {
        match name {
            "llama" => Some(Architecture::Llama),
            "qwen2" => Some(Architecture::Qwen2),
            "qwen3" => Some(Architecture::Qwen3),
            "gemma3" => Some(Architecture::Gemma3),
            "phi3" => Some(Architecture::Phi3),
            "qwen3moe" => Some(Architecture::Qwen3Moe),
            _ => None,
        }
    }

    /// The GGUF `general.architecture` name (Mixtral's is `llama`, as llama.cpp writes it).
    pub fn gguf_name(self) -> &'static str {
        match self {
            Architecture::Llama | Architecture::Mixtral => "llama",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Gemma3 => "gemma3",
            Architecture::Phi3 => "phi3",
            Architecture::Qwen3Moe => "qwen3moe",
        }
    }

    /// Parses a Hugging Face `architectures[0]` class name.
    pub fn from_hf_class(name: &str) -> Option<Architecture> {
        match name {
            "LlamaForCausalLM" | "MistralForCausalLM" => Some(Architecture::Llama),
            "Qwen2ForCausalLM" => Some(Architecture::Qwen2),
            "Qwen3ForCausalLM" => Some(Architecture::Qwen3),
            "Gemma3ForCausalLM" => Some(Architecture::Gemma3),
            "Phi3ForCausalLM" => Some(Architecture::Phi3),
            "MixtralForCausalLM" => Some(Architecture::Mixtral),
            "Qwen3MoeForCausalLM" => Some(Architecture::Qwen3Moe),
            _ => None,
        }
    }

    /// Parses a Hugging Face `model_type`.
    pub fn from_hf_model_type(name: &str) -> Option<Architecture> {
        match name {
            "llama" | "mistral" => Some(Architecture::Llama),
            "qwen2" => Some(Architecture::Qwen2),
            "qwen3" => Some(Architecture::Qwen3),
            "gemma3_text" => Some(Architecture::Gemma3),
            "phi3" => Some(Architecture::Phi3),
            "mixtral" => Some(Architecture::Mixtral),
            "qwen3_moe" => Some(Architecture::Qwen3Moe),
            _ => None,
        }
    }

    /// Whether the architecture's MLP is a mixture of experts.
    pub fn is_moe(self) -> bool {
        matches!(self, Architecture::Mixtral | Architecture::Qwen3Moe)
    }
}

/// The supported GGUF `general.architecture` names.
pub const GGUF_ARCHITECTURES: &str =
    "llama, qwen2, qwen3, qwen3moe, gemma3, phi3 (`llama` with experts: Mixtral)";
/// The supported Hugging Face `architectures` classes.
pub const HF_CLASSES: &str = "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, \
                              Qwen3ForCausalLM, Gemma3ForCausalLM, Phi3ForCausalLM, \
                              MixtralForCausalLM, Qwen3MoeForCausalLM";
/// The supported Hugging Face `model_type` values.
pub const HF_MODEL_TYPES: &str =
    "llama, mistral, qwen2, qwen3, gemma3_text, phi3, mixtral, qwen3_moe";

/// The most experts a mixture-of-experts layer may have (the largest released models have
/// 512; a bound keeps a corrupted count from sizing buffers).
pub const MAX_EXPERTS: usize = 4096;

/// How RoPE pairs up the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Dimension `i` rotates with `i + head_dim/2` (HF `rotate_half`; llama.cpp "NEOX").
    Neox,
    /// Dimension `2i` rotates with `2i + 1` (llama.cpp "NORM"; GGUF llama files store q/k
    /// weights permuted for this layout).
    Interleaved,
}

/// Llama 3 frequency-dependent RoPE scaling (`rope_scaling.rope_type == "llama3"`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3RopeScaling {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_max_position_embeddings: usize,
}

/// Rotary position embedding parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeConfig {
    pub theta: f32,
    pub style: RopeStyle,
    pub llama3_scaling: Option<Llama3RopeScaling>,
}

impl RopeConfig {
    /// The inverse frequency of each rotated pair: `[head_dim / 2]`.
    pub fn inv_freqs(&self, head_dim: usize) -> Vec<f32> {
        let half = head_dim / 2;
        (0..half)
            .map(|i| {
                let base = 1.0 / (self.theta as f64).powf(2.0 * i as f64 / head_dim as f64);
                match &self.llama3_scaling {
                    None => base as f32,
                    Some(s) => llama3_scaled(base, s) as f32,
                }
            })
            .collect()
    }
}

/// Applies Llama 3 scaling to one inverse frequency (as in the Llama 3.1 reference code).
fn llama3_scaled(inv_freq: f64, s: &Llama3RopeScaling) -> f64 {
    let old_len = s.original_max_position_embeddings as f64;
    let low_freq_wavelen = old_len / s.low_freq_factor as f64;
    let high_freq_wavelen = old_len / s.high_freq_factor as f64;
    let wavelen = 2.0 * std::f64::consts::PI / inv_freq;
    if wavelen < high_freq_wavelen {
        inv_freq
    } else if wavelen > low_freq_wavelen {
        inv_freq / s.factor as f64
    } else {
        let smooth = (old_len / wavelen - s.low_freq_factor as f64)
            / (s.high_freq_factor as f64 - s.low_freq_factor as f64);
        (1.0 - smooth) * inv_freq / s.factor as f64 + smooth * inv_freq
    }
}

/// Shapes and hyper-parameters of a decoder-only transformer.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope: RopeConfig,
    /// The longest sequence the model was trained for (positions `0..context_len`).
    pub context_len: usize,
    /// Whether the output projection reuses the token embedding matrix.
    pub tie_word_embeddings: bool,
    /// Bias on the q/k/v projections (Qwen2).
    pub qkv_bias: bool,
    /// RMSNorm on each head of q and k (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// What the block does beyond the Llama block (none for Llama and Qwen).
    pub features: BlockFeatures,
}

/// The feed-forward activation of the gated MLP: `act(gate) * up`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Activation {
    /// SwiGLU: `silu(x) = x / (1 + e^-x)`.
    #[default]
    Silu,
    /// GeGLU with the tanh approximation of GELU (`gelu_pytorch_tanh`).
    GeluTanh,
}

/// Attention over a window of recent positions on some layers (Gemma 3's local layers,
/// Mistral v0.1's every layer): a token at position `p` of such a layer attends to positions
/// `p + 1 - size ..= p` (the last `size` positions, itself included), as the sliding-window
/// masks of transformers and llama.cpp define it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlidingWindow {
    pub size: usize,
    /// `[num_layers]` whether each layer slides (the others attend to the whole context).
    pub layers: Vec<bool>,
}

/// Parts of the decoder block beyond the Llama block. The default is the Llama block, so
/// the Llama and Qwen paths are unchanged by their presence.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BlockFeatures {
    /// The token embedding is multiplied by this (Gemma: `sqrt(hidden_size)`, in f32).
    pub embedding_scale: Option<f32>,
    pub activation: Activation,
    /// An RMSNorm on the attention output and on the MLP output before each residual add
    /// (Gemma 3's "sandwich" norms).
    pub post_norms: bool,
    /// The query-key product's scale; `None`: `1 / sqrt(head_dim)`.
    pub attention_scale: Option<f32>,
    /// `logits = cap * tanh(logits / cap)` on the output (`final_logit_softcapping`).
    pub final_logit_softcap: Option<f32>,
    pub sliding_window: Option<SlidingWindow>,
    /// The RoPE of the sliding-window layers when it differs from the global one (Gemma 3:
    /// `rope_local_base_freq`, no scaling).
    pub local_rope: Option<RopeConfig>,
    /// The global layers' RoPE frequencies are divided by this (linear scaling, Gemma 3's
    /// `rope_scaling` on its global layers only).
    pub rope_linear_factor: Option<f32>,
    /// Every layer's MLP is a sparse mixture of experts (Mixtral, Qwen3-MoE).
    pub moe: Option<MixtureOfExperts>,
}

/// A sparse mixture-of-experts MLP: a router (a `[num_experts, hidden]` matrix) scores every
/// expert for a token, the softmax of those scores over all experts gives each a weight, the
/// `experts_per_token` heaviest run on the token (each a gated MLP of width `expert_ffn`), and
/// their outputs are summed, each times its weight. With `normalize_top_k` the chosen weights
/// are first divided by their sum (Mixtral always; Qwen3-MoE when `norm_topk_prob`), which
/// equals a softmax over the chosen experts' scores alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MixtureOfExperts {
    pub num_experts: usize,
    pub experts_per_token: usize,
    pub expert_ffn: usize,
    pub normalize_top_k: bool,
}

impl MixtureOfExperts {
    /// The share of a layer's experts that a step of `tokens` tokens reads, expected when each
    /// token picks its experts independently and uniformly: `1 - (1 - k/E)^tokens`. Routing
    /// that gives a batch's tokens correlated experts reads fewer.
    pub fn share_read(&self, tokens: f64) -> f64 {
        let miss = 1.0 - self.experts_per_token as f64 / self.num_experts as f64;
        1.0 - miss.powf(tokens.max(1.0))
    }
}

impl BlockFeatures {
    /// The attention window of layer `l`, if it slides.
    pub fn window(&self, l: usize) -> Option<usize> {
        let w = self.sliding_window.as_ref()?;
        w.layers.get(l).copied().unwrap_or(false).then_some(w.size)
    }
}

/// The largest count or dimension a model may have (2^24): far above any real model's, and
/// small enough that what is allocated per layer, head or row stays bounded.
pub const MAX_SIZE: usize = 1 << 24;

/// Checks that a count or dimension is positive and at most [`MAX_SIZE`]. The loaders check
/// the layer count where they read it, before anything is built per layer;
/// [`ModelConfig::validate`] checks every size.
pub fn check_size(name: &str, v: usize) -> Result<(), String> {
    if v == 0 {
        return Err(format!("{name} must be positive"));
    }
    if v > MAX_SIZE {
        return Err(format!("{name} = {v} is implausibly large"));
    }
    Ok(())
}

impl ModelConfig {
    /// Checks the relations between sizes that the forward pass relies on.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_layers", self.num_layers),
            ("num_heads", self.num_heads),
            ("num_kv_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("context_len", self.context_len),
        ];
        for (name, v) in positive {
            check_size(name, v)?;
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(format!(
                "num_heads ({}) is not a multiple of num_kv_heads ({})",
                self.num_heads, self.num_kv_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(format!(
                "head_dim ({}) must be even for RoPE",
                self.head_dim
            ));
        }
        if !(self.rope.theta.is_finite() && self.rope.theta > 0.0) {
            return Err(format!("rope theta {} must be positive", self.rope.theta));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps >= 0.0) {
            return Err(format!("rms_norm_eps {} is invalid", self.rms_norm_eps));
        }
        self.validate_features()
    }

    fn validate_features(&self) -> Result<(), String> {
        let f = &self.features;
        if let Some(w) = &f.sliding_window {
            if w.size == 0 {
                return Err("the sliding window must be positive".into());
            }
            if w.layers.len() != self.num_layers {
                return Err(format!(
                    "the sliding-window layer pattern has {} entries for {} layers",
                    w.layers.len(),
                    self.num_layers
                ));
            }
        }
        let positive = |name: &str, v: Option<f32>| match v {
            Some(x) if !(x.is_finite() && x > 0.0) => Err(format!("{name} {x} must be positive")),
            _ => Ok(()),
        };
        positive("embedding scale", f.embedding_scale)?;
        positive("attention scale", f.attention_scale)?;
        positive("final logit soft-cap", f.final_logit_softcap)?;
        positive("RoPE linear scaling factor", f.rope_linear_factor)?;
        if let Some(r) = &f.local_rope {
            if !(r.theta.is_finite() && r.theta > 0.0) {
                return Err(format!("local rope theta {} must be positive", r.theta));
            }
        }
        if let Some(m) = &f.moe {
            if m.num_experts == 0 || m.num_experts > MAX_EXPERTS {
                return Err(format!(
                    "the expert count {} must be between 1 and {MAX_EXPERTS}",
                    m.num_experts
                ));
            }
            if m.experts_per_token == 0 || m.experts_per_token > m.num_experts {
                return Err(format!(
                    "the experts used per token ({}) must be between 1 and the expert count ({})",
                    m.experts_per_token, m.num_experts
                ));
            }
            if m.expert_ffn == 0 || m.expert_ffn > (1 << 24) {
                return Err(format!(
                    "the expert feed-forward length {} is invalid",
                    m.expert_ffn
                ));
            }
        }
        if self.architecture.is_moe() != f.moe.is_some() {
            return Err(format!(
                "{:?} {} a mixture of experts",
                self.architecture,
                if f.moe.is_some() { "has no" } else { "needs" }
            ));
        }
        Ok(())
    }

    /// Weights of one layer's MLP that a token passes through: the gated MLP, or the router
    /// and the experts it picks.
    pub fn ffn_params_per_token(&self) -> usize {
        let h = self.hidden_size;
        match &self.features.moe {
            None => 3 * h * self.intermediate_size,
            Some(m) => m.num_experts * h + m.experts_per_token * 3 * h * m.expert_ffn,
        }
    }

    /// The share of a layer's experts that a step of `tokens` tokens reads (1 for a dense
    /// model; see [`MixtureOfExperts::share_read`]).
    pub fn expert_share_read(&self, tokens: usize) -> f64 {
        self.features
            .moe
            .map_or(1.0, |m| m.share_read(tokens as f64))
    }

    /// Width of the q projection output: `num_heads * head_dim`.
    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// Width of the k and v projection outputs: `num_kv_heads * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_scaling_keeps_high_and_divides_low_frequencies() {
        let s = Llama3RopeScaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
        let plain = RopeConfig {
            theta: 500000.0,
            style: RopeStyle::Neox,
            llama3_scaling: None,
        };
        let scaled = RopeConfig {
            llama3_scaling: Some(s),
            ..plain
        };
        let (a, b) = (plain.inv_freqs(128), scaled.inv_freqs(128));
        assert_eq!(a[0], b[0]);
        assert!((b[63] - a[63] / 8.0).abs() <= 1e-12);
    }
}
