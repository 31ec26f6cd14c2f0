//! `tandem plan --calibrate`: measures this machine's ceilings with tandem's own kernels, for
//! each thread count, in seconds, and saves them as hardware profiles (JSON).
//!
//! The products of a forward pass are those of 30 layers of a small Llama (Q4_1, the default
//! model's shapes), one pool job each, as the CPU runner runs them:
//!
//! - int8 compute ceiling, at 1 to 256 tokens per product: one layer's matrices again and
//!   again (they stay in the cache), less the dispatch time of the jobs;
//! - read bandwidth: the same pass at one token over 30 distinct layers (66 MB, more than
//!   the caches hold): the rate at which the kernels stream weights from memory;
//! - attention rates: the attention kernels over f16 keys and values as the model's steps run
//!   them, the group kernel of decode (many sequences' rows streamed from memory) and the
//!   tile kernel of prefill (the causal attention of whole prompts);
//! - overhead: one tiny product on the pool (a step runs about 8 jobs per layer, 4 more),
//!   and, when a model is at hand, [`fit_to_model`]: the overhead and the matrix rates as
//!   the model's own decode steps and prefill chunks show them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use half::f16;
use serde::{Deserialize, Serialize};
use tandem_kernels::attention::{attend_heads_with, attend_rows, KvRows, KvView};
use tandem_kernels::{matmul_packed, DType, PackedMatrix, ThreadPool, WeightView};

use super::cost::Roofline;
use super::hardware::{DeviceKind, HardwareProfile, RatePoint};
use super::shape::ModelShape;
use super::step_times::{self, TimedStep};
use crate::bench_cmd::measure;
use tandem_model::runner::ModelRunner;

/// Saved calibration: one CPU profile per thread count measured, and the GPU profiles
/// `--calibrate --device cuda` added.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Calibration {
    pub profiles: Vec<HardwareProfile>,
}

impl Calibration {
    /// The CPU profile measured with `threads` threads, else the nearest thread count below
    /// it, else the smallest.
    pub fn for_threads(&self, threads: usize) -> Option<&HardwareProfile> {
        let cpu = || self.profiles.iter().filter(|p| p.kind == DeviceKind::Cpu);
        let below = cpu().filter(|p| p.threads <= threads);
        below
            .max_by_key(|p| p.threads)
            .or_else(|| cpu().min_by_key(|p| p.threads))
    }

    /// The GPU profile calibrated last.
    pub fn gpu(&self) -> Option<&HardwareProfile> {
        self.profiles
            .iter()
            .rev()
            .find(|p| p.kind == DeviceKind::Gpu)
    }

    /// Adds `profile` after the others, in place of an earlier GPU profile of the same name.
    pub fn put_gpu(&mut self, profile: HardwareProfile) {
        self.profiles
            .retain(|p| !(p.kind == DeviceKind::Gpu && p.name == profile.name));
        self.profiles.push(profile);
    }
}

/// Thread-pool rounds per layer of a step, and per step outside the layers.
const ROUNDS_PER_LAYER: f64 = 8.0;
const ROUNDS_PER_STEP: f64 = 4.0;
/// Layers of the matrices the rates are measured over.
const LAYERS: usize = 30;
/// Tokens per product at which the int8 rate is measured.
const MATMUL_TOKENS: [usize; 6] = [1, 4, 16, 32, 64, 256];

/// Measures the machine at 1, 2, 4, ... up to `max_threads` threads.
pub fn calibrate(max_threads: usize) -> Calibration {
    let mut counts: Vec<usize> = std::iter::successors(Some(1), |t| Some(t * 2))
        .take_while(|&t| t < max_threads)
        .collect();
    counts.push(max_threads.max(1));
    let profiles = counts.into_iter().map(profile).collect();
    Calibration { profiles }
}

fn profile(threads: usize) -> HardwareProfile {
    let pool = ThreadPool::new(threads);
    let round = pool_round_s(&pool);
    let layer = layer_weights(&pool);
    let model: Vec<PackedMatrix> = (0..LAYERS).flat_map(|_| layer_weights(&pool)).collect();
    let jobs = (LAYERS * layer.len()) as f64;
    let dispatch = jobs * round;
    // The compute ceiling: the products of a model's forward pass over one layer's matrices
    // again and again, so that they stay in the cache.
    let resident: Vec<&PackedMatrix> = (0..LAYERS).flat_map(|_| layer.iter()).collect();
    let params: usize = resident.iter().map(|w| w.rows() * w.cols()).sum();
    let matmul = MATMUL_TOKENS
        .iter()
        .map(|&tokens| {
            let secs = pass_s(&resident, &pool, tokens);
            RatePoint {
                tokens,
                flops: (2 * params * tokens) as f64 / (secs - dispatch).max(secs / 10.0),
            }
        })
        .collect();
    // The bandwidth: the same products at one token over the model's worth of matrices,
    // streamed from memory.
    let streamed: Vec<&PackedMatrix> = model.iter().collect();
    let bytes: usize = model.iter().map(PackedMatrix::bytes).sum();
    let secs = pass_s(&streamed, &pool, 1);
    let bandwidth = bytes as f64 / (secs - dispatch).max(secs / 10.0);
    eprintln!(
        "tandem: calibrated {threads} thread(s): {:.1} GB/s",
        bandwidth / 1e9
    );
    HardwareProfile {
        name: format!("this machine, {threads} thread(s)"),
        kind: DeviceKind::Cpu,
        source: format!(
            "tandem plan --calibrate ({} kernels)",
            tandem_kernels::Isa::best()
        ),
        threads,
        bandwidth,
        matmul,
        attention_flops: decode_attention_rate(&pool),
        prefill_attention_flops: prefill_attention_rate(&pool),
        step_overhead_s: ROUNDS_PER_STEP * round,
        layer_overhead_s: ROUNDS_PER_LAYER * round,
        memory_bytes: 0.0,
    }
}

/// Fits the profile to a model's own forward passes on `runner` (the pool must hold 64
/// blocks of 16 tokens): the per-layer overhead from one-token decode steps (their time
/// beyond the roofline), then the matrix rate at 4 to 32 tokens from decode steps of that
/// many sequences and at 64 and 256 from prefill chunks, wherever the model runs slower than
/// the kernels alone (norms, activation quantization, RoPE and attention jobs, which the
/// kernel-only measurement leaves out, cost time per token).
pub fn fit_to_model(
    runner: &mut dyn ModelRunner,
    shape: &ModelShape,
    hw: &mut HardwareProfile,
) -> anyhow::Result<()> {
    measure(runner, 1, 16, 4, 8192)?; // first touch of the pool and scratch memory
    let steps = 16;
    let kv_dtype = runner.kv_geometry().dtype;
    let one = best_measure(runner, 1, 16, steps)?.decode_s / steps as f64;
    let fixed = hw.clone();
    let r = Roofline {
        shape,
        hw: &fixed,
        kv_dtype,
    };
    let ceiling = r.decode(1, 16, steps) / steps as f64 - fixed.overhead_s(shape.num_layers);
    let extra = one - ceiling - fixed.step_overhead_s;
    let layer_overhead = (extra / shape.num_layers as f64).max(fixed.layer_overhead_s);
    hw.layer_overhead_s = layer_overhead;
    for p in hw.matmul.iter_mut().filter(|p| p.tokens >= 4) {
        let n = p.tokens;
        let TimedStep { work, secs } = if n <= 32 {
            step_times::decode(runner, n, 16, 8)?
        } else {
            step_times::prefill(runner, 1, n)?
        };
        let attention: f64 = work
            .iter()
            .map(|w| shape.attention_flops(w.cached, w.new))
            .sum();
        let rows = work.iter().map(|w| w.rows).sum();
        let overhead = fixed.step_overhead_s + layer_overhead * shape.num_layers as f64;
        let rate = if n <= 32 {
            fixed.attention_flops
        } else {
            fixed.prefill_attention_flops
        };
        let left = secs - overhead - attention / rate;
        if left > 0.0 {
            p.flops = p.flops.min(shape.matmul_flops(n as f64, rows) / left);
        }
    }
    Ok(())
}

/// The fastest prefill and decode of three runs of `tandem bench`'s measurement: on a
/// machine shared with other work, the least disturbed run is the machine's own speed.
pub fn best_measure(
    runner: &mut dyn ModelRunner,
    batch: usize,
    prompt: usize,
    gen: usize,
) -> anyhow::Result<crate::bench_cmd::Measured> {
    let mut best = measure(runner, batch, prompt, gen, 8192)?;
    for _ in 0..2 {
        let m = measure(runner, batch, prompt, gen, 8192)?;
        best.prefill_s = best.prefill_s.min(m.prefill_s);
        best.decode_s = best.decode_s.min(m.decode_s);
    }
    Ok(best)
}

/// Seconds (best of a few) of one pass of `tokens` tokens through every matrix of `ws`.
fn pass_s(ws: &[&PackedMatrix], pool: &ThreadPool, tokens: usize) -> f64 {
    let widest = ws.iter().map(|w| w.rows().max(w.cols())).max().unwrap_or(1);
    let x: Vec<f32> = (0..tokens * widest).map(wave).collect();
    let mut y = vec![0.0; tokens * widest];
    let reps = if tokens >= 64 { 2 } else { 4 };
    best_of(reps, || {
        for w in ws {
            let (r, c) = (w.rows(), w.cols());
            matmul_packed(pool, w, &x[..tokens * c], &mut y[..tokens * r], tokens);
        }
    })
}

/// The best of `reps` timings of `f`, in seconds.
fn best_of(reps: usize, mut f: impl FnMut()) -> f64 {
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// One layer of a small Llama (q, k, v, o, gate, up, down of a 576-wide model with a
/// 1536-wide FFN and 192-wide K/V, as the default model's), Q4_1: 3.5M weights, 2.2 MB.
fn layer_weights(pool: &ThreadPool) -> Vec<PackedMatrix> {
    let (h, kv, ff) = (576, 192, 1536);
    let shapes = [(h, h), (kv, h), (kv, h), (h, h), (ff, h), (ff, h), (h, ff)];
    let pack = |&(r, c): &(usize, usize)| {
        let d = q4_1_data(r, c);
        let view = WeightView::new(DType::Q4_1, r, c, &d).expect("consistent sizes");
        PackedMatrix::pack(&view, pool).expect("Q4_1 packs")
    };
    shapes.iter().map(pack).collect()
}

/// `rows x cols` deterministic weights quantized to Q4_1.
fn q4_1_data(rows: usize, cols: usize) -> Vec<u8> {
    let dtype = DType::Q4_1;
    let row_bytes = dtype.bytes_for(cols).expect("whole blocks");
    let mut data = vec![0u8; rows * row_bytes];
    for (r, dst) in data.chunks_mut(row_bytes).enumerate() {
        let src: Vec<f32> = (0..cols).map(|c| wave(r * cols + c)).collect();
        tandem_kernels::quant::quantize_row(dtype, &src, dst);
    }
    data
}

/// FLOP/s of decode's group kernel over the f16 keys and values of 64 sequences of 2,048
/// positions (3 KV heads of 64 per slot; 100 MB, more than the last-level cache holds, so
/// they stream from memory as a batch's caches do), on every thread, reading the rows as a
/// decode step does: one task per sequence walks its 3 KV heads together (a token's 9 query
/// heads, every slot's row read whole).
fn decode_attention_rate(pool: &ThreadPool) -> f64 {
    let (seqs, ctx) = (64, 2048);
    let (keys, values, slots) = kv_rows(seqs, ctx);
    let q: Vec<f32> = (0..HEADS * HEAD_DIM).map(wave).collect();
    let sink = AtomicU64::new(0);
    let isa = tandem_kernels::isa::active();
    let secs = best_of(3, || {
        pool.run(seqs, |i| {
            let kv = kv_view(&keys, &values, 0, &slots[i]);
            let mut out = vec![0.0; q.len()];
            attend_heads_with(isa, &q, &kv, KV_HEADS, 0.125, &mut out);
            sink.fetch_add(u64::from(out[0].to_bits()), Ordering::Relaxed);
        })
    });
    std::hint::black_box(sink.load(Ordering::Relaxed));
    (4 * ctx * HEAD_DIM * HEADS * seqs) as f64 / secs
}

/// FLOP/s of prefill's tile kernel as a prefill step runs it: the causal attention of two
/// prompts of 2,048 tokens (f16 keys and values, 3 KV heads of 64), one task per chunk of 64
/// tokens computing their 9 query heads one after the other, 16 rows a tile. A prompt's
/// rows (3 MB) stay in the last-level cache while its chunks read them, as they do in a
/// prefill step.
fn prefill_attention_rate(pool: &ThreadPool) -> f64 {
    let (seqs, ctx, chunk) = (2, 2048, 64);
    let (keys, values, slots) = kv_rows(seqs, ctx);
    let q: Vec<f32> = (0..chunk * HEAD_DIM).map(wave).collect();
    let chunks = ctx / chunk;
    let sink = AtomicU64::new(0);
    let secs = best_of(3, || {
        pool.run(seqs * chunks, |i| {
            let first = i % chunks * chunk;
            let context: Vec<usize> = (first + 1..=first + chunk).collect();
            let mut out = vec![0.0; q.len()];
            for h in 0..HEADS {
                let kv = kv_view(&keys, &values, h / (HEADS / KV_HEADS), &slots[i / chunks]);
                attend_rows(&q, &context, &kv, 0.125, &mut out);
            }
            sink.fetch_add(u64::from(out[0].to_bits()), Ordering::Relaxed);
        })
    });
    std::hint::black_box(sink.load(Ordering::Relaxed));
    // Σ of the contexts of one prompt's rows: 1 + 2 + … + ctx.
    let pairs = ctx * (ctx + 1) / 2;
    (4 * pairs * HEAD_DIM * HEADS * seqs) as f64 / secs
}

/// Query heads, KV heads and head size of the attention rates (the default model's).
const HEADS: usize = 9;
const KV_HEADS: usize = 3;
const HEAD_DIM: usize = 64;

/// The f16 keys and values of `seqs` sequences of `ctx` positions ([`KV_HEADS`] heads a
/// slot), and each sequence's slots (sequence `s` holds slots `s · ctx ..`).
fn kv_rows(seqs: usize, ctx: usize) -> (Vec<f16>, Vec<f16>, Vec<Vec<usize>>) {
    let n = seqs * ctx * KV_HEADS * HEAD_DIM;
    let keys = (0..n).map(|i| f16::from_f32(wave(i))).collect();
    let values = (0..n).map(|i| f16::from_f32(wave(i + 7))).collect();
    let slots = (0..seqs)
        .map(|s| (s * ctx..(s + 1) * ctx).collect())
        .collect();
    (keys, values, slots)
}

/// KV head `head` of `keys` and `values` over `slots`.
fn kv_view<'a>(keys: &'a [f16], values: &'a [f16], head: usize, slots: &'a [usize]) -> KvView<'a> {
    KvView {
        rows: KvRows::F16 { keys, values },
        row_stride: KV_HEADS * HEAD_DIM,
        offset: head * HEAD_DIM,
        head_dim: HEAD_DIM,
        slots,
    }
}

/// Seconds of one small product on the pool (one token through a 64 x 576 matrix: the
/// dispatch, quantization of the input and wait of a job, with next to no arithmetic).
fn pool_round_s(pool: &ThreadPool) -> f64 {
    let cols = 576;
    let small = tiny_matrix(pool, cols);
    let x: Vec<f32> = (0..cols).map(wave).collect();
    let mut y = vec![0.0; small.rows()];
    let rounds = 2000;
    let secs = best_of(3, || {
        for _ in 0..rounds {
            matmul_packed(pool, &small, &x, &mut y, 1);
        }
    });
    secs / rounds as f64
}

/// A 64-row Q4_1 matrix of `cols` columns.
fn tiny_matrix(pool: &ThreadPool, cols: usize) -> PackedMatrix {
    let data = q4_1_data(64, cols);
    let view = WeightView::new(DType::Q4_1, 64, cols, &data).expect("consistent sizes");
    PackedMatrix::pack(&view, pool).expect("Q4_1 packs")
}

/// A deterministic value in [-1, 1).
fn wave(i: usize) -> f32 {
    ((i.wrapping_mul(2_654_435_761) % 2001) as f32 / 1000.0) - 1.0
}
