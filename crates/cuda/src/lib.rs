//! tandem's CUDA backend: [`CudaRunner`], a [`tandem_model::runner::ModelRunner`] whose
//! weights, paged KV cache and working memory live in GPU memory.
//!
//! Design:
//! - **No CUDA at build time.** cudarc loads `libcuda`, `libnvrtc` and `libcublas` at run
//!   time; [`libs`] checks for each first, so a machine without them gets a
//!   [`CudaError::LibraryNotFound`] naming the library, never a panic.
//! - **Kernels are CUDA C in the repository** (`kernels/*.cu`), compiled by NVRTC at run
//!   time to a cubin for the device's compute capability and cached on disk
//!   ([`nvrtc_cache`]). One program per numeric mode: `act_t` (the storage type of weights,
//!   matrix-product inputs and KV) is bf16 or f32.
//! - **Matrix products through cuBLAS** (`cublasGemmEx`, f32 accumulation, f32 outputs);
//!   q/k/v and gate/up are fused into one matrix each.
//! - **Numerics:** the residual stream, norms, RoPE, softmax and the stored final hidden
//!   states are f32 in both modes; bf16 mode rounds only what cuBLAS reads and the KV cache.
//! - **Paged KV** exactly as the engine addresses it: slot `table[p / bs] * bs + p % bs`,
//!   per layer `[num_slots, kv_dim]` key and value planes, plus each slot's final hidden
//!   state for `cached_logits`. The LM head always runs on fixed tiles of rows gathered from
//!   that store, so a row's logits do not depend on the call that produced them.

#![allow(unsafe_code)] // a kernel-level crate; every unsafe block states its SAFETY

mod attention_kernels;
mod attention_tiles;
mod batch_layout;
mod decode_graphs;
mod device;
mod device_rows;
mod draw_buffers;
#[cfg(test)]
mod emulated_tests;
#[cfg(test)]
mod emulator;
mod error;
mod forward;
mod gemm;
mod host_staging;
pub mod kernels;
mod kv_pool;
mod launched_steps;
mod layer_program;
mod libs;
mod moe_kernels;
pub mod nvrtc_cache;
mod options;
mod product_kernels;
mod program_buffers;
mod q4_weights;
mod q8_weights;
mod row_kernels;
mod runner;
mod step_inputs;
mod step_launch;
mod step_profile;
mod weight_conversion;
mod weights;

pub use device::{probe, DeviceInfo, GpuInfo};
pub use error::CudaError;
pub use libs::preload_library;
pub use options::{CudaDtype, CudaOptions, CudaWeights, KvBudget};
pub use runner::CudaRunner;
pub use step_profile::StepProfile;
