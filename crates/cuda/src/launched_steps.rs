//! Steps queued on the device and not yet collected
//! ([`tandem_model::runner::ModelRunner::launch_sample`] and
//! [`tandem_model::runner::ModelRunner::collect_picks`]).
//!
//! A launched step queues its forward pass and its row reductions (`device_rows.rs`), then
//! asynchronous copies of each output row's results — the drawn token, the row's maximum,
//! softmax sum and token logit, the top logits asked for — into page-locked host memory
//! owned by the step, and an event after them. Collecting waits for that event only. A
//! pageable destination would make each copy wait for the stream, and with it the host for
//! the whole step; a page-locked one lets the host plan the next step meanwhile.
//!
//! Each step's drawn tokens stay on the device too, in `picks` (output row `i` at index
//! `i`): the next step's carried tokens are gathered from there (`carry_tokens`,
//! elementwise.cu) before its forward pass, in stream order, so they are this step's picks
//! however far the host has run ahead.

use std::collections::VecDeque;
use std::sync::Arc;

use cudarc::driver::{result, CudaContext, CudaEvent, CudaSlice, CudaStream, PinnedHostSlice};
use tandem_model::batch::CarriedToken;
use tandem_model::ModelError;

use crate::error::CudaError;
use crate::forward::ptr;
use crate::kernels::DevPtr;
use crate::row_kernels::TOP_LOGITS_MAX;

/// Launched steps that may be uncollected at a time (the runner trait's contract).
pub(crate) const MAX_LAUNCHED: usize = 2;

/// Page-locked host memory for the results of up to `rows` output rows, laid out as
/// `[rows] f64` sums, `[rows] f32` maxima, `[rows] f32` token logits, `[rows] i32` tokens,
/// `[rows, TOP_LOGITS_MAX] i32` top ids, `[rows, TOP_LOGITS_MAX] f32` top values.
#[derive(Debug)]
pub(crate) struct PinnedResults {
    rows: usize,
    host: PinnedHostSlice<u8>,
    base: *mut u8,
}

// SAFETY: `base` is the address of `host`'s allocation, which the struct owns; the memory
// is only written by copies queued through `&mut self` and read after their event.
unsafe impl Send for PinnedResults {}

/// Which per-row result a copy fills.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RowResult {
    Sum,
    Max,
    TokenLogit,
    Token,
    TopIds,
    TopValues,
}

impl RowResult {
    /// Bytes of one row's value.
    fn row_bytes(self) -> usize {
        match self {
            RowResult::Sum => 8,
            RowResult::Max | RowResult::TokenLogit | RowResult::Token => 4,
            RowResult::TopIds | RowResult::TopValues => 4 * TOP_LOGITS_MAX,
        }
    }

    /// Where this result's rows begin in buffers of `rows` rows.
    fn offset(self, rows: usize) -> usize {
        rows * match self {
            RowResult::Sum => 0,
            RowResult::Max => 8,
            RowResult::TokenLogit => 12,
            RowResult::Token => 16,
            RowResult::TopIds => 20,
            RowResult::TopValues => 20 + 4 * TOP_LOGITS_MAX,
        }
    }

    fn end(rows: usize) -> usize {
        RowResult::TopValues.offset(rows) + rows * RowResult::TopValues.row_bytes()
    }
}

impl PinnedResults {
    fn new(ctx: &Arc<CudaContext>, rows: usize) -> Result<PinnedResults, CudaError> {
        // Flags 0: cached memory the host reads quickly (write-combined memory, cudarc's
        // default, is slow to read from the host).
        // SAFETY: the memory is uninitialised bytes; it is only read where a copy wrote.
        let mut host = unsafe { ctx.alloc_pinned_with_flags::<u8>(RowResult::end(rows), 0) }?;
        let base = host.as_mut_ptr()?;
        Ok(PinnedResults { rows, host, base })
    }

    /// Queues the copy of `count` rows of `what` from the device buffer at `src` to output
    /// rows `first..first + count`.
    pub fn queue_copy(
        &mut self,
        stream: &CudaStream,
        what: RowResult,
        first: usize,
        count: usize,
        src: DevPtr,
    ) -> Result<(), CudaError> {
        if first + count > self.rows {
            return Err(CudaError::Unsupported(format!(
                "rows {first}..{} past the {} rows of the results",
                first + count,
                self.rows
            )));
        }
        let b = what.row_bytes();
        let at = what.offset(self.rows) + first * b;
        // SAFETY: `at + count * b` lies within the allocation (checked above against the
        // layout's extents). The memory stays allocated until the step's event has passed
        // (`LaunchedSteps` keeps the buffer with its step, and synchronises before
        // dropping queued steps), and nothing reads it before.
        unsafe {
            let dst = std::slice::from_raw_parts_mut(self.base.add(at), count * b);
            result::memcpy_dtoh_async(dst, src, stream.cu_stream())?;
        }
        Ok(())
    }

    /// The bytes of output row `row`'s `what`, once the copies have completed.
    fn bytes(&self, what: RowResult, row: usize) -> &[u8] {
        let b = what.row_bytes();
        let at = what.offset(self.rows) + row * b;
        // SAFETY: within the allocation (row < rows); called only after the step's event,
        // so no copy is writing it.
        unsafe { std::slice::from_raw_parts(self.base.add(at), b) }
    }

    pub fn f64_at(&self, what: RowResult, row: usize) -> f64 {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.bytes(what, row));
        f64::from_ne_bytes(a)
    }

    pub fn f32_at(&self, what: RowResult, row: usize, i: usize) -> f32 {
        f32::from_bits(self.u32_at(what, row, i))
    }

    pub fn i32_at(&self, what: RowResult, row: usize, i: usize) -> i32 {
        self.u32_at(what, row, i) as i32
    }

    fn u32_at(&self, what: RowResult, row: usize, i: usize) -> u32 {
        let mut a = [0u8; 4];
        a.copy_from_slice(&self.bytes(what, row)[4 * i..4 * i + 4]);
        u32::from_ne_bytes(a)
    }

    /// Keeps the allocation alive in `self.host` (the field is otherwise only dropped).
    fn capacity(&self) -> usize {
        self.host.len()
    }
}

/// One launched step: where its results land, and the event after their copies.
#[derive(Debug)]
pub(crate) struct LaunchedStep {
    pub results: PinnedResults,
    /// Top logprobs asked for, per output row (the row count is its length).
    pub top_counts: Vec<usize>,
    pub event: CudaEvent,
}

/// The launched steps, oldest first, the result buffers of collected ones for reuse, and
/// the device copy of the latest step's picks.
#[derive(Debug)]
pub(crate) struct LaunchedSteps {
    queue: VecDeque<LaunchedStep>,
    spare: Vec<PinnedResults>,
    /// `[capacity]` i32: the latest step's drawn tokens, by output row.
    picks: CudaSlice<i32>,
    /// Output rows of the latest step whose picks are in `picks` (`None`: no step since
    /// the runner started or the queue was dropped; nothing can be carried).
    latest_outputs: Option<usize>,
}

impl LaunchedSteps {
    pub fn new(stream: &Arc<CudaStream>, rows: usize) -> Result<LaunchedSteps, CudaError> {
        Ok(LaunchedSteps {
            queue: VecDeque::new(),
            spare: Vec::new(),
            picks: stream.alloc_zeros(rows.max(1))?,
            latest_outputs: None,
        })
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Checks `carried` for a batch of `tokens` tokens against the latest step.
    pub fn check_carried(&self, carried: &[CarriedToken], tokens: usize) -> Result<(), CudaError> {
        check_carried(carried, tokens, self.latest_outputs)
    }

    /// Makes room for the picks of `outputs` rows; a grown buffer keeps the latest step's
    /// picks (copied on the stream), which the step about to be queued may carry.
    pub fn reserve_picks(
        &mut self,
        stream: &Arc<CudaStream>,
        outputs: usize,
    ) -> Result<(), CudaError> {
        if outputs <= self.picks.len() {
            return Ok(());
        }
        let mut grown = stream.alloc_zeros::<i32>(outputs.next_power_of_two())?;
        stream.memcpy_dtod(&self.picks, &mut grown.slice_mut(..self.picks.len()))?;
        self.picks = grown;
        Ok(())
    }

    /// The device address of output row `row`'s pick.
    pub fn picks_ptr(&self, stream: &CudaStream, row: usize) -> DevPtr {
        ptr(&self.picks, stream) + 4 * row as u64
    }

    /// A result buffer for `rows` output rows: a collected step's, or a new one.
    pub fn take_results(
        &mut self,
        ctx: &Arc<CudaContext>,
        rows: usize,
    ) -> Result<PinnedResults, CudaError> {
        if let Some(i) = self.spare.iter().position(|r| r.rows >= rows) {
            return Ok(self.spare.swap_remove(i));
        }
        // Drop the smallest spare so that spares never outnumber the launched steps.
        if self.spare.len() >= MAX_LAUNCHED {
            self.spare.sort_by_key(PinnedResults::capacity);
            self.spare.remove(0);
        }
        PinnedResults::new(ctx, rows.next_power_of_two().max(64))
    }

    /// Queues a launched step whose results were queued into `step.results`.
    pub fn push(&mut self, step: LaunchedStep) {
        self.latest_outputs = Some(step.top_counts.len());
        self.queue.push_back(step);
    }

    /// After a step run to its end (`forward_sample`, `forward_greedy`): nothing can be
    /// carried until the next launch, as after a runner's start.
    pub fn forget_latest(&mut self) {
        self.latest_outputs = None;
    }

    pub fn pop(&mut self) -> Option<LaunchedStep> {
        self.queue.pop_front()
    }

    /// Returns a collected step's buffer for reuse.
    pub fn recycle(&mut self, results: PinnedResults) {
        self.spare.push(results);
    }

    /// Drops every launched step (after an error). Copies into their buffers may still be
    /// queued, so the stream is waited for first; if that fails too, the buffers are leaked
    /// rather than freed under a copy.
    pub fn clear(&mut self, stream: &CudaStream) {
        self.latest_outputs = None;
        if self.queue.is_empty() {
            return;
        }
        if stream.synchronize().is_ok() {
            self.queue.clear();
        } else {
            for step in self.queue.drain(..) {
                std::mem::forget(step.results);
            }
        }
    }
}

/// Checks that `carried` names distinct rows of a batch of `tokens` tokens and output rows
/// of the latest step, which had `latest_outputs` (`None`: there is none).
fn check_carried(
    carried: &[CarriedToken],
    tokens: usize,
    latest_outputs: Option<usize>,
) -> Result<(), CudaError> {
    if carried.is_empty() {
        return Ok(());
    }
    let Some(outputs) = latest_outputs else {
        return Err(bad("carried tokens but no step was launched before".into()));
    };
    let mut seen = vec![false; tokens];
    for c in carried {
        if c.row >= tokens || c.from_output >= outputs {
            return Err(bad(format!(
                "carried token {c:?} outside the batch's {tokens} rows or the last step's \
                 {outputs} output rows"
            )));
        }
        if std::mem::replace(&mut seen[c.row], true) {
            return Err(bad(format!("row {} is carried twice", c.row)));
        }
    }
    Ok(())
}

fn bad(message: String) -> CudaError {
    ModelError::Batch(message).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn carried(pairs: &[(usize, usize)]) -> Vec<CarriedToken> {
        pairs
            .iter()
            .map(|&(row, from_output)| CarriedToken { row, from_output })
            .collect()
    }

    #[test]
    fn carried_tokens_must_name_distinct_rows_and_outputs_of_the_latest_step() {
        assert!(check_carried(&[], 3, None).is_ok());
        assert!(check_carried(&carried(&[(0, 1), (2, 0)]), 3, Some(2)).is_ok());
        for (pairs, outputs) in [
            (vec![(0, 0)], None),            // no step before
            (vec![(3, 0)], Some(2)),         // past the batch
            (vec![(0, 2)], Some(2)),         // past the outputs of the step before
            (vec![(1, 0), (1, 1)], Some(2)), // a row twice
        ] {
            let r = check_carried(&carried(&pairs), 3, outputs);
            assert!(r.is_err(), "{pairs:?} of {outputs:?}");
        }
    }

    #[test]
    fn the_result_layout_packs_every_row_result_without_overlap() {
        for rows in [1, 3, 64, 256] {
            let all = [
                RowResult::Sum,
                RowResult::Max,
                RowResult::TokenLogit,
                RowResult::Token,
                RowResult::TopIds,
                RowResult::TopValues,
            ];
            let mut end = 0;
            for w in all {
                assert_eq!(w.offset(rows), end, "{w:?} of {rows} rows");
                end += rows * w.row_bytes();
            }
            assert_eq!(RowResult::end(rows), end);
        }
    }
}
