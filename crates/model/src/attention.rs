//! Causal grouped-query attention of new tokens over a paged KV store.
//!
//! Every new token attends to positions `0..=pos` of its own sequence, read from the store
//! through the sequence's slots (its own K/V were written before this runs). The reduction
//! order over positions and head dimensions is fixed per token, so a token's result is the
//! same whether it is computed alone, in a chunk, or beside other sequences.

use tandem_kernels::ops::dot_fixed;
use tandem_kernels::parallel::for_each_chunk_mut;
use tandem_kernels::ThreadPool;

/// Where each new token of the batch sits: its position and its sequence's slot list.
#[derive(Debug)]
pub struct AttentionLayout<'a> {
    /// `[num_tokens]` position of each new token.
    pub positions: &'a [usize],
    /// `[num_tokens]` index into `seq_slots` of each token's sequence.
    pub token_seq: &'a [usize],
    /// Per sequence: the KV slot of each context position `0..context_len`.
    pub seq_slots: &'a [Vec<usize>],
}

/// Head geometry.
#[derive(Debug, Clone, Copy)]
pub struct HeadShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

/// `out[t, h] = softmax_j(q[t, h] . k[j, kvh] * scale) . v[j, kvh]` over `j <= pos(t)`.
///
/// `q`, `out`: `[num_tokens, num_heads * head_dim]`; `keys`, `values`:
/// `[num_slots, num_kv_heads * head_dim]`.
pub fn causal_attention(
    pool: &ThreadPool,
    shape: HeadShape,
    layout: &AttentionLayout<'_>,
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    out: &mut [f32],
) {
    let HeadShape {
        num_heads,
        num_kv_heads,
        head_dim,
    } = shape;
    let q_dim = num_heads * head_dim;
    let kv_dim = num_kv_heads * head_dim;
    let group = num_heads / num_kv_heads;
    let scale = 1.0 / (head_dim as f32).sqrt();
    for_each_chunk_mut(pool, out, q_dim, |t, out_row| {
        let pos = layout.positions[t];
        let slots = &layout.seq_slots[layout.token_seq[t]][..=pos];
        let mut scores = vec![0.0f32; slots.len()]; // [pos + 1]
        for h in 0..num_heads {
            let kv_off = (h / group) * head_dim;
            let q_head = &q[t * q_dim + h * head_dim..][..head_dim];
            for (s, &slot) in scores.iter_mut().zip(slots) {
                let k = &keys[slot * kv_dim + kv_off..][..head_dim];
                *s = dot_fixed(q_head, k) * scale;
            }
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut denom = 0.0f32;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                denom += *s;
            }
            let o = &mut out_row[h * head_dim..(h + 1) * head_dim];
            o.fill(0.0);
            for (&w, &slot) in scores.iter().zip(slots) {
                let v = &values[slot * kv_dim + kv_off..][..head_dim];
                for (a, &b) in o.iter_mut().zip(v) {
                    *a += w * b;
                }
            }
            let inv = 1.0 / denom;
            o.iter_mut().for_each(|a| *a *= inv);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plain f64 attention for one token and head, from the definition.
    fn reference(q: &[f32], ks: &[Vec<f32>], vs: &[Vec<f32>]) -> Vec<f64> {
        let d = q.len();
        let s: Vec<f64> = ks
            .iter()
            .map(|k| {
                q.iter()
                    .zip(k)
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum::<f64>()
                    / (d as f64).sqrt()
            })
            .collect();
        let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = w.iter().sum();
        (0..d)
            .map(|i| {
                w.iter()
                    .zip(vs)
                    .map(|(wj, v)| wj * v[i] as f64)
                    .sum::<f64>()
                    / z
            })
            .collect()
    }

    #[test]
    fn matches_definition_with_gqa_and_scattered_slots() {
        let (heads, kv_heads, d) = (4, 2, 8);
        let n_slots = 12;
        let f = |i: usize| ((i * 7919 % 1000) as f32 / 500.0) - 1.0;
        let keys: Vec<f32> = (0..n_slots * kv_heads * d).map(|i| f(i + 3)).collect();
        let values: Vec<f32> = (0..n_slots * kv_heads * d).map(|i| f(i + 11)).collect();
        let slots = vec![vec![9, 2, 5, 0, 7]];
        let positions = [3usize, 4];
        let q: Vec<f32> = (0..2 * heads * d).map(|i| f(i + 101)).collect();
        let mut out = vec![0.0; 2 * heads * d];
        let layout = AttentionLayout {
            positions: &positions,
            token_seq: &[0, 0],
            seq_slots: &slots,
        };
        let shape = HeadShape {
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim: d,
        };
        causal_attention(
            &ThreadPool::new(2),
            shape,
            &layout,
            &q,
            &keys,
            &values,
            &mut out,
        );
        for (t, &pos) in positions.iter().enumerate() {
            for h in 0..heads {
                let kvh = h / 2;
                let row = |buf: &[f32], s: usize| buf[(s * kv_heads + kvh) * d..][..d].to_vec();
                let ks: Vec<_> = slots[0][..=pos].iter().map(|&s| row(&keys, s)).collect();
                let vs: Vec<_> = slots[0][..=pos].iter().map(|&s| row(&values, s)).collect();
                let want = reference(&q[(t * heads + h) * d..][..d], &ks, &vs);
                let got = &out[(t * heads + h) * d..][..d];
                for (g, w) in got.iter().zip(&want) {
                    assert!(
                        (*g as f64 - w).abs() < 1e-5,
                        "token {t} head {h}: {g} vs {w}"
                    );
                }
            }
        }
    }
}
