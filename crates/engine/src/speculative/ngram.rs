//! N-gram (prompt lookup) proposer: for `n` from `max_n` down to `min_n`, find the latest
//! earlier occurrence of the sequence's last `n` tokens and propose the tokens that followed
//! it. The continuation is read from the sequence extended by the drafts themselves, so a
//! periodic run (`a b a b a b`) proposes a full `k` tokens. Drafts are certain (one-hot).

use tandem_model::batch::TokenId;

use super::{Proposal, ProposalInput, Proposer};
use crate::error::{EngineError, Result};

/// Prompt-lookup proposer over prompt + output.
#[derive(Debug, Clone)]
pub struct NgramProposer {
    min_n: usize,
    max_n: usize,
}

impl NgramProposer {
    /// Matches of `n` tokens, `1 <= min_n <= n <= max_n`.
    pub fn new(min_n: usize, max_n: usize) -> Result<NgramProposer> {
        if min_n == 0 || min_n > max_n {
            return Err(EngineError::InvalidConfig(format!(
                "n-gram sizes must satisfy 1 <= min <= max, got [{min_n}, {max_n}]"
            )));
        }
        Ok(NgramProposer { min_n, max_n })
    }
}

impl Default for NgramProposer {
    /// Matches of 1 to 3 tokens (the longest wins).
    fn default() -> NgramProposer {
        NgramProposer { min_n: 1, max_n: 3 }
    }
}

impl Proposer for NgramProposer {
    fn propose(&mut self, inputs: &[ProposalInput<'_>]) -> Result<Vec<Proposal>> {
        Ok(inputs
            .iter()
            .map(|i| Proposal {
                tokens: lookup(i.tokens, self.min_n, self.max_n, i.max_drafts),
                dists: None,
            })
            .collect())
    }

    fn name(&self) -> &'static str {
        "ngram"
    }
}

/// Up to `k` tokens following the latest earlier occurrence of the longest suffix of `tokens`
/// of `min_n..=max_n` tokens; empty when no suffix recurs.
pub fn lookup(tokens: &[TokenId], min_n: usize, max_n: usize, k: usize) -> Vec<TokenId> {
    let len = tokens.len();
    for n in (min_n..=max_n.min(len.saturating_sub(1))).rev() {
        let pattern = &tokens[len - n..];
        // Occurrences start at j < len - n (the suffix itself is excluded): latest first.
        let Some(j) = (0..len - n).rev().find(|&j| &tokens[j..j + n] == pattern) else {
            continue;
        };
        let start = j + n; // < len
        let mut drafts = Vec::with_capacity(k);
        for m in 0..k {
            let at = start + m;
            let t = if at < len {
                tokens[at]
            } else {
                drafts[at - len]
            };
            drafts.push(t);
        }
        return drafts;
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: &[u32]) -> Vec<TokenId> {
        v.iter().copied().map(TokenId).collect()
    }

    #[test]
    fn longest_suffix_wins_over_a_later_shorter_match() {
        // Suffix [1, 2]: occurs at 0 (followed by 7 8); [2] alone recurs later (followed by 9).
        let toks = t(&[1, 2, 7, 8, 2, 9, 1, 2]);
        assert_eq!(lookup(&toks, 1, 2, 2), t(&[7, 8]));
        assert_eq!(lookup(&toks, 1, 1, 2), t(&[9, 1]));
    }

    #[test]
    fn latest_occurrence_is_used() {
        let toks = t(&[5, 1, 5, 2, 5]);
        assert_eq!(lookup(&toks, 1, 1, 1), t(&[2]));
    }

    #[test]
    fn periodic_runs_continue_through_the_drafts() {
        let toks = t(&[3, 4, 3, 4]);
        assert_eq!(lookup(&toks, 2, 2, 5), t(&[3, 4, 3, 4, 3]));
        assert_eq!(lookup(&t(&[7, 7]), 1, 3, 3), t(&[7, 7, 7]));
    }

    #[test]
    fn nothing_to_copy_proposes_nothing() {
        assert!(lookup(&t(&[1, 2, 3, 4]), 1, 3, 4).is_empty());
        assert!(lookup(&t(&[1]), 1, 3, 4).is_empty());
        assert!(NgramProposer::new(0, 2).is_err());
        assert!(NgramProposer::new(3, 2).is_err());
    }
}
