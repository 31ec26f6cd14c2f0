//! GgufWriter -> parser round trips (every value type, nested arrays, v2 and v3, custom
//! alignment), the metadata accessors, and tensor registration in a TensorSet.

use std::path::PathBuf;

use tandem_kernels::DType;
use tandem_model::gguf::{GgufError, GgufFile, GgufWriter, Metadata, MetadataValue};
use tandem_model::ModelError;
use MetadataValue::*;

fn s(v: &str) -> MetadataValue {
    String(v.to_string())
}

/// One value of every type, with extremes, plus arrays of each and nested arrays.
fn every_value() -> Vec<(&'static str, MetadataValue)> {
    vec![
        ("u8", U8(u8::MAX)),
        ("i8", I8(i8::MIN)),
        ("u16", U16(u16::MAX)),
        ("i16", I16(i16::MIN)),
        ("u32", U32(u32::MAX)),
        ("i32", I32(i32::MIN)),
        ("u64", U64(u64::MAX)),
        ("i64", I64(i64::MIN)),
        ("f32", F32(-3.25e-7)),
        ("f64", F64(f64::MAX)),
        ("bool.t", Bool(true)),
        ("bool.f", Bool(false)),
        ("str", s("héllo, 世界")),
        ("str.empty", s("")),
        ("arr.u8", Array(vec![U8(0), U8(255)])),
        ("arr.i8", Array(vec![I8(-1)])),
        ("arr.u16", Array(vec![U16(1), U16(2)])),
        ("arr.i16", Array(vec![I16(-3)])),
        ("arr.u32", Array(vec![U32(4), U32(5)])),
        ("arr.i32", Array(vec![I32(-6), I32(7)])),
        ("arr.u64", Array(vec![U64(8)])),
        ("arr.i64", Array(vec![I64(-9)])),
        ("arr.f32", Array(vec![F32(0.5), F32(-1.0)])),
        ("arr.f64", Array(vec![F64(0.125)])),
        ("arr.bool", Array(vec![Bool(true), Bool(false)])),
        ("arr.str", Array(vec![s("a"), s(""), s("ccc")])),
        ("arr.empty", Array(vec![])),
        (
            "arr.nested",
            Array(vec![
                Array(vec![I32(1), I32(2)]),
                Array(vec![]),
                Array(vec![I32(3)]),
            ]),
        ),
        (
            "arr.nested.str",
            Array(vec![Array(vec![Array(vec![s("deep")])])]),
        ),
        ("arr.depth8", nested(8)),
    ]
}

/// `depth` arrays nested inside each other around one u8.
fn nested(depth: usize) -> MetadataValue {
    (0..depth).fold(U8(1), |v, _| Array(vec![v]))
}

#[test]
fn every_value_type_round_trips_in_v2_and_v3() {
    for version in [2, 3] {
        let mut w = GgufWriter::new(version);
        for (k, v) in every_value() {
            w = w.metadata(k, v);
        }
        let bytes = w.to_bytes();
        let (got_version, metadata, tensors, data_offset, alignment) =
            GgufFile::parse_bytes(&bytes).expect("valid file");
        assert_eq!(got_version, version);
        assert!(tensors.is_empty());
        assert_eq!(alignment, 32);
        assert_eq!(data_offset, bytes.len());
        assert_eq!(data_offset % 32, 0);
        assert_eq!(metadata.len(), every_value().len());
        for (k, v) in every_value() {
            assert_eq!(metadata.get(k), Some(&v), "key {k}, version {version}");
        }
    }
}

#[test]
fn tensors_round_trip_with_custom_alignment() {
    for align in [1u32, 8, 64, 4096] {
        let bytes = GgufWriter::new(3)
            .metadata("general.alignment", U32(align))
            .tensor("x", DType::F32, &[3], vec![1u8; 12])
            .tensor("y", DType::Q4_1, &[32, 2], vec![2u8; 40])
            .to_bytes();
        let (_, _, tensors, data_offset, alignment) =
            GgufFile::parse_bytes(&bytes).expect("valid file");
        let align = align as usize;
        assert_eq!(alignment, align);
        assert_eq!(data_offset % align, 0);
        assert_eq!(tensors[0].offset, 0);
        assert_eq!(tensors[1].offset as usize, 12usize.next_multiple_of(align));
        assert_eq!(tensors[1].dims, vec![32, 2]);
        assert_eq!(tensors[1].dtype, DType::Q4_1);
        let y = data_offset + tensors[1].offset as usize;
        assert_eq!(&bytes[y..y + 40], &[2u8; 40][..]);
    }
}

fn sample_metadata() -> Metadata {
    let bytes = GgufWriter::new(3)
        .metadata("u8", U8(9))
        .metadata("i32.neg", I32(-1))
        .metadata("i64.big", I64(1 << 40))
        .metadata("u64.max", U64(u64::MAX))
        .metadata("f64", F64(0.5))
        .metadata("f64.huge", F64(1e300))
        .metadata("f64.inf", F64(f64::INFINITY))
        .metadata("int", I16(-7))
        .metadata("str", s("x"))
        .metadata("bool", Bool(true))
        .metadata("strs", Array(vec![s("a"), s("b")]))
        .metadata("u32s", Array(vec![U32(1), U32(u32::MAX)]))
        .metadata("i8s", Array(vec![I8(-1), I8(2)]))
        .metadata("mixed", Array(vec![Array(vec![]), Array(vec![U8(1)])]))
        .to_bytes();
    GgufFile::parse_bytes(&bytes).expect("valid").1
}

fn wrong(key: &str, expected: &'static str, found: &str) -> GgufError {
    GgufError::WrongType {
        key: key.into(),
        expected,
        found: found.into(),
    }
}

fn range(key: &str, expected: &'static str, value: &str) -> GgufError {
    GgufError::OutOfRange {
        key: key.into(),
        expected,
        value: value.into(),
    }
}

#[test]
fn integer_accessors_accept_fitting_integers_only() {
    let m = sample_metadata();
    assert_eq!(m.u32("u8"), Ok(9));
    assert_eq!(m.u64("i64.big"), Ok(1 << 40));
    assert_eq!(m.u64("u64.max"), Ok(u64::MAX));
    assert_eq!(
        m.u32("i64.big"),
        Err(range("i64.big", "u32", "1099511627776"))
    );
    assert_eq!(m.u32("i32.neg"), Err(range("i32.neg", "u32", "-1")));
    assert_eq!(m.u64("i32.neg"), Err(range("i32.neg", "u64", "-1")));
    assert_eq!(
        m.u32("u64.max"),
        Err(range("u64.max", "u32", "18446744073709551615"))
    );
    assert_eq!(m.u32("str"), Err(wrong("str", "u32", "string")));
    assert_eq!(m.u32("f64"), Err(wrong("f64", "u32", "f64")));
    assert_eq!(m.u32("nope"), Err(GgufError::MissingKey("nope".into())));
    assert_eq!(m.opt_u32("nope"), Ok(None));
    assert_eq!(m.opt_u64("u8"), Ok(Some(9)));
    assert_eq!(m.opt_u32("str"), Err(wrong("str", "u32", "string")));
}

#[test]
fn float_string_and_bool_accessors() {
    let m = sample_metadata();
    assert_eq!(m.f32("f64"), Ok(0.5));
    assert_eq!(m.f32("int"), Ok(-7.0));
    assert_eq!(m.f32("f64.inf"), Ok(f32::INFINITY));
    assert!(matches!(
        m.f32("f64.huge"),
        Err(GgufError::OutOfRange { .. })
    ));
    assert_eq!(m.f32("bool"), Err(wrong("bool", "f32", "bool")));
    assert_eq!(m.opt_f32("nope"), Ok(None));
    assert_eq!(m.str("str"), Ok("x"));
    assert_eq!(m.str("u8"), Err(wrong("u8", "string", "u8")));
    assert_eq!(m.opt_str("str"), Ok(Some("x")));
    assert_eq!(m.opt_str("nope"), Ok(None));
    assert_eq!(m.bool("bool"), Ok(true));
    assert_eq!(m.bool("u8"), Err(wrong("u8", "bool", "u8")));
    assert_eq!(m.opt_bool("nope"), Ok(None));
    assert_eq!(m.opt_bool("str"), Err(wrong("str", "bool", "string")));
}

#[test]
fn array_accessors_check_element_types() {
    let m = sample_metadata();
    assert_eq!(m.str_array("strs"), Ok(vec!["a", "b"]));
    assert_eq!(m.u32_array("u32s"), Ok(vec![1, u32::MAX]));
    assert_eq!(m.i32_array("i8s"), Ok(vec![-1, 2]));
    assert_eq!(m.f32_array("i8s"), Ok(vec![-1.0, 2.0]));
    let elem = |key: &str, expected, found: &str| wrong(key, expected, found);
    assert_eq!(
        m.i32_array("u32s"),
        Err(elem(
            "u32s",
            "array of i32 integers",
            "element 1: U32(4294967295)"
        ))
    );
    assert_eq!(
        m.u32_array("i8s"),
        Err(elem("i8s", "array of u32 integers", "element 0: I8(-1)"))
    );
    assert_eq!(
        m.str_array("u32s"),
        Err(elem("u32s", "array of strings", "element 0: U32(1)"))
    );
    assert_eq!(
        m.f32_array("mixed"),
        Err(elem("mixed", "array of numbers", "element 0: array"))
    );
    assert_eq!(
        m.str_array("str"),
        Err(wrong("str", "array of strings", "string"))
    );
    assert_eq!(
        m.u32_array("nope"),
        Err(GgufError::MissingKey("nope".into()))
    );
    let keys: Vec<&str> = m.keys().collect();
    assert_eq!(keys.len(), 14);
    assert!(
        keys.windows(2).all(|w| w[0] < w[1]),
        "keys sorted: {keys:?}"
    );
}

/// A file in the system temp dir, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, bytes: &[u8]) -> TempFile {
        let path = std::env::temp_dir().join(format!("tandem-gguf-{}-{name}", std::process::id()));
        std::fs::write(&path, bytes).expect("write temp file");
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn tensor_set_gets_outermost_first_shapes_and_the_right_bytes() {
    let emb: Vec<u8> = (0..4 * 34).map(|i| i as u8).collect();
    let norm: Vec<u8> = [1.0f32, -2.0, 0.5]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let bytes = GgufWriter::new(3)
        .tensor("emb", DType::Q8_0, &[64, 2], emb.clone())
        .tensor("norm", DType::F32, &[3], norm.clone())
        .tensor("cube", DType::F16, &[2, 3, 4], vec![0u8; 48])
        .to_bytes();
    let tmp = TempFile::new("set.gguf", &bytes);
    let file = GgufFile::open(&tmp.0).expect("open");
    assert_eq!(file.version, 3);
    assert_eq!(file.tensors.len(), 3);
    let set = file.into_tensor_set().expect("tensor set");
    assert_eq!(set.len(), 3);
    let e = set.require("emb").expect("emb");
    assert_eq!((e.dtype, e.shape), (DType::Q8_0, &[2usize, 64][..]));
    assert_eq!(e.data, &emb[..]);
    let n = set.require("norm").expect("norm");
    assert_eq!(n.shape, &[3]);
    assert_eq!(n.data, &norm[..]);
    assert_eq!(set.require("cube").expect("cube").shape, &[4, 3, 2]);
}

#[test]
fn open_reports_io_and_format_errors() {
    let missing = std::env::temp_dir().join("tandem-gguf-does-not-exist.gguf");
    assert!(matches!(
        GgufFile::open(&missing),
        Err(ModelError::Io { .. })
    ));
    let empty = TempFile::new("empty.gguf", b"");
    assert!(matches!(
        GgufFile::open(&empty.0),
        Err(ModelError::Gguf(GgufError::Truncated { what: "magic", .. }))
    ));
    let tmp = TempFile::new("bad.gguf", b"GGML\x03\0\0\0");
    assert!(matches!(
        GgufFile::open(&tmp.0),
        Err(ModelError::Gguf(GgufError::BadMagic))
    ));
}

#[test]
fn metadata_value_is_32_bytes() {
    // The allocation bound documented on `GgufFile::parse_bytes` relies on this.
    assert_eq!(std::mem::size_of::<MetadataValue>(), 32);
}
