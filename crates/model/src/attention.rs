//! Causal grouped-query attention of new tokens over a paged KV store.
//!
//! Every new token attends to positions `0..=pos` of its own sequence, read from the store
//! through the sequence's slots (its own K/V were written before this runs); on a layer with
//! a sliding window of `w` positions, to `pos + 1 - w ..= pos` only (the blocks before stay
//! in the store and are simply not read). When every sequence brings one token (decode), the
//! work is split as `decode_attention.rs` describes: tasks that read a token's K/V rows whole,
//! through the kernels' one-pass group attention. When a sequence brings several
//! (prefill, scoring, speculative verification), it is split into tasks of up to
//! [`TILE_ROWS`] consecutive tokens of one sequence, whose rows of each query head go through
//! the tile kernel together, so that a block of K/V rows is read once for all of them.
//!
//! Both kernels follow the one reduction order of [`tandem_kernels::attention`], fixed per
//! query head and context length, and are bitwise equal: a token's result is the same whether
//! it is computed alone, in a chunk, beside other sequences, or with any task split.

use tandem_kernels::attention::{attend_rows_with, attend_with, KvRows, KvView, TILE_ROWS};
use tandem_kernels::parallel::for_each_part_mut;
use tandem_kernels::{Isa, ThreadPool};

use crate::decode_attention::decode_attention;
pub use crate::decode_partitions::DecodeWork;

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

/// Head geometry and what a layer's attention reads.
#[derive(Debug, Clone, Copy)]
pub struct HeadShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// The query-key product's scale (usually `1 / sqrt(head_dim)`).
    pub scale: f32,
    /// The layer's sliding window in positions, if it has one.
    pub window: Option<usize>,
}

impl HeadShape {
    /// The first context position a token at `pos` attends to.
    pub(crate) fn first_position(&self, pos: usize) -> usize {
        self.window.map_or(0, |w| (pos + 1).saturating_sub(w))
    }
}

/// One layer's single-token decode, as its task splits read it (`decode_attention.rs`,
/// `decode_partitions.rs`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct DecodeInputs<'a> {
    pub isa: Isa,
    pub pool: &'a ThreadPool,
    pub shape: HeadShape,
    pub layout: &'a AttentionLayout<'a>,
    /// `[num_tokens, num_heads · head_dim]`
    pub q: &'a [f32],
    pub rows: KvRows<'a>,
}

impl<'a> DecodeInputs<'a> {
    /// The slots token `t` attends to (its context after its window).
    pub(crate) fn context(&self, t: usize) -> &'a [usize] {
        let pos = self.layout.positions[t];
        let slots = &self.layout.seq_slots[self.layout.token_seq[t]];
        &slots[self.shape.first_position(pos)..=pos]
    }
}

/// `out[t, h] = softmax_j(q[t, h] . k[j, kvh] * scale) . v[j, kvh]` over `j <= pos(t)`.
///
/// `q`, `out`: `[num_tokens, num_heads * head_dim]`; `rows`: the layer's keys and values,
/// `[num_slots, num_kv_heads * head_dim]` each; `work`: the memory of the decode's task
/// splits, kept by the caller so that a stream of steps allocates nothing.
#[allow(clippy::too_many_arguments)]
pub fn causal_attention(
    isa: Isa,
    pool: &ThreadPool,
    shape: HeadShape,
    layout: &AttentionLayout<'_>,
    q: &[f32],
    rows: KvRows<'_>,
    work: &mut DecodeWork,
    out: &mut [f32],
) {
    let runs = layout.token_seq.windows(2).any(|w| w[0] == w[1]);
    if runs {
        return tiled_attention(isa, pool, shape, layout, q, rows, out);
    }
    let inputs = DecodeInputs {
        isa,
        pool,
        shape,
        layout,
        q,
        rows,
    };
    decode_attention(&inputs, work, out);
}

/// [`causal_attention`] in tasks of up to [`TILE_ROWS`] consecutive tokens of one sequence,
/// every query head of them through the tile kernel. A task with a token whose window starts
/// past position 0 has rows with different first positions, which the tile kernel (one
/// shared start) cannot take: its rows go through the group kernel one by one, bitwise what
/// the tile kernel would give, at the cost of reading the window's K/V once per row.
fn tiled_attention(
    isa: Isa,
    pool: &ThreadPool,
    shape: HeadShape,
    layout: &AttentionLayout<'_>,
    q: &[f32],
    rows: KvRows<'_>,
    out: &mut [f32],
) {
    let HeadShape {
        num_heads,
        num_kv_heads,
        head_dim: d,
        scale,
        ..
    } = shape;
    let group = num_heads / num_kv_heads;
    let token_len = num_heads * d;
    let seqs = layout.token_seq;
    // Task boundaries in tokens: a new task at every change of sequence and every
    // `TILE_ROWS` tokens.
    let mut bounds = vec![0];
    for t in 1..seqs.len() {
        let start = bounds.last().copied().unwrap_or(0);
        if seqs[t] != seqs[t - 1] || t - start == TILE_ROWS {
            bounds.push(t);
        }
    }
    bounds.push(seqs.len());
    let tokens = bounds.clone();
    bounds.iter_mut().for_each(|b| *b *= token_len);
    for_each_part_mut(pool, out, &bounds, |i, out_tokens| {
        let first = tokens[i];
        let n = tokens[i + 1] - first;
        let positions = &layout.positions[first..first + n];
        if positions.iter().any(|&p| shape.first_position(p) > 0) {
            let seq_slots = &layout.seq_slots[seqs[first]];
            for (r, &pos) in positions.iter().enumerate() {
                let slots = &seq_slots[shape.first_position(pos)..=pos];
                for g in 0..num_kv_heads {
                    let kv = KvView {
                        rows,
                        row_stride: num_kv_heads * d,
                        offset: g * d,
                        head_dim: d,
                        slots,
                    };
                    let at = (first + r) * token_len + g * group * d;
                    let q_group = &q[at..at + group * d];
                    let out_at = r * token_len + g * group * d;
                    let out_group = &mut out_tokens[out_at..out_at + group * d];
                    attend_with(isa, q_group, &kv, scale, out_group);
                }
            }
            return;
        }
        let context: Vec<usize> = positions.iter().map(|&p| p + 1).collect();
        let longest = context.iter().copied().max().unwrap_or(0);
        let slots = &layout.seq_slots[seqs[first]][..longest];
        let mut q_rows = vec![0.0f32; n * d];
        let mut out_rows = vec![0.0f32; n * d];
        for h in 0..num_heads {
            for (r, row) in q_rows.chunks_exact_mut(d).enumerate() {
                row.copy_from_slice(&q[(first + r) * token_len + h * d..][..d]);
            }
            let kv = KvView {
                rows,
                row_stride: num_kv_heads * d,
                offset: h / group * d,
                head_dim: d,
                slots,
            };
            attend_rows_with(isa, &q_rows, &context, &kv, scale, &mut out_rows);
            for (r, row) in out_rows.chunks_exact(d).enumerate() {
                out_tokens[r * token_len + h * d..][..d].copy_from_slice(row);
            }
        }
    });
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Heads of `d` with the usual `1 / √d` scale.
    pub(crate) fn head_shape(
        heads: usize,
        kv_heads: usize,
        d: usize,
        window: Option<usize>,
    ) -> HeadShape {
        HeadShape {
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim: d,
            scale: 1.0 / (d as f32).sqrt(),
            window,
        }
    }

    /// [`causal_attention`] of `q` for the tokens at `positions` of the sequences `token_seq`
    /// (their slots in `seq_slots`) on a pool of `threads`, into a fresh output.
    pub(crate) fn attention_of(
        threads: usize,
        shape: HeadShape,
        positions: &[usize],
        token_seq: &[usize],
        seq_slots: &[Vec<usize>],
        q: &[f32],
        rows: KvRows<'_>,
    ) -> Vec<f32> {
        let mut out = vec![f32::NAN; q.len()];
        let layout = AttentionLayout {
            positions,
            token_seq,
            seq_slots,
        };
        let (pool, mut work) = (ThreadPool::new(threads), DecodeWork::default());
        causal_attention(
            Isa::best(),
            &pool,
            shape,
            &layout,
            q,
            rows,
            &mut work,
            &mut out,
        );
        out
    }

    pub(crate) fn same_bits(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    }

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
        let shape = head_shape(heads, kv_heads, d, None);
        let rows = KvRows::F32 {
            keys: &keys,
            values: &values,
        };
        let out = attention_of(2, shape, &positions, &[0, 0], &slots, &q, rows);
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

    /// A token computed alone (with 3 threads, each GQA group's heads split into parts) gets
    /// the bits it gets beside other tokens (one task per group), whatever the thread count.
    #[test]
    fn a_token_alone_equals_the_token_in_a_batch() {
        let (heads, kv_heads, d) = (6, 2, 20);
        let f = |i: usize| ((i * 7919 % 1000) as f32 / 500.0) - 1.0;
        let keys: Vec<f32> = (0..9 * kv_heads * d).map(|i| f(i + 5)).collect();
        let values: Vec<f32> = (0..9 * kv_heads * d).map(|i| f(i + 17)).collect();
        let slots = vec![vec![8, 1, 4, 6, 0, 3], vec![2, 5, 7]];
        let shape = head_shape(heads, kv_heads, d, None);
        let q: Vec<f32> = (0..4 * heads * d).map(|i| f(i + 31)).collect();
        let rows = KvRows::F32 {
            keys: &keys,
            values: &values,
        };
        let run = |threads: usize, positions: &[usize], token_seq: &[usize], q: &[f32]| {
            attention_of(threads, shape, positions, token_seq, &slots, q, rows)
        };
        let batch = run(2, &[3, 4, 5, 2], &[0, 0, 0, 1], &q);
        let row = heads * d;
        for (t, (pos, seq)) in [(3, 0), (4, 0), (5, 0), (2, 1)].into_iter().enumerate() {
            for threads in [1, 2, 3] {
                let alone = run(threads, &[pos], &[seq], &q[t * row..][..row]);
                let same = same_bits(&alone, &batch[t * row..][..row]);
                assert!(same, "token {t} with {threads} threads");
            }
        }
    }

    /// With a window of 3, a token reads only its last 3 positions: equal to the definition
    /// over those, and bitwise the same computed alone (group kernel) or in a prefill run
    /// (rows whose window starts past 0 go through the group kernel, the others the tile).
    #[test]
    fn a_window_limits_the_context_and_keeps_batch_invariance() {
        let (heads, kv_heads, d, window) = (4, 2, 8, 3);
        let f = |i: usize| ((i * 7919 % 1000) as f32 / 500.0) - 1.0;
        let keys: Vec<f32> = (0..8 * kv_heads * d).map(|i| f(i + 7)).collect();
        let values: Vec<f32> = (0..8 * kv_heads * d).map(|i| f(i + 19)).collect();
        let slots = vec![vec![5, 0, 7, 2, 6, 1, 3]];
        let shape = HeadShape {
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim: d,
            scale: 0.3,
            window: Some(window),
        };
        let row = heads * d;
        let q: Vec<f32> = (0..7 * row).map(|i| f(i + 41)).collect();
        let rows = KvRows::F32 {
            keys: &keys,
            values: &values,
        };
        let run = |positions: &[usize], q: &[f32]| {
            let token_seq = vec![0; positions.len()];
            attention_of(2, shape, positions, &token_seq, &slots, q, rows)
        };
        let prefill = run(&[0, 1, 2, 3, 4, 5, 6], &q);
        for pos in 0..7 {
            let alone = run(&[pos], &q[pos * row..][..row]);
            let same = same_bits(&alone, &prefill[pos * row..][..row]);
            assert!(same, "position {pos}: alone differs from the prefill");
            let first = (pos + 1).saturating_sub(window);
            for h in 0..heads {
                let kvh = h / 2;
                let at = |buf: &[f32], s: usize| buf[(s * kv_heads + kvh) * d..][..d].to_vec();
                let seen = &slots[0][first..=pos];
                let ks: Vec<_> = seen.iter().map(|&s| at(&keys, s)).collect();
                let vs: Vec<_> = seen.iter().map(|&s| at(&values, s)).collect();
                // `reference` scales by 1/sqrt(d); scale q so that the product is `0.3 q.k`.
                let qh: Vec<f32> = q[pos * row + h * d..][..d]
                    .iter()
                    .map(|x| x * 0.3 * (d as f32).sqrt())
                    .collect();
                let want = reference(&qh, &ks, &vs);
                for (g, w) in alone[h * d..][..d].iter().zip(&want) {
                    assert!(
                        (*g as f64 - w).abs() < 1e-5,
                        "pos {pos} head {h}: {g} vs {w}"
                    );
                }
            }
        }
    }

    /// Past a partition (128 positions) the context is folded from its partitions: a
    /// 400-token prefill (tile kernel, or rows one by one under a window) gives every token
    /// the bits it gets decoded alone on 2 threads (its partitions spread over tasks), and
    /// both match the definition.
    #[test]
    fn long_contexts_decode_with_the_bits_of_their_prefill() {
        let (heads, kv_heads, d, n) = (6, 2, 20, 400);
        let f = |i: usize| ((i * 7919 % 1000) as f32 / 500.0) - 1.0;
        let keys: Vec<f32> = (0..n * kv_heads * d).map(|i| f(i + 13)).collect();
        let values: Vec<f32> = (0..n * kv_heads * d).map(|i| f(i + 37)).collect();
        // Scattered slots, as a paged pool hands them out.
        let slots = vec![(0..n).map(|i| i * 7 % n).collect::<Vec<usize>>()];
        let row = heads * d;
        let q: Vec<f32> = (0..n * row).map(|i| f(i + 59)).collect();
        let rows = KvRows::F32 {
            keys: &keys,
            values: &values,
        };
        for window in [None, Some(150)] {
            let shape = head_shape(heads, kv_heads, d, window);
            let run = |positions: &[usize], q: &[f32]| {
                let token_seq = vec![0; positions.len()];
                attention_of(2, shape, positions, &token_seq, &slots, q, rows)
            };
            let all: Vec<usize> = (0..n).collect();
            let prefill = run(&all, &q);
            for pos in [0, 127, 128, 129, 255, 256, 300, 399] {
                let alone = run(&[pos], &q[pos * row..][..row]);
                let same = same_bits(&alone, &prefill[pos * row..][..row]);
                assert!(
                    same,
                    "position {pos}, window {window:?}: decode differs from prefill"
                );
                let seen = &slots[0][shape.first_position(pos)..=pos];
                for h in 0..heads {
                    let at =
                        |buf: &[f32], s: usize| buf[(s * kv_heads + h / 3) * d..][..d].to_vec();
                    let ks: Vec<_> = seen.iter().map(|&s| at(&keys, s)).collect();
                    let vs: Vec<_> = seen.iter().map(|&s| at(&values, s)).collect();
                    let want = reference(&q[pos * row + h * d..][..d], &ks, &vs);
                    for (g, w) in alone[h * d..][..d].iter().zip(&want) {
                        assert!(
                            (*g as f64 - w).abs() < 1e-5,
                            "pos {pos} head {h}: {g} vs {w}"
                        );
                    }
                }
            }
        }
    }
}
