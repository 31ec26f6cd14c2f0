//! Attention over 8-bit K/V rows (`KvRows::Q8`, written by `kv_quant::quantize_q8`): in every
//! variant and every kernel (one head, several KV heads walked together, the tile of a
//! prefill chunk), bitwise the f32 attention over the dequantized rows — so 8-bit rows carry
//! the whole numeric contract of the f32 ones — and close to the attention over the rows
//! before quantization.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a test failure

mod common;
use common::assert_bits;

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tandem_kernels::attention::{
    attend_heads_with, attend_rows_with, attend_with, KvRows, KvView, Q8Rows, Q8_GROUP,
};
use tandem_kernels::kv_quant::{dequantize_q8, quantize_q8};
use tandem_kernels::Isa;

/// A layer's rows as f32, as 8-bit codes, and those codes dequantized.
struct Layer {
    keys: Vec<f32>,
    values: Vec<f32>,
    key_codes: Vec<i8>,
    key_scales: Vec<f32>,
    value_codes: Vec<i8>,
    value_scales: Vec<f32>,
    keys_dq: Vec<f32>,
    values_dq: Vec<f32>,
}

impl Layer {
    fn new(rng: &mut StdRng, elements: usize, spread: f32) -> Layer {
        let mut draw = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| rng.random_range(-1.0f32..1.0) * spread)
                .collect()
        };
        let (keys, values) = (draw(elements), draw(elements));
        let quantize = |x: &[f32]| {
            let mut codes = vec![0i8; x.len()];
            let mut scales = vec![0.0f32; x.len() / Q8_GROUP];
            quantize_q8(x, &mut codes, &mut scales);
            (codes, scales)
        };
        let (key_codes, key_scales) = quantize(&keys);
        let (value_codes, value_scales) = quantize(&values);
        Layer {
            keys_dq: dequantize_q8(&key_codes, &key_scales),
            values_dq: dequantize_q8(&value_codes, &value_scales),
            keys,
            values,
            key_codes,
            key_scales,
            value_codes,
            value_scales,
        }
    }

    fn q8(&self) -> KvRows<'_> {
        KvRows::Q8 {
            keys: Q8Rows {
                codes: &self.key_codes,
                scales: &self.key_scales,
            },
            values: Q8Rows {
                codes: &self.value_codes,
                scales: &self.value_scales,
            },
        }
    }

    fn dequantized(&self) -> KvRows<'_> {
        KvRows::F32 {
            keys: &self.keys_dq,
            values: &self.values_dq,
        }
    }

    fn exact(&self) -> KvRows<'_> {
        KvRows::F32 {
            keys: &self.keys,
            values: &self.values,
        }
    }
}

/// Slots `0..n_slots` shuffled, the first `context` of them.
fn scattered_slots(rng: &mut StdRng, n_slots: usize, context: usize) -> Vec<usize> {
    let mut slots: Vec<usize> = (0..n_slots).collect();
    slots.shuffle(rng);
    slots.truncate(context);
    slots
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(100))]

    /// One KV head and several walked together: every variant gives the bits of the scalar
    /// reference over the dequantized f32 rows.
    #[test]
    fn group_kernels_equal_f32_over_the_dequantized_rows(
        seed in any::<u64>(),
        head_dim in prop_oneof![Just(64usize), Just(32), Just(96), Just(128), Just(256)],
        group in 1usize..=9,
        kv_heads in 1usize..=4,
        context in prop_oneof![1usize..70, 120usize..300],
        spread in prop_oneof![Just(1.0f32), Just(6.0)],
    ) {
        let mut rng = StdRng::seed_from_u64(seed);
        let first = rng.random_range(0..2);
        let row = (first + kv_heads) * head_dim;
        let n_slots = context + 4;
        let layer = Layer::new(&mut rng, n_slots * row, spread);
        let slots = scattered_slots(&mut rng, n_slots, context);
        let q: Vec<f32> = (0..kv_heads * group * head_dim)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect();
        let scale = 1.0 / (head_dim as f32).sqrt();
        let view = |rows, offset| KvView { rows, row_stride: row, offset, head_dim, slots: &slots };
        let mut want = vec![f32::NAN; q.len()];
        let at = first * head_dim;
        attend_heads_with(Isa::Scalar, &q, &view(layer.dequantized(), at), kv_heads, scale, &mut want);
        for isa in Isa::available() {
            let mut got = vec![f32::NAN; q.len()];
            attend_heads_with(isa, &q, &view(layer.q8(), at), kv_heads, scale, &mut got);
            assert_bits(&got, &want, &format!("{} together", isa.name()))?;
            let n = group * head_dim;
            for (h, (qh, wh)) in q.chunks(n).zip(want.chunks(n)).enumerate() {
                let mut alone = vec![f32::NAN; n];
                attend_with(isa, qh, &view(layer.q8(), at + h * head_dim), scale, &mut alone);
                assert_bits(&alone, wh, &format!("{} head {}", isa.name(), h))?;
            }
        }
        // And the 8-bit rows stay close to the rows before quantization: each element is
        // off by at most 1/254 of its group's largest magnitude. Over 3,000 cases the worst
        // output moved by 0.0025 · spread · (1 + spread); twice that is allowed.
        let mut exact = vec![f32::NAN; q.len()];
        attend_heads_with(Isa::Scalar, &q, &view(layer.exact(), at), kv_heads, scale, &mut exact);
        let tol = 0.005 * spread * (1.0 + spread);
        for (i, (w, e)) in want.iter().zip(&exact).enumerate() {
            prop_assert!((w - e).abs() <= tol, "element {}: {} vs {} (tolerance {})", i, w, e, tol);
        }
    }

    /// The tile kernel of a prefill chunk: every row, over its own context, has the bits of
    /// the scalar reference over the dequantized rows (and so of decode over the same cache).
    #[test]
    fn tile_rows_equal_f32_over_the_dequantized_rows(
        seed in any::<u64>(),
        head_dim in prop_oneof![Just(64usize), Just(96), Just(256), Just(288)],
        rows in 1usize..36,
        context in 1usize..70,
    ) {
        let mut rng = StdRng::seed_from_u64(seed);
        let num_kv_heads = rng.random_range(1..=3);
        let kv_head = rng.random_range(0..num_kv_heads);
        let row = num_kv_heads * head_dim;
        let n_slots = context + 3;
        let layer = Layer::new(&mut rng, n_slots * row, 2.0);
        let slots = scattered_slots(&mut rng, n_slots, context);
        let q: Vec<f32> = (0..rows * head_dim).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let lens: Vec<usize> = (0..rows).map(|_| rng.random_range(1..=context)).collect();
        let scale = 1.0 / (head_dim as f32).sqrt();
        let view = |rows| KvView {
            rows,
            row_stride: row,
            offset: kv_head * head_dim,
            head_dim,
            slots: &slots,
        };
        let mut want = vec![f32::NAN; q.len()];
        attend_rows_with(Isa::Scalar, &q, &lens, &view(layer.dequantized()), scale, &mut want);
        for isa in Isa::available() {
            let mut got = vec![f32::NAN; q.len()];
            attend_rows_with(isa, &q, &lens, &view(layer.q8()), scale, &mut got);
            assert_bits(&got, &want, isa.name())?;
        }
    }
}

/// One call of a kernel entry point, to be caught if it panics.
type Call<'a> = Box<dyn Fn() + 'a>;

/// A head that would split a group of 32 shared scales is refused by every entry point, in
/// every variant: it would read another group's scale. (Two heads of 48 span 96, a whole
/// number of groups, so each head must be checked, not only their span.)
#[test]
fn heads_off_the_scale_groups_are_refused() {
    let codes = vec![0i8; 4 * 96];
    let scales = vec![1.0f32; 4 * 96 / Q8_GROUP];
    let rows = Q8Rows {
        codes: &codes,
        scales: &scales,
    };
    let view = KvView {
        rows: KvRows::Q8 {
            keys: rows,
            values: rows,
        },
        row_stride: 96,
        offset: 0,
        head_dim: 48,
        slots: &[0, 1],
    };
    let q = [0.5f32; 96];
    for isa in Isa::available() {
        let calls: [(&str, Call<'_>); 3] = [
            (
                "attend_with",
                Box::new(|| {
                    attend_with(isa, &q[..48], &view, 0.1, &mut [0.0; 48]);
                }),
            ),
            (
                "attend_heads_with",
                Box::new(|| {
                    attend_heads_with(isa, &q, &view, 2, 0.1, &mut [0.0; 96]);
                }),
            ),
            (
                "attend_rows_with",
                Box::new(|| {
                    attend_rows_with(isa, &q, &[1, 2], &view, 0.1, &mut [0.0; 96]);
                }),
            ),
        ];
        for (name, call) in calls {
            let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(call))
                .expect_err(&format!("{name} ({isa}) took heads of 48 over 8-bit rows"));
            let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
            assert!(msg.contains("groups of 32"), "{name} ({isa}): {msg}");
        }
    }
}
