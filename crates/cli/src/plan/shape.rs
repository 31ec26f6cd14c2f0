//! What the cost model needs to know of a model: its shapes, how many weights a token passes
//! through, and how many bytes a forward pass reads, on the CPU (the stored, possibly
//! quantized tensors, as the int8 kernels read them) or on a GPU (bf16, as the CUDA runner
//! uploads them).

use serde::Serialize;
use tandem_model::config::MixtureOfExperts;
use tandem_model::host_model::HostModel;
use tandem_model::kv_store::KvDtype;
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
    /// Of each layer, the positions a token attends to (a sliding window, itself included),
    /// or `None`: every position up to its own.
    pub windows: Vec<Option<usize>>,
    /// Weights of the layer matrices a token passes through (q, k, v, o, gate, up, down; of a
    /// mixture of experts, the router and the experts it picks) over all layers.
    pub layer_params: usize,
    /// Of a mixture of experts: the weights of all experts (all layers), their stored bytes,
    /// and the share of them a step of `t` tokens reads is `1 - (1 - picked/experts)^t`
    /// (expected under uniform routing). Zero for a dense model.
    pub expert_params: usize,
    pub expert_stored_bytes: f64,
    pub experts: usize,
    pub experts_picked: usize,
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
        shape.expert_stored_bytes = host.expert_bytes() as f64;
        shape
    }

    /// The shape of a model known by its configuration alone, its matrices stored with
    /// `bits_per_weight` bits each (16 for bf16, 4.5 for Q4_0, 5 for Q4_1, 8.5 for Q8_0).
    pub fn of_config(c: &ModelConfig, bits_per_weight: f64) -> ModelShape {
        let attention = c.hidden_size * (2 * c.q_dim() + 2 * c.kv_dim());
        let layer = attention + c.ffn_params_per_token();
        let (experts, picked, all_experts) = match &c.features.moe {
            None => (0, 0, 0),
            Some(m) => (
                m.num_experts,
                m.experts_per_token,
                m.num_experts * 3 * c.hidden_size * m.expert_ffn,
            ),
        };
        // Stored: every expert, not only the picked ones.
        let stored_layer = match &c.features.moe {
            None => layer,
            Some(m) => attention + m.num_experts * c.hidden_size + all_experts,
        };
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
            windows: (0..c.num_layers).map(|l| c.features.window(l)).collect(),
            layer_params: c.num_layers * layer,
            lm_head_params: lm_head,
            expert_params: c.num_layers * all_experts,
            expert_stored_bytes: bytes(c.num_layers * all_experts),
            experts,
            experts_picked: picked,
            stored_bytes: bytes(c.num_layers * stored_layer + lm_head + embed),
            stored_bytes_per_step: bytes(c.num_layers * stored_layer + lm_head),
        }
    }

    /// The share of the experts a step of `tokens` tokens reads (1 without experts).
    fn expert_share_read(&self, tokens: f64) -> f64 {
        if self.experts == 0 {
            return 1.0;
        }
        let moe = MixtureOfExperts {
            num_experts: self.experts,
            experts_per_token: self.experts_picked,
            expert_ffn: 0,
            normalize_top_k: false,
        };
        moe.share_read(tokens)
    }

    /// Bytes of keys and values one token adds to the cache (all layers).
    pub fn kv_bytes_per_token(&self, kv_dtype: KvDtype) -> usize {
        2 * self.num_layers * kv_dtype.row_bytes(self.kv_dim)
    }

    /// Bytes one token slot of the engine's KV pool takes: keys and values, and the final
    /// hidden state in f32 that scoring reads back from the prefix cache.
    pub fn kv_slot_bytes(&self, kv_dtype: KvDtype) -> usize {
        self.kv_bytes_per_token(kv_dtype) + 4 * self.hidden_size
    }

    /// Matrix FLOPs of `tokens` tokens through the layers, plus `rows` rows of the LM head.
    pub fn matmul_flops(&self, tokens: f64, rows: f64) -> f64 {
        2.0 * (self.layer_params as f64 * tokens + self.lm_head_params as f64 * rows)
    }

    /// Of [`ModelShape::matmul_flops`] for `tokens` tokens, the experts' part (0 when dense).
    pub fn picked_expert_flops(&self, tokens: f64) -> f64 {
        if self.experts == 0 {
            return 0.0;
        }
        let per_token =
            self.expert_params as f64 * self.experts_picked as f64 / self.experts as f64;
        2.0 * per_token * tokens
    }

    /// Rows an expert's products see in a step of `tokens` tokens, on average over the
    /// experts the step reads.
    pub fn rows_per_expert(&self, tokens: f64) -> f64 {
        if self.experts == 0 {
            return tokens;
        }
        let picks = tokens * self.experts_picked as f64;
        let read = self.experts as f64 * self.expert_share_read(tokens);
        (picks / read.max(1.0)).max(1.0)
    }

    /// Attention FLOPs of `new` tokens after `cached` positions (scores and the weighted sum
    /// of values, every head of every layer): token `i` of the new ones attends `cached + i
    /// + 1` positions, or its window's on a sliding-window layer.
    pub fn attention_flops(&self, cached: f64, new: f64) -> f64 {
        let pairs: f64 = self
            .windows
            .iter()
            .map(|&w| attended_pairs(w, cached, new))
            .sum();
        4.0 * (self.num_heads * self.head_dim) as f64 * pairs
    }

    /// Positions of keys and values, summed over the layers, that a pass over `new`
    /// consecutive new tokens ending a context of `context` positions reads: all of them, or
    /// on a sliding-window layer those the new tokens' windows cover.
    pub fn kv_positions_read(&self, context: f64, new: f64) -> f64 {
        self.windows
            .iter()
            .map(|w| match w {
                Some(w) => context.min(*w as f64 + new - 1.0),
                None => context,
            })
            .sum()
    }

    /// Bytes of weights a forward pass over `tokens` tokens reads on a device storing them at
    /// `bytes_per_weight` (`None`: as stored): all of them, but of a mixture of experts only
    /// the share its tokens are expected to pick.
    pub fn weight_bytes_per_step(&self, bytes_per_weight: Option<f64>, tokens: f64) -> f64 {
        let unread = 1.0 - self.expert_share_read(tokens);
        match bytes_per_weight {
            None => self.stored_bytes_per_step - self.expert_stored_bytes * unread,
            Some(b) => {
                let picked_share = if self.experts == 0 {
                    0.0
                } else {
                    self.experts_picked as f64 / self.experts as f64
                };
                let per_token = (self.layer_params + self.lm_head_params) as f64;
                let non_expert = per_token - self.expert_params as f64 * picked_share;
                (non_expert + self.expert_params as f64 * (1.0 - unread)) * b
            }
        }
    }

    /// Bytes the weights occupy on a device storing them at `bytes_per_weight`.
    pub fn resident_weight_bytes(&self, bytes_per_weight: Option<f64>) -> f64 {
        match bytes_per_weight {
            None => self.stored_bytes,
            Some(b) => {
                // Every expert is resident, as if an endless step read them all.
                let per_step = self.weight_bytes_per_step(Some(b), f64::INFINITY);
                let scale = self.stored_bytes / self.stored_bytes_per_step.max(1.0);
                per_step * scale
            }
        }
    }
}

/// Query-key pairs of `new` tokens after `cached` positions in one layer: token `i` (from 1)
/// attends `cached + i` positions, at most `window`.
fn attended_pairs(window: Option<usize>, cached: f64, new: f64) -> f64 {
    let all = new * cached + new * (new + 1.0) / 2.0;
    let Some(w) = window.map(|w| w as f64) else {
        return all;
    };
    let (first, last) = (cached + 1.0, cached + new); // the counts of the first and last token
    if last <= w {
        all
    } else if first >= w {
        new * w
    } else {
        // Tokens up to the window attend first..=w positions, the rest w each.
        (w - first + 1.0) * (first + w) / 2.0 + (last - w) * w
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_model::hf_config::load_hf_config;

    fn moe_shape() -> (ModelConfig, ModelShape) {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../model/tests/fixtures/hf/qwen3_moe"
        );
        let c = load_hf_config(std::path::Path::new(dir))
            .expect("fixture config")
            .config;
        let shape = ModelShape::of_config(&c, 16.0);
        (c, shape)
    }

    #[test]
    fn a_mixture_of_experts_costs_its_picked_experts_and_stores_all() {
        let (c, s) = moe_shape();
        let m = c.features.moe.expect("a MoE fixture");
        let h = c.hidden_size;
        let attention = h * (2 * c.q_dim() + 2 * c.kv_dim());
        let expert = 3 * h * m.expert_ffn;
        let router = m.num_experts * h;
        let lm_head = c.vocab_size * h;
        // A token passes through the router and k experts.
        let per_token = attention + router + m.experts_per_token * expert;
        assert_eq!(s.layer_params, c.num_layers * per_token);
        // Stored: every expert; the fixture ties its embedding to the LM head.
        let stored = c.num_layers * (attention + router + m.num_experts * expert) + lm_head;
        assert_eq!(s.stored_bytes, 2.0 * stored as f64);
        assert_eq!(s.resident_weight_bytes(Some(2.0)), 2.0 * stored as f64);
        // One token reads k of E experts; many tokens read nearly all of them.
        let one = s.weight_bytes_per_step(Some(2.0), 1.0);
        let want = 2.0 * (c.num_layers * per_token + lm_head) as f64;
        assert!((one - want).abs() < 1e-6 * want, "{one} vs {want}");
        let many = s.weight_bytes_per_step(Some(2.0), 1e6);
        assert!((many - 2.0 * stored as f64).abs() < 1e-6 * many, "{many}");
        assert!(s.weight_bytes_per_step(None, 4.0) > s.weight_bytes_per_step(None, 1.0));
        // A token's k experts each see it alone; many tokens share each expert.
        assert_eq!(s.rows_per_expert(1.0), 1.0);
        let (e, k) = (m.num_experts as f64, m.experts_per_token as f64);
        assert!((s.rows_per_expert(1e6) - 1e6 * k / e).abs() < 1e-3);
        let picked = c.num_layers * m.experts_per_token * expert;
        assert_eq!(s.picked_expert_flops(3.0), 2.0 * 3.0 * picked as f64);
    }
}

#[cfg(test)]
mod window_tests {
    use super::*;
    use tandem_model::hf_config::load_hf_config;

    /// Gemma 3's fixture: a window of 8 positions on layers 0 and 2, none on layer 1.
    fn gemma_shape() -> ModelShape {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../model/tests/fixtures/hf/gemma3"
        );
        let c = load_hf_config(std::path::Path::new(dir))
            .expect("fixture config")
            .config;
        ModelShape::of_config(&c, 16.0)
    }

    /// Pairs and positions read, by counting what every new token sees in every layer.
    fn counted(s: &ModelShape, cached: usize, new: usize) -> (f64, f64) {
        let (mut pairs, mut read) = (0.0, 0.0);
        for w in &s.windows {
            let mut seen = std::collections::BTreeSet::new();
            for p in cached..cached + new {
                let first = w.map_or(0, |w| (p + 1).saturating_sub(w));
                pairs += (p + 1 - first) as f64;
                seen.extend(first..=p);
            }
            read += seen.len() as f64;
        }
        let per_pair = 4.0 * (s.num_heads * s.head_dim) as f64;
        (pairs * per_pair, read)
    }

    #[test]
    fn sliding_windows_bound_the_pairs_and_the_positions_read() {
        let s = gemma_shape();
        assert_eq!(s.windows, vec![Some(8), None, Some(8)]);
        for (cached, new) in [
            (0, 1),
            (0, 5),
            (0, 8),
            (0, 9),
            (0, 30),
            (3, 4),
            (6, 7),
            (20, 1),
            (20, 16),
            (100, 64),
        ] {
            let (flops, read) = counted(&s, cached, new);
            let context = (cached + new) as f64;
            let (c, n) = (cached as f64, new as f64);
            assert_eq!(
                s.attention_flops(c, n),
                flops,
                "pairs after {cached} + {new}"
            );
            assert_eq!(
                s.kv_positions_read(context, n),
                read,
                "read after {cached} + {new}"
            );
        }
        // Without windows: every pair and every position, in every layer.
        let mut full = s.clone();
        full.windows = vec![None; 3];
        let (c, n) = (100.0, 64.0);
        let pairs = n * c + n * (n + 1.0) / 2.0;
        let per_pair = 4.0 * (s.num_heads * s.head_dim) as f64;
        assert_eq!(full.attention_flops(c, n), 3.0 * pairs * per_pair);
        assert_eq!(full.kv_positions_read(c + n, n), 3.0 * (c + n));
    }
}
