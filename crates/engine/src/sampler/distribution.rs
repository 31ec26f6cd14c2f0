//! The processed distribution at one position: exactly the distribution [`super::sample`]
//! draws from (processors, temperature, top-k, top-p, min-p; one-hot on the argmax when
//! greedy), as explicit probabilities. Speculative verification needs it to accept a draft
//! with probability `min(1, p/q)` and to draw from the residual `max(p - q, 0)`.

use super::error::SamplerError;
use super::logprobs::{self, RawLogSoftmax};
use super::params::SamplingParams;
use super::scratch::{self, Scratch};
use super::state::SamplerState;
use super::{processors, truncation, SampledToken};

/// A probability distribution over the vocabulary: `[vocab_size]` non-negative values that
/// sum to 1 (up to rounding).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenDistribution {
    probs: Vec<f64>,
}

impl TokenDistribution {
    /// All mass on `token` (`[vocab_size]`).
    pub fn one_hot(vocab_size: usize, token: u32) -> TokenDistribution {
        let mut probs = vec![0.0; vocab_size];
        probs[token as usize] = 1.0;
        TokenDistribution { probs }
    }

    /// Normalises non-negative finite `weights` (`[vocab_size]`). `None` when they are not
    /// all finite and non-negative or their sum is not positive.
    pub fn from_weights(mut weights: Vec<f64>) -> Option<TokenDistribution> {
        if weights.iter().any(|w| !(w.is_finite() && *w >= 0.0)) {
            return None;
        }
        let total: f64 = weights.iter().sum();
        if !(total > 0.0 && total.is_finite()) {
            return None;
        }
        weights.iter_mut().for_each(|w| *w /= total);
        Some(TokenDistribution { probs: weights })
    }

    /// `p(token)`; 0 outside the vocabulary.
    pub fn prob(&self, token: u32) -> f64 {
        self.probs.get(token as usize).copied().unwrap_or(0.0)
    }

    /// `[vocab_size]` probabilities.
    pub fn probs(&self) -> &[f64] {
        &self.probs
    }

    /// Vocabulary size.
    pub fn len(&self) -> usize {
        self.probs.len()
    }

    /// True for an empty vocabulary (never built by this module).
    pub fn is_empty(&self) -> bool {
        self.probs.is_empty()
    }

    /// Inverse-CDF draw in id order with a uniform `u` in `[0, 1)`: the first token whose
    /// cumulative probability exceeds `u * total`; never a token of probability 0.
    pub fn draw(&self, u: f64) -> Option<u32> {
        draw_weights(&self.probs, u)
    }

    /// The normalised residual `max(self - other, 0)` (speculative rejection). `None` when it
    /// has no mass (only when `other` covers `self` everywhere, i.e. the two are equal).
    pub fn residual(&self, other: &TokenDistribution) -> Option<TokenDistribution> {
        let w = self
            .probs
            .iter()
            .zip(&other.probs)
            .map(|(p, q)| (p - q).max(0.0))
            .collect();
        TokenDistribution::from_weights(w)
    }
}

/// Inverse-CDF draw over non-negative `weights` in id order (not necessarily normalised).
pub(crate) fn draw_weights(weights: &[f64], u: f64) -> Option<u32> {
    let total: f64 = weights.iter().sum();
    let target = u * total;
    let mut cum = 0.0;
    let mut last_positive = None;
    for (id, &w) in weights.iter().enumerate() {
        if w > 0.0 {
            cum += w;
            last_positive = Some(id as u32);
            if cum > target {
                return last_positive;
            }
        }
    }
    last_positive
}

/// The distribution [`super::sample`] would draw from for `logits_row` (`[vocab_size]`)
/// with this state's history and `num_output_tokens` generated tokens: the processors
/// (logit_bias, min_tokens, penalties) and the constraint, then one-hot on the argmax when greedy, else
/// temperature, top-k, top-p and min-p, renormalised. Draws nothing from the stream.
///
/// Errors as [`super::sample`]: non-finite or empty row, ids outside the row, no candidate.
pub fn processed_distribution(
    logits_row: &[f32],
    params: &SamplingParams,
    state: &mut SamplerState,
    num_output_tokens: usize,
) -> Result<TokenDistribution, SamplerError> {
    let mut scratch = processed_values(logits_row, params, state, num_output_tokens)?;
    let values = &mut scratch.values; // [vocab_size]
    let dist = if params.is_greedy() {
        truncation::argmax(values).map(|t| TokenDistribution::one_hot(values.len(), t))
    } else if truncation::truncate(values, &mut scratch.candidates, params) {
        let mut w = vec![0.0; values.len()];
        for &id in &scratch.candidates {
            w[id as usize] = values[id as usize];
        }
        TokenDistribution::from_weights(w)
    } else {
        None
    };
    scratch::put_back(scratch);
    dist.ok_or(SamplerError::NoCandidates)
}

/// The token greedy decoding ([`super::sample`] at temperature 0) picks: the argmax of the
/// processed logits, ties to the lowest id. Same errors as [`processed_distribution`].
pub fn processed_argmax(
    logits_row: &[f32],
    params: &SamplingParams,
    state: &mut SamplerState,
    num_output_tokens: usize,
) -> Result<u32, SamplerError> {
    let scratch = processed_values(logits_row, params, state, num_output_tokens)?;
    let token = truncation::argmax(&scratch.values);
    scratch::put_back(scratch);
    token.ok_or(SamplerError::NoCandidates)
}

/// Checks the row and ids, then returns this thread's scratch with `values` holding the
/// processed logits (the caller puts the scratch back).
fn processed_values(
    logits_row: &[f32],
    params: &SamplingParams,
    state: &mut SamplerState,
    num_output_tokens: usize,
) -> Result<Scratch, SamplerError> {
    if logits_row.is_empty() {
        return Err(SamplerError::EmptyLogits);
    }
    if logits_row.iter().any(|v| !v.is_finite()) {
        return Err(SamplerError::NonFiniteLogits);
    }
    params.validate_ids(logits_row.len())?;
    let mut scratch = scratch::take();
    scratch.values.clear();
    scratch.values.extend(logits_row.iter().map(|&v| v as f64));
    processors::apply_all(&mut scratch.values, params, state, num_output_tokens);
    if let Err(e) = super::apply_constraint(&mut scratch.values, params, state) {
        scratch::put_back(scratch);
        return Err(e);
    }
    Ok(scratch)
}

/// What [`super::sample`] reports for `token` chosen from `logits_row`: when asked, its raw
/// logprob and the raw top logprobs. Errors on a non-finite or empty row.
pub fn reported_token(
    logits_row: &[f32],
    token: u32,
    params: &SamplingParams,
) -> Result<SampledToken, SamplerError> {
    let lsm = RawLogSoftmax::if_reported(logits_row, params)?;
    if token as usize >= logits_row.len() {
        return Err(SamplerError::invalid(
            "token",
            format!("{token} is outside the row"),
        ));
    }
    Ok(logprobs::reported(logits_row, token, params, lsm))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::sample;

    #[test]
    fn greedy_distribution_is_one_hot_on_the_processed_argmax() {
        let params = SamplingParams {
            logit_bias: vec![(2, 5.0)],
            ..SamplingParams::greedy()
        };
        let mut state = SamplerState::new(0, &[]);
        let d = processed_distribution(&[1.0, 3.0, 0.0], &params, &mut state, 0).expect("ok");
        assert_eq!(d.probs(), &[0.0, 0.0, 1.0]);
        assert_eq!(
            state.num_draws(),
            0,
            "building a distribution draws nothing"
        );
    }

    #[test]
    fn sampled_distribution_matches_softmax_after_top_k() {
        let params = SamplingParams {
            temperature: 0.5,
            top_k: 2,
            ..SamplingParams::default()
        };
        let mut state = SamplerState::new(0, &[]);
        let d = processed_distribution(&[0.0, 1.0, 0.5], &params, &mut state, 0).expect("ok");
        let (a, b) = (2f64.exp(), 1f64.exp()); // exp(l / T) of tokens 1 and 2
        assert!((d.prob(1) - a / (a + b)).abs() < 1e-12);
        assert!((d.prob(2) - b / (a + b)).abs() < 1e-12);
        assert_eq!(d.prob(0), 0.0);
    }

    #[test]
    fn reported_token_equals_what_sample_reports() {
        let params = SamplingParams {
            logprobs: true,
            top_logprobs: 2,
            ..SamplingParams::greedy()
        };
        let row = [0.3, -1.0, 2.5, 2.0];
        let mut state = SamplerState::new(1, &[]);
        let s = sample(&row, &params, &mut state, 0).expect("ok");
        let r = reported_token(&row, s.token, &params).expect("ok");
        assert_eq!(s, r);
    }

    #[test]
    fn residual_removes_the_overlap_and_renormalises() {
        let p = TokenDistribution::from_weights(vec![0.5, 0.5, 0.0]).expect("valid");
        let q = TokenDistribution::from_weights(vec![0.25, 0.25, 0.5]).expect("valid");
        let r = p.residual(&q).expect("mass left");
        assert_eq!(r.probs(), &[0.5, 0.5, 0.0]);
        assert!(p.residual(&p).is_none());
        assert_eq!(r.draw(0.6), Some(1));
        assert_eq!(r.draw(0.0), Some(0));
    }
}
