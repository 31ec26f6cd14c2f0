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

use std::collections::HashMap;
use std::ops::Range;

use tandem_engine::block_allocator::BlockAllocator;
use tandem_engine::engine::{Engine, EngineEvent, GenerationRequest};
use tandem_engine::sampler::SamplingParams;
use tandem_engine::speculative::{DraftModelProposer, NgramProposer, Proposer, SpeculativeConfig};
use tandem_engine::{FinishReason, RequestParams, SchedulerConfig, SeqId};
use tandem_kernels::ops::log_softmax;
use tandem_model::batch::{BlockId, ForwardBatch, TokenId};
use tandem_model::fake_runner::FakeRunner;
use tandem_model::logits::Logits;
use tandem_model::runner::{KvGeometry, ModelRunner};
use tandem_model::{ModelConfig, Result as ModelResult};

/// Small, so that n-gram and salted-draft guesses are sometimes right.
const VOCAB: usize = 16;
const CONTEXT: usize = 64;
const BLOCK: usize = 4;
const SALT: u64 = 0x7a11;
/// Another model over the same vocabulary (for draft models).
const DRAFT_SALT: u64 = 0xd4af;
const EOS: TokenId = TokenId(0);
/// Top logprobs asked for with every token.
const TOP: usize = 3;
/// A pool that holds the longest request (`CONTEXT / BLOCK` blocks) but not all at once.
const TINY: usize = CONTEXT / BLOCK + 2;

/// One emitted token: (id, logprob, top logprobs), logprobs as bits so `==` is bitwise.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Tok(TokenId, u32, Vec<(TokenId, u32)>);

/// What one request (one sample) produced.
#[derive(Debug, Clone, PartialEq, Default)]
struct Out {
    tokens: Vec<Tok>,
    finish: Option<FinishReason>,
}

/// A request and its number of parallel samples.
#[derive(Debug, Clone)]
struct Sub(GenerationRequest, usize);

/// The engine's pool (blocks), token budget, per-sequence chunk cap and prefix cache.
#[derive(Debug, Clone, Copy)]
struct Shape(usize, usize, usize, bool);

const REFERENCE: Shape = Shape(256, 4096, 4096, false);
const TINY_POOL: Shape = Shape(TINY, 4096, 4096, false);
const CHUNKED: Shape = Shape(256, 7, 7, true);

impl Shape {
    fn engine(self) -> Engine {
        let Shape(blocks, budget, chunk, caching) = self;
        let mut c = SchedulerConfig::new(blocks, BLOCK, CONTEXT);
        c.max_num_batched_tokens = budget;
        c.long_prefill_token_threshold = chunk;
        c.enable_prefix_caching = caching;
        c.eos_token_ids = vec![EOS];
        let runner = FakeRunner::new(VOCAB, CONTEXT, blocks, BLOCK, SALT);
        Engine::new(Box::new(runner), c, 5).expect("the config matches the runner's pool")
    }
}

/// When requests are added: all at once, the next once the engine is idle, or request `i`
/// before step `i * gap`.
#[derive(Debug, Clone, Copy)]
enum Arrival {
    AllAtOnce,
    OneAtATime,
    Every(usize),
}

/// What a run produced, by submission and sample (events checked for order as they come),
/// and the prompt tokens each submission's admission found in the prefix cache.
#[derive(Debug)]
struct Run {
    slot: HashMap<SeqId, (usize, usize)>,
    ids: Vec<Vec<SeqId>>,
    outs: Vec<Vec<Out>>,
    cached: Vec<Option<usize>>,
}

impl Run {
    fn flat(&self) -> Vec<Out> {
        self.outs.iter().flatten().cloned().collect()
    }
    fn out(&mut self, id: SeqId) -> &mut Out {
        let &(i, j) = self.slot.get(&id).expect("events name known ids");
        &mut self.outs[i][j]
    }
    fn record(&mut self, events: Vec<EngineEvent>) {
        for e in events {
            match e {
                EngineEvent::Token {
                    seq_id,
                    token,
                    logprob,
                    top_logprobs: top,
                } => {
                    let out = self.out(seq_id);
                    assert!(out.finish.is_none(), "{seq_id:?}: a token after its end");
                    let top = top.iter().map(|&(t, l)| (t, l.to_bits())).collect();
                    out.tokens.push(Tok(token, logprob.to_bits(), top));
                }
                EngineEvent::Finished { seq_id, reason } => {
                    let failed = matches!(reason, FinishReason::Error(_));
                    assert!(!failed, "{seq_id:?} failed: {reason:?}");
                    let out = self.out(seq_id);
                    assert!(out.finish.is_none(), "{seq_id:?} finished twice");
                    out.finish = Some(reason);
                }
                EngineEvent::Admitted {
                    seq_id,
                    cached_tokens,
                } => {
                    let &(i, _) = self.slot.get(&seq_id).expect("a known id");
                    let again = self.cached[i].replace(cached_tokens);
                    assert!(again.is_none(), "{seq_id:?}: its group admitted twice");
                }
                other => panic!("unexpected event {other:?}"),
            }
        }
    }
}

/// Runs `subs` to completion, aborting submission `i` before step `s` for each `(i, s)` of
/// `aborts`; checks the allocator after every step and the idle engine at the end.
fn run(engine: &mut Engine, subs: &[Sub], arrival: Arrival, aborts: &[(usize, usize)]) -> Run {
    let mut rec = Run {
        slot: HashMap::new(),
        ids: vec![Vec::new(); subs.len()],
        outs: subs.iter().map(|s| vec![Out::default(); s.1]).collect(),
        cached: vec![None; subs.len()],
    };
    let (mut next, mut step) = (0, 0);
    while next < subs.len() || engine.has_unfinished() {
        assert!(step < 20_000, "the run does not terminate");
        while next < subs.len() && due(arrival, next, step, engine.has_unfinished()) {
            let Sub(req, n) = subs[next].clone();
            let ids = engine.add_request_n(req, n).expect("an admissible request");
            rec.slot
                .extend(ids.iter().zip(0..).map(|(&id, j)| (id, (next, j))));
            rec.ids[next] = ids;
            next += 1;
        }
        // Abort the arrived, live ones among those due.
        let due_now = aborts.iter().filter(|a| a.1 == step);
        let ids: Vec<SeqId> = due_now
            .filter_map(|a| rec.ids[a.0].first().copied())
            .collect();
        for id in ids {
            let out = rec.out(id);
            if out.finish.is_none() {
                out.finish = Some(FinishReason::Abort);
                engine.abort(id).expect("a live request can be aborted");
            }
        }
        rec.record(engine.step().expect("a step on the fake never fails"));
        let invariants = engine.scheduler().allocator().check_invariants();
        invariants.expect("allocator invariants hold after every step");
        step += 1;
    }
    // Idle: no block held, none cached with the prefix cache off.
    let s = engine.scheduler();
    assert_eq!(s.num_waiting() + s.num_running(), 0, "idle scheduler");
    assert_pool_idle("target pool", s.allocator());
    let registered = s.allocator().num_registered();
    let on = s.config().enable_prefix_caching;
    assert!(on || registered == 0, "blocks cached with the cache off");
    rec
}

fn due(arrival: Arrival, index: usize, step: usize, busy: bool) -> bool {
    match arrival {
        Arrival::AllAtOnce => true,
        Arrival::OneAtATime => !busy,
        Arrival::Every(gap) => index * gap <= step,
    }
}

/// Every refcount 0 and free (cached-free included) == total.
fn assert_pool_idle(what: &str, a: &BlockAllocator) {
    a.check_invariants()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(a.num_free(), a.num_total(), "{what}: blocks leaked");
    for b in 0..a.num_total() {
        let rc = a.refcount(BlockId(b as u32));
        assert_eq!(rc, Some(0), "{what}: block {b} still held when idle");
    }
}

/// Tokens `len` long from a small recurrence keyed on `seed`.
fn ids(seed: usize, len: usize) -> Vec<TokenId> {
    let id = |j: usize| TokenId(((seed * 7 + j * 5 + j * j * 3) % VOCAB) as u32);
    (0..len).map(id).collect()
}

/// The prompt set: shared prefixes (full and partial blocks), a prompt of exactly the shared
/// full blocks, 1-token and sub-block prompts, two identical one-block prompts, a repeated
/// phrase (n-gram material), a long one and one that reaches the context limit.
fn prompts() -> Vec<Vec<TokenId>> {
    let shared = ids(1, 10);
    let with = |tail: Vec<TokenId>| [shared.clone(), tail].concat();
    vec![
        with(ids(3, 3)),
        with(ids(4, 6)),
        shared[..2 * BLOCK].to_vec(),
        ids(5, 1),
        ids(6, 3),
        ids(7, BLOCK),
        ids(7, BLOCK),
        ids(2, 3).repeat(4),
        with(ids(8, 21)),
        ids(9, CONTEXT - 12),
    ]
}

/// Request `i` of the set: every third one seeded sampled, the rest greedy; mixed stop rules;
/// the last one fills the context.
fn requests() -> Vec<GenerationRequest> {
    let prompts = prompts();
    let last = prompts.len() - 1;
    let request = |(i, prompt): (usize, Vec<TokenId>)| {
        let room = CONTEXT - prompt.len();
        let max_tokens = if i == last { room } else { 6 + i * 5 % 9 };
        let limits = RequestParams {
            max_tokens,
            ignore_eos: i == last || i % 4 != 0,
            stop_token_ids: if i == 1 { vec![TokenId(5)] } else { Vec::new() },
            ..RequestParams::default()
        };
        GenerationRequest {
            prompt,
            sampling: sampling((i % 3 == 2).then_some(100 + i as u64)),
            limits,
            sample_index: 0,
            prompt_logprobs: None,
            prompt_logprobs_start: 1,
        }
    };
    prompts.into_iter().enumerate().map(request).collect()
}

/// Greedy (`None`) or seeded sampling at temperature 0.8, top-p 0.9; top `TOP` logprobs.
fn sampling(seed: Option<u64>) -> SamplingParams {
    let (temperature, top_p) = seed.map_or((0.0, 1.0), |_| (0.8, 0.9));
    SamplingParams {
        temperature,
        top_p,
        seed,
        logprobs: true,
        top_logprobs: TOP,
        ..SamplingParams::default()
    }
}

fn singles(reqs: &[GenerationRequest]) -> Vec<Sub> {
    reqs.iter().map(|r| Sub(r.clone(), 1)).collect()
}

/// The reference: sample `i` of each submission as a request with `sample_index + i`, alone in
/// a fresh roomy engine without the prefix cache; each checked against the forward pass.
fn reference(subs: &[Sub]) -> Vec<Out> {
    let mut outs = Vec::new();
    for Sub(req, n) in subs {
        for i in 0..*n as u64 {
            let mut alone = req.clone();
            alone.sample_index += i;
            let mut engine = REFERENCE.engine();
            let one = run(&mut engine, &[Sub(alone, 1)], Arrival::AllAtOnce, &[]);
            let out = one.flat().remove(0);
            check_forward(req, &out);
            outs.push(out);
        }
    }
    outs
}

/// Decode ≡ forward: every token's logprob and top logprobs are the log-softmax of the fake's
/// logits after exactly its context (bitwise), greedy picks the argmax, no stop token before
/// the last, and the finish reason follows the stop rules.
fn check_forward(req: &GenerationRequest, out: &Out) {
    let model = FakeRunner::new(VOCAB, CONTEXT, 1, BLOCK, SALT);
    let limits = &req.limits;
    let is_stop = |t| limits.stop_token_ids.contains(&t) || (!limits.ignore_eos && t == EOS);
    let mut history = req.prompt.clone();
    for (i, Tok(token, logprob, top)) in out.tokens.iter().enumerate() {
        let logits = model.logits_after(&history);
        let mut lp = vec![0.0; VOCAB];
        log_softmax(&logits, &mut lp).expect("the fake's logits are finite");
        let want = lp[token.0 as usize].to_bits();
        assert_eq!(*logprob, want, "token {i}: logprob is not the forward's");
        let want_top = top_logprobs(&logits, &lp);
        assert_eq!(top, &want_top, "token {i}: top logprobs");
        let argmax = !req.sampling.is_greedy() || *token == want_top[0].0;
        assert!(argmax, "token {i}: a greedy token is not the argmax");
        let last = i + 1 == out.tokens.len();
        assert!(last || !is_stop(*token), "token {i} should have stopped");
        history.push(*token);
    }
    // A request that neither stopped nor ran out can only have been aborted.
    let stopped = out.tokens.last().is_some_and(|t| is_stop(t.0));
    let full = out.tokens.len() == limits.max_tokens || history.len() == CONTEXT;
    let want = match (stopped, full) {
        (true, _) => FinishReason::Stop,
        (false, true) => FinishReason::Length,
        (false, false) => FinishReason::Abort,
    };
    assert_eq!(out.finish, Some(want), "finish reason");
}

/// The `TOP` most likely tokens (ties to the lower id) with their logprobs' bits.
fn top_logprobs(logits: &[f32], lp: &[f32]) -> Vec<(TokenId, u32)> {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    let top = order.into_iter().take(TOP);
    top.map(|i| (TokenId(i as u32), lp[i].to_bits())).collect()
}

/// Every output of `got` equals the reference's, and is the forward pass's.
fn assert_same(path: &str, subs: &[Sub], got: &[Out], want: &[Out]) {
    let reqs = subs.iter().flat_map(|s| std::iter::repeat_n(&s.0, s.1));
    assert_eq!(got.len(), want.len(), "{path}: number of outputs");
    for (i, ((g, w), req)) in got.iter().zip(want).zip(reqs).enumerate() {
        let ids = |o: &Out| o.tokens.iter().map(|t| t.0).collect::<Vec<_>>();
        assert_eq!(ids(g), ids(w), "{path}: output {i}: tokens differ");
        assert_eq!(g, w, "{path}: output {i}: logprobs or finish differ");
        check_forward(req, g);
    }
}

/// Runs `subs` on a fresh engine of `shape`, compares with `want`; returns the engine.
fn check_path(shape: Shape, subs: &[Sub], arrival: Arrival, want: &[Out]) -> Engine {
    let mut engine = shape.engine();
    let got = run(&mut engine, subs, arrival, &[]).flat();
    assert_same(&format!("{shape:?}, {arrival:?}"), subs, &got, want);
    engine
}

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
    let (mut rng, mut aborted_mid_run) = (0x5eed_u64, 0);
    // Three (request, step) pairs per round from a 64-bit LCG.
    let mut lcg = |below: usize| {
        rng = rng.wrapping_mul(0x5851_f42d_4c95_7f2d).wrapping_add(1);
        ((rng >> 33) % below as u64) as usize
    };
    for round in 0..12 {
        let aborts: Vec<(usize, usize)> = (0..3).map(|_| (lcg(subs.len()), lcg(16))).collect();
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
