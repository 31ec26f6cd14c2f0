//! Prompt logprobs through the engine (ARCHITECTURE.md § Invariants, 1-3 and 5): the scores the
//! engine emits for prompt tokens are bitwise equal to teacher-forced scoring
//! (`tandem_model::scoring::score_tokens`) of the same tokens, whether the prompt is prefilled
//! whole, in chunks of 1 or 7 tokens, batched with ordinary generation requests, or recomputed
//! after a preemption; every prompt index is emitted exactly once, in order; and asking for them
//! changes nothing in what is generated.

use std::collections::HashMap;

use tandem_engine::engine::{Engine, EngineEvent, GenerationRequest, PromptTokenLogprob};
use tandem_engine::sampler::SamplingParams;
use tandem_engine::{FinishReason, RequestParams, SchedulerConfig, SeqId};
use tandem_model::batch::TokenId;
use tandem_model::scoring::{score_tokens, ScoreOptions};
use tandem_model::transformer::Model;

mod cpu_engine;
use cpu_engine::{config, cpu_engine, default_model, fixture_model, scoring_runner};
use tandem_model::runner::ModelRunner;

/// What one request produced: prompt scores (index 1 first), tokens, logprobs, finish reason.
#[derive(Debug, Clone, Default, PartialEq)]
struct Output {
    prompt: Vec<PromptTokenLogprob>,
    tokens: Vec<TokenId>,
    logprobs: Vec<Option<f32>>,
    finish: Option<FinishReason>,
}

/// `n` requests over deterministic prompts of 1..=30 tokens: even ones ask for prompt
/// logprobs (0..=5 alternatives, some with `max_tokens == 0`), odd ones are plain greedy
/// generation riding in the same batches.
fn requests(n: usize, vocab: usize) -> Vec<GenerationRequest> {
    (0..n)
        .map(|i| {
            let len = 1 + (i * 11) % 30;
            let prompt = (0..len)
                .map(|j| TokenId(((i * 131 + j * 17 + 5) % vocab) as u32))
                .collect();
            let scored = i % 2 == 0;
            GenerationRequest {
                prompt,
                sampling: SamplingParams {
                    logprobs: true,
                    ..SamplingParams::greedy()
                },
                limits: RequestParams {
                    max_tokens: if scored && i % 4 == 0 { 0 } else { 3 + i % 4 },
                    ignore_eos: true,
                    ..RequestParams::default()
                },
                sample_index: 0,
                prompt_logprobs: scored.then_some(i % 6),
                prompt_logprobs_start: 1,
            }
        })
        .collect()
}

/// Adds the events of one step to `out`, checking that prompt chunks are contiguous, come
/// once, and precede the request's tokens.
fn collect(events: Vec<EngineEvent>, ids: &HashMap<SeqId, usize>, out: &mut [Output]) {
    for e in events {
        match e {
            EngineEvent::PromptLogprobs {
                seq_id,
                start,
                entries,
            } => {
                let o = &mut out[ids[&seq_id]];
                assert_eq!(
                    start,
                    o.prompt.len() + 1,
                    "chunks are contiguous, once each"
                );
                assert!(o.tokens.is_empty(), "prompt scores come before tokens");
                assert!(!entries.is_empty(), "no empty chunk");
                o.prompt.extend(entries);
            }
            EngineEvent::Token {
                seq_id,
                token,
                logprob,
                ..
            } => {
                let o = &mut out[ids[&seq_id]];
                o.tokens.push(token);
                o.logprobs.push(logprob);
            }
            EngineEvent::Finished { seq_id, reason } => {
                let o = &mut out[ids[&seq_id]];
                assert!(o.finish.is_none(), "finished once");
                o.finish = Some(reason);
            }
            EngineEvent::Admitted { seq_id, .. } => {
                let o = &out[ids[&seq_id]];
                assert!(o.prompt.is_empty() && o.tokens.is_empty(), "admitted first");
            }
        }
    }
}

/// Runs `reqs`, `per_step` new submissions per step in index order, to completion.
fn run(
    model: Model,
    c: SchedulerConfig,
    reqs: &[GenerationRequest],
    per_step: usize,
) -> (Vec<Output>, Engine) {
    let mut engine = cpu_engine(model, c, 7);
    let mut ids = HashMap::new();
    let mut out = vec![Output::default(); reqs.len()];
    let mut next = 0;
    while next < reqs.len() || engine.has_unfinished() {
        for (i, r) in reqs.iter().enumerate().skip(next).take(per_step) {
            ids.insert(engine.add_request(r.clone()).expect("admitted"), i);
        }
        next = (next + per_step).min(reqs.len());
        collect(engine.step().expect("step"), &ids, &mut out);
    }
    (out, engine)
}

/// Bitwise comparison of the engine's prompt scores with `score_tokens` on the prompt.
fn assert_matches_scoring(
    model: &mut dyn ModelRunner,
    req: &GenerationRequest,
    got: &[PromptTokenLogprob],
    what: &str,
) {
    let k = req.prompt_logprobs.expect("a scored request");
    let opts = ScoreOptions {
        top_k: k.max(1), // the rank comes with top_k > 0; the top list is a prefix
        ..ScoreOptions::default()
    };
    let reference = score_tokens(model, &req.prompt, &opts, &mut |_, _| {}).expect("score");
    assert_eq!(
        got.len(),
        req.prompt.len() - 1,
        "{what}: every index from 1 once"
    );
    for (i, g) in got.iter().enumerate() {
        let r = reference.positions[i + 1]
            .as_ref()
            .expect("scored position");
        assert_eq!(g.token, req.prompt[i + 1], "{what}: position {}", i + 1);
        assert_eq!(
            g.logprob.to_bits(),
            r.logprob.to_bits(),
            "{what}: position {} logprob",
            i + 1
        );
        assert_eq!(Some(g.rank), r.rank, "{what}: position {} rank", i + 1);
        let top: Vec<(u32, u32)> = g.top.iter().map(|(t, l)| (t.0, l.to_bits())).collect();
        let want: Vec<(u32, u32)> = r.top[..k].iter().map(|(t, l)| (t.0, l.to_bits())).collect();
        assert_eq!(top, want, "{what}: position {} top {k}", i + 1);
    }
}

fn check_paths(load: fn() -> Model, n: usize) {
    let mut model = scoring_runner(load());
    let reqs = requests(n, model.config().vocab_size);
    // Reference for the generated side: the same requests without prompt logprobs.
    let plain: Vec<GenerationRequest> = reqs
        .iter()
        .map(|r| GenerationRequest {
            prompt_logprobs: None,
            prompt_logprobs_start: 1,
            limits: RequestParams {
                max_tokens: r.limits.max_tokens.max(1),
                ..r.limits.clone()
            },
            ..r.clone()
        })
        .collect();
    let (baseline, _) = run(load(), config(model.config(), 512, 4096, 16), &plain, n);
    let tiny = reqs
        .iter()
        .map(|r| (r.prompt.len() + r.limits.max_tokens).div_ceil(4))
        .max()
        .expect("requests")
        + 1;
    let paths = [
        ("alone, one per step, whole prefill", 512, 4096, 16, 1),
        ("all at once", 512, 4096, 16, n),
        ("chunks of 1", 512, 1, 16, n),
        ("chunks of 7, block 4", 512, 7, 4, 3),
        ("tiny pool: preemption", tiny, 64, 4, n),
    ];
    for (name, blocks, budget, block_size, per_step) in paths {
        let (got, engine) = run(
            load(),
            config(model.config(), blocks, budget, block_size),
            &reqs,
            per_step,
        );
        for (i, (r, o)) in reqs.iter().zip(&got).enumerate() {
            let what = format!("{name}: request {i}");
            if r.prompt_logprobs.is_some() {
                assert_matches_scoring(model.as_mut(), r, &o.prompt, &what);
            } else {
                assert!(o.prompt.is_empty(), "{what}: not asked for");
            }
            if r.limits.max_tokens == 0 {
                assert!(o.tokens.is_empty(), "{what}: prompt only");
            } else {
                assert_eq!(o.tokens, baseline[i].tokens, "{what}: generation unchanged");
                assert!(
                    o.logprobs == baseline[i].logprobs,
                    "{what}: logprobs unchanged"
                );
            }
            assert_eq!(o.finish, Some(FinishReason::Length), "{what}");
        }
        assert!(
            engine.scheduler().allocator().is_idle(),
            "{name}: blocks leaked"
        );
        if name.contains("preemption") {
            assert!(
                engine.scheduler().stats().num_preemptions > 0,
                "the tiny pool must preempt"
            );
        }
    }
}

#[test]
fn prompt_logprobs_equal_scoring_on_every_path_on_a_fixture_model() {
    check_paths(fixture_model, 24);
}

#[test]
fn prompt_logprobs_equal_scoring_on_every_path_on_the_default_model() {
    check_paths(default_model, 4);
}

#[test]
fn a_preempted_request_emits_its_prompt_once() {
    // Two long requests in a pool that holds only one of them whole: the later one is
    // preempted mid-generation, after its prompt scores went out, and recomputes them.
    let model = fixture_model();
    let vocab = model.config.vocab_size;
    let reqs: Vec<GenerationRequest> = (0..2)
        .map(|i| GenerationRequest {
            prompt: (0..20)
                .map(|j| TokenId(((i * 7 + j * 13 + 1) % vocab) as u32))
                .collect(),
            sampling: SamplingParams::greedy(),
            limits: RequestParams {
                max_tokens: 20,
                ignore_eos: true,
                ..RequestParams::default()
            },
            sample_index: 0,
            prompt_logprobs: Some(2),
            prompt_logprobs_start: 1,
        })
        .collect();
    let c = config(&model.config, 15, 64, 4); // 60 slots: 2 x 40 tokens do not fit
    let mut model = scoring_runner(model);
    let (got, engine) = run(fixture_model(), c, &reqs, 2);
    assert!(
        engine.scheduler().stats().num_preemptions > 0,
        "the pool must preempt"
    );
    for (i, (r, o)) in reqs.iter().zip(&got).enumerate() {
        assert_matches_scoring(model.as_mut(), r, &o.prompt, &format!("request {i}"));
        assert_eq!(o.tokens.len(), 20);
    }
}

#[test]
fn groups_one_token_prompts_and_refusals() {
    let model = fixture_model();
    let c = config(&model.config, 64, 64, 4);
    let mut engine = cpu_engine(model, c, 0);
    let base = GenerationRequest {
        prompt: vec![TokenId(3), TokenId(9), TokenId(27)],
        sampling: SamplingParams::greedy(),
        limits: RequestParams {
            max_tokens: 2,
            ignore_eos: true,
            ..RequestParams::default()
        },
        sample_index: 0,
        prompt_logprobs: Some(1),
        prompt_logprobs_start: 1,
    };
    let refused = |engine: &mut Engine, r: GenerationRequest, field: &str| {
        let err = engine.add_request(r).expect_err("refused");
        assert!(err.to_string().contains(field), "names {field}: {err}");
    };
    refused(
        &mut engine,
        GenerationRequest {
            prompt_logprobs: Some(21),
            prompt_logprobs_start: 1,
            ..base.clone()
        },
        "prompt_logprobs",
    );
    let no_output = RequestParams {
        max_tokens: 0,
        ..base.limits.clone()
    };
    let plain_zero = GenerationRequest {
        prompt_logprobs: None,
        prompt_logprobs_start: 1,
        limits: no_output.clone(),
        ..base.clone()
    };
    refused(&mut engine, plain_zero, "max_tokens");
    let beam = tandem_engine::beam_search::BeamParams {
        width: 2,
        length_penalty: 1.0,
    };
    let err = engine
        .add_beam_request(base.clone(), beam)
        .expect_err("refused");
    assert!(err.to_string().contains("beam"), "{err}");
    let zero_group = GenerationRequest {
        limits: no_output,
        ..base.clone()
    };
    assert!(
        engine.add_request_n(zero_group, 2).is_err(),
        "n > 1 needs an output"
    );
    assert!(!engine.has_unfinished(), "nothing started");

    let ids = engine.add_request_n(base.clone(), 3).expect("a group");
    let one = engine
        .add_request(GenerationRequest {
            prompt: vec![TokenId(5)],
            ..base.clone()
        })
        .expect("a one-token prompt");
    let mut scores: HashMap<SeqId, usize> = HashMap::new();
    let mut finished = 0;
    while engine.has_unfinished() {
        for e in engine.step().expect("step") {
            match e {
                EngineEvent::PromptLogprobs {
                    seq_id, entries, ..
                } => *scores.entry(seq_id).or_default() += entries.len(),
                EngineEvent::Finished { .. } => finished += 1,
                EngineEvent::Token { .. } | EngineEvent::Admitted { .. } => {}
            }
        }
    }
    assert_eq!(finished, 4);
    for id in &ids {
        assert_eq!(
            scores.get(id),
            Some(&2),
            "every sample of the group gets them"
        );
    }
    assert_eq!(
        scores.len(),
        3,
        "a one-token prompt gets none: {scores:?} {one:?}"
    );
    assert!(engine.scheduler().allocator().is_idle());
}
