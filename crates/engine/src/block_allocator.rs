//! The logical KV block allocator (ARCHITECTURE.md § KV cache): block ids, reference counts, an
//! O(1) free queue and the prefix cache's index over a fixed pool of `num_blocks` blocks of
//! `block_size` token slots each.
//!
//! The physical K/V data lives in the model crate's `KvStore`; this only decides which
//! block ids are in use and by how many holders.
//!
//! Prefix caching: a full block may be *registered* under a [`BlockKey`] (see
//! [`crate::prefix_cache`]). A registered block whose last holder lets go stays in the index
//! and keeps its contents while it waits in the free queue (cached-free); a later request
//! with the same prefix takes it back with [`BlockAllocator::acquire_cached`] in O(1). Free
//! blocks holding nothing reusable sit at the front of the queue and are handed out first;
//! cached-free blocks join the back in the order they are freed, so allocation evicts the
//! least recently freed one (and a sequence's table releases its tail first, so its most
//! specific blocks go before its shared head).
//!
//! Invariants (checked by [`BlockAllocator::check_invariants`] and the property tests):
//! - `num_free() + (number of blocks with refcount > 0) == num_total()` (`num_free` counts
//!   cached-free blocks);
//! - a block's refcount is 0 if and only if it is in the free queue, at most once;
//! - every index entry names a block registered under that key, and every registered block
//!   is in the index under its key.
//!
//! Sequences should not call [`BlockAllocator::free`] by hand: they hold their blocks in a
//! [`crate::block_table::BlockTable`], which releases them on drop on every exit path.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tandem_model::batch::{BlockId, TokenId};

use crate::error::{EngineError, Result};
use crate::prefix_cache::{BlockKey, CachedBlock};

mod free_queue;

use free_queue::FreeQueue;

/// The shared pool state behind every [`BlockAllocator`] handle.
#[derive(Debug)]
struct Pool {
    /// Token slots per block.
    block_size: usize,
    /// `[num_blocks]` holders of each block; 0 means free.
    refcounts: Vec<u32>,
    /// Free blocks: reusable-nothing at the front, cached-free at the back (LRU order).
    free: FreeQueue,
    /// `[num_blocks]` what a registered block holds.
    cached: Vec<Option<CachedBlock>>,
    /// Registered blocks by key.
    index: HashMap<BlockKey, BlockId>,
    /// Cached-free blocks handed out for other contents since start.
    evictions: u64,
}

impl Pool {
    /// Takes the front free block, evicting what it cached, and gives it refcount 1.
    fn take_free(&mut self) -> Option<BlockId> {
        let id = self.free.pop_front()?;
        let i = id.0 as usize;
        assert_eq!(
            self.refcounts[i], 0,
            "block {i} in the free queue has holders"
        );
        if let Some(c) = self.cached[i].take() {
            self.index.remove(&c.key);
            self.evictions += 1;
        }
        self.refcounts[i] = 1;
        Some(id)
    }
}

/// A cheap, cloneable handle to one pool of KV blocks. All clones see the same pool.
///
/// The engine is single-threaded; the mutex only makes the handle `Send` so the engine can
/// be moved to its own thread. It is never contended.
#[derive(Debug, Clone)]
pub struct BlockAllocator {
    pool: Arc<Mutex<Pool>>,
}

impl BlockAllocator {
    /// A pool of `num_blocks` free blocks of `block_size` token slots each.
    pub fn new(num_blocks: usize, block_size: usize) -> Result<BlockAllocator> {
        if num_blocks == 0 || block_size == 0 {
            return Err(EngineError::InvalidConfig(format!(
                "the KV pool needs at least one block of at least one slot \
                 (num_blocks {num_blocks}, block_size {block_size})"
            )));
        }
        let max = u32::MAX as usize - 1;
        if num_blocks > max {
            return Err(EngineError::InvalidConfig(format!(
                "num_blocks {num_blocks} exceeds {max}"
            )));
        }
        // In id order, so that allocation hands out 0, 1, 2, ... on a fresh pool.
        let pool = Pool {
            block_size,
            refcounts: vec![0; num_blocks],
            free: FreeQueue::full(num_blocks),
            cached: vec![None; num_blocks],
            index: HashMap::new(),
            evictions: 0,
        };
        Ok(BlockAllocator {
            pool: Arc::new(Mutex::new(pool)),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Pool> {
        // Every mutation below completes before any assert can fire, so a poisoned pool is
        // still consistent; recovering keeps `Drop` of block tables panic-free.
        self.pool.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Token slots per block.
    pub fn block_size(&self) -> usize {
        self.lock().block_size
    }

    /// Blocks in the pool.
    pub fn num_total(&self) -> usize {
        self.lock().refcounts.len()
    }

    /// Blocks with refcount 0, cached-free ones included.
    pub fn num_free(&self) -> usize {
        self.lock().free.len()
    }

    /// Blocks registered in the prefix cache (held or cached-free); see the glossary in
    /// ARCHITECTURE.md.
    pub fn num_registered(&self) -> usize {
        self.lock().index.len()
    }

    /// Cached-free blocks evicted (handed out for other contents) since start.
    pub fn num_evictions(&self) -> u64 {
        self.lock().evictions
    }

    /// Blocks needed to hold `num_tokens` token slots.
    pub fn blocks_for(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.block_size())
    }

    /// Takes a free block and gives it refcount 1; `None` when the pool is dry. O(1).
    pub fn allocate(&self) -> Option<BlockId> {
        self.lock().take_free()
    }

    /// Takes `n` free blocks at once, or none when fewer than `n` are free.
    pub fn allocate_n(&self, n: usize) -> Option<Vec<BlockId>> {
        let mut pool = self.lock();
        if pool.free.len() < n {
            return None;
        }
        Some((0..n).filter_map(|_| pool.take_free()).collect())
    }

    /// Adds a holder to an allocated block (fork, prefix sharing). O(1).
    pub fn share(&self, id: BlockId) -> Result<()> {
        let mut pool = self.lock();
        match pool.refcounts.get_mut(id.0 as usize) {
            Some(rc) if *rc > 0 => {
                *rc = rc
                    .checked_add(1)
                    .expect("a block cannot have 2^32 holders: each holder is a block table");
                Ok(())
            }
            _ => Err(EngineError::BlockNotAllocated(id.0)),
        }
    }

    /// Drops one holder of a block; at refcount 0 the block returns to the free queue (at
    /// the back while it is registered, so its contents stay reusable). O(1).
    pub fn free(&self, id: BlockId) -> Result<()> {
        let mut pool = self.lock();
        let i = id.0 as usize;
        match pool.refcounts.get_mut(i) {
            Some(rc) if *rc > 0 => {
                *rc -= 1;
                if *rc == 0 {
                    if pool.cached[i].is_some() {
                        pool.free.push_back(id);
                    } else {
                        pool.free.push_front(id);
                    }
                }
                Ok(())
            }
            _ => Err(EngineError::BlockNotAllocated(id.0)),
        }
    }

    /// Registers a held, full block under `key` (its parent's key and its token ids kept to
    /// verify later hits). Does nothing when the block is already registered or another
    /// block holds `key` (two requests computed the same prefix at once). Returns whether
    /// the block was registered.
    pub fn register(
        &self,
        id: BlockId,
        parent: BlockKey,
        key: BlockKey,
        tokens: &[TokenId],
    ) -> bool {
        let mut pool = self.lock();
        let i = id.0 as usize;
        let held = pool.refcounts.get(i).is_some_and(|&rc| rc > 0);
        if !held || pool.cached[i].is_some() || pool.index.contains_key(&key) {
            return false;
        }
        pool.index.insert(key, id);
        pool.cached[i] = Some(CachedBlock {
            key,
            parent,
            tokens: tokens.into(),
        });
        true
    }

    /// A prefix-cache hit: the block registered under `key`, if its stored parent key and
    /// tokens equal `parent` and `tokens`, with one more holder (taken out of the free queue
    /// when it was cached-free). The caller owns that reference. O(1) plus the comparison.
    pub fn acquire_cached(
        &self,
        parent: BlockKey,
        key: BlockKey,
        tokens: &[TokenId],
    ) -> Option<BlockId> {
        let mut pool = self.lock();
        let id = *pool.index.get(&key)?;
        let i = id.0 as usize;
        let c = pool.cached[i].as_ref()?;
        if c.parent != parent || *c.tokens != *tokens {
            return None;
        }
        if pool.refcounts[i] == 0 {
            pool.free.remove(id);
        }
        pool.refcounts[i] += 1;
        Some(id)
    }

    /// Whether [`BlockAllocator::acquire_cached`] would hit, without taking anything.
    pub fn is_cached(&self, parent: BlockKey, key: BlockKey, tokens: &[TokenId]) -> bool {
        self.find_cached(parent, key, tokens).is_some()
    }

    /// The block [`BlockAllocator::acquire_cached`] would hit, without taking it.
    pub fn find_cached(
        &self,
        parent: BlockKey,
        key: BlockKey,
        tokens: &[TokenId],
    ) -> Option<BlockId> {
        let pool = self.lock();
        let id = *pool.index.get(&key)?;
        let c = pool.cached[id.0 as usize].as_ref()?;
        (c.parent == parent && *c.tokens == *tokens).then_some(id)
    }

    /// Forgets every registered block (held blocks keep their contents, cached-free blocks
    /// become plain free blocks at the front of the queue). Returns how many were forgotten.
    pub fn reset_prefix_cache(&self) -> usize {
        let mut pool = self.lock();
        let n = pool.index.len();
        pool.index.clear();
        for i in 0..pool.cached.len() {
            if pool.cached[i].take().is_some() && pool.refcounts[i] == 0 {
                let id = BlockId(i as u32);
                pool.free.remove(id);
                pool.free.push_front(id);
            }
        }
        n
    }

    /// The number of holders of `id`; `None` for an id outside the pool.
    pub fn refcount(&self, id: BlockId) -> Option<u32> {
        self.lock().refcounts.get(id.0 as usize).copied()
    }

    /// The key `id` is registered under, if any.
    pub fn cached_key(&self, id: BlockId) -> Option<BlockKey> {
        let pool = self.lock();
        pool.cached.get(id.0 as usize)?.as_ref().map(|c| c.key)
    }

    /// True when every block is free (every refcount is 0; cached-free blocks are free).
    pub fn is_idle(&self) -> bool {
        let pool = self.lock();
        pool.free.len() == pool.refcounts.len()
    }

    /// Checks the invariants in the module doc; returns a description of the first broken one.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let pool = self.lock();
        let mut on_free_list = vec![false; pool.refcounts.len()];
        let mut seen = 0;
        for id in pool.free.iter() {
            let i = id.0 as usize;
            if i >= on_free_list.len() {
                return Err(format!("free queue holds block {i} outside the pool"));
            }
            if on_free_list[i] {
                return Err(format!("block {i} is in the free queue twice"));
            }
            on_free_list[i] = true;
            seen += 1;
        }
        if seen != pool.free.len() {
            return Err(format!(
                "free queue links {seen} blocks but counts {}",
                pool.free.len()
            ));
        }
        for (i, (&rc, &free)) in pool.refcounts.iter().zip(&on_free_list).enumerate() {
            if (rc == 0) != free {
                return Err(format!(
                    "block {i} has refcount {rc} but free-list flag {free}"
                ));
            }
        }
        for (key, id) in &pool.index {
            match &pool.cached[id.0 as usize] {
                Some(c) if c.key == *key && c.tokens.len() == pool.block_size => {}
                other => return Err(format!("index entry for block {} holds {other:?}", id.0)),
            }
        }
        let registered = pool.cached.iter().filter(|c| c.is_some()).count();
        if registered != pool.index.len() {
            return Err(format!(
                "{registered} registered blocks but {} index entries",
                pool.index.len()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prefix_cache::BlockKey;

    #[test]
    fn allocates_every_block_once_then_runs_dry() {
        let a = BlockAllocator::new(3, 4).expect("valid pool");
        let mut got: Vec<u32> = (0..3)
            .map(|_| a.allocate().expect("free block").0)
            .collect();
        got.sort_unstable();
        assert_eq!(got, vec![0, 1, 2]);
        assert_eq!(a.allocate(), None);
        assert_eq!(a.num_free(), 0);
        a.free(BlockId(1)).expect("allocated");
        assert_eq!(a.allocate(), Some(BlockId(1)));
    }

    #[test]
    fn shared_block_returns_only_after_last_holder() {
        let a = BlockAllocator::new(2, 16).expect("valid pool");
        let b = a.allocate().expect("free block");
        a.share(b).expect("allocated");
        assert_eq!(a.refcount(b), Some(2));
        a.free(b).expect("allocated");
        assert_eq!(a.num_free(), 1);
        a.free(b).expect("still allocated");
        assert_eq!(a.num_free(), 2);
        assert_eq!(a.free(b), Err(EngineError::BlockNotAllocated(b.0)));
        assert_eq!(a.share(b), Err(EngineError::BlockNotAllocated(b.0)));
        assert_eq!(a.free(BlockId(7)), Err(EngineError::BlockNotAllocated(7)));
        a.check_invariants().expect("consistent");
    }

    #[test]
    fn allocate_n_is_all_or_nothing() {
        let a = BlockAllocator::new(4, 2).expect("valid pool");
        assert_eq!(a.allocate_n(5), None);
        assert_eq!(a.num_free(), 4);
        let ids = a.allocate_n(3).expect("enough blocks");
        assert_eq!(ids, vec![BlockId(0), BlockId(1), BlockId(2)]);
        assert_eq!(a.num_free(), 1);
        assert_eq!(a.blocks_for(5), 3);
        assert_eq!(a.blocks_for(0), 0);
    }

    #[test]
    fn rejects_empty_pool() {
        assert!(BlockAllocator::new(0, 16).is_err());
        assert!(BlockAllocator::new(4, 0).is_err());
    }

    fn toks(v: &[u32]) -> Vec<TokenId> {
        v.iter().copied().map(TokenId).collect()
    }

    #[test]
    fn cached_free_blocks_are_reused_by_a_hit_and_evicted_least_recently_freed_first() {
        let a = BlockAllocator::new(4, 2).expect("valid pool");
        let (root, k1, k2) = (BlockKey(1), BlockKey(11), BlockKey(12));
        let b1 = a.allocate().expect("free");
        let b2 = a.allocate().expect("free");
        assert!(a.register(b1, root, k1, &toks(&[1, 2])));
        assert!(a.register(b2, k1, k2, &toks(&[3, 4])));
        assert!(!a.register(b2, k1, k2, &toks(&[3, 4])), "registered once");
        // The tail first, as a block table releases: b2 is freed before b1.
        a.free(b2).expect("held");
        a.free(b1).expect("held");
        assert_eq!((a.num_free(), a.num_registered()), (4, 2));
        a.check_invariants().expect("consistent");
        // A hit verifies the parent key and the tokens.
        assert_eq!(a.acquire_cached(root, k1, &toks(&[1, 9])), None);
        assert_eq!(a.acquire_cached(BlockKey(2), k1, &toks(&[1, 2])), None);
        assert_eq!(a.acquire_cached(root, k1, &toks(&[1, 2])), Some(b1));
        assert_eq!((a.refcount(b1), a.num_free()), (Some(1), 3));
        a.free(b1).expect("held");
        // Plain free blocks go first, then the least recently freed cached one (b2).
        let fresh = a.allocate_n(2).expect("two plain blocks");
        assert!(!fresh.contains(&b1) && !fresh.contains(&b2));
        assert_eq!(a.allocate(), Some(b2));
        assert_eq!(a.num_evictions(), 1);
        assert_eq!(a.acquire_cached(k1, k2, &toks(&[3, 4])), None, "evicted");
        assert_eq!(a.cached_key(b1), Some(k1), "b1 is still cached");
        a.check_invariants().expect("consistent");
    }

    #[test]
    fn a_key_is_held_by_one_block_and_reset_forgets_everything() {
        let a = BlockAllocator::new(3, 1).expect("valid pool");
        let (x, y) = (a.allocate().expect("free"), a.allocate().expect("free"));
        assert!(a.register(x, BlockKey(0), BlockKey(5), &toks(&[7])));
        assert!(
            !a.register(y, BlockKey(0), BlockKey(5), &toks(&[7])),
            "duplicate key"
        );
        a.free(x).expect("held");
        assert_eq!(a.reset_prefix_cache(), 1);
        assert_eq!(a.num_registered(), 0);
        assert_eq!(
            a.acquire_cached(BlockKey(0), BlockKey(5), &toks(&[7])),
            None
        );
        a.free(y).expect("held");
        assert!(a.is_idle());
        a.check_invariants().expect("consistent");
    }
}
