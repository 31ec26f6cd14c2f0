//! The continuous-batching scheduler (ARCHITECTURE.md § The engine step), after vLLM's v1 design:
//! no prefill or decode phase, one token budget per step.
//!
//! Each step [`Scheduler::schedule`] grants every running sequence (in order) up to
//! `min(num_tokens - num_computed_tokens, long_prefill_token_threshold, budget left)` new
//! tokens, leasing the KV blocks those tokens need. When the pool is dry it first drops the
//! sequence's speculative drafts (if any), then preempts by recompute the *last* running
//! sequence (the latest arrival under FCFS, the least urgent
//! under priority, since `running` is kept in that order): its blocks are freed, its
//! `num_computed_tokens` reset to 0, and it is queued again ahead of its peers. If nobody was
//! preempted, waiting sequences are then admitted in order while budget, blocks and the
//! sequence cap allow; waiting sequences never cause preemption.
//!
//! Invariants:
//! - waiting and preempted sequences own no blocks;
//! - a running sequence's table holds exactly the blocks for its computed tokens (plus, during
//!   a step, those granted);
//! - since the victim is always the last running sequence, a sequence already granted tokens
//!   this step is never preempted, and the first running sequence always makes progress
//!   (a sequence alone always fits the pool: see `SchedulerConfig::max_seq_len`).
//!
//! Groups (see `scheduler/groups.rs`): an `n > 1` request is one sequence until its prompt's
//! logits come back; [`Scheduler::update`] then forks it into its siblings, which share the
//! prompt's blocks by refcount. A *managed* sequence (a beam) is computed like any other, but
//! its owner appends its tokens ([`Scheduler::fork_managed`]); once its logits are out it has
//! nothing to compute and is *parked* (skipped) until its owner forks or releases it; a
//! parked sequence may be preempted (also to admit a waiting one) and is then not requeued. A write
//! into a block with other holders first copies the block (copy-on-write): the plan lists
//! those copies in [`StepPlan::block_copies`].
//!
//! [`Scheduler::update`] then applies the runner's sampled tokens: it advances
//! `num_computed_tokens`, appends tokens, applies the stop conditions and releases the blocks
//! of finished sequences.

use std::collections::{BTreeSet, VecDeque};

use tandem_model::batch::{AdapterId, BlockId, TokenId};

use crate::block_allocator::BlockAllocator;
use crate::block_table::BlockTable;
use crate::error::{EngineError, Result};
use crate::prefix_cache::PrefixHasher;
use crate::scheduler_config::SchedulerConfig;
use crate::sequence::{
    FinishReason, RequestParams, SchedulingPolicy, SeqId, SeqMap, SeqStatus, Sequence,
};
use crate::step_plan::{ScheduledSeq, StepPlan};

/// Counters over the scheduler's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SchedulerStats {
    /// Non-empty plans handed out.
    pub num_steps: u64,
    /// Recompute preemptions.
    pub num_preemptions: u64,
    /// Tokens looked up in the prefix cache at admissions (`vllm:prefix_cache_queries`).
    pub prefix_cache_queries: u64,
    /// Of those, tokens found cached (`vllm:prefix_cache_hits`).
    pub prefix_cache_hits: u64,
    /// Plans made ahead of the previous step's result ([`Scheduler::schedule_ahead`]).
    pub num_planned_ahead: u64,
}

/// One sequence's grant in the step in flight.
#[derive(Debug, Clone)]
struct Grant {
    seq_id: SeqId,
    num_new: usize,
    num_output_rows: usize,
    /// Pending siblings of an `n > 1` group whose prompt completes in this grant: they are
    /// forked from it in `update` and sample from the same logits row.
    siblings: Vec<SeqId>,
}

/// A plan handed out and not yet answered.
#[derive(Debug)]
struct InFlight {
    step: u64,
    grants: Vec<Grant>,
}

/// Plans every engine step; owns the sequences and the block pool.
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    allocator: BlockAllocator,
    /// Every live (not finished) sequence.
    seqs: SeqMap<Sequence>,
    /// Waiting and preempted sequences, in admission order.
    waiting: VecDeque<SeqId>,
    /// Running sequences, in service order (FCFS: admission order; priority: by key).
    running: Vec<SeqId>,
    next_seq: u64,
    next_step: u64,
    /// Plans handed out and not yet answered, oldest first: one, or two while a step is
    /// planned ahead of the one running (see `scheduler/ahead.rs`).
    in_flight: VecDeque<InFlight>,
    stats: SchedulerStats,
    /// `n > 1` group parent -> sibling ids reserved for it and not forked yet.
    pending: SeqMap<Vec<SeqId>>,
    /// Running slots a managed root needs at admission (its beam width).
    reserve: SeqMap<usize>,
    /// Block keys for the prefix cache; `None` when it is off.
    prefix_hasher: Option<PrefixHasher>,
}

impl Scheduler {
    /// A scheduler with an empty pool of `config.num_blocks` blocks.
    pub fn new(config: SchedulerConfig) -> Result<Scheduler> {
        config.validate()?;
        let allocator = BlockAllocator::new(config.num_blocks, config.block_size)?;
        let prefix_hasher = config.enable_prefix_caching.then(|| PrefixHasher::new(0));
        Ok(Scheduler {
            config,
            allocator,
            seqs: SeqMap::default(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            next_seq: 0,
            next_step: 0,
            in_flight: VecDeque::new(),
            stats: SchedulerStats::default(),
            pending: SeqMap::default(),
            reserve: SeqMap::default(),
            prefix_hasher,
        })
    }

    /// Sets the model identity the prefix cache's keys start from (cached blocks of another
    /// model can then never match). Forgets what is cached.
    pub fn set_model_identity(&mut self, model_identity: u64) {
        if self.prefix_hasher.is_some() {
            self.prefix_hasher = Some(PrefixHasher::new(model_identity));
            self.reset_prefix_cache();
        }
    }

    /// The configuration.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// The block pool (for accounting checks).
    pub fn allocator(&self) -> &BlockAllocator {
        &self.allocator
    }

    /// Life-time counters.
    pub fn stats(&self) -> SchedulerStats {
        self.stats
    }

    /// A live sequence.
    pub fn sequence(&self, id: SeqId) -> Option<&Sequence> {
        self.seqs.get(&id)
    }

    /// Sequences waiting (fresh or preempted).
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Sequences running.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// The distinct LoRA adapters of the running sequences and of the waiting ones.
    pub fn adapters_in_use(&self) -> [BTreeSet<AdapterId>; 2] {
        let of = |ids: &mut dyn Iterator<Item = &SeqId>| {
            ids.filter_map(|id| self.seqs.get(id)?.params().adapter)
                .collect()
        };
        [of(&mut self.running.iter()), of(&mut self.waiting.iter())]
    }

    /// Whether a live sequence runs with adapter `id`.
    pub fn uses_adapter(&self, id: AdapterId) -> bool {
        self.seqs.values().any(|s| s.params().adapter == Some(id))
    }

    /// True while any sequence is live.
    pub fn has_unfinished(&self) -> bool {
        !self.seqs.is_empty()
    }

    /// Queues a request. Refuses, changing nothing, an empty prompt and a prompt that can never
    /// run: longer than `max_model_len` or needing more blocks than the whole pool. With
    /// `max_tokens == 0` only the prompt is computed (for its prompt logprobs): the sequence
    /// then finishes with `Length`, no token sampled.
    pub fn add_request(&mut self, prompt: Vec<TokenId>, params: RequestParams) -> Result<SeqId> {
        self.check_request(&prompt)?;
        Ok(self.push_request(prompt, params, false))
    }

    /// The refusals of [`Scheduler::add_request`].
    fn check_request(&self, prompt: &[TokenId]) -> Result<()> {
        let len = prompt.len();
        if len == 0 {
            return Err(EngineError::EmptyPrompt);
        }
        if len > self.config.max_model_len {
            return Err(EngineError::PromptTooLong {
                len,
                max_model_len: self.config.max_model_len,
            });
        }
        let needed = len.div_ceil(self.config.block_size);
        if needed > self.config.num_blocks {
            return Err(EngineError::PromptExceedsPool {
                len,
                needed,
                total: self.config.num_blocks,
            });
        }
        Ok(())
    }

    /// Queues a checked request under a fresh id.
    fn push_request(
        &mut self,
        prompt: Vec<TokenId>,
        params: RequestParams,
        managed: bool,
    ) -> SeqId {
        let id = self.fresh_id();
        let table = BlockTable::new(self.allocator.clone());
        let mut seq = Sequence::new(id, prompt, params, table);
        if managed {
            seq.set_managed();
        }
        self.seqs.insert(id, seq);
        self.enqueue_waiting(id, false);
        id
    }

    /// The next sequence id.
    fn fresh_id(&mut self) -> SeqId {
        let id = SeqId(self.next_seq);
        self.next_seq += 1;
        id
    }

    /// Ends a live sequence at once and frees its blocks. A step in flight ignores it.
    pub fn abort(&mut self, id: SeqId) -> Result<()> {
        self.finish_early(id, FinishReason::Abort)
    }

    /// Ends a live sequence at once with `reason` (an abort, or an error found by the runner
    /// for this sequence alone) and frees its blocks. A step in flight ignores it.
    ///
    /// A pending sibling of an `n > 1` group is simply dropped from its group; ending a
    /// group's parent before its prompt is computed ends its pending siblings with it.
    pub fn finish_early(&mut self, id: SeqId, reason: FinishReason) -> Result<()> {
        if self.drop_pending_sibling(id) {
            return Ok(());
        }
        if !self.seqs.contains_key(&id) {
            return Err(EngineError::UnknownSeq(id));
        }
        self.finish(id, reason);
        Ok(())
    }

    /// Appends speculative draft tokens to a running sequence without drafts, to be verified
    /// next step (as many as fit `max_seq_len`). Drafts that do not fit a step's grant are
    /// rolled back; a preempted sequence loses its drafts.
    pub fn add_drafts(&mut self, id: SeqId, drafts: &[TokenId]) -> Result<()> {
        if let Some(f) = self.in_flight.front() {
            return Err(EngineError::StepInFlight(f.step));
        }
        let max_len = self.config.max_seq_len();
        let seq = self.seqs.get_mut(&id).ok_or(EngineError::UnknownSeq(id))?;
        if seq.status() != &SeqStatus::Running || seq.num_draft() > 0 {
            return Err(EngineError::InvalidParams(format!(
                "{id:?} must be running without drafts to take drafts"
            )));
        }
        let room = max_len.saturating_sub(seq.num_tokens());
        seq.append_draft(&drafts[..drafts.len().min(room)]);
        Ok(())
    }

    /// Plans the next step. Errors if the previous plan has not been answered. A non-empty
    /// plan is in flight until [`Scheduler::update`] or [`Scheduler::fail_step`]; an empty
    /// plan (nothing to run) needs no answer.
    pub fn schedule(&mut self) -> Result<StepPlan> {
        if let Some(f) = self.in_flight.front() {
            return Err(EngineError::StepInFlight(f.step));
        }
        let mut budget = self.config.max_num_batched_tokens;
        let mut grants = Vec::new();
        let mut preempted = Vec::new();
        let mut block_copies = Vec::new();
        let mut first_admissions = Vec::new();
        self.schedule_running(&mut budget, &mut grants, &mut preempted, &mut block_copies);
        if preempted.is_empty() {
            let mut admitted = Admitted {
                grants: &mut grants,
                copies: &mut block_copies,
                preempted: &mut preempted,
                first: &mut first_admissions,
                stop_at_groups: false,
            };
            self.schedule_waiting(&mut budget, &mut admitted);
        }
        let step = self.next_step;
        let seqs = grants.iter().map(|g| self.scheduled_seq(g)).collect();
        if !grants.is_empty() {
            self.next_step += 1;
            self.stats.num_steps += 1;
            self.in_flight.push_back(InFlight { step, grants });
        }
        Ok(StepPlan {
            step,
            seqs,
            preempted,
            block_copies,
            first_admissions,
        })
    }

    /// Grants tokens to running sequences in order (skipping parked ones), preempting from
    /// the back when blocks run out.
    fn schedule_running(
        &mut self,
        budget: &mut usize,
        grants: &mut Vec<Grant>,
        preempted: &mut Vec<SeqId>,
        copies: &mut Vec<(BlockId, BlockId)>,
    ) {
        let mut i = 0;
        while i < self.running.len() && *budget > 0 {
            let id = self.running[i];
            if self.seqs[&id].num_uncomputed() == 0 {
                i += 1; // parked: a managed sequence waiting for its owner
                continue;
            }
            let mut num_new = self.grant_size(id, *budget);
            loop {
                if let Some(c) = self.prepare_write(id, num_new) {
                    copies.extend(c);
                    grants.push(self.grant(id, num_new));
                    *budget -= num_new;
                    i += 1;
                    break;
                }
                if let Some(n) = self.drop_drafts(id, num_new) {
                    num_new = n; // speculation never preempts: its drafts go first
                    continue;
                }
                // The victim is last in service order, so never an already granted sequence.
                let victim = self.running.pop().expect("the current sequence is running");
                self.preempt(victim);
                preempted.push(victim);
                if victim == id {
                    break;
                }
            }
        }
    }

    /// Admits waiting sequences in order while budget, blocks and the sequence cap allow
    /// (a group's parent needs a running slot for each of its members). A sequence holding
    /// no block first adopts its cached prefix blocks; one whose prefix a running sequence
    /// is computing right now waits for it (see `scheduler/prefix.rs`).
    fn schedule_waiting(&mut self, budget: &mut usize, out: &mut Admitted<'_>) {
        while *budget > 0 {
            let Some(&id) = self.waiting.front() else {
                break;
            };
            if out.stop_at_groups && self.pending.contains_key(&id) {
                break; // admitted by a plan made on the host's result
            }
            if self.prefix_in_flight(id) {
                // Its prefix is being computed: it is admitted once that is cached, and
                // nobody behind it overtakes it meanwhile.
                break;
            }
            let fits = self.running.len() + self.slots_needed(id) <= self.config.max_num_seqs;
            let hit = if fits { self.lookup_prefix(id) } else { 0 };
            let num_new = self.grant_size(id, *budget);
            let Some(c) = fits.then(|| self.prepare_write(id, num_new)).flatten() else {
                self.seq_mut(id).release_cached();
                if self.evict_parked(out.preempted) {
                    continue;
                }
                break;
            };
            out.copies.extend(c);
            let first = self.seqs[&id].prefix().num_cached_tokens.is_none();
            self.count_lookup(id, hit);
            if first && self.prefix_hasher.is_some() {
                out.first.push((id, hit.min(self.seqs[&id].prompt_len())));
            }
            self.seq_mut(id).set_status(SeqStatus::Running);
            self.waiting.pop_front();
            self.insert_running(id);
            out.grants.push(self.grant(id, num_new));
            *budget -= num_new;
        }
    }

    /// Tokens to grant `id` this step (at least 1 while budget is left), after dropping the
    /// speculative drafts that would not fit.
    fn grant_size(&mut self, id: SeqId, budget: usize) -> usize {
        let threshold = self.config.long_prefill_token_threshold;
        let seq = self.seq_mut(id);
        let mut n = seq.num_uncomputed().min(threshold).min(budget);
        let end = seq.num_computed_tokens() + n;
        if seq.num_draft() > 0 && end < seq.num_tokens() {
            // Drafts past the grant cannot be verified this step: roll them back.
            let committed = seq.num_tokens() - seq.num_draft();
            seq.rollback_to(end.max(committed));
            n = seq.num_uncomputed().min(n);
        }
        assert!(n > 0, "a live sequence always has an uncomputed token");
        n
    }

    /// Leases the blocks for `num_new` more tokens of `id` and unshares those it will write
    /// into; `None` (and no change) when the pool is dry.
    fn prepare_write(&mut self, id: SeqId, num_new: usize) -> Option<Vec<(BlockId, BlockId)>> {
        let seq = self.seq_mut(id);
        let start = seq.num_computed_tokens();
        seq.block_table_mut()
            .prepare_write(start, start + num_new)
            .ok()
    }

    fn grant(&self, id: SeqId, num_new: usize) -> Grant {
        let seq = &self.seqs[&id];
        let reaches_end = seq.num_computed_tokens() + num_new == seq.num_tokens();
        let siblings = match self.pending.get(&id) {
            Some(s) if reaches_end => s.clone(),
            _ => Vec::new(),
        };
        Grant {
            seq_id: id,
            num_new,
            num_output_rows: if reaches_end && seq.params().max_tokens > 0 {
                1 + seq.num_draft()
            } else {
                0
            },
            siblings,
        }
    }

    fn scheduled_seq(&self, g: &Grant) -> ScheduledSeq {
        let seq = &self.seqs[&g.seq_id];
        let start = seq.num_computed_tokens();
        ScheduledSeq {
            seq_id: g.seq_id,
            num_computed: start,
            tokens: seq.tokens()[start..start + g.num_new].to_vec(),
            block_table: seq.block_table().blocks().to_vec(),
            num_output_rows: g.num_output_rows,
            carries_pick: false,
            adapter: seq.params().adapter,
        }
    }

    /// Recompute preemption of a sequence already removed from `running`. A parked managed
    /// sequence is not queued again: its owner has its logits and will fork it (the children
    /// recompute) or release it.
    fn preempt(&mut self, id: SeqId) {
        let seq = self.seq_mut(id);
        let parked = seq.is_managed() && seq.num_uncomputed() == 0;
        seq.preempt();
        self.stats.num_preemptions += 1;
        if !parked {
            self.enqueue_waiting(id, true);
        }
    }

    /// Preempts the last parked running sequence, if any, to make room for a waiting one
    /// (parked sequences would otherwise hold the pool while waiting on sequences that
    /// cannot be admitted).
    fn evict_parked(&mut self, preempted: &mut Vec<SeqId>) -> bool {
        let parked = self
            .running
            .iter()
            .rposition(|id| self.seqs[id].num_uncomputed() == 0);
        let Some(at) = parked else {
            return false;
        };
        let id = self.running.remove(at);
        self.preempt(id);
        preempted.push(id);
        true
    }

    /// Queues `id`: under FCFS at the back, or at the front when it was preempted; under
    /// priority by (priority, arrival).
    fn enqueue_waiting(&mut self, id: SeqId, preempted: bool) {
        match self.config.policy {
            SchedulingPolicy::Fcfs if preempted => self.waiting.push_front(id),
            SchedulingPolicy::Fcfs => self.waiting.push_back(id),
            SchedulingPolicy::Priority => {
                let key = self.key(id);
                let at = self.waiting.partition_point(|&w| self.key(w) < key);
                self.waiting.insert(at, id);
            }
        }
    }

    fn insert_running(&mut self, id: SeqId) {
        match self.config.policy {
            SchedulingPolicy::Fcfs => self.running.push(id),
            SchedulingPolicy::Priority => {
                let key = self.key(id);
                let at = self.running.partition_point(|&r| self.key(r) < key);
                self.running.insert(at, id);
            }
        }
    }

    /// Service order under priority: smaller priority value first, then earlier arrival.
    fn key(&self, id: SeqId) -> (i32, SeqId) {
        (self.seqs[&id].params().priority, id)
    }

    fn seq_mut(&mut self, id: SeqId) -> &mut Sequence {
        self.seqs
            .get_mut(&id)
            .expect("queued sequence ids are live")
    }

    /// Removes a sequence everywhere, releasing its blocks, with its pending siblings.
    fn finish(&mut self, id: SeqId, reason: FinishReason) {
        self.pending.remove(&id);
        self.reserve.remove(&id);
        if let Some(mut seq) = self.seqs.remove(&id) {
            seq.set_status(SeqStatus::Finished(reason));
            self.running.retain(|&r| r != id);
            self.waiting.retain(|&w| w != id);
        }
    }
}

/// Where admissions of one `schedule` call go.
struct Admitted<'a> {
    grants: &'a mut Vec<Grant>,
    copies: &'a mut Vec<(BlockId, BlockId)>,
    preempted: &'a mut Vec<SeqId>,
    /// First admissions with the prefix cache on, with their cached prompt tokens.
    first: &'a mut Vec<(SeqId, usize)>,
    /// Admission stops at a group waiting for its fork (a plan made ahead: the fork needs
    /// the shared row on the host; see `scheduler/ahead.rs`).
    stop_at_groups: bool,
}

mod ahead;
mod drafts;
mod groups;
mod prefix;
mod prefix_transfer;

pub(crate) use prefix::adoptable_blocks;
pub use prefix_transfer::CacheScope;
mod update;
