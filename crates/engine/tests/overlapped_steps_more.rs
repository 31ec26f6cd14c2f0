//! More overlapped-step scenarios (`engine/overlap.rs`): priority scheduling, and aborts of
//! any member of an `n > 1` group while a step is launched, each compared with the
//! reference (every sample alone in a roomy synchronous engine).

mod fake_paths;

use std::collections::HashMap;

use fake_paths::*;
use tandem_engine::engine::{Engine, EngineEvent};
use tandem_engine::{FinishReason, SchedulingPolicy, SeqId};
use tandem_model::fake_runner::FakeRunner;
use tandem_model::queued_runner::QueuedRunner;

fn engine(shape: Shape, policy: SchedulingPolicy, overlap: bool) -> Engine {
    let mut c = shape.config();
    c.policy = policy;
    let fake = FakeRunner::new(VOCAB, CONTEXT, shape.0, BLOCK, SALT);
    let runner: Box<dyn tandem_model::runner::ModelRunner> = if overlap {
        Box::new(QueuedRunner::new(Box::new(fake)))
    } else {
        Box::new(fake)
    };
    Engine::new(runner, c, 5).expect("engine")
}

/// Runs `subs` (submission `i` added before step `i`), aborting the `(submission, sample)`
/// ids of `aborts` before the steps given; returns outputs by submission and sample.
fn run_aborting(
    engine: &mut Engine,
    subs: &[Sub],
    aborts: &[(usize, usize, usize)],
) -> Vec<Vec<Out>> {
    let mut outs: Vec<Vec<Out>> = subs.iter().map(|s| vec![Out::default(); s.1]).collect();
    let mut slot: HashMap<SeqId, (usize, usize)> = HashMap::new();
    let mut ids: Vec<Vec<SeqId>> = vec![Vec::new(); subs.len()];
    let mut step = 0;
    while step < subs.len() || engine.has_unfinished() {
        assert!(step < 5000, "no end");
        if let Some(Sub(req, n)) = subs.get(step) {
            let added = engine.add_request_n(req.clone(), *n).expect("admissible");
            slot.extend(added.iter().enumerate().map(|(j, &id)| (id, (step, j))));
            ids[step] = added;
        }
        for &(i, j, _) in aborts.iter().filter(|a| a.2 == step) {
            let Some(&id) = ids.get(i).and_then(|v| v.get(j)) else {
                continue;
            };
            if outs[i][j].finish.is_none() {
                engine.abort(id).expect("a live request can be aborted");
                outs[i][j].finish = Some(FinishReason::Abort);
                // Aborting a parent before its fork ends its pending siblings too.
                if j == 0 {
                    for o in outs[i].iter_mut().filter(|o| o.tokens.is_empty()) {
                        o.finish.get_or_insert(FinishReason::Abort);
                    }
                }
            }
        }
        for e in engine.step().expect("a step") {
            match e {
                EngineEvent::Token {
                    seq_id,
                    token,
                    logprob,
                    top_logprobs,
                } => {
                    let (i, j) = slot[&seq_id];
                    let out = &mut outs[i][j];
                    assert!(out.finish.is_none(), "{seq_id:?}: a token after its end");
                    out.tokens.push(Tok::of(token, logprob, &top_logprobs));
                }
                EngineEvent::Finished { seq_id, reason } => {
                    assert!(!reason.is_failure(), "{reason:?}");
                    let (i, j) = slot[&seq_id];
                    let out = &mut outs[i][j];
                    assert!(out.finish.is_none(), "{seq_id:?} finished twice");
                    out.finish = Some(reason);
                }
                _ => {}
            }
        }
        let a = engine.scheduler().allocator();
        a.check_invariants().expect("allocator invariants");
        step += 1;
    }
    assert_pool_idle("pool", engine.scheduler().allocator());
    outs
}

fn group_subs() -> Vec<Sub> {
    let mut reqs = requests();
    for (i, r) in reqs.iter_mut().enumerate() {
        r.sampling = sampling(Some(500 + i as u64));
        r.limits.priority = [3, -1, 0, 2, -2][i % 5];
    }
    reqs.into_iter()
        .enumerate()
        .map(|(i, r)| Sub(r, [1, 3, 2][i % 3]))
        .collect()
}

#[test]
fn priority_scheduling_overlaps_unchanged() {
    let subs = group_subs();
    let want = reference(&subs);
    for shape in [REFERENCE, CHUNKED, TINY_POOL, Shape(TINY, 9, 9, true)] {
        let mut e = engine(shape, SchedulingPolicy::Priority, true);
        let got: Vec<Out> = run_aborting(&mut e, &subs, &[]).concat();
        assert_same(&format!("priority {shape:?}"), &subs, &got, &want);
        assert!(e.scheduler().stats().num_planned_ahead > 0);
    }
}

#[test]
fn aborting_any_group_member_while_a_step_runs_changes_no_other_sample() {
    let subs = group_subs();
    let want = reference(&subs);
    let mut random = lcg(0x5eed);
    let shapes = [REFERENCE, CHUNKED, TINY_POOL, Shape(TINY, 64, 5, true)];
    let mut cut = 0;
    for round in 0..24 {
        let aborts: Vec<(usize, usize, usize)> = (0..4)
            .map(|_| {
                let i = random(subs.len());
                (i, random(subs[i].1), random(20))
            })
            .collect();
        for policy in [SchedulingPolicy::Fcfs, SchedulingPolicy::Priority] {
            let mut e = engine(shapes[round % shapes.len()], policy, true);
            let got = run_aborting(&mut e, &subs, &aborts).concat();
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                let path = format!("round {round}, {policy:?}, aborts {aborts:?}, output {k}");
                if g.finish == Some(FinishReason::Abort) {
                    assert!(w.tokens.starts_with(&g.tokens), "{path}: diverged");
                    cut += usize::from(!g.tokens.is_empty());
                } else {
                    assert_eq!(g, w, "{path}: changed by the others' aborts");
                }
            }
        }
    }
    assert!(cut > 0, "no sample was cut mid-generation");
}
