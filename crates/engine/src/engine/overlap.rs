//! Overlapped steps: the host plans step n+1 while the runner computes step n.
//!
//! With a runner that overlaps steps (a GPU: kernels are queued and run while the host goes
//! on; `ModelRunner::overlaps_steps`), a step whose rows the runner chooses is *launched*
//! (`ModelRunner::launch_sample`) and answered by the next call to [`Engine::step`]. That
//! call first plans the following step ahead of the result
//! ([`crate::scheduler::Scheduler::schedule_ahead`]: each sequence being sampled gets one
//! carried token, the runner's pick, which never crosses to the host before the step that
//! reads it is queued), launches it, and only then waits for the older step's picks
//! (`ModelRunner::collect_picks`) and applies them. The device so always has the next step
//! queued while the host samples, appends, checks stop conditions and streams tokens.
//!
//! Results are those of the synchronous loop, request by request, token for token: a row's
//! token depends only on its own sequence (batch invariance) and each request draws from its
//! own stream in order. What changes is the cost: a sequence that a stop token ends at step
//! n has computed one row of step n+1 for nothing (`scheduler/ahead.rs`).
//!
//! A carried row's processors are built before its carried token is known: `min_tokens`
//! counts it as output here, and the runner counts it for the penalties
//! (`LogitProcessing::with_output`) once it has it.
//!
//! Overlap holds only while every live request can take its next token without the host:
//! no grammar (its mask needs the token), no prompt logprobs, no beam search, no speculative
//! decoding, no step timeline being recorded. Any of them present, the engine answers the
//! launched step first and plans the next one from the result, as without overlap.

use tandem_model::batch::{CarriedToken, ForwardBatch};
use tandem_model::row_sampling::RowDraw;
use tandem_model::ModelError;

use super::sampling::reported;
use super::{Engine, EngineEvent};
use crate::error::Result;
use crate::sequence::SeqMap;
use crate::step_plan::{to_forward_batch, StepPlan};

/// A step launched on the runner and not answered yet.
#[derive(Debug)]
pub(super) struct Launched {
    plan: StepPlan,
    /// How each output row is chosen (one per row, in order).
    rows: Vec<RowDraw>,
}

impl Engine {
    /// Turns overlapped steps on or off (on by default; they happen only with a runner that
    /// overlaps steps). Results do not depend on it. A step already launched is still
    /// answered by the next [`Engine::step`].
    pub fn set_overlap(&mut self, on: bool) {
        self.overlap = on;
    }

    /// Whether the step being planned may be launched and the next one planned before its
    /// result (see the module doc).
    pub(super) fn may_overlap(&self) -> bool {
        self.overlap
            && self.runner.overlaps_steps()
            && self.spec.is_none()
            && self.trace.is_none()
            && self.beams.is_empty()
            && self.prompt_logprobs.is_empty()
            && self.requests.values().all(|r| !r.state.is_constrained())
    }

    /// Launches `plan` (its block copies done) and keeps it to answer next step; returns the
    /// events of a failed launch.
    pub(super) fn launch_first(
        &mut self,
        plan: StepPlan,
        batch: &ForwardBatch,
        rows: Vec<RowDraw>,
    ) -> Vec<EngineEvent> {
        match self.runner.launch_sample(batch, &rows, &[]) {
            Ok(()) => {
                self.launched = Some(Launched { plan, rows });
                Vec::new()
            }
            Err(e) => self.fail_in_flight(&format!("forward pass failed: {e}")),
        }
    }

    /// One step while `launched` runs: plans and launches the next step ahead of its result
    /// when it can, then answers it.
    pub(super) fn step_overlapped(&mut self, launched: Launched) -> Result<Vec<EngineEvent>> {
        let mut out = Vec::new();
        let ahead = if self.may_overlap() {
            self.scheduler.schedule_ahead()?
        } else {
            None
        };
        let mut next = None;
        let mut ahead_failed = None;
        if let Some(plan) = ahead {
            out.extend(self.admitted_events(&plan));
            match self.launch_ahead(&plan, &launched.plan) {
                Ok(rows) => next = Some(Launched { plan, rows }),
                // Only the plan made ahead failed, unless `launch_sample` itself did: the
                // runner then dropped the older step too, whose collect fails below.
                Err(e) => ahead_failed = Some(format!("forward pass failed: {e}")),
            }
        }
        let picks = self.runner.collect_picks().and_then(|picks| {
            if picks.len() == launched.rows.len() {
                Ok(picks)
            } else {
                Err(ModelError::Batch(format!(
                    "the runner chose {} tokens for {} rows",
                    picks.len(),
                    launched.rows.len()
                )))
            }
        });
        if picks.is_err() && next.take().is_some() {
            // The step launched ahead read the older step's picks: it fails with it. A failed
            // collect dropped it already; picks of the wrong length did not, so the runner
            // is drained here and holds nothing the engine does not.
            let _ = self.runner.collect_picks();
        }
        self.launched = next;
        let samples = picks.map(|p| {
            let picks = reported(p);
            self.picked_samples(&launched.plan, &launched.rows, picks)
        });
        self.recycle_rows(launched.rows);
        out.extend(self.answer_step(launched.plan.step, samples, Vec::new())?);
        if let Some(message) = ahead_failed {
            // The older step is answered; the plan made ahead (still in flight) fails.
            out.extend(self.fail_in_flight(&message));
        }
        Ok(out)
    }

    /// Launches `plan`, planned ahead of `before` (still running), with its carried tokens
    /// read from `before`'s picks; returns its row draws.
    fn launch_ahead(
        &mut self,
        plan: &StepPlan,
        before: &StepPlan,
    ) -> std::result::Result<Vec<RowDraw>, ModelError> {
        self.runner.copy_blocks(&plan.block_copies)?;
        let rows = self.draw_rows(plan);
        let batch = to_forward_batch(plan);
        let carried = carried_tokens(plan, before, &batch)?;
        self.runner.launch_sample(&batch, &rows, &carried)?;
        Ok(rows)
    }

    /// `Admitted` events of a plan's first admissions.
    pub(super) fn admitted_events(&self, plan: &StepPlan) -> Vec<EngineEvent> {
        plan.first_admissions
            .iter()
            .filter(|(id, _)| self.requests.contains_key(id))
            .map(|&(seq_id, cached_tokens)| EngineEvent::Admitted {
                seq_id,
                cached_tokens,
            })
            .collect()
    }

    /// Fails every plan in flight (the runner holds none of them: it dropped them, or they
    /// were never launched).
    fn fail_in_flight(&mut self, message: &str) -> Vec<EngineEvent> {
        self.launched = None;
        let events = self.scheduler.fail_step(message);
        self.translate(events, SeqMap::default())
    }
}

/// Where `plan`'s carried tokens come from: the output row of their sequence in `before`.
fn carried_tokens(
    plan: &StepPlan,
    before: &StepPlan,
    batch: &ForwardBatch,
) -> std::result::Result<Vec<CarriedToken>, ModelError> {
    let output_of: SeqMap<usize> = before
        .seqs
        .iter()
        .filter(|s| s.num_output_rows > 0)
        .enumerate()
        .map(|(row, s)| (s.seq_id, row))
        .collect();
    plan.seqs
        .iter()
        .zip(&batch.seqs)
        .filter(|(s, _)| s.carries_pick)
        .map(|(s, span)| {
            let from_output = output_of.get(&s.seq_id).copied().ok_or_else(|| {
                ModelError::Batch(format!(
                    "{:?} carries a pick of a step without its row",
                    s.seq_id
                ))
            })?;
            Ok(CarriedToken {
                row: span.start,
                from_output,
            })
        })
        .collect()
}
