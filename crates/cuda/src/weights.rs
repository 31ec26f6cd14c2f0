//! The model's weights on the device: each layer converted on the host
//! (`weight_conversion.rs`: any stored format, GGUF quants included, to the storage type or,
//! for the layers' matrices under `--cuda-weights q8_0` or `q4_1`, quantized) and uploaded,
//! a layer at a time. Norm weights and biases stay f32.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr};
use tandem_model::host_model::HostModel;

use crate::error::CudaError;
use crate::forward::ptr;
use crate::options::{CudaDtype, CudaWeights};
use crate::program_buffers::{LayerPtrs, MatrixPtrs, MlpPtrs, WeightPtrs};
use crate::weight_conversion::{convert_embeddings, convert_layer, HostMatrix, HostMlp};

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
    pub mlp: DeviceMlp,
    /// `[h]` f32 each: the norms of the attention's and the MLP's outputs (Gemma 3).
    pub post_norms: Option<[CudaSlice<f32>; 2]>,
}

/// A layer's MLP on the device (see `weight_conversion::HostMlp` for the layouts).
#[derive(Debug)]
pub(crate) enum DeviceMlp {
    Dense {
        gate_up: DeviceMatrix,
        down: DeviceMatrix,
    },
    Experts {
        router: CudaSlice<u8>,
        gate_up: DeviceMatrix,
        down: DeviceMatrix,
    },
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
                mlp: match &l.mlp {
                    DeviceMlp::Dense { gate_up, down } => MlpPtrs::Dense {
                        gate_up: gate_up.ptrs(s),
                        down: down.ptrs(s),
                    },
                    DeviceMlp::Experts {
                        router,
                        gate_up,
                        down,
                    } => MlpPtrs::Experts {
                        router: ptr(router, s),
                        gate_up: gate_up.ptrs(s),
                        down: down.ptrs(s),
                    },
                },
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
            mlp: match &h.mlp {
                HostMlp::Dense { gate_up, down } => DeviceMlp::Dense {
                    gate_up: up.matrix(gate_up)?,
                    down: up.matrix(down)?,
                },
                HostMlp::Experts {
                    router,
                    gate_up,
                    down,
                } => DeviceMlp::Experts {
                    router: up.put(router)?,
                    gate_up: up.matrix(gate_up)?,
                    down: up.matrix(down)?,
                },
            },
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
