//! Safe parallel loops over disjoint parts of a mutable buffer, on top of [`ThreadPool::run`].

use crate::ThreadPool;

/// A raw pointer that may cross threads; each task derives a disjoint sub-slice from it.
struct SharedMut<T>(*mut T);

// SAFETY: only used by `for_each_chunk_mut`, `for_each_part_mut` and `for_each_chunk_pair_mut`,
// whose tasks touch pairwise disjoint ranges.
unsafe impl<T: Send> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    /// # Safety
    /// `start + len` must lie within the buffer this pointer came from, and no other live
    /// reference may overlap `[start, start + len)`.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice(&self, start: usize, len: usize) -> &mut [T] {
        std::slice::from_raw_parts_mut(self.0.add(start), len)
    }
}

/// Calls `f(i, chunk_i)` for every `chunk_len`-sized chunk of `data` (the last may be shorter),
/// spreading the chunks over the pool. Chunks are disjoint, so tasks never alias.
pub fn for_each_chunk_mut<T, F>(pool: &ThreadPool, data: &mut [T], chunk_len: usize, f: F)
where
    T: Send,
    F: Fn(usize, &mut [T]) + Sync,
{
    assert!(
        chunk_len > 0,
        "for_each_chunk_mut: chunk_len must be positive"
    );
    let len = data.len();
    let n_chunks = len.div_ceil(chunk_len);
    let ptr = SharedMut(data.as_mut_ptr());
    pool.run(n_chunks, |i| {
        let start = i * chunk_len;
        let n = chunk_len.min(len - start);
        // SAFETY: `i < n_chunks`, so `[start, start + n)` lies within `data`, and distinct `i`
        // give disjoint ranges; `data` is borrowed mutably for the whole call.
        let chunk = unsafe { ptr.slice(start, n) };
        f(i, chunk);
    });
}

/// Calls `f(i, part_i)` for every part `data[bounds[i]..bounds[i + 1]]`, spreading the parts
/// over the pool: chunks of varying length. `bounds` must start at 0, end at `data.len()` and
/// never decrease.
pub fn for_each_part_mut<T, F>(pool: &ThreadPool, data: &mut [T], bounds: &[usize], f: F)
where
    T: Send,
    F: Fn(usize, &mut [T]) + Sync,
{
    assert!(
        bounds.first() == Some(&0)
            && bounds.last() == Some(&data.len())
            && bounds.windows(2).all(|w| w[0] <= w[1]),
        "for_each_part_mut: bounds must rise from 0 to the buffer's length"
    );
    let ptr = SharedMut(data.as_mut_ptr());
    pool.run(bounds.len() - 1, |i| {
        let (start, end) = (bounds[i], bounds[i + 1]);
        // SAFETY: `i + 1 < bounds.len()`, the bounds rise from 0 to `data.len()`, so
        // `[start, end)` lies within `data` and distinct `i` give disjoint ranges; `data` is
        // borrowed mutably for the whole call.
        let part = unsafe { ptr.slice(start, end - start) };
        f(i, part);
    });
}

/// [`for_each_chunk_mut`] over two buffers cut into the same number of chunks: calls
/// `f(i, a_i, b_i)` with chunk `i` of `a` (`a_len` long) and of `b` (`b_len` long).
pub fn for_each_chunk_pair_mut<A, B, F>(
    pool: &ThreadPool,
    a: &mut [A],
    a_len: usize,
    b: &mut [B],
    b_len: usize,
    f: F,
) where
    A: Send,
    B: Send,
    F: Fn(usize, &mut [A], &mut [B]) + Sync,
{
    assert!(
        a_len > 0
            && b_len > 0
            && a.len().is_multiple_of(a_len)
            && a.len() / a_len * b_len == b.len(),
        "for_each_chunk_pair_mut: the buffers do not hold the same number of whole chunks"
    );
    let n_chunks = a.len() / a_len;
    let (pa, pb) = (SharedMut(a.as_mut_ptr()), SharedMut(b.as_mut_ptr()));
    pool.run(n_chunks, |i| {
        // SAFETY: `i < n_chunks` and both buffers hold exactly `n_chunks` whole chunks, so
        // each range lies in its buffer; distinct `i` give disjoint ranges; both buffers are
        // borrowed mutably for the whole call.
        let (ca, cb) = unsafe { (pa.slice(i * a_len, a_len), pb.slice(i * b_len, b_len)) };
        f(i, ca, cb);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chunk_is_visited_once() {
        let pool = ThreadPool::new(2);
        let mut v = vec![0usize; 103];
        for_each_chunk_mut(&pool, &mut v, 10, |i, c| {
            c.iter_mut().for_each(|x| *x += i + 1)
        });
        for (j, x) in v.iter().enumerate() {
            assert_eq!(*x, j / 10 + 1);
        }
    }

    #[test]
    fn every_part_is_visited_once() {
        let pool = ThreadPool::new(2);
        let mut v = vec![0usize; 20];
        let bounds = [0, 3, 3, 11, 20];
        for_each_part_mut(&pool, &mut v, &bounds, |i, c| {
            c.iter_mut().for_each(|x| *x += i + 1)
        });
        let want: Vec<usize> = (0..20)
            .map(|j| {
                bounds
                    .windows(2)
                    .position(|w| w[0] <= j && j < w[1])
                    .unwrap()
                    + 1
            })
            .collect();
        assert_eq!(v, want);
    }
}
