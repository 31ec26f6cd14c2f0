//! Independent f64 references for the sampler tests: the target distribution written
//! straight from the documented semantics (full sorts, explicit renormalisation), and a
//! chi-square goodness-of-fit test with its own incomplete-gamma routine.
#![allow(dead_code)] // each test binary uses a different subset

use std::collections::{HashMap, HashSet};

use tandem_engine::sampler::{SamplingParams, StreamRng};

/// Processed logits (steps 1-4 of the documented order) in f64.
pub fn processed_logits(
    logits: &[f32],
    p: &SamplingParams,
    prompt: &[u32],
    output: &[u32],
    num_output: usize,
) -> Vec<f64> {
    let mut l: Vec<f64> = logits.iter().map(|&v| v as f64).collect();
    for &(id, b) in &p.logit_bias {
        l[id as usize] += b as f64;
    }
    if num_output < p.min_tokens {
        for &id in &p.stop_token_ids {
            l[id as usize] = f64::NEG_INFINITY;
        }
        if !p.ignore_eos {
            for &id in &p.eos_token_ids {
                l[id as usize] = f64::NEG_INFINITY;
            }
        }
    }
    let seen: HashSet<u32> = prompt.iter().chain(output).copied().collect();
    let r = p.repetition_penalty as f64;
    for &id in &seen {
        let v = &mut l[id as usize];
        *v = if *v > 0.0 { *v / r } else { *v * r };
    }
    let mut counts: HashMap<u32, u32> = HashMap::new();
    for &t in output {
        *counts.entry(t).or_default() += 1;
    }
    for (&id, &c) in &counts {
        l[id as usize] -= p.presence_penalty as f64 + p.frequency_penalty as f64 * c as f64;
    }
    l
}

/// Normalises `w` in place (entries that are zero stay zero).
fn normalise(w: &mut [f64]) {
    let s: f64 = w.iter().sum();
    for x in w.iter_mut() {
        *x /= s;
    }
}

/// Ids sorted by `w` descending, ties to the lower id.
fn order_desc(w: &[f64]) -> Vec<usize> {
    let mut ids: Vec<usize> = (0..w.len()).collect();
    ids.sort_by(|&a, &b| w[b].partial_cmp(&w[a]).expect("no NaN").then(a.cmp(&b)));
    ids
}

/// The exact distribution the sampler should draw from, per the documented semantics.
pub fn target_distribution(
    logits: &[f32],
    p: &SamplingParams,
    prompt: &[u32],
    output: &[u32],
    num_output: usize,
) -> Vec<f64> {
    let l = processed_logits(logits, p, prompt, output, num_output);
    let n = l.len();
    let max = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if p.temperature == 0.0 {
        let best = (0..n).find(|&i| l[i] == max).expect("a maximum");
        let mut one_hot = vec![0.0; n];
        one_hot[best] = 1.0;
        return one_hot;
    }
    let t = p.temperature as f64;
    let mut prob: Vec<f64> = l.iter().map(|&v| ((v - max) / t).exp()).collect();
    normalise(&mut prob);
    let order = order_desc(&l);
    if p.top_k >= 1 {
        for &id in order.iter().skip(p.top_k as usize) {
            prob[id] = 0.0;
        }
        normalise(&mut prob);
    }
    if p.top_p < 1.0 {
        let mut before = 0.0;
        for &id in &order {
            let keep = before < p.top_p as f64;
            before += prob[id];
            if !keep {
                prob[id] = 0.0;
            }
        }
        normalise(&mut prob);
    }
    if p.min_p > 0.0 {
        let top = prob.iter().copied().fold(0.0, f64::max);
        for x in prob.iter_mut() {
            if *x < p.min_p as f64 * top {
                *x = 0.0;
            }
        }
        normalise(&mut prob);
    }
    prob
}

/// `ln Γ(x)` for `x > 0` (Lanczos approximation, g = 7, 9 terms; ~1e-15 relative).
pub fn ln_gamma(x: f64) -> f64 {
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x) Γ(1-x) = π / sin(πx).
        return (std::f64::consts::PI / (std::f64::consts::PI * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = C[0];
    let t = x + 7.5;
    for (i, &c) in C.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// Regularised upper incomplete gamma `Q(a, x) = Γ(a, x) / Γ(a)`.
pub fn gamma_q(a: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 1.0;
    }
    let log_prefix = a * x.ln() - x - ln_gamma(a);
    if x < a + 1.0 {
        // Series: P(a, x) = e^-x x^a / Γ(a+1) * sum_n x^n / ((a+1)...(a+n)).
        let (mut term, mut sum, mut ap) = (1.0 / a, 1.0 / a, a);
        for _ in 0..10_000 {
            ap += 1.0;
            term *= x / ap;
            sum += term;
            if term.abs() < sum.abs() * 1e-16 {
                break;
            }
        }
        1.0 - sum * log_prefix.exp()
    } else {
        // Continued fraction for Q (modified Lentz).
        let tiny = 1e-300;
        let mut b = x + 1.0 - a;
        let mut c = 1.0 / tiny;
        let mut d = 1.0 / b;
        let mut h = d;
        for i in 1..10_000 {
            let an = -(i as f64) * (i as f64 - a);
            b += 2.0;
            d = an * d + b;
            d = if d.abs() < tiny { tiny } else { d };
            c = b + an / c;
            c = if c.abs() < tiny { tiny } else { c };
            d = 1.0 / d;
            let delta = d * c;
            h *= delta;
            if (delta - 1.0).abs() < 1e-16 {
                break;
            }
        }
        h * log_prefix.exp()
    }
}

/// Survival function of the chi-square distribution with `df` degrees of freedom.
pub fn chi2_sf(stat: f64, df: usize) -> f64 {
    gamma_q(df as f64 / 2.0, stat / 2.0)
}

/// Result of comparing observed counts with a target distribution.
#[derive(Debug)]
pub struct Fit {
    pub chi2: f64,
    pub df: usize,
    pub p_value: f64,
    pub tv_distance: f64,
    /// Samples that fell on tokens of target probability zero.
    pub impossible: u64,
}

/// Chi-square goodness of fit: bins with expected count < 5 are pooled into one bin
/// (the pool is merged into the smallest bin if it is itself still < 5).
pub fn fit(counts: &[u64], target: &[f64]) -> Fit {
    let n: u64 = counts.iter().sum();
    let nf = n as f64;
    let impossible = counts
        .iter()
        .zip(target)
        .filter(|(_, &p)| p == 0.0)
        .map(|(&c, _)| c)
        .sum();
    let tv_distance = 0.5
        * counts
            .iter()
            .zip(target)
            .map(|(&c, &p)| (c as f64 / nf - p).abs())
            .sum::<f64>();
    let mut bins: Vec<(f64, f64)> = Vec::new(); // (observed, expected)
    let mut pool = (0.0, 0.0);
    for (&c, &p) in counts.iter().zip(target) {
        let e = p * nf;
        if e >= 5.0 {
            bins.push((c as f64, e));
        } else {
            pool = (pool.0 + c as f64, pool.1 + e);
        }
    }
    if pool.1 > 0.0 {
        if pool.1 >= 5.0 || bins.is_empty() {
            bins.push(pool);
        } else {
            let smallest = (0..bins.len())
                .min_by(|&a, &b| bins[a].1.total_cmp(&bins[b].1))
                .expect("non-empty");
            bins[smallest].0 += pool.0;
            bins[smallest].1 += pool.1;
        }
    }
    let chi2: f64 = bins.iter().map(|&(o, e)| (o - e) * (o - e) / e).sum();
    let df = bins.len().saturating_sub(1).max(1);
    Fit {
        chi2,
        df,
        p_value: chi2_sf(chi2, df),
        tv_distance,
        impossible,
    }
}

/// `n` logits drawn from N(0, scale^2) with Box-Muller over a fixed stream.
pub fn synthetic_logits(n: usize, scale: f32, seed: u64) -> Vec<f32> {
    let mut r = StreamRng::new(seed);
    (0..n)
        .map(|_| {
            let u1 = 1.0 - r.next_f64(); // (0, 1]
            let u2 = r.next_f64();
            let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            (z as f32) * scale
        })
        .collect()
}
