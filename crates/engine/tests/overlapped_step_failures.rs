//! Overlapped steps when the runner fails part of a step planned ahead: what the engine
//! believes is launched must stay what the runner holds, so that requests outside the failed
//! plans are unaffected (`engine/overlap.rs`).

mod fake_paths;

use std::ops::Range;

use fake_paths::*;
use tandem_engine::engine::{Engine, GenerationRequest};
use tandem_engine::FinishReason;
use tandem_model::batch::{BlockId, CarriedToken, ForwardBatch, TokenId};
use tandem_model::config::ModelConfig;
use tandem_model::error::{ModelError, Result as ModelResult};
use tandem_model::fake_runner::FakeRunner;
use tandem_model::logits::Logits;
use tandem_model::queued_runner::QueuedRunner;
use tandem_model::row_sampling::RowDraw;
use tandem_model::runner::{KvGeometry, ModelRunner};
use tandem_model::token_pick::TokenPick;

/// A `QueuedRunner` over the fake whose `fail_at`-th non-empty block copy fails (as a
/// device copy can) and whose `bad_collect`-th collect returns one pick too many (a faulty
/// runner), everything else delegated.
#[derive(Debug)]
struct Faulty {
    inner: QueuedRunner,
    copies: usize,
    fail_at: usize,
    collects: usize,
    bad_collect: usize,
    launches: usize,
    fail_launch: usize,
}

impl Faulty {
    fn engine(fail_at: usize, bad_collect: usize) -> Engine {
        Faulty::engine_failing_launch(fail_at, bad_collect, usize::MAX)
    }

    fn engine_failing_launch(fail_at: usize, bad_collect: usize, fail_launch: usize) -> Engine {
        let shape = Shape(256, 1, 1, false);
        let fake = FakeRunner::new(VOCAB, CONTEXT, shape.0, BLOCK, SALT);
        let runner = Faulty {
            inner: QueuedRunner::new(Box::new(fake)),
            copies: 0,
            fail_at,
            collects: 0,
            bad_collect,
            launches: 0,
            fail_launch,
        };
        let mut config = tandem_engine::SchedulerConfig::new(shape.0, BLOCK, CONTEXT);
        config.max_num_batched_tokens = 1;
        config.long_prefill_token_threshold = 1;
        config.eos_token_ids = vec![EOS];
        Engine::new(Box::new(runner), config, 5).expect("engine")
    }
}

/// Runs `n` samples of `req` to their end on `engine`; the pool is idle after.
fn run_to_end(engine: &mut Engine, req: &GenerationRequest, n: usize) -> Vec<Out> {
    let ids = engine.add_request_n(req.clone(), n).expect("admissible");
    let mut events = Vec::new();
    let mut steps = 0;
    while engine.has_unfinished() {
        steps += 1;
        assert!(steps < 1000, "no end");
        events.extend(engine.step().expect("a step"));
    }
    let outs = outputs(&ids, events);
    assert_pool_idle("pool", engine.scheduler().allocator());
    outs
}

fn failed(o: &Out) -> bool {
    matches!(o.finish, Some(FinishReason::Error(_)))
}

impl ModelRunner for Faulty {
    fn config(&self) -> &ModelConfig {
        self.inner.config()
    }
    fn kv_geometry(&self) -> KvGeometry {
        self.inner.kv_geometry()
    }
    fn forward(&mut self, batch: &ForwardBatch) -> ModelResult<Logits> {
        self.inner.forward(batch)
    }
    fn forward_logprobs(
        &mut self,
        batch: &ForwardBatch,
        targets: &[Option<TokenId>],
    ) -> ModelResult<Vec<Option<f32>>> {
        self.inner.forward_logprobs(batch, targets)
    }
    fn forward_greedy(&mut self, batch: &ForwardBatch) -> ModelResult<Vec<Option<TokenPick>>> {
        self.inner.forward_greedy(batch)
    }
    fn samples_rows(&self) -> bool {
        self.inner.samples_rows()
    }
    fn forward_sample(
        &mut self,
        batch: &ForwardBatch,
        rows: &[RowDraw],
    ) -> ModelResult<Vec<Option<TokenPick>>> {
        self.inner.forward_sample(batch, rows)
    }
    fn overlaps_steps(&self) -> bool {
        true
    }
    fn launch_sample(
        &mut self,
        batch: &ForwardBatch,
        rows: &[RowDraw],
        carried: &[CarriedToken],
    ) -> ModelResult<()> {
        self.launches += 1;
        if self.launches == self.fail_launch {
            // As the contract says: a failed launch drops every launched step.
            while self.inner.num_launched() > 0 {
                self.inner.collect_picks()?;
            }
            return Err(ModelError::Batch("injected launch failure".into()));
        }
        self.inner.launch_sample(batch, rows, carried)
    }
    fn collect_picks(&mut self) -> ModelResult<Vec<Option<TokenPick>>> {
        let mut picks = self.inner.collect_picks()?;
        self.collects += 1;
        if self.collects == self.bad_collect {
            picks.push(None);
        }
        Ok(picks)
    }
    fn copy_blocks(&mut self, copies: &[(BlockId, BlockId)]) -> ModelResult<()> {
        if !copies.is_empty() {
            self.copies += 1;
            if self.copies == self.fail_at {
                return Err(ModelError::Batch("injected copy failure".into()));
            }
        }
        self.inner.copy_blocks(copies)
    }
    fn cached_logits(&mut self, table: &[BlockId], pos: Range<usize>) -> ModelResult<Logits> {
        self.inner.cached_logits(table, pos)
    }
    fn model_identity(&self) -> u64 {
        self.inner.model_identity()
    }
    fn describe(&self) -> String {
        "failing copies".into()
    }
}

#[test]
fn a_failed_copy_ahead_leaves_requests_outside_the_failed_plans_unchanged() {
    // An n = 3 group over a prompt that ends inside a block: after the fork the siblings
    // share that block, and each but the last copies it before its first write. With a
    // budget of one token per step the parent runs alone first, so the second copy (the
    // first sibling's) is made by a plan made ahead while the parent's step runs.
    let mut req = requests()[4].clone();
    req.prompt = ids(6, 6);
    req.sampling = sampling(Some(77));
    req.limits.max_tokens = 3;
    req.limits.ignore_eos = true;
    let want = reference(&[Sub(req.clone(), 3)]);
    // Without a failure: the reference, and the second copy is made ahead.
    let mut engine = Faulty::engine(usize::MAX, usize::MAX);
    assert_eq!(run_to_end(&mut engine, &req, 3), want);
    assert!(engine.scheduler().stats().num_planned_ahead > 0);

    let mut engine = Faulty::engine(2, usize::MAX);
    let got = run_to_end(&mut engine, &req, 3);
    assert!(
        failed(&got[1]),
        "the sibling whose copy failed: {:?}",
        got[1]
    );
    // The last sibling was in no failed plan: it must be untouched.
    assert_eq!(
        got[2], want[2],
        "a request outside the failed plans changed"
    );
    // The parent's step was launched before the failed plan and ran: answered as usual.
    assert_eq!(got[0], want[0], "the step launched before the failed plan");
}

#[test]
fn picks_that_do_not_answer_a_step_fail_it_and_leave_the_runner_empty() {
    // The second collect answers a step with one pick too many while a step planned ahead
    // of it (reading those picks) is launched: both fail. The runner must not keep the
    // step launched ahead, or the next request's steps would be answered by its picks.
    let mut req = requests()[4].clone();
    req.prompt = ids(6, 2);
    req.sampling = sampling(Some(78));
    req.limits.max_tokens = 6;
    req.limits.ignore_eos = true;
    let want = reference(&[Sub(req.clone(), 1)]);
    let mut engine = Faulty::engine(usize::MAX, usize::MAX);
    assert_eq!(run_to_end(&mut engine, &req, 1), want);

    let mut engine = Faulty::engine(usize::MAX, 3);
    let got = run_to_end(&mut engine, &req, 1);
    assert!(failed(&got[0]), "answered by a bad result: {:?}", got[0]);
    assert!(engine.scheduler().stats().num_planned_ahead > 0);
    // A request that comes after the failure is the reference's.
    assert_eq!(run_to_end(&mut engine, &req, 1), want, "after the failure");
}

#[test]
fn a_failed_launch_ahead_fails_both_steps_and_nothing_after() {
    let mut req = requests()[4].clone();
    req.prompt = ids(6, 2);
    req.sampling = sampling(Some(79));
    req.limits.max_tokens = 6;
    req.limits.ignore_eos = true;
    let want = reference(&[Sub(req.clone(), 1)]);
    // Launch 3 is made ahead of launch 2 (the prompt takes two one-token steps).
    let mut engine = Faulty::engine_failing_launch(usize::MAX, usize::MAX, 3);
    let got = run_to_end(&mut engine, &req, 1);
    let Some(FinishReason::Error(message)) = &got[0].finish else {
        panic!("not failed: {:?}", got[0]);
    };
    assert!(message.contains("forward pass failed"), "{message}");
    assert!(engine.scheduler().stats().num_planned_ahead > 0);
    assert_eq!(run_to_end(&mut engine, &req, 1), want, "after the failure");
}
