//! Choosing the token from processed logits: greedy argmax, or temperature -> top-k ->
//! top-p -> min-p -> one inverse-CDF draw. Everything is f64.

use std::cmp::Ordering;

use tandem_kernels::sampling_weights;

use super::draw::{draw_listed, draw_row};
use super::nucleus;
use super::params::SamplingParams;

/// The id of the largest value, ties broken by the lowest id; `None` when every value is
/// `-inf`. `values`: `[vocab_size]`, no NaN.
pub(crate) fn argmax(values: &[f64]) -> Option<u32> {
    let mut best: Option<(usize, f64)> = None;
    for (i, &v) in values.iter().enumerate() {
        if v > f64::NEG_INFINITY && best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map(|(i, _)| i as u32)
}

/// Orders ids by descending value, then ascending id (a total order, NaN-free input).
pub(super) fn by_value_desc(values: &[f64]) -> impl Fn(&u32, &u32) -> Ordering + '_ {
    move |a, b| {
        values[*b as usize]
            .total_cmp(&values[*a as usize])
            .then(a.cmp(b))
    }
}

/// Random sampling from processed logits `values` (`[vocab_size]`, finite or `-inf`) with
/// the uniform draw `u` in `[0, 1)`. `candidates` is scratch. On return `values` holds
/// unnormalised weights for the surviving candidates. `None` when every value is `-inf`.
///
/// Steps (with `T` = temperature > 0, `l` = processed logits):
/// 1. candidates = tokens with `l > -inf`;
/// 2. top-k: keep the `k` largest `l` (ties to the lower id), exactly `k` tokens;
/// 3. weights `w = exp((l - max l) / T)` (so the most likely token weighs exactly 1);
/// 4. top-p: sort by `w` descending (ties to the lower id) and keep each token whose
///    preceding mass is `< top_p * sum(w)`, i.e. the shortest prefix reaching `top_p`;
/// 5. min-p: keep tokens with `w >= min_p` (probability >= min_p x the largest one; this
///    ratio does not depend on renormalisation, so min-p commutes with steps 2 and 4);
/// 6. choose, walking the survivors in id order, the first whose cumulative weight exceeds
///    `u * sum(w)` ([`super::draw`]: the cumulative weights summed in blocks). (Id order, not the order truncation leaves them in: it is the order a
///    runner drawing where its logits are walks (`tandem_model::row_sampling`), so a seed
///    draws the same token on either path, up to rounding at a boundary.)
pub(crate) fn sample_random(
    values: &mut [f64],
    candidates: &mut Vec<u32>,
    params: &SamplingParams,
    u: f64,
) -> Option<u32> {
    if cuts_nothing(params, values.len()) {
        // Every finite token survives: weigh the whole row and draw in id order without
        // listing the candidates, the same draw (an `-inf` entry weighs 0, which changes no
        // sum and is never chosen).
        let max = sampling_weights::maximum(values);
        if max == f64::NEG_INFINITY {
            return None;
        }
        sampling_weights::exp_weights(values, max, params.temperature as f64);
        return draw_row(values, u);
    }
    if !truncate(values, candidates, params) {
        return None;
    }
    candidates.sort_unstable();
    draw_listed(values, candidates, u)
}

/// Whether no truncation of `params` can drop a token of a `vocab`-sized row.
fn cuts_nothing(params: &SamplingParams, vocab: usize) -> bool {
    top_k_keeps_all(params, vocab) && params.top_p >= 1.0 && params.min_p <= 0.0
}

/// Whether top-k keeps every token of a `vocab`-sized row.
fn top_k_keeps_all(params: &SamplingParams, vocab: usize) -> bool {
    params.top_k_limit().is_none_or(|k| k >= vocab)
}

/// Steps 1-5 of [`sample_random`]: leaves the survivors in `candidates` and their
/// unnormalised weights in `values` (entries of other ids hold 0 or are left as they were).
/// False when every value is `-inf` (no survivor).
///
/// The weights are `tandem_kernels::sampling_weights`' (an exponential within two ulps of
/// the library's): over the whole row at once, vectorized, unless top-k cut the candidates.
pub(crate) fn truncate(
    values: &mut [f64],
    candidates: &mut Vec<u32>,
    params: &SamplingParams,
) -> bool {
    let max = sampling_weights::maximum(values);
    if max == f64::NEG_INFINITY {
        return false;
    }
    let t = params.temperature as f64;
    let (top_p, min_p) = (params.top_p as f64, params.min_p as f64);
    if top_k_keeps_all(params, values.len()) && (top_p < 1.0 || min_p > 0.0) {
        // Weigh the whole row at once and list only the tokens top-p or min-p can keep
        // (never one that weighs 0: it is never drawn).
        let total = sampling_weights::exp_weights(values, max, t);
        if top_p < 1.0 {
            nucleus::keep_nucleus_of_row(values, candidates, top_p * total);
        } else {
            candidates.clear();
            candidates.extend((0..values.len() as u32).filter(|&id| values[id as usize] >= min_p));
        }
    } else {
        let total = list_weighed(values, candidates, params, max);
        if top_p < 1.0 {
            nucleus::keep_nucleus_of(values, candidates, top_p * total);
        }
    }
    if min_p > 0.0 {
        candidates.retain(|&id| values[id as usize] >= min_p);
    }
    true
}

/// Lists the finite tokens into `candidates`, cuts them to top-k, and weighs them; their
/// total weight.
fn list_weighed(
    values: &mut [f64],
    candidates: &mut Vec<u32>,
    params: &SamplingParams,
    max: f64,
) -> f64 {
    let t = params.temperature as f64;
    candidates.clear();
    candidates.extend(
        values
            .iter()
            .enumerate()
            .filter(|(_, &v)| v > f64::NEG_INFINITY)
            .map(|(i, _)| i as u32),
    );
    let mut whole_row = true;
    if let Some(k) = params.top_k_limit() {
        if k < candidates.len() {
            candidates.select_nth_unstable_by(k - 1, by_value_desc(values));
            candidates.truncate(k);
            whole_row = false;
        }
    }
    if whole_row {
        // Every candidate's weight, and 0 for the `-inf` entries that are not candidates.
        sampling_weights::exp_weights(values, max, t)
    } else {
        let mut total = 0.0;
        for &id in candidates.iter() {
            let w = sampling_weights::exp_weight(values[id as usize], max, t);
            values[id as usize] = w;
            total += w;
        }
        total
    }
}

/// Uniform draws in `[0, 1)` from a xorshift stream (the tests' random rows).
#[cfg(test)]
pub(super) fn xorshift(mut seed: u64) -> impl FnMut() -> f64 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(top_k: i32, top_p: f32, min_p: f32) -> SamplingParams {
        SamplingParams {
            top_k,
            top_p,
            min_p,
            ..SamplingParams::default()
        }
    }

    /// The surviving candidate set for `logits`, sorted by id (u = 0 picks nothing special).
    fn survivors(logits: &[f64], p: &SamplingParams) -> Vec<u32> {
        let mut values = logits.to_vec();
        let mut cands = Vec::new();
        assert!(truncate(&mut values, &mut cands, p), "a candidate");
        cands.sort_unstable();
        cands
    }

    #[test]
    fn a_row_nothing_cuts_draws_as_its_listed_candidates_do() {
        // Logits over 12 orders of magnitude (weights that underflow to 0 included), some
        // `-inf`, at several temperatures and draws: the whole-row draw must pick the token
        // the draw over the listed candidates picks, from the same weights.
        let mut uniform = xorshift(0x9e37_79b9_7f4a_7c15u64);
        for trial in 0..200 {
            let n = 1 + trial * 37 % 3000;
            let row: Vec<f64> = (0..n)
                .map(|_| match uniform() {
                    x if x < 0.1 => f64::NEG_INFINITY,
                    x => (x - 0.5) * if trial % 3 == 0 { 2000.0 } else { 20.0 },
                })
                .collect();
            for t in [0.3f32, 1.0, 1.7] {
                let p = SamplingParams {
                    temperature: t,
                    ..params(-1, 1.0, 0.0)
                };
                let u = uniform();
                let (mut whole, mut listed) = (row.clone(), row.clone());
                let mut cands = Vec::new();
                let picked = sample_random(&mut whole, &mut cands, &p, u);
                let expected = truncate(&mut listed, &mut cands, &p).then(|| {
                    cands.sort_unstable();
                    draw_listed(&listed, &cands, u)
                });
                assert_eq!(picked, expected.flatten(), "trial {trial}, T {t}, u {u}");
                for &id in &cands {
                    let i = id as usize;
                    assert_eq!(whole[i].to_bits(), listed[i].to_bits(), "weight of {id}");
                }
            }
        }
    }

    #[test]
    fn argmax_breaks_ties_to_lowest_id_and_skips_neg_inf() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), Some(1));
        assert_eq!(argmax(&[f64::NEG_INFINITY, -5.0]), Some(1));
        assert_eq!(argmax(&[f64::NEG_INFINITY; 3]), None);
    }

    #[test]
    fn top_k_keeps_exactly_k_with_ties_to_lower_ids() {
        let l = [1.0, 5.0, 3.0, 5.0, 3.0, 0.0];
        assert_eq!(survivors(&l, &params(2, 1.0, 0.0)), vec![1, 3]);
        assert_eq!(survivors(&l, &params(3, 1.0, 0.0)), vec![1, 2, 3]);
        assert_eq!(
            survivors(&l, &params(100, 1.0, 0.0)),
            vec![0, 1, 2, 3, 4, 5]
        );
    }

    #[test]
    fn top_p_keeps_shortest_prefix_reaching_mass() {
        // Probabilities 0.5, 0.25, 0.125, 0.125 (logits ln of them).
        let l: Vec<f64> = [0.5f64, 0.25, 0.125, 0.125]
            .iter()
            .map(|p| p.ln())
            .collect();
        assert_eq!(survivors(&l, &params(-1, 0.5, 0.0)), vec![0]);
        assert_eq!(survivors(&l, &params(-1, 0.6, 0.0)), vec![0, 1]);
        assert_eq!(survivors(&l, &params(-1, 0.75, 0.0)), vec![0, 1]);
        assert_eq!(survivors(&l, &params(-1, 0.8, 0.0)), vec![0, 1, 2]);
        // After top-k = 2 the mass is renormalised: 2/3, 1/3; top_p 0.7 needs both.
        assert_eq!(survivors(&l, &params(2, 0.7, 0.0)), vec![0, 1]);
        assert_eq!(survivors(&l, &params(2, 0.6, 0.0)), vec![0]);
    }

    #[test]
    fn top_p_handles_large_nuclei_and_ties() {
        // 1000 equal logits: top_p 0.5 must keep exactly 500 (ties to lower ids).
        let l = vec![0.0; 1000];
        assert_eq!(
            survivors(&l, &params(-1, 0.5, 0.0)),
            (0..500).collect::<Vec<u32>>()
        );
    }

    #[test]
    fn nucleus_is_the_shortest_descending_prefix_on_varied_distributions() {
        // Logits of a random walk's shape, from peaked to flat (scale), at vocabulary sizes
        // that put the boundary in every part of the exponent buckets; the nucleus must be
        // the definition's, computed by sorting every token.
        let mut uniform = xorshift(0x2545_f491_4f6c_dd1du64);
        let mut checked = 0;
        for case in 0..300 {
            let n = [1, 2, 7, 100, 1000, 20_000][case % 6];
            let scale = [0.1, 1.0, 4.0, 15.0, 60.0][case % 5];
            let top_p = [0.05, 0.5, 0.9, 0.95, 0.999][case % 7 % 5];
            let logits: Vec<f64> = (0..n)
                .map(|i| {
                    let tie = i % 13 == 0; // equal logits across bucket boundaries
                    if tie {
                        0.25 * scale
                    } else {
                        scale * (uniform() - 0.5) * 2.0
                    }
                })
                .collect();
            let p = params(-1, top_p, 0.0);
            let mut weights = logits.clone();
            let mut all = Vec::new();
            assert!(truncate(&mut weights, &mut all, &params(-1, 1.0, 0.0)));
            let total: f64 = weights.iter().sum();
            let mut order: Vec<u32> = (0..n as u32).collect();
            order.sort_by(by_value_desc(&weights));
            let threshold = top_p as f64 * total;
            let (mut above, mut keep) = (0.0, order.len());
            for (r, &id) in order.iter().enumerate() {
                above += weights[id as usize];
                if above >= threshold {
                    keep = r + 1;
                    break;
                }
            }
            if (above - threshold).abs() <= 1e-9 * total {
                continue; // the boundary is a matter of rounding
            }
            let mut want = order[..keep].to_vec();
            want.sort_unstable();
            assert_eq!(
                survivors(&logits, &p),
                want,
                "case {case}: n {n}, scale {scale}, top_p {top_p}"
            );
            checked += 1;
        }
        assert!(
            checked > 250,
            "only {checked} cases away from a rounding boundary"
        );
    }

    #[test]
    fn min_p_is_relative_to_the_top_probability() {
        // Probability ratios to the top: 1, 0.5, 0.2, 0.05.
        let l: Vec<f64> = [1.0f64, 0.5, 0.2, 0.05].iter().map(|r| r.ln()).collect();
        assert_eq!(survivors(&l, &params(-1, 1.0, 0.1)), vec![0, 1, 2]);
        assert_eq!(survivors(&l, &params(-1, 1.0, 0.3)), vec![0, 1]);
    }

    #[test]
    fn temperature_scales_weights() {
        let mut v = vec![0.0, 1.0, -1.0];
        let p = SamplingParams {
            temperature: 0.5,
            ..SamplingParams::default()
        };
        let mut c = Vec::new();
        sample_random(&mut v, &mut c, &p, 0.0);
        let expect = [(-2.0f64).exp(), 1.0, (-4.0f64).exp()];
        for (got, want) in v.iter().zip(expect) {
            assert!((got - want).abs() < 1e-15);
        }
    }
}
