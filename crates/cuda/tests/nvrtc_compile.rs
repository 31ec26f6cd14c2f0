//! Compiles every kernel with NVRTC for sm_80 and sm_90, in both numeric modes, and fails on
//! any error or warning. Needs no GPU: only `libnvrtc`.
//!
//! The library is found, in order, at `$TANDEM_NVRTC_LIB` (the path of a `libnvrtc.so.13`),
//! or in the `nvidia-cuda-nvrtc` wheel installed under `<target>/nvrtc-wheel/` — installed
//! there with `python3 -m pip install --target` on first use. It is then loaded by absolute
//! path (see `tandem_cuda::preload_library`). Without it the test fails; it never skips.

use std::path::{Path, PathBuf};
use std::process::Command;

use tandem_cuda::kernels::{program_options, program_source, KERNEL_NAMES};
use tandem_cuda::nvrtc_cache::{compile_cubin, nvrtc_version};
use tandem_cuda::{preload_library, CudaDtype};

/// The wheel providing NVRTC for this test (CUDA 13.0, as the device's driver).
const WHEEL: &str = "nvidia-cuda-nvrtc==13.0.88";

fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"),
    }
}

/// The path of `libnvrtc.so.13`, installing the wheel if needed.
fn nvrtc_library() -> PathBuf {
    if let Some(p) = std::env::var_os("TANDEM_NVRTC_LIB") {
        return PathBuf::from(p);
    }
    let wheel_dir = target_dir().join("nvrtc-wheel");
    let lib = wheel_dir.join("nvidia/cu13/lib/libnvrtc.so.13");
    if !lib.is_file() {
        let status = Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "--no-deps", "--target"])
            .arg(&wheel_dir)
            .arg(WHEEL)
            .status();
        assert!(
            matches!(status, Ok(s) if s.success()),
            "could not install {WHEEL} into {} with `python3 -m pip` ({status:?}); install it \
             there yourself or set TANDEM_NVRTC_LIB to the path of a libnvrtc.so.13",
            wheel_dir.display()
        );
    }
    assert!(
        lib.is_file(),
        "{} is missing after installing {WHEEL}",
        lib.display()
    );
    lib
}

fn load_nvrtc() {
    let lib = nvrtc_library();
    // libnvrtc loads its builtins library from the same folder; load it first so that the
    // lookup by soname succeeds whatever the loader's search path.
    if let Some(dir) = lib.parent() {
        let builtins = dir.join("libnvrtc-builtins.so.13.0");
        if builtins.is_file() {
            preload_library(&builtins).expect("load libnvrtc-builtins");
        }
    }
    preload_library(&lib).expect("load libnvrtc");
}

#[test]
fn every_kernel_compiles_without_warnings_for_sm80_and_sm90() {
    load_nvrtc();
    let (major, minor) = nvrtc_version().expect("NVRTC loads after preloading");
    assert!(major >= 12, "NVRTC {major}.{minor} is too old");
    let source = program_source();
    for arch in ["sm_80", "sm_90"] {
        for dtype in [CudaDtype::Bf16, CudaDtype::F32] {
            let compiled = compile_cubin(&source, arch, &program_options(dtype))
                .unwrap_or_else(|e| panic!("{arch} {dtype:?}: {e}"));
            assert!(
                compiled.log.is_empty(),
                "{arch} {dtype:?}: NVRTC warned:\n{}",
                compiled.log
            );
            assert!(compiled.cubin.len() > 1000, "{arch} {dtype:?}: empty cubin");
            // Every kernel's name appears in the cubin's symbol table.
            for name in KERNEL_NAMES {
                let found = compiled
                    .cubin
                    .windows(name.len())
                    .any(|w| w == name.as_bytes());
                assert!(
                    found,
                    "{arch} {dtype:?}: kernel {name} missing from the cubin"
                );
            }
        }
    }
}
