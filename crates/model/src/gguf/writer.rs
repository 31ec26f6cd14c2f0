//! A small in-memory GGUF writer, for tests and fixtures across the project.
//!
//! It writes exactly what it is given (version 2/3 layout) and validates nothing, so it can
//! also craft malformed files: duplicate keys, any version number, raw tensor type ids and
//! offsets, heterogeneous arrays. Layout matches common GGUF writers: header, metadata in
//! insertion order, tensor infos, zero padding to the alignment, then each tensor's data
//! padded to the alignment.
//!
//! ```
//! use tandem_kernels::DType;
//! use tandem_model::gguf::{GgufFile, GgufWriter, MetadataValue};
//!
//! let bytes = GgufWriter::new(3)
//!     .metadata("general.architecture", MetadataValue::String("llama".into()))
//!     .tensor("norm.weight", DType::F32, &[4], vec![0u8; 16])
//!     .to_bytes();
//! let (version, metadata, tensors, _, _) = GgufFile::parse_bytes(&bytes).unwrap();
//! assert_eq!(version, 3);
//! assert_eq!(metadata.str("general.architecture").unwrap(), "llama");
//! assert_eq!(tensors[0].dims, vec![4]);
//! ```

use tandem_kernels::DType;

use super::metadata::MetadataValue;
use super::reader::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC};

/// Builder for a GGUF file image. See the module docs.
#[derive(Debug, Clone)]
pub struct GgufWriter {
    version: u32,
    metadata: Vec<(String, MetadataValue)>,
    tensors: Vec<PendingTensor>,
}

#[derive(Debug, Clone)]
struct PendingTensor {
    name: String,
    type_id: u32,
    /// ggml order, innermost first.
    dims: Vec<u64>,
    data: TensorData,
}

#[derive(Debug, Clone)]
enum TensorData {
    /// Bytes placed in the data section at the next aligned offset.
    Bytes(Vec<u8>),
    /// No data written; the info carries this offset verbatim.
    Raw { offset: u64 },
}

impl GgufWriter {
    /// An empty file of the given version number (written as is, even if unsupported).
    pub fn new(version: u32) -> GgufWriter {
        GgufWriter {
            version,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Appends a metadata pair. A `general.alignment` given as `U32` (non-zero) also sets
    /// the alignment used to lay out the data section.
    pub fn metadata(mut self, key: impl Into<String>, value: MetadataValue) -> GgufWriter {
        self.metadata.push((key.into(), value));
        self
    }

    /// Appends a tensor with its dims in ggml order (innermost first) and its raw bytes,
    /// placed at the next aligned offset of the data section.
    pub fn tensor(
        mut self,
        name: impl Into<String>,
        dtype: DType,
        ggml_dims: &[u64],
        bytes: impl Into<Vec<u8>>,
    ) -> GgufWriter {
        self.tensors.push(PendingTensor {
            name: name.into(),
            type_id: dtype.ggml_id(),
            dims: ggml_dims.to_vec(),
            data: TensorData::Bytes(bytes.into()),
        });
        self
    }

    /// Appends a tensor info written verbatim (any type id, any offset relative to the
    /// data section) with no data, for crafting malformed files.
    pub fn raw_tensor(
        mut self,
        name: impl Into<String>,
        type_id: u32,
        ggml_dims: &[u64],
        offset: u64,
    ) -> GgufWriter {
        self.tensors.push(PendingTensor {
            name: name.into(),
            type_id,
            dims: ggml_dims.to_vec(),
            data: TensorData::Raw { offset },
        });
        self
    }

    /// The alignment used for the layout: the last `general.alignment` given as a
    /// non-zero `U32`, else 32.
    pub fn alignment(&self) -> usize {
        self.metadata
            .iter()
            .rev()
            .find_map(|(k, v)| match v {
                MetadataValue::U32(a) if k == ALIGNMENT_KEY && *a > 0 => Some(*a as usize),
                _ => None,
            })
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// The complete file image.
    pub fn to_bytes(&self) -> Vec<u8> {
        let align = self.alignment();
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            write_str(&mut out, key);
            out.extend_from_slice(&value.type_id().to_le_bytes());
            write_value(&mut out, value);
        }
        let mut data = Vec::new();
        for t in &self.tensors {
            let offset = match &t.data {
                TensorData::Raw { offset } => *offset,
                TensorData::Bytes(bytes) => {
                    let offset = data.len() as u64;
                    data.extend_from_slice(bytes);
                    pad(&mut data, align);
                    offset
                }
            };
            write_str(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.type_id.to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
        }
        pad(&mut out, align);
        out.extend_from_slice(&data);
        out
    }
}

/// Appends zeros up to the next multiple of `align`.
fn pad(out: &mut Vec<u8>, align: usize) {
    out.resize(out.len().next_multiple_of(align), 0);
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Writes a value's payload (without its type id). An array's element type is that of
/// its first element (u8 when empty).
fn write_value(out: &mut Vec<u8>, value: &MetadataValue) {
    match value {
        MetadataValue::U8(v) => out.push(*v),
        MetadataValue::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::Bool(v) => out.push(u8::from(*v)),
        MetadataValue::String(s) => write_str(out, s),
        MetadataValue::Array(items) => {
            let elem_type = items.first().map_or(0, MetadataValue::type_id);
            out.extend_from_slice(&elem_type.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                write_value(out, item);
            }
        }
    }
}
