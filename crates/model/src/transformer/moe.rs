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
use tandem_kernels::packed::QuantizedRows;
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
    /// `[m, hidden]` the normed rows of one expert's tokens, and its output rows.
    rows_in: Vec<f32>,
    rows_out: Vec<f32>,
    /// `[m, expert_ffn]` the expert's gate and up projections.
    gate: Vec<f32>,
    up: Vec<f32>,
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
        a.out.iter_mut().for_each(|v| *v = 0.0);
        for (e, mlp) in w.experts.iter().enumerate() {
            let members = &s.members[s.starts[e]..s.starts[e + 1]];
            let m = members.len();
            if m == 0 {
                continue;
            }
            s.rows_in.clear();
            for &(t, _) in members {
                s.rows_in.extend_from_slice(&a.xn[t * h..(t + 1) * h]);
            }
            s.gate.resize(m * ff, 0.0);
            s.up.resize(m * ff, 0.0);
            s.rows_out.resize(m * h, 0.0);
            let ys = [&mut s.gate[..m * ff], &mut s.up[..m * ff]];
            self.packed.matmuls(
                &self.tensors,
                &self.pool,
                [mlp.gate, mlp.up],
                &s.rows_in,
                ys,
                m,
                xq,
            );
            self.activate(&mut s.gate[..m * ff], &s.up[..m * ff], ff);
            self.matmul(mlp.down, &s.gate[..m * ff], &mut s.rows_out[..m * h], m, xq);
            for (&(t, weight), y) in members.iter().zip(s.rows_out.chunks_exact(h)) {
                let out = &mut a.out[t * h..(t + 1) * h];
                out.iter_mut().zip(y).for_each(|(o, &v)| *o += weight * v);
            }
        }
    }
}
