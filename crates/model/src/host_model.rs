//! A model as loaded: its configuration and its tensors on the host, resolved to the roles
//! they play ([`ModelWeights`]), not yet prepared for any device. Each runner prepares its
//! own copy from it: the CPU runner repacks matrices for its int8 kernels, the CUDA runner
//! uploads them to the GPU.

use crate::config::ModelConfig;
use crate::transformer::ModelWeights;
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
    /// the embedding lookup is not a matrix product). Used for FLOP estimates.
    pub fn num_params(&self) -> usize {
        let c = &self.config;
        let per_layer = c.hidden_size * (2 * c.q_dim() + 2 * c.kv_dim())
            + 3 * c.hidden_size * c.intermediate_size;
        c.num_layers * per_layer + c.vocab_size * c.hidden_size
    }
}
