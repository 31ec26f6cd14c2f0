//! `POST /v1/completions`: the prompt as a string, a list of strings, a list of token ids
//! or a list of lists of token ids; choices are ordered prompt by prompt, `n` per prompt.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;
use tandem_model::batch::TokenId;

use super::body::{fields, json_object};
use super::echo::PromptOptions;
use super::format::Endpoint;
use super::sampling::CommonFields;
use super::{beam, off_the_workers, respond, structured, App, ServedModel};
use crate::error::{ApiError, ApiResult};

/// The fields only completions have.
#[derive(Debug, Default, Deserialize)]
struct CompletionFields {
    logprobs: Option<u32>,
    echo: Option<bool>,
    prompt_logprobs: Option<u32>,
    suffix: Option<String>,
    add_special_tokens: Option<bool>,
}

pub async fn completions(State(app): State<App>, body: Result<Bytes, BytesRejection>) -> Response {
    match run(app, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn run(app: App, body: Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    let value = json_object(body, app.config.limits.max_body_bytes)?;
    let common: CommonFields = fields(&value)?;
    let own: CompletionFields = fields(&value)?;
    let ServedModel {
        name: model,
        adapter,
    } = app.check_model(common.model.as_deref())?;
    if own.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::field("suffix", "suffix is not supported"));
    }
    let logprobs = own.logprobs.map(|k| k as usize);
    let bounds = &app.config.limits;
    let options = PromptOptions::new(
        own.echo,
        logprobs,
        own.prompt_logprobs,
        bounds.max_top_logprobs,
    )?;
    let mut plan = options.plan(&common, &app)?;
    plan.limits.adapter = adapter;
    structured::attach(&app, &value, &mut plan).await?;
    let prompt = value
        .get("prompt")
        .ok_or_else(|| ApiError::field("prompt", "is required"))?;
    let prompts = {
        let (app, prompt) = (app.clone(), prompt.clone());
        let add_special = own.add_special_tokens.unwrap_or(true);
        off_the_workers(move || parse_prompts(&app, &prompt, add_special)).await?
    };
    let max_tokens = plan
        .max_tokens
        .unwrap_or(bounds.max_output_tokens.map_or(16, |cap| cap.min(16)));
    if common.use_beam_search == Some(true) {
        beam::check(
            &plan,
            &[
                ("echo", options.echo),
                ("logprobs", logprobs.is_some()),
                ("prompt_logprobs", options.prompt_logprobs.is_some()),
                ("prompt", prompts.len() > 1),
            ],
        )?;
        let req = beam::BeamRequest {
            endpoint: Endpoint::Completions,
            prompt: &prompts[0],
            max_tokens,
            length_penalty: common.length_penalty.unwrap_or(1.0),
            model,
        };
        return beam::run(&app, &plan, req).await;
    }
    let sub = respond::Submission {
        endpoint: Endpoint::Completions,
        prompt_field: "prompt",
        requests: options.requests(&plan, &prompts, max_tokens),
        prompt_tokens: prompts.iter().map(Vec::len).sum(),
        model,
        logprobs,
        echo: options.echo_plan(&app, prompt, &prompts, plan.n)?,
        tools: None,
    };
    respond::run_plan(&app, &plan, sub).await
}

/// The prompts' ids, each non-empty and inside the vocabulary.
fn parse_prompts(app: &App, prompt: &Value, add_special: bool) -> ApiResult<Vec<Vec<TokenId>>> {
    let bad = || {
        ApiError::field(
            "prompt",
            "must be a string, a list of strings, a list of token ids or a list of lists of token ids",
        )
    };
    let items: Vec<&Value> = match prompt {
        Value::String(_) => vec![prompt],
        Value::Array(a) if a.is_empty() => return Err(ApiError::field("prompt", "is empty")),
        Value::Array(a) if a.iter().all(Value::is_u64) => vec![prompt],
        Value::Array(a) => a.iter().collect(),
        _ => return Err(bad()),
    };
    let max_prompts = app.config.limits.max_prompts;
    if items.len() > max_prompts {
        return Err(ApiError::field(
            "prompt",
            format!("at most {max_prompts} prompts, got {}", items.len()),
        ));
    }
    let max_len = app.limits.max_model_len;
    let max_tokens = app.config.limits.prompt_tokens(max_len);
    items
        .into_iter()
        .map(|item| {
            let ids = match item {
                Value::String(s) => app.prompts.text(s, add_special, "prompt")?,
                Value::Array(a) => {
                    let ids: Vec<u32> = a
                        .iter()
                        .map(|v| {
                            v.as_u64()
                                .and_then(|x| u32::try_from(x).ok())
                                .ok_or_else(bad)
                        })
                        .collect::<ApiResult<_>>()?;
                    app.prompts.check_ids(&ids, "prompt")?;
                    ids.into_iter().map(TokenId).collect()
                }
                _ => return Err(bad()),
            };
            if ids.is_empty() {
                return Err(ApiError::field("prompt", "has no tokens"));
            }
            if ids.len() > max_tokens {
                return Err(ApiError::field(
                    "prompt",
                    format!(
                        "has {} tokens, more than the {max_tokens} allowed (maximum model length {max_len})",
                        ids.len()
                    ),
                ));
            }
            Ok(ids)
        })
        .collect()
}
