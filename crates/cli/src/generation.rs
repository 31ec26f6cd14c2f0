//! The generation loop shared by `generate` and `chat`: submit every job to the engine at
//! once, step until all finish (continuous batching), and collect the output processor's
//! deltas (text with stop strings, tokens, finish reasons, beam hypotheses; see
//! `tandem_text`) into results in submission order.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Result;
use tandem_engine::beam_search::BeamParams;
use tandem_engine::engine::{Engine, GenerationRequest};
use tandem_engine::sampler::SamplingParams;
use tandem_engine::{FinishReason, RequestParams};
use tandem_model::batch::TokenId;
use tandem_model::tokenizer::Tokenizer;
use tandem_text::{
    BeamText, OutputProcessor, RequestDelta, RequestOutput, TextOptions, TextRequest,
};

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
    /// Each token's raw logprob (`None` unless the job's sampling asked for logprobs).
    pub logprobs: Vec<Option<f32>>,
    /// `stop`, `length`, `abort` or `error`.
    pub finish_reason: String,
    pub error: Option<String>,
    pub prompt_tokens: usize,
    /// Beam search only: every hypothesis, best first (the result's text is the best).
    pub beams: Vec<BeamOutput>,
}

/// Callbacks while jobs run.
pub trait Observer {
    /// New text of job `index`.
    fn text(&mut self, _index: usize, _delta: &str) {}
    /// A job finished; `generated` counts all tokens generated so far.
    fn finished(&mut self, _index: usize, _generated: usize) {}
}

/// Submits every job; returns the result slots (job by job, sample by sample), the requests
/// now running being tracked by `outputs` with their slot's index. A job the engine refuses
/// gets `error` results; the others run.
fn submit(
    engine: &mut Engine,
    outputs: &mut OutputProcessor<usize>,
    jobs: Vec<Job>,
    observer: &mut dyn Observer,
) -> Vec<JobResult> {
    let mut results = Vec::new();
    for job in jobs {
        let first = results.len();
        let prompt_tokens = job.prompt.len();
        results.extend((0..job.num_results()).map(|_| JobResult {
            prompt_tokens,
            ..JobResult::default()
        }));
        let request = TextRequest {
            request: GenerationRequest {
                prompt: job.prompt,
                sampling: job.sampling,
                limits: job.limits,
                sample_index: 0,
                prompt_logprobs: None,
                prompt_logprobs_start: 1,
            },
            samples: job.n,
            beam: job.beam,
            text: job.text,
            num_speculative_tokens: job.num_speculative_tokens,
        };
        if let Err(e) = outputs.add(engine, request, |k| first + k) {
            for (index, res) in results.iter_mut().enumerate().skip(first) {
                res.finish_reason = "error".into();
                res.error = Some(e.to_string());
                observer.finished(index, 0);
            }
        }
    }
    results
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
    let mut outputs = OutputProcessor::new(tokenizer.clone());
    let mut results = submit(engine, &mut outputs, jobs, observer);
    let mut generated = 0;
    while !outputs.is_empty() {
        if cancel.load(Ordering::Relaxed) {
            outputs.finish_all(Some(engine), FinishReason::Abort, |_, &index, output| {
                if let RequestOutput::Delta(delta) = output {
                    observer.text(index, &delta.text);
                    record(&mut results[index], delta);
                }
            });
            break;
        }
        let events = engine.step()?;
        let detokenize = std::time::Instant::now();
        outputs.process(engine, events, |_, &index, output| {
            let RequestOutput::Delta(delta) = output else {
                // `generate` reports no prefix-cache use.
                return;
            };
            generated += usize::from(delta.token.is_some());
            observer.text(index, &delta.text);
            if record(&mut results[index], delta) {
                observer.finished(index, generated);
            }
        });
        if let Some(trace) = engine.trace_mut() {
            trace.add_detokenize(detokenize);
        }
    }
    Ok(results)
}

/// Adds `delta` to a job's result; true when it was the last one.
fn record(res: &mut JobResult, delta: RequestDelta) -> bool {
    if let Some(t) = &delta.token {
        res.token_ids.push(t.token.0);
        res.logprobs.push(t.logprob);
    }
    res.text.push_str(&delta.text);
    if !delta.beams.is_empty() {
        res.beams = delta.beams.into_iter().map(BeamOutput::from).collect();
        if let Some(best) = res.beams.first() {
            res.text = best.text.clone();
            res.token_ids = best.token_ids.clone();
        }
    }
    let Some(finish) = delta.finish else {
        return false;
    };
    res.finish_reason = finish.as_str().into();
    res.error = finish.failure().map(str::to_string);
    true
}

impl From<BeamText> for BeamOutput {
    fn from(b: BeamText) -> BeamOutput {
        BeamOutput {
            text: b.text,
            token_ids: b.tokens.iter().map(|t| t.0).collect(),
            cum_logprob: b.cum_logprob,
            score: b.score,
        }
    }
}
