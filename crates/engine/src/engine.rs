//! The engine: model, KV store, scheduler and per-request samplers, advanced one step at a
//! time. `Engine::step` is the whole generation loop body:
//!
//! plan (scheduler) -> `ForwardBatch` -> forward (model) -> sample (per request) ->
//! update (scheduler: append, stop checks, release) -> events.

use std::collections::HashMap;

use tandem_model::batch::TokenId;
use tandem_model::kv_store::KvStore;
use tandem_model::logits::Logits;
use tandem_model::transformer::Model;

use crate::error::{EngineError, Result};
use crate::sampler::{sample, SampledToken, SamplerState, SamplingParams};
use crate::scheduler::Scheduler;
use crate::scheduler_config::SchedulerConfig;
use crate::sequence::{FinishReason, RequestParams, SeqId};
use crate::step_plan::{to_forward_batch, SeqEvent, SeqOutput, StepPlan, StepResult};

/// One generation request: its prompt, how to choose tokens, and when to stop.
#[derive(Debug, Clone)]
pub struct GenerationRequest {
    pub prompt: Vec<TokenId>,
    pub sampling: SamplingParams,
    pub limits: RequestParams,
    /// Which sample of its prompt this is (0 for the first; `n > 1` requests number their
    /// samples), so that seeded siblings draw from distinct, reproducible streams.
    pub sample_index: u64,
}

/// What a client learns from a step, in order per request.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineEvent {
    /// A token was appended to the request's output. `logprob` and `top_logprobs` come from
    /// the model's raw distribution at that position (see [`crate::sampler`]).
    Token {
        seq_id: SeqId,
        token: TokenId,
        logprob: f32,
        top_logprobs: Vec<(TokenId, f32)>,
    },
    /// The request finished; its KV blocks are already released.
    Finished { seq_id: SeqId, reason: FinishReason },
}

/// A request's sampling side, kept beside the scheduler's sequence.
#[derive(Debug)]
struct ActiveRequest {
    sampling: SamplingParams,
    state: SamplerState,
}

/// The generation engine. Owns the model and the KV store; synchronous.
#[derive(Debug)]
pub struct Engine {
    model: Model,
    kv: KvStore,
    scheduler: Scheduler,
    requests: HashMap<SeqId, ActiveRequest>,
    /// Seeds the random streams of requests that bring no seed of their own.
    seed: u64,
}

impl Engine {
    /// An engine over `model` with the KV pool and limits of `config`.
    pub fn new(model: Model, config: SchedulerConfig, seed: u64) -> Result<Engine> {
        let kv = KvStore::new(&model.config, config.block_size, config.num_blocks)
            .map_err(|e| EngineError::InvalidConfig(e.to_string()))?;
        let scheduler = Scheduler::new(config)?;
        Ok(Engine {
            model,
            kv,
            scheduler,
            requests: HashMap::new(),
            seed,
        })
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// Validates and queues a request. Nothing is started when it is refused.
    pub fn add_request(&mut self, req: GenerationRequest) -> Result<SeqId> {
        let vocab = self.model.config.vocab_size;
        req.sampling.validate(vocab)?;
        if let Some(t) = req.prompt.iter().find(|t| t.0 as usize >= vocab) {
            return Err(EngineError::InvalidParams(format!(
                "prompt token id {} is outside the vocabulary of {vocab}",
                t.0
            )));
        }
        let max_len = self.scheduler.config().max_model_len;
        if req.prompt.len() + req.limits.max_tokens > max_len {
            return Err(EngineError::InvalidParams(format!(
                "max_tokens: the prompt ({} tokens) plus max_tokens ({}) exceeds the maximum model length of {max_len}",
                req.prompt.len(),
                req.limits.max_tokens
            )));
        }
        let prompt_ids: Vec<u32> = req.prompt.iter().map(|t| t.0).collect();
        let id = self.scheduler.add_request(req.prompt, req.limits)?;
        // A seeded request's stream depends only on its seed and sample index, never on what
        // else is running; an unseeded one gets a stream of its own from the engine seed.
        let base = req
            .sampling
            .seed
            .unwrap_or_else(|| splitmix64(self.seed ^ splitmix64(id.0)));
        let state = SamplerState::new(base.wrapping_add(req.sample_index), &prompt_ids);
        self.requests.insert(
            id,
            ActiveRequest {
                sampling: req.sampling,
                state,
            },
        );
        Ok(id)
    }

    /// Ends a request now and frees its blocks.
    pub fn abort(&mut self, id: SeqId) -> Result<()> {
        self.scheduler.abort(id)?;
        self.requests.remove(&id);
        Ok(())
    }

    /// Whether any request is waiting or running.
    pub fn has_unfinished(&self) -> bool {
        self.scheduler.has_unfinished()
    }

    /// Runs one engine step and returns its events. A failure of the forward pass ends the
    /// step's requests with an error; bad logits in one row end only that request.
    pub fn step(&mut self) -> Result<Vec<EngineEvent>> {
        let plan = self.scheduler.schedule()?;
        if plan.is_empty() {
            return Ok(Vec::new());
        }
        let batch = to_forward_batch(&plan);
        let logits = match self.model.forward(&batch, &mut self.kv) {
            Ok(l) => l,
            Err(e) => {
                let events = self
                    .scheduler
                    .fail_step(&format!("forward pass failed: {e}"));
                return Ok(self.translate(events, &HashMap::new()));
            }
        };
        let (outputs, sampled, failed) = self.sample_plan(&plan, &logits);
        let mut events = Vec::new();
        for (id, message) in failed {
            let reason = FinishReason::Error(message);
            self.scheduler.finish_early(id, reason.clone())?;
            events.push(SeqEvent::Finished { seq_id: id, reason });
        }
        events.extend(self.scheduler.update(&StepResult {
            step: plan.step,
            outputs,
        })?);
        Ok(self.translate(events, &sampled))
    }

    /// Samples one token for every sequence of the plan that asked for logits.
    #[allow(clippy::type_complexity)]
    fn sample_plan(
        &mut self,
        plan: &StepPlan,
        logits: &Logits,
    ) -> (
        Vec<SeqOutput>,
        HashMap<SeqId, SampledToken>,
        Vec<(SeqId, String)>,
    ) {
        let (mut outputs, mut sampled, mut failed) = (Vec::new(), HashMap::new(), Vec::new());
        let mut row = 0;
        for s in plan.seqs.iter().filter(|s| s.num_output_rows > 0) {
            row += s.num_output_rows;
            let last = row - 1; // without speculation there is exactly one output row
            let num_output = self
                .scheduler
                .sequence(s.seq_id)
                .map_or(0, |q| q.output().len());
            let req = self
                .requests
                .get_mut(&s.seq_id)
                .expect("every scheduled sequence has a request");
            match sample(logits.row(last), &req.sampling, &mut req.state, num_output) {
                Ok(t) => {
                    outputs.push(SeqOutput {
                        seq_id: s.seq_id,
                        tokens: vec![TokenId(t.token)],
                    });
                    sampled.insert(s.seq_id, t);
                }
                Err(e) => failed.push((s.seq_id, e.to_string())),
            }
        }
        (outputs, sampled, failed)
    }

    /// Turns scheduler events into client events, updating penalty counts and dropping the
    /// state of finished requests.
    fn translate(
        &mut self,
        events: Vec<SeqEvent>,
        sampled: &HashMap<SeqId, SampledToken>,
    ) -> Vec<EngineEvent> {
        events
            .into_iter()
            .map(|e| match e {
                SeqEvent::Token { seq_id, token } => {
                    if let Some(r) = self.requests.get_mut(&seq_id) {
                        r.state.append_output(token.0);
                    }
                    let s = sampled.get(&seq_id);
                    EngineEvent::Token {
                        seq_id,
                        token,
                        logprob: s.map_or(f32::NAN, |s| s.logprob),
                        top_logprobs: s
                            .map(|s| {
                                s.top_logprobs
                                    .iter()
                                    .map(|&(t, l)| (TokenId(t), l))
                                    .collect()
                            })
                            .unwrap_or_default(),
                    }
                }
                SeqEvent::Finished { seq_id, reason } => {
                    self.requests.remove(&seq_id);
                    EngineEvent::Finished { seq_id, reason }
                }
            })
            .collect()
    }
}

/// One round of the SplitMix64 mixer: spreads nearby integers over the 64-bit range.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
