//! Tensor storage shared by the GGUF and safetensors loaders: memory-mapped files and a
//! name -> tensor table whose entries point into them. Weights stay in their stored
//! (possibly quantized) format; nothing is dequantized at load time.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use tandem_kernels::{DType, WeightView};

use crate::error::{ModelError, Result};

/// A read-only memory map of a whole file.
#[derive(Debug)]
pub struct MappedFile {
    path: PathBuf,
    mmap: Mmap,
}

impl MappedFile {
    /// Maps `path` read-only. This and [`MappedFile::release`] are the crate's audited `unsafe`
    /// blocks.
    pub fn open(path: &Path) -> Result<MappedFile> {
        let io_err = |source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io_err)?;
        // SAFETY: the map is read-only and private to this process. Model files are not
        // expected to change while loaded; if another process truncates the file the OS
        // may signal, which is the accepted risk of every mmap-based loader. All reads go
        // through the bounds-checked `&[u8]` returned by `bytes()`.
        #[allow(unsafe_code)]
        let mmap = unsafe { Mmap::map(&file) }.map_err(io_err)?;
        Ok(MappedFile {
            path: path.to_path_buf(),
            mmap,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn bytes(&self) -> &[u8] {
        &self.mmap
    }

    /// Drops this process's resident pages of bytes `range` (rounded out to whole pages); a
    /// later read faults them back in from the file, unchanged. For tensors read once at load
    /// time (repacked), so that they do not count twice in resident memory. Best effort: an
    /// error leaves the pages where they are.
    pub fn release(&self, range: std::ops::Range<usize>) {
        if range.end > self.mmap.len() || range.is_empty() {
            return;
        }
        // SAFETY: the map is read-only and private and this process never writes to it, so
        // every page is clean: MADV_DONTNEED only unmaps them, and the next access reads the
        // same bytes back from the file. Slices borrowed from `bytes()` stay valid and keep
        // their contents.
        #[allow(unsafe_code)]
        let _ = unsafe {
            self.mmap.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                range.start,
                range.len(),
            )
        };
    }
}

/// Where one tensor lives. `shape` is outermost-first (row-major): a matrix that maps
/// `in` features to `out` features has shape `[out, in]`, each row `in` elements long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Index of the file in the [`TensorSet`].
    pub file: usize,
    /// Byte offset of the first element within the file.
    pub offset: usize,
    /// Length in bytes; equals `dtype.bytes_for(product of shape)`.
    pub len: usize,
}

/// A borrowed tensor: its type, shape and raw bytes.
#[derive(Debug, Clone, Copy)]
pub struct TensorRef<'a> {
    pub name: &'a str,
    pub dtype: DType,
    pub shape: &'a [usize],
    pub data: &'a [u8],
}

impl<'a> TensorRef<'a> {
    /// Views a 2-D tensor `[rows, cols]` as a weight matrix.
    pub fn matrix(&self) -> Result<WeightView<'a>> {
        let bad = |reason: String| ModelError::BadTensor {
            name: self.name.to_string(),
            reason,
        };
        let [rows, cols] = *self.shape else {
            return Err(bad(format!(
                "expected 2 dimensions, found {:?}",
                self.shape
            )));
        };
        WeightView::new(self.dtype, rows, cols, self.data).ok_or_else(|| {
            bad(format!(
                "{} bytes do not hold {rows}x{cols} {}",
                self.data.len(),
                self.dtype
            ))
        })
    }

    /// Dequantizes the whole tensor to f32 (for small tensors: norms, biases).
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let n: usize = self.shape.iter().product();
        let mut out = vec![0.0; n];
        if self.dtype.bytes_for(n) != Some(self.data.len()) {
            return Err(ModelError::BadTensor {
                name: self.name.to_string(),
                reason: "size does not match shape".into(),
            });
        }
        tandem_kernels::quant::dequantize_row(self.dtype, self.data, &mut out);
        Ok(out)
    }
}

/// A resolved tensor of a [`TensorSet`], cheap to keep and to look up again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TensorHandle(usize);

/// All tensors of a model, by name, over one or more mapped files.
#[derive(Debug, Default)]
pub struct TensorSet {
    files: Vec<MappedFile>,
    /// Tensors in insertion order; [`TensorHandle`] indexes this.
    entries: Vec<(String, TensorEntry)>,
    by_name: HashMap<String, usize>,
}

impl TensorSet {
    /// Adds a mapped file and returns its index for [`TensorEntry::file`].
    pub fn add_file(&mut self, file: MappedFile) -> usize {
        self.files.push(file);
        self.files.len() - 1
    }

    /// Registers a tensor after checking that it lies inside its file and that its byte
    /// length matches its shape and type.
    pub fn insert(&mut self, name: String, entry: TensorEntry) -> Result<()> {
        let bad = |reason: String| ModelError::BadTensor {
            name: name.clone(),
            reason,
        };
        let file = self
            .files
            .get(entry.file)
            .ok_or_else(|| bad("unknown file index".into()))?;
        let n = entry
            .shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| bad(format!("shape {:?} overflows", entry.shape)))?;
        if entry.dtype.bytes_for(n) != Some(entry.len) {
            return Err(bad(format!(
                "{} bytes do not hold {n} {} elements",
                entry.len, entry.dtype
            )));
        }
        let end = entry
            .offset
            .checked_add(entry.len)
            .ok_or_else(|| bad("offset overflows".into()))?;
        if end > file.bytes().len() {
            return Err(bad(format!(
                "data [{}, {end}) lies past the end of the file ({} bytes)",
                entry.offset,
                file.bytes().len()
            )));
        }
        if self.by_name.contains_key(&name) {
            return Err(bad("duplicate tensor name".into()));
        }
        self.by_name.insert(name.clone(), self.entries.len());
        self.entries.push((name, entry));
        Ok(())
    }

    /// Replaces the matrix `name` (`[rows, cols]`) by consecutive blocks of its rows, named
    /// and sized by `parts` (their row counts must add up to `rows`): views of the same bytes,
    /// for fused projections such as Phi-3's q/k/v. Call before taking handles.
    pub fn split_rows(&mut self, name: &str, parts: &[(String, usize)]) -> Result<()> {
        let bad = |reason: String| ModelError::BadTensor {
            name: name.to_string(),
            reason,
        };
        let index = *self
            .by_name
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        let fused = self.entries[index].1.clone();
        let [rows, cols] = fused.shape[..] else {
            return Err(bad(format!(
                "expected 2 dimensions, found {:?}",
                fused.shape
            )));
        };
        let want: usize = parts.iter().map(|(_, r)| r).sum();
        if want != rows {
            return Err(bad(format!(
                "{rows} rows, expected {want} ({})",
                parts
                    .iter()
                    .map(|(n, r)| format!("{r} for {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let row_bytes = fused
            .dtype
            .bytes_for(cols)
            .filter(|b| b * rows == fused.len)
            .ok_or_else(|| bad(format!("rows of {cols} {} do not split", fused.dtype)))?;
        self.by_name.remove(name);
        let mut offset = fused.offset;
        for (i, (part, part_rows)) in parts.iter().enumerate() {
            if self.by_name.contains_key(part) {
                return Err(bad(format!("its part `{part}` is also stored on its own")));
            }
            let entry = TensorEntry {
                shape: vec![*part_rows, cols],
                offset,
                len: part_rows * row_bytes,
                ..fused.clone()
            };
            offset += entry.len;
            // The first part takes the fused tensor's place, so handles stay dense.
            if i == 0 {
                self.entries[index] = (part.clone(), entry);
                self.by_name.insert(part.clone(), index);
            } else {
                self.by_name.insert(part.clone(), self.entries.len());
                self.entries.push((part.clone(), entry));
            }
        }
        Ok(())
    }

    /// Replaces the 3-D tensor `name` (`[parts.len(), rows, cols]`, e.g. all the experts'
    /// gate matrices of a layer) by one `[rows, cols]` matrix per entry of `parts`: views of
    /// the same bytes. Call before taking handles.
    pub fn split_outer(&mut self, name: &str, parts: &[String]) -> Result<()> {
        let index = *self
            .by_name
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        let entry = &mut self.entries[index].1;
        let [outer, rows, cols] = entry.shape[..] else {
            return Err(ModelError::BadTensor {
                name: name.to_string(),
                reason: format!("expected 3 dimensions, found {:?}", entry.shape),
            });
        };
        if outer != parts.len() {
            return Err(ModelError::BadTensor {
                name: name.to_string(),
                reason: format!(
                    "shape {:?} holds {outer} matrices, expected {}",
                    entry.shape,
                    parts.len()
                ),
            });
        }
        // `insert` checked that the product of the dimensions does not overflow.
        entry.shape = vec![outer * rows, cols];
        let sized: Vec<(String, usize)> = parts.iter().map(|p| (p.clone(), rows)).collect();
        self.split_rows(name, &sized)
    }

    pub fn get(&self, name: &str) -> Option<TensorRef<'_>> {
        self.handle(name).map(|h| self.by_handle(h))
    }

    /// The handle of a tensor, for repeated lookups without hashing.
    pub fn handle(&self, name: &str) -> Option<TensorHandle> {
        self.by_name.get(name).map(|&i| TensorHandle(i))
    }

    /// The tensor behind a handle obtained from this set.
    pub fn by_handle(&self, h: TensorHandle) -> TensorRef<'_> {
        let (name, e) = &self.entries[h.0];
        // Bounds were checked by `insert`.
        let data = &self.files[e.file].bytes()[e.offset..e.offset + e.len];
        TensorRef {
            name,
            dtype: e.dtype,
            shape: &e.shape,
            data,
        }
    }

    /// Drops the resident pages of the tensor's bytes (see [`MappedFile::release`]).
    pub fn release_pages(&self, h: TensorHandle) {
        let e = &self.entries[h.0].1;
        self.files[e.file].release(e.offset..e.offset + e.len);
    }

    /// Like [`TensorSet::get`] but a missing tensor is an error.
    pub fn require(&self, name: &str) -> Result<TensorRef<'_>> {
        self.get(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(n, _)| n.as_str())
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Total bytes of tensor data.
    pub fn total_bytes(&self) -> usize {
        self.entries.iter().map(|(_, e)| e.len).sum()
    }

    /// A hash of every tensor's name, type and shape and of a sample of its bytes (the first,
    /// middle and last 4 KiB): tells two models of the same shapes apart (a fine-tune changes
    /// every tensor) without reading gigabytes. Equal across processes of the same build.
    pub fn sampled_digest(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        const SAMPLE: usize = 4096;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for i in 0..self.entries.len() {
            let t = self.by_handle(TensorHandle(i));
            (t.name, format!("{:?}", t.dtype), t.shape, t.data.len()).hash(&mut h);
            let mid = t.data.len() / 2;
            for start in [
                0,
                mid.saturating_sub(SAMPLE / 2),
                t.data.len().saturating_sub(SAMPLE),
            ] {
                t.data[start..(start + SAMPLE).min(t.data.len())].hash(&mut h);
            }
        }
        h.finish()
    }
}
