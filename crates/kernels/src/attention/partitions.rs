//! The fixed partitions of a context and the fold of their results (the last steps of the
//! numeric contract in [`crate::attention`]).
//!
//! A context is cut into partitions of [`POS_PARTITION`] positions counted from its first
//! slot (the last one shorter). Each partition runs the contract's block steps from a fresh
//! state and leaves a [`Partial`]: per query head, its weighted sum of values, the maximum of
//! its scores and the sum of its probabilities. A context of one partition ends as before,
//! `out = acc · (1 / l)`; a longer one folds its partitions in order ([`fold`]) first. The
//! partitions depend only on the context, so the same query gets the same bits whether one
//! task walks its partitions one after the other (here) or several tasks compute them at once
//! and one folds them (a long sequence's decode spread over the threads).

use std::cell::RefCell;

use super::{exp_fixed, KvView, TileWork, GROUP_MAX, KV_HEADS_MAX, TILE_ROWS};
use crate::isa::Isa;
use crate::isa_dispatch::with_isa;
use crate::simd::Kernels;

/// Context positions per partition (fixed: part of the numeric contract; a multiple of
/// [`super::POS_BLOCK`]).
pub const POS_PARTITION: usize = 128;

/// Most query heads one running state holds: one kernel call's (every GQA group of
/// [`KV_HEADS_MAX`] KV heads) or one tile's rows.
pub const PARTIAL_HEADS_MAX: usize = GROUP_MAX * KV_HEADS_MAX;

/// Every head of a state (a mask of [`PARTIAL_HEADS_MAX`] bits).
const ALL_HEADS: u64 = u64::MAX;
const _: () = assert!(PARTIAL_HEADS_MAX <= u64::BITS as usize);

/// The partitions of a context of `n` positions.
pub fn partitions(n: usize) -> usize {
    n.div_ceil(POS_PARTITION)
}

/// Partition `p` of a context's `slots` (empty past the last).
pub fn partition(slots: &[usize], p: usize) -> &[usize] {
    let start = slots.len().min(p * POS_PARTITION);
    &slots[start..slots.len().min(start + POS_PARTITION)]
}

/// The length of one partition's record for `heads` query heads of `head_dim` elements:
/// their `[heads, head_dim]` weighted sums of values (not yet divided), then their `[heads]`
/// score maxima, then their `[heads]` sums of probabilities.
pub fn record_len(heads: usize, head_dim: usize) -> usize {
    heads * (head_dim + 2)
}

/// One partition's result for some query heads, before the division by the sum, where the
/// kernels leave it.
#[derive(Debug)]
pub(crate) struct Partial<'a> {
    /// `[heads, head_dim]` `Σ_j p_j · v_j` in the contract's order.
    pub acc: &'a mut [f32],
    /// `[heads]` the largest score that is no NaN (−∞ if none).
    pub max: &'a mut [f32],
    /// `[heads]` `Σ_j p_j` in the contract's order.
    pub sum: &'a mut [f32],
}

impl<'a> Partial<'a> {
    /// The state laid out in one record of [`record_len`] elements: `acc`, then `max`, then
    /// `sum` (how a decode spread over tasks keeps its partitions).
    pub(crate) fn in_record(record: &'a mut [f32], heads: usize) -> Partial<'a> {
        assert!(
            heads > 0
                && record.len() > 2 * heads
                && (record.len() - 2 * heads).is_multiple_of(heads),
            "Partial::in_record: {} elements for {heads} heads",
            record.len()
        );
        let (acc, stats) = record.split_at_mut(record.len() - 2 * heads);
        let (max, sum) = stats.split_at_mut(heads);
        Partial { acc, max, sum }
    }

    /// The query heads this state holds.
    pub(crate) fn heads(&self) -> usize {
        self.max.len()
    }

    /// The state of `count` heads from head `first` on.
    pub(crate) fn heads_mut(&mut self, first: usize, count: usize) -> Partial<'_> {
        let d = self.acc.len() / self.heads().max(1);
        Partial {
            acc: &mut self.acc[first * d..][..count * d],
            max: &mut self.max[first..][..count],
            sum: &mut self.sum[first..][..count],
        }
    }

    /// Sets this state to the one laid out in `record` (see [`record_len`]).
    fn copy_from_record(self, record: &[f32]) {
        let (acc, stats) = record.split_at(self.acc.len());
        let heads = self.heads();
        self.acc.copy_from_slice(acc);
        self.max.copy_from_slice(&stats[..heads]);
        self.sum.copy_from_slice(&stats[heads..]);
    }

    /// This state, borrowed again (to hand to a kernel).
    pub(crate) fn reborrow(&mut self) -> Partial<'_> {
        Partial {
            acc: self.acc,
            max: self.max,
            sum: self.sum,
        }
    }
}

with_isa! {
    /// Folds the next partition's `record` (of the same heads) into the running state `run`,
    /// for the heads `h` whose bit `h` of `reached` is set (the others keep their state): per
    /// head, `M' = max(M, m)`, `a = exp(M − M')`, `b = exp(m − M')`, `L ← L·a + l·b`,
    /// `ACC[c] ← ACC[c]·a + acc[c]·b`, plain multiplications and additions (never fused, so
    /// every variant gives the same bits).
    fold_with => fold(run: &mut Partial<'_>, record: &[f32], reached: u64) -> ()
}

#[inline(always)]
fn fold(run: &mut Partial<'_>, record: &[f32], reached: u64) {
    let heads = run.heads();
    assert_eq!(
        record.len(),
        run.acc.len() + 2 * heads,
        "fold: a record of other heads"
    );
    let d = run.acc.len() / heads;
    let (acc, stats) = record.split_at(heads * d);
    let (max, sum) = stats.split_at(heads);
    for h in (0..heads).filter(|&h| reached >> h & 1 == 1) {
        let m = f32::max(run.max[h], max[h]);
        let (a, b) = (rescale(run.max[h], m), rescale(max[h], m));
        run.max[h] = m;
        run.sum[h] = run.sum[h] * a + sum[h] * b;
        let rows = run.acc[h * d..][..d].iter_mut().zip(&acc[h * d..][..d]);
        rows.for_each(|(r, &x)| *r = *r * a + x * b);
    }
}

/// `exp(x − m)` for a maximum `m` that `x` contributed to: 1 when `x` is the maximum (what
/// `exp_fixed(x − x)` gives for a finite `x`; an infinite one gives NaN, as there), without
/// the polynomial, which would otherwise run twice per head and fold.
#[inline(always)]
fn rescale(x: f32, m: f32) -> f32 {
    if x == m && x.is_finite() {
        1.0
    } else {
        exp_fixed(x - m)
    }
}

with_isa! {
    /// The contract's last step: `acc[c] ← acc[c] · (1 / l)` for every head of `run`.
    finish_with => finish(run: &mut Partial<'_>) -> ()
}

#[inline(always)]
fn finish(run: &mut Partial<'_>) {
    let heads = run.heads();
    let d = run.acc.len() / heads.max(1);
    for (acc, &l) in run.acc.chunks_exact_mut(d.max(1)).zip(run.sum.iter()) {
        let inv = 1.0 / l;
        acc.iter_mut().for_each(|a| *a *= inv);
    }
}

/// `out` (`[heads, head_dim]`) from the records of a context's partitions (`records`: one
/// after the other, in order, each of `heads` heads): partition 0's state, the others folded
/// into it, then divided: bitwise what the kernels give for the whole context in one call,
/// with any `isa`.
///
/// Panics if the records do not hold whole partitions of `out`'s heads (at most
/// [`PARTIAL_HEADS_MAX`]) or hold none.
pub fn fold_partitions(isa: Isa, records: &[f32], heads: usize, out: &mut [f32]) {
    assert!(
        (1..=PARTIAL_HEADS_MAX).contains(&heads) && out.len().is_multiple_of(heads),
        "fold_partitions: {heads} heads, {} outputs",
        out.len()
    );
    let len = out.len() + 2 * heads;
    assert!(
        !records.is_empty() && records.len().is_multiple_of(len),
        "fold_partitions: {} elements are no whole records of {len}",
        records.len()
    );
    // The walk of the kernels, with each partition's state read from its record.
    let parts = records.len() / len;
    walk(isa, heads, parts, out, |p, state| {
        state.copy_from_record(&records[p * len..][..len]);
        ALL_HEADS
    });
}

thread_local! {
    /// One partition's record while a call folds a long context (grown once per thread to
    /// the largest call, so a stream of decode steps allocates nothing).
    static RECORD: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with a record of `record_len(heads, head_dim)` elements (contents unspecified).
fn with_record<R>(heads: usize, head_dim: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    let len = record_len(heads, head_dim);
    RECORD.with(|cell| match cell.try_borrow_mut() {
        Ok(mut record) => {
            if record.len() < len {
                // Room for the most heads a state holds at once: a thread grows it once per
                // head size, whatever calls come later.
                record.resize(record_len(PARTIAL_HEADS_MAX, head_dim).max(len), 0.0);
            }
            f(&mut record[..len])
        }
        // Re-entered (a kernel never calls back here; kept total anyway): a fresh buffer.
        Err(_) => f(&mut vec![0.0; len]),
    })
}

/// The group kernel over the partitions of `kv`'s context, folded and finished into `out`
/// (the query heads of `kv_heads` KV heads, at most [`PARTIAL_HEADS_MAX`]).
pub(crate) fn attend_group(
    kernels: &Kernels,
    q: &[f32],
    kv: &KvView<'_>,
    kv_heads: usize,
    scale: f32,
    out: &mut [f32],
) {
    let heads = q.len() / kv.head_dim;
    let view = |p: usize| KvView {
        slots: partition(kv.slots, p),
        ..*kv
    };
    let parts = partitions(kv.slots.len());
    walk(kernels.isa(), heads, parts, out, |p, state| {
        let next = partition(kv.slots, p + 1);
        kernels.attend_partition(q, &view(p), kv_heads, scale, state, next);
        ALL_HEADS
    });
}

/// The tile kernel over the partitions of the rows' contexts (at most [`TILE_ROWS`] rows of
/// `kv.head_dim`), folded and finished into `out`. A row is folded only with the partitions
/// its context reaches; in a partition past its context the kernel gives it an empty state,
/// which is never read.
pub(crate) fn attend_tile(
    kernels: &Kernels,
    q: &[f32],
    context: &[usize],
    kv: &KvView<'_>,
    scale: f32,
    out: &mut [f32],
) {
    let rows = context.len();
    assert!(rows <= TILE_ROWS, "attend_tile: {rows} rows");
    let longest = context.iter().copied().max().unwrap_or(0);
    let view = |p: usize| KvView {
        slots: partition(&kv.slots[..longest], p),
        ..*kv
    };
    let mut work = TileWork::new(q, kv.head_dim);
    walk(kernels.isa(), rows, partitions(longest), out, |p, state| {
        let start = p * POS_PARTITION;
        let reads: [usize; TILE_ROWS] = std::array::from_fn(|i| {
            context
                .get(i)
                .map_or(0, |&c| c.saturating_sub(start).min(POS_PARTITION))
        });
        kernels.attend_tile_partition(q, &reads[..rows], &view(p), scale, state, &mut work);
        (0..rows)
            .filter(|&i| reads[i] > 0)
            .fold(0, |m, i| m | 1 << i)
    });
}

/// The contract over `parts` partitions (at least one) for `heads` query heads into `out`:
/// `run(p, state)` computes partition `p` into `state` and returns the heads it reached (bit
/// `h` for head `h`); partition 0 is computed in place, each next one into a record and
/// folded into the heads it reached, then the state is divided.
fn walk(
    isa: Isa,
    heads: usize,
    parts: usize,
    out: &mut [f32],
    mut run: impl FnMut(usize, Partial<'_>) -> u64,
) {
    assert!(
        (1..=PARTIAL_HEADS_MAX).contains(&heads) && parts >= 1,
        "attention partitions: {heads} heads, {parts} partitions"
    );
    let (mut max, mut sum) = ([0.0f32; PARTIAL_HEADS_MAX], [0.0f32; PARTIAL_HEADS_MAX]);
    let mut state = Partial {
        acc: out,
        max: &mut max[..heads],
        sum: &mut sum[..heads],
    };
    run(0, state.reborrow());
    if parts > 1 {
        let d = state.acc.len() / heads;
        with_record(heads, d, |record| {
            for p in 1..parts {
                let reached = run(p, Partial::in_record(record, heads));
                fold_with(isa, &mut state, record, reached);
            }
        });
    }
    finish_with(isa, &mut state);
}
