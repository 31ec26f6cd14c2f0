//! The pre-tokenizers of byte-level BPE vocabularies read from GGUF, chosen by the
//! `tokenizer.ggml.pre` key.
//!
//! Each pre-type is a list of regular expressions applied in order: every expression splits
//! every piece produced so far into its matches and the (non-empty) stretches between them.
//! The expressions follow the original tokenizers of each model family (as llama.cpp reads
//! them); case-insensitive contractions are spelled with explicit character classes.

use crate::error::{ModelError, Result};

/// GPT-2's split: contractions, letters, numbers, other symbols (each optionally after one
/// space), and whitespace runs that leave their last space to the following word.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Contractions in either case, as the Llama-3-style expressions write them.
const CONTRACTIONS: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])";

/// The tail shared by the Llama-3 and Qwen2 expressions after their number rule.
const LLAMA3_TAIL: &str = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How a byte-level BPE vocabulary splits text before merging.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreTokenizerSpec {
    /// The name this spec was chosen by (the GGUF `tokenizer.ggml.pre` value).
    pub name: String,
    /// Split expressions, applied in order (each isolates its matches).
    pub regexes: Vec<String>,
    /// When true, a pre-token that is itself in the vocabulary is taken whole, without
    /// running the merges (Llama-3 style vocabularies).
    pub ignore_merges: bool,
    /// The BOS default of this family, used when the GGUF has no `add_bos_token` key.
    pub default_add_bos: bool,
}

/// Llama-3's expression, also used by DBRX, Smaug and ChatGLM-4 (numbers in runs of 1-3 digits).
fn llama3() -> String {
    format!(r"{CONTRACTIONS}|[^\r\n\p{{L}}\p{{N}}]?\p{{L}}+|\p{{N}}{{1,3}}{LLAMA3_TAIL}")
}

/// Qwen2's expression: as Llama-3's but every digit is its own pre-token.
fn qwen2() -> String {
    format!(r"{CONTRACTIONS}|[^\r\n\p{{L}}\p{{N}}]?\p{{L}}+|\p{{N}}{LLAMA3_TAIL}")
}

impl PreTokenizerSpec {
    /// The spec for a `tokenizer.ggml.pre` value; `None` (key absent) means "default".
    ///
    /// Unknown names are an error rather than a silent fallback: a wrong split changes
    /// the token ids without any other visible symptom.
    pub fn from_name(name: Option<&str>) -> Result<Self> {
        let name = name.unwrap_or("default");
        let (regexes, ignore_merges, default_add_bos): (Vec<String>, bool, bool) = match name {
            "default" => (
                vec![
                    r"[\p{P}\$\+<=>\^~\|]+".into(),
                    GPT2.into(),
                    r"\p{N}+".into(),
                    "[0-9][0-9][0-9]".into(),
                ],
                false,
                false,
            ),
            "gpt2" | "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" | "jina-es" | "jina-de"
            | "jina-v2-es" | "jina-v2-de" | "roberta-bpe" | "exaone4" | "mellum" => {
                (vec![GPT2.into()], false, false)
            }
            "starcoder" | "refact" | "smollm" | "command-r" | "codeshell" | "exaone"
            | "minerva-7b" => (vec![r"\p{N}".into(), GPT2.into()], false, false),
            "falcon" => (
                vec![
                    r"[\p{P}\$\+<=>\^~\|`]+".into(),
                    GPT2.into(),
                    "[0-9][0-9][0-9]".into(),
                ],
                false,
                false,
            ),
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" => {
                (vec![llama3()], true, true)
            }
            "dbrx" | "smaug-bpe" | "chatglm-bpe" => (vec![llama3()], false, false),
            "qwen2" | "deepseek-r1-qwen" | "stablelm2" => (vec![qwen2()], false, false),
            other => {
                return Err(ModelError::Tokenizer(format!(
                    "unsupported pre-tokenizer `{other}` (tokenizer.ggml.pre)"
                )))
            }
        };
        Ok(Self {
            name: name.to_owned(),
            regexes,
            ignore_merges,
            default_add_bos,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_names_resolve_and_unknown_names_fail() {
        let smollm = PreTokenizerSpec::from_name(Some("smollm")).expect("smollm is known");
        assert_eq!(smollm.regexes.len(), 2);
        assert_eq!(smollm.regexes[0], r"\p{N}");
        let default = PreTokenizerSpec::from_name(None).expect("absent means default");
        assert_eq!(default.name, "default");
        assert_eq!(default.regexes.len(), 4);
        let llama3 = PreTokenizerSpec::from_name(Some("llama-bpe")).expect("llama-bpe is known");
        assert!(llama3.ignore_merges && llama3.default_add_bos);
        assert!(llama3.regexes[0].contains(r"\p{N}{1,3}"));
        let qwen = PreTokenizerSpec::from_name(Some("qwen2")).expect("qwen2 is known");
        assert!(qwen.regexes[0].contains(r"|\p{N}|"));
        assert!(PreTokenizerSpec::from_name(Some("no-such-pre")).is_err());
    }
}
