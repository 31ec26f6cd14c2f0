//! A fake model and a driver for scheduler tests.
//!
//! The fake model keeps a fake KV store: each slot remembers the token and position written
//! to it. The next token is a hash of the context *read back through the block table*, so a
//! wrong block table, a block shared by two live sequences, a stale block or a wrong
//! `num_cached` changes the output. The reference ([`alone`]) is an independent, plain loop
//! over the same hash with the stop rules written out again.

#![allow(dead_code)]

use std::collections::{HashMap, HashSet};

use tandem_engine::model::batch::{BlockId, ForwardBatch, TokenId};
use tandem_engine::{
    to_forward_batch, FinishReason, RequestParams, Scheduler, SchedulerConfig, SeqEvent, SeqId,
    SeqOutput, SeqStatus, StepPlan, StepResult,
};

/// Vocabulary of the fake model.
pub const VOCAB: u32 = 32;
/// The fake model's EOS token.
pub const EOS: TokenId = TokenId(0);

/// The fake model's next token after `context`: FNV-1a over the ids, modulo [`VOCAB`].
pub fn next_token(context: &[TokenId]) -> TokenId {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for t in context {
        for b in t.0.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    TokenId((h % u64::from(VOCAB)) as u32)
}

/// What a request produces alone: a plain loop with the stop rules restated.
pub fn alone(
    prompt: &[TokenId],
    params: &RequestParams,
    max_seq_len: usize,
) -> (Vec<TokenId>, FinishReason) {
    let mut tokens = prompt.to_vec();
    let mut out = Vec::new();
    loop {
        let t = next_token(&tokens);
        tokens.push(t);
        out.push(t);
        if (!params.ignore_eos && t == EOS) || params.stop_token_ids.contains(&t) {
            return (out, FinishReason::Stop);
        }
        if out.len() >= params.max_tokens || tokens.len() >= max_seq_len {
            return (out, FinishReason::Length);
        }
    }
}

/// A fake KV store and forward pass.
pub struct FakeModel {
    block_size: usize,
    num_blocks: usize,
    /// `[num_blocks * block_size]` (token, position) written to each slot.
    kv: Vec<Option<(TokenId, usize)>>,
}

impl FakeModel {
    pub fn new(num_blocks: usize, block_size: usize) -> FakeModel {
        FakeModel {
            block_size,
            num_blocks,
            kv: vec![None; num_blocks * block_size],
        }
    }

    fn slot(&self, table: &[BlockId], pos: usize) -> usize {
        table[pos / self.block_size].0 as usize * self.block_size + pos % self.block_size
    }

    /// Writes every new token's "K/V", then returns the next token for each output row,
    /// computed from the context read back from the store.
    pub fn forward(&mut self, batch: &ForwardBatch) -> Vec<TokenId> {
        batch
            .validate(VOCAB as usize, self.block_size, self.num_blocks)
            .expect("the scheduler builds valid batches");
        for s in &batch.seqs {
            for j in 0..s.len {
                let pos = s.num_cached + j;
                let slot = self.slot(&s.block_table, pos);
                self.kv[slot] = Some((batch.tokens[s.start + j], pos));
            }
        }
        let mut out = Vec::new();
        for row in batch.output_rows() {
            let s = batch
                .seqs
                .iter()
                .find(|s| (s.start..s.start + s.len).contains(&row))
                .expect("output rows are inside the batch");
            let last = s.num_cached + row - s.start;
            let context: Vec<TokenId> = (0..=last)
                .map(|pos| match self.kv[self.slot(&s.block_table, pos)] {
                    Some((t, p)) if p == pos => t,
                    other => panic!("position {pos} reads slot holding {other:?}"),
                })
                .collect();
            out.push(next_token(&context));
        }
        out
    }
}

/// One request of a workload.
#[derive(Debug, Clone)]
pub struct Req {
    pub prompt: Vec<TokenId>,
    pub params: RequestParams,
    /// Step before which it is added.
    pub arrival: usize,
    /// Step before which it is aborted, if any.
    pub abort_at: Option<usize>,
    /// Propose drafts (some right, some wrong) every other step.
    pub speculate: bool,
}

/// What a run produced per request (index in the workload).
#[derive(Debug, Default)]
pub struct Outcome {
    pub outputs: Vec<Vec<TokenId>>,
    pub finish: Vec<Option<FinishReason>>,
    pub num_preemptions: u64,
    pub num_steps: u64,
    /// Draft tokens the fake verifier accepted.
    pub num_accepted_drafts: usize,
    /// Tokens found in the prefix cache at admissions.
    pub prefix_cache_hits: u64,
}

/// Checks the plan against the limits and the pool (property (e) and block exclusivity): a
/// block the step writes into belongs to that sequence alone; blocks before its write
/// range may be shared (prefix-cache hits), since nobody writes them.
pub fn check_plan(plan: &StepPlan, c: &SchedulerConfig) {
    assert!(plan.num_batched_tokens() <= c.max_num_batched_tokens);
    assert!(plan.seqs.len() <= c.max_num_seqs);
    let mut ids = HashSet::new();
    let mut holders: HashMap<BlockId, usize> = HashMap::new();
    for s in &plan.seqs {
        assert!(!s.is_empty());
        assert!(s.len() <= c.long_prefill_token_threshold);
        assert!(ids.insert(s.seq_id), "a sequence is scheduled once");
        assert!(s.block_table.len() * c.block_size >= s.num_computed + s.len());
        let mut own = HashSet::new();
        for b in &s.block_table {
            assert!(own.insert(*b), "block {b:?} appears twice in one table");
            *holders.entry(*b).or_default() += 1;
        }
    }
    for s in &plan.seqs {
        let first = s.num_computed / c.block_size;
        let last = (s.num_computed + s.len() - 1) / c.block_size;
        for b in &s.block_table[first..=last] {
            assert_eq!(
                holders[b], 1,
                "block {b:?} is written while another sequence holds it"
            );
        }
    }
}

/// Blocks the live sequences hold must be exactly the allocated ones, each with as many
/// holders as tables list it.
fn check_pool(sched: &Scheduler, live: &[SeqId]) {
    let a = sched.allocator();
    a.check_invariants().expect("allocator invariants");
    let mut holders: HashMap<BlockId, u32> = HashMap::new();
    for s in live.iter().filter_map(|id| sched.sequence(*id)) {
        for b in s.block_table().blocks() {
            *holders.entry(*b).or_default() += 1;
        }
    }
    assert_eq!(
        holders.len(),
        a.num_total() - a.num_free(),
        "leaked or double-counted blocks"
    );
    for (b, n) in holders {
        assert_eq!(a.refcount(b), Some(n), "refcount of {b:?}");
    }
}

/// Runs a workload through the scheduler and the fake model.
pub fn run(config: &SchedulerConfig, reqs: &[Req]) -> Outcome {
    let mut sched = Scheduler::new(config.clone()).expect("valid config");
    let mut model = FakeModel::new(config.num_blocks, config.block_size);
    let mut ids: Vec<Option<SeqId>> = vec![None; reqs.len()];
    let mut index: HashMap<SeqId, usize> = HashMap::new();
    let mut o = Outcome {
        outputs: vec![Vec::new(); reqs.len()],
        finish: vec![None; reqs.len()],
        ..Outcome::default()
    };
    let last_arrival = reqs.iter().map(|r| r.arrival).max().unwrap_or(0);
    let mut step = 0;
    while step <= last_arrival || sched.has_unfinished() {
        assert!(step < 100_000, "the workload does not terminate");
        for (i, r) in reqs.iter().enumerate() {
            if r.arrival == step {
                let id = sched
                    .add_request(r.prompt.clone(), r.params.clone())
                    .expect("admissible");
                ids[i] = Some(id);
                index.insert(id, i);
            }
            if r.abort_at == Some(step) && o.finish[i].is_none() {
                if let Some(id) = ids[i] {
                    sched.abort(id).expect("live");
                    o.finish[i] = Some(FinishReason::Abort);
                }
            }
            if r.speculate && step % 2 == 0 && o.finish[i].is_none() {
                propose(&mut sched, ids[i], step);
            }
        }
        let plan = sched.schedule().expect("no step in flight");
        check_plan(&plan, config);
        if plan.is_empty() {
            assert!(
                !sched.has_unfinished(),
                "live sequences but nothing scheduled"
            );
            step += 1;
            continue;
        }
        let result = execute(&mut model, &plan);
        o.num_accepted_drafts += result
            .outputs
            .iter()
            .map(|x| x.tokens.len() - 1)
            .sum::<usize>();
        for e in sched.update(&result).expect("result answers plan") {
            match e {
                SeqEvent::Token { seq_id, token } => {
                    let i = index[&seq_id];
                    assert!(o.finish[i].is_none(), "token after finish");
                    o.outputs[i].push(token);
                }
                SeqEvent::Finished { seq_id, reason } => {
                    let i = index[&seq_id];
                    assert!(o.finish[i].is_none(), "finished twice");
                    o.finish[i] = Some(reason);
                }
            }
        }
        let live: Vec<SeqId> = index.keys().copied().collect();
        check_pool(&sched, &live);
        step += 1;
    }
    let a = sched.allocator();
    assert!(a.is_idle(), "idle scheduler holds blocks");
    for b in 0..a.num_total() {
        assert_eq!(a.refcount(BlockId(b as u32)), Some(0));
    }
    a.check_invariants()
        .expect("allocator invariants when idle");
    o.prefix_cache_hits = sched.stats().prefix_cache_hits;
    o.num_preemptions = sched.stats().num_preemptions;
    o.num_steps = sched.stats().num_steps;
    o
}

/// Runs the plan on the fake model and verifies drafts greedily: accept while the draft
/// equals the model's token, then append the model's token.
pub fn execute(model: &mut FakeModel, plan: &StepPlan) -> StepResult {
    let batch = to_forward_batch(plan);
    let mut sampled = model.forward(&batch).into_iter();
    let mut outputs = Vec::new();
    for s in plan.seqs.iter().filter(|s| s.num_output_rows > 0) {
        let rows: Vec<TokenId> = sampled.by_ref().take(s.num_output_rows).collect();
        let drafts = &s.tokens[s.len() - s.num_output_rows + 1..];
        let mut tokens = Vec::new();
        for (k, t) in rows.iter().enumerate() {
            tokens.push(*t);
            if k == drafts.len() || drafts[k] != *t {
                break;
            }
        }
        outputs.push(SeqOutput {
            seq_id: s.seq_id,
            tokens,
        });
    }
    StepResult {
        step: plan.step,
        outputs,
    }
}

/// Proposes up to 3 drafts: the true continuation, with one token corrupted on some steps.
fn propose(sched: &mut Scheduler, id: Option<SeqId>, step: usize) {
    let Some(id) = id else { return };
    let Some(seq) = sched.sequence(id) else {
        return;
    };
    if seq.status() != &SeqStatus::Running || seq.num_uncomputed() != 1 || seq.num_draft() > 0 {
        return; // still prefilling, or drafts pending
    }
    let mut ctx = seq.tokens().to_vec();
    let mut drafts = Vec::new();
    for k in 0..3 {
        let mut t = next_token(&ctx);
        if (step / 2 + k) % 4 == 3 {
            t = TokenId((t.0 + 1) % VOCAB);
        }
        ctx.push(t);
        drafts.push(t);
    }
    sched
        .add_drafts(id, &drafts)
        .expect("running without drafts");
}
