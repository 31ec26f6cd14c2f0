//! `POST /v1/chat/completions`: the conversation goes through the model's chat template
//! with the generation prompt; `max_completion_tokens` (or `max_tokens`) defaults to the
//! rest of the context.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;
use tandem_model::batch::TokenId;
use tandem_model::chat_template::{ChatMessage, RenderOptions};

use super::body::{fields, json_object};
use super::format::Endpoint;
use super::sampling::{CommonFields, GenerationPlan};
use super::{beam, off_the_workers, respond, structured, tools, App, ServedModel};
use crate::error::{ApiError, ApiResult};
use crate::limits::RequestLimits;

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
    /// An assistant message's calls (chat with tools).
    pub tool_calls: Option<Value>,
    /// A `tool` message's answer to this call.
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
}

/// The fields only chat has.
#[derive(Debug, Deserialize)]
struct ChatFields {
    messages: Option<Vec<MessageIn>>,
    max_completion_tokens: Option<u64>,
    logprobs: Option<bool>,
    top_logprobs: Option<u32>,
    add_generation_prompt: Option<bool>,
    tools: Option<Value>,
    tool_choice: Option<Value>,
    /// Accepted: a model may make several calls in one answer either way.
    #[allow(dead_code)]
    parallel_tool_calls: Option<bool>,
    /// Extra variables for the chat template (e.g. Qwen3's `enable_thinking`), as in vLLM;
    /// none may replace the template's own inputs or functions.
    chat_template_kwargs: Option<serde_json::Map<String, Value>>,
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

/// The request's tool mode; `required` and a named function constrain the output (not
/// together with another structured output constraint).
async fn attach_tools(
    app: &App,
    own: &ChatFields,
    plan: &mut GenerationPlan,
) -> ApiResult<Option<tools::ToolMode>> {
    let mode = tools::mode(own.tools.as_ref(), own.tool_choice.as_ref())?;
    let spec = match (&mode, &own.tools) {
        (Some(m), Some(list)) => tools::constraint(list, m),
        _ => None,
    };
    if let Some(spec) = spec {
        if plan.sampling.constraint.is_some() {
            return Err(ApiError::field(
                "tool_choice",
                "cannot be combined with a structured output constraint",
            ));
        }
        structured::compile_into(app, "tools", spec, plan).await?;
    }
    Ok(mode)
}

/// The conversation's ids: through [`PromptBuilder::chat`] for plain messages, or as JSON
/// with the tools (and their calls and results in the history) for the template's `tools`
/// variable; a template that never mentions tools gets them as a first system message.
fn chat_prompt(
    app: &App,
    messages: Option<Vec<MessageIn>>,
    options: &RenderOptions<'_>,
) -> ApiResult<Vec<TokenId>> {
    let messages = messages.ok_or_else(|| ApiError::field("messages", "is required"))?;
    let tool_list = options.tools;
    let with_tools = tool_list.is_some()
        || messages
            .iter()
            .any(|m| m.tool_calls.is_some() || m.role == "tool");
    if !with_tools {
        return app.prompts.chat(&to_messages(messages)?, options);
    }
    let extra: Vec<_> = messages
        .iter()
        .map(|m| (m.tool_calls.clone(), m.tool_call_id.clone(), m.name.clone()))
        .collect();
    let plain = to_messages(messages)?;
    let mut json_messages: Vec<Value> = plain
        .iter()
        .zip(extra)
        .map(|(m, (calls, id, name))| {
            let mut v = serde_json::json!({"role": m.role, "content": m.content});
            for (k, x) in [
                ("tool_calls", calls),
                ("tool_call_id", id.map(Value::from)),
                ("name", name.map(Value::from)),
            ] {
                if let Some(x) = x {
                    v[k] = x;
                }
            }
            v
        })
        .collect();
    let template_knows_tools = app
        .prompts
        .template_source()
        .is_some_and(|s| s.contains("tools"));
    if let (Some(list), false) = (tool_list, template_knows_tools) {
        let system = serde_json::json!({"role": "system", "content": tools::system_prompt(list)});
        json_messages.insert(0, system);
    }
    app.prompts.chat_json(&Value::Array(json_messages), options)
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
    let common: CommonFields = fields(&value)?;
    let own: ChatFields = fields(&value)?;
    // `max_completion_tokens` stands in for `max_tokens`: a refusal names the field sent.
    let sent = if own.max_completion_tokens.is_some() {
        "max_completion_tokens"
    } else {
        "max_tokens"
    };
    let answer = answer(app, value, common, own).await;
    answer.map_err(|e| e.renamed("max_tokens", sent))
}

/// [`run`] once the request's fields are read.
async fn answer(
    app: App,
    value: Value,
    mut common: CommonFields,
    own: ChatFields,
) -> ApiResult<Response> {
    let ServedModel {
        name: model,
        adapter,
    } = app.check_model(common.model.as_deref())?;
    let bounds = &app.config.limits;
    apply_max_completion_tokens(&own, &mut common, bounds)?;
    let logprobs = top_logprobs(&own)?;
    let limits = &app.limits;
    let mut plan = GenerationPlan::new(&common, logprobs, "top_logprobs", limits, bounds)?;
    plan.limits.adapter = adapter;
    structured::attach(&app, &value, &mut plan).await?;
    let tool_mode = attach_tools(&app, &own, &mut plan).await?;
    let beam_search = common.use_beam_search == Some(true);
    if beam_search {
        let tools = tool_mode.is_some();
        beam::check(&plan, &[("logprobs", logprobs.is_some()), ("tools", tools)])?;
    }
    let prompt = {
        let app = app.clone();
        let (tools, kwargs) = (own.tools.clone(), own.chat_template_kwargs.clone());
        let add_generation_prompt = own.add_generation_prompt.unwrap_or(true);
        let messages = own.messages;
        off_the_workers(move || {
            let options = RenderOptions {
                tools: tools.as_ref(),
                add_generation_prompt,
                kwargs: kwargs.as_ref(),
            };
            chat_prompt(&app, messages, &options)
        })
        .await?
    };
    check_prompt_length(&prompt, bounds, limits.max_model_len)?;
    let room = limits.max_model_len - prompt.len();
    let default_max = bounds.max_output_tokens.map_or(room, |cap| cap.min(room));
    let max_tokens = plan.max_tokens.unwrap_or(default_max);
    if beam_search {
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
        tools: tool_mode,
    };
    respond::run_plan(&app, &plan, sub).await
}

/// `max_completion_tokens` (OpenAI's newer name) overrides `max_tokens`, within the bound.
fn apply_max_completion_tokens(
    own: &ChatFields,
    common: &mut CommonFields,
    bounds: &RequestLimits,
) -> ApiResult<()> {
    if let Some(m) = own.max_completion_tokens {
        if let Some(cap) = bounds.max_output_tokens.filter(|&cap| m > cap as u64) {
            return Err(ApiError::field(
                "max_completion_tokens",
                format!("must be at most {cap}, got {m}"),
            ));
        }
        common.max_tokens = Some(m);
    }
    Ok(())
}

/// Refuses a rendered conversation that is empty or longer than the prompt bound.
fn check_prompt_length(
    prompt: &[TokenId],
    bounds: &RequestLimits,
    max_model_len: usize,
) -> ApiResult<()> {
    if prompt.is_empty() {
        return Err(ApiError::field(
            "messages",
            "the rendered conversation has no tokens",
        ));
    }
    let max_prompt = bounds.prompt_tokens(max_model_len);
    if prompt.len() > max_prompt {
        return Err(ApiError::field(
            "messages",
            format!(
                "the conversation has {} tokens, more than the {max_prompt} allowed (maximum model length {max_model_len})",
                prompt.len(),
            ),
        ));
    }
    Ok(())
}
