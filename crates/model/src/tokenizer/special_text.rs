//! Special-token texts inside user text: finding them (`<|im_start|>`, `<bos>`, ...), and
//! encoding text that holds them as plain text, so that a chat message cannot smuggle a
//! control token into its prompt. Both are built on first use: most texts hold none.

use std::ops::Range;
use std::sync::OnceLock;

use aho_corasick::{AhoCorasick, MatchKind};

/// The matcher of a vocabulary's special-token texts, and a copy of its tokenizer that
/// encodes them as text.
#[derive(Debug, Clone, Default)]
pub(super) struct SpecialText {
    /// `None` when the vocabulary has no special token with a text.
    matcher: OnceLock<Option<Matcher>>,
    as_text: OnceLock<tokenizers::Tokenizer>,
}

/// The special texts and their ids, matched leftmost-longest (as the tokenizer splits).
#[derive(Debug, Clone)]
struct Matcher {
    automaton: AhoCorasick,
    specials: Vec<(String, u32)>,
}

/// A special-token text found in a text: its bytes there and its id.
pub(super) struct Found<'a> {
    pub(super) at: Range<usize>,
    pub(super) text: &'a str,
    pub(super) id: u32,
}

impl SpecialText {
    /// The matches of `specials` (built on first use: `(text, id)` pairs) in `text`, left
    /// to right, leftmost-longest.
    pub(super) fn find_all<'a>(
        &'a self,
        text: &'a str,
        specials: impl FnOnce() -> Vec<(String, u32)>,
    ) -> impl Iterator<Item = Found<'a>> + 'a {
        let matcher = self
            .matcher
            .get_or_init(|| {
                let specials: Vec<(String, u32)> = specials()
                    .into_iter()
                    .filter(|(t, _)| !t.is_empty())
                    .collect();
                // A vocabulary's texts always build (no size limit is set); should they not,
                // nothing is matched rather than every request refused.
                AhoCorasick::builder()
                    .match_kind(MatchKind::LeftmostLongest)
                    .build(specials.iter().map(|(t, _)| t))
                    .ok()
                    .map(|automaton| Matcher {
                        automaton,
                        specials,
                    })
            })
            .as_ref();
        matcher.into_iter().flat_map(move |m| {
            m.automaton.find_iter(text).map(|found| {
                let (special, id) = &m.specials[found.pattern().as_usize()];
                Found {
                    at: found.range(),
                    text: special,
                    id: *id,
                }
            })
        })
    }

    /// `inner` with special-token texts encoded as text (built on first use).
    pub(super) fn as_text(&self, inner: &tokenizers::Tokenizer) -> &tokenizers::Tokenizer {
        self.as_text.get_or_init(|| {
            let mut t = inner.clone();
            t.set_encode_special_tokens(true);
            t
        })
    }
}
