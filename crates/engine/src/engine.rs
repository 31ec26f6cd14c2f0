//! The engine: model, KV store, scheduler and per-request samplers, advanced one step at a
//! time. `Engine::step` is the whole generation loop body:
//!
//! plan (scheduler) -> block copies + `ForwardBatch` -> forward (model) -> sample (per
//! request) -> update (scheduler: append, stop checks, release) -> events.
//!
//! `n > 1` parallel samples ([`Engine::add_request_n`]): the prompt is computed once, then
//! the group forks into `n` sequences sharing the prompt's KV blocks (see
//! `scheduler/groups.rs`); sibling `i` samples its first token from the shared logits row with
//! its own stream and is from then on an independent request, token for token the same as a
//! separate request with `sample_index + i` (same seed) run alone.
//!
//! Beam search ([`Engine::add_beam_request`], see `engine/beams.rs` and
//! [`crate::beam_search`]) is the other decoding mode: beams are managed sequences sharing
//! prefix blocks, stepped together once all their logits are out.
//!
//! Prompt logprobs ([`GenerationRequest::prompt_logprobs`], see `engine/prompt_logprobs.rs`):
//! the prompt's rows are scored as they are prefilled and arrive as
//! [`EngineEvent::PromptLogprobs`]; with `max_tokens == 0` the request ends right after its
//! prompt (a scoring request).

use tandem_model::batch::{AdapterId, TokenId};
use tandem_model::lora::LoraAdapter;
use tandem_model::runner::ModelRunner;
use tandem_model::{ModelConfig, ModelError};

use crate::error::{EngineError, Result};
use crate::sampler::{SamplerState, SamplingParams};
use crate::scheduler::Scheduler;
use crate::scheduler_config::SchedulerConfig;
use crate::sequence::{FinishReason, RequestParams, SeqId, SeqMap};
use crate::step_plan::{to_forward_batch, StepResult};
use crate::trace::{MarkKind, Part, StepTrace};

mod beams;
mod kv_transfer;
mod overlap;
mod prompt_logprobs;
mod sampling;
mod speculation;
mod step_trace;

use sampling::RowPath;

pub use prompt_logprobs::PromptTokenLogprob;

/// One generation request: its prompt, how to choose tokens, and when to stop.
#[derive(Debug, Clone)]
pub struct GenerationRequest {
    pub prompt: Vec<TokenId>,
    pub sampling: SamplingParams,
    pub limits: RequestParams,
    /// Which sample of its prompt this is (0 for the first; `n > 1` requests number their
    /// samples), so that seeded siblings draw from distinct, reproducible streams.
    pub sample_index: u64,
    /// `Some(k)`: also score every prompt token (its logprob, rank and `k` alternatives, at
    /// most [`crate::sampler::MAX_TOP_LOGPROBS`]), see [`EngineEvent::PromptLogprobs`]. Then
    /// `limits.max_tokens` may be 0: the request ends after its prompt with `Length`.
    /// Not with beam search; with `n > 1` every sample gets them (computed once).
    pub prompt_logprobs: Option<usize>,
    /// With `prompt_logprobs`: the first prompt index to score (0 and 1 both mean every
    /// scorable index). Scoring a continuation of a context asks for the continuation's
    /// indices only; the context's positions then cost nothing when the prefix cache holds
    /// them. At most the prompt length.
    pub prompt_logprobs_start: usize,
}

/// What a client learns from a step, in order per request.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineEvent {
    /// A token was appended to the request's output. `logprob` and `top_logprobs` come from
    /// the model's raw distribution at that position (see [`crate::sampler`]), for a request
    /// that asked for them (`SamplingParams::logprobs`; else `None` and empty).
    Token {
        seq_id: SeqId,
        token: TokenId,
        logprob: Option<f32>,
        top_logprobs: Vec<(TokenId, f32)>,
    },
    /// The request finished; its KV blocks are already released.
    Finished { seq_id: SeqId, reason: FinishReason },
    /// The request was admitted for the first time and `cached_tokens` of its prompt were
    /// found in the prefix cache (only with the prefix cache on; before its other events).
    Admitted { seq_id: SeqId, cached_tokens: usize },
    /// Scores of prompt tokens `start..start + entries.len()` (`start >= 1`: nothing predicts
    /// prompt token 0), computed this step; chunks arrive in order, each index once, before
    /// the request's other events of the step (see `engine/prompt_logprobs.rs`).
    PromptLogprobs {
        seq_id: SeqId,
        start: usize,
        entries: Vec<PromptTokenLogprob>,
    },
}

/// A request's sampling side, kept beside the scheduler's sequence.
#[derive(Debug)]
struct ActiveRequest {
    sampling: SamplingParams,
    state: SamplerState,
}

/// The generation engine. Owns the model runner (weights and KV pool on their device);
/// synchronous.
#[derive(Debug)]
pub struct Engine {
    runner: Box<dyn ModelRunner>,
    scheduler: Scheduler,
    requests: SeqMap<ActiveRequest>,
    /// Beam search requests.
    beams: beams::Beams,
    /// Requests still owed prompt logprobs.
    prompt_logprobs: prompt_logprobs::PromptLogprobs,
    /// Seeds the random streams of requests that bring no seed of their own.
    seed: u64,
    /// Speculative decoding, when enabled (see `engine/speculation.rs`).
    spec: Option<crate::speculative::Speculation>,
    /// The step timeline, when recording (see `engine/step_trace.rs`); `None` costs nothing.
    trace: Option<Box<StepTrace>>,
    /// Whether steps overlap when the runner can (see `engine/overlap.rs`).
    overlap: bool,
    /// The step launched on the runner and not answered yet.
    launched: Option<overlap::Launched>,
    /// Processor lists of answered row draws, reused by the next draws.
    spare_lists: Vec<Vec<tandem_model::logit_processing::TokenAdjustment>>,
}

impl Engine {
    /// An engine over `runner` with the limits of `config`, whose pool geometry must be the
    /// runner's (`num_blocks`, `block_size`).
    pub fn new(runner: Box<dyn ModelRunner>, config: SchedulerConfig, seed: u64) -> Result<Engine> {
        let g = runner.kv_geometry();
        if (g.num_blocks, g.block_size) != (config.num_blocks, config.block_size) {
            return Err(EngineError::InvalidConfig(format!(
                "the scheduler plans {} blocks of {} tokens but the runner holds {} of {}",
                config.num_blocks, config.block_size, g.num_blocks, g.block_size
            )));
        }
        let mut scheduler = Scheduler::new(config)?;
        scheduler.set_model_identity(runner.model_identity());
        Ok(Engine {
            runner,
            scheduler,
            requests: SeqMap::default(),
            beams: beams::Beams::default(),
            prompt_logprobs: prompt_logprobs::PromptLogprobs::default(),
            seed,
            spec: None,
            trace: None,
            overlap: true,
            launched: None,
            spare_lists: Vec::new(),
        })
    }

    /// The model's shapes and hyper-parameters.
    pub fn model_config(&self) -> &ModelConfig {
        self.runner.config()
    }

    /// The runner: the device the model runs on and its KV pool.
    pub fn runner(&self) -> &dyn ModelRunner {
        self.runner.as_ref()
    }

    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// Validates and queues a request. Nothing is started when it is refused.
    pub fn add_request(&mut self, req: GenerationRequest) -> Result<SeqId> {
        let ids = self.add_request_n(req, 1)?;
        Ok(ids[0])
    }

    /// Validates and queues `n` parallel samples of one request; returns their ids, sample
    /// `sample_index` first. The prompt is computed once and its KV blocks are shared by
    /// reference count; sibling `i` draws from the stream of sample `sample_index + i`, so it
    /// generates exactly what a separate request with that `sample_index` would alone. Each
    /// id then streams its own `Token` and `Finished` events. Aborting the first id before
    /// its first token aborts the whole group; aborting another id drops only that sample.
    /// Refuses `n == 0` and `n > max_num_seqs`; nothing is started when refused.
    pub fn add_request_n(&mut self, req: GenerationRequest, n: usize) -> Result<Vec<SeqId>> {
        self.validate(&req)?;
        let prompt_ids: Vec<u32> = req.prompt.iter().map(|t| t.0).collect();
        let ids = self.scheduler.add_group(req.prompt, req.limits, n)?;
        if let Some(k) = req.prompt_logprobs {
            self.prompt_logprobs
                .register(ids[0], k, req.prompt_logprobs_start);
        }
        // A seeded request's stream depends only on its seed and sample index, never on what
        // else is running; an unseeded one gets a stream of its own from the engine seed.
        let base = req
            .sampling
            .seed
            .unwrap_or_else(|| splitmix64(self.seed ^ splitmix64(ids[0].0)));
        let first = SamplerState::new(base.wrapping_add(req.sample_index), &prompt_ids)
            .with_constraint(req.sampling.constraint.as_ref())
            .with_penalties(&req.sampling);
        let mut sampling = req.sampling;
        if sampling.constraint.is_some() && sampling.eos_token_ids.is_empty() {
            // The grammar must know what ends the request, as the scheduler does.
            let eos = &self.scheduler.config().eos_token_ids;
            sampling.eos_token_ids = eos.iter().map(|t| t.0).collect();
        }
        for (i, &id) in ids.iter().enumerate() {
            let state = first.fork(i as u64);
            let sampling = sampling.clone();
            self.requests.insert(id, ActiveRequest { sampling, state });
        }
        self.trace_marks(&ids, MarkKind::Arrived);
        Ok(ids)
    }

    /// The refusals of a sampled request (the scheduler adds its own).
    fn validate(&self, req: &GenerationRequest) -> Result<()> {
        req.sampling.validate(self.runner.config().vocab_size)?;
        prompt_logprobs::validate(req)?;
        self.check_prompt(req)
    }

    /// Refuses prompt tokens outside the vocabulary, prompt + `max_tokens` beyond the model
    /// length, and an adapter the runner does not have.
    fn check_prompt(&self, req: &GenerationRequest) -> Result<()> {
        if let Some(a) = req.limits.adapter.filter(|&a| !self.runner.has_adapter(a)) {
            let msg = format!("adapter {} is not loaded", a.0);
            return Err(EngineError::InvalidParams(msg));
        }
        let vocab = self.runner.config().vocab_size;
        if let Some(t) = req.prompt.iter().find(|t| t.0 as usize >= vocab) {
            return Err(EngineError::InvalidParams(format!(
                "prompt token id {} is outside the vocabulary of {vocab}",
                t.0
            )));
        }
        let max_len = self.scheduler.config().max_model_len;
        let total = req.prompt.len().checked_add(req.limits.max_tokens);
        if total.is_none_or(|n| n > max_len) {
            return Err(EngineError::InvalidParams(format!(
                "max_tokens: the prompt ({} tokens) plus max_tokens ({}) exceeds the maximum model length of {max_len}",
                req.prompt.len(),
                req.limits.max_tokens
            )));
        }
        Ok(())
    }

    /// Ends a request now and frees its blocks (with its pending siblings, see
    /// [`Engine::add_request_n`]).
    pub fn abort(&mut self, id: SeqId) -> Result<()> {
        if self.is_beam_request(id) {
            self.end_beam_request(id, true);
            return Ok(());
        }
        let mut ids = vec![id];
        ids.extend_from_slice(self.scheduler.pending_siblings(id));
        self.scheduler.abort(id)?;
        self.trace_marks(&ids, MarkKind::Aborted);
        for id in ids {
            self.requests.remove(&id);
            self.forget_speculation(id);
        }
        Ok(())
    }

    /// Forgets every cached prefix block (the admin reset of the prefix cache); returns how
    /// many blocks were forgotten. Results never change: only the cost of the next prefills.
    pub fn reset_prefix_cache(&mut self) -> usize {
        self.scheduler.reset_prefix_cache()
    }

    /// Registers a LoRA adapter with the runner (loading it while serving); requests name it
    /// by the returned id.
    pub fn add_adapter(&mut self, adapter: LoraAdapter) -> Result<AdapterId> {
        let added = self.runner.add_adapter(adapter);
        added.map_err(|e| EngineError::InvalidParams(e.to_string()))
    }

    /// Forgets adapter `id`; refused while a request runs or waits with it. Its cached
    /// blocks are never hit again (ids are not reused) and age out of the cache.
    pub fn remove_adapter(&mut self, id: AdapterId) -> Result<()> {
        if self.scheduler.uses_adapter(id) {
            let msg = format!("adapter {} is in use by a running or waiting request", id.0);
            return Err(EngineError::InvalidParams(msg));
        }
        let removed = self.runner.remove_adapter(id);
        removed.map_err(|e| EngineError::InvalidParams(e.to_string()))
    }

    /// Whether any request is waiting or running, or a launched step is still to be
    /// answered.
    pub fn has_unfinished(&self) -> bool {
        self.scheduler.has_unfinished() || self.launched.is_some()
    }

    /// Runs one engine step and returns its events. A failure of the forward pass ends the
    /// step's requests with an error; bad logits in one row end only that request. With
    /// overlapped steps (`engine/overlap.rs`) a call may only launch the step it plans: its
    /// tokens come with the next call's events, and a call may return none while a launched
    /// step is still to be answered ([`Engine::has_unfinished`] says so).
    pub fn step(&mut self) -> Result<Vec<EngineEvent>> {
        if let Some(launched) = self.launched.take() {
            return self.step_overlapped(launched);
        }
        let mut clock = self.step_clock();
        self.propose_drafts()?;
        let plan = self.scheduler.schedule()?;
        if plan.is_empty() {
            return Ok(Vec::new());
        }
        let slices = self.trace_plan(&plan);
        if let Err(e) = self.runner.copy_blocks(&plan.block_copies) {
            let message = format!("KV block copy failed: {e}");
            let events = self.scheduler.fail_step(&message);
            return Ok(self.translate(events, SeqMap::default()));
        }
        let mut out = self.admitted_events(&plan);
        let (cached_events, failed) =
            self.prompt_logprobs
                .score_cached(&plan, &self.scheduler, self.runner.as_mut());
        out.extend(cached_events);
        let mut batch = to_forward_batch(&plan);
        let plan_rows = batch.output_rows();
        let prompt_rows = self.prompt_logprobs.plan_rows(&plan, &self.scheduler);
        prompt_logprobs::widen_output(&mut batch, &prompt_rows);
        clock.mark(Part::Schedule);
        // Steps whose rows need only their choice let the runner choose: a device runner
        // keeps the logits where they are.
        let path = if prompt_rows.is_empty() {
            self.row_path(&plan)
        } else {
            RowPath::Host
        };
        let forwarded = match path {
            RowPath::Host => self
                .forward_logits(&plan, &batch, &prompt_rows, &plan_rows, &mut clock)
                .map(|(samples, events)| {
                    out.extend(events);
                    samples
                }),
            _ => {
                let rows = self.draw_rows(&plan);
                if self.may_overlap() {
                    // Its picks are collected by the next step, which plans ahead meanwhile.
                    out.extend(self.launch_first(plan, &batch, rows));
                    return Ok(out);
                }
                self.forward_picks(&plan, &batch, path, rows, &mut clock)
            }
        };
        out.extend(self.answer_step(plan.step, forwarded, failed)?);
        out.extend(self.advance_beams()?);
        self.prompt_logprobs.retain_live(&self.scheduler);
        clock.mark(Part::Sample);
        self.record_step(&plan, &clock, slices, &out);
        Ok(out)
    }
}

impl Engine {
    /// Answers the oldest plan in flight: ends the rows that failed to sample, hands the
    /// sampled tokens to the scheduler and translates its events; a failed forward pass
    /// fails every plan in flight.
    fn answer_step(
        &mut self,
        step: u64,
        forwarded: std::result::Result<sampling::StepSamples, ModelError>,
        mut failed: Vec<(SeqId, FinishReason)>,
    ) -> Result<Vec<EngineEvent>> {
        let (events, sampled) = match forwarded {
            Ok(samples) => {
                failed.extend(samples.failed);
                let mut events = self.end_failed(failed);
                events.extend(self.scheduler.update(&StepResult {
                    step,
                    outputs: samples.outputs,
                })?);
                (events, samples.sampled)
            }
            Err(e) => {
                let message = format!("forward pass failed: {e}");
                (self.scheduler.fail_step(&message), SeqMap::default())
            }
        };
        Ok(self.translate(events, sampled))
    }
}

/// One round of the SplitMix64 mixer: spreads nearby integers over the 64-bit range.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
