//! The decoder-only transformer (Llama, Qwen2, Qwen3) and its one entry point,
//! [`Model::forward`]: a [`ForwardBatch`] in, logits for the selected rows out.

use tandem_kernels::ops::{add_inplace, rms_norm, rms_norm_inplace, rope_head, swiglu_inplace};
use tandem_kernels::parallel::for_each_chunk_mut;
use tandem_kernels::ThreadPool;

use crate::attention::{causal_attention, AttentionLayout, HeadShape};
use crate::batch::ForwardBatch;
use crate::config::{ModelConfig, RopeStyle};
use crate::error::Result;
use crate::kv_store::{KvDtype, KvStore};
use crate::logits::Logits;
use crate::packed_weights::PackedWeights;
use crate::weights::{TensorHandle, TensorSet};

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
    pub gate: TensorHandle,
    pub up: TensorHandle,
    pub down: TensorHandle,
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
}

/// Scratch activations of one forward call.
struct Activations {
    /// `[n, hidden]` the residual stream.
    x: Vec<f32>,
    /// `[n, hidden]` normalised input of a sub-layer.
    xn: Vec<f32>,
    /// `[n, q_dim]`, `[n, kv_dim]`, `[n, kv_dim]`.
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    /// `[n, q_dim]` attention output.
    attn: Vec<f32>,
    /// `[n, intermediate]` gate and up projections.
    gate: Vec<f32>,
    up: Vec<f32>,
    /// `[n, hidden]` sub-layer output before the residual add.
    out: Vec<f32>,
}

impl Activations {
    fn new(c: &ModelConfig, n: usize) -> Activations {
        let z = |w: usize| vec![0.0f32; n * w];
        Activations {
            x: z(c.hidden_size),
            xn: z(c.hidden_size),
            q: z(c.q_dim()),
            k: z(c.kv_dim()),
            v: z(c.kv_dim()),
            attn: z(c.q_dim()),
            gate: z(c.intermediate_size),
            up: z(c.intermediate_size),
            out: z(c.hidden_size),
        }
    }
}

/// Where the batch's tokens go: computed once per forward, shared by every layer.
struct BatchLayout {
    positions: Vec<usize>,
    token_seq: Vec<usize>,
    /// Per sequence, the slot of each context position.
    seq_slots: Vec<Vec<usize>>,
    /// `[n]` the slot each new token's K/V is written to.
    write_slots: Vec<usize>,
}

impl BatchLayout {
    fn new(batch: &ForwardBatch, kv: &KvStore) -> BatchLayout {
        let positions = batch.positions();
        let mut token_seq = Vec::with_capacity(batch.num_tokens());
        let mut seq_slots: Vec<Vec<usize>> = Vec::with_capacity(batch.seqs.len());
        for (i, s) in batch.seqs.iter().enumerate() {
            token_seq.extend(std::iter::repeat_n(i, s.len));
            seq_slots.push(
                (0..s.context_len())
                    .map(|p| kv.slot(&s.block_table, p))
                    .collect(),
            );
        }
        let write_slots = positions
            .iter()
            .zip(&token_seq)
            .map(|(&p, &s)| seq_slots[s][p])
            .collect::<Vec<usize>>();
        BatchLayout {
            positions,
            token_seq,
            seq_slots,
            write_slots,
        }
    }
}

impl Model {
    /// Assembles a model from resolved parts; loaders call this after validating shapes.
    pub(crate) fn new(
        config: ModelConfig,
        tensors: TensorSet,
        w: ModelWeights,
        threads: usize,
    ) -> Model {
        let pool = ThreadPool::new(threads);
        let packed = PackedWeights::prepare(&tensors, &w, &pool);
        Model {
            config,
            tensors,
            w,
            packed,
            pool,
        }
    }

    /// Number of worker threads the kernels use.
    pub fn threads(&self) -> usize {
        self.pool.n_threads()
    }

    /// Number of weights in the matrices a token passes through (all layers and the LM head;
    /// the embedding lookup is not a matrix product). Used for FLOP estimates.
    pub fn num_params(&self) -> usize {
        let c = &self.config;
        let per_layer = c.hidden_size * (2 * c.q_dim() + 2 * c.kv_dim())
            + 3 * c.hidden_size * c.intermediate_size;
        c.num_layers * per_layer + c.vocab_size * c.hidden_size
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

    /// `y = x · Wᵀ` for matrix `h` over `n` rows of `x`.
    fn matmul(&self, h: TensorHandle, x: &[f32], y: &mut [f32], n: usize) {
        self.packed.matmul(&self.tensors, &self.pool, h, x, y, n);
    }

    /// Runs the transformer over `batch`: writes every new token's K/V into `kv` and returns
    /// logits for the rows `batch.output` selects.
    pub fn forward(&self, batch: &ForwardBatch, kv: &mut KvStore) -> Result<Logits> {
        let c = &self.config;
        batch.validate(c.vocab_size, kv.block_size(), kv.num_blocks())?;
        let n = batch.num_tokens();
        let layout = BatchLayout::new(batch, kv);
        let mut a = Activations::new(c, n);
        let embed = self.tensors.by_handle(self.w.embed);
        let row_bytes = embed.data.len() / c.vocab_size;
        for (t, row) in a.x.chunks_exact_mut(c.hidden_size).enumerate() {
            let id = batch.tokens[t].0 as usize;
            let src = &embed.data[id * row_bytes..(id + 1) * row_bytes];
            tandem_kernels::quant::dequantize_row(embed.dtype, src, row);
        }
        for (l, layer) in self.w.layers.iter().enumerate() {
            self.attention_block(l, layer, &layout, &mut a, kv);
            self.mlp_block(layer, &mut a);
        }
        // Every token's final hidden state is kept beside its K/V (see `KvStore`).
        self.norm_rows(&a.x, &self.w.final_norm, &mut a.xn);
        let h = c.hidden_size;
        for (t, &slot) in layout.write_slots.iter().enumerate() {
            kv.write_hidden(slot, &a.xn[t * h..(t + 1) * h]);
        }
        let rows = batch.output_rows();
        let selected = rows.clone();
        Ok(self.lm_head(rows, |i| &a.xn[selected[i] * h..(selected[i] + 1) * h]))
    }

    /// The logits of the tokens whose final hidden states sit in `slots` of `kv` (rows
    /// numbered `0..slots.len()`): bitwise what the forward pass that computed them returned,
    /// because the LM head's result for a row does not depend on the other rows.
    pub fn logits_at_slots(&self, kv: &KvStore, slots: &[usize]) -> Logits {
        self.lm_head((0..slots.len()).collect(), |i| kv.hidden_row(slots[i]))
    }

    fn attention_block(
        &self,
        l: usize,
        w: &LayerWeights,
        layout: &BatchLayout,
        a: &mut Activations,
        kv: &mut KvStore,
    ) {
        let c = &self.config;
        let n = layout.positions.len();
        self.norm_rows(&a.x, &w.attn_norm, &mut a.xn);
        let (h, ys) = ([w.q, w.k, w.v], [&mut a.q[..], &mut a.k[..], &mut a.v[..]]);
        self.packed
            .matmuls(&self.tensors, &self.pool, h, &a.xn, ys, n);
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
        self.apply_rope(&layout.positions, &mut a.q, c.num_heads);
        self.apply_rope(&layout.positions, &mut a.k, c.num_kv_heads);
        let kv_dim = c.kv_dim();
        for (t, &slot) in layout.write_slots.iter().enumerate() {
            let r = t * kv_dim..(t + 1) * kv_dim;
            kv.write(l, slot, &a.k[r.clone()], &a.v[r]);
        }
        let shape = HeadShape {
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
        };
        let attn_layout = AttentionLayout {
            positions: &layout.positions,
            token_seq: &layout.token_seq,
            seq_slots: &layout.seq_slots,
        };
        causal_attention(
            &self.pool,
            shape,
            &attn_layout,
            &a.q,
            kv.layer(l),
            &mut a.attn,
        );
        self.matmul(w.o, &a.attn, &mut a.out, n);
        add_inplace(&mut a.x, &a.out);
    }

    fn mlp_block(&self, w: &LayerWeights, a: &mut Activations) {
        let n = a.x.len() / self.config.hidden_size;
        self.norm_rows(&a.x, &w.ffn_norm, &mut a.xn);
        let (h, ys) = ([w.gate, w.up], [&mut a.gate[..], &mut a.up[..]]);
        self.packed
            .matmuls(&self.tensors, &self.pool, h, &a.xn, ys, n);
        let ff = self.config.intermediate_size;
        for_each_chunk_mut(&self.pool, &mut a.gate, ff, |t, gate| {
            swiglu_inplace(gate, &a.up[t * ff..(t + 1) * ff]);
        });
        self.matmul(w.down, &a.gate, &mut a.out, n);
        add_inplace(&mut a.x, &a.out);
    }

    /// RMSNorm of every `[hidden]` row of `x` into `out`.
    fn norm_rows(&self, x: &[f32], weight: &[f32], out: &mut [f32]) {
        let (h, eps) = (self.config.hidden_size, self.config.rms_norm_eps);
        for_each_chunk_mut(&self.pool, out, h, |t, row| {
            rms_norm(&x[t * h..(t + 1) * h], weight, eps, row)
        });
    }

    /// Rotates every head of `x` (`[n, heads * head_dim]`) by its token's position.
    fn apply_rope(&self, positions: &[usize], x: &mut [f32], heads: usize) {
        let d = self.config.head_dim;
        let neox = self.config.rope.style == RopeStyle::Neox;
        let half = d / 2;
        let (mut cos, mut sin) = (vec![0.0f32; half], vec![0.0f32; half]);
        for (t, row) in x.chunks_exact_mut(heads * d).enumerate() {
            let p = positions[t] as f64;
            for (i, &f) in self.w.inv_freqs.iter().enumerate() {
                let angle = p * f as f64;
                cos[i] = angle.cos() as f32;
                sin[i] = angle.sin() as f32;
            }
            for head in row.chunks_exact_mut(d) {
                rope_head(head, &cos, &sin, neox);
            }
        }
    }

    /// The output projection of final hidden states: row `i` of the result (numbered
    /// `rows[i]`) from `hidden(i)`.
    fn lm_head<'a>(&self, rows: Vec<usize>, hidden: impl Fn(usize) -> &'a [f32]) -> Logits {
        let c = &self.config;
        let mut normed = vec![0.0f32; rows.len() * c.hidden_size]; // [rows, hidden]
        for (i, dst) in normed.chunks_exact_mut(c.hidden_size).enumerate() {
            dst.copy_from_slice(hidden(i));
        }
        let mut data = vec![0.0f32; rows.len() * c.vocab_size]; // [rows, vocab]
        self.matmul(self.w.lm_head, &normed, &mut data, rows.len());
        Logits::new(rows, c.vocab_size, data)
    }
}

/// Adds `bias` (`[width]`) to every row of `x` (`[n, width]`).
fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        add_inplace(row, bias);
    }
}
