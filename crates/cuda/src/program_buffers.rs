//! The addresses and sizes the forward program (`layer_program.rs`) works on: every weight,
//! the workspace of a step, the paged KV pool. The runner fills them from its device
//! buffers; the emulated tests from host buffers.

use tandem_model::ModelConfig;

use crate::kernels::DevPtr;
use crate::layer_program::PARTIAL_SLOTS;
use crate::moe_kernels::Routes;
use crate::options::CudaDtype;

/// A `[rows, cols]` matrix of a layer (see `weights.rs` for the formats).
#[derive(Debug, Clone, Copy)]
pub(crate) enum MatrixPtrs {
    Dense(DevPtr),
    Q8 { codes: DevPtr, scales: DevPtr },
    Q4 { codes: DevPtr, scales: DevPtr },
}

/// One decoder layer's weights.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LayerPtrs {
    pub attn_norm: DevPtr,
    pub qkv: MatrixPtrs,
    pub qkv_bias: Option<DevPtr>,
    pub qk_norm: Option<DevPtr>,
    pub o: MatrixPtrs,
    pub ffn_norm: DevPtr,
    pub mlp: MlpPtrs,
    /// `[h]` f32 each: the norms of the attention's and the MLP's outputs (Gemma 3).
    pub post_norms: Option<[DevPtr; 2]>,
}

/// A layer's MLP (see `weight_conversion::HostMlp` for the layouts).
#[derive(Debug, Clone, Copy)]
pub(crate) enum MlpPtrs {
    Dense {
        gate_up: MatrixPtrs,
        down: MatrixPtrs,
    },
    Experts {
        router: DevPtr,
        gate_up: MatrixPtrs,
        down: MatrixPtrs,
    },
}

/// Every weight (they never move once placed).
#[derive(Debug, Clone)]
pub(crate) struct WeightPtrs {
    pub embed: DevPtr,
    /// The embedding's address when tied.
    pub lm_head: DevPtr,
    pub final_norm: DevPtr,
    pub layers: Vec<LayerPtrs>,
}

/// The activations a step works in, for up to `capacity` tokens (sizes: [`WorkspaceBytes`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct WorkspacePtrs {
    pub x: DevPtr,
    pub delta: DevPtr,
    pub xn: DevPtr,
    pub qkv: DevPtr,
    pub q: DevPtr,
    pub attn: DevPtr,
    pub partials: DevPtr,
    pub gate_up: DevPtr,
    pub act: DevPtr,
    pub lm_in: DevPtr,
    pub logits: DevPtr,
    pub scores: DevPtr,
    pub route_experts: DevPtr,
    pub route_weights: DevPtr,
    pub route_groups: DevPtr,
    pub expert_out: DevPtr,
}

/// Bytes of each workspace buffer for `capacity` tokens (and the LM head's `logit_rows`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WorkspaceBytes {
    /// `[cap, h]` f32: the residual stream.
    pub x: usize,
    /// `[cap, h]` f32: the last sub-layer's output, not yet added to `x`.
    pub delta: usize,
    /// `[cap, h]` storage type: normed input of a projection.
    pub xn: usize,
    /// `[cap, q_dim + 2 * kv_dim]` f32.
    pub qkv: usize,
    /// `[cap, q_dim]` f32: rotated queries.
    pub q: usize,
    /// `[cap, q_dim]` storage type: attention output.
    pub attn: usize,
    /// `[PARTIAL_SLOTS, head_dim + 2]` f32: attention's per-partition results.
    pub partials: usize,
    /// `[rows, 2 * ff]` f32, where rows are the tokens, or with experts their routes
    /// (`cap * experts_per_token`) and ff the experts' width.
    pub gate_up: usize,
    /// `[rows, ff]` storage type: the activation's output.
    pub act: usize,
    /// `[logit_rows, h]` storage type: LM head input.
    pub lm_in: usize,
    /// `[logit_rows, vocab]` f32.
    pub logits: usize,
    /// With experts (else 0): `[cap, experts]` f32 router scores; `[cap, experts_per_token]`
    /// i32 and f32 routes; their grouping by expert (i32, `moe_kernels::Routes`);
    /// `[cap * experts_per_token, h]` f32 each route's output.
    pub scores: usize,
    pub route_experts: usize,
    pub route_weights: usize,
    pub route_groups: usize,
    pub expert_out: usize,
}

impl WorkspaceBytes {
    pub fn new(c: &ModelConfig, dtype: CudaDtype, capacity: usize, logit_rows: usize) -> Self {
        let e = dtype.size();
        let (h, q_dim) = (c.hidden_size, c.q_dim());
        let moe = c.features.moe;
        let (rows, ff) = match moe {
            Some(m) => (capacity * m.experts_per_token, m.expert_ffn),
            None => (capacity, c.intermediate_size),
        };
        let routes = moe.map_or(0, |m| capacity * m.experts_per_token);
        WorkspaceBytes {
            x: capacity * h * 4,
            delta: capacity * h * 4,
            xn: capacity * h * e,
            qkv: capacity * (q_dim + 2 * c.kv_dim()) * 4,
            q: capacity * q_dim * 4,
            attn: capacity * q_dim * e,
            partials: PARTIAL_SLOTS * (c.head_dim + 2) * 4,
            gate_up: rows * 2 * ff * 4,
            act: rows * ff * e,
            lm_in: logit_rows * h * e,
            logits: logit_rows * c.vocab_size * 4,
            scores: moe.map_or(0, |m| capacity * m.num_experts * 4),
            route_experts: routes * 4,
            route_weights: routes * 4,
            route_groups: moe.map_or(0, |m| 4 * Routes::group_words(m.num_experts, routes)),
            expert_out: routes * h * 4,
        }
    }

    /// The workspace laid out by `at(field, bytes)`, which returns where it put each buffer
    /// (the emulated tests' host buffers).
    #[cfg(test)]
    pub fn place(&self, mut at: impl FnMut(&'static str, usize) -> DevPtr) -> WorkspacePtrs {
        WorkspacePtrs {
            x: at("x", self.x),
            delta: at("delta", self.delta),
            xn: at("xn", self.xn),
            qkv: at("qkv", self.qkv),
            q: at("q", self.q),
            attn: at("attn", self.attn),
            partials: at("partials", self.partials),
            gate_up: at("gate_up", self.gate_up),
            act: at("act", self.act),
            lm_in: at("lm_in", self.lm_in),
            logits: at("logits", self.logits),
            scores: at("scores", self.scores),
            route_experts: at("route_experts", self.route_experts),
            route_weights: at("route_weights", self.route_weights),
            route_groups: at("route_groups", self.route_groups),
            expert_out: at("expert_out", self.expert_out),
        }
    }
}

/// The paged KV pool: per layer, key and value planes of `[slots, kv_dim]`, and the f32
/// hidden-state store `[slots, h]`.
#[derive(Debug, Clone)]
pub(crate) struct KvPtrs {
    pub keys: Vec<DevPtr>,
    pub values: Vec<DevPtr>,
    pub hidden: DevPtr,
    pub block_size: usize,
}
