//! Which sequences may take speculative drafts this step (see [`Scheduler::add_drafts`]).

use super::Scheduler;
use crate::sequence::SeqId;

impl Scheduler {
    /// Running sequences, in service order, that are decoding with nothing pending: exactly
    /// one uncomputed token (the last sampled one), no drafts, not managed (beams), and not
    /// an `n > 1` parent whose siblings are still to fork.
    pub fn draft_candidates(&self) -> Vec<SeqId> {
        self.running
            .iter()
            .copied()
            .filter(|id| {
                let s = &self.seqs[id];
                s.num_uncomputed() == 1
                    && s.num_draft() == 0
                    && !s.is_managed()
                    && !self.pending.contains_key(id)
            })
            .collect()
    }

    /// Rolls back `id`'s drafts when it has any (the pool cannot hold them): returns the
    /// grant that remains of `num_new`, or `None` when there were no drafts.
    pub(super) fn drop_drafts(&mut self, id: SeqId, num_new: usize) -> Option<usize> {
        let seq = self.seq_mut(id);
        if seq.num_draft() == 0 {
            return None;
        }
        seq.rollback_to(seq.num_tokens() - seq.num_draft());
        Some(seq.num_uncomputed().min(num_new))
    }
}

#[cfg(test)]
mod tests {
    use tandem_model::batch::TokenId;

    use crate::scheduler_config::SchedulerConfig;
    use crate::sequence::RequestParams;
    use crate::step_plan::{SeqOutput, StepResult};
    use crate::Scheduler;

    #[test]
    fn drafts_that_do_not_fit_the_pool_are_dropped_before_anyone_is_preempted() {
        // Two sequences of 3 prompt tokens, blocks of 4, a pool of 2 blocks: their next
        // token fits, drafts past position 3 would need a third block.
        let mut s = Scheduler::new(SchedulerConfig::new(2, 4, 64)).expect("config");
        let p = RequestParams::default();
        let a = s.add_request(vec![TokenId(1); 3], p.clone()).expect("fits");
        let b = s.add_request(vec![TokenId(2); 3], p).expect("fits");
        let plan = s.schedule().expect("plan");
        let outputs = [a, b]
            .iter()
            .map(|&seq_id| SeqOutput {
                seq_id,
                tokens: vec![TokenId(5)],
            })
            .collect();
        s.update(&StepResult {
            step: plan.step,
            outputs,
        })
        .expect("answers the plan");
        assert_eq!(s.draft_candidates(), vec![a, b]);
        s.add_drafts(a, &[TokenId(6), TokenId(7)]).expect("running");
        let plan = s.schedule().expect("plan");
        assert!(plan.preempted.is_empty(), "nobody is preempted for drafts");
        assert_eq!(plan.seqs.len(), 2);
        assert!(plan
            .seqs
            .iter()
            .all(|x| x.len() == 1 && x.num_output_rows == 1));
        assert_eq!(s.sequence(a).expect("live").num_draft(), 0);
    }
}
