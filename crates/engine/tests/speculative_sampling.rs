//! End to end, ARCHITECTURE.md § Invariants, 6: random sampling with speculation has the target
//! distribution. Thousands of seeded requests at temperature 0.8 (top-k 6), on a prompt holding the
//! model's own greedy continuation twice, run through the engine with and without speculation:
//! another fixture model as the draft (mostly rejections and residual draws), the model itself as
//! the draft (acceptances and bonus tokens), and n-gram lookup. The frequencies of each output
//! position's token must agree (two-sample chi-square, p > 1e-3).

mod sampler_reference;

use std::collections::HashMap;

use sampler_reference::chi2_sf;
use tandem_engine::engine::{Engine, EngineEvent, GenerationRequest};
use tandem_engine::sampler::SamplingParams;
use tandem_engine::speculative::{
    DraftModelProposer, NgramProposer, Proposer, SpecStats, SpeculativeConfig,
};
use tandem_engine::{RequestParams, SchedulerConfig, SeqId};
use tandem_model::batch::TokenId;
use tandem_model::loader::load_model;
use tandem_model::transformer::Model;

use tandem_model::cpu_runner::{CpuRunner, KvSpec};
use tandem_model::runner::ModelRunner;

mod cpu_engine;
use cpu_engine::cpu_engine;

const REQUESTS: usize = 4_000;
const LEN: usize = 4;

fn fixture(name: &str) -> Model {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../model/tests/fixtures/hf")
        .join(name);
    Model::new(load_model(&dir).expect("fixture model").host, 1)
}

/// A draft runner over `model` with a pool of 4,096 blocks of 8 slots.
fn draft_runner(model: Model) -> Box<dyn ModelRunner> {
    let spec = KvSpec {
        block_size: 8,
        num_blocks: 4096,
        dtype: None,
    };
    Box::new(CpuRunner::new(model, spec).expect("draft pool"))
}

/// The outputs of `REQUESTS` seeded requests, `LEN` tokens each.
fn outputs(spec: Option<Box<dyn Proposer>>) -> (Vec<Vec<TokenId>>, SpecStats) {
    let model = fixture("llama_untied");
    let mut config = SchedulerConfig::new(4096, 8, model.config.context_len);
    config.max_num_seqs = 128;
    let mut engine = cpu_engine(model, config, 3);
    if let Some(p) = spec {
        let c = SpeculativeConfig {
            num_tokens: 3,
            max_batch_size: 1024,
            draft_cost: 0.0,
            verify_cost: 0.0,
            ..SpeculativeConfig::default()
        };
        engine.enable_speculation(c, p).expect("valid");
    }
    // Something to copy: the model's own greedy continuation, written twice.
    let base: Vec<TokenId> = [5u32, 9, 14].into_iter().map(TokenId).collect();
    let greedy = generate(&mut engine, &base, SamplingParams::greedy(), 12);
    let prompt: Vec<TokenId> = base.iter().chain(&greedy).chain(&greedy).copied().collect();
    let before = engine.spec_stats();
    let mut ids: HashMap<SeqId, usize> = HashMap::new();
    for i in 0..REQUESTS {
        let req = GenerationRequest {
            prompt: prompt.clone(),
            sampling: SamplingParams {
                temperature: 0.8,
                top_k: 6,
                seed: Some(i as u64),
                ..SamplingParams::default()
            },
            limits: RequestParams {
                max_tokens: LEN,
                ignore_eos: true,
                ..RequestParams::default()
            },
            sample_index: 0,
            prompt_logprobs: None,
            prompt_logprobs_start: 1,
        };
        ids.insert(engine.add_request(req).expect("admitted"), i);
    }
    let mut out = vec![Vec::new(); REQUESTS];
    while engine.has_unfinished() {
        for e in engine.step().expect("step") {
            if let EngineEvent::Token { seq_id, token, .. } = e {
                out[ids[&seq_id]].push(token);
            }
        }
    }
    assert!(engine.scheduler().allocator().is_idle());
    let after = engine.spec_stats();
    let stats = SpecStats {
        num_drafts: after.num_drafts - before.num_drafts,
        num_draft_tokens: after.num_draft_tokens - before.num_draft_tokens,
        num_accepted_tokens: after.num_accepted_tokens - before.num_accepted_tokens,
        accepted_per_position: Vec::new(),
    };
    (out, stats)
}

/// One request's `n` tokens, run alone.
fn generate(
    engine: &mut Engine,
    prompt: &[TokenId],
    sampling: SamplingParams,
    n: usize,
) -> Vec<TokenId> {
    let req = GenerationRequest {
        prompt: prompt.to_vec(),
        sampling,
        limits: RequestParams {
            max_tokens: n,
            ignore_eos: true,
            ..RequestParams::default()
        },
        sample_index: 0,
        prompt_logprobs: None,
        prompt_logprobs_start: 1,
    };
    engine.add_request(req).expect("admitted");
    let mut out = Vec::new();
    while engine.has_unfinished() {
        for e in engine.step().expect("step") {
            if let EngineEvent::Token { token, .. } = e {
                out.push(token);
            }
        }
    }
    out
}

/// Two-sample chi-square homogeneity test of equal-size samples; cells with fewer than 10
/// observations in both samples together are pooled. Returns (p-value, TV distance).
fn homogeneity(a: &[TokenId], b: &[TokenId]) -> (f64, f64) {
    let mut counts: HashMap<u32, (f64, f64)> = HashMap::new();
    for t in a {
        counts.entry(t.0).or_default().0 += 1.0;
    }
    for t in b {
        counts.entry(t.0).or_default().1 += 1.0;
    }
    let n = a.len() as f64;
    let tv = 0.5 * counts.values().map(|(x, y)| (x - y).abs() / n).sum::<f64>();
    let (mut cells, mut pool) = (Vec::new(), (0.0, 0.0));
    for &(x, y) in counts.values() {
        if x + y >= 10.0 {
            cells.push((x, y));
        } else {
            pool = (pool.0 + x, pool.1 + y);
        }
    }
    if pool.0 + pool.1 > 0.0 {
        cells.push(pool);
    }
    let stat: f64 = cells.iter().map(|(x, y)| (x - y) * (x - y) / (x + y)).sum();
    (chi2_sf(stat, cells.len().saturating_sub(1).max(1)), tv)
}

fn compare(
    name: &str,
    plain: &[Vec<TokenId>],
    spec: &[Vec<TokenId>],
    stats: &SpecStats,
    rejects: bool,
) {
    eprintln!(
        "{name}: {} drafts, {} draft tokens, {} accepted",
        stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens
    );
    assert!(stats.num_accepted_tokens > 0, "{name}: nothing accepted");
    assert!(
        !rejects || stats.num_accepted_tokens < stats.num_draft_tokens,
        "{name}: nothing rejected"
    );
    for pos in 0..LEN {
        let a: Vec<TokenId> = plain.iter().map(|o| o[pos]).collect();
        let b: Vec<TokenId> = spec.iter().map(|o| o[pos]).collect();
        let (p, tv) = homogeneity(&a, &b);
        eprintln!("{name}: position {pos}: p {p:.4}, TV {tv:.4}");
        assert!(p > 1e-3, "{name}: position {pos} differs: p = {p}");
    }
}

#[test]
fn sampled_tokens_have_the_same_distribution_with_and_without_speculation() {
    let (plain, _) = outputs(None);
    let draft = fixture("llama_tied");
    let vocab = draft.config.vocab_size;
    let p = DraftModelProposer::new(draft_runner(draft), vocab).expect("draft");
    let (spec, stats) = outputs(Some(Box::new(p)));
    compare("other model as draft", &plain, &spec, &stats, true);
    // Drafting for itself (no penalties): q = p, so every draft is accepted and the bonus
    // token path carries the run.
    let own = fixture("llama_untied");
    let p = DraftModelProposer::new(draft_runner(own), vocab).expect("draft");
    let (spec, stats) = outputs(Some(Box::new(p)));
    compare("self as draft", &plain, &spec, &stats, false);
    let (ngram, stats) = outputs(Some(Box::new(NgramProposer::new(1, 3).expect("ok"))));
    compare("n-gram", &plain, &ngram, &stats, true);
}
