//! A finished beam search hypothesis through the same text layer as sampled output.

use std::sync::Arc;

use tandem_engine::beam_search::BeamHypothesis;
use tandem_model::batch::TokenId;
use tandem_model::tokenizer::Tokenizer;

use crate::{TextError, TextOptions, TextStream};

/// One beam search hypothesis as text.
#[derive(Debug, Clone, PartialEq)]
pub struct BeamText {
    /// Every token of the hypothesis (its final stop token included, if it ended on one;
    /// not cut at a stop string).
    pub tokens: Vec<TokenId>,
    /// Its text, cut at the first stop string as for sampled output.
    pub text: String,
    /// Whether a stop string cut the text.
    pub stopped: bool,
    /// Sum of the raw logprobs of `tokens`.
    pub cum_logprob: f32,
    /// The length-normalised score the beams were ranked by.
    pub score: f32,
}

impl BeamText {
    /// The text of `hypothesis` under `options` (skip special tokens, stop strings).
    pub fn new(
        tokenizer: &Arc<Tokenizer>,
        options: &TextOptions,
        hypothesis: BeamHypothesis,
    ) -> Result<BeamText, TextError> {
        let mut stream = TextStream::new(tokenizer.clone(), options.clone());
        let mut text = String::new();
        let mut stopped = false;
        for t in &hypothesis.tokens {
            let delta = stream.push(t.0)?;
            text.push_str(&delta.text);
            if delta.stopped.is_some() {
                stopped = true;
                break;
            }
        }
        if !stopped {
            let tail = stream.finish();
            text.push_str(&tail.text);
            stopped = tail.stopped.is_some();
        }
        Ok(BeamText {
            tokens: hypothesis.tokens,
            text,
            stopped,
            cum_logprob: hypothesis.cum_logprob,
            score: hypothesis.score,
        })
    }
}
