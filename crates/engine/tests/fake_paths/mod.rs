//! The harness of the engine-level equivalence tests on the weightless
//! [`FakeRunner`] (`engine_on_fake_runner.rs`, `overlapped_steps.rs`): one prompt set run
//! through an engine of a given shape, every output compared with the reference (each
//! request alone in a roomy engine) and with the fake's forward pass.

#![allow(dead_code)]

use std::collections::HashMap;

use tandem_engine::block_allocator::BlockAllocator;
use tandem_engine::engine::{Engine, EngineEvent, GenerationRequest};
use tandem_engine::sampler::SamplingParams;
use tandem_engine::{FinishReason, RequestParams, SchedulerConfig, SeqId};
use tandem_kernels::ops::log_softmax;
use tandem_model::batch::{BlockId, TokenId};
use tandem_model::fake_runner::FakeRunner;
use tandem_model::queued_runner::QueuedRunner;

/// Small, so that n-gram and salted-draft guesses are sometimes right.
pub const VOCAB: usize = 16;
pub const CONTEXT: usize = 64;
pub const BLOCK: usize = 4;
pub const SALT: u64 = 0x7a11;
/// Another model over the same vocabulary (for draft models).
pub const DRAFT_SALT: u64 = 0xd4af;
pub const EOS: TokenId = TokenId(0);
/// Top logprobs asked for with every token.
pub const TOP: usize = 3;
/// A pool that holds the longest request (`CONTEXT / BLOCK` blocks) but not all at once.
pub const TINY: usize = CONTEXT / BLOCK + 2;

/// One emitted token: (id, logprob, top logprobs), logprobs as bits so `==` is bitwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tok(pub TokenId, pub Option<u32>, pub Vec<(TokenId, u32)>);

impl Tok {
    /// An emitted token, its logprobs as bits.
    pub fn of(token: TokenId, logprob: Option<f32>, top: &[(TokenId, f32)]) -> Tok {
        let top = top.iter().map(|&(t, l)| (t, l.to_bits())).collect();
        Tok(token, logprob.map(f32::to_bits), top)
    }
}

/// What one request (one sample) produced.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Out {
    pub tokens: Vec<Tok>,
    pub finish: Option<FinishReason>,
}

/// A request and its number of parallel samples.
#[derive(Debug, Clone)]
pub struct Sub(pub GenerationRequest, pub usize);

/// The engine's pool (blocks), token budget, per-sequence chunk cap and prefix cache.
#[derive(Debug, Clone, Copy)]
pub struct Shape(pub usize, pub usize, pub usize, pub bool);

pub const REFERENCE: Shape = Shape(256, 4096, 4096, false);
pub const TINY_POOL: Shape = Shape(TINY, 4096, 4096, false);
pub const CHUNKED: Shape = Shape(256, 7, 7, true);

impl Shape {
    pub fn engine(self) -> Engine {
        let runner = FakeRunner::new(VOCAB, CONTEXT, self.0, BLOCK, SALT);
        Engine::new(Box::new(runner), self.config(), 5).expect("the config matches the pool")
    }

    /// The scheduler's configuration of this shape.
    pub fn config(self) -> SchedulerConfig {
        let Shape(blocks, budget, chunk, caching) = self;
        let mut c = SchedulerConfig::new(blocks, BLOCK, CONTEXT);
        c.max_num_batched_tokens = budget;
        c.long_prefill_token_threshold = chunk;
        c.enable_prefix_caching = caching;
        c.eos_token_ids = vec![EOS];
        c
    }

    /// [`Shape::engine`] over a runner that overlaps steps (each run at launch): the
    /// engine plans each step ahead of the previous one's result.
    pub fn overlapped_engine(self) -> Engine {
        let runner = FakeRunner::new(VOCAB, CONTEXT, self.0, BLOCK, SALT);
        let queued = QueuedRunner::new(Box::new(runner));
        Engine::new(Box::new(queued), self.config(), 5).expect("the config matches the pool")
    }
}

/// When requests are added: all at once, the next once the engine is idle, or request `i`
/// before step `i * gap`.
#[derive(Debug, Clone, Copy)]
pub enum Arrival {
    AllAtOnce,
    OneAtATime,
    Every(usize),
}

/// What a run produced, by submission and sample (events checked for order as they come),
/// and the prompt tokens each submission's admission found in the prefix cache.
#[derive(Debug)]
pub struct Run {
    pub slot: HashMap<SeqId, (usize, usize)>,
    pub ids: Vec<Vec<SeqId>>,
    pub outs: Vec<Vec<Out>>,
    pub cached: Vec<Option<usize>>,
}

impl Run {
    pub fn flat(&self) -> Vec<Out> {
        self.outs.iter().flatten().cloned().collect()
    }
    pub fn out(&mut self, id: SeqId) -> &mut Out {
        let &(i, j) = self.slot.get(&id).expect("events name known ids");
        &mut self.outs[i][j]
    }
    pub fn record(&mut self, events: Vec<EngineEvent>) {
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
                    out.tokens.push(Tok::of(token, logprob, &top));
                }
                EngineEvent::Finished { seq_id, reason } => {
                    let failed = reason.is_failure();
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
pub fn run(engine: &mut Engine, subs: &[Sub], arrival: Arrival, aborts: &[(usize, usize)]) -> Run {
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

pub fn due(arrival: Arrival, index: usize, step: usize, busy: bool) -> bool {
    match arrival {
        Arrival::AllAtOnce => true,
        Arrival::OneAtATime => !busy,
        Arrival::Every(gap) => index * gap <= step,
    }
}

/// Every refcount 0 and free (cached-free included) == total.
pub fn assert_pool_idle(what: &str, a: &BlockAllocator) {
    a.check_invariants()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(a.num_free(), a.num_total(), "{what}: blocks leaked");
    for b in 0..a.num_total() {
        let rc = a.refcount(BlockId(b as u32));
        assert_eq!(rc, Some(0), "{what}: block {b} still held when idle");
    }
}

/// Tokens `len` long from a small recurrence keyed on `seed`.
pub fn ids(seed: usize, len: usize) -> Vec<TokenId> {
    let id = |j: usize| TokenId(((seed * 7 + j * 5 + j * j * 3) % VOCAB) as u32);
    (0..len).map(id).collect()
}

/// The prompt set: shared prefixes (full and partial blocks), a prompt of exactly the shared
/// full blocks, 1-token and sub-block prompts, two identical one-block prompts, a repeated
/// phrase (n-gram material), a long one and one that reaches the context limit.
pub fn prompts() -> Vec<Vec<TokenId>> {
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
pub fn requests() -> Vec<GenerationRequest> {
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
pub fn sampling(seed: Option<u64>) -> SamplingParams {
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

pub fn singles(reqs: &[GenerationRequest]) -> Vec<Sub> {
    reqs.iter().map(|r| Sub(r.clone(), 1)).collect()
}

/// The reference: sample `i` of each submission as a request with `sample_index + i`, alone in
/// a fresh roomy engine without the prefix cache; each checked against the forward pass.
pub fn reference(subs: &[Sub]) -> Vec<Out> {
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
pub fn check_forward(req: &GenerationRequest, out: &Out) {
    let model = FakeRunner::new(VOCAB, CONTEXT, 1, BLOCK, SALT);
    let limits = &req.limits;
    let is_stop = |t| limits.stop_token_ids.contains(&t) || (!limits.ignore_eos && t == EOS);
    let mut history = req.prompt.clone();
    for (i, Tok(token, logprob, top)) in out.tokens.iter().enumerate() {
        let logits = model.logits_after(&history);
        let mut lp = vec![0.0; VOCAB];
        log_softmax(&logits, &mut lp).expect("the fake's logits are finite");
        let want = lp[token.0 as usize].to_bits();
        assert_eq!(
            *logprob,
            Some(want),
            "token {i}: logprob is not the forward's"
        );
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
pub fn top_logprobs(logits: &[f32], lp: &[f32]) -> Vec<(TokenId, u32)> {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    let top = order.into_iter().take(TOP);
    top.map(|i| (TokenId(i as u32), lp[i].to_bits())).collect()
}

/// Every output of `got` equals the reference's, and is the forward pass's.
pub fn assert_same(path: &str, subs: &[Sub], got: &[Out], want: &[Out]) {
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
pub fn check_path(shape: Shape, subs: &[Sub], arrival: Arrival, want: &[Out]) -> Engine {
    let mut engine = shape.engine();
    let got = run(&mut engine, subs, arrival, &[]).flat();
    assert_same(&format!("{shape:?}, {arrival:?}"), subs, &got, want);
    engine
}

/// A 64-bit LCG from `seed`: `next(below)` is in `0..below`.
pub fn lcg(seed: u64) -> impl FnMut(usize) -> usize {
    let mut rng = seed;
    move |below: usize| {
        rng = rng.wrapping_mul(0x5851_f42d_4c95_7f2d).wrapping_add(1);
        ((rng >> 33) % below as u64) as usize
    }
}

/// The outputs of `ids` from their events, in order (other events are ignored).
pub fn outputs(ids: &[SeqId], events: Vec<EngineEvent>) -> Vec<Out> {
    let mut outs = vec![Out::default(); ids.len()];
    let index = |id: SeqId| ids.iter().position(|&i| i == id).expect("a known id");
    for e in events {
        match e {
            EngineEvent::Token {
                seq_id,
                token,
                logprob,
                top_logprobs,
            } => outs[index(seq_id)]
                .tokens
                .push(Tok::of(token, logprob, &top_logprobs)),
            EngineEvent::Finished { seq_id, reason } => outs[index(seq_id)].finish = Some(reason),
            _ => {}
        }
    }
    outs
}
