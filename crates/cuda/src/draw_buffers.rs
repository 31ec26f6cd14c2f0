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
use crate::launched_steps::{PinnedResults, RowResult};
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
    /// `[LOGIT_ROWS]`: the raw logits of carried tokens the rows' lists do not hold.
    carried_saved: CudaSlice<f32>,
    /// The first output row of the group being processed, when its rows count carried
    /// tokens (set by `process_drawn_rows` for its `restore_processed`).
    carried_from: Option<usize>,
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
            carried_saved: stream.alloc_zeros(LOGIT_ROWS)?,
            carried_from: None,
        })
    }
}

impl CudaRunner {
    /// Applies the processors of `draws` (one per row of the logits buffer, at most
    /// [`LOGIT_ROWS`]) to their rows in place; true when there were any, and
    /// [`Self::restore_processed`] must follow the draw.
    ///
    /// With `carried_from` (the group's first output row, in a step that carries tokens),
    /// each row's carried token counts once more for its penalties (`carry_tokens` noted
    /// them per output row).
    pub(crate) fn process_drawn_rows(
        &mut self,
        draws: &[RowDraw],
        carried_from: Option<usize>,
    ) -> Result<bool, CudaError> {
        let counts_carried =
            carried_from.is_some() && draws.iter().any(|d| d.processing.has_penalties());
        if draws.iter().all(|d| d.processing.is_empty()) && !counts_carried {
            return Ok(false);
        }
        self.draws.carried_from = carried_from.filter(|_| counts_carried);
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
        self.staging.copy(&s, &rows, &mut b.rows)?;
        self.staging.copy(&s, &tokens, &mut b.tokens)?;
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
        let carried = b.carried_from.map(|first| {
            let ids = self.inputs.ptrs().carried_out + 4 * first as u64;
            (ids, ptr(&b.carried_saved, s))
        });
        self.kernels.process_rows(
            ptr(&self.ws.logits, s),
            ptr(&b.rows, s),
            ptr(&b.tokens, s),
            ptr(&b.saved, s),
            carried,
            rows,
            self.config.vocab_size,
            restore,
        )
    }

    /// Queues `top_logits` over the rows of the logits buffer for the top logprobs `draws`
    /// ask for (one per row) and the copies of its results to output rows `first..` of
    /// `results`; nothing when no row asks.
    pub(crate) fn queue_top_logits(
        &mut self,
        draws: &[RowDraw],
        first: usize,
        results: &mut PinnedResults,
    ) -> Result<(), CudaError> {
        let rows = draws.len();
        if draws.iter().all(|d| d.top_logprobs == 0) {
            return Ok(());
        }
        let counts: Vec<i32> = draws
            .iter()
            .map(|d| d.top_logprobs.min(TOP_LOGITS_MAX) as i32)
            .collect();
        let s = self.device.stream.clone();
        let b = &mut self.draws;
        self.staging.copy(&s, &counts, &mut b.top_counts)?;
        let (ids, values) = (ptr(&b.top_ids, &s), ptr(&b.top_values, &s));
        let logits = ptr(&self.ws.logits, &s);
        let vocab = self.config.vocab_size;
        self.kernels
            .top_logits(logits, ptr(&b.top_counts, &s), rows, vocab, ids, values)?;
        results.queue_copy(&s, RowResult::TopIds, first, rows, ids)?;
        results.queue_copy(&s, RowResult::TopValues, first, rows, values)
    }
}

/// The `count` (at most [`TOP_LOGITS_MAX`] and the vocabulary) most likely tokens of output
/// row `row` from its collected results, with their log-probabilities from the row's
/// maximum and softmax sum.
pub(crate) fn top_logprobs_of(
    results: &PinnedResults,
    row: usize,
    count: usize,
    vocab: usize,
) -> Vec<(TokenId, f32)> {
    let n = count.min(TOP_LOGITS_MAX).min(vocab);
    if n == 0 {
        return Vec::new();
    }
    let max = results.f32_at(RowResult::Max, row, 0);
    let lse = log_sum_exp(max, results.f64_at(RowResult::Sum, row));
    (0..n)
        .map(|i| {
            let id = results.i32_at(RowResult::TopIds, row, i);
            let value = results.f32_at(RowResult::TopValues, row, i);
            (TokenId(id as u32), log_prob(value, lse))
        })
        .collect()
}
