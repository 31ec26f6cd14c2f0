//! Builds a Hugging Face `tokenizers::Tokenizer` that tokenizes exactly like llama.cpp from
//! a GGUF vocabulary: byte-level BPE for `gpt2` vocabularies, SentencePiece-style scored BPE
//! with byte fallback for `llama` vocabularies.

use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreTokenizerSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, NormalizerWrapper, SplitDelimiterBehavior};

use super::gguf_vocab::{GgufTokenType, GgufVocab};
use super::pre_tokenizer::PreTokenizerSpec;
use crate::error::{ModelError, Result};

/// The SentencePiece word-boundary mark that stands for a space.
pub(crate) const SPM_SPACE: char = '\u{2581}';

fn tok_err(context: &str, e: impl std::fmt::Display) -> ModelError {
    ModelError::Tokenizer(format!("{context}: {e}"))
}

/// token text -> id; for duplicated texts the last id wins, as in llama.cpp.
fn vocab_map(tokens: &[String]) -> Vocab {
    tokens
        .iter()
        .enumerate()
        .map(|(id, t)| {
            (
                t.clone(),
                u32::try_from(id).expect("validated: vocab size fits u32"),
            )
        })
        .collect()
}

/// Splits a GGUF merge ("left right") at its first space after the first character, as
/// llama.cpp does (so a left part may itself start with a space).
fn split_merge(merge: &str) -> Result<(String, String)> {
    let first_len = merge.chars().next().map_or(0, char::len_utf8);
    let pos = merge[first_len..]
        .find(' ')
        .map(|p| p + first_len)
        .ok_or_else(|| ModelError::Tokenizer(format!("merge `{merge}` has no separator")))?;
    Ok((merge[..pos].to_owned(), merge[pos + 1..].to_owned()))
}

/// Byte-level BPE (`tokenizer.ggml.model = gpt2`) with the pre-tokenizer of `spec`.
pub(crate) fn byte_level_bpe(
    vocab: &GgufVocab,
    spec: &PreTokenizerSpec,
) -> Result<tokenizers::Tokenizer> {
    let merges = vocab
        .merges
        .iter()
        .map(|m| split_merge(m))
        .collect::<Result<Vec<_>>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab_map(&vocab.tokens), merges)
        .ignore_merges(spec.ignore_merges)
        .build()
        .map_err(|e| tok_err("building BPE", e))?;
    let mut steps: Vec<PreTokenizerWrapper> = Vec::with_capacity(spec.regexes.len() + 1);
    for regex in &spec.regexes {
        let split = Split::new(
            SplitPattern::Regex(regex.clone()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| tok_err("pre-tokenizer regex", e))?;
        steps.push(split.into());
    }
    // The regexes above did the splitting; ByteLevel only maps bytes to its alphabet.
    steps.push(ByteLevel::new(false, false, false).into());
    let mut tokenizer = tokenizers::Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(PreTokenizerSequence::new(steps)));
    register_added_tokens(&mut tokenizer, vocab);
    Ok(tokenizer)
}

/// SentencePiece-style BPE (`tokenizer.ggml.model = llama`).
///
/// llama.cpp repeatedly merges the adjacent pair whose concatenation is a vocabulary piece
/// with the highest score. That is BPE whose merges are every split of every piece into two
/// pieces, ranked by the merged piece's score (descending). Characters missing from the
/// vocabulary fall back to `<0xNN>` byte pieces.
pub(crate) fn sentencepiece_bpe(vocab: &GgufVocab) -> Result<tokenizers::Tokenizer> {
    let scores = vocab
        .scores
        .as_ref()
        .ok_or_else(|| ModelError::Tokenizer("llama vocabulary without scores".into()))?;
    let map = vocab_map(&vocab.tokens);
    // Every split of every piece into two pieces, as (piece id, split byte): millions of
    // lookups for a 262k vocabulary, so the ids are cut into one range per core (at most
    // 8), each listed in id then split order.
    let splits_of = |ids: std::ops::Range<usize>| {
        let mut found: Vec<(u32, u32)> = Vec::new();
        for id in ids {
            if vocab.token_types[id] == GgufTokenType::Byte {
                continue;
            }
            let piece = &vocab.tokens[id];
            for (split, _) in piece.char_indices().skip(1) {
                let (left, right) = piece.split_at(split);
                if map.contains_key(left) && map.contains_key(right) {
                    found.push((id as u32, split as u32));
                }
            }
        }
        found
    };
    let n = vocab.tokens.len();
    let parts = std::thread::available_parallelism()
        .map_or(1, |p| p.get())
        .min(8);
    let mut ranked: Vec<(u32, u32)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..parts)
            .map(|i| s.spawn(move || splits_of(n * i / parts..n * (i + 1) / parts)))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    // Highest score first; ties by piece id, then by split position (stable sort).
    ranked.sort_by(|a, b| {
        let score = |id: u32| scores[id as usize];
        score(b.0).total_cmp(&score(a.0)).then(a.0.cmp(&b.0))
    });
    let merges = ranked
        .into_iter()
        .map(|(id, split)| {
            let (left, right) = vocab.tokens[id as usize].split_at(split as usize);
            (left.to_owned(), right.to_owned())
        })
        .collect();
    let mut builder = BPE::builder()
        .vocab_and_merges(map, merges)
        .byte_fallback(true);
    if let Some(unk) = vocab.unk_id {
        builder = builder.unk_token(vocab.tokens[unk as usize].clone());
    }
    let bpe = builder.build().map_err(|e| tok_err("building BPE", e))?;
    let mut tokenizer = tokenizers::Tokenizer::new(bpe);
    let mut normalizers: Vec<NormalizerWrapper> = Vec::new();
    if vocab.add_space_prefix.unwrap_or(true) {
        normalizers.push(Prepend::new(SPM_SPACE.to_string()).into());
    }
    let replace = Replace::new(" ", SPM_SPACE.to_string()).map_err(|e| tok_err("normalizer", e))?;
    normalizers.push(replace.into());
    tokenizer.with_normalizer(Some(NormalizerSequence::new(normalizers)));
    register_added_tokens(&mut tokenizer, vocab);
    Ok(tokenizer)
}

/// Control and unknown tokens become special added tokens and user-defined tokens plain
/// added tokens, all matched verbatim in the raw text (before normalization), so that e.g.
/// `<|im_start|>` in a prompt encodes to its single id.
fn register_added_tokens(tokenizer: &mut tokenizers::Tokenizer, vocab: &GgufVocab) {
    let mut special = Vec::new();
    let mut user = Vec::new();
    for (text, ty) in vocab.tokens.iter().zip(&vocab.token_types) {
        if text.is_empty() {
            continue;
        }
        match ty {
            GgufTokenType::Control | GgufTokenType::Unknown => {
                special.push(AddedToken::from(text.clone(), true).normalized(false));
            }
            GgufTokenType::UserDefined => {
                user.push(AddedToken::from(text.clone(), false).normalized(false));
            }
            _ => {}
        }
    }
    tokenizer.add_special_tokens(&special);
    tokenizer.add_tokens(&user);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_split_at_first_space_after_first_char() {
        let (l, r) = split_merge("Ġ t").expect("valid merge");
        assert_eq!((l.as_str(), r.as_str()), ("Ġ", "t"));
        let (l, r) = split_merge("  x").expect("space as left part");
        assert_eq!((l.as_str(), r.as_str()), (" ", "x"));
        assert!(split_merge("abc").is_err());
    }
}
