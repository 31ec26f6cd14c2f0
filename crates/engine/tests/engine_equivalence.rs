//! The equivalence harness (ARCHITECTURE.md § Invariants) for generation, on a real model file: one
//! prompt set, many paths (alone, batched with others in any arrival order, chunked prefill at
//! several sizes, forced preemption), all compared token for token and logprob for logprob, plus
//! decode ≡ teacher-forced forward and pool accounting.

use std::collections::HashMap;

use tandem_engine::engine::{Engine, EngineEvent, GenerationRequest};
use tandem_engine::sampler::SamplingParams;
use tandem_engine::{RequestParams, SchedulerConfig, SeqId};
use tandem_model::batch::TokenId;
use tandem_model::scoring::{score_tokens, ScoreOptions};
use tandem_model::transformer::Model;

mod cpu_engine;
use cpu_engine::{
    config, cpu_engine_with, default_model, fixture_model, gemma3_fixture, mixtral_fixture,
    scoring_runner_with,
};
use tandem_model::kv_store::KvDtype;

/// Tokens and logprobs (`None` where not asked for) a request produced.
type Output = (Vec<TokenId>, Vec<Option<f32>>);

/// A way to run the prompt set: name, KV blocks, step token budget, block size, arrival
/// order, submissions per step.
type Path<'a> = (&'a str, usize, usize, usize, &'a [usize], usize);

/// Deterministic prompts of varied lengths (65 requests on the fixtures: each alone vs with
/// up to 64 others).
fn prompts(n: usize, vocab: usize) -> Vec<Vec<TokenId>> {
    (0..n)
        .map(|i| {
            let len = 3 + (i * 7) % 29;
            (0..len)
                .map(|j| TokenId(((i * 131 + j * 17 + 5) % vocab) as u32))
                .collect()
        })
        .collect()
}

/// Request `i`: greedy or sampled; every third one does not ask for logprobs, so that
/// batches mix requests that do and do not (a step of only the latter skips them).
fn request(prompt: &[TokenId], i: usize, sampled: bool) -> GenerationRequest {
    let logprobs = i % 3 != 2;
    let sampling = if sampled {
        SamplingParams {
            temperature: 0.9,
            top_p: 0.95,
            seed: Some(1000 + i as u64),
            logprobs,
            ..SamplingParams::default()
        }
    } else {
        SamplingParams {
            logprobs,
            ..SamplingParams::greedy()
        }
    };
    let limits = RequestParams {
        max_tokens: 6 + i % 5,
        ignore_eos: true,
        ..RequestParams::default()
    };
    GenerationRequest {
        prompt: prompt.to_vec(),
        sampling,
        limits,
        sample_index: 0,
        prompt_logprobs: None,
        prompt_logprobs_start: 1,
    }
}

/// Runs `requests` (submitted in `order`, `per_step` new submissions per step) to completion.
fn run(
    model: Model,
    config: SchedulerConfig,
    reqs: &[GenerationRequest],
    order: &[usize],
    per_step: usize,
    kv: Option<KvDtype>,
) -> (Vec<Output>, Engine) {
    let mut engine = cpu_engine_with(model, config, kv, 7);
    let mut ids: HashMap<SeqId, usize> = HashMap::new();
    let mut out: Vec<Output> = vec![(Vec::new(), Vec::new()); reqs.len()];
    let mut pending = order.iter().copied().peekable();
    while pending.peek().is_some() || engine.has_unfinished() {
        for i in pending.by_ref().take(per_step) {
            ids.insert(engine.add_request(reqs[i].clone()).expect("admitted"), i);
        }
        for e in engine.step().expect("step") {
            if let EngineEvent::Token {
                seq_id,
                token,
                logprob,
                ..
            } = e
            {
                let o = &mut out[ids[&seq_id]];
                o.0.push(token);
                o.1.push(logprob);
            }
        }
    }
    (out, engine)
}

/// Every path against each request alone, and decode against scoring, with the KV cache
/// stored as `kv` (else the model's default) throughout.
fn check_paths(load: fn() -> Model, n: usize, sampled: bool, kv: Option<KvDtype>) {
    let model = scoring_runner_with(load(), kv);
    let vocab = model.config().vocab_size;
    let reqs: Vec<GenerationRequest> = prompts(n, vocab)
        .iter()
        .enumerate()
        .map(|(i, p)| request(p, i, sampled))
        .collect();
    // Reference: each request alone, whole prefill.
    let alone: Vec<Output> = (0..n)
        .map(|i| {
            let m = load();
            let c = config(&m.config, 64, 4096, 16);
            run(m, c, &reqs[i..=i], &[0], 1, kv).0.remove(0)
        })
        .collect();
    // A pool that holds the longest request but not all of them at once.
    let tiny = reqs
        .iter()
        .map(|r| (r.prompt.len() + r.limits.max_tokens).div_ceil(4))
        .max()
        .expect("requests")
        + 1;
    let forward: Vec<usize> = (0..n).collect();
    let reverse: Vec<usize> = (0..n).rev().collect();
    let paths: [Path<'_>; 6] = [
        ("all at once", 512, 4096, 16, &forward, n),
        ("reverse arrival, one per step", 512, 4096, 16, &reverse, 1),
        ("chunks of 1", 512, 1, 16, &forward, n),
        ("chunks of 7, block 4", 512, 7, 4, &reverse, 3),
        ("chunks of 64", 512, 64, 8, &forward, 2),
        ("tiny pool: preemption", tiny, 64, 4, &forward, n),
    ];
    for (name, blocks, budget, block_size, order, per_step) in paths {
        let m = load();
        let c = config(&m.config, blocks, budget, block_size);
        let (got, engine) = run(m, c, &reqs, order, per_step, kv);
        for i in 0..n {
            assert_eq!(
                got[i].0, alone[i].0,
                "{name}: request {i} tokens differ from alone"
            );
            assert!(
                got[i].1 == alone[i].1,
                "{name}: request {i} logprobs differ from alone"
            );
        }
        let alloc = engine.scheduler().allocator();
        assert!(
            alloc.is_idle(),
            "{name}: blocks leaked: {} of {} free",
            alloc.num_free(),
            alloc.num_total()
        );
        if name.contains("preemption") {
            assert!(
                engine.scheduler().stats().num_preemptions > 0,
                "the tiny pool must force preemption"
            );
        }
    }
    // decode ≡ forward: the logprob of every generated token equals the teacher-forced score.
    let mut model = scoring_runner_with(load(), kv);
    for (i, (tokens, logprobs)) in alone.iter().enumerate() {
        let full: Vec<TokenId> = reqs[i].prompt.iter().chain(tokens).copied().collect();
        let scored = score_tokens(
            model.as_mut(),
            &full,
            &ScoreOptions {
                top_k: 1,
                ..ScoreOptions::default()
            },
            &mut |_, _| {},
        )
        .expect("score");
        // Log-probabilities alone take the runner's `forward_logprobs`: the same numbers.
        let plain = score_tokens(
            model.as_mut(),
            &full,
            &ScoreOptions::default(),
            &mut |_, _| {},
        )
        .expect("score");
        let p = reqs[i].prompt.len();
        assert_eq!(logprobs.len(), tokens.len());
        for (j, lp) in logprobs.iter().enumerate() {
            let s = scored.positions[p + j].as_ref().expect("scored");
            if !sampled {
                assert_eq!(s.top[0].0, tokens[j], "greedy token is the forward argmax");
            }
            let Some(lp) = lp else {
                assert!(!reqs[i].sampling.logprobs, "request {i} asked for logprobs");
                continue;
            };
            assert!(
                reqs[i].sampling.logprobs,
                "request {i} did not ask for logprobs"
            );
            assert!(
                s.logprob == *lp,
                "request {i} token {j}: decode {lp} vs forward {}",
                s.logprob
            );
            let alone = plain.positions[p + j].as_ref().expect("scored").logprob;
            assert_eq!(
                alone.to_bits(),
                lp.to_bits(),
                "request {i} token {j}: logprobs alone"
            );
        }
    }
}

#[test]
fn greedy_generation_is_path_independent_on_a_fixture_model() {
    check_paths(fixture_model, 65, false, None);
}

#[test]
fn seeded_sampling_is_path_independent_on_a_fixture_model() {
    check_paths(fixture_model, 65, true, None);
}

/// Gemma 3 with a window of 8 positions on its local layers, shorter than most prompts.
#[test]
fn greedy_generation_is_path_independent_with_a_sliding_window() {
    check_paths(gemma3_fixture, 65, false, None);
}

#[test]
fn seeded_sampling_is_path_independent_with_a_sliding_window() {
    check_paths(gemma3_fixture, 65, true, None);
}

/// Mixtral: a token's neighbours in a step share some of its experts.
#[test]
fn greedy_generation_is_path_independent_with_a_mixture_of_experts() {
    check_paths(mixtral_fixture, 65, false, None);
}

#[test]
fn seeded_sampling_is_path_independent_with_a_mixture_of_experts() {
    check_paths(mixtral_fixture, 65, true, None);
}

#[test]
fn greedy_generation_is_path_independent_on_the_default_model() {
    check_paths(default_model, 4, false, None);
}

/// An 8-bit KV cache: a token's keys and values are quantized once, when written, so every
/// path (and scoring) reads the same values, and the invariants hold as with f16.
#[test]
fn generation_is_path_independent_with_an_8_bit_kv_cache() {
    check_paths(default_model, 4, false, Some(KvDtype::Q8));
    check_paths(default_model, 4, true, Some(KvDtype::Q8));
}

#[test]
fn a_bad_request_is_refused_and_changes_nothing() {
    let model = fixture_model();
    let c = config(&model.config, 8, 64, 4);
    let vocab = model.config.vocab_size;
    let mut engine = cpu_engine_with(model, c, None, 0);
    let too_long = GenerationRequest {
        prompt: vec![TokenId(1); 40],
        ..request(&[TokenId(1)], 0, false)
    };
    assert!(
        engine.add_request(too_long).is_err(),
        "needs more blocks than the pool"
    );
    let bad_token = request(&[TokenId(vocab as u32)], 0, false);
    assert!(
        engine.add_request(bad_token).is_err(),
        "token outside the vocabulary"
    );
    let bad_temp = GenerationRequest {
        sampling: SamplingParams {
            temperature: -1.0,
            ..SamplingParams::default()
        },
        ..request(&[TokenId(1)], 0, false)
    };
    let err = engine
        .add_request(bad_temp)
        .expect_err("negative temperature");
    assert!(
        err.to_string().contains("temperature"),
        "error names the field: {err}"
    );
    let too_many = GenerationRequest {
        limits: RequestParams {
            max_tokens: 1_000_000,
            ..RequestParams::default()
        },
        ..request(&[TokenId(1)], 0, false)
    };
    let err = engine
        .add_request(too_many)
        .expect_err("prompt + max_tokens beyond the context");
    assert!(
        err.to_string().contains("max_tokens"),
        "error names the field: {err}"
    );
    assert!(!engine.has_unfinished());
    assert!(engine.scheduler().allocator().is_idle());
}
