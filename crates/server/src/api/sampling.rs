//! The request fields shared by `/v1/completions` and `/v1/chat/completions`, their bounds,
//! and their translation into engine requests and text options.

use std::collections::HashMap;

use serde::Deserialize;
use tandem_engine::engine::GenerationRequest;
use tandem_engine::sampler::SamplingParams;
use tandem_engine::RequestParams;
use tandem_model::batch::TokenId;
use tandem_text::{StopStrings, TextOptions};

use super::ModelLimits;
use crate::engine_thread::SampleGroup;
use crate::error::{ApiError, ApiResult};
use crate::limits::RequestLimits;

/// Most entries in `stop_token_ids`.
pub const MAX_STOP_TOKEN_IDS: usize = 64;
/// Longest `cache_salt`, in bytes.
pub const MAX_CACHE_SALT_BYTES: usize = 256;

/// `cache_salt`, when given, is 1 to [`MAX_CACHE_SALT_BYTES`] bytes.
pub(super) fn check_cache_salt(salt: Option<&str>) -> ApiResult<()> {
    match salt {
        Some(s) if s.is_empty() || s.len() > MAX_CACHE_SALT_BYTES => Err(ApiError::field(
            "cache_salt",
            format!("must be 1 to {MAX_CACHE_SALT_BYTES} bytes, got {}", s.len()),
        )),
        _ => Ok(()),
    }
}

/// `stop` as one string or a list, as in the OpenAI API.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// A last chunk with the request's usage (and `"usage": null` on the others).
    pub include_usage: Option<bool>,
    /// Usage so far on every chunk (vLLM's extension).
    pub continuous_usage_stats: Option<bool>,
}

/// Fields every generation request may carry (unknown fields are ignored).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CommonFields {
    pub model: Option<String>,
    pub max_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i32>,
    pub min_p: Option<f32>,
    pub n: Option<u64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub stop: Option<StopField>,
    pub seed: Option<i64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub logit_bias: Option<HashMap<String, f32>>,
    pub ignore_eos: Option<bool>,
    pub min_tokens: Option<u64>,
    pub stop_token_ids: Option<Vec<u32>>,
    pub include_stop_str_in_output: Option<bool>,
    pub skip_special_tokens: Option<bool>,
    /// Accepted and ignored (an end-user id for abuse monitoring).
    pub user: Option<String>,
    pub best_of: Option<u64>,
    /// Beam search of width `n` (see [`super::beam`]).
    pub use_beam_search: Option<bool>,
    /// Prefix-cache isolation: requests share cached KV blocks only with requests of the
    /// same salt (vLLM's field; for tenants that must not learn of each other's prompts).
    pub cache_salt: Option<String>,
    /// Beam search's length normalisation exponent (default 1.0).
    pub length_penalty: Option<f32>,
}

/// What a request asks for, validated, before its prompts are known.
#[derive(Debug, Clone)]
pub struct GenerationPlan {
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
    /// Usage on every chunk.
    pub continuous_usage: bool,
    /// `None`: the endpoint's default (16 for completions, the rest of the context for chat).
    pub max_tokens: Option<usize>,
    pub sampling: SamplingParams,
    pub limits: RequestParams,
    pub text: TextOptions,
}

impl GenerationPlan {
    /// Validates the shared fields against the model and the server's bounds. `logprobs`:
    /// how many alternatives per token the endpoint asked for (`None`: no logprobs);
    /// `logprobs_param` names that field (`logprobs`, `top_logprobs`).
    pub fn new(
        f: &CommonFields,
        logprobs: Option<usize>,
        logprobs_param: &str,
        model: &ModelLimits,
        bounds: &RequestLimits,
    ) -> ApiResult<GenerationPlan> {
        let n = f.n.unwrap_or(1);
        let max_n = bounds.max_n as u64;
        if !(1..=max_n).contains(&n) {
            return Err(ApiError::field(
                "n",
                format!("must be between 1 and {max_n}, got {n}"),
            ));
        }
        check_unsupported(f, n)?;
        let max_tokens = match f.max_tokens {
            Some(0) => return Err(ApiError::field("max_tokens", "must be at least 1")),
            Some(m) => Some(usize::try_from(m).unwrap_or(usize::MAX)),
            None => None,
        };
        if let (Some(m), Some(cap)) = (max_tokens, bounds.max_output_tokens) {
            if m > cap {
                return Err(ApiError::field(
                    "max_tokens",
                    format!("must be at most {cap}, got {m}"),
                ));
            }
        }
        let min_tokens = f
            .min_tokens
            .map_or(0, |m| usize::try_from(m).unwrap_or(usize::MAX));
        if let Some(m) = max_tokens.filter(|&m| min_tokens > m) {
            return Err(ApiError::field(
                "min_tokens",
                format!("must be at most max_tokens ({m}), got {min_tokens}"),
            ));
        }
        let max_k = bounds.max_top_logprobs;
        if let Some(k) = logprobs.filter(|&k| k > max_k) {
            return Err(ApiError::field(
                logprobs_param,
                format!("at most {max_k} alternatives, got {k}"),
            ));
        }
        check_cache_salt(f.cache_salt.as_deref())?;
        let stop_token_ids = f.stop_token_ids.clone().unwrap_or_default();
        if stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
            return Err(ApiError::field(
                "stop_token_ids",
                format!(
                    "at most {MAX_STOP_TOKEN_IDS} ids, got {}",
                    stop_token_ids.len()
                ),
            ));
        }
        let ignore_eos = f.ignore_eos.unwrap_or(false);
        let sampling = SamplingParams {
            temperature: f.temperature.unwrap_or(1.0),
            top_k: f.top_k.unwrap_or(-1),
            top_p: f.top_p.unwrap_or(1.0),
            min_p: f.min_p.unwrap_or(0.0),
            repetition_penalty: f.repetition_penalty.unwrap_or(1.0),
            presence_penalty: f.presence_penalty.unwrap_or(0.0),
            frequency_penalty: f.frequency_penalty.unwrap_or(0.0),
            logit_bias: logit_bias(f.logit_bias.as_ref(), bounds.max_logit_bias)?,
            seed: f.seed.map(|s| s as u64),
            logprobs: logprobs.is_some(),
            top_logprobs: logprobs.unwrap_or(0),
            min_tokens,
            ignore_eos,
            stop_token_ids: stop_token_ids.clone(),
            eos_token_ids: model.eos_token_ids.clone(),
            constraint: None,
        };
        sampling
            .validate(model.vocab_size)
            .map_err(|e| ApiError::from_engine(&e.into(), "prompt"))?;
        let stop = match &f.stop {
            None => Vec::new(),
            Some(StopField::One(s)) => vec![s.clone()],
            Some(StopField::Many(v)) => v.clone(),
        };
        let stop = StopStrings::with_limits(stop, bounds.max_stop_strings, bounds.max_stop_length)
            .map_err(|e| ApiError::field("stop", e))?;
        let stream = f.stream.unwrap_or(false);
        let options = f.stream_options.clone().unwrap_or_default();
        if f.stream_options.is_some() && !stream {
            return Err(ApiError::field(
                "stream_options",
                "is only allowed with stream: true",
            ));
        }
        Ok(GenerationPlan {
            n: n as usize,
            stream,
            include_usage: options.include_usage.unwrap_or(false),
            continuous_usage: options.continuous_usage_stats.unwrap_or(false),
            max_tokens,
            sampling,
            limits: RequestParams {
                max_tokens: max_tokens.unwrap_or(16),
                ignore_eos,
                stop_token_ids: stop_token_ids.into_iter().map(TokenId).collect(),
                priority: 0,
                cache_salt: f.cache_salt.clone(),
                adapter: None,
            },
            text: TextOptions {
                skip_special_tokens: f.skip_special_tokens.unwrap_or(true),
                stop,
                include_stop_str_in_output: f.include_stop_str_in_output.unwrap_or(false),
            },
        })
    }

    /// The engine request for one prompt with `max_tokens` output tokens at most, and its
    /// number of parallel samples (`n`).
    pub fn request(&self, prompt: &[TokenId], max_tokens: usize) -> SampleGroup {
        let request = GenerationRequest {
            prompt: prompt.to_vec(),
            sampling: self.sampling.clone(),
            limits: RequestParams {
                max_tokens,
                ..self.limits.clone()
            },
            sample_index: 0,
            prompt_logprobs: None,
            prompt_logprobs_start: 1,
        };
        (request, self.n)
    }
}

/// Refuses what is not implemented rather than silently doing something else.
fn check_unsupported(f: &CommonFields, n: u64) -> ApiResult<()> {
    if f.length_penalty.is_some() && f.use_beam_search != Some(true) {
        return Err(ApiError::field(
            "length_penalty",
            "only applies with use_beam_search",
        ));
    }
    if let Some(b) = f.best_of.filter(|&b| b != n) {
        return Err(ApiError::field(
            "best_of",
            format!("only best_of == n is supported (n = {n}, best_of = {b})"),
        ));
    }
    Ok(())
}

/// `logit_bias`: at most `max` token id strings to biases in [-100, 100] (the ids are
/// checked against the vocabulary with the other sampling parameters).
fn logit_bias(map: Option<&HashMap<String, f32>>, max: usize) -> ApiResult<Vec<(u32, f32)>> {
    let Some(map) = map else {
        return Ok(Vec::new());
    };
    if map.len() > max {
        return Err(ApiError::field(
            "logit_bias",
            format!("at most {max} entries, got {}", map.len()),
        ));
    }
    let mut out: Vec<(u32, f32)> =
        map.iter()
            .map(|(k, &v)| {
                k.trim().parse::<u32>().map(|id| (id, v)).map_err(|_| {
                    ApiError::field("logit_bias", format!("key `{k}` is not a token id"))
                })
            })
            .collect::<ApiResult<_>>()?;
    out.sort_by_key(|&(id, _)| id);
    // `{"5": 1, "05": 2}`: two keys for one token, which bias would win is arbitrary.
    if let Some(w) = out.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(ApiError::field(
            "logit_bias",
            format!("token {} appears under two keys", w[0].0),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn model() -> ModelLimits {
        ModelLimits {
            vocab_size: 100,
            max_model_len: 64,
            eos_token_ids: vec![2],
            kv_block_size: 16,
            kv_bytes_per_block: 1024,
        }
    }

    fn plan(v: serde_json::Value) -> ApiResult<GenerationPlan> {
        let f: CommonFields = crate::api::body::fields(&v)?;
        GenerationPlan::new(&f, None, "logprobs", &model(), &RequestLimits::default())
    }

    #[test]
    fn configured_bounds_name_the_field() {
        let bounds = RequestLimits {
            max_n: 2,
            max_output_tokens: Some(8),
            max_stop_strings: 1,
            max_stop_length: 3,
            max_logit_bias: 1,
            max_top_logprobs: 2,
            ..RequestLimits::default()
        };
        for (body, logprobs, field) in [
            (json!({"n": 3}), None, "n"),
            (json!({"max_tokens": 9}), None, "max_tokens"),
            (json!({"stop": ["a", "b"]}), None, "stop"),
            (json!({"stop": "abcd"}), None, "stop"),
            (
                json!({"logit_bias": {"1": 1.0, "2": 1.0}}),
                None,
                "logit_bias",
            ),
            (json!({}), Some(3), "logprobs"),
            (
                json!({"stream_options": {"include_usage": true}}),
                None,
                "stream_options",
            ),
        ] {
            let f: CommonFields = crate::api::body::fields(&body).expect("fields");
            let e = GenerationPlan::new(&f, logprobs, "logprobs", &model(), &bounds).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(field), "{body}: {e:?}");
            assert_eq!(e.status, 400);
        }
        let f: CommonFields =
            crate::api::body::fields(&json!({"n": 2, "max_tokens": 8, "stop": "abc",
                                             "logit_bias": {"1": 1.0}}))
            .expect("fields");
        assert!(GenerationPlan::new(&f, Some(2), "logprobs", &model(), &bounds).is_ok());
    }

    #[test]
    fn bounds_name_the_field() {
        for (body, field) in [
            (json!({"temperature": -1.0}), "temperature"),
            (json!({"n": 0}), "n"),
            (json!({"n": 17}), "n"),
            (json!({"top_p": 0.0}), "top_p"),
            (json!({"max_tokens": 0}), "max_tokens"),
            (json!({"logit_bias": {"abc": 1.0}}), "logit_bias"),
            (json!({"logit_bias": {"500": 1.0}}), "logit_bias"),
            (json!({"logit_bias": {"5": 1.0, "05": 2.0}}), "logit_bias"),
            (json!({"stop": ["", "x"]}), "stop"),
            (json!({"stop_token_ids": [100]}), "stop_token_ids"),
            (json!({"min_tokens": 5, "max_tokens": 4}), "min_tokens"),
            (json!({"best_of": 3}), "best_of"),
        ] {
            let e = plan(body.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(field), "{body}: {e:?}");
            assert_eq!(e.status, 400);
        }
    }

    #[test]
    fn fields_reach_the_engine_request() {
        let p = plan(json!({"temperature": 0, "seed": 7, "n": 2, "stop": "x",
                            "logit_bias": {"5": 2.5}, "ignore_eos": true}))
        .expect("valid");
        let (req, n) = p.request(&[TokenId(1), TokenId(3)], 9);
        assert_eq!(n, 2);
        let reqs = [req];
        assert_eq!(reqs[0].sample_index, 0);
        assert_eq!(reqs[0].limits.max_tokens, 9);
        assert!(reqs[0].limits.ignore_eos && reqs[0].sampling.ignore_eos);
        assert_eq!(reqs[0].sampling.seed, Some(7));
        assert_eq!(reqs[0].sampling.logit_bias, vec![(5, 2.5)]);
        assert_eq!(reqs[0].sampling.eos_token_ids, vec![2]);
        assert_eq!(p.text.stop.as_slice(), ["x".to_string()]);
    }
}
