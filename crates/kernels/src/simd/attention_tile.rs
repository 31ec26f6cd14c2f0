//! The tile form of [`crate::attention`]'s kernel: up to [`TILE_ROWS`] query rows of one KV
//! head, each with its own context length, one row per vector lane (the tokens of a prefill
//! chunk, or of a scored text).
//!
//! It performs the reference's operations row by row, so every row is bitwise equal to the
//! scalar reference: the score of row `i` at position `j` is lane `i` of 16 partial-sum
//! vectors (partial `t` accumulates `q[c]·k[c]` for `c ≡ t (mod 16)` in increasing `c` with
//! fused multiply-adds, `k[j][c]` broadcast to every lane) added lane-wise by the tree of
//! [`crate::dot16::tree_sum`]: the contract's dot without a horizontal sum. The running
//! maximum folds the block's scores lane-wise in position order; `exp` runs on all rows at
//! once; positions past a row's context get the score −∞, which leaves its maximum untouched,
//! and are left out of its sum and values, which are updated row by row as in the group
//! kernel. A block's K and V rows are widened to f32 once for all the rows. A call covers
//! one partition of the rows' contexts and leaves each row's state (a row whose context
//! ends before the partition reads none of it: an empty state, which is never folded).

use super::attention::{accumulate, exp, scale_row, Element};
use super::lanes::Lanes16;
use crate::attention::{
    exp_fixed, HeadRows, KvPlane, KvRows, KvView, Partial, Q8Rows, TileWork, POS_BLOCK,
    TILE_HEAD_DIM_MAX, TILE_ROWS,
};
use crate::dot16::LANES;

/// Largest head the tile kernel handles (its buffers live on the stack; larger heads never
/// reach it, see [`crate::attention::attend_rows_with`]).
const HEAD_DIM_MAX: usize = TILE_HEAD_DIM_MAX;

/// As [`crate::attention::attend_tile_scalar`] (bitwise equal).
///
/// # Safety
/// The CPU must support `V`'s features. Shapes are asserted.
#[inline(always)]
unsafe fn attend_kv_tile<V: Lanes16>(
    q: &[f32],
    context: &[usize],
    kv: &KvView<'_>,
    scale: f32,
    state: Partial<'_>,
    work: &mut TileWork,
) {
    match kv.rows {
        KvRows::F32 { keys, values } => {
            attend_tile::<V, &[f32]>(q, context, &kv.head(keys, values), scale, state, work)
        }
        KvRows::F16 { keys, values } => {
            attend_tile::<V, &[half::f16]>(q, context, &kv.head(keys, values), scale, state, work)
        }
        KvRows::Q8 { keys, values } => {
            attend_tile::<V, Q8Rows<'_>>(q, context, &kv.head(keys, values), scale, state, work)
        }
    }
}

/// The tile kernel over rows of one element type (`head_dim <= HEAD_DIM_MAX`).
///
/// # Safety
/// The CPU must support `V`'s features. Shapes are asserted.
#[inline(always)]
unsafe fn attend_tile<V: Lanes16, P: KvPlane>(
    q: &[f32],
    context: &[usize],
    kv: &HeadRows<'_, P>,
    scale: f32,
    state: Partial<'_>,
    work: &mut TileWork,
) where
    P::Row: Element,
{
    let d = kv.head_dim;
    let n = context.len();
    let Partial { acc: out, max, sum } = state;
    assert!(
        n <= TILE_ROWS
            && d <= HEAD_DIM_MAX
            && q.len() == n * d
            && out.len() == q.len()
            && max.len() == n
            && sum.len() == n,
        "attend_tile: {n} rows, {} query elements, {} outputs, head_dim {d}",
        q.len(),
        out.len()
    );
    assert!(
        context.iter().all(|&c| c <= kv.slots.len()),
        "attend_tile: context lengths must lie in 0..={}",
        kv.slots.len()
    );
    let full = d - d % LANES;
    let TileWork {
        qt,
        kt,
        vt,
        s,
        part,
    } = work;
    let mut m = [f32::NEG_INFINITY; TILE_ROWS];
    let mut l = [0.0f32; TILE_ROWS];
    let mut m_new = [0.0f32; TILE_ROWS];
    let mut rescale = [1.0f32; TILE_ROWS];
    out.fill(0.0);
    let longest = context.iter().copied().max().unwrap_or(0);
    for (b, block) in kv.slots[..longest].chunks(POS_BLOCK).enumerate() {
        let nb = block.len();
        // The positions of this block that each row reads.
        let reads: [usize; TILE_ROWS] = std::array::from_fn(|i| {
            context
                .get(i)
                .map_or(0, |&c| c.saturating_sub(b * POS_BLOCK).min(nb))
        });
        for (j, &slot) in block.iter().enumerate() {
            widen::<V, P::Row>(kv.key(slot), &mut kt[j * d..][..d], full);
            widen::<V, P::Row>(kv.value(slot), &mut vt[j * d..][..d], full);
        }
        scores::<V>(qt, kt, d, nb, part);
        let sv = V::splat(scale);
        for (j, sj) in s[..nb].iter_mut().enumerate() {
            tree::<V>(part, j).mul(sv).store(sj.as_mut_ptr());
        }
        for (i, &r) in reads[..n].iter().enumerate() {
            s[r..nb].iter_mut().for_each(|sj| sj[i] = f32::NEG_INFINITY);
        }
        // `max(m, s[0], s[1], …)` left to right, lane-wise (`s > m ? s : m`, as `f32::max`
        // for the reference's inputs; the sign of a zero maximum changes no later result).
        let mut mv = V::load(m.as_ptr());
        for sj in &s[..nb] {
            mv = V::load(sj.as_ptr()).max(mv);
        }
        mv.store(m_new.as_mut_ptr());
        // Rows whose maximum grew from a finite value rescale their values now and their sum
        // below (the others scale it by 1, which changes no bit). A row reading nothing of
        // the block keeps its maximum.
        for i in 0..n {
            rescale[i] = 1.0;
            if m[i] > f32::NEG_INFINITY && m_new[i] > m[i] {
                let c = exp_fixed(m[i] - m_new[i]);
                rescale[i] = c;
                scale_row::<V>(&mut out[i * d..][..d], c, full);
            }
            m[i] = m_new[i];
        }
        for sj in &mut s[..nb] {
            exp::<V>(V::load(sj.as_ptr()).sub(mv)).store(sj.as_mut_ptr());
        }
        for (i, &r) in reads[..n].iter().enumerate() {
            s[r..nb].iter_mut().for_each(|sj| sj[i] = 0.0);
        }
        // `l · c + p[0] + p[1] + …` lane-wise (the probabilities past a row's context are 0,
        // and adding 0 to the non-negative sum changes no bit; so does scaling by 1).
        let mut lv = V::load(l.as_ptr()).mul(V::load(rescale.as_ptr()));
        for sj in &s[..nb] {
            lv = lv.add(V::load(sj.as_ptr()));
        }
        lv.store(l.as_mut_ptr());
        let mut i = 0;
        while i < n {
            let r = reads[i];
            if i + 4 <= n && reads[i + 1..i + 4].iter().all(|&x| x == r) {
                if r > 0 {
                    accumulate_4::<V>(&mut out[i * d..][..4 * d], s, i, &vt[..], d, r, full);
                }
                i += 4;
            } else {
                if r > 0 {
                    let p: [f32; POS_BLOCK] = std::array::from_fn(|j| s[j][i]);
                    let v_rows: [&[f32]; POS_BLOCK] = std::array::from_fn(|j| &vt[j * d..][..d]);
                    accumulate::<V, &[f32]>(&mut out[i * d..][..d], &p[..r], &v_rows[..r], full);
                }
                i += 1;
            }
        }
    }
    max.copy_from_slice(&m[..n]);
    sum.copy_from_slice(&l[..n]);
}

/// The partial sums of the dots of every row (lanes) with the keys `kt` (`[nb, d]`): partial
/// `t` of position `j` accumulates `q[c] · k[j][c]` for `c ≡ t (mod 16)` in increasing `c`
/// with fused multiply-adds, into `part[t · POS_BLOCK + j]` (partials past `d` are 0). A
/// query column is loaded once for all the positions.
///
/// # Safety
/// The CPU must support `V`'s features; `qt` holds `d · TILE_ROWS` elements, `kt` `nb · d`.
#[inline(always)]
unsafe fn scores<V: Lanes16>(
    qt: &[f32],
    kt: &[f32],
    d: usize,
    nb: usize,
    part: &mut [[f32; TILE_ROWS]],
) {
    debug_assert!(qt.len() >= d * TILE_ROWS && kt.len() >= nb * d && nb <= POS_BLOCK);
    if nb == POS_BLOCK {
        scores_n::<V, POS_BLOCK>(qt, kt, d, part, 0);
    } else {
        for j in 0..nb {
            scores_n::<V, 1>(qt, &kt[j * d..], d, part, j);
        }
    }
}

/// [`scores`] for the `N` positions from `j0` on (`kt` starting at position `j0`), with `N`
/// accumulators in registers.
///
/// # Safety
/// As for [`scores`], with `j0 + N <= POS_BLOCK` and `kt` holding `N · d` elements.
#[inline(always)]
unsafe fn scores_n<V: Lanes16, const N: usize>(
    qt: &[f32],
    kt: &[f32],
    d: usize,
    part: &mut [[f32; TILE_ROWS]],
    j0: usize,
) {
    debug_assert!(j0 + N <= POS_BLOCK && kt.len() >= N * d);
    let (q, k) = (qt.as_ptr(), kt.as_ptr());
    for t in 0..LANES {
        let mut acc = [V::zero(); N];
        let mut c = t;
        while c < d {
            let qc = V::load(q.add(c * TILE_ROWS));
            for (j, a) in acc.iter_mut().enumerate() {
                *a = qc.mul_add(V::splat(*k.add(j * d + c)), *a);
            }
            c += LANES;
        }
        for (j, a) in acc.iter().enumerate() {
            a.store(part[t * POS_BLOCK + j0 + j].as_mut_ptr());
        }
    }
}

/// The dot of every row with position `j`: its 16 partials added lane-wise by the tree of
/// `dot16::tree_sum`.
///
/// # Safety
/// The CPU must support `V`'s features; `part` was filled by [`scores`] for position `j`.
#[inline(always)]
unsafe fn tree<V: Lanes16>(part: &[[f32; TILE_ROWS]], j: usize) -> V {
    // (Loops, not `array::from_fn`: its closure would not inherit the target features.)
    let mut v = [V::zero(); LANES];
    for (t, v) in v.iter_mut().enumerate() {
        *v = V::load(part[t * POS_BLOCK + j].as_ptr());
    }
    let mut width = LANES / 2;
    while width > 0 {
        for t in 0..width {
            v[t] = v[t].add(v[t + width]);
        }
        width /= 2;
    }
    v[0]
}

/// [`accumulate`] for the four rows `i..i + 4` of `out` (`[4, d]`), which read the same `r`
/// positions with the probabilities `s[j][i + x]`: every row gets the operations it gets
/// alone, and each value vector is loaded once for the four.
///
/// # Safety
/// The CPU must support `V`'s features; `vt` holds `r · d` elements; `full` is `d` rounded
/// down to 16.
#[inline(always)]
unsafe fn accumulate_4<V: Lanes16>(
    out: &mut [f32],
    s: &[[f32; TILE_ROWS]; POS_BLOCK],
    i: usize,
    vt: &[f32],
    d: usize,
    r: usize,
    full: usize,
) {
    debug_assert!(out.len() == 4 * d && vt.len() >= r * d && i + 4 <= TILE_ROWS);
    const TILE: usize = 4;
    let o = out.as_mut_ptr();
    let v = vt.as_ptr();
    let mut c = 0;
    while c + TILE * LANES <= full {
        let mut a = [[V::zero(); TILE]; 4];
        for (x, ax) in a.iter_mut().enumerate() {
            for (t, a) in ax.iter_mut().enumerate() {
                *a = V::load(o.add(x * d + c + t * LANES));
            }
        }
        for (j, sj) in s.iter().enumerate().take(r) {
            let mut vj = [V::zero(); TILE];
            for (t, vv) in vj.iter_mut().enumerate() {
                *vv = V::load(v.add(j * d + c + t * LANES));
            }
            for (x, ax) in a.iter_mut().enumerate() {
                let w = V::splat(sj[i + x]);
                for (a, &vv) in ax.iter_mut().zip(&vj) {
                    *a = w.mul_add(vv, *a);
                }
            }
        }
        for (x, ax) in a.iter().enumerate() {
            for (t, a) in ax.iter().enumerate() {
                a.store(o.add(x * d + c + t * LANES));
            }
        }
        c += TILE * LANES;
    }
    while c < full {
        let mut a = [V::zero(); 4];
        for (x, a) in a.iter_mut().enumerate() {
            *a = V::load(o.add(x * d + c));
        }
        for (j, sj) in s.iter().enumerate().take(r) {
            let vv = V::load(v.add(j * d + c));
            for (x, a) in a.iter_mut().enumerate() {
                *a = V::splat(sj[i + x]).mul_add(vv, *a);
            }
        }
        for (x, a) in a.iter().enumerate() {
            a.store(o.add(x * d + c));
        }
        c += LANES;
    }
    for x in 0..4 {
        for c in full..d {
            let a = &mut *o.add(x * d + c);
            for (j, sj) in s.iter().enumerate().take(r) {
                *a = sj[i + x].mul_add(*v.add(j * d + c), *a);
            }
        }
    }
}

/// `dst = src` widened to f32 (`full`: the length rounded down to 16).
///
/// # Safety
/// The CPU must support `V`'s features; `src` holds `dst.len()` elements.
#[inline(always)]
unsafe fn widen<V: Lanes16, E: Element>(src: E, dst: &mut [f32], full: usize) {
    for c in (0..full).step_by(LANES) {
        src.load::<V>(c).store(dst.as_mut_ptr().add(c));
    }
    for (c, x) in dst.iter_mut().enumerate().skip(full) {
        *x = src.at(c);
    }
}

/// # Safety
/// AVX-512 F/BW/VL and F16C must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub(super) unsafe fn attend_tile_avx512(
    q: &[f32],
    context: &[usize],
    kv: &KvView<'_>,
    scale: f32,
    state: Partial<'_>,
    work: &mut TileWork,
) {
    attend_kv_tile::<super::avx512::Z>(q, context, kv, scale, state, work)
}

/// # Safety
/// AVX2, FMA and F16C must be available.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn attend_tile_avx2(
    q: &[f32],
    context: &[usize],
    kv: &KvView<'_>,
    scale: f32,
    state: Partial<'_>,
    work: &mut TileWork,
) {
    attend_kv_tile::<super::avx2::Y>(q, context, kv, scale, state, work)
}
