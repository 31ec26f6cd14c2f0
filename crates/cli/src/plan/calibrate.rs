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
//! - attention rate: the attention kernels over f16 keys and values of a cached context;
//! - overhead: one tiny product on the pool (a step runs about 8 jobs per layer, 4 more),
//!   and, when a model is at hand, [`measured_layer_overhead`]: what a real one-token decode
//!   step takes beyond its roofline, per layer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use half::f16;
use serde::{Deserialize, Serialize};
use tandem_kernels::attention::{attend, KvRows, KvView};
use tandem_kernels::{matmul_packed, DType, PackedMatrix, ThreadPool, WeightView};

use super::hardware::{DeviceKind, HardwareProfile, RatePoint};

/// Saved calibration: one profile per thread count measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Calibration {
    pub profiles: Vec<HardwareProfile>,
}

impl Calibration {
    /// The profile measured with `threads` threads, else the nearest thread count below it,
    /// else the smallest.
    pub fn for_threads(&self, threads: usize) -> Option<&HardwareProfile> {
        let below = self.profiles.iter().filter(|p| p.threads <= threads);
        below
            .max_by_key(|p| p.threads)
            .or_else(|| self.profiles.iter().min_by_key(|p| p.threads))
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
        attention_flops: attention_rate(&pool),
        step_overhead_s: ROUNDS_PER_STEP * round,
        layer_overhead_s: ROUNDS_PER_LAYER * round,
        memory_bytes: 0.0,
    }
}

/// The per-layer overhead of `runner`'s decode steps: the mean time of 32 one-token steps
/// after a 16-token prompt, less the roofline's memory/compute time and the fixed step
/// overhead of `hw`, divided by the layers (never below `hw`'s estimate from pool rounds).
pub fn measured_layer_overhead(
    runner: &mut dyn tandem_model::runner::ModelRunner,
    shape: &super::shape::ModelShape,
    hw: &HardwareProfile,
) -> anyhow::Result<f64> {
    let steps = 32;
    let m = crate::bench_cmd::measure(runner, 1, 16, steps, 8192)?;
    let kv_dtype_bytes = runner.kv_geometry().dtype.size();
    let r = super::cost::Roofline {
        shape,
        hw,
        kv_dtype_bytes,
    };
    let modelled = r.decode(1, 16, steps) - steps as f64 * hw.overhead_s(shape.num_layers);
    let extra = (m.decode_s - modelled) / steps as f64 - hw.step_overhead_s;
    Ok((extra / shape.num_layers as f64).max(hw.layer_overhead_s))
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

/// FLOP/s of the attention kernels: a group of 3 query heads of 64 over 512 cached f16
/// positions (3 KV heads per slot), one task per KV head and query, on every thread.
fn attention_rate(pool: &ThreadPool) -> f64 {
    let (ctx, head_dim, kv_heads, group) = (512, 64, 3, 3);
    let stride = kv_heads * head_dim;
    let keys: Vec<f16> = (0..ctx * stride).map(|i| f16::from_f32(wave(i))).collect();
    let values: Vec<f16> = (0..ctx * stride)
        .map(|i| f16::from_f32(wave(i + 7)))
        .collect();
    let slots: Vec<usize> = (0..ctx).collect();
    let q: Vec<f32> = (0..group * head_dim).map(wave).collect();
    let tasks = 16 * pool.n_threads();
    let sink = AtomicU64::new(0);
    let secs = best_of(3, || {
        pool.run(tasks, |i| {
            let kv = KvView {
                rows: KvRows::F16 {
                    keys: &keys,
                    values: &values,
                },
                row_stride: stride,
                offset: (i % kv_heads) * head_dim,
                head_dim,
                slots: &slots,
            };
            let mut out = vec![0.0; group * head_dim];
            for _ in 0..20 {
                attend(&q, &kv, 0.125, &mut out);
            }
            sink.fetch_add(out[0].to_bits() as u64, Ordering::Relaxed);
        })
    });
    std::hint::black_box(sink.load(Ordering::Relaxed));
    (4 * ctx * head_dim * group * 20 * tasks) as f64 / secs
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
