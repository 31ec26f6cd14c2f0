//! The HTTP API: routes, shared state, authentication and the endpoints.
//!
//! | route | what |
//! | --- | --- |
//! | `GET /health` | 200 while the engine runs, 503 otherwise; never needs the API key (below) |
//! | `GET /v1/models`, `GET /v1/models/{id}` | the served model |
//! | `POST /v1/completions` | text completions ([`completions`]) |
//! | `POST /v1/chat/completions` | chat completions ([`chat`]) |
//! | `POST /v1/score` | teacher-forced scores of known text ([`score`]) |
//! | `POST /tokenize`, `POST /detokenize`, `GET /tokenizer_info` | vLLM-style tokenizer access ([`tokenize`]) |
//! | `GET /metrics` | Prometheus metrics with vLLM's names ([`crate::metrics`]) |
//!
//! Every response carries the request's `x-request-id` header (a fresh id when it has none).
//!
//! `/health` answers `{"status": "ok", "running", "waiting", "in_flight", "disconnects",
//! "kv_free_blocks", "kv_total_blocks"}`: sequences running and waiting in the scheduler,
//! requests whose client is still attached, requests aborted because their client went
//! away (since start), and the KV pool. When idle, `kv_free_blocks == kv_total_blocks`.

pub mod adapters;
pub mod beam;
pub mod body;
pub mod chat;
pub mod compile_slots;
pub mod completions;
pub mod echo;
pub mod format;
pub mod kv_prefill;
pub mod respond;
pub mod routes;
pub mod sampling;
pub mod score;
pub mod score_format;
pub mod structured;
pub mod tokenize;
pub mod tools;
mod unique_keys;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tandem_engine::sampler::{ConstraintCompiler, ConstraintError};
use tandem_model::batch::AdapterId;

use crate::config::ServerConfig;
use crate::engine_thread::EngineHandle;
use crate::error::{ApiError, ApiResult};
use crate::kv_transfer_stats::KvTransferStats;
use crate::prefill_peer::PrefillPeers;
use crate::prompt::PromptBuilder;
use adapters::AdapterNames;
use compile_slots::CompileSlots;
use tandem_model::ModelConfig;

/// What a request's `model` resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedModel {
    /// The name the response carries (the request's own spelling).
    pub name: String,
    /// The LoRA adapter the request runs with; `None` for the base model.
    pub adapter: Option<AdapterId>,
}

/// What the model allows, read from the engine before it moved to its thread.
#[derive(Debug, Clone)]
pub struct ModelLimits {
    /// Token ids a request may name: below both the model's vocabulary and the tokenizer's
    /// id space (which the loader pads over a padded embedding's rows).
    pub vocab_size: usize,
    /// Most tokens (prompt + output) in one sequence.
    pub max_model_len: usize,
    pub eos_token_ids: Vec<u32>,
    /// Token slots per KV block.
    pub kv_block_size: usize,
    /// Bytes of one KV block in transfer (0 when the runner cannot move blocks): what a
    /// prefill peer's answer may weigh.
    pub kv_bytes_per_block: usize,
}

/// Everything the handlers share.
#[derive(Debug)]
pub struct AppState {
    pub engine: EngineHandle,
    pub prompts: PromptBuilder,
    pub limits: ModelLimits,
    pub config: ServerConfig,
    /// Unix time the server started (the model's `created`).
    pub started: u64,
    next_id: AtomicU64,
    /// The model's structured-output vocabulary, built on first use (see
    /// [`structured`]).
    constraints: std::sync::OnceLock<Result<Arc<ConstraintCompiler>, ConstraintError>>,
    /// Where structured-output grammars compile (`limits.max_grammar_compiles` at once).
    pub(crate) compile_slots: CompileSlots,
    /// The LoRA adapters' names (those of `config.adapter_names`, then any loaded at run
    /// time).
    pub adapters: AdapterNames,
    /// The model's configuration, to check adapters loaded at run time against.
    pub model_config: ModelConfig,
    /// The prefill instances this one continues from (`config.prefill_peers`).
    pub prefill_peers: Option<PrefillPeers>,
    /// Counters of KV blocks sent to and received from peers.
    pub kv_transfer: KvTransferStats,
}

/// Shared handle to [`AppState`].
pub type App = Arc<AppState>;

impl AppState {
    pub fn new(
        engine: EngineHandle,
        prompts: PromptBuilder,
        (limits, model_config): (ModelLimits, ModelConfig),
        config: ServerConfig,
    ) -> AppState {
        let compile_slots = CompileSlots::new(config.limits.max_grammar_compiles);
        let adapters = AdapterNames::new(&config.adapter_names);
        AppState {
            adapters,
            model_config,
            engine,
            prompts,
            limits,
            config,
            started: unix_time(),
            next_id: AtomicU64::new(0),
            prefill_peers: None,
            kv_transfer: KvTransferStats::default(),
            constraints: std::sync::OnceLock::new(),
            compile_slots,
        }
    }

    /// The structured-output compiler for this model (built once, on first use; slow
    /// enough to belong off the async threads).
    pub fn constraint_compiler(
        self: &Arc<Self>,
    ) -> Result<Arc<ConstraintCompiler>, ConstraintError> {
        self.constraints
            .get_or_init(|| structured::build_compiler(self))
            .clone()
    }

    /// A fresh response id with `prefix` (`cmpl`, `chatcmpl`).
    pub fn response_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:x}{n:06x}", self.started)
    }

    /// What the request's `model` names, which must be ours: the name responses carry, and
    /// the LoRA adapter the request runs with (none for the base model).
    pub fn check_model(&self, requested: Option<&str>) -> ApiResult<ServedModel> {
        let Some(m) = requested else {
            let name = self.config.served_name().to_string();
            return Ok(ServedModel {
                name,
                adapter: None,
            });
        };
        let adapter = self.adapters.resolve(m);
        if adapter.is_none() && !self.config.model_names.iter().any(|n| n == m) {
            return Err(ApiError::model_not_found(m));
        }
        Ok(ServedModel {
            name: m.to_string(),
            adapter,
        })
    }
}

/// Runs `work` on tokio's blocking pool: turning a request's text into token ids
/// (rendering a chat template, tokenizing) costs CPU in proportion to the request (2 s for
/// the largest body on this project's machines), and the few HTTP worker threads must stay
/// free to answer `/health` and keep streams flowing meanwhile.
pub async fn off_the_workers<T, F>(work: F) -> ApiResult<T>
where
    T: Send + 'static,
    F: FnOnce() -> ApiResult<T> + Send + 'static,
{
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError::internal(format!("tokenizing the request failed: {e}")))?
}

/// Seconds since the Unix epoch.
pub fn unix_time() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
