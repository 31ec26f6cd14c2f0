//! Quick throughput check of the scalar `matmul`:
//! `cargo run --release -p tandem-kernels --example matmul_bench [threads...]`.
//!
//! Prints GFLOP/s (2·rows·cols·n_tokens per call) for the SmolLM2-135M shapes in Q4_1 and Q8_0
//! with 1 and 64 tokens, best of several timed batches, and the pool's dispatch latency.

use std::time::Instant;

use tandem_kernels::quant::quantize_row;
use tandem_kernels::{matmul, DType, ThreadPool, WeightView};

fn weight(dtype: DType, rows: usize, cols: usize) -> Vec<u8> {
    let row_bytes = dtype
        .bytes_for(cols)
        .expect("cols is a whole number of blocks");
    let mut data = vec![0u8; rows * row_bytes];
    for (r, row) in data.chunks_exact_mut(row_bytes).enumerate() {
        let x: Vec<f32> = (0..cols)
            .map(|c| ((r * 31 + c * 17) % 97) as f32 / 48.0 - 1.0)
            .collect();
        quantize_row(dtype, &x, row);
    }
    data
}

fn bench(pool: &ThreadPool, dtype: DType, rows: usize, cols: usize, n_tokens: usize) -> f64 {
    let data = weight(dtype, rows, cols);
    let w = WeightView::new(dtype, rows, cols, &data).expect("sizes match");
    let x: Vec<f32> = (0..n_tokens * cols)
        .map(|i| (i % 13) as f32 * 0.1 - 0.6)
        .collect();
    let mut y = vec![0.0f32; n_tokens * rows];
    let flops_per_call = 2.0 * (rows * cols * n_tokens) as f64;
    let iters = ((2e8 / flops_per_call) as usize).max(3);
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let start = Instant::now();
        for _ in 0..iters {
            matmul(pool, &w, &x, &mut y, n_tokens);
        }
        best = best.min(start.elapsed().as_secs_f64() / iters as f64);
    }
    std::hint::black_box(&y);
    flops_per_call / best / 1e9
}

/// Mean wall time of one `run` of `n_threads` empty tasks, in microseconds.
fn dispatch_us(pool: &ThreadPool) -> f64 {
    let calls = 20_000;
    let start = Instant::now();
    for _ in 0..calls {
        pool.run(pool.n_threads(), |i| {
            std::hint::black_box(i);
        });
    }
    start.elapsed().as_secs_f64() / f64::from(calls) * 1e6
}

fn main() {
    let threads: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("thread counts are integers"))
        .collect();
    let threads = if threads.is_empty() { vec![1] } else { threads };
    for n_threads in threads {
        let pool = ThreadPool::new(n_threads);
        println!(
            "threads={n_threads} run() dispatch: {:.2} us/call",
            dispatch_us(&pool)
        );
        for dtype in [DType::Q4_1, DType::Q8_0, DType::F32] {
            for (rows, cols) in [(576, 1536), (1536, 576)] {
                for n_tokens in [1, 64] {
                    let gflops = bench(&pool, dtype, rows, cols, n_tokens);
                    println!(
                        "threads={n_threads} {dtype} {rows}x{cols} n_tokens={n_tokens}: \
                         {gflops:.2} GFLOP/s"
                    );
                }
            }
        }
    }
}
