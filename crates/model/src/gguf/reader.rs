//! The GGUF container: header, metadata and tensor table, parsed from untrusted bytes.
//!
//! Layout (all integers little-endian): magic `GGUF`, u32 version, u64 tensor count, u64
//! metadata count, the metadata pairs, the tensor infos, padding up to the data alignment,
//! then the tensor data. Every count, length and offset is checked before use; a malformed
//! file yields a typed [`GgufError`], never a panic.

use std::fmt;
use std::path::Path;

use super::cursor::Cursor;
use super::error::GgufError;
use super::metadata::{Metadata, MetadataValue};
use super::tensor_info::{read_tensor_infos, validate_layout, GgufTensorInfo};
use crate::error::{ModelError, Result};
use crate::weights::{MappedFile, TensorEntry, TensorSet};

/// The four magic bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Data alignment in bytes when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: usize = 32;
/// Metadata key that overrides [`DEFAULT_ALIGNMENT`].
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// Deepest accepted nesting of metadata arrays (an array of arrays has depth 2).
pub const MAX_ARRAY_DEPTH: usize = 8;

/// Smallest encoded size of one metadata pair: an empty key (u64 length), a u32 value
/// type and a one-byte value.
const MIN_KV_SIZE: usize = 8 + 4 + 1;

/// What [`GgufFile::parse_bytes`] returns: version, metadata, tensor infos, data section
/// offset (bytes from file start) and alignment (bytes).
pub type ParsedGguf = (u32, Metadata, Vec<GgufTensorInfo>, usize, usize);

/// A parsed GGUF file over its memory map.
pub struct GgufFile {
    pub version: u32,
    pub metadata: Metadata,
    /// In file order.
    pub tensors: Vec<GgufTensorInfo>,
    /// Absolute byte offset of the data section; tensor offsets are relative to it.
    pub data_offset: usize,
    /// Data alignment in bytes (a power of two).
    pub alignment: usize,
    file: MappedFile,
}

impl fmt::Debug for GgufFile {
    // Summarised: the metadata of a real model holds tens of thousands of tokens.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.file.path())
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("data_offset", &self.data_offset)
            .field("alignment", &self.alignment)
            .finish()
    }
}

impl GgufFile {
    /// Maps and parses the file at `path`.
    pub fn open(path: &Path) -> Result<GgufFile> {
        GgufFile::from_mapped(MappedFile::open(path)?)
    }

    /// Parses an already mapped file.
    pub fn from_mapped(file: MappedFile) -> Result<GgufFile> {
        let (version, metadata, tensors, data_offset, alignment) =
            GgufFile::parse_bytes(file.bytes())?;
        Ok(GgufFile {
            version,
            metadata,
            tensors,
            data_offset,
            alignment,
            file,
        })
    }

    /// The mapped file.
    pub fn file(&self) -> &MappedFile {
        &self.file
    }

    /// Parses a whole GGUF file held in memory and validates its tensor layout against
    /// `bytes.len()`.
    ///
    /// Memory: no count is trusted before the remaining bytes are known to be able to hold
    /// that many items, so absurd counts and lengths fail without allocating. What is
    /// allocated is bounded by what the input really encodes: at most
    /// `size_of::<MetadataValue>()` (32) bytes per input byte (a u8 array, stored one
    /// value per element) plus a small constant.
    pub fn parse_bytes(bytes: &[u8]) -> Result<ParsedGguf, GgufError> {
        let mut c = Cursor::new(bytes);
        if c.array::<4>("magic")? != GGUF_MAGIC {
            return Err(GgufError::BadMagic);
        }
        let version = c.u32("version")?;
        if !matches!(version, 2 | 3) {
            return Err(GgufError::UnsupportedVersion(version));
        }
        let tensor_count_offset = c.pos();
        let tensor_count = c.u64("tensor count")?;
        let metadata = read_metadata(&mut c)?;
        let tensors = read_tensor_infos(&mut c, tensor_count, tensor_count_offset)?;
        let alignment = alignment(&metadata)?;
        let data_offset = c
            .pos()
            .checked_next_multiple_of(alignment)
            .ok_or(GgufError::Overflow("data section offset"))?;
        validate_layout(&tensors, data_offset, alignment, bytes.len())?;
        Ok((version, metadata, tensors, data_offset, alignment))
    }

    /// Registers every tensor in a [`TensorSet`] over this file, with shapes converted from
    /// ggml order (innermost first) to outermost-first.
    pub fn into_tensor_set(self) -> Result<TensorSet> {
        let mut set = TensorSet::default();
        let file = set.add_file(self.file);
        for t in self.tensors {
            let bad = |reason: &str| ModelError::BadTensor {
                name: t.name.clone(),
                reason: reason.to_string(),
            };
            let shape = t.shape().ok_or_else(|| bad("dimensions overflow usize"))?;
            let len = t
                .n_bytes()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| bad("byte size is not a whole number of blocks or overflows"))?;
            let offset = usize::try_from(t.offset)
                .ok()
                .and_then(|o| o.checked_add(self.data_offset))
                .ok_or_else(|| bad("data offset overflows"))?;
            let entry = TensorEntry {
                dtype: t.dtype,
                shape,
                file,
                offset,
                len,
            };
            set.insert(t.name, entry)?;
        }
        Ok(set)
    }
}

/// Reads the metadata count and pairs.
fn read_metadata(c: &mut Cursor<'_>) -> Result<Metadata, GgufError> {
    let n = c.count("metadata", MIN_KV_SIZE)?;
    let mut metadata = Metadata::default();
    for _ in 0..n {
        let key = c.string("metadata key")?;
        let type_id = c.u32("metadata value type")?;
        let value = read_value(c, key, type_id, 0)?;
        if metadata.insert(key.to_string(), value).is_some() {
            return Err(GgufError::DuplicateKey(key.to_string()));
        }
    }
    Ok(metadata)
}

/// Smallest encoded size of one value of GGUF value type `type_id`, or `None` for an
/// unknown type. An array needs at least its element type and length.
fn min_value_size(type_id: u32) -> Option<usize> {
    Some(match type_id {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 4 + 8,
        _ => return None,
    })
}

/// Reads one value of type `type_id` belonging to `key`; `depth` counts the arrays that
/// enclose it.
fn read_value(
    c: &mut Cursor<'_>,
    key: &str,
    type_id: u32,
    depth: usize,
) -> Result<MetadataValue, GgufError> {
    Ok(match type_id {
        0 => MetadataValue::U8(c.u8("u8 value")?),
        1 => MetadataValue::I8(i8::from_le_bytes(c.array("i8 value")?)),
        2 => MetadataValue::U16(u16::from_le_bytes(c.array("u16 value")?)),
        3 => MetadataValue::I16(i16::from_le_bytes(c.array("i16 value")?)),
        4 => MetadataValue::U32(c.u32("u32 value")?),
        5 => MetadataValue::I32(i32::from_le_bytes(c.array("i32 value")?)),
        6 => MetadataValue::F32(f32::from_le_bytes(c.array("f32 value")?)),
        7 => match c.u8("bool value")? {
            0 => MetadataValue::Bool(false),
            1 => MetadataValue::Bool(true),
            value => {
                let key = key.to_string();
                return Err(GgufError::InvalidBool { key, value });
            }
        },
        8 => MetadataValue::String(c.string("metadata string")?.to_string()),
        9 => read_array(c, key, depth)?,
        10 => MetadataValue::U64(c.u64("u64 value")?),
        11 => MetadataValue::I64(i64::from_le_bytes(c.array("i64 value")?)),
        12 => MetadataValue::F64(f64::from_le_bytes(c.array("f64 value")?)),
        _ => {
            let key = key.to_string();
            return Err(GgufError::UnknownValueType { key, type_id });
        }
    })
}

/// Reads an array's element type, length and elements (after its own type id).
fn read_array(c: &mut Cursor<'_>, key: &str, depth: usize) -> Result<MetadataValue, GgufError> {
    if depth >= MAX_ARRAY_DEPTH {
        let key = key.to_string();
        return Err(GgufError::NestingTooDeep {
            key,
            limit: MAX_ARRAY_DEPTH,
        });
    }
    let elem_type = c.u32("array element type")?;
    let Some(min_size) = min_value_size(elem_type) else {
        let key = key.to_string();
        return Err(GgufError::UnknownValueType {
            key,
            type_id: elem_type,
        });
    };
    let n = c.count("array element", min_size)?;
    let mut items = Vec::with_capacity(n);
    for _ in 0..n {
        items.push(read_value(c, key, elem_type, depth + 1)?);
    }
    Ok(MetadataValue::Array(items))
}

/// The data alignment: `general.alignment`, a non-zero power of two, or the default.
fn alignment(metadata: &Metadata) -> Result<usize, GgufError> {
    let Some(align) = metadata.opt_u32(ALIGNMENT_KEY)? else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    if !align.is_power_of_two() {
        return Err(GgufError::BadAlignment(align.into()));
    }
    usize::try_from(align).map_err(|_| GgufError::Overflow("alignment exceeds usize"))
}
