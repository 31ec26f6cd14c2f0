//! A sequence's block table: the ordered KV blocks holding its positions, owned RAII-style.
//!
//! Position `p` of the sequence lives in slot `p % block_size` of block `blocks()[p / block_size]`.
//! The table holds one reference on each of its blocks and drops them all when it is cleared
//! or dropped, so finish, abort, preemption and error paths cannot leak blocks.

use tandem_model::batch::BlockId;

use crate::block_allocator::BlockAllocator;

/// The pool ran out of free blocks; nothing was allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfBlocks {
    /// Blocks the request needed beyond those already held.
    pub needed: usize,
    /// Free blocks at the time.
    pub free: usize,
}

/// The blocks of one sequence, in position order. Releases them on drop.
#[derive(Debug)]
pub struct BlockTable {
    allocator: BlockAllocator,
    /// Each entry holds one reference on its block.
    blocks: Vec<BlockId>,
}

impl BlockTable {
    /// An empty table drawing from `allocator`'s pool.
    pub fn new(allocator: BlockAllocator) -> BlockTable {
        BlockTable {
            allocator,
            blocks: Vec::new(),
        }
    }

    /// The blocks, in position order.
    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }

    /// Number of blocks held.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// True when no block is held.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Token slots the held blocks provide.
    pub fn capacity_tokens(&self) -> usize {
        self.blocks.len() * self.allocator.block_size()
    }

    /// Grows the table until it holds at least `num_tokens` slots. All or nothing: when the
    /// pool cannot provide every missing block, nothing is allocated.
    pub fn ensure_capacity(&mut self, num_tokens: usize) -> Result<(), OutOfBlocks> {
        let want = self.allocator.blocks_for(num_tokens);
        let needed = want.saturating_sub(self.blocks.len());
        if needed == 0 {
            return Ok(());
        }
        match self.allocator.allocate_n(needed) {
            Some(ids) => {
                self.blocks.extend(ids);
                Ok(())
            }
            None => Err(OutOfBlocks {
                needed,
                free: self.allocator.num_free(),
            }),
        }
    }

    /// Makes positions `start..end` writable: grows the table to hold `end` slots and gives
    /// the table its own copy of every already held block in that range whose refcount is
    /// above 1 (copy-on-write: the shared block keeps its other holders, this table takes a
    /// fresh block). Returns the `(src, dst)` block copies the physical store must perform,
    /// in order, before anything writes into them. All or nothing: when the pool cannot
    /// provide every block needed, nothing changes.
    pub fn prepare_write(
        &mut self,
        start: usize,
        end: usize,
    ) -> Result<Vec<(BlockId, BlockId)>, OutOfBlocks> {
        let want = self.allocator.blocks_for(end);
        let grow = want.saturating_sub(self.blocks.len());
        let first = start / self.allocator.block_size();
        let shared: Vec<usize> = (first..self.blocks.len().min(want))
            .filter(|&i| self.allocator.refcount(self.blocks[i]).unwrap_or(0) > 1)
            .collect();
        let needed = grow + shared.len();
        if needed == 0 {
            return Ok(Vec::new());
        }
        let Some(fresh) = self.allocator.allocate_n(needed) else {
            return Err(OutOfBlocks {
                needed,
                free: self.allocator.num_free(),
            });
        };
        let mut fresh = fresh.into_iter();
        let mut copies = Vec::with_capacity(shared.len());
        for i in shared {
            let dst = fresh.next().expect("allocated one block per shared block");
            let src = std::mem::replace(&mut self.blocks[i], dst);
            self.allocator
                .free(src)
                .expect("a block table holds a reference on each of its blocks");
            copies.push((src, dst));
        }
        self.blocks.extend(fresh);
        Ok(copies)
    }

    /// Releases the blocks past those needed for `num_tokens` slots (rollback of rejected
    /// speculative tokens, truncation). The tail is released first.
    pub fn truncate_to_tokens(&mut self, num_tokens: usize) {
        let keep = self.allocator.blocks_for(num_tokens);
        while self.blocks.len() > keep {
            let id = self.blocks.pop().expect("len > keep >= 0");
            self.allocator
                .free(id)
                .expect("a block table holds a reference on each of its blocks");
        }
    }

    /// Appends a block whose reference the caller hands over (a prefix-cache hit from
    /// [`BlockAllocator::acquire_cached`]); the table releases it like its other blocks.
    pub fn push_acquired(&mut self, id: BlockId) {
        self.blocks.push(id);
    }

    /// The allocator this table draws from.
    pub fn allocator(&self) -> &BlockAllocator {
        &self.allocator
    }

    /// A second table over the same blocks; each block gains one holder.
    pub fn fork(&self) -> BlockTable {
        for &id in &self.blocks {
            self.allocator
                .share(id)
                .expect("a block table holds a reference on each of its blocks");
        }
        BlockTable {
            allocator: self.allocator.clone(),
            blocks: self.blocks.clone(),
        }
    }

    /// Releases every block (tail first).
    pub fn clear(&mut self) {
        self.truncate_to_tokens(0);
    }
}

impl Drop for BlockTable {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_by_block_boundaries_and_releases_on_drop() {
        let a = BlockAllocator::new(4, 4).expect("valid pool");
        {
            let mut t = BlockTable::new(a.clone());
            t.ensure_capacity(1).expect("room");
            assert_eq!(t.len(), 1);
            t.ensure_capacity(4).expect("room");
            assert_eq!(t.len(), 1);
            t.ensure_capacity(5).expect("room");
            assert_eq!(t.len(), 2);
            assert_eq!(t.capacity_tokens(), 8);
            assert_eq!(
                t.ensure_capacity(17),
                Err(OutOfBlocks { needed: 3, free: 2 })
            );
            assert_eq!(t.len(), 2, "a failed grow allocates nothing");
            assert_eq!(a.num_free(), 2);
            t.truncate_to_tokens(3);
            assert_eq!(t.len(), 1);
            assert_eq!(a.num_free(), 3);
        }
        assert!(a.is_idle());
    }

    #[test]
    fn prepare_write_copies_only_shared_blocks_in_the_written_range() {
        let a = BlockAllocator::new(8, 4).expect("valid pool");
        let mut t = BlockTable::new(a.clone());
        t.ensure_capacity(6).expect("room"); // one full block, one partial
        let mut f = t.fork();
        // The fork writes position 6 (in the shared partial block 1) and 7..9 (new block).
        let copies = f.prepare_write(6, 9).expect("room");
        assert_eq!(copies.len(), 1);
        let (src, dst) = copies[0];
        assert_eq!(src, t.blocks()[1]);
        assert_eq!(f.blocks()[1], dst);
        assert_eq!(f.blocks()[0], t.blocks()[0], "the full block stays shared");
        assert_eq!(a.refcount(t.blocks()[0]), Some(2));
        assert_eq!(a.refcount(src), Some(1));
        assert_eq!(f.len(), 3);
        // The last holder writes in place.
        assert_eq!(t.prepare_write(6, 7).expect("room"), vec![]);
        assert_eq!(a.num_free(), 8 - 4);
        let mut g = t.fork();
        let hog = a.allocate_n(a.num_free()).expect("drain");
        let err = g.prepare_write(5, 7);
        assert_eq!(g.blocks(), t.blocks(), "a failed write prepares nothing");
        assert_eq!(err, Err(OutOfBlocks { needed: 1, free: 0 }));
        for id in hog {
            a.free(id).expect("allocated above");
        }
        drop((t, f, g));
        assert!(a.is_idle());
        a.check_invariants().expect("consistent");
    }

    #[test]
    fn fork_shares_and_both_must_drop() {
        let a = BlockAllocator::new(4, 2).expect("valid pool");
        let mut t = BlockTable::new(a.clone());
        t.ensure_capacity(4).expect("room");
        let f = t.fork();
        assert_eq!(f.blocks(), t.blocks());
        assert!(t.blocks().iter().all(|&b| a.refcount(b) == Some(2)));
        drop(t);
        assert_eq!(a.num_free(), 2);
        drop(f);
        assert!(a.is_idle());
        a.check_invariants().expect("consistent");
    }
}
