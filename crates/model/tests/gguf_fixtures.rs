//! Committed fixtures written by the reference Python writer (gguf-py 0.19, see
//! fixtures/gguf/make_fixtures.py): the parser must read what it wrote, GgufWriter must
//! reproduce it byte for byte, and the patched copies must fail with their specific error.
//! Expected values are the script's inputs and what gguf-py's GGUFReader reported for the
//! files (data offset 640, tensor offsets 0/96/128).

use std::path::PathBuf;

use tandem_kernels::DType;
use tandem_model::gguf::{GgufError, GgufFile, GgufTensorInfo, GgufWriter, MetadataValue};
use MetadataValue::*;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gguf")
        .join(name)
}

fn read(name: &str) -> Vec<u8> {
    std::fs::read(fixture(name)).expect("fixture present")
}

fn s(v: &str) -> MetadataValue {
    String(v.to_string())
}

/// The metadata make_fixtures.py gives valid_v3.gguf, in the order it writes it.
fn valid_v3_metadata() -> Vec<(&'static str, MetadataValue)> {
    vec![
        ("general.architecture", s("llama")),
        ("t.u8", U8(200)),
        ("t.i8", I8(-100)),
        ("t.u16", U16(60000)),
        ("t.i16", I16(-30000)),
        ("t.u32", U32(4_000_000_000)),
        ("t.i32", I32(-2_000_000_000)),
        ("t.f32", F32(1.5)),
        ("t.u64", U64((1 << 63) + 5)),
        ("t.i64", I64(-(1 << 62))),
        ("t.f64", F64(-0.25)),
        ("t.bool", Bool(true)),
        ("t.str", s("héllo")),
        ("t.strs", Array(vec![s("a"), s("bc"), s("")])),
        ("t.i32s", Array(vec![I32(1), I32(-2), I32(3)])),
        (
            "t.nested",
            Array(vec![Array(vec![I32(1), I32(2)]), Array(vec![I32(3)])]),
        ),
    ]
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn info(name: &str, dims: &[u64], dtype: DType, offset: u64) -> GgufTensorInfo {
    GgufTensorInfo {
        name: name.into(),
        dims: dims.to_vec(),
        dtype,
        offset,
    }
}

#[test]
fn reads_the_reference_writers_file() {
    let bytes = read("valid_v3.gguf");
    let (version, metadata, tensors, data_offset, alignment) =
        GgufFile::parse_bytes(&bytes).expect("valid fixture");
    assert_eq!((version, data_offset, alignment), (3, 640, 32));
    assert_eq!(metadata.len(), valid_v3_metadata().len());
    for (k, v) in valid_v3_metadata() {
        assert_eq!(metadata.get(k), Some(&v), "{k}");
    }
    assert_eq!(
        tensors,
        vec![
            info("tok.weight", &[32, 2], DType::Q8_0, 0),
            info("norm.weight", &[4], DType::F32, 96),
            info("proj.weight", &[3, 2], DType::F16, 128),
        ]
    );
}

#[test]
fn tensor_set_over_the_reference_file() {
    let file = GgufFile::open(&fixture("valid_v3.gguf")).expect("open");
    let set = file.into_tensor_set().expect("tensors");
    let tok = set.require("tok.weight").expect("tok");
    // numpy wrote a (2, 34)-byte array of arange(68) as Q8_0 rows.
    assert_eq!(tok.shape, &[2, 32]);
    assert_eq!(tok.data, &(0..68).collect::<Vec<u8>>()[..]);
    let norm = set.require("norm.weight").expect("norm");
    assert_eq!(norm.shape, &[4]);
    assert_eq!(norm.data, &f32_bytes(&[1.0, 2.0, 3.0, 4.0])[..]);
    let proj = set.require("proj.weight").expect("proj");
    assert_eq!((proj.dtype, proj.shape), (DType::F16, &[2usize, 3][..]));
    let proj_f32: Vec<f32> = proj
        .data
        .chunks_exact(2)
        .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect();
    assert_eq!(proj_f32, vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
}

#[test]
fn writer_reproduces_the_reference_files_byte_for_byte() {
    let mut w = GgufWriter::new(3);
    for (k, v) in valid_v3_metadata() {
        w = w.metadata(k, v);
    }
    let f16s: Vec<u8> = (0..6u16)
        .flat_map(|i| half::f16::from_f32(f32::from(i)).to_le_bytes())
        .collect();
    let w = w
        .tensor(
            "tok.weight",
            DType::Q8_0,
            &[32, 2],
            (0..68).collect::<Vec<u8>>(),
        )
        .tensor(
            "norm.weight",
            DType::F32,
            &[4],
            f32_bytes(&[1.0, 2.0, 3.0, 4.0]),
        )
        .tensor("proj.weight", DType::F16, &[3, 2], f16s);
    assert!(
        w.to_bytes() == read("valid_v3.gguf"),
        "valid_v3.gguf differs"
    );

    let w = GgufWriter::new(3)
        .metadata("general.architecture", s("qwen2"))
        .metadata("general.alignment", U32(64))
        .tensor("a", DType::F32, &[2], f32_bytes(&[1.0, -1.0]))
        .tensor("b", DType::F32, &[1], f32_bytes(&[0.5]));
    assert!(
        w.to_bytes() == read("valid_align64.gguf"),
        "valid_align64.gguf differs"
    );
}

#[test]
fn custom_alignment_fixture() {
    let bytes = read("valid_align64.gguf");
    let (_, metadata, tensors, data_offset, alignment) =
        GgufFile::parse_bytes(&bytes).expect("valid fixture");
    assert_eq!(alignment, 64);
    assert_eq!(metadata.u32("general.alignment"), Ok(64));
    assert_eq!(data_offset % 64, 0);
    assert_eq!(tensors[1].offset, 64);
    let b = data_offset + 64;
    assert_eq!(&bytes[b..b + 4], &0.5f32.to_le_bytes());
}

#[test]
fn malformed_fixtures_give_their_specific_errors() {
    let cases = [
        ("bad_magic.gguf", GgufError::BadMagic),
        ("version1.gguf", GgufError::UnsupportedVersion(1)),
        (
            "string_len_huge.gguf",
            GgufError::StringTooLong {
                len: 1 << 50,
                offset: 56,
                remaining: 800 - 64,
            },
        ),
        (
            "bad_utf8_key.gguf",
            GgufError::InvalidUtf8 {
                what: "metadata key",
                offset: 79,
            },
        ),
        (
            "unknown_tensor_type.gguf",
            GgufError::UnsupportedTensorType {
                name: "norm.weight".into(),
                type_id: 99,
            },
        ),
        (
            "truncated_data.gguf",
            GgufError::TensorOutOfBounds {
                name: "proj.weight".into(),
                offset: 128,
                nbytes: 12,
                data_offset: 640,
                file_len: 776,
            },
        ),
    ];
    for (name, expected) in cases {
        let got = GgufFile::parse_bytes(&read(name)).map(|p| p.0);
        assert_eq!(got, Err(expected), "{name}");
    }
    let got = GgufFile::parse_bytes(&read("tensor_count_huge.gguf")).map(|p| p.0);
    assert!(
        matches!(
            got,
            Err(GgufError::CountTooLarge { what: "tensor", count, offset: 8, min_size: 24, .. })
                if count == 1 << 63
        ),
        "{got:?}"
    );
}
