//! The scalar reference of the attention kernels: the numeric contract of
//! [`crate::attention`] written out operation by operation, one partition of a context per
//! call (the SIMD kernels are bitwise equal to it).

use super::{
    add_in_order, block_max, exp_fixed, HeadRows, KvPlane, KvRow, KvRows, KvView, Partial,
    TileWork, GROUP_MAX, POS_BLOCK,
};
use crate::dot16;

/// The scalar form of the tile kernel over one partition: every row on its own through the
/// reference, over its first `context[i]` slots (0: an empty state, which the caller never
/// reads).
pub(crate) fn attend_tile_scalar(
    q: &[f32],
    context: &[usize],
    kv: &KvView<'_>,
    scale: f32,
    state: Partial<'_>,
    _work: &mut TileWork,
) {
    let d = kv.head_dim;
    let rows = q.chunks_exact(d).zip(state.acc.chunks_exact_mut(d));
    let stats = state.max.iter_mut().zip(state.sum.iter_mut());
    for (((qi, acc), (max, sum)), &n) in rows.zip(stats).zip(context) {
        let view = KvView {
            slots: &kv.slots[..n],
            ..*kv
        };
        let row = Partial {
            acc,
            max: std::slice::from_mut(max),
            sum: std::slice::from_mut(sum),
        };
        attend_one_scalar(qi, &view, scale, row);
    }
}

/// The scalar reference of the group kernel over one partition (the state
/// [`attend_partition_with`] writes) for at most [`GROUP_MAX`] query heads per KV head: each
/// group on its own, in the order of the module docs. Shapes are checked by the callers.
pub(crate) fn attend_group_scalar(
    q: &[f32],
    kv: &KvView<'_>,
    kv_heads: usize,
    scale: f32,
    mut state: Partial<'_>,
    _next: &[usize],
) {
    let n = q.len() / kv_heads.max(1);
    let g = n / kv.head_dim.max(1);
    if g == 0 {
        return;
    }
    for (h, qh) in q.chunks(n).enumerate() {
        let head = KvView {
            offset: kv.offset + h * kv.head_dim,
            ..*kv
        };
        attend_one_scalar(qh, &head, scale, state.heads_mut(h * g, g));
    }
}

/// The scalar reference for at most [`GROUP_MAX`] query heads of one KV head.
fn attend_one_scalar(q: &[f32], kv: &KvView<'_>, scale: f32, state: Partial<'_>) {
    match kv.rows {
        KvRows::F32 { keys, values } => attend_rows_scalar(q, &kv.head(keys, values), scale, state),
        KvRows::F16 { keys, values } => attend_widened(q, &kv.head(keys, values), scale, state),
        KvRows::Q8 { keys, values } => attend_widened(q, &kv.head(keys, values), scale, state),
    }
}

/// [`attend_rows_scalar`] over the context's rows of this head read as f32 ([`KvRow::at`]),
/// in position order.
fn attend_widened<P: KvPlane>(q: &[f32], kv: &HeadRows<'_, P>, scale: f32, state: Partial<'_>) {
    let d = kv.head_dim;
    let widen = |row: P::Row| (0..d).map(move |c| row.at(c));
    let k: Vec<f32> = kv.slots.iter().flat_map(|&s| widen(kv.key(s))).collect();
    let v: Vec<f32> = kv.slots.iter().flat_map(|&s| widen(kv.value(s))).collect();
    let slots: Vec<usize> = (0..kv.slots.len()).collect();
    let widened = HeadRows {
        keys: &k[..],
        values: &v[..],
        row_stride: d,
        offset: 0,
        head_dim: d,
        slots: &slots,
    };
    attend_rows_scalar(q, &widened, scale, state)
}

/// [`attend_one_scalar`] over f32 rows: steps 1 to 5 of the module docs over every block.
fn attend_rows_scalar(q: &[f32], kv: &HeadRows<'_, &[f32]>, scale: f32, state: Partial<'_>) {
    let d = kv.head_dim;
    let g = q.len() / d;
    assert!(g <= GROUP_MAX, "attend_group: {g} query heads");
    let Partial {
        acc: out,
        max: m,
        sum: l,
    } = state;
    out.fill(0.0);
    m.fill(f32::NEG_INFINITY);
    l.fill(0.0);
    let mut p = [[0.0f32; POS_BLOCK]; GROUP_MAX];
    for block in kv.slots.chunks(POS_BLOCK) {
        for (j, &slot) in block.iter().enumerate() {
            let k = kv.key(slot);
            for (i, qi) in q.chunks_exact(d).enumerate() {
                p[i][j] = fused_dot(qi, k) * scale;
            }
        }
        for (i, acc) in out.chunks_exact_mut(d).enumerate() {
            let s = &mut p[i][..block.len()];
            let (m_new, c) = block_max(m[i], s);
            if let Some(c) = c {
                l[i] *= c;
                acc.iter_mut().for_each(|a| *a *= c);
            }
            m[i] = m_new;
            for x in s.iter_mut() {
                *x = exp_fixed(*x - m_new);
            }
            l[i] = add_in_order(l[i], s);
        }
        for (j, &slot) in block.iter().enumerate() {
            let v = kv.value(slot);
            for (i, acc) in out.chunks_exact_mut(d).enumerate() {
                for (a, &b) in acc.iter_mut().zip(v) {
                    *a = p[i][j].mul_add(b, *a);
                }
            }
        }
    }
}

/// Step 1's dot of the module docs: 16 lanes of fused multiply-adds, then the tree.
fn fused_dot(q: &[f32], k: &[f32]) -> f32 {
    let mut acc = [0.0f32; dot16::LANES];
    for (c, (&a, &b)) in q.iter().zip(k).enumerate() {
        let lane = &mut acc[c % dot16::LANES];
        *lane = a.mul_add(b, *lane);
    }
    dot16::tree_sum(&acc)
}
