//! Statistical test of the speculative verifier (ARCHITECTURE.md § Invariants, 6): for synthetic
//! target rows and draft distributions, including adversarial pairs (draft mass where the target
//! has none, one-hot drafts on impossible tokens), drafts are drawn from `q` and judged by
//! `verify`; the first emitted token must follow the processed target distribution `p` computed
//! independently by `sampler_reference`, and so must the second emitted token given the first (its
//! history includes the first, for the penalties). 100,000 draws per case, chi-square p > 1e-3; the
//! total-variation distance is printed.

mod sampler_reference;

use sampler_reference::{fit, synthetic_logits, target_distribution};
use tandem_engine::sampler::{SamplerState, SamplingParams, StreamRng, TokenDistribution};
use tandem_engine::speculative::verify::{verify, DraftRows, Limits};

const VOCAB: usize = 24;
const DRAWS: usize = 100_000;
const MIN_P_VALUE: f64 = 1e-3;

/// How the draft distribution of a case is built from the target row.
enum Draft {
    /// softmax of another random row.
    Other(u64),
    /// Uniform over the tokens the target gives probability 0 (its whole mass is wasted).
    WhereTargetIsZero,
    /// Half on the target's least likely tokens (including impossible ones), half uniform.
    Skewed,
    /// Certain drafts (n-gram): always this token.
    Certain(u32),
}

struct Case {
    name: &'static str,
    params: SamplingParams,
    prompt: Vec<u32>,
    output: Vec<u32>,
    draft: Draft,
}

fn softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    row.iter().map(|&v| (v as f64 - max).exp()).collect()
}

fn draft_dist(d: &Draft, target: &[f64]) -> Option<TokenDistribution> {
    let w = match d {
        Draft::Other(seed) => softmax(&synthetic_logits(VOCAB, 2.0, *seed)),
        Draft::WhereTargetIsZero => target
            .iter()
            .map(|&p| if p == 0.0 { 1.0 } else { 0.0 })
            .collect(),
        Draft::Skewed => {
            let mut order: Vec<usize> = (0..VOCAB).collect();
            order.sort_by(|&a, &b| target[a].total_cmp(&target[b]));
            let mut w = vec![0.5 / VOCAB as f64; VOCAB];
            for &i in &order[..6] {
                w[i] += 0.5 / 6.0;
            }
            w
        }
        Draft::Certain(_) => return None,
    };
    Some(TokenDistribution::from_weights(w).expect("some draft mass"))
}

/// Runs `DRAWS` verifications of two drafts; returns counts of the first emitted token and,
/// per first token, counts of the second.
fn run(case: &Case, rows: &[Vec<f32>; 3], seed: u64) -> (Vec<u64>, Vec<Vec<u64>>) {
    let n_out = case.output.len();
    let p0 = target_distribution(&rows[0], &case.params, &case.prompt, &case.output, n_out);
    let q0 = draft_dist(&case.draft, &p0);
    // The second position's draft: same construction against the first position's target.
    let q1 = q0.clone();
    let dists = q0
        .as_ref()
        .zip(q1.as_ref())
        .map(|(a, b)| vec![a.clone(), b.clone()]);
    let mut state = SamplerState::new(seed, &case.prompt);
    for &t in &case.output {
        state.append_output(t);
    }
    let mut draft_rng = StreamRng::new(seed ^ 0xd4af);
    let row_refs: Vec<&[f32]> = rows.iter().map(|r| &r[..]).collect();
    let never = |_: u32| false;
    let limits = Limits {
        max_new: 3,
        is_stop: &never,
    };
    let mut first = vec![0u64; VOCAB];
    let mut second = vec![vec![0u64; VOCAB]; VOCAB];
    for _ in 0..DRAWS {
        let drafts: Vec<u32> = match (&case.draft, &dists) {
            (Draft::Certain(t), _) => vec![*t, *t],
            (_, Some(q)) => q
                .iter()
                .map(|q| q.draw(draft_rng.next_f64()).expect("mass"))
                .collect(),
            _ => unreachable!("non-certain drafts have distributions"),
        };
        let d = DraftRows {
            rows: &row_refs,
            drafts: &drafts,
            dists: dists.as_deref(),
        };
        let out = verify(d, &case.params, &mut state, n_out, &limits).expect("finite rows");
        first[out[0].token as usize] += 1;
        if let Some(t) = out.get(1) {
            second[out[0].token as usize][t.token as usize] += 1;
        }
    }
    (first, second)
}

fn check(case: &Case, seed: u64) {
    let rows = [
        synthetic_logits(VOCAB, 1.5, seed),
        synthetic_logits(VOCAB, 1.5, seed + 1),
        synthetic_logits(VOCAB, 1.5, seed + 2),
    ];
    let (first, second) = run(case, &rows, seed);
    let n_out = case.output.len();
    let p0 = target_distribution(&rows[0], &case.params, &case.prompt, &case.output, n_out);
    report_and_assert(case.name, "first", &first, &p0);
    // The second token given the most frequent first token (when it was accepted).
    let t0 = (0..VOCAB)
        .max_by_key(|&t| second[t].iter().sum::<u64>())
        .expect("vocab");
    let mut history = case.output.clone();
    history.push(t0 as u32);
    let p1 = target_distribution(&rows[1], &case.params, &case.prompt, &history, n_out + 1);
    if second[t0].iter().sum::<u64>() >= 2_000 {
        report_and_assert(case.name, "second|first", &second[t0], &p1);
    }
}

fn report_and_assert(name: &str, what: &str, counts: &[u64], target: &[f64]) {
    let f = fit(counts, target);
    let n: u64 = counts.iter().sum();
    eprintln!(
        "{name:<34} {what:<13} n {n:>6}  chi2 {:>7.2}  df {:>2}  p {:.4}  TV {:.5}",
        f.chi2, f.df, f.p_value, f.tv_distance
    );
    assert_eq!(
        f.impossible, 0,
        "{name} {what}: emitted a token of probability 0"
    );
    assert!(
        f.p_value > MIN_P_VALUE,
        "{name} {what}: chi-square p = {} (chi2 {}, df {})",
        f.p_value,
        f.chi2,
        f.df
    );
}

fn cases() -> Vec<Case> {
    let plain = |name, draft| Case {
        name,
        params: SamplingParams::default(),
        prompt: Vec::new(),
        output: Vec::new(),
        draft,
    };
    let top_k = SamplingParams {
        temperature: 0.8,
        top_k: 6,
        ..SamplingParams::default()
    };
    vec![
        plain("T=1, draft = another model", Draft::Other(99)),
        plain("T=1, skewed draft", Draft::Skewed),
        plain("T=1, certain draft (n-gram)", Draft::Certain(3)),
        Case {
            name: "top-k 6: draft only where p = 0",
            params: top_k.clone(),
            prompt: Vec::new(),
            output: Vec::new(),
            draft: Draft::WhereTargetIsZero,
        },
        Case {
            name: "top-k 6: skewed draft",
            params: top_k.clone(),
            prompt: Vec::new(),
            output: Vec::new(),
            draft: Draft::Skewed,
        },
        Case {
            name: "top-k 6: certain impossible draft",
            params: top_k,
            prompt: Vec::new(),
            output: Vec::new(),
            draft: Draft::Certain(VOCAB as u32 - 1),
        },
        Case {
            name: "penalties, top-p, min-p, bias",
            params: SamplingParams {
                temperature: 1.2,
                top_p: 0.9,
                min_p: 0.02,
                repetition_penalty: 1.3,
                presence_penalty: 0.5,
                frequency_penalty: 0.4,
                logit_bias: vec![(2, 2.0), (7, -3.0)],
                ..SamplingParams::default()
            },
            prompt: vec![1, 2, 5, 9],
            output: vec![2, 2, 11],
            draft: Draft::Other(7),
        },
    ]
}

#[test]
fn verified_tokens_follow_the_target_distribution() {
    for (i, case) in cases().iter().enumerate() {
        check(case, 1_000 + 17 * i as u64);
    }
}

#[test]
fn greedy_verification_always_emits_the_argmax() {
    let row = synthetic_logits(VOCAB, 1.5, 5);
    let argmax = (0..VOCAB)
        .max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))
        .expect("vocab") as u32;
    let q = TokenDistribution::from_weights(vec![1.0; VOCAB]).expect("uniform");
    let mut state = SamplerState::new(0, &[]);
    let never = |_: u32| false;
    let limits = Limits {
        max_new: 2,
        is_stop: &never,
    };
    let rows: Vec<&[f32]> = vec![&row, &row];
    for d in 0..VOCAB as u32 {
        let dists = [q.clone()];
        let out = verify(
            DraftRows {
                rows: &rows,
                drafts: &[d],
                dists: Some(&dists),
            },
            &SamplingParams::greedy(),
            &mut state,
            0,
            &limits,
        )
        .expect("finite");
        assert_eq!(out[0].token, argmax, "draft {d}");
        assert_eq!(out.len(), if d == argmax { 2 } else { 1 });
    }
}
