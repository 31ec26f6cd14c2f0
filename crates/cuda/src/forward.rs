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
use tandem_model::logits::Logits;
use tandem_model::ModelConfig;

use crate::batch_layout::BatchLayout;
use crate::error::CudaError;
use crate::kernels::{AttnBuffers, AttnShape, DevPtr, QkvBuffers, QkvShape};
use crate::options::CudaDtype;
use crate::runner::CudaRunner;
use crate::weights::DeviceLayer;

/// Rows of one LM head product. Always this many (padded), so that a row's logits come from
/// the same cuBLAS kernel whichever call computes them (`forward` or `cached_logits`).
pub(crate) const LM_TILE: usize = 64;

/// Activations of up to `capacity` tokens, plus the LM head's tile.
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
    /// `[cap, 2 * ff]` f32.
    gate_up: CudaSlice<f32>,
    /// `[cap, ff]` storage type: SwiGLU output.
    act: CudaSlice<u8>,
    /// `[LM_TILE, h]` storage type: LM head input.
    lm_in: CudaSlice<u8>,
    /// `[LM_TILE, vocab]` f32.
    logits: CudaSlice<f32>,
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
            gate_up: f(capacity * 2 * ff)?,
            act: b(capacity * ff)?,
            lm_in: b(LM_TILE * h)?,
            logits: f(LM_TILE * c.vocab_size)?,
        })
    }
}

/// The batch's index arrays on the device.
struct DeviceLayout {
    tokens: CudaSlice<i32>,
    positions: CudaSlice<i32>,
    token_seq: CudaSlice<i32>,
    write_slots: CudaSlice<i64>,
    block_tables: CudaSlice<i32>,
    cos: CudaSlice<f32>,
    sin: CudaSlice<f32>,
}

impl DeviceLayout {
    fn upload(stream: &Arc<CudaStream>, l: &BatchLayout) -> Result<DeviceLayout, CudaError> {
        Ok(DeviceLayout {
            tokens: stream.clone_htod(&l.tokens)?,
            positions: stream.clone_htod(&l.positions)?,
            token_seq: stream.clone_htod(&l.token_seq)?,
            write_slots: stream.clone_htod(&l.write_slots)?,
            block_tables: stream.clone_htod(&l.block_tables)?,
            cos: stream.clone_htod(&l.cos)?,
            sin: stream.clone_htod(&l.sin)?,
        })
    }
}

fn ptr<T>(s: &CudaSlice<T>, stream: &CudaStream) -> DevPtr {
    s.device_ptr(stream).0
}

impl CudaRunner {
    /// Runs every layer over the batch laid out in `l` and stores the final hidden states;
    /// returns the logits of `l.output_rows`.
    pub(crate) fn run_forward(&mut self, l: &BatchLayout) -> Result<Logits, CudaError> {
        let n = l.tokens.len();
        if n > self.ws.capacity {
            self.ws = Workspace::new(&self.device.stream, &self.config, self.dtype, n)?;
        }
        let s = self.device.stream.clone();
        let d = DeviceLayout::upload(&s, l)?;
        let c = &self.config;
        let h = c.hidden_size;
        let x = ptr(&self.ws.x, &s);
        let delta = ptr(&self.ws.delta, &s);
        let xn = ptr(&self.ws.xn, &s);
        self.kernels
            .embed_gather(ptr(&self.weights.embed, &s), ptr(&d.tokens, &s), x, n, h)?;
        for i in 0..self.weights.layers.len() {
            let w = &self.weights.layers[i];
            let prev = (i > 0).then_some(delta);
            self.kernels
                .add_rms_norm(x, prev, ptr(&w.attn_norm, &s), xn, n, h, c.rms_norm_eps)?;
            self.attention(i, &d, l.max_blocks, n)?;
            self.mlp(i, n)?;
        }
        let hidden = self.pool.hidden_ptr();
        let slots = ptr(&d.write_slots, &s);
        let norm = ptr(&self.weights.final_norm, &s);
        let eps = c.rms_norm_eps;
        self.kernels
            .final_norm_store(x, delta, norm, slots, hidden, n, h, eps)?;
        self.lm_head(l.output_rows.clone(), &l.output_slots)
    }

    /// The attention sub-layer of layer `i` (input: `xn`; output: `delta`).
    fn attention(
        &self,
        i: usize,
        d: &DeviceLayout,
        max_blocks: usize,
        n: usize,
    ) -> Result<(), CudaError> {
        let (c, s, w) = (&self.config, &self.device.stream, &self.weights.layers[i]);
        let qkv_dim = c.q_dim() + 2 * c.kv_dim();
        let qkv = ptr(&self.ws.qkv, s);
        let xn = ptr(&self.ws.xn, s);
        self.gemm
            .matmul(xn, ptr(&w.qkv, s), qkv, n, qkv_dim, c.hidden_size)?;
        let (k_cache, v_cache) = self.pool.layer_ptrs(i);
        let bufs = QkvBuffers {
            qkv,
            bias: w.qkv_bias.as_ref().map(|b| ptr(b, s)),
            qk_norm: w.qk_norm.as_ref().map(|b| ptr(b, s)),
            cos: ptr(&d.cos, s),
            sin: ptr(&d.sin, s),
            slots: ptr(&d.write_slots, s),
            q_out: ptr(&self.ws.q, s),
            k_cache,
            v_cache,
        };
        self.kernels.qkv_rope_store(&bufs, self.qkv_shape(w), n)?;
        let attn = AttnBuffers {
            q: ptr(&self.ws.q, s),
            k_cache,
            v_cache,
            block_tables: ptr(&d.block_tables, s),
            token_seq: ptr(&d.token_seq, s),
            positions: ptr(&d.positions, s),
            out: ptr(&self.ws.attn, s),
        };
        self.kernels
            .paged_attention(&attn, self.attn_shape(max_blocks), n)?;
        let delta = ptr(&self.ws.delta, s);
        self.gemm
            .matmul(attn.out, ptr(&w.o, s), delta, n, c.hidden_size, c.q_dim())
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
        let gate_up = ptr(&self.ws.gate_up, s);
        self.gemm
            .matmul(xn, ptr(&w.gate_up, s), gate_up, n, 2 * ff, h)?;
        let act = ptr(&self.ws.act, s);
        self.kernels.swiglu(gate_up, act, n, ff)?;
        self.gemm.matmul(act, ptr(&w.down, s), delta, n, h, ff)
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

    fn attn_shape(&self, max_blocks: usize) -> AttnShape {
        let c = &self.config;
        AttnShape {
            num_heads: c.num_heads as i32,
            num_kv_heads: c.num_kv_heads as i32,
            head_dim: c.head_dim as i32,
            block_size: self.pool.block_size as i32,
            max_blocks: max_blocks as i32,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
        }
    }

    /// Logits of the hidden states stored at `slots` (row `i` numbered `rows[i]`), computed
    /// [`LM_TILE`] rows at a time.
    pub(crate) fn lm_head(&self, rows: Vec<usize>, slots: &[i64]) -> Result<Logits, CudaError> {
        let (c, s) = (&self.config, &self.device.stream);
        let (h, vocab) = (c.hidden_size, c.vocab_size);
        let mut data = vec![0.0f32; slots.len() * vocab]; // [rows, vocab]
        let lm_in = ptr(&self.ws.lm_in, s);
        let logits = ptr(&self.ws.logits, s);
        let head = ptr(self.weights.lm_head(), s);
        for (tile, out) in slots.chunks(LM_TILE).zip(data.chunks_mut(LM_TILE * vocab)) {
            let dev_slots = s.clone_htod(tile)?;
            let hidden = self.pool.hidden_ptr();
            self.kernels
                .gather_hidden(hidden, ptr(&dev_slots, s), lm_in, tile.len(), h)?;
            self.gemm.matmul(lm_in, head, logits, LM_TILE, vocab, h)?;
            s.memcpy_dtoh(&self.ws.logits.slice(..tile.len() * vocab), out)?;
        }
        Ok(Logits::new(rows, vocab, data))
    }
}
