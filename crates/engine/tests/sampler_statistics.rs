//! Statistical tests: for each parameter setting, 100,000 seeded draws over a 50-token
//! synthetic vocabulary are compared with the exact target distribution computed in f64 by
//! the independent reference (`sampler_reference`) with a chi-square test (p > 1e-3).

mod sampler_reference;

use sampler_reference::{chi2_sf, fit, gamma_q, ln_gamma, synthetic_logits, target_distribution};
use tandem_engine::sampler::{sample, SamplerState, SamplingParams};

const VOCAB: usize = 50;
const DRAWS: usize = 100_000;
const MIN_P_VALUE: f64 = 1e-3;

/// A setting: parameters plus the prompt and output history the penalties see.
struct Case {
    name: &'static str,
    params: SamplingParams,
    prompt: Vec<u32>,
    output: Vec<u32>,
}

fn case(name: &'static str, params: SamplingParams) -> Case {
    Case {
        name,
        params,
        prompt: Vec::new(),
        output: Vec::new(),
    }
}

fn with_temp(t: f32) -> SamplingParams {
    SamplingParams {
        temperature: t,
        ..SamplingParams::default()
    }
}

/// Draws `DRAWS` tokens for `case` and returns the per-token counts.
fn draw_counts(logits: &[f32], c: &Case, seed: u64) -> Vec<u64> {
    c.params.validate(logits.len()).expect("valid params");
    let mut state = SamplerState::new(seed, &c.prompt);
    for &t in &c.output {
        state.append_output(t);
    }
    let mut counts = vec![0u64; logits.len()];
    for _ in 0..DRAWS {
        let s = sample(logits, &c.params, &mut state, c.output.len()).expect("finite row");
        counts[s.token as usize] += 1;
    }
    counts
}

/// Runs one case against `target` and asserts the fit.
fn check(logits: &[f32], c: &Case, seed: u64) {
    let target = target_distribution(logits, &c.params, &c.prompt, &c.output, c.output.len());
    let counts = draw_counts(logits, c, seed);
    let f = fit(&counts, &target);
    let support = target.iter().filter(|&&p| p > 0.0).count();
    eprintln!(
        "{:<28} support {:>2}  chi2 {:>8.2}  df {:>2}  p {:.4}  TV {:.5}",
        c.name, support, f.chi2, f.df, f.p_value, f.tv_distance
    );
    assert_eq!(
        f.impossible, 0,
        "{}: sampled a token of probability 0",
        c.name
    );
    assert!(
        f.p_value > MIN_P_VALUE,
        "{}: chi-square p = {} (chi2 {}, df {})",
        c.name,
        f.p_value,
        f.chi2,
        f.df
    );
}

fn history_cases() -> Vec<Case> {
    vec![
        Case {
            name: "repetition 1.3 + history",
            params: SamplingParams {
                repetition_penalty: 1.3,
                ..SamplingParams::default()
            },
            prompt: vec![0, 3, 3, 7, 11, 20, 31, 49],
            output: vec![5, 7, 7, 12, 40],
        },
        Case {
            name: "presence 0.8 frequency 0.5",
            params: SamplingParams {
                presence_penalty: 0.8,
                frequency_penalty: 0.5,
                ..SamplingParams::default()
            },
            prompt: vec![1, 2, 3],
            output: vec![2, 2, 2, 9, 9, 17, 33, 33, 33, 33],
        },
        Case {
            name: "negative presence/frequency",
            params: SamplingParams {
                presence_penalty: -1.0,
                frequency_penalty: -0.4,
                ..SamplingParams::default()
            },
            prompt: Vec::new(),
            output: vec![4, 4, 30],
        },
        Case {
            name: "combined",
            params: SamplingParams {
                temperature: 0.8,
                top_k: 20,
                top_p: 0.9,
                min_p: 0.05,
                repetition_penalty: 1.2,
                presence_penalty: 0.3,
                frequency_penalty: 0.2,
                logit_bias: vec![(10, 2.0), (25, -1.5), (44, 3.0)],
                min_tokens: 8,
                stop_token_ids: vec![6],
                eos_token_ids: vec![0],
                ..SamplingParams::default()
            },
            prompt: vec![1, 6, 10, 22, 23],
            output: vec![10, 13, 13, 44],
        },
    ]
}

#[test]
fn sampled_frequencies_match_target_distributions() {
    let logits = synthetic_logits(VOCAB, 1.5, 2024);
    let mut cases = vec![
        case("temperature 1.0", SamplingParams::default()),
        case("temperature 0.7", with_temp(0.7)),
        case("temperature 1.3", with_temp(1.3)),
        case(
            "top_k 5",
            SamplingParams {
                top_k: 5,
                ..SamplingParams::default()
            },
        ),
        case(
            "top_p 0.8",
            SamplingParams {
                top_p: 0.8,
                ..SamplingParams::default()
            },
        ),
        case(
            "min_p 0.1",
            SamplingParams {
                min_p: 0.1,
                ..SamplingParams::default()
            },
        ),
        case(
            "logit_bias",
            SamplingParams {
                logit_bias: vec![(3, 4.0), (17, -100.0), (30, 2.5), (30, 0.5), (48, -2.0)],
                ..SamplingParams::default()
            },
        ),
        case(
            "top_k 10 + top_p 0.7 @ T0.9",
            SamplingParams {
                temperature: 0.9,
                top_k: 10,
                top_p: 0.7,
                ..SamplingParams::default()
            },
        ),
    ];
    cases.extend(history_cases());
    for (i, c) in cases.iter().enumerate() {
        check(&logits, c, 1000 + i as u64);
    }
}

#[test]
fn flat_peaked_and_large_rows_match_too() {
    // A near-uniform row (many tokens inside the nucleus), a peaked one, and a 1000-token
    // row whose nucleus is larger than the sampler's first sorted batch of 64.
    let rows = [
        ("flat row, top_p 0.5", VOCAB, 0.2f32, 0.5f32, 5u64),
        ("peaked row, top_p 0.99", VOCAB, 3.0, 0.99, 6),
        ("1000 tokens, top_p 0.9", 1000, 0.5, 0.9, 7),
    ];
    for (name, vocab, scale, top_p, seed) in rows {
        let logits = synthetic_logits(vocab, scale, seed);
        let c = case(
            name,
            SamplingParams {
                top_p,
                ..SamplingParams::default()
            },
        );
        let target = target_distribution(&logits, &c.params, &[], &[], 0);
        assert!(
            target.iter().filter(|&&p| p > 0.0).count() > 1,
            "{name}: degenerate"
        );
        check(&logits, &c, 77 + seed);
    }
}

#[test]
fn chi_square_detects_a_wrong_temperature() {
    // Negative control: draws at T = 0.7 must be rejected against the T = 0.75 target.
    let logits = synthetic_logits(VOCAB, 1.5, 2024);
    let drawn = case("T 0.7", with_temp(0.7));
    let counts = draw_counts(&logits, &drawn, 1);
    let wrong = target_distribution(&logits, &with_temp(0.75), &[], &[], 0);
    let f = fit(&counts, &wrong);
    eprintln!(
        "negative control: chi2 {:.1} p {:e} TV {:.4}",
        f.chi2, f.p_value, f.tv_distance
    );
    assert!(
        f.p_value < MIN_P_VALUE,
        "the test has no power: p = {}",
        f.p_value
    );
}

#[test]
fn chi_square_detects_an_off_by_one_nucleus() {
    // Negative control: the top-p draws against a target that keeps one token more.
    let logits = synthetic_logits(VOCAB, 1.5, 2024);
    let params = SamplingParams {
        top_p: 0.8,
        ..SamplingParams::default()
    };
    let counts = draw_counts(&logits, &case("top_p", params.clone()), 3);
    let full = target_distribution(&logits, &SamplingParams::default(), &[], &[], 0);
    let kept = target_distribution(&logits, &params, &[], &[], 0);
    let k = kept.iter().filter(|&&p| p > 0.0).count();
    let wider = SamplingParams {
        top_k: k as i32 + 1,
        ..SamplingParams::default()
    };
    let wrong = target_distribution(&logits, &wider, &[], &[], 0);
    assert!(full.len() > k + 1);
    let f = fit(&counts, &wrong);
    assert!(
        f.p_value < MIN_P_VALUE,
        "the test has no power: p = {}",
        f.p_value
    );
}

#[test]
fn greedy_is_the_argmax_every_time() {
    let logits = synthetic_logits(VOCAB, 1.5, 9);
    let mut state = SamplerState::new(0, &[]);
    let want = target_distribution(&logits, &SamplingParams::greedy(), &[], &[], 0);
    for _ in 0..1000 {
        let s = sample(&logits, &SamplingParams::greedy(), &mut state, 0).expect("finite");
        assert_eq!(want[s.token as usize], 1.0);
    }
}

#[test]
fn chi_square_routine_matches_known_values() {
    // Closed form for even df: sf(x, 2m) = e^{-x/2} sum_{j<m} (x/2)^j / j!.
    assert!((chi2_sf(10.0, 4) - 6.0 * (-5.0f64).exp()).abs() < 1e-13);
    assert!((chi2_sf(2.0, 2) - (-1.0f64).exp()).abs() < 1e-14);
    // Tabulated 5% critical values.
    assert!((chi2_sf(3.841_458_820_694_124, 1) - 0.05).abs() < 1e-9);
    assert!((chi2_sf(18.307_038_053_275_146, 10) - 0.05).abs() < 1e-9);
    assert!((chi2_sf(67.504_806_585_615_3, 50) - 0.05).abs() < 1e-9);
    assert!((ln_gamma(5.0) - 24f64.ln()).abs() < 1e-13);
    assert!((ln_gamma(0.5) - std::f64::consts::PI.sqrt().ln()).abs() < 1e-13);
    assert!((gamma_q(1.0, 3.0) - (-3.0f64).exp()).abs() < 1e-14);
}
