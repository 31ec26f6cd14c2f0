//! The forward pass on the device: the workspace it runs in and the order of kernels and
//! matrix products, layer by layer, mirroring `tandem_model::transformer`.
//!
//! Per layer: `xn = rms_norm(x (+= delta))` → `qkv = xn · Wqkvᵀ` → bias, q/k norms, RoPE and
//! the K/V store → paged attention → `delta = attn · Woᵀ` → `xn = rms_norm(x += delta)` →
//! `gate_up = xn · Wguᵀ` → SwiGLU → `delta = act · Wdownᵀ`. The last layer's delta is added
//! by the final norm, which writes each token's normed state into the hidden store; the LM
//! head reads the rows that need logits back from there.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use tandem_model::batch::CarriedToken;
use tandem_model::logits::Logits;
use tandem_model::ModelConfig;

use crate::attention_tiles::{tokens_per_tile, AttentionTiles};
use crate::batch_layout::BatchLayout;
use crate::decode_graphs::bucket_for;
use crate::error::CudaError;
use crate::kernels::{
    AttnBuffers, AttnShape, DevPtr, QkvBuffers, QkvShape, ATTN_PARTITION, TC_MAX_HEAD_DIM,
    TC_TILE_TOKENS,
};
use crate::options::CudaDtype;
use crate::product_kernels::{Q4_MATVEC_ROWS, Q8_MATVEC_ROWS};
use crate::row_kernels::ROW_SAMPLING_BYTES;
use crate::runner::CudaRunner;
use crate::step_inputs::{InputPtrs, StepInputs, LOGIT_ROWS};
use crate::weights::{DeviceLayer, DeviceMatrix};

/// Rows of one LM head product. Always this many (padded), so that a row's logits come from
/// the same cuBLAS kernel whichever call computes them (`forward` or `cached_logits`).
pub(crate) const LM_TILE: usize = 64;

/// (token, head, partition) results the attention's partials buffer holds; a batch that
/// needs more runs its attention in groups of rows.
pub(crate) const PARTIAL_SLOTS: usize = 1 << 18;

/// Tokens per attention launch: as many as the partials buffer holds at `parts` partitions
/// per (token, head).
fn attention_rows(num_heads: usize, parts: usize) -> usize {
    (PARTIAL_SLOTS / (num_heads * parts)).max(1)
}

/// Activations of up to `capacity` tokens, plus the LM head's rows.
#[derive(Debug)]
pub(crate) struct Workspace {
    pub capacity: usize,
    /// `[cap, h]` f32: the residual stream.
    x: CudaSlice<f32>,
    /// `[cap, h]` f32: the last sub-layer's output, not yet added to `x`.
    delta: CudaSlice<f32>,
    /// `[cap, h]` storage type: normed input of a projection.
    xn: CudaSlice<u8>,
    /// `[cap, q_dim + 2 * kv_dim]` f32.
    qkv: CudaSlice<f32>,
    /// `[cap, q_dim]` f32: rotated queries.
    q: CudaSlice<f32>,
    /// `[cap, q_dim]` storage type: attention output.
    attn: CudaSlice<u8>,
    /// `[PARTIAL_SLOTS, head_dim + 2]` f32: attention's per-partition results.
    partials: CudaSlice<f32>,
    /// `[cap, 2 * ff]` f32.
    gate_up: CudaSlice<f32>,
    /// `[cap, ff]` storage type: SwiGLU output.
    act: CudaSlice<u8>,
    /// `[LOGIT_ROWS, h]` storage type: LM head input.
    lm_in: CudaSlice<u8>,
    /// `[LOGIT_ROWS, vocab]` f32.
    pub(crate) logits: CudaSlice<f32>,
    /// `[LOGIT_ROWS]` each: the targets of rows scored on the device, and each row's
    /// maximum, softmax sum and target logit (see `device_rows.rs`).
    pub(crate) lp_targets: CudaSlice<i32>,
    pub(crate) lp_max: CudaSlice<f32>,
    pub(crate) lp_sum: CudaSlice<f64>,
    pub(crate) lp_target_logit: CudaSlice<f32>,
    /// `[LOGIT_ROWS]` parameters of rows sampled on the device (`kernels::row_sampling_bytes`).
    pub(crate) sample_params: CudaSlice<u8>,
}

impl Workspace {
    pub fn new(
        stream: &Arc<CudaStream>,
        c: &ModelConfig,
        dtype: CudaDtype,
        capacity: usize,
    ) -> Result<Workspace, CudaError> {
        let e = dtype.size();
        let (h, q_dim, ff) = (c.hidden_size, c.q_dim(), c.intermediate_size);
        let qkv_dim = q_dim + 2 * c.kv_dim();
        let f = |len: usize| stream.alloc_zeros::<f32>(len);
        let b = |len: usize| stream.alloc_zeros::<u8>(len * e);
        Ok(Workspace {
            capacity,
            x: f(capacity * h)?,
            delta: f(capacity * h)?,
            xn: b(capacity * h)?,
            qkv: f(capacity * qkv_dim)?,
            q: f(capacity * q_dim)?,
            attn: b(capacity * q_dim)?,
            partials: f(PARTIAL_SLOTS * (c.head_dim + 2))?,
            gate_up: f(capacity * 2 * ff)?,
            act: b(capacity * ff)?,
            lm_in: b(LOGIT_ROWS * h)?,
            logits: f(LOGIT_ROWS * c.vocab_size)?,
            lp_targets: stream.alloc_zeros::<i32>(LOGIT_ROWS)?,
            lp_max: f(LOGIT_ROWS)?,
            lp_sum: stream.alloc_zeros::<f64>(LOGIT_ROWS)?,
            lp_target_logit: f(LOGIT_ROWS)?,
            sample_params: stream.alloc_zeros::<u8>(LOGIT_ROWS * ROW_SAMPLING_BYTES)?,
        })
    }
}

/// A zeroed host buffer for `len` logits. A batch's logits are large (256 rows of a 128k
/// vocabulary are 131 MB) and need a fresh buffer every step, whose pages fault in as the
/// copy writes them: advised onto huge pages, that is one fault per 2 MiB, not per 4 KiB.
fn logits_buffer(len: usize) -> Vec<f32> {
    tandem_kernels::huge_pages::zeroed_vec(len)
}

pub(crate) fn ptr<T>(s: &CudaSlice<T>, stream: &CudaStream) -> DevPtr {
    s.device_ptr(stream).0
}

impl CudaRunner {
    /// Runs every layer over the batch laid out in `l` and stores the final hidden states;
    /// returns the logits of `l.output_rows`. Decode batches replay a CUDA graph when they
    /// can; everything else is launched eagerly.
    pub(crate) fn run_forward(&mut self, mut l: BatchLayout) -> Result<Logits, CudaError> {
        let n = l.tokens.len();
        self.ensure_capacity(n, l.max_blocks)?;
        l.widen_tables(self.inputs.table_stride);
        if let Some(bucket) = self.graph_bucket(&l) {
            return self.decode_with_graph(l, bucket);
        }
        self.queue_eager(&l, &[])?;
        self.lm_head(l.output_rows.clone(), &l.output_slots)
    }

    /// Uploads `l` (already fitted by [`CudaRunner::ensure_capacity`] and widened), writes
    /// the `carried` tokens from the latest step's picks and queues every layer eagerly.
    pub(crate) fn queue_eager(
        &mut self,
        l: &BatchLayout,
        carried: &[CarriedToken],
    ) -> Result<(), CudaError> {
        self.inputs.upload(l, &mut self.staging)?;
        self.queue_carried(carried, &l.output_rows)?;
        let parts = l.max_context().div_ceil(ATTN_PARTITION).max(1);
        let tiles = self.attention_tiles(l, parts)?;
        self.queue_layers(l.tokens.len(), parts, tiles.as_ref())
    }

    /// The attention's tiles of a step with several tokens of a sequence, uploaded; `None`
    /// for decode steps, whose tiles are single tokens.
    fn attention_tiles(
        &mut self,
        l: &BatchLayout,
        parts: usize,
    ) -> Result<Option<AttentionTiles>, CudaError> {
        if l.is_decode() {
            return Ok(None);
        }
        if self.tensor_core_prefill() {
            let n = l.tokens.len();
            let tiles = AttentionTiles::build(&l.token_seq, &l.positions, TC_TILE_TOKENS, n);
            self.inputs.upload_tiles(&tiles.pairs, &mut self.staging)?;
            return Ok(Some(tiles));
        }
        let c = &self.config;
        let group = c.num_heads / c.num_kv_heads;
        let limit = self.kernels.attention_shared_limit();
        let per_tile = tokens_per_tile(group, c.head_dim, self.dtype.size(), limit);
        let rows = attention_rows(c.num_heads, parts);
        let tiles = AttentionTiles::build(&l.token_seq, &l.positions, per_tile, rows);
        self.inputs.upload_tiles(&tiles.pairs, &mut self.staging)?;
        Ok(Some(tiles))
    }

    /// Grows the workspace and the input buffers when a batch of `n` tokens with block
    /// tables of `max_blocks` does not fit; recorded graphs then read stale addresses and
    /// are dropped.
    pub(crate) fn ensure_capacity(&mut self, n: usize, max_blocks: usize) -> Result<(), CudaError> {
        let s = self.device.stream.clone();
        if n > self.ws.capacity {
            self.ws = Workspace::new(&s, &self.config, self.dtype, n)?;
            self.graphs.clear();
        }
        if !self.inputs.fits(n, max_blocks) {
            let rows = n.max(self.inputs.rows);
            let stride = max_blocks.next_power_of_two().max(self.inputs.table_stride);
            let half = self.inputs.half_dim();
            self.inputs = StepInputs::new(&s, rows, half, stride)?;
            self.graphs.clear();
        }
        Ok(())
    }

    /// Context partitions a graph's attention names: enough for the longest block table the
    /// inputs hold.
    fn graph_parts(&self) -> usize {
        (self.inputs.table_stride * self.pool.block_size).div_ceil(ATTN_PARTITION)
    }

    /// The graph bucket of a decode layout, when graphs are on and the padded batch fits
    /// every fixed buffer.
    pub(crate) fn graph_bucket(&self, l: &BatchLayout) -> Option<usize> {
        if !self.graphs.enabled || !l.is_decode() {
            return None;
        }
        let bucket = bucket_for(l.tokens.len())?;
        let fits = bucket <= self.ws.capacity
            && bucket <= self.inputs.rows
            && bucket <= LOGIT_ROWS
            && bucket * self.config.num_heads * self.graph_parts() <= PARTIAL_SLOTS;
        fits.then_some(bucket)
    }

    /// A decode step through the graph of `bucket`, recorded first if needed.
    fn decode_with_graph(&mut self, l: BatchLayout, bucket: usize) -> Result<Logits, CudaError> {
        let n = l.tokens.len();
        self.replay_decode(l, bucket, &[])?;
        let vocab = self.config.vocab_size;
        let mut data = logits_buffer(n * vocab);
        let s = &self.device.stream;
        s.memcpy_dtoh(&self.ws.logits.slice(..n * vocab), &mut data)?;
        Ok(Logits::new((0..n).collect(), vocab, data))
    }

    /// Queues the graph of `bucket` (recorded first if needed) over the decode layout `l`
    /// with its `carried` tokens from the latest step's picks: the logits of its tokens end
    /// in the first rows of the logits buffer. When the recording fails, the step's work is
    /// queued eagerly and graphs are turned off for good (a warning and `describe` say why).
    pub(crate) fn replay_decode(
        &mut self,
        mut l: BatchLayout,
        bucket: usize,
        carried: &[CarriedToken],
    ) -> Result<(), CudaError> {
        l.pad_decode(bucket, self.pool.scratch_block(), self.pool.block_size);
        self.inputs.upload(&l, &mut self.staging)?;
        self.inputs
            .upload_output_slots(&l.output_slots, &mut self.staging)?;
        self.queue_carried(carried, &l.output_rows)?;
        if !self.graphs.has(bucket) {
            let parts = self.graph_parts();
            let stream = self.device.stream.clone();
            let mut graphs = std::mem::take(&mut self.graphs);
            let recorded = graphs.record(&stream, bucket, || {
                self.queue_layers(bucket, parts, None)?;
                self.queue_lm_head(bucket)
            });
            self.graphs = graphs;
            if let Err(e) = recorded {
                // Nothing of the failed recording ran: the same work, queued eagerly over
                // the inputs already uploaded, is this step; later steps stay eager.
                self.graphs.give_up(bucket, &e);
                self.queue_layers(bucket, parts, None)?;
                return self.queue_lm_head(bucket);
            }
        }
        self.graphs.launch(bucket)
    }

    /// Queues every layer over the `n` tokens in the input buffers, ending with the final
    /// norm that stores each token's hidden state. `parts`: context partitions the attention
    /// launches name (at least the longest context's); `tiles`: the attention's tiles, as
    /// uploaded, or `None` for one token per tile. Queues only: no host synchronisation
    /// and no allocation, so that it can be recorded into a graph.
    fn queue_layers(
        &self,
        n: usize,
        parts: usize,
        tiles: Option<&AttentionTiles>,
    ) -> Result<(), CudaError> {
        let s = self.device.stream.clone();
        let inputs = self.inputs.ptrs();
        let c = &self.config;
        let h = c.hidden_size;
        let x = ptr(&self.ws.x, &s);
        let delta = ptr(&self.ws.delta, &s);
        let xn = ptr(&self.ws.xn, &s);
        self.kernels
            .embed_gather(ptr(&self.weights.embed, &s), inputs.tokens, x, n, h)?;
        self.mark("embed")?;
        for i in 0..self.weights.layers.len() {
            let w = &self.weights.layers[i];
            let prev = (i > 0).then_some(delta);
            self.kernels
                .add_rms_norm(x, prev, ptr(&w.attn_norm, &s), xn, n, h, c.rms_norm_eps)?;
            self.mark("add_rms_norm")?;
            self.attention(i, &inputs, n, parts, tiles)?;
            self.mlp(i, n)?;
        }
        let hidden = self.pool.hidden_ptr();
        let norm = ptr(&self.weights.final_norm, &s);
        let eps = c.rms_norm_eps;
        self.kernels
            .final_norm_store(x, delta, norm, inputs.write_slots, hidden, n, h, eps)?;
        self.mark("final_norm")
    }

    /// Marks the end of operation `name` for a profiled step (see [`crate::StepProfile`]).
    fn mark(&self, name: &'static str) -> Result<(), CudaError> {
        self.profile
            .mark(name, &self.device.ctx, &self.device.stream)
    }

    /// The attention sub-layer of layer `i` (input: `xn`; output: `delta`).
    fn attention(
        &self,
        i: usize,
        d: &InputPtrs,
        n: usize,
        parts: usize,
        tiles: Option<&AttentionTiles>,
    ) -> Result<(), CudaError> {
        let (c, s, w) = (&self.config, &self.device.stream, &self.weights.layers[i]);
        let qkv_dim = c.q_dim() + 2 * c.kv_dim();
        let qkv = ptr(&self.ws.qkv, s);
        let xn = ptr(&self.ws.xn, s);
        self.product(xn, &w.qkv, qkv, n, qkv_dim, c.hidden_size)?;
        self.mark("qkv_proj")?;
        let (k_cache, v_cache) = self.pool.layer_ptrs(i);
        let bufs = QkvBuffers {
            qkv,
            bias: w.qkv_bias.as_ref().map(|b| ptr(b, s)),
            qk_norm: w.qk_norm.as_ref().map(|b| ptr(b, s)),
            cos: d.cos,
            sin: d.sin,
            slots: d.write_slots,
            q_out: ptr(&self.ws.q, s),
            k_cache,
            v_cache,
        };
        self.kernels.qkv_rope_store(&bufs, self.qkv_shape(w), n)?;
        self.mark("qkv_rope_store")?;
        if c.num_heads * parts > PARTIAL_SLOTS {
            return Err(CudaError::Unsupported(format!(
                "a context of {} partitions exceeds the attention's partial buffer",
                parts
            )));
        }
        let tile_tokens = tiles.map_or(1, |t| t.tile_tokens);
        let shape = self.attn_shape(parts, tile_tokens);
        if let (Some(t), true) = (tiles, self.tensor_core_prefill()) {
            let attn = AttnBuffers {
                q: ptr(&self.ws.q, s),
                k_cache,
                v_cache,
                block_tables: d.block_tables,
                token_seq: d.token_seq,
                positions: d.positions,
                tiles: Some(d.tiles),
                out: ptr(&self.ws.attn, s),
                partials: 0,
            };
            self.kernels.attention_tc(&attn, shape, t.pairs.len() / 2)?;
            return self.attention_output(i, n);
        }
        let row_groups = attention_rows(c.num_heads, parts);
        let q_row = (c.q_dim() * 4) as u64;
        let out_row = (c.q_dim() * self.dtype.size()) as u64;
        for (g, first) in (0..n).step_by(row_groups).enumerate() {
            let rows = row_groups.min(n - first);
            let f = first as u64;
            let (tile_ptr, num_tiles) = match tiles {
                Some(t) => {
                    let range = t.groups[g].clone();
                    (Some(d.tiles + range.start as u64 * 8), range.len())
                }
                None => (None, rows),
            };
            let attn = AttnBuffers {
                q: ptr(&self.ws.q, s) + f * q_row,
                k_cache,
                v_cache,
                block_tables: d.block_tables,
                token_seq: d.token_seq + f * 4,
                positions: d.positions + f * 4,
                tiles: tile_ptr,
                out: ptr(&self.ws.attn, s) + f * out_row,
                partials: ptr(&self.ws.partials, s),
            };
            self.kernels
                .paged_attention(&attn, shape, rows, num_tiles)?;
        }
        self.attention_output(i, n)
    }

    /// The end of layer `i`'s attention sub-layer: the o projection of the attention's
    /// output into `delta`.
    fn attention_output(&self, i: usize, n: usize) -> Result<(), CudaError> {
        self.mark("attention")?;
        let (c, s, w) = (&self.config, &self.device.stream, &self.weights.layers[i]);
        let delta = ptr(&self.ws.delta, s);
        let attn = ptr(&self.ws.attn, s);
        self.product(attn, &w.o, delta, n, c.hidden_size, c.q_dim())?;
        self.mark("o_proj")
    }

    /// Whether steps with several tokens of a sequence run their attention on tensor cores
    /// (attention_tc.cu): asked for, bf16, head dimension a multiple of 16 up to 128, and
    /// not batch-invariant (the tiled kernel keeps prefill and decode identical).
    pub(crate) fn tensor_core_prefill(&self) -> bool {
        let d = self.config.head_dim;
        self.tensor_core_attention
            && self.dtype == CudaDtype::Bf16
            && !self.batch_invariant
            && d.is_multiple_of(16)
            && d <= TC_MAX_HEAD_DIM
    }

    /// The MLP sub-layer of layer `i`: adds the attention output to `x`, norms, and leaves
    /// its own output in `delta`.
    fn mlp(&self, i: usize, n: usize) -> Result<(), CudaError> {
        let (c, s, w) = (&self.config, &self.device.stream, &self.weights.layers[i]);
        let (h, ff) = (c.hidden_size, c.intermediate_size);
        let (x, delta, xn) = (
            ptr(&self.ws.x, s),
            ptr(&self.ws.delta, s),
            ptr(&self.ws.xn, s),
        );
        let eps = c.rms_norm_eps;
        self.kernels
            .add_rms_norm(x, Some(delta), ptr(&w.ffn_norm, s), xn, n, h, eps)?;
        self.mark("add_rms_norm")?;
        let gate_up = ptr(&self.ws.gate_up, s);
        self.product(xn, &w.gate_up, gate_up, n, 2 * ff, h)?;
        self.mark("gate_up_proj")?;
        let act = ptr(&self.ws.act, s);
        self.kernels.swiglu(gate_up, act, n, ff)?;
        self.mark("swiglu")?;
        self.product(act, &w.down, delta, n, h, ff)?;
        self.mark("down_proj")
    }

    fn qkv_shape(&self, w: &DeviceLayer) -> QkvShape {
        let c = &self.config;
        QkvShape {
            num_heads: c.num_heads as i32,
            num_kv_heads: c.num_kv_heads as i32,
            head_dim: c.head_dim as i32,
            neox: (c.rope.style == tandem_model::config::RopeStyle::Neox) as i32,
            has_bias: w.qkv_bias.is_some() as i32,
            has_qk_norm: w.qk_norm.is_some() as i32,
            eps: c.rms_norm_eps,
        }
    }

    fn attn_shape(&self, parts: usize, tile_tokens: usize) -> AttnShape {
        let c = &self.config;
        AttnShape {
            num_heads: c.num_heads as i32,
            num_kv_heads: c.num_kv_heads as i32,
            head_dim: c.head_dim as i32,
            block_size: self.pool.block_size as i32,
            max_blocks: self.inputs.table_stride as i32,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
            num_parts: parts as i32,
            tile_tokens: tile_tokens as i32,
        }
    }

    /// Logits of the hidden states stored at `slots` (row `i` numbered `rows[i]`), computed
    /// [`LOGIT_ROWS`] rows at a time and copied to the host.
    pub(crate) fn lm_head(&mut self, rows: Vec<usize>, slots: &[i64]) -> Result<Logits, CudaError> {
        let vocab = self.config.vocab_size;
        let mut data = logits_buffer(slots.len() * vocab); // [rows, vocab]
        let s = self.device.stream.clone();
        for (group, out) in slots
            .chunks(LOGIT_ROWS)
            .zip(data.chunks_mut(LOGIT_ROWS * vocab))
        {
            self.inputs.upload_output_slots(group, &mut self.staging)?;
            self.queue_lm_head(group.len())?;
            s.memcpy_dtoh(&self.ws.logits.slice(..group.len() * vocab), out)?;
        }
        Ok(Logits::new(rows, vocab, data))
    }

    /// `y[n, m] = x[n, k] · w[m, k]ᵀ` for a layer's matrix `w`. A quantized matrix (Q8_0,
    /// Q4_1) multiplies from its codes when `n` is small (decode), unless the runner is
    /// batch-invariant; otherwise it is expanded into the scratch matrix first (the
    /// product's time then includes writing and reading 2 bytes a weight once more).
    fn product(
        &self,
        x: DevPtr,
        w: &DeviceMatrix,
        y: DevPtr,
        n: usize,
        m: usize,
        k: usize,
    ) -> Result<(), CudaError> {
        let s = &self.device.stream;
        let from_codes = !self.batch_invariant;
        let scratch = || match &self.quant_scratch {
            Some(scratch) => Ok(ptr(scratch, s)),
            None => Err(CudaError::Unsupported(
                "a quantized matrix without its scratch".into(),
            )),
        };
        match w {
            DeviceMatrix::Dense(d) => self.dense_product(x, ptr(d, s), y, n, m, k),
            DeviceMatrix::Q8 { codes, scales } => {
                let (codes, scales) = (ptr(codes, s), ptr(scales, s));
                if from_codes && n <= Q8_MATVEC_ROWS {
                    return self.kernels.q8_matvec(codes, scales, x, y, n, m, k);
                }
                let scratch = scratch()?;
                self.kernels.q8_dequant(codes, scales, scratch, m, k)?;
                self.dense_product(x, scratch, y, n, m, k)
            }
            DeviceMatrix::Q4 { codes, scales } => {
                let (codes, scales) = (ptr(codes, s), ptr(scales, s));
                if from_codes && n <= Q4_MATVEC_ROWS {
                    return self.kernels.q4_matvec(codes, scales, x, y, n, m, k);
                }
                let scratch = scratch()?;
                self.kernels.q4_dequant(codes, scales, scratch, m, k)?;
                self.dense_product(x, scratch, y, n, m, k)
            }
        }
    }

    /// `y[n, m] = x[n, k] · w[m, k]ᵀ`: cuBLAS, or the fixed-order kernel when the runner is
    /// batch-invariant.
    fn dense_product(
        &self,
        x: DevPtr,
        w: DevPtr,
        y: DevPtr,
        n: usize,
        m: usize,
        k: usize,
    ) -> Result<(), CudaError> {
        if self.batch_invariant {
            self.kernels.matmul_fixed(x, w, y, n, m, k)
        } else {
            self.gemm.matmul(x, w, y, n, m, k)
        }
    }

    /// Queues the LM head over the first `rows` (at most [`LOGIT_ROWS`]) output slots of
    /// the inputs, [`LM_TILE`] rows per product, into the logits buffer.
    pub(crate) fn queue_lm_head(&self, rows: usize) -> Result<(), CudaError> {
        let (c, s) = (&self.config, &self.device.stream);
        let (h, vocab) = (c.hidden_size, c.vocab_size);
        let e = self.dtype.size() as u64;
        let head = ptr(self.weights.lm_head(), s);
        let slots = self.inputs.ptrs().output_slots;
        for first in (0..rows).step_by(LM_TILE) {
            let tile = LM_TILE.min(rows - first);
            let f = first as u64;
            let lm_in = ptr(&self.ws.lm_in, s) + f * (h as u64) * e;
            let logits = ptr(&self.ws.logits, s) + f * (vocab as u64) * 4;
            let hidden = self.pool.hidden_ptr();
            self.kernels
                .gather_hidden(hidden, slots + f * 8, lm_in, tile, h)?;
            self.dense_product(lm_in, head, logits, LM_TILE, vocab, h)?;
        }
        self.mark("lm_head")
    }
}
