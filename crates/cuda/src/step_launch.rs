//! Steps that end in picks, queued and collected: [`CudaRunner::launch_picks`] queues the
//! forward pass (decode steps through their graph), each output row's draw and reductions
//! and the copies of their results into page-locked memory (`launched_steps.rs`);
//! [`CudaRunner::collect_launched`] waits for the oldest launched step and turns its
//! results into picks. `forward_sample` and `forward_greedy` are a launch and a collect;
//! `launch_sample` returns after the launch, so that the host plans the next step while
//! the device runs this one.

use tandem_model::batch::{CarriedToken, ForwardBatch};
use tandem_model::row_sampling::RowDraw;
use tandem_model::token_pick::TokenPick;
use tandem_model::ModelError;

use crate::batch_layout::BatchLayout;
use crate::draw_buffers::top_logprobs_of;
use crate::error::{catch_binding_panic, CudaError};
use crate::forward::ptr;
use crate::launched_steps::{LaunchedStep, PinnedResults, RowResult, MAX_LAUNCHED};
use crate::row_kernels::row_sampling_bytes;
use crate::runner::CudaRunner;
use crate::step_inputs::LOGIT_ROWS;

impl CudaRunner {
    /// [`tandem_model::runner::ModelRunner::launch_sample`]: `layout` is the batch's,
    /// checked with `rows` by `sample_layout`. Any error drops the launched steps.
    pub(crate) fn launch_layout(
        &mut self,
        layout: BatchLayout,
        rows: &[RowDraw],
        carried: &[CarriedToken],
    ) -> Result<(), CudaError> {
        let launched = self
            .steps
            .check_carried(carried, layout.tokens.len())
            .and_then(|()| self.device.bind())
            .and_then(|()| catch_binding_panic(|| self.launch_picks(layout, rows, carried)));
        if launched.is_err() {
            self.steps.clear(&self.device.stream);
        }
        launched
    }

    /// [`tandem_model::runner::ModelRunner::launch_sample`] of a batch.
    pub(crate) fn launch_sample_inner(
        &mut self,
        batch: &ForwardBatch,
        rows: &[RowDraw],
        carried: &[CarriedToken],
    ) -> Result<(), CudaError> {
        let layout = self.sample_layout(batch, rows);
        match layout {
            Ok(l) => self.launch_layout(l, rows, carried),
            Err(e) => {
                self.steps.clear(&self.device.stream);
                Err(e)
            }
        }
    }

    /// A launch and its collect: the picks of `layout`'s rows drawn as `rows` say. Refused
    /// while launched steps are uncollected (their picks come first).
    pub(crate) fn picks_now(
        &mut self,
        layout: BatchLayout,
        rows: &[RowDraw],
    ) -> Result<Vec<Option<TokenPick>>, CudaError> {
        if self.steps.len() > 0 {
            return Err(ModelError::Batch(format!(
                "{} launched steps are not collected yet",
                self.steps.len()
            ))
            .into());
        }
        self.launch_layout(layout, rows, &[])?;
        let picks = self.collect_launched();
        // Not a launched step: its picks overwrote the device copy of the last launched
        // step's, which a later launch could otherwise carry without an error.
        self.steps.forget_latest();
        picks
    }

    /// [`tandem_model::runner::ModelRunner::collect_picks`]: waits for the oldest launched
    /// step and returns its picks. Any error drops the launched steps.
    pub(crate) fn collect_launched(&mut self) -> Result<Vec<Option<TokenPick>>, CudaError> {
        let Some(step) = self.steps.pop() else {
            return Err(ModelError::Batch("no launched step to collect".into()).into());
        };
        let waited = self
            .device
            .bind()
            .and_then(|()| Ok(step.event.synchronize()?));
        if let Err(e) = waited {
            // The step's buffer may still be written: keep it out of reach.
            std::mem::forget(step.results);
            self.steps.clear(&self.device.stream);
            return Err(e);
        }
        let picks = picks_of(&step, self.config.vocab_size);
        self.steps.recycle(step.results);
        Ok(picks)
    }

    /// Queues the step of `l` with `carried` tokens from the latest step, each output row
    /// drawn as `sampling` says, the copies of the results and the step's event.
    fn launch_picks(
        &mut self,
        mut l: BatchLayout,
        sampling: &[RowDraw],
        carried: &[CarriedToken],
    ) -> Result<(), CudaError> {
        if self.steps.len() >= MAX_LAUNCHED {
            return Err(ModelError::Batch(format!(
                "{MAX_LAUNCHED} launched steps are not collected yet"
            ))
            .into());
        }
        let outputs = l.output_rows.len();
        let stream = self.device.stream.clone();
        self.ensure_capacity(l.tokens.len(), l.max_blocks)?;
        self.steps.reserve_picks(&stream, outputs)?;
        l.widen_tables(self.inputs.table_stride);
        let mut results = self.steps.take_results(&self.device.ctx, outputs)?;
        self.staging.begin_step()?;
        // A panic in the bindings must not unwind past `results` (freed under its queued
        // copies) nor skip `end_step`: caught here, it takes the error path below.
        let queued =
            catch_binding_panic(|| self.queue_step_picks(l, sampling, carried, &mut results));
        let staged = self.staging.end_step(&stream);
        let queued = queued.and(staged);
        let event = queued.and_then(|()| Ok(stream.record_event(None)?));
        match event {
            Ok(event) => {
                self.steps.push(LaunchedStep {
                    results,
                    top_counts: sampling.iter().map(|d| d.top_logprobs).collect(),
                    event,
                });
                Ok(())
            }
            Err(e) => {
                // Copies into `results` may be queued: the caller's `clear` waits for the
                // stream, and only then may the buffer go.
                if stream.synchronize().is_ok() {
                    drop(results);
                } else {
                    std::mem::forget(results);
                }
                Err(e)
            }
        }
    }

    /// Queues the forward pass of `l` (fitted and widened) and the draws of its output rows.
    fn queue_step_picks(
        &mut self,
        l: BatchLayout,
        sampling: &[RowDraw],
        carried: &[CarriedToken],
        results: &mut PinnedResults,
    ) -> Result<(), CudaError> {
        let carries = !carried.is_empty();
        if let Some(bucket) = self.graph_bucket(&l) {
            self.replay_decode(l, bucket, carried)?;
            return self.queue_group_picks(0, sampling, carries, results);
        }
        self.queue_eager(&l, carried)?;
        for (g, slots) in l.output_slots.chunks(LOGIT_ROWS).enumerate() {
            self.inputs.upload_output_slots(slots, &mut self.staging)?;
            self.queue_lm_head(slots.len())?;
            let first = g * LOGIT_ROWS;
            let draws = &sampling[first..first + slots.len()];
            self.queue_group_picks(first, draws, carries, results)?;
        }
        Ok(())
    }

    /// Uploads the triples of `carried` and queues `carry_tokens`, which writes the latest
    /// step's picks into the input tokens (after the inputs' upload, before the layers) and
    /// notes, per output row (`output_rows`: the layout's), the token it carries.
    pub(crate) fn queue_carried(
        &mut self,
        carried: &[CarriedToken],
        output_rows: &[usize],
    ) -> Result<(), CudaError> {
        if carried.is_empty() {
            return Ok(());
        }
        let mut triples = Vec::with_capacity(3 * carried.len());
        for c in carried {
            let output = output_rows.binary_search(&c.row).map_err(|_| {
                CudaError::from(ModelError::Batch(format!(
                    "carried row {} is not an output row",
                    c.row
                )))
            })?;
            triples.extend([c.row as i32, c.from_output as i32, output as i32]);
        }
        self.inputs.upload_carried(&triples, &mut self.staging)?;
        let s = &self.device.stream;
        let p = self.inputs.ptrs();
        let picks = self.steps.picks_ptr(s, 0);
        let (count, outputs) = (carried.len(), output_rows.len());
        self.kernels
            .carry_tokens(p.tokens, picks, p.carried, count, p.carried_out, outputs)
    }

    /// Queues the draws of the first `draws.len()` (at most [`LOGIT_ROWS`]) rows of the
    /// logits buffer, output rows `first..`, their reductions and the copies of the results
    /// into `results`. The drawn tokens go to the device picks at `first..`. In a step that
    /// `carries` tokens, each carried row's penalties count its token.
    fn queue_group_picks(
        &mut self,
        first: usize,
        draws: &[RowDraw],
        carries: bool,
        results: &mut PinnedResults,
    ) -> Result<(), CudaError> {
        let rows = draws.len();
        let s = self.device.stream.clone();
        let bytes: Vec<u8> = draws
            .iter()
            .flat_map(|d| row_sampling_bytes(&d.sampling))
            .collect();
        self.staging.copy(&s, &bytes, &mut self.ws.sample_params)?;
        let processed = self.process_drawn_rows(draws, carries.then_some(first))?;
        let picks = self.steps.picks_ptr(&s, first);
        let (ws, vocab) = (&self.ws, self.config.vocab_size);
        let logits = ptr(&ws.logits, &s);
        let params = ptr(&ws.sample_params, &s);
        self.kernels
            .sample_rows(logits, params, rows, vocab, picks)?;
        if processed {
            self.restore_processed(rows)?;
        }
        let ws = &self.ws;
        let (max, sum, logit) = (
            ptr(&ws.lp_max, &s),
            ptr(&ws.lp_sum, &s),
            ptr(&ws.lp_target_logit, &s),
        );
        self.kernels
            .logit_exp_sums(logits, picks, rows, vocab, max, sum, logit)?;
        results.queue_copy(&s, RowResult::Token, first, rows, picks)?;
        results.queue_copy(&s, RowResult::Max, first, rows, max)?;
        results.queue_copy(&s, RowResult::Sum, first, rows, sum)?;
        results.queue_copy(&s, RowResult::TokenLogit, first, rows, logit)?;
        self.queue_top_logits(draws, first, results)
    }
}

/// The picks of a launched step whose event has passed: each row's token and raw logprob
/// from its statistics, with the top logprobs it asked for.
fn picks_of(step: &LaunchedStep, vocab: usize) -> Vec<Option<TokenPick>> {
    let r = &step.results;
    step.top_counts
        .iter()
        .enumerate()
        .map(|(i, &top)| {
            TokenPick::from_stats(
                r.i32_at(RowResult::Token, i, 0) as i64,
                r.f32_at(RowResult::TokenLogit, i, 0),
                r.f32_at(RowResult::Max, i, 0),
                r.f64_at(RowResult::Sum, i),
            )
            .map(|p| TokenPick {
                top_logprobs: top_logprobs_of(r, i, top, vocab),
                ..p
            })
        })
        .collect()
}
