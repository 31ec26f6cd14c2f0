//! The tensor table of a GGUF file: one info per tensor (name, dimensions, type, offset),
//! and the checks that the data they describe is well formed and inside the file.

use std::collections::HashSet;

use tandem_kernels::DType;

use super::cursor::Cursor;
use super::error::GgufError;

/// Most dimensions a ggml tensor may have.
pub const MAX_DIMS: usize = 4;

/// Smallest encoded tensor info: an empty name (u64 length), u32 dimension count, no
/// dimensions, u32 type and u64 offset.
const MIN_TENSOR_INFO_SIZE: usize = 8 + 4 + 4 + 8;

/// One entry of the tensor table. After [`super::GgufFile::parse_bytes`] the invariants
/// hold: at most 4 dims, all non-zero, their product and byte size fit in `usize`, the
/// innermost dim is a whole number of `dtype` blocks, and the data lies inside the file
/// without overlapping any other tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufTensorInfo {
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` is the innermost (contiguous) one.
    pub dims: Vec<u64>,
    pub dtype: DType,
    /// Byte offset of the data, relative to the start of the data section.
    pub offset: u64,
}

impl GgufTensorInfo {
    /// Number of elements, or `None` on overflow.
    pub fn n_elements(&self) -> Option<u64> {
        self.dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
    }

    /// Size of the data in bytes, or `None` when the element count overflows or is not a
    /// whole number of blocks.
    pub fn n_bytes(&self) -> Option<u64> {
        let n = usize::try_from(self.n_elements()?).ok()?;
        u64::try_from(self.dtype.bytes_for(n)?).ok()
    }

    /// The shape outermost-first (the reverse of `dims`), e.g. ggml dims `[576, 49152]`
    /// give `[49152, 576]`; `None` if a dimension does not fit in `usize`.
    pub fn shape(&self) -> Option<Vec<usize>> {
        self.dims
            .iter()
            .rev()
            .map(|&d| usize::try_from(d).ok())
            .collect()
    }
}

/// Reads `count` tensor infos (the count was read at `count_offset`) and checks each one
/// on its own: dimension count and sizes, type, block multiple, unique name.
pub(crate) fn read_tensor_infos(
    c: &mut Cursor<'_>,
    count: u64,
    count_offset: usize,
) -> Result<Vec<GgufTensorInfo>, GgufError> {
    let n = c.check_count("tensor", count, count_offset, MIN_TENSOR_INFO_SIZE)?;
    let mut tensors = Vec::with_capacity(n);
    // Borrowed from the input, so checking uniqueness copies no names.
    let mut names: HashSet<&str> = HashSet::with_capacity(n);
    for _ in 0..n {
        let name = c.string("tensor name")?;
        if !names.insert(name) {
            return Err(GgufError::DuplicateTensor(name.to_string()));
        }
        tensors.push(read_tensor_info(c, name.to_string())?);
    }
    Ok(tensors)
}

/// Reads the rest of a tensor info after its name.
fn read_tensor_info(c: &mut Cursor<'_>, name: String) -> Result<GgufTensorInfo, GgufError> {
    let n_dims = c.u32("tensor dimension count")?;
    if n_dims as usize > MAX_DIMS {
        return Err(GgufError::TooManyDims { name, n_dims });
    }
    let mut dims = Vec::with_capacity(MAX_DIMS);
    for _ in 0..n_dims {
        dims.push(c.u64("tensor dimension")?);
    }
    let type_id = c.u32("tensor type")?;
    let offset = c.u64("tensor offset")?;
    if dims.contains(&0) {
        return Err(GgufError::ZeroDim { name, dims });
    }
    let Some(dtype) = DType::from_ggml_id(type_id) else {
        return Err(GgufError::UnsupportedTensorType { name, type_id });
    };
    let info = GgufTensorInfo {
        name,
        dims,
        dtype,
        offset,
    };
    // ggml stores each row (the innermost dimension) as whole blocks.
    let row_len = info.dims.first().copied().unwrap_or(1);
    let block_len = dtype.block_len();
    if row_len % block_len as u64 > 0 {
        return Err(GgufError::PartialBlock {
            name: info.name,
            dtype,
            row_len,
            block_len,
        });
    }
    if info.n_bytes().is_none() {
        return Err(GgufError::ShapeOverflow {
            name: info.name,
            dims: info.dims,
        });
    }
    Ok(info)
}

/// Checks every tensor's data against the data section: offsets aligned, data inside a
/// file of `file_len` bytes, no two tensors overlapping.
pub(crate) fn validate_layout(
    tensors: &[GgufTensorInfo],
    data_offset: usize,
    alignment: usize,
    file_len: usize,
) -> Result<(), GgufError> {
    // (start, end, index) relative to the data section; u128 cannot overflow here.
    let mut spans: Vec<(u128, u128, usize)> = Vec::with_capacity(tensors.len());
    for (i, t) in tensors.iter().enumerate() {
        // `alignment` is a power of two.
        if t.offset & (alignment as u64 - 1) > 0 {
            return Err(GgufError::MisalignedTensor {
                name: t.name.clone(),
                offset: t.offset,
                alignment,
            });
        }
        let nbytes = t.n_bytes().ok_or_else(|| GgufError::ShapeOverflow {
            name: t.name.clone(),
            dims: t.dims.clone(),
        })?;
        let end = t.offset as u128 + nbytes as u128;
        if data_offset as u128 + end > file_len as u128 {
            return Err(GgufError::TensorOutOfBounds {
                name: t.name.clone(),
                offset: t.offset,
                nbytes,
                data_offset,
                file_len,
            });
        }
        spans.push((t.offset as u128, end, i));
    }
    spans.sort_unstable();
    // Sorted by start, the spans are disjoint iff each ends before the next begins.
    for pair in spans.windows(2) {
        let ((_, end, a), (start, _, b)) = (pair[0], pair[1]);
        if start < end {
            return Err(GgufError::OverlappingTensors {
                first: tensors[a].name.clone(),
                second: tensors[b].name.clone(),
            });
        }
    }
    Ok(())
}

/// Checks that the tensors' data tile the data section as GGUF writers lay it out: the
/// first tensor at offset 0, each next one at the first aligned offset after the previous
/// one's end, and nothing after the last but its padding. A gap means bytes no tensor
/// accounts for: typically a tensor whose type or shape was changed to one that needs fewer
/// bytes than were written (an F32 norm retyped as Q4_0 or BF16, a Q4_1 matrix as Q4_0).
/// Call after `validate_layout` (which `parse_bytes` runs); `data_len` is the number of
/// file bytes from the start of the data section.
pub fn check_no_gaps(
    tensors: &[GgufTensorInfo],
    alignment: usize,
    data_len: usize,
) -> Result<(), GgufError> {
    let mut spans: Vec<(u128, u128, &str)> = Vec::with_capacity(tensors.len());
    for t in tensors {
        let nbytes = t.n_bytes().ok_or_else(|| GgufError::ShapeOverflow {
            name: t.name.clone(),
            dims: t.dims.clone(),
        })?;
        spans.push((t.offset as u128, t.offset as u128 + nbytes as u128, &t.name));
    }
    spans.sort_unstable();
    let align = alignment as u128;
    let gap = |after: Option<&str>, before: &str, bytes: u128| GgufError::UnaccountedBytes {
        after: after.map_or("the start of the data section".into(), |n| format!("`{n}`")),
        before: before.to_string(),
        bytes: u64::try_from(bytes).unwrap_or(u64::MAX),
    };
    let (mut expected, mut previous) = (0u128, None);
    for &(start, end, name) in &spans {
        if start != expected {
            return Err(gap(
                previous,
                &format!("`{name}`"),
                start.abs_diff(expected),
            ));
        }
        expected = end.next_multiple_of(align);
        previous = Some(name);
    }
    if previous.is_some() && data_len as u128 > expected {
        return Err(gap(
            previous,
            "the end of the file",
            data_len as u128 - expected,
        ));
    }
    Ok(())
}
