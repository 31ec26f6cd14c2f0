//! `--lora-modules` and `--lora` end to end: `tandem score` of the Llama fixture with its PEFT
//! adapter gives transformers + PEFT's log-probabilities (the fixture's reference logits,
//! scripts/make_lora_fixtures.py), and the flags' mistakes are clear errors that name them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn tandem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(args)
        .output()
        .expect("run tandem")
}

/// Runs tandem with `args`, which must succeed, and parses its one JSON object.
fn json_ok(args: &[&str]) -> Value {
    let out = tandem(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "tandem {args:?}: {stderr}");
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures")
}

fn path(p: PathBuf) -> String {
    p.display().to_string()
}

/// The adapter fixture's first sequence and its log-softmax rows (f64), from PEFT's logits.
fn peft_logprobs() -> (Vec<u32>, Vec<Vec<f64>>) {
    let dir = fixtures().join("lora/llama_tied");
    let text = std::fs::read_to_string(dir.join("reference.json")).expect("reference");
    let r: Value = serde_json::from_str(&text).expect("json");
    let s = &r["sequences"][0];
    let ids: Vec<u32> = (s["input_ids"].as_array().expect("ids").iter())
        .map(|v| v.as_u64().expect("id") as u32)
        .collect();
    let bytes = std::fs::read(dir.join(s["logits_file"].as_str().expect("file"))).expect("logits");
    let logits: Vec<f64> = (bytes.chunks_exact(4))
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64)
        .collect();
    let rows = (logits.chunks_exact(logits.len() / ids.len()))
        .map(|row| {
            let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + row.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
            row.iter().map(|x| x - lse).collect()
        })
        .collect();
    (ids, rows)
}

#[test]
fn score_with_an_adapter_matches_peft() {
    let (ids, rows) = peft_logprobs();
    let list = ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let model = path(fixtures().join("hf/llama_tied"));
    let module = format!("sql={}", path(fixtures().join("lora/llama_tied")));
    let score = ["score", "--model", &model, "--tokens", &list, "--json"];
    let lora = ["--lora-modules", &module, "--lora", "sql"];
    let v = json_ok(&[&score[..], &["--kernels", "avx2"], &lora].concat());
    let lps = v["token_logprobs"].as_array().expect("logprobs");
    for i in 1..ids.len() {
        let (got, want) = (
            lps[i].as_f64().expect("a number"),
            rows[i - 1][ids[i] as usize],
        );
        assert!(
            (got - want).abs() < 1e-3,
            "position {i}: {got} vs PEFT {want}"
        );
    }
    // Without --lora the same modules load, and the base model scores.
    let b = json_ok(&[&score[..], &lora[..2]].concat());
    assert_ne!(b["token_logprobs"], v["token_logprobs"]);
    // --lora-dtype bf16 rounds the adapter: other numbers, a fraction of its effect away.
    let bf16 = ["--kernels", "avx2", "--lora-dtype", "bf16"];
    let r = json_ok(&[&score[..], &bf16, &lora].concat());
    let lp = |v: &Value, i: usize| v["token_logprobs"][i].as_f64().expect("a number");
    let (mut effect, mut error) = (0.0f64, 0.0f64);
    for i in 1..ids.len() {
        effect = effect.max((lp(&b, i) - lp(&v, i)).abs());
        error = error.max((lp(&r, i) - lp(&v, i)).abs());
    }
    assert!(
        error > 0.0 && error < 0.05 * effect,
        "bf16 error {error}, effect {effect}"
    );
}

fn error_of(args: &[&str]) -> String {
    let out = tandem(args);
    assert!(!out.status.success(), "{args:?} should fail");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn mistakes_in_the_flags_are_named() {
    let model = path(fixtures().join("hf/llama_tied"));
    let good = format!("sql={}", path(fixtures().join("lora/llama_tied")));
    let wrong_model = format!("q={}", path(fixtures().join("lora/qwen3")));
    let score = ["score", "--model", &model, "--text", "hi"];
    let cases: [(&[&str], &str); 5] = [
        (&["--lora-modules", &good, &good], "given twice"),
        (&["--lora-dtype", "f8"], "--lora-dtype"),
        (&["--lora", "sql"], "--lora sql"),
        (&["--lora-modules", "sql"], "NAME=PATH"),
        (&["--lora-modules", &wrong_model], "--lora-modules q"),
    ];
    for (extra, needle) in cases {
        let args = [&score[..], extra].concat();
        let e = error_of(&args);
        assert!(e.contains(needle), "{args:?}: {e}");
    }
    let serve = ["serve", "--model", &model, "--port", "0"];
    let e = error_of(&[&serve[..], &["--lora-modules", &good, "--lora", "sql"]].concat());
    assert!(e.contains("--lora"), "{e}");
}

/// `generate --lora` and `score --lora` agree: every greedy token generated under the adapter
/// is the adapter's most likely token when the text is scored under it (rank 1), with the
/// logprob generation reported, and without the adapter the generation differs.
#[test]
fn generate_under_an_adapter_is_greedy_under_its_scores() {
    let model = path(fixtures().join("hf/llama_tied"));
    let module = format!("sql={}", path(fixtures().join("lora/llama_tied")));
    let generate = |lora: &[&str]| -> Value {
        let args = [
            "generate",
            "--model",
            &model,
            "--prompt",
            "hello",
            "--max-tokens",
            "8",
        ];
        let greedy = [
            "--temperature",
            "0",
            "--ignore-eos",
            "--json",
            "--lora-modules",
            &module,
        ];
        json_ok(&[&args[..], &greedy, lora].concat())
    };
    let adapted = generate(&["--lora", "sql"]);
    assert_ne!(
        adapted["token_ids"],
        generate(&[])["token_ids"],
        "the adapter changes the text"
    );
    let prompt = json_ok(&["score", "--model", &model, "--text", "hello", "--json"]);
    let ids: Vec<u64> = (prompt["tokens"].as_array().expect("tokens").iter())
        .chain(adapted["token_ids"].as_array().expect("ids"))
        .map(|v| v.as_u64().expect("an id"))
        .collect();
    let list = ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    let score = [
        "score", "--model", &model, "--tokens", &list, "--top-k", "1", "--json",
    ];
    let lora = ["--lora-modules", &module, "--lora", "sql"];
    let scored = json_ok(&[&score[..], &lora].concat());
    let n = prompt["tokens"].as_array().expect("tokens").len();
    let generated = adapted["logprobs"].as_array().expect("logprobs");
    for (k, i) in (n..ids.len()).enumerate() {
        assert_eq!(
            scored["ranks"][i], 1,
            "generated token {k} is the adapter's greedy choice"
        );
        let (s, g) = (scored["token_logprobs"][i].as_f64(), generated[k].as_f64());
        let (s, g) = (s.expect("a score"), g.expect("a logprob"));
        assert!((s - g).abs() < 1e-4, "token {k}: scored {s}, generated {g}");
    }
}
