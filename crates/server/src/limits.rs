//! Bounds on what one request may ask for (ARCHITECTURE.md § Request bounds and errors), each
//! configurable by a `tandem serve` flag. A request over a bound gets a 400 naming the field (413
//! for the body size, 429 when the waiting queue is full); nothing is clamped silently.

use tandem_engine::sampler::MAX_TOP_LOGPROBS;

/// The server's per-request bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestLimits {
    /// Request bodies above this many bytes get 413.
    pub max_body_bytes: usize,
    /// Most choices per prompt (`n`).
    pub max_n: usize,
    /// Most output tokens one choice may ask for (`max_tokens`, `max_completion_tokens`);
    /// `None`: up to the maximum model length. Chat's default (the rest of the context) is
    /// capped by it too.
    pub max_output_tokens: Option<usize>,
    /// Most tokens in one prompt; `None`: the maximum model length less one (room for one
    /// output token). A prompt at or beyond the model length is always refused.
    pub max_prompt_tokens: Option<usize>,
    /// Most prompts in one `/v1/completions` request (`prompt` as a list).
    pub max_prompts: usize,
    /// Most `stop` strings.
    pub max_stop_strings: usize,
    /// Longest `stop` string, in bytes.
    pub max_stop_length: usize,
    /// Most `logit_bias` entries (their ids must be in the vocabulary regardless).
    pub max_logit_bias: usize,
    /// Most alternatives per token (`logprobs`, `top_logprobs`, `prompt_logprobs`); at most
    /// the engine's own ceiling [`MAX_TOP_LOGPROBS`].
    pub max_top_logprobs: usize,
    /// Most sequences one `/v1/score` request may score.
    pub max_score_items: usize,
    /// Most sequences waiting for their first step; a request that would exceed it gets 429
    /// with `Retry-After`.
    pub max_waiting_requests: usize,
    /// Largest structured-output grammar (JSON schema text, regex, choices, Lark grammar),
    /// in bytes (`--max-grammar-bytes`).
    pub max_grammar_bytes: usize,
    /// Most grammars compiling at once (`--max-grammar-compiles`). A compile past its time
    /// limit is refused but runs on to its end (its lexer fuel bounds it) and keeps its slot
    /// until then, so hostile grammars occupy at most this many threads; a request that
    /// finds every slot taken for the time limit gets 429 with `Retry-After`.
    pub max_grammar_compiles: usize,
}

/// Default `--max-grammar-bytes`: 64 KiB.
pub const DEFAULT_MAX_GRAMMAR_BYTES: usize = 64 << 10;
/// Default `--max-grammar-compiles`.
pub const DEFAULT_MAX_GRAMMAR_COMPILES: usize = 4;
/// Default limit on a request body, in bytes.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 << 20;
/// Default limit on the sequences of one `/v1/score` request.
pub const DEFAULT_MAX_SCORE_ITEMS: usize = 64;
/// Default limit on the waiting queue.
pub const DEFAULT_MAX_WAITING_REQUESTS: usize = 256;

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_n: 16,
            max_output_tokens: None,
            max_prompt_tokens: None,
            max_prompts: 64,
            max_stop_strings: 16,
            max_stop_length: 256,
            max_logit_bias: 1024,
            max_top_logprobs: MAX_TOP_LOGPROBS,
            max_score_items: DEFAULT_MAX_SCORE_ITEMS,
            max_waiting_requests: DEFAULT_MAX_WAITING_REQUESTS,
            max_grammar_bytes: DEFAULT_MAX_GRAMMAR_BYTES,
            max_grammar_compiles: DEFAULT_MAX_GRAMMAR_COMPILES,
        }
    }
}

impl RequestLimits {
    /// Refuses bounds that would refuse every request (zero) or exceed what the engine can
    /// do (`max_top_logprobs` above [`MAX_TOP_LOGPROBS`]); names the flag.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("--max-body-bytes", self.max_body_bytes),
            ("--max-n", self.max_n),
            ("--max-output-tokens", self.max_output_tokens.unwrap_or(1)),
            ("--max-prompt-tokens", self.max_prompt_tokens.unwrap_or(1)),
            ("--max-prompts", self.max_prompts),
            ("--max-stop-length", self.max_stop_length),
            ("--max-score-items", self.max_score_items),
            ("--max-waiting-requests", self.max_waiting_requests),
            ("--max-grammar-bytes", self.max_grammar_bytes),
            ("--max-grammar-compiles", self.max_grammar_compiles),
        ];
        if let Some((flag, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("{flag} must be at least 1"));
        }
        if self.max_top_logprobs > MAX_TOP_LOGPROBS {
            return Err(format!(
                "--max-top-logprobs must be at most {MAX_TOP_LOGPROBS}, got {}",
                self.max_top_logprobs
            ));
        }
        Ok(())
    }

    /// The longest prompt for a model of `max_model_len` tokens.
    pub fn prompt_tokens(&self, max_model_len: usize) -> usize {
        let room = max_model_len.saturating_sub(1);
        self.max_prompt_tokens.map_or(room, |m| m.min(room))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_zero_bounds_are_refused() {
        assert_eq!(RequestLimits::default().validate(), Ok(()));
        let l = RequestLimits {
            max_n: 0,
            ..RequestLimits::default()
        };
        assert!(l.validate().unwrap_err().contains("--max-n"));
        let l = RequestLimits {
            max_grammar_compiles: 0,
            ..RequestLimits::default()
        };
        assert!(l.validate().unwrap_err().contains("--max-grammar-compiles"));
        let l = RequestLimits {
            max_top_logprobs: MAX_TOP_LOGPROBS + 1,
            ..RequestLimits::default()
        };
        assert!(l.validate().unwrap_err().contains("--max-top-logprobs"));
    }

    #[test]
    fn prompt_bound_leaves_room_for_one_token() {
        let mut l = RequestLimits::default();
        assert_eq!(l.prompt_tokens(100), 99);
        l.max_prompt_tokens = Some(10);
        assert_eq!(l.prompt_tokens(100), 10);
        assert_eq!(l.prompt_tokens(5), 4);
    }
}
