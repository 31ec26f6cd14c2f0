//! `tandem plan --calibrate` / `--device cuda` end to end, as far as a machine without a GPU
//! allows: calibrating a CUDA device that is not there is a clear error that saves nothing;
//! `--device auto` calibrates the CPU; CPU and GPU profiles share one calibration file, each
//! device plans with its own, and recalibrating the CPU keeps the GPU's.
#![allow(clippy::unwrap_used)] // helpers outside #[test] functions

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{json, Value};

fn tandem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(args)
        .output()
        .expect("run tandem")
}

fn tmp(name: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_file(&p);
    p
}

/// A config-only model: planning it loads no weights.
fn config() -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../model/tests/fixtures/hf/llama_tied/config.json");
    p.display().to_string()
}

fn profile(name: &str, kind: &str) -> Value {
    json!({
        "name": name, "kind": kind, "source": "test", "threads": 1,
        "bandwidth": 1e12, "matmul": [{"tokens": 1, "flops": 1e13}, {"tokens": 64, "flops": 1e14}],
        "attention_flops": 1e13, "prefill_attention_flops": 1e13, "step_overhead_s": 1e-4,
        "layer_overhead_s": 1e-5, "memory_bytes": 1e10
    })
}

fn hardware_of(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    v["hardware"]["name"].as_str().unwrap().to_string()
}

#[test]
fn calibrating_a_cuda_device_that_is_not_there_is_a_clear_error() {
    let save = tmp("plan_gpu_cli_missing.json");
    let s = save.display().to_string();
    let out = tandem(&["plan", "--calibrate", "--device", "cuda:999", "--save", &s]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    match tandem_cuda::probe() {
        // This machine: no driver. The error names the library.
        Err(tandem_cuda::CudaError::LibraryNotFound { library, .. }) => {
            assert!(
                err.contains("--calibrate --device cuda needs the NVIDIA driver")
                    && err.contains(library),
                "{err}"
            );
        }
        Err(e) => assert!(err.contains(&e.to_string()), "{err}"),
        Ok(found) => assert!(
            err.contains(&format!("{} CUDA devices found", found.device_count())),
            "{err}"
        ),
    }
    assert!(
        !save.exists(),
        "a failed calibration saved {}",
        save.display()
    );
    // A GPU profile is measured on a model's own steps: not from a config alone.
    let out = tandem(&[
        "plan",
        "--calibrate",
        "--device",
        "cuda",
        "--config",
        &config(),
        "--save",
        &s,
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--model, not --config"),
        "{err}"
    );
}

#[test]
fn cpu_and_gpu_profiles_share_the_calibration_file() {
    let file = tmp("plan_gpu_cli_calibration.json");
    let f = file.display().to_string();
    let cfg = config();
    let c = json!({"profiles": [
        profile("old cpu", "cpu"), profile("first gpu", "gpu"), profile("last gpu", "gpu")
    ]});
    std::fs::write(&file, c.to_string()).unwrap();
    let plan = |device: &str| {
        tandem(&[
            "plan",
            "--config",
            &cfg,
            "--hardware",
            &f,
            "--device",
            device,
            "--json",
        ])
    };
    assert_eq!(hardware_of(&plan("cuda")), "last gpu");
    assert_eq!(hardware_of(&plan("cpu")), "old cpu");
    // --device auto calibrates the CPU (and plans with the profile it saved), keeping the
    // GPU profiles.
    let out = tandem(&[
        "plan",
        "--calibrate",
        "--device",
        "auto",
        "--threads",
        "1",
        "--config",
        &cfg,
        "--save",
        &f,
        "--json",
    ]);
    assert_eq!(hardware_of(&out), "this machine, 1 thread(s)");
    let saved: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let names: Vec<&str> = saved["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["this machine, 1 thread(s)", "first gpu", "last gpu"]
    );
    assert_eq!(hardware_of(&plan("cuda")), "last gpu");
    // A file without a GPU profile says how to make one.
    std::fs::write(
        &file,
        json!({"profiles": [profile("cpu", "cpu")]}).to_string(),
    )
    .unwrap();
    let out = plan("cuda");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--calibrate --device cuda"),
        "{err}"
    );
}
