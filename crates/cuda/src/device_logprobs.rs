//! Teacher-forced log-probabilities computed where the logits are
//! ([`tandem_model::runner::ModelRunner::forward_logprobs`]).
//!
//! Scoring asks for one number per position, but the forward pass makes a vocabulary's
//! worth of logits per position: 32 sequences of 2,048 tokens of a 128k-vocabulary model
//! are 34 GB of logits. Here the LM head's rows stay on the device; `logit_exp_sums`
//! (logprobs.cu) reduces each row to its maximum, its softmax sum and the target's logit,
//! 16 bytes, and the host finishes with the same two operations its own log-softmax ends
//! with ([`tandem_kernels::ops::log_sum_exp`], [`tandem_kernels::ops::log_prob`]). The
//! kernel sums in the host's order with the host's exp, so a log-probability is bitwise the
//! one the host computes from the same logits.

use tandem_kernels::ops::{log_prob, log_sum_exp};
use tandem_model::batch::{ForwardBatch, TokenId};
use tandem_model::ModelError;

use crate::batch_layout::BatchLayout;
use crate::error::{catch_binding_panic, CudaError};
use crate::forward::ptr;
use crate::runner::CudaRunner;
use crate::step_inputs::LOGIT_ROWS;

impl CudaRunner {
    /// [`tandem_model::runner::ModelRunner::forward_logprobs`] on the device.
    pub(crate) fn forward_logprobs_inner(
        &mut self,
        batch: &ForwardBatch,
        targets: &[Option<TokenId>],
    ) -> Result<Vec<Option<f32>>, CudaError> {
        let c = &self.config;
        batch.validate(c.vocab_size, self.pool.block_size, self.pool.num_blocks)?;
        let layout = BatchLayout::build(batch, self.pool.block_size, &self.inv_freqs)?;
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

    /// Runs the layers eagerly, then the LM head and the row sums [`LOGIT_ROWS`] rows at a
    /// time.
    fn run_logprobs(
        &mut self,
        mut l: BatchLayout,
        targets: &[Option<TokenId>],
    ) -> Result<Vec<Option<f32>>, CudaError> {
        self.ensure_capacity(l.tokens.len(), l.max_blocks)?;
        l.widen_tables(self.inputs.table_stride);
        self.queue_eager(&l)?;
        let vocab = self.config.vocab_size;
        let s = self.device.stream.clone();
        let mut out = Vec::with_capacity(targets.len());
        let (mut max, mut sum, mut logit) = (
            vec![0f32; LOGIT_ROWS],
            vec![0f64; LOGIT_ROWS],
            vec![0f32; LOGIT_ROWS],
        );
        for (g, (slots, group)) in l
            .output_slots
            .chunks(LOGIT_ROWS)
            .zip(targets.chunks(LOGIT_ROWS))
            .enumerate()
        {
            let rows = slots.len();
            self.inputs.upload_output_slots(slots)?;
            self.queue_lm_head(rows)?;
            let ids: Vec<i32> = group.iter().map(|t| t.map_or(-1, |t| t.0 as i32)).collect();
            s.memcpy_htod(&ids, &mut self.ws.lp_targets)?;
            let ws = &self.ws;
            self.kernels.logit_exp_sums(
                ptr(&ws.logits, &s),
                ptr(&ws.lp_targets, &s),
                rows,
                vocab,
                ptr(&ws.lp_max, &s),
                ptr(&ws.lp_sum, &s),
                ptr(&ws.lp_target_logit, &s),
            )?;
            s.memcpy_dtoh(&ws.lp_max.slice(..rows), &mut max[..rows])?;
            s.memcpy_dtoh(&ws.lp_sum.slice(..rows), &mut sum[..rows])?;
            s.memcpy_dtoh(&ws.lp_target_logit.slice(..rows), &mut logit[..rows])?;
            for (i, t) in group.iter().enumerate() {
                let Some(_) = t else {
                    out.push(None);
                    continue;
                };
                // A finite row's sum is at least 1 (its maximum's term); 0 marks a NaN or
                // an infinity, which the host's log-softmax refuses too.
                if sum[i] == 0.0 {
                    let row = g * LOGIT_ROWS + i;
                    return Err(ModelError::Batch(format!("non-finite logits at row {row}")).into());
                }
                out.push(Some(log_prob(logit[i], log_sum_exp(max[i], sum[i]))));
            }
        }
        Ok(out)
    }
}
