//! The forward pass on the device: the workspace it runs in, and the runner's side of a
//! step — fitting the buffers to the batch, uploading its inputs, and queuing the
//! [`LayerProgram`] eagerly or replaying its recorded decode graph.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use tandem_model::batch::CarriedToken;
use tandem_model::logits::Logits;
use tandem_model::ModelConfig;

use crate::batch_layout::BatchLayout;
use crate::decode_graphs::bucket_for;
use crate::error::CudaError;
use crate::kernels::{DevPtr, ATTN_PARTITION};
use crate::layer_program::{tensor_core_attention, DenseProducts, LayerProgram, PARTIAL_SLOTS};
use crate::options::CudaDtype;
use crate::program_buffers::{WorkspaceBytes, WorkspacePtrs};
use crate::row_kernels::ROW_SAMPLING_BYTES;
use crate::runner::CudaRunner;
use crate::step_inputs::{StepInputs, LOGIT_ROWS};

/// Activations of up to `capacity` tokens, plus the LM head's rows (see [`WorkspaceBytes`]
/// for each buffer's shape).
#[derive(Debug)]
pub(crate) struct Workspace {
    pub capacity: usize,
    x: CudaSlice<f32>,
    delta: CudaSlice<f32>,
    xn: CudaSlice<u8>,
    qkv: CudaSlice<f32>,
    q: CudaSlice<f32>,
    attn: CudaSlice<u8>,
    partials: CudaSlice<f32>,
    gate_up: CudaSlice<f32>,
    act: CudaSlice<u8>,
    lm_in: CudaSlice<u8>,
    pub(crate) logits: CudaSlice<f32>,
    scores: CudaSlice<f32>,
    route_experts: CudaSlice<i32>,
    route_weights: CudaSlice<f32>,
    route_groups: CudaSlice<i32>,
    expert_out: CudaSlice<f32>,
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
        let sz = WorkspaceBytes::new(c, dtype, capacity, LOGIT_ROWS);
        // Never empty: a model without experts has no use for their buffers.
        let f = |bytes: usize| stream.alloc_zeros::<f32>(bytes.max(16) / 4);
        let b = |bytes: usize| stream.alloc_zeros::<u8>(bytes.max(16));
        Ok(Workspace {
            capacity,
            x: f(sz.x)?,
            delta: f(sz.delta)?,
            xn: b(sz.xn)?,
            qkv: f(sz.qkv)?,
            q: f(sz.q)?,
            attn: b(sz.attn)?,
            partials: f(sz.partials)?,
            gate_up: f(sz.gate_up)?,
            act: b(sz.act)?,
            lm_in: b(sz.lm_in)?,
            logits: f(sz.logits)?,
            scores: f(sz.scores)?,
            route_experts: stream.alloc_zeros::<i32>(sz.route_experts.max(16) / 4)?,
            route_weights: f(sz.route_weights)?,
            route_groups: stream.alloc_zeros::<i32>(sz.route_groups.max(16) / 4)?,
            expert_out: f(sz.expert_out)?,
            lp_targets: stream.alloc_zeros::<i32>(LOGIT_ROWS)?,
            lp_max: stream.alloc_zeros::<f32>(LOGIT_ROWS)?,
            lp_sum: stream.alloc_zeros::<f64>(LOGIT_ROWS)?,
            lp_target_logit: stream.alloc_zeros::<f32>(LOGIT_ROWS)?,
            sample_params: stream.alloc_zeros::<u8>(LOGIT_ROWS * ROW_SAMPLING_BYTES)?,
        })
    }

    /// The addresses [`LayerProgram`] works in.
    pub fn ptrs(&self, s: &CudaStream) -> WorkspacePtrs {
        WorkspacePtrs {
            x: ptr(&self.x, s),
            delta: ptr(&self.delta, s),
            xn: ptr(&self.xn, s),
            qkv: ptr(&self.qkv, s),
            q: ptr(&self.q, s),
            attn: ptr(&self.attn, s),
            partials: ptr(&self.partials, s),
            gate_up: ptr(&self.gate_up, s),
            act: ptr(&self.act, s),
            lm_in: ptr(&self.lm_in, s),
            logits: ptr(&self.logits, s),
            scores: ptr(&self.scores, s),
            route_experts: ptr(&self.route_experts, s),
            route_weights: ptr(&self.route_weights, s),
            route_groups: ptr(&self.route_groups, s),
            expert_out: ptr(&self.expert_out, s),
        }
    }
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
        let tiles = self.program().attention_tiles(l, parts);
        if let Some(t) = &tiles {
            self.inputs.upload_tiles(&t.pairs, &mut self.staging)?;
        }
        self.program()
            .queue_layers(l.tokens.len(), parts, tiles.as_ref())
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
        let mut data = self.spare_logits.take(n * vocab);
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
        let parts = self.graph_parts();
        // On tensor cores the attention reads its tiles (a token each, the same for every
        // step of the bucket) from the inputs, where a prefill step may have left its own.
        let tiles = self.program().attention_tiles(&l, parts);
        if let Some(t) = &tiles {
            self.inputs.upload_tiles(&t.pairs, &mut self.staging)?;
        }
        if !self.graphs.has(bucket) {
            let stream = self.device.stream.clone();
            let mut graphs = std::mem::take(&mut self.graphs);
            let recorded = graphs.record(&stream, bucket, || {
                let program = self.program();
                program.queue_layers(bucket, parts, tiles.as_ref())?;
                program.queue_lm_head(bucket)
            });
            self.graphs = graphs;
            if let Err(e) = recorded {
                // Nothing of the failed recording ran: the same work, queued eagerly over
                // the inputs already uploaded, is this step; later steps stay eager.
                self.graphs.give_up(bucket, &e);
                let program = self.program();
                program.queue_layers(bucket, parts, tiles.as_ref())?;
                return program.queue_lm_head(bucket);
            }
        }
        self.graphs.launch(bucket)
    }

    /// Logits of the hidden states stored at `slots` (row `i` numbered `rows[i]`), computed
    /// [`LOGIT_ROWS`] rows at a time and copied to the host.
    pub(crate) fn lm_head(&mut self, rows: Vec<usize>, slots: &[i64]) -> Result<Logits, CudaError> {
        let vocab = self.config.vocab_size;
        let mut data = self.spare_logits.take(slots.len() * vocab); // [rows, vocab]
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

    /// Queues the LM head over the first `rows` (at most [`LOGIT_ROWS`]) output slots of
    /// the inputs into the logits buffer.
    pub(crate) fn queue_lm_head(&self, rows: usize) -> Result<(), CudaError> {
        self.program().queue_lm_head(rows)
    }

    /// The step's program over this runner's buffers (see [`LayerProgram`]).
    pub(crate) fn program(&self) -> LayerProgram<'_> {
        let s = &self.device.stream;
        LayerProgram {
            config: &self.config,
            dtype: self.dtype,
            kernels: &self.kernels,
            dense: match self.batch_invariant {
                true => DenseProducts::Fixed,
                false => DenseProducts::Cublas(&self.gemm),
            },
            from_codes: !self.batch_invariant,
            quant_scratch: self.quant_scratch.as_ref().map(|q| ptr(q, s)),
            tensor_core_attention: self.tensor_core_attention(),
            tc_fold_min_blocks: self.tc_fold_min_blocks,
            weights: &self.weight_ptrs,
            kv: &self.kv_ptrs,
            ws: self.ws.ptrs(s),
            inputs: self.inputs.ptrs(),
            table_stride: self.inputs.table_stride,
            profile: Some((&self.profile, &self.device)),
        }
    }

    /// Whether every step runs its attention on tensor cores (see
    /// [`tensor_core_attention`]).
    pub(crate) fn tensor_core_attention(&self) -> bool {
        tensor_core_attention(self.tensor_core_attention, &self.config, self.dtype)
    }
}
