//! Rows sampled on the host run side by side on the threads a runner lends
//! (`ModelRunner::host_pool`), with the tokens and logprobs of the engine's own loop over
//! them: the same seeded requests (top-p, top-k, min-p, stop tokens held back by
//! `min_tokens`, penalties, bias, top logprobs, `n > 1` siblings) through a fake model that
//! lends a pool and one that does not.

use std::sync::atomic::Ordering;

use tandem_engine::engine::{Engine, EngineEvent, GenerationRequest};
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

/// A token event: (request, sample, token, logprob bits, top logprobs' ids and bits).
type TokenEvent = (usize, usize, u32, u32, Vec<(u32, u32)>);

/// Every token event of 12 requests (two of them `n = 3`) submitted together, in event
/// order, and how often the engine asked for the runner's pool.
fn run(lent_threads: Option<usize>) -> (Vec<TokenEvent>, usize) {
    let mut runner = FakeRunner::new(VOCAB, 512, BLOCKS, BLOCK, 9);
    if let Some(threads) = lent_threads {
        runner = runner.lending_threads(threads);
    }
    let asked = runner.host_pool_asked();
    let config = SchedulerConfig::new(BLOCKS, BLOCK, 512);
    let mut engine = Engine::new(Box::new(runner), config, 5).expect("engine");
    let mut owner = std::collections::HashMap::new();
    for i in 0..12 {
        let req = GenerationRequest {
            prompt: (0..3 + i)
                .map(|t| TokenId((t * 31 + i * 7) as u32 % VOCAB as u32))
                .collect(),
            sampling: sampling(i),
            limits: RequestParams {
                max_tokens: 24,
                ignore_eos: true,
                ..RequestParams::default()
            },
            sample_index: 0,
            prompt_logprobs: None,
            prompt_logprobs_start: 1,
        };
        let n = if i % 6 == 0 { 3 } else { 1 };
        for (k, id) in engine
            .add_request_n(req, n)
            .expect("admitted")
            .into_iter()
            .enumerate()
        {
            owner.insert(id, (i, k));
        }
    }
    let mut events = Vec::new();
    while engine.has_unfinished() {
        for e in engine.step().expect("step") {
            if let EngineEvent::Token {
                seq_id,
                token,
                logprob,
                top_logprobs,
                ..
            } = e
            {
                let (i, k) = owner[&seq_id];
                let top = top_logprobs
                    .iter()
                    .map(|(t, l)| (t.0, l.to_bits()))
                    .collect();
                events.push((i, k, token.0, logprob.to_bits(), top));
            }
        }
    }
    (events, asked.load(Ordering::Relaxed))
}

#[test]
fn rows_sampled_on_a_lent_pool_equal_the_engines_own_loop() {
    let (alone, _) = run(None);
    let (pooled, asked) = run(Some(4));
    assert!(asked > 0, "the engine never asked for the pool");
    assert!(alone.len() > 12 * 24, "{} tokens", alone.len());
    assert_eq!(pooled, alone);
}
