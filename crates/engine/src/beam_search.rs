//! Beam search, model-free: which beams survive a step and which hypotheses finish.
//!
//! The search keeps up to `width` *live* beams of equal output length `L`, each with its
//! cumulative logprob `cum` (the sum, in f32 and in order, of the raw `log_softmax` logprobs
//! of its output tokens). One step, given each live beam's `2 * width` most likely next
//! tokens:
//!
//! 1. every candidate `(beam, token)` gets `cum(beam) + logprob(token)`; all candidates are
//!    ranked by that value, descending (ties: earlier beam, then lower token id), and the
//!    first `2 * width` kept (this is the global top `2 * width`, as in Hugging Face
//!    transformers' beam search);
//! 2. walking the ranking, a candidate whose token is a stop token (EOS unless `ignore_eos`,
//!    or a `stop_token_ids` entry) becomes a finished *hypothesis* if its rank is below
//!    `width` (else it is dropped); any other candidate becomes a live beam of length
//!    `L + 1`, until `width` live beams are chosen;
//! 3. the search ends when the new beams reach `max_len` output tokens (they all become
//!    hypotheses), when no live beam is left, or when `width` hypotheses exist and the best
//!    new live beam's score does not beat the worst hypothesis (Hugging Face's heuristic
//!    `early_stopping=False` rule).
//!
//! A hypothesis's **score** is `cum / len^length_penalty` with `len` its number of output
//! tokens, the final stop token included. The best `width` hypotheses are kept; the result
//! is sorted by score, best first (ties keep the order they were found in).

use tandem_model::batch::TokenId;

use crate::error::{EngineError, Result};

/// How a beam search request searches. Its sampling parameters are ignored.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BeamParams {
    /// Live beams kept per step and hypotheses returned; at least 1.
    pub width: usize,
    /// Exponent of the length normalisation of scores (1.0: mean logprob per token; 0.0:
    /// plain cumulative logprob). Must be finite.
    pub length_penalty: f32,
}

impl BeamParams {
    /// Checks `width >= 1` and a finite `length_penalty`.
    pub fn validate(&self) -> Result<()> {
        if self.width == 0 {
            return Err(EngineError::InvalidParams(
                "beam width must be at least 1".into(),
            ));
        }
        if !self.length_penalty.is_finite() {
            return Err(EngineError::InvalidParams(format!(
                "length_penalty must be finite, got {}",
                self.length_penalty
            )));
        }
        Ok(())
    }
}

/// One finished beam.
#[derive(Debug, Clone, PartialEq)]
pub struct BeamHypothesis {
    /// Output tokens (the final stop token included, if it ended on one).
    pub tokens: Vec<TokenId>,
    /// Sum of the raw logprobs of `tokens` (natural log).
    pub cum_logprob: f32,
    /// `cum_logprob / tokens.len()^length_penalty`.
    pub score: f32,
}

/// The score of a beam of `len` output tokens: `cum_logprob / len^length_penalty`.
pub fn beam_score(cum_logprob: f32, len: usize, length_penalty: f32) -> f32 {
    cum_logprob / (len as f32).powf(length_penalty)
}

/// The `k` largest entries of a logprob row (`[vocab_size]`) as `(token, logprob)`, largest
/// first, ties to the lower id.
pub fn top_k_logprobs(logprobs: &[f32], k: usize) -> Vec<(TokenId, f32)> {
    let by_value = |a: &u32, b: &u32| {
        logprobs[*b as usize]
            .total_cmp(&logprobs[*a as usize])
            .then(a.cmp(b))
    };
    let mut ids: Vec<u32> = (0..logprobs.len() as u32).collect();
    let k = k.min(ids.len());
    if k == 0 {
        return Vec::new();
    }
    if k < ids.len() {
        ids.select_nth_unstable_by(k - 1, by_value);
        ids.truncate(k);
    }
    ids.sort_unstable_by(by_value);
    ids.into_iter()
        .map(|t| (TokenId(t), logprobs[t as usize]))
        .collect()
}

/// A live beam as one step sees it.
#[derive(Debug, Clone, Copy)]
pub struct LiveBeam<'a> {
    /// Its output tokens so far (all live beams have the same number).
    pub tokens: &'a [TokenId],
    /// Its cumulative logprob.
    pub cum_logprob: f32,
    /// Its most likely next tokens with their logprobs (at least `2 * width` when the
    /// vocabulary has that many), as [`top_k_logprobs`] gives them.
    pub candidates: &'a [(TokenId, f32)],
}

/// A beam chosen to go on: live beam `parent` extended by `token`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NextBeam {
    /// Index of the parent in the step's live beams.
    pub parent: usize,
    /// The appended token.
    pub token: TokenId,
    /// The new beam's cumulative logprob.
    pub cum_logprob: f32,
}

/// The state of one beam search beyond its live beams: parameters and hypotheses.
#[derive(Debug, Clone)]
pub struct BeamSearch {
    params: BeamParams,
    /// Most output tokens a beam may have; at least 1.
    max_len: usize,
    stop_tokens: Vec<TokenId>,
    /// Best `width` hypotheses, best first.
    finished: Vec<BeamHypothesis>,
    reached_max_len: bool,
}

impl BeamSearch {
    /// A search with no hypotheses yet. `max_len` is raised to 1.
    pub fn new(params: BeamParams, max_len: usize, stop_tokens: Vec<TokenId>) -> BeamSearch {
        BeamSearch {
            params,
            max_len: max_len.max(1),
            stop_tokens,
            finished: Vec::new(),
            reached_max_len: false,
        }
    }

    /// The parameters.
    pub fn params(&self) -> BeamParams {
        self.params
    }

    /// Runs one step over `live` (non-empty, equal lengths): returns the beams to go on
    /// with, best first, or `None` when the search is over.
    pub fn step(&mut self, live: &[LiveBeam<'_>]) -> Option<Vec<NextBeam>> {
        let w = self.params.width;
        let len = live.first().map_or(0, |b| b.tokens.len());
        let mut ranked: Vec<NextBeam> = Vec::new();
        for (parent, beam) in live.iter().enumerate() {
            ranked.extend(beam.candidates.iter().map(|&(token, lp)| NextBeam {
                parent,
                token,
                cum_logprob: beam.cum_logprob + lp,
            }));
        }
        ranked.sort_by(|a, b| {
            b.cum_logprob
                .total_cmp(&a.cum_logprob)
                .then(a.parent.cmp(&b.parent))
                .then(a.token.cmp(&b.token))
        });
        ranked.truncate(2 * w);
        let mut next = Vec::with_capacity(w);
        for (rank, c) in ranked.into_iter().enumerate() {
            if self.stop_tokens.contains(&c.token) {
                if rank < w {
                    self.add(extended(live[c.parent].tokens, c.token), c.cum_logprob);
                }
            } else if next.len() < w {
                next.push(c);
            }
        }
        if len + 1 >= self.max_len {
            for c in &next {
                self.add(extended(live[c.parent].tokens, c.token), c.cum_logprob);
            }
            self.reached_max_len = true;
            return None;
        }
        let best = next.first()?;
        let best_possible = beam_score(best.cum_logprob, len + 1, self.params.length_penalty);
        match self.finished.last() {
            Some(worst) if self.finished.len() == w && best_possible <= worst.score => None,
            _ => Some(next),
        }
    }

    /// Whether the search ended because beams reached `max_len`.
    /// Tokens that end a beam: EOS unless ignored, and the request's stop ids.
    pub fn stop_tokens(&self) -> &[TokenId] {
        &self.stop_tokens
    }

    pub fn reached_max_len(&self) -> bool {
        self.reached_max_len
    }

    /// The hypotheses, best first.
    pub fn into_hypotheses(self) -> Vec<BeamHypothesis> {
        self.finished
    }

    /// Keeps `tokens` as a hypothesis if it is among the best `width`.
    fn add(&mut self, tokens: Vec<TokenId>, cum_logprob: f32) {
        let score = beam_score(cum_logprob, tokens.len(), self.params.length_penalty);
        let w = self.params.width;
        if self.finished.len() == w && self.finished.last().is_some_and(|h| score <= h.score) {
            return;
        }
        // After the last hypothesis at least as good: ties keep discovery order.
        let at = self.finished.partition_point(|h| h.score >= score);
        self.finished.insert(
            at,
            BeamHypothesis {
                tokens,
                cum_logprob,
                score,
            },
        );
        self.finished.truncate(w);
    }
}

fn extended(tokens: &[TokenId], token: TokenId) -> Vec<TokenId> {
    let mut v = Vec::with_capacity(tokens.len() + 1);
    v.extend_from_slice(tokens);
    v.push(token);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: u32) -> TokenId {
        TokenId(v)
    }

    #[test]
    fn top_k_orders_by_value_then_id() {
        let row = [-1.0, -0.5, -1.0, -3.0, -0.5];
        let got = top_k_logprobs(&row, 3);
        assert_eq!(got, vec![(t(1), -0.5), (t(4), -0.5), (t(0), -1.0)]);
        assert_eq!(top_k_logprobs(&row, 9).len(), 5);
    }

    #[test]
    fn stop_candidates_finish_only_within_the_top_width() {
        let params = BeamParams {
            width: 2,
            length_penalty: 1.0,
        };
        let mut s = BeamSearch::new(params, 10, vec![t(0)]);
        let prefix = [t(7)];
        let cands = [(t(5), -0.1), (t(0), -0.2), (t(6), -0.3), (t(8), -0.4)];
        let live = [LiveBeam {
            tokens: &prefix,
            cum_logprob: -1.0,
            candidates: &cands,
        }];
        let next = s.step(&live).expect("goes on");
        assert_eq!(
            next.iter().map(|n| n.token).collect::<Vec<_>>(),
            vec![t(5), t(6)]
        );
        assert!((next[0].cum_logprob - (-1.1)).abs() < 1e-6);
        let h = s.clone().into_hypotheses();
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].tokens, vec![t(7), t(0)]);
        assert!((h[0].score - (-1.2 / 2.0)).abs() < 1e-6);
        // A stop token ranked at `width` or below is dropped.
        let cands = [(t(5), -0.1), (t(6), -0.2), (t(0), -0.3)];
        let live = [LiveBeam {
            tokens: &prefix,
            cum_logprob: 0.0,
            candidates: &cands,
        }];
        let mut s = BeamSearch::new(params, 10, vec![t(0)]);
        s.step(&live).expect("goes on");
        assert!(s.into_hypotheses().is_empty());
    }

    #[test]
    fn ends_at_max_len_or_when_no_live_beam_can_win() {
        let params = BeamParams {
            width: 1,
            length_penalty: 0.0,
        };
        let mut s = BeamSearch::new(params, 1, vec![]);
        let cands = [(t(3), -0.5), (t(4), -0.7)];
        let live = [LiveBeam {
            tokens: &[],
            cum_logprob: 0.0,
            candidates: &cands,
        }];
        assert_eq!(s.step(&live), None);
        assert!(s.reached_max_len());
        assert_eq!(s.into_hypotheses()[0].tokens, vec![t(3)]);
        // width 1: EOS first finishes a hypothesis at -0.1; the live beam is already worse.
        let mut s = BeamSearch::new(params, 5, vec![t(0)]);
        let cands = [(t(0), -0.1), (t(4), -0.7)];
        let live = [LiveBeam {
            tokens: &[],
            cum_logprob: 0.0,
            candidates: &cands,
        }];
        assert_eq!(s.step(&live), None);
        assert!(!s.reached_max_len());
        let h = s.into_hypotheses();
        assert_eq!((h[0].tokens.clone(), h[0].score), (vec![t(0)], -0.1));
    }

    #[test]
    fn params_are_validated() {
        let ok = BeamParams {
            width: 2,
            length_penalty: 1.0,
        };
        assert!(ok.validate().is_ok());
        assert!(BeamParams { width: 0, ..ok }.validate().is_err());
        let nan = BeamParams {
            length_penalty: f32::NAN,
            ..ok
        };
        assert!(nan.validate().is_err());
    }
}
