//! The launches of the matrix-product kernels: the batch-invariant product (matmul.cu) and
//! the quantized weights' products (Q8_0: q8.cu; Q4_1: q4.cu). Like every launch they go through
//! [`Kernels::launch`].

use crate::error::CudaError;
use crate::kernels::{Arg, DevPtr, Kernels, ROW_THREADS};

/// Output tile of a `matmul_fixed` block (`MM_TILE_N` x `MM_TILE_M` in matmul.cu).
const MM_TILE_N: usize = 16;
const MM_TILE_M: usize = 64;
/// Most rows of x a `q8_matvec` launch takes (`Q8_MAX_ROWS` in q8.cu); larger products
/// expand the matrix first.
pub(crate) const Q8_MATVEC_ROWS: usize = 8;
/// Most rows of x a `q4_matvec` launch takes (`Q4_MAX_ROWS` in q4.cu).
pub(crate) const Q4_MATVEC_ROWS: usize = 8;

impl Kernels {
    /// `y[n, m] = x[n, k] · w[m, k]ᵀ` with every element summed over k in ascending order
    /// by one thread, whatever the shape (matmul.cu): the batch-invariant product. x, w:
    /// storage type; y: f32.
    #[allow(clippy::too_many_arguments)] // the kernel's arguments
    pub fn matmul_fixed(
        &self,
        x: DevPtr,
        w: DevPtr,
        y: DevPtr,
        n: usize,
        m: usize,
        k: usize,
    ) -> Result<(), CudaError> {
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(w),
            Arg::Ptr(y),
            Arg::I32(n as i32),
            Arg::I32(m as i32),
            Arg::I32(k as i32),
        ];
        let grid = (m.div_ceil(MM_TILE_M) as u32, n.div_ceil(MM_TILE_N) as u32);
        self.launch("matmul_fixed", grid, 256, &args)
    }

    /// `y[n, m] = x[n, k] · W[m, k]ᵀ` from a Q8_0 matrix (codes `[m, k]` bytes, scales
    /// `[m, k / 32]` f32), for `n <= Q8_MATVEC_ROWS`. x: storage type; y: f32.
    #[allow(clippy::too_many_arguments)] // the kernel's arguments
    pub fn q8_matvec(
        &self,
        codes: DevPtr,
        scales: DevPtr,
        x: DevPtr,
        y: DevPtr,
        n: usize,
        m: usize,
        k: usize,
    ) -> Result<(), CudaError> {
        self.quant_matvec("q8_matvec", [codes, scales, x, y], n, m, k)
    }

    /// `out[m, k]` (storage type) = the Q8_0 matrix's weights.
    pub fn q8_dequant(
        &self,
        codes: DevPtr,
        scales: DevPtr,
        out: DevPtr,
        m: usize,
        k: usize,
    ) -> Result<(), CudaError> {
        self.quant_dequant("q8_dequant", [codes, scales, out], m, k)
    }

    /// `y[n, m] = x[n, k] · W[m, k]ᵀ` from a Q4_1 matrix (codes `[m, k / 2]` bytes, scales
    /// `[m, k / 32]` u32 of f16 `d` and `m`), for `n <= Q4_MATVEC_ROWS`. x: storage type;
    /// y: f32.
    #[allow(clippy::too_many_arguments)] // the kernel's arguments
    pub fn q4_matvec(
        &self,
        codes: DevPtr,
        scales: DevPtr,
        x: DevPtr,
        y: DevPtr,
        n: usize,
        m: usize,
        k: usize,
    ) -> Result<(), CudaError> {
        self.quant_matvec("q4_matvec", [codes, scales, x, y], n, m, k)
    }

    /// `out[m, k]` (storage type) = the Q4_1 matrix's weights.
    pub fn q4_dequant(
        &self,
        codes: DevPtr,
        scales: DevPtr,
        out: DevPtr,
        m: usize,
        k: usize,
    ) -> Result<(), CudaError> {
        self.quant_dequant("q4_dequant", [codes, scales, out], m, k)
    }

    /// A quantized matrix-vector kernel (codes, scales, x, y; one warp per output column).
    fn quant_matvec(
        &self,
        kernel: &str,
        ptrs: [DevPtr; 4],
        n: usize,
        m: usize,
        k: usize,
    ) -> Result<(), CudaError> {
        let [codes, scales, x, y] = ptrs;
        let args = [
            Arg::Ptr(codes),
            Arg::Ptr(scales),
            Arg::Ptr(x),
            Arg::Ptr(y),
            Arg::I32(n as i32),
            Arg::I32(m as i32),
            Arg::I32(k as i32),
        ];
        let warps = (ROW_THREADS / 32) as usize;
        self.launch(kernel, (m.div_ceil(warps) as u32, 1), ROW_THREADS, &args)
    }

    /// A dequantization kernel (codes, scales, out; one block per row).
    fn quant_dequant(
        &self,
        kernel: &str,
        ptrs: [DevPtr; 3],
        m: usize,
        k: usize,
    ) -> Result<(), CudaError> {
        let [codes, scales, out] = ptrs;
        let args = [
            Arg::Ptr(codes),
            Arg::Ptr(scales),
            Arg::Ptr(out),
            Arg::I32(k as i32),
        ];
        self.launch(kernel, (m as u32, 1), ROW_THREADS, &args)
    }
}
