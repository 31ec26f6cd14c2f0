//! The generation loop shared by `generate` and `chat`: submit every job to the engine at
//! once, step until all finish (continuous batching), turn tokens into text with stop
//! strings, and collect results in submission order.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Result;
use tandem_engine::engine::{Engine, EngineEvent, GenerationRequest};
use tandem_engine::sampler::SamplingParams;
use tandem_engine::{FinishReason, RequestParams, SeqId};
use tandem_model::batch::TokenId;
use tandem_model::tokenizer::Tokenizer;
use tandem_server::text::{TextOptions, TextStream};

/// One request to run.
#[derive(Debug, Clone)]
pub struct Job {
    pub prompt: Vec<TokenId>,
    pub sampling: SamplingParams,
    pub limits: RequestParams,
    pub text: TextOptions,
    pub sample_index: u64,
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
}

/// A job in flight.
struct Running {
    index: usize,
    stream: TextStream,
}

/// Callbacks while jobs run.
pub trait Observer {
    /// New text of job `index`.
    fn text(&mut self, _index: usize, _delta: &str) {}
    /// A job finished; `generated` counts all tokens generated so far.
    fn finished(&mut self, _index: usize, _generated: usize) {}
}

/// Runs `jobs` together; a job the engine refuses gets an `error` result, the others run.
/// Setting `cancel` aborts everything still running (finish reason `abort`).
pub fn run_jobs(
    engine: &mut Engine,
    tokenizer: &Arc<Tokenizer>,
    jobs: Vec<Job>,
    observer: &mut dyn Observer,
    cancel: &AtomicBool,
) -> Result<Vec<JobResult>> {
    let mut results = vec![JobResult::default(); jobs.len()];
    let mut running: HashMap<SeqId, Running> = HashMap::new();
    for (index, job) in jobs.into_iter().enumerate() {
        results[index].prompt_tokens = job.prompt.len();
        let stream = TextStream::new(tokenizer.clone(), job.text);
        let request = GenerationRequest {
            prompt: job.prompt,
            sampling: job.sampling,
            limits: job.limits,
            sample_index: job.sample_index,
        };
        match engine.add_request(request) {
            Ok(id) => {
                running.insert(id, Running { index, stream });
            }
            Err(e) => {
                results[index].finish_reason = "error".into();
                results[index].error = Some(e.to_string());
                observer.finished(index, 0);
            }
        }
    }
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
            }
        }
    }
    Ok(results)
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
