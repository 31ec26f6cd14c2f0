//! The scheduler's validated, immutable configuration.

use tandem_model::batch::TokenId;

use crate::error::{EngineError, Result};
use crate::sequence::SchedulingPolicy;

/// Limits and geometry the scheduler plans under. Build it, then [`SchedulerConfig::validate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Most new tokens in one step, over all sequences (the token budget).
    pub max_num_batched_tokens: usize,
    /// Most sequences running at once (and so scheduled in one step).
    pub max_num_seqs: usize,
    /// Most tokens (prompt + output) in one sequence.
    pub max_model_len: usize,
    /// Most new tokens one sequence gets in one step, so a long prompt is chunked and cannot
    /// crowd out the decodes riding alongside it.
    pub long_prefill_token_threshold: usize,
    /// Order of service among waiting and running requests.
    pub policy: SchedulingPolicy,
    /// KV blocks in the pool.
    pub num_blocks: usize,
    /// Token slots per KV block.
    pub block_size: usize,
    /// The model's end-of-sequence tokens.
    pub eos_token_ids: Vec<TokenId>,
    /// Reuse the KV blocks of prefixes already computed (ARCHITECTURE.md § Prefix cache).
    pub enable_prefix_caching: bool,
}

impl SchedulerConfig {
    /// A configuration with the given pool and context and vLLM-like defaults: a budget of
    /// 2048 tokens, 256 sequences, no chunk cap below the budget, FCFS, prefix caching on.
    pub fn new(num_blocks: usize, block_size: usize, max_model_len: usize) -> SchedulerConfig {
        SchedulerConfig {
            max_num_batched_tokens: 2048,
            max_num_seqs: 256,
            max_model_len,
            long_prefill_token_threshold: 2048,
            policy: SchedulingPolicy::Fcfs,
            num_blocks,
            block_size,
            eos_token_ids: Vec::new(),
            enable_prefix_caching: true,
        }
    }

    /// Checks every value is in range.
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("max_num_batched_tokens", self.max_num_batched_tokens),
            ("max_num_seqs", self.max_num_seqs),
            ("max_model_len", self.max_model_len),
            (
                "long_prefill_token_threshold",
                self.long_prefill_token_threshold,
            ),
            ("num_blocks", self.num_blocks),
            ("block_size", self.block_size),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(EngineError::InvalidConfig(format!(
                "{name} must be positive"
            )));
        }
        if self.num_blocks.checked_mul(self.block_size).is_none() {
            return Err(EngineError::InvalidConfig(
                "num_blocks * block_size overflows".into(),
            ));
        }
        Ok(())
    }

    /// The longest sequence (prompt + output tokens) the engine can hold: the model's
    /// context or the whole pool, whichever is smaller. A sequence reaching it finishes
    /// with `Length`, so a sequence running alone always fits the pool.
    pub fn max_seq_len(&self) -> usize {
        self.max_model_len
            .min(self.num_blocks.saturating_mul(self.block_size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_bad_field() {
        let mut c = SchedulerConfig::new(8, 16, 1024);
        c.validate().expect("defaults are valid");
        assert_eq!(c.max_seq_len(), 128);
        c.max_num_seqs = 0;
        match c.validate() {
            Err(EngineError::InvalidConfig(m)) => assert!(m.contains("max_num_seqs")),
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }
}
