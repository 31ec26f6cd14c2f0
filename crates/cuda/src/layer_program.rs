//! The forward pass as a program of launches over device addresses: the order of kernels
//! and matrix products, layer by layer, mirroring `tandem_model::transformer`.
//!
//! Per layer: `xn = rms_norm(x (+= delta))` → `qkv = xn · Wqkvᵀ` → bias, q/k norms, RoPE and
//! the K/V store → paged attention → `delta = attn · Woᵀ` → `xn = rms_norm(x += delta)` →
//! `gate_up = xn · Wguᵀ` → SwiGLU or GeGLU → `delta = act · Wdownᵀ`. The last layer's delta
//! is added by the final norm, which writes each token's normed state into the hidden store;
//! the LM head reads the rows that need logits back from there (and soft-caps them when the
//! model does). Gemma 3's parts fit in between: the embedding's scale, a norm of each
//! sub-layer's output before it is added (`rms_norm_rows` on `delta`), the model's query-key
//! scale, and on its sliding-window layers a window in the attention and RoPE angles of
//! their own frequencies. A mixture of experts replaces the MLP's products: the router's
//! scores, each token's routes, the routes grouped by expert, the experts' products over
//! them, and each token's weighted sum (kernels/moe.cu).
//!
//! The program owns nothing and only queues work: the runner hands it the addresses of its
//! weights, workspace, KV pool and step inputs, and the crate's tests hand it host buffers
//! that the kernel emulator runs, so the whole program is checked against the CPU model on
//! machines without a GPU.

use tandem_model::ModelConfig;

use crate::attention_kernels::AttnBuffers;
use crate::attention_tiles::{tokens_per_tile, AttentionTiles};
use crate::batch_layout::BatchLayout;
use crate::device::Device;
use crate::error::CudaError;
use crate::gemm::Gemm;
use crate::kernels::{
    tc_tile_tokens, window_parts, AttnShape, DevPtr, Kernels, QkvBuffers, QkvShape,
    TC_MAX_HEAD_DIM, TC_ROWS,
};
use crate::moe_kernels::{Routes, GEMM_K, GEMM_ROUTES_PER_EXPERT};
use crate::options::CudaDtype;
use crate::product_kernels::{Q4_MATVEC_ROWS, Q8_MATVEC_ROWS};
use crate::program_buffers::{KvPtrs, LayerPtrs, MatrixPtrs, MlpPtrs, WeightPtrs, WorkspacePtrs};
use crate::step_inputs::InputPtrs;
use crate::step_profile::EventLog;

/// Rows of one LM head product. Always this many (padded), so that a row's logits come from
/// the same cuBLAS kernel whichever call computes them (`forward` or `cached_logits`).
pub(crate) const LM_TILE: usize = 64;

/// (token, head, partition) results the attention's partials buffer holds; a batch that
/// needs more runs its attention in groups of rows.
pub(crate) const PARTIAL_SLOTS: usize = 1 << 18;

/// Tokens per attention launch: as many as the partials buffer holds at `parts` partitions
/// per (token, head).
pub(crate) fn attention_rows(num_heads: usize, parts: usize) -> usize {
    (PARTIAL_SLOTS / (num_heads * parts)).max(1)
}

/// How dense products `y = x · wᵀ` are computed.
#[derive(Debug, Clone, Copy)]
pub(crate) enum DenseProducts<'a> {
    Cublas(&'a Gemm),
    /// The fixed-order kernel (`matmul_fixed`): a row's result never depends on the batch.
    Fixed,
}

/// One step's program: everything it reads and writes, by address, and how it computes.
#[derive(Debug)]
pub(crate) struct LayerProgram<'a> {
    pub config: &'a ModelConfig,
    pub dtype: CudaDtype,
    pub kernels: &'a Kernels,
    pub dense: DenseProducts<'a>,
    /// Whether quantized matrices multiply from their codes when a product has few rows
    /// (otherwise they expand into `quant_scratch` first).
    pub from_codes: bool,
    /// The storage-type matrix a quantized matrix expands into (`None`: dense weights).
    pub quant_scratch: Option<DevPtr>,
    /// Whether every step runs its attention on tensor cores (see
    /// [`tensor_core_attention`]).
    pub tensor_core_attention: bool,
    /// The fewest blocks (tiles × kv heads) with which a tensor-core launch has its blocks fold
    /// their partitions themselves instead of a block per partition; the runner's is
    /// [`TC_FOLD_MIN_BLOCKS`]. Both give the same bits.
    pub tc_fold_min_blocks: usize,
    pub weights: &'a WeightPtrs,
    pub kv: &'a KvPtrs,
    pub ws: WorkspacePtrs,
    pub inputs: InputPtrs,
    /// Row length of the uploaded block tables.
    pub table_stride: usize,
    /// Events of a profiled step.
    pub profile: Option<(&'a EventLog, &'a Device)>,
}

/// Blocks (tiles × kv heads) from which a tensor-core launch folds each token's partitions
/// within its block: enough to fill a large GPU (132 multiprocessors on an H100 or H200)
/// several times, so that the blocks' longer walks over the context run side by side.
pub(crate) const TC_FOLD_MIN_BLOCKS: usize = 1024;

/// Whether the tensor-core attention (attention_tc.cu) serves this model's steps: asked for,
/// bf16, head dimension a multiple of 16 up to `TC_MAX_HEAD_DIM`, at most `TC_ROWS` query
/// heads per kv head. It then serves every step, prefill, mixed and decode alike, each
/// token a row per query head of a tile of its sequence (a block per kv head): a
/// token's result depends only on its own context (the chunks of the cache it reads start
/// at multiples of the chunk size whatever its tile), so decode steps stay bitwise equal
/// to scoring and a sequence to itself alone, as with the CUDA-core kernel, and the mode
/// combines with `--batch-invariant`.
pub(crate) fn tensor_core_attention(asked: bool, c: &ModelConfig, dtype: CudaDtype) -> bool {
    let d = c.head_dim;
    let group = c.num_heads / c.num_kv_heads;
    asked
        && dtype == CudaDtype::Bf16
        && d.is_multiple_of(16)
        && d <= TC_MAX_HEAD_DIM
        && group <= TC_ROWS
}

/// Whether the tensor-core blocks over `tiles` fold each token's partitions themselves
/// rather than a block per partition (the same bits; see attention_tc.cu): tiles of a
/// prompt's tokens, and at least `min_blocks` blocks (tiles × kv heads), enough to fill
/// the device.
pub(crate) fn tc_folds(tiles: &AttentionTiles, c: &ModelConfig, min_blocks: usize) -> bool {
    tiles.tile_tokens > 1 && tiles.pairs.len() / 2 * c.num_kv_heads >= min_blocks
}

impl LayerProgram<'_> {
    /// The attention's tiles of a step (to upload before the layers run): on tensor cores
    /// every step's, decode steps' too (a token a tile); on CUDA cores those of a step with
    /// several tokens of a sequence, and `None` for decode steps, whose tiles are single
    /// tokens the kernel numbers itself.
    pub fn attention_tiles(&self, l: &BatchLayout, parts: usize) -> Option<AttentionTiles> {
        let c = self.config;
        let rows = attention_rows(c.num_heads, parts);
        if self.tensor_core_attention {
            let tile = tc_tile_tokens(c.num_heads / c.num_kv_heads);
            let whole = AttentionTiles::build_folded(&l.token_seq, &l.positions, tile);
            let folds = self.kernels.tensor_core_folds(c.head_dim);
            if folds && tc_folds(&whole, c, self.tc_fold_min_blocks) {
                return Some(whole);
            }
            if l.tokens.len() <= rows {
                // One launch group either way (every decode step): the same table.
                return Some(AttentionTiles {
                    folded: false,
                    ..whole
                });
            }
            return Some(AttentionTiles::build(
                &l.token_seq,
                &l.positions,
                tile,
                rows,
            ));
        }
        if l.is_decode() {
            return None;
        }
        let group = c.num_heads / c.num_kv_heads;
        let limit = self.kernels.attention_shared_limit();
        let per_tile = tokens_per_tile(group, c.head_dim, self.dtype.size(), limit);
        Some(AttentionTiles::build(
            &l.token_seq,
            &l.positions,
            per_tile,
            rows,
        ))
    }

    /// Queues every layer over the `n` tokens in the input buffers, ending with the final
    /// norm that stores each token's hidden state. `parts`: context partitions the attention
    /// launches name (at least the longest context's); `tiles`: the attention's tiles, as
    /// uploaded, or `None` for one token per tile. Queues only: no host synchronisation
    /// and no allocation, so that it can be recorded into a graph.
    pub fn queue_layers(
        &self,
        n: usize,
        parts: usize,
        tiles: Option<&AttentionTiles>,
    ) -> Result<(), CudaError> {
        let (c, ws, w) = (self.config, &self.ws, self.weights);
        let h = c.hidden_size;
        let scale = c.features.embedding_scale.unwrap_or(1.0);
        self.kernels
            .embed_gather(w.embed, self.inputs.tokens, ws.x, (n, h), scale)?;
        self.mark("embed")?;
        for (i, layer) in w.layers.iter().enumerate() {
            let prev = (i > 0).then_some(ws.delta);
            self.kernels
                .add_rms_norm(ws.x, prev, layer.attn_norm, ws.xn, n, h, c.rms_norm_eps)?;
            self.mark("add_rms_norm")?;
            self.attention(i, n, parts, tiles)?;
            self.mlp(layer, n)?;
        }
        let (slots, eps) = (self.inputs.write_slots, c.rms_norm_eps);
        self.kernels.final_norm_store(
            ws.x,
            ws.delta,
            w.final_norm,
            slots,
            self.kv.hidden,
            n,
            h,
            eps,
        )?;
        self.mark("final_norm")
    }

    /// Marks the end of operation `name` for a profiled step (see [`crate::StepProfile`]).
    fn mark(&self, name: &'static str) -> Result<(), CudaError> {
        match self.profile {
            Some((log, device)) => log.mark(name, &device.ctx, &device.stream),
            None => Ok(()),
        }
    }

    /// The attention sub-layer of layer `i` (input: `xn`; output: `delta`).
    fn attention(
        &self,
        i: usize,
        n: usize,
        parts: usize,
        tiles: Option<&AttentionTiles>,
    ) -> Result<(), CudaError> {
        let (c, ws, d) = (self.config, &self.ws, &self.inputs);
        let w = &self.weights.layers[i];
        let qkv_dim = c.q_dim() + 2 * c.kv_dim();
        self.product(ws.xn, &w.qkv, ws.qkv, n, qkv_dim, c.hidden_size)?;
        self.mark("qkv_proj")?;
        let (k_cache, v_cache) = (self.kv.keys[i], self.kv.values[i]);
        let window = c.features.window(i);
        let local = window.is_some() && c.features.local_rope.is_some();
        let bufs = QkvBuffers {
            qkv: ws.qkv,
            bias: w.qkv_bias,
            qk_norm: w.qk_norm,
            cos: if local { d.cos_local } else { d.cos },
            sin: if local { d.sin_local } else { d.sin },
            slots: d.write_slots,
            q_out: ws.q,
            k_cache,
            v_cache,
        };
        self.kernels.qkv_rope_store(&bufs, self.qkv_shape(w), n)?;
        self.mark("qkv_rope_store")?;
        if c.num_heads * parts > PARTIAL_SLOTS {
            return Err(CudaError::Unsupported(format!(
                "a context of {parts} partitions exceeds the attention's partial buffer"
            )));
        }
        let tile_tokens = tiles.map_or(1, |t| t.tile_tokens);
        let launch_parts = window_parts(parts, window, tile_tokens);
        let shape = self.attn_shape(launch_parts, tile_tokens, window);
        // On tensor cores, a step with a prompt's tiles, enough of them to fill the device,
        // folds each token's partitions within its block, writing no partial results, in
        // one launch ([`tc_folds`]); otherwise a token's partitions spread over blocks, in
        // launches of as many rows as the partial results' buffer holds. Both give the same
        // bits (see attention_tc.cu).
        let folded = tiles.is_some_and(|t| t.folded);
        let row_groups = match folded {
            true => n,
            false => attention_rows(c.num_heads, parts),
        };
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
                q: ws.q + f * q_row,
                k_cache,
                v_cache,
                block_tables: d.block_tables,
                token_seq: d.token_seq + f * 4,
                positions: d.positions + f * 4,
                tiles: tile_ptr,
                out: ws.attn + f * out_row,
                partials: if folded { 0 } else { ws.partials },
            };
            if self.tensor_core_attention {
                self.kernels.attention_tc(&attn, shape, rows, num_tiles)?;
            } else {
                self.kernels
                    .paged_attention(&attn, shape, rows, num_tiles)?;
            }
        }
        self.attention_output(w, n)
    }

    /// The end of a layer's attention sub-layer: the o projection of the attention's output
    /// into `delta`, normed when the model norms it.
    fn attention_output(&self, w: &LayerPtrs, n: usize) -> Result<(), CudaError> {
        self.mark("attention")?;
        let c = self.config;
        self.product(
            self.ws.attn,
            &w.o,
            self.ws.delta,
            n,
            c.hidden_size,
            c.q_dim(),
        )?;
        self.mark("o_proj")?;
        self.post_norm(w.post_norms.map(|[attn, _]| attn), n)
    }

    /// `delta = rms_norm(delta) * weight` (Gemma 3's norm of a sub-layer's output), if
    /// `weight` is given.
    fn post_norm(&self, weight: Option<DevPtr>, n: usize) -> Result<(), CudaError> {
        let Some(weight) = weight else {
            return Ok(());
        };
        let (h, eps) = (self.config.hidden_size, self.config.rms_norm_eps);
        self.kernels
            .rms_norm_rows(self.ws.delta, weight, (n, h), eps)?;
        self.mark("post_norm")
    }

    /// The MLP sub-layer: adds the attention output to `x`, norms, and leaves its own output
    /// in `delta`.
    fn mlp(&self, w: &LayerPtrs, n: usize) -> Result<(), CudaError> {
        let (c, ws) = (self.config, &self.ws);
        let (h, eps) = (c.hidden_size, c.rms_norm_eps);
        self.kernels
            .add_rms_norm(ws.x, Some(ws.delta), w.ffn_norm, ws.xn, n, h, eps)?;
        self.mark("add_rms_norm")?;
        match (w.mlp, c.features.moe) {
            (MlpPtrs::Dense { gate_up, down }, _) => {
                let ff = c.intermediate_size;
                self.product(ws.xn, &gate_up, ws.gate_up, n, 2 * ff, h)?;
                self.mark("gate_up_proj")?;
                self.activation(n, ff)?;
                self.product(ws.act, &down, ws.delta, n, h, ff)?;
                self.mark("down_proj")?;
            }
            (
                MlpPtrs::Experts {
                    router,
                    gate_up,
                    down,
                },
                Some(moe),
            ) => {
                let (k, ff) = (moe.experts_per_token, moe.expert_ffn);
                let routes = Routes {
                    experts: ws.route_experts,
                    weights: ws.route_weights,
                    groups: ws.route_groups,
                    k,
                    num_experts: moe.num_experts,
                };
                self.dense_product(ws.xn, router, ws.scores, n, moe.num_experts, h)?;
                self.kernels.moe_route(
                    (ws.scores, self.inputs.live_rows),
                    routes,
                    n,
                    moe.normalize_top_k,
                )?;
                self.kernels.moe_group(routes, n)?;
                self.mark("router")?;
                self.expert_products((ws.xn, &gate_up, ws.gate_up), (routes, n), k, (2 * ff, h))?;
                self.mark("gate_up_proj")?;
                self.activation(n * k, ff)?;
                let products = (ws.act, &down, ws.expert_out);
                self.expert_products(products, (routes, n), 1, (h, ff))?;
                self.kernels
                    .moe_combine(ws.expert_out, routes, ws.delta, (n, h))?;
                self.mark("down_proj")?;
            }
            (MlpPtrs::Experts { .. }, None) => {
                return Err(CudaError::Unsupported(
                    "a layer of experts in a model configured without them".into(),
                ))
            }
        }
        self.post_norm(w.post_norms.map(|[_, mlp]| mlp), n)
    }

    /// The experts' products over `n` tokens' routes (see [`Kernels::expert_matvec`]). In
    /// bf16, dense experts always run on tensor cores (a route's bits never depend on the
    /// step); quantized ones too when the step routes [`GEMM_ROUTES_PER_EXPERT`] or more
    /// to an expert on average (a long prefill chunk), or under `--batch-invariant`, which
    /// wants one kernel for every step; else from their codes on CUDA cores, as f32 does.
    fn expert_products(
        &self,
        (x, w, y): (DevPtr, &MatrixPtrs, DevPtr),
        (routes, n): (Routes, usize),
        per_token: usize,
        (m, width): (usize, usize),
    ) -> Result<(), CudaError> {
        let long = n * routes.k >= GEMM_ROUTES_PER_EXPERT * routes.num_experts;
        let tensor_cores = self.dtype == CudaDtype::Bf16
            && width % GEMM_K == 0
            && (matches!(w, MatrixPtrs::Dense(_)) || long || !self.from_codes);
        if tensor_cores {
            self.kernels
                .expert_gemm((x, w, y), (routes, n), per_token, (m, width))
        } else {
            self.kernels
                .expert_matvec((x, w, y), routes, per_token, (m, width))
        }
    }

    /// `act = act(gate) * up` over `rows` rows of `ff` of the gate/up buffer.
    fn activation(&self, rows: usize, ff: usize) -> Result<(), CudaError> {
        let act = self.config.features.activation;
        self.kernels
            .gated_activation(self.ws.gate_up, self.ws.act, (rows, ff), act)?;
        self.mark("activation")
    }

    fn qkv_shape(&self, w: &LayerPtrs) -> QkvShape {
        let c = self.config;
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

    /// The attention's shape for a launch naming `parts` partitions, over tiles of up to
    /// `tile_tokens` tokens, on a layer with this sliding `window` (if any).
    fn attn_shape(&self, parts: usize, tile_tokens: usize, window: Option<usize>) -> AttnShape {
        let c = self.config;
        let default_scale = 1.0 / (c.head_dim as f32).sqrt();
        AttnShape {
            num_heads: c.num_heads as i32,
            num_kv_heads: c.num_kv_heads as i32,
            head_dim: c.head_dim as i32,
            block_size: self.kv.block_size as i32,
            max_blocks: self.table_stride as i32,
            scale: c.features.attention_scale.unwrap_or(default_scale),
            num_parts: parts as i32,
            tile_tokens: tile_tokens as i32,
            // Clamped: a window of over 2^31 positions is no window at all.
            window: window.map_or(0, |w| w.min(i32::MAX as usize) as i32),
        }
    }

    /// `y[n, m] = x[n, k] · w[m, k]ᵀ` for a layer's matrix `w`. A quantized matrix (Q8_0,
    /// Q4_1) multiplies from its codes when `n` is small (decode) and `from_codes` allows;
    /// otherwise it is expanded into the scratch matrix first (the product's time then
    /// includes writing and reading 2 bytes a weight once more).
    fn product(
        &self,
        x: DevPtr,
        w: &MatrixPtrs,
        y: DevPtr,
        n: usize,
        m: usize,
        k: usize,
    ) -> Result<(), CudaError> {
        let scratch = || {
            self.quant_scratch.ok_or_else(|| {
                CudaError::Unsupported("a quantized matrix without its scratch".into())
            })
        };
        match *w {
            MatrixPtrs::Dense(d) => self.dense_product(x, d, y, n, m, k),
            MatrixPtrs::Q8 { codes, scales } => {
                if self.from_codes && n <= Q8_MATVEC_ROWS {
                    return self.kernels.q8_matvec(codes, scales, x, y, n, m, k);
                }
                let scratch = scratch()?;
                self.kernels.q8_dequant(codes, scales, scratch, m, k)?;
                self.dense_product(x, scratch, y, n, m, k)
            }
            MatrixPtrs::Q4 { codes, scales } => {
                if self.from_codes && n <= Q4_MATVEC_ROWS {
                    return self.kernels.q4_matvec(codes, scales, x, y, n, m, k);
                }
                let scratch = scratch()?;
                self.kernels.q4_dequant(codes, scales, scratch, m, k)?;
                self.dense_product(x, scratch, y, n, m, k)
            }
        }
    }

    /// `y[n, m] = x[n, k] · w[m, k]ᵀ` with dense `w`.
    fn dense_product(
        &self,
        x: DevPtr,
        w: DevPtr,
        y: DevPtr,
        n: usize,
        m: usize,
        k: usize,
    ) -> Result<(), CudaError> {
        match self.dense {
            DenseProducts::Fixed => self.kernels.matmul_fixed(x, w, y, n, m, k),
            DenseProducts::Cublas(gemm) => gemm.matmul(x, w, y, n, m, k),
        }
    }

    /// Queues the LM head over the first `rows` (at most the logits buffer's rows) output
    /// slots of the inputs, [`LM_TILE`] rows per product, into the logits buffer.
    pub fn queue_lm_head(&self, rows: usize) -> Result<(), CudaError> {
        let (c, ws) = (self.config, &self.ws);
        let (h, vocab) = (c.hidden_size, c.vocab_size);
        let e = self.dtype.size() as u64;
        let slots = self.inputs.output_slots;
        for first in (0..rows).step_by(LM_TILE) {
            let tile = LM_TILE.min(rows - first);
            let f = first as u64;
            let lm_in = ws.lm_in + f * (h as u64) * e;
            let logits = ws.logits + f * (vocab as u64) * 4;
            self.kernels
                .gather_hidden(self.kv.hidden, slots + f * 8, lm_in, tile, h)?;
            self.dense_product(lm_in, self.weights.lm_head, logits, LM_TILE, vocab, h)?;
            if let Some(cap) = c.features.final_logit_softcap {
                self.kernels.soft_cap(logits, (tile, vocab), cap)?;
            }
        }
        self.mark("lm_head")
    }
}
