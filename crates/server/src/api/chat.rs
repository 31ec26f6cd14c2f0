//! `POST /v1/chat/completions`: the conversation goes through the model's chat template
//! with the generation prompt; `max_completion_tokens` (or `max_tokens`) defaults to the
//! rest of the context.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tandem_model::chat_template::ChatMessage;

use super::body::{fields, json_object};
use super::format::Endpoint;
use super::sampling::{CommonFields, GenerationPlan};
use super::{beam, respond, structured, App};
use crate::error::{ApiError, ApiResult};

/// Most messages in one conversation.
pub const MAX_MESSAGES: usize = 1024;

/// A message's content: a string, or a list of parts of which only text is supported.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct MessageIn {
    pub role: String,
    pub content: Option<Content>,
}

/// The fields only chat has.
#[derive(Debug, Deserialize)]
struct ChatFields {
    messages: Option<Vec<MessageIn>>,
    max_completion_tokens: Option<u64>,
    logprobs: Option<bool>,
    top_logprobs: Option<u32>,
    add_generation_prompt: Option<bool>,
}

pub async fn chat_completions(
    State(app): State<App>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match run(app, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// The conversation as the chat template sees it.
pub fn to_messages(messages: Vec<MessageIn>) -> ApiResult<Vec<ChatMessage>> {
    if messages.is_empty() {
        return Err(ApiError::field("messages", "must not be empty"));
    }
    if messages.len() > MAX_MESSAGES {
        return Err(ApiError::field(
            "messages",
            format!("at most {MAX_MESSAGES} messages, got {}", messages.len()),
        ));
    }
    messages
        .into_iter()
        .map(|m| {
            let content = match m.content {
                None => String::new(),
                Some(Content::Text(t)) => t,
                Some(Content::Parts(parts)) => parts
                    .into_iter()
                    .map(|p| match (p.kind.as_str(), p.text) {
                        ("text", Some(t)) => Ok(t),
                        (kind, _) => Err(ApiError::field(
                            "messages",
                            format!("content part of type `{kind}` is not supported (only text)"),
                        )),
                    })
                    .collect::<ApiResult<Vec<_>>>()?
                    .join("\n"),
            };
            Ok(ChatMessage::new(m.role, content))
        })
        .collect()
}

/// `top_logprobs` (bounded by the plan) when `logprobs` is set.
fn top_logprobs(own: &ChatFields) -> ApiResult<Option<usize>> {
    match (own.logprobs.unwrap_or(false), own.top_logprobs) {
        (false, Some(k)) if k > 0 => Err(ApiError::field(
            "top_logprobs",
            "requires logprobs to be true",
        )),
        (true, k) => Ok(Some(k.unwrap_or(0) as usize)),
        (false, _) => Ok(None),
    }
}

async fn run(app: App, body: Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    let value = json_object(body, app.config.limits.max_body_bytes)?;
    let mut common: CommonFields = fields(&value)?;
    let own: ChatFields = fields(&value)?;
    let model = app.check_model(common.model.as_deref())?;
    let bounds = &app.config.limits;
    if let Some(m) = own.max_completion_tokens {
        if let Some(cap) = bounds.max_output_tokens.filter(|&cap| m > cap as u64) {
            return Err(ApiError::field(
                "max_completion_tokens",
                format!("must be at most {cap}, got {m}"),
            ));
        }
        common.max_tokens = Some(m);
    }
    let logprobs = top_logprobs(&own)?;
    let limits = &app.limits;
    let mut plan = GenerationPlan::new(&common, logprobs, "top_logprobs", limits, bounds)?;
    let beam = common.use_beam_search == Some(true);
    structured::attach(&app, &value, beam, &mut plan).await?;
    let messages = own
        .messages
        .ok_or_else(|| ApiError::field("messages", "is required"))?;
    let messages = to_messages(messages)?;
    let prompt = app
        .prompts
        .chat(&messages, own.add_generation_prompt.unwrap_or(true))?;
    if prompt.is_empty() {
        return Err(ApiError::field(
            "messages",
            "the rendered conversation has no tokens",
        ));
    }
    let max_prompt = bounds.prompt_tokens(limits.max_model_len);
    if prompt.len() > max_prompt {
        return Err(ApiError::field(
            "messages",
            format!(
                "the conversation has {} tokens, more than the {max_prompt} allowed (maximum model length {})",
                prompt.len(),
                limits.max_model_len
            ),
        ));
    }
    let room = limits.max_model_len - prompt.len();
    let default_max = bounds.max_output_tokens.map_or(room, |cap| cap.min(room));
    let max_tokens = plan.max_tokens.unwrap_or(default_max);
    if common.use_beam_search == Some(true) {
        beam::check(&plan, &[("logprobs", logprobs.is_some())])?;
        let req = beam::BeamRequest {
            endpoint: Endpoint::Chat,
            prompt: &prompt,
            max_tokens,
            length_penalty: common.length_penalty.unwrap_or(1.0),
            model,
        };
        return beam::run(&app, &plan, req).await;
    }
    let sub = respond::Submission {
        endpoint: Endpoint::Chat,
        prompt_field: "messages",
        requests: vec![plan.request(&prompt, max_tokens)],
        prompt_tokens: prompt.len(),
        model,
        logprobs,
        echo: None,
    };
    respond::run_plan(&app, &plan, sub).await
}
