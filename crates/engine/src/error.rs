//! The engine crate's error type.

use crate::sequence::SeqId;

/// Everything the engine can refuse or fail at. A broken internal invariant is an `assert!`,
/// never one of these.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    /// A request's sampling parameters are out of range (names the field and the bound).
    #[error("{0}")]
    Sampler(#[from] crate::sampler::SamplerError),
    /// A configuration value is out of range.
    #[error("invalid engine configuration: {0}")]
    InvalidConfig(String),
    /// A request's sampling parameters are out of range.
    #[error("invalid request parameters: {0}")]
    InvalidParams(String),
    /// The prompt has no tokens.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// The prompt is longer than the model's context.
    #[error("the prompt has {len} tokens, more than the maximum model length of {max_model_len}")]
    PromptTooLong {
        /// Prompt length in tokens.
        len: usize,
        /// The configured maximum model length in tokens.
        max_model_len: usize,
    },
    /// The prompt needs more KV blocks than the whole pool holds, so it could never run.
    #[error(
        "the prompt has {len} tokens and needs {needed} KV blocks, but the pool has only {total}"
    )]
    PromptExceedsPool {
        /// Prompt length in tokens.
        len: usize,
        /// Blocks the prompt needs.
        needed: usize,
        /// Blocks in the whole pool.
        total: usize,
    },
    /// No live sequence has this id (never added, already finished or aborted).
    #[error("unknown sequence {0:?}")]
    UnknownSeq(SeqId),
    /// A block id outside the pool or not currently referenced was released or shared.
    #[error("block {0} is not allocated")]
    BlockNotAllocated(u32),
    /// `schedule` was called while the previous plan's result is still outstanding.
    #[error("step {0} is still in flight: call update or fail_step first")]
    StepInFlight(u64),
    /// KV blocks sent by another instance are malformed or do not fit this engine (another
    /// model, numeric mode, KV dtype or block size), or this engine cannot move KV blocks.
    #[error("KV transfer: {0}")]
    KvTransfer(String),
    /// A step result does not answer the plan in flight.
    #[error("step result does not match the plan in flight: {0}")]
    ResultMismatch(String),
}

/// Shorthand for this crate's results.
pub type Result<T> = std::result::Result<T, EngineError>;
