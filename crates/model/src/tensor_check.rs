//! Strict checks of a model's tensors against its config, so that a wrong or corrupted file
//! is refused with an error naming what is wrong instead of loading into a model that
//! computes nonsense:
//!
//! - **type class** ([`check_dtype`]): norms and biases are float vectors (F32 only in a GGUF
//!   file, as llama.cpp's converters write every 1-D tensor; F32, F16 or BF16 in a
//!   safetensors checkpoint, which stores every tensor in the model's dtype; both convert
//!   exactly to f32), matrices any supported stored type;
//! - **layer count** ([`check_layer_count`]): the declared layer count equals the layers
//!   whose tensors are present, numbered from 0 without a hole;
//! - **head counts** ([`check_attention_shapes`]): heads × head_dim match the rows of layer
//!   0's q and k projections, and the embedding matches the vocabulary and hidden sizes;
//! - **every tensor used** ([`TensorUse`]): the builder claims each tensor it resolves, and
//!   whatever is left over, apart from the format's known extras, is an error that lists it
//!   (as llama.cpp's loader does).

use std::collections::{BTreeSet, HashSet};

use tandem_kernels::DType;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::tensor_names::{Hyper, NameScheme, Part};
use crate::weights::TensorSet;

/// Most names an error lists before summarizing the rest.
const MAX_LISTED: usize = 10;

/// What a tensor is for, which decides the types it may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A norm weight or a bias, converted to f32 at load.
    Vector,
    /// A projection or embedding matrix, used in its stored type.
    Matrix,
}

/// The types a tensor of `role` may have in a file of `scheme`.
pub fn allowed_dtypes(scheme: NameScheme, role: Role) -> &'static [DType] {
    match (scheme, role) {
        (NameScheme::Gguf, Role::Vector) => &[DType::F32],
        (NameScheme::HuggingFace, _) => &[DType::F32, DType::F16, DType::BF16],
        (NameScheme::Gguf, Role::Matrix) => &DType::ALL,
    }
}

/// Refuses a tensor whose type its role does not allow (e.g. a Q4_0 or BF16 norm in a GGUF
/// file: bytes that were written as F32 and would be read as something else).
pub fn check_dtype(scheme: NameScheme, role: Role, name: &str, dtype: DType) -> Result<()> {
    let allowed = allowed_dtypes(scheme, role);
    if allowed.contains(&dtype) {
        return Ok(());
    }
    let what = match role {
        Role::Vector => "a norm or bias",
        Role::Matrix => "a matrix",
    };
    let list: Vec<String> = allowed.iter().map(|d| d.to_string()).collect();
    let format = match scheme {
        NameScheme::Gguf => "a GGUF file",
        NameScheme::HuggingFace => "a safetensors checkpoint",
    };
    Err(ModelError::BadTensor {
        name: name.to_string(),
        reason: format!(
            "type {dtype}, but {what} in {format} must be {}",
            list.join(" or ")
        ),
    })
}

/// The names of the tensors the builder has claimed, to find the ones left over.
#[derive(Debug, Default)]
pub struct TensorUse {
    used: HashSet<String>,
}

impl TensorUse {
    pub fn claim(&mut self, name: &str) {
        self.used.insert(name.to_string());
    }

    /// Refuses the set if it holds a tensor nobody claimed that is not a known extra.
    pub fn check_all_used(
        &self,
        tensors: &TensorSet,
        scheme: NameScheme,
        c: &ModelConfig,
    ) -> Result<()> {
        let mut names: Vec<String> = tensors
            .names()
            .filter(|n| !self.used.contains(*n) && !scheme.is_allowed_extra(n))
            .map(str::to_string)
            .collect();
        if names.is_empty() {
            return Ok(());
        }
        names.sort();
        Err(ModelError::UnusedTensors {
            architecture: c.architecture.gguf_name().to_string(),
            names,
            allowed: scheme.allowed_extras(),
        })
    }
}

/// `names` for an error message: the first few in backquotes, then how many more.
pub fn list_names(names: &[String]) -> String {
    let shown: Vec<String> = names
        .iter()
        .take(MAX_LISTED)
        .map(|n| format!("`{n}`"))
        .collect();
    let mut s = shown.join(", ");
    if names.len() > MAX_LISTED {
        s.push_str(&format!(" and {} more", names.len() - MAX_LISTED));
    }
    s
}

/// The note on the extras a format may carry, for [`ModelError::UnusedTensors`].
pub fn allowed_note(allowed: &str) -> String {
    format!(" (allowed without being used: {allowed})")
}

/// Refuses a layer count that differs from the layers present: `blk.N` (`model.layers.N`)
/// tensors must exist for exactly `0..num_layers`.
pub fn check_layer_count(c: &ModelConfig, tensors: &TensorSet, scheme: NameScheme) -> Result<()> {
    let found: BTreeSet<usize> = tensors.names().filter_map(|n| scheme.layer_of(n)).collect();
    let contiguous = found.iter().copied().eq(0..found.len());
    if contiguous && found.len() == c.num_layers {
        return Ok(());
    }
    let first = scheme.layer_prefix(0);
    let described = match (found.first(), found.last()) {
        (None, _) | (_, None) => "no layers".to_string(),
        (Some(_), Some(&last)) if contiguous => format!(
            "{} layers ({} to {})",
            found.len(),
            first.trim_end_matches('.'),
            scheme.layer_prefix(last).trim_end_matches('.')
        ),
        (Some(_), Some(&last)) => {
            // Names are untrusted: list a few holes without walking a huge index range.
            let missing: Vec<String> = (0..=last)
                .filter(|i| !found.contains(i))
                .take(MAX_LISTED)
                .map(|i| format!("`{i}`"))
                .collect();
            let more = (last - found.len() + 1).saturating_sub(missing.len());
            let more = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            format!(
                "{} layers numbered with holes (missing: {}{more})",
                found.len(),
                missing.join(", ")
            )
        }
    };
    Err(ModelError::LayerCount {
        key: scheme.key(c.architecture, Hyper::Layers),
        declared: c.num_layers,
        found: described,
    })
}

/// Rows and columns of a 2-D tensor, if present and 2-D.
fn dims(tensors: &TensorSet, name: &str) -> Option<(usize, usize)> {
    match tensors.get(name)?.shape {
        &[rows, cols] => Some((rows, cols)),
        _ => None,
    }
}

/// How `rows` splits into heads of `head_dim`, for messages.
fn as_heads(rows: usize, head_dim: usize) -> String {
    if head_dim > 0 && rows.is_multiple_of(head_dim) {
        format!(" ({} heads of {head_dim})", rows / head_dim)
    } else {
        String::new()
    }
}

/// Refuses head counts, head_dim, hidden or vocabulary sizes that disagree with the shapes
/// of the embedding and of layer 0's q and k. Missing tensors are left to the builder.
pub fn check_attention_shapes(c: &ModelConfig, tensors: &TensorSet, s: NameScheme) -> Result<()> {
    let key = |h| s.key(c.architecture, h);
    if let Some((rows, cols)) = dims(tensors, s.embed()) {
        if cols != c.hidden_size {
            return Err(ModelError::Hyperparameter {
                key: key(Hyper::Hidden),
                reason: format!(
                    "is {}, but `{}` has {cols} columns",
                    c.hidden_size,
                    s.embed()
                ),
            });
        }
        if rows != c.vocab_size {
            return Err(ModelError::Hyperparameter {
                key: key(Hyper::Vocab),
                reason: format!("is {}, but `{}` has {rows} rows", c.vocab_size, s.embed()),
            });
        }
    }
    for (part, heads, hyper) in [
        (Part::Q, c.num_heads, Hyper::Heads),
        (Part::K, c.num_kv_heads, Hyper::KvHeads),
    ] {
        let name = s.layer(0, part);
        let Some((rows, cols)) = dims(tensors, &name) else {
            continue;
        };
        if cols == c.hidden_size && rows != heads * c.head_dim {
            return Err(ModelError::Hyperparameter {
                key: key(hyper),
                reason: format!(
                    "is {heads}, and {heads} heads × head_dim {} need {} rows in `{name}`, \
                     which has {rows}{}",
                    c.head_dim,
                    heads * c.head_dim,
                    as_heads(rows, c.head_dim)
                ),
            });
        }
    }
    Ok(())
}
