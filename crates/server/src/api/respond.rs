//! Driving a [`Generation`] into an HTTP response: one JSON body, or server-sent events
//! framed exactly as `data: {json}\n\n` ... `data: [DONE]\n\n`.
//!
//! Both paths consume the same [`crate::generation::ChoiceUpdate`]s. A streamed response
//! owns the generation inside its body; when the client disconnects the body is dropped,
//! and with it the generation, which aborts the engine requests.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use tandem_model::tokenizer::Tokenizer;

use super::echo::EchoPlan;
use super::format::{usage, ChoiceResult, Endpoint, ResponseMeta};
use super::sampling::GenerationPlan;
use super::tools::ToolMode;
use super::App;
use crate::engine_thread::{SampleGroup, SubmitError};
use crate::error::{ApiError, ApiResult};
use crate::generation::{ChoiceUpdate, Generation, TokenInfo};

/// What an endpoint hands over once its request is validated.
#[derive(Debug)]
pub struct Submission {
    pub endpoint: Endpoint,
    /// The request field a refused prompt is reported against (`prompt`, `messages`).
    pub prompt_field: &'static str,
    pub requests: Vec<SampleGroup>,
    pub prompt_tokens: usize,
    pub model: String,
    pub logprobs: Option<usize>,
    /// Echoed prompts and prompt scores (completions only).
    pub echo: Option<EchoPlan>,
    /// Chat with tools: how the text becomes `tool_calls`.
    pub tools: Option<ToolMode>,
}

/// Submits the requests to the engine and answers with one body or an SSE stream: the part
/// the completions and chat endpoints share.
pub async fn run_plan(app: &App, plan: &GenerationPlan, sub: Submission) -> ApiResult<Response> {
    crate::prefill_peer::prefill_remotely(app, &sub.requests, &sub.model).await;
    let (seqs, events) = app
        .engine
        .submit(sub.requests, &plan.text)
        .await
        .map_err(|e| submit_error(e, sub.prompt_field))?;
    let num_choices = seqs.len();
    let tokenizer = app.prompts.tokenizer().clone();
    let mut generation = Generation::new(events, num_choices);
    generation.log_prompt_tokens(sub.prompt_tokens);
    let prompt_logprobs = sub.echo.as_ref().and_then(|e| e.prompt_logprobs);
    if let Some(e) = sub.echo {
        generation = generation.with_echo(e.per_choice);
    }
    let prefix = match sub.endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completions => "cmpl",
    };
    let meta = ResponseMeta {
        endpoint: sub.endpoint,
        id: app.response_id(prefix),
        created: super::unix_time(),
        model: sub.model,
        logprobs: sub.logprobs,
        prompt_logprobs,
        tools: sub.tools,
    };
    Ok(if plan.stream {
        let usage = UsageReport {
            prompt_tokens: sub.prompt_tokens,
            final_chunk: plan.include_usage,
            every_chunk: plan.continuous_usage,
        };
        stream(generation, meta, tokenizer, usage, num_choices)
    } else {
        complete(generation, meta, tokenizer, sub.prompt_tokens, num_choices).await
    })
}

/// The answer to a refused submission: 400 naming the field for a client mistake, 429 for a
/// full queue, 503 when the engine is gone. `prompt_field` names the prompt's field.
pub fn submit_error(e: SubmitError, prompt_field: &str) -> ApiError {
    match e {
        SubmitError::Refused(e) => ApiError::from_engine(&e, prompt_field),
        SubmitError::QueueFull(max) => ApiError::queue_full(max),
        SubmitError::Unavailable => ApiError::unavailable(e.to_string()),
    }
}

/// Runs the generation to the end and answers one JSON body; a choice that failed in the
/// engine makes the whole answer a 500.
pub async fn complete(
    mut generation: Generation,
    meta: ResponseMeta,
    tokenizer: Arc<Tokenizer>,
    prompt_tokens: usize,
    num_choices: usize,
) -> Response {
    let mut choices = vec![ChoiceResult::default(); num_choices];
    while let Some(u) = generation.next().await {
        let c = &mut choices[u.index];
        c.text.push_str(&u.text);
        c.tokens.extend(u.tokens);
        c.prompt.extend(u.prompt);
        if let Some(err) = u
            .finish
            .as_ref()
            .and_then(|f| ApiError::failed("generation failed", f))
        {
            return err.into_response();
        }
        c.finish = u.finish;
    }
    let completion_tokens = generation.num_tokens().iter().sum();
    let body = meta.response(
        &tokenizer,
        &choices,
        usage(prompt_tokens, completion_tokens, generation.cached_tokens()),
    );
    axum::Json(body).into_response()
}

/// Where a stream reports usage (`stream_options`).
#[derive(Debug, Clone, Copy)]
pub struct UsageReport {
    pub prompt_tokens: usize,
    /// A last chunk with no choices and the final usage; `"usage": null` on the others
    /// (`include_usage`).
    pub final_chunk: bool,
    /// The usage so far on every chunk (`continuous_usage_stats`).
    pub every_chunk: bool,
}

/// State of one SSE body.
struct SseState {
    generation: Generation,
    meta: ResponseMeta,
    tokenizer: Arc<Tokenizer>,
    usage: UsageReport,
    /// Frames ready to send, in order.
    queue: std::collections::VecDeque<Bytes>,
    /// Per choice: whether its first chunk went out (chat sends the role first), and the
    /// text offset of its next token (completions logprobs).
    started: Vec<bool>,
    offsets: Vec<usize>,
    /// Per choice, with tools: the text, and the tokens for its logprobs, held back until
    /// its last chunk.
    held: Vec<String>,
    held_tokens: Vec<Vec<TokenInfo>>,
    done: bool,
}

fn frame(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

impl SseState {
    /// Refills the queue; false once everything, `[DONE]` included, has been queued.
    async fn refill(&mut self) -> bool {
        if self.done {
            return false;
        }
        let Some(u) = self.generation.next().await else {
            if self.usage.final_chunk {
                let chunk = self.meta.usage_chunk(self.usage_so_far());
                self.queue.push_back(frame(&chunk));
            }
            self.queue
                .push_back(Bytes::from_static(b"data: [DONE]\n\n"));
            self.done = true;
            return true;
        };
        if let Some(err) = u
            .finish
            .as_ref()
            .and_then(|f| ApiError::failed("generation failed", f))
        {
            self.queue.push_back(frame(&err.body()));
        }
        let role = !self.started[u.index];
        self.started[u.index] = true;
        if self.meta.tools.is_some() {
            self.hold_tool_text(u, role);
            return true;
        }
        let logprobs = self
            .meta
            .logprobs(&self.tokenizer, &u.tokens, &mut self.offsets[u.index]);
        let mut chunk = self
            .meta
            .chunk(u.index, &u.text, logprobs, u.finish.as_ref(), role);
        if role {
            let choice = &mut chunk["choices"][0];
            self.meta
                .add_prompt_logprobs(choice, &self.tokenizer, &u.prompt);
        }
        if self.usage.every_chunk {
            chunk["usage"] = self.usage_so_far();
        } else if self.usage.final_chunk {
            chunk["usage"] = Value::Null;
        }
        self.queue.push_back(frame(&chunk));
        true
    }

    /// With tools, a choice's text is held back and sent in its last chunk (content or
    /// `tool_calls`); before that only the role goes out.
    fn hold_tool_text(&mut self, u: ChoiceUpdate, role: bool) {
        self.held[u.index].push_str(&u.text);
        self.held_tokens[u.index].extend(u.tokens);
        let chunk = if u.finish.is_some() {
            let text = std::mem::take(&mut self.held[u.index]);
            let tokens = std::mem::take(&mut self.held_tokens[u.index]);
            let offset = &mut self.offsets[u.index];
            let logprobs = self.meta.logprobs(&self.tokenizer, &tokens, offset);
            self.meta
                .tool_chunk(u.index, &text, logprobs, u.finish.as_ref())
        } else if role {
            self.meta.chunk(u.index, "", Value::Null, None, true)
        } else {
            return;
        };
        let mut chunk = chunk;
        if self.usage.every_chunk {
            chunk["usage"] = self.usage_so_far();
        } else if self.usage.final_chunk {
            chunk["usage"] = Value::Null;
        }
        self.queue.push_back(frame(&chunk));
    }

    /// The usage object counting the tokens generated so far.
    fn usage_so_far(&self) -> Value {
        let n = self.generation.num_tokens().iter().sum();
        let cached = self.generation.cached_tokens();
        usage(self.usage.prompt_tokens, n, cached)
    }
}

/// Streams the generation as server-sent events.
pub fn stream(
    generation: Generation,
    meta: ResponseMeta,
    tokenizer: Arc<Tokenizer>,
    usage: UsageReport,
    num_choices: usize,
) -> Response {
    let state = SseState {
        generation,
        meta,
        tokenizer,
        usage,
        queue: Default::default(),
        started: vec![false; num_choices],
        offsets: vec![0; num_choices],
        held: vec![String::new(); num_choices],
        held_tokens: vec![Vec::new(); num_choices],
        done: false,
    };
    let body = futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(b) = s.queue.pop_front() {
                return Some((Ok::<Bytes, Infallible>(b), s));
            }
            if !s.refill().await {
                return None;
            }
        }
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}
