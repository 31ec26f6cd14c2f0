//! `n > 1` parallel samples on a fixture model: sibling `i` of a group must generate exactly
//! (tokens and logprobs, bit for bit) what a separate request with `sample_index = i` and the
//! same seed generates alone, whatever the pool, chunking or preemption; the prompt is
//! computed once and its blocks are shared by refcount; every block returns to the pool.
//! The KV cache holds f16 here (its copy-on-write of a shared partial block is exercised; the
//! f32 cache's by `beam_search.rs` and the prefix cache tests).

use std::collections::HashMap;

use tandem_engine::engine::{Engine, EngineEvent, GenerationRequest};
use tandem_engine::sampler::SamplingParams;
use tandem_engine::{FinishReason, RequestParams, SchedulerConfig, SeqId};
use tandem_model::batch::TokenId;
use tandem_model::kv_store::KvDtype;

mod cpu_engine;
use cpu_engine::{cpu_engine_with, fixture_model};

/// Tokens and logprobs one sample produced.
type Output = (Vec<TokenId>, Vec<f32>);

fn config(num_blocks: usize, budget: usize, block_size: usize) -> SchedulerConfig {
    let mut c = SchedulerConfig::new(num_blocks, block_size, 256);
    c.max_num_batched_tokens = budget;
    c.long_prefill_token_threshold = budget;
    c
}

fn prompt(len: usize, salt: usize) -> Vec<TokenId> {
    (0..len)
        .map(|j| TokenId(((salt * 131 + j * 17 + 5) % 320) as u32))
        .collect()
}

fn request(prompt: Vec<TokenId>, seed: u64, max_tokens: usize) -> GenerationRequest {
    GenerationRequest {
        prompt,
        sampling: SamplingParams {
            temperature: 1.0,
            top_p: 0.95,
            seed: Some(seed),
            logprobs: true,
            ..SamplingParams::default()
        },
        limits: RequestParams {
            max_tokens,
            ignore_eos: true,
            ..RequestParams::default()
        },
        sample_index: 0,
        prompt_logprobs: None,
        prompt_logprobs_start: 1,
    }
}

/// Steps `engine` until idle, collecting each id's tokens and logprobs.
fn drain(engine: &mut Engine, outputs: &mut HashMap<SeqId, Output>) {
    while engine.has_unfinished() {
        collect(engine.step().expect("step"), outputs);
    }
}

fn collect(events: Vec<EngineEvent>, outputs: &mut HashMap<SeqId, Output>) {
    for e in events {
        if let EngineEvent::Token {
            seq_id,
            token,
            logprob,
            ..
        } = e
        {
            let o = outputs.entry(seq_id).or_default();
            o.0.push(token);
            o.1.push(logprob.expect("asked for"));
        }
    }
}

/// The reference: `req` with `sample_index = i`, alone in a roomy engine.
fn alone(req: &GenerationRequest, i: u64) -> Output {
    let mut engine = cpu_engine_with(fixture_model(), config(64, 4096, 16), Some(KvDtype::F16), 3);
    let id = engine
        .add_request(GenerationRequest {
            sample_index: i,
            ..req.clone()
        })
        .expect("admitted");
    let mut out = HashMap::new();
    drain(&mut engine, &mut out);
    out.remove(&id).expect("tokens")
}

#[test]
fn siblings_equal_separate_requests_and_share_the_prompt_blocks() {
    let n = 4;
    let block_size = 4;
    // 10 prompt tokens: two full blocks and a partial third one, shared then copied on write.
    let req = request(prompt(10, 1), 77, 7);
    let other = request(prompt(13, 2), 5, 9);
    let mut engine = cpu_engine_with(
        fixture_model(),
        config(64, 4096, block_size),
        Some(KvDtype::F16),
        3,
    );
    let ids = engine.add_request_n(req.clone(), n).expect("admitted");
    let other_id = engine.add_request(other.clone()).expect("admitted");
    assert_eq!(ids.len(), n);
    let mut out = HashMap::new();
    // Step 1 computes both prompts (each once) and forks the group.
    collect(engine.step().expect("step"), &mut out);
    let s = engine.scheduler();
    let alloc = s.allocator();
    let used = alloc.num_total() - alloc.num_free();
    assert_eq!(
        used,
        3 + 4,
        "the group's prompt is stored once: 3 blocks, plus 4 for the other"
    );
    let tables: Vec<Vec<_>> = ids
        .iter()
        .map(|&id| {
            s.sequence(id)
                .expect("forked")
                .block_table()
                .blocks()
                .to_vec()
        })
        .collect();
    for t in &tables {
        assert_eq!(t, &tables[0], "siblings share every prompt block");
        for &b in t {
            assert_eq!(
                alloc.refcount(b),
                Some(n as u32),
                "each block has n holders"
            );
        }
    }
    // Step 2: each sibling writes position 10 into the shared partial block: n - 1 copies.
    collect(engine.step().expect("step"), &mut out);
    let s = engine.scheduler();
    let alloc = s.allocator();
    for &b in &tables[0][..2] {
        assert_eq!(
            alloc.refcount(b),
            Some(n as u32),
            "full prompt blocks stay shared"
        );
    }
    let lasts: Vec<_> = ids
        .iter()
        .map(|&id| s.sequence(id).expect("live").block_table().blocks()[2])
        .collect();
    for (i, b) in lasts.iter().enumerate() {
        assert_eq!(
            alloc.refcount(*b),
            Some(1),
            "sibling {i} owns its partial block"
        );
        assert!(!lasts[..i].contains(b), "partial blocks are distinct");
    }
    drain(&mut engine, &mut out);
    assert!(engine.scheduler().allocator().is_idle(), "blocks leaked");
    for (i, id) in ids.iter().enumerate() {
        let want = alone(&req, i as u64);
        let got = &out[id];
        assert_eq!(got.0, want.0, "sibling {i} tokens");
        assert!(got.1 == want.1, "sibling {i} logprobs");
    }
    assert_eq!(
        out[&other_id],
        alone(&other, 0),
        "a request batched beside the group"
    );
    let distinct: std::collections::HashSet<_> = ids.iter().map(|id| &out[id].0).collect();
    assert!(
        distinct.len() > 1,
        "different streams give different samples"
    );
}

#[test]
fn siblings_survive_chunking_and_preemption_in_a_tiny_pool() {
    let n = 3;
    let req = request(prompt(9, 3), 11, 12);
    let reference: Vec<Output> = (0..n as u64).map(|i| alone(&req, i)).collect();
    // 9 + 12 tokens need 6 blocks of 4; 8 blocks cannot hold three siblings at once.
    for budget in [3, 64] {
        let mut engine =
            cpu_engine_with(fixture_model(), config(8, budget, 4), Some(KvDtype::F16), 3);
        let ids = engine.add_request_n(req.clone(), n).expect("admitted");
        let mut out = HashMap::new();
        drain(&mut engine, &mut out);
        assert!(
            engine.scheduler().stats().num_preemptions > 0,
            "the pool forces preemption"
        );
        assert!(engine.scheduler().allocator().is_idle(), "blocks leaked");
        engine
            .scheduler()
            .allocator()
            .check_invariants()
            .expect("consistent pool");
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(
                out[id].0, reference[i].0,
                "budget {budget}: sibling {i} tokens"
            );
            assert!(
                out[id].1 == reference[i].1,
                "budget {budget}: sibling {i} logprobs"
            );
        }
    }
}

#[test]
fn greedy_siblings_agree_and_each_finishes() {
    let mut req = request(prompt(6, 4), 1, 5);
    req.sampling = SamplingParams {
        logprobs: true,
        ..SamplingParams::greedy()
    };
    let mut engine = cpu_engine_with(fixture_model(), config(32, 4096, 4), Some(KvDtype::F16), 3);
    let ids = engine.add_request_n(req.clone(), 3).expect("admitted");
    let mut finished = Vec::new();
    let mut out = HashMap::new();
    while engine.has_unfinished() {
        let events = engine.step().expect("step");
        for e in &events {
            if let EngineEvent::Finished { seq_id, reason } = e {
                assert_eq!(reason, &FinishReason::Length);
                finished.push(*seq_id);
            }
        }
        collect(events, &mut out);
    }
    finished.sort();
    assert_eq!(finished, ids);
    let want = alone(&req, 0);
    for id in &ids {
        assert_eq!(out[id], want);
    }
}

#[test]
fn aborts_before_the_fork_drop_one_sibling_or_the_whole_group() {
    let req = request(prompt(5, 5), 9, 4);
    let mut engine = cpu_engine_with(fixture_model(), config(32, 4096, 4), Some(KvDtype::F16), 3);
    let ids = engine.add_request_n(req.clone(), 3).expect("admitted");
    engine
        .abort(ids[1])
        .expect("a pending sibling can be aborted");
    let mut out = HashMap::new();
    drain(&mut engine, &mut out);
    assert!(!out.contains_key(&ids[1]));
    assert_eq!(out[&ids[0]], alone(&req, 0));
    assert_eq!(out[&ids[2]], alone(&req, 2));
    let ids = engine.add_request_n(req, 3).expect("admitted");
    engine.abort(ids[0]).expect("the parent aborts its group");
    assert!(!engine.has_unfinished());
    assert!(
        engine.abort(ids[2]).is_err(),
        "siblings went with the parent"
    );
    assert!(engine.scheduler().allocator().is_idle());
}

#[test]
fn group_sizes_are_checked() {
    let mut engine = cpu_engine_with(fixture_model(), config(32, 4096, 4), Some(KvDtype::F16), 3);
    let req = request(prompt(5, 6), 9, 4);
    assert!(engine.add_request_n(req.clone(), 0).is_err());
    let err = engine
        .add_request_n(req, 257)
        .expect_err("more than max_num_seqs");
    assert!(err.to_string().contains("max_num_seqs"), "{err}");
    assert!(!engine.has_unfinished());
}

/// A group whose prompt is in the prefix cache forks from the cached blocks and still
/// generates what separate requests generate alone (the prefix cache is on by default).
#[test]
fn a_group_on_a_cached_prompt_equals_separate_requests() {
    let n = 3;
    let req = request(prompt(10, 4), 31, 6);
    let mut engine = cpu_engine_with(fixture_model(), config(64, 4096, 4), Some(KvDtype::F16), 3);
    for round in 0..2 {
        let ids = engine.add_request_n(req.clone(), n).expect("admitted");
        let mut out = HashMap::new();
        let mut cached = None;
        while engine.has_unfinished() {
            let events = engine.step().expect("step");
            for e in &events {
                if let EngineEvent::Admitted { cached_tokens, .. } = e {
                    cached = Some(*cached_tokens);
                }
            }
            collect(events, &mut out);
        }
        assert_eq!(
            cached,
            Some(if round == 0 { 0 } else { 8 }),
            "round {round}"
        );
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(out[id], alone(&req, i as u64), "round {round}, sample {i}");
        }
        assert!(engine.scheduler().allocator().is_idle());
    }
}
