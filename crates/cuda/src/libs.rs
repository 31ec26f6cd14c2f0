//! Finding the CUDA shared libraries at run time.
//!
//! cudarc opens `libcuda`, `libnvrtc` and `libcublas` by name through the dynamic loader,
//! and panics when none of its candidate names loads. This module checks first, so that a
//! machine without CUDA gets a [`CudaError::LibraryNotFound`] naming the library instead.
//!
//! [`preload_library`] opens a library by absolute path and keeps it loaded for the life of
//! the process. Once loaded, a later `dlopen` by the library's soname (for example
//! `libnvrtc.so.13`, one of cudarc's candidates) returns the same library, which is how a
//! library outside the loader's search path (a pip wheel's `lib/` folder) is used.

use std::path::Path;
use std::sync::Mutex;

use crate::error::CudaError;

/// Libraries opened by [`preload_library`]; never closed.
static PRELOADED: Mutex<Vec<libloading::Library>> = Mutex::new(Vec::new());

/// Opens the shared library at `path` and keeps it loaded until the process exits.
pub fn preload_library(path: &Path) -> Result<(), CudaError> {
    let load_err = |reason: String| CudaError::LibraryLoad {
        path: path.to_path_buf(),
        reason,
    };
    // SAFETY: loading a library runs its initialisers. The libraries preloaded here are
    // NVIDIA's CUDA libraries, whose initialisers only set up their own state.
    let lib = unsafe { libloading::Library::new(path) }.map_err(|e| load_err(e.to_string()))?;
    PRELOADED
        .lock()
        .map_err(|_| load_err("the preload registry is poisoned".into()))?
        .push(lib);
    Ok(())
}

/// The CUDA libraries this crate uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CudaLib {
    Driver,
    Nvrtc,
    Cublas,
}

impl CudaLib {
    fn name(self) -> &'static str {
        match self {
            CudaLib::Driver => "libcuda (the NVIDIA driver)",
            CudaLib::Nvrtc => "libnvrtc (the CUDA runtime compiler)",
            CudaLib::Cublas => "libcublas",
        }
    }

    fn stem(self) -> &'static str {
        match self {
            CudaLib::Driver => "cuda",
            CudaLib::Nvrtc => "nvrtc",
            CudaLib::Cublas => "cublas",
        }
    }

    fn hint(self) -> &'static str {
        match self {
            CudaLib::Driver => "is an NVIDIA GPU with its driver installed?",
            CudaLib::Nvrtc | CudaLib::Cublas => {
                "install the CUDA 13 toolkit libraries (or the nvidia-* pip wheels) and add \
                 their lib folder to LD_LIBRARY_PATH"
            }
        }
    }

    fn is_present(self) -> bool {
        // SAFETY: these functions only try `dlopen` on cudarc's candidate names and close
        // what they opened; they call nothing in the library.
        unsafe {
            match self {
                CudaLib::Driver => cudarc::driver::sys::is_culib_present(),
                CudaLib::Nvrtc => cudarc::nvrtc::sys::is_culib_present(),
                CudaLib::Cublas => cudarc::cublas::sys::is_culib_present(),
            }
        }
    }

    /// `Ok` when cudarc will find the library, else the error naming it.
    pub(crate) fn require(self) -> Result<(), CudaError> {
        if self.is_present() {
            return Ok(());
        }
        let candidates = cudarc::get_lib_name_candidates(self.stem());
        Err(CudaError::LibraryNotFound {
            library: self.name(),
            searched: candidates.join(", "),
            hint: self.hint(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preloading_a_missing_path_is_an_error_naming_it() {
        let err =
            preload_library(Path::new("/nonexistent/libnvrtc.so.13")).expect_err("no such file");
        assert!(err.to_string().contains("libnvrtc.so.13"), "{err}");
    }
}
