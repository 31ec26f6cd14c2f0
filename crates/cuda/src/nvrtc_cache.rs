//! Run-time compilation of the kernel sources with NVRTC, straight to a cubin for the
//! device's architecture, with an on-disk cache.
//!
//! The cache key is a SHA-256 of the NVRTC version, the target architecture, the options and
//! the source, so a changed kernel, option or compiler never reuses a stale binary. Cache
//! files are written to a temporary name and renamed into place, so concurrent processes
//! never read a partial file. A cache that cannot be read or written only costs a compile.

use std::ffi::{c_char, c_int, CString};
use std::path::{Path, PathBuf};

use cudarc::nvrtc::{result as nvrtc, sys};
use sha2::{Digest, Sha256};

use crate::error::{catch_binding_panic, CudaError};
use crate::libs::CudaLib;

/// A successful compilation: the cubin and whatever NVRTC logged (warnings).
#[derive(Debug, Clone)]
pub struct Compiled {
    pub cubin: Vec<u8>,
    pub log: String,
}

/// NVRTC's `(major, minor)` version.
pub fn nvrtc_version() -> Result<(i32, i32), CudaError> {
    CudaLib::Nvrtc.require()?;
    catch_binding_panic(|| {
        let (mut major, mut minor): (c_int, c_int) = (0, 0);
        // SAFETY: both pointers are valid for writes of one c_int for the whole call.
        unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
            .result()
            .map_err(|e| CudaError::Nvrtc(format!("nvrtcVersion: {e:?}")))?;
        Ok((major, minor))
    })
}

/// Compiles `source` to a cubin for `arch` (e.g. `"sm_90"`) with the extra `options`.
/// A source NVRTC rejects is a [`CudaError::Compile`] carrying its log.
pub fn compile_cubin(source: &str, arch: &str, options: &[String]) -> Result<Compiled, CudaError> {
    CudaLib::Nvrtc.require()?;
    let src = CString::new(source).map_err(|_| CudaError::Nvrtc("source holds a NUL".into()))?;
    let mut opts = vec![
        format!("--gpu-architecture={arch}"),
        "-default-device".to_string(),
        "--std=c++17".to_string(),
    ];
    opts.extend(options.iter().cloned());
    if opts.iter().any(|o| o.contains('\0')) {
        return Err(CudaError::Nvrtc("an option holds a NUL".into()));
    }
    catch_binding_panic(|| {
        let name = c"tandem_kernels.cu";
        let prog = nvrtc::create_program(&src, Some(name))
            .map_err(|e| CudaError::Nvrtc(format!("create program: {e:?}")))?;
        // SAFETY: `prog` is a live program created above and destroyed below, exactly once;
        // the options were checked for interior NULs, which is the only way this call
        // could panic.
        let compiled = unsafe { nvrtc::compile_program(prog, &opts) };
        // SAFETY: as above; the log is read before the program is destroyed.
        let log = unsafe { nvrtc::get_program_log(prog) }
            .map(|chars| c_chars_to_string(&chars))
            .unwrap_or_default();
        let cubin = match compiled {
            Ok(()) => read_cubin(prog),
            Err(_) => Err(CudaError::Compile {
                arch: arch.to_string(),
                log: log.clone(),
            }),
        };
        // SAFETY: `prog` is live and not used after this call.
        let _ = unsafe { nvrtc::destroy_program(prog) };
        Ok(Compiled { cubin: cubin?, log })
    })
}

/// The cubin of a program compiled successfully.
fn read_cubin(prog: sys::nvrtcProgram) -> Result<Vec<u8>, CudaError> {
    let mut size = 0usize;
    // SAFETY: `prog` is a live, successfully compiled program; `size` is valid for writes.
    unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) }
        .result()
        .map_err(|e| CudaError::Nvrtc(format!("cubin size: {e:?}")))?;
    let mut cubin = vec![0u8; size];
    // SAFETY: `cubin` has exactly the `size` bytes NVRTC reported for this program.
    unsafe { sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast::<c_char>()) }
        .result()
        .map_err(|e| CudaError::Nvrtc(format!("cubin: {e:?}")))?;
    Ok(cubin)
}

fn c_chars_to_string(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).trim().to_string()
}

/// The cubin of `source` for `arch`, from `cache_dir` when compiled before, else compiled
/// now and stored there.
pub fn load_or_compile(
    cache_dir: &Path,
    source: &str,
    arch: &str,
    options: &[String],
) -> Result<Vec<u8>, CudaError> {
    let path = cache_path(cache_dir, source, arch, options)?;
    if let Ok(cubin) = std::fs::read(&path) {
        if !cubin.is_empty() {
            return Ok(cubin);
        }
    }
    let compiled = compile_cubin(source, arch, options)?;
    store(&path, &compiled.cubin);
    Ok(compiled.cubin)
}

/// Where the cubin of this compilation lives in `cache_dir`.
fn cache_path(
    cache_dir: &Path,
    source: &str,
    arch: &str,
    options: &[String],
) -> Result<PathBuf, CudaError> {
    let (major, minor) = nvrtc_version()?;
    let mut h = Sha256::new();
    h.update(format!("nvrtc {major}.{minor}\0{arch}\0").as_bytes());
    for o in options {
        h.update(o.as_bytes());
        h.update([0u8]);
    }
    h.update(source.as_bytes());
    let digest = h.finalize();
    let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
    Ok(cache_dir.join(format!("tandem-{arch}-{hex}.cubin")))
}

/// Best-effort write: temporary file, then rename.
fn store(path: &Path, cubin: &[u8]) {
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    if std::fs::write(&tmp, cubin).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}
