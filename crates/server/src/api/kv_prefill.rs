//! `POST /v1/kv/prefill`, served with `ServerConfig::kv_producer`: the prefill side of
//! disaggregated serving (ARCHITECTURE.md § KV transfer).
//!
//! The body names a prompt by its token ids, as the decode instance tokenized it:
//! `{"model", "prompt_token_ids", "cache_salt", "skip_blocks"}` (`model` picks a LoRA
//! adapter as on every route; the first `skip_blocks` blocks, which the caller holds, are
//! not sent). The prompt runs as a one-token generation, batched with whatever else this
//! instance computes; then the prefix cache's blocks of the prompt are answered as
//! `application/octet-stream` in the wire form of `tandem_engine::kv_transfer` (every full
//! block, unless one was evicted in between: then the run before it). Bad input is a 400 as
//! on every route.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tandem_engine::engine::GenerationRequest;
use tandem_engine::sampler::SamplingParams;
use tandem_engine::{EngineError, RequestParams};
use tandem_model::batch::TokenId;
use tandem_text::{RequestOutput, TextOptions};

use super::body::{fields, json_object};
use super::respond::submit_error;
use super::App;
use crate::engine_thread::PromptKey;
use crate::error::{ApiError, ApiResult};

#[derive(Debug, Deserialize)]
struct PrefillBody {
    model: Option<String>,
    prompt_token_ids: Option<Vec<u32>>,
    cache_salt: Option<String>,
    /// Leading blocks the caller holds already: the answer starts after them.
    #[serde(default)]
    skip_blocks: u32,
}

/// Computes the prompt and answers its KV blocks.
pub async fn prefill(
    State(app): State<App>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let value = json_object(body, app.config.limits.max_body_bytes)?;
    let body: PrefillBody = fields(&value)?;
    let served = app.check_model(body.model.as_deref())?;
    let Some(ids) = body.prompt_token_ids.filter(|ids| !ids.is_empty()) else {
        let why = "give the prompt as a non-empty list of token ids";
        return Err(ApiError::field("prompt_token_ids", why));
    };
    let key = PromptKey {
        prompt: ids.into_iter().map(TokenId).collect(),
        cache_salt: body.cache_salt,
        adapter: served.adapter,
    };
    compute(&app, &key).await?;
    let payload = app
        .engine
        .export_prefix(key, body.skip_blocks)
        .await
        .map_err(|e| submit_error(e, "prompt_token_ids"))?
        .map_err(|e| match e {
            EngineError::InvalidConfig(m) => ApiError::unavailable(m),
            other => ApiError::internal(other.to_string()),
        })?;
    let blocks = payload.num_blocks();
    let bytes = payload.into_bytes();
    app.kv_transfer.on_sent(blocks, bytes.len());
    let octets = [(header::CONTENT_TYPE, "application/octet-stream")];
    Ok((octets, bytes).into_response())
}

/// Runs `key`'s prompt as a one-token generation and waits for its end.
async fn compute(app: &App, key: &PromptKey) -> ApiResult<()> {
    let request = GenerationRequest {
        prompt: key.prompt.clone(),
        sampling: SamplingParams::greedy(),
        limits: RequestParams {
            max_tokens: 1,
            ignore_eos: true,
            cache_salt: key.cache_salt.clone(),
            adapter: key.adapter,
            ..RequestParams::default()
        },
        sample_index: 0,
        prompt_logprobs: None,
        prompt_logprobs_start: 1,
    };
    let (_, mut events) = app
        .engine
        .submit(vec![(request, 1)], &TextOptions::default())
        .await
        .map_err(|e| submit_error(e, "prompt_token_ids"))?;
    while let Some(e) = events.recv().await {
        let RequestOutput::Delta(d) = e.event else {
            continue;
        };
        if let Some(f) = d.finish {
            return match ApiError::failed("prefill failed", &f) {
                Some(err) => Err(err),
                None => Ok(()),
            };
        }
    }
    Err(ApiError::unavailable(
        "the engine stopped during the prefill",
    ))
}
