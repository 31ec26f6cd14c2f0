//! Prefix caching at the scheduling level (ARCHITECTURE.md § Invariants, 4 and 8), against the fake
//! model, whose next token is a hash of the context *read back through the block table*: a cached
//! block with the wrong contents, a stale block reused after eviction or a wrong `num_computed`
//! changes the output.
//!
//! - Random workloads of prompts built from a few shared heads, with random pools (tiny ones
//!   evict and preempt), chunk sizes, aborts, speculation and two cache salts: every output
//!   equals its alone-run, with the cache on and off; after every step no block is both free
//!   and held, refcounts equal the tables' references, every cached key's block holds its
//!   tokens (allocator invariants); the pool returns to full when idle.
//! - Fixed workloads: hits happen (and count), evictions happen, salts isolate.

mod common;

use common::{alone, run, Req, VOCAB};
use proptest::prelude::*;
use tandem_engine::model::batch::TokenId;
use tandem_engine::{FinishReason, RequestParams, Scheduler, SchedulerConfig};

const MAX_MODEL_LEN: usize = 48;

fn heads() -> Vec<Vec<TokenId>> {
    (0..3u32)
        .map(|h| {
            (0..(8 + 9 * h))
                .map(|j| TokenId((h * 11 + j * 3) % VOCAB))
                .collect()
        })
        .collect()
}

fn req_strategy() -> impl Strategy<Value = Req> {
    (
        0usize..4,
        prop::collection::vec(0..VOCAB, 1..8),
        1usize..12,
        0..=10usize,
        prop::option::weighted(0.1, 0usize..30),
        prop::bool::weighted(0.25),
        prop::bool::weighted(0.3),
    )
        .prop_map(
            |(head, tail, max_tokens, arrival, abort_at, speculate, salted)| {
                let mut prompt = heads().get(head).cloned().unwrap_or_default();
                prompt.extend(tail.into_iter().map(TokenId));
                Req {
                    prompt,
                    params: RequestParams {
                        max_tokens,
                        ignore_eos: true,
                        cache_salt: salted.then(|| "tenant-b".to_string()),
                        ..RequestParams::default()
                    },
                    arrival,
                    abort_at: abort_at.filter(|&a| a >= arrival),
                    speculate,
                }
            },
        )
}

fn config_strategy(pool: std::ops::Range<usize>) -> impl Strategy<Value = SchedulerConfig> {
    (
        1usize..40,
        1usize..6,
        1usize..40,
        prop::sample::select(vec![1usize, 2, 4, 8]),
        pool,
    )
        .prop_map(|(budget, seqs, threshold, block_size, pool_tokens)| {
            let mut c =
                SchedulerConfig::new(pool_tokens.div_ceil(block_size), block_size, MAX_MODEL_LEN);
            c.max_num_batched_tokens = budget;
            c.max_num_seqs = seqs;
            c.long_prefill_token_threshold = threshold;
            c.eos_token_ids = vec![common::EOS];
            c
        })
}

fn assert_alone_equivalent(reqs: &[Req], o: &common::Outcome) {
    for (i, r) in reqs.iter().enumerate() {
        let (want, why) = alone(&r.prompt, &r.params, MAX_MODEL_LEN);
        match &o.finish[i] {
            Some(FinishReason::Abort) => assert!(want.starts_with(&o.outputs[i]), "request {i}"),
            Some(reason) => {
                assert_eq!(o.outputs[i], want, "request {i} output");
                assert_eq!(reason, &why, "request {i} finish reason");
            }
            None => panic!("request {i} never finished"),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Roomy pools: hits on shared heads, cache on ≡ cache off ≡ alone.
    #[test]
    fn shared_heads_give_alone_outputs_with_and_without_the_cache(
        config in config_strategy(MAX_MODEL_LEN * 3..MAX_MODEL_LEN * 8),
        reqs in prop::collection::vec(req_strategy(), 1..14),
    ) {
        let on = run(&config, &reqs);
        assert_alone_equivalent(&reqs, &on);
        let mut off = config.clone();
        off.enable_prefix_caching = false;
        let o = run(&off, &reqs);
        assert_alone_equivalent(&reqs, &o);
        prop_assert_eq!(o.prefix_cache_hits, 0);
    }

    /// Pools for about one sequence: eviction, preemption and re-admission through the cache.
    #[test]
    fn tiny_pools_evict_and_preempt_transparently(
        config in config_strategy(MAX_MODEL_LEN..MAX_MODEL_LEN + 10),
        reqs in prop::collection::vec(req_strategy(), 2..10),
    ) {
        let o = run(&config, &reqs);
        assert_alone_equivalent(&reqs, &o);
    }
}

fn req(prompt: Vec<TokenId>, arrival: usize, salt: Option<&str>) -> Req {
    Req {
        prompt,
        params: RequestParams {
            max_tokens: 4,
            ignore_eos: true,
            cache_salt: salt.map(str::to_string),
            ..RequestParams::default()
        },
        arrival,
        abort_at: None,
        speculate: false,
    }
}

fn with_tail(head: &[TokenId], tail: &[u32]) -> Vec<TokenId> {
    head.iter()
        .copied()
        .chain(tail.iter().copied().map(TokenId))
        .collect()
}

#[test]
fn a_later_request_hits_the_full_blocks_of_a_finished_ones_prompt() {
    let head = &heads()[2]; // 26 tokens: 6 full blocks of 4
    let c = SchedulerConfig::new(64, 4, MAX_MODEL_LEN);
    let reqs = [
        req(with_tail(head, &[1, 2]), 0, None),
        req(with_tail(head, &[3]), 20, None),
    ];
    let o = run(&c, &reqs);
    assert_alone_equivalent(&reqs, &o);
    // The second prompt (27 tokens) finds the first's 6 full prompt blocks.
    assert_eq!(o.prefix_cache_hits, 24);
    // The same prompt again hits all but its last token's block.
    let same = [
        req(with_tail(head, &[1, 2]), 0, None),
        req(with_tail(head, &[1, 2]), 20, None),
    ];
    let o = run(&c, &same);
    assert_alone_equivalent(&same, &o);
    assert_eq!(
        o.prefix_cache_hits, 24,
        "28 tokens: 7 blocks, the last is left to compute"
    );
}

#[test]
fn different_salts_never_share_a_block() {
    let head = &heads()[2];
    let c = SchedulerConfig::new(64, 4, MAX_MODEL_LEN);
    let reqs = [
        req(with_tail(head, &[1]), 0, Some("a")),
        req(with_tail(head, &[1]), 20, Some("b")),
        req(with_tail(head, &[1]), 40, None),
        req(with_tail(head, &[1]), 60, Some("a")),
    ];
    let o = run(&c, &reqs);
    assert_alone_equivalent(&reqs, &o);
    assert_eq!(
        o.prefix_cache_hits, 24,
        "only the second \"a\" request hits"
    );
}

#[test]
fn eviction_takes_the_most_specific_blocks_first_and_failed_steps_cache_nothing() {
    // A pool of 10 blocks of 4: the second, unrelated prompt evicts the first's blocks.
    let mut c = SchedulerConfig::new(10, 4, 40);
    c.eos_token_ids = vec![common::EOS];
    let a: Vec<TokenId> = (0..30).map(|j| TokenId(j % VOCAB)).collect();
    let b: Vec<TokenId> = (0..30).map(|j| TokenId((j * 7 + 5) % VOCAB)).collect();
    let mut s = Scheduler::new(c).expect("valid");
    for prompt in [&a, &b, &a] {
        s.add_request(
            prompt.clone(),
            RequestParams {
                max_tokens: 1,
                ..RequestParams::default()
            },
        )
        .expect("fits");
        while s.has_unfinished() {
            s.schedule().expect("plan");
            s.fail_step("not run"); // released without computing: nothing may be registered
        }
    }
    assert_eq!(
        s.stats().prefix_cache_hits,
        0,
        "nothing computed, nothing cached"
    );
    assert_eq!(s.allocator().num_registered(), 0);
    assert!(s.allocator().is_idle());
    // Now computed for real. `a` (30 + 4 tokens, 33 computed) leaves 8 full blocks cached
    // and frees its tail first; `b` needs 9 blocks: the 2 plain free ones, then the 7 least
    // recently freed cached ones, which are `a`'s most specific blocks. Only `a`'s head
    // block survives for the third request.
    let reqs = [
        req(a.clone(), 0, None),
        req(b.clone(), 20, None),
        req(a.clone(), 40, None),
    ];
    let mut c = SchedulerConfig::new(10, 4, 40);
    c.eos_token_ids = vec![common::EOS];
    let o = run(&c, &reqs);
    for (i, r) in reqs.iter().enumerate() {
        assert_eq!(
            o.outputs[i],
            alone(&r.prompt, &r.params, 40).0,
            "request {i}"
        );
    }
    assert_eq!(
        o.prefix_cache_hits, 4,
        "a's head block survives b's evictions"
    );
}

#[test]
fn requests_submitted_together_share_the_prefix_one_of_them_computes() {
    let head = &heads()[2]; // 26 tokens: 6 full blocks of 4
    let mut c = SchedulerConfig::new(64, 4, MAX_MODEL_LEN);
    c.long_prefill_token_threshold = 8; // the head takes several steps to compute
    let reqs: Vec<Req> = (0..4u32)
        .map(|k| req(with_tail(head, &[k, k + 1]), 0, None))
        .collect();
    let o = run(&c, &reqs);
    assert_alone_equivalent(&reqs, &o);
    assert_eq!(
        o.prefix_cache_hits,
        3 * 24,
        "the others wait for the first's head blocks"
    );
}
