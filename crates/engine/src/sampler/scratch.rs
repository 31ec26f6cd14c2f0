//! The sampler's working buffers: one set per thread, not per request.
//!
//! A row of a 262,144-token vocabulary takes 2 MiB of f64 values and up to 1 MiB of
//! candidate ids. Kept per request, a batch of 16 sampled requests touched 48 MiB of
//! buffers each step, more than the caches hold, so every pass over a row went to memory;
//! kept per thread (the engine's and those of the host pool that samples rows side by side),
//! the same few buffers are reused row after row and nothing is held for an idle request.
//! No value survives from one call to the next: every call clears what it uses.

use std::cell::RefCell;

/// Buffers reused across calls so that sampling a row allocates nothing in the steady state.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    /// Processed logits, then (for random sampling) unnormalised weights: `[vocab_size]`.
    pub(crate) values: Vec<f64>,
    /// Candidate token ids, reordered by the truncation steps: `[<= vocab_size]`.
    pub(crate) candidates: Vec<u32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// This thread's buffers (empty ones when they are out already), to [`put_back`] when done.
pub(crate) fn take() -> Scratch {
    SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()))
}

/// Returns buffers taken with [`take`], for the next call on this thread.
pub(crate) fn put_back(scratch: Scratch) {
    SCRATCH.with(|s| *s.borrow_mut() = scratch);
}
