//! The free-block queue: an intrusive doubly linked list over block ids `0..n`.
//!
//! Push at either end, pop from the front, and unlink any member, all in O(1) and without
//! allocating after start-up. The allocator keeps blocks that hold nothing reusable at the
//! front (handed out first) and blocks that still hold a cached prefix at the back, in the
//! order they were freed, so the front of the cached part is the least recently freed one
//! (the next to be evicted), and a prefix-cache hit pulls its block out from anywhere.

use tandem_model::batch::BlockId;

const NIL: u32 = u32::MAX;

/// A doubly linked list of block ids, each at most once.
#[derive(Debug)]
pub(super) struct FreeQueue {
    prev: Vec<u32>,
    next: Vec<u32>,
    member: Vec<bool>,
    head: u32,
    tail: u32,
    len: usize,
}

impl FreeQueue {
    /// The queue `0, 1, ..., n - 1` (front to back). `n` must fit in `u32` below `u32::MAX`.
    pub(super) fn full(n: usize) -> FreeQueue {
        let n32 = n as u32;
        let prev = (0..n32).map(|i| if i == 0 { NIL } else { i - 1 }).collect();
        let next = (0..n32)
            .map(|i| if i + 1 == n32 { NIL } else { i + 1 })
            .collect();
        FreeQueue {
            prev,
            next,
            member: vec![true; n],
            head: if n == 0 { NIL } else { 0 },
            tail: if n == 0 { NIL } else { n32 - 1 },
            len: n,
        }
    }

    /// Members.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Whether `id` is in the queue.
    pub(super) fn contains(&self, id: BlockId) -> bool {
        self.member.get(id.0 as usize).copied().unwrap_or(false)
    }

    /// Removes and returns the front member.
    pub(super) fn pop_front(&mut self) -> Option<BlockId> {
        if self.head == NIL {
            return None;
        }
        let id = BlockId(self.head);
        self.remove(id);
        Some(id)
    }

    /// Inserts a non-member at the front.
    pub(super) fn push_front(&mut self, id: BlockId) {
        let i = self.link_fresh(id);
        self.next[i] = self.head;
        self.prev[i] = NIL;
        if self.head == NIL {
            self.tail = id.0;
        } else {
            self.prev[self.head as usize] = id.0;
        }
        self.head = id.0;
    }

    /// Inserts a non-member at the back.
    pub(super) fn push_back(&mut self, id: BlockId) {
        let i = self.link_fresh(id);
        self.prev[i] = self.tail;
        self.next[i] = NIL;
        if self.tail == NIL {
            self.head = id.0;
        } else {
            self.next[self.tail as usize] = id.0;
        }
        self.tail = id.0;
    }

    fn link_fresh(&mut self, id: BlockId) -> usize {
        let i = id.0 as usize;
        assert!(!self.member[i], "block {i} is already free");
        self.member[i] = true;
        self.len += 1;
        i
    }

    /// Unlinks a member; returns false (and changes nothing) for a non-member.
    pub(super) fn remove(&mut self, id: BlockId) -> bool {
        let i = id.0 as usize;
        if !self.contains(id) {
            return false;
        }
        let (p, n) = (self.prev[i], self.next[i]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[i] = NIL;
        self.next[i] = NIL;
        self.member[i] = false;
        self.len -= 1;
        true
    }

    /// The members, front to back (for invariant checks).
    pub(super) fn iter(&self) -> impl Iterator<Item = BlockId> + '_ {
        let mut at = self.head;
        std::iter::from_fn(move || {
            if at == NIL {
                return None;
            }
            let id = BlockId(at);
            at = self.next[at as usize];
            Some(id)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(q: &FreeQueue) -> Vec<u32> {
        q.iter().map(|b| b.0).collect()
    }

    #[test]
    fn ends_and_middle_removal_keep_the_links_consistent() {
        let mut q = FreeQueue::full(4);
        assert_eq!(ids(&q), [0, 1, 2, 3]);
        assert!(q.remove(BlockId(2)));
        assert!(!q.remove(BlockId(2)));
        assert_eq!(ids(&q), [0, 1, 3]);
        assert_eq!(q.pop_front(), Some(BlockId(0)));
        q.push_back(BlockId(0));
        q.push_front(BlockId(2));
        assert_eq!(ids(&q), [2, 1, 3, 0]);
        assert!(q.remove(BlockId(0)));
        assert!(q.remove(BlockId(2)));
        assert_eq!(ids(&q), [1, 3]);
        assert_eq!(q.len(), 2);
        while q.pop_front().is_some() {}
        assert_eq!(q.len(), 0);
        q.push_back(BlockId(3));
        assert_eq!(ids(&q), [3]);
    }
}
