//! The scheduler's side of prefix caching (ARCHITECTURE.md § Prefix cache): a lookup when a
//! sequence is admitted and a registration when a step completes full blocks.
//!
//! - Lookup ([`Scheduler::lookup_prefix`]): for a sequence holding no block (fresh, or
//!   preempted and re-admitted), the longest run of leading full blocks of its committed
//!   tokens found in the cache is adopted (each block gains a holder, cached-free ones leave
//!   the free queue) and counts as computed; at least the last token is always left to
//!   compute, because its logits are needed. If the admission then fails, the blocks are
//!   released again.
//! - Registration ([`Scheduler::register_blocks`]): after a step, every block whose tokens
//!   are all computed and committed (never speculative drafts) is registered under its
//!   chained key, before a finish could release it.
//!
//! - Cache-aware admission ([`Scheduler::prefix_in_flight`]): a waiting sequence whose next
//!   uncached block is being computed right now by a running sequence (the same key, not yet
//!   complete) waits until that block is registered instead of computing it a second time —
//!   several continuations of one context submitted together share the context's prefill.
//!   Nobody behind it in the queue overtakes it meanwhile (admission order is kept), and it
//!   cannot starve: the running sequence is served first every step, so the block completes
//!   within a few steps (or the sequence leaves `running`, which ends the wait).
//!
//! The cache never changes results: a block's K/V are a function of the token ids up to its end,
//! which its chained key and the hit's token comparison pin down (ARCHITECTURE.md § Invariants, 4).

use super::Scheduler;
use crate::sequence::{SeqId, Sequence};

/// The most leading full blocks of `seq` the cache may supply: those of its committed
/// tokens (see [`adoptable_blocks`]).
fn max_cached_blocks(seq: &Sequence, block_size: usize) -> usize {
    adoptable_blocks(seq.num_tokens() - seq.num_draft(), block_size)
}

/// The most leading full blocks of `num_tokens` tokens the prefix cache may supply: all but
/// the last token's, which is always computed (its logits are needed).
pub(crate) fn adoptable_blocks(num_tokens: usize, block_size: usize) -> usize {
    num_tokens.saturating_sub(1) / block_size
}

impl Scheduler {
    /// Adopts the cached leading blocks of `id` if it holds no block yet; returns the tokens
    /// now counted as computed (a multiple of the block size, below its token count).
    pub(super) fn lookup_prefix(&mut self, id: SeqId) -> usize {
        let Some(hasher) = self.prefix_hasher.as_ref() else {
            return 0;
        };
        let bs = self.config.block_size;
        let Some(seq) = self.seqs.get_mut(&id) else {
            return 0;
        };
        if !seq.block_table().is_empty() || seq.num_computed_tokens() > 0 {
            return 0;
        }
        let max_blocks = max_cached_blocks(seq, bs);
        let root = seq.ensure_block_keys(hasher, bs, max_blocks);
        let mut hits = Vec::new();
        for i in 0..max_blocks {
            let (parent, key, tokens) = seq.keyed_block(root, i, bs);
            match self.allocator.acquire_cached(parent, key, tokens) {
                Some(block) => hits.push(block),
                None => break,
            }
        }
        let num_hit = hits.len() * bs;
        if num_hit > 0 {
            seq.adopt_cached(&hits, num_hit);
        }
        num_hit
    }

    /// Whether waiting `id`'s first block not in the cache is being computed by a running
    /// sequence right now (see the module doc). Computes `id`'s block keys once.
    pub(super) fn prefix_in_flight(&mut self, id: SeqId) -> bool {
        let Some(hasher) = self.prefix_hasher.as_ref() else {
            return false;
        };
        let bs = self.config.block_size;
        let Some(seq) = self.seqs.get_mut(&id) else {
            return false;
        };
        if !seq.block_table().is_empty() {
            return false;
        }
        let max_blocks = max_cached_blocks(seq, bs);
        let root = seq.ensure_block_keys(hasher, bs, max_blocks);
        let cached = (0..max_blocks)
            .take_while(|&i| {
                let (parent, key, tokens) = seq.keyed_block(root, i, bs);
                self.allocator.is_cached(parent, key, tokens)
            })
            .count();
        let next = seq.prefix().keys.get(cached).copied();
        let Some(next) = next else {
            return false; // fully cached (or nothing to share)
        };
        self.running.iter().any(|r| {
            let s = &self.seqs[r];
            s.num_computed_tokens() < (cached + 1) * bs
                && s.prefix().keys.get(cached) == Some(&next)
        })
    }

    /// Counts a successful admission's lookup: `hit` of the sequence's tokens were cached.
    pub(super) fn count_lookup(&mut self, id: SeqId, hit: usize) {
        if self.prefix_hasher.is_none() {
            return;
        }
        let Some(seq) = self.seqs.get_mut(&id) else {
            return;
        };
        self.stats.prefix_cache_queries += (seq.num_tokens() - seq.num_draft()) as u64;
        self.stats.prefix_cache_hits += hit as u64;
        let prompt_len = seq.prompt_len();
        let first = &mut seq.prefix_mut().num_cached_tokens;
        if first.is_none() {
            *first = Some(hit.min(prompt_len));
        }
    }

    /// Registers the blocks of `id` that are now full of computed, committed tokens.
    pub(super) fn register_blocks(&mut self, id: SeqId) {
        let Some(hasher) = self.prefix_hasher.as_ref() else {
            return;
        };
        let bs = self.config.block_size;
        let Some(seq) = self.seqs.get_mut(&id) else {
            return;
        };
        let full = seq.num_committed_computed() / bs;
        let from = seq.prefix().num_registered;
        if full <= from {
            return;
        }
        let root = seq.ensure_block_keys(hasher, bs, full);
        for i in from..full {
            let (parent, key, tokens) = seq.keyed_block(root, i, bs);
            self.allocator
                .register(seq.block_table().blocks()[i], parent, key, tokens);
        }
        seq.prefix_mut().num_registered = full;
    }

    /// Forgets every cached block (admin reset); running sequences register their full
    /// blocks again after their next step. Returns the number of blocks forgotten.
    pub fn reset_prefix_cache(&mut self) -> usize {
        for seq in self.seqs.values_mut() {
            seq.prefix_mut().num_registered = 0;
        }
        self.allocator.reset_prefix_cache()
    }

    /// Whether the prefix cache is on.
    pub fn prefix_caching(&self) -> bool {
        self.prefix_hasher.is_some()
    }

    /// Prompt tokens of `id` found in the prefix cache at its first admission (`None` before
    /// it was admitted or with the cache off).
    pub fn num_cached_tokens(&self, id: SeqId) -> Option<usize> {
        self.seqs.get(&id)?.prefix().num_cached_tokens
    }
}
