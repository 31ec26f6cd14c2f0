//! `--trace FILE` through the binary on the default model: `generate` over a JSONL batch
//! (engine steps, one complete track per request, tokens per step within the budget and
//! adding up to each request's prompt and output) and `score` (one forward pass per step,
//! covering the scored tokens).
#![allow(clippy::unwrap_used)] // helpers outside #[test] functions

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn model() -> String {
    tandem_model::default_model::test_model_path()
        .expect("the default model is needed; this test does not skip")
        .display()
        .to_string()
}

fn tmp(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(name)
}

/// Runs tandem; returns stdout, panicking with stderr on failure.
fn run(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(args)
        .output()
        .expect("run tandem");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "tandem {args:?}: {err}");
    String::from_utf8(out.stdout).unwrap()
}

fn events(path: &Path) -> Vec<Value> {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["traceEvents"].as_array().unwrap().clone()
}

fn tokens(e: &Value) -> u64 {
    e["args"]["tokens"].as_u64().unwrap()
}

#[test]
fn generate_traces_every_step_and_request() {
    let input = tmp("trace_in.jsonl");
    let lines = ["Once upon a time", "The capital of France is", "1, 2, 3,"]
        .map(|p| serde_json::json!({"prompt": p, "max_tokens": 6, "ignore_eos": true}).to_string());
    std::fs::write(&input, lines.join("\n")).unwrap();
    let trace = tmp("trace_generate.json");
    let (m, i, t) = (
        model(),
        input.display().to_string(),
        trace.display().to_string(),
    );
    let out = run(&[
        "generate",
        "--model",
        &m,
        "--input",
        &i,
        "--json",
        "--kv-cache-memory",
        "64MiB",
        "--max-num-batched-tokens",
        "8",
        "--temperature",
        "0",
        "--trace",
        &t,
    ]);
    let results: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ev = events(&trace);
    let steps: Vec<&Value> = ev.iter().filter(|e| e["cat"] == "step").collect();
    assert!(steps.len() > 5, "{} steps", steps.len());
    for s in &steps {
        let used = s["args"]["prefill_tokens"].as_u64().unwrap()
            + s["args"]["decode_tokens"].as_u64().unwrap();
        assert!((1..=8).contains(&used), "{s}");
    }
    assert!(ev.iter().any(|e| e["name"] == "detokenize"));
    for (k, r) in results.iter().enumerate() {
        // Requests get ids 0, 1, 2 in input order: tracks 1, 2, 3.
        let track: Vec<&Value> = ev
            .iter()
            .filter(|e| e["pid"] == 2 && e["tid"] == k as u64 + 1 && e["ph"] != "M")
            .collect();
        let names: Vec<&str> = track.iter().map(|e| e["name"].as_str().unwrap()).collect();
        assert_eq!(names.first(), Some(&"arrived"), "{names:?}");
        assert_eq!(names.last(), Some(&"finished"), "{names:?}");
        let prefill: u64 = track
            .iter()
            .filter(|e| e["name"] == "prefill")
            .map(|e| tokens(e))
            .sum();
        let decode: u64 = track
            .iter()
            .filter(|e| e["name"] == "decode")
            .map(|e| tokens(e))
            .sum();
        let prompt = r["usage"]["prompt_tokens"].as_u64().unwrap();
        let output = r["usage"]["completion_tokens"].as_u64().unwrap();
        assert_eq!(
            prefill, prompt,
            "request {k}: every prompt token prefilled once"
        );
        assert_eq!(
            decode,
            output - 1,
            "request {k}: all but the last token fed back"
        );
    }
}

#[test]
fn score_traces_its_forward_passes() {
    let trace = tmp("trace_score.json");
    let (m, t) = (model(), trace.display().to_string());
    let out = run(&[
        "score",
        "--model",
        &m,
        "--text",
        "The capital of France is Paris.",
        "--json",
        "--trace",
        &t,
    ]);
    let scored: Value = serde_json::from_str(&out).unwrap();
    let ev = events(&trace);
    let steps = ev.iter().filter(|e| e["cat"] == "step").count();
    assert!(steps >= 1);
    let computed: u64 = ev
        .iter()
        .filter(|e| e["name"] == "prefill")
        .map(tokens)
        .sum();
    assert_eq!(computed, scored["num_tokens"].as_u64().unwrap());
}
