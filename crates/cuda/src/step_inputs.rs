//! The batch's index arrays in device memory, allocated once and rewritten every step.
//!
//! Kernels and captured CUDA graphs read them at fixed addresses: a step copies its
//! [`BatchLayout`] into the front of each buffer and launches (or replays) the same work.
//! The buffers grow only when a batch needs more room than they have (more tokens, a
//! longer block table); that moves them, and the caller drops its captured graphs.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use crate::batch_layout::BatchLayout;
use crate::error::CudaError;
use crate::host_staging::HostStaging;
use crate::kernels::DevPtr;

/// Rows of logits computed on the device before they are copied to the host together
/// (a multiple of the LM head's tile).
pub(crate) const LOGIT_ROWS: usize = 256;

/// The device copies of one step's [`BatchLayout`].
#[derive(Debug)]
pub(crate) struct StepInputs {
    /// Tokens (and so sequences) the buffers hold.
    pub rows: usize,
    /// Row length of `block_tables`: every step's layout is widened to this.
    pub table_stride: usize,
    tokens: CudaSlice<i32>,
    positions: CudaSlice<i32>,
    token_seq: CudaSlice<i32>,
    write_slots: CudaSlice<i64>,
    /// `[rows, head_dim / 2]` each.
    cos: CudaSlice<f32>,
    sin: CudaSlice<f32>,
    /// `[rows, head_dim / 2]` each: the sliding-window layers' angles (only models whose
    /// sliding-window layers have frequencies of their own write them).
    cos_local: CudaSlice<f32>,
    sin_local: CudaSlice<f32>,
    /// `[rows, table_stride]`.
    block_tables: CudaSlice<i32>,
    /// `[LOGIT_ROWS]`: slots of the hidden states the LM head reads next.
    output_slots: CudaSlice<i64>,
    /// `[rows, 2]`: the attention's tiles of a prefill or mixed step (at most one per token).
    tiles: CudaSlice<i32>,
    /// `[rows, 3]`: (row, output row of the step before, output row) of the tokens a step
    /// carries.
    carried: CudaSlice<i32>,
    /// `[rows]`: per output row, the token it carries (its penalties count it), or -1.
    carried_out: CudaSlice<i32>,
    /// `[1]`: the rows of the step's own tokens; the rest pad a decode graph's batch.
    live_rows: CudaSlice<i32>,
    /// What `live_rows` holds: a step with the same count copies nothing (decode steps
    /// of a steady batch, the common case).
    live_uploaded: i32,
    half_dim: usize,
    stream: Arc<CudaStream>,
}

/// Device addresses of the inputs, as the kernels take them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct InputPtrs {
    pub tokens: DevPtr,
    pub positions: DevPtr,
    pub token_seq: DevPtr,
    pub write_slots: DevPtr,
    pub cos: DevPtr,
    pub sin: DevPtr,
    pub cos_local: DevPtr,
    pub sin_local: DevPtr,
    pub block_tables: DevPtr,
    pub output_slots: DevPtr,
    pub tiles: DevPtr,
    pub carried: DevPtr,
    pub carried_out: DevPtr,
    pub live_rows: DevPtr,
}

impl StepInputs {
    pub fn new(
        stream: &Arc<CudaStream>,
        rows: usize,
        half_dim: usize,
        table_stride: usize,
    ) -> Result<StepInputs, CudaError> {
        Ok(StepInputs {
            rows,
            table_stride,
            tokens: stream.alloc_zeros(rows)?,
            positions: stream.alloc_zeros(rows)?,
            token_seq: stream.alloc_zeros(rows)?,
            write_slots: stream.alloc_zeros(rows)?,
            cos: stream.alloc_zeros(rows * half_dim)?,
            sin: stream.alloc_zeros(rows * half_dim)?,
            cos_local: stream.alloc_zeros(rows * half_dim)?,
            sin_local: stream.alloc_zeros(rows * half_dim)?,
            block_tables: stream.alloc_zeros(rows * table_stride)?,
            output_slots: stream.alloc_zeros(LOGIT_ROWS)?,
            tiles: stream.alloc_zeros(2 * rows)?,
            carried: stream.alloc_zeros(3 * rows)?,
            carried_out: stream.alloc_zeros(rows)?,
            live_rows: stream.alloc_zeros(1)?,
            live_uploaded: 0,
            half_dim,
            stream: stream.clone(),
        })
    }

    /// Whether a layout of `rows` tokens with block tables of `stride` fits as is.
    pub fn fits(&self, rows: usize, stride: usize) -> bool {
        rows <= self.rows && stride <= self.table_stride
    }

    /// Copies `l`'s index arrays (already widened to `table_stride`) into the buffers; the
    /// output slots go separately ([`StepInputs::upload_output_slots`]).
    pub fn upload(&mut self, l: &BatchLayout, st: &mut HostStaging) -> Result<(), CudaError> {
        let n = l.tokens.len();
        if n > self.rows || l.max_blocks != self.table_stride {
            return Err(CudaError::Unsupported(format!(
                "a layout of {n} tokens and {} blocks per table does not fit inputs of {} \
                 tokens and {} blocks",
                l.max_blocks, self.rows, self.table_stride
            )));
        }
        let s = self.stream.clone();
        st.copy(&s, &l.tokens, &mut self.tokens)?;
        st.copy(&s, &l.positions, &mut self.positions)?;
        st.copy(&s, &l.token_seq, &mut self.token_seq)?;
        st.copy(&s, &l.write_slots, &mut self.write_slots)?;
        st.copy(&s, &l.cos, &mut self.cos)?;
        st.copy(&s, &l.sin, &mut self.sin)?;
        if !l.cos_local.is_empty() {
            st.copy(&s, &l.cos_local, &mut self.cos_local)?;
            st.copy(&s, &l.sin_local, &mut self.sin_local)?;
        }
        st.copy(&s, &l.block_tables, &mut self.block_tables)?;
        let live = i32::try_from(l.live_rows)
            .map_err(|_| CudaError::Unsupported(format!("a step of {} tokens", l.live_rows)))?;
        if live != self.live_uploaded {
            st.copy(&s, &[live], &mut self.live_rows)?;
            self.live_uploaded = live;
        }
        Ok(())
    }

    /// Copies up to [`LOGIT_ROWS`] slots for the LM head.
    pub fn upload_output_slots(
        &mut self,
        slots: &[i64],
        st: &mut HostStaging,
    ) -> Result<(), CudaError> {
        let s = self.stream.clone();
        st.copy(&s, slots, &mut self.output_slots)
    }

    /// Copies the attention's tile pairs (at most one tile per token the inputs hold).
    pub fn upload_tiles(&mut self, pairs: &[i32], st: &mut HostStaging) -> Result<(), CudaError> {
        let s = self.stream.clone();
        st.copy(&s, pairs, &mut self.tiles)
    }

    /// Copies the (row, output row before, output row) triples of the carried tokens (at
    /// most one per token).
    pub fn upload_carried(
        &mut self,
        triples: &[i32],
        st: &mut HostStaging,
    ) -> Result<(), CudaError> {
        let s = self.stream.clone();
        st.copy(&s, triples, &mut self.carried)
    }

    pub fn ptrs(&self) -> InputPtrs {
        let s = &self.stream;
        InputPtrs {
            tokens: self.tokens.device_ptr(s).0,
            positions: self.positions.device_ptr(s).0,
            token_seq: self.token_seq.device_ptr(s).0,
            write_slots: self.write_slots.device_ptr(s).0,
            cos: self.cos.device_ptr(s).0,
            sin: self.sin.device_ptr(s).0,
            cos_local: self.cos_local.device_ptr(s).0,
            sin_local: self.sin_local.device_ptr(s).0,
            block_tables: self.block_tables.device_ptr(s).0,
            output_slots: self.output_slots.device_ptr(s).0,
            tiles: self.tiles.device_ptr(s).0,
            carried: self.carried.device_ptr(s).0,
            carried_out: self.carried_out.device_ptr(s).0,
            live_rows: self.live_rows.device_ptr(s).0,
        }
    }

    /// Half the head dimension (the RoPE tables' row length).
    pub fn half_dim(&self) -> usize {
        self.half_dim
    }
}
