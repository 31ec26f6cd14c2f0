//! `logit_exp_sums`: per row the maximum, the softmax sum and the target's logit, bitwise
//! what the host computes (`tandem_kernels::exp_sum`), so that log-probs scored on the
//! device equal the host's; and with the targets `sample_rows` chooses at temperature 0,
//! the greedy picks the runner returns, equal to the host's (`TokenPick::greedy`).

use super::*;
use tandem_model::row_sampling::RowSampling;
use tandem_model::token_pick::TokenPick;

use crate::row_kernels::row_sampling_bytes;

struct Stats {
    max: Vec<f32>,
    sum: Vec<f64>,
    target: Vec<f32>,
    /// The targets as the kernels saw them (the chosen tokens for greedy runs).
    tokens: Vec<i32>,
}

/// `logit_exp_sums` of `rows` rows with `targets`, or with none, or (`greedy`) with the
/// tokens `sample_rows` picks at temperature 0, as the runner's greedy picks run.
fn run(logits: &[f32], targets: Option<&[i32]>, greedy: bool, rows: usize, vocab: usize) -> Stats {
    // The program's numeric mode does not touch these kernels (f32 logits, f64 sums).
    let k = kernels(CudaDtype::Bf16);
    let mut l = Buf::of(logits);
    let mut t = Buf::of(&targets.map_or(vec![-1; rows], |t| t.to_vec()));
    if greedy {
        let zero = RowSampling {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            uniform: 0.0,
        };
        let bytes: Vec<u8> = (0..rows).flat_map(|_| row_sampling_bytes(&zero)).collect();
        let mut p = Buf::of(&bytes);
        k.sample_rows(l.ptr(), p.ptr(), rows, vocab, t.ptr())
            .expect("launch");
    }
    let (mut m, mut s, mut x) = (
        Buf::zeroed(rows * 4),
        Buf::zeroed(rows * 8),
        Buf::zeroed(rows * 4),
    );
    let tp = if targets.is_some() || greedy {
        t.ptr()
    } else {
        0
    };
    k.logit_exp_sums(l.ptr(), tp, rows, vocab, m.ptr(), s.ptr(), x.ptr())
        .expect("launch");
    Stats {
        max: m.read(),
        sum: s.read(),
        target: x.read(),
        tokens: t.read(),
    }
}

#[test]
fn sums_and_greedy_picks_are_bitwise_the_hosts_for_any_vocabulary_size() {
    // One element; fewer than a tile; a tile and a bit; SmolLM2's vocabulary.
    for vocab in [1usize, 7, 2049, 49_152] {
        let rows = 3;
        let mut logits = normal_ish(&mut rng(vocab as u64), rows * vocab, 8.0);
        if vocab > 1000 {
            // Row 1: the maximum twice, at two different threads' indices; row 2: the
            // largest values are zeros of both signs.
            logits[vocab + 900] = 99.0;
            logits[vocab + 300] = 99.0;
            let row2 = &mut logits[2 * vocab..];
            row2.iter_mut().for_each(|v| *v = -v.abs());
            row2[700] = 0.0;
            row2[500] = -0.0;
        }
        let targets: Vec<i32> = (0..rows as i32)
            .map(|r| (r * 7919) % vocab as i32)
            .collect();
        let st = run(&logits, Some(&targets), false, rows, vocab);
        let gr = run(&logits, None, true, rows, vocab);
        for r in 0..rows {
            let row = &logits[r * vocab..(r + 1) * vocab];
            let host_max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let what = format!("vocab {vocab} row {r}");
            assert_eq!(st.max[r], host_max, "{what}: max");
            let host_sum = tandem_kernels::exp_sum::exp_sum(row, host_max);
            assert_eq!(st.sum[r].to_bits(), host_sum.to_bits(), "{what}: sum");
            assert_eq!(st.target[r], row[targets[r] as usize], "{what}: target");
            let pick =
                TokenPick::from_stats(gr.tokens[r] as i64, gr.target[r], gr.max[r], gr.sum[r]);
            assert_eq!(pick, TokenPick::greedy(row), "{what}: greedy pick");
        }
        if vocab > 1000 {
            assert_eq!(
                (gr.tokens[1], gr.tokens[2]),
                (300, 500),
                "ties go to the lowest id"
            );
        }
    }
}

#[test]
fn rows_with_a_nan_or_infinity_have_a_zero_sum_no_target_and_no_pick() {
    let vocab = 300;
    let mut logits = normal_ish(&mut rng(9), 3 * vocab, 1.0);
    logits[5] = f32::NAN;
    logits[vocab + 299] = f32::INFINITY;
    let st = run(&logits, Some(&[0, 1, -1]), false, 3, vocab);
    assert_eq!((st.sum[0], st.sum[1]), (0.0, 0.0), "non-finite rows");
    assert_eq!(
        (st.target[0], st.target[1]),
        (0.0, 0.0),
        "non-finite rows' targets"
    );
    let gr = run(&logits, None, true, 3, vocab);
    assert_eq!(
        (gr.tokens[0], gr.tokens[1]),
        (-1, -1),
        "non-finite rows' greedy picks"
    );
    assert!(st.sum[2] > 1.0, "a finite row sums at least exp(0) = 1");
    assert_eq!(st.target[2], 0.0, "a negative target reads no logit");
    let no_targets = run(&logits, None, false, 3, vocab);
    assert_eq!(
        no_targets.target,
        vec![0.0; 3],
        "no targets: no target logits"
    );
    assert_eq!(no_targets.sum[2].to_bits(), st.sum[2].to_bits());
}
