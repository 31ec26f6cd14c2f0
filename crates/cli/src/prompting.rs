//! From user input (text or chat messages, plus sampling settings) to engine jobs.

use std::sync::Arc;

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use tandem_engine::beam_search::BeamParams;
use tandem_engine::sampler::SamplingParams;
use tandem_engine::RequestParams;
use tandem_model::batch::{AdapterId, TokenId};
use tandem_model::chat_template::{ChatMessage, ChatTemplate, RenderOptions};
use tandem_model::tokenizer::Tokenizer;
use tandem_text::{StopStrings, TextOptions};

use crate::args::SamplingArgs;
use crate::generation::Job;

/// Most answers per prompt.
pub const MAX_N: usize = 16;

/// A prompt as the user gave it.
#[derive(Debug, Clone)]
pub enum PromptInput {
    /// Tokenized as a completion prompt (BOS when the model asks for it).
    Text(String),
    /// Rendered through the chat template with the generation prompt.
    Messages(Vec<ChatMessage>),
}

impl PromptInput {
    /// The prompt as echoed in results: the text, or the messages as JSON.
    pub fn display_text(&self) -> String {
        match self {
            PromptInput::Text(t) => t.clone(),
            PromptInput::Messages(m) => serde_json::to_string(m).unwrap_or_default(),
        }
    }
}

/// Per-input settings that override the command line (`--input` lines).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplingOverrides {
    pub max_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i32>,
    pub min_p: Option<f32>,
    pub seed: Option<u64>,
    pub stop: Option<StopField>,
    pub n: Option<usize>,
    pub ignore_eos: Option<bool>,
    pub min_tokens: Option<usize>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub include_stop_str_in_output: Option<bool>,
    pub beam_width: Option<usize>,
    pub length_penalty: Option<f32>,
    /// This request's own number of draft tokens per step (0: no speculation).
    pub num_speculative_tokens: Option<usize>,
}

/// `stop` as one string or a list, as in the OpenAI API.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

/// Tokenizes prompts and turns settings into engine jobs.
#[derive(Debug)]
pub struct PromptBuilder {
    tokenizer: Arc<Tokenizer>,
    template: Option<ChatTemplate>,
    eos: Vec<u32>,
    /// The LoRA adapter every job runs with.
    adapter: Option<AdapterId>,
}

impl PromptBuilder {
    pub fn new(
        tokenizer: Arc<Tokenizer>,
        template: Option<&str>,
        eos: &[TokenId],
    ) -> Result<PromptBuilder> {
        let template = match template {
            Some(src) => Some(ChatTemplate::new(
                src,
                tokenizer.bos_token().map(str::to_string),
                tokenizer.eos_token().map(str::to_string),
            )?),
            None => None,
        };
        Ok(PromptBuilder {
            tokenizer,
            template,
            eos: eos.iter().map(|t| t.0).collect(),
            adapter: None,
        })
    }

    /// Every job runs with `adapter` (`--lora`).
    pub fn with_adapter(mut self, adapter: Option<AdapterId>) -> PromptBuilder {
        self.adapter = adapter;
        self
    }

    /// The prompt's token ids.
    pub fn tokens(&self, input: &PromptInput) -> Result<Vec<TokenId>> {
        let ids = match input {
            PromptInput::Text(t) => self.tokenizer.encode(t, true)?,
            PromptInput::Messages(m) => {
                let template = self
                    .template
                    .as_ref()
                    .context("the model has no chat template")?;
                // Control tokens only from the template, never from a message's text.
                let options = RenderOptions {
                    add_generation_prompt: true,
                    ..RenderOptions::default()
                };
                template.encode(&self.tokenizer, &serde_json::to_value(m)?, &options)?
            }
        };
        if ids.is_empty() {
            bail!("the prompt has no tokens");
        }
        Ok(ids.into_iter().map(TokenId).collect())
    }

    /// The job for one input: `n` samples of its prompt (sharing its KV blocks), or a beam
    /// search.
    pub fn job(
        &self,
        input: &PromptInput,
        args: &SamplingArgs,
        o: &SamplingOverrides,
    ) -> Result<Job> {
        let n = o.n.unwrap_or(args.n);
        if n == 0 || n > MAX_N {
            bail!("n = {n} must be between 1 and {MAX_N}");
        }
        let max_tokens = o.max_tokens.unwrap_or(args.max_tokens);
        if max_tokens == 0 {
            bail!("max_tokens must be at least 1");
        }
        let ignore_eos = o.ignore_eos.unwrap_or(args.ignore_eos);
        let stop = match &o.stop {
            Some(StopField::One(s)) => vec![s.clone()],
            Some(StopField::Many(v)) => v.clone(),
            None => args.stop.clone(),
        };
        let stop = StopStrings::new(stop).context("stop")?;
        let sampling = SamplingParams {
            temperature: o.temperature.unwrap_or(args.temperature),
            top_p: o.top_p.unwrap_or(args.top_p),
            top_k: o.top_k.unwrap_or(args.top_k),
            min_p: o.min_p.unwrap_or(args.min_p),
            seed: o.seed.or(args.seed),
            min_tokens: o.min_tokens.unwrap_or(0),
            presence_penalty: o.presence_penalty.unwrap_or(0.0),
            frequency_penalty: o.frequency_penalty.unwrap_or(0.0),
            repetition_penalty: o.repetition_penalty.unwrap_or(1.0),
            ignore_eos,
            eos_token_ids: self.eos.clone(),
            ..SamplingParams::default()
        };
        let limits = RequestParams {
            max_tokens,
            ignore_eos,
            adapter: self.adapter,
            ..RequestParams::default()
        };
        let text = TextOptions {
            skip_special_tokens: true,
            stop,
            include_stop_str_in_output: o.include_stop_str_in_output.unwrap_or(false),
        };
        let beam = match o.beam_width.or(args.beam_width) {
            None => None,
            Some(width) => {
                let b = BeamParams {
                    width,
                    length_penalty: o.length_penalty.unwrap_or(args.length_penalty),
                };
                b.validate()
                    .map_err(|e| anyhow::anyhow!("beam_width: {e}"))?;
                Some(b)
            }
        };
        Ok(Job {
            prompt: self.tokens(input)?,
            sampling,
            limits,
            text,
            n,
            beam,
            num_speculative_tokens: o.num_speculative_tokens,
        })
    }
}
