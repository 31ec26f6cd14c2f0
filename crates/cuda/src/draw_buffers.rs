//! What a row draw needs beyond its parameters (see `device_rows.rs`): the processors'
//! token lists, applied to the logits in place before the draw and undone after it
//! (processing.cu), and the raw rows' most likely tokens (`top_logits`, sampling.cu).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use tandem_kernels::ops::{log_prob, log_sum_exp};
use tandem_model::batch::TokenId;
use tandem_model::row_sampling::RowDraw;

use crate::error::CudaError;
use crate::forward::ptr;
use crate::row_kernels::{
    append_processing, ROW_PROCESSING_BYTES, TOKEN_ADJUSTMENT_BYTES, TOP_LOGITS_MAX,
};
use crate::runner::CudaRunner;
use crate::step_inputs::LOGIT_ROWS;

/// Token adjustments the list holds before it first grows.
const INITIAL_TOKENS: usize = 4096;

/// Device buffers of the draws' processors and top logits.
#[derive(Debug)]
pub(crate) struct DrawBuffers {
    /// `[LOGIT_ROWS]` `RowProcessing`s.
    rows: CudaSlice<u8>,
    /// The rows' `TokenAdjustment`s, grown to the largest step's list.
    tokens: CudaSlice<u8>,
    /// One raw logit per token of the list, for the restore.
    saved: CudaSlice<f32>,
    /// `[LOGIT_ROWS]` top logits asked for per row; `[LOGIT_ROWS, TOP_LOGITS_MAX]` results.
    top_counts: CudaSlice<i32>,
    top_ids: CudaSlice<i32>,
    top_values: CudaSlice<f32>,
}

impl DrawBuffers {
    pub(crate) fn new(stream: &Arc<CudaStream>) -> Result<DrawBuffers, CudaError> {
        Ok(DrawBuffers {
            rows: stream.alloc_zeros(LOGIT_ROWS * ROW_PROCESSING_BYTES)?,
            tokens: stream.alloc_zeros(INITIAL_TOKENS * TOKEN_ADJUSTMENT_BYTES)?,
            saved: stream.alloc_zeros(INITIAL_TOKENS)?,
            top_counts: stream.alloc_zeros(LOGIT_ROWS)?,
            top_ids: stream.alloc_zeros(LOGIT_ROWS * TOP_LOGITS_MAX)?,
            top_values: stream.alloc_zeros(LOGIT_ROWS * TOP_LOGITS_MAX)?,
        })
    }
}

impl CudaRunner {
    /// Applies the processors of `draws` (one per row of the logits buffer, at most
    /// [`LOGIT_ROWS`]) to their rows in place; true when there were any, and
    /// [`Self::restore_processed`] must follow the draw.
    pub(crate) fn process_drawn_rows(&mut self, draws: &[RowDraw]) -> Result<bool, CudaError> {
        if draws.iter().all(|d| d.processing.is_empty()) {
            return Ok(false);
        }
        let s = self.device.stream.clone();
        let (mut rows, mut tokens) = (Vec::new(), Vec::new());
        for d in draws {
            append_processing(&d.processing, &mut rows, &mut tokens);
        }
        let count = tokens.len() / TOKEN_ADJUSTMENT_BYTES;
        let b = &mut self.draws;
        if count > b.saved.len() {
            let grown = count.next_power_of_two();
            b.tokens = s.alloc_zeros(grown * TOKEN_ADJUSTMENT_BYTES)?;
            b.saved = s.alloc_zeros(grown)?;
        }
        s.memcpy_htod(&rows, &mut b.rows)?;
        s.memcpy_htod(&tokens, &mut b.tokens)?;
        self.launch_processing(draws.len(), false)?;
        Ok(true)
    }

    /// Puts back the raw logits [`Self::process_drawn_rows`] replaced in its `rows` rows.
    pub(crate) fn restore_processed(&mut self, rows: usize) -> Result<(), CudaError> {
        self.launch_processing(rows, true)
    }

    fn launch_processing(&mut self, rows: usize, restore: bool) -> Result<(), CudaError> {
        let s = &self.device.stream;
        let b = &self.draws;
        self.kernels.process_rows(
            ptr(&self.ws.logits, s),
            ptr(&b.rows, s),
            ptr(&b.tokens, s),
            ptr(&b.saved, s),
            None,
            rows,
            self.config.vocab_size,
            restore,
        )
    }

    /// The most likely tokens of the raw rows `draws` ask for (one per row of the logits
    /// buffer), with their log-probabilities from each row's maximum and softmax sum;
    /// empty lists when no row asks.
    pub(crate) fn top_logprobs(
        &mut self,
        draws: &[RowDraw],
        max: &[f32],
        sum: &[f64],
    ) -> Result<Vec<Vec<(TokenId, f32)>>, CudaError> {
        let rows = draws.len();
        if draws.iter().all(|d| d.top_logprobs == 0) {
            return Ok(vec![Vec::new(); rows]);
        }
        let counts: Vec<i32> = draws
            .iter()
            .map(|d| d.top_logprobs.min(TOP_LOGITS_MAX) as i32)
            .collect();
        let s = self.device.stream.clone();
        let b = &mut self.draws;
        s.memcpy_htod(&counts, &mut b.top_counts)?;
        self.kernels.top_logits(
            ptr(&self.ws.logits, &s),
            ptr(&b.top_counts, &s),
            rows,
            self.config.vocab_size,
            ptr(&b.top_ids, &s),
            ptr(&b.top_values, &s),
        )?;
        let mut ids = vec![0i32; rows * TOP_LOGITS_MAX];
        let mut values = vec![0f32; rows * TOP_LOGITS_MAX];
        s.memcpy_dtoh(&b.top_ids.slice(..ids.len()), &mut ids)?;
        s.memcpy_dtoh(&b.top_values.slice(..values.len()), &mut values)?;
        Ok((0..rows)
            .map(|r| {
                let n = (counts[r] as usize).min(self.config.vocab_size);
                let lse = log_sum_exp(max[r], sum[r]);
                (r * TOP_LOGITS_MAX..r * TOP_LOGITS_MAX + n)
                    .map(|i| (TokenId(ids[i] as u32), log_prob(values[i], lse)))
                    .collect()
            })
            .collect())
    }
}
