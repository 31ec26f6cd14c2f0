//! `tandem plan --calibrate`: measures this machine's ceilings with tandem's own kernels, for
//! each thread count, in seconds, and saves them as hardware profiles (JSON).
//!
//! - read bandwidth: threads summing disjoint parts of a buffer far larger than the caches;
//! - int8 matrix rate: the packed int8 kernels over 66 MB of Q4_1 matrices shaped as a small
//!   model's layers (more than the caches hold), at 1 to 256 tokens per product: the effective rate,
//!   set by streaming the weights at few tokens and by arithmetic at many;
//! - attention rate: the attention kernels over f16 keys and values of a cached context;
//! - overhead: one tiny product on the pool (a step runs about 8 jobs per layer, 4 more).

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
    let bandwidth = read_bandwidth(&pool);
    let weights = test_weights(&pool);
    let matmul = MATMUL_TOKENS
        .iter()
        .map(|&tokens| RatePoint {
            tokens,
            flops: int8_rate(&weights, &pool, tokens),
        })
        .collect();
    let round = pool_round_s(&pool, &weights);
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

/// Bytes/s of threads summing disjoint parts of a 256 MiB buffer.
fn read_bandwidth(pool: &ThreadPool) -> f64 {
    let words: usize = 32 << 20; // 256 MiB of u64
    let buf: Vec<u64> = (0..words as u64).collect();
    let sink = AtomicU64::new(0);
    let parts = pool.n_threads();
    let per = words.div_ceil(parts);
    let secs = best_of(5, || {
        pool.run(parts, |i| {
            let part = &buf[(i * per).min(words)..((i + 1) * per).min(words)];
            let s = part.iter().fold(0u64, |a, &x| a.wrapping_add(x));
            sink.fetch_add(s, Ordering::Relaxed);
        })
    });
    std::hint::black_box(sink.load(Ordering::Relaxed));
    (words * 8) as f64 / secs
}

/// FLOP/s of the packed int8 kernels at `tokens` tokens per product over a model-sized set
/// of matrices ([`test_weights`]), each read once per pass as a forward pass reads them. The rate is the
/// effective one: at few tokens it is set by streaming the weights, at many by arithmetic.
fn int8_rate(weights: &[PackedMatrix], pool: &ThreadPool, tokens: usize) -> f64 {
    let widest = weights
        .iter()
        .map(|w| w.rows().max(w.cols()))
        .max()
        .unwrap_or(1);
    let x: Vec<f32> = (0..tokens * widest).map(wave).collect();
    let mut y = vec![0.0; tokens * widest];
    let pass = || {
        for w in weights {
            let (r, c) = (w.rows(), w.cols());
            matmul_packed(pool, w, &x[..tokens * c], &mut y[..tokens * r], tokens);
        }
    };
    let reps = if tokens >= 64 { 2 } else { 3 };
    let secs = best_of(reps, pass);
    let params: usize = weights.iter().map(|w| w.rows() * w.cols()).sum();
    (2 * params * tokens) as f64 / secs
}

/// The matrices [`int8_rate`] runs over: 30 layers of a small Llama (q, k, v, o, gate, up,
/// down of a 576-wide model with 1536-wide FFN and 192-wide K/V, as the default model's),
/// Q4_1, 106M weights, 66 MB packed: more than the caches hold.
fn test_weights(pool: &ThreadPool) -> Vec<PackedMatrix> {
    let (h, kv, ff) = (576, 192, 1536);
    let shapes = [(h, h), (kv, h), (kv, h), (h, h), (ff, h), (ff, h), (h, ff)];
    let data: Vec<(usize, usize, Vec<u8>)> = shapes
        .iter()
        .map(|&(r, c)| (r, c, q4_1_data(r, c)))
        .collect();
    let pack = |(r, c, d): &(usize, usize, Vec<u8>)| {
        let view = WeightView::new(DType::Q4_1, *r, *c, d).expect("consistent sizes");
        PackedMatrix::pack(&view, pool).expect("Q4_1 packs")
    };
    (0..30).flat_map(|_| data.iter().map(pack)).collect()
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
fn pool_round_s(pool: &ThreadPool, weights: &[PackedMatrix]) -> f64 {
    let cols = weights[0].cols();
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
