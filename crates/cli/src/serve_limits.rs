//! `tandem serve`'s bounds on requests (ARCHITECTURE.md § Request bounds and errors) and its API
//! key flags.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use tandem_server::limits::{
    RequestLimits, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_GRAMMAR_BYTES, DEFAULT_MAX_GRAMMAR_COMPILES,
    DEFAULT_MAX_SCORE_ITEMS, DEFAULT_MAX_WAITING_REQUESTS,
};

/// What one request may ask for; over a bound it gets 400 naming the field (413 for the body,
/// 429 with Retry-After when the waiting queue is full).
#[derive(Debug, Args)]
pub struct LimitArgs {
    /// Largest request body in bytes (larger: 413).
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_BODY_BYTES)]
    max_body_bytes: usize,
    /// Most choices per prompt (`n`).
    #[arg(long, value_name = "N", default_value_t = 16)]
    max_n: usize,
    /// Most output tokens per choice (`max_tokens`); default: up to the model length.
    #[arg(long, value_name = "N")]
    max_output_tokens: Option<usize>,
    /// Most prompt tokens (a prompt at or beyond the model length is refused anyway).
    #[arg(long, value_name = "N")]
    max_prompt_tokens: Option<usize>,
    /// Most prompts in one /v1/completions request.
    #[arg(long, value_name = "N", default_value_t = 64)]
    max_prompts: usize,
    /// Most `stop` strings per request.
    #[arg(long, value_name = "N", default_value_t = 16)]
    max_stop_strings: usize,
    /// Longest `stop` string in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 256)]
    max_stop_length: usize,
    /// Most `logit_bias` entries (ids must be in the vocabulary).
    #[arg(long, value_name = "N", default_value_t = 1024)]
    max_logit_bias: usize,
    /// Most alternatives per token (`logprobs`, `top_logprobs`, `prompt_logprobs`; <= 20).
    #[arg(long, value_name = "K", default_value_t = 20)]
    max_top_logprobs: usize,
    /// Most sequences in one /v1/score request.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_SCORE_ITEMS)]
    max_score_items: usize,
    /// Most requests waiting to start; more get 429 with Retry-After.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_WAITING_REQUESTS)]
    max_waiting_requests: usize,
    /// Largest structured-output grammar (JSON schema, regex, choices, Lark) in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_GRAMMAR_BYTES)]
    max_grammar_bytes: usize,
    /// Most structured-output grammars compiling at once; a request that finds them all busy
    /// for the 10 s compile limit gets 429.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_GRAMMAR_COMPILES)]
    max_grammar_compiles: usize,
}

impl LimitArgs {
    /// The validated bounds.
    pub fn limits(&self) -> Result<RequestLimits> {
        let limits = RequestLimits {
            max_body_bytes: self.max_body_bytes,
            max_n: self.max_n,
            max_output_tokens: self.max_output_tokens,
            max_prompt_tokens: self.max_prompt_tokens,
            max_prompts: self.max_prompts,
            max_stop_strings: self.max_stop_strings,
            max_stop_length: self.max_stop_length,
            max_logit_bias: self.max_logit_bias,
            max_top_logprobs: self.max_top_logprobs,
            max_score_items: self.max_score_items,
            max_waiting_requests: self.max_waiting_requests,
            max_grammar_bytes: self.max_grammar_bytes,
            max_grammar_compiles: self.max_grammar_compiles,
        };
        limits.validate().map_err(anyhow::Error::msg)?;
        Ok(limits)
    }
}

/// The API key, given inline or in a file.
#[derive(Debug, Args)]
pub struct KeyArgs {
    /// Require `Authorization: Bearer KEY` on every route except /health.
    #[arg(long, value_name = "KEY", conflicts_with = "api_key_file")]
    api_key: Option<String>,
    /// Like --api-key, with the key read from this file (surrounding whitespace dropped), so
    /// it stays out of the process list.
    #[arg(long, value_name = "PATH")]
    api_key_file: Option<PathBuf>,
}

impl KeyArgs {
    /// The key, if one was given; an empty key is an error, not "no key".
    pub fn key(&self) -> Result<Option<String>> {
        let key = match (&self.api_key, &self.api_key_file) {
            (Some(k), _) => k.clone(),
            (None, Some(path)) => std::fs::read_to_string(path)
                .with_context(|| format!("reading --api-key-file {}", path.display()))?
                .trim()
                .to_string(),
            (None, None) => return Ok(None),
        };
        if key.is_empty() {
            bail!("the API key is empty");
        }
        Ok(Some(key))
    }
}
