//! Turning generated token ids into the text a client sees, one token at a time.
//!
//! Shared by the CLI and the server, per request:
//!
//! - [`IncrementalDetokenizer`] turns ids into text chunks and never emits part of a UTF-8
//!   character: the bytes of a character split across tokens are held back until it is
//!   complete. The concatenation of its chunks equals `Tokenizer::decode` of all the ids.
//! - [`StopStringMatcher`] cuts a stream of text chunks at the first stop string, holding
//!   back any tail that could still become a stop string, so that no byte of a matched stop
//!   string is ever emitted (unless `include_stop_str_in_output`).
//! - [`TextStream`] chains the two; its concatenated deltas equal the non-streamed text
//!   (everything decoded, then cut at the first stop string, see [`StopStringMatcher`]).

mod detokenizer;
mod stop;
mod stream;

pub use detokenizer::IncrementalDetokenizer;
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
