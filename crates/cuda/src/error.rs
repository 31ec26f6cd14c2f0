//! The crate's error type. Nothing in this crate panics on a missing library, a device
//! without memory or a bad batch: every failure becomes a [`CudaError`].

use std::path::PathBuf;

/// What can go wrong preparing or running the CUDA backend.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// A CUDA shared library could not be loaded (no NVIDIA driver, no CUDA toolkit, or the
    /// library is not on the dynamic loader's search path).
    #[error("could not load the CUDA library {library} (searched for {searched}); {hint}")]
    LibraryNotFound {
        library: &'static str,
        searched: String,
        hint: &'static str,
    },
    /// A library at an explicit path could not be opened.
    #[error("could not load {}: {reason}", path.display())]
    LibraryLoad { path: PathBuf, reason: String },
    #[error("CUDA driver error: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    #[error("cuBLAS error: {0}")]
    Cublas(#[from] cudarc::cublas::result::CublasError),
    #[error("NVRTC error: {0}")]
    Nvrtc(String),
    /// NVRTC rejected a kernel source (or warned, where warnings are errors).
    #[error("NVRTC failed to compile the kernels for {arch}:\n{log}")]
    Compile { arch: String, log: String },
    #[error("no CUDA device {ordinal} (the system has {count})")]
    NoSuchDevice { ordinal: usize, count: usize },
    /// The options or the model cannot be served by this backend.
    #[error("{0}")]
    Unsupported(String),
    /// Not enough device memory for the weights, the workspace or the requested KV pool.
    #[error("out of device memory: {0}")]
    OutOfMemory(String),
    /// A CUDA binding panicked (for example on a symbol missing from an older library);
    /// caught at the crate boundary.
    #[error("the CUDA bindings failed: {0}")]
    Binding(String),
    /// A kernel run on the CPU emulator failed (tests; see `emulator`).
    #[cfg(test)]
    #[error("emulated kernel: {0}")]
    Emulator(String),
    #[error(transparent)]
    Model(#[from] tandem_model::ModelError),
}

impl From<CudaError> for tandem_model::ModelError {
    /// The runner trait speaks `ModelError`; device failures travel as its `Batch` variant's
    /// message (the model crate knows nothing of CUDA).
    fn from(e: CudaError) -> Self {
        match e {
            CudaError::Model(m) => m,
            other => tandem_model::ModelError::Batch(format!("cuda: {other}")),
        }
    }
}

/// Runs `f`, turning a panic inside the CUDA bindings into [`CudaError::Binding`].
pub(crate) fn catch_binding_panic<T>(
    f: impl FnOnce() -> Result<T, CudaError>,
) -> Result<T, CudaError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".to_string());
            Err(CudaError::Binding(msg))
        }
    }
}
