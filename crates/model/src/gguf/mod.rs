//! GGUF (versions 2 and 3) reading, plus a small writer for tests.
//!
//! Model files are untrusted: [`GgufFile::parse_bytes`] checks every count, length and
//! offset it reads and reports violations as [`GgufError`] variants without panicking, and
//! it never reserves memory for a count before checking that the remaining bytes could hold
//! that many items.

mod cursor;
mod error;
mod ggml_types;
mod metadata;
mod reader;
mod tensor_info;
mod writer;

pub use error::GgufError;
pub use metadata::{Metadata, MetadataValue};
pub use reader::{
    GgufFile, ParsedGguf, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ARRAY_DEPTH,
};
pub use tensor_info::{check_no_gaps, GgufTensorInfo, MAX_DIMS};
pub use writer::GgufWriter;
