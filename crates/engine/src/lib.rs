//! tandem's engine: the model-free core of generation. Synchronous: no async, no HTTP.
//!
//! - [`block_allocator`]: the logical KV block pool (ids, refcounts, O(1) free list) and
//!   [`block_table`]: a sequence's blocks, released on drop on every exit path;
//! - [`sequence`]: a request's tokens (prompt + output [+ draft]), `num_computed_tokens`,
//!   status machine and parameters;
//! - [`scheduler`]: continuous batching under a token budget and a sequence cap, chunked
//!   prefill, block leasing and recompute preemption ([`scheduler_config`] holds its limits);
//! - [`step_plan`]: the `StepPlan` / `StepResult` contract with the runner, client events, and
//!   [`step_plan::to_forward_batch`], the seam onto the model's `ForwardBatch`.
//!
//! - [`sampler`]: how a token is chosen from a logits row (processors, seeded streams,
//!   logprobs of the raw distribution);
//! - [`beam_search`]: the model-free beam search step (ranking, hypotheses, scores);
//! - [`speculative`]: speculative decoding (n-gram and draft-model proposers, the rejection
//!   sampler, when to speculate, counters);
//! - [`kv_transfer`]: the wire form of a prompt's KV blocks moving between instances
//!   (disaggregated prefill: `Engine::export_prefix` / `Engine::import_prefix`);
//! - [`trace`]: the step timeline (Chrome trace JSON of every step and request), off by
//!   default;
//! - [`engine`]: `Engine::step` = `scheduler.schedule()` -> the model's forward pass on
//!   `to_forward_batch(&plan)` -> sample -> `scheduler.update(&result)` -> events.

pub mod beam_search;
pub mod block_allocator;
pub mod block_table;
pub mod engine;
pub mod error;
pub mod kv_transfer;
pub mod prefix_cache;
pub mod scheduler;
pub mod scheduler_config;
pub mod sequence;
pub mod speculative;
pub mod step_plan;
pub mod trace;

pub use error::{EngineError, Result};
pub use scheduler::{Scheduler, SchedulerStats};
pub use scheduler_config::SchedulerConfig;
pub use sequence::{FinishReason, RequestParams, SchedulingPolicy, SeqId, SeqStatus, Sequence};
pub use step_plan::{to_forward_batch, ScheduledSeq, SeqEvent, SeqOutput, StepPlan, StepResult};
pub use tandem_model as model;

pub mod sampler;
