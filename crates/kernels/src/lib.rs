//! Numeric kernels for tandem.
//!
//! This is the only crate with `unsafe` code. It holds the quantized block formats
//! ([`dtype`], [`quant`]), the scalar reference operations and their SIMD variants chosen at
//! run time ([`isa`]), matrix products over quantized weights ([`matmul`], exact) and over
//! weights repacked for integer dot products ([`packed`], the int8 path), the attention of a
//! query group, or of a tile of a prefill chunk's tokens, over f32, f16 or 8-bit KV rows
//! ([`attention`], [`kv_quant`]), huge-page buffers ([`huge_pages`]), trimming the heap ([`heap`]) and the persistent thread pool
//! ([`thread_pool`]). It knows nothing of models or requests.
#![allow(unsafe_code)]

pub mod attention;
pub mod cpu;
pub mod dot16;
pub mod dtype;
pub mod exp_sum;
pub mod heap;
pub mod huge_pages;
pub mod isa;
mod isa_dispatch;
pub mod kv_quant;
pub mod matmul;
pub mod ops;
pub mod packed;
pub mod parallel;
pub mod quant;
pub mod row_max;
pub mod sampling_weights;
mod simd;
pub mod thread_pool;

pub use dtype::DType;
pub use isa::Isa;
pub use matmul::{matmul, matmul_with, WeightView};
pub use packed::{matmul_packed, matmul_packed_with, PackedMatrix, PackedRows};
pub use thread_pool::ThreadPool;
