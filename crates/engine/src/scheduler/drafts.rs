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
}
