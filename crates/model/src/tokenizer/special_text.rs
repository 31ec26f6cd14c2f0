//! Special-token texts inside user text: finding them (`<|im_start|>`, `<bos>`, ...), and
//! encoding text that holds them as plain text, so that a chat message cannot smuggle a
//! control token into its prompt. Both are built on first use: most texts hold none.

use std::sync::OnceLock;

use aho_corasick::AhoCorasick;

/// The matcher of a vocabulary's special-token texts, and a copy of its tokenizer that
/// encodes them as text.
#[derive(Debug, Clone, Default)]
pub(super) struct SpecialText {
    /// `None` when the vocabulary has no special token with a text.
    matcher: OnceLock<Option<(AhoCorasick, Vec<String>)>>,
    as_text: OnceLock<tokenizers::Tokenizer>,
}

impl SpecialText {
    /// The first of `specials` (built on first use) found in `text`.
    pub(super) fn find<'a>(
        &'a self,
        text: &str,
        specials: impl FnOnce() -> Vec<String>,
    ) -> Option<&'a str> {
        let (matcher, texts) = self
            .matcher
            .get_or_init(|| {
                let texts: Vec<String> = specials().into_iter().filter(|t| !t.is_empty()).collect();
                // A vocabulary's texts always build (no size limit is set); should one not,
                // nothing is matched rather than every request refused.
                AhoCorasick::new(&texts).ok().map(|m| (m, texts))
            })
            .as_ref()?;
        matcher
            .find(text)
            .map(|m| texts[m.pattern().as_usize()].as_str())
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
