//! The model's weights on the device. Each matrix is dequantized on the host a block of rows
//! at a time (any stored format, GGUF quants included), converted to the storage type (or,
//! for the layers' matrices under `--cuda-weights q8_0` or `q4_1`, quantized) and uploaded;
//! q/k/v and gate/up are concatenated row-wise into one matrix each, so one matrix product
//! computes all three (two). Norm weights and biases stay f32.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr};
use half::bf16;
use tandem_model::host_model::HostModel;
use tandem_model::transformer::{FeedForward, LayerWeights};
use tandem_model::weights::TensorRef;

use crate::error::CudaError;
use crate::forward::ptr;
use crate::layer_program::{LayerPtrs, MatrixPtrs, WeightPtrs};
use crate::options::{CudaDtype, CudaWeights};
use crate::q4_weights::{self, Q4_BLOCK};
use crate::q8_weights::{self, Q8_BLOCK};

/// Rows dequantized per step when converting a matrix.
const ROW_BLOCK: usize = 64;

/// A `[rows, cols]` matrix of a decoder layer on the device.
#[derive(Debug)]
pub(crate) enum DeviceMatrix {
    /// In the storage type.
    Dense(CudaSlice<u8>),
    /// Q8_0: `[rows, cols]` int8 codes and `[rows, cols / 32]` f32 scales.
    Q8 {
        codes: CudaSlice<u8>,
        scales: CudaSlice<f32>,
    },
    /// Q4_1: `[rows, cols / 32]` blocks of 16 code bytes and as many u32 scales (f16 `d`
    /// and `m`); see kernels/q4.cu.
    Q4 {
        codes: CudaSlice<u8>,
        scales: CudaSlice<u32>,
    },
}

/// One decoder layer on the device.
#[derive(Debug)]
pub(crate) struct DeviceLayer {
    /// `[h]` f32.
    pub attn_norm: CudaSlice<f32>,
    /// `[q_dim + 2 * kv_dim, h]`: q, k, v rows.
    pub qkv: DeviceMatrix,
    /// `[q_dim + 2 * kv_dim]` f32 (Qwen2).
    pub qkv_bias: Option<CudaSlice<f32>>,
    /// `[2, head_dim]` f32: q then k head-norm weights (Qwen3).
    pub qk_norm: Option<CudaSlice<f32>>,
    /// `[h, q_dim]`.
    pub o: DeviceMatrix,
    /// `[h]` f32.
    pub ffn_norm: CudaSlice<f32>,
    /// `[2 * ff, h]`: gate rows, then up rows.
    pub gate_up: DeviceMatrix,
    /// `[h, ff]`.
    pub down: DeviceMatrix,
    /// `[h]` f32 each: the norms of the attention's and the MLP's outputs (Gemma 3).
    pub post_norms: Option<[CudaSlice<f32>; 2]>,
}

/// All weights on the device.
#[derive(Debug)]
pub(crate) struct DeviceWeights {
    /// `[vocab, h]` storage type.
    pub embed: CudaSlice<u8>,
    /// `[vocab, h]` storage type; `None` when tied to the embedding.
    pub lm_head: Option<CudaSlice<u8>>,
    /// `[h]` f32.
    pub final_norm: CudaSlice<f32>,
    pub layers: Vec<DeviceLayer>,
    /// Bytes of device memory the weights take.
    pub bytes: usize,
    /// Elements of the largest quantized matrix (0 without any): the scratch it expands
    /// into.
    pub largest_quantized: usize,
    /// How the layers' matrices are stored.
    pub format: CudaWeights,
}

impl DeviceWeights {
    /// The addresses [`LayerProgram`](crate::layer_program::LayerProgram) reads.
    pub fn ptrs(&self, s: &CudaStream) -> WeightPtrs {
        let layers = self
            .layers
            .iter()
            .map(|l| LayerPtrs {
                attn_norm: ptr(&l.attn_norm, s),
                qkv: l.qkv.ptrs(s),
                qkv_bias: l.qkv_bias.as_ref().map(|b| ptr(b, s)),
                qk_norm: l.qk_norm.as_ref().map(|b| ptr(b, s)),
                o: l.o.ptrs(s),
                ffn_norm: ptr(&l.ffn_norm, s),
                gate_up: l.gate_up.ptrs(s),
                down: l.down.ptrs(s),
                post_norms: l
                    .post_norms
                    .as_ref()
                    .map(|p| p.each_ref().map(|w| ptr(w, s))),
            })
            .collect();
        WeightPtrs {
            embed: ptr(&self.embed, s),
            lm_head: ptr(self.lm_head.as_ref().unwrap_or(&self.embed), s),
            final_norm: ptr(&self.final_norm, s),
            layers,
        }
    }
}

impl DeviceMatrix {
    fn ptrs(&self, s: &CudaStream) -> MatrixPtrs {
        match self {
            DeviceMatrix::Dense(d) => MatrixPtrs::Dense(ptr(d, s)),
            DeviceMatrix::Q8 { codes, scales } => MatrixPtrs::Q8 {
                codes: ptr(codes, s),
                scales: ptr(scales, s),
            },
            DeviceMatrix::Q4 { codes, scales } => MatrixPtrs::Q4 {
                codes: ptr(codes, s),
                scales: ptr(scales, s),
            },
        }
    }
}

/// Converts and uploads every weight of `host`, a layer at a time (at most one layer's
/// converted copy is in host memory at once).
pub(crate) fn upload(
    host: &HostModel,
    dtype: CudaDtype,
    format: CudaWeights,
    stream: &Arc<CudaStream>,
) -> Result<DeviceWeights, CudaError> {
    let mut up = Uploader { stream, bytes: 0 };
    let (embed, lm_head) = convert_embeddings(host, dtype)?;
    let embed = up.put(&embed)?;
    let lm_head = lm_head.map(|m| up.put(&m)).transpose()?;
    let final_norm = up.put(&host.weights.final_norm)?;
    let mut largest_quantized = 0;
    let mut layers = Vec::with_capacity(host.weights.layers.len());
    for l in &host.weights.layers {
        let h = convert_layer(host, l, dtype, format)?;
        largest_quantized = largest_quantized.max(h.largest_quantized());
        layers.push(DeviceLayer {
            attn_norm: up.put(&h.attn_norm)?,
            qkv: up.matrix(&h.qkv)?,
            qkv_bias: h.qkv_bias.map(|b| up.put(&b)).transpose()?,
            qk_norm: h.qk_norm.map(|b| up.put(&b)).transpose()?,
            o: up.matrix(&h.o)?,
            ffn_norm: up.put(&h.ffn_norm)?,
            gate_up: up.matrix(&h.gate_up)?,
            down: up.matrix(&h.down)?,
            post_norms: match &h.post_norms {
                Some([attn, mlp]) => Some([up.put(attn)?, up.put(mlp)?]),
                None => None,
            },
        });
    }
    Ok(DeviceWeights {
        embed,
        lm_head,
        final_norm,
        layers,
        bytes: up.bytes,
        largest_quantized,
        format,
    })
}

/// Copies host data to the device and counts the bytes.
struct Uploader<'a> {
    stream: &'a Arc<CudaStream>,
    bytes: usize,
}

impl Uploader<'_> {
    fn put<T: DeviceRepr>(&mut self, v: &[T]) -> Result<CudaSlice<T>, CudaError> {
        self.bytes += std::mem::size_of_val(v);
        Ok(self.stream.clone_htod(v)?)
    }

    fn matrix(&mut self, m: &HostMatrix) -> Result<DeviceMatrix, CudaError> {
        Ok(match m {
            HostMatrix::Dense(d) => DeviceMatrix::Dense(self.put(d)?),
            HostMatrix::Q8 { codes, scales, .. } => DeviceMatrix::Q8 {
                codes: self.put(codes)?,
                scales: self.put(scales)?,
            },
            HostMatrix::Q4 { codes, scales, .. } => DeviceMatrix::Q4 {
                codes: self.put(codes)?,
                scales: self.put(scales)?,
            },
        })
    }
}

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

/// One decoder layer converted on the host, in the layout of [`DeviceLayer`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HostLayer {
    pub attn_norm: Vec<f32>,
    pub qkv: HostMatrix,
    pub qkv_bias: Option<Vec<f32>>,
    pub qk_norm: Option<Vec<f32>>,
    pub o: HostMatrix,
    pub ffn_norm: Vec<f32>,
    pub gate_up: HostMatrix,
    pub down: HostMatrix,
    /// The attention's output norm and the MLP's.
    pub post_norms: Option<[Vec<f32>; 2]>,
}

impl HostLayer {
    /// Elements of the layer's largest quantized matrix (0 if none is).
    fn largest_quantized(&self) -> usize {
        [&self.qkv, &self.o, &self.gate_up, &self.down]
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
    let FeedForward::Dense(mlp) = &l.mlp else {
        return Err(CudaError::Unsupported(
            "mixture-of-experts layers run on the CPU only".into(),
        ));
    };
    let matrix = |parts: &[(TensorRef<'_>, usize, usize)]| layer_matrix(parts, dtype, format);
    Ok(HostLayer {
        attn_norm: l.attn_norm.clone(),
        qkv: matrix(&[(t(l.q), q_dim, h), (t(l.k), kv_dim, h), (t(l.v), kv_dim, h)])?,
        qkv_bias: l.qkv_bias.as_ref().map(|parts| parts.concat()),
        qk_norm: l.qk_norm.as_ref().map(|parts| parts.concat()),
        o: matrix(&[(t(l.o), h, q_dim)])?,
        ffn_norm: l.ffn_norm.clone(),
        gate_up: matrix(&[(t(mlp.gate), ff, h), (t(mlp.up), ff, h)])?,
        down: matrix(&[(t(mlp.down), h, ff)])?,
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
