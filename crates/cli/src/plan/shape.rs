//! What the cost model needs to know of a model: its shapes, how many weights a token passes
//! through, and how many bytes a forward pass reads, on the CPU (the stored, possibly
//! quantized tensors, as the int8 kernels read them) or on a GPU (bf16, as the CUDA runner
//! uploads them).

use serde::Serialize;
use tandem_model::host_model::HostModel;
use tandem_model::ModelConfig;

/// The sizes of a model that set its cost.
#[derive(Debug, Clone, Serialize)]
pub struct ModelShape {
    pub num_layers: usize,
    pub hidden_size: usize,
    pub num_heads: usize,
    pub head_dim: usize,
    /// Key (= value) width of one layer: `num_kv_heads * head_dim`.
    pub kv_dim: usize,
    pub vocab_size: usize,
    pub context_len: usize,
    /// Weights of the layer matrices (q, k, v, o, gate, up, down) over all layers.
    pub layer_params: usize,
    /// Weights of the output projection (vocabulary x hidden).
    pub lm_head_params: usize,
    /// Bytes the stored weights take (embedding included).
    pub stored_bytes: f64,
    /// Bytes one forward pass reads from the stored weights (layers and LM head; the
    /// embedding only when it is the LM head, as with tied embeddings).
    pub stored_bytes_per_step: f64,
}

impl ModelShape {
    /// The shape of a loaded model; its byte counts from its stored tensors.
    pub fn of_host(host: &HostModel) -> ModelShape {
        let mut shape = ModelShape::of_config(&host.config, 0.0);
        let total = host.weight_bytes() as f64;
        let w = &host.weights;
        let embed_only = if w.embed == w.lm_head {
            0.0
        } else {
            host.tensors.by_handle(w.embed).data.len() as f64
        };
        shape.stored_bytes = total;
        shape.stored_bytes_per_step = total - embed_only;
        shape
    }

    /// The shape of a model known by its configuration alone, its matrices stored with
    /// `bits_per_weight` bits each (16 for bf16, 4.5 for Q4_0, 5 for Q4_1, 8.5 for Q8_0).
    pub fn of_config(c: &ModelConfig, bits_per_weight: f64) -> ModelShape {
        let layer = c.hidden_size * (2 * c.q_dim() + 2 * c.kv_dim())
            + 3 * c.hidden_size * c.intermediate_size;
        let lm_head = c.vocab_size * c.hidden_size;
        let embed = if c.tie_word_embeddings { 0 } else { lm_head };
        let bytes = |params: usize| params as f64 * bits_per_weight / 8.0;
        ModelShape {
            num_layers: c.num_layers,
            hidden_size: c.hidden_size,
            num_heads: c.num_heads,
            head_dim: c.head_dim,
            kv_dim: c.kv_dim(),
            vocab_size: c.vocab_size,
            context_len: c.context_len,
            layer_params: c.num_layers * layer,
            lm_head_params: lm_head,
            stored_bytes: bytes(c.num_layers * layer + lm_head + embed),
            stored_bytes_per_step: bytes(c.num_layers * layer + lm_head),
        }
    }

    /// Bytes of keys and values one token adds to the cache (all layers).
    pub fn kv_bytes_per_token(&self, kv_dtype_bytes: usize) -> usize {
        2 * self.num_layers * self.kv_dim * kv_dtype_bytes
    }

    /// Bytes one token slot of the engine's KV pool takes: keys and values, and the final
    /// hidden state in f32 that scoring reads back from the prefix cache.
    pub fn kv_slot_bytes(&self, kv_dtype_bytes: usize) -> usize {
        self.kv_bytes_per_token(kv_dtype_bytes) + 4 * self.hidden_size
    }

    /// Matrix FLOPs of `tokens` tokens through the layers, plus `rows` rows of the LM head.
    pub fn matmul_flops(&self, tokens: f64, rows: f64) -> f64 {
        2.0 * (self.layer_params as f64 * tokens + self.lm_head_params as f64 * rows)
    }

    /// Attention FLOPs of one token attending `context` positions (scores and the weighted
    /// sum of values, every head of every layer).
    pub fn attention_flops(&self, context: f64) -> f64 {
        4.0 * (self.num_layers * self.num_heads * self.head_dim) as f64 * context
    }

    /// Bytes of weights one forward pass reads on a device storing them at `bytes_per_weight`
    /// (`None`: as stored).
    pub fn weight_bytes_per_step(&self, bytes_per_weight: Option<f64>) -> f64 {
        match bytes_per_weight {
            None => self.stored_bytes_per_step,
            Some(b) => (self.layer_params + self.lm_head_params) as f64 * b,
        }
    }

    /// Bytes the weights occupy on a device storing them at `bytes_per_weight`.
    pub fn resident_weight_bytes(&self, bytes_per_weight: Option<f64>) -> f64 {
        match bytes_per_weight {
            None => self.stored_bytes,
            Some(b) => {
                let per_step = self.weight_bytes_per_step(Some(b));
                let scale = self.stored_bytes / self.stored_bytes_per_step.max(1.0);
                per_step * scale
            }
        }
    }
}
