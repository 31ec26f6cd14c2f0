//! The bytes each token id stands for, and decoding of id sequences to text.
//!
//! Decoding is done here rather than by `tokenizers`' decoders so that the bytes of a single
//! token ([`PieceTable::bytes`]) and the decoding of a whole sequence agree by construction:
//! the decoded text is the UTF-8 (lossy) reading of the concatenated token bytes, except for
//! the one space SentencePiece vocabularies prepend to each stretch of ordinary text.

use std::collections::HashMap;

use super::build_gguf::SPM_SPACE;
use super::byte_level;
use crate::error::{ModelError, Result};

/// How a token takes part in encoding and decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// A piece produced by the tokenization algorithm.
    Normal,
    /// A control token (BOS, EOS, `<|im_start|>`, ...): matched verbatim in text, dropped
    /// from decoded text when special tokens are skipped.
    Special,
    /// A user-defined added token: matched verbatim in text, always decoded.
    Added,
    /// An id past the vocabulary that the model has a row for (a padded embedding): never
    /// produced by encoding, and no text at all when decoded, as if it were absent.
    Padding,
}

/// How vocabulary strings of normal tokens spell bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceEncoding {
    /// GPT-2 byte-level alphabet (one character per byte).
    ByteLevel,
    /// SentencePiece: `▁` is a space, `<0xNN>` is the byte NN, anything else is UTF-8 text.
    /// The space that encoding put in front of text (`space_prefix`) is removed again.
    SentencePiece { space_prefix: SpacePrefix },
}

/// Where SentencePiece encoding adds a space in front of the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpacePrefix {
    /// Never (`add_space_prefix = false`).
    Never,
    /// Before the text only when it starts the input (Metaspace `prepend_scheme: first`):
    /// decoding strips it from the first ordinary token if only control tokens precede it.
    First,
    /// Before every stretch of text between special tokens (llama.cpp; the legacy Llama
    /// `Prepend` normalizer): decoding strips it after the start and after every
    /// special or added token.
    EverySegment,
}

/// Per-id bytes and kinds. Invariant: `bytes.len() == kinds.len()` = the id space size.
#[derive(Debug, Clone)]
pub(crate) struct PieceTable {
    bytes: Vec<Vec<u8>>,
    kinds: Vec<TokenKind>,
    encoding: PieceEncoding,
}

/// The byte a SentencePiece byte-fallback piece `<0xNN>` stands for.
fn spm_byte_piece(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

impl PieceTable {
    /// Builds the table from each id's vocabulary string (`None` for unused ids) and kind.
    pub fn new(texts: &[Option<&str>], kinds: Vec<TokenKind>, encoding: PieceEncoding) -> Self {
        assert_eq!(texts.len(), kinds.len(), "one kind per token id");
        let char_map: HashMap<char, u8> = byte_level::char_to_byte_map();
        let bytes = texts
            .iter()
            .zip(&kinds)
            .map(|(text, kind)| {
                let Some(text) = text else {
                    return Vec::new();
                };
                match (kind, encoding) {
                    (TokenKind::Padding, _) => Vec::new(),
                    (TokenKind::Special | TokenKind::Added, _) => text.as_bytes().to_vec(),
                    (TokenKind::Normal, PieceEncoding::ByteLevel) => {
                        byte_level::decode_piece(text, &char_map)
                            .unwrap_or_else(|| text.as_bytes().to_vec())
                    }
                    (TokenKind::Normal, PieceEncoding::SentencePiece { .. }) => {
                        match spm_byte_piece(text) {
                            Some(b) => vec![b],
                            None => text.replace(SPM_SPACE, " ").into_bytes(),
                        }
                    }
                }
            })
            .collect();
        Self {
            bytes,
            kinds,
            encoding,
        }
    }

    /// Number of ids in the table.
    pub fn len(&self) -> usize {
        self.kinds.len()
    }

    /// Extends the id space to `n` ids with [`TokenKind::Padding`] tokens.
    pub fn pad_to(&mut self, n: usize) {
        if n > self.len() {
            self.bytes.resize(n, Vec::new());
            self.kinds.resize(n, TokenKind::Padding);
        }
    }

    /// The bytes of one token in isolation, `None` for an id outside the vocabulary.
    pub fn bytes(&self, id: u32) -> Option<&[u8]> {
        self.bytes.get(id as usize).map(Vec::as_slice)
    }

    /// The kind of one token, `None` for an id outside the vocabulary.
    pub fn kind(&self, id: u32) -> Option<TokenKind> {
        self.kinds.get(id as usize).copied()
    }

    /// The text of `ids`; invalid UTF-8 (e.g. a cut multi-byte character) becomes U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        let prefix = match self.encoding {
            PieceEncoding::SentencePiece { space_prefix } => space_prefix,
            PieceEncoding::ByteLevel => SpacePrefix::Never,
        };
        let mut out: Vec<u8> = Vec::new();
        // Whether the next ordinary token starts a stretch of text that got a space prefix.
        let mut at_text_start = prefix != SpacePrefix::Never;
        for &id in ids {
            let kind = self.kind(id).ok_or_else(|| {
                ModelError::Tokenizer(format!("token id {id} is outside the vocabulary"))
            })?;
            let bytes = &self.bytes[id as usize];
            if kind == TokenKind::Padding {
                continue;
            }
            if kind == TokenKind::Normal {
                let skip = usize::from(at_text_start && bytes.first() == Some(&b' '));
                out.extend_from_slice(&bytes[skip..]);
                at_text_start = false;
                continue;
            }
            if !(kind == TokenKind::Special && skip_special) {
                out.extend_from_slice(bytes);
            }
            if prefix == SpacePrefix::EverySegment {
                at_text_start = true;
            } else if prefix == SpacePrefix::First && kind == TokenKind::Added {
                at_text_start = false;
            }
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentencepiece_pieces_and_prefix_stripping() {
        let texts = [Some("<s>"), Some("▁hi"), Some("<0x0A>"), Some("▁▁x"), None];
        let kinds = vec![
            TokenKind::Special,
            TokenKind::Normal,
            TokenKind::Normal,
            TokenKind::Normal,
            TokenKind::Normal,
        ];
        let spm = PieceEncoding::SentencePiece {
            space_prefix: SpacePrefix::EverySegment,
        };
        let table = PieceTable::new(&texts, kinds, spm);
        assert_eq!(table.bytes(1), Some(&b" hi"[..]));
        assert_eq!(table.bytes(2), Some(&b"\n"[..]));
        assert_eq!(table.bytes(4), Some(&b""[..]));
        assert_eq!(table.bytes(5), None);
        assert_eq!(table.decode(&[1, 1], false).expect("valid ids"), "hi hi");
        assert_eq!(
            table.decode(&[0, 3, 2], false).expect("valid ids"),
            "<s> x\n"
        );
        assert_eq!(table.decode(&[0, 1], true).expect("valid ids"), "hi");
        assert!(table.decode(&[7], false).is_err());
        let first = PieceEncoding::SentencePiece {
            space_prefix: SpacePrefix::First,
        };
        let kinds = vec![TokenKind::Special, TokenKind::Normal, TokenKind::Normal];
        let table = PieceTable::new(&texts[..3], kinds, first);
        assert_eq!(
            table.decode(&[0, 1, 0, 1], false).expect("valid ids"),
            "<s>hi<s> hi"
        );
    }

    #[test]
    fn byte_level_pieces_join_split_characters() {
        // "é" is C3 A9: byte-level characters `Ã` (C3) and `©` (A9).
        let texts = [Some("Ã"), Some("©"), Some("<|im_end|>")];
        let kinds = vec![TokenKind::Normal, TokenKind::Normal, TokenKind::Special];
        let table = PieceTable::new(&texts, kinds, PieceEncoding::ByteLevel);
        assert_eq!(table.decode(&[0, 1], false).expect("valid ids"), "é");
        assert_eq!(table.decode(&[0], false).expect("valid ids"), "\u{FFFD}");
        assert_eq!(table.decode(&[0, 1, 2], true).expect("valid ids"), "é");
        assert_eq!(table.decode(&[2], false).expect("valid ids"), "<|im_end|>");
    }
}
