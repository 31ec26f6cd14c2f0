//! Rows sampled on the host run side by side on the threads a runner lends
//! (`ModelRunner::host_pool`), with the tokens and logprobs of the engine's own loop over
//! them: the same seeded requests (top-p, top-k, min-p, stop tokens held back by
//! `min_tokens`, penalties, bias, top logprobs, `n > 1` siblings, prompt logprobs with
//! ranks and alternatives) through a fake model that lends a pool and one that does not.

use std::sync::atomic::Ordering;

use tandem_engine::engine::{Engine, GenerationRequest};
use tandem_engine::sampler::SamplingParams;
use tandem_engine::scheduler_config::SchedulerConfig;
use tandem_engine::RequestParams;
use tandem_model::batch::TokenId;
use tandem_model::fake_runner::FakeRunner;

const VOCAB: usize = 3000;
const BLOCK: usize = 4;
const BLOCKS: usize = 400;

/// Request `i`'s sampling: every processor and truncation in some request, all seeded.
fn sampling(i: usize) -> SamplingParams {
    let mut p = SamplingParams {
        temperature: [0.7, 1.0, 1.3][i % 3],
        seed: Some(100 + i as u64),
        ..SamplingParams::default()
    };
    match i % 5 {
        0 => p.top_p = 0.9,
        1 => p.top_k = 40,
        2 => {
            // A tenth of the vocabulary stops the request, but not before 10 tokens.
            p.min_p = 0.05;
            p.stop_token_ids = (0..300).collect();
            p.min_tokens = 10;
        }
        3 => {
            p.frequency_penalty = 0.4;
            p.repetition_penalty = 1.2;
            p.logit_bias = vec![(7, 3.0), (11, -2.0)];
        }
        _ => {
            p.logprobs = true;
            p.top_logprobs = 3;
        }
    }
    p
}

/// Every event of 12 requests (two of them `n = 3`) submitted together, in order (floats
/// as `Debug` writes them: distinct bits, distinct text), each request asking for
/// `prompt_logprobs` with prompts of `prompt_len + i` tokens; and how often the engine
/// asked for the runner's pool.
fn run(
    lent_threads: Option<usize>,
    prompt_logprobs: Option<usize>,
    prompt_len: usize,
) -> (Vec<String>, usize) {
    let mut runner = FakeRunner::new(VOCAB, 512, BLOCKS, BLOCK, 9);
    if let Some(threads) = lent_threads {
        runner = runner.lending_threads(threads);
    }
    let asked = runner.host_pool_asked();
    let config = SchedulerConfig::new(BLOCKS, BLOCK, 512);
    let mut engine = Engine::new(Box::new(runner), config, 5).expect("engine");
    for i in 0..12 {
        let req = GenerationRequest {
            prompt: (0..prompt_len + i)
                .map(|t| TokenId((t * 31 + i * 7) as u32 % VOCAB as u32))
                .collect(),
            sampling: sampling(i),
            limits: RequestParams {
                max_tokens: 24,
                ignore_eos: true,
                ..RequestParams::default()
            },
            sample_index: 0,
            prompt_logprobs,
            prompt_logprobs_start: 1,
        };
        let n = if i % 6 == 0 { 3 } else { 1 };
        engine.add_request_n(req, n).expect("admitted");
    }
    let mut events = Vec::new();
    while engine.has_unfinished() {
        let step = engine.step().expect("step");
        events.extend(step.iter().map(|e| format!("{e:?}")));
    }
    (events, asked.load(Ordering::Relaxed))
}

#[test]
fn rows_sampled_on_a_lent_pool_equal_the_engines_own_loop() {
    let (alone, _) = run(None, None, 3);
    let (pooled, asked) = run(Some(4), None, 3);
    assert!(asked > 0, "the engine never asked for the pool");
    let tokens = alone.iter().filter(|e| e.starts_with("Token")).count();
    assert!(tokens > 12 * 24, "{tokens} tokens");
    assert_eq!(pooled, alone);
}

#[test]
fn prompt_logprobs_scored_on_a_lent_pool_equal_the_engines_own_loop() {
    let (alone, _) = run(None, Some(4), 40);
    let (pooled, asked) = run(Some(3), Some(4), 40);
    assert!(asked > 0, "the engine never asked for the pool");
    let scored = alone
        .iter()
        .filter(|e| e.starts_with("PromptLogprobs"))
        .count();
    assert!(scored >= 16, "{scored} prompt logprob events");
    assert_eq!(pooled, alone);
}
