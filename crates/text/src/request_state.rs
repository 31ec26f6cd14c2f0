//! One request's output state inside the [`crate::OutputProcessor`]: its text stream, the
//! prompt scores waiting for its first delta, and the finish-reason mapping.

use std::sync::Arc;

use tandem_engine::engine::PromptTokenLogprob;
use tandem_model::tokenizer::Tokenizer;

use crate::{BeamText, Finish, GeneratedToken, RequestDelta, TextOptions, TextStream};

/// A request between its admission and its last delta.
#[derive(Debug)]
pub(crate) struct RequestState {
    stream: TextStream,
    /// Kept for the hypotheses of a beam search, which get text streams of their own.
    options: TextOptions,
    /// Prompt scores received so far; they go out with the first delta.
    prompt_logprobs: Vec<PromptTokenLogprob>,
    /// The prompt index the next chunk of scores must start at.
    next_prompt_index: usize,
    /// Whether a delta went out (after which no prompt score may arrive).
    started: bool,
}

impl RequestState {
    /// A request whose prompt scores (if any) start at `prompt_logprobs_start` (0 and 1
    /// both mean prompt index 1, the first one anything predicts).
    pub(crate) fn new(
        tokenizer: Arc<Tokenizer>,
        options: TextOptions,
        prompt_logprobs_start: usize,
    ) -> RequestState {
        RequestState {
            stream: TextStream::new(tokenizer, options.clone()),
            options,
            prompt_logprobs: Vec::new(),
            next_prompt_index: prompt_logprobs_start.max(1),
            started: false,
        }
    }

    /// Adds a generated token. The delta finishes the request with `Stop` when a stop
    /// string matched (the caller must end it in the engine), or with an error when the
    /// token has no text.
    pub(crate) fn token(&mut self, token: GeneratedToken) -> RequestDelta {
        match self.stream.push(token.token.0) {
            Ok(delta) => {
                let finish = delta.stopped.map(|_| Finish::Stop);
                self.delta(delta.text, Some(token), finish)
            }
            Err(e) => self.delta(
                String::new(),
                Some(token),
                Some(Finish::Error(e.to_string())),
            ),
        }
    }

    /// Adds the scores of prompt indices `start..`; an error when they do not continue the
    /// ones received (a position the engine skipped) or come after the first delta.
    pub(crate) fn prompt_logprobs(
        &mut self,
        start: usize,
        entries: Vec<PromptTokenLogprob>,
    ) -> Result<(), String> {
        if self.started || start != self.next_prompt_index {
            return Err(format!(
                "prompt logprobs arrived for index {start}, expected {}",
                self.next_prompt_index
            ));
        }
        self.next_prompt_index += entries.len();
        self.prompt_logprobs.extend(entries);
        Ok(())
    }

    /// The last delta: the text still held back and `finish` (`Stop` instead when that
    /// text completes a stop string). An output cut by its length limit drops an unfinished
    /// trailing character instead of ending in U+FFFD.
    pub(crate) fn finish(&mut self, finish: Finish, beams: Vec<BeamText>) -> RequestDelta {
        let tail = if finish == Finish::Length {
            self.stream.finish_cut()
        } else {
            self.stream.finish()
        };
        let finish = if tail.stopped.is_some() {
            Finish::Stop
        } else {
            finish
        };
        RequestDelta {
            beams,
            ..self.delta(tail.text, None, Some(finish))
        }
    }

    /// The last delta of a request that failed: no more text, the error as its finish.
    pub(crate) fn fail(&mut self, message: String) -> RequestDelta {
        self.delta(String::new(), None, Some(Finish::Error(message)))
    }

    /// The options its text is made with.
    pub(crate) fn options(&self) -> &TextOptions {
        &self.options
    }

    fn delta(
        &mut self,
        text: String,
        token: Option<GeneratedToken>,
        finish: Option<Finish>,
    ) -> RequestDelta {
        self.started = true;
        RequestDelta {
            text,
            token,
            prompt_logprobs: std::mem::take(&mut self.prompt_logprobs),
            finish,
            beams: Vec::new(),
        }
    }
}
