//! `tandem bench --prefix-cache`: what the prefix cache saves (issue: prefix caching),
//! measured through the engine, cold and warm alternating, medians of `--repeat` rounds.
//!
//! For every prompt length P, one JSON line each for:
//! - `ttft`: a request of P shared tokens + 16 of its own (one output token), after
//!   [`Engine::reset_prefix_cache`] (cold) and after another request with the same P tokens
//!   (warm);
//! - `isolation`: tenant A's cold TTFT, then tenant B (another `cache_salt`) with the same
//!   prompt, which must be just as cold (a ratio near 1 reveals nothing to B);
//! - `score`: 4 continuations of 16 tokens scored against a P/2-token context (prompt
//!   logprobs of the continuation's tokens, no output, as `/v1/score` asks for a context
//!   with continuations), submitted one after the other: cold = the cache reset before each,
//!   warm = the cache kept (the first continuation computes the context, the others reuse it);
//!   `together` = all four submitted at once on an empty cache (the others wait for the
//!   first's context blocks).
//!
//! Run it with the cache on (the default); the cold rounds reset it.

use std::time::Instant;

use anyhow::{bail, Result};
use serde_json::json;
use tandem_engine::engine::{Engine, EngineEvent, GenerationRequest};
use tandem_engine::sampler::SamplingParams;
use tandem_engine::RequestParams;
use tandem_model::batch::TokenId;

use crate::bench_cmd::prompt_tokens;

/// Prints the `ttft` and `score` lines for each prompt length.
pub fn run(engine: &mut Engine, prompt_lens: &[usize], repeat: usize) -> Result<()> {
    if !engine.scheduler().prefix_caching() {
        bail!("--prefix-cache measures the prefix cache: do not pass --no-prefix-caching");
    }
    let vocab = engine.model_config().vocab_size;
    for &p in prompt_lens {
        let shared = prompt_tokens(1, p, vocab);
        let with_tail = |seq: usize| -> Vec<TokenId> {
            let mut t = shared.clone();
            t.extend(prompt_tokens(100 + seq, 16, vocab));
            t
        };
        let (mut cold, mut warm) = (Vec::new(), Vec::new());
        for r in 0..repeat.max(1) {
            engine.reset_prefix_cache();
            cold.push(timed(engine, &[request(with_tail(2 * r), 1, None, 1)])?);
            warm.push(timed(engine, &[request(with_tail(2 * r + 1), 1, None, 1)])?);
        }
        let (c, w) = (median(&mut cold), median(&mut warm));
        println!(
            "{}",
            json!({"mode": "prefix_cache", "case": "ttft", "prefix_len": p, "tail_len": 16,
                   "cold_s": c, "warm_s": w, "speedup": c / w, "repeat": repeat})
        );

        // Isolation: tenant B's TTFT after tenant A ran the very same prompt is a cold TTFT.
        let (mut cold, mut other) = (Vec::new(), Vec::new());
        for r in 0..repeat.max(1) {
            let prompt = with_tail(1000 + r);
            let tenant = |salt: &str| GenerationRequest {
                limits: RequestParams {
                    cache_salt: Some(salt.to_string()),
                    ..request(prompt.clone(), 1, None, 1).limits
                },
                ..request(prompt.clone(), 1, None, 1)
            };
            engine.reset_prefix_cache();
            cold.push(timed(engine, &[tenant("a")])?);
            other.push(timed(engine, &[tenant("b")])?);
        }
        let (c, o) = (median(&mut cold), median(&mut other));
        println!(
            "{}",
            json!({"mode": "prefix_cache", "case": "isolation", "prefix_len": p, "tail_len": 16,
                   "tenant_a_cold_s": c, "tenant_b_after_a_s": o, "ratio": o / c,
                   "repeat": repeat})
        );

        let context = prompt_tokens(2, p / 2, vocab);
        let scoring: Vec<GenerationRequest> = (0..4)
            .map(|k| {
                let mut t = context.clone();
                t.extend(prompt_tokens(200 + k, 16, vocab));
                request(t, 0, Some(1), p / 2)
            })
            .collect();
        let (mut cold, mut warm, mut together) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..repeat.max(1) {
            let mut total = 0.0;
            for r in &scoring {
                engine.reset_prefix_cache();
                total += timed(engine, std::slice::from_ref(r))?;
            }
            cold.push(total);
            engine.reset_prefix_cache();
            warm.push(timed(engine, &scoring)?);
            engine.reset_prefix_cache();
            together.push(timed_together(engine, &scoring)?);
        }
        let (c, w, t) = (median(&mut cold), median(&mut warm), median(&mut together));
        println!(
            "{}",
            json!({"mode": "prefix_cache", "case": "score", "context_len": p / 2,
                   "continuations": 4, "continuation_len": 16, "cold_s": c, "warm_s": w,
                   "warm_over_cold": w / c, "together_s": t, "together_over_cold": t / c,
                   "repeat": repeat})
        );
    }
    Ok(())
}

fn request(
    prompt: Vec<TokenId>,
    max_tokens: usize,
    prompt_logprobs: Option<usize>,
    prompt_logprobs_start: usize,
) -> GenerationRequest {
    GenerationRequest {
        prompt,
        sampling: SamplingParams::greedy(),
        limits: RequestParams {
            max_tokens,
            ignore_eos: true,
            ..RequestParams::default()
        },
        sample_index: 0,
        prompt_logprobs,
        prompt_logprobs_start,
    }
}

/// Runs `reqs` one after the other, each to completion; returns the seconds taken.
fn timed(engine: &mut Engine, reqs: &[GenerationRequest]) -> Result<f64> {
    let start = Instant::now();
    for r in reqs {
        engine.add_request(r.clone())?;
        while engine.has_unfinished() {
            for e in engine.step()? {
                if let EngineEvent::Finished {
                    reason: tandem_engine::FinishReason::Error(m),
                    ..
                } = e
                {
                    bail!("benchmark request failed: {m}");
                }
            }
        }
    }
    Ok(start.elapsed().as_secs_f64())
}

/// Submits `reqs` together and runs them to completion; returns the seconds taken.
fn timed_together(engine: &mut Engine, reqs: &[GenerationRequest]) -> Result<f64> {
    let start = Instant::now();
    for r in reqs {
        engine.add_request(r.clone())?;
    }
    while engine.has_unfinished() {
        engine.step()?;
    }
    Ok(start.elapsed().as_secs_f64())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
