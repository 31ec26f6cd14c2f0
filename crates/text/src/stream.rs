//! Per-request text streaming: detokenizer followed by the stop-string matcher.

use std::sync::Arc;

use tandem_model::tokenizer::Tokenizer;

use crate::{IncrementalDetokenizer, StopStringMatcher, StopStrings, TextDelta, TextError};

/// How a request's generated tokens become text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TextOptions {
    /// Leave control tokens (EOS, `<|im_end|>`, ...) out of the text.
    pub skip_special_tokens: bool,
    /// Stop strings, already validated.
    pub stop: StopStrings,
    /// Emit the matched stop string as the end of the text.
    pub include_stop_str_in_output: bool,
}

/// One request's token-to-text pipeline, used the same way by the CLI and the server.
///
/// Invariant (ARCHITECTURE.md § Invariants, 7: stream ≡ non-stream): for any ids pushed one at a
/// time, the concatenation of the deltas of every `push` and of `finish` equals the non-streamed
/// text: the ids decoded all at once (`Tokenizer::decode(ids, skip_special_tokens)`), then cut at
/// the first stop string as [`StopStringMatcher`] defines it. No delta contains U+FFFD from a
/// character split across tokens, and no byte of the matched stop string is ever emitted (unless
/// `include_stop_str_in_output`).
#[derive(Debug, Clone)]
pub struct TextStream {
    detokenizer: IncrementalDetokenizer,
    matcher: StopStringMatcher,
}

impl TextStream {
    /// A stream for one request.
    pub fn new(tokenizer: Arc<Tokenizer>, options: TextOptions) -> Self {
        Self {
            detokenizer: IncrementalDetokenizer::new(tokenizer, options.skip_special_tokens),
            matcher: StopStringMatcher::new(options.stop, options.include_stop_str_in_output),
        }
    }

    /// Adds one generated token. Once a stop string has matched, ids are ignored and the
    /// delta is empty: the caller should stop generating when `stopped` is set.
    pub fn push(&mut self, id: u32) -> Result<TextDelta, TextError> {
        if self.is_stopped() {
            return Ok(TextDelta::default());
        }
        let text = self.detokenizer.push(id)?;
        if text.is_empty() {
            return Ok(TextDelta::default());
        }
        Ok(self.matcher.push(&text))
    }

    /// Ends generation (EOS, length limit, abort): returns the rest of the text. The final
    /// bytes can still complete a stop string (only one containing U+FFFD, which an
    /// incomplete trailing character becomes), hence a [`TextDelta`].
    pub fn finish(&mut self) -> TextDelta {
        if self.is_stopped() {
            return TextDelta::default();
        }
        let tail = self.detokenizer.finish();
        let mut delta = self.matcher.push(&tail);
        if delta.stopped.is_none() {
            delta.text.push_str(&self.matcher.finish());
        }
        delta
    }

    /// Ends generation cut by a length limit: as [`TextStream::finish`], except that the
    /// bytes of an unfinished trailing character are dropped rather than becoming U+FFFD.
    pub fn finish_cut(&mut self) -> TextDelta {
        self.detokenizer.discard_incomplete();
        self.finish()
    }

    /// Whether a stop string has matched.
    pub fn is_stopped(&self) -> bool {
        self.matcher.stopped().is_some()
    }
}
