//! The typed errors of GGUF reading. Every check on untrusted input maps to one variant, so
//! callers and tests can tell exactly which rule a file broke. Byte offsets are absolute
//! positions in the file.

use tandem_kernels::DType;

use super::ggml_types::{describe_type_id, supported_types};

/// Errors from reading a GGUF file.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GgufError {
    #[error("bad magic: not a GGUF file")]
    BadMagic,
    #[error("unsupported GGUF version {0} (supported: 2, 3)")]
    UnsupportedVersion(u32),
    #[error("file truncated: {what} needs {needed} bytes at offset {offset}, {available} left")]
    Truncated {
        what: &'static str,
        offset: usize,
        needed: usize,
        available: usize,
    },
    #[error(
        "{what} count {count} at offset {offset} cannot fit in the {remaining} bytes left \
         (each needs at least {min_size} bytes)"
    )]
    CountTooLarge {
        what: &'static str,
        count: u64,
        offset: usize,
        remaining: usize,
        min_size: usize,
    },
    #[error("string length {len} at offset {offset} exceeds the {remaining} bytes left")]
    StringTooLong {
        len: u64,
        offset: usize,
        remaining: usize,
    },
    #[error("invalid UTF-8 in {what} at offset {offset}")]
    InvalidUtf8 { what: &'static str, offset: usize },
    #[error("metadata `{key}`: unknown value type {type_id}")]
    UnknownValueType { key: String, type_id: u32 },
    #[error("metadata `{key}`: bool byte {value} is neither 0 nor 1")]
    InvalidBool { key: String, value: u8 },
    #[error("metadata `{key}`: arrays nested deeper than {limit} levels")]
    NestingTooDeep { key: String, limit: usize },
    #[error("duplicate metadata key `{0}`")]
    DuplicateKey(String),
    #[error("missing metadata key `{0}`")]
    MissingKey(String),
    #[error("metadata `{key}`: expected {expected}, found {found}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },
    #[error("metadata `{key}`: value {value} does not fit in {expected}")]
    OutOfRange {
        key: String,
        expected: &'static str,
        value: String,
    },
    #[error("general.alignment {0} is not a power of two")]
    BadAlignment(u64),
    #[error("duplicate tensor name `{0}`")]
    DuplicateTensor(String),
    #[error("tensor `{name}`: {n_dims} dimensions (at most 4 supported)")]
    TooManyDims { name: String, n_dims: u32 },
    #[error("tensor `{name}`: zero-sized dimension in {dims:?}")]
    ZeroDim { name: String, dims: Vec<u64> },
    #[error("tensor `{name}`: element count of dimensions {dims:?} overflows")]
    ShapeOverflow { name: String, dims: Vec<u64> },
    #[error(
        "tensor `{name}`: tensor type {} is not supported (supported: {})",
        describe_type_id(*type_id),
        supported_types()
    )]
    UnsupportedTensorType { name: String, type_id: u32 },
    #[error(
        "tensor `{name}`: row length {row_len} is not a multiple of the {dtype} block length \
         {block_len}"
    )]
    PartialBlock {
        name: String,
        dtype: DType,
        row_len: u64,
        block_len: usize,
    },
    #[error(
        "tensor `{name}`: data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    MisalignedTensor {
        name: String,
        offset: u64,
        alignment: usize,
    },
    #[error(
        "tensor `{name}`: {nbytes} bytes at data offset {offset} (data section starts at file \
         offset {data_offset}) lie past the end of the file ({file_len} bytes)"
    )]
    TensorOutOfBounds {
        name: String,
        offset: u64,
        nbytes: u64,
        data_offset: usize,
        file_len: usize,
    },
    #[error("tensors `{first}` and `{second}` have overlapping data")]
    OverlappingTensors { first: String, second: String },
    #[error(
        "{bytes} bytes of tensor data between {after} and {before} belong to no tensor (a \
         tensor's type or shape does not match the data written for it)"
    )]
    UnaccountedBytes {
        after: String,
        before: String,
        bytes: u64,
    },
    #[error("offset arithmetic overflows: {0}")]
    Overflow(&'static str),
}
