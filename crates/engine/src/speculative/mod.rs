//! Speculative decoding (ARCHITECTURE.md § Speculative decoding; § Invariants, 6): a cheap
//! [`Proposer`] guesses up to `k` tokens that follow a sequence; the target model computes the
//! sequence's last token and the `k` drafts in one forward pass (1 + k output rows);
//! [`verify::verify`] keeps the accepted prefix and one more token, so the emitted tokens follow
//! exactly the distribution plain decoding samples from, and greedy output is token-for-token the
//! same.
//!
//! - [`ngram`]: prompt lookup: the tokens that followed the latest earlier occurrence of the
//!   last `n` tokens (longest `n` in `[min_n, max_n]` first);
//! - [`draft_model`]: a second model with the same vocabulary and its own KV blocks, kept in
//!   step with the target's sequences by their common prefix (rejections and preemptions
//!   become a shorter prefix to recompute from);
//! - [`verify`]: the rejection sampler (greedy: accept while the draft is the argmax);
//! - [`control`]: when to speculate: the batch-size switch, per-request acceptance back-off,
//!   and the counters ([`SpecStats`]).
//!
//! Drafts live in the scheduler as uncommitted tokens (see [`crate::Sequence::append_draft`]);
//! rejected ones are rolled back with their blocks. A prefix cache must only ever register
//! blocks of committed tokens.

pub mod control;
pub mod draft_model;
pub mod ngram;
pub mod verify;

use tandem_model::batch::TokenId;

use crate::error::Result;
use crate::sampler::{SamplingParams, TokenDistribution};
use crate::sequence::SeqId;

pub use control::{SpecStats, Speculation, SpeculativeConfig};
pub use draft_model::DraftModelProposer;
pub use ngram::NgramProposer;

/// The most draft tokens per step a configuration may ask for.
pub const MAX_SPECULATIVE_TOKENS: usize = 32;

/// What a proposer sees of one sequence.
#[derive(Debug, Clone, Copy)]
pub struct ProposalInput<'a> {
    /// The sequence.
    pub seq_id: SeqId,
    /// `[num_tokens]` its committed tokens (prompt + output); the last one is not yet in the
    /// target's KV store and the drafts follow it.
    pub tokens: &'a [TokenId],
    /// How many of `tokens` are output.
    pub num_output_tokens: usize,
    /// Most drafts wanted (>= 1).
    pub max_drafts: usize,
    /// How the request samples (a draft model samples its drafts with the same settings).
    pub sampling: &'a SamplingParams,
    /// The request's stream seed (a draft model keys its own stream on it).
    pub seed: u64,
}

/// A proposer's guess for one sequence.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Proposal {
    /// `[<= max_drafts]` draft tokens, possibly none.
    pub tokens: Vec<TokenId>,
    /// `[tokens.len()]` the distribution each draft was drawn from, or `None` when every draft
    /// is certain (one-hot: n-gram lookup, or a greedy draft).
    pub dists: Option<Vec<TokenDistribution>>,
}

/// A source of draft tokens.
pub trait Proposer: std::fmt::Debug + Send {
    /// One proposal per input, in order (empty when there is nothing to guess).
    fn propose(&mut self, inputs: &[ProposalInput<'_>]) -> Result<Vec<Proposal>>;

    /// Forgets a sequence that finished (frees whatever the proposer kept for it).
    fn release(&mut self, _seq_id: SeqId) {}

    /// A short name for logs and metrics (`ngram`, `draft`).
    fn name(&self) -> &'static str;
}
