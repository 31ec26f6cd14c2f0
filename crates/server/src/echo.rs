//! The prompt side of a completion choice: `echo` (the prompt's text and tokens go first in
//! the choice) and the prompt's scores (for `echo` with `logprobs`, and vLLM's
//! `prompt_logprobs`).
//!
//! The engine sends a request's prompt scores before any of its tokens; the output processor
//! hands them over, prompt index 1 first, with the request's first output. [`PromptSide`]
//! keeps them and, on the choice's *first* update (streamed or not), prepends the echoed
//! prompt text to the update's text and the prompt tokens to its tokens, and attaches every
//! prompt score. So a
//! stream sends the echoed prompt in its first chunk (as vLLM does), and the concatenated
//! stream equals the non-streamed body by construction.

use tandem_engine::engine::PromptTokenLogprob;

use crate::generation::{ChoiceUpdate, TokenInfo};

/// The prompt a choice echoes.
#[derive(Debug, Clone, PartialEq)]
pub struct EchoPrompt {
    /// The prompt's text: as given, or the decoded ids of a token-id prompt.
    pub text: String,
    /// The prompt's token ids.
    pub ids: Vec<u32>,
    /// Alternatives per echoed token in the legacy `top_logprobs` (the request's `logprobs`).
    pub top_k: usize,
}

/// One choice's prompt: what to echo, the scores received so far, whether its first update
/// went out.
#[derive(Debug, Default)]
pub struct PromptSide {
    echo: Option<EchoPrompt>,
    /// Scores of prompt indices `1..=scores.len()`.
    scores: Vec<PromptTokenLogprob>,
    sent: bool,
}

impl PromptSide {
    pub fn new(echo: Option<EchoPrompt>) -> PromptSide {
        PromptSide {
            echo,
            ..PromptSide::default()
        }
    }

    /// Adds the scores that came with the choice's first output (prompt indices `1..`, in
    /// order: the output processor checked them).
    pub fn push(&mut self, entries: Vec<PromptTokenLogprob>) {
        self.scores.extend(entries);
    }

    /// Completes the choice's first update (later updates pass unchanged): the echoed text
    /// and tokens go first, and the update carries every prompt score.
    pub fn first_update(&mut self, update: &mut ChoiceUpdate) {
        if std::mem::replace(&mut self.sent, true) {
            return;
        }
        if let Some(echo) = &self.echo {
            update.text.insert_str(0, &echo.text);
            let prompt = echo.ids.iter().enumerate().map(|(i, &id)| {
                let score = i.checked_sub(1).and_then(|j| self.scores.get(j));
                TokenInfo {
                    id,
                    logprob: score.map(|s| s.logprob),
                    top: score.map_or_else(Vec::new, |s| {
                        let top = &s.top[..echo.top_k.min(s.top.len())];
                        top.iter().map(|&(t, l)| (t.0, l)).collect()
                    }),
                }
            });
            let generated = std::mem::take(&mut update.tokens);
            update.tokens = prompt.chain(generated).collect();
        }
        update.prompt = std::mem::take(&mut self.scores);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_model::batch::TokenId;

    fn score(token: u32, logprob: f32) -> PromptTokenLogprob {
        PromptTokenLogprob {
            token: TokenId(token),
            logprob,
            rank: 1,
            top: vec![(TokenId(token), logprob), (TokenId(99), -9.0)],
        }
    }

    #[test]
    fn the_first_update_echoes_the_prompt_with_its_scores() {
        let echo = EchoPrompt {
            text: "ab".into(),
            ids: vec![5, 6, 7],
            top_k: 1,
        };
        let mut side = PromptSide::new(Some(echo));
        side.push(vec![score(6, -1.0)]);
        side.push(vec![score(7, -2.0)]);
        let generated = TokenInfo {
            id: 8,
            logprob: Some(-0.5),
            top: vec![],
        };
        let mut u = ChoiceUpdate {
            index: 0,
            text: "c".into(),
            tokens: vec![generated.clone()],
            finish: None,
            prompt: Vec::new(),
        };
        side.first_update(&mut u);
        assert_eq!(u.text, "abc");
        let ids: Vec<u32> = u.tokens.iter().map(|t| t.id).collect();
        assert_eq!(ids, vec![5, 6, 7, 8]);
        assert_eq!(
            u.tokens[0].logprob, None,
            "nothing predicts the first token"
        );
        assert_eq!(u.tokens[1].logprob, Some(-1.0));
        assert_eq!(u.tokens[2].top, vec![(7, -2.0)], "top_k alternatives only");
        assert_eq!(u.tokens[3], generated);
        assert_eq!(u.prompt.len(), 2);
        let mut later = ChoiceUpdate {
            text: "d".into(),
            ..u.clone()
        };
        later.prompt.clear();
        side.first_update(&mut later);
        assert_eq!(later.text, "d", "only the first update echoes");
        assert!(
            later.prompt.is_empty(),
            "scores go with the first update only"
        );
    }
}
