//! Compiles every kernel with NVRTC for sm_80 and sm_90, in both numeric modes, and fails on
//! any error or warning, and on any kernel that would not launch or would run slowly for
//! want of registers: ptxas's report (`-v`) must show no stack frame and no spills, at most
//! 48 KiB of static shared memory, and few enough registers for the kernel's largest block
//! on one multiprocessor. Needs no GPU: only `libnvrtc`.
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
fn every_kernel_compiles_cleanly_and_fits_a_multiprocessor_on_sm80_and_sm90() {
    load_nvrtc();
    let (major, minor) = nvrtc_version().expect("NVRTC loads after preloading");
    assert!(major >= 12, "NVRTC {major}.{minor} is too old");
    let source = program_source();
    for arch in ["sm_80", "sm_90"] {
        for dtype in [CudaDtype::Bf16, CudaDtype::F32] {
            let mut options = program_options(dtype);
            options.push("--ptxas-options=-v".into());
            let compiled = compile_cubin(&source, arch, &options)
                .unwrap_or_else(|e| panic!("{arch} {dtype:?}: {e}"));
            let (warnings, resources) = read_log(&compiled.log);
            assert!(
                warnings.is_empty(),
                "{arch} {dtype:?}: NVRTC warned:\n{warnings}"
            );
            check_resources(&format!("{arch} {dtype:?}"), &resources);
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

/// What ptxas reports of one kernel.
#[derive(Debug, Default)]
struct Resources {
    name: String,
    registers: usize,
    stack_bytes: usize,
    spill_bytes: usize,
    shared_bytes: usize,
}

/// The log's lines other than ptxas's report, and the report's kernels.
fn read_log(log: &str) -> (String, Vec<Resources>) {
    let mut warnings = String::new();
    let mut kernels: Vec<Resources> = Vec::new();
    // The number before `unit` in `line` ("32 bytes stack frame" -> 32).
    let number_before = |line: &str, unit: &str| -> usize {
        line.find(unit)
            .and_then(|at| line[..at].split_whitespace().last())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    for line in log.lines() {
        let report = match line.strip_prefix("ptxas") {
            Some(r) if !r.contains("warning") && !r.contains("error") => r,
            _ => {
                if !line.trim().is_empty() {
                    warnings.push_str(line);
                    warnings.push('\n');
                }
                continue;
            }
        };
        if let Some(at) = report.find("entry function '") {
            let rest = &report[at + "entry function '".len()..];
            let name = rest.split('\'').next().unwrap_or_default().to_string();
            kernels.push(Resources {
                name,
                ..Resources::default()
            });
        } else if let Some(k) = kernels.last_mut() {
            if report.contains("stack frame") {
                k.stack_bytes = number_before(report, "bytes stack frame");
                k.spill_bytes = number_before(report, "bytes spill stores")
                    + number_before(report, "bytes spill loads");
            } else if report.contains("registers") {
                k.registers = number_before(report, "registers");
                k.shared_bytes = number_before(report, "bytes smem");
            }
        }
    }
    (warnings, kernels)
}

/// The most threads a launch of `kernel` may have: paged_attention's tiles grow to 1024
/// threads (`attention_tiles.rs`, MAX_BLOCK_THREADS); every other launch takes at most 256
/// (ROW_THREADS and the row, sampling and expert kernels' block sizes).
fn max_launch_threads(kernel: &str) -> usize {
    match kernel {
        "paged_attention" => 1024,
        _ => 256,
    }
}

fn check_resources(what: &str, kernels: &[Resources]) {
    for name in KERNEL_NAMES {
        let k = kernels
            .iter()
            .find(|k| k.name == name)
            .unwrap_or_else(|| panic!("{what}: no ptxas report of {name}"));
        assert!(k.registers > 0, "{what}: {k:?} reports no registers");
        assert_eq!(
            (k.stack_bytes, k.spill_bytes),
            (0, 0),
            "{what}: {name} keeps values in local memory: {k:?}"
        );
        // 64K registers a multiprocessor on sm_80 and sm_90.
        let threads = max_launch_threads(name);
        assert!(
            k.registers * threads <= 65_536,
            "{what}: {name}'s {} registers a thread do not fit a block of {threads}",
            k.registers
        );
        assert!(
            k.shared_bytes <= 48 * 1024,
            "{what}: {name} declares {} bytes of static shared memory",
            k.shared_bytes
        );
    }
}
