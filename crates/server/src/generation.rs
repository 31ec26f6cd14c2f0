//! One HTTP request's generation: its engine requests (one per choice), their token events
//! turned into text per choice with stop strings, as a sequence of [`ChoiceUpdate`]s.
//!
//! Streaming and non-streaming responses are built from the same updates, so the concatenated
//! streamed text of a choice is the non-streamed text by construction (ARCHITECTURE.md §
//! Invariants, 7); what the text layer holds back (an incomplete UTF-8 character, a possible start
//! of a stop string) is never sent early.

use std::sync::Arc;

use crate::echo::{EchoPrompt, PromptSide};
use crate::text::{TextOptions, TextStream};
use tandem_engine::engine::PromptTokenLogprob;
use tandem_engine::{FinishReason, SeqId};
use tandem_model::tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::engine_thread::{EngineHandle, GroupEvent, RequestEvent};

/// A generated (or echoed prompt) token with its raw-distribution logprob and alternatives
/// (most likely first). `logprob` is `None` only for an echoed prompt token without a score
/// (the first one: nothing predicts it).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenInfo {
    pub id: u32,
    pub logprob: Option<f32>,
    pub top: Vec<(u32, f32)>,
}

/// Why a choice ended, as the API reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finish {
    /// EOS, a stop token or a stop string.
    Stop,
    /// `max_tokens` or the context length.
    Length,
    /// Aborted (server shutting down).
    Abort,
    /// The model or engine failed for this choice.
    Error(String),
}

impl Finish {
    /// The `finish_reason` string (an error reports `error`).
    pub fn as_str(&self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::Abort => "abort",
            Finish::Error(_) => "error",
        }
    }

    fn from_engine(reason: FinishReason) -> Finish {
        match reason {
            FinishReason::Stop => Finish::Stop,
            FinishReason::Length => Finish::Length,
            FinishReason::Abort => Finish::Abort,
            FinishReason::Error(e) => Finish::Error(e),
        }
    }
}

/// New text of one choice, the tokens generated since its previous update, and its finish
/// reason on its last update. A choice's first update also carries its echoed prompt (text
/// and tokens first) and all its prompt scores (see [`crate::echo`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ChoiceUpdate {
    pub index: usize,
    pub text: String,
    pub tokens: Vec<TokenInfo>,
    pub finish: Option<Finish>,
    /// Scores of prompt indices `1..` (first update only; empty unless asked for).
    pub prompt: Vec<PromptTokenLogprob>,
}

#[derive(Debug)]
struct Choice {
    seq: SeqId,
    stream: TextStream,
    /// Tokens not yet reported in an update.
    pending: Vec<TokenInfo>,
    num_tokens: usize,
    finished: bool,
    prompt: PromptSide,
}

/// The running choices of one HTTP request. Dropping it aborts whatever still runs (the
/// engine thread sees the event receiver gone).
#[derive(Debug)]
pub struct Generation {
    events: UnboundedReceiver<GroupEvent>,
    engine: EngineHandle,
    choices: Vec<Choice>,
    remaining: usize,
    /// Prompt tokens the prefix cache held, over the choices' prompts.
    cached_tokens: usize,
}

impl Generation {
    /// Wraps submitted requests `seqs` (choice `i` is `seqs[i]`) and their event receiver.
    pub fn new(
        engine: EngineHandle,
        seqs: Vec<SeqId>,
        events: UnboundedReceiver<GroupEvent>,
        tokenizer: &Arc<Tokenizer>,
        text: &[TextOptions],
    ) -> Generation {
        let choices: Vec<Choice> = seqs
            .into_iter()
            .zip(text)
            .map(|(seq, options)| Choice {
                seq,
                stream: TextStream::new(tokenizer.clone(), options.clone()),
                pending: Vec::new(),
                num_tokens: 0,
                finished: false,
                prompt: PromptSide::default(),
            })
            .collect();
        let remaining = choices.len();
        Generation {
            events,
            engine,
            choices,
            remaining,
            cached_tokens: 0,
        }
    }

    /// Echoes `echo[i]` in choice `i`'s first update (see [`crate::echo`]).
    pub fn with_echo(mut self, echo: Vec<Option<EchoPrompt>>) -> Generation {
        for (c, e) in self.choices.iter_mut().zip(echo) {
            c.prompt = PromptSide::new(e);
        }
        self
    }

    /// Prompt tokens found in the prefix cache (`usage.prompt_tokens_details.cached_tokens`).
    pub fn cached_tokens(&self) -> usize {
        self.cached_tokens
    }

    /// Tokens generated so far by each choice (up to its stop).
    pub fn num_tokens(&self) -> Vec<usize> {
        self.choices.iter().map(|c| c.num_tokens).collect()
    }

    /// The next update with new text or a finish; `None` once every choice has finished.
    pub async fn next(&mut self) -> Option<ChoiceUpdate> {
        while self.remaining > 0 {
            let Some(GroupEvent { index, event }) = self.events.recv().await else {
                // The engine thread is gone without telling: end the first open choice.
                let index = self.choices.iter().position(|c| !c.finished)?;
                let fin = Finish::Error("the engine stopped".into());
                let mut update = self.finish(index, String::new(), fin);
                self.choices[index].prompt.first_update(&mut update);
                return Some(update);
            };
            if let Some(mut update) = self.apply(index, event) {
                self.choices[index].prompt.first_update(&mut update);
                return Some(update);
            }
        }
        None
    }

    fn apply(&mut self, index: usize, event: RequestEvent) -> Option<ChoiceUpdate> {
        let choice = self.choices.get_mut(index)?;
        if choice.finished {
            return None;
        }
        match event {
            RequestEvent::Token {
                token,
                logprob,
                top_logprobs,
            } => {
                choice.num_tokens += 1;
                choice.pending.push(TokenInfo {
                    id: token.0,
                    logprob: Some(logprob),
                    top: top_logprobs.iter().map(|&(t, l)| (t.0, l)).collect(),
                });
                let delta = match choice.stream.push(token.0) {
                    Ok(d) => d,
                    Err(e) => {
                        self.engine.abort(choice.seq);
                        return Some(self.finish(
                            index,
                            String::new(),
                            Finish::Error(e.to_string()),
                        ));
                    }
                };
                if delta.stopped.is_some() {
                    self.engine.abort(choice.seq);
                    return Some(self.finish(index, delta.text, Finish::Stop));
                }
                if delta.text.is_empty() {
                    return None;
                }
                let tokens = std::mem::take(&mut choice.pending);
                Some(ChoiceUpdate {
                    index,
                    text: delta.text,
                    tokens,
                    finish: None,
                    prompt: Vec::new(),
                })
            }
            RequestEvent::Admitted { cached_tokens } => {
                self.cached_tokens += cached_tokens;
                None
            }
            RequestEvent::PromptLogprobs { start, entries } => {
                let Err(e) = choice.prompt.push(start, entries) else {
                    return None;
                };
                self.engine.abort(choice.seq);
                Some(self.finish(index, String::new(), Finish::Error(e)))
            }
            // Beam results go to `api/beam.rs`, never to a sampled generation.
            RequestEvent::Beams(_) => None,
            RequestEvent::Finished(reason) => {
                let tail = choice.stream.finish();
                let fin = if tail.stopped.is_some() {
                    Finish::Stop
                } else {
                    Finish::from_engine(reason)
                };
                Some(self.finish(index, tail.text, fin))
            }
        }
    }

    fn finish(&mut self, index: usize, text: String, finish: Finish) -> ChoiceUpdate {
        let choice = &mut self.choices[index];
        choice.finished = true;
        self.remaining -= 1;
        ChoiceUpdate {
            index,
            text,
            tokens: std::mem::take(&mut choice.pending),
            finish: Some(finish),
            prompt: Vec::new(),
        }
    }
}
