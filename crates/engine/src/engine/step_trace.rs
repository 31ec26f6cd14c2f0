//! The engine's side of the step timeline (see [`crate::trace`]): what a step planned, how long
//! its parts took, and what happened to each request, handed to the recorder when one is on.

use crate::sequence::{FinishReason, SeqId};
use crate::step_plan::StepPlan;
use crate::trace::{MarkKind, SeqSlice, StepClock, StepCounters, StepTrace, Work};

use super::{Engine, EngineEvent};

impl Engine {
    /// Starts recording the step timeline, keeping the last `capacity` steps.
    pub fn enable_trace(&mut self, capacity: usize) {
        self.trace = Some(Box::new(StepTrace::new(capacity)));
    }

    /// The step timeline, when recording.
    pub fn trace(&self) -> Option<&StepTrace> {
        self.trace.as_deref()
    }

    /// The step timeline, when recording (callers add the detokenize part).
    pub fn trace_mut(&mut self) -> Option<&mut StepTrace> {
        self.trace.as_deref_mut()
    }

    /// A clock for the next step: on only while recording.
    pub(super) fn step_clock(&self) -> StepClock {
        StepClock::new(self.trace.is_some())
    }

    /// Marks requests in the timeline (no-op when not recording).
    pub(super) fn trace_marks(&mut self, ids: &[SeqId], kind: MarkKind) {
        if let Some(t) = self.trace.as_mut() {
            for &id in ids {
                t.mark(id, kind.clone());
            }
        }
    }

    /// Each scheduled sequence's share of `plan`, while its sequences are all live: prefill
    /// while its prompt is not fully computed, decode after. `None` when not recording.
    pub(super) fn trace_plan(&self, plan: &StepPlan) -> Option<Vec<SeqSlice>> {
        self.trace.as_ref()?;
        let slices = plan.seqs.iter().map(|s| {
            let prompt_len = self.scheduler.sequence(s.seq_id).map(|q| q.prompt_len());
            SeqSlice {
                seq_id: s.seq_id,
                work: match prompt_len {
                    Some(p) if s.num_computed < p => Work::Prefill,
                    _ => Work::Decode,
                },
                tokens: s.len(),
            }
        });
        Some(slices.collect())
    }

    /// Hands the finished step to the recorder (no-op when not recording).
    pub(super) fn record_step(
        &mut self,
        plan: &StepPlan,
        clock: &StepClock,
        slices: Option<Vec<SeqSlice>>,
        events: &[EngineEvent],
    ) {
        let (Some(trace), Some(slices)) = (self.trace.as_mut(), slices) else {
            return;
        };
        let mut during: Vec<(SeqId, MarkKind)> = plan
            .preempted
            .iter()
            .map(|&id| (id, MarkKind::Preempted))
            .collect();
        during.extend(events.iter().filter_map(|e| match e {
            EngineEvent::Finished { seq_id, reason } => {
                Some((*seq_id, MarkKind::Finished(reason_word(reason).into())))
            }
            _ => None,
        }));
        let pool = self.scheduler.allocator();
        let counters = StepCounters {
            running: self.scheduler.num_running(),
            waiting: self.scheduler.num_waiting(),
            kv_blocks_in_use: pool.num_total() - pool.num_free(),
            kv_blocks_cached: pool.num_registered(),
        };
        trace.record(plan.step, clock, slices, counters, during);
    }
}

fn reason_word(r: &FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Abort => "abort",
        FinishReason::Error(_) => "error",
        FinishReason::Refused(_) => "refused",
    }
}
