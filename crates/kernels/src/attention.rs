//! Attention of a group of query heads over the K/V rows of one sequence, in one pass with an
//! online (streaming) softmax.
//!
//! The query heads of a GQA group share one KV head, so they are computed together and every
//! K/V row is read once per group. Positions are processed in blocks of [`POS_BLOCK`]; for
//! each query head and block, in this order (the numeric contract; every variant performs
//! exactly these f32 operations, the maximum of step 2 in any order):
//!
//! 1. `s[j] = dot(q, k[j]) · scale` for the block's positions `j`: 16 lane sums, lane `l`
//!    accumulating `q[c]·k[c]` for `c ≡ l (mod 16)` in increasing `c` with fused multiply-adds,
//!    then the fixed tree of [`crate::dot16::tree_sum`];
//! 2. `m' = max(m, s[0], s[1], …)`, NaN scores ignored as [`f32::max`] ignores them (`m`
//!    starts at −∞); a maximum's order matters only for the sign of a zero maximum, which no
//!    later result sees (every use subtracts it from a score or a maximum, and `exp(±0)` is
//!    1), so the scalar reference folds and the SIMD kernels reduce by halving;
//! 3. if `m` was finite and `m' > m`: `c = exp(m − m')`, `l ← l · c`, `acc[d] ← acc[d] · c`;
//! 4. `p[j] = exp(s[j] − m')`, then `l ← l + p[j]` in increasing `j`;
//! 5. `acc[d] ← fma(p[j], v[j][d], acc[d])` in increasing `j` (fused: one rounding);
//!
//! These steps run over one **partition** of the context at a time: [`POS_PARTITION`]
//! positions counted from the context's first slot (the last partition shorter), each from a
//! fresh state (`m = −∞`, `l = 0`, `acc = 0`). With one partition the result is
//! `out[d] = acc[d] · (1 / l)`. With more, the partitions' states are folded in order first
//! ([`fold_partitions`]: `M' = max(M, m_p)`, `a = exp(M − M')`, `b = exp(m_p − M')`,
//! `L ← L·a + l_p·b`, `ACC[d] ← ACC[d]·a + acc_p[d]·b`, unfused), then divided the same way.
//! Fixed partitions let one long sequence's decode spread over the threads, a partition per
//! task, with the bits it gets in one task (and those of the tile kernel that scores it).
//!
//! `exp` is [`exp_fixed`], a polynomial made of plain multiplications and additions, so a
//! SIMD lane computes the same bits as the scalar function. The order depends only on the
//! context length: a query's result does not depend on the other queries of the group, the
//! batch, the chunking or the thread split, and the SIMD variants are **bitwise equal** to
//! the scalar reference ([`attend_group_scalar`]).

mod kv_rows;
mod partitions;
mod reference;
mod tile_work;

use crate::isa::{self, Isa};
use crate::simd::Kernels;

pub(crate) use kv_rows::{HeadRows, KvPlane, KvRow};
pub use kv_rows::{KvRows, KvView, Q8Rows, Q8_GROUP};
pub(crate) use partitions::Partial;
pub use partitions::{
    fold_partitions, partition, partitions, record_len, PARTIAL_HEADS_MAX, POS_PARTITION,
};
pub(crate) use reference::{attend_group_scalar, attend_tile_scalar};
pub(crate) use tile_work::TileWork;

/// Context positions per block of the online softmax (fixed: part of the numeric contract).
pub const POS_BLOCK: usize = 16;

/// Most query heads one kernel call handles; larger groups are split (results unchanged:
/// every query head is computed on its own).
pub const GROUP_MAX: usize = 8;

/// Most query rows one call of the tile kernel ([`attend_rows`]) computes together: one per
/// vector lane.
pub const TILE_ROWS: usize = 16;

/// Most KV heads one call of the group kernel walks together ([`attend_heads_with`]).
pub const KV_HEADS_MAX: usize = 8;

/// Largest head the tile kernel takes (its buffers live on the stack); rows of larger heads
/// go through the group kernel one by one (bitwise the same).
pub(crate) const TILE_HEAD_DIM_MAX: usize = 256;

/// `out[i] = softmax_j(q[i] · k[j] · scale) · v[j]` over the context of `kv`, for every query
/// head `i` of `q` (`[g, head_dim]`; `out` alike), with the process-wide kernels
/// ([`isa::active`]).
///
/// Panics if the shapes do not match or the context is empty (caller bugs).
pub fn attend(q: &[f32], kv: &KvView<'_>, scale: f32, out: &mut [f32]) {
    attend_with(isa::active(), q, kv, scale, out);
}

/// [`attend`] with the kernels of `isa` (bitwise equal for every ISA; for tests and
/// benchmarks that compare variants in one process).
///
/// Panics if the shapes do not match, the context is empty or this CPU cannot run `isa`.
pub fn attend_with(isa: Isa, q: &[f32], kv: &KvView<'_>, scale: f32, out: &mut [f32]) {
    let d = kv.head_dim;
    assert!(
        d > 0 && q.len() == out.len() && q.len().is_multiple_of(d),
        "attend: q has {} elements, out {}, head_dim {d}",
        q.len(),
        out.len()
    );
    kv.assert_head_in_row("attend");
    assert!(!kv.slots.is_empty(), "attend: empty context");
    let kernels = Kernels::new(isa)
        .unwrap_or_else(|| panic!("attend: this CPU cannot run the {isa} kernels"));
    let chunk = GROUP_MAX * d;
    for (qg, og) in q.chunks(chunk).zip(out.chunks_mut(chunk)) {
        partitions::attend_group(&kernels, qg, kv, 1, scale, og);
    }
}

/// [`attend`] for the query heads of `kv_heads` consecutive KV heads, the first at
/// `kv.offset`: `q` (`out` alike) holds their GQA groups one after the other, each of
/// `q.len() / (kv_heads · head_dim)` heads, and group `h` attends to the KV head at
/// `kv.offset + h · head_dim`. Bitwise [`attend`] of each group on its own; the groups walk
/// the context together, block by block, so that the span of a slot's row they cover (the
/// whole row when they are all the layer's KV heads) is read in one pass (decode of many
/// sequences, where the rows come from memory, not from the caches).
///
/// Panics if the shapes do not match, the heads do not lie within a slot's row, the context
/// is empty or this CPU cannot run `isa`.
pub fn attend_heads_with(
    isa: Isa,
    q: &[f32],
    kv: &KvView<'_>,
    kv_heads: usize,
    scale: f32,
    out: &mut [f32],
) {
    assert_eq!(
        q.len(),
        out.len(),
        "attend_heads: q and out differ in length"
    );
    let kernels = checked_heads(isa, q, kv, kv_heads, "attend_heads");
    let d = kv.head_dim;
    let group = q.len() / (kv_heads * d);
    if group > GROUP_MAX || kv_heads > KV_HEADS_MAX {
        // Groups too large to walk together: one KV head at a time (the same bits).
        let groups = q.chunks(group * d).zip(out.chunks_mut(group * d));
        for (h, (qh, oh)) in groups.enumerate() {
            let head = KvView {
                offset: kv.offset + h * d,
                ..*kv
            };
            attend_with(isa, qh, &head, scale, oh);
        }
        return;
    }
    partitions::attend_group(&kernels, q, kv, kv_heads, scale, out);
}

/// The state that [`attend_heads_with`] reaches over `kv`'s context when that is one
/// partition, or one partition of a longer context (at most [`POS_PARTITION`] positions),
/// written to `record` ([`record_len`] of the query heads): what [`fold_partitions`] turns
/// into the bits of the whole context in one call, from the records of its partitions in
/// order. For decode tasks that take a partition range of a long context each; `next`: the
/// slots that follow (the next partition's, or none), whose first block is prefetched (the
/// result does not depend on it).
///
/// Panics as [`attend_heads_with`] does, if the context is longer than a partition, a group
/// has more than [`GROUP_MAX`] heads or there are more than [`KV_HEADS_MAX`] KV heads.
pub fn attend_partition_with(
    isa: Isa,
    q: &[f32],
    kv: &KvView<'_>,
    kv_heads: usize,
    scale: f32,
    next: &[usize],
    record: &mut [f32],
) {
    let kernels = checked_heads(isa, q, kv, kv_heads, "attend_partition");
    let heads = q.len() / kv.head_dim;
    assert!(
        kv.slots.len() <= POS_PARTITION
            && heads / kv_heads <= GROUP_MAX
            && kv_heads <= KV_HEADS_MAX
            && record.len() == record_len(heads, kv.head_dim),
        "attend_partition: {} positions, {heads} query heads of {kv_heads} KV heads, a record of {}",
        kv.slots.len(),
        record.len()
    );
    let state = Partial::in_record(record, heads);
    kernels.attend_partition(q, kv, kv_heads, scale, state, next);
}

/// The kernels of `isa` after the checks of the entry points that take `kv_heads` KV heads'
/// query heads `q` over `kv` (`caller` names the entry point in a panic).
fn checked_heads(isa: Isa, q: &[f32], kv: &KvView<'_>, kv_heads: usize, caller: &str) -> Kernels {
    let d = kv.head_dim;
    let span = kv_heads * d;
    assert!(
        span > 0 && q.len().is_multiple_of(span),
        "{caller}: q has {} elements for {kv_heads} KV heads of {d}",
        q.len(),
    );
    let widest = KvView {
        head_dim: span,
        ..*kv
    };
    widest.assert_head_in_row(caller);
    // Each head too: 8-bit rows need every head, not only their span, on whole groups.
    kv.assert_head_in_row(caller);
    assert!(!kv.slots.is_empty(), "{caller}: empty context");
    Kernels::new(isa).unwrap_or_else(|| panic!("{caller}: this CPU cannot run the {isa} kernels"))
}

/// `out[i] = softmax_j(q[i] · k[j] · scale) · v[j]` over the first `context[i]` positions of
/// `kv`, for every query row `i` of `q` (`[n, head_dim]`; `out` alike): rows of one KV head,
/// each with its own context length (the tokens of a prefill chunk), with the process-wide
/// kernels.
///
/// Each row's result is bitwise the result of [`attend`] for that row alone over
/// `kv.slots[..context[i]]`; [`TILE_ROWS`] rows are computed together, one per vector lane,
/// so that a block's K/V rows are read and widened once for all of them and the score dots
/// need no horizontal sums.
///
/// Panics if the shapes do not match or a context length is 0 or longer than `kv.slots`.
pub fn attend_rows(q: &[f32], context: &[usize], kv: &KvView<'_>, scale: f32, out: &mut [f32]) {
    attend_rows_with(isa::active(), q, context, kv, scale, out);
}

/// [`attend_rows`] with the kernels of `isa` (bitwise equal for every ISA).
///
/// Panics as [`attend_rows`] does, or if this CPU cannot run `isa`.
pub fn attend_rows_with(
    isa: Isa,
    q: &[f32],
    context: &[usize],
    kv: &KvView<'_>,
    scale: f32,
    out: &mut [f32],
) {
    let d = kv.head_dim;
    assert!(
        d > 0 && q.len() == out.len() && q.len() == context.len() * d,
        "attend_rows: q has {} elements, out {}, {} rows of {d}",
        q.len(),
        out.len(),
        context.len()
    );
    kv.assert_head_in_row("attend_rows");
    assert!(
        context.iter().all(|&c| c >= 1 && c <= kv.slots.len()),
        "attend_rows: context lengths must lie in 1..={}",
        kv.slots.len()
    );
    let kernels = Kernels::new(isa)
        .unwrap_or_else(|| panic!("attend_rows: this CPU cannot run the {isa} kernels"));
    if d > TILE_HEAD_DIM_MAX {
        // Rows one by one through the group kernel (the same bits).
        let rows = q.chunks_exact(d).zip(out.chunks_mut(d));
        for ((qi, oi), &n) in rows.zip(context) {
            let view = KvView {
                slots: &kv.slots[..n],
                ..*kv
            };
            partitions::attend_group(&kernels, qi, &view, 1, scale, oi);
        }
        return;
    }
    let chunk = TILE_ROWS * d;
    let tiles = q.chunks(chunk).zip(out.chunks_mut(chunk));
    for ((qt, ot), ct) in tiles.zip(context.chunks(TILE_ROWS)) {
        partitions::attend_tile(&kernels, qt, ct, kv, scale, ot);
    }
}

/// Steps 2 and 3 of the module docs: the new running maximum after the block's scores `s`,
/// and the factor `exp(m − m')` that rescales the running sums when the maximum grew from a
/// finite value (`None`: no rescaling).
#[inline(always)]
pub(crate) fn block_max(m: f32, s: &[f32]) -> (f32, Option<f32>) {
    grown_max(m, s.iter().copied().fold(f32::NEG_INFINITY, f32::max))
}

/// [`block_max`] given the block's largest score that is no NaN (`top`; −∞ if none): the
/// same new maximum, whatever order found `top`. (Only the sign of a zero maximum may
/// differ, and it changes no later result: every use subtracts it from a score or a
/// maximum, and `exp` of `±0` is 1.)
#[inline(always)]
pub(crate) fn grown_max(m: f32, top: f32) -> (f32, Option<f32>) {
    let m_new = f32::max(m, top);
    let c = (m > f32::NEG_INFINITY && m_new > m).then(|| exp_fixed(m - m_new));
    (m_new, c)
}

/// `l + p[0] + p[1] + …`, left to right.
#[inline(always)]
pub(crate) fn add_in_order(l: f32, p: &[f32]) -> f32 {
    p.iter().fold(l, |acc, &x| acc + x)
}

/// The constants of [`exp_fixed`] (shared with its SIMD form).
pub(crate) mod exp_consts {
    /// Inputs are clamped to `[MIN_X, MAX_X]` (results stay normal and finite).
    pub const MIN_X: f32 = -87.0;
    pub const MAX_X: f32 = 88.0;
    pub const LOG2E: f32 = std::f32::consts::LOG2_E;
    /// `1.5 · 2^23`: adding it rounds to an integer (ties to even) held in the low mantissa.
    pub const ROUND: f32 = 12_582_912.0;
    /// `ln 2` split so that `n · LN2_HI` is exact for `|n| ≤ 127` (Cody–Waite).
    pub const LN2_HI: f32 = f32::from_bits(0x3F31_8000); // 0.693359375, 9 significant bits
    pub const LN2_LO: f32 = -2.121_944_4e-4;
    /// `exp(r) ≈ 1 + r + r² · P(r)` on `|r| ≤ ln 2 / 2`, highest degree first.
    pub const P: [f32; 6] = [
        1.987_569_1e-4,
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        0.166_666_65,
        0.5,
    ];
    /// `bits(ROUND) − 127`: subtracting it from `bits(ROUND + n)` leaves the biased exponent
    /// of `2^n`.
    pub const EXP_BIAS: u32 = 0x4B40_0000 - 127;
}

/// `e^x` to about 2 ulp for `x` in `[-87, 88]` (inputs outside are clamped; NaN stays NaN),
/// from multiplications and additions only: `x = n · ln 2 + r`, a degree-7 polynomial for
/// `e^r`, times `2^n` built from its exponent bits. The SIMD kernels run the same operations
/// lane by lane, so they give the same bits.
#[inline(always)]
pub fn exp_fixed(x: f32) -> f32 {
    use exp_consts::*;
    // `a > b ? a : b` (the SIMD max/min operand order), which keeps a NaN `x`.
    let x = if MIN_X > x { MIN_X } else { x };
    let x = if MAX_X < x { MAX_X } else { x };
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let z = r * r;
    let mut y = P[0];
    for c in &P[1..] {
        y = y * r + c;
    }
    let y = y * z + r + 1.0;
    let pow2 = f32::from_bits(t.to_bits().wrapping_sub(EXP_BIAS) << 23);
    y * pow2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_fixed_is_close_to_exp() {
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = (x as f64).exp();
            let got = exp_fixed(x) as f64;
            assert!(
                ((got - want) / want).abs() < 3e-7,
                "exp({x}) = {got}, want {want}"
            );
            x += 0.0137;
        }
        assert_eq!(exp_fixed(0.0), 1.0);
        assert!(exp_fixed(f32::NAN).is_nan());
        assert!(exp_fixed(f32::NEG_INFINITY) < 1e-37);
        assert!(exp_fixed(1000.0).is_finite());
    }

    #[test]
    fn block_max_rescales_only_when_a_finite_maximum_grows() {
        assert_eq!(block_max(f32::NEG_INFINITY, &[1.0, 3.0, 2.0]), (3.0, None));
        assert_eq!(block_max(3.0, &[1.0, 2.0]), (3.0, None));
        let (m, c) = block_max(1.0, &[0.0, 2.0]);
        assert_eq!(m, 2.0);
        assert_eq!(c, Some(exp_fixed(-1.0)));
    }
}
