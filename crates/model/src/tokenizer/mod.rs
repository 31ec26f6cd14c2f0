//! Text <-> token ids for a model, built either from a GGUF file's `tokenizer.ggml.*`
//! metadata (tokenizing exactly as llama.cpp does) or from a Hugging Face model directory
//! (`tokenizer.json` + `tokenizer_config.json`).
//!
//! The heavy lifting (regex pre-tokenization, BPE merging, special-token matching) is done by
//! Hugging Face's `tokenizers` crate, configured here; decoding uses our own per-id byte table
//! (see [`pieces`]) so that streaming and whole-text decoding agree byte for byte.

mod build_gguf;
mod byte_level;
mod from_gguf;
mod gguf_vocab;
mod hf_dir;
mod pieces;
mod pre_tokenizer;
mod special_text;

pub use gguf_vocab::{GgufTokenType, GgufTokenizerModel, GgufVocab};
pub use pieces::{PieceEncoding, SpacePrefix, TokenKind};
pub use pre_tokenizer::PreTokenizerSpec;

use std::ops::Range;
use std::path::Path;

use crate::error::{ModelError, Result};
use crate::gguf::Metadata;
use pieces::PieceTable;
use special_text::SpecialText;

/// A model's tokenizer, with its special-token settings and chat template.
///
/// Invariants: every id in `bos_id`/`eos_ids` is `< vocab_size()`; `encode` only produces
/// ids `< vocab_size()`.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    pieces: PieceTable,
    bos_id: Option<u32>,
    eos_ids: Vec<u32>,
    add_bos: bool,
    add_eos: bool,
    bos_token: Option<String>,
    eos_token: Option<String>,
    chat_template: Option<String>,
    /// How the tokenizer was built, for logs (e.g. "gguf gpt2, pre-tokenizer smollm").
    description: String,
    /// Who adds BOS/EOS for `encode(.., true)`.
    specials_by: SpecialsBy,
    /// Special-token texts inside user text.
    special_text: SpecialText,
}

/// Who adds BOS/EOS when encoding a completion prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SpecialsBy {
    /// [`Tokenizer::encode`], from the `add_bos`/`add_eos` flags (GGUF metadata).
    Flags,
    /// tokenizer.json's post-processor (Hugging Face directories, as transformers does).
    PostProcessor,
}

impl Tokenizer {
    /// Builds the tokenizer of a GGUF file from its metadata (`tokenizer.ggml.*`).
    pub fn from_gguf_metadata(meta: &Metadata) -> Result<Self> {
        Self::from_gguf_vocab(&GgufVocab::from_metadata(meta)?)
    }

    /// Builds the tokenizer llama.cpp would use for this GGUF vocabulary.
    pub fn from_gguf_vocab(vocab: &GgufVocab) -> Result<Self> {
        vocab.validate()?;
        let (inner, encoding, default_add_bos, description) = match vocab.model {
            GgufTokenizerModel::Gpt2 => {
                let spec = PreTokenizerSpec::from_name(vocab.pre.as_deref())?;
                let inner = build_gguf::byte_level_bpe(vocab, &spec)?;
                let description = format!("gguf gpt2 byte-level BPE, pre-tokenizer {}", spec.name);
                (
                    inner,
                    PieceEncoding::ByteLevel,
                    spec.default_add_bos,
                    description,
                )
            }
            GgufTokenizerModel::Llama => {
                let inner = build_gguf::sentencepiece_bpe(vocab)?;
                let space_prefix = if vocab.add_space_prefix.unwrap_or(true) {
                    SpacePrefix::EverySegment
                } else {
                    SpacePrefix::Never
                };
                let encoding = PieceEncoding::SentencePiece { space_prefix };
                (
                    inner,
                    encoding,
                    true,
                    "gguf llama SentencePiece BPE".to_owned(),
                )
            }
        };
        let texts: Vec<Option<&str>> = vocab.tokens.iter().map(|t| Some(t.as_str())).collect();
        let kinds = vocab
            .token_types
            .iter()
            .map(|ty| match ty {
                GgufTokenType::Control | GgufTokenType::Unknown => TokenKind::Special,
                GgufTokenType::UserDefined => TokenKind::Added,
                _ => TokenKind::Normal,
            })
            .collect();
        let text_of = |id: Option<u32>| id.map(|id| vocab.tokens[id as usize].clone());
        Ok(Self {
            inner,
            pieces: PieceTable::new(&texts, kinds, encoding),
            bos_id: vocab.bos_id,
            eos_ids: vocab.end_of_generation_ids(),
            add_bos: vocab.add_bos.unwrap_or(default_add_bos) && vocab.bos_id.is_some(),
            add_eos: vocab.add_eos.unwrap_or(false) && vocab.eos_id.is_some(),
            bos_token: text_of(vocab.bos_id),
            eos_token: text_of(vocab.eos_id),
            chat_template: vocab.chat_template.clone(),
            description,
            specials_by: SpecialsBy::Flags,
            special_text: SpecialText::default(),
        })
    }

    /// Loads `tokenizer.json`, `tokenizer_config.json` (and, when present,
    /// `chat_template.jinja` and `generation_config.json`) from a Hugging Face model
    /// directory. As in transformers 5, `encode(.., true)` adds the special tokens that
    /// tokenizer.json's post-processor adds (`add_bos_token` in the config is ignored).
    pub fn from_hf_dir(dir: &Path) -> Result<Self> {
        let parts = hf_dir::load(dir)?;
        Ok(Self {
            inner: parts.inner,
            pieces: parts.pieces,
            bos_id: parts.bos_id,
            eos_ids: parts.eos_ids,
            add_bos: parts.add_bos,
            add_eos: parts.add_eos,
            bos_token: parts.bos_token,
            eos_token: parts.eos_token,
            chat_template: parts.chat_template,
            description: format!("Hugging Face tokenizer.json from {}", dir.display()),
            specials_by: SpecialsBy::PostProcessor,
            special_text: SpecialText::default(),
        })
    }

    /// Token ids of `text`. Special-token texts inside `text` (e.g. `<|im_start|>`) become
    /// their single ids. With `add_special`, BOS (and EOS) are added when the model's
    /// metadata says so: this is the tokenization of a completion prompt.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let by_post_processor = add_special && self.specials_by == SpecialsBy::PostProcessor;
        let encoding = self
            .inner
            .encode_fast(text, by_post_processor)
            .map_err(|e| ModelError::Tokenizer(format!("encoding failed: {e}")))?;
        let body = encoding.get_ids();
        if self.specials_by == SpecialsBy::PostProcessor {
            return Ok(body.to_vec());
        }
        let mut ids = Vec::with_capacity(body.len() + 2);
        if add_special && self.add_bos {
            ids.extend(self.bos_id);
        }
        ids.extend_from_slice(body);
        if add_special && self.add_eos {
            ids.extend(self.eos_ids.first());
        }
        Ok(ids)
    }

    /// The first special-token text (`<|im_start|>`, `<bos>`, ...) in `text`, if any: what
    /// [`Tokenizer::encode`] would turn into a control token.
    pub fn special_text_in<'a>(&'a self, text: &'a str) -> Option<&'a str> {
        self.specials_in(text).next().map(|f| f.text)
    }

    fn specials_in<'a>(&'a self, text: &'a str) -> impl Iterator<Item = special_text::Found<'a>> {
        self.special_text.find_all(text, || {
            (0..self.pieces.len() as u32)
                .filter(|&id| self.is_special(id))
                .filter_map(|id| {
                    let text = std::str::from_utf8(self.token_bytes(id)?).ok()?;
                    Some((text.to_string(), id))
                })
                .collect()
        })
    }

    /// Token ids of `text`, no BOS/EOS, as [`Tokenizer::encode`] gives them, except that
    /// special-token texts inside the byte ranges `literal` (sorted, disjoint) are tokenized
    /// as the text they are: the text is cut at the other special texts, which become their
    /// ids, and the runs between are encoded without special tokens, exactly where and how
    /// `encode` cuts and encodes them.
    pub fn encode_with_literals(&self, text: &str, literal: &[Range<usize>]) -> Result<Vec<u32>> {
        let as_text = self.special_text.as_text(&self.inner);
        let encode = |run: &str| -> Result<Vec<u32>> {
            let encoding = as_text
                .encode_fast(run, false)
                .map_err(|e| ModelError::Tokenizer(format!("encoding failed: {e}")))?;
            Ok(encoding.get_ids().to_vec())
        };
        let overlaps =
            |at: &Range<usize>| literal.iter().any(|l| l.start < at.end && at.start < l.end);
        let mut ids = Vec::new();
        let mut from = 0;
        for found in self.specials_in(text).filter(|f| !overlaps(&f.at)) {
            ids.extend(encode(&text[from..found.at.start])?);
            ids.push(found.id);
            from = found.at.end;
        }
        ids.extend(encode(&text[from..])?);
        Ok(ids)
    }

    /// The text of `ids`. With `skip_special`, control tokens (BOS, EOS, `<|im_end|>`, ...)
    /// are left out. Bytes that do not form valid UTF-8 become U+FFFD. Unknown ids are an
    /// error.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.pieces.decode(ids, skip_special)
    }

    /// The bytes one token stands for on its own (a special token gives its text); `None`
    /// for an id outside the vocabulary. A token may hold part of a UTF-8 character.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.pieces.bytes(id)
    }

    /// The vocabulary string of a token (e.g. `Ġthe` in byte-level vocabularies).
    pub fn token_to_piece(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The id of a vocabulary string or added token, if any.
    pub fn token_to_id(&self, piece: &str) -> Option<u32> {
        self.inner.token_to_id(piece)
    }

    /// Whether `id` is a control token (skipped by `decode(.., true)`).
    pub fn is_special(&self, id: u32) -> bool {
        self.pieces.kind(id) == Some(TokenKind::Special)
    }

    /// Whether `id` is a padding row past the vocabulary ([`Tokenizer::pad_to`]): no text,
    /// and no effect on the text around it.
    pub fn is_padding(&self, id: u32) -> bool {
        self.pieces.kind(id) == Some(TokenKind::Padding)
    }

    /// Size of the id space (ids are `0..vocab_size()`).
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// Makes the id space `n` ids when the vocabulary has fewer: a model whose embedding was
    /// padded (Qwen2.5 and Qwen3 in Hugging Face format: 151,936 rows for about 151,670
    /// tokens) may still sample a padding row, which then decodes to no text and leaves the
    /// text around it as it was, as transformers' `decode` skips it, instead of being an
    /// unknown id.
    pub fn pad_to(&mut self, n: usize) {
        self.pieces.pad_to(n);
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// Ids that end a generation: EOS first, then end-of-turn tokens.
    pub fn eos_ids(&self) -> Vec<u32> {
        self.eos_ids.clone()
    }

    /// Whether `encode(text, true)` starts with BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `encode(text, true)` ends with EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// The BOS token's text, for chat templates.
    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    /// The EOS token's text, for chat templates.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// The model's Jinja chat template, if it has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// How this tokenizer was built, for start-up logs.
    pub fn description(&self) -> &str {
        &self.description
    }
}
