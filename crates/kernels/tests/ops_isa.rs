//! The element-wise ops of a layer (`tandem_kernels::ops`: RMSNorm, SwiGLU, GeGLU, the
//! residual add, the scaled add of LoRA corrections) give the same bits in every variant
//! they are compiled for: rows of many lengths (off the vector widths), values from tiny to past `exp`'s clamp, infinities and
//! NaN.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a test failure

use proptest::prelude::*;
use tandem_kernels::ops::{
    add_inplace_with, add_scaled_bf16_inplace_with, add_scaled_inplace_with,
    geglu_tanh_inplace_with, rms_norm_inplace_with, rms_norm_with, swiglu_inplace_with,
};
use tandem_kernels::Isa;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Values of every magnitude the ops meet, and some they should survive.
fn value() -> impl Strategy<Value = f32> {
    prop_oneof![
        8 => -8.0f32..8.0,
        2 => -200.0f32..200.0,
        1 => prop_oneof![
            Just(0.0f32),
            Just(-0.0),
            Just(f32::INFINITY),
            Just(f32::NEG_INFINITY),
            Just(f32::NAN),
            Just(1e-30),
            Just(-95.0),
        ],
    ]
}

fn row(len: std::ops::Range<usize>) -> impl Strategy<Value = (Vec<f32>, Vec<f32>)> {
    len.prop_flat_map(|n| {
        (
            proptest::collection::vec(value(), n),
            proptest::collection::vec(value(), n),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn every_variant_gives_the_scalar_bits((x, y) in row(1..200)) {
        let eps = 1e-6;
        let weight: Vec<f32> = y.iter().map(|v| if v.is_finite() { *v } else { 0.5 }).collect();
        let run = |isa: Isa| {
            let mut normed = vec![0.0f32; x.len()];
            rms_norm_with(isa, &x, &weight, eps, &mut normed);
            let mut in_place = x.clone();
            rms_norm_inplace_with(isa, &mut in_place, &weight, eps);
            let mut swiglu = x.clone();
            swiglu_inplace_with(isa, &mut swiglu, &y);
            let mut geglu = x.clone();
            geglu_tanh_inplace_with(isa, &mut geglu, &y);
            let mut sum = x.clone();
            add_inplace_with(isa, &mut sum, &y);
            let mut scaled = x.clone();
            add_scaled_inplace_with(isa, &mut scaled, y[0], &y);
            // 0 · ∞ makes a NaN whose sign bit the vector and scalar units set differently:
            // every NaN counts as one value here (the others keep the operands' NaNs).
            scaled.iter_mut().filter(|v| v.is_nan()).for_each(|v| *v = f32::NAN);
            // bf16 rows: bitwise the f32 scaled add of the widened values.
            let y16: Vec<u16> = y.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
            let widened: Vec<f32> = y16.iter().map(|&h| f32::from_bits(u32::from(h) << 16)).collect();
            let mut scaled16 = x.clone();
            add_scaled_bf16_inplace_with(isa, &mut scaled16, y[0], &y16);
            let mut scaled_wide = x.clone();
            add_scaled_inplace_with(isa, &mut scaled_wide, y[0], &widened);
            for v in scaled16.iter_mut().chain(scaled_wide.iter_mut()).filter(|v| v.is_nan()) {
                *v = f32::NAN;
            }
            assert_eq!(bits(&scaled16), bits(&scaled_wide), "bf16 add_scaled in {}", isa.name());
            [normed, in_place, swiglu, geglu, sum, scaled, scaled16].map(|v| bits(&v))
        };
        let want = run(Isa::Scalar);
        for isa in Isa::available() {
            let got = run(isa);
            let names = [
                "rms_norm", "rms_norm_inplace", "swiglu", "geglu", "add", "add_scaled",
                "add_scaled_bf16",
            ];
            for (name, (g, w)) in names
                .iter()
                .zip(got.iter().zip(&want))
            {
                prop_assert_eq!(g, w, "{} differs in {}", name, isa.name());
            }
        }
    }
}

/// A layer-sized row (the default model's 576 and 1,536 columns, Gemma's 640 and 2,048).
#[test]
fn layer_sized_rows_agree_too() {
    for n in [576usize, 640, 1536, 2048] {
        let x: Vec<f32> = (0..n)
            .map(|i| ((i * 7919 % 1013) as f32 / 97.0) - 5.0)
            .collect();
        let y: Vec<f32> = (0..n)
            .map(|i| ((i * 104729 % 997) as f32 / 331.0) - 1.5)
            .collect();
        let mut want = x.clone();
        swiglu_inplace_with(Isa::Scalar, &mut want, &y);
        let mut want_norm = vec![0.0; n];
        rms_norm_with(Isa::Scalar, &x, &y, 1e-5, &mut want_norm);
        for isa in Isa::available() {
            let mut got = x.clone();
            swiglu_inplace_with(isa, &mut got, &y);
            assert_eq!(bits(&got), bits(&want), "swiglu {n} {isa}");
            let mut got_norm = vec![0.0; n];
            rms_norm_with(isa, &x, &y, 1e-5, &mut got_norm);
            assert_eq!(bits(&got_norm), bits(&want_norm), "rms_norm {n} {isa}");
        }
    }
}
