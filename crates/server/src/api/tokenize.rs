//! `POST /tokenize` and `POST /detokenize` (vLLM's shapes):
//!
//! - `/tokenize` `{"prompt": str, "add_special_tokens": bool = true}` or
//!   `{"messages": [...], "add_generation_prompt": bool = true, "chat_template_kwargs": {}}` ->
//!   `{"count", "max_model_len", "tokens": [int]}`;
//! - `/detokenize` `{"tokens": [int]}` -> `{"prompt": str}` (special tokens kept);
//! - `GET /tokenizer_info` -> `{"tokenizer_class", "name", "vocab_size",
//!   "model_max_length", "bos_token", "bos_token_id", "eos_token", "eos_token_id",
//!   "eos_token_ids", "add_bos_token", "add_eos_token", "chat_template"}` (absent tokens
//!   and template are `null`; `eos_token_ids` lists every id that ends a generation).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use tandem_model::chat_template::RenderOptions;

use super::body::{fields, json_object};
use super::chat::{to_messages, MessageIn};
use super::{off_the_workers, App};
use crate::error::{ApiError, ApiResult};

#[derive(Debug, Deserialize)]
struct TokenizeFields {
    model: Option<String>,
    prompt: Option<String>,
    messages: Option<Vec<MessageIn>>,
    add_special_tokens: Option<bool>,
    add_generation_prompt: Option<bool>,
    /// As in chat requests: extra template variables.
    chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
}

#[derive(Debug, Deserialize)]
struct DetokenizeFields {
    model: Option<String>,
    tokens: Vec<u32>,
}

pub async fn tokenize(State(app): State<App>, body: Result<Bytes, BytesRejection>) -> Response {
    off_the_workers(move || tokenize_now(&app, body))
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// `/tokenize`, on the blocking pool (see [`off_the_workers`]).
fn tokenize_now(app: &App, body: Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    let f: TokenizeFields = fields(&json_object(body, app.config.limits.max_body_bytes)?)?;
    app.check_model(f.model.as_deref())?;
    let ids = match (f.prompt, f.messages) {
        (Some(p), None) => app
            .prompts
            .text(&p, f.add_special_tokens.unwrap_or(true), "prompt")?,
        (None, Some(m)) => {
            let options = RenderOptions {
                add_generation_prompt: f.add_generation_prompt.unwrap_or(true),
                kwargs: f.chat_template_kwargs.as_ref(),
                ..RenderOptions::default()
            };
            app.prompts.chat(&to_messages(m)?, &options)?
        }
        _ => {
            return Err(ApiError::bad_request(
                "give exactly one of `prompt` or `messages`",
                Some("prompt"),
            ))
        }
    };
    let tokens: Vec<u32> = ids.iter().map(|t| t.0).collect();
    Ok(axum::Json(json!({
        "count": tokens.len(),
        "max_model_len": app.limits.max_model_len,
        "tokens": tokens,
    }))
    .into_response())
}

pub async fn detokenize(State(app): State<App>, body: Result<Bytes, BytesRejection>) -> Response {
    let run = || -> ApiResult<Response> {
        let f: DetokenizeFields = fields(&json_object(body, app.config.limits.max_body_bytes)?)?;
        app.check_model(f.model.as_deref())?;
        app.prompts.check_ids(&f.tokens, "tokens")?;
        let text = app
            .prompts
            .tokenizer()
            .decode(&f.tokens, false)
            .map_err(|e| ApiError::field("tokens", e))?;
        Ok(axum::Json(json!({"prompt": text})).into_response())
    };
    run().unwrap_or_else(IntoResponse::into_response)
}

pub async fn tokenizer_info(State(app): State<App>) -> Response {
    let t = app.prompts.tokenizer();
    let eos_ids = t.eos_ids();
    axum::Json(json!({
        "tokenizer_class": t.description(),
        "name": app.config.served_name(),
        "vocab_size": t.vocab_size(),
        "model_max_length": app.limits.max_model_len,
        "bos_token": t.bos_token(),
        "bos_token_id": t.bos_id(),
        "eos_token": t.eos_token(),
        "eos_token_id": eos_ids.first(),
        "eos_token_ids": eos_ids,
        "add_bos_token": t.add_bos(),
        "add_eos_token": t.add_eos(),
        "chat_template": app.prompts.template_source(),
    }))
    .into_response()
}
