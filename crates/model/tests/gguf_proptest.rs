//! Property tests: arbitrary metadata round-trips through GgufWriter and the parser, and
//! arbitrary corruptions of a valid file never panic; whatever parses satisfies the
//! documented invariants.

mod gguf_corpus;

use proptest::prelude::*;
use tandem_model::gguf::{GgufFile, GgufWriter, MetadataValue, MAX_DIMS};
use MetadataValue::*;

/// Finite or infinite floats, never NaN (NaN != NaN would fail equality, not the parser).
fn f32s() -> impl Strategy<Value = f32> {
    prop_oneof![
        prop::num::f32::NORMAL | prop::num::f32::SUBNORMAL | prop::num::f32::ZERO,
        Just(f32::INFINITY)
    ]
}

fn f64s() -> impl Strategy<Value = f64> {
    prop::num::f64::NORMAL | prop::num::f64::SUBNORMAL | prop::num::f64::ZERO
}

fn scalar() -> impl Strategy<Value = MetadataValue> {
    prop_oneof![
        any::<u8>().prop_map(U8),
        any::<i8>().prop_map(I8),
        any::<u16>().prop_map(U16),
        any::<i16>().prop_map(I16),
        any::<u32>().prop_map(U32),
        any::<i32>().prop_map(I32),
        any::<u64>().prop_map(U64),
        any::<i64>().prop_map(I64),
        f32s().prop_map(F32),
        f64s().prop_map(F64),
        any::<bool>().prop_map(Bool),
        ".{0,12}".prop_map(String),
    ]
}

/// A homogeneous array of up to 4 values drawn from `inner`.
fn array_like(inner: BoxedStrategy<MetadataValue>) -> impl Strategy<Value = MetadataValue> {
    prop::collection::vec(inner, 0..5).prop_map(|items| {
        // GGUF arrays are homogeneous: keep the elements of the first element's type.
        let Some(first) = items.first() else {
            return Array(vec![]);
        };
        let t = first.type_id();
        Array(items.iter().filter(|v| v.type_id() == t).cloned().collect())
    })
}

fn value() -> impl Strategy<Value = MetadataValue> {
    scalar().prop_recursive(4, 64, 5, |inner| array_like(inner.boxed()))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_metadata_round_trips(
        pairs in prop::collection::btree_map("[a-z.]{1,10}", value(), 0..8),
        version in 2u32..=3,
    ) {
        let mut w = GgufWriter::new(version);
        for (k, v) in &pairs {
            w = w.metadata(k.clone(), v.clone());
        }
        let bytes = w.to_bytes();
        let (got_version, metadata, _, _, _) = GgufFile::parse_bytes(&bytes)
            .map_err(|e| TestCaseError::fail(format!("{e}")))?;
        prop_assert_eq!(got_version, version);
        prop_assert_eq!(metadata.len(), pairs.len());
        for (k, v) in &pairs {
            prop_assert_eq!(metadata.get(k), Some(v));
        }
    }

    #[test]
    fn corrupted_files_never_panic_and_what_parses_is_sound(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let mut bytes = gguf_corpus::small_valid();
        for (at, v) in edits {
            let i = at.index(bytes.len());
            bytes[i] = v;
        }
        if truncate {
            bytes.truncate(cut.index(bytes.len()));
        }
        if let Ok((version, _, tensors, data_offset, alignment)) = GgufFile::parse_bytes(&bytes) {
            prop_assert!(version == 2 || version == 3);
            prop_assert!(alignment.is_power_of_two());
            prop_assert_eq!(data_offset % alignment, 0);
            let mut spans = Vec::new();
            for t in &tensors {
                prop_assert!(t.dims.len() <= MAX_DIMS && t.dims.iter().all(|&d| d > 0));
                let n = t.n_bytes().expect("validated size");
                let start = data_offset as u64 + t.offset;
                prop_assert!(start + n <= bytes.len() as u64);
                prop_assert_eq!(t.offset % alignment as u64, 0);
                spans.push((start, start + n));
            }
            spans.sort_unstable();
            prop_assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0));
        }
    }
}
