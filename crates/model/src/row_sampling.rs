//! Sampling a token from one logits row with temperature, top-k, top-p and min-p and one
//! uniform number: the algorithm of runners that sample where the logits are
//! (`ModelRunner::forward_sample`; the CUDA runner's `sample_rows` kernel), written plainly
//! here as its reference and as the default for runners that hold logits on the host.
//!
//! With `l` the row, `m` its maximum and `T` the temperature:
//! 1. top-k keeps the `k` largest `l`, ties to the lower id (values in their total order);
//! 2. weights `w = exp((l - m) / T)` in f64, `total` their sum over the top-k survivors;
//! 3. top-p keeps, in the same order, the shortest prefix whose mass reaches
//!    `top_p * total`;
//! 4. min-p keeps `w >= min_p` (the largest weight is exactly 1);
//! 5. the draw walks the survivors in id order and takes the first whose cumulative weight
//!    exceeds `u` times their total; if rounding never does, the last one of positive
//!    weight.
//!
//! The row is the processed one (`crate::logit_processing` applied to the raw logits): a
//! `-inf` there is a token that cannot be chosen. These are the steps of the engine's
//! sampler (`tandem_engine::sampler`) for a request without a grammar: the distributions
//! are equal (a test compares them to 1e-12), and as both draws walk the survivors in id
//! order, the same `u` picks the same token, except where rounding (the order of a sum, an
//! ulp of `exp`) moves a boundary across it, with a probability of order 1e-15 per draw.
//! Temperature 0 is greedy: the lowest id of the maximum.
//!
//! A [`RowDraw`] is the whole of what a runner needs for one row: these parameters, the
//! processors, and how many of the raw distribution's most likely tokens to report.

use std::cmp::Ordering;

use crate::batch::TokenId;
use crate::logit_processing::LogitProcessing;
use crate::token_pick::{top_logprobs, TokenPick};

/// How one output row is sampled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowSampling {
    /// `>= 0`; 0 is greedy.
    pub temperature: f32,
    /// Keep the `top_k` largest; `<= 0` keeps all.
    pub top_k: i32,
    /// In `(0, 1]`; 1 keeps all.
    pub top_p: f32,
    /// In `[0, 1]`; 0 keeps all.
    pub min_p: f32,
    /// The row's uniform number, in `[0, 1)`.
    pub uniform: f64,
}

impl RowSampling {
    /// Checks the parameters' ranges: temperature finite and `>= 0`, `top_p` in `(0, 1]`,
    /// `min_p` in `[0, 1]`, `uniform` in `[0, 1)`.
    pub fn validate(&self) -> Result<(), String> {
        let ok = self.temperature.is_finite()
            && self.temperature >= 0.0
            && self.top_p > 0.0
            && self.top_p <= 1.0
            && (0.0..=1.0).contains(&self.min_p)
            && (0.0..1.0).contains(&self.uniform);
        if ok {
            Ok(())
        } else {
            Err(format!("row sampling parameters out of range: {self:?}"))
        }
    }
}

/// How a runner chooses one output row's token: the processors applied to the raw logits,
/// the draw from the processed row, and the number of the raw distribution's most likely
/// tokens reported with it (`top_logprobs`, 0 for none).
#[derive(Debug, Clone, PartialEq)]
pub struct RowDraw {
    pub sampling: RowSampling,
    pub processing: LogitProcessing,
    pub top_logprobs: usize,
}

impl RowDraw {
    /// A draw of unprocessed logits reporting only the chosen token.
    pub fn plain(sampling: RowSampling) -> RowDraw {
        RowDraw {
            sampling,
            processing: LogitProcessing::default(),
            top_logprobs: 0,
        }
    }

    /// Checks the parameters ([`RowSampling::validate`], [`LogitProcessing::validate`]).
    pub fn validate(&self, vocab: usize) -> Result<(), String> {
        self.sampling.validate()?;
        self.processing.validate(vocab)
    }

    /// The pick of the raw logits `row` (see the module documentation); `None` when the row
    /// is empty or not finite, or no token can be chosen.
    pub fn pick(&self, row: &[f32]) -> Option<TokenPick> {
        let token = if self.processing.is_empty() {
            pick(row, &self.sampling)?
        } else {
            let mut processed = row.to_vec();
            self.processing.apply(&mut processed);
            pick(&processed, &self.sampling)?
        };
        let mut p = TokenPick::of_row(row, token)?;
        if self.top_logprobs > 0 {
            p.top_logprobs = top_logprobs(row, self.top_logprobs);
        }
        Some(p)
    }
}

/// The surviving ids of the processed `row` in ascending order with their unnormalised
/// weights; `None` when the row is empty, holds a NaN or `+inf`, or is all `-inf`. Greedy
/// rows have one survivor of weight 1; a `-inf` survives only with weight 0.
pub fn survivors(row: &[f32], s: &RowSampling) -> Option<Vec<(u32, f64)>> {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !m.is_finite() || row.iter().any(|v| v.is_nan()) {
        return None;
    }
    if s.temperature == 0.0 {
        let first = row.iter().position(|&v| v == m)?;
        return Some(vec![(first as u32, 1.0)]);
    }
    // Every id, most likely first, ties to the lower id.
    let mut order: Vec<u32> = (0..row.len() as u32).collect();
    let by_rank = |a: &u32, b: &u32| -> Ordering {
        row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b))
    };
    order.sort_unstable_by(by_rank);
    if s.top_k > 0 && (s.top_k as usize) < order.len() {
        order.truncate(s.top_k as usize);
    }
    let (t, md) = (s.temperature as f64, m as f64);
    let weight = |id: u32| ((row[id as usize] as f64 - md) / t).exp();
    if s.top_p < 1.0 {
        let total: f64 = order.iter().map(|&id| weight(id)).sum();
        let threshold = s.top_p as f64 * total;
        let mut above = 0.0;
        let keep = order
            .iter()
            .position(|&id| {
                above += weight(id);
                above >= threshold
            })
            .map_or(order.len(), |r| r + 1);
        order.truncate(keep);
    }
    let mut kept: Vec<(u32, f64)> = order
        .into_iter()
        .map(|id| (id, weight(id)))
        .filter(|&(_, w)| s.min_p <= 0.0 || w >= s.min_p as f64)
        .collect();
    kept.sort_unstable_by_key(|&(id, _)| id);
    Some(kept)
}

/// The token drawn from the processed `row` (see the module documentation); `None` as
/// [`survivors`].
pub fn pick(row: &[f32], s: &RowSampling) -> Option<TokenId> {
    let kept = survivors(row, s)?;
    let total: f64 = kept.iter().map(|&(_, w)| w).filter(|&w| w > 0.0).sum();
    let target = s.uniform * total;
    let mut run = 0.0;
    let mut last = None;
    for &(id, w) in &kept {
        if w > 0.0 {
            run += w;
            last = Some(id);
            if run > target {
                return Some(TokenId(id));
            }
        }
    }
    last.map(TokenId)
}
