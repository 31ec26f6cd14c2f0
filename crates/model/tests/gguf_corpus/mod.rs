//! Shared by the GGUF malformed-input and allocation tests: a small valid file and a
//! corpus of malformed files, each with the exact error the parser must report.
//!
//! Header-level cases are hand-encoded with [`Enc`] (independent of the crate's writer);
//! tensor-table cases use `GgufWriter`, whose output is checked byte for byte against the
//! reference Python writer in `gguf_fixtures.rs`.

#![allow(dead_code)]

use tandem_kernels::DType;
use tandem_model::gguf::{GgufError, GgufWriter, MetadataValue};

/// A malformed file and the error it must produce.
pub struct Case {
    pub name: &'static str,
    pub bytes: Vec<u8>,
    pub expected: GgufError,
}

/// Minimal little-endian encoder for hand-made headers.
#[derive(Default)]
pub struct Enc(pub Vec<u8>);

impl Enc {
    /// Magic, version, tensor count, metadata count.
    pub fn header(version: u32, n_tensors: u64, n_kv: u64) -> Enc {
        Enc::default()
            .raw(b"GGUF")
            .u32(version)
            .u64(n_tensors)
            .u64(n_kv)
    }
    pub fn raw(mut self, b: &[u8]) -> Enc {
        self.0.extend_from_slice(b);
        self
    }
    pub fn u32(self, v: u32) -> Enc {
        self.raw(&v.to_le_bytes())
    }
    pub fn u64(self, v: u64) -> Enc {
        self.raw(&v.to_le_bytes())
    }
    /// A GGUF string of raw bytes (u64 length, then the bytes).
    pub fn str(self, s: &[u8]) -> Enc {
        self.u64(s.len() as u64).raw(s)
    }
    pub fn zeros(self, n: usize) -> Enc {
        self.raw(&vec![0; n])
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

fn s(v: &str) -> MetadataValue {
    MetadataValue::String(v.to_string())
}

/// A small valid v3 file touching every structure: strings, string array, nested array,
/// scalars, a quantized and a float tensor. Its last tensor ends exactly at the end of the
/// file (no trailing padding), so every proper prefix is invalid.
pub fn small_valid() -> Vec<u8> {
    use MetadataValue::*;
    GgufWriter::new(3)
        .metadata("general.architecture", s("llama"))
        .metadata("n", U32(7))
        .metadata("eps", F64(1e-5))
        .metadata("flag", Bool(true))
        .metadata("toks", Array(vec![s("a"), s("bc")]))
        .metadata("nest", Array(vec![Array(vec![I16(-1)]), Array(vec![])]))
        .tensor("q", DType::Q8_0, &[32], vec![7u8; 34])
        .tensor("a", DType::F32, &[8], vec![1u8; 32])
        .to_bytes()
}

/// Cases whose header or counts are malformed (hand-encoded).
pub fn header_cases() -> Vec<Case> {
    let mut magic = small_valid();
    magic[..4].copy_from_slice(b"GGML");
    vec![
        case("bad magic", magic, GgufError::BadMagic),
        case("empty file", Vec::new(), truncated("magic", 0, 4, 0)),
        case(
            "version 1",
            Enc::header(1, 0, 0).0,
            GgufError::UnsupportedVersion(1),
        ),
        case(
            "version 4",
            Enc::header(4, 0, 0).0,
            GgufError::UnsupportedVersion(4),
        ),
        case(
            "tensor count 2^63",
            Enc::header(3, 1 << 63, 0).zeros(100).0,
            too_many("tensor", 1 << 63, 8, 100, 24),
        ),
        case(
            "metadata count 2^40",
            Enc::header(3, 0, 1 << 40).zeros(100).0,
            too_many("metadata", 1 << 40, 16, 100, 13),
        ),
        case(
            "array length 2^60",
            kv(9).u32(0).u64(1 << 60).zeros(50).0,
            too_many("array element", 1 << 60, 41, 50, 1),
        ),
        case(
            "array length 2^20 (large but not absurd)",
            kv(9).u32(10).u64(1 << 20).zeros(64).0,
            too_many("array element", 1 << 20, 41, 64, 8),
        ),
        case(
            "tensor count 2^20 (large but not absurd)",
            Enc::header(3, 1 << 20, 0).zeros(1000).0,
            too_many("tensor", 1 << 20, 8, 1000, 24),
        ),
        case(
            "array of strings length 2^40",
            kv(9).u32(8).u64(1 << 40).zeros(50).0,
            too_many("array element", 1 << 40, 41, 50, 8),
        ),
    ]
}

/// A metadata pair "k" of the given value type (metadata starts at byte 24; the key
/// occupies 9 bytes and its type 4 more, so the value starts at byte 37).
fn kv(type_id: u32) -> Enc {
    Enc::header(3, 0, 1).str(b"k").u32(type_id)
}

/// Cases whose metadata values are malformed (hand-encoded).
pub fn value_cases() -> Vec<Case> {
    let nested = (0..9).fold(kv(9), |e, _| e.u32(9).u64(1)).u32(0).u64(0);
    vec![
        case(
            "string length 2^50",
            kv(8).u64(1 << 50).zeros(50).0,
            GgufError::StringTooLong {
                len: 1 << 50,
                offset: 37,
                remaining: 50,
            },
        ),
        case(
            "key length 2^50",
            Enc::header(3, 0, 1).u64(1 << 50).zeros(20).0,
            GgufError::StringTooLong {
                len: 1 << 50,
                offset: 24,
                remaining: 20,
            },
        ),
        case(
            "string length u64::MAX",
            kv(8).u64(u64::MAX).0,
            GgufError::StringTooLong {
                len: u64::MAX,
                offset: 37,
                remaining: 0,
            },
        ),
        case(
            "unknown value type",
            kv(13).zeros(8).0,
            unknown_value("k", 13),
        ),
        case(
            "unknown element type",
            kv(9).u32(99).u64(1).zeros(8).0,
            unknown_value("k", 99),
        ),
        case(
            "invalid UTF-8 key",
            Enc::header(3, 0, 1).str(b"a\xffb").u32(0).zeros(1).0,
            utf8("metadata key", 33),
        ),
        case(
            "invalid UTF-8 string value",
            kv(8).str(b"ok\xc3(").0,
            utf8("metadata string", 47),
        ),
        case(
            "invalid bool",
            kv(7).raw(&[2]).0,
            GgufError::InvalidBool {
                key: "k".into(),
                value: 2,
            },
        ),
        case(
            "arrays nested 9 deep",
            nested.0,
            GgufError::NestingTooDeep {
                key: "k".into(),
                limit: 8,
            },
        ),
        case(
            "duplicate key",
            Enc::header(3, 0, 2)
                .str(b"k")
                .u32(0)
                .raw(&[1])
                .str(b"k")
                .u32(0)
                .raw(&[2])
                .0,
            GgufError::DuplicateKey("k".into()),
        ),
    ]
}

/// Cases whose alignment or tensor layout is malformed (built with the writer).
pub fn tensor_cases() -> Vec<Case> {
    use MetadataValue::*;
    let w = || GgufWriter::new(3).metadata("general.architecture", s("llama"));
    let past_end = w().raw_tensor("t", 0, &[4], 0).to_bytes();
    let past_end_len = past_end.len();
    let far = w().raw_tensor("t", 0, &[4], u64::MAX - 31).to_bytes();
    let far_len = far.len();
    vec![
        case(
            "alignment 48",
            w().metadata("general.alignment", U32(48)).to_bytes(),
            GgufError::BadAlignment(48),
        ),
        case(
            "alignment 0",
            w().metadata("general.alignment", U32(0)).to_bytes(),
            GgufError::BadAlignment(0),
        ),
        case(
            "alignment as string",
            w().metadata("general.alignment", s("32")).to_bytes(),
            GgufError::WrongType {
                key: "general.alignment".into(),
                expected: "u32",
                found: "string".into(),
            },
        ),
        case(
            "tensor past the end",
            past_end,
            out_of_bounds("t", 0, 16, past_end_len, past_end_len),
        ),
        case(
            "tensor offset near u64::MAX",
            far,
            out_of_bounds("t", u64::MAX - 31, 16, far_len, far_len),
        ),
        case(
            "overlapping tensors",
            w().tensor("a", DType::F32, &[16], vec![0; 64])
                .raw_tensor("b", 0, &[8], 32)
                .to_bytes(),
            GgufError::OverlappingTensors {
                first: "a".into(),
                second: "b".into(),
            },
        ),
        case(
            "misaligned tensor",
            w().tensor("a", DType::F32, &[32], vec![0; 128])
                .raw_tensor("b", 0, &[4], 40)
                .to_bytes(),
            GgufError::MisalignedTensor {
                name: "b".into(),
                offset: 40,
                alignment: 32,
            },
        ),
    ]
}

/// Cases whose tensor infos are malformed on their own (built with the writer).
pub fn tensor_info_cases() -> Vec<Case> {
    let w = || GgufWriter::new(3).metadata("general.architecture", s("llama"));
    let dims = |name: &str, d: Vec<u64>| (name.to_string(), d);
    vec![
        case(
            "unknown tensor type",
            w().raw_tensor("t", 99, &[4], 0).to_bytes(),
            unsupported("t", 99),
        ),
        case(
            "known ggml type tandem does not support (IQ2_XXS)",
            w().raw_tensor("t", 16, &[256], 0).to_bytes(),
            unsupported("t", 16),
        ),
        case(
            "5 dims",
            w().raw_tensor("t", 0, &[1, 1, 1, 1, 1], 0).to_bytes(),
            GgufError::TooManyDims {
                name: "t".into(),
                n_dims: 5,
            },
        ),
        case(
            "dim count u32::MAX",
            Enc::header(3, 1, 0).str(b"t").u32(u32::MAX).zeros(64).0,
            GgufError::TooManyDims {
                name: "t".into(),
                n_dims: u32::MAX,
            },
        ),
        case("zero dim", w().raw_tensor("t", 0, &[4, 0], 0).to_bytes(), {
            let (name, dims) = dims("t", vec![4, 0]);
            GgufError::ZeroDim { name, dims }
        }),
        case(
            "dim product overflows u64",
            w().raw_tensor("t", 0, &[1 << 32, 1 << 32, 2], 0).to_bytes(),
            {
                let (name, dims) = dims("t", vec![1 << 32, 1 << 32, 2]);
                GgufError::ShapeOverflow { name, dims }
            },
        ),
        case(
            "byte size overflows",
            w().raw_tensor("t", 0, &[1 << 62], 0).to_bytes(),
            {
                let (name, dims) = dims("t", vec![1 << 62]);
                GgufError::ShapeOverflow { name, dims }
            },
        ),
        case(
            "row not a whole number of blocks",
            w().raw_tensor("t", DType::Q8_0.ggml_id(), &[16, 2], 0)
                .to_bytes(),
            GgufError::PartialBlock {
                name: "t".into(),
                dtype: DType::Q8_0,
                row_len: 16,
                block_len: 32,
            },
        ),
        case(
            "duplicate tensor name",
            w().tensor("t", DType::F32, &[8], vec![0; 32])
                .tensor("t", DType::F32, &[8], vec![0; 32])
                .to_bytes(),
            GgufError::DuplicateTensor("t".into()),
        ),
        case(
            "invalid UTF-8 tensor name",
            Enc::header(3, 1, 0)
                .str(b"\xfe")
                .u32(1)
                .u64(4)
                .u32(0)
                .u64(0)
                .zeros(64)
                .0,
            utf8("tensor name", 32),
        ),
    ]
}

/// Every malformed case.
pub fn all_cases() -> Vec<Case> {
    let mut cases = header_cases();
    cases.extend(value_cases());
    cases.extend(tensor_cases());
    cases.extend(tensor_info_cases());
    cases
}

fn case(name: &'static str, bytes: Vec<u8>, expected: GgufError) -> Case {
    Case {
        name,
        bytes,
        expected,
    }
}

pub fn truncated(what: &'static str, offset: usize, needed: usize, available: usize) -> GgufError {
    GgufError::Truncated {
        what,
        offset,
        needed,
        available,
    }
}

fn too_many(
    what: &'static str,
    count: u64,
    offset: usize,
    remaining: usize,
    min_size: usize,
) -> GgufError {
    GgufError::CountTooLarge {
        what,
        count,
        offset,
        remaining,
        min_size,
    }
}

fn unknown_value(key: &str, type_id: u32) -> GgufError {
    GgufError::UnknownValueType {
        key: key.into(),
        type_id,
    }
}

fn utf8(what: &'static str, offset: usize) -> GgufError {
    GgufError::InvalidUtf8 { what, offset }
}

fn unsupported(name: &str, type_id: u32) -> GgufError {
    GgufError::UnsupportedTensorType {
        name: name.into(),
        type_id,
    }
}

fn out_of_bounds(
    name: &str,
    offset: u64,
    nbytes: u64,
    data_offset: usize,
    file_len: usize,
) -> GgufError {
    GgufError::TensorOutOfBounds {
        name: name.into(),
        offset,
        nbytes,
        data_offset,
        file_len,
    }
}
