//! The mixture-of-experts MLP of Mixtral and Qwen3-MoE.
//!
//! For each token, the router (an exact product with its stored `[experts, hidden]` matrix)
//! scores every expert; the softmax over all scores gives weights, the `k` heaviest experts
//! are chosen (ties to the lower index) and, where the config says so, their weights are
//! divided by their sum. Tokens are then grouped by expert: each expert that any token chose
//! runs its gated MLP once over the rows of exactly the tokens that chose it, and each
//! token's output is the sum of its experts' outputs times their weights.
//!
//! **Batch invariance.** A token's result does not depend on which other tokens share its
//! experts: every product's row depends only on its own input row (the property all of
//! tandem's matrix kernels have), and each token adds its experts' contributions in
//! ascending expert order, whatever the batch. The batch-invariance tests cover MoE models.

use tandem_kernels::ops::rms_norm;
use tandem_kernels::packed::{matmuls_quantized_grouped, GroupedProduct, QuantizedRows};
use tandem_kernels::parallel::for_each_chunk_mut;

use super::{GatedMlp, Model};
use crate::scratch::Activations;
use crate::weights::TensorHandle;

/// A layer's experts: the router and each expert's gated MLP.
#[derive(Debug)]
pub struct ExpertWeights {
    /// `[num_experts, hidden]`: row `e` scores expert `e`.
    pub router: TensorHandle,
    pub experts: Vec<GatedMlp>,
}

/// One of the experts a token runs through, and the weight of its output.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Route {
    pub expert: usize,
    pub weight: f32,
}

/// Routes one token from its router scores (`[num_experts]`): fills `out` (one entry per
/// expert used) with the heaviest experts by softmax weight, heaviest first, ties to the
/// lower index; with `normalize`, the chosen weights are divided by their sum.
pub fn route(scores: &[f32], normalize: bool, out: &mut [Route]) {
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = scores.iter().map(|&s| (s - max).exp()).sum();
    for slot in out.iter_mut() {
        *slot = Route {
            expert: usize::MAX,
            weight: f32::NEG_INFINITY,
        };
    }
    // Insertion into the k best so far: `k` is small (2 to 10 in released models).
    for (e, &s) in scores.iter().enumerate() {
        let weight = (s - max).exp() / sum;
        // A NaN weight (from NaN scores) ranks last but still fills an empty slot.
        let rank = if weight.is_nan() {
            f32::NEG_INFINITY
        } else {
            weight
        };
        let Some(pos) = out
            .iter()
            .position(|r| rank > r.weight || r.expert == usize::MAX)
        else {
            continue;
        };
        out.copy_within(pos..out.len() - 1, pos + 1);
        out[pos] = Route { expert: e, weight };
    }
    if normalize {
        let total: f32 = out.iter().map(|r| r.weight).sum();
        out.iter_mut().for_each(|r| r.weight /= total);
    }
}

/// The working memory of a mixture-of-experts block, kept between calls.
#[derive(Debug, Default)]
pub(crate) struct MoeScratch {
    /// `[n, num_experts]` router scores.
    scores: Vec<f32>,
    /// `[n, k]` each token's experts.
    routes: Vec<Route>,
    /// `[num_experts + 1]`: expert `e`'s tokens are `members[starts[e]..starts[e + 1]]`.
    starts: Vec<usize>,
    /// `[n * k]` (token, weight), grouped by expert, tokens ascending within a group.
    members: Vec<(usize, f32)>,
    /// `[n * k, hidden]` every route's normed input row and its expert's output row,
    /// grouped by expert like `members`.
    rows_in: Vec<f32>,
    rows_out: Vec<f32>,
    /// `[n * k, expert_ffn]` the experts' gate and up projections.
    gate: Vec<f32>,
    up: Vec<f32>,
    /// Under the int8 kernels: each expert's input rows and activated rows, quantized.
    xq_in: Vec<QuantizedRows>,
    xq_mid: Vec<QuantizedRows>,
}

impl MoeScratch {
    /// Groups the tokens' routes (`k` per token) by expert into `starts` and `members` (a
    /// counting sort, which keeps the tokens ascending within each expert).
    fn group(&mut self, num_experts: usize, k: usize) {
        self.starts.clear();
        self.starts.resize(num_experts + 1, 0);
        for r in &self.routes {
            self.starts[r.expert + 1] += 1;
        }
        for e in 0..num_experts {
            self.starts[e + 1] += self.starts[e];
        }
        let mut next = self.starts.clone();
        self.members.clear();
        self.members.resize(self.routes.len(), (0, 0.0));
        for (i, r) in self.routes.iter().enumerate() {
            self.members[next[r.expert]] = (i / k, r.weight);
            next[r.expert] += 1;
        }
    }
}

impl Model {
    /// `a.out` = the mixture of experts applied to `rms_norm(a.x, norm)`.
    pub(super) fn experts_block(
        &self,
        norm: &[f32],
        w: &ExpertWeights,
        a: &mut Activations,
        xq: &mut QuantizedRows,
        s: &mut MoeScratch,
    ) {
        let c = &self.config;
        let moe = c
            .features
            .moe
            .expect("a layer with experts belongs to a mixture-of-experts config");
        let (h, ff, k) = (c.hidden_size, moe.expert_ffn, moe.experts_per_token);
        let n = a.x.len() / h;
        let eps = c.rms_norm_eps;
        for_each_chunk_mut(&self.pool, &mut a.xn, h, |t, row| {
            rms_norm(&a.x[t * h..(t + 1) * h], norm, eps, row)
        });
        s.scores.resize(n * moe.num_experts, 0.0);
        self.matmul(w.router, &a.xn, &mut s.scores, n, xq);
        s.routes.resize(
            n * k,
            Route {
                expert: 0,
                weight: 0.0,
            },
        );
        let scores = s.scores.chunks_exact(moe.num_experts);
        for (scores, out) in scores.zip(s.routes.chunks_exact_mut(k)) {
            route(scores, moe.normalize_top_k, out);
        }
        s.group(moe.num_experts, k);
        // Every route's input row, grouped by expert (expert e's rows are
        // `starts[e]..starts[e + 1]`).
        s.rows_in.clear();
        for &(t, _) in &s.members {
            s.rows_in.extend_from_slice(&a.xn[t * h..(t + 1) * h]);
        }
        let routes = s.members.len();
        s.gate.resize(routes * ff, 0.0);
        s.up.resize(routes * ff, 0.0);
        s.rows_out.resize(routes * h, 0.0);
        if self.packed.all_packed_slice(&w.experts) {
            self.experts_int8(w, s, h, ff);
        } else {
            self.experts_one_by_one(w, s, xq, h, ff);
        }
        // Each token adds its experts' outputs in ascending expert order.
        a.out.iter_mut().for_each(|v| *v = 0.0);
        for (&(t, weight), y) in s.members.iter().zip(s.rows_out.chunks_exact(h)) {
            let out = &mut a.out[t * h..(t + 1) * h];
            out.iter_mut().zip(y).for_each(|(o, &v)| *o += weight * v);
        }
    }

    /// The experts' MLPs over their rows of `s.rows_in` into `s.rows_out`, expert by expert
    /// (the exact path, or matrices the int8 kernels do not pack).
    fn experts_one_by_one(
        &self,
        w: &ExpertWeights,
        s: &mut MoeScratch,
        xq: &mut QuantizedRows,
        h: usize,
        ff: usize,
    ) {
        for (e, mlp) in w.experts.iter().enumerate() {
            let rows = s.starts[e]..s.starts[e + 1];
            let m = rows.len();
            if m == 0 {
                continue;
            }
            let x = &s.rows_in[rows.start * h..rows.end * h];
            let gate = &mut s.gate[rows.start * ff..rows.end * ff];
            let up = &mut s.up[rows.start * ff..rows.end * ff];
            let (tensors, pool) = (&self.tensors, &self.pool);
            self.packed.matmuls(
                tensors,
                pool,
                [mlp.gate, mlp.up],
                x,
                [&mut *gate, &mut *up],
                m,
                xq,
            );
            self.activate(gate, up, ff);
            let out = &mut s.rows_out[rows.start * h..rows.end * h];
            self.matmul(mlp.down, gate, out, m, xq);
        }
    }

    /// [`Model::experts_one_by_one`] through the int8 kernels with all experts in each job:
    /// the inputs quantized expert by expert in one job, the gate and up products of every
    /// expert in one, the activation in one, the down products in one. Each product's result
    /// is bitwise what it is alone.
    fn experts_int8(&self, w: &ExpertWeights, s: &mut MoeScratch, h: usize, ff: usize) {
        let isa = self.packed.isa();
        let MoeScratch {
            starts,
            rows_in,
            rows_out,
            gate,
            up,
            xq_in,
            xq_mid,
            ..
        } = s;
        let n_experts = w.experts.len();
        xq_in.resize_with(n_experts, QuantizedRows::empty);
        xq_mid.resize_with(n_experts, QuantizedRows::empty);
        let starts = &starts[..];
        let quantize = |xqs: &mut [QuantizedRows], x: &[f32], width: usize| {
            for_each_chunk_mut(&self.pool, xqs, 1, |e, xq| {
                let rows = starts[e]..starts[e + 1];
                let x = &x[rows.start * width..rows.end * width];
                // Inside a pool task the nested call runs inline.
                xq[0].quantize_into_with(isa, &self.pool, x, rows.len(), width);
            });
        };
        quantize(xq_in, rows_in, h);
        let packed = |m: TensorHandle| self.packed.packed(m).expect("checked: all packed");
        // The experts no token chose have empty rows and are left out.
        let mut products = Vec::with_capacity(2 * n_experts);
        let parts = split_rows_mut(gate, starts, ff)
            .into_iter()
            .zip(split_rows_mut(up, starts, ff));
        for ((mlp, xq), (g, u)) in w.experts.iter().zip(xq_in.iter()).zip(parts) {
            if !g.is_empty() {
                products.push(GroupedProduct {
                    w: packed(mlp.gate),
                    xq,
                    y: g,
                });
                products.push(GroupedProduct {
                    w: packed(mlp.up),
                    xq,
                    y: u,
                });
            }
        }
        matmuls_quantized_grouped(isa, &self.pool, &mut products);
        self.activate(gate, up, ff);
        quantize(xq_mid, gate, ff);
        let outs = split_rows_mut(rows_out, starts, h);
        let mut products: Vec<_> = w
            .experts
            .iter()
            .zip(xq_mid.iter())
            .zip(outs)
            .filter(|(_, y)| !y.is_empty())
            .map(|((mlp, xq), y)| GroupedProduct {
                w: packed(mlp.down),
                xq,
                y,
            })
            .collect();
        matmuls_quantized_grouped(isa, &self.pool, &mut products);
        // Each expert's buffers keep what this step used plus a little: otherwise every
        // expert would keep the most rows it ever received (E of them after long prefills).
        for xq in xq_in.iter_mut().chain(xq_mid.iter_mut()) {
            xq.release_excess(EXPERT_ROWS_SLACK);
        }
    }
}

/// Bytes an expert's quantized rows may hold beyond the current step's before they are given
/// back: enough that decode and short prefill steps never reallocate.
const EXPERT_ROWS_SLACK: usize = 256 << 10;

/// `buf` (`[rows, width]`) cut into the row ranges `starts[e]..starts[e + 1]`, one slice per
/// expert `e`.
fn split_rows_mut<'a>(buf: &'a mut [f32], starts: &[usize], width: usize) -> Vec<&'a mut [f32]> {
    let mut rest = buf;
    let mut parts = Vec::with_capacity(starts.len().saturating_sub(1));
    for pair in starts.windows(2) {
        let (part, tail) = rest.split_at_mut((pair[1] - pair[0]) * width);
        parts.push(part);
        rest = tail;
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes(scores: &[f32], k: usize, normalize: bool) -> Vec<(usize, f32)> {
        let mut out = vec![
            Route {
                expert: 0,
                weight: 0.0
            };
            k
        ];
        route(scores, normalize, &mut out);
        out.iter().map(|r| (r.expert, r.weight)).collect()
    }

    #[test]
    fn the_heaviest_experts_are_chosen_with_their_softmax_weights() {
        let scores = [0.5f32, 2.0, -1.0, 1.0];
        let total: f64 = scores.iter().map(|&s| (s as f64).exp()).sum();
        let p = |i: usize| ((scores[i] as f64).exp() / total) as f32;
        let got = routes(&scores, 2, false);
        assert_eq!([got[0].0, got[1].0], [1, 3]);
        assert!((got[0].1 - p(1)).abs() < 1e-6 && (got[1].1 - p(3)).abs() < 1e-6);
        // Renormalised: a softmax over the chosen scores alone.
        let got = routes(&scores, 2, true);
        let z = (2.0f64).exp() + 1.0f64.exp();
        assert!((got[0].1 as f64 - 2.0f64.exp() / z).abs() < 1e-6);
        assert!((got[0].1 + got[1].1 - 1.0).abs() < 1e-6);
    }

    #[test]
    fn ties_go_to_the_lower_index_and_nan_scores_still_fill_every_slot() {
        let got = routes(&[1.0, 3.0, 3.0, 3.0], 2, false);
        assert_eq!([got[0].0, got[1].0], [1, 2]);
        let got = routes(&[f32::NAN, f32::NAN, f32::NAN], 2, true);
        assert!(got.iter().all(|&(e, _)| e < 3), "{got:?}");
    }
}
