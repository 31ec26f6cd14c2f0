//! Where an int8 kernel writes one row group's products: straight into the output matrix,
//! token by token, as each tile of tokens finishes. (A group's products used to go to a
//! scratch tile first and then be copied out in one burst of stores, one output row per
//! token: a burst of store misses the kernel's own arithmetic no longer hides.)

use std::marker::PhantomData;

use super::GROUP_ROWS;

/// The outputs of one row group for every token: element `[t, j]` (token `t`, the group's
/// row `j`) at `base + t·stride + j`, for `j < live`, the group's real rows. The lanes of
/// a last group's padding rows are never written.
pub(crate) struct GroupOut<'a> {
    base: *mut f32,
    stride: usize,
    n_tokens: usize,
    live: usize,
    _borrow: PhantomData<&'a mut [f32]>,
}

impl<'a> GroupOut<'a> {
    /// # Safety
    /// For every `t < n_tokens`, the `live` floats at `base + t·stride` must be writable,
    /// outlive the view, and be accessed by no other live reference or view meanwhile.
    pub(crate) unsafe fn new(base: *mut f32, stride: usize, n_tokens: usize, live: usize) -> Self {
        assert!(
            (1..=GROUP_ROWS).contains(&live) && (n_tokens <= 1 || live <= stride),
            "group output: {live} lanes in rows of {stride}"
        );
        GroupOut {
            base,
            stride,
            n_tokens,
            live,
            _borrow: PhantomData,
        }
    }

    pub(crate) fn n_tokens(&self) -> usize {
        self.n_tokens
    }

    /// The group's real rows: the lanes written per token.
    pub(crate) fn live(&self) -> usize {
        self.live
    }

    /// Sets element `[t, j]`.
    pub(crate) fn set(&mut self, t: usize, j: usize, v: f32) {
        assert!(
            t < self.n_tokens && j < self.live,
            "group output: out of bounds"
        );
        // SAFETY: in bounds (checked above; contract of `new`).
        unsafe { *self.base.add(t * self.stride + j) = v };
    }

    /// Token `t`'s first lane, for a kernel's stores of [`GroupOut::live`] lanes.
    pub(crate) fn token(&mut self, t: usize) -> *mut f32 {
        assert!(t < self.n_tokens, "group output: token {t} out of bounds");
        // `wrapping_add`: only the stores (of at most `live` lanes) dereference it.
        self.base.wrapping_add(t * self.stride)
    }
}
