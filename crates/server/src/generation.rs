//! One HTTP request's generation: its engine requests (one per choice), whose outputs the
//! engine thread's output processor already made into text (detokenizer and stop strings,
//! see `tandem_text`), as a sequence of [`ChoiceUpdate`]s.
//!
//! Streaming and non-streaming responses are built from the same updates, so the
//! concatenated streamed text of a choice is the non-streamed text by construction
//! (ARCHITECTURE.md § Invariants, 7); what the text layer holds back (an incomplete UTF-8 character, a
//! possible start of a stop string) is never sent early, and the tokens behind held-back
//! text wait for the next update that has text.

use tandem_engine::engine::PromptTokenLogprob;
use tandem_text::RequestOutput;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::access_log::{self, AccessRecord};
use crate::echo::{EchoPrompt, PromptSide};
use crate::engine_thread::GroupEvent;

pub use tandem_text::Finish;

/// A generated (or echoed prompt) token with its raw-distribution logprob and alternatives
/// (most likely first). `logprob` is `None` for an echoed prompt token without a score (the
/// first one: nothing predicts it) and for a generated one when logprobs were not asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenInfo {
    pub id: u32,
    pub logprob: Option<f32>,
    pub top: Vec<(u32, f32)>,
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

#[derive(Debug, Default)]
struct Choice {
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
    choices: Vec<Choice>,
    remaining: usize,
    /// Prompt tokens the prefix cache held, over the choices' prompts.
    cached_tokens: usize,
    /// The request's access line, when made inside the access-log middleware.
    access: Option<AccessRecord>,
}

impl Generation {
    /// Wraps the event receiver of `num_choices` submitted requests (choice `i` is event
    /// index `i`).
    pub fn new(events: UnboundedReceiver<GroupEvent>, num_choices: usize) -> Generation {
        Generation {
            events,
            choices: (0..num_choices).map(|_| Choice::default()).collect(),
            remaining: num_choices,
            cached_tokens: 0,
            access: access_log::current(),
        }
    }

    /// Echoes `echo[i]` in choice `i`'s first update (see [`crate::echo`]).
    pub fn with_echo(mut self, echo: Vec<Option<EchoPrompt>>) -> Generation {
        for (c, e) in self.choices.iter_mut().zip(echo) {
            c.prompt = PromptSide::new(e);
        }
        self
    }

    /// Notes the request's prompt tokens on its access line.
    pub fn log_prompt_tokens(&self, n: usize) {
        if let Some(a) = &self.access {
            a.prompt_tokens(n);
        }
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
                let mut update = self.update(index, String::new(), Some(fin));
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

    /// An update when `event` brings text or a finish.
    fn apply(&mut self, index: usize, event: RequestOutput) -> Option<ChoiceUpdate> {
        let choice = self.choices.get_mut(index)?;
        if choice.finished {
            return None;
        }
        let delta = match event {
            RequestOutput::Admitted { cached_tokens } => {
                self.cached_tokens += cached_tokens;
                if let Some(a) = &self.access {
                    a.cached_tokens(cached_tokens);
                }
                return None;
            }
            RequestOutput::Delta(delta) => delta,
        };
        if let Some(t) = delta.token {
            choice.num_tokens += 1;
            if let Some(a) = &self.access {
                a.token();
            }
            choice.pending.push(TokenInfo {
                id: t.token.0,
                logprob: t.logprob,
                top: t.top_logprobs.iter().map(|&(t, l)| (t.0, l)).collect(),
            });
        }
        choice.prompt.push(delta.prompt_logprobs);
        if delta.text.is_empty() && delta.finish.is_none() {
            return None;
        }
        Some(self.update(index, delta.text, delta.finish))
    }

    /// Choice `index`'s update with `text`, its pending tokens and `finish`.
    fn update(&mut self, index: usize, text: String, finish: Option<Finish>) -> ChoiceUpdate {
        let choice = &mut self.choices[index];
        if let (Some(f), Some(a)) = (&finish, &self.access) {
            a.finished(f);
        }
        if finish.is_some() {
            choice.finished = true;
            self.remaining -= 1;
        }
        ChoiceUpdate {
            index,
            text,
            tokens: std::mem::take(&mut choice.pending),
            finish,
            prompt: Vec::new(),
        }
    }
}
