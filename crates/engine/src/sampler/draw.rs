//! The inverse-CDF draw: walking the candidates in id order, the first whose cumulative
//! weight exceeds `u` times their total weight.
//!
//! A row of a large vocabulary summed and walked one weight after another is two chains of
//! dependent f64 additions, a quarter of a million long each (Gemma 3's vocabulary: about
//! 0.4 ms a row). So the cumulative weights are summed in two levels: the candidates in
//! blocks of [`BLOCK`], each block's weight summed in [`LANES`] interleaved lanes (which
//! vectorize), the blocks' weights one after another from 0 (their running sum after the
//! last block is the total). Only the block where the running sum passes `u · total` is
//! walked candidate by candidate, from the running sum before it. Where rounding keeps that
//! walk from passing the target, the block's last candidate of positive weight is taken
//! (the block's sum said the target lies in it); where it keeps every block from passing
//! it, the last candidate of positive weight. A candidate of weight 0 is never chosen.

use std::ops::Range;

/// Candidates per block of the two-level sum.
const BLOCK: usize = 1024;

/// Interleaved partial sums within a block.
const LANES: usize = 8;

/// The draw over every id of `weights` (an entry that weighs 0 is never chosen).
pub(super) fn draw_row(weights: &[f64], u: f64) -> Option<u32> {
    draw_by(weights.len(), |i| i as u32, |i| weights[i], u)
}

/// The draw over the ids `candidates`, in their order, weighed by `weights[id]`.
pub(super) fn draw_listed(weights: &[f64], candidates: &[u32], u: f64) -> Option<u32> {
    let weight = |i: usize| weights[candidates[i] as usize];
    draw_by(candidates.len(), |i| candidates[i], weight, u)
}

/// The draw over `n` candidates, the `i`-th being id `id(i)` of weight `weight(i)`.
fn draw_by(
    n: usize,
    id: impl Fn(usize) -> u32,
    weight: impl Fn(usize) -> f64 + Copy,
    u: f64,
) -> Option<u32> {
    let blocks: Vec<f64> = (0..n.div_ceil(BLOCK))
        .map(|b| lane_sum(block(b, n), weight))
        .collect();
    let total = blocks.iter().fold(0.0, |sum, &s| sum + s);
    let target = u * total;
    let mut cum = 0.0;
    for (b, &s) in blocks.iter().enumerate() {
        if cum + s > target {
            let mut last = None;
            for i in block(b, n) {
                let w = weight(i);
                if w > 0.0 {
                    cum += w;
                    last = Some(id(i));
                    if cum > target {
                        break;
                    }
                }
            }
            return last;
        }
        cum += s;
    }
    (0..n).rev().find(|&i| weight(i) > 0.0).map(id)
}

/// The candidates of block `b` of `n`.
fn block(b: usize, n: usize) -> Range<usize> {
    b * BLOCK..n.min((b + 1) * BLOCK)
}

/// `Σ weight(i)` over `range` in [`LANES`] interleaved lanes, added in a fixed tree.
fn lane_sum(range: Range<usize>, weight: impl Fn(usize) -> f64) -> f64 {
    let mut lanes = [0.0f64; LANES];
    let whole = range.start + (range.len() - range.len() % LANES);
    for i in (range.start..whole).step_by(LANES) {
        for (k, lane) in lanes.iter_mut().enumerate() {
            *lane += weight(i + k);
        }
    }
    for (lane, i) in lanes.iter_mut().zip(whole..range.end) {
        *lane += weight(i);
    }
    let [a, b, c, d, e, f, g, h] = lanes;
    ((a + e) + (c + g)) + ((b + f) + (d + h))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::truncation::xorshift;

    /// The definition: one running sum in candidate order.
    fn walk(weights: &[f64], ids: &[u32], u: f64) -> Option<u32> {
        let total: f64 = ids.iter().map(|&i| weights[i as usize]).sum();
        let mut cum = 0.0;
        let mut last = None;
        for &i in ids {
            let w = weights[i as usize];
            if w > 0.0 {
                cum += w;
                last = Some(i);
                if cum > u * total {
                    return Some(i);
                }
            }
        }
        last
    }

    #[test]
    fn follows_cumulative_weights_and_never_picks_zero_weight() {
        let w = [0.0, 1.0, 0.0, 3.0, 0.0];
        assert_eq!(draw_row(&w, 0.0), Some(1));
        assert_eq!(draw_row(&w, 0.2499), Some(1));
        assert_eq!(draw_row(&w, 0.25), Some(3));
        assert_eq!(draw_row(&w, 0.999_999), Some(3));
        assert_eq!(draw_listed(&w, &[3, 1], 0.7), Some(3), "the list's order");
        assert_eq!(draw_listed(&w, &[3, 1], 0.8), Some(1));
        assert_eq!(draw_listed(&w, &[0, 2], 0.5), None);
        assert_eq!(draw_row(&[], 0.5), None);
        assert_eq!(draw_row(&[0.0; 3000], 0.5), None);
    }

    /// Weights that are small integers sum exactly in any order, so the blocked draw must
    /// pick exactly the token of the plain walk: rows of 1 to 5 blocks and ragged ends, a
    /// third of the weights 0, draws that land on block boundaries included.
    #[test]
    fn picks_the_token_of_one_running_sum() {
        let mut uniform = xorshift(0x2545_f491_4f6c_dd1d);
        for trial in 0..300 {
            let n = 1 + (trial * 97) % (5 * BLOCK + 13);
            let weights: Vec<f64> = (0..n)
                .map(|_| match uniform() {
                    x if x < 0.33 => 0.0,
                    x => (x * 10.0).floor(),
                })
                .collect();
            let all: Vec<u32> = (0..n as u32).collect();
            let listed: Vec<u32> = all.iter().copied().filter(|i| i % 3 != 1).collect();
            let total: f64 = weights.iter().sum();
            // Draws at the start of each block's mass, just before it, and at random.
            let mut draws: Vec<f64> = (0..20).map(|_| uniform()).collect();
            let mut cum = 0.0;
            for (i, w) in weights.iter().enumerate() {
                if i % BLOCK == 0 && total > 0.0 {
                    draws.push(cum / total);
                    draws.push((cum / total - 1e-12).max(0.0));
                }
                cum += w;
            }
            for u in draws {
                assert_eq!(
                    draw_row(&weights, u),
                    walk(&weights, &all, u),
                    "n {n} u {u}"
                );
                let got = draw_listed(&weights, &listed, u);
                assert_eq!(got, walk(&weights, &listed, u), "listed, n {n} u {u}");
            }
        }
    }
}
