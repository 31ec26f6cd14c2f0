//! Per-request sampler state: the random stream and the token history the penalties read.

use std::collections::BTreeMap;

use tandem_model::logit_processing::TokenAdjustment;

use super::constraint::{Constraint, ConstraintState};
use super::history::{History, PenaltyKinds};
use super::params::SamplingParams;
use super::rng::StreamRng;

/// Everything the sampler remembers about one request (one sample of it, for `n > 1`).
///
/// Invariants: the random stream advances exactly once per call to [`super::sample`], so a
/// seeded request's tokens depend only on its seed, its logits and its own history; the
/// output counts contain exactly the tokens passed to [`SamplerState::append_output`].
#[derive(Debug, Clone)]
pub struct SamplerState {
    /// The seed this state's stream was created from.
    seed: u64,
    rng: StreamRng,
    /// Distinct prompt token ids, sorted (for the repetition penalty).
    prompt_tokens: Vec<u32>,
    /// Occurrences of each generated token (for all three penalties).
    output_counts: BTreeMap<u32, u32>,
    /// The grammar position after the committed output, for a constrained request.
    pub(crate) constraint: Option<ConstraintState>,
    /// The penalties' token list, kept in step with the output (`None` without penalties,
    /// or until [`SamplerState::with_penalties`]).
    history: Option<History>,
}

impl SamplerState {
    /// A state for a request with this prompt whose stream is keyed by `seed` (use
    /// [`super::SamplingParams::stream_seed`] to derive it from the request's seed, or from
    /// an engine-chosen seed for unseeded requests).
    pub fn new(seed: u64, prompt_tokens: &[u32]) -> SamplerState {
        let mut prompt = prompt_tokens.to_vec();
        prompt.sort_unstable();
        prompt.dedup();
        SamplerState {
            seed,
            rng: StreamRng::new(seed),
            prompt_tokens: prompt,
            output_counts: BTreeMap::new(),
            constraint: None,
            history: None,
        }
    }

    /// This state keeping the token list of `params`' penalties from step to step (see
    /// `history.rs`); without penalties, unchanged.
    pub fn with_penalties(mut self, params: &SamplingParams) -> SamplerState {
        let kinds = PenaltyKinds::of(params);
        self.history = kinds
            .any()
            .then(|| History::new(kinds, &self.prompt_tokens, self.output_counts()));
        self
    }

    /// The kept penalty list, if it is for `kinds`.
    pub(crate) fn history(&self, kinds: PenaltyKinds) -> Option<&[TokenAdjustment]> {
        self.history
            .as_ref()
            .filter(|h| h.kinds == kinds)
            .map(|h| h.tokens.as_slice())
    }

    /// This state with `constraint`'s start position (a request with a grammar).
    pub fn with_constraint(mut self, constraint: Option<&Constraint>) -> SamplerState {
        self.constraint = constraint.map(Constraint::start);
        self
    }

    /// Whether the request's tokens are constrained by a grammar.
    pub fn is_constrained(&self) -> bool {
        self.constraint.is_some()
    }

    /// Advances the grammar past a committed output token (call once per committed token,
    /// after [`SamplerState::append_output`]). Stop tokens end the request and are not fed.
    pub fn advance_constraint(&mut self, token: u32, is_stop: bool) {
        if let (Some(c), false) = (self.constraint.as_mut(), is_stop) {
            c.commit(token);
        }
    }

    /// Undoes the last `n` [`SamplerState::advance_constraint`] calls of non-stop tokens
    /// (the drafts a verification advanced through).
    pub fn rollback_constraint(&mut self, n: usize) {
        if let Some(c) = self.constraint.as_mut() {
            c.rollback(n);
        }
    }

    /// The state of sibling sample `index` of the same request (for `n > 1`): the same
    /// prompt and output history, and a fresh stream keyed by `seed + index` (wrapping).
    /// `fork(0)` of a state that has not sampled yet reproduces it exactly.
    pub fn fork(&self, index: u64) -> SamplerState {
        let seed = self.seed.wrapping_add(index);
        SamplerState {
            seed,
            rng: StreamRng::new(seed),
            prompt_tokens: self.prompt_tokens.clone(),
            output_counts: self.output_counts.clone(),
            constraint: self.constraint.clone(),
            history: self.history.clone(),
        }
    }

    /// The seed this state's stream was created from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// How many random draws (= calls to [`super::sample`]) this state has made.
    pub fn num_draws(&self) -> u64 {
        self.rng.draws()
    }

    /// Records a generated token (call once per token appended to the output, including
    /// tokens accepted from a speculative draft).
    pub fn append_output(&mut self, token: u32) {
        *self.output_counts.entry(token).or_insert(0) += 1;
        self.refresh_history(token);
    }

    /// Undoes one [`SamplerState::append_output`] of `token` (speculative verification
    /// extends the history by draft tokens while it judges the next position, then takes
    /// them back). Does nothing if `token` was never recorded.
    pub fn retract_output(&mut self, token: u32) {
        if let Some(c) = self.output_counts.get_mut(&token) {
            *c -= 1;
            if *c == 0 {
                self.output_counts.remove(&token);
            }
            self.refresh_history(token);
        }
    }

    /// Brings the kept penalty list's entry of `token` up to date.
    fn refresh_history(&mut self, token: u32) {
        let in_prompt = self.in_prompt(token);
        let count = self.output_count(token);
        if let Some(h) = self.history.as_mut() {
            h.set(token, in_prompt, count);
        }
    }

    /// How many times `token` occurs in the output so far.
    pub fn output_count(&self, token: u32) -> u32 {
        self.output_counts.get(&token).copied().unwrap_or(0)
    }

    /// Whether `token` occurs in the prompt.
    pub fn in_prompt(&self, token: u32) -> bool {
        self.prompt_tokens.binary_search(&token).is_ok()
    }

    /// Distinct prompt token ids, ascending.
    pub(crate) fn prompt_tokens(&self) -> &[u32] {
        &self.prompt_tokens
    }

    /// `(token, count)` for every generated token, ascending by id.
    pub(crate) fn output_counts(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.output_counts.iter().map(|(&t, &c)| (t, c))
    }

    /// One uniform draw in `[0, 1)`; the only place the stream advances.
    /// (Public for speculative verification, which draws once per judged draft and once per
    /// residual sample.)
    pub fn draw_uniform(&mut self) -> f64 {
        self.rng.next_f64()
    }
}
