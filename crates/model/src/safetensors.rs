//! Loading Hugging Face safetensors checkpoints: a single `model.safetensors`, or shards
//! listed by `model.safetensors.index.json`. Files are memory-mapped and registered in a
//! [`TensorSet`] without copying or converting any tensor data.
//!
//! A safetensors file is: an 8-byte little-endian `u64` header length `n`, then `n` bytes of
//! JSON mapping each tensor name to `{"dtype", "shape", "data_offsets": [begin, end]}` (plus
//! an optional `"__metadata__"` object of strings), then the data. Offsets are relative to
//! the first byte after the header. Every field is untrusted: lengths are bounded, offsets
//! range-checked with checked arithmetic, and tensors may not overlap.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Component, Path};

use serde::Deserialize;
use tandem_kernels::DType;

use crate::error::{ModelError, Result};
use crate::weights::{MappedFile, TensorEntry, TensorSet};

/// Name of a single-file checkpoint inside a model directory.
pub const SINGLE_FILE: &str = "model.safetensors";
/// Name of the shard index of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// Largest JSON header accepted, in bytes (the biggest real models need a few MB).
pub const MAX_HEADER_BYTES: u64 = 100 * 1024 * 1024;
/// Largest shard index accepted, in bytes.
pub const MAX_INDEX_BYTES: u64 = 100 * 1024 * 1024;
/// Most dimensions a tensor may have.
const MAX_RANK: usize = 8;

/// One tensor as described by a header, checked against the file it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderTensor {
    pub name: String,
    pub dtype: DType,
    /// Outermost dimension first, as stored.
    pub shape: Vec<usize>,
    /// Absolute byte offset of the first element within the file.
    pub offset: usize,
    /// Length in bytes: `numel * dtype size`.
    pub len: usize,
}

/// A tensor's entry in the header, before any check.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTensor {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: [usize; 2],
}

/// The header's top-level entries in file order, duplicates kept (a JSON map would silently
/// keep only the last of two entries with the same name).
#[derive(Debug)]
struct HeaderEntries(Vec<(String, serde_json::Value)>);

impl<'de> Deserialize<'de> for HeaderEntries {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct EntriesVisitor;
        impl<'de> serde::de::Visitor<'de> for EntriesVisitor {
            type Value = HeaderEntries;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<HeaderEntries, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(HeaderEntries(entries))
            }
        }
        d.deserialize_map(EntriesVisitor)
    }
}

#[derive(Debug, Deserialize)]
struct RawIndex {
    weight_map: BTreeMap<String, String>,
}

fn st_err(path: &Path, msg: impl std::fmt::Display) -> ModelError {
    ModelError::Safetensors(format!("{}: {msg}", path.display()))
}

fn bad_tensor(name: &str, path: &Path, reason: impl std::fmt::Display) -> ModelError {
    ModelError::BadTensor {
        name: name.to_string(),
        reason: format!("in {}: {reason}", path.display()),
    }
}

/// Maps a safetensors dtype name to a supported [`DType`].
fn parse_dtype(name: &str) -> Option<DType> {
    match name {
        "F32" => Some(DType::F32),
        "F16" => Some(DType::F16),
        "BF16" => Some(DType::BF16),
        _ => None,
    }
}

/// Parses and checks the header of the safetensors file whose bytes are `bytes`; `path` only
/// labels errors. Returns the tensors sorted by offset.
pub fn parse_header(bytes: &[u8], path: &Path) -> Result<Vec<HeaderTensor>> {
    let len_bytes: [u8; 8] = bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| st_err(path, format!("file of {} bytes has no header", bytes.len())))?;
    let header_len = u64::from_le_bytes(len_bytes);
    let available = (bytes.len() - 8) as u64;
    if header_len > MAX_HEADER_BYTES || header_len > available {
        return Err(st_err(
            path,
            format!(
                "header length {header_len} exceeds the {available} bytes after it \
                 or the limit of {MAX_HEADER_BYTES}"
            ),
        ));
    }
    // Both bounds above make this conversion and slice exact.
    let data_start = 8 + header_len as usize;
    let header: HeaderEntries = serde_json::from_slice(&bytes[8..data_start])
        .map_err(|e| st_err(path, format!("header is not a JSON object: {e}")))?;
    let data_len = bytes.len() - data_start;
    let mut tensors = Vec::with_capacity(header.0.len());
    let mut seen = HashSet::with_capacity(header.0.len());
    for (name, value) in header.0 {
        if !seen.insert(name.clone()) {
            return Err(bad_tensor(&name, path, "listed twice in the header"));
        }
        if name == "__metadata__" {
            continue;
        }
        let t = check_tensor(&name, value, data_len, path)?;
        tensors.push(HeaderTensor {
            offset: data_start + t.offset,
            ..t
        });
    }
    check_no_overlap(&mut tensors, path)?;
    Ok(tensors)
}

/// Checks one header entry; the returned offset is relative to the data section.
fn check_tensor(
    name: &str,
    value: serde_json::Value,
    data_len: usize,
    path: &Path,
) -> Result<HeaderTensor> {
    let raw: RawTensor = serde_json::from_value(value)
        .map_err(|e| bad_tensor(name, path, format!("malformed header entry: {e}")))?;
    let dtype = parse_dtype(&raw.dtype).ok_or_else(|| {
        bad_tensor(
            name,
            path,
            format!("dtype `{}` is not supported (F32, F16, BF16)", raw.dtype),
        )
    })?;
    if raw.shape.len() > MAX_RANK {
        return Err(bad_tensor(name, path, format!("rank {}", raw.shape.len())));
    }
    let [begin, end] = raw.data_offsets;
    if begin > end || end > data_len {
        return Err(bad_tensor(
            name,
            path,
            format!("data_offsets [{begin}, {end}] outside the {data_len} data bytes"),
        ));
    }
    let numel = raw
        .shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d));
    let expected = numel
        .and_then(|n| dtype.bytes_for(n))
        .ok_or_else(|| bad_tensor(name, path, format!("shape {:?} overflows", raw.shape)))?;
    if end - begin != expected {
        return Err(bad_tensor(
            name,
            path,
            format!(
                "holds {} bytes but shape {:?} of {dtype} needs {expected}",
                end - begin,
                raw.shape
            ),
        ));
    }
    Ok(HeaderTensor {
        name: name.to_string(),
        dtype,
        shape: raw.shape,
        offset: begin,
        len: expected,
    })
}

/// Sorts by offset and rejects any two tensors whose byte ranges intersect.
fn check_no_overlap(tensors: &mut [HeaderTensor], path: &Path) -> Result<()> {
    tensors.sort_by_key(|t| (t.offset, t.len));
    for pair in tensors.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        // Sorted by offset, so only the previous range can reach into this one.
        if b.offset < a.offset + a.len {
            return Err(bad_tensor(
                &b.name,
                path,
                format!("data overlaps tensor `{}`", a.name),
            ));
        }
    }
    Ok(())
}

/// Maps `path`, checks its header and registers every tensor in `set`. Returns the names.
pub fn add_safetensors_file(set: &mut TensorSet, path: &Path) -> Result<Vec<String>> {
    let file = MappedFile::open(path)?;
    let tensors = parse_header(file.bytes(), path)?;
    let index = set.add_file(file);
    let mut names = Vec::with_capacity(tensors.len());
    for t in tensors {
        let entry = TensorEntry {
            dtype: t.dtype,
            shape: t.shape,
            file: index,
            offset: t.offset,
            len: t.len,
        };
        set.insert(t.name.clone(), entry)?;
        names.push(t.name);
    }
    Ok(names)
}

/// Loads the checkpoint in `dir`: `model.safetensors` if present, otherwise the shards named
/// by `model.safetensors.index.json`.
pub fn load_safetensors_dir(dir: &Path) -> Result<TensorSet> {
    let single = dir.join(SINGLE_FILE);
    let index = dir.join(INDEX_FILE);
    let mut set = TensorSet::default();
    if single.is_file() {
        add_safetensors_file(&mut set, &single)?;
    } else if index.is_file() {
        load_sharded(&mut set, dir, &index)?;
    } else {
        return Err(st_err(
            dir,
            format!("neither {SINGLE_FILE} nor {INDEX_FILE} found"),
        ));
    }
    if set.is_empty() {
        return Err(st_err(dir, "the checkpoint holds no tensors"));
    }
    Ok(set)
}

/// Rejects shard names that could leave the model directory: only plain relative
/// components are allowed (no `..`, no root, no drive prefix, not empty).
fn check_shard_name(name: &str, index: &Path) -> Result<()> {
    let path = Path::new(name);
    let plain = !name.is_empty() && path.components().all(|c| matches!(c, Component::Normal(_)));
    if plain {
        Ok(())
    } else {
        Err(st_err(
            index,
            format!("shard name `{name}` is not a plain relative path"),
        ))
    }
}

fn read_index(index: &Path) -> Result<RawIndex> {
    let io_err = |source| ModelError::Io {
        path: index.to_path_buf(),
        source,
    };
    let size = std::fs::metadata(index).map_err(io_err)?.len();
    if size > MAX_INDEX_BYTES {
        return Err(st_err(index, format!("{size} bytes is too large")));
    }
    let text = std::fs::read(index).map_err(io_err)?;
    serde_json::from_slice(&text).map_err(|e| st_err(index, format!("malformed index: {e}")))
}

fn load_sharded(set: &mut TensorSet, dir: &Path, index: &Path) -> Result<()> {
    let map = read_index(index)?.weight_map;
    if map.is_empty() {
        return Err(st_err(index, "weight_map is empty"));
    }
    let shards: BTreeSet<&str> = map.values().map(String::as_str).collect();
    for shard in &shards {
        check_shard_name(shard, index)?;
    }
    for shard in shards {
        let path = dir.join(shard);
        let found: HashSet<String> = add_safetensors_file(set, &path)?.into_iter().collect();
        for (name, listed_in) in &map {
            if listed_in == shard && !found.contains(name) {
                return Err(st_err(
                    index,
                    format!("tensor `{name}` is not in its shard `{shard}`"),
                ));
            }
        }
        if let Some(extra) = found
            .iter()
            .find(|n| map.get(*n).map(String::as_str) != Some(shard))
        {
            return Err(st_err(
                &path,
                format!("holds tensor `{extra}` that the index does not assign to it"),
            ));
        }
    }
    Ok(())
}
