//! The logical KV block allocator (DESIGN §2.3): block ids, reference counts and an O(1)
//! free list over a fixed pool of `num_blocks` blocks of `block_size` token slots each.
//!
//! The physical K/V data lives in the model crate's `KvStore`; this only decides which
//! block ids are in use and by how many holders.
//!
//! Invariants (checked by [`BlockAllocator::check_invariants`] and the property tests):
//! - `num_free() + (number of blocks with refcount > 0) == num_total()`;
//! - a block's refcount is 0 if and only if it is on the free list, and it is on the free
//!   list at most once.
//!
//! Sequences should not call [`BlockAllocator::free`] by hand: they hold their blocks in a
//! [`crate::block_table::BlockTable`], which releases them on drop on every exit path.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tandem_model::batch::BlockId;

use crate::error::{EngineError, Result};

/// The shared pool state behind every [`BlockAllocator`] handle.
#[derive(Debug)]
struct Pool {
    /// Token slots per block.
    block_size: usize,
    /// `[num_blocks]` holders of each block; 0 means free.
    refcounts: Vec<u32>,
    /// Stack of free block ids: push and pop are O(1), no allocation after start-up.
    free: Vec<BlockId>,
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
        let max = u32::MAX as usize;
        if num_blocks > max {
            return Err(EngineError::InvalidConfig(format!(
                "num_blocks {num_blocks} exceeds {max}"
            )));
        }
        // Reversed so that allocation hands out 0, 1, 2, ... on a fresh pool.
        let free = (0..num_blocks as u32).rev().map(BlockId).collect();
        let pool = Pool {
            block_size,
            refcounts: vec![0; num_blocks],
            free,
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

    /// Blocks with refcount 0.
    pub fn num_free(&self) -> usize {
        self.lock().free.len()
    }

    /// Blocks needed to hold `num_tokens` token slots.
    pub fn blocks_for(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.block_size())
    }

    /// Takes a free block and gives it refcount 1; `None` when the pool is dry. O(1).
    pub fn allocate(&self) -> Option<BlockId> {
        let mut pool = self.lock();
        let id = pool.free.pop()?;
        let rc = &mut pool.refcounts[id.0 as usize];
        assert_eq!(*rc, 0, "block {} on the free list has holders", id.0);
        *rc = 1;
        Some(id)
    }

    /// Takes `n` free blocks at once, or none when fewer than `n` are free.
    pub fn allocate_n(&self, n: usize) -> Option<Vec<BlockId>> {
        let mut pool = self.lock();
        if pool.free.len() < n {
            return None;
        }
        let at = pool.free.len() - n;
        let ids: Vec<BlockId> = pool.free.drain(at..).rev().collect();
        for id in &ids {
            let rc = &mut pool.refcounts[id.0 as usize];
            assert_eq!(*rc, 0, "block {} on the free list has holders", id.0);
            *rc = 1;
        }
        Some(ids)
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

    /// Drops one holder of a block; at refcount 0 the block returns to the free list. O(1).
    pub fn free(&self, id: BlockId) -> Result<()> {
        let mut pool = self.lock();
        match pool.refcounts.get_mut(id.0 as usize) {
            Some(rc) if *rc > 0 => {
                *rc -= 1;
                if *rc == 0 {
                    pool.free.push(id);
                }
                Ok(())
            }
            _ => Err(EngineError::BlockNotAllocated(id.0)),
        }
    }

    /// The number of holders of `id`; `None` for an id outside the pool.
    pub fn refcount(&self, id: BlockId) -> Option<u32> {
        self.lock().refcounts.get(id.0 as usize).copied()
    }

    /// True when every block is free (every refcount is 0).
    pub fn is_idle(&self) -> bool {
        let pool = self.lock();
        pool.free.len() == pool.refcounts.len()
    }

    /// Checks the invariants in the module doc; returns a description of the first broken one.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let pool = self.lock();
        let mut on_free_list = vec![false; pool.refcounts.len()];
        for id in &pool.free {
            let i = id.0 as usize;
            if i >= on_free_list.len() {
                return Err(format!("free list holds block {i} outside the pool"));
            }
            if on_free_list[i] {
                return Err(format!("block {i} is on the free list twice"));
            }
            on_free_list[i] = true;
        }
        for (i, (&rc, &free)) in pool.refcounts.iter().zip(&on_free_list).enumerate() {
            if (rc == 0) != free {
                return Err(format!(
                    "block {i} has refcount {rc} but free-list flag {free}"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
