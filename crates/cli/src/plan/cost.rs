//! The roofline cost of an engine step, and of the workloads built from steps.
//!
//! A step computing `tokens` new tokens reads every weight once and each scheduled
//! sequence's keys and values (on the CPU once per 16-token tile of its new tokens, as the
//! attention kernels do; on a GPU once), and does `2 x weights` FLOPs per token plus attention. Each layer runs its
//! matrix products, then attention, so the time is a fixed overhead plus, for each phase, the
//! larger of its memory time (bytes / bandwidth) and its arithmetic time (matrix FLOPs at
//! the profile's rate for that many tokens; attention FLOPs at the attention rate). Below
//! the crossover the matrix phase is bandwidth-bound, above it compute-bound.

use serde::Serialize;

use super::hardware::{DeviceKind, HardwareProfile};
use super::shape::ModelShape;
use tandem_model::kv_store::KvDtype;

/// Query rows the attention kernels handle per pass over a sequence's K/V.
const ATTENTION_TILE: f64 = 16.0;

/// One sequence's part of a step: new tokens on top of a cached context.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SeqWork {
    /// Positions already in the KV cache.
    pub cached: f64,
    /// New tokens computed.
    pub new: f64,
    /// Rows of logits asked (1 to sample, `new` to score every position).
    pub rows: f64,
}

/// What a step costs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StepCost {
    pub tokens: f64,
    pub weight_bytes: f64,
    pub kv_bytes: f64,
    pub flops: f64,
    pub memory_s: f64,
    pub compute_s: f64,
    pub time_s: f64,
    /// True when the arithmetic outweighs the memory traffic.
    pub compute_bound: bool,
}

/// A model on a machine: everything a step's cost depends on.
#[derive(Debug, Clone)]
pub struct Roofline<'a> {
    pub shape: &'a ModelShape,
    pub hw: &'a HardwareProfile,
    /// How the KV cache stores keys and values (its bytes per token).
    pub kv_dtype: KvDtype,
}

impl Roofline<'_> {
    /// The cost of one step over `seqs`: the matrix phase (weights read against matrix
    /// FLOPs) and the attention phase (K/V read against attention FLOPs) run one after the
    /// other in every layer, each at the higher of its two times.
    pub fn step(&self, seqs: &[SeqWork]) -> StepCost {
        let s = self.shape;
        let tokens: f64 = seqs.iter().map(|q| q.new).sum();
        let rows: f64 = seqs.iter().map(|q| q.rows).sum();
        // Bytes of one position's keys and values in one layer.
        let kv_per_pos = (s.kv_bytes_per_token(self.kv_dtype) / s.num_layers.max(1)) as f64;
        // The CPU's tile kernel reads a sequence's K/V once per tile of its new tokens; on a
        // GPU once a step (the step's other tokens find them in its cache). `.1`: the new
        // tokens of one pass (their windows' union is what a windowed layer reads).
        let passes = |new: f64| match self.hw.kind {
            DeviceKind::Cpu => ((new / ATTENTION_TILE).ceil(), new.min(ATTENTION_TILE)),
            DeviceKind::Gpu => (new.min(1.0).ceil(), new),
        };
        let mut kv_bytes = 0.0;
        let mut attention_s = 0.0;
        let mut attention = 0.0;
        for q in seqs {
            let context = q.cached + q.new;
            let (count, per_pass) = passes(q.new);
            kv_bytes += s.kv_positions_read(context, per_pass) * kv_per_pos * count;
            let flops = s.attention_flops(q.cached, q.new);
            let rate = if q.new > 1.0 {
                self.hw.prefill_attention_flops
            } else {
                self.hw.attention_flops
            };
            attention += flops;
            attention_s += flops / rate;
        }
        let weight_bytes = s.weight_bytes_per_step(self.hw.bytes_per_weight(), tokens);
        let matmul = s.matmul_flops(tokens, rows);
        let weights_s = weight_bytes / self.hw.bandwidth;
        // A mixture's experts each see only their share of the step's tokens, so their
        // products run at the rate of that many rows.
        let expert = s.picked_expert_flops(tokens);
        let matmul_s = (matmul - expert) / self.hw.matmul_flops(tokens)
            + expert / self.hw.matmul_flops(s.rows_per_expert(tokens));
        let kv_s = kv_bytes / self.hw.bandwidth;
        StepCost {
            tokens,
            weight_bytes,
            kv_bytes,
            flops: matmul + attention,
            memory_s: weights_s + kv_s,
            compute_s: matmul_s + attention_s,
            time_s: self.hw.overhead_s(s.num_layers)
                + weights_s.max(matmul_s)
                + kv_s.max(attention_s),
            compute_bound: matmul_s > weights_s,
        }
    }

    /// One decode step of `batch` sequences with `context` cached positions each.
    pub fn decode_step(&self, batch: usize, context: f64) -> StepCost {
        let w = SeqWork {
            cached: context,
            new: 1.0,
            rows: 1.0,
        };
        self.step(&vec![w; batch])
    }

    /// Seconds to prefill `batch` prompts of `len` tokens packed into steps of at most
    /// `budget` tokens (in order, as the scheduler and `tandem bench` pack them), the last
    /// row of each prompt sampled. `riding`: decodes of other sequences (with `context`
    /// cached positions) in every step.
    pub fn prefill(&self, batch: usize, len: usize, budget: usize, riding: (usize, f64)) -> f64 {
        let budget = budget.max(riding.0 + 1);
        let mut done = vec![0usize; batch];
        let mut total = 0.0;
        while done.iter().any(|&d| d < len) {
            let mut seqs = vec![
                SeqWork {
                    cached: riding.1,
                    new: 1.0,
                    rows: 1.0
                };
                riding.0
            ];
            let mut room = budget - riding.0;
            for d in done.iter_mut() {
                if *d == len || room == 0 {
                    continue;
                }
                let n = room.min(len - *d);
                let rows = if *d + n == len { 1.0 } else { 0.0 };
                seqs.push(SeqWork {
                    cached: *d as f64,
                    new: n as f64,
                    rows,
                });
                *d += n;
                room -= n;
            }
            total += self.step(&seqs).time_s;
        }
        total
    }

    /// Seconds to decode `steps` steps of `batch` sequences starting from `context` cached
    /// positions each.
    pub fn decode(&self, batch: usize, context: usize, steps: usize) -> f64 {
        (0..steps)
            .map(|i| self.decode_step(batch, (context + i) as f64).time_s)
            .sum()
    }

    /// Seconds to score `n` known tokens in teacher-forced passes of at most `budget` tokens,
    /// logits for every position.
    pub fn score(&self, n: usize, budget: usize) -> f64 {
        let mut done = 0;
        let mut total = 0.0;
        while done < n {
            let k = budget.min(n - done);
            let w = SeqWork {
                cached: done as f64,
                new: k as f64,
                rows: k as f64,
            };
            total += self.step(&[w]).time_s;
            done += k;
        }
        total
    }

    /// The smallest decode batch at `context` whose step is compute-bound (`None` up to
    /// `max_batch`).
    pub fn crossover_batch(&self, context: f64, max_batch: usize) -> Option<usize> {
        (1..=max_batch).find(|&b| self.decode_step(b, context).compute_bound)
    }

    /// Decode speed-up from speculation: `k` drafts per step, each accepted with
    /// probability `acceptance` (while the previous ones were), verified in one step of
    /// `1 + k` tokens per sequence; drafting itself free (n-gram lookup).
    pub fn speculation_speedup(
        &self,
        batch: usize,
        context: f64,
        k: usize,
        acceptance: f64,
    ) -> f64 {
        let a = acceptance.clamp(0.0, 0.999_999);
        let tokens_per_step = (1.0 - a.powi(k as i32 + 1)) / (1.0 - a);
        let plain = self.decode_step(batch, context).time_s;
        let w = SeqWork {
            cached: context,
            new: 1.0 + k as f64,
            rows: 1.0 + k as f64,
        };
        let verify = self.step(&vec![w; batch]).time_s;
        tokens_per_step * plain / verify
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::hardware::RatePoint;

    fn shape() -> ModelShape {
        ModelShape {
            num_layers: 2,
            windows: vec![None; 2],
            hidden_size: 64,
            num_heads: 4,
            head_dim: 16,
            kv_dim: 32,
            vocab_size: 100,
            context_len: 512,
            layer_params: 100_000,
            lm_head_params: 6_400,
            expert_params: 0,
            expert_stored_bytes: 0.0,
            experts: 0,
            experts_picked: 0,
            stored_bytes: 200_000.0,
            stored_bytes_per_step: 200_000.0,
        }
    }

    fn hw() -> HardwareProfile {
        HardwareProfile {
            name: "test".into(),
            kind: DeviceKind::Cpu,
            source: "test".into(),
            threads: 1,
            bandwidth: 1e9,
            matmul: vec![RatePoint {
                tokens: 1,
                flops: 1e10,
            }],
            attention_flops: 1e10,
            prefill_attention_flops: 1e10,
            step_overhead_s: 1e-4,
            layer_overhead_s: 0.0,
            memory_bytes: 0.0,
        }
    }

    #[test]
    fn a_decode_step_is_bandwidth_bound_until_the_batch_pays_for_the_weights() {
        let (s, h) = (shape(), hw());
        let r = Roofline {
            shape: &s,
            hw: &h,
            kv_dtype: KvDtype::F16,
        };
        let one = r.decode_step(1, 0.0);
        // 200 kB at 1 GB/s = 200 µs; 2 x 106,400 FLOPs at 10 GFLOP/s = 21 µs.
        assert!(!one.compute_bound);
        assert!((one.time_s - (1e-4 + 2e-4)).abs() < 1e-6, "{one:?}");
        // Compute: 21.28 µs per token (+ attention of 1 position): crossover at 10 tokens.
        assert_eq!(r.crossover_batch(0.0, 64), Some(10));
        // Scoring 100 tokens in one pass is far cheaper than generating them one by one.
        assert!(r.decode(1, 0, 100) > 5.0 * r.score(100, 2048));
        // Speculation with perfect drafts and free verification would gain k + 1.
        let gain = r.speculation_speedup(1, 0.0, 3, 0.9);
        assert!(gain > 1.0 && gain < 4.0, "{gain}");
    }

    #[test]
    fn prefill_packs_prompts_into_budgeted_steps() {
        let (s, h) = (shape(), hw());
        let r = Roofline {
            shape: &s,
            hw: &h,
            kv_dtype: KvDtype::F16,
        };
        // Two prompts of 10 in steps of 8: steps of 8, 8 (2 + 6), 4.
        let t = r.prefill(2, 10, 8, (0, 0.0));
        let steps = [
            r.step(&[SeqWork {
                cached: 0.0,
                new: 8.0,
                rows: 0.0,
            }])
            .time_s,
            r.step(&[
                SeqWork {
                    cached: 8.0,
                    new: 2.0,
                    rows: 1.0,
                },
                SeqWork {
                    cached: 0.0,
                    new: 6.0,
                    rows: 0.0,
                },
            ])
            .time_s,
            r.step(&[SeqWork {
                cached: 6.0,
                new: 4.0,
                rows: 1.0,
            }])
            .time_s,
        ];
        assert!((t - steps.iter().sum::<f64>()).abs() < 1e-12);
    }
}
