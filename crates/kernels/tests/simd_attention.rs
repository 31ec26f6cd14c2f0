//! The attention kernel (`tandem_kernels::attention`): every SIMD variant is bitwise equal to
//! the scalar reference on random shapes (head sizes and context lengths that are no multiple
//! of the vector width or of the position block, groups larger than one kernel call, scattered
//! slots); the scalar reference matches the definition computed in f64; and a query head's
//! result does not depend on the other heads computed with it. The same over f16 rows, where
//! the result must be bitwise the f32 attention over the rows widened to f32. Several KV heads
//! walked together give each group its bits alone.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a test failure

mod common;
use common::assert_bits;

use half::f16;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tandem_kernels::attention::{
    attend_heads_with, attend_partition_with, attend_rows_with, attend_with, fold_partitions,
    partition, partitions, record_len, KvRows, KvView, GROUP_MAX, KV_HEADS_MAX,
};
use tandem_kernels::Isa;

/// A random layer of a KV store and one sequence's context in it.
#[derive(Clone)]
struct Case {
    head_dim: usize,
    num_kv_heads: usize,
    kv_head: usize,
    keys: Vec<f32>,
    values: Vec<f32>,
    slots: Vec<usize>,
    /// `[group, head_dim]`
    q: Vec<f32>,
}

impl Case {
    fn new(seed: u64, head_dim: usize, group: usize, context: usize, spread: f32) -> Case {
        let mut rng = StdRng::seed_from_u64(seed);
        let num_kv_heads = rng.random_range(1..=3);
        let kv_head = rng.random_range(0..num_kv_heads);
        let n_slots = context + rng.random_range(0..8);
        let row = num_kv_heads * head_dim;
        let mut draw = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| rng.random_range(-1.0f32..1.0) * spread)
                .collect()
        };
        let keys = draw(n_slots * row);
        let values = draw(n_slots * row);
        let q = draw(group * head_dim);
        let mut slots: Vec<usize> = (0..n_slots).collect();
        slots.shuffle(&mut rng);
        slots.truncate(context);
        Case {
            head_dim,
            num_kv_heads,
            kv_head,
            keys,
            values,
            slots,
            q,
        }
    }

    /// The same case with the keys and values rounded to f16 (and back: exact).
    fn rounded_to_f16(&self) -> Case {
        let round = |v: &[f32]| v.iter().map(|&x| f16::from_f32(x).to_f32()).collect();
        Case {
            keys: round(&self.keys),
            values: round(&self.values),
            ..self.clone()
        }
    }

    fn view(&self) -> KvView<'_> {
        self.view_of(KvRows::F32 {
            keys: &self.keys,
            values: &self.values,
        })
    }

    fn view_of<'a>(&'a self, rows: KvRows<'a>) -> KvView<'a> {
        KvView {
            rows,
            row_stride: self.num_kv_heads * self.head_dim,
            offset: self.kv_head * self.head_dim,
            head_dim: self.head_dim,
            slots: &self.slots,
        }
    }

    /// The rows of `q` through the tile kernel, row `i` over the first `context[i]` slots,
    /// over f32 rows or (`half`) the rows stored as f16.
    fn run_rows(&self, isa: Isa, context: &[usize], half: bool) -> Vec<f32> {
        let to_f16 = |v: &[f32]| v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<f16>>();
        let (keys, values) = (to_f16(&self.keys), to_f16(&self.values));
        let view = if half {
            self.view_of(KvRows::F16 {
                keys: &keys,
                values: &values,
            })
        } else {
            self.view()
        };
        let mut out = vec![f32::NAN; self.q.len()];
        attend_rows_with(isa, &self.q, context, &view, self.scale(), &mut out);
        out
    }

    /// Row `i` of `q` alone through the group kernel over the first `n` slots.
    fn run_row_alone(&self, isa: Isa, i: usize, n: usize, half: bool) -> Vec<f32> {
        let d = self.head_dim;
        let short = Case {
            slots: self.slots[..n].to_vec(),
            ..self.clone()
        };
        let q = &self.q[i * d..][..d];
        if half {
            short.run_f16(isa, q)
        } else {
            short.run(isa, q)
        }
    }

    fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }

    fn run(&self, isa: Isa, q: &[f32]) -> Vec<f32> {
        let mut out = vec![f32::NAN; q.len()];
        attend_with(isa, q, &self.view(), self.scale(), &mut out);
        out
    }

    /// [`Case::run`] over the keys and values stored as f16.
    fn run_f16(&self, isa: Isa, q: &[f32]) -> Vec<f32> {
        let to_f16 = |v: &[f32]| v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<f16>>();
        let (keys, values) = (to_f16(&self.keys), to_f16(&self.values));
        let view = self.view_of(KvRows::F16 {
            keys: &keys,
            values: &values,
        });
        let mut out = vec![f32::NAN; q.len()];
        attend_with(isa, q, &view, self.scale(), &mut out);
        out
    }

    /// The definition in f64 for query head `i`: softmax of the scaled dots, times V.
    fn definition(&self, i: usize) -> Vec<f64> {
        let d = self.head_dim;
        let kv = self.view();
        let row = |buf: &[f32], s: usize| -> Vec<f64> {
            buf[s * kv.row_stride + kv.offset..][..d]
                .iter()
                .map(|&x| f64::from(x))
                .collect()
        };
        let q: Vec<f64> = self.q[i * d..][..d].iter().map(|&x| f64::from(x)).collect();
        let scores: Vec<f64> = self
            .slots
            .iter()
            .map(|&s| {
                let k = row(&self.keys, s);
                q.iter().zip(&k).map(|(a, b)| a * b).sum::<f64>() / (d as f64).sqrt()
            })
            .collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let z: f64 = w.iter().sum();
        let mut out = vec![0.0; d];
        for (wj, &s) in w.iter().zip(&self.slots) {
            for (o, v) in out.iter_mut().zip(row(&self.values, s)) {
                *o += wj * v / z;
            }
        }
        out
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn simd_variants_equal_scalar_bitwise(
        seed in any::<u64>(),
        head_dim in prop_oneof![Just(64usize), Just(128), 1usize..100],
        group in 1usize..12,
        context in prop_oneof![1usize..80, 120usize..420],
        spread in prop_oneof![Just(1.0f32), Just(4.0), Just(0.01)],
    ) {
        let case = Case::new(seed, head_dim, group, context, spread);
        let want = case.run(Isa::Scalar, &case.q);
        let want_f16 = case.run_f16(Isa::Scalar, &case.q);
        for isa in Isa::available() {
            assert_bits(&case.run(isa, &case.q), &want, isa.name())?;
            assert_bits(&case.run_f16(isa, &case.q), &want_f16, isa.name())?;
        }
    }

    /// f16 rows are widened exactly: attention over them is the f32 attention over the
    /// rounded values, bit for bit, in every variant.
    #[test]
    fn f16_rows_equal_f32_rows_of_the_rounded_values(
        seed in any::<u64>(),
        head_dim in prop_oneof![Just(64usize), 1usize..90],
        group in 1usize..10,
        context in 1usize..60,
    ) {
        let case = Case::new(seed, head_dim, group, context, 2.0);
        let rounded = case.rounded_to_f16();
        for isa in Isa::available() {
            assert_bits(&case.run_f16(isa, &case.q), &rounded.run(isa, &case.q), isa.name())?;
        }
    }

    #[test]
    fn scalar_matches_the_definition(
        seed in any::<u64>(),
        head_dim in prop_oneof![Just(64usize), 1usize..100],
        group in 1usize..10,
        context in prop_oneof![1usize..80, 120usize..420],
        spread in prop_oneof![Just(1.0f32), Just(3.0)],
    ) {
        let case = Case::new(seed, head_dim, group, context, spread);
        let got = case.run(Isa::Scalar, &case.q);
        for i in 0..group {
            let want = case.definition(i);
            for (k, (g, w)) in got[i * head_dim..][..head_dim].iter().zip(&want).enumerate() {
                // The output is a convex combination of values of magnitude <= spread; the
                // scores' rounding (|s| <= spread^2 sqrt(d)) moves the weights relatively.
                let tol = 2e-6 * f64::from(spread) * (1.0 + f64::from(spread * spread) * (head_dim as f64).sqrt());
                prop_assert!((f64::from(*g) - w).abs() <= tol, "head {} dim {}: {} vs {}", i, k, g, w);
            }
        }
    }

    #[test]
    fn a_head_does_not_depend_on_its_group(
        seed in any::<u64>(),
        head_dim in prop_oneof![Just(64usize), 1usize..70],
        group in 2usize..12,
        context in 1usize..50,
    ) {
        let case = Case::new(seed, head_dim, group, context, 1.0);
        for isa in Isa::available() {
            let together = case.run(isa, &case.q);
            for i in 0..group {
                let alone = case.run(isa, &case.q[i * head_dim..][..head_dim]);
                assert_bits(&together[i * head_dim..][..head_dim], &alone, isa.name())?;
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(120))]

    /// Several KV heads walked together (decode of a whole token in one task) give each
    /// group the bits of the scalar reference for that group alone: groups of up to 10 heads
    /// and up to 10 KV heads (past what one kernel call takes), heads that do not start the
    /// row, f32 and f16 rows, in every variant; and so do the partitions of a long context
    /// computed apart and folded afterwards (decode tasks of one sequence).
    #[test]
    fn kv_heads_together_equal_each_group_alone(
        seed in any::<u64>(),
        head_dim in prop_oneof![Just(64usize), 1usize..90],
        group in 1usize..=10,
        kv_heads in 1usize..=10,
        context in prop_oneof![1usize..70, 120usize..420],
    ) {
        let mut rng = StdRng::seed_from_u64(seed);
        let first = rng.random_range(0..3);
        let row = (first + kv_heads + rng.random_range(0..2)) * head_dim;
        let n_slots = context + 5;
        let mut draw = |n: usize| -> Vec<f32> {
            (0..n).map(|_| rng.random_range(-2.0f32..2.0)).collect()
        };
        let (keys, values) = (draw(n_slots * row), draw(n_slots * row));
        let q = draw(kv_heads * group * head_dim);
        let mut slots: Vec<usize> = (0..n_slots).collect();
        slots.shuffle(&mut rng);
        slots.truncate(context);
        let to_f16 = |v: &[f32]| v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<f16>>();
        let (keys16, values16) = (to_f16(&keys), to_f16(&values));
        let scale = 1.0 / (head_dim as f32).sqrt();
        for half in [false, true] {
            let rows = if half {
                KvRows::F16 { keys: &keys16, values: &values16 }
            } else {
                KvRows::F32 { keys: &keys, values: &values }
            };
            let view = |offset: usize| KvView {
                rows,
                row_stride: row,
                offset,
                head_dim,
                slots: &slots,
            };
            let n = group * head_dim;
            let mut want = vec![f32::NAN; q.len()];
            for (h, (qh, wh)) in q.chunks(n).zip(want.chunks_mut(n)).enumerate() {
                attend_with(Isa::Scalar, qh, &view((first + h) * head_dim), scale, wh);
            }
            for isa in Isa::available() {
                let mut got = vec![f32::NAN; q.len()];
                attend_heads_with(isa, &q, &view(first * head_dim), kv_heads, scale, &mut got);
                assert_bits(&got, &want, &format!("{} f16={}", isa.name(), half))?;
                if group > GROUP_MAX || kv_heads > KV_HEADS_MAX {
                    continue;
                }
                // The partitions computed one by one (as decode tasks do, each into its
                // record) and folded afterwards: the same bits.
                let len = record_len(kv_heads * group, head_dim);
                let mut records = vec![f32::NAN; partitions(context) * len];
                for (p, record) in records.chunks_mut(len).enumerate() {
                    let part = KvView {
                        slots: partition(&slots, p),
                        ..view(first * head_dim)
                    };
                    attend_partition_with(isa, &q, &part, kv_heads, scale, partition(&slots, p + 1), record);
                }
                fold_partitions(isa, &records, kv_heads * group, &mut got);
                assert_bits(&got, &want, &format!("{} f16={} partitions", isa.name(), half))?;
            }
        }
    }

    /// The tile kernel gives every row the bits of the scalar reference for that row alone
    /// over its own context: rows beside longer and shorter ones, several tiles, head sizes
    /// that are no multiple of 16 and one too large for the tile's buffers, f32 and f16 rows.
    #[test]
    fn tile_rows_equal_each_row_alone(
        seed in any::<u64>(),
        head_dim in prop_oneof![Just(64usize), Just(260), 1usize..100],
        rows in 1usize..40,
        context in prop_oneof![1usize..70, 100usize..300],
        spread in prop_oneof![Just(1.0f32), Just(4.0)],
    ) {
        let case = Case::new(seed, head_dim, rows, context, spread);
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5EED);
        let lens: Vec<usize> = (0..rows).map(|_| rng.random_range(1..=context)).collect();
        for half in [false, true] {
            let want: Vec<f32> = (0..rows)
                .flat_map(|i| case.run_row_alone(Isa::Scalar, i, lens[i], half))
                .collect();
            for isa in Isa::available() {
                let got = case.run_rows(isa, &lens, half);
                assert_bits(&got, &want, &format!("{} f16={}", isa.name(), half))?;
            }
        }
    }
}

/// A context whose scores grow block after block (the running maximum is rescaled many
/// times) and one where the largest score comes first (never rescaled) agree with the
/// definition, and the NaN of a poisoned key reaches the output.
#[test]
fn rescaling_and_nan() {
    // 70 positions (one partition) and 300 (three: the fold rescales the running state).
    for (increasing, n) in [(true, 70), (false, 70), (true, 300), (false, 300)] {
        let mut case = Case::new(7, 64, 3, n, 1.0);
        for (j, &s) in case.slots.clone().iter().enumerate() {
            let w = if increasing { j as f32 } else { (n - j) as f32 } * 3.5 / n as f32;
            for x in &mut case.keys[s * case.num_kv_heads * 64 + case.kv_head * 64..][..64] {
                *x = x.abs() * w;
            }
        }
        case.q.iter_mut().for_each(|x| *x = x.abs());
        let want = case.run(Isa::Scalar, &case.q);
        for i in 0..3 {
            for (g, w) in want[i * 64..][..64].iter().zip(case.definition(i)) {
                assert!((f64::from(*g) - w).abs() < 1e-5, "{g} vs {w}");
            }
        }
        let full = [n; 3];
        for isa in Isa::available() {
            for got in [case.run(isa, &case.q), case.run_rows(isa, &full, false)] {
                assert!(got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()));
            }
        }
    }
    // A NaN key in the first partition, and in the second (rows whose context ends before
    // it stay finite, in the tile kernel and in partitions computed apart and folded).
    for (seed, n, poisoned, rows) in [(8, 20, 5, [20, 5, 3]), (9, 300, 200, [300, 150, 100])] {
        let mut case = Case::new(seed, 32, 3, n, 1.0);
        let s = case.slots[poisoned];
        case.keys[s * case.num_kv_heads * 32 + case.kv_head * 32] = f32::NAN;
        for isa in Isa::available() {
            assert!(case.run(isa, &case.q).iter().all(|x| x.is_nan()), "{isa}");
            let f16 = case.run_f16(isa, &case.q);
            assert!(f16.iter().all(|x| x.is_nan()), "{isa}");
            let tile = case.run_rows(isa, &rows, false);
            assert!(tile[..32].iter().all(|x| x.is_nan()), "{isa}");
            assert!(tile[32..].iter().all(|x| x.is_finite()), "{isa}");
        }
    }
}
