//! ARCHITECTURE.md § Invariants, 4, on the default model: a prefix-cache hit ≡ a miss ≡ the cache
//! disabled, also after eviction, with chunked prefill on — for generation (tokens and logprobs)
//! and for scoring (prompt logprobs: the cached positions' scores come from the final hidden states
//! kept beside their K/V and must equal a cold computation bitwise).

use tandem_engine::engine::{Engine, EngineEvent, GenerationRequest, PromptTokenLogprob};
use tandem_engine::sampler::SamplingParams;
use tandem_engine::{RequestParams, SchedulerConfig, SeqId};
use tandem_model::batch::TokenId;

mod cpu_engine;
use cpu_engine::{cpu_engine, default_model, gemma3_fixture, mixtral_fixture};
use tandem_model::transformer::Model;

/// What one request produced.
#[derive(Debug, Default, Clone, PartialEq)]
struct Out {
    tokens: Vec<TokenId>,
    logprobs: Vec<f32>,
    prompt: Vec<PromptTokenLogprob>,
    /// From `EngineEvent::Admitted` (not compared: it is what differs between paths).
    cached: Option<usize>,
    /// The prompt index of `prompt[0]`.
    start: usize,
}

const BLOCK: usize = 16;

fn config(num_blocks: usize, caching: bool) -> SchedulerConfig {
    let mut c = SchedulerConfig::new(num_blocks, BLOCK, 2048);
    c.long_prefill_token_threshold = 24; // chunked prefill, chunks not aligned to blocks
    c.max_num_batched_tokens = 64;
    c.enable_prefix_caching = caching;
    c
}

/// Token ids below the default model's vocabulary.
const DEFAULT_IDS: u32 = 49_000;
/// Token ids below the HF fixtures' vocabulary (320).
const FIXTURE_IDS: u32 = 300;

/// Ids `(j * mul + add) % ids + 10` for `j` in `range`.
fn toks(range: std::ops::Range<u32>, mul: u32, add: u32, ids: u32) -> Vec<TokenId> {
    range.map(|j| TokenId((j * mul + add) % ids + 10)).collect()
}

/// A 70-token shared head (4 full blocks + 6), tails of different lengths; greedy generation
/// with prompt logprobs (top 3) and a scoring-only request (max_tokens 0).
fn requests(ids: u32) -> Vec<GenerationRequest> {
    let head = toks(0..70, 37, 11, ids);
    let tails = [
        toks(0..5, 13, 1, ids),
        toks(0..29, 7, 3, ids),
        Vec::new(),
        toks(0..1, 1, 9, ids),
    ];
    let mut reqs: Vec<GenerationRequest> = tails
        .iter()
        .map(|t| {
            let mut prompt = head.clone();
            prompt.extend_from_slice(t);
            GenerationRequest {
                prompt,
                sampling: SamplingParams {
                    logprobs: true,
                    ..SamplingParams::greedy()
                },
                limits: RequestParams {
                    max_tokens: 5,
                    ignore_eos: true,
                    ..RequestParams::default()
                },
                sample_index: 0,
                prompt_logprobs: Some(3),
                prompt_logprobs_start: 1,
            }
        })
        .collect();
    // Shares only the first block with the others (a partial hit).
    let mut partial = head[..20].to_vec();
    partial.extend(toks(0..30, 5, 17, ids));
    reqs.push(GenerationRequest {
        prompt: partial,
        ..reqs[0].clone()
    });
    // Scoring only.
    reqs.push(GenerationRequest {
        limits: RequestParams {
            max_tokens: 0,
            ..reqs[1].limits.clone()
        },
        ..reqs[1].clone()
    });
    // Sampled, seeded: the same stream whatever the cache did.
    reqs.push(GenerationRequest {
        sampling: SamplingParams {
            temperature: 0.8,
            top_k: 40,
            seed: Some(5),
            logprobs: true,
            ..SamplingParams::default()
        },
        prompt_logprobs: None,
        prompt_logprobs_start: 1,
        ..reqs[0].clone()
    });
    reqs
}

/// Submits `reqs[i]` for `i` in `batch` at once and runs them to completion.
fn run_batch(engine: &mut Engine, reqs: &[GenerationRequest], batch: &[usize], out: &mut [Out]) {
    let mut ids: Vec<(SeqId, usize)> = Vec::new();
    for &i in batch {
        ids.push((
            engine.add_request(reqs[i].clone()).expect("valid request"),
            i,
        ));
    }
    let index = |id: SeqId| ids.iter().find(|(s, _)| *s == id).map(|&(_, i)| i);
    while engine.has_unfinished() {
        for e in engine.step().expect("step") {
            match e {
                EngineEvent::Token {
                    seq_id,
                    token,
                    logprob,
                    ..
                } => {
                    let o = &mut out[index(seq_id).expect("ours")];
                    o.tokens.push(token);
                    o.logprobs
                        .push(logprob.expect("every request asks for logprobs"));
                }
                EngineEvent::PromptLogprobs {
                    seq_id,
                    start,
                    entries,
                } => {
                    let o = &mut out[index(seq_id).expect("ours")];
                    if o.prompt.is_empty() {
                        o.start = start;
                    }
                    assert_eq!(start, o.start + o.prompt.len(), "contiguous prompt chunks");
                    o.prompt.extend(entries);
                }
                EngineEvent::Admitted {
                    seq_id,
                    cached_tokens,
                } => {
                    let o = &mut out[index(seq_id).expect("ours")];
                    assert!(o.cached.is_none(), "admitted once");
                    o.cached = Some(cached_tokens);
                }
                EngineEvent::Finished { seq_id, reason } => {
                    let i = index(seq_id).expect("ours");
                    assert!(!reason.is_failure(), "{i}: {reason:?}");
                }
            }
        }
    }
    let a = engine.scheduler().allocator();
    assert!(a.is_idle(), "the pool returns to full when idle");
    a.check_invariants().expect("allocator invariants");
}

fn assert_same(name: &str, got: &[Out], want: &[Out]) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.tokens, w.tokens, "{name}: request {i} tokens");
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&g.logprobs),
            bits(&w.logprobs),
            "{name}: request {i} logprobs"
        );
        assert_eq!(
            g.prompt.len(),
            w.prompt.len(),
            "{name}: request {i} prompt scores"
        );
        for (k, (a, b)) in g.prompt.iter().zip(&w.prompt).enumerate() {
            assert_eq!(a.token, b.token);
            assert_eq!(
                a.logprob.to_bits(),
                b.logprob.to_bits(),
                "{name}: request {i} prompt index {}",
                k + 1
            );
            assert_eq!(
                a.rank,
                b.rank,
                "{name}: request {i} prompt index {} rank",
                k + 1
            );
            assert_eq!(
                a.top,
                b.top,
                "{name}: request {i} prompt index {} top",
                k + 1
            );
        }
    }
}

#[test]
fn cache_hits_misses_evictions_and_disabled_cache_give_identical_results() {
    let reqs = requests(DEFAULT_IDS);
    let n = reqs.len();
    let all: Vec<usize> = (0..n).collect();

    // Reference: the cache disabled, each request alone.
    let mut off = cpu_engine(default_model(), config(256, false), 7);
    let mut want = vec![Out::default(); n];
    for i in 0..n {
        run_batch(&mut off, &reqs, &[i], &mut want);
    }
    assert!(
        want.iter().all(|o| o.cached.is_none()),
        "no Admitted events with the cache off"
    );
    assert_eq!(off.scheduler().stats().prefix_cache_queries, 0);

    // Warm: one engine, one request after the other: every later request hits the head.
    let mut on = cpu_engine(default_model(), config(256, true), 7);
    let mut warm = vec![Out::default(); n];
    for i in 0..n {
        run_batch(&mut on, &reqs, &[i], &mut warm);
    }
    assert_same("warm", &warm, &want);
    assert_eq!(warm[0].cached, Some(0), "cold start");
    assert_eq!(
        warm[1].cached,
        Some(64),
        "4 full blocks of the 70-token head"
    );
    assert_eq!(
        warm[4].cached,
        Some(16),
        "partial hit: the first block only"
    );
    assert_eq!(
        warm[5].cached,
        Some(96),
        "the same prompt as request 1: all but the last token's block"
    );
    let stats = on.scheduler().stats();
    assert!(stats.prefix_cache_hits > 0 && stats.prefix_cache_hits <= stats.prefix_cache_queries);

    // Scoring from index 75 only (a continuation after a cached context): the same numbers
    // as the full scoring's tail, nothing before it.
    let tail_only = GenerationRequest {
        prompt_logprobs_start: 75,
        ..reqs[5].clone()
    };
    let mut tail = vec![Out::default(); 1];
    run_batch(&mut on, std::slice::from_ref(&tail_only), &[0], &mut tail);
    assert_eq!(tail[0].start, 75);
    assert_eq!(
        tail[0].prompt,
        want[5].prompt[74..].to_vec(),
        "indices 75.. only"
    );
    let refused = GenerationRequest {
        prompt_logprobs_start: reqs[5].prompt.len() + 1,
        ..reqs[5].clone()
    };
    assert!(
        on.add_request(refused).is_err(),
        "a start beyond the prompt is refused"
    );

    // All at once, then all again on the warm engine (full hits while others run).
    let mut batched = vec![Out::default(); n];
    run_batch(&mut on, &reqs, &all, &mut batched);
    assert_same("batched warm", &batched, &want);
    assert!(batched.iter().all(|o| o.cached.is_some_and(|c| c > 0)));

    // After eviction: a small pool, filled by an unrelated request between two rounds.
    let mut small = cpu_engine(default_model(), config(14, true), 7);
    let mut first = vec![Out::default(); n];
    for i in 0..n {
        run_batch(&mut small, &reqs, &[i], &mut first);
    }
    let filler = GenerationRequest {
        prompt: toks(0..200, 3, 1, DEFAULT_IDS),
        ..reqs[0].clone()
    };
    let mut sink = vec![Out::default(); 1];
    run_batch(&mut small, &[filler], &[0], &mut sink);
    let evictions = small.scheduler().allocator().num_evictions();
    assert!(evictions > 0, "the filler evicted cached blocks");
    let mut again = vec![Out::default(); n];
    for i in 0..n {
        run_batch(&mut small, &reqs, &[i], &mut again);
    }
    assert!(
        again[0].cached.is_some_and(|c| c < 64),
        "request 0's head blocks were (partly) evicted by the filler: {:?}",
        again[0].cached
    );
    assert_same("small pool, first round", &first, &want);
    assert_same("small pool, after eviction", &again, &want);

    // Reset: nothing cached, results unchanged.
    let mut reset = vec![Out::default(); n];
    assert!(on.reset_prefix_cache() > 0);
    run_batch(&mut on, &reqs, &[1], &mut reset);
    assert_eq!(reset[1].cached, Some(0));
    assert_same("after reset", &reset[1..2], &want[1..2]);
}

/// With a sliding window (Gemma 3's local layers read only the last 8 positions; every
/// block stays in the pool), a cache hit ≡ a miss: cached blocks hold the K/V and final
/// hidden states of every position, whichever layers read them.
#[test]
fn sliding_window_cache_hits_equal_misses() {
    cache_hits_equal_misses(gemma3_fixture);
}

/// In a mixture of experts, the uncached tail of a prompt runs without the head's tokens
/// beside it in the step: their experts are shared no more, and nothing changes.
#[test]
fn mixture_of_experts_cache_hits_equal_misses() {
    cache_hits_equal_misses(mixtral_fixture);
}

fn cache_hits_equal_misses(load: fn() -> Model) {
    let reqs = requests(FIXTURE_IDS);
    let n = reqs.len();
    let mut off = cpu_engine(load(), config(256, false), 7);
    let mut want = vec![Out::default(); n];
    for i in 0..n {
        run_batch(&mut off, &reqs, &[i], &mut want);
    }
    let mut on = cpu_engine(load(), config(256, true), 7);
    let mut warm = vec![Out::default(); n];
    for i in 0..n {
        run_batch(&mut on, &reqs, &[i], &mut warm);
    }
    assert_same("warm", &warm, &want);
    assert_eq!(
        warm[1].cached,
        Some(64),
        "4 full blocks of the 70-token head"
    );
    let all: Vec<usize> = (0..n).collect();
    let mut batched = vec![Out::default(); n];
    run_batch(&mut on, &reqs, &all, &mut batched);
    assert_same("batched warm", &batched, &want);
}
