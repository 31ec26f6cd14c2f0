//! Scheduler behaviour on hand-made scenarios, answered by a scripted runner.

use tandem_engine::model::batch::TokenId;
use tandem_engine::{
    EngineError, FinishReason, RequestParams, Scheduler, SchedulerConfig, SchedulingPolicy,
    SeqEvent, SeqId, SeqOutput, StepPlan, StepResult,
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

/// Answers every sequence needing logits with `token`.
fn answer(plan: &StepPlan, token: u32) -> StepResult {
    StepResult {
        step: plan.step,
        outputs: plan
            .seqs
            .iter()
            .filter(|s| s.num_output_rows > 0)
            .map(|s| SeqOutput {
                seq_id: s.seq_id,
                tokens: vec![TokenId(token)],
            })
            .collect(),
    }
}

/// (seq, num_computed, len, num_output_rows) of each scheduled sequence.
fn shape(plan: &StepPlan) -> Vec<(u64, usize, usize, usize)> {
    plan.seqs
        .iter()
        .map(|s| (s.seq_id.0, s.num_computed, s.len(), s.num_output_rows))
        .collect()
}

fn step(s: &mut Scheduler, token: u32) -> (StepPlan, Vec<SeqEvent>) {
    let plan = s.schedule().expect("no step in flight");
    let events = s.update(&answer(&plan, token)).expect("matching result");
    (plan, events)
}

#[test]
fn impossible_prompts_are_refused_and_leak_nothing() {
    let mut c = SchedulerConfig::new(4, 4, 32); // pool: 16 tokens
    c.eos_token_ids = vec![TokenId(0)];
    let mut s = Scheduler::new(c).expect("valid config");
    assert_eq!(
        s.add_request(toks(33), params(1)),
        Err(EngineError::PromptTooLong {
            len: 33,
            max_model_len: 32
        })
    );
    assert_eq!(
        s.add_request(toks(17), params(1)),
        Err(EngineError::PromptExceedsPool {
            len: 17,
            needed: 5,
            total: 4
        })
    );
    assert_eq!(
        s.add_request(vec![], params(1)),
        Err(EngineError::EmptyPrompt)
    );
    assert!(!s.has_unfinished());
    assert!(s.allocator().is_idle());
    assert!(s.schedule().expect("nothing in flight").is_empty());
    // A prompt filling the whole pool is accepted, and stops at the pool's length.
    let id = s.add_request(toks(16), params(8)).expect("fits the pool");
    let (plan, events) = step(&mut s, 5);
    assert_eq!(shape(&plan), vec![(id.0, 0, 16, 1)]);
    assert_eq!(
        events,
        vec![
            SeqEvent::Token {
                seq_id: id,
                token: TokenId(5)
            },
            SeqEvent::Finished {
                seq_id: id,
                reason: FinishReason::Length
            },
        ]
    );
    assert!(s.allocator().is_idle());
}

#[test]
fn prompt_only_requests_finish_after_their_prompt() {
    let mut c = SchedulerConfig::new(16, 4, 64);
    c.max_num_batched_tokens = 4;
    let mut s = Scheduler::new(c).expect("valid config");
    assert!(matches!(
        s.add_group(toks(3), params(0), 2),
        Err(EngineError::InvalidParams(m)) if m.contains("max_tokens")
    ));
    assert!(matches!(
        s.add_managed(toks(3), params(0), 2),
        Err(EngineError::InvalidParams(m)) if m.contains("max_tokens")
    ));
    let id = s
        .add_request(toks(6), params(0))
        .expect("a prompt-only request");
    let (plan, events) = step(&mut s, 5);
    assert_eq!(shape(&plan), vec![(id.0, 0, 4, 0)]);
    assert!(events.is_empty());
    let (plan, events) = step(&mut s, 5);
    assert_eq!(shape(&plan), vec![(id.0, 4, 2, 0)], "no row is sampled");
    assert_eq!(
        events,
        vec![SeqEvent::Finished {
            seq_id: id,
            reason: FinishReason::Length
        }]
    );
    assert!(!s.has_unfinished());
    assert!(s.allocator().is_idle());
}

#[test]
fn long_prompt_is_chunked_alongside_decodes() {
    let mut c = SchedulerConfig::new(64, 4, 256);
    c.max_num_batched_tokens = 8;
    c.long_prefill_token_threshold = 4;
    let mut s = Scheduler::new(c).expect("valid config");
    let a = s.add_request(toks(3), params(10)).expect("admissible");
    let (plan, _) = step(&mut s, 9);
    assert_eq!(shape(&plan), vec![(a.0, 0, 3, 1)]);
    let b = s.add_request(toks(10), params(10)).expect("admissible");
    let (plan, _) = step(&mut s, 9);
    assert_eq!(shape(&plan), vec![(a.0, 3, 1, 1), (b.0, 0, 4, 0)]);
    let (plan, _) = step(&mut s, 9);
    assert_eq!(shape(&plan), vec![(a.0, 4, 1, 1), (b.0, 4, 4, 0)]);
    let (plan, events) = step(&mut s, 9);
    assert_eq!(shape(&plan), vec![(a.0, 5, 1, 1), (b.0, 8, 2, 1)]);
    assert_eq!(events.len(), 2, "both sequences got a token");
    assert_eq!(
        plan.seqs[1].block_table.len(),
        3,
        "10 tokens in blocks of 4"
    );
    assert_eq!(s.sequence(b).expect("live").output(), &[TokenId(9)]);
}

#[test]
fn abort_frees_at_once_and_in_flight_results_skip_it() {
    let mut s = Scheduler::new(SchedulerConfig::new(8, 4, 64)).expect("valid config");
    let a = s.add_request(toks(9), params(5)).expect("admissible");
    let b = s.add_request(toks(2), params(5)).expect("admissible");
    let plan = s.schedule().expect("nothing in flight");
    assert_eq!(s.allocator().num_free(), 8 - 3 - 1);
    assert_eq!(s.schedule(), Err(EngineError::StepInFlight(plan.step)));
    s.abort(a).expect("live");
    assert_eq!(s.allocator().num_free(), 8 - 1);
    assert_eq!(s.abort(a), Err(EngineError::UnknownSeq(a)));
    let events = s.update(&answer(&plan, 4)).expect("matching result");
    assert_eq!(
        events,
        vec![SeqEvent::Token {
            seq_id: b,
            token: TokenId(4)
        }]
    );
    s.abort(b).expect("live");
    assert!(s.allocator().is_idle());
    assert!(!s.has_unfinished());
}

#[test]
fn mismatched_results_change_nothing() {
    let mut s = Scheduler::new(SchedulerConfig::new(8, 4, 64)).expect("valid config");
    let a = s.add_request(toks(5), params(5)).expect("admissible");
    let plan = s.schedule().expect("nothing in flight");
    let good = answer(&plan, 3);
    let wrong_step = StepResult {
        step: plan.step + 1,
        ..good.clone()
    };
    let missing = StepResult {
        step: plan.step,
        outputs: vec![],
    };
    let mut two = good.clone();
    two.outputs[0].tokens.push(TokenId(3));
    let mut stranger = good.clone();
    stranger.outputs[0].seq_id = SeqId(77);
    for bad in [wrong_step, missing, two, stranger] {
        assert!(
            matches!(s.update(&bad), Err(EngineError::ResultMismatch(_))),
            "{bad:?}"
        );
        assert_eq!(s.sequence(a).expect("live").num_computed_tokens(), 0);
    }
    s.update(&good).expect("matching result");
    assert_eq!(s.sequence(a).expect("live").num_computed_tokens(), 5);
    assert!(matches!(
        s.update(&good),
        Err(EngineError::ResultMismatch(_))
    ));
}

#[test]
fn failed_step_finishes_its_sequences_with_an_error() {
    let mut s = Scheduler::new(SchedulerConfig::new(8, 4, 64)).expect("valid config");
    let a = s.add_request(toks(5), params(5)).expect("admissible");
    s.schedule().expect("nothing in flight");
    let events = s.fail_step("model exploded");
    assert_eq!(
        events,
        vec![SeqEvent::Finished {
            seq_id: a,
            reason: FinishReason::Error("model exploded".into())
        }]
    );
    assert!(s.allocator().is_idle());
    assert!(s.schedule().expect("nothing in flight").is_empty());
}

#[test]
fn stop_conditions() {
    let mut c = SchedulerConfig::new(32, 4, 128);
    c.eos_token_ids = vec![TokenId(0)];
    let mut s = Scheduler::new(c).expect("valid config");
    let eos = s.add_request(toks(2), params(9)).expect("admissible");
    let ignore = RequestParams {
        ignore_eos: true,
        ..params(2)
    };
    let ign = s.add_request(toks(2), ignore).expect("admissible");
    let stop = RequestParams {
        stop_token_ids: vec![TokenId(0)],
        ignore_eos: true,
        ..params(9)
    };
    let stp = s.add_request(toks(2), stop).expect("admissible");
    let (_, events) = step(&mut s, 0);
    let finished: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            SeqEvent::Finished { seq_id, reason } => Some((*seq_id, reason.clone())),
            SeqEvent::Token { .. } => None,
        })
        .collect();
    assert_eq!(
        finished,
        vec![(eos, FinishReason::Stop), (stp, FinishReason::Stop)]
    );
    let (_, events) = step(&mut s, 0);
    assert_eq!(
        events.last(),
        Some(&SeqEvent::Finished {
            seq_id: ign,
            reason: FinishReason::Length
        })
    );
    assert!(s.allocator().is_idle());
}

#[test]
fn priority_orders_admission_and_picks_the_least_urgent_victim() {
    let mut c = SchedulerConfig::new(6, 2, 12); // pool: 12 tokens
    c.policy = SchedulingPolicy::Priority;
    c.max_num_seqs = 2;
    c.enable_prefix_caching = false; // identical prompts: keep the three independent
    let mut s = Scheduler::new(c).expect("valid config");
    let low = s
        .add_request(
            toks(4),
            RequestParams {
                priority: 5,
                ..params(8)
            },
        )
        .expect("ok");
    let high = s
        .add_request(
            toks(4),
            RequestParams {
                priority: 1,
                ..params(8)
            },
        )
        .expect("ok");
    let mid = s
        .add_request(
            toks(4),
            RequestParams {
                priority: 3,
                ..params(8)
            },
        )
        .expect("ok");
    let (plan, _) = step(&mut s, 1);
    let order: Vec<SeqId> = plan.seqs.iter().map(|x| x.seq_id).collect();
    assert_eq!(order, vec![high, mid], "the two most urgent run first");
    // Both grow by one token per step: 4 blocks of 6 held; at 7 tokens each needs a 4th block.
    let mut preempted = Vec::new();
    for _ in 0..4 {
        let (plan, _) = step(&mut s, 1);
        preempted.extend(plan.preempted);
    }
    assert_eq!(
        preempted.first(),
        Some(&mid),
        "the less urgent running sequence is the victim"
    );
    assert!(s.sequence(low).expect("live").block_table().is_empty());
}

#[test]
fn waiting_requests_never_preempt_running_ones() {
    let mut s = Scheduler::new(SchedulerConfig::new(4, 4, 16)).expect("valid config");
    let a = s.add_request(toks(12), params(3)).expect("admissible");
    step(&mut s, 2);
    let b = s.add_request(toks(8), params(3)).expect("admissible");
    let (plan, _) = step(&mut s, 2);
    assert_eq!(shape(&plan), vec![(a.0, 12, 1, 1)]);
    assert!(plan.preempted.is_empty());
    assert_eq!(s.num_waiting(), 1);
    assert!(s.sequence(b).expect("live").block_table().is_empty());
}
