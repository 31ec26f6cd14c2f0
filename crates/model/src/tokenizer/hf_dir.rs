//! Loading a tokenizer from a Hugging Face model directory: `tokenizer.json` (required),
//! `tokenizer_config.json` (special tokens, chat template),
//! `chat_template.jinja` (newer checkpoints keep the template there) and
//! `generation_config.json` (extra end-of-generation ids).

use std::path::Path;
use std::str::FromStr;

use serde_json::Value as Json;

use super::pieces::{PieceEncoding, PieceTable, SpacePrefix, TokenKind};
use crate::error::{ModelError, Result};

/// Reads and parses an optional JSON file; `Ok(None)` when it does not exist.
fn read_json(path: &Path) -> Result<Option<Json>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| ModelError::Tokenizer(format!("{}: {e}", path.display())))
}

/// A special token given as `"<s>"` or as `{"content": "<s>", ...}`.
fn token_text(value: Option<&Json>) -> Option<String> {
    match value? {
        Json::String(s) => Some(s.clone()),
        Json::Object(map) => map.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}

/// `chat_template` is a string or a list of `{"name", "template"}` (the "default" one wins).
fn config_chat_template(config: &Json) -> Option<String> {
    match config.get("chat_template")? {
        Json::String(s) => Some(s.clone()),
        Json::Array(items) => {
            let named = |name: &str| {
                items
                    .iter()
                    .find(|t| t.get("name").and_then(Json::as_str) == Some(name))
            };
            let chosen = named("default").or_else(|| items.first())?;
            chosen.get("template")?.as_str().map(str::to_owned)
        }
        _ => None,
    }
}

/// How the vocabulary spells bytes, read from the `decoder` section of tokenizer.json.
fn piece_encoding(tokenizer_json: &Json) -> Result<PieceEncoding> {
    let decoder = tokenizer_json
        .get("decoder")
        .map(Json::to_string)
        .unwrap_or_default();
    if decoder.contains("\"ByteLevel\"") {
        return Ok(PieceEncoding::ByteLevel);
    }
    if decoder.contains("ByteFallback")
        || decoder.contains("Metaspace")
        || decoder.contains('\u{2581}')
    {
        let pre = tokenizer_json
            .get("pre_tokenizer")
            .map(Json::to_string)
            .unwrap_or_default();
        let normalizer = tokenizer_json
            .get("normalizer")
            .map(Json::to_string)
            .unwrap_or_default();
        let space_prefix = if normalizer.contains("\"Prepend\"") {
            SpacePrefix::EverySegment
        } else if pre.contains("\"prepend_scheme\":\"first\"") {
            SpacePrefix::First
        } else if pre.contains("\"prepend_scheme\":\"always\"") {
            SpacePrefix::EverySegment
        } else {
            SpacePrefix::Never
        };
        return Ok(PieceEncoding::SentencePiece { space_prefix });
    }
    Err(ModelError::Tokenizer(format!(
        "unsupported tokenizer.json decoder {decoder} (expected byte-level or SentencePiece)"
    )))
}

/// Everything `Tokenizer::from_hf_dir` needs, read from the directory.
pub(crate) struct HfParts {
    pub inner: tokenizers::Tokenizer,
    pub pieces: PieceTable,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub bos_id: Option<u32>,
    pub eos_ids: Vec<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    pub chat_template: Option<String>,
}

/// The per-id piece table of a loaded `tokenizers::Tokenizer`.
fn piece_table(inner: &tokenizers::Tokenizer, encoding: PieceEncoding) -> PieceTable {
    let vocab = inner.get_vocab(true);
    let size = vocab.values().map(|&id| id as usize + 1).max().unwrap_or(0);
    let mut texts: Vec<Option<&str>> = vec![None; size];
    for (text, &id) in &vocab {
        texts[id as usize] = Some(text.as_str());
    }
    let mut kinds = vec![TokenKind::Normal; size];
    for (id, added) in inner.get_added_tokens_decoder() {
        if let Some(kind) = kinds.get_mut(id as usize) {
            *kind = if added.special {
                TokenKind::Special
            } else {
                TokenKind::Added
            };
        }
    }
    PieceTable::new(&texts, kinds, encoding)
}

/// Whether tokenizer.json's post-processor adds special tokens (before, after) a sequence,
/// found by encoding "a" with and without them.
fn post_processor_adds(inner: &tokenizers::Tokenizer) -> (bool, bool) {
    let encode = |with: bool| inner.encode_fast("a", with).map(|e| e.get_ids().to_vec());
    let (Ok(plain), Ok(full)) = (encode(false), encode(true)) else {
        return (false, false);
    };
    if plain.is_empty() || full.len() < plain.len() {
        return (false, false);
    }
    match full
        .windows(plain.len())
        .position(|w| w == plain.as_slice())
    {
        Some(start) => (start > 0, start + plain.len() < full.len()),
        None => (false, false),
    }
}

/// Reads the tokenizer files of a Hugging Face model directory.
pub(crate) fn load(dir: &Path) -> Result<HfParts> {
    let json_path = dir.join("tokenizer.json");
    let text = std::fs::read_to_string(&json_path).map_err(|source| ModelError::Io {
        path: json_path.clone(),
        source,
    })?;
    let bad =
        |e: &dyn std::fmt::Display| ModelError::Tokenizer(format!("{}: {e}", json_path.display()));
    let tokenizer_json: Json = serde_json::from_str(&text).map_err(|e| bad(&e))?;
    let inner = tokenizers::Tokenizer::from_str(&text).map_err(|e| bad(&e))?;
    let pieces = piece_table(&inner, piece_encoding(&tokenizer_json)?);
    let config = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or(Json::Null);
    let bos_token = token_text(config.get("bos_token"));
    let eos_token = token_text(config.get("eos_token"));
    let bos_id = bos_token.as_deref().and_then(|t| inner.token_to_id(t));
    let mut eos_ids: Vec<u32> = eos_token
        .as_deref()
        .and_then(|t| inner.token_to_id(t))
        .into_iter()
        .collect();
    if let Some(gen) = read_json(&dir.join("generation_config.json"))? {
        let extra = match gen.get("eos_token_id") {
            Some(Json::Array(items)) => items.iter().filter_map(Json::as_u64).collect(),
            Some(v) => v.as_u64().into_iter().collect(),
            None => Vec::new(),
        };
        for id in extra.into_iter().filter_map(|id| u32::try_from(id).ok()) {
            if (id as usize) < pieces.len() && !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
    }
    // As in transformers 5: with a tokenizer.json, its post-processor alone decides which
    // special tokens a sequence gets (`add_bos_token` in tokenizer_config.json is ignored).
    let (add_bos, add_eos) = post_processor_adds(&inner);
    let jinja_path = dir.join("chat_template.jinja");
    let chat_template = if jinja_path.is_file() {
        Some(
            std::fs::read_to_string(&jinja_path).map_err(|source| ModelError::Io {
                path: jinja_path.clone(),
                source,
            })?,
        )
    } else {
        config_chat_template(&config)
    };
    Ok(HfParts {
        inner,
        pieces,
        add_bos,
        add_eos,
        bos_token,
        eos_token,
        bos_id,
        eos_ids,
        chat_template,
    })
}
