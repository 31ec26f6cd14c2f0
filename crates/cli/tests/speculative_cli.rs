//! `--speculative` end to end on the default model: greedy `generate` output (text, token
//! ids, logprobs) is the same with n-gram or draft-model speculation as without, and
//! `bench --speculative` reports the counters. Bad values are refused with a clear error.
#![allow(clippy::unwrap_used)] // helpers outside #[test] functions

use std::process::{Command, Output};

use serde_json::Value;

fn model() -> String {
    tandem_model::default_model::test_model_path()
        .expect("the default model is needed; this test does not skip")
        .display()
        .to_string()
}

fn tandem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(args)
        .output()
        .expect("run tandem")
}

fn json(args: &[&str]) -> Value {
    let out = tandem(args);
    assert!(
        out.status.success(),
        "tandem {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("UTF-8");
    serde_json::from_str(text.lines().last().expect("a line")).expect("JSON")
}

const PROMPT: &str =
    "Copy exactly.\nText: red, green, blue, yellow, purple, orange.\nCopy: red, green,";

#[test]
fn greedy_generate_is_unchanged_by_speculation() {
    let m = model();
    let draft = format!("draft:{m}");
    let base = [
        "generate",
        "--model",
        &m,
        "--kv-cache-memory",
        "256MiB",
        "--prompt",
        PROMPT,
        "--max-tokens",
        "24",
        "--temperature",
        "0",
        "--json",
    ];
    let plain = json(&base);
    for spec in [
        ["--speculative", "ngram"],
        ["--speculative", draft.as_str()],
    ] {
        let mut args = base.to_vec();
        args.extend_from_slice(&spec);
        args.extend_from_slice(&["--speculative-draft-cost", "0"]);
        let got = json(&args);
        for field in ["text", "token_ids", "logprobs", "finish_reason"] {
            assert_eq!(got[field], plain[field], "{spec:?}: {field} differs");
        }
    }
}

#[test]
fn bench_reports_the_speculation_counters() {
    let m = model();
    let r = json(&[
        "bench",
        "--model",
        &m,
        "--kv-cache-memory",
        "64MiB",
        "--prompt-len",
        "32",
        "--gen-len",
        "24",
        "--prompt-kind",
        "copy",
        "--speculative",
        "ngram",
    ]);
    assert_eq!(r["mode"], "engine");
    assert_eq!(r["speculative"], "ngram");
    let drafted = r["spec_num_draft_tokens"].as_u64().expect("a count");
    let accepted = r["spec_num_accepted_tokens"].as_u64().expect("a count");
    assert!(drafted > 0 && accepted <= drafted, "{r}");
    assert!(r["decode_tok_per_s"].as_f64().expect("a rate") > 0.0);
}

#[test]
fn bad_speculative_flags_are_refused() {
    let m = model();
    for (flags, needle) in [
        (vec!["--speculative", "eagle"], "expected `ngram`"),
        (vec!["--num-speculative-tokens", "3"], "needs --speculative"),
        (
            vec!["--speculative", "ngram", "--num-speculative-tokens", "0"],
            "num_speculative_tokens",
        ),
    ] {
        let mut args = vec![
            "generate",
            "--model",
            &m,
            "--prompt",
            "hi",
            "--max-tokens",
            "2",
        ];
        args.extend_from_slice(&flags);
        let out = tandem(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?} accepted");
        assert!(err.contains(needle), "{flags:?}: {err}");
    }
}

#[test]
fn a_jsonl_line_can_set_its_own_number_of_drafts() {
    let m = model();
    let dir = std::env::temp_dir().join(format!("tandem-spec-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let input = dir.join("in.jsonl");
    let line = |k: usize| {
        serde_json::json!({"prompt": PROMPT, "max_tokens": 16, "temperature": 0.0,
                           "num_speculative_tokens": k})
        .to_string()
    };
    std::fs::write(&input, format!("{}\n{}\n", line(0), line(6))).expect("write input");
    let out = tandem(&[
        "generate",
        "--model",
        &m,
        "--kv-cache-memory",
        "256MiB",
        "--input",
        input.to_str().expect("UTF-8 path"),
        "--speculative",
        "ngram",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .expect("UTF-8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(
        lines[0]["token_ids"], lines[1]["token_ids"],
        "same greedy output"
    );
    std::fs::remove_dir_all(&dir).expect("clean up");
}
