//! The tokenizer part of a GGUF file's metadata (`tokenizer.ggml.*`), read into plain
//! owned values and checked for consistency before any tokenizer is built from it.

use crate::error::{ModelError, Result};

/// GGUF token types (`tokenizer.ggml.token_type`), as llama.cpp writes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgufTokenType {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl GgufTokenType {
    /// The type for a stored code; codes outside 1..=6 (0 is "undefined") count as normal,
    /// as llama.cpp treats them.
    pub fn from_code(code: i32) -> Self {
        match code {
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => Self::Normal,
        }
    }
}

/// Which tokenization algorithm `tokenizer.ggml.model` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgufTokenizerModel {
    /// `gpt2`: byte-level BPE with ranked merges and a regex pre-tokenizer.
    Gpt2,
    /// `llama`: SentencePiece-style BPE over scored pieces, `▁` for spaces, byte fallback.
    Llama,
}

/// Everything tandem reads from the `tokenizer.ggml.*` keys.
///
/// Invariants (checked by [`GgufVocab::validate`]): `token_types` and `scores`, when present,
/// have one entry per token; every special id is `< tokens.len()`.
#[derive(Debug, Clone)]
pub struct GgufVocab {
    pub model: GgufTokenizerModel,
    /// `tokenizer.ggml.pre`; `None` when absent.
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`, indexed by token id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`, one per token (all normal when absent).
    pub token_types: Vec<GgufTokenType>,
    /// `tokenizer.ggml.scores`, one per token; `None` when absent.
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.merges` ("left right" pairs, in rank order); empty when absent.
    pub merges: Vec<String>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    /// End-of-turn and end-of-message ids (`eot_token_id`, `eom_token_id`), when present.
    pub extra_eog_ids: Vec<u32>,
    pub unk_id: Option<u32>,
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    pub add_space_prefix: Option<bool>,
    pub chat_template: Option<String>,
}

impl GgufVocab {
    /// Rejects vocabularies whose parallel arrays or special ids do not fit the token list.
    pub fn validate(&self) -> Result<()> {
        let n = self.tokens.len();
        if n == 0 {
            return Err(ModelError::Tokenizer("empty vocabulary".into()));
        }
        if u32::try_from(n).is_err() {
            return Err(ModelError::Tokenizer(format!(
                "vocabulary of {n} tokens is too large"
            )));
        }
        if self.token_types.len() != n {
            return Err(ModelError::Tokenizer(format!(
                "{} token types for {n} tokens",
                self.token_types.len()
            )));
        }
        if let Some(scores) = &self.scores {
            if scores.len() != n {
                return Err(ModelError::Tokenizer(format!(
                    "{} token scores for {n} tokens",
                    scores.len()
                )));
            }
        }
        let specials = [self.bos_id, self.eos_id, self.unk_id];
        let all = specials.iter().flatten().chain(self.extra_eog_ids.iter());
        for &id in all {
            if id as usize >= n {
                return Err(ModelError::Tokenizer(format!(
                    "special token id {id} is outside the vocabulary of {n} tokens"
                )));
            }
        }
        Ok(())
    }

    /// The ids whose sampling ends a generation: EOS, EOT/EOM, and control tokens whose text
    /// is a well-known end-of-turn marker (as several GGUF writers only set one of them).
    pub fn end_of_generation_ids(&self) -> Vec<u32> {
        const END_MARKERS: [&str; 8] = [
            "<|eot_id|>",
            "<|im_end|>",
            "<|end|>",
            "<end_of_turn>",
            "<|endoftext|>",
            "<|eom_id|>",
            "<EOT>",
            "<|end_of_text|>",
        ];
        let mut ids: Vec<u32> = self.eos_id.into_iter().collect();
        ids.extend(&self.extra_eog_ids);
        for (id, (text, ty)) in self.tokens.iter().zip(&self.token_types).enumerate() {
            let is_marker = *ty == GgufTokenType::Control && END_MARKERS.contains(&text.as_str());
            let id = u32::try_from(id).expect("validated: vocabulary size fits u32");
            if is_marker && !ids.contains(&id) {
                ids.push(id);
            }
        }
        ids
    }
}
