//! `exp_sum` (ARCHITECTURE.md § Invariants, 9): every kernel variant equals the scalar code bitwise
//! on random rows of every length (including ones that are not a multiple of the vector width), and
//! the result is within 1e-14 (relative) of the C library's `exp` summed in f64.

use proptest::prelude::*;
use tandem_kernels::exp_sum::exp_sum_with;
use tandem_kernels::isa::Isa;

fn row() -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(-60.0f32..30.0, 1..300)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn variants_agree_bitwise_and_match_libm(x in row()) {
        let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let scalar = exp_sum_with(Isa::Scalar, &x, max);
        for isa in Isa::available() {
            let got = exp_sum_with(isa, &x, max);
            prop_assert_eq!(got.to_bits(), scalar.to_bits(), "{}", isa);
        }
        let libm: f64 = x.iter().map(|&v| ((v - max) as f64).exp()).sum();
        prop_assert!(((scalar - libm) / libm).abs() < 1e-14, "{} vs {}", scalar, libm);
    }
}

#[test]
fn a_vocabulary_row_with_far_outliers() {
    let mut x: Vec<f32> = (0..49_157)
        .map(|i| ((i as f32) * 0.37).sin() * 12.0)
        .collect();
    x[17] = -1.0e4; // underflows to 0 in the true sum
    x[40_000] = 80.0;
    let max = 80.0;
    let scalar = exp_sum_with(Isa::Scalar, &x, max);
    for isa in Isa::available() {
        assert_eq!(
            exp_sum_with(isa, &x, max).to_bits(),
            scalar.to_bits(),
            "{isa}"
        );
    }
    let libm: f64 = x.iter().map(|&v| ((v - max) as f64).exp()).sum();
    assert!(((scalar - libm) / libm).abs() < 1e-14);
}
