//! The decoder-only transformer (Llama, Qwen2, Qwen3, Gemma 3, Phi-3, and the
//! mixture-of-experts Mixtral and Qwen3-MoE, whose MLP is in `transformer/moe.rs`) and its one
//! entry point, [`Model::forward`]: a [`ForwardBatch`] in, logits for the selected rows out.

mod adapt;
mod moe;

use tandem_kernels::ops::{
    add_inplace, geglu_tanh_inplace, rms_norm, rms_norm_inplace, rope_head, softcap_inplace,
    swiglu_inplace,
};
use tandem_kernels::packed::QuantizedRows;
use tandem_kernels::parallel::for_each_chunk_mut;
use tandem_kernels::{Isa, ThreadPool};

use crate::attention::{causal_attention, AttentionLayout, HeadShape};
use crate::batch::{AdapterId, ForwardBatch, SeqSpan, TokenId};
use crate::config::{Activation, ModelConfig, RopeStyle};
use crate::error::{ModelError, Result};
use crate::host_model::HostModel;
use crate::kv_store::{KvDtype, KvStore};
use crate::logits::Logits;
use crate::lora::{AdapterRows, AdapterSet, LoraAdapter, Projection};
use crate::packed_weights::{NormedInput, PackedWeights};
use crate::scratch::{Activations, BatchLayout, RopeTable, Scratch};
use crate::token_pick::TokenPick;
use crate::weights::{TensorHandle, TensorSet};

/// The largest logits buffer a model keeps for reuse ([`Model::recycle_logits`]): a decode
/// step of 64 rows over a 262,144-token vocabulary; a long prompt's rows are let go.
pub const SPARE_LOGITS_BYTES: usize = 64 << 20;

pub(crate) use moe::MoeScratch;
pub use moe::{route, ExpertWeights, Route};

/// The weights of one decoder layer. Matrices stay in their stored format; the small
/// vectors (norms, biases) are kept as f32.
#[derive(Debug)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub q: TensorHandle,
    pub k: TensorHandle,
    pub v: TensorHandle,
    pub o: TensorHandle,
    /// q/k/v biases (Qwen2): `[q_dim]`, `[kv_dim]`, `[kv_dim]`.
    pub qkv_bias: Option<[Vec<f32>; 3]>,
    /// Per-head RMSNorm weights for q and k (Qwen3): `[head_dim]` each.
    pub qk_norm: Option<[Vec<f32>; 2]>,
    pub ffn_norm: Vec<f32>,
    /// The norms of the attention output and of the MLP output before their residual adds
    /// (Gemma 3): `[hidden]` each.
    pub post_norms: Option<[Vec<f32>; 2]>,
    pub mlp: FeedForward,
}

/// A gated MLP: `down(act(gate · x) * (up · x))`.
#[derive(Debug, Clone, Copy)]
pub struct GatedMlp {
    pub gate: TensorHandle,
    pub up: TensorHandle,
    pub down: TensorHandle,
}

/// A layer's feed-forward part.
#[derive(Debug)]
pub enum FeedForward {
    /// One gated MLP for every token.
    Dense(GatedMlp),
    /// A mixture of experts: each token runs through the few its router picks.
    Experts(ExpertWeights),
}

impl LayerWeights {
    /// Every projection matrix of the layer (the router of a mixture of experts is not one:
    /// it stays in its stored form, see `transformer/moe.rs`).
    pub fn projections(&self) -> Vec<TensorHandle> {
        let mut all = vec![self.q, self.k, self.v, self.o];
        match &self.mlp {
            FeedForward::Dense(m) => all.extend([m.gate, m.up, m.down]),
            FeedForward::Experts(e) => {
                all.extend(e.experts.iter().flat_map(|m| [m.gate, m.up, m.down]))
            }
        }
        all
    }
}

/// The model-level weights, resolved against a [`TensorSet`].
#[derive(Debug)]
pub struct ModelWeights {
    pub embed: TensorHandle,
    /// The output projection: `lm_head`/`output`, or the embedding when tied.
    pub lm_head: TensorHandle,
    pub final_norm: Vec<f32>,
    pub layers: Vec<LayerWeights>,
    /// `[head_dim / 2]` inverse RoPE frequency of each rotated pair.
    pub inv_freqs: Vec<f32>,
    /// The sliding-window layers' own frequencies, when they differ (Gemma 3).
    pub local_inv_freqs: Option<Vec<f32>>,
}

/// A loaded model: its configuration, its tensors and the thread pool that runs it.
#[derive(Debug)]
pub struct Model {
    pub config: ModelConfig,
    tensors: TensorSet,
    w: ModelWeights,
    /// The matrices repacked for the int8 kernels (none under an exact kernel variant).
    packed: PackedWeights,
    pool: ThreadPool,
    /// Working memory reused by every forward call.
    scratch: Scratch,
    /// The LoRA adapters sequences may run with, by [`AdapterId`].
    adapters: AdapterSet,
}

impl Model {
    /// Prepares a loaded model for the CPU with the process's default kernel variant
    /// ([`tandem_kernels::isa::active`]); see [`Model::with_kernels`].
    pub fn new(host: HostModel, threads: usize) -> Model {
        Model::with_kernels(host, threads, tandem_kernels::isa::active())
    }

    /// Prepares a loaded model for the CPU: its kernels run as `isa` on `threads` threads,
    /// and its matrices are repacked for the int8 kernels when `isa` is an int8 variant.
    /// The caller checks that the CPU can run `isa` ([`Isa::is_available`]).
    pub fn with_kernels(host: HostModel, threads: usize, isa: Isa) -> Model {
        let HostModel {
            config,
            tensors,
            weights: w,
        } = host;
        let pool = ThreadPool::new(threads);
        let packed = PackedWeights::prepare(&tensors, &w, &pool, isa);
        Model {
            config,
            tensors,
            w,
            packed,
            pool,
            scratch: Scratch::default(),
            adapters: AdapterSet::default(),
        }
    }

    /// Registers a LoRA adapter (loaded for this model's configuration, e.g. by
    /// [`crate::lora::load_peft_adapter`]); sequences of a batch name it by the returned id,
    /// never given to another adapter.
    pub fn add_adapter(&mut self, adapter: LoraAdapter) -> Result<AdapterId> {
        adapter.check(&self.config).map_err(ModelError::Batch)?;
        Ok(self.adapters.add(adapter))
    }

    /// Forgets adapter `id` (a batch naming it is refused from now on).
    pub fn remove_adapter(&mut self, id: AdapterId) -> Result<()> {
        match self.adapters.remove(id) {
            Some(_) => Ok(()),
            None => Err(ModelError::Batch(format!(
                "adapter {} is not registered",
                id.0
            ))),
        }
    }

    /// Whether adapter `id` is registered.
    pub fn has_adapter(&self, id: AdapterId) -> bool {
        self.adapters.get(id).is_some()
    }

    /// [`LoraAdapter::digest`] of registered adapter `id`.
    pub fn adapter_digest(&self, id: AdapterId) -> Option<u64> {
        self.adapters.digest(id)
    }

    /// [`crate::weights::TensorSet::sampled_digest`] of the model's tensors.
    pub fn weights_digest(&self) -> u64 {
        self.tensors.sampled_digest()
    }

    /// The kernel variant this model's products and attention run with.
    pub fn kernels(&self) -> Isa {
        self.packed.isa()
    }

    /// The thread pool the kernels run on.
    pub fn pool(&self) -> &ThreadPool {
        &self.pool
    }

    /// Number of worker threads the kernels use.
    pub fn threads(&self) -> usize {
        self.pool.n_threads()
    }

    /// The greedy pick of every row of `logits` ([`TokenPick::greedy`]), the rows spread
    /// over the model's threads: each row's scans of the vocabulary are its own, so the
    /// picks are those of a loop over the rows.
    pub fn greedy_picks(&self, logits: &Logits) -> Vec<Option<TokenPick>> {
        let mut picks = vec![None; logits.num_rows()];
        for_each_chunk_mut(&self.pool, &mut picks, 1, |r, pick| {
            pick[0] = TokenPick::greedy(logits.row(r));
        });
        picks
    }

    /// [`Model::greedy_picks`]' tokens without their log-probabilities.
    pub fn greedy_tokens(&self, logits: &Logits) -> Vec<Option<TokenId>> {
        let mut tokens = vec![None; logits.num_rows()];
        for_each_chunk_mut(&self.pool, &mut tokens, 1, |r, token| {
            let greedy = tandem_kernels::row_max::greedy(logits.row(r));
            token[0] = greedy.map(|(id, _)| TokenId(id as u32));
        });
        tokens
    }

    /// Takes back the buffer of logits this model returned, for the next forward pass's LM
    /// head to write into (one of at most [`SPARE_LOGITS_BYTES`] is kept: a decode step's,
    /// not a long prompt's).
    pub fn recycle_logits(&mut self, logits: Logits) {
        self.scratch.logits.keep(logits);
    }

    /// `log p(targets[r])` for every row `r` of `logits` that has a target (one target per
    /// row, checked by the caller), the rows spread over the model's threads:
    /// [`TokenPick::of_row`]'s logprob, bitwise `scoring::score_row`'s. `Err(r)`: row `r`
    /// has a target but is not finite (or the target is not in it).
    pub(crate) fn target_logprobs(
        &self,
        logits: &Logits,
        targets: &[Option<TokenId>],
    ) -> std::result::Result<Vec<Option<f32>>, usize> {
        let mut scores: Vec<Option<Option<f32>>> = vec![None; targets.len()];
        for_each_chunk_mut(&self.pool, &mut scores, 1, |r, score| {
            score[0] = targets[r].map(|t| TokenPick::of_row(logits.row(r), t).map(|p| p.logprob));
        });
        scores
            .into_iter()
            .enumerate()
            .map(|(r, score)| score.map_or(Ok(None), |s| s.map(Some).ok_or(r)))
            .collect()
    }

    /// Total bytes of weights.
    pub fn weight_bytes(&self) -> usize {
        self.tensors.total_bytes()
    }

    /// Bytes of weights repacked for the int8 kernels (held beside the mapped file).
    pub fn packed_bytes(&self) -> usize {
        self.packed.bytes()
    }

    /// How a KV store for this model holds keys and values unless told otherwise: f16 when
    /// its matrices run through the int8 kernels (which already round activations to 8 bits;
    /// f16 halves the bytes each decode step reads per context position), f32 when the model
    /// runs exactly, so that an exact run stays the fp32 reference end to end.
    pub fn default_kv_dtype(&self) -> KvDtype {
        if self.packed_bytes() > 0 {
            KvDtype::F16
        } else {
            KvDtype::F32
        }
    }

    /// `y = x · Wᵀ` for matrix `h` over `n` rows of `x` (`xq`: where the int8 kernels put
    /// the quantized rows).
    fn matmul(&self, h: TensorHandle, x: &[f32], y: &mut [f32], n: usize, xq: &mut QuantizedRows) {
        self.packed
            .matmul(&self.tensors, &self.pool, h, x, y, n, xq);
    }

    /// `ys[m] = rms_norm(x, norm) · W_mᵀ` for the matrices `hs` (see
    /// [`PackedWeights::normed_matmuls`]; `scratch`: the normed rows where a matrix runs
    /// exactly, and the quantized ones).
    fn normed_matmuls<const N: usize>(
        &self,
        norm: &[f32],
        hs: [TensorHandle; N],
        x: &[f32],
        scratch: (&mut [f32], &mut QuantizedRows),
        ys: [&mut [f32]; N],
    ) {
        let input = NormedInput {
            x,
            weight: norm,
            eps: self.config.rms_norm_eps,
        };
        self.packed
            .normed_matmuls(&self.tensors, &self.pool, hs, input, scratch, ys);
    }

    /// Runs the transformer over `batch`: writes every new token's K/V into `kv` and returns
    /// logits for the rows `batch.output` selects.
    pub fn forward(&mut self, batch: &ForwardBatch, kv: &mut KvStore) -> Result<Logits> {
        let c = &self.config;
        batch.validate(c.vocab_size, kv.block_size(), kv.num_blocks())?;
        let unknown = |s: &&SeqSpan| s.adapter.is_some_and(|a| !self.has_adapter(a));
        if let Some(s) = batch.seqs.iter().find(unknown) {
            let msg = format!("adapter {:?} is not registered", s.adapter);
            return Err(ModelError::Batch(msg));
        }
        // The scratch is moved out for the call (the layers borrow the weights) and back.
        let mut scratch = std::mem::take(&mut self.scratch);
        let logits = self.forward_in(batch, kv, &mut scratch);
        self.scratch = scratch;
        Ok(logits)
    }

    /// [`Model::forward`] of a validated batch in `scratch`.
    fn forward_in(&self, batch: &ForwardBatch, kv: &mut KvStore, scratch: &mut Scratch) -> Logits {
        let c = &self.config;
        let n = batch.num_tokens();
        let Scratch {
            act: a,
            layout,
            rope,
            local_rope,
            xq,
            gathered,
            moe,
            logits,
        } = scratch;
        layout.fill(batch, kv);
        rope.fill(&layout.positions, &self.w.inv_freqs);
        if let Some(freqs) = &self.w.local_inv_freqs {
            local_rope.fill(&layout.positions, freqs);
        }
        a.resize(c, n);
        let embed = self.tensors.by_handle(self.w.embed);
        let row_bytes = embed.data.len() / c.vocab_size;
        for (t, row) in a.x.chunks_exact_mut(c.hidden_size).enumerate() {
            let id = batch.tokens[t].0 as usize;
            let src = &embed.data[id * row_bytes..(id + 1) * row_bytes];
            tandem_kernels::quant::dequantize_row(embed.dtype, src, row);
            if let Some(scale) = c.features.embedding_scale {
                row.iter_mut().for_each(|v| *v *= scale);
            }
        }
        for (l, layer) in self.w.layers.iter().enumerate() {
            let local = c.features.window(l).is_some() && self.w.local_inv_freqs.is_some();
            let layer_rope = if local { &*local_rope } else { &*rope };
            self.attention_block(l, layer, layout, layer_rope, a, xq, kv);
            self.mlp_block(l, layer, &layout.adapter_rows, a, xq, moe);
        }
        // Every token's final hidden state is kept beside its K/V (see `KvStore`).
        let h = c.hidden_size;
        let (eps, norm) = (c.rms_norm_eps, &self.w.final_norm[..]);
        for_each_chunk_mut(&self.pool, &mut a.xn, h, |t, row| {
            rms_norm(&a.x[t * h..(t + 1) * h], norm, eps, row)
        });
        for (t, &slot) in layout.write_slots.iter().enumerate() {
            kv.write_hidden(slot, &a.xn[t * h..(t + 1) * h]);
        }
        let rows = batch.output_rows();
        gathered.clear();
        for &r in &rows {
            gathered.extend_from_slice(&a.xn[r * h..(r + 1) * h]);
        }
        let data = logits.take(rows.len() * c.vocab_size);
        self.lm_head(rows, gathered, xq, data)
    }

    /// The logits of the tokens whose final hidden states sit in `slots` of `kv` (rows
    /// numbered `0..slots.len()`): bitwise what the forward pass that computed them returned,
    /// because the LM head's result for a row does not depend on the other rows.
    pub fn logits_at_slots(&mut self, kv: &KvStore, slots: &[usize]) -> Logits {
        let mut scratch = std::mem::take(&mut self.scratch);
        let Scratch {
            xq,
            gathered,
            logits,
            ..
        } = &mut scratch;
        gathered.clear();
        for &slot in slots {
            gathered.extend_from_slice(kv.hidden_row(slot));
        }
        let data = logits.take(slots.len() * self.config.vocab_size);
        let logits = self.lm_head((0..slots.len()).collect(), gathered, xq, data);
        self.scratch = scratch;
        logits
    }

    #[allow(clippy::too_many_arguments)] // a layer, its inputs and the call's scratch
    fn attention_block(
        &self,
        l: usize,
        w: &LayerWeights,
        layout: &BatchLayout,
        rope: &RopeTable,
        a: &mut Activations,
        xq: &mut QuantizedRows,
        kv: &mut KvStore,
    ) {
        let c = &self.config;
        let n = layout.positions.len();
        let ys = [&mut a.q[..], &mut a.k[..], &mut a.v[..]];
        let scratch = (&mut a.xn[..], &mut *xq);
        self.normed_matmuls(&w.attn_norm, [w.q, w.k, w.v], &a.x, scratch, ys);
        let rows = &layout.adapter_rows;
        let ys = [
            (Projection::Q, &mut a.q[..]),
            (Projection::K, &mut a.k[..]),
            (Projection::V, &mut a.v[..]),
        ];
        self.adapt_normed(rows, (l, &w.attn_norm), &a.x, ys, &mut a.lora);
        if let Some([bq, bk, bv]) = &w.qkv_bias {
            add_bias(&mut a.q, bq);
            add_bias(&mut a.k, bk);
            add_bias(&mut a.v, bv);
        }
        if let Some([nq, nk]) = &w.qk_norm {
            for head in a.q.chunks_exact_mut(c.head_dim) {
                rms_norm_inplace(head, nq, c.rms_norm_eps);
            }
            for head in a.k.chunks_exact_mut(c.head_dim) {
                rms_norm_inplace(head, nk, c.rms_norm_eps);
            }
        }
        self.rotate_and_store(l, layout, rope, a, kv);
        let shape = HeadShape {
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            scale: c
                .features
                .attention_scale
                .unwrap_or(1.0 / (c.head_dim as f32).sqrt()),
            window: c.features.window(l),
        };
        let attn_layout = AttentionLayout {
            positions: &layout.positions,
            token_seq: &layout.token_seq,
            seq_slots: &layout.seq_slots,
        };
        causal_attention(
            self.packed.isa(),
            &self.pool,
            shape,
            &attn_layout,
            &a.q,
            kv.layer(l),
            &mut a.decode,
            &mut a.attn,
        );
        self.matmul(w.o, &a.attn, &mut a.out, n, xq);
        self.adapt(
            rows,
            (l, Projection::O),
            &a.attn,
            &mut a.out,
            &mut a.lora.scratch,
        );
        if let Some([post_attn, _]) = &w.post_norms {
            self.norm_rows(&mut a.out, post_attn);
        }
        add_inplace(&mut a.x, &a.out);
    }

    /// RMSNorm of every row of `x` (`[n, hidden]`) in place.
    fn norm_rows(&self, x: &mut [f32], weight: &[f32]) {
        let eps = self.config.rms_norm_eps;
        for_each_chunk_mut(&self.pool, x, weight.len(), |_, row| {
            rms_norm_inplace(row, weight, eps)
        });
    }

    /// RoPE and the KV write, fused: token by token, its query and key heads are rotated by
    /// its position and its key and value rows stored at its slot of layer `l`.
    fn rotate_and_store(
        &self,
        l: usize,
        layout: &BatchLayout,
        rope: &RopeTable,
        a: &mut Activations,
        kv: &mut KvStore,
    ) {
        let c = &self.config;
        let (d, q_dim, kv_dim) = (c.head_dim, c.q_dim(), c.kv_dim());
        let neox = c.rope.style == RopeStyle::Neox;
        let tokens =
            a.q.chunks_exact_mut(q_dim)
                .zip(a.k.chunks_exact_mut(kv_dim))
                .zip(a.v.chunks_exact(kv_dim));
        for (t, ((q, k), v)) in tokens.enumerate() {
            let (cos, sin) = rope.row(t);
            for head in q.chunks_exact_mut(d).chain(k.chunks_exact_mut(d)) {
                rope_head(head, cos, sin, neox);
            }
            kv.write(l, layout.write_slots[t], k, v);
        }
    }

    fn mlp_block(
        &self,
        l: usize,
        w: &LayerWeights,
        rows: &AdapterRows,
        a: &mut Activations,
        xq: &mut QuantizedRows,
        moe: &mut MoeScratch,
    ) {
        let c = &self.config;
        let n = a.x.len() / c.hidden_size;
        match &w.mlp {
            FeedForward::Dense(m) => {
                let scratch = (&mut a.xn[..], &mut *xq);
                let ff = c.intermediate_size;
                let (gate, up) = (&mut a.gate[..n * ff], &mut a.up[..n * ff]);
                self.normed_matmuls(&w.ffn_norm, [m.gate, m.up], &a.x, scratch, [gate, up]);
                let ys = [
                    (Projection::Gate, &mut a.gate[..n * ff]),
                    (Projection::Up, &mut a.up[..n * ff]),
                ];
                self.adapt_normed(rows, (l, &w.ffn_norm), &a.x, ys, &mut a.lora);
                self.activate(&mut a.gate[..n * ff], &a.up[..n * ff], ff);
                self.matmul(m.down, &a.gate[..n * ff], &mut a.out, n, xq);
                let down = (l, Projection::Down);
                self.adapt(
                    rows,
                    down,
                    &a.gate[..n * ff],
                    &mut a.out,
                    &mut a.lora.scratch,
                );
            }
            FeedForward::Experts(e) => self.experts_block(&w.ffn_norm, e, a, xq, moe),
        }
        if let Some([_, post_ffn]) = &w.post_norms {
            self.norm_rows(&mut a.out, post_ffn);
        }
        add_inplace(&mut a.x, &a.out);
    }

    /// `gate[t] = act(gate[t]) * up[t]` for every row `t` of width `ff`.
    fn activate(&self, gate: &mut [f32], up: &[f32], ff: usize) {
        let act = self.config.features.activation;
        for_each_chunk_mut(&self.pool, gate, ff, |t, gate| {
            let up = &up[t * ff..(t + 1) * ff];
            match act {
                Activation::Silu => swiglu_inplace(gate, up),
                Activation::GeluTanh => geglu_tanh_inplace(gate, up),
            }
        });
    }

    /// The output projection of final hidden states: row `i` of the result (numbered
    /// `rows[i]`) from row `i` of `hidden` (`[rows, hidden_size]`), written into `data`
    /// (`[rows, vocab]`, possibly a recycled buffer: the product writes every entry, so
    /// whatever it held is never read).
    fn lm_head(
        &self,
        rows: Vec<usize>,
        hidden: &[f32],
        xq: &mut QuantizedRows,
        mut data: Vec<f32>,
    ) -> Logits {
        let c = &self.config;
        self.matmul(self.w.lm_head, hidden, &mut data, rows.len(), xq);
        if let Some(cap) = c.features.final_logit_softcap {
            softcap_inplace(&mut data, cap);
        }
        Logits::new(rows, c.vocab_size, data)
    }
}

/// Adds `bias` (`[width]`) to every row of `x` (`[n, width]`).
fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        add_inplace(row, bias);
    }
}
