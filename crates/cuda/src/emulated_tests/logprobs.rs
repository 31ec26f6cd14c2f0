//! `logit_exp_sums`: per row the maximum, the softmax sum and the target's logit, bitwise
//! what the host's log-softmax computes (`tandem_kernels::exp_sum`), so that log-probs
//! scored on the device equal those scored on the host.

use super::*;

fn run(logits: &[f32], targets: &[i32], vocab: usize) -> (Vec<f32>, Vec<f64>, Vec<f32>) {
    let rows = targets.len();
    // The program's numeric mode does not touch this kernel (f32 logits, f64 sums).
    let k = kernels(CudaDtype::Bf16);
    let (mut l, mut t) = (Buf::of(logits), Buf::of(targets));
    let (mut m, mut s, mut x) = (
        Buf::zeroed(rows * 4),
        Buf::zeroed(rows * 8),
        Buf::zeroed(rows * 4),
    );
    k.logit_exp_sums(l.ptr(), t.ptr(), rows, vocab, m.ptr(), s.ptr(), x.ptr())
        .expect("launch");
    (m.read(), s.read(), x.read())
}

#[test]
fn sums_are_bitwise_the_hosts_for_any_vocabulary_size() {
    // One element; fewer than a tile; a tile and a bit; SmolLM2's vocabulary.
    for vocab in [1usize, 7, 2049, 49_152] {
        let rows = 3;
        let logits = normal_ish(&mut rng(vocab as u64), rows * vocab, 8.0);
        let targets: Vec<i32> = (0..rows as i32)
            .map(|r| (r * 7919) % vocab as i32)
            .collect();
        let (max, sum, target) = run(&logits, &targets, vocab);
        for r in 0..rows {
            let row = &logits[r * vocab..(r + 1) * vocab];
            let host_max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(
                max[r].to_bits(),
                host_max.to_bits(),
                "vocab {vocab} row {r}: max"
            );
            let host_sum = tandem_kernels::exp_sum::exp_sum(row, host_max);
            assert_eq!(
                sum[r].to_bits(),
                host_sum.to_bits(),
                "vocab {vocab} row {r}: sum"
            );
            assert_eq!(
                target[r], row[targets[r] as usize],
                "vocab {vocab} row {r}: target"
            );
        }
    }
}

#[test]
fn rows_with_a_nan_or_infinity_have_a_zero_sum_and_no_target() {
    let vocab = 300;
    let mut logits = normal_ish(&mut rng(9), 3 * vocab, 1.0);
    logits[5] = f32::NAN;
    logits[vocab + 299] = f32::INFINITY;
    let (_, sum, target) = run(&logits, &[0, 1, -1], vocab);
    assert_eq!((sum[0], sum[1]), (0.0, 0.0), "non-finite rows");
    assert_eq!(
        (target[0], target[1]),
        (0.0, 0.0),
        "non-finite rows' targets"
    );
    assert!(sum[2] > 1.0, "a finite row sums at least exp(0) = 1");
    assert_eq!(target[2], 0.0, "a negative target reads no logit");
}
