//! From the engine's events to what a client sees: per-request text, tokens and finish
//! reasons. Shared by the CLI and the server (no HTTP, no async runtime here).
//!
//! The text layer, per request:
//!
//! - [`IncrementalDetokenizer`] turns ids into text chunks and never emits part of a UTF-8
//!   character: the bytes of a character split across tokens are held back until it is
//!   complete. The concatenation of its chunks equals `Tokenizer::decode` of all the ids.
//! - [`StopStringMatcher`] cuts a stream of text chunks at the first stop string, holding
//!   back any tail that could still become a stop string, so that no byte of a matched stop
//!   string is ever emitted (unless `include_stop_str_in_output`).
//! - [`TextStream`] chains the two; its concatenated deltas equal the non-streamed text
//!   (everything decoded, then cut at the first stop string, see [`StopStringMatcher`]).
//!
//! The output processor (vLLM's name for it), over all requests:
//!
//! - [`OutputProcessor`] submits [`TextRequest`]s (samples, beam search, per-request
//!   speculation) and consumes every [`EngineEvent`](tandem_engine::engine::EngineEvent)
//!   of a step: it runs each request's [`TextStream`], ends a request in the engine when a
//!   stop string matches, maps finish reasons, collects prompt logprobs and beam search
//!   hypotheses, and hands its caller one [`RequestOutput`] per event that matters. The CLI
//!   collects them into results; the server's engine thread forwards them to each
//!   request's channel.

mod beam_text;
mod detokenizer;
mod output;
mod output_processor;
mod request_state;
mod stop;
mod stream;

pub use beam_text::BeamText;
pub use detokenizer::IncrementalDetokenizer;
pub use output::{Finish, GeneratedToken, RequestDelta, RequestOutput};
pub use output_processor::{OutputProcessor, RequestControl, TextRequest};
pub use stop::{
    StopMatch, StopStringError, StopStringMatcher, StopStrings, TextDelta, MAX_STOP_STRINGS,
    MAX_STOP_STRING_BYTES,
};
pub use stream::{TextOptions, TextStream};

/// Errors while turning token ids into text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    /// The id is not in the tokenizer's vocabulary (a bug upstream: sampled ids must be
    /// `< vocab_size`).
    #[error("token id {0} is outside the vocabulary")]
    UnknownToken(u32),
}
