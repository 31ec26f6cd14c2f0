//! Property tests: whatever the logits and parameters, the sampled token is one the
//! documented processed distribution allows (computed independently, with a small slack
//! only at the top-p and min-p boundaries for rounding).

mod sampler_reference;

use proptest::prelude::*;
use sampler_reference::processed_logits;
use tandem_engine::sampler::{sample, SamplerState, SamplingParams};

/// Checks the token against each truncation rule, from the reference processed logits.
fn assert_allowed(token: usize, l: &[f64], p: &SamplingParams) {
    assert!(l[token] > f64::NEG_INFINITY, "sampled a suppressed token");
    let max = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if p.temperature == 0.0 {
        let first_max = l.iter().position(|&v| v == max).expect("a max");
        assert_eq!(
            token, first_max,
            "greedy must be the argmax with the lowest id"
        );
        return;
    }
    // top-k: fewer than k tokens rank strictly above (ties may go either way).
    if p.top_k >= 1 {
        let above = l.iter().filter(|&&v| v > l[token]).count();
        assert!(above < p.top_k as usize, "outside top-{}", p.top_k);
    }
    let t = p.temperature as f64;
    let mut w: Vec<f64> = l.iter().map(|&v| ((v - max) / t).exp()).collect();
    if p.top_k >= 1 {
        let mut sorted = l.to_vec();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let kth = sorted[(p.top_k as usize).min(l.len()) - 1];
        for (x, &v) in w.iter_mut().zip(l) {
            if v < kth {
                *x = 0.0;
            }
        }
    }
    let total: f64 = w.iter().sum();
    if p.top_p < 1.0 {
        // Mass strictly more likely than the token must be below top_p.
        let before: f64 = w.iter().filter(|&&x| x > w[token]).sum();
        assert!(
            before / total < p.top_p as f64 + 1e-9,
            "outside the nucleus"
        );
    }
    if p.min_p > 0.0 {
        assert!(w[token] >= p.min_p as f64 * (1.0 - 1e-9), "below min-p");
    }
    assert!(w[token] > 0.0, "zero probability");
}

fn params_strategy() -> impl Strategy<Value = SamplingParams> {
    (
        (
            prop_oneof![Just(0.0f32), 0.05f32..3.0],
            prop_oneof![Just(-1i32), Just(0), 1i32..20],
            prop_oneof![Just(1.0f32), 0.01f32..1.0],
            prop_oneof![Just(0.0f32), 0.0f32..=1.0],
        ),
        (0.5f32..2.0, -2.0f32..=2.0, -2.0f32..=2.0),
        proptest::collection::vec((0u32..40, -100.0f32..=100.0), 0..6),
        (
            0usize..4,
            proptest::collection::vec(0u32..40, 0..4),
            any::<bool>(),
        ),
    )
        .prop_map(
            |((temperature, top_k, top_p, min_p), pen, logit_bias, stop)| {
                let (min_tokens, stop_token_ids, ignore_eos) = stop;
                SamplingParams {
                    temperature,
                    top_k,
                    top_p,
                    min_p,
                    repetition_penalty: pen.0,
                    presence_penalty: pen.1,
                    frequency_penalty: pen.2,
                    logit_bias,
                    min_tokens,
                    stop_token_ids,
                    eos_token_ids: vec![0],
                    ignore_eos,
                    ..SamplingParams::default()
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn sampled_token_is_allowed_by_the_processed_distribution(
        logits in proptest::collection::vec(
            prop_oneof![-20.0f32..20.0, Just(0.0f32), Just(1.0f32)], 40..=40),
        params in params_strategy(),
        prompt in proptest::collection::vec(0u32..40, 0..8),
        output in proptest::collection::vec(0u32..40, 0..8),
        seed in any::<u64>(),
    ) {
        prop_assert!(params.validate(logits.len()).is_ok());
        let mut state = SamplerState::new(seed, &prompt);
        for &t in &output {
            state.append_output(t);
        }
        let l = processed_logits(&logits, &params, &prompt, &output, output.len());
        for _ in 0..8 {
            match sample(&logits, &params, &mut state, output.len()) {
                Ok(s) => assert_allowed(s.token as usize, &l, &params),
                Err(e) => {
                    // Only possible when every token is suppressed.
                    prop_assert!(l.iter().all(|&v| v == f64::NEG_INFINITY), "{e}");
                }
            }
        }
    }

    #[test]
    fn larger_rows_with_one_dominant_cluster(
        n in 100usize..3000,
        hot in proptest::collection::vec(0usize..100, 1..10),
        top_p in 0.05f32..1.0,
        top_k in prop_oneof![Just(-1i32), 1i32..200],
        seed in any::<u64>(),
    ) {
        // Many equal low logits plus a few high ones: exercises the growing nucleus search.
        let mut logits = vec![0.0f32; n];
        for (i, &h) in hot.iter().enumerate() {
            logits[h] = 2.0 + i as f32 * 0.5;
        }
        let params = SamplingParams { top_p, top_k, ..SamplingParams::default() };
        let mut state = SamplerState::new(seed, &[]);
        let l = processed_logits(&logits, &params, &[], &[], 0);
        for _ in 0..4 {
            let s = sample(&logits, &params, &mut state, 0).expect("finite");
            assert_allowed(s.token as usize, &l, &params);
        }
    }
}
