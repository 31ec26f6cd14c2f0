//! Incremental detokenization that never emits a broken UTF-8 character.

use std::sync::Arc;

use tandem_model::tokenizer::Tokenizer;

use super::TextError;

/// The most bytes a held-back incomplete UTF-8 sequence can have (a 4-byte character minus
/// its last byte).
const MAX_INCOMPLETE_BYTES: usize = 3;

/// Turns token ids, pushed one at a time, into text chunks.
///
/// Each token contributes the bytes [`Tokenizer::token_bytes`] gives (nothing for a special
/// token when `skip_special`). Bytes are emitted as soon as they form complete characters;
/// the bytes of an incomplete character at the end are held back until a later token
/// completes it. Bytes that can never become valid UTF-8, whatever follows, are emitted at
/// once as one U+FFFD per maximal invalid subpart, exactly as `String::from_utf8_lossy`
/// reads them. Only [`finish`](Self::finish) turns a still-incomplete tail into U+FFFD.
///
/// Invariant: for byte-level vocabularies (the default model) and any other vocabulary
/// whose `decode` is the lossy UTF-8 reading of the concatenated token bytes, the
/// concatenation of every chunk returned by `push` and `finish` equals
/// `tokenizer.decode(all ids, skip_special)`, and after each `push` the text emitted so far
/// is that decoding of the ids so far minus at most one incomplete trailing character.
/// (SentencePiece vocabularies that strip a prepended space in `decode` are not covered:
/// `token_bytes` keeps that space.)
#[derive(Debug, Clone)]
pub struct IncrementalDetokenizer {
    tokenizer: Arc<Tokenizer>,
    skip_special: bool,
    /// Bytes of an incomplete UTF-8 character ending the text so far; at most
    /// [`MAX_INCOMPLETE_BYTES`] after every `push`.
    pending: Vec<u8>,
}

impl IncrementalDetokenizer {
    /// A detokenizer for `tokenizer`; with `skip_special`, control tokens (EOS,
    /// `<|im_end|>`, ...) add nothing to the text, as in `decode(.., true)`.
    pub fn new(tokenizer: Arc<Tokenizer>, skip_special: bool) -> Self {
        Self {
            tokenizer,
            skip_special,
            pending: Vec::with_capacity(8),
        }
    }

    /// Whether special tokens are left out of the text.
    pub fn skip_special(&self) -> bool {
        self.skip_special
    }

    /// Adds one token and returns the text that became complete (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String, TextError> {
        let bytes = self
            .tokenizer
            .token_bytes(id)
            .ok_or(TextError::UnknownToken(id))?;
        if self.skip_special && self.tokenizer.is_special(id) {
            return Ok(String::new());
        }
        self.pending.extend_from_slice(bytes);
        Ok(self.take_complete())
    }

    /// Ends the stream: returns the held-back bytes, an incomplete trailing character
    /// becoming one U+FFFD (as `decode` reads it). The detokenizer is empty afterwards.
    pub fn finish(&mut self) -> String {
        let tail = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        tail
    }

    /// Whether bytes of an incomplete character are being held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Removes from `pending` and returns everything but an incomplete trailing character.
    fn take_complete(&mut self) -> String {
        let mut out = String::with_capacity(self.pending.len());
        let mut keep_from = self.pending.len();
        let mut chunks = self.pending.utf8_chunks().peekable();
        while let Some(chunk) = chunks.next() {
            out.push_str(chunk.valid());
            let invalid = chunk.invalid();
            if invalid.is_empty() {
                continue;
            }
            let is_last = chunks.peek().is_none();
            if is_last && is_incomplete(invalid) {
                keep_from = self.pending.len() - invalid.len();
            } else {
                out.push(char::REPLACEMENT_CHARACTER);
            }
        }
        self.pending.drain(..keep_from);
        debug_assert!(self.pending.len() <= MAX_INCOMPLETE_BYTES);
        out
    }
}

/// Whether `bytes` (an invalid chunk at the end of the input) is the start of a character
/// that more bytes could complete, rather than bytes that are invalid whatever follows.
fn is_incomplete(bytes: &[u8]) -> bool {
    match std::str::from_utf8(bytes) {
        Ok(_) => false,
        Err(e) => e.error_len().is_none(),
    }
}
