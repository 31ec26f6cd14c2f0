//! Scheduling-level invariants against the fake model (ARCHITECTURE.md § Invariants, 2, 3, 5, 6,
//! 8): every request's output equals its alone-run whatever the batch, chunking, budget, pool size,
//! arrival order, aborts or speculation; plans respect the limits; the pool drains.

mod common;

use common::{alone, run, Req, VOCAB};
use proptest::prelude::*;
use tandem_engine::model::batch::TokenId;
use tandem_engine::{FinishReason, RequestParams, SchedulerConfig, SchedulingPolicy};

fn req_strategy(max_prompt: usize, max_arrival: usize) -> impl Strategy<Value = Req> {
    (
        prop::collection::vec(0..VOCAB, 1..=max_prompt),
        1usize..24,
        any::<bool>(),
        prop::collection::vec(1..VOCAB, 0..2),
        0i32..3,
        0..=max_arrival,
        prop::option::weighted(0.15, 0usize..40),
        prop::bool::weighted(0.3),
    )
        .prop_map(
            |(prompt, max_tokens, ignore_eos, stops, priority, arrival, abort_at, speculate)| Req {
                prompt: prompt.into_iter().map(TokenId).collect(),
                params: RequestParams {
                    max_tokens,
                    ignore_eos,
                    stop_token_ids: stops.into_iter().map(TokenId).collect(),
                    priority,
                    cache_salt: None,
                    adapter: None,
                },
                arrival,
                abort_at: abort_at.filter(|&a| a >= arrival),
                speculate,
            },
        )
}

fn config_strategy(blocks: std::ops::Range<usize>) -> impl Strategy<Value = SchedulerConfig> {
    (
        1usize..48,
        1usize..8,
        1usize..48,
        prop::sample::select(vec![1usize, 2, 4, 16]),
        blocks,
        any::<bool>(),
    )
        .prop_map(|(budget, seqs, threshold, block_size, pool_tokens, prio)| {
            let num_blocks = pool_tokens.div_ceil(block_size);
            let mut c = SchedulerConfig::new(num_blocks, block_size, MAX_MODEL_LEN);
            c.max_num_batched_tokens = budget;
            c.max_num_seqs = seqs;
            c.long_prefill_token_threshold = threshold;
            c.policy = if prio {
                SchedulingPolicy::Priority
            } else {
                SchedulingPolicy::Fcfs
            };
            c.eos_token_ids = vec![common::EOS];
            c
        })
}

/// Every configuration's pool holds at least this many tokens, so `max_seq_len` is this.
const MAX_MODEL_LEN: usize = 40;

/// Asserts every request's output equals its alone-run (a prefix of it when aborted).
fn assert_alone_equivalent(reqs: &[Req], o: &common::Outcome) {
    for (i, r) in reqs.iter().enumerate() {
        let (want, why) = alone(&r.prompt, &r.params, MAX_MODEL_LEN);
        match &o.finish[i] {
            Some(FinishReason::Abort) => {
                assert!(
                    want.starts_with(&o.outputs[i]),
                    "request {i}: aborted output diverged"
                )
            }
            Some(reason) => {
                assert_eq!(o.outputs[i], want, "request {i} output");
                assert_eq!(reason, &why, "request {i} finish reason");
            }
            None => panic!("request {i} never finished"),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// (a), (c), (e): random workloads, budgets, caps, chunk thresholds and block sizes.
    #[test]
    fn outputs_equal_alone_runs(
        config in config_strategy(MAX_MODEL_LEN * 4..MAX_MODEL_LEN * 12),
        reqs in prop::collection::vec(req_strategy(MAX_MODEL_LEN, 12), 1..16),
    ) {
        let o = run(&config, &reqs);
        assert_alone_equivalent(&reqs, &o);
    }

    /// (b): a pool that holds barely one full sequence forces recompute preemption.
    #[test]
    fn tiny_pool_preemption_is_transparent(
        config in config_strategy(MAX_MODEL_LEN..MAX_MODEL_LEN + 12),
        reqs in prop::collection::vec(req_strategy(24, 4), 2..10),
    ) {
        let o = run(&config, &reqs);
        assert_alone_equivalent(&reqs, &o);
    }
}

/// A fixed workload that must preempt: six long generations, pool for about one.
#[test]
fn forced_preemption_happens_and_changes_nothing() {
    let mut config = SchedulerConfig::new(10, 4, MAX_MODEL_LEN);
    config.eos_token_ids = vec![common::EOS];
    let reqs: Vec<Req> = (0..6u32)
        .map(|i| Req {
            prompt: (0..12).map(|j| TokenId((i * 7 + j) % VOCAB)).collect(),
            params: RequestParams {
                max_tokens: 20,
                ignore_eos: true,
                ..RequestParams::default()
            },
            arrival: 0,
            abort_at: None,
            speculate: i % 2 == 0,
        })
        .collect();
    let o = run(&config, &reqs);
    assert!(
        o.num_preemptions > 0,
        "the pool is too small not to preempt"
    );
    assert_alone_equivalent(&reqs, &o);
    for out in &o.outputs {
        assert_eq!(out.len(), 20);
    }
}

/// Chunk size changes the number of steps, never the outputs.
#[test]
fn chunked_prefill_at_every_threshold_matches_whole_prefill() {
    let prompt: Vec<TokenId> = (0..33).map(|j| TokenId((j * 5 + 3) % VOCAB)).collect();
    let params = RequestParams {
        max_tokens: 5,
        ignore_eos: true,
        ..RequestParams::default()
    };
    let want = alone(&prompt, &params, MAX_MODEL_LEN).0;
    let mut steps = Vec::new();
    for threshold in [1, 2, 7, 16, 33, 64] {
        let mut c = SchedulerConfig::new(16, 4, MAX_MODEL_LEN);
        c.long_prefill_token_threshold = threshold;
        let req = Req {
            prompt: prompt.clone(),
            params: params.clone(),
            arrival: 0,
            abort_at: None,
            speculate: false,
        };
        let o = run(&c, &[req]);
        assert_eq!(o.outputs[0], want, "threshold {threshold}");
        steps.push(o.num_steps);
    }
    // 33 prompt tokens in chunks of `threshold`, then 4 more decode steps.
    assert_eq!(steps, vec![37, 21, 9, 7, 5, 5]);
}
