//! Logits reduced where they are: teacher-forced log-probabilities
//! ([`tandem_model::runner::ModelRunner::forward_logprobs`]), greedy picks
//! ([`tandem_model::runner::ModelRunner::forward_greedy`]) and sampled tokens
//! ([`tandem_model::runner::ModelRunner::forward_sample`]: processing.cu applies each
//! row's processors in place, `sample_rows`, sampling.cu, draws each row's token, the raw
//! logits are put back, and the token's raw logprob then comes as a target's does, with
//! the row's most likely tokens from `top_logits` when asked; see `draw_buffers.rs`). Picks
//! are queued and collected by `step_launch.rs`, the same way for a step run to its end and
//! for an overlapped one.
//!
//! All need a few numbers per row, but the forward pass makes a vocabulary's worth of
//! logits per row: 32 sequences of 2,048 tokens of a 128k-vocabulary model are 34 GB of
//! logits, and a decode step of 256 sequences 131 MB, more than the step's weights. Here the
//! LM head's rows stay on the device; `sample_rows` chooses each row's token (greedy picks
//! are draws at temperature 0), and `logit_exp_sums` (logprobs.cu) reduces each row to its
//! maximum, its softmax sum and the target's (or chosen token's) logit; the host finishes
//! with the same two operations its own log-softmax ends with ([`tandem_kernels::ops::log_sum_exp`], [`tandem_kernels::ops::log_prob`]). The
//! kernel sums in the host's order with the host's exp, so a log-probability is bitwise the
//! one the host computes from the same logits, and a greedy pick is the sampler's.

use tandem_kernels::ops::{log_prob, log_sum_exp};
use tandem_model::batch::{ForwardBatch, TokenId};
use tandem_model::row_sampling::{RowDraw, RowSampling};
use tandem_model::token_pick::TokenPick;
use tandem_model::ModelError;

use crate::batch_layout::BatchLayout;
use crate::error::{catch_binding_panic, CudaError};
use crate::forward::ptr;
use crate::row_kernels::TOP_LOGITS_MAX;
use crate::runner::CudaRunner;
use crate::step_inputs::LOGIT_ROWS;

/// The statistics of the first rows of the logits buffer.
#[derive(Debug, Default)]
struct RowStats {
    max: Vec<f32>,
    /// 0 for a row holding a NaN or an infinity (a finite row sums at least 1).
    sum: Vec<f64>,
    target_logit: Vec<f32>,
}

impl CudaRunner {
    /// [`tandem_model::runner::ModelRunner::forward_logprobs`] on the device.
    pub(crate) fn forward_logprobs_inner(
        &mut self,
        batch: &ForwardBatch,
        targets: &[Option<TokenId>],
    ) -> Result<Vec<Option<f32>>, CudaError> {
        let c = &self.config;
        batch.validate(c.vocab_size, self.pool.block_size, self.pool.num_blocks)?;
        let layout = BatchLayout::build(batch, self.pool.block_size, &self.rope)?;
        if targets.len() != layout.output_rows.len() {
            return Err(ModelError::Batch(format!(
                "{} targets for {} output rows",
                targets.len(),
                layout.output_rows.len()
            ))
            .into());
        }
        if let Some(t) = targets
            .iter()
            .flatten()
            .find(|t| t.0 as usize >= c.vocab_size)
        {
            return Err(ModelError::Batch(format!(
                "target token {} is outside the vocabulary ({})",
                t.0, c.vocab_size
            ))
            .into());
        }
        self.device.bind()?;
        catch_binding_panic(|| self.run_logprobs(layout, targets))
    }

    /// [`tandem_model::runner::ModelRunner::forward_greedy`] on the device.
    pub(crate) fn forward_greedy_inner(
        &mut self,
        batch: &ForwardBatch,
    ) -> Result<Vec<Option<TokenPick>>, CudaError> {
        let c = &self.config;
        batch.validate(c.vocab_size, self.pool.block_size, self.pool.num_blocks)?;
        let layout = BatchLayout::build(batch, self.pool.block_size, &self.rope)?;
        // Greedy rows are draws at temperature 0: the lowest id of the maximum.
        let greedy = RowDraw::plain(RowSampling {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            uniform: 0.0,
        });
        let rows = vec![greedy; layout.output_rows.len()];
        self.picks_now(layout, &rows)
    }

    /// [`tandem_model::runner::ModelRunner::forward_sample`] on the device.
    pub(crate) fn forward_sample_inner(
        &mut self,
        batch: &ForwardBatch,
        rows: &[RowDraw],
    ) -> Result<Vec<Option<TokenPick>>, CudaError> {
        let layout = self.sample_layout(batch, rows)?;
        self.picks_now(layout, rows)
    }

    /// The layout of `batch` after checking it and its row draws (one per output row).
    pub(crate) fn sample_layout(
        &self,
        batch: &ForwardBatch,
        rows: &[RowDraw],
    ) -> Result<BatchLayout, CudaError> {
        let c = &self.config;
        batch.validate(c.vocab_size, self.pool.block_size, self.pool.num_blocks)?;
        let layout = BatchLayout::build(batch, self.pool.block_size, &self.rope)?;
        if let Some(e) = rows.iter().find_map(|r| r.validate(c.vocab_size).err()) {
            return Err(ModelError::Batch(e).into());
        }
        if let Some(r) = rows.iter().find(|r| r.top_logprobs > TOP_LOGITS_MAX) {
            return Err(ModelError::Batch(format!(
                "{} top logprobs asked for; the device reports at most {TOP_LOGITS_MAX}",
                r.top_logprobs
            ))
            .into());
        }
        if rows.len() != layout.output_rows.len() {
            return Err(ModelError::Batch(format!(
                "{} row samplings for {} output rows",
                rows.len(),
                layout.output_rows.len()
            ))
            .into());
        }
        Ok(layout)
    }

    /// Runs the layers eagerly, then the LM head and the row sums [`LOGIT_ROWS`] rows at a
    /// time.
    fn run_logprobs(
        &mut self,
        mut l: BatchLayout,
        targets: &[Option<TokenId>],
    ) -> Result<Vec<Option<f32>>, CudaError> {
        self.ensure_capacity(l.tokens.len(), l.max_blocks)?;
        l.widen_tables(self.inputs.table_stride);
        self.queue_eager(&l, &[])?;
        let mut out = Vec::with_capacity(targets.len());
        for (g, (slots, group)) in l
            .output_slots
            .chunks(LOGIT_ROWS)
            .zip(targets.chunks(LOGIT_ROWS))
            .enumerate()
        {
            self.inputs.upload_output_slots(slots, &mut self.staging)?;
            self.queue_lm_head(slots.len())?;
            let ids: Vec<i32> = group.iter().map(|t| t.map_or(-1, |t| t.0 as i32)).collect();
            let st = self.row_stats(slots.len(), &ids)?;
            for (i, t) in group.iter().enumerate() {
                let Some(_) = t else {
                    out.push(None);
                    continue;
                };
                // 0 marks a NaN or an infinity, which the host's log-softmax refuses too.
                if st.sum[i] == 0.0 {
                    let row = g * LOGIT_ROWS + i;
                    return Err(ModelError::Batch(format!("non-finite logits at row {row}")).into());
                }
                out.push(Some(log_prob(
                    st.target_logit[i],
                    log_sum_exp(st.max[i], st.sum[i]),
                )));
            }
        }
        Ok(out)
    }

    /// Reduces the first `rows` (at most [`LOGIT_ROWS`]) rows of the logits buffer with
    /// the host's `targets` (negative: none) and copies the statistics to the host.
    fn row_stats(&mut self, rows: usize, targets: &[i32]) -> Result<RowStats, CudaError> {
        let s = self.device.stream.clone();
        s.memcpy_htod(targets, &mut self.ws.lp_targets)?;
        let ws = &self.ws;
        self.kernels.logit_exp_sums(
            ptr(&ws.logits, &s),
            ptr(&ws.lp_targets, &s),
            rows,
            self.config.vocab_size,
            ptr(&ws.lp_max, &s),
            ptr(&ws.lp_sum, &s),
            ptr(&ws.lp_target_logit, &s),
        )?;
        let mut st = RowStats {
            max: vec![0.0; rows],
            sum: vec![0.0; rows],
            target_logit: vec![0.0; rows],
        };
        s.memcpy_dtoh(&ws.lp_max.slice(..rows), &mut st.max)?;
        s.memcpy_dtoh(&ws.lp_sum.slice(..rows), &mut st.sum)?;
        s.memcpy_dtoh(&ws.lp_target_logit.slice(..rows), &mut st.target_logit)?;
        Ok(st)
    }
}
