//! The attention of single-token decode: every sequence of the batch brings one new token, and
//! the work is split into tasks for the pool.
//!
//! A slot's row holds every KV head of a position. A task takes `kv_heads` consecutive KV
//! heads of one token (all of them, up to [`KV_HEADS_MAX`]) and walks them through the
//! context together, so that each row is read whole, in one pass: a task per (token, KV head)
//! read a head's share of every row on its own pass, which ran 1.3–2.3x slower once the K/V
//! come from memory (BENCHMARKS.md § Figures behind choices in the code). When the batch has
//! fewer tokens than the pool has threads, tasks take fewer KV heads (down to one, the
//! head's share of each row), and if that still leaves a thread idle (one sequence of a model
//! with a single KV head), each GQA group's query heads are split into parts, each of which
//! reads the group's K/V itself.
//!
//! Few tokens with long contexts are split the other way, along their contexts: tasks of
//! partitions (`decode_partitions.rs`), which read whole rows and keep every thread busy
//! with one sequence.
//!
//! Every query head's result is computed by the kernels' group attention, which gives a head
//! the same bits whatever other heads share its call, and the same whether its context's
//! partitions are walked by one task or spread over several: a token's result does not
//! depend on the split, the batch or the thread count.

use std::ops::Range;

use tandem_kernels::attention::{attend_heads_with, KvView, KV_HEADS_MAX};
use tandem_kernels::parallel::{for_each_chunk_mut, for_each_part_mut};

use crate::attention::DecodeInputs;
use crate::decode_partitions::{attend_in_partitions, DecodeWork};

/// How a decode batch is cut into tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DecodeSplit {
    /// Consecutive KV heads per task (a divisor of the layer's KV heads).
    kv_heads: usize,
    /// Parts each group's query heads are split into (1: whole groups; more only with one KV
    /// head per task).
    parts: usize,
}

impl DecodeSplit {
    /// The split for `tokens` tokens of a layer with `num_kv_heads` KV heads of `group` query
    /// heads each, on `threads` threads: the most KV heads a kernel call takes that still
    /// leave a task per thread; groups split only when even one KV head per task leaves
    /// fewer tasks than threads, into as few parts as give every thread the same number of
    /// tasks (or at least one). A split group's parts each read the rows again, so an uneven
    /// share (3 tokens on 2 threads) costs less than splitting.
    fn new(tokens: usize, num_kv_heads: usize, group: usize, threads: usize) -> DecodeSplit {
        let threads = threads.max(1);
        let group = group.max(1);
        let kv_heads = (1..=num_kv_heads.min(KV_HEADS_MAX))
            .rev()
            .filter(|k| num_kv_heads.is_multiple_of(*k))
            .find(|k| tokens * (num_kv_heads / k) >= threads)
            .unwrap_or(1);
        let tasks = tokens * (num_kv_heads / kv_heads);
        let parts = if tasks >= threads {
            1
        } else {
            (1..=group)
                .find(|p| (tasks * p).is_multiple_of(threads))
                .or_else(|| (1..=group).find(|p| tasks * p >= threads))
                .unwrap_or(group)
        };
        DecodeSplit { kv_heads, parts }
    }

    /// The query heads (within its group) of part `p` of a group of `group` heads.
    fn part_heads(&self, p: usize, group: usize) -> Range<usize> {
        group * p / self.parts..group * (p + 1) / self.parts
    }
}

/// `out[t, h] = softmax_j(q[t, h] · k[j, kvh] · scale) · v[j, kvh]` over the context of token
/// `t` (one new token per sequence). `q`, `out`: `[num_tokens, num_heads · head_dim]`;
/// `work`: the memory of the task splits (see [`DecodeWork`]).
pub(crate) fn decode_attention(inputs: &DecodeInputs<'_>, work: &mut DecodeWork, out: &mut [f32]) {
    if attend_in_partitions(inputs, work, out) {
        return;
    }
    let DecodeInputs {
        isa,
        pool,
        shape,
        q,
        rows,
        ..
    } = *inputs;
    let (num_heads, num_kv_heads, d) = (shape.num_heads, shape.num_kv_heads, shape.head_dim);
    let group = num_heads / num_kv_heads;
    let tokens = inputs.layout.positions.len();
    let split = DecodeSplit::new(tokens, num_kv_heads, group, pool.n_threads());
    let k = split.kv_heads;
    let per_token = num_kv_heads / k;
    // The K/V of KV heads `first_kv ..` of token `t`.
    let view = |t: usize, first_kv: usize| KvView {
        rows,
        row_stride: num_kv_heads * d,
        offset: first_kv * d,
        head_dim: d,
        slots: inputs.context(t),
    };
    if split.parts == 1 {
        // Whole groups: a task's query heads and outputs are contiguous.
        for_each_chunk_mut(pool, out, k * group * d, |i, out_heads| {
            let (t, first_kv) = (i / per_token, i % per_token * k);
            let q_at = (t * num_heads + first_kv * group) * d;
            let q_heads = &q[q_at..q_at + k * group * d];
            attend_heads_with(isa, q_heads, &view(t, first_kv), k, shape.scale, out_heads);
        });
        return;
    }
    // Fewer tokens than threads even one KV head per task: tasks of part `p` of a group
    // (one KV head, `k == 1`), whose query heads and outputs are contiguous.
    debug_assert_eq!(k, 1);
    let heads_before = |i: usize| {
        let (g, p) = (i / split.parts, i % split.parts);
        g * group + split.part_heads(p, group).start
    };
    let bounds = &mut work.group_bounds;
    bounds.clear();
    bounds.extend((0..=tokens * num_kv_heads * split.parts).map(|i| heads_before(i) * d));
    for_each_part_mut(pool, out, bounds, |i, out_heads| {
        let first = heads_before(i);
        let (t, g) = (first / num_heads, first % num_heads / group);
        let q_heads = &q[first * d..][..out_heads.len()];
        attend_heads_with(isa, q_heads, &view(t, g), 1, shape.scale, out_heads);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::tests::{attention_of, head_shape, same_bits};
    use tandem_kernels::attention::KvRows;

    #[test]
    fn tasks_take_whole_rows_and_split_groups_only_to_balance_the_threads() {
        let split = |tokens, kv, group, threads| {
            let s = DecodeSplit::new(tokens, kv, group, threads);
            (s.kv_heads, s.parts)
        };
        // The default model (3 KV heads of 3) on 2 threads: one token per KV head, more
        // tokens whole.
        assert_eq!(split(1, 3, 3, 2), (1, 1));
        assert_eq!(split(2, 3, 3, 2), (3, 1));
        assert_eq!(split(3, 3, 3, 2), (3, 1));
        assert_eq!(split(16, 3, 3, 2), (3, 1));
        // Three threads, one token: a KV head each.
        assert_eq!(split(1, 3, 3, 3), (1, 1));
        // Gemma 3 270M: one KV head of 4, one token: two parts of two heads.
        assert_eq!(split(1, 1, 4, 2), (1, 2));
        assert_eq!(split(1, 1, 4, 3), (1, 3));
        assert_eq!(split(2, 1, 4, 3), (1, 3));
        // Llama 3.2 1B's 8 KV heads, one token on 2 threads: half the row each.
        assert_eq!(split(1, 8, 4, 2), (4, 1));
        // More KV heads than one call takes: the largest divisor that fits.
        assert_eq!(split(16, 16, 2, 2), (8, 1));
        assert_eq!(split(4, 12, 2, 2), (6, 1));
        // One thread: whole tokens, never split.
        assert_eq!(split(1, 3, 3, 1), (3, 1));
        // Groups of one head cannot be split.
        assert_eq!(split(1, 1, 1, 2), (1, 1));
    }

    /// A decode batch gives every token the bits it gets alone, whatever the split: whole
    /// groups of several KV heads, single KV heads, parts of groups, 1 to 3 threads, with and
    /// without a sliding window.
    #[test]
    fn a_token_has_the_same_bits_in_every_split() {
        for (heads, kv_heads) in [(12, 4), (8, 1), (6, 2)] {
            same_bits_in_every_split(heads, kv_heads);
        }
    }

    fn same_bits_in_every_split(heads: usize, kv_heads: usize) {
        let d = 24;
        let f = |i: usize| ((i * 7919 % 1000) as f32 / 500.0) - 1.0;
        // Contexts of up to 420 positions: several blocks, so the running maximum is rescaled
        // and the next block prefetched, and up to four partitions, which few tokens spread
        // over tasks.
        let n_slots = 12 * 420;
        let keys: Vec<f32> = (0..n_slots * kv_heads * d).map(|i| f(i + 3)).collect();
        let values: Vec<f32> = (0..n_slots * kv_heads * d).map(|i| f(i + 29)).collect();
        let seqs = 12;
        // Sequence `s` owns slots `s, s + 12, ...` (interleaved, as a paged pool hands out).
        let slots: Vec<Vec<usize>> = (0..seqs)
            .map(|s| (s..n_slots).step_by(seqs).collect())
            .collect();
        let positions: Vec<usize> = (0..seqs).map(|s| (s * 137 + 17) % slots[s].len()).collect();
        let token_seq: Vec<usize> = (0..seqs).collect();
        let row = heads * d;
        let q: Vec<f32> = (0..seqs * row).map(|i| f(i + 53)).collect();
        let rows = KvRows::F32 {
            keys: &keys,
            values: &values,
        };
        for window in [None, Some(4), Some(19), Some(200)] {
            let shape = head_shape(heads, kv_heads, d, window);
            let run = |threads: usize, positions: &[usize], token_seq: &[usize], q: &[f32]| {
                attention_of(threads, shape, positions, token_seq, &slots, q, rows)
            };
            // Alone on one thread: one task, whole groups.
            let alone: Vec<Vec<f32>> = (0..seqs)
                .map(|t| run(1, &positions[t..=t], &[t], &q[t * row..][..row]))
                .collect();
            for (threads, tokens) in [(2, seqs), (2, 1), (2, 3), (3, 1), (3, 2), (1, seqs)] {
                let got = run(
                    threads,
                    &positions[..tokens],
                    &token_seq[..tokens],
                    &q[..tokens * row],
                );
                for (t, want) in alone.iter().enumerate().take(tokens) {
                    assert!(
                        same_bits(&got[t * row..][..row], want),
                        "token {t} of {tokens}, {threads} threads, window {window:?}"
                    );
                }
            }
        }
    }
}
