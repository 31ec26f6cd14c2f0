//! Throughput of `matmul` per kernel variant:
//! `cargo run --release -p tandem-kernels --example matmul_bench [threads...] [filter]`
//! (`filter`: an ISA name such as `avx512` keeps only that ISA; `tok=N` (repeatable) replaces
//! the token counts; anything else keeps only the shapes whose label, e.g. `Q8_0 49152x576`,
//! contains it).
//!
//! Prints GFLOP/s (2·rows·cols·n_tokens per call) for the SmolLM2-135M shapes (Q4_1
//! projections, the Q8_0 LM head) and Gemma 3 270M's (the Q8_0 262,144 × 640 LM head, Q5_0,
//! Q6_K and Q4_K projections), and two K-quant matrices of 32,768 × 2,048 that no cache holds,
//! with 1, 64 and 512 tokens, for every ISA this CPU runs, and in
//! the column `packed` for the int8 kernels on packed matrices that quantized models run
//! (`matmul_quantized`, the activations quantized outside the timing): the median of 7 timed
//! batches (the machine is shared; medians resist outliers).

use std::time::Instant;

use tandem_kernels::packed::{matmul_quantized, QuantizedRows};
use tandem_kernels::quant::quantize_row;
use tandem_kernels::{matmul_with, DType, Isa, PackedMatrix, ThreadPool, WeightView};

/// `[rows, cols]` weights of the default model (attention q/o, k/v, MLP gate/up, MLP down, and
/// the LM head), then Gemma 3 270M's (LM head, MLP gate/up and down, attention o), then two
/// K-quant matrices larger than this CPU's 32 MiB last-level cache (a Q4_K_M model's Q4_K
/// layers and Q6_K LM head stream from memory at one token).
const SHAPES: [(DType, usize, usize); 11] = [
    (DType::Q4_1, 576, 576),
    (DType::Q4_1, 192, 576),
    (DType::Q4_1, 1536, 576),
    (DType::Q4_1, 576, 1536),
    (DType::Q8_0, 49152, 576),
    (DType::Q8_0, 262144, 640),
    (DType::Q5_0, 2048, 640),
    (DType::Q6_K, 640, 2048),
    (DType::Q4_K, 640, 1024),
    (DType::Q4_K, 32768, 2048),
    (DType::Q6_K, 32768, 2048),
];

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

/// Median GFLOP/s of `product` (`y = x · wᵀ`, `[n_tokens, cols]` by `[rows, cols]`) over 7
/// batches of calls.
fn bench(w: &WeightView<'_>, n_tokens: usize, mut product: impl FnMut(&[f32], &mut [f32])) -> f64 {
    let x: Vec<f32> = (0..n_tokens * w.cols)
        .map(|i| (i % 13) as f32 * 0.1 - 0.6)
        .collect(); // [n_tokens, cols]
    let mut y = vec![0.0f32; n_tokens * w.rows]; // [n_tokens, rows]
    let flops_per_call = 2.0 * (w.rows * w.cols * n_tokens) as f64;
    let iters = ((1e8 / flops_per_call) as usize).max(1);
    product(&x, &mut y); // warm-up
    let mut secs: Vec<f64> = (0..7)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..iters {
                product(&x, &mut y);
            }
            start.elapsed().as_secs_f64() / iters as f64
        })
        .collect();
    std::hint::black_box(&y);
    secs.sort_by(f64::total_cmp);
    flops_per_call / secs[secs.len() / 2] / 1e9
}

/// [`bench`] of the packed int8 product (the activations quantized once, outside the timing).
fn bench_packed(pool: &ThreadPool, w: &WeightView<'_>, n_tokens: usize) -> Option<f64> {
    let packed = PackedMatrix::pack(w, pool)?;
    let mut xq = None;
    Some(bench(w, n_tokens, |x, y| {
        let xq = xq.get_or_insert_with(|| QuantizedRows::quantize(pool, x, n_tokens, w.cols));
        matmul_quantized(pool, &packed, xq, y);
    }))
}

fn main() {
    let (threads, filters): (Vec<String>, Vec<String>) = std::env::args()
        .skip(1)
        .partition(|a| a.parse::<usize>().is_ok());
    let threads: Vec<usize> = threads
        .iter()
        .map(|a| a.parse().expect("partitioned on parse"))
        .collect();
    let threads = if threads.is_empty() { vec![1] } else { threads };
    let (tok_args, filters): (Vec<String>, Vec<String>) =
        filters.into_iter().partition(|f| f.starts_with("tok="));
    let token_counts: Vec<usize> = if tok_args.is_empty() {
        vec![1, 64, 512]
    } else {
        tok_args
            .iter()
            .map(|a| {
                a["tok=".len()..]
                    .parse()
                    .expect("tok=N takes a token count")
            })
            .collect()
    };
    let (isa_filters, filters): (Vec<String>, Vec<String>) =
        filters.into_iter().partition(|f| f.parse::<Isa>().is_ok());
    let isas: Vec<Isa> = Isa::available()
        .into_iter()
        .filter(|i| isa_filters.is_empty() || isa_filters.iter().any(|f| f == i.name()))
        .collect();
    print!("{:<22} {:>3} {:>3}", "shape", "tok", "thr");
    for isa in &isas {
        print!(" {:>8}", isa.name());
    }
    println!(" {:>8}   (GFLOP/s, wall time, median of 7)", "packed");
    for (dtype, rows, cols) in SHAPES {
        let label = format!("{dtype} {rows}x{cols}");
        if !filters.iter().all(|f| label.contains(f.as_str())) {
            continue;
        }
        let data = weight(dtype, rows, cols);
        let w = WeightView::new(dtype, rows, cols, &data).expect("sizes match");
        for &n_tokens in &token_counts {
            for &n_threads in &threads {
                let pool = ThreadPool::new(n_threads);
                print!("{label:<22} {n_tokens:>3} {n_threads:>3}");
                for &isa in &isas {
                    let gflops = bench(&w, n_tokens, |x, y| {
                        matmul_with(isa, &pool, &w, x, y, n_tokens)
                    });
                    print!(" {gflops:>8.2}");
                }
                match bench_packed(&pool, &w, n_tokens) {
                    Some(gflops) => println!(" {gflops:>8.2}"),
                    None => println!(" {:>8}", "-"),
                }
            }
        }
    }
}
