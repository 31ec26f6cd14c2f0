//! Engine-level equivalence on the weightless [`FakeRunner`]: one prompt set (short, long,
//! block-aligned, shared prefixes, one reaching the context limit; greedy and seeded sampled)
//! runs through many paths — batching and arrival order, chunked prefill, prefix-cache hits,
//! reset and eviction, preemption, n-gram and draft-model speculation, `n > 1` samples, aborts
//! — and every path must emit exactly what the reference emits (each request alone, whole
//! prefill, no prefix cache, no speculation): token ids, logprobs and top logprobs bitwise, and
//! the finish reasons. Every output is also checked against the model (decode ≡ forward): each
//! logprob is the kernels' `log_softmax` (the sampler's arithmetic, so bitwise) of
//! `logits_after(prompt + output so far)`, greedy tokens are argmaxes, finishes follow the stop
//! rules. Allocator invariants hold after every step; after every path the pools are idle.
//!
//! Why a fake suffices: what these paths can get wrong is *which* KV slots a token reads and
//! writes (block tables, copy-on-write, prefix hits, frees, preemption, rolled-back drafts) and
//! how tokens are sampled and reported. The fake's logits hash the whole history read back
//! through the block tables from its pool, so any such slip changes the logits or fails the
//! forward pass, as it would corrupt a real model's attention. Numerics inside a real forward
//! pass (kernels, batch-dependent reductions) are the real-model tests' job.

mod fake_paths;

use std::ops::Range;

use fake_paths::*;
use tandem_engine::engine::{Engine, GenerationRequest};
use tandem_engine::speculative::{DraftModelProposer, NgramProposer, Proposer, SpeculativeConfig};
use tandem_engine::FinishReason;
use tandem_model::batch::{BlockId, ForwardBatch};
use tandem_model::fake_runner::FakeRunner;
use tandem_model::logits::Logits;
use tandem_model::runner::{KvGeometry, ModelRunner};
use tandem_model::{ModelConfig, Result as ModelResult};

#[test]
fn reference_decodes_exactly_the_forward_pass() {
    let reqs = requests();
    let want = reference(&singles(&reqs));
    let len = reqs[reqs.len() - 1].prompt.len() + want[want.len() - 1].tokens.len();
    assert_eq!(len, CONTEXT, "the near-limit request fills the context");
    let ended = |r: FinishReason| want.iter().any(|o| o.finish.as_ref() == Some(&r));
    assert!(ended(FinishReason::Stop), "no request stopped");
    assert!(ended(FinishReason::Length), "no request ran out");
}

#[test]
fn batching_arrival_order_and_chunking_do_not_change_outputs() {
    let subs = singles(&requests());
    let want = reference(&subs);
    use Arrival::{AllAtOnce, Every, OneAtATime};
    for arrival in [AllAtOnce, OneAtATime, Every(1), Every(3)] {
        check_path(REFERENCE, &subs, arrival, &want);
        check_path(Shape(256, 4096, 4096, true), &subs, arrival, &want);
    }
    // Chunked prefill, (token budget, per-sequence cap): budget 1 is one token per step.
    let sizes = [(1, 1), (2, 2), (3, 3), (5, 5), (7, 3), (13, 13), (4096, 6)];
    for (budget, chunk) in sizes {
        for caching in [false, true] {
            let shape = Shape(256, budget, chunk, caching);
            check_path(shape, &subs, Arrival::AllAtOnce, &want);
            check_path(shape, &subs, Arrival::Every(2), &want);
        }
    }
}

#[test]
fn prefix_cache_hits_reset_and_eviction_do_not_change_outputs() {
    let reqs = requests();
    let subs = singles(&reqs);
    let want = reference(&subs);
    let mut engine = Shape(256, 4096, 4096, true).engine();
    let cold = run(&mut engine, &subs, Arrival::OneAtATime, &[]);
    assert_same("cold cache", &subs, &cold.flat(), &want);
    let hits: usize = cold.cached.iter().map(|c| c.expect("admitted")).sum();
    assert!(hits > 0, "shared prefixes must hit: {:?}", cold.cached);
    // Warm: every prompt's leading full blocks (all but the last token) are cached.
    let warm = run(&mut engine, &subs, Arrival::AllAtOnce, &[]);
    assert_same("warm cache", &subs, &warm.flat(), &want);
    for (r, c) in reqs.iter().zip(&warm.cached) {
        let (len, full) = (r.prompt.len(), (r.prompt.len() - 1) / BLOCK * BLOCK);
        assert_eq!(*c, Some(full), "warm hit of a {len}-token prompt");
    }
    assert!(engine.reset_prefix_cache() > 0, "the reset forgets blocks");
    let reset = run(&mut engine, &subs, Arrival::AllAtOnce, &[]);
    assert_same("after reset", &subs, &reset.flat(), &want);
    assert_eq!(reset.cached[0], Some(0), "nothing survives a reset");
    // A small pool: cached-free blocks are evicted for new contents, and hit in between.
    let mut engine = Shape(TINY, 4096, 5, true).engine();
    let mut hits = 0;
    for arrival in [Arrival::OneAtATime, Arrival::Every(1), Arrival::OneAtATime] {
        let r = run(&mut engine, &subs, arrival, &[]);
        assert_same(&format!("small pool, {arrival:?}"), &subs, &r.flat(), &want);
        hits += r.cached.iter().flatten().sum::<usize>();
    }
    assert!(hits > 0, "no hit in the small pool");
    let evictions = engine.scheduler().allocator().num_evictions();
    assert!(evictions > 0, "no eviction in the small pool");
}

#[test]
fn preemption_is_transparent() {
    let subs = singles(&requests());
    let want = reference(&subs);
    for (budget, chunk) in [(4096, 4096), (9, 9), (64, 5)] {
        for caching in [false, true] {
            let shape = Shape(TINY, budget, chunk, caching);
            let engine = check_path(shape, &subs, Arrival::AllAtOnce, &want);
            let stats = engine.scheduler().stats();
            assert!(stats.num_preemptions > 0, "{shape:?}: no preemption");
        }
    }
}

/// A draft model that is the target except at positions `4 mod 5`, where it is the
/// differently salted fake: runs of accepted drafts ended by a rejection.
#[derive(Debug)]
struct MostlyAgreeing(FakeRunner, FakeRunner);

impl ModelRunner for MostlyAgreeing {
    fn config(&self) -> &ModelConfig {
        self.0.config()
    }
    fn kv_geometry(&self) -> KvGeometry {
        self.0.kv_geometry()
    }
    fn forward(&mut self, batch: &ForwardBatch) -> ModelResult<Logits> {
        let (same, other) = (self.0.forward(batch)?, self.1.forward(batch)?);
        let positions = batch.positions();
        let mut data = Vec::with_capacity(same.as_slice().len());
        for (i, &row) in same.rows().iter().enumerate() {
            let agree = positions[row] % 5 != 4;
            data.extend_from_slice(if agree { same.row(i) } else { other.row(i) });
        }
        Ok(Logits::new(same.rows().to_vec(), VOCAB, data))
    }
    fn copy_blocks(&mut self, copies: &[(BlockId, BlockId)]) -> ModelResult<()> {
        self.0.copy_blocks(copies)?;
        self.1.copy_blocks(copies)
    }
    fn cached_logits(&mut self, table: &[BlockId], pos: Range<usize>) -> ModelResult<Logits> {
        self.0.cached_logits(table, pos)
    }
    fn model_identity(&self) -> u64 {
        self.1.model_identity()
    }
    fn describe(&self) -> String {
        "a fake draft agreeing with the target at 4 of 5 positions".into()
    }
}

/// The draft model of each kind of proposer (`None` for the n-gram one), its pool small
/// enough to run dry: a fake with another salt (agreeing by chance, 1 in `VOCAB`) or
/// [`MostlyAgreeing`].
fn draft_model(kind: &str) -> Option<Box<dyn ModelRunner>> {
    let fake = |salt| FakeRunner::new(VOCAB, CONTEXT, 24, BLOCK, salt);
    match kind {
        "ngram" => None,
        "salted" => Some(Box::new(fake(DRAFT_SALT))),
        _ => Some(Box::new(MostlyAgreeing(fake(SALT), fake(DRAFT_SALT)))),
    }
}

/// Runs `subs` with `draft` proposing `k` tokens; returns the outputs and the engine, after
/// checking the draft pool is idle too.
fn speculate(shape: Shape, subs: &[Sub], draft: &str, k: usize) -> (Vec<Out>, Engine) {
    let ngram = || Box::new(NgramProposer::new(1, 3).expect("n-gram sizes"));
    let (proposer, draft_pool): (Box<dyn Proposer>, _) = match draft_model(draft) {
        None => (ngram(), None),
        Some(model) => {
            let p = DraftModelProposer::new(model, VOCAB).expect("same vocabulary");
            let pool = p.allocator().clone();
            (Box::new(p), Some(pool))
        }
    };
    // Always `k` drafts (no cost model), whatever the batch size.
    let mut config = SpeculativeConfig::default();
    (config.num_tokens, config.max_batch_size) = (k, 64);
    (config.draft_cost, config.verify_cost) = (0.0, 0.0);
    let mut engine = shape.engine();
    let enabled = engine.enable_speculation(config, proposer);
    enabled.expect("a valid speculative config");
    let outs = run(&mut engine, subs, Arrival::AllAtOnce, &[]).flat();
    if let Some(pool) = draft_pool {
        assert_pool_idle("draft pool", &pool);
    }
    (outs, engine)
}

#[test]
fn speculation_is_transparent_for_greedy_requests() {
    let greedy = requests().into_iter().filter(|r| r.sampling.is_greedy());
    let subs = singles(&greedy.collect::<Vec<_>>());
    let want = reference(&subs);
    for draft in ["ngram", "salted", "agreeing"] {
        for (k, shape) in [(4, REFERENCE), (3, CHUNKED), (7, TINY_POOL)] {
            let (got, engine) = speculate(shape, &subs, draft, k);
            let (stats, preemptions) = (engine.spec_stats(), engine.scheduler().stats());
            let name = format!("{draft}, k {k}, {shape:?}");
            assert_same(&name, &subs, &got, &want);
            let (drafted, accepted) = (stats.num_draft_tokens, stats.num_accepted_tokens);
            let both = 0 < accepted && accepted < drafted;
            assert!(both, "{name}: accepted {accepted} of {drafted} drafts");
            let third = stats.accepted_per_position.get(2).copied().unwrap_or(0);
            let runs = draft != "agreeing" || third > 0;
            assert!(runs, "{name}: never 3 drafts accepted in a row ({stats:?})");
            let tiny_preempts = shape.0 != TINY || preemptions.num_preemptions > 0;
            assert!(tiny_preempts, "{name}: no preemption");
        }
    }
}

#[test]
fn seeded_sampling_is_batch_invariant() {
    let mut reqs = requests();
    for (i, r) in reqs.iter_mut().enumerate() {
        r.sampling = sampling(Some(7 + i as u64));
    }
    let subs = singles(&reqs);
    let want = reference(&subs);
    check_path(REFERENCE, &subs, Arrival::AllAtOnce, &want);
    check_path(Shape(256, 5, 5, true), &subs, Arrival::Every(2), &want);
    check_path(Shape(TINY, 9, 9, false), &subs, Arrival::AllAtOnce, &want);
    // Sampling is really random: some token is not the most likely one.
    let mut tokens = want.iter().flat_map(|o| &o.tokens);
    assert!(tokens.any(|t| t.0 != t.2[0].0), "temperature 0.8 is argmax");
}

#[test]
fn parallel_samples_equal_separate_requests() {
    // Sampled requests get 3 samples (one numbered from 2), some greedy ones 2.
    let sub = |(i, mut req): (usize, GenerationRequest)| {
        req.sample_index = if i == 5 { 2 } else { 0 };
        Sub(req, [2, 1, 3][i % 3])
    };
    let subs: Vec<Sub> = requests().into_iter().enumerate().map(sub).collect();
    let want = reference(&subs);
    let first = subs[0].1 + subs[1].1; // the samples of request 2 (sampled)
    let distinct = want[first..first + 3].windows(2).any(|w| w[0] != w[1]);
    assert!(distinct, "the samples of a sampled request are all alike");
    for shape in [REFERENCE, Shape(256, 6, 6, true), TINY_POOL] {
        check_path(shape, &subs, Arrival::AllAtOnce, &want);
        check_path(shape, &subs, Arrival::Every(2), &want);
    }
}

#[test]
fn aborts_leave_other_requests_unchanged() {
    let subs = singles(&requests());
    let want = reference(&subs);
    let shapes = [REFERENCE, CHUNKED, Shape(TINY, 64, 5, true)];
    let mut aborted_mid_run = 0;
    // Three (request, step) pairs per round from a 64-bit LCG.
    let mut random = lcg(0x5eed);
    for round in 0..12 {
        let aborts: Vec<(usize, usize)> =
            (0..3).map(|_| (random(subs.len()), random(16))).collect();
        let mut engine = shapes[round % shapes.len()].engine();
        let got = run(&mut engine, &subs, Arrival::Every(1), &aborts).flat();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let path = format!("round {round}, aborts {aborts:?}, request {i}");
            if g.finish == Some(FinishReason::Abort) {
                assert!(w.tokens.starts_with(&g.tokens), "{path}: aborted, diverged");
                check_forward(&subs[i].0, g);
                aborted_mid_run += usize::from(!g.tokens.is_empty());
            } else {
                assert_eq!(g, w, "{path}: changed by the others' aborts");
            }
        }
    }
    assert!(aborted_mid_run > 0, "no request was aborted mid-generation");
}
