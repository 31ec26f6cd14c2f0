//! `sample_rows`: the token each row draws equals the host reference's
//! (`tandem_model::row_sampling::pick`) for the same parameters and uniform number, over
//! greedy rows, every truncation alone and combined, ties at the top-k and top-p
//! boundaries, uniform numbers at both ends of [0, 1), and random settings over rows of a
//! larger vocabulary.

use super::*;
use tandem_model::batch::TokenId;
use tandem_model::row_sampling::{pick, RowSampling};

use crate::row_kernels::row_sampling_bytes;

const VOCAB: usize = 1000;

fn params(temperature: f32, top_k: i32, top_p: f32, min_p: f32) -> RowSampling {
    RowSampling {
        temperature,
        top_k,
        top_p,
        min_p,
        uniform: 0.0,
    }
}

/// Draws `rows[i]` from `logits[i]` (each `VOCAB` long) on the emulator.
fn run(logits: &[Vec<f32>], rows: &[RowSampling]) -> Vec<i32> {
    run_vocab(logits, rows, VOCAB)
}

fn run_vocab(logits: &[Vec<f32>], rows: &[RowSampling], vocab: usize) -> Vec<i32> {
    let k = kernels(CudaDtype::Bf16);
    let flat: Vec<f32> = logits.iter().flatten().copied().collect();
    let bytes: Vec<u8> = rows.iter().flat_map(row_sampling_bytes).collect();
    let (mut l, mut p) = (Buf::of(&flat), Buf::of(&bytes));
    let mut t = Buf::zeroed(rows.len() * 4);
    k.sample_rows(l.ptr(), p.ptr(), rows.len(), vocab, t.ptr())
        .expect("launch");
    t.read()
}

#[test]
fn draws_equal_the_host_reference() {
    let mut r = rng(21);
    let smooth = normal_ish(&mut r, VOCAB, 3.0);
    // Values on a coarse grid: many ties, also at the truncation boundaries.
    let coarse: Vec<f32> = normal_ish(&mut r, VOCAB, 3.0)
        .iter()
        .map(|v| (v * 2.0).round() / 2.0)
        .collect();
    let mut zeros = smooth.iter().map(|v| -v.abs()).collect::<Vec<f32>>();
    (zeros[10], zeros[20]) = (-0.0, 0.0);
    let configs = [
        params(0.0, 0, 1.0, 0.0),
        params(0.7, 0, 1.0, 0.0),
        params(1.0, 5, 1.0, 0.0),
        params(1.0, 1, 1.0, 0.0),
        params(1.0, VOCAB as i32 + 10, 1.0, 0.0),
        params(0.8, 0, 0.9, 0.0),
        params(1.3, 50, 0.3, 0.0),
        params(1.0, 0, 1.0, 0.1),
        params(0.6, 40, 0.8, 0.05),
        params(2.0, 7, 0.5, 0.0),
    ];
    let uniforms = [0.0, 1e-9, 0.1, 0.25, 0.5, 0.618, 0.9, 0.999_999];
    let (mut logits, mut rows) = (Vec::new(), Vec::new());
    for base in [&smooth, &coarse, &zeros] {
        for c in &configs {
            for &u in &uniforms {
                logits.push(base.clone());
                rows.push(RowSampling { uniform: u, ..*c });
            }
        }
    }
    let got = run(&logits, &rows);
    for (i, (row, s)) in logits.iter().zip(&rows).enumerate() {
        let want = pick(row, s).map_or(-1, |TokenId(t)| t as i32);
        assert_eq!(got[i], want, "row {i}: {s:?}");
    }
    // The draws do spread: a sampled configuration picks several distinct tokens.
    let sampled: std::collections::HashSet<i32> = got[8..16].iter().copied().collect();
    assert!(sampled.len() > 3, "{sampled:?}");
}

#[test]
fn rows_with_nan_or_plus_infinity_draw_nothing_and_minus_infinity_is_never_drawn() {
    let base = normal_ish(&mut rng(22), VOCAB, 1.0);
    let with = |at: &[(usize, f32)]| {
        let mut row = base.clone();
        at.iter().for_each(|&(i, v)| row[i] = v);
        row
    };
    let top = base.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let best = base.iter().position(|&v| v == top).expect("a maximum");
    let logits = [
        with(&[(3, f32::NAN)]),
        with(&[(3, f32::INFINITY)]),
        vec![f32::NEG_INFINITY; VOCAB],
        with(&[(best, f32::NEG_INFINITY)]), // greedy takes the next best
        with(&[(4, f32::NEG_INFINITY), (5, f32::NEG_INFINITY)]),
    ];
    let rows = [
        params(1.0, 0, 1.0, 0.0),
        params(0.0, 0, 1.0, 0.0),
        params(1.0, 0, 1.0, 0.0),
        params(0.0, 0, 1.0, 0.0),
        params(1.0, VOCAB as i32 - 1, 0.9, 0.0),
    ];
    let got = run(&logits, &rows);
    assert_eq!(&got[..3], &[-1, -1, -1]);
    for r in 3..5 {
        let want = pick(&logits[r], &rows[r]).map_or(-1, |TokenId(t)| t as i32);
        assert_eq!(got[r], want, "row {r}");
        assert!(want >= 0 && logits[r][want as usize].is_finite());
    }
    assert_ne!(got[3], best as i32);
}

/// Rows of 6,000 logits shaped as a model's are (peaked, spread, or on a coarse grid with
/// long runs of equal values), each with random settings (top-k alone, top-p alone, both,
/// with min-p) and its own uniform number: every token is the host reference's. The top-p
/// boundary falls in a different digit of the key in each row, so every pass of the
/// search decides.
#[test]
fn random_settings_over_a_larger_vocabulary_draw_the_host_references_tokens() {
    const V: usize = 6000;
    let mut r = rng(23);
    let (mut logits, mut rows) = (Vec::new(), Vec::new());
    for i in 0..120 {
        let mut row = normal_ish(&mut r, V, [0.5, 3.0, 9.0][i % 3]);
        if i % 4 == 1 {
            row.iter_mut().for_each(|v| *v = (*v * 4.0).round() / 4.0);
        }
        let top_k = match i % 5 {
            0 | 1 => r.random_range(1..400),
            _ => 0,
        };
        let top_p = match i % 5 {
            1..=3 => r.random_range(0.02f32..0.999),
            _ => 1.0,
        };
        rows.push(RowSampling {
            temperature: [0.25f32, 0.7, 1.0, 1.6][r.random_range(0..4)],
            top_k,
            top_p,
            min_p: if i % 7 == 3 {
                r.random_range(0.0f32..0.3)
            } else {
                0.0
            },
            uniform: r.random::<f64>(),
        });
        logits.push(row);
    }
    let got = run_vocab(&logits, &rows, V);
    let mut distinct = std::collections::HashSet::new();
    for (i, (row, s)) in logits.iter().zip(&rows).enumerate() {
        let want = pick(row, s).map_or(-1, |TokenId(t)| t as i32);
        assert_eq!(got[i], want, "row {i}: {s:?}");
        distinct.insert(want);
    }
    assert!(distinct.len() > 60, "the draws spread: {}", distinct.len());
}
