//! Incremental detokenization that never emits a broken UTF-8 character.

use std::sync::Arc;

use tandem_model::tokenizer::Tokenizer;

use crate::TextError;

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
/// SentencePiece vocabularies prepend a space to text when encoding and `decode` removes it
/// again from the first ordinary token of a stretch of text; that token's leading space is
/// dropped here too (see [`SpaceStripProbe`]).
///
/// Invariant: the concatenation of every chunk returned by `push` and `finish` equals
/// `tokenizer.decode(all ids, skip_special)`, and after each `push` the text emitted so far
/// is that decoding of the ids so far minus at most one incomplete trailing character.
#[derive(Debug, Clone)]
pub struct IncrementalDetokenizer {
    tokenizer: Arc<Tokenizer>,
    skip_special: bool,
    /// Bytes of an incomplete UTF-8 character ending the text so far; at most
    /// [`MAX_INCOMPLETE_BYTES`] after every `push`.
    pending: Vec<u8>,
    /// What decides whether `decode` drops the next token's leading space.
    probe: SpaceStripProbe,
}

impl IncrementalDetokenizer {
    /// A detokenizer for `tokenizer`; with `skip_special`, control tokens (EOS,
    /// `<|im_end|>`, ...) add nothing to the text, as in `decode(.., true)`.
    pub fn new(tokenizer: Arc<Tokenizer>, skip_special: bool) -> Self {
        Self {
            tokenizer,
            skip_special,
            pending: Vec::with_capacity(8),
            probe: SpaceStripProbe::default(),
        }
    }

    /// Whether special tokens are left out of the text.
    pub fn skip_special(&self) -> bool {
        self.skip_special
    }

    /// Adds one token and returns the text that became complete (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String, TextError> {
        if self.tokenizer.is_padding(id) {
            // A padded embedding row: no text, and none of the context `decode` sees.
            return Ok(String::new());
        }
        let bytes = self
            .tokenizer
            .token_bytes(id)
            .ok_or(TextError::UnknownToken(id))?;
        let special = self.tokenizer.is_special(id);
        let skip = usize::from(!special && self.probe.strips_space(&self.tokenizer, id, bytes));
        self.probe.record(id, special);
        if self.skip_special && special {
            return Ok(String::new());
        }
        self.pending.extend_from_slice(&bytes[skip..]);
        Ok(self.take_complete())
    }

    /// Ends the stream: returns the held-back bytes, an incomplete trailing character
    /// becoming one U+FFFD (as `decode` reads it). The detokenizer is empty afterwards.
    pub fn finish(&mut self) -> String {
        let tail = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        tail
    }

    /// Drops the bytes of an incomplete trailing character (for an output cut by a length
    /// limit: the model never finished that character, so it is not text).
    pub fn discard_incomplete(&mut self) {
        self.pending.clear();
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

/// Finds out whether `decode` would drop the leading space of the next token, without
/// knowing the vocabulary's space-prefix rule.
///
/// In `decode`, whether an ordinary token's leading space is dropped depends on the tokens
/// before it only through (a) the previous token and (b) whether any non-special token came
/// before (SentencePiece "prefix every stretch of text" and "prefix the start only" rules;
/// byte-level vocabularies never drop it). The context `[first non-special token, previous
/// token]` therefore puts `decode` in the same state as the whole sequence, and decoding it
/// with and without the new token shows whether the space is dropped. A leading ASCII space
/// ends any incomplete character before it, so the lossy decodings compare exactly.
#[derive(Debug, Clone, Copy, Default)]
struct SpaceStripProbe {
    /// The first non-special token pushed so far.
    first_non_special: Option<u32>,
    /// The last token pushed, unless it is `first_non_special` itself.
    previous: Option<u32>,
}

impl SpaceStripProbe {
    /// Records a pushed token.
    fn record(&mut self, id: u32, special: bool) {
        if !special && self.first_non_special.is_none() {
            self.first_non_special = Some(id);
            self.previous = None;
        } else {
            self.previous = Some(id);
        }
    }

    /// Whether `decode` drops the leading space of non-special token `id` (bytes `bytes`)
    /// after the tokens recorded so far.
    fn strips_space(&self, tokenizer: &Tokenizer, id: u32, bytes: &[u8]) -> bool {
        if bytes.first() != Some(&b' ') {
            return false;
        }
        let mut context = [0u32; 3];
        let mut len = 0;
        for t in [self.first_non_special, self.previous]
            .into_iter()
            .flatten()
        {
            context[len] = t;
            len += 1;
        }
        context[len] = id;
        let (Ok(before), Ok(after)) = (
            tokenizer.decode(&context[..len], false),
            tokenizer.decode(&context[..=len], false),
        ) else {
            return false;
        };
        let added = after
            .strip_prefix(before.as_str())
            .unwrap_or(after.as_str());
        added.len() < String::from_utf8_lossy(bytes).len()
    }
}
