//! The experts' products on tensor cores (`expert_gemm`, bf16): against an f64 reference over
//! routes grouped by `moe_group` (an expert with two tiles, the second partial; one with no
//! route between two with routes; outputs that fill one block and part of a second; widths of
//! fewer, as many and more column steps than the pipeline holds), and each token's result
//! bitwise the same computed alone as in the batch, where its routes sit at other places of
//! other tiles. Q8_0 and Q4_1 experts (`_q8`, `_q4`) give bitwise the results of their matrices
//! expanded by `q8_dequant` and `q4_dequant` and multiplied as dense ones.

use super::moe::Grouped;
use super::*;
use crate::program_buffers::MatrixPtrs;
use crate::{q4_weights, q8_weights};

const EXPERTS: usize = 5;
/// Tokens; expert 0 gets every token's first route: 110 routes, tiles of 64 and 46.
const TOKENS: usize = 110;
/// Experts per token.
const PER_TOKEN: usize = 2;
/// Outputs per expert: a block of 64 and one of 16.
const M: usize = 80;

/// The expert of token `t`'s `slot`-th route; expert 2, between experts with routes, gets
/// none (its tiles are none, and the tiles of expert 3 follow those of expert 1). The
/// experts' counts, 110 (64 + 46), 63, 0, 32 and 15, give tiles of every fill the four
/// warps tell apart: the lower 32 routes' second m16 tile empty (15) or not (32), the upper
/// 32 routes' warps idle or busy with one m16 tile (46) or two (63, 64).
fn expert_of(t: usize, slot: usize) -> i32 {
    match (slot, t % 7) {
        (0, _) => 0,
        (_, 0 | 1 | 2 | 5) => 1,
        (_, 3 | 4) => 3,
        _ => 4,
    }
}

/// The products of a batch of `tokens` (numbers of the test's tokens, which fix their
/// routes) through `moe_group` and `expert_gemm`, and the groups buffer. `x` holds the rows
/// of all TOKENS tokens: one per token (`per_token` = PER_TOKEN) or one per route (1).
fn products(
    kern: &Kernels,
    tokens: &[usize],
    x: &[f32],
    w: &MatrixPtrs,
    per_token: usize,
    width: usize,
) -> (Vec<f32>, Vec<i32>) {
    let n = tokens.len();
    let routes_n = n * PER_TOKEN;
    let experts: Vec<i32> = (0..routes_n)
        .map(|r| expert_of(tokens[r / PER_TOKEN], r % PER_TOKEN))
        .collect();
    let grouped = Grouped::new(kern, &experts, PER_TOKEN, EXPERTS);
    let routes = grouped.routes;
    // x's rows of these tokens: one per token (per_token = PER_TOKEN) or one per route.
    let rows_per_token = PER_TOKEN / per_token;
    let rows: Vec<f32> = tokens
        .iter()
        .flat_map(|&t| {
            let first = t * rows_per_token * width;
            x[first..first + rows_per_token * width].iter().copied()
        })
        .collect();
    let mut xb = act_buf(CudaDtype::Bf16, &rows);
    // NaN until written: every route's every output must be.
    let mut y = Buf::of(&vec![f32::NAN; routes_n * M]);
    kern.expert_gemm((xb.ptr(), w, y.ptr()), (routes, n), per_token, (M, width))
        .expect("launch");
    (y.read::<f32>(), grouped.groups())
}

#[test]
fn expert_products_on_tensor_cores_match_the_reference_and_never_depend_on_the_batch() {
    let kern = kernels(CudaDtype::Bf16);
    let all: Vec<usize> = (0..TOKENS).collect();
    for width in [32usize, 96, 320] {
        let mut r = rng(width as u64);
        let weights = as_stored(
            CudaDtype::Bf16,
            &normal_ish(&mut r, EXPERTS * M * width, 0.5),
        );
        let mut wb = act_buf(CudaDtype::Bf16, &weights);
        let w = MatrixPtrs::Dense(wb.ptr());
        let mut quantized = Quantized::new(&kern, &weights, width);
        for per_token in [PER_TOKEN, 1] {
            let x_rows = TOKENS * PER_TOKEN / per_token;
            let x = as_stored(CudaDtype::Bf16, &normal_ish(&mut r, x_rows * width, 1.0));
            let (got, groups) = products(&kern, &all, &x, &w, per_token, width);
            let what = format!("width {width} per_token {per_token}");

            // The tiles moe_group numbered: ⌈count / 64⌉ per expert, in expert order.
            let counts: Vec<usize> = (0..EXPERTS as i32)
                .map(|e| {
                    let chose = |t: &usize| (0..PER_TOKEN).any(|s| expert_of(*t, s) == e);
                    all.iter().filter(|t| chose(t)).count()
                })
                .collect();
            assert_eq!(counts, [TOKENS, 63, 0, 32, 15]);
            let tile_offsets = &groups[2 * EXPERTS + 1..3 * EXPERTS + 2];
            let mut want_tiles = vec![0];
            for c in &counts {
                want_tiles.push(want_tiles.last().copied().unwrap_or(0) + c.div_ceil(64) as i32);
            }
            assert_eq!(tile_offsets, &want_tiles[..], "{what}: tile offsets");

            let want: Vec<f64> = (0..TOKENS * PER_TOKEN * M)
                .map(|i| {
                    let (route, j) = (i / M, i % M);
                    let e = expert_of(route / PER_TOKEN, route % PER_TOKEN) as usize;
                    let (xr, wr) = (route / per_token, e * M + j);
                    (0..width)
                        .map(|c| x[xr * width + c] as f64 * weights[wr * width + c] as f64)
                        .sum()
                })
                .collect();
            // bf16 inputs, exact products, f32 sums.
            assert_close(&what, &got, &want, 2e-5);

            // A token alone, and three tokens that put it first in its tiles: its routes'
            // bits are those of the whole batch.
            for t in [0usize, 33, 65, 109] {
                for batch in [vec![t], vec![t, (t + 1) % TOKENS, (t + 5) % TOKENS]] {
                    let (alone, _) = products(&kern, &batch, &x, &w, per_token, width);
                    let span = t * PER_TOKEN * M..(t + 1) * PER_TOKEN * M;
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&alone[..PER_TOKEN * M]),
                        bits(&got[span]),
                        "{what}: token {t} in {batch:?} vs in the whole batch"
                    );
                }
            }

            // Quantized experts: bitwise their expansion's products.
            for (format, codes, expanded) in quantized.formats() {
                let (got, _) = products(&kern, &all, &x, &codes, per_token, width);
                let (want, _) = products(&kern, &all, &x, &expanded, per_token, width);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert!(got.iter().all(|v| v.is_finite()), "{what} {format}");
                assert_eq!(bits(&got), bits(&want), "{what} {format} vs its expansion");
            }
        }
    }
}

/// The test's experts quantized to Q8_0 and Q4_1, and each expanded to bf16 by the
/// dense layers' kernels (`q8_dequant`, `q4_dequant`).
struct Quantized {
    bufs: Vec<Buf>,
}

impl Quantized {
    fn new(kern: &Kernels, weights: &[f32], width: usize) -> Quantized {
        let rows = EXPERTS * M;
        let (mut c8, mut s8) = (Vec::new(), Vec::new());
        q8_weights::quantize(weights, &mut c8, &mut s8);
        let (mut c4, mut s4) = (Vec::new(), Vec::new());
        q4_weights::quantize(weights, &mut c4, &mut s4);
        let mut bufs = vec![
            Buf::of(&c8),
            Buf::of(&s8),
            Buf::zeroed(rows * width * 2),
            Buf::of(&c4),
            Buf::of(&s4),
            Buf::zeroed(rows * width * 2),
        ];
        let p: Vec<DevPtr> = bufs.iter_mut().map(Buf::ptr).collect();
        kern.q8_dequant(p[0], p[1], p[2], rows, width)
            .expect("launch");
        kern.q4_dequant(p[3], p[4], p[5], rows, width)
            .expect("launch");
        Quantized { bufs }
    }

    /// (name, the codes, their expansion) of each format.
    fn formats(&mut self) -> Vec<(&'static str, MatrixPtrs, MatrixPtrs)> {
        let p: Vec<DevPtr> = self.bufs.iter_mut().map(Buf::ptr).collect();
        vec![
            (
                "Q8_0",
                MatrixPtrs::Q8 {
                    codes: p[0],
                    scales: p[1],
                },
                MatrixPtrs::Dense(p[2]),
            ),
            (
                "Q4_1",
                MatrixPtrs::Q4 {
                    codes: p[3],
                    scales: p[4],
                },
                MatrixPtrs::Dense(p[5]),
            ),
        ]
    }
}
