//! Reading the `tokenizer.ggml.*` keys of GGUF metadata into a [`GgufVocab`].

use super::gguf_vocab::{GgufTokenType, GgufTokenizerModel, GgufVocab};
use crate::error::{ModelError, Result};
use crate::gguf::{Metadata, MetadataValue};

/// Whether an optional array key is present (absent arrays have documented defaults).
fn has(meta: &Metadata, key: &str) -> bool {
    meta.get(key).is_some()
}

/// The tokenizer model named by `tokenizer.ggml.model`.
fn tokenizer_model(meta: &Metadata) -> Result<GgufTokenizerModel> {
    match meta.str("tokenizer.ggml.model")? {
        "gpt2" => Ok(GgufTokenizerModel::Gpt2),
        "llama" => Ok(GgufTokenizerModel::Llama),
        other => Err(ModelError::Tokenizer(format!(
            "unsupported tokenizer model `{other}` (supported: gpt2, llama)"
        ))),
    }
}

impl GgufVocab {
    /// Reads and validates the vocabulary of a GGUF file.
    pub fn from_metadata(meta: &Metadata) -> Result<Self> {
        let model = tokenizer_model(meta)?;
        let tokens: Vec<String> = meta
            .str_array("tokenizer.ggml.tokens")?
            .into_iter()
            .map(str::to_owned)
            .collect();
        let token_types = if has(meta, "tokenizer.ggml.token_type") {
            let codes = meta.i32_array("tokenizer.ggml.token_type")?;
            codes.into_iter().map(GgufTokenType::from_code).collect()
        } else {
            vec![GgufTokenType::Normal; tokens.len()]
        };
        let scores = if has(meta, "tokenizer.ggml.scores") {
            Some(meta.f32_array("tokenizer.ggml.scores")?)
        } else {
            None
        };
        let merges = if has(meta, "tokenizer.ggml.merges") {
            let merges = meta.str_array("tokenizer.ggml.merges")?;
            merges.into_iter().map(str::to_owned).collect()
        } else if model == GgufTokenizerModel::Gpt2 {
            return Err(ModelError::Tokenizer(
                "gpt2 vocabulary without merges".into(),
            ));
        } else {
            Vec::new()
        };
        let extra_eog_ids = ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"]
            .iter()
            .filter_map(|key| meta.opt_u32(key).transpose())
            .collect::<Result<Vec<u32>, _>>()?;
        let chat_template = match meta.get("tokenizer.chat_template") {
            Some(MetadataValue::String(s)) => Some(s.clone()),
            _ => None,
        };
        let vocab = GgufVocab {
            model,
            pre: meta.opt_str("tokenizer.ggml.pre")?.map(str::to_owned),
            tokens,
            token_types,
            scores,
            merges,
            bos_id: meta.opt_u32("tokenizer.ggml.bos_token_id")?,
            eos_id: meta.opt_u32("tokenizer.ggml.eos_token_id")?,
            extra_eog_ids,
            unk_id: meta.opt_u32("tokenizer.ggml.unknown_token_id")?,
            add_bos: meta.opt_bool("tokenizer.ggml.add_bos_token")?,
            add_eos: meta.opt_bool("tokenizer.ggml.add_eos_token")?,
            add_space_prefix: meta.opt_bool("tokenizer.ggml.add_space_prefix")?,
            chat_template,
        };
        vocab.validate()?;
        Ok(vocab)
    }
}
