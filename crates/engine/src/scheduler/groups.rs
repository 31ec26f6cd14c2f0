//! Sequence groups: `n > 1` parallel samples of one prompt, and managed sequences (beams).
//!
//! An `n > 1` group is queued as one sequence (the *parent*, the group's first id) plus
//! `n - 1` reserved sibling ids. The prompt is computed once. In the `update` of the step that
//! produced the prompt's logits, the parent is forked into its siblings before any token is
//! appended: each sibling is a copy of the parent whose block table shares every prompt block
//! (refcount `n`); a partial last block is copied by the first sibling that writes into it
//! ([`crate::block_table::BlockTable::prepare_write`]). From then on the siblings are
//! ordinary, independent sequences (preempted, recomputed and finished on their own).
//!
//! A managed sequence is computed like any other but never gets tokens from `update`; its
//! owner (the engine's beam search) extends it by forking it with one more token
//! ([`Scheduler::fork_managed`]) and releases it with [`Scheduler::finish_early`].

use tandem_model::batch::TokenId;

use super::Scheduler;
use crate::error::{EngineError, Result};
use crate::sequence::{RequestParams, SeqId, SeqStatus};

impl Scheduler {
    /// Queues an `n > 1` group: returns its `n` ids, the parent first. Refuses what
    /// [`Scheduler::add_request`] refuses, `n == 0`, and `n > max_num_seqs` (the group could
    /// never be admitted: its parent needs a running slot for every member).
    pub fn add_group(
        &mut self,
        prompt: Vec<TokenId>,
        params: RequestParams,
        n: usize,
    ) -> Result<Vec<SeqId>> {
        self.check_request(&prompt)?;
        self.check_width("n", n)?;
        if n > 1 && params.max_tokens == 0 {
            return Err(EngineError::InvalidParams(
                "n > 1 needs max_tokens of at least 1".into(),
            ));
        }
        let parent = self.push_request(prompt, params, false);
        let siblings: Vec<SeqId> = (1..n).map(|_| self.fresh_id()).collect();
        let mut ids = vec![parent];
        ids.extend_from_slice(&siblings);
        if !siblings.is_empty() {
            self.pending.insert(parent, siblings);
        }
        Ok(ids)
    }

    /// Queues a managed sequence (the root of a beam search of `width` beams, admitted only
    /// when `width` running slots are free).
    pub fn add_managed(
        &mut self,
        prompt: Vec<TokenId>,
        params: RequestParams,
        width: usize,
    ) -> Result<SeqId> {
        self.check_request(&prompt)?;
        self.check_width("beam width", width)?;
        if params.max_tokens == 0 {
            return Err(EngineError::InvalidParams(
                "beam search needs max_tokens of at least 1".into(),
            ));
        }
        let id = self.push_request(prompt, params, true);
        self.reserve.insert(id, width);
        Ok(id)
    }

    fn check_width(&self, name: &str, n: usize) -> Result<()> {
        let max = self.config.max_num_seqs;
        if n == 0 || n > max {
            return Err(EngineError::InvalidParams(format!(
                "{name} must be between 1 and max_num_seqs ({max}), got {n}"
            )));
        }
        Ok(())
    }

    /// The siblings `id` will fork into when its prompt's logits come back (empty for an
    /// ordinary sequence or a group already forked).
    pub fn pending_siblings(&self, id: SeqId) -> &[SeqId] {
        self.pending.get(&id).map_or(&[], Vec::as_slice)
    }

    /// A new managed sequence: a copy of the managed sequence `parent` (tokens, computed
    /// progress, shared blocks, status) with `token` appended as one more output token. A
    /// running parent gives a running child, a preempted one a preempted child. The parent
    /// must have no uncomputed tokens unless preempted.
    pub fn fork_managed(&mut self, parent: SeqId, token: TokenId) -> Result<SeqId> {
        if let Some(f) = self.in_flight.front() {
            return Err(EngineError::StepInFlight(f.step));
        }
        let seq = self
            .seqs
            .get(&parent)
            .ok_or(EngineError::UnknownSeq(parent))?;
        let running = seq.status() == &SeqStatus::Running;
        if !seq.is_managed() || (running && seq.num_uncomputed() > 0) {
            return Err(EngineError::InvalidParams(format!(
                "{parent:?} must be a managed sequence whose tokens are all computed"
            )));
        }
        let id = SeqId(self.next_seq);
        let mut child = seq.fork(id);
        self.next_seq += 1;
        child.append_output(token);
        self.seqs.insert(id, child);
        if running {
            self.insert_running(id);
        } else {
            self.enqueue_waiting(id, true);
        }
        Ok(id)
    }

    /// Running slots `id` needs to be admitted: one per member of its group.
    pub(super) fn slots_needed(&self, id: SeqId) -> usize {
        let group = 1 + self.pending_siblings(id).len();
        group.max(self.reserve.get(&id).copied().unwrap_or(1))
    }

    /// Forks the pending siblings of `parent` (called in `update` once its prompt is
    /// computed, before its first token is appended); returns them in order.
    pub(super) fn spawn_siblings(&mut self, parent: SeqId) -> Vec<SeqId> {
        let Some(siblings) = self.pending.remove(&parent) else {
            return Vec::new();
        };
        for &id in &siblings {
            let child = self.seqs[&parent].fork(id);
            self.seqs.insert(id, child);
            self.insert_running(id);
        }
        siblings
    }

    /// Removes `id` from its parent's pending siblings; false if it is not pending.
    pub(super) fn drop_pending_sibling(&mut self, id: SeqId) -> bool {
        let found = self.pending.values_mut().any(|siblings| {
            let before = siblings.len();
            siblings.retain(|&s| s != id);
            siblings.len() < before
        });
        self.pending.retain(|_, siblings| !siblings.is_empty());
        found
    }
}
