//! Throughput of the attention kernel in batched decode, with the default model's geometry
//! (30 layers, 9 query heads in 3 KV groups of 64 dimensions):
//! `cargo run --release -p tandem-kernels --example attention_bench [batch] [context] [threads]`.
//!
//! Each of `batch` sequences owns `context` scattered slots (its blocks of 16 interleaved with
//! the other sequences', as a paged pool hands them out); one "step" runs, for every layer, one
//! query token per sequence against its whole context, split into one task per token (all its
//! KV heads at once) on the pool as the model does in a batch (`PER_HEAD=1`: one task per
//! (token, KV head), as it does for small batches). Prints, for f32, f16 and 8-bit (q8) rows,
//! the median step time of 7 and the K/V bytes read per second: the layers' stores together
//! exceed the caches, as in a real decode.
//! The stores sit on huge pages as the model's do (`SMALL_PAGES=1`: ordinary 4 KiB pages);
//! `REPS=N` times N steps instead of 7; `DTYPES=f16,q8` runs (and builds) only those.

use std::time::Instant;

use half::f16;
use tandem_kernels::attention::{attend, attend_heads_with, KvRows, KvView, Q8Rows, Q8_GROUP};
use tandem_kernels::huge_pages::zeroed_vec;
use tandem_kernels::kv_quant::quantize_q8;
use tandem_kernels::parallel::for_each_chunk_mut;
use tandem_kernels::ThreadPool;

const LAYERS: usize = 30;
const HEADS: usize = 9;
const KV_HEADS: usize = 3;
const HEAD_DIM: usize = 64;
const BLOCK: usize = 16;

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("numbers: batch context threads"))
        .collect();
    let batch = args.first().copied().unwrap_or(32);
    let context = args.get(1).copied().unwrap_or(256);
    let threads = args.get(2).copied().unwrap_or(2);
    let pool = ThreadPool::new(threads);
    let row = KV_HEADS * HEAD_DIM;
    let blocks_per_seq = context.div_ceil(BLOCK);
    let slots_total = batch * blocks_per_seq * BLOCK;
    // Block `b` of sequence `s` is pool block `b * batch + s`.
    let seq_slots: Vec<Vec<usize>> = (0..batch)
        .map(|s| {
            (0..context)
                .map(|p| ((p / BLOCK) * batch + s) * BLOCK + p % BLOCK)
                .collect()
        })
        .collect();
    let value = |i: usize| ((i * 7919 % 1013) as f32 / 506.0) - 1.0;
    let huge = std::env::var_os("SMALL_PAGES").is_none();
    let f32_layers: Vec<Vec<f32>> = (0..2 * LAYERS)
        .map(|l| {
            let mut v = if huge {
                zeroed_vec(slots_total * row)
            } else {
                vec![0.0; slots_total * row]
            };
            v.iter_mut()
                .enumerate()
                .for_each(|(i, x)| *x = value(i + l));
            v
        })
        .collect();
    let dtypes = std::env::var("DTYPES").unwrap_or_else(|_| "f32,f16,q8".into());
    let wanted = |d: &str| dtypes.split(',').any(|x| x == d);
    let f16_layers: Vec<Vec<f16>> = f32_layers
        .iter()
        .filter(|_| wanted("f16"))
        .map(|l| {
            let mut v = if huge {
                zeroed_vec(l.len())
            } else {
                vec![f16::ZERO; l.len()]
            };
            v.iter_mut()
                .zip(l)
                .for_each(|(h, &x)| *h = f16::from_f32(x));
            v
        })
        .collect();
    let q8_layers: Vec<(Vec<i8>, Vec<f32>)> = f32_layers
        .iter()
        .filter(|_| wanted("q8"))
        .map(|l| {
            let (mut codes, mut scales): (Vec<i8>, Vec<f32>) = if huge {
                (zeroed_vec(l.len()), zeroed_vec(l.len() / Q8_GROUP))
            } else {
                (vec![0; l.len()], vec![0.0; l.len() / Q8_GROUP])
            };
            quantize_q8(l, &mut codes, &mut scales);
            (codes, scales)
        })
        .collect();
    let q: Vec<f32> = (0..batch * HEADS * HEAD_DIM)
        .map(|i| value(i + 5) * 0.3)
        .collect();
    let mut out = vec![0.0f32; q.len()];
    let group = HEADS / KV_HEADS;
    let task = group * HEAD_DIM;
    let scale = 1.0 / (HEAD_DIM as f32).sqrt();
    let per_head = std::env::var_os("PER_HEAD").is_some();
    let isa = tandem_kernels::isa::active();
    let mut step = |dtype: &str| {
        for layer in 0..LAYERS {
            let (k, v) = (2 * layer, 2 * layer + 1);
            let rows = match dtype {
                "f16" => KvRows::F16 {
                    keys: &f16_layers[k],
                    values: &f16_layers[v],
                },
                "q8" => KvRows::Q8 {
                    keys: q8_rows(&q8_layers[k]),
                    values: q8_rows(&q8_layers[v]),
                },
                _ => KvRows::F32 {
                    keys: &f32_layers[k],
                    values: &f32_layers[v],
                },
            };
            if per_head {
                for_each_chunk_mut(&pool, &mut out, task, |i, o| {
                    let (t, kvh) = (i / KV_HEADS, i % KV_HEADS);
                    let kv = KvView {
                        rows,
                        row_stride: row,
                        offset: kvh * HEAD_DIM,
                        head_dim: HEAD_DIM,
                        slots: &seq_slots[t],
                    };
                    attend(&q[i * task..][..task], &kv, scale, o);
                });
            } else {
                let token = KV_HEADS * task;
                for_each_chunk_mut(&pool, &mut out, token, |t, o| {
                    let kv = KvView {
                        rows,
                        row_stride: row,
                        offset: 0,
                        head_dim: HEAD_DIM,
                        slots: &seq_slots[t],
                    };
                    attend_heads_with(isa, &q[t * token..][..token], &kv, KV_HEADS, scale, o);
                });
            }
        }
    };
    for (name, bytes) in [("f32", 4.0f64), ("f16", 2.0), ("q8", 1.125)] {
        if !wanted(name) {
            continue;
        }
        let mut times = Vec::new();
        let reps: usize = std::env::var("REPS")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(7);
        for _ in 0..reps {
            let started = Instant::now();
            step(name);
            times.push(started.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let t = times[times.len() / 2];
        let kv_bytes = (batch * context * LAYERS * 2 * row) as f64 * bytes;
        println!(
            "{name}: batch {batch} context {context} threads {threads}: step {:.2} ms, \
             K/V {:.1} GB/s, {:.0} tok/s of attention alone",
            t * 1e3,
            kv_bytes / t / 1e9,
            batch as f64 / t
        );
    }
}

fn q8_rows((codes, scales): &(Vec<i8>, Vec<f32>)) -> Q8Rows<'_> {
    Q8Rows { codes, scales }
}
