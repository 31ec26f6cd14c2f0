//! Per-request sampling parameters and their validation.

use tandem_model::logit_processing::TokenAdjustment;
use tandem_model::row_sampling::{RowDraw, RowSampling};

use super::constraint::Constraint;
use super::error::SamplerError;
use super::processors::logit_processing_in;
use super::state::SamplerState;

/// The largest `top_logprobs` a request may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;
/// The largest absolute `logit_bias` value (OpenAI's limit).
pub const MAX_ABS_LOGIT_BIAS: f32 = 100.0;
/// The largest absolute presence or frequency penalty (OpenAI's limit).
pub const MAX_ABS_PENALTY: f32 = 2.0;

/// What the sampler needs to know about one request. Stop conditions on text, `max_tokens`
/// and `n` belong to the scheduler and the server, not here.
///
/// `Default` follows OpenAI's defaults: temperature 1, top_p 1, no top-k, no min-p, neutral
/// penalties, no bias, no seed, no logprobs, min_tokens 0.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature, `>= 0` and finite. `0` means greedy (argmax, ties to the lowest id).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens. Both `0` and `-1` disable it (as in vLLM);
    /// values `< -1` are rejected; values above the vocabulary size keep everything.
    pub top_k: i32,
    /// Nucleus sampling: keep the smallest set of most likely tokens whose probability mass is
    /// `>= top_p`. In `(0, 1]`; `1` disables it.
    pub top_p: f32,
    /// Keep tokens whose probability is `>= min_p` times the most likely one's. In `[0, 1]`;
    /// `0` disables it.
    pub min_p: f32,
    /// Repetition penalty over prompt and output tokens (`> 0`, `1` = neutral): a seen token's
    /// logit is divided by it when positive and multiplied by it otherwise.
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every token that occurs in the output. In `[-2, 2]`.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per occurrence in the output. In `[-2, 2]`.
    pub frequency_penalty: f32,
    /// `(token id, bias)` pairs added to the raw logits; bias in `[-100, 100]`. Repeated ids
    /// add up.
    pub logit_bias: Vec<(u32, f32)>,
    /// Seed of the request's random stream; `None` lets the engine pick one.
    pub seed: Option<u64>,
    /// Whether to return the chosen token's raw logprob and `top_logprobs` alternatives
    /// (without it neither is reported, and the host sampler skips the log-softmax's
    /// normalizer, a pass over the row).
    pub logprobs: bool,
    /// How many alternatives to return when `logprobs` is set, at most [`MAX_TOP_LOGPROBS`].
    pub top_logprobs: usize,
    /// While fewer than `min_tokens` tokens have been generated, stop tokens are suppressed.
    pub min_tokens: usize,
    /// When set, the model's EOS ids neither stop the request nor are suppressed by
    /// `min_tokens`.
    pub ignore_eos: bool,
    /// Extra token ids that end the request (suppressed while output < `min_tokens`).
    pub stop_token_ids: Vec<u32>,
    /// The model's end-of-sequence ids, filled in by the engine from the model's metadata.
    pub eos_token_ids: Vec<u32>,
    /// A compiled grammar the output must match (structured output); see
    /// [`super::constraint`]. Compile it with [`super::ConstraintCompiler::compile`].
    pub constraint: Option<Constraint>,
}

impl Default for SamplingParams {
    fn default() -> SamplingParams {
        SamplingParams {
            temperature: 1.0,
            top_k: -1,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: None,
            logprobs: false,
            top_logprobs: 0,
            min_tokens: 0,
            ignore_eos: false,
            stop_token_ids: Vec::new(),
            eos_token_ids: Vec::new(),
            constraint: None,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding (temperature 0) with every other setting at its default.
    pub fn greedy() -> SamplingParams {
        SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        }
    }

    /// Whether sampling is greedy (argmax) rather than random.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Whether, with `num_output_tokens` generated, the request's processed logits are its
    /// raw logits and it reports nothing but the chosen token's logprob: no bias, no
    /// penalties, no stop tokens suppressed by `min_tokens`, no `top_logprobs`. (A grammar,
    /// held by the request's state, is the one processor this cannot see.) A greedy such row
    /// needs only the runner's greedy pick (`ModelRunner::forward_greedy`).
    pub fn is_unprocessed(&self, num_output_tokens: usize) -> bool {
        self.logit_bias.is_empty()
            && self.repetition_penalty == 1.0
            && self.presence_penalty == 0.0
            && self.frequency_penalty == 0.0
            && !(self.logprobs && self.top_logprobs > 0)
            && (num_output_tokens >= self.min_tokens
                || self.suppressed_while_short().next().is_none())
    }

    /// The row parameters of a device draw with uniform number `uniform`
    /// (`tandem_model::row_sampling`).
    pub fn row_sampling(&self, uniform: f64) -> RowSampling {
        RowSampling {
            temperature: self.temperature,
            top_k: self
                .top_k_limit()
                .map_or(0, |k| i32::try_from(k).unwrap_or(i32::MAX)),
            top_p: self.top_p,
            min_p: self.min_p,
            uniform,
        }
    }

    /// Everything a runner needs to choose this request's next token where its logits are,
    /// with `state`'s history, `num_output_tokens` generated and the uniform number
    /// `uniform` (a grammar excepted: a constrained request is sampled on the host).
    /// Processed tokens outside a vocabulary of `vocab_size` are left out, as the host's
    /// processors ignore them.
    pub fn row_draw(
        &self,
        state: &SamplerState,
        num_output_tokens: usize,
        uniform: f64,
        vocab_size: usize,
    ) -> RowDraw {
        self.row_draw_in(state, num_output_tokens, uniform, vocab_size, Vec::new())
    }

    /// [`Self::row_draw`] with the processors' list in `buffer` (its allocation reused).
    pub fn row_draw_in(
        &self,
        state: &SamplerState,
        num_output_tokens: usize,
        uniform: f64,
        vocab_size: usize,
        buffer: Vec<TokenAdjustment>,
    ) -> RowDraw {
        let mut processing = logit_processing_in(self, state, num_output_tokens, buffer);
        processing.tokens.retain(|t| (t.id as usize) < vocab_size);
        RowDraw {
            sampling: self.row_sampling(uniform),
            processing,
            top_logprobs: if self.logprobs { self.top_logprobs } else { 0 },
        }
    }

    /// `Some(k)` when top-k truncation is active (`top_k >= 1`).
    pub fn top_k_limit(&self) -> Option<usize> {
        usize::try_from(self.top_k).ok().filter(|&k| k >= 1)
    }

    /// Whether `token` ends the request: a `stop_token_ids` entry, or an EOS id unless
    /// `ignore_eos`. (The scheduler also honours `min_tokens`; the sampler never emits a stop
    /// token before then.)
    pub fn is_stop_token(&self, token: u32) -> bool {
        self.stop_token_ids.contains(&token)
            || (!self.ignore_eos && self.eos_token_ids.contains(&token))
    }

    /// The ids suppressed while the output is shorter than `min_tokens`: exactly the ids for
    /// which [`Self::is_stop_token`] holds.
    pub fn suppressed_while_short(&self) -> impl Iterator<Item = u32> + '_ {
        let eos: &[u32] = if self.ignore_eos {
            &[]
        } else {
            &self.eos_token_ids
        };
        self.stop_token_ids.iter().chain(eos).copied()
    }

    /// The seed of the random stream for sample `index` (0-based) of this request: the
    /// request's seed, or `engine_seed` when it has none, plus `index` (wrapping). Sibling
    /// samples of an `n > 1` request thus use `seed`, `seed + 1`, ... (as vLLM does).
    pub fn stream_seed(&self, engine_seed: u64, index: u64) -> u64 {
        self.seed.unwrap_or(engine_seed).wrapping_add(index)
    }

    /// Checks every field against its bound for a model with `vocab_size` tokens.
    pub fn validate(&self, vocab_size: usize) -> Result<(), SamplerError> {
        let t = self.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return Err(SamplerError::invalid(
                "temperature",
                format!("must be finite and >= 0, got {t}"),
            ));
        }
        if self.top_k < -1 {
            return Err(SamplerError::invalid(
                "top_k",
                format!("must be -1 or 0 (disabled) or >= 1, got {}", self.top_k),
            ));
        }
        let p = self.top_p;
        if !(p > 0.0 && p <= 1.0) {
            return Err(SamplerError::invalid(
                "top_p",
                format!("must be in (0, 1], got {p}"),
            ));
        }
        let m = self.min_p;
        if !(0.0..=1.0).contains(&m) {
            return Err(SamplerError::invalid(
                "min_p",
                format!("must be in [0, 1], got {m}"),
            ));
        }
        let r = self.repetition_penalty;
        if !(r.is_finite() && r > 0.0) {
            return Err(SamplerError::invalid(
                "repetition_penalty",
                format!("must be finite and > 0, got {r}"),
            ));
        }
        for (field, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-MAX_ABS_PENALTY..=MAX_ABS_PENALTY).contains(&v) {
                return Err(SamplerError::invalid(
                    field,
                    format!("must be in [-2, 2], got {v}"),
                ));
            }
        }
        self.validate_ids(vocab_size)?;
        if self.top_logprobs > MAX_TOP_LOGPROBS {
            return Err(SamplerError::invalid(
                "top_logprobs",
                format!("must be <= {MAX_TOP_LOGPROBS}, got {}", self.top_logprobs),
            ));
        }
        Ok(())
    }

    /// Checks the token ids in `logit_bias`, `stop_token_ids` and `eos_token_ids` against
    /// `vocab_size`, and the bias values against [`MAX_ABS_LOGIT_BIAS`].
    pub fn validate_ids(&self, vocab_size: usize) -> Result<(), SamplerError> {
        let in_vocab = |id: u32| (id as usize) < vocab_size;
        for &(id, bias) in &self.logit_bias {
            if !in_vocab(id) {
                return Err(SamplerError::invalid(
                    "logit_bias",
                    format!("token id {id} is outside the vocabulary [0, {vocab_size})"),
                ));
            }
            if !(-MAX_ABS_LOGIT_BIAS..=MAX_ABS_LOGIT_BIAS).contains(&bias) {
                return Err(SamplerError::invalid(
                    "logit_bias",
                    format!("bias for token {id} must be in [-100, 100], got {bias}"),
                ));
            }
        }
        for (field, ids) in [
            ("stop_token_ids", &self.stop_token_ids),
            ("eos_token_ids", &self.eos_token_ids),
        ] {
            if let Some(&id) = ids.iter().find(|&&id| !in_vocab(id)) {
                return Err(SamplerError::invalid(
                    field,
                    format!("token id {id} is outside the vocabulary [0, {vocab_size})"),
                ));
            }
        }
        Ok(())
    }
}
