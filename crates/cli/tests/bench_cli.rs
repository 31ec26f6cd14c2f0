//! `tandem bench --engine` with sampled requests on the default model: the JSON line reports
//! the sampling settings and every decode token, and settings that would be ignored or are
//! invalid are refused with a clear error.

use std::process::{Command, Output};

use serde_json::Value;

/// `tandem bench --model <default model> --kv-cache-memory 64MiB ARGS`.
fn bench(args: &[&str]) -> Output {
    let model = tandem_model::default_model::test_model_path()
        .expect("the default model is needed; this test does not skip");
    Command::new(env!("CARGO_BIN_EXE_tandem"))
        .arg("bench")
        .arg("--model")
        .arg(model)
        .args(["--kv-cache-memory", "64MiB"])
        .args(args)
        .output()
        .expect("run tandem")
}

#[test]
fn a_sampled_engine_bench_reports_its_settings_and_every_token() {
    let args = [
        "--engine",
        "--batch",
        "3",
        "--prompt-len",
        "16",
        "--gen-len",
        "12",
        "--temperature",
        "0.8",
        "--top-p",
        "0.9",
        "--top-k",
        "50",
        "--min-p",
        "0.05",
    ];
    let out = bench(&args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let text = String::from_utf8(out.stdout).expect("UTF-8");
    let r: Value = serde_json::from_str(text.lines().last().expect("a line")).expect("JSON");
    assert_eq!(r["mode"], "engine");
    assert_eq!(r["temperature"].as_f64(), Some(0.8f32 as f64));
    assert_eq!(r["top_p"].as_f64(), Some(0.9f32 as f64));
    assert_eq!(r["top_k"], 50);
    assert_eq!(r["min_p"].as_f64(), Some(0.05f32 as f64));
    // EOS is ignored: every request decodes G - 1 tokens after its first.
    assert_eq!(r["decode_tokens"], 3 * 11, "{r}");
}

#[test]
fn sampling_flags_that_would_be_ignored_or_are_invalid_are_refused() {
    for (flags, needle) in [
        (vec!["--engine", "--top-p", "0.9"], "give --temperature too"),
        (vec!["--top-k", "5"], "give --temperature too"),
        (vec!["--engine", "--min-p", "0.1"], "give --temperature too"),
        (
            vec!["--prefix-cache", "--temperature", "1"],
            "--temperature does not apply",
        ),
        (vec!["--engine", "--temperature", "-1"], "temperature"),
        (
            vec!["--engine", "--temperature", "1", "--top-p", "1.5"],
            "top_p",
        ),
        (
            vec!["--engine", "--temperature", "1", "--min-p", "2"],
            "min_p",
        ),
    ] {
        let out = bench(&flags);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?} accepted");
        assert!(err.contains(needle), "{flags:?}: {err}");
    }
}
