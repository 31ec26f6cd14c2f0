//! `tandem plan` end to end: the KV capacity it predicts is the one the engine reports at
//! start-up for the same flags (default model and an HF fixture, several budgets, block sizes
//! and KV dtypes), a saved hardware profile is read, a request rate gives a steady state that
//! obeys Little's law (or is refused past saturation), and bad input is a clear error.
#![allow(clippy::unwrap_used)] // helpers outside #[test] functions

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use regex::Regex;
use serde_json::Value;

fn tandem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(args)
        .output()
        .expect("run tandem")
}

fn default_model() -> String {
    let p = tandem_model::default_model::test_model_path()
        .expect("the default model is needed; this test does not skip");
    p.display().to_string()
}

fn fixture(name: &str) -> String {
    let p: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../model/tests/fixtures/hf")
        .join(name);
    p.display().to_string()
}

/// A CPU hardware profile file (the capacity does not depend on its rates).
fn profile_file(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join(format!("plan_cli_{name}.json"));
    let profile = serde_json::json!({"profiles": [{
        "name": "test cpu", "kind": "cpu", "source": "test", "threads": 1,
        "bandwidth": 1e10, "matmul": [{"tokens": 1, "flops": 1e10}, {"tokens": 64, "flops": 1e11}],
        "attention_flops": 1e10, "prefill_attention_flops": 1e10, "step_overhead_s": 1e-4, "layer_overhead_s": 1e-5,
        "memory_bytes": 0.0
    }]});
    std::fs::write(&path, profile.to_string()).unwrap();
    path
}

/// (blocks, block size, tokens) from the engine's start-up line.
fn engine_report(model: &str, flags: &[&str]) -> (u64, u64, u64) {
    let mut args = vec![
        "generate",
        "--model",
        model,
        "--prompt",
        "hi",
        "--max-tokens",
        "1",
    ];
    args.extend_from_slice(flags);
    let out = tandem(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "generate {flags:?} failed: {stderr}");
    let re = Regex::new(r"KV cache (\d+) blocks x (\d+) tokens = (\d+) tokens").unwrap();
    let c = re
        .captures(&stderr)
        .expect("the start-up line reports the KV cache");
    let n = |i: usize| c[i].parse::<u64>().unwrap();
    (n(1), n(2), n(3))
}

fn plan_capacity(model: &str, flags: &[&str]) -> (u64, u64, u64) {
    let profile = profile_file("capacity");
    let p = profile.display().to_string();
    let mut args = vec!["plan", "--model", model, "--hardware", &p, "--json"];
    args.extend_from_slice(flags);
    let out = tandem(&args);
    assert!(
        out.status.success(),
        "plan failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let c = &v["capacity"];
    let n = |k: &str| c[k].as_u64().unwrap();
    (n("num_blocks"), n("block_size"), n("capacity_tokens"))
}

#[test]
fn plan_capacity_equals_the_engines_start_up_report() {
    let model = default_model();
    let hf = fixture("llama_tied");
    let cases: [(&str, &[&str]); 4] = [
        (&model, &[]),
        (&model, &["--kv-cache-memory", "10MB", "--block-size", "32"]),
        (
            &model,
            &["--kv-cache-memory", "7MiB", "--kv-cache-dtype", "f32"],
        ),
        (&hf, &["--kv-cache-memory", "1MiB", "--block-size", "8"]),
    ];
    for (m, flags) in cases {
        let engine = engine_report(m, flags);
        assert_eq!(plan_capacity(m, flags), engine, "{m} {flags:?}");
    }
}

#[test]
fn plan_reports_the_workload_and_refuses_bad_input() {
    let model = default_model();
    let profile = profile_file("report").display().to_string();
    let base = ["plan", "--model", &model, "--hardware", &profile];
    let out = tandem(&[&base[..], &["--concurrency", "4", "--prefix-hit", "0.5"]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in ["KV cache", "TTFT", "crossover", "generate/score"] {
        assert!(text.contains(needle), "no {needle} in:\n{text}");
    }
    // Several prompt lengths: the pool is sized by the longest request, TTFT averaged.
    let lens = ["--prompt-len", "100,300", "--gen-len", "28", "--json"];
    let out = tandem(&[&base[..], &lens].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["capacity"]["blocks_per_request"],
        (300 + 28usize).div_ceil(16)
    );
    assert_eq!(v["prompt_len"], 200);
    let w = &v["workload"];
    assert!(w["ttft_ms_max"].as_f64().unwrap() > w["ttft_ms"].as_f64().unwrap());
    let unknown = ["plan", "--model", &model, "--hardware", "no-such-gpu"];
    for (args, names) in [
        (
            [&base[..], &["--prefix-hit", "1.5"]].concat(),
            "--prefix-hit",
        ),
        (
            [&base[..], &["--kv-cache-memory", "10"]].concat(),
            "--kv-cache-memory",
        ),
        (
            [&base[..], &["--prompt-len", "64,0"]].concat(),
            "--prompt-len",
        ),
        (unknown.to_vec(), "no-such-gpu"),
        (
            [&base[..], &["--cuda-weights", "q8_0"]].concat(),
            "--cuda-weights",
        ),
        ([&base[..], &["--dtype", "f32"]].concat(), "--dtype"),
    ] {
        let out = tandem(&args);
        assert!(!out.status.success(), "{names} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("error") && err.contains(names),
            "{names}: {err}"
        );
        assert!(!err.contains("panicked"), "{names}: {err}");
    }
}

fn plan_json(args: &[&str]) -> Value {
    let out = tandem(args);
    assert!(
        out.status.success(),
        "plan {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs())
}

#[test]
fn plan_at_a_request_rate_reports_a_consistent_steady_state() {
    let model = default_model();
    let base = [
        "plan",
        "--model",
        &model,
        "--hardware",
        "h100",
        "--gen-len",
        "64,192",
        "--json",
    ];
    let probe = plan_json(&[&base[..], &["--request-rate", "1"]].concat());
    let sat = probe["rate"]["saturation"]["request_rate"]
        .as_f64()
        .unwrap();
    assert!(sat > 1.0, "{}", probe["rate"]);
    // Half the saturation rate: a steady state that obeys Little's law.
    let rate = sat / 2.0;
    let rate_arg = format!("{rate}");
    let v = plan_json(&[&base[..], &["--request-rate", &rate_arg]].concat());
    let r = &v["rate"];
    assert_eq!(r["stable"], true);
    assert!(close(r["request_rate"].as_f64().unwrap(), rate, 1e-12));
    assert!(close(r["utilisation"].as_f64().unwrap(), 0.5, 1e-9));
    let s = &r["steady"];
    let f = |k: &str| s[k].as_f64().unwrap_or_else(|| panic!("no {k} in {s}"));
    let mean_gen = (64.0 + 192.0) / 2.0;
    assert!(close(f("output_tok_per_s"), rate * mean_gen, 1e-9));
    assert!(close(f("concurrency"), rate * f("latency_ms") / 1e3, 1e-9));
    assert!(close(
        f("latency_ms"),
        f("ttft_ms") + (mean_gen - 1.0) * f("itl_ms"),
        1e-9
    ));
    // Requests decoding = rate x decode steps per request x step time (the fixed point).
    let decoding = f("decode_batch") - 1.0;
    assert!(close(
        decoding,
        rate * (mean_gen - 1.0) * f("itl_ms") / 1e3,
        1e-6
    ));
    assert!(f("ttft_ms_max") >= f("ttft_ms") && f("queue_ms") < f("ttft_ms"));
    assert!(f("kv_tokens_in_use") > 0.0 && s["preemption"] == false);
    assert_eq!(
        s["kv_capacity_tokens"], v["capacity"]["capacity_tokens"],
        "{s}"
    );
    // The rest of the plan runs at the implied concurrency.
    assert_eq!(
        v["concurrency"].as_f64().unwrap(),
        f("concurrency").round().max(1.0)
    );
    // The same saturation point whatever the rate asked.
    assert!(close(
        r["saturation"]["request_rate"].as_f64().unwrap(),
        sat,
        1e-12
    ));

    // The text and the throughput chart show the operating point.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("plan_rate_svg_stable");
    let d = dir.display().to_string();
    let out = tandem(&[&base[..7], &["--request-rate", &rate_arg, "--svg", &d]].concat());
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("steady state") && text.contains("50% of the most"),
        "{text}"
    );
    let svg = std::fs::read_to_string(dir.join("throughput.svg")).unwrap();
    assert!(svg.contains(&format!(">{rate:.2} req/s<")), "{svg}");

    // Past saturation: reported, not solved; the text and the charts say so too.
    let over = format!("{}", 3.0 * sat);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("plan_rate_svg");
    let d = dir.display().to_string();
    let out = tandem(&[&base[..7], &["--request-rate", &over, "--svg", &d]].concat());
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    for t in [&text, &err] {
        assert!(t.contains("grows without bound"), "{t}");
    }
    let svg = std::fs::read_to_string(dir.join("throughput.svg")).unwrap();
    assert!(svg.contains(&format!("at most {sat:.2} req/s")), "{svg}");
    let v = plan_json(&[&base[..], &["--request-rate", &over]].concat());
    assert_eq!(v["rate"]["stable"], false);
    assert!(v["rate"]["steady"].is_null());
    assert_eq!(
        v["concurrency"], v["capacity"]["max_concurrent_requests"],
        "an unsustainable rate fills the engine"
    );

    // A rate or a concurrency, not both; a rate must be positive.
    for (args, name) in [
        (
            vec!["--request-rate", "2", "--concurrency", "4"],
            "--concurrency",
        ),
        (vec!["--request-rate", "0"], "--request-rate"),
        (vec!["--request-rate=-1"], "--request-rate"),
        (vec!["--request-rate", "inf"], "--request-rate"),
    ] {
        let out = tandem(&[&base[..], &args].concat());
        assert!(!out.status.success(), "{args:?} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(name) && !err.contains("panicked"), "{err}");
    }
}
