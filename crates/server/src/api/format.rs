//! The JSON shapes of completion and chat responses, streamed chunks and logprobs.

use serde_json::{json, Map, Value};
use tandem_engine::engine::PromptTokenLogprob;
use tandem_model::tokenizer::Tokenizer;

use super::tools::{self, ToolMode};
use crate::generation::{Finish, TokenInfo};

/// Which endpoint's shapes to produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    Chat,
}

/// Fixed parts of every response body of one request.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
    /// Alternatives per token when logprobs were asked for.
    pub logprobs: Option<usize>,
    /// vLLM's `prompt_logprobs` when asked for (completions; see `api/echo.rs`).
    pub prompt_logprobs: Option<usize>,
    /// Chat with tools: how the answer's text becomes `tool_calls` (see `api/tools.rs`).
    pub tools: Option<ToolMode>,
}

/// One choice, complete (non-streaming).
#[derive(Debug, Clone, Default)]
pub struct ChoiceResult {
    pub text: String,
    pub tokens: Vec<TokenInfo>,
    pub finish: Option<Finish>,
    /// Scores of prompt indices `1..` (when asked for).
    pub prompt: Vec<PromptTokenLogprob>,
}

/// A token's text: its bytes, lossily decoded (a token may hold part of a character).
pub(super) fn token_text(tok: &Tokenizer, id: u32) -> String {
    tok.token_bytes(id)
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_default()
}

fn token_bytes(tok: &Tokenizer, id: u32) -> Vec<u8> {
    tok.token_bytes(id).map(<[u8]>::to_vec).unwrap_or_default()
}

impl ResponseMeta {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
        }
    }

    fn envelope(&self, chunk: bool, choices: Vec<Value>) -> Value {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }

    /// The logprobs object for `tokens`; `text_offset` is where the first token's text
    /// starts in the choice's text (completions only), advanced past the tokens.
    pub fn logprobs(
        &self,
        tok: &Tokenizer,
        tokens: &[TokenInfo],
        text_offset: &mut usize,
    ) -> Value {
        if self.logprobs.is_none() {
            return Value::Null;
        }
        match self.endpoint {
            Endpoint::Completions => legacy_logprobs(tok, tokens, text_offset),
            Endpoint::Chat => json!({"content": tokens.iter().map(|t| {
                let top: Vec<Value> = t.top.iter().map(|&(id, lp)| json!({
                    "token": token_text(tok, id), "logprob": lp, "bytes": token_bytes(tok, id),
                })).collect();
                json!({"token": token_text(tok, t.id), "logprob": t.logprob,
                       "bytes": token_bytes(tok, t.id), "top_logprobs": top})
            }).collect::<Vec<_>>()}),
        }
    }

    /// A complete response.
    pub fn response(&self, tok: &Tokenizer, choices: &[ChoiceResult], usage: Value) -> Value {
        let choices = choices
            .iter()
            .enumerate()
            .map(|(index, c)| {
                let logprobs = self.logprobs(tok, &c.tokens, &mut 0);
                let finish = c.finish.as_ref().map(Finish::as_str);
                match self.endpoint {
                    Endpoint::Completions => {
                        let mut choice = json!({"index": index, "text": c.text,
                            "logprobs": logprobs, "finish_reason": finish});
                        self.add_prompt_logprobs(&mut choice, tok, &c.prompt);
                        choice
                    }
                    Endpoint::Chat => {
                        let (message, finish) = self.message(&c.text, finish);
                        json!({"index": index, "message": message,
                               "logprobs": logprobs, "finish_reason": finish})
                    }
                }
            })
            .collect();
        let mut v = self.envelope(false, choices);
        v["usage"] = usage;
        v
    }

    /// A streamed chunk for one choice. `role` adds the chat role (first chunk).
    pub fn chunk(
        &self,
        index: usize,
        text: &str,
        logprobs: Value,
        finish: Option<&Finish>,
        role: bool,
    ) -> Value {
        let finish = finish.map(Finish::as_str);
        let choice = match self.endpoint {
            Endpoint::Completions => json!({"index": index, "text": text,
                "logprobs": logprobs, "finish_reason": finish}),
            Endpoint::Chat => {
                let mut delta = Map::new();
                if role {
                    delta.insert("role".into(), json!("assistant"));
                }
                if role || !text.is_empty() {
                    delta.insert("content".into(), json!(text));
                }
                json!({"index": index, "delta": delta, "logprobs": logprobs,
                       "finish_reason": finish})
            }
        };
        self.envelope(true, vec![choice])
    }

    /// A chat answer's message and finish reason: its text, or with tools the calls parsed
    /// out of it.
    fn message<'a>(&self, text: &str, finish: Option<&'a str>) -> (Value, Option<&'a str>) {
        let Some(mode) = &self.tools else {
            return (json!({"role": "assistant", "content": text}), finish);
        };
        let answer = tools::parse(text, mode);
        let mut message = json!({"role": "assistant", "content": answer.content});
        if !answer.calls.is_empty() {
            message["tool_calls"] = tools::calls_json(&answer, &self.id, false);
        }
        let finish = finish.map(|f| tools::finish_reason(&answer, mode, f));
        (message, finish)
    }

    /// The last streamed chunk of a chat choice with tools: the held-back text as content
    /// or as `tool_calls` fragments (one per call, whole), with its tokens' `logprobs` and
    /// the finish reason.
    pub fn tool_chunk(
        &self,
        index: usize,
        text: &str,
        logprobs: Value,
        finish: Option<&Finish>,
    ) -> Value {
        let (message, finish) = self.message(text, finish.map(Finish::as_str));
        let mut delta = Map::new();
        if let Some(c) = message.get("content").filter(|c| !c.is_null()) {
            delta.insert("content".into(), c.clone());
        }
        if let (Some(mode), Some(_)) = (&self.tools, message.get("tool_calls")) {
            let answer = tools::parse(text, mode);
            delta.insert(
                "tool_calls".into(),
                tools::calls_json(&answer, &self.id, true),
            );
        }
        let choice = json!({"index": index, "delta": delta, "logprobs": logprobs,
                            "finish_reason": finish});
        self.envelope(true, vec![choice])
    }

    /// The final usage chunk (`stream_options.include_usage`).
    pub fn usage_chunk(&self, usage: Value) -> Value {
        let mut v = self.envelope(true, Vec::new());
        v["usage"] = usage;
        v
    }
}

/// `{"prompt_tokens", "completion_tokens", "total_tokens",
/// "prompt_tokens_details": {"cached_tokens"}}` (prompt tokens the prefix cache held).
pub fn usage(prompt_tokens: usize, completion_tokens: usize, cached_tokens: usize) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    })
}

/// The legacy completions format: `tokens`, `token_logprobs`, `top_logprobs` (a dict per
/// token of the alternatives plus the chosen token, as OpenAI does; `null` with the logprob
/// of an echoed first prompt token), `text_offset` (character offsets of each token's text
/// in the choice's text).
fn legacy_logprobs(tok: &Tokenizer, tokens: &[TokenInfo], offset: &mut usize) -> Value {
    let mut texts = Vec::with_capacity(tokens.len());
    let mut offsets = Vec::with_capacity(tokens.len());
    let mut tops = Vec::with_capacity(tokens.len());
    for t in tokens {
        let text = token_text(tok, t.id);
        offsets.push(*offset);
        *offset += text.chars().count();
        let Some(logprob) = t.logprob else {
            tops.push(Value::Null);
            texts.push(text);
            continue;
        };
        let mut top = Map::new();
        for &(id, lp) in &t.top {
            top.entry(token_text(tok, id)).or_insert(json!(lp));
        }
        top.entry(text.clone()).or_insert(json!(logprob));
        tops.push(Value::Object(top));
        texts.push(text);
    }
    json!({
        "tokens": texts,
        "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
        "top_logprobs": tops,
        "text_offset": offsets,
    })
}
