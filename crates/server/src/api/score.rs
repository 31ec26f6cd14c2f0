//! `POST /v1/score` (tandem's own): the teacher-forced forward pass over HTTP — the
//! log-probability of every token of known text, with ranks, alternatives, sums and
//! perplexity; the same numbers as `tandem score`.
//!
//! **Request** (a JSON object), either
//! - `input`: a string, a list of token ids, or a list of items each a string or a list of
//!   token ids (one scored sequence per item), or
//! - `context` (a string or token ids) and `continuations` (a non-empty list of strings or
//!   token-id lists): each continuation is scored after the context. The context and each
//!   continuation are tokenized separately and their ids concatenated (as
//!   lm-evaluation-harness does), and only the continuation's tokens are reported;
//!
//! plus optional `top_logprobs` (alternatives per position, default 0, at most 20),
//! `add_special_tokens` (default true: text inputs and the context get the model's special
//! tokens — BOS when its metadata asks for it — like `tandem score`; continuations never
//! do), `cache_salt` (as in generation requests: cached prefixes are shared only between
//! requests of the same salt) and `model`. Refused with 400: no or both input forms, an item
//! without tokens, more items than the server's `max_score_items`, an item longer than the
//! maximum model length (the message names both lengths), token ids outside the vocabulary,
//! `top_logprobs` over its bound, an empty or overlong `cache_salt`.
//!
//! **Response**:
//! ```json
//! {"id": "score-...", "object": "score", "created": 1700000000, "model": "m",
//!  "data": [{"index": 0, "tokens": [504, 3575], "token_texts": ["The", " capital"],
//!            "token_logprobs": [null, -7.21], "ranks": [null, 12],
//!            "num_tokens": 2, "num_scored": 1, "sum_logprob": -7.21,
//!            "mean_logprob": -7.21, "perplexity": 1352.9, "greedy": false}],
//!  "usage": {"prompt_tokens": 2, "completion_tokens": 0, "total_tokens": 2}}
//! ```
//! `token_logprobs[i]` is `log p(tokens[i] | everything before it)` in nats; `null` for the
//! first token of an `input` (nothing predicts it; with a BOS, the BOS is that token).
//! `ranks[i]` is 1 + the number of vocabulary entries strictly more likely. With
//! `top_logprobs: k > 0` each item also has `"top_logprobs"`: per position `null` or a list
//! of `{"id", "token", "logprob"}`, most likely first. For `context` + `continuations`, item
//! `i` is continuation `i`: `tokens` are its tokens only (all scored) and
//! `"context_tokens"` gives the context's length. `mean_logprob` and `perplexity`
//! (`exp(-mean)`) are `null` when nothing was scored; `greedy` is true when every scored
//! token has rank 1 (lm-evaluation-harness's `is_greedy`). `usage.prompt_tokens` counts
//! every token computed.
//!
//! Every item runs through the engine as a prompt-only request (`max_tokens: 0` with prompt
//! logprobs), so scoring batches with generation; a client that disconnects aborts them.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};
use tandem_engine::engine::{GenerationRequest, PromptTokenLogprob};
use tandem_engine::sampler::SamplingParams;
use tandem_engine::RequestParams;
use tandem_model::batch::{AdapterId, TokenId};

use super::body::{fields, json_object};
use super::sampling::check_cache_salt;
use super::score_format::{item_json, ScoredItem};
use super::{off_the_workers, App, ServedModel};
use crate::engine_thread::GroupEvent;
use crate::error::{ApiError, ApiResult};
use tandem_text::{Finish, RequestOutput, TextOptions};
use tokio::sync::mpsc::UnboundedReceiver;

/// The fields of a score request (unknown fields are ignored).
#[derive(Debug, Default, Deserialize)]
struct ScoreFields {
    model: Option<String>,
    input: Option<Value>,
    context: Option<Value>,
    continuations: Option<Value>,
    top_logprobs: Option<u32>,
    add_special_tokens: Option<bool>,
    /// As in generation requests: only requests with the same salt share cached prefixes.
    cache_salt: Option<String>,
}

/// One sequence to score: its tokens, and how many leading ones are context (not reported).
#[derive(Debug, Clone, PartialEq)]
struct Item {
    tokens: Vec<TokenId>,
    context: usize,
}

impl Item {
    /// The first prompt index the engine scores: 1 (index 0 has no score), or the
    /// context's length when there is a context.
    fn first_scored(&self) -> usize {
        self.context.max(1)
    }
}

pub async fn score(State(app): State<App>, body: Result<Bytes, BytesRejection>) -> Response {
    match run(app, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn run(app: App, body: Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    let value = json_object(body, app.config.limits.max_body_bytes)?;
    let f: ScoreFields = fields(&value)?;
    let ServedModel {
        name: model,
        adapter,
    } = app.check_model(f.model.as_deref())?;
    let top_k = f.top_logprobs.unwrap_or(0) as usize;
    let max_k = app.config.limits.max_top_logprobs;
    if top_k > max_k {
        return Err(ApiError::field(
            "top_logprobs",
            format!("at most {max_k} alternatives, got {top_k}"),
        ));
    }
    check_cache_salt(f.cache_salt.as_deref())?;
    let salt = f.cache_salt.clone();
    let items = {
        let app = app.clone();
        off_the_workers(move || parse_items(&app, &f)).await?
    };
    let scores = run_items(&app, &items, top_k, (salt.as_deref(), adapter)).await?;
    let data: Vec<Value> = items
        .iter()
        .zip(scores)
        .enumerate()
        .map(|(index, (item, scores))| {
            let scored = ScoredItem {
                tokens: &item.tokens,
                context: item.context,
                first: item.first_scored(),
                scores: &scores,
                top_k,
            };
            item_json(app.prompts.tokenizer(), index, &scored)
        })
        .collect();
    let total: usize = items.iter().map(|i| i.tokens.len()).sum();
    let body = json!({
        "id": app.response_id("score"),
        "object": "score",
        "created": super::unix_time(),
        "model": model,
        "data": data,
        "usage": {"prompt_tokens": total, "completion_tokens": 0, "total_tokens": total},
    });
    Ok(axum::Json(body).into_response())
}

/// The sequences to score, validated.
fn parse_items(app: &App, f: &ScoreFields) -> ApiResult<Vec<Item>> {
    let add_special = f.add_special_tokens.unwrap_or(true);
    let items = match (&f.input, &f.context, &f.continuations) {
        (Some(input), None, None) => list(input, "input")?
            .into_iter()
            .map(|v| {
                let tokens = tokens(app, v, add_special, "input")?;
                Ok(Item { tokens, context: 0 })
            })
            .collect::<ApiResult<Vec<Item>>>()?,
        (None, Some(context), Some(continuations)) => {
            let ctx = tokens(app, context, add_special, "context")?;
            let conts = match continuations {
                Value::Array(a) if !a.is_empty() && !a.iter().all(Value::is_u64) => {
                    a.iter().collect()
                }
                _ => {
                    return Err(ApiError::field(
                        "continuations",
                        "must be a non-empty list of strings or lists of token ids",
                    ))
                }
            };
            continuation_items(app, &ctx, conts)?
        }
        _ => {
            return Err(ApiError::bad_request(
                "give either `input`, or `context` with `continuations`",
                Some("input"),
            ))
        }
    };
    check_items(
        app,
        &items,
        if f.input.is_some() {
            "input"
        } else {
            "continuations"
        },
    )?;
    Ok(items)
}

/// The context followed by each continuation (tokenized without special tokens).
fn continuation_items(app: &App, ctx: &[TokenId], conts: Vec<&Value>) -> ApiResult<Vec<Item>> {
    conts
        .into_iter()
        .map(|v| {
            let cont = tokens(app, v, false, "continuations")?;
            if cont.is_empty() {
                return Err(ApiError::field(
                    "continuations",
                    "a continuation has no tokens",
                ));
            }
            let mut tokens = ctx.to_vec();
            tokens.extend(cont);
            Ok(Item {
                tokens,
                context: ctx.len(),
            })
        })
        .collect()
}

/// The items of `input`: one string or id list, or a list of them.
fn list<'v>(v: &'v Value, param: &str) -> ApiResult<Vec<&'v Value>> {
    match v {
        Value::String(_) => Ok(vec![v]),
        Value::Array(a) if a.is_empty() => Err(ApiError::field(param, "is empty")),
        Value::Array(a) if a.iter().all(Value::is_u64) => Ok(vec![v]),
        Value::Array(a) => Ok(a.iter().collect()),
        _ => Err(shape_error(param)),
    }
}

fn shape_error(param: &str) -> ApiError {
    ApiError::field(
        param,
        "must be a string, a list of token ids, or a list of strings or lists of token ids",
    )
}

/// The ids of one string or id list (ids checked against the vocabulary).
fn tokens(app: &App, v: &Value, add_special: bool, param: &str) -> ApiResult<Vec<TokenId>> {
    match v {
        Value::String(s) => app.prompts.text(s, add_special, param),
        Value::Array(a) => {
            let ids: Vec<u32> = a
                .iter()
                .map(|x| {
                    x.as_u64()
                        .and_then(|x| u32::try_from(x).ok())
                        .ok_or_else(|| shape_error(param))
                })
                .collect::<ApiResult<_>>()?;
            app.prompts.check_ids(&ids, param)?;
            Ok(ids.into_iter().map(TokenId).collect())
        }
        _ => Err(shape_error(param)),
    }
}

/// Refuses too many items, empty ones and ones longer than the model's context.
fn check_items(app: &App, items: &[Item], param: &str) -> ApiResult<()> {
    let max_items = app.config.limits.max_score_items;
    if items.len() > max_items {
        return Err(ApiError::field(
            param,
            format!("at most {max_items} items, got {}", items.len()),
        ));
    }
    let max_len = app.limits.max_model_len;
    let max_prompt = app.config.limits.max_prompt_tokens.unwrap_or(max_len);
    for (i, item) in items.iter().enumerate() {
        if item.tokens.is_empty() {
            return Err(ApiError::field(param, format!("item {i} has no tokens")));
        }
        if item.tokens.len() > max_len {
            return Err(ApiError::field(
                param,
                format!(
                    "item {i} has {} tokens, more than the maximum model length of {max_len}",
                    item.tokens.len()
                ),
            ));
        }
        if item.tokens.len() > max_prompt {
            return Err(ApiError::field(
                param,
                format!(
                    "item {i} has {} tokens, more than the {max_prompt} allowed by the server",
                    item.tokens.len()
                ),
            ));
        }
    }
    Ok(())
}

/// Runs every item as a prompt-only engine request (sharing cached prefixes only with
/// requests of the same `cache_salt`); returns each item's prompt scores (prompt indices
/// `1..`).
async fn run_items(
    app: &App,
    items: &[Item],
    top_k: usize,
    (cache_salt, adapter): (Option<&str>, Option<AdapterId>),
) -> ApiResult<Vec<Vec<PromptTokenLogprob>>> {
    let requests = items
        .iter()
        .map(|item| {
            let request = GenerationRequest {
                prompt: item.tokens.clone(),
                sampling: SamplingParams::greedy(),
                limits: RequestParams {
                    max_tokens: 0,
                    cache_salt: cache_salt.map(str::to_string),
                    adapter,
                    ..RequestParams::default()
                },
                sample_index: 0,
                prompt_logprobs: Some(top_k),
                // A context's own positions are not reported: with the prefix cache they
                // then cost nothing (see `GenerationRequest::prompt_logprobs_start`).
                prompt_logprobs_start: item.first_scored(),
            };
            (request, 1)
        })
        .collect();
    let (_, mut events) = app
        .engine
        .submit(requests, &TextOptions::default())
        .await
        .map_err(|e| super::respond::submit_error(e, "input"))?;
    let scores = collect_scores(&mut events, items.len()).await?;
    for (i, (s, item)) in scores.iter().zip(items).enumerate() {
        let want = item.tokens.len() - item.first_scored();
        if s.len() != want {
            return Err(ApiError::internal(format!(
                "item {i}: {} of {want} positions were scored",
                s.len(),
            )));
        }
    }
    Ok(scores)
}

/// The prompt scores of the `num_items` prompt-only requests, from their outputs until all
/// finished.
async fn collect_scores(
    events: &mut UnboundedReceiver<GroupEvent>,
    num_items: usize,
) -> ApiResult<Vec<Vec<PromptTokenLogprob>>> {
    let mut scores: Vec<Vec<PromptTokenLogprob>> = vec![Vec::new(); num_items];
    let mut open = num_items;
    while open > 0 {
        let Some(GroupEvent { index, event }) = events.recv().await else {
            return Err(ApiError::unavailable("the engine stopped"));
        };
        match event {
            // The output processor checked that the scores continue from the item's
            // `prompt_logprobs_start`.
            RequestOutput::Delta(delta) => {
                scores[index].extend(delta.prompt_logprobs);
                let what = format!("item {index} failed");
                if let Some(err) = delta
                    .finish
                    .as_ref()
                    .and_then(|f| ApiError::failed(&what, f))
                {
                    return Err(err);
                }
                match delta.finish {
                    Some(Finish::Length) => open -= 1,
                    Some(_) => return Err(ApiError::unavailable("the request was aborted")),
                    None => {}
                }
            }
            RequestOutput::Admitted { .. } => {}
        }
    }
    Ok(scores)
}
