//! `/v1/completions` prompt options: `echo`, `logprobs` over echoed prompt tokens,
//! `max_tokens: 0`, and vLLM's `prompt_logprobs` extension.
//!
//! - `echo: true`: each choice's text starts with its prompt (the string as given, or the
//!   decoded ids of a token-id prompt); with `logprobs: k` the legacy logprobs object covers
//!   the prompt tokens, then the generated ones (`token_logprobs[0]` and `top_logprobs[0]`
//!   are `null`: nothing predicts the first token). Streaming sends the echoed prompt in each
//!   choice's first chunk. This is what lm-evaluation-harness uses for log-likelihoods.
//! - `max_tokens: 0` is allowed with `echo` or `prompt_logprobs`: only the prompt is
//!   computed, `finish_reason` is `length` (not with `n > 1`).
//! - `prompt_logprobs: k` (vLLM): each choice gets `"prompt_logprobs": [null, {...}, ...]`,
//!   one entry per prompt token; entry `i >= 1` maps token ids (as strings) to
//!   `{"logprob", "rank", "decoded_token"}` for the actual token and the `k` most likely
//!   ones. Streaming: in each choice's first chunk.
//!
//! The prompt scores come from the engine's prompt logprobs, the same numbers as
//! `tandem score` and `/v1/score`.

use serde_json::{json, Map, Value};
use tandem_engine::engine::PromptTokenLogprob;
use tandem_model::batch::TokenId;
use tandem_model::tokenizer::Tokenizer;

use super::format::{token_text, ResponseMeta};
use super::sampling::{CommonFields, GenerationPlan};
use super::App;
use crate::echo::EchoPrompt;
use crate::engine_thread::SampleGroup;
use crate::error::{ApiError, ApiResult};

/// What a completion request asks of its prompts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptOptions {
    pub echo: bool,
    /// The request's `logprobs` (alternatives per token).
    pub logprobs: Option<usize>,
    /// The request's `prompt_logprobs`.
    pub prompt_logprobs: Option<usize>,
}

/// What the responder needs to echo and report prompts.
#[derive(Debug, Clone, PartialEq)]
pub struct EchoPlan {
    /// Per choice (prompt by prompt, `n` per prompt): the prompt it echoes.
    pub per_choice: Vec<Option<EchoPrompt>>,
    /// The request's `prompt_logprobs`.
    pub prompt_logprobs: Option<usize>,
}

impl PromptOptions {
    /// Validates `prompt_logprobs` (at most `max_top_logprobs`).
    pub fn new(
        echo: Option<bool>,
        logprobs: Option<usize>,
        prompt_logprobs: Option<u32>,
        max_top_logprobs: usize,
    ) -> ApiResult<Self> {
        let prompt_logprobs = prompt_logprobs.map(|k| k as usize);
        if let Some(k) = prompt_logprobs.filter(|&k| k > max_top_logprobs) {
            return Err(ApiError::field(
                "prompt_logprobs",
                format!("at most {max_top_logprobs} alternatives, got {k}"),
            ));
        }
        Ok(PromptOptions {
            echo: echo.unwrap_or(false),
            logprobs,
            prompt_logprobs,
        })
    }

    /// The generation plan, allowing `max_tokens: 0` when the prompt itself is the answer
    /// (`echo` or `prompt_logprobs`).
    pub fn plan(&self, common: &CommonFields, app: &App) -> ApiResult<GenerationPlan> {
        let zero = common.max_tokens == Some(0);
        if zero && !self.echo && self.prompt_logprobs.is_none() {
            return Err(ApiError::field(
                "max_tokens",
                "must be at least 1 (0 only with echo or prompt_logprobs)",
            ));
        }
        if zero && common.n.is_some_and(|n| n > 1) {
            return Err(ApiError::field("n", "must be 1 when max_tokens is 0"));
        }
        let nonzero;
        let common = if zero {
            nonzero = CommonFields {
                max_tokens: None,
                min_tokens: None,
                ..common.clone()
            };
            &nonzero
        } else {
            common
        };
        let mut plan = GenerationPlan::new(
            common,
            self.logprobs,
            "logprobs",
            &app.limits,
            &app.config.limits,
        )?;
        if zero {
            plan.max_tokens = Some(0);
        }
        Ok(plan)
    }

    /// Alternatives the engine computes per prompt position, `None` when the prompt is not
    /// scored at all. A prompt-only request (`max_tokens` 0) is always scored: that is
    /// what the engine computes for it.
    fn engine_prompt_logprobs(&self, max_tokens: usize) -> Option<usize> {
        let echoed = self.logprobs.filter(|_| self.echo);
        match (echoed, self.prompt_logprobs) {
            (None, None) if max_tokens > 0 => None,
            (a, b) => Some(a.unwrap_or(0).max(b.unwrap_or(0))),
        }
    }

    /// The engine requests: one group per prompt, scoring the prompt when needed.
    pub fn requests(
        &self,
        plan: &GenerationPlan,
        prompts: &[Vec<TokenId>],
        max_tokens: usize,
    ) -> Vec<SampleGroup> {
        let scored = self.engine_prompt_logprobs(max_tokens);
        prompts
            .iter()
            .map(|p| {
                let (mut request, n) = plan.request(p, max_tokens);
                request.prompt_logprobs = scored;
                (request, n)
            })
            .collect()
    }

    /// What to echo per choice, or `None` when neither `echo` nor `prompt_logprobs` is
    /// asked. `prompt` is the request's `prompt` field, `prompts` its ids.
    pub fn echo_plan(
        &self,
        app: &App,
        prompt: &Value,
        prompts: &[Vec<TokenId>],
        n: usize,
    ) -> ApiResult<Option<EchoPlan>> {
        if !self.echo && self.prompt_logprobs.is_none() {
            return Ok(None);
        }
        let mut per_choice = Vec::with_capacity(prompts.len() * n);
        for (i, ids) in prompts.iter().enumerate() {
            let echo = if self.echo {
                let ids: Vec<u32> = ids.iter().map(|t| t.0).collect();
                let text = match prompt_text(prompt, i) {
                    Some(s) => s.to_string(),
                    None => app
                        .prompts
                        .tokenizer()
                        .decode(&ids, false)
                        .map_err(|e| ApiError::field("prompt", e))?,
                };
                let top_k = self.logprobs.unwrap_or(0);
                Some(EchoPrompt { text, ids, top_k })
            } else {
                None
            };
            per_choice.extend(std::iter::repeat_n(echo, n));
        }
        Ok(Some(EchoPlan {
            per_choice,
            prompt_logprobs: self.prompt_logprobs,
        }))
    }
}

/// The text of prompt `i` when the `prompt` field gave it as a string (mirrors the shapes
/// `completions::parse_prompts` accepts).
fn prompt_text(prompt: &Value, i: usize) -> Option<&str> {
    match prompt {
        Value::String(s) if i == 0 => Some(s),
        Value::Array(a) if !a.iter().all(Value::is_u64) => a.get(i)?.as_str(),
        _ => None,
    }
}

impl ResponseMeta {
    /// Adds vLLM's `prompt_logprobs` to a completion choice when the request asked for it:
    /// `[null, {"<id>": {"logprob", "rank", "decoded_token"}, ...}, ...]`, entry `i` for
    /// prompt token `i`, each holding the actual token and the `k` most likely ones.
    pub fn add_prompt_logprobs(
        &self,
        choice: &mut Value,
        tok: &Tokenizer,
        scores: &[PromptTokenLogprob],
    ) {
        let Some(k) = self.prompt_logprobs else {
            return;
        };
        let entries = scores.iter().map(|s| {
            let top = &s.top[..k.min(s.top.len())];
            let mut m = Map::new();
            let entry = |id: u32, logprob: f32, rank: usize| {
                json!({"logprob": logprob, "rank": rank, "decoded_token": token_text(tok, id)})
            };
            m.insert(s.token.0.to_string(), entry(s.token.0, s.logprob, s.rank));
            for &(id, lp) in top {
                // Exact: anything strictly more likely than a top entry is in the top list.
                let rank = 1 + top.iter().filter(|&&(_, l)| l > lp).count();
                m.entry(id.0.to_string()).or_insert_with(|| entry(id.0, lp, rank));
            }
            Value::Object(m)
        });
        let list: Vec<Value> = std::iter::once(Value::Null).chain(entries).collect();
        choice["prompt_logprobs"] = Value::Array(list);
    }
}
