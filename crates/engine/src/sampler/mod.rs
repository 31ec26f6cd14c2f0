//! The sampler: turns one row of logits into the next token of one request.
//!
//! # Semantics
//!
//! Each call to [`sample`] works on a private f64 copy of the row and applies, in order:
//!
//! 1. **logit_bias**: `l[id] += bias` (repeated ids add up);
//! 2. **min_tokens**: while `num_output_tokens < min_tokens`, every stop token
//!    (`stop_token_ids`, plus the model's `eos_token_ids` unless `ignore_eos`) gets `-inf`;
//! 3. **repetition penalty** `r` (tokens in the prompt or the output, each once):
//!    `l = l / r` if `l > 0`, else `l = l * r`;
//! 4. **presence / frequency penalties** (output tokens only):
//!    `l -= presence + frequency * count`;
//!    steps 1-4 compute each changed logit in f64 and round it once to f32
//!    ([`tandem_model::logit_processing`]), so a runner that applies them to its f32 logits
//!    where they are (`ModelRunner::forward_sample`) gets the same values;
//!    then the **constraint** (structured output, [`constraint`]): tokens the request's
//!    grammar does not allow get `-inf`; stop tokens only where the grammar accepts;
//! 5. **greedy** when `temperature == 0`: the largest `l`, ties to the lowest id (top-k,
//!    top-p and min-p cannot change an argmax and are skipped);
//! 6. otherwise **temperature** `T`: `p ∝ exp(l / T)`;
//! 7. **top-k**: keep exactly the `k` largest (ties to the lower id);
//! 8. **top-p**: over the distribution renormalised after top-k, keep the shortest
//!    prefix in descending-probability order whose mass is `>= top_p`;
//! 9. **min-p**: keep tokens with `p >= min_p * max p` (a ratio, so renormalisation does not
//!    change it);
//! 10. **draw** one token from the renormalised survivors, walked in id order, by inverse
//!     CDF with one uniform number from the request's stream.
//!
//! This is the order of Hugging Face transformers' processors (vLLM applies min-p before
//! top-p, which differs only when both are set).
//!
//! **Logprobs** ([`SampledToken::logprob`] and `top_logprobs`), reported when the request
//! asks for them ([`SamplingParams::logprobs`]; otherwise their `log_softmax`, a pass over
//! the row, is skipped), are those of the **raw model distribution**: `log_softmax` of the unprocessed
//! logits, whatever the processors did (the vLLM convention). They therefore equal the
//! numbers `tandem score` prints for the same context, bit for bit.
//!
//! **Randomness**: every call draws exactly one uniform number from the request's own
//! counter-based stream ([`SamplerState`]), greedy or not, so a seeded request produces the
//! same tokens whatever else is in the batch, however the steps are composed. Sibling
//! samples of an `n > 1` request use the seeds `seed + i` ([`SamplerState::fork`]).
//!
//! **Faults**: a row holding NaN or ±inf gives [`SamplerError::NonFiniteLogits`] and
//! touches nothing shared; the caller ends that request only.

pub mod constraint;
mod distribution;
mod draw;
mod error;
mod history;
mod logprobs;
mod nucleus;
mod params;
mod processors;
mod rng;
mod scratch;
mod state;
mod truncation;

pub use constraint::{Constraint, ConstraintCompiler, ConstraintError, GrammarSpec};
pub use distribution::{
    processed_argmax, processed_distribution, reported_token, TokenDistribution,
};
pub use error::SamplerError;
pub use params::{SamplingParams, MAX_ABS_LOGIT_BIAS, MAX_ABS_PENALTY, MAX_TOP_LOGPROBS};
pub use rng::StreamRng;
pub use state::SamplerState;

use logprobs::RawLogSoftmax;

/// The token chosen for one request in one step.
#[derive(Debug, Clone, PartialEq)]
pub struct SampledToken {
    /// The chosen token id.
    pub token: u32,
    /// `log p(token)` under the raw model distribution (natural log); `None` unless
    /// `params.logprobs`.
    pub logprob: Option<f32>,
    /// The `top_logprobs` most likely tokens of the raw distribution and their logprobs,
    /// most likely first (ties to the lower id); empty unless `params.logprobs`.
    pub top_logprobs: Vec<(u32, f32)>,
}

/// Chooses the next token of one request from its logits row (`[vocab_size]`).
///
/// `num_output_tokens` is how many tokens the request has generated so far (for
/// `min_tokens`). The caller records the chosen token with
/// [`SamplerState::append_output`]. `params` should have passed
/// [`SamplingParams::validate`]; ids outside the row are rejected here too.
///
/// Errors: [`SamplerError::NonFiniteLogits`] for a NaN or infinite logit,
/// [`SamplerError::EmptyLogits`], [`SamplerError::NoCandidates`] when every token is
/// suppressed, and [`SamplerError::InvalidParam`] for ids outside the row.
pub fn sample(
    logits_row: &[f32],
    params: &SamplingParams,
    state: &mut SamplerState,
    num_output_tokens: usize,
) -> Result<SampledToken, SamplerError> {
    // Draw first and unconditionally: exactly one draw per call.
    let u = state.draw_uniform();
    let lsm = RawLogSoftmax::if_reported(logits_row, params)?;
    params.validate_ids(logits_row.len())?;

    let mut scratch = scratch::take();
    let values = &mut scratch.values; // [vocab_size]
    values.clear();
    values.extend(logits_row.iter().map(|&v| v as f64));
    processors::apply_all(values, params, state, num_output_tokens);
    if let Err(e) = apply_constraint(values, params, state) {
        scratch::put_back(scratch);
        return Err(e);
    }
    let chosen = if params.is_greedy() {
        truncation::argmax(values)
    } else {
        truncation::sample_random(values, &mut scratch.candidates, params, u)
    };
    scratch::put_back(scratch);
    let token = chosen.ok_or(SamplerError::NoCandidates)?;
    Ok(logprobs::reported(logits_row, token, params, lsm))
}

/// The constraint step of the processing: `-inf` for what the request's grammar forbids at
/// the state's position (nothing without a grammar).
pub(crate) fn apply_constraint(
    values: &mut [f64],
    params: &SamplingParams,
    state: &mut SamplerState,
) -> Result<(), SamplerError> {
    match state.constraint.as_mut() {
        Some(c) => {
            let stops: Vec<u32> = params.suppressed_while_short().collect();
            c.apply(values, &stops).map_err(SamplerError::Constraint)
        }
        None => Ok(()),
    }
}
