//! Planning a step ahead: the plan of step n+1 made while step n runs on the device, so that
//! the device does not wait for the host between steps (what vLLM calls async scheduling).
//!
//! The sequences step n samples for take their next token from step n's pick, which the host
//! does not know yet: the plan grants each of them one *carried* token
//! ([`ScheduledSeq::carries_pick`]), a placeholder the runner replaces by the pick where the
//! picks are, at the position step n's token will occupy. Everything else is planned as
//! [`Scheduler::schedule`] plans it, from the state step n leaves behind (its grants counted
//! as computed). The rules that keep the scheduler's invariants:
//!
//! - Only one plan may be in flight, it must verify no drafts, no group waiting for its fork
//!   may be running or next in the queue, and no managed sequence may be live (those need
//!   their results on the host before anything follows them). Admission stops at a group
//!   further back in the queue: it is admitted once it is next, by a plan made from a
//!   result. So every row planned ahead is one sequence's only row.
//! - A sequence that step n's token finishes by length for certain (`max_tokens`, the longest
//!   sequence the engine holds) gets no carried token. One that a stop token finishes, which
//!   nobody can foresee, has its carried row computed and thrown away: [`Scheduler::update`]
//!   skips a grant whose sequence has ended (as it skips an aborted one), and step n's
//!   result released its blocks. The device runs steps in order, so the discarded row's KV
//!   write lands before any later plan reuses those blocks, and it never touches a block the
//!   prefix cache holds: only blocks full of computed tokens are registered, and the carried
//!   position lies past them.
//! - Nothing is preempted: when the pool cannot hold a grant, planning stops there and the
//!   sequences after it wait for a later step, waiting ones included (as `schedule` admits
//!   nobody once it preempted). Nothing planned ahead is ever undone.
//! - Otherwise waiting sequences are admitted as usual: their tokens are known.

use tandem_model::batch::{BlockId, TokenId};

use super::{Admitted, Grant, InFlight, Scheduler};
use crate::error::Result;
use crate::sequence::{SeqId, SeqMap, Sequence};
use crate::step_plan::{ScheduledSeq, StepPlan};

/// Where a running sequence's grant ahead starts, and whether its token is carried.
#[derive(Debug, Clone, Copy)]
struct AheadStart {
    start: usize,
    carried: bool,
}

/// The running sequences' grants planned ahead, in running order.
struct RunningAhead {
    grants: Vec<Grant>,
    starts: SeqMap<AheadStart>,
    /// Copy-on-write block copies the grants need.
    copies: Vec<(BlockId, BlockId)>,
    /// The step's token budget left.
    budget: usize,
    /// The pool could not hold a grant: planning stopped there (nothing is preempted).
    short: bool,
}

impl Scheduler {
    /// Plans the step after the one in flight, before its result is known (see the module
    /// doc). `None`, with nothing changed, when it cannot: no plan or two plans in flight, a
    /// plan in flight that forks or verifies drafts, a group waiting for its fork running or
    /// next in the queue, a managed sequence live, or nothing to grant without preempting.
    /// A plan is then in flight behind the first; results answer them in order.
    pub fn schedule_ahead(&mut self) -> Result<Option<StepPlan>> {
        let Some(flight) = self.in_flight.front() else {
            return Ok(None);
        };
        if self.in_flight.len() > 1 || !self.can_plan_after(flight) {
            return Ok(None);
        }
        let RunningAhead {
            mut grants,
            starts,
            mut copies,
            mut budget,
            short,
        } = self.grant_running_ahead();
        let mut preempted = Vec::new();
        let mut first_admissions = Vec::new();
        let mut admitted = Admitted {
            grants: &mut grants,
            copies: &mut copies,
            preempted: &mut preempted,
            first: &mut first_admissions,
            stop_at_groups: true,
        };
        if !short {
            // As `schedule` admits nobody once it preempted: the blocks a running sequence
            // is short of are not handed to a waiting one.
            self.schedule_waiting(&mut budget, &mut admitted);
        }
        if grants.is_empty() {
            return Ok(None);
        }
        let seqs = grants
            .iter()
            .map(|g| match starts.get(&g.seq_id) {
                Some(&s) => self.scheduled_ahead(g, s),
                None => self.scheduled_seq(g),
            })
            .collect();
        let step = self.next_step;
        self.next_step += 1;
        self.stats.num_steps += 1;
        self.stats.num_planned_ahead += 1;
        self.in_flight.push_back(InFlight { step, grants });
        Ok(Some(StepPlan {
            step,
            seqs,
            preempted,
            block_copies: copies,
            first_admissions,
        }))
    }

    /// Whether a step may be planned behind `flight` before its result: no group waiting
    /// for its fork is running or next in the queue (the fork needs the shared row on the
    /// host: such a group is planned from a result; one further back only stops admission,
    /// see `schedule_waiting`) and no managed sequence lives.
    fn can_plan_after(&self, flight: &InFlight) -> bool {
        let plain = |g: &Grant| g.siblings.is_empty() && g.num_output_rows <= 1;
        let next_waiting = self.waiting.front();
        let group_due = self
            .pending
            .keys()
            .any(|p| self.running.contains(p) || next_waiting == Some(p));
        flight.grants.iter().all(plain)
            && !group_due
            && !self.seqs.values().any(Sequence::is_managed)
    }

    /// The grant of `num_new` tokens from `start` to running `id` (no group is pending).
    /// Grants every running sequence its next tokens as of the end of the plan in flight
    /// (one carried token for those it samples, else the rest of its prompt in chunks), in
    /// running order, until the budget or the pool runs out.
    fn grant_running_ahead(&mut self) -> RunningAhead {
        // Per granted sequence: tokens the plan in flight computes, and whether it samples.
        let granted: SeqMap<(usize, bool)> = self
            .in_flight
            .front()
            .map(|flight| {
                flight
                    .grants
                    .iter()
                    .map(|g| (g.seq_id, (g.num_new, g.num_output_rows == 1)))
                    .collect()
            })
            .unwrap_or_default();
        let mut out = RunningAhead {
            grants: Vec::new(),
            starts: SeqMap::default(),
            copies: Vec::new(),
            budget: self.config.max_num_batched_tokens,
            short: false,
        };
        for i in 0..self.running.len() {
            if out.budget == 0 {
                break;
            }
            let id = self.running[i];
            let seq = &self.seqs[&id];
            let (computing, samples) = granted.get(&id).copied().unwrap_or((0, false));
            let start = seq.num_computed_tokens() + computing;
            let (num_new, carried) = if samples {
                if finishes_by_length(self, seq) {
                    continue;
                }
                (1, true)
            } else {
                let left = seq.num_tokens() - start;
                if left == 0 {
                    continue;
                }
                let threshold = self.config.long_prefill_token_threshold;
                (left.min(threshold).min(out.budget), false)
            };
            let table = self.seq_mut(id).block_table_mut();
            let Ok(c) = table.prepare_write(start, start + num_new) else {
                out.short = true; // the pool is dry: no preemption ahead of a result
                break;
            };
            out.copies.extend(c);
            out.starts.insert(id, AheadStart { start, carried });
            out.grants
                .push(self.grant_ahead(id, start, num_new, carried));
            out.budget -= num_new;
        }
        out
    }

    fn grant_ahead(&self, id: SeqId, start: usize, num_new: usize, carried: bool) -> Grant {
        let seq = &self.seqs[&id];
        let reaches_end = carried || start + num_new == seq.num_tokens();
        Grant {
            seq_id: id,
            num_new,
            num_output_rows: usize::from(reaches_end && seq.params().max_tokens > 0),
            siblings: Vec::new(),
        }
    }

    fn scheduled_ahead(&self, g: &Grant, s: AheadStart) -> ScheduledSeq {
        let seq = &self.seqs[&g.seq_id];
        let tokens = if s.carried {
            vec![TokenId(0)]
        } else {
            seq.tokens()[s.start..s.start + g.num_new].to_vec()
        };
        ScheduledSeq {
            seq_id: g.seq_id,
            num_computed: s.start,
            tokens,
            block_table: seq.block_table().blocks().to_vec(),
            num_output_rows: g.num_output_rows,
            carries_pick: s.carried,
            adapter: seq.params().adapter,
        }
    }
}

/// Whether the token the plan in flight samples for `seq` ends it by length, whatever it is
/// (the length conditions of `update::stop_reason`).
fn finishes_by_length(s: &Scheduler, seq: &Sequence) -> bool {
    seq.output().len() + 1 >= seq.params().max_tokens
        || seq.num_tokens() + 1 >= s.config.max_seq_len()
}
