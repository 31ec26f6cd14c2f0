//! The SIMD form of [`crate::attention`]'s group kernel, generic over the 16-lane vector.
//!
//! It performs the operations of the scalar reference in the same order, lane by lane: the
//! dots as 16 lanes of fused multiply-adds (scalar tail, the tree of [`crate::dot16`]), `exp`
//! as the vector form of [`crate::attention::exp_fixed`] on the 16 scores of a block at once,
//! and the value accumulation with 16 head dimensions per vector (fused multiply-adds,
//! positions in increasing order). f16 rows are widened exactly as they are loaded, 8-bit
//! rows multiplied by their group's scale (one rounding, the reference's too). The
//! results are bitwise equal to the scalar reference. A block's K and V rows are located once
//! for all the group's query heads; with AVX-512's 32 registers each key vector is widened
//! once for three heads at a time (their 3 × 8 score accumulators stay in registers) and each
//! value vector once for four (4 × 4 output accumulators), so a GQA group pays its f16
//! conversions once, not once per head. AVX2, with a quarter of the vectors in registers,
//! keeps one head at a time. Several KV heads of one token can walk the context together,
//! block by block, so that a batched decode reads each slot's row whole in one pass. A call
//! covers one partition of a context and leaves its state (sums and maxima, not yet divided);
//! `crate::attention::partitions` folds and finishes them.

use std::arch::x86_64::{_mm_loadu_si128, _mm_prefetch, _MM_HINT_T1};

use half::f16;

use super::lanes::Lanes16;
use crate::attention::exp_consts::{EXP_BIAS, LN2_HI, LN2_LO, LOG2E, MAX_X, MIN_X, P, ROUND};
use crate::attention::{
    add_in_order, grown_max, HeadRows, KvPlane, KvRow, KvRows, KvView, Partial, Q8Rows, GROUP_MAX,
    KV_HEADS_MAX, POS_BLOCK, Q8_GROUP,
};
use crate::dot16::{tree_sum, LANES};

/// One head's K or V row of a slot, in a store's format, read 16 elements at a time as f32
/// (and one at a time by [`KvRow::at`]).
pub(super) trait Element: KvRow {
    /// Elements `c..c + 16`, as f32.
    ///
    /// # Safety
    /// The CPU must support `V`'s features; `c + 16` must not exceed the row's length.
    unsafe fn load<V: Lanes16>(self, c: usize) -> V;
    /// Asks for the row's lines to be brought into L2.
    fn prefetch(self);
    /// Whether widening a vector needs registers of its own (8-bit codes: the codes and
    /// their scale), so that the kernels keep fewer accumulators live while they load.
    const NARROW: bool = false;
}

/// Asks for the `bytes` bytes from `p` to be brought into L2 (in decode the rows come from
/// memory, at addresses the hardware prefetcher cannot guess). Into L2 rather than L1: the
/// lines of a block exceed what L1 can have in flight, and batched decode attention measured
/// faster so (BENCHMARKS.md § Figures behind choices in the code).
#[inline(always)]
fn prefetch_bytes(p: *const i8, bytes: usize) {
    for off in (0..bytes).step_by(64) {
        // SAFETY: prefetching never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(off)) };
    }
}

impl Element for &[f32] {
    #[inline(always)]
    unsafe fn load<V: Lanes16>(self, c: usize) -> V {
        V::load(self.as_ptr().add(c))
    }
    #[inline(always)]
    fn prefetch(self) {
        prefetch_bytes(self.as_ptr().cast(), std::mem::size_of_val(self));
    }
}

impl Element for &[f16] {
    #[inline(always)]
    unsafe fn load<V: Lanes16>(self, c: usize) -> V {
        // `f16` is a transparent little-endian `u16`.
        V::load_f16(self.as_ptr().add(c).cast())
    }
    #[inline(always)]
    fn prefetch(self) {
        prefetch_bytes(self.as_ptr().cast(), std::mem::size_of_val(self));
    }
}

impl Element for Q8Rows<'_> {
    const NARROW: bool = true;
    /// `c` is a multiple of 16, so the 16 elements share one scale.
    #[inline(always)]
    unsafe fn load<V: Lanes16>(self, c: usize) -> V {
        let codes = _mm_loadu_si128(self.codes.as_ptr().add(c).cast());
        V::from_i8(codes).mul(V::splat(*self.scales.as_ptr().add(c / Q8_GROUP)))
    }
    #[inline(always)]
    fn prefetch(self) {
        prefetch_bytes(self.codes.as_ptr(), self.codes.len());
        prefetch_bytes(
            self.scales.as_ptr().cast(),
            std::mem::size_of_val(self.scales),
        );
    }
}

/// As [`crate::attention::attend_group_scalar`] (bitwise equal), for either element type.
///
/// # Safety
/// The CPU must support `V`'s features. Shapes are asserted.
#[inline(always)]
unsafe fn attend_kv<V: Lanes16>(
    q: &[f32],
    kv: &KvView<'_>,
    kv_heads: usize,
    scale: f32,
    state: Partial<'_>,
    next: &[usize],
) {
    match kv.rows {
        KvRows::F32 { keys, values } => {
            attend_group::<V, &[f32]>(q, &kv.head(keys, values), kv_heads, scale, state, next)
        }
        KvRows::F16 { keys, values } => {
            attend_group::<V, &[f16]>(q, &kv.head(keys, values), kv_heads, scale, state, next)
        }
        KvRows::Q8 { keys, values } => {
            let kv = kv.head(keys, values);
            attend_group::<V, Q8Rows<'_>>(q, &kv, kv_heads, scale, state, next)
        }
    }
}

/// As [`crate::attention::attend_group_scalar`] (bitwise equal), for the query heads of
/// `kv_heads` consecutive KV heads from `kv.offset` on: `q` holds their groups one after the
/// other, each of the same number of heads. The groups advance through the context together,
/// block by block, so that a block's rows are read whole (every KV head of a slot at once)
/// rather than once per head; each group's operations are those it would perform alone.
/// The state is left in `state` (`state.acc` `[kv_heads · g, d]`, not yet divided by the sum).
/// `next`: the slots that follow `kv`'s (the next partition's; may be empty), whose first
/// block the last block prefetches as every block prefetches the one after it.
///
/// # Safety
/// The CPU must support `V`'s features. Shapes are asserted.
#[inline(always)]
unsafe fn attend_group<V: Lanes16, P: KvPlane>(
    q: &[f32],
    kv: &HeadRows<'_, P>,
    kv_heads: usize,
    scale: f32,
    state: Partial<'_>,
    next: &[usize],
) where
    P::Row: Element,
{
    let d = kv.head_dim;
    let span = kv_heads * d;
    let g = q.len() / span.max(1);
    let Partial { acc: out, max, sum } = state;
    assert!(
        (1..=KV_HEADS_MAX).contains(&kv_heads)
            && g <= GROUP_MAX
            && q.len() == g * span
            && out.len() == q.len()
            && max.len() == kv_heads * g
            && sum.len() == max.len()
            && kv.offset + span <= kv.row_stride,
        "attend_group: {} query elements, {} outputs, {kv_heads} KV heads of {d}",
        q.len(),
        out.len()
    );
    out.fill(0.0);
    let mut running = [Running::new(); KV_HEADS_MAX];
    let blocks = kv.slots.chunks(POS_BLOCK);
    // The block after the last: the first of the next partition, where one follows.
    let after = (!next.is_empty()).then_some(&next[..next.len().min(POS_BLOCK)]);
    for (block, next) in blocks.clone().zip(blocks.skip(1).map(Some).chain([after])) {
        for (h, running) in running.iter_mut().enumerate().take(kv_heads) {
            let head = HeadRows {
                offset: kv.offset + h * d,
                ..*kv
            };
            let at = h * g * d..(h + 1) * g * d;
            group_block::<V, P>(
                &q[at.clone()],
                &head,
                block,
                scale,
                &mut out[at],
                running,
                next,
            );
        }
    }
    for (h, running) in running.iter().enumerate().take(kv_heads) {
        max[h * g..][..g].copy_from_slice(&running.m[..g]);
        sum[h * g..][..g].copy_from_slice(&running.l[..g]);
    }
}

/// The running maximum `m` and sum `l` of each query head of a group.
#[derive(Clone, Copy)]
struct Running {
    m: [f32; GROUP_MAX],
    l: [f32; GROUP_MAX],
}

impl Running {
    fn new() -> Running {
        Running {
            m: [f32::NEG_INFINITY; GROUP_MAX],
            l: [0.0; GROUP_MAX],
        }
    }
}

/// Steps 1 to 5 of [`crate::attention`]'s order for one block of positions and the `g` query
/// heads of one KV head (`q`, `out`: `[g, d]`), updating their running maxima and sums. The
/// keys of the `next` block are prefetched before the scores, its values before the
/// accumulation: spread so, a whole token's K/V rows ahead never ask for more lines at once
/// than the caches take in flight (asked for all at once, in a task of three KV heads, they
/// measured slower than the head-by-head passes they replace).
///
/// # Safety
/// The CPU must support `V`'s features; the shapes are those [`attend_group`] asserted.
#[inline(always)]
unsafe fn group_block<V: Lanes16, P: KvPlane>(
    q: &[f32],
    kv: &HeadRows<'_, P>,
    block: &[usize],
    scale: f32,
    out: &mut [f32],
    running: &mut Running,
    next: Option<&[usize]>,
) where
    P::Row: Element,
{
    let Running { m, l } = running;
    let d = kv.head_dim;
    if let Some(next) = next {
        next.iter().for_each(|&slot| kv.key(slot).prefetch());
    }
    let g = q.len() / d;
    let full = d - d % LANES;
    let nb = block.len();
    // Scores, then probabilities, of the block; lanes past the block's end are ignored.
    let mut p = [[0.0f32; POS_BLOCK]; GROUP_MAX];
    // Past the block's end, the first row stands in (its lanes are ignored; no value row
    // past the end is read).
    let mut k_rows: [P::Row; POS_BLOCK] = [kv.key(block[0]); POS_BLOCK];
    let mut v_rows: [P::Row; POS_BLOCK] = [kv.value(block[0]); POS_BLOCK];
    for (j, &slot) in block.iter().enumerate() {
        k_rows[j] = kv.key(slot);
        v_rows[j] = kv.value(slot);
    }
    let mut first = 0;
    if full == d && V::IN_REGISTERS >= 32 {
        // Three heads at a time share each widened key vector.
        while first + SCORE_HEADS <= g {
            let sums = scores_3::<V, P::Row>(&q[first * d..][..SCORE_HEADS * d], &k_rows);
            for (i, sum) in sums.into_iter().enumerate() {
                sum.mul(V::splat(scale)).store(p[first + i].as_mut_ptr());
            }
            first += SCORE_HEADS;
        }
    }
    for i in first..g {
        let qi = &q[i * d..][..d];
        if full == d {
            scores::<V, P::Row>(qi, &k_rows)
                .mul(V::splat(scale))
                .store(p[i].as_mut_ptr());
        } else {
            for (s, k) in p[i].iter_mut().zip(&k_rows[..nb]) {
                *s = dot::<V, P::Row>(qi, *k, full) * scale;
            }
            // As the stand-in rows do above: lanes past the block's end repeat its first.
            let first_score = p[i][0];
            p[i][nb..].fill(first_score);
        }
    }
    for i in 0..g {
        let acc = &mut out[i * d..][..d];
        // Every lane holds a score of the block; NaN lanes become −∞ (`s > −∞ ? s : −∞`),
        // which `f32::max` in the reference's fold ignores too.
        let lanes = V::load(p[i].as_ptr()).max(V::splat(f32::NEG_INFINITY));
        let (m_new, c) = grown_max(m[i], lanes.max_lane());
        if let Some(c) = c {
            l[i] *= c;
            scale_row::<V>(acc, c, full);
        }
        m[i] = m_new;
        let s = V::load(p[i].as_ptr()).sub(V::splat(m_new));
        exp::<V>(s).store(p[i].as_mut_ptr());
        l[i] = add_in_order(l[i], &p[i][..nb]);
    }
    if let Some(next) = next {
        next.iter().for_each(|&slot| kv.value(slot).prefetch());
    }
    // Up to four heads at a time share each widened value vector where the registers hold
    // their 16 accumulators.
    let at_once = if V::IN_REGISTERS >= 32 {
        HEADS_AT_ONCE
    } else {
        1
    };
    let mut i = 0;
    while i < g {
        let heads = at_once.min(g - i);
        accumulate_heads::<V, P::Row>(
            &mut out[i * d..][..heads * d],
            &p[i..i + heads],
            nb,
            &v_rows[..nb],
            full,
        );
        i += heads;
    }
}

/// The dots of `q` with the 16 rows `k`, lane `j` holding `q · k[j]` in the order of
/// [`crate::dot16::dot_1`] (every row as long as `q`, a multiple of 16): 16 independent
/// accumulators, summed by one transposing tree.
///
/// # Safety
/// The CPU must support `V`'s features; every `k[j].len() == q.len()`, a multiple of 16.
#[inline(always)]
unsafe fn scores<V: Lanes16, E: Element>(q: &[f32], k: &[E; POS_BLOCK]) -> V {
    let mut acc = [V::zero(); POS_BLOCK];
    for c in (0..q.len()).step_by(LANES) {
        let qv = V::load(q.as_ptr().add(c));
        for j in 0..POS_BLOCK {
            acc[j] = qv.mul_add(k[j].load::<V>(c), acc[j]);
        }
    }
    V::tree_sum_16(&acc)
}

/// Query heads whose values [`accumulate_heads`] accumulates together (4 heads × 4 vectors of
/// dimensions: 16 accumulators).
const HEADS_AT_ONCE: usize = 4;

/// [`accumulate`] for `p.len()` (at most [`HEADS_AT_ONCE`]) query heads of one GQA group at
/// once, `acc` holding their rows one after the other: each value vector is loaded (and
/// widened) once for all of them. Per head and dimension the operations and their order are
/// those of [`accumulate`], so the bits are the same.
///
/// # Safety
/// As [`accumulate`]; `acc.len() == p.len() · d` with `d` every `v[j].len()`.
#[inline(always)]
unsafe fn accumulate_heads<V: Lanes16, E: Element>(
    acc: &mut [f32],
    p: &[[f32; POS_BLOCK]],
    nb: usize,
    v: &[E],
    full: usize,
) {
    const TILE: usize = 4;
    let h = p.len();
    let d = acc.len() / h.max(1);
    debug_assert!(h <= HEADS_AT_ONCE && acc.len() == h * d);
    let o = acc.as_mut_ptr();
    let mut c = 0;
    while c + TILE * LANES <= full {
        let mut a = [[V::zero(); TILE]; HEADS_AT_ONCE];
        for (i, a) in a.iter_mut().enumerate().take(h) {
            for (t, a) in a.iter_mut().enumerate() {
                *a = V::load(o.add(i * d + c + t * LANES));
            }
        }
        for (j, row) in v.iter().enumerate().take(nb) {
            let mut vv = [V::zero(); TILE];
            for (t, vv) in vv.iter_mut().enumerate() {
                *vv = row.load::<V>(c + t * LANES);
            }
            for (i, a) in a.iter_mut().enumerate().take(h) {
                let wv = V::splat(p[i][j]);
                for (a, &vv) in a.iter_mut().zip(&vv) {
                    *a = wv.mul_add(vv, *a);
                }
            }
        }
        for (i, a) in a.iter().enumerate().take(h) {
            for (t, a) in a.iter().enumerate() {
                a.store(o.add(i * d + c + t * LANES));
            }
        }
        c += TILE * LANES;
    }
    if c < d {
        // The dimensions left (fewer than 64): each head on its own, as `accumulate` does
        // them.
        for (i, p) in p.iter().enumerate() {
            accumulate_from::<V, E>(&mut acc[i * d..(i + 1) * d], &p[..nb], v, full, c);
        }
    }
}

/// Query heads whose scores [`scores_3`] computes together.
const SCORE_HEADS: usize = 3;

/// [`scores`] of three query heads (`q`: `[3, d]`) at once, a part of a block of positions at
/// a time (half a block: 3 × 8 accumulators stay in registers; a quarter for rows whose
/// conversion needs registers of its own, [`Element::NARROW`]): each key vector is loaded
/// and widened once for the three. Per head and position the fused multiply-adds run in the
/// order of [`scores`] and the same tree sums them, so the bits are the same.
///
/// # Safety
/// As [`scores`], with `q.len() == 3 · d`.
#[inline(always)]
unsafe fn scores_3<V: Lanes16, E: Element>(q: &[f32], k: &[E; POS_BLOCK]) -> [V; SCORE_HEADS] {
    if E::NARROW {
        scores_3_by::<V, E, { POS_BLOCK / 4 }>(q, k)
    } else {
        scores_3_by::<V, E, { POS_BLOCK / 2 }>(q, k)
    }
}

/// [`scores_3`], `PART` positions at a time.
///
/// # Safety
/// As [`scores_3`].
#[inline(always)]
unsafe fn scores_3_by<V: Lanes16, E: Element, const PART: usize>(
    q: &[f32],
    k: &[E; POS_BLOCK],
) -> [V; SCORE_HEADS] {
    let d = q.len() / SCORE_HEADS;
    let mut acc = [[V::zero(); POS_BLOCK]; SCORE_HEADS];
    for part in 0..POS_BLOCK / PART {
        let mut a = [[V::zero(); PART]; SCORE_HEADS];
        for c in (0..d).step_by(LANES) {
            let qv: [V; SCORE_HEADS] = [
                V::load(q.as_ptr().add(c)),
                V::load(q.as_ptr().add(d + c)),
                V::load(q.as_ptr().add(2 * d + c)),
            ];
            for j in 0..PART {
                let kv = k[part * PART + j].load::<V>(c);
                for i in 0..SCORE_HEADS {
                    a[i][j] = qv[i].mul_add(kv, a[i][j]);
                }
            }
        }
        for i in 0..SCORE_HEADS {
            acc[i][part * PART..(part + 1) * PART].copy_from_slice(&a[i]);
        }
    }
    [
        V::tree_sum_16(&acc[0]),
        V::tree_sum_16(&acc[1]),
        V::tree_sum_16(&acc[2]),
    ]
}

/// `acc[d] = fma(p[j], v[j][d], acc[d])` for `j` in increasing order (one rounding each),
/// four vectors of dimensions at a time so that four addition chains overlap.
///
/// # Safety
/// The CPU must support `V`'s features; every `v[j].len() == acc.len()`; `full` is that
/// length rounded down to 16.
#[inline(always)]
pub(super) unsafe fn accumulate<V: Lanes16, E: Element>(
    acc: &mut [f32],
    p: &[f32],
    v: &[E],
    full: usize,
) {
    accumulate_from::<V, E>(acc, p, v, full, 0)
}

/// [`accumulate`] of the dimensions from `start` (a multiple of 16) on.
///
/// # Safety
/// As [`accumulate`].
#[inline(always)]
unsafe fn accumulate_from<V: Lanes16, E: Element>(
    acc: &mut [f32],
    p: &[f32],
    v: &[E],
    full: usize,
    start: usize,
) {
    const TILE: usize = 4;
    let o = acc.as_mut_ptr();
    let mut c = start;
    while c + TILE * LANES <= full {
        let mut a = [V::zero(); TILE];
        for (t, a) in a.iter_mut().enumerate() {
            *a = V::load(o.add(c + t * LANES));
        }
        for (&w, row) in p.iter().zip(v) {
            let wv = V::splat(w);
            for (t, a) in a.iter_mut().enumerate() {
                *a = wv.mul_add(row.load::<V>(c + t * LANES), *a);
            }
        }
        for (t, a) in a.iter().enumerate() {
            a.store(o.add(c + t * LANES));
        }
        c += TILE * LANES;
    }
    while c < full {
        let mut a = V::load(o.add(c));
        for (&w, row) in p.iter().zip(v) {
            a = V::splat(w).mul_add(row.load::<V>(c), a);
        }
        a.store(o.add(c));
        c += LANES;
    }
    for (c, a) in acc.iter_mut().enumerate().skip(full) {
        for (&w, row) in p.iter().zip(v) {
            *a = w.mul_add(row.at(c), *a);
        }
    }
}

/// `q · k` in the order of [`crate::dot16::dot_1`]; `full` is `len` rounded down to 16.
///
/// # Safety
/// The CPU must support `V`'s features; `q.len() == k.len()`.
#[inline(always)]
unsafe fn dot<V: Lanes16, E: Element>(q: &[f32], k: E, full: usize) -> f32 {
    let mut acc = V::zero();
    for c in (0..full).step_by(LANES) {
        acc = V::load(q.as_ptr().add(c)).mul_add(k.load::<V>(c), acc);
    }
    if full == q.len() {
        acc.tree_sum()
    } else {
        // The tail: lane `i` adds `q[full + i] · k[full + i]`, fused.
        let mut lanes = acc.to_array();
        for (i, (a, &qv)) in lanes.iter_mut().zip(&q[full..]).enumerate() {
            *a = qv.mul_add(k.at(full + i), *a);
        }
        tree_sum(&lanes)
    }
}

/// `row[d] *= c` for every element (`full`: the length rounded down to 16).
///
/// # Safety
/// The CPU must support `V`'s features.
#[inline(always)]
pub(super) unsafe fn scale_row<V: Lanes16>(row: &mut [f32], c: f32, full: usize) {
    let o = row.as_mut_ptr();
    let cv = V::splat(c);
    for i in (0..full).step_by(LANES) {
        V::load(o.add(i)).mul(cv).store(o.add(i));
    }
    for a in &mut row[full..] {
        *a *= c;
    }
}

/// [`crate::attention::exp_fixed`] on every lane (the same operations, so the same bits).
///
/// # Safety
/// The CPU must support `V`'s features.
#[inline(always)]
pub(super) unsafe fn exp<V: Lanes16>(x: V) -> V {
    let x = V::splat(MIN_X).max(x);
    let x = V::splat(MAX_X).min(x);
    let t = x.mul(V::splat(LOG2E)).add(V::splat(ROUND));
    let n = t.sub(V::splat(ROUND));
    let r = x.sub(n.mul(V::splat(LN2_HI))).sub(n.mul(V::splat(LN2_LO)));
    let z = r.mul(r);
    let mut y = V::splat(P[0]);
    for &c in &P[1..] {
        y = y.mul(r).add(V::splat(c));
    }
    let y = y.mul(z).add(r).add(V::splat(1.0));
    y.mul(t.shifted_exponent(EXP_BIAS))
}

/// # Safety
/// AVX-512 F/BW/VL and F16C must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub(super) unsafe fn attend_group_avx512(
    q: &[f32],
    kv: &KvView<'_>,
    kv_heads: usize,
    scale: f32,
    state: Partial<'_>,
    next: &[usize],
) {
    attend_kv::<super::avx512::Z>(q, kv, kv_heads, scale, state, next)
}

/// # Safety
/// AVX2, FMA and F16C must be available.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn attend_group_avx2(
    q: &[f32],
    kv: &KvView<'_>,
    kv_heads: usize,
    scale: f32,
    state: Partial<'_>,
    next: &[usize],
) {
    attend_kv::<super::avx2::Y>(q, kv, kv_heads, scale, state, next)
}
