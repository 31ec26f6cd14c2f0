//! The generation loop shared by `generate` and `chat`: submit every job to the engine at
//! once, step until all finish (continuous batching), turn tokens into text with stop
//! strings, and collect results in submission order.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Result;
use tandem_engine::beam_search::BeamParams;
use tandem_engine::engine::{Engine, EngineEvent, GenerationRequest};
use tandem_engine::sampler::SamplingParams;
use tandem_engine::{FinishReason, RequestParams, SeqId};
use tandem_model::batch::TokenId;
use tandem_model::tokenizer::Tokenizer;
use tandem_server::text::{TextOptions, TextStream};

/// One prompt to run: `n` samples sharing the prompt's KV blocks, or a beam search.
#[derive(Debug, Clone)]
pub struct Job {
    pub prompt: Vec<TokenId>,
    pub sampling: SamplingParams,
    pub limits: RequestParams,
    pub text: TextOptions,
    pub n: usize,
    pub beam: Option<BeamParams>,
    /// Per-request draft tokens per step with speculative decoding (None: the engine's).
    pub num_speculative_tokens: Option<usize>,
}

impl Job {
    /// Results this job produces: one per sample, or one for a beam search.
    pub fn num_results(&self) -> usize {
        if self.beam.is_some() {
            1
        } else {
            self.n
        }
    }
}

/// One finished beam-search hypothesis.
#[derive(Debug, Clone, Default)]
pub struct BeamOutput {
    pub text: String,
    pub token_ids: Vec<u32>,
    pub cum_logprob: f32,
    pub score: f32,
}

/// What a job produced.
#[derive(Debug, Clone, Default)]
pub struct JobResult {
    pub text: String,
    pub token_ids: Vec<u32>,
    pub logprobs: Vec<f32>,
    /// `stop`, `length`, `abort` or `error`.
    pub finish_reason: String,
    pub error: Option<String>,
    pub prompt_tokens: usize,
    /// Beam search only: every hypothesis, best first (the result's text is the best).
    pub beams: Vec<BeamOutput>,
}

/// A result slot in flight.
struct Running {
    index: usize,
    stream: TextStream,
    beam: bool,
}

/// Callbacks while jobs run.
pub trait Observer {
    /// New text of job `index`.
    fn text(&mut self, _index: usize, _delta: &str) {}
    /// A job finished; `generated` counts all tokens generated so far.
    fn finished(&mut self, _index: usize, _generated: usize) {}
}

/// Submits every job; returns the result slots (job by job, sample by sample) and the
/// requests now running. A job the engine refuses gets `error` results; the others run.
fn submit(
    engine: &mut Engine,
    tokenizer: &Arc<Tokenizer>,
    jobs: Vec<Job>,
    observer: &mut dyn Observer,
) -> (Vec<JobResult>, HashMap<SeqId, Running>) {
    let mut results = Vec::new();
    let mut running = HashMap::new();
    for job in jobs {
        let first = results.len();
        let count = job.num_results();
        let prompt_tokens = job.prompt.len();
        results.extend((0..count).map(|_| JobResult {
            prompt_tokens,
            ..JobResult::default()
        }));
        let stream = TextStream::new(tokenizer.clone(), job.text.clone());
        let beam = job.beam;
        let spec_k = job.num_speculative_tokens;
        let (n, request) = (
            job.n,
            GenerationRequest {
                prompt: job.prompt,
                sampling: job.sampling,
                limits: job.limits,
                sample_index: 0,
                prompt_logprobs: None,
                prompt_logprobs_start: 1,
            },
        );
        let admitted = match beam {
            Some(b) => engine.add_beam_request(request, b).map(|id| vec![id]),
            None => engine.add_request_n(request, n),
        };
        match admitted {
            Ok(ids) => {
                for (k, id) in ids.into_iter().enumerate() {
                    if let (Some(spec_k), None) = (spec_k, beam) {
                        engine
                            .set_num_speculative_tokens(id, spec_k)
                            .expect("a request just admitted is live");
                    }
                    let r = Running {
                        index: first + k,
                        stream: stream.clone(),
                        beam: beam.is_some(),
                    };
                    running.insert(id, r);
                }
            }
            Err(e) => {
                for (index, res) in results.iter_mut().enumerate().skip(first) {
                    res.finish_reason = "error".into();
                    res.error = Some(e.to_string());
                    observer.finished(index, 0);
                }
            }
        }
    }
    (results, running)
}

/// Runs `jobs` together with continuous batching; results come back job by job, sample by
/// sample. Setting `cancel` aborts everything still running (finish reason `abort`).
pub fn run_jobs(
    engine: &mut Engine,
    tokenizer: &Arc<Tokenizer>,
    jobs: Vec<Job>,
    observer: &mut dyn Observer,
    cancel: &AtomicBool,
) -> Result<Vec<JobResult>> {
    let (mut results, mut running) = submit(engine, tokenizer, jobs, observer);
    let mut generated = 0;
    while !running.is_empty() {
        if cancel.load(Ordering::Relaxed) {
            for (id, r) in running.drain() {
                engine.abort(id)?;
                finish(
                    &mut results[r.index],
                    r.stream,
                    "abort",
                    None,
                    observer,
                    r.index,
                );
            }
            break;
        }
        for event in engine.step()? {
            match event {
                EngineEvent::Token {
                    seq_id,
                    token,
                    logprob,
                    ..
                } => {
                    let Some(r) = running.get_mut(&seq_id) else {
                        continue;
                    };
                    generated += 1;
                    let res = &mut results[r.index];
                    res.token_ids.push(token.0);
                    res.logprobs.push(logprob);
                    let delta = r.stream.push(token.0)?;
                    res.text.push_str(&delta.text);
                    observer.text(r.index, &delta.text);
                    if delta.stopped.is_some() {
                        let r = running.remove(&seq_id).expect("present above");
                        if engine.scheduler().sequence(seq_id).is_some() {
                            engine.abort(seq_id)?;
                        }
                        finish(
                            &mut results[r.index],
                            r.stream,
                            "stop",
                            None,
                            observer,
                            r.index,
                        );
                        observer.finished(r.index, generated);
                    }
                }
                EngineEvent::Finished { seq_id, reason } => {
                    let Some(r) = running.remove(&seq_id) else {
                        continue;
                    };
                    if r.beam {
                        results[r.index].beams = beam_outputs(engine, tokenizer, seq_id);
                        if let Some(best) = results[r.index].beams.first().cloned() {
                            results[r.index].text = best.text;
                            results[r.index].token_ids = best.token_ids;
                        }
                    }
                    let (why, error) = match reason {
                        FinishReason::Stop => ("stop", None),
                        FinishReason::Length => ("length", None),
                        FinishReason::Abort => ("abort", None),
                        FinishReason::Error(e) => ("error", Some(e)),
                    };
                    finish(
                        &mut results[r.index],
                        r.stream,
                        why,
                        error,
                        observer,
                        r.index,
                    );
                    observer.finished(r.index, generated);
                }
                // `generate` never asks for prompt logprobs and reports no cache use.
                EngineEvent::PromptLogprobs { .. } | EngineEvent::Admitted { .. } => {}
            }
        }
    }
    Ok(results)
}

/// The hypotheses of a finished beam search, best first, as text.
fn beam_outputs(engine: &mut Engine, tokenizer: &Tokenizer, id: SeqId) -> Vec<BeamOutput> {
    let hyps = engine.take_beam_result(id).unwrap_or_default();
    hyps.into_iter()
        .map(|h| {
            let token_ids: Vec<u32> = h.tokens.iter().map(|t| t.0).collect();
            let text = tokenizer.decode(&token_ids, true).unwrap_or_default();
            BeamOutput {
                text,
                token_ids,
                cum_logprob: h.cum_logprob,
                score: h.score,
            }
        })
        .collect()
}

fn finish(
    res: &mut JobResult,
    mut stream: TextStream,
    why: &str,
    error: Option<String>,
    observer: &mut dyn Observer,
    index: usize,
) {
    let tail = stream.finish();
    res.text.push_str(&tail.text);
    observer.text(index, &tail.text);
    res.finish_reason = if tail.stopped.is_some() {
        "stop".into()
    } else {
        why.into()
    };
    res.error = error;
}
