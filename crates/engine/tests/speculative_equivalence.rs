//! ARCHITECTURE.md § Invariants, 6, speculation transparency: greedy decoding with speculation
//! (n-gram and draft model) emits exactly the tokens and bitwise the logprobs (chosen and top) of
//! plain greedy decoding, whatever the batch composition, step budget (drafts cut by the budget) or
//! pool size (forced preemption), and leaves both KV pools empty. Each run must actually accept
//! drafts, so the speculative path is exercised.

use std::collections::HashMap;

use tandem_engine::block_allocator::BlockAllocator;
use tandem_engine::engine::{Engine, EngineEvent, GenerationRequest};
use tandem_engine::sampler::SamplingParams;
use tandem_engine::speculative::{
    DraftModelProposer, NgramProposer, Proposer, SpecStats, SpeculativeConfig,
};
use tandem_engine::{RequestParams, SchedulerConfig, SeqId};
use tandem_model::batch::TokenId;
use tandem_model::kv_store::KvDtype;
use tandem_model::loader::load_model;
use tandem_model::transformer::Model;

use tandem_model::cpu_runner::{CpuRunner, KvSpec};

mod cpu_engine;
use cpu_engine::{config, cpu_engine, default_model, fixture_model, mixtral_fixture};

/// Per request: (token, logprob, top logprobs) for each emitted token.
type Output = Vec<(TokenId, f32, Vec<(TokenId, f32)>)>;

/// Prompts with something to copy (a repeated phrase) and without.
fn prompts(n: usize, vocab: usize) -> Vec<Vec<TokenId>> {
    (0..n)
        .map(|i| {
            let phrase: Vec<u32> = (0..4 + i % 5)
                .map(|j| ((i * 37 + j * 11 + 3) % vocab) as u32)
                .collect();
            let repeats = if i % 3 == 2 { 1 } else { 3 };
            let mut p: Vec<u32> = phrase
                .iter()
                .copied()
                .cycle()
                .take(phrase.len() * repeats)
                .collect();
            p.push(((i * 7 + 1) % vocab) as u32);
            p.into_iter().map(TokenId).collect()
        })
        .collect()
}

fn request(prompt: &[TokenId], i: usize) -> GenerationRequest {
    GenerationRequest {
        prompt: prompt.to_vec(),
        sampling: SamplingParams {
            logprobs: true,
            top_logprobs: 3,
            ..SamplingParams::greedy()
        },
        limits: RequestParams {
            max_tokens: 12 + i % 7,
            ignore_eos: true,
            ..RequestParams::default()
        },
        sample_index: 0,
        prompt_logprobs: None,
        prompt_logprobs_start: 1,
    }
}

/// Runs `reqs` with `per_step` submissions per step to completion; returns the outputs, the
/// speculation counters and the engine.
fn run(
    model: Model,
    config: SchedulerConfig,
    spec: Option<(Box<dyn Proposer>, usize, f64)>,
    reqs: &[GenerationRequest],
    per_step: usize,
) -> (Vec<Output>, SpecStats, Engine) {
    let mut engine = cpu_engine(model, config, 7);
    if let Some((proposer, k, draft_cost)) = spec {
        let c = SpeculativeConfig {
            num_tokens: k,
            max_batch_size: 64,
            draft_cost,
            verify_cost: draft_cost,
            ..SpeculativeConfig::default()
        };
        engine.enable_speculation(c, proposer).expect("valid");
    }
    let mut ids: HashMap<SeqId, usize> = HashMap::new();
    let mut out: Vec<Output> = vec![Vec::new(); reqs.len()];
    let mut pending = reqs.iter().enumerate().peekable();
    while pending.peek().is_some() || engine.has_unfinished() {
        for (i, r) in pending.by_ref().take(per_step) {
            ids.insert(engine.add_request(r.clone()).expect("admitted"), i);
        }
        for e in engine.step().expect("step") {
            if let EngineEvent::Token {
                seq_id,
                token,
                logprob,
                top_logprobs,
            } = e
            {
                let logprob = logprob.expect("asked for");
                out[ids[&seq_id]].push((token, logprob, top_logprobs));
            }
        }
    }
    (out, engine.spec_stats(), engine)
}

/// A draft model proposer over `model` drafting for itself (its KV cache as `kv_dtype`, or
/// the model's default), and a handle on its pool.
fn self_draft(
    model: Model,
    blocks: usize,
    block_size: usize,
    kv_dtype: Option<KvDtype>,
) -> (Box<dyn Proposer>, BlockAllocator) {
    let vocab = model.config.vocab_size;
    let spec = KvSpec {
        block_size,
        num_blocks: blocks,
        dtype: kv_dtype,
    };
    let runner = Box::new(CpuRunner::new(model, spec).expect("draft pool"));
    let p = DraftModelProposer::new(runner, vocab).expect("draft");
    let pool = p.allocator().clone();
    (Box::new(p), pool)
}

fn assert_same(name: &str, got: &[Output], want: &[Output]) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let gt: Vec<TokenId> = g.iter().map(|x| x.0).collect();
        let wt: Vec<TokenId> = w.iter().map(|x| x.0).collect();
        assert_eq!(
            gt, wt,
            "{name}: request {i} tokens differ from plain decoding"
        );
        for (j, (a, b)) in g.iter().zip(w).enumerate() {
            assert!(
                a.1.to_bits() == b.1.to_bits() && a.2 == b.2,
                "{name}: request {i} token {j} logprobs differ: {:?} vs {:?}",
                a,
                b
            );
        }
    }
}

fn check(load: fn() -> Model, prompts: &[Vec<TokenId>]) {
    let n = prompts.len();
    let reqs: Vec<GenerationRequest> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| request(p, i))
        .collect();
    let m = load();
    let c = config(&m.config, 512, 4096, 16);
    let (plain, _, _) = run(m, c, None, &reqs, n);
    // A pool that holds the longest request (plus drafts) but not all of them at once.
    let tiny = reqs
        .iter()
        .map(|r| (r.prompt.len() + r.limits.max_tokens + 4).div_ceil(4))
        .max()
        .expect("requests")
        + 2;
    // (name, proposer, k, KV blocks, budget, block size, submissions per step)
    type Variant = (&'static str, bool, usize, usize, usize, usize, usize);
    let variants: [Variant; 8] = [
        ("ngram, all at once", false, 4, 512, 4096, 16, n),
        ("ngram, one per step", false, 3, 512, 4096, 16, 1),
        ("ngram, budget 5: drafts cut", false, 6, 512, 5, 4, n),
        ("ngram, tiny pool: preemption", false, 4, tiny, 64, 4, n),
        ("draft, all at once", true, 4, 512, 4096, 16, n),
        ("draft with an f16 KV cache", true, 4, 512, 4096, 16, n),
        ("draft, budget 7", true, 3, 512, 7, 4, 2),
        ("draft, tiny pool: preemption", true, 5, tiny, 64, 4, n),
    ];
    for (name, draft, k, blocks, budget, block_size, per_step) in variants {
        let m = load();
        let c = config(&m.config, blocks, budget, block_size);
        let (proposer, draft_pool): (Box<dyn Proposer>, Option<BlockAllocator>) = if draft {
            let dtype = name.contains("f16").then_some(KvDtype::F16);
            let (p, pool) = self_draft(load(), 64, 8, dtype);
            (p, Some(pool))
        } else {
            (Box::new(NgramProposer::new(1, 3).expect("sizes")), None)
        };
        // One variant lets each request choose its number of drafts (and pause).
        let cost = if name.contains("one per step") {
            0.25
        } else {
            0.0
        };
        let (got, stats, engine) = run(m, c, Some((proposer, k, cost)), &reqs, per_step);
        assert_same(name, &got, &plain);
        eprintln!(
            "{name:<32} drafts {:>4} tokens {:>5} accepted {:>5} ({:.2}), per position {:?}",
            stats.num_drafts,
            stats.num_draft_tokens,
            stats.num_accepted_tokens,
            stats.acceptance_rate(),
            stats.accepted_per_position
        );
        assert!(
            stats.num_accepted_tokens > 0,
            "{name}: no draft was accepted"
        );
        assert!(
            engine.scheduler().allocator().is_idle(),
            "{name}: target blocks leaked"
        );
        if let Some(pool) = draft_pool {
            assert!(pool.is_idle(), "{name}: draft blocks leaked");
        }
        if name.contains("preemption") {
            assert!(
                engine.scheduler().stats().num_preemptions > 0,
                "{name}: no preemption"
            );
        }
    }
}

#[test]
fn greedy_speculation_is_transparent_on_a_fixture_model() {
    let vocab = fixture_model().config.vocab_size;
    check(fixture_model, &prompts(12, vocab));
}

/// Verifying 1 + k tokens of a sequence in one step routes each through its own experts.
#[test]
fn greedy_speculation_is_transparent_with_a_mixture_of_experts() {
    let vocab = mixtral_fixture().config.vocab_size;
    check(mixtral_fixture, &prompts(12, vocab));
}

#[test]
fn greedy_speculation_is_transparent_on_the_default_model() {
    let path = tandem_model::default_model::test_model_path().expect("the default model");
    let tok = load_model(&path).expect("default model").tokenizer;
    let texts = [
        "Copy the list exactly.\nList: apple, banana, cherry, grape, lemon, mango.\nCopy: apple, banana,",
        "def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n",
        "The weather today is",
    ];
    let prompts: Vec<Vec<TokenId>> = texts
        .iter()
        .map(|t| {
            tok.encode(t, true)
                .expect("encode")
                .into_iter()
                .map(TokenId)
                .collect()
        })
        .collect();
    check(default_model, &prompts);
}
