//! The two attention kernels side by side with their K/V in cache, in the default model's
//! geometry (3 query heads per KV head of 64 dimensions, f16 rows):
//! `cargo run --release -p tandem-kernels --example attention_tile_bench [context]`.
//!
//! The decode (group) kernel runs one token's 3 query heads over `context` positions; the
//! tile kernel runs 16 tokens of a prefill chunk (contexts `context − 15 ..= context`) of one
//! query head. Prints the best of 7 timings of each as nanoseconds per query head and block
//! of 16 positions (the unit of work of both).

use std::time::Instant;

use half::f16;
use tandem_kernels::attention::{attend, attend_rows, KvRows, KvView, POS_BLOCK, TILE_ROWS};

const KV_HEADS: usize = 3;
const HEAD_DIM: usize = 64;
const GROUP: usize = 3;

fn main() {
    let context: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("a context length"))
        .unwrap_or(1024)
        .max(TILE_ROWS);
    let row = KV_HEADS * HEAD_DIM;
    let value = |i: usize| ((i * 7919 % 1013) as f32 / 506.0) - 1.0;
    let keys: Vec<f16> = (0..context * row)
        .map(|i| f16::from_f32(value(i)))
        .collect();
    let values: Vec<f16> = (0..context * row)
        .map(|i| f16::from_f32(value(i + 7)))
        .collect();
    let slots: Vec<usize> = (0..context).collect();
    let kv = KvView {
        rows: KvRows::F16 {
            keys: &keys,
            values: &values,
        },
        row_stride: row,
        offset: HEAD_DIM,
        head_dim: HEAD_DIM,
        slots: &slots,
    };
    let scale = 1.0 / (HEAD_DIM as f32).sqrt();
    let q_group: Vec<f32> = (0..GROUP * HEAD_DIM).map(|i| value(i + 3) * 0.3).collect();
    let q_tile: Vec<f32> = (0..TILE_ROWS * HEAD_DIM)
        .map(|i| value(i + 3) * 0.3)
        .collect();
    let lens: Vec<usize> = (0..TILE_ROWS)
        .map(|i| context + 1 + i - TILE_ROWS)
        .collect();
    let mut out = vec![0.0f32; TILE_ROWS * HEAD_DIM];
    let blocks = context.div_ceil(POS_BLOCK);
    let reps = (4_000_000 / context).max(1);
    let (mut group_ns, mut tile_ns) = (f64::MAX, f64::MAX);
    for _ in 0..7 {
        let started = Instant::now();
        for _ in 0..reps {
            attend(&q_group, &kv, scale, &mut out[..GROUP * HEAD_DIM]);
        }
        let per = started.elapsed().as_secs_f64() / (reps * GROUP * blocks) as f64;
        group_ns = group_ns.min(per * 1e9);
        let tile_reps = (reps / 5).max(1);
        let started = Instant::now();
        for _ in 0..tile_reps {
            attend_rows(&q_tile, &lens, &kv, scale, &mut out);
        }
        let per = started.elapsed().as_secs_f64() / (tile_reps * TILE_ROWS * blocks) as f64;
        tile_ns = tile_ns.min(per * 1e9);
    }
    println!(
        "context {context}, f16 rows: decode (group) kernel {group_ns:.1} ns, tile kernel \
         {tile_ns:.1} ns per query head and block of {POS_BLOCK} positions (best of 7)"
    );
}
