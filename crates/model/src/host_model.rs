//! A model as loaded: its configuration and its tensors on the host, resolved to the roles
//! they play ([`ModelWeights`]), not yet prepared for any device. Each runner prepares its
//! own copy from it: the CPU runner repacks matrices for its int8 kernels, the CUDA runner
//! uploads them to the GPU.

use crate::config::ModelConfig;
use crate::transformer::{FeedForward, ModelWeights};
use crate::weights::TensorSet;

/// A loaded model's configuration and resolved tensors.
#[derive(Debug)]
pub struct HostModel {
    pub config: ModelConfig,
    /// The tensors in their stored (possibly quantized) format, memory-mapped.
    pub tensors: TensorSet,
    /// Which tensor plays which role, plus the small vectors (norms, biases, RoPE
    /// frequencies) already in f32.
    pub weights: ModelWeights,
}

impl HostModel {
    /// Total bytes of the stored tensors.
    pub fn weight_bytes(&self) -> usize {
        self.tensors.total_bytes()
    }

    /// Number of weights in the matrices a token passes through (all layers and the LM head;
    /// the embedding lookup is not a matrix product; in a mixture of experts, the router and
    /// the experts a token uses: its active parameters). Used for FLOP estimates.
    pub fn num_params(&self) -> usize {
        let c = &self.config;
        let per_layer = c.hidden_size * (2 * c.q_dim() + 2 * c.kv_dim()) + c.ffn_params_per_token();
        c.num_layers * per_layer + c.vocab_size * c.hidden_size
    }

    /// Bytes of the experts' stored matrices (0 for a dense model).
    pub fn expert_bytes(&self) -> usize {
        let experts = self.weights.layers.iter().filter_map(|l| match &l.mlp {
            FeedForward::Experts(e) => Some(&e.experts),
            FeedForward::Dense(_) => None,
        });
        experts
            .flatten()
            .flat_map(|m| [m.gate, m.up, m.down])
            .map(|h| self.tensors.by_handle(h).data.len())
            .sum()
    }

    /// Bytes of stored weights a forward step of `tokens` tokens reads: all of them, but of a
    /// mixture of experts only the share of the experts that `tokens` tokens are expected to
    /// pick ([`ModelConfig::expert_share_read`]).
    pub fn weight_bytes_read(&self, tokens: usize) -> f64 {
        let experts = self.expert_bytes() as f64;
        self.weight_bytes() as f64 - experts * (1.0 - self.config.expert_share_read(tokens))
    }
}
