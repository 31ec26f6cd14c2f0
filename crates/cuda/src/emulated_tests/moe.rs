//! The experts' products (`expert_matvec`, `_q8`, `_q4`) over routes grouped by `moe_group`:
//! against an f64 reference with the stacked experts' weights, and, for the quantized
//! formats, bitwise against the dense layers' matvec kernel on the same expert's rows (the
//! same block dots in the same order). Rows of 2048 values make every lane take several
//! blocks; an expert with more than EXPERT_ROUTES (8) routes takes two route groups, one
//! with none is skipped, and an output count that is not a multiple of 8 leaves idle warps.

use super::*;
use crate::moe_kernels::Routes;
use crate::program_buffers::MatrixPtrs;

const EXPERTS: usize = 4;
/// Tokens; expert 0 gets every token's first route (9 > 8).
const TOKENS: usize = 9;
/// Experts per token.
const PER_TOKEN: usize = 3;
/// Outputs per expert.
const M: usize = 20;

/// The expert of route `r` (= token · PER_TOKEN + slot); expert 3 gets no route.
fn expert_of(r: usize) -> i32 {
    let (t, slot) = (r / PER_TOKEN, r % PER_TOKEN);
    match (slot, t % 3 == 0) {
        (0, _) => 0,
        (1, true) | (2, false) => 1,
        _ => 2,
    }
}

/// The stacked experts `[EXPERTS * M, width]` in one format: its buffers (codes and scales,
/// or the dense matrix) and the weights they stand for.
struct Stacked {
    bufs: Vec<Buf>,
    weights: Vec<f32>,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Format {
    Dense,
    Q8,
    Q4,
}

fn stacked(format: Format, dtype: CudaDtype, width: usize, seed: u64) -> Stacked {
    let w = normal_ish(&mut rng(seed), EXPERTS * M * width, 0.5);
    match format {
        Format::Dense => {
            let weights = as_stored(dtype, &w);
            Stacked {
                bufs: vec![act_buf(dtype, &w)],
                weights,
            }
        }
        Format::Q8 => {
            use crate::q8_weights::{dequantize, quantize, Q8_BLOCK};
            let (mut codes, mut scales) = (Vec::new(), Vec::new());
            quantize(&w, &mut codes, &mut scales);
            let weights = codes
                .iter()
                .enumerate()
                .map(|(i, &c)| dequantize(c, scales[i / Q8_BLOCK]))
                .collect();
            Stacked {
                bufs: vec![Buf::of(&codes), Buf::of(&scales)],
                weights,
            }
        }
        Format::Q4 => {
            use crate::q4_weights::{dequantize, quantize};
            let (mut codes, mut scales) = (Vec::new(), Vec::new());
            quantize(&w, &mut codes, &mut scales);
            let weights = dequantize(&codes, &scales);
            Stacked {
                bufs: vec![Buf::of(&codes), Buf::of(&scales)],
                weights,
            }
        }
    }
}

impl Stacked {
    fn ptrs(&mut self, format: Format) -> MatrixPtrs {
        match format {
            Format::Dense => MatrixPtrs::Dense(self.bufs[0].ptr()),
            Format::Q8 => MatrixPtrs::Q8 {
                codes: self.bufs[0].ptr(),
                scales: self.bufs[1].ptr(),
            },
            Format::Q4 => MatrixPtrs::Q4 {
                codes: self.bufs[0].ptr(),
                scales: self.bufs[1].ptr(),
            },
        }
    }
}

/// `y[r] = x[r / per_token] · W[expert_of(r)]ᵀ` in f64.
fn reference(x: &[f32], w: &[f32], per_token: usize, width: usize) -> Vec<f64> {
    (0..TOKENS * PER_TOKEN * M)
        .map(|i| {
            let (r, j) = (i / M, i % M);
            let (xr, wr) = (r / per_token, expert_of(r) as usize * M + j);
            (0..width)
                .map(|t| x[xr * width + t] as f64 * w[wr * width + t] as f64)
                .sum()
        })
        .collect()
}

#[test]
fn expert_products_match_the_reference_and_the_dense_layers_matvec() {
    let routes_n = TOKENS * PER_TOKEN;
    let experts: Vec<i32> = (0..routes_n).map(expert_of).collect();
    for width in [96usize, 2048] {
        for dtype in MODES {
            let kern = kernels(dtype);
            let grouped = Grouped::new(&kern, &experts, PER_TOKEN, EXPERTS);
            let routes = grouped.routes;
            let mut r = rng(width as u64);
            for format in [Format::Dense, Format::Q8, Format::Q4] {
                let mut w = stacked(format, dtype, width, width as u64 + 7);
                let ptrs = w.ptrs(format);
                // per_token = PER_TOKEN: one x row per token (gate/up); 1: one per route.
                for per_token in [PER_TOKEN, 1] {
                    let x = normal_ish(&mut r, routes_n / per_token * width, 1.0);
                    let mut xb = act_buf(dtype, &x);
                    // NaN until written: every route's every output must be.
                    let mut y = Buf::of(&vec![f32::NAN; routes_n * M]);
                    kern.expert_matvec((xb.ptr(), &ptrs, y.ptr()), routes, per_token, (M, width))
                        .expect("launch");
                    let got = y.read::<f32>();
                    let what = format!("{dtype:?} {format:?} width {width} per_token {per_token}");
                    let want = reference(&as_stored(dtype, &x), &w.weights, per_token, width);
                    // Inputs as stored, sums in f32 in either mode.
                    assert_close(&what, &got, &want, 2e-5);
                    if format == Format::Dense {
                        continue;
                    }
                    // Each route bitwise as the dense layers' matvec computes its row.
                    let xs = as_stored(dtype, &x);
                    for route in 0..routes_n {
                        let e = expert_of(route) as usize;
                        let xr = route / per_token;
                        let mut row = act_buf(dtype, &xs[xr * width..(xr + 1) * width]);
                        // Expert e's rows: code bytes per row, then 4 scale bytes per block.
                        let code_bytes = if format == Format::Q8 {
                            width
                        } else {
                            width / 2
                        };
                        let rows = |buf: &Buf, per_row: usize| {
                            buf.read::<u8>()[e * M * per_row..(e + 1) * M * per_row].to_vec()
                        };
                        let codes = rows(&w.bufs[0], code_bytes);
                        let scales = rows(&w.bufs[1], width / 32 * 4);
                        let (mut cb, mut sb) = (Buf::of(&codes), Buf::of(&scales));
                        let mut one = Buf::zeroed(M * 4);
                        let (c, s, xp, yp) = (cb.ptr(), sb.ptr(), row.ptr(), one.ptr());
                        match format {
                            Format::Q8 => kern.q8_matvec(c, s, xp, yp, 1, M, width),
                            _ => kern.q4_matvec(c, s, xp, yp, 1, M, width),
                        }
                        .expect("launch");
                        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                        assert_eq!(
                            bits(&got[route * M..(route + 1) * M]),
                            bits(&one.read::<f32>()),
                            "{what}: route {route} vs the matvec kernel"
                        );
                    }
                }
            }
        }
    }
}

/// Routes (`[tokens, k]` expert ids; zero weights) grouped by `moe_group`, in buffers
/// that live as long as this.
pub(super) struct Grouped {
    pub routes: Routes,
    bufs: [Buf; 3],
}

impl Grouped {
    pub fn new(kern: &Kernels, experts: &[i32], k: usize, num_experts: usize) -> Grouped {
        let mut eb = Buf::of(experts);
        let mut wb = Buf::of(&vec![0.0f32; experts.len()]);
        let mut groups = Buf::zeroed(4 * Routes::group_words(num_experts, experts.len()));
        let routes = Routes {
            experts: eb.ptr(),
            weights: wb.ptr(),
            groups: groups.ptr(),
            k,
            num_experts,
        };
        kern.moe_group(routes, experts.len() / k).expect("launch");
        Grouped {
            routes,
            bufs: [eb, wb, groups],
        }
    }

    /// The groups buffer: counts, offsets, tile offsets, order.
    pub fn groups(&self) -> Vec<i32> {
        self.bufs[2].read::<i32>()
    }
}
