//! The weights converted on the host before they go to the device. Each matrix is
//! dequantized a block of rows at a time (any stored format, GGUF quants included) and
//! converted to the storage type or, for the layers' matrices under `--cuda-weights q8_0`
//! or `q4_1`, quantized; q/k/v and gate/up are concatenated row-wise into one matrix each,
//! so one matrix product computes all three (two); a layer's experts are stacked into one
//! matrix per kind, indexed by expert. The runner uploads what this makes
//! (`weights.rs`); the emulated tests place it in host buffers.

use half::bf16;
use tandem_model::host_model::HostModel;
use tandem_model::transformer::{FeedForward, LayerWeights};
use tandem_model::weights::TensorRef;

use crate::error::CudaError;
use crate::options::{CudaDtype, CudaWeights};
use crate::q4_weights::{self, Q4_BLOCK};
use crate::q8_weights::{self, Q8_BLOCK};

/// Rows dequantized per step when converting a matrix.
const ROW_BLOCK: usize = 64;

/// A layer's matrix converted on the host: the storage type's bytes, or codes and scales.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum HostMatrix {
    Dense(Vec<u8>),
    Q8 {
        codes: Vec<u8>,
        scales: Vec<f32>,
        elements: usize,
    },
    Q4 {
        codes: Vec<u8>,
        scales: Vec<u32>,
        elements: usize,
    },
}

/// The MLP of a layer, converted.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum HostMlp {
    /// `gate_up` `[2 * ff, h]`: gate rows, then up rows; `down` `[h, ff]`.
    Dense {
        gate_up: HostMatrix,
        down: HostMatrix,
    },
    /// A mixture of experts: `router` `[experts, h]` in the storage type; the experts'
    /// matrices stacked, in the layers' format: `gate_up` `[experts * 2 * expert_ffn, h]`
    /// (each expert's gate rows, then its up rows), `down` `[experts * h, expert_ffn]`.
    Experts {
        router: Vec<u8>,
        gate_up: HostMatrix,
        down: HostMatrix,
    },
}

/// One decoder layer converted on the host, in the layout of `weights::DeviceLayer`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HostLayer {
    pub attn_norm: Vec<f32>,
    pub qkv: HostMatrix,
    pub qkv_bias: Option<Vec<f32>>,
    pub qk_norm: Option<Vec<f32>>,
    pub o: HostMatrix,
    pub ffn_norm: Vec<f32>,
    pub mlp: HostMlp,
    /// The attention's output norm and the MLP's.
    pub post_norms: Option<[Vec<f32>; 2]>,
}

impl HostLayer {
    /// Elements of the layer's largest quantized matrix (0 if none is).
    pub fn largest_quantized(&self) -> usize {
        let mut matrices = vec![&self.qkv, &self.o];
        if let HostMlp::Dense { gate_up, down } = &self.mlp {
            matrices.extend([gate_up, down]);
        }
        matrices
            .iter()
            .map(|m| match m {
                HostMatrix::Dense(_) => 0,
                HostMatrix::Q8 { elements, .. } | HostMatrix::Q4 { elements, .. } => *elements,
            })
            .max()
            .unwrap_or(0)
    }
}

/// The embedding and, when not tied to it, the LM head, in the storage type.
pub(crate) fn convert_embeddings(
    host: &HostModel,
    dtype: CudaDtype,
) -> Result<(Vec<u8>, Option<Vec<u8>>), CudaError> {
    let (c, w) = (&host.config, &host.weights);
    let tensor = |h| host.tensors.by_handle(h);
    let embed = dense(&[(tensor(w.embed), c.vocab_size, c.hidden_size)], dtype)?;
    let lm_head = if w.lm_head == w.embed {
        None
    } else {
        Some(dense(
            &[(tensor(w.lm_head), c.vocab_size, c.hidden_size)],
            dtype,
        )?)
    };
    Ok((embed, lm_head))
}

/// Converts layer `l` of `host`: q/k/v and gate/up stacked, matrices in `format`.
pub(crate) fn convert_layer(
    host: &HostModel,
    l: &LayerWeights,
    dtype: CudaDtype,
    format: CudaWeights,
) -> Result<HostLayer, CudaError> {
    let c = &host.config;
    let t = |h| host.tensors.by_handle(h);
    let (h, q_dim, kv_dim, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
    let matrix = |parts: &[(TensorRef<'_>, usize, usize)]| layer_matrix(parts, dtype, format);
    let mlp = match (&l.mlp, &c.features.moe) {
        (FeedForward::Dense(mlp), _) => HostMlp::Dense {
            gate_up: matrix(&[(t(mlp.gate), ff, h), (t(mlp.up), ff, h)])?,
            down: matrix(&[(t(mlp.down), h, ff)])?,
        },
        (FeedForward::Experts(e), Some(moe)) => {
            let ff = moe.expert_ffn;
            let gate_up: Vec<_> = e
                .experts
                .iter()
                .flat_map(|x| [(t(x.gate), ff, h), (t(x.up), ff, h)])
                .collect();
            let down: Vec<_> = e.experts.iter().map(|x| (t(x.down), h, ff)).collect();
            HostMlp::Experts {
                router: dense(&[(t(e.router), moe.num_experts, h)], dtype)?,
                gate_up: matrix(&gate_up)?,
                down: matrix(&down)?,
            }
        }
        (FeedForward::Experts(_), None) => {
            return Err(CudaError::Unsupported(
                "a layer of experts in a model configured without them".into(),
            ))
        }
    };
    Ok(HostLayer {
        attn_norm: l.attn_norm.clone(),
        qkv: matrix(&[(t(l.q), q_dim, h), (t(l.k), kv_dim, h), (t(l.v), kv_dim, h)])?,
        qkv_bias: l.qkv_bias.as_ref().map(|parts| parts.concat()),
        qk_norm: l.qk_norm.as_ref().map(|parts| parts.concat()),
        o: matrix(&[(t(l.o), h, q_dim)])?,
        ffn_norm: l.ffn_norm.clone(),
        mlp,
        post_norms: l.post_norms.clone(),
    })
}

/// A layer's matrices `(tensor, rows, cols)`, stacked row-wise, in `format`.
fn layer_matrix(
    parts: &[(TensorRef<'_>, usize, usize)],
    dtype: CudaDtype,
    format: CudaWeights,
) -> Result<HostMatrix, CudaError> {
    let block = match format {
        CudaWeights::Dense => return Ok(HostMatrix::Dense(dense(parts, dtype)?)),
        CudaWeights::Q8_0 => Q8_BLOCK,
        CudaWeights::Q4_1 => Q4_BLOCK,
    };
    if let Some((t, _, cols)) = parts.iter().find(|(_, _, cols)| cols % block != 0) {
        return Err(CudaError::Unsupported(format!(
            "--cuda-weights {} needs rows of a multiple of {block} values; {} has {cols}",
            format.name(),
            t.name
        )));
    }
    let elements: usize = parts.iter().map(|(_, r, c)| r * c).sum();
    let mut codes = Vec::new();
    if format == CudaWeights::Q4_1 {
        let mut scales = Vec::new();
        for (t, rows, cols) in parts {
            for_each_row_block(t, *rows, *cols, |values| {
                q4_weights::quantize(values, &mut codes, &mut scales)
            })?;
        }
        return Ok(HostMatrix::Q4 {
            codes,
            scales,
            elements,
        });
    }
    let mut scales = Vec::new();
    for (t, rows, cols) in parts {
        for_each_row_block(t, *rows, *cols, |values| {
            q8_weights::quantize(values, &mut codes, &mut scales)
        })?;
    }
    Ok(HostMatrix::Q8 {
        codes,
        scales,
        elements,
    })
}

/// The matrices `(tensor, rows, cols)`, stacked row-wise, in the storage type.
fn dense(parts: &[(TensorRef<'_>, usize, usize)], dtype: CudaDtype) -> Result<Vec<u8>, CudaError> {
    let total: usize = parts.iter().map(|(_, r, c)| r * c).sum();
    let mut host = Vec::with_capacity(total * dtype.size());
    for (t, rows, cols) in parts {
        append_converted(t, *rows, *cols, dtype, &mut host)?;
    }
    Ok(host)
}

/// Appends the `[rows, cols]` matrix `t`, converted to `dtype`, to `out` (little-endian).
pub(crate) fn append_converted(
    t: &TensorRef<'_>,
    rows: usize,
    cols: usize,
    dtype: CudaDtype,
    out: &mut Vec<u8>,
) -> Result<(), CudaError> {
    for_each_row_block(t, rows, cols, |values| encode(values, dtype, out))
}

/// Calls `f` with the `[rows, cols]` matrix `t` dequantized to f32, [`ROW_BLOCK`] rows at a
/// time, in order.
fn for_each_row_block(
    t: &TensorRef<'_>,
    rows: usize,
    cols: usize,
    mut f: impl FnMut(&[f32]),
) -> Result<(), CudaError> {
    if t.shape != [rows, cols] {
        return Err(CudaError::Unsupported(format!(
            "tensor {} has shape {:?}, expected [{rows}, {cols}]",
            t.name, t.shape
        )));
    }
    let row_bytes = t.data.len() / rows.max(1);
    let mut buf = vec![0.0f32; ROW_BLOCK * cols]; // [ROW_BLOCK, cols]
    for first in (0..rows).step_by(ROW_BLOCK) {
        let n = ROW_BLOCK.min(rows - first);
        let src = &t.data[first * row_bytes..(first + n) * row_bytes];
        let dst = &mut buf[..n * cols];
        tandem_kernels::quant::dequantize_row(t.dtype, src, dst);
        f(dst);
    }
    Ok(())
}

/// Appends `values` in the storage type: bf16 rounds to nearest, ties to even.
pub(crate) fn encode(values: &[f32], dtype: CudaDtype, out: &mut Vec<u8>) {
    match dtype {
        CudaDtype::Bf16 => {
            for &v in values {
                out.extend_from_slice(&bf16::from_f32(v).to_bits().to_le_bytes());
            }
        }
        CudaDtype::F32 => {
            for &v in values {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_encoding_rounds_to_nearest_even() {
        let mut out = Vec::new();
        // 1 + 2^-8 is halfway between bf16 1.0 and 1 + 2^-7: ties to even (1.0).
        // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even (1 + 2^-6).
        encode(
            &[1.0, 1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0, -2.5],
            CudaDtype::Bf16,
            &mut out,
        );
        let bits: Vec<u16> = out
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        assert_eq!(bits, vec![0x3f80, 0x3f80, 0x3f82, 0xc020]);
        let mut f = Vec::new();
        encode(&[1.5], CudaDtype::F32, &mut f);
        assert_eq!(f, 1.5f32.to_le_bytes());
    }
}
