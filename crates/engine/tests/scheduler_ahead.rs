//! `Scheduler::schedule_ahead` (`scheduler/ahead.rs`) on hand-made scenarios: what a plan
//! made while the previous one runs may grant.

use tandem_engine::model::batch::TokenId;
use tandem_engine::{
    RequestParams, Scheduler, SchedulerConfig, SeqId, SeqOutput, StepPlan, StepResult,
};

fn toks(n: usize) -> Vec<TokenId> {
    (0..n as u32).map(|i| TokenId(i % 7 + 1)).collect()
}

fn params(max_tokens: usize) -> RequestParams {
    RequestParams {
        max_tokens,
        ..RequestParams::default()
    }
}

/// Answers every sequence needing logits with token 3.
fn answer(plan: &StepPlan) -> StepResult {
    let outputs = plan.seqs.iter().filter(|s| s.num_output_rows > 0);
    StepResult {
        step: plan.step,
        outputs: outputs
            .map(|s| SeqOutput {
                seq_id: s.seq_id,
                tokens: vec![TokenId(3)],
            })
            .collect(),
    }
}

fn ids(plan: &StepPlan) -> Vec<SeqId> {
    plan.seqs.iter().map(|s| s.seq_id).collect()
}

#[test]
fn a_waiting_sequence_does_not_overtake_a_running_one_the_dry_pool_left_short() {
    // Pool of 5 blocks of 4. Step 0 gives R (16-token prompt, chunks of 8) and B (8
    // tokens) two blocks each: one block is left. R's next chunk needs two.
    let start = || {
        let mut c = SchedulerConfig::new(5, 4, 20);
        c.long_prefill_token_threshold = 8;
        c.enable_prefix_caching = false;
        let mut s = Scheduler::new(c).expect("valid config");
        let r = s.add_request(toks(16), params(4)).expect("R");
        let b = s.add_request(toks(8), params(4)).expect("B");
        let first = s.schedule().expect("step 0");
        assert_eq!(ids(&first), vec![r, b]);
        assert_eq!(s.allocator().num_free(), 1);
        let w = s.add_request(toks(2), params(4)).expect("W");
        (s, first, [r, b, w])
    };
    // The synchronous loop, after step 0's result, preempts B for R and admits nobody.
    let (mut s, first, [r, b, w]) = start();
    s.update(&answer(&first)).expect("step 0's result");
    let next = s.schedule().expect("step 1");
    assert_eq!((ids(&next), next.preempted), (vec![r], vec![b]));
    let (mut s, _, [_, _, w2]) = start();
    assert_eq!(w, w2);
    // A waiting sequence never takes blocks a running one is short of. Ahead of the
    // result there is no preemption, and W must not take the last block either.
    let ahead = s.schedule_ahead().expect("no error");
    let admitted = ahead.as_ref().is_some_and(|p| ids(p).contains(&w));
    assert!(
        !admitted,
        "W admitted past R, which the dry pool left short: {:?}",
        ahead.map(|p| ids(&p))
    );
}

#[test]
fn a_group_waiting_behind_others_does_not_stop_planning_ahead() {
    // S decodes; W and then an n = 2 group G wait. Planning ahead of S's step admits W and
    // stops at G (its fork needs the shared row on the host); once G is next in the queue,
    // the plan is made from the result instead.
    let mut c = SchedulerConfig::new(64, 4, 64);
    c.enable_prefix_caching = false;
    c.max_num_seqs = 3;
    let mut s = Scheduler::new(c).expect("valid config");
    let id_s = s.add_request(toks(5), params(8)).expect("S");
    let first = s.schedule().expect("S's prompt");
    s.update(&answer(&first)).expect("S's first token");
    let decode = s.schedule().expect("S decodes");
    assert_eq!(ids(&decode), vec![id_s]);
    let w = s.add_request(toks(3), params(8)).expect("W");
    let g = s.add_group(toks(6), params(8), 2).expect("G");
    let ahead = s.schedule_ahead().expect("no error");
    let ahead = ahead.expect("planned ahead with a group queued behind the running ones");
    assert_eq!(
        ids(&ahead),
        vec![id_s, w],
        "the group is not admitted ahead"
    );
    s.update(&answer(&decode)).expect("decode result");
    s.update(&answer(&ahead)).expect("ahead result");
    // G is next in the queue (it needs two of the three running slots): once it may be
    // admitted, it is planned from a result.
    s.abort(w).expect("W");
    let next = s.schedule().expect("S and G");
    assert_eq!(ids(&next), vec![id_s, g[0]]);
    assert!(s.schedule_ahead().expect("no error").is_none(), "G forks");
}
