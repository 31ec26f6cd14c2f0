//! Overlapped steps (`engine/overlap.rs`, `scheduler/ahead.rs`): with a runner that overlaps
//! steps, the engine plans step n+1 before step n's picks are on the host, the sampled
//! sequences' next tokens carried from the picks by the runner. Every output must be the
//! reference's (each request alone, synchronous): token ids, logprobs and top logprobs
//! bitwise, finish reasons, and the fake's forward pass; the pool must be idle at the end
//! and the allocator's invariants hold after every step. The fake checks the whole
//! history each token reads back through its block table, so a carried token put in the
//! wrong row, a block freed under a step still to run, or a prefix-cache hit on a block a
//! discarded row wrote would change the logits or fail the pass.
//!
//! `QueuedRunner` runs each step at its launch, in launch order, which is the order a GPU
//! stream runs them: what the engine may do while a step is "running" is exactly what it
//! may do on the device.

mod cpu_engine;
mod fake_paths;

use cpu_engine::{config, cpu_runner, fixture_model};
use fake_paths::*;
use tandem_engine::engine::{Engine, EngineEvent, GenerationRequest};
use tandem_engine::sampler::{SamplerState, SamplingParams};
use tandem_engine::{FinishReason, RequestParams, SeqId};
use tandem_model::batch::{CarriedToken, ForwardBatch, OutputSelection, TokenId};
use tandem_model::fake_runner::FakeRunner;
use tandem_model::queued_runner::QueuedRunner;
use tandem_model::row_sampling::{RowDraw, RowSampling};
use tandem_model::runner::ModelRunner;

/// Runs `subs` on an overlapped engine of `shape` and compares with `want`.
fn check_overlapped(shape: Shape, subs: &[Sub], arrival: Arrival, want: &[Out]) -> Engine {
    let mut engine = shape.overlapped_engine();
    let got = run(&mut engine, subs, arrival, &[]).flat();
    assert_same(
        &format!("overlapped {shape:?}, {arrival:?}"),
        subs,
        &got,
        want,
    );
    engine
}

#[test]
fn overlapped_steps_give_the_synchronous_outputs() {
    let subs = singles(&requests());
    let want = reference(&subs);
    use Arrival::{AllAtOnce, Every, OneAtATime};
    let mut ahead = 0;
    for arrival in [AllAtOnce, OneAtATime, Every(1), Every(3)] {
        for shape in [REFERENCE, Shape(256, 4096, 4096, true), CHUNKED] {
            let engine = check_overlapped(shape, &subs, arrival, &want);
            let stats = engine.scheduler().stats();
            let name = format!("{shape:?}, {arrival:?}");
            assert!(
                2 * stats.num_planned_ahead > stats.num_steps,
                "{name}: {} of {} steps planned ahead",
                stats.num_planned_ahead,
                stats.num_steps
            );
            ahead += stats.num_planned_ahead;
        }
    }
    // Chunked prefill planned ahead: a prompt's next chunk while its last one runs.
    for (budget, chunk) in [(1, 1), (3, 3), (7, 3), (4096, 6)] {
        for caching in [false, true] {
            let shape = Shape(256, budget, chunk, caching);
            check_overlapped(shape, &subs, AllAtOnce, &want);
            check_overlapped(shape, &subs, Every(2), &want);
        }
    }
    assert!(ahead > 0);
}

#[test]
fn a_dry_pool_falls_back_to_preemption_without_changing_outputs() {
    let subs = singles(&requests());
    let want = reference(&subs);
    let mut preemptions = 0;
    for (budget, chunk) in [(4096, 4096), (9, 9), (64, 5)] {
        for caching in [false, true] {
            let shape = Shape(TINY, budget, chunk, caching);
            let engine = check_overlapped(shape, &subs, Arrival::AllAtOnce, &want);
            let stats = engine.scheduler().stats();
            assert!(
                stats.num_planned_ahead > 0,
                "{shape:?}: never planned ahead"
            );
            preemptions += stats.num_preemptions;
        }
    }
    assert!(preemptions > 0, "the tiny pool never preempted");
}

#[test]
fn parallel_samples_and_seeded_draws_overlap_unchanged() {
    let mut reqs = requests();
    for (i, r) in reqs.iter_mut().enumerate().filter(|(i, _)| i % 2 == 0) {
        r.sampling = sampling(Some(40 + i as u64));
    }
    let subs: Vec<Sub> = reqs
        .into_iter()
        .enumerate()
        .map(|(i, r)| Sub(r, [2, 1, 3][i % 3]))
        .collect();
    let want = reference(&subs);
    for shape in [REFERENCE, Shape(256, 6, 6, true), TINY_POOL] {
        check_overlapped(shape, &subs, Arrival::AllAtOnce, &want);
        check_overlapped(shape, &subs, Arrival::Every(2), &want);
    }
}

#[test]
fn aborts_while_a_step_runs_leave_other_requests_unchanged() {
    let subs = singles(&requests());
    let want = reference(&subs);
    let shapes = [REFERENCE, CHUNKED, Shape(TINY, 64, 5, true)];
    let mut random = lcg(0xab0);
    let mut aborted_mid_run = 0;
    for round in 0..12 {
        let aborts: Vec<(usize, usize)> =
            (0..3).map(|_| (random(subs.len()), random(16))).collect();
        let mut engine = shapes[round % shapes.len()].overlapped_engine();
        // `run` aborts between steps: with overlap, always while a step is launched.
        let got = run(&mut engine, &subs, Arrival::Every(1), &aborts).flat();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let path = format!("round {round}, aborts {aborts:?}, request {i}");
            if g.finish == Some(FinishReason::Abort) {
                assert!(w.tokens.starts_with(&g.tokens), "{path}: aborted, diverged");
                aborted_mid_run += usize::from(!g.tokens.is_empty());
            } else {
                assert_eq!(g, w, "{path}: changed by the others' aborts");
            }
        }
    }
    assert!(aborted_mid_run > 0, "no request was aborted mid-generation");
}

#[test]
fn requests_that_need_their_tokens_on_the_host_suspend_overlap() {
    // Prompt logprobs are scored on the host from the prompt's logits: while such a request
    // is live, no step is planned ahead. Its generated tokens are those of the same request
    // without them.
    const K: usize = 1; // a prompt of 13 tokens
    let reqs = requests();
    let mut short = reqs[K].clone();
    short.limits.max_tokens = 4;
    let mut check = singles(&reqs);
    check[K] = Sub(short.clone(), 1);
    let want = reference(&check);
    let mut scored = short;
    scored.prompt_logprobs = Some(2);
    let mut engine = Shape(256, 4096, 4096, true).overlapped_engine();
    let mut ahead_while_scoring = Vec::new();
    let mut rec = Vec::new();
    let mut ids = vec![SeqId(u64::MAX); check.len()];
    for (i, Sub(req, _)) in check.iter().enumerate().filter(|(i, _)| *i != K) {
        ids[i] = engine.add_request(req.clone()).expect("admissible");
    }
    // Everything else first makes progress with overlap on, then the scored one comes.
    for _ in 0..3 {
        rec.extend(engine.step().expect("a step"));
    }
    let ahead_before = engine.scheduler().stats().num_planned_ahead;
    assert!(
        ahead_before > 0,
        "no step planned ahead before the scored request"
    );
    ids[K] = engine.add_request(scored).expect("admissible");
    while engine.has_unfinished() {
        let before = engine.scheduler().stats().num_planned_ahead;
        let scored_live = engine.scheduler().sequence(ids[K]).is_some();
        rec.extend(engine.step().expect("a step"));
        let after = engine.scheduler().stats().num_planned_ahead;
        if scored_live {
            ahead_while_scoring.push(after - before);
        }
    }
    assert!(
        ahead_while_scoring.iter().all(|&n| n == 0),
        "planned ahead while prompt logprobs were owed: {ahead_while_scoring:?}"
    );
    let scored_events = rec
        .iter()
        .filter(|e| matches!(e, EngineEvent::PromptLogprobs { seq_id, .. } if *seq_id == ids[K]));
    assert!(scored_events.count() > 0, "no prompt logprobs");
    let ahead_after = engine.scheduler().stats().num_planned_ahead;
    assert!(
        ahead_after > ahead_before,
        "overlap did not resume after it ended"
    );
    let got = outputs(&ids, rec);
    assert_same("prompt logprobs among overlapped", &check, &got, &want);
}

#[test]
fn penalties_count_the_carried_token() {
    // Seeded draws with every penalty: the runner counts each carried token for them.
    let mut reqs = requests();
    for (i, r) in reqs.iter_mut().enumerate() {
        r.sampling = sampling(Some(500 + i as u64));
        r.sampling.repetition_penalty = [1.0, 1.4, 0.7][i % 3];
        r.sampling.presence_penalty = [0.8, 0.0, -0.5][i % 3];
        r.sampling.frequency_penalty = [0.6, 0.3, 0.0][i % 3];
        r.sampling.temperature = 0.5; // sharp enough for the penalties to change choices
    }
    let subs = singles(&reqs);
    let want = reference(&subs);
    let mut plain = reqs.clone();
    for r in &mut plain {
        (r.sampling.repetition_penalty, r.sampling.presence_penalty) = (1.0, 0.0);
        r.sampling.frequency_penalty = 0.0;
    }
    let unpenalised = reference(&singles(&plain));
    let differ = want
        .iter()
        .zip(&unpenalised)
        .filter(|(a, b)| a != b)
        .count();
    assert!(differ > 3, "the penalties change only {differ} outputs");
    for shape in [REFERENCE, CHUNKED, TINY_POOL] {
        let engine = check_overlapped(shape, &subs, Arrival::Every(1), &want);
        assert!(engine.scheduler().stats().num_planned_ahead > 0);
    }
}

#[test]
fn a_carried_tokens_processing_is_the_list_built_after_it() {
    let mut rng = 0x9e37_u64;
    let mut next = |below: u64| {
        rng = rng
            .wrapping_mul(0x5851_f42d_4c95_7f2d)
            .wrapping_add(1_442_695_040_888_963_407);
        (rng >> 33) % below
    };
    let vocab = 40;
    for case in 0..300 {
        let params = SamplingParams {
            temperature: 0.7,
            repetition_penalty: [1.0, 1.3, 0.8][case % 3],
            presence_penalty: [0.0, 0.4][case / 3 % 2],
            frequency_penalty: [0.0, 0.25][case / 6 % 2],
            logit_bias: (0..next(4)).map(|_| (next(vocab) as u32, 1.5)).collect(),
            min_tokens: next(4) as usize,
            stop_token_ids: vec![next(vocab) as u32],
            ..SamplingParams::default()
        };
        let prompt: Vec<u32> = (0..next(12)).map(|_| next(vocab) as u32).collect();
        let mut state = SamplerState::new(1, &prompt);
        let outputs = next(6) as usize;
        for _ in 0..outputs {
            state.append_output(next(vocab) as u32);
        }
        let token = next(vocab) as u32;
        let before = params.row_draw(&state, outputs + 1, 0.5, vocab as usize);
        state.append_output(token);
        let after = params.row_draw(&state, outputs + 1, 0.5, vocab as usize);
        assert_eq!(
            before.processing.with_output(token),
            after.processing,
            "case {case}: token {token}"
        );
    }
}

#[test]
fn the_queued_runner_carries_picks_and_keeps_the_contract() {
    let fake = || FakeRunner::new(16, 64, 8, 4, 0x7a11);
    let mut queued = QueuedRunner::new(Box::new(fake()));
    let greedy = [RowDraw::plain(RowSampling {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        uniform: 0.0,
    })];
    let prompt: Vec<TokenId> = [3, 1, 4].map(TokenId).to_vec();
    let table = vec![
        tandem_model::batch::BlockId(0),
        tandem_model::batch::BlockId(1),
    ];
    let first = ForwardBatch::single(prompt.clone(), 0, table.clone(), OutputSelection::Last);
    assert!(queued.collect_picks().is_err(), "nothing launched");
    queued.launch_sample(&first, &greedy, &[]).expect("launch");
    // The next step's token is the first's pick, carried.
    let second = ForwardBatch::single(vec![TokenId(0)], 3, table.clone(), OutputSelection::Last);
    let carried = [CarriedToken {
        row: 0,
        from_output: 0,
    }];
    queued
        .launch_sample(&second, &greedy, &carried)
        .expect("launch");
    assert_eq!(queued.num_launched(), 2);
    let third = ForwardBatch::single(vec![TokenId(0)], 4, table.clone(), OutputSelection::Last);
    assert!(
        queued.launch_sample(&third, &greedy, &carried).is_err(),
        "a third launched step"
    );
    // The refused launch dropped both: collecting finds nothing.
    assert!(queued.collect_picks().is_err());
    // Against a synchronous runner fed the real tokens.
    let mut sync = fake();
    let mut queued = QueuedRunner::new(Box::new(fake()));
    queued.launch_sample(&first, &greedy, &[]).expect("launch");
    queued
        .launch_sample(&second, &greedy, &carried)
        .expect("launch");
    let want_first = sync.forward_sample(&first, &greedy).expect("sync");
    let picked = want_first[0].as_ref().expect("finite").token;
    let real = ForwardBatch::single(vec![picked], 3, table, OutputSelection::Last);
    let want_second = sync.forward_sample(&real, &greedy).expect("sync");
    assert_eq!(queued.collect_picks().expect("first"), want_first);
    assert_eq!(queued.collect_picks().expect("second"), want_second);
}

/// Requests over the real CPU fixture model: greedy, seeded sampled with truncation, bias,
/// `min_tokens` and top logprobs, stop tokens.
fn fixture_requests(vocab: usize) -> Vec<GenerationRequest> {
    (0..8u32)
        .map(|i| {
            let prompt = (0..5 + 3 * i).map(|j| TokenId((i * 31 + j * 7) % vocab as u32));
            let sampling = SamplingParams {
                temperature: if i % 2 == 0 { 0.0 } else { 0.9 },
                top_k: if i % 4 == 1 { 20 } else { 0 },
                top_p: if i % 4 == 3 { 0.8 } else { 1.0 },
                seed: Some(u64::from(i) + 11),
                logit_bias: if i == 2 { vec![(5, 2.5)] } else { Vec::new() },
                min_tokens: if i == 5 { 4 } else { 0 },
                logprobs: i % 3 == 0,
                top_logprobs: if i % 3 == 0 { 4 } else { 0 },
                ..SamplingParams::default()
            };
            GenerationRequest {
                prompt: prompt.collect(),
                sampling,
                limits: RequestParams {
                    max_tokens: 6 + (i as usize * 3) % 7,
                    stop_token_ids: vec![TokenId(7), TokenId(11)],
                    ..RequestParams::default()
                },
                sample_index: 0,
                prompt_logprobs: None,
                prompt_logprobs_start: 1,
            }
        })
        .collect()
}

#[test]
fn overlapped_steps_on_the_cpu_model_equal_the_synchronous_loop() {
    let model = fixture_model();
    let vocab = model.config.vocab_size;
    let reqs = fixture_requests(vocab);
    let c = config(&model.config, 64, 24, 4);
    let run_all = |overlap: bool| {
        let runner = cpu_runner(fixture_model(), &c, None);
        let runner: Box<dyn ModelRunner> = if overlap {
            Box::new(QueuedRunner::new(runner))
        } else {
            runner
        };
        let mut engine = Engine::new(runner, c.clone(), 3).expect("engine");
        let ids: Vec<SeqId> = reqs
            .iter()
            .map(|r| engine.add_request(r.clone()).expect("admissible"))
            .collect();
        let mut events = Vec::new();
        while engine.has_unfinished() {
            events.extend(engine.step().expect("a step"));
        }
        let a = engine.scheduler().allocator();
        assert_eq!(a.num_free(), a.num_total(), "blocks leaked");
        (outputs(&ids, events), engine.scheduler().stats())
    };
    let (want, sync_stats) = run_all(false);
    let (got, stats) = run_all(true);
    assert_eq!(sync_stats.num_planned_ahead, 0);
    assert!(stats.num_planned_ahead > 0, "never planned ahead");
    assert_eq!(
        got, want,
        "overlapped outputs differ from the synchronous loop"
    );
    let sampled = want.iter().flat_map(|o| &o.tokens).count();
    assert!(sampled > 40, "only {sampled} tokens");
}

#[test]
fn min_tokens_counts_the_carried_token() {
    // Every request may stop on EOS, and must not before its 6th token: a carried row's
    // suppression depends on the output it comes after, the token still on the device.
    let mut reqs = requests();
    for (i, r) in reqs.iter_mut().enumerate() {
        r.sampling = sampling(Some(300 + i as u64));
        r.sampling.min_tokens = 6;
        r.sampling.eos_token_ids = vec![EOS.0];
        r.limits.ignore_eos = false;
        r.limits.max_tokens = r.limits.max_tokens.max(8);
    }
    let subs = singles(&reqs);
    let want = reference(&subs);
    // The suppression mattered: EOS was among the most likely tokens before the 6th.
    let early_eos = want
        .iter()
        .flat_map(|o| o.tokens.iter().take(5))
        .filter(|t| t.2.iter().any(|&(id, _)| id == EOS))
        .count();
    assert!(early_eos > 3, "EOS was never likely early ({early_eos})");
    for shape in [REFERENCE, CHUNKED, TINY_POOL] {
        let engine = check_overlapped(shape, &subs, Arrival::Every(1), &want);
        assert!(engine.scheduler().stats().num_planned_ahead > 0);
    }
}
