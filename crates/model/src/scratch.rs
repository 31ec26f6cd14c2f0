//! The forward pass's working memory, kept by the model between calls.
//!
//! Activations, the batch's layout, its RoPE angles and its quantized activations are resized
//! in place for each batch, so a stream of decode steps allocates nothing here once the
//! buffers have grown to the largest batch seen (they keep that size, as an inference engine
//! keeps its compute buffers for the largest step it runs). What a buffer held before is never
//! read: every producer writes the whole of its output.

use tandem_kernels::packed::QuantizedRows;

use crate::attention::DecodeWork;
use crate::batch::ForwardBatch;
use crate::config::ModelConfig;
use crate::kv_store::KvStore;
use crate::logits::SpareLogits;
use crate::lora::{AdapterRows, LoraScratch};
use crate::transformer::{MoeScratch, SPARE_LOGITS_BYTES};

/// Everything one forward call works in.
#[derive(Debug)]
pub(crate) struct Scratch {
    pub act: Activations,
    pub layout: BatchLayout,
    pub rope: RopeTable,
    /// The angles of the sliding-window layers' own RoPE (Gemma 3; empty otherwise).
    pub local_rope: RopeTable,
    /// Activations quantized for the int8 kernels.
    pub xq: QuantizedRows,
    /// The final hidden states of the rows that get logits, gathered.
    pub gathered: Vec<f32>,
    /// The routing and per-expert rows of a mixture-of-experts MLP (empty otherwise).
    pub moe: MoeScratch,
    /// The logits buffer handed back after its step ([`crate::transformer::Model::recycle_logits`]),
    /// which the next step's LM head writes into.
    pub logits: SpareLogits,
}

impl Default for Scratch {
    fn default() -> Scratch {
        Scratch {
            act: Activations::default(),
            layout: BatchLayout::default(),
            rope: RopeTable::default(),
            local_rope: RopeTable::default(),
            xq: QuantizedRows::empty(),
            gathered: Vec::new(),
            moe: MoeScratch::default(),
            logits: SpareLogits::new(SPARE_LOGITS_BYTES),
        }
    }
}

/// Activations of one forward call.
#[derive(Debug, Default)]
pub(crate) struct Activations {
    /// `[n, hidden]` the residual stream.
    pub x: Vec<f32>,
    /// `[n, hidden]` normalised input of a sub-layer (written only where a matrix runs
    /// exactly; the int8 path norms and quantizes in one pass) and the final norm.
    pub xn: Vec<f32>,
    /// `[n, q_dim]`, `[n, kv_dim]`, `[n, kv_dim]`.
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    /// `[n, q_dim]` attention output.
    pub attn: Vec<f32>,
    /// `[n, intermediate]` gate and up projections.
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    /// `[n, hidden]` sub-layer output before the residual add.
    pub out: Vec<f32>,
    /// The working memory of decode attention's task splits.
    pub decode: DecodeWork,
    /// The LoRA corrections' working memory (sized only when a row of the batch runs with
    /// an adapter).
    pub lora: LoraWork,
}

/// What the LoRA corrections work in.
#[derive(Debug, Default)]
pub(crate) struct LoraWork {
    /// `[n, hidden]` a sub-layer's normalised input.
    pub input: Vec<f32>,
    pub scratch: LoraScratch,
}

impl Activations {
    /// Sizes every buffer for `n` tokens.
    pub fn resize(&mut self, c: &ModelConfig, n: usize) {
        // A mixture of experts keeps its per-expert rows in its own scratch.
        let ff = if c.features.moe.is_some() {
            0
        } else {
            c.intermediate_size
        };
        let sizes = [
            (&mut self.x, c.hidden_size),
            (&mut self.xn, c.hidden_size),
            (&mut self.q, c.q_dim()),
            (&mut self.k, c.kv_dim()),
            (&mut self.v, c.kv_dim()),
            (&mut self.attn, c.q_dim()),
            (&mut self.gate, ff),
            (&mut self.up, ff),
            (&mut self.out, c.hidden_size),
        ];
        for (buf, width) in sizes {
            buf.resize(n * width, 0.0);
        }
    }
}

/// Positions by which a sequence's slot list grows.
const SLOT_STEP: usize = 1024;

/// Where the batch's tokens go: computed once per forward, shared by every layer.
#[derive(Debug, Default)]
pub(crate) struct BatchLayout {
    pub positions: Vec<usize>,
    pub token_seq: Vec<usize>,
    /// Per sequence, the slot of each context position.
    pub seq_slots: Vec<Vec<usize>>,
    /// `[n]` the slot each new token's K/V is written to.
    pub write_slots: Vec<usize>,
    /// The rows that run with a LoRA adapter (usually none).
    pub adapter_rows: AdapterRows,
}

impl BatchLayout {
    /// Fills the layout for `batch`, whose blocks live in `kv`.
    pub fn fill(&mut self, batch: &ForwardBatch, kv: &KvStore) {
        self.positions.clear();
        self.token_seq.clear();
        self.write_slots.clear();
        self.adapter_rows = batch.adapter_rows();
        // Slot lists are kept for as many sequences as a batch has had (the ones past this
        // batch's are not read) and grown a step of positions at a time, so that neither a
        // smaller batch nor a context growing by one token per step allocates.
        if self.seq_slots.len() < batch.seqs.len() {
            self.seq_slots.resize_with(batch.seqs.len(), Vec::new);
        }
        for (i, (s, slots)) in batch.seqs.iter().zip(&mut self.seq_slots).enumerate() {
            self.positions.extend(s.num_cached..s.num_cached + s.len);
            self.token_seq.extend(std::iter::repeat_n(i, s.len));
            let context = s.context_len();
            if slots.capacity() < context {
                slots.reserve(context.next_multiple_of(SLOT_STEP) - slots.len());
            }
            slots.clear();
            slots.extend((0..s.context_len()).map(|p| kv.slot(&s.block_table, p)));
            self.write_slots
                .extend((s.num_cached..s.num_cached + s.len).map(|p| slots[p]));
        }
    }
}

/// `cos` and `sin` of every rotated pair's angle at each new token's position, computed once
/// per forward call for all layers and both q and k.
#[derive(Debug, Default)]
pub(crate) struct RopeTable {
    half: usize,
    /// `[n, half]` each.
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl RopeTable {
    /// Angles `position · inv_freqs[i]`, in f64, rounded once to f32.
    pub fn fill(&mut self, positions: &[usize], inv_freqs: &[f32]) {
        self.half = inv_freqs.len();
        self.cos.clear();
        self.sin.clear();
        for &p in positions {
            for &f in inv_freqs {
                let angle = p as f64 * f as f64;
                self.cos.push(angle.cos() as f32);
                self.sin.push(angle.sin() as f32);
            }
        }
    }

    /// Token `t`'s `(cos, sin)`, `[half]` each.
    pub fn row(&self, t: usize) -> (&[f32], &[f32]) {
        let r = t * self.half..(t + 1) * self.half;
        (&self.cos[r.clone()], &self.sin[r])
    }
}
