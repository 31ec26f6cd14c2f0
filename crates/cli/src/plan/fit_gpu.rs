//! Fitting a GPU profile to the model's own steps on the CUDA runner: a pure function of the
//! measured step times ([`GpuSteps`]), starting from a datasheet profile. Every ceiling is
//! solved for so that the roofline ([`Roofline::step`]) gives the measured time of the steps
//! that depend on it:
//!
//! - read bandwidth: decode steps of a batch at a short and at a long context differ only in
//!   the keys and values they read;
//! - overhead: what a one-sequence decode step takes beyond reading the weights and its K/V
//!   (the host's part of a step, when measured, is the per-step overhead, the rest is per
//!   layer);
//! - prefill attention rate: one long prompt against the same tokens as short prompts (the
//!   same products, far less attention);
//! - matrix-product rates: steps of 1 to 4096 tokens; where a step is slower than its reads
//!   the products are compute-bound and the rate is solved for, elsewhere it is kept from
//!   the datasheet (no lower than the reads allow), and no rate is above that of more tokens.
//!
//! Decode steps of up to a few dozen sequences are taken to be bound by the weights' reads,
//! as they are on every GPU.

use super::cost::{Roofline, SeqWork};
use super::hardware::{HardwareProfile, RatePoint};
use super::shape::ModelShape;
use super::step_times::TimedStep;
use tandem_model::kv_store::KvDtype;

/// The model's steps timed on the GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSteps {
    /// Decode steps of one sequence at a short context.
    pub decode_one: TimedStep,
    /// Decode steps of the same batch at a short and at a long context.
    pub kv_short: TimedStep,
    pub kv_long: TimedStep,
    /// One prefill step of a long prompt, and one of the same tokens as short prompts.
    pub prefill_long: TimedStep,
    pub prefill_split: TimedStep,
    /// Steps of increasing tokens per product (decode batches, then prefill chunks).
    pub products: Vec<TimedStep>,
    /// The host's part of a step (not overlapped with the device), when measured.
    pub host_s: Option<f64>,
}

/// A fitted profile and what could not be fitted.
#[derive(Debug, Clone)]
pub struct GpuFit {
    pub profile: HardwareProfile,
    pub notes: Vec<String>,
}

/// A rate no step reaches: products at it are bound by their reads.
const UNBOUNDED: f64 = 1e30;
/// A step within this share of its memory time is taken as bandwidth-bound.
const MEMORY_BOUND_SLACK: f64 = 1.02;

/// Fits `base` (a datasheet profile) to `m`, measured with a KV cache of `kv_dtype`.
pub fn fit(base: &HardwareProfile, shape: &ModelShape, kv_dtype: KvDtype, m: &GpuSteps) -> GpuFit {
    let time = |hw: &HardwareProfile, s: &TimedStep| {
        Roofline {
            shape,
            hw,
            kv_dtype,
        }
        .step(&s.work)
        .time_s
    };
    let mut notes = Vec::new();
    let mut hw = base.clone();
    hw.step_overhead_s = 0.0;
    hw.layer_overhead_s = 0.0;
    // Decode steps read their weights at any rate a GPU's products reach.
    let mut reads = hw.clone();
    reads.matmul = vec![RatePoint {
        tokens: 1,
        flops: UNBOUNDED,
    }];
    let kv_dt = m.kv_long.secs - m.kv_short.secs;
    let kv_delta = |h: &HardwareProfile| time(h, &m.kv_long) - time(h, &m.kv_short);
    if kv_dt > 0.0 {
        let attention = attention_flops(shape, &m.kv_long) - attention_flops(shape, &m.kv_short);
        reads.attention_flops = reads.attention_flops.max(attention / kv_dt);
        reads.bandwidth = solve_decreasing(1e9, 1e16, kv_dt, |b| {
            kv_delta(&HardwareProfile {
                bandwidth: b,
                ..reads.clone()
            })
        });
        if reads.bandwidth > 1.2 * base.bandwidth {
            notes.push(format!(
                "the K/V read of decode steps gives {:.0} GB/s, above the {:.0} GB/s of {}: \
                 the steps may have been disturbed",
                reads.bandwidth / 1e9,
                base.bandwidth / 1e9,
                base.source
            ));
        }
    } else {
        notes.push(format!(
            "decode steps at context {:.0} were not slower than at {:.0}: bandwidth kept from {}",
            m.kv_long.work[0].cached, m.kv_short.work[0].cached, base.source
        ));
    }
    let floor = m.host_s.unwrap_or(0.0);
    let mut overhead = m.decode_one.secs - time(&reads, &m.decode_one);
    if overhead < floor {
        // Faster than its reads at the bandwidth K/V are read at: the products stream
        // weights faster than attention reads K/V, which then runs at the rate it shows.
        overhead = floor;
        reads.bandwidth = solve_decreasing(1e9, 1e16, m.decode_one.secs - floor, |b| {
            time(
                &HardwareProfile {
                    bandwidth: b,
                    ..reads.clone()
                },
                &m.decode_one,
            )
        });
        if kv_dt > 0.0 {
            reads.attention_flops = solve_decreasing(1e6, 1e17, kv_dt, |r| {
                kv_delta(&HardwareProfile {
                    attention_flops: r,
                    ..reads.clone()
                })
            });
        }
        notes.push(
            "attention reads K/V slower than the products read weights: the decode attention \
             rate is fitted to the K/V steps"
                .into(),
        );
    }
    hw.bandwidth = reads.bandwidth;
    hw.attention_flops = reads.attention_flops;
    hw.step_overhead_s = m.host_s.unwrap_or(base.step_overhead_s).min(overhead);
    hw.layer_overhead_s = (overhead - hw.step_overhead_s) / shape.num_layers as f64;
    if m.host_s.is_none() {
        notes.push(format!(
            "the host's part of a step was not measured: per-step overhead {:.3} ms assumed, \
             the rest per layer",
            hw.step_overhead_s * 1e3
        ));
    }
    // Prefill attention and the product rates depend on each other a little (the long and
    // split prefills differ in LM-head rows): twice round.
    let prefill_dt = m.prefill_long.secs - m.prefill_split.secs;
    if prefill_dt <= 0.0 {
        notes.push(format!(
            "one prompt of {:.0} tokens was not slower than {} of {:.0}: prefill attention rate \
             kept from {}",
            m.prefill_long.tokens(),
            m.prefill_split.work.len(),
            m.prefill_split.work[0].new,
            base.source
        ));
    }
    for _ in 0..2 {
        if prefill_dt > 0.0 {
            hw.prefill_attention_flops = solve_decreasing(1e9, 1e17, prefill_dt, |r| {
                let h = HardwareProfile {
                    prefill_attention_flops: r,
                    ..hw.clone()
                };
                time(&h, &m.prefill_long) - time(&h, &m.prefill_split)
            });
        }
        hw.matmul = product_rates(base, &hw, shape, m, &time);
    }
    GpuFit { profile: hw, notes }
}

/// The matrix-product rate at each step of `m.products`: solved where the step is slower
/// than its reads, else the datasheet's (at least what the reads allow), no rate above a
/// later one unless its own step shows it.
fn product_rates(
    base: &HardwareProfile,
    hw: &HardwareProfile,
    shape: &ModelShape,
    m: &GpuSteps,
    time: &dyn Fn(&HardwareProfile, &TimedStep) -> f64,
) -> Vec<RatePoint> {
    let at = |tokens: usize, flops: f64| HardwareProfile {
        matmul: vec![RatePoint { tokens, flops }],
        ..hw.clone()
    };
    let mut points: Vec<(RatePoint, f64)> = Vec::new();
    for s in &m.products {
        let n = s.tokens();
        let tokens = n.round() as usize;
        if tokens == 0 || points.last().is_some_and(|(p, _)| p.tokens >= tokens) {
            continue;
        }
        let memory = time(&at(tokens, UNBOUNDED), s);
        let reads_s = shape.weight_bytes_per_step(hw.bytes_per_weight(), n) / hw.bandwidth;
        let rows: f64 = s.work.iter().map(|w| w.rows).sum();
        let (flops, least) = if s.secs > memory * MEMORY_BOUND_SLACK {
            let r = solve_decreasing(1e9, 1e17, s.secs, |r| time(&at(tokens, r), s));
            (r, r)
        } else {
            let least = shape.matmul_flops(n, rows) / reads_s;
            (base.matmul_flops(n).max(least), least)
        };
        points.push((RatePoint { tokens, flops }, least));
    }
    let mut cap = f64::INFINITY;
    let mut out: Vec<RatePoint> = points
        .iter()
        .rev()
        .map(|&(p, least)| {
            let flops = p.flops.min(cap).max(least);
            cap = cap.min(flops);
            RatePoint {
                tokens: p.tokens,
                flops,
            }
        })
        .collect();
    out.reverse();
    if out.is_empty() {
        return hw.matmul.clone();
    }
    out
}

/// Attention FLOPs of a step's new tokens over their contexts.
fn attention_flops(shape: &ModelShape, s: &TimedStep) -> f64 {
    s.work
        .iter()
        .map(|w: &SeqWork| shape.attention_flops(w.cached, w.new))
        .sum()
}

/// The `x` in `[lo, hi]` (bisected in log scale) at which the non-increasing `f` comes down
/// to `target`; `lo` or `hi` when it stays above or below it.
fn solve_decreasing(lo: f64, hi: f64, target: f64, f: impl Fn(f64) -> f64) -> f64 {
    let (mut a, mut b) = (lo.ln(), hi.ln());
    for _ in 0..200 {
        let mid = (a + b) / 2.0;
        if f(mid.exp()) > target {
            a = mid;
        } else {
            b = mid;
        }
    }
    ((a + b) / 2.0).exp()
}

#[cfg(test)]
#[path = "fit_gpu_tests.rs"]
mod tests;
