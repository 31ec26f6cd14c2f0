//! Matrix products through cuBLAS: `y[n, m] = x[n, k] · w[m, k]ᵀ`, row-major, with `x` and
//! `w` in the storage type (bf16 or f32) and `y` in f32, accumulated in f32.
//!
//! cuBLAS is column-major. A row-major `[rows, cols]` buffer is the column-major
//! `[cols, rows]` matrix, so the product is computed as `yᵀ[m, n] = w · xᵀ` with `w` read
//! transposed (`CUBLAS_OP_T`, `lda = k`), `x` as is (`ldb = k`) and `ldc = m`.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasMath_t, cublasOperation_t, cudaDataType,
};
use cudarc::cublas::{result as blas, CudaBlas};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use crate::error::CudaError;
use crate::kernels::DevPtr;
use crate::options::CudaDtype;

/// cuBLAS's workspace: given up front (the size NVIDIA recommends for Hopper), so that no
/// product allocates while a CUDA graph is being recorded.
const WORKSPACE_BYTES: usize = 32 << 20;

/// A cuBLAS handle bound to the runner's stream, set up for one numeric mode.
#[derive(Debug)]
pub(crate) struct Gemm {
    blas: CudaBlas,
    input_type: cudaDataType,
    /// Kept alive for the handle, which uses it.
    _workspace: CudaSlice<u8>,
}

impl Gemm {
    /// bf16 mode: default math (bf16 tensor cores, f32 accumulation). f32 mode: pedantic
    /// math, so that no TF32 or other reduced precision is used.
    pub fn new(stream: Arc<CudaStream>, dtype: CudaDtype) -> Result<Gemm, CudaError> {
        let blas = CudaBlas::new(stream.clone())?;
        let (input_type, math) = match dtype {
            CudaDtype::Bf16 => (cudaDataType::CUDA_R_16BF, cublasMath_t::CUBLAS_DEFAULT_MATH),
            CudaDtype::F32 => (cudaDataType::CUDA_R_32F, cublasMath_t::CUBLAS_PEDANTIC_MATH),
        };
        // SAFETY: the handle is live (owned by `blas`); setting its math mode has no other
        // precondition.
        unsafe { cudarc::cublas::sys::cublasSetMathMode(*blas.handle(), math) }.result()?;
        let workspace = stream.alloc_zeros::<u8>(WORKSPACE_BYTES)?;
        let address = workspace.device_ptr(&stream).0;
        // SAFETY: the handle is live; `workspace` is a device allocation of
        // WORKSPACE_BYTES bytes in the handle's context, owned by the returned `Gemm` next to
        // the handle, so it outlives every product the handle runs.
        unsafe {
            cudarc::cublas::sys::cublasSetWorkspace_v2(
                *blas.handle(),
                address as *mut c_void,
                WORKSPACE_BYTES,
            )
        }
        .result()?;
        Ok(Gemm {
            blas,
            input_type,
            _workspace: workspace,
        })
    }

    /// `y[n, m] = x[n, k] · w[m, k]ᵀ`. x, w: storage type; y: f32.
    pub fn matmul(
        &self,
        x: DevPtr,
        w: DevPtr,
        y: DevPtr,
        n: usize,
        m: usize,
        k: usize,
    ) -> Result<(), CudaError> {
        if n == 0 {
            return Ok(());
        }
        let dim = |v: usize| {
            i32::try_from(v)
                .map_err(|_| CudaError::Unsupported(format!("matrix dimension {v} exceeds i32")))
        };
        let (n, m, k) = (dim(n)?, dim(m)?, dim(k)?);
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: `w` holds `m * k`, `x` holds `n * k` elements of the storage type and `y`
        // holds `n * m` f32, all live allocations of this handle's context (the callers size
        // them from the model's shapes and the batch). alpha and beta are host f32 scalars,
        // matching the handle's default host pointer mode and the 32F compute type. The call
        // is queued on the runner's one stream.
        unsafe {
            blas::gemm_ex(
                *self.blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                m,
                n,
                k,
                (&alpha as *const f32).cast::<c_void>(),
                w as *const c_void,
                self.input_type,
                k,
                x as *const c_void,
                self.input_type,
                k,
                (&beta as *const f32).cast::<c_void>(),
                y as *mut c_void,
                cudaDataType::CUDA_R_32F,
                m,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }?;
        Ok(())
    }
}
