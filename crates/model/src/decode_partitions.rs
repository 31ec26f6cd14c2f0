//! Decode of a few long sequences: tasks of context partitions.
//!
//! The kernels cut every context into fixed partitions of
//! [`POS_PARTITION`](tandem_kernels::attention::POS_PARTITION) positions and
//! fold the partitions' states in order (the numeric contract of
//! `tandem_kernels::attention`). When the batch has too few tokens to keep every thread busy
//! with whole tokens (one sequence, or a few of unequal lengths), a token's partitions are
//! spread over tasks instead: each task computes a range of partitions of one token, with all
//! its KV heads, so that it reads whole rows, into one record per partition
//! ([`attend_partition_with`]); then one task per token and KV-head chunk folds its records
//! in order ([`fold_partitions`]). A token gets exactly the bits it gets in one task.

use std::ops::Range;

use tandem_kernels::attention::{
    attend_partition_with, fold_partitions, partition, partitions, record_len, KvView, GROUP_MAX,
    KV_HEADS_MAX, PARTIAL_HEADS_MAX,
};
use tandem_kernels::parallel::{for_each_chunk_mut, for_each_part_mut};

use crate::attention::{AttentionLayout, DecodeInputs, HeadShape};

/// Tasks per thread the partitions are cut into (more balance the threads when contexts
/// differ in length; fewer keep each task's run of blocks long).
const TASKS_PER_THREAD: usize = 4;

/// One task: partitions `parts` of token `token`'s context, for the KV heads of chunk
/// `chunk`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PartitionTask {
    token: usize,
    chunk: usize,
    parts: Range<usize>,
}

/// The working memory of decode attention's task splits: for a split along the contexts,
/// the plan of its tasks and the records of its partitions; for a split of GQA groups, the
/// tasks' bounds. Kept between steps so that a stream of decode steps allocates nothing once
/// they have grown to the largest batch.
#[derive(Debug, Default)]
pub struct DecodeWork {
    plan: PartitionPlan,
    /// The partitions' records, `[tokens, chunks, partitions, record]` (grown, never shrunk).
    records: Vec<f32>,
    /// Where each task of a split of GQA groups starts in the output (`decode_attention.rs`).
    pub(crate) group_bounds: Vec<usize>,
}

/// How the partitions of a decode batch are spread over tasks, and where their records lie.
#[derive(Debug, Default)]
struct PartitionPlan {
    /// KV heads per chunk (a divisor of the layer's KV heads); a record holds a chunk's
    /// query heads.
    kv_heads: usize,
    /// The tasks, in record order.
    tasks: Vec<PartitionTask>,
    /// `[tasks + 1]` where each task's records start in the scratch, in elements.
    bounds: Vec<usize>,
    /// `[tokens · chunks]` where each (token, chunk)'s records start, in elements.
    starts: Vec<usize>,
    /// Elements per record.
    record: usize,
}

impl PartitionPlan {
    /// Plans a decode batch; `false` (the plan left unusable) where partition tasks do not
    /// pay: one thread, enough tokens to give every thread several whole ones, whole tokens
    /// that already share out evenly, fewer partitions than threads, or groups too large for
    /// one kernel call.
    fn fill(&mut self, layout: &AttentionLayout<'_>, shape: &HeadShape, threads: usize) -> bool {
        let (num_kv_heads, d) = (shape.num_kv_heads, shape.head_dim);
        let group = shape.num_heads / num_kv_heads.max(1);
        let threads = threads.max(1);
        let few = layout.positions.len() < TASKS_PER_THREAD * threads;
        if threads == 1 || !few || group > GROUP_MAX {
            return false;
        }
        // The partitions of each token's context (after its window).
        let parts_of = |p: usize| partitions(p + 1 - shape.first_position(p));
        let total: usize = layout.positions.iter().map(|&p| parts_of(p)).sum();
        if whole_tokens_balance(
            layout.positions.iter().map(|&p| parts_of(p)),
            total,
            threads,
        ) {
            return false;
        }
        let kv_heads = (1..=num_kv_heads.min(KV_HEADS_MAX))
            .rev()
            .find(|&k| num_kv_heads.is_multiple_of(k) && k * group <= PARTIAL_HEADS_MAX);
        let Some(kv_heads) = kv_heads.filter(|_| total >= threads) else {
            return false;
        };
        let chunks = num_kv_heads / kv_heads;
        // Partitions per task: the (partition, chunk) pairs over the tasks wanted.
        let per_task = (total * chunks).div_ceil(TASKS_PER_THREAD * threads).max(1);
        self.kv_heads = kv_heads;
        self.record = record_len(kv_heads * group, d);
        self.tasks.clear();
        self.starts.clear();
        self.bounds.clear();
        // At most a task per thread's share and one more per (token, chunk): reserved at the
        // first plan, so that later batches never grow the lists.
        let most = TASKS_PER_THREAD * threads * (chunks + 1);
        self.tasks.reserve(most);
        self.bounds.reserve(most + 1);
        self.starts.reserve(TASKS_PER_THREAD * threads * chunks);
        self.bounds.push(0);
        let mut end = 0;
        for (token, &pos) in layout.positions.iter().enumerate() {
            let parts = parts_of(pos);
            for chunk in 0..chunks {
                self.starts.push(end);
                for first in (0..parts).step_by(per_task) {
                    let parts = first..parts.min(first + per_task);
                    end += parts.len() * self.record;
                    self.tasks.push(PartitionTask {
                        token,
                        chunk,
                        parts,
                    });
                    self.bounds.push(end);
                }
            }
        }
        true
    }

    /// Elements of scratch the records take.
    fn scratch_len(&self) -> usize {
        self.bounds.last().copied().unwrap_or(0)
    }
}

/// Whether tasks of whole tokens (`work`: each token's partitions, `total` of them), taken in
/// order by the first free of `threads` threads, finish within a tenth of an even share:
/// then splitting the tokens' contexts would only add the fold. (Past 64 threads, the
/// longest share is bounded below by the longest token and the even share.)
fn whole_tokens_balance(work: impl Iterator<Item = usize>, total: usize, threads: usize) -> bool {
    const MOST: usize = 64;
    let mut loads = [0usize; MOST];
    let longest = if threads <= MOST {
        let loads = &mut loads[..threads];
        for w in work {
            if let Some(least) = loads.iter_mut().min() {
                *least += w;
            }
        }
        loads.iter().copied().max().unwrap_or(0)
    } else {
        work.max().unwrap_or(0).max(total.div_ceil(threads))
    };
    10 * longest * threads <= 11 * total
}

/// Decode attention in partition tasks (see the module docs), if [`DecodeWork`] finds they
/// pay for this batch: `true` when it ran (and wrote `out`), `false` when the caller should
/// split by tokens.
pub(crate) fn attend_in_partitions(
    inputs: &DecodeInputs<'_>,
    work: &mut DecodeWork,
    out: &mut [f32],
) -> bool {
    let DecodeInputs {
        isa,
        pool,
        shape,
        layout,
        q,
        rows,
    } = *inputs;
    let DecodeWork { plan, records, .. } = work;
    if !plan.fill(layout, &shape, pool.n_threads()) {
        return false;
    }
    let (num_heads, d) = (shape.num_heads, shape.head_dim);
    let group = num_heads / shape.num_kv_heads;
    let k = plan.kv_heads;
    if records.len() < plan.scratch_len() {
        // With room for contexts growing a step at a time: 8 more partitions per token and
        // chunk.
        let room = 8 * plan.starts.len() * plan.record;
        records.resize(plan.scratch_len() + room, 0.0);
    }
    let records = &mut records[..plan.scratch_len()];
    for_each_part_mut(pool, records, &plan.bounds, |i, task_records| {
        let task = &plan.tasks[i];
        let slots = inputs.context(task.token);
        let first_kv = task.chunk * k;
        let q_heads = &q[(task.token * num_heads + first_kv * group) * d..][..k * group * d];
        let parts = task_records.chunks_exact_mut(plan.record);
        for (p, record) in task.parts.clone().zip(parts) {
            let view = KvView {
                rows,
                row_stride: shape.num_kv_heads * d,
                offset: first_kv * d,
                head_dim: d,
                slots: partition(slots, p),
            };
            // The task's next partition, whose first block the kernel prefetches.
            let next = if p + 1 < task.parts.end {
                partition(slots, p + 1)
            } else {
                &[]
            };
            attend_partition_with(isa, q_heads, &view, k, shape.scale, next, record);
        }
    });
    let records = &*records;
    let chunks = shape.num_kv_heads / k;
    for_each_chunk_mut(pool, out, k * group * d, |i, out_heads| {
        let start = plan.starts[i];
        let len = partitions(inputs.context(i / chunks).len()) * plan.record;
        fold_partitions(isa, &records[start..start + len], k * group, out_heads);
    });
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(contexts: &[usize], kv: usize, group: usize, threads: usize) -> Option<PartitionPlan> {
        let positions: Vec<usize> = contexts.iter().map(|&n| n - 1).collect();
        let token_seq: Vec<usize> = (0..contexts.len()).collect();
        let seq_slots: Vec<Vec<usize>> = contexts.iter().map(|&n| (0..n).collect()).collect();
        let layout = AttentionLayout {
            positions: &positions,
            token_seq: &token_seq,
            seq_slots: &seq_slots,
        };
        let shape = HeadShape {
            num_heads: kv * group,
            num_kv_heads: kv,
            head_dim: 64,
            scale: 0.125,
            window: None,
        };
        let mut plan = PartitionPlan::default();
        plan.fill(&layout, &shape, threads).then_some(plan)
    }

    #[test]
    fn partition_tasks_only_where_whole_tokens_leave_threads_idle() {
        // One thread, many tokens, short contexts, groups past one call: no.
        assert!(plan(&[4096], 3, 3, 1).is_none());
        assert!(plan(&[4096; 8], 3, 3, 2).is_none());
        // Whole tokens that share out evenly: no; unevenly (3 on 2 threads, or one much
        // longer than the other): yes.
        assert!(plan(&[2048; 4], 3, 3, 2).is_none());
        assert!(plan(&[2048, 2000], 3, 3, 2).is_none());
        assert!(plan(&[2048; 3], 3, 3, 2).is_some());
        assert!(plan(&[4096, 300], 3, 3, 2).is_some());
        // Past 64 threads: 64 equal tokens leave 36 of 100 threads idle.
        assert!(plan(&[1024; 64], 3, 3, 100).is_some());
        assert!(plan(&[1024; 128], 3, 3, 64).is_none());
        assert!(plan(&[100], 3, 3, 2).is_none());
        assert!(plan(&[4096], 1, 16, 2).is_none());
        // The default model (3 KV heads of 3) after 4096 positions on 2 threads: 32
        // partitions in 8 tasks of 4, whole rows.
        let p = plan(&[4096], 3, 3, 2).expect("a plan");
        assert_eq!((p.kv_heads, p.tasks.len()), (3, 8));
        assert!(p.tasks.iter().all(|t| t.parts.len() == 4));
        // 16 KV heads (more than one call takes): chunks of 8.
        assert_eq!(plan(&[1000], 16, 2, 2).expect("a plan").kv_heads, 8);
    }

    /// Every (token, chunk) gets its partitions in order, each once, and its records where
    /// `starts` says, one after the other.
    #[test]
    fn tasks_cover_every_partition_once_in_record_order() {
        for (contexts, kv, group, threads) in [
            (vec![4096], 3, 3, 2),
            (vec![300, 5000, 129], 2, 4, 2),
            (vec![1000], 16, 2, 3),
            (vec![128, 129], 1, 4, 2),
        ] {
            let p = plan(&contexts, kv, group, threads).expect("a plan");
            let chunks = kv / p.kv_heads;
            let mut at = 0;
            for (t, &n) in contexts.iter().enumerate() {
                for c in 0..chunks {
                    assert_eq!(p.starts[t * chunks + c], at);
                    let mine = p.tasks.iter().filter(|x| x.token == t && x.chunk == c);
                    let parts: Vec<usize> = mine.flat_map(|x| x.parts.clone()).collect();
                    assert_eq!(parts, (0..partitions(n)).collect::<Vec<_>>());
                    at += partitions(n) * p.record;
                }
            }
            assert_eq!(p.scratch_len(), at);
            let sizes = p.bounds.windows(2).map(|w| w[1] - w[0]);
            assert!(sizes
                .zip(&p.tasks)
                .all(|(s, x)| s == x.parts.len() * p.record));
        }
    }
}
