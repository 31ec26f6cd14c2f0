//! Prompts to token ids: a completion prompt is tokenized with the model's special tokens
//! (BOS when its metadata asks for it); a conversation is rendered through the chat
//! template (which writes its own special tokens) and tokenized without adding any.
//! This is what the CLI does too.

use std::sync::Arc;

use tandem_model::batch::TokenId;
use tandem_model::chat_template::{ChatMessage, ChatTemplate, RenderOptions};
use tandem_model::error::ModelError;
use tandem_model::tokenizer::Tokenizer;

use crate::error::{ApiError, ApiResult, ServerError};

/// Tokenizes prompts of both kinds.
#[derive(Debug)]
pub struct PromptBuilder {
    tokenizer: Arc<Tokenizer>,
    template: Option<ChatTemplate>,
    template_source: Option<String>,
}

impl PromptBuilder {
    /// `template`: the chat template's source, when the model has one.
    pub fn new(tokenizer: Arc<Tokenizer>, template: Option<&str>) -> Result<Self, ServerError> {
        let template_source = template;
        let template = template
            .map(|src| {
                ChatTemplate::new(
                    src,
                    tokenizer.bos_token().map(str::to_string),
                    tokenizer.eos_token().map(str::to_string),
                )
                .map_err(|e| ServerError::ChatTemplate(e.to_string()))
            })
            .transpose()?;
        Ok(Self {
            tokenizer,
            template,
            template_source: template_source.map(str::to_string),
        })
    }

    /// The chat template's source, when the model has one.
    pub fn template_source(&self) -> Option<&str> {
        self.template_source.as_deref()
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// A completion prompt's ids; `param` names the field in errors.
    pub fn text(&self, text: &str, add_special: bool, param: &str) -> ApiResult<Vec<TokenId>> {
        let ids = self
            .tokenizer
            .encode(text, add_special)
            .map_err(|e| ApiError::field(param, e))?;
        Ok(ids.into_iter().map(TokenId).collect())
    }

    /// The model's chat template, or a 400 on `messages` when it has none.
    fn template(&self) -> ApiResult<&ChatTemplate> {
        self.template
            .as_ref()
            .ok_or_else(|| ApiError::field("messages", "the model has no chat template"))
    }

    /// The ids of a conversation rendered through the chat template.
    pub fn chat(
        &self,
        messages: &[ChatMessage],
        options: &RenderOptions<'_>,
    ) -> ApiResult<Vec<TokenId>> {
        let messages = serde_json::to_value(messages)
            .map_err(|e| ApiError::internal(format!("messages as JSON: {e}")))?;
        self.chat_json(&messages, options)
    }

    /// The ids of a conversation given as JSON messages, with the request's tools and extra
    /// template variables. Control tokens come only from the template: special-token text
    /// in a message stays text ([`ChatTemplate::encode`]).
    pub fn chat_json(
        &self,
        messages: &serde_json::Value,
        options: &RenderOptions<'_>,
    ) -> ApiResult<Vec<TokenId>> {
        let ids = self
            .template()?
            .encode(&self.tokenizer, messages, options)
            .map_err(rendering_error)?;
        Ok(ids.into_iter().map(TokenId).collect())
    }

    /// Checks that every id is in the vocabulary.
    pub fn check_ids(&self, ids: &[u32], param: &str) -> ApiResult<()> {
        let vocab = self.tokenizer.vocab_size();
        match ids.iter().find(|&&id| id as usize >= vocab) {
            Some(id) => Err(ApiError::field(
                param,
                format!("token id {id} is outside the vocabulary [0, {vocab})"),
            )),
            None => Ok(()),
        }
    }
}

/// A failed rendering: the request's fault (400 naming `messages`: the template raised, or
/// cannot render what was sent; or naming `chat_template_kwargs`), or the template's own
/// (500: it spent its budget).
fn rendering_error(e: ModelError) -> ApiError {
    match e {
        ModelError::ChatTemplateBudget(_) => ApiError::internal(e.to_string()),
        ModelError::ChatTemplateKwargs(_) => ApiError::field("chat_template_kwargs", e),
        e => ApiError::field("messages", e),
    }
}
