//! `tandem score` end to end: the real binary, real model files, the JSON contract of README.md §
//! score, and clear errors for bad input.
#![allow(clippy::unwrap_used)] // helpers outside #[test] functions

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn tandem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(args)
        .output()
        .expect("run tandem")
}

fn json_ok(args: &[&str]) -> Value {
    let out = tandem(args);
    assert!(
        out.status.success(),
        "tandem {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON object")
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../model/tests/fixtures/hf")
        .join(name)
}

fn default_model() -> String {
    let p = tandem_model::default_model::test_model_path()
        .expect("the default model is needed; this test does not skip");
    p.display().to_string()
}

/// log-softmax in f64 of one row of the fixture's reference logits.
fn reference_logprobs(name: &str, seq: usize) -> (Vec<u32>, Vec<Vec<f64>>) {
    let dir = fixture(name);
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let s = &r["sequences"][seq];
    let ids: Vec<u32> = s["input_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let bytes = std::fs::read(dir.join(s["logits_file"].as_str().unwrap())).unwrap();
    let vocab = r["vocab_size"].as_u64().unwrap() as usize;
    let logits: Vec<f64> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64)
        .collect();
    let rows = logits
        .chunks_exact(vocab)
        .map(|row| {
            let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + row.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
            row.iter().map(|x| x - lse).collect()
        })
        .collect();
    (ids, rows)
}

#[test]
fn json_output_matches_transformers_and_the_contract() {
    let (ids, rows) = reference_logprobs("llama_untied", 1);
    let list = ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let model = fixture("llama_untied");
    let v = json_ok(&[
        "score",
        "--model",
        model.to_str().unwrap(),
        "--tokens",
        &list,
        "--json",
    ]);
    assert_eq!(v["num_tokens"], ids.len());
    assert_eq!(v["tokens"].as_array().unwrap().len(), ids.len());
    assert!(Path::new(v["model"].as_str().unwrap()).is_absolute());
    let lps = v["token_logprobs"].as_array().unwrap();
    assert!(lps[0].is_null());
    let mut sum = 0.0;
    for i in 1..ids.len() {
        let want = rows[i - 1][ids[i] as usize];
        let got = lps[i].as_f64().unwrap();
        assert!(
            (got - want).abs() < 1e-3,
            "position {i}: {got} vs transformers {want}"
        );
        sum += got;
    }
    assert!((v["sum_logprob"].as_f64().unwrap() - sum).abs() < 1e-6);
    let ppl = (-sum / (ids.len() - 1) as f64).exp();
    assert!((v["perplexity"].as_f64().unwrap() - ppl).abs() < 1e-6 * ppl);
    assert!(v.get("top_logprobs").is_none() && v.get("ranks").is_none());
}

#[test]
fn top_k_gives_sorted_alternatives_and_consistent_ranks() {
    let model = default_model();
    let v = json_ok(&[
        "score",
        "--model",
        &model,
        "--text",
        "The capital of France is Paris.",
        "--top-k",
        "3",
        "--json",
    ]);
    let (tokens, lps) = (
        v["tokens"].as_array().unwrap(),
        v["token_logprobs"].as_array().unwrap(),
    );
    let (tops, ranks) = (
        v["top_logprobs"].as_array().unwrap(),
        v["ranks"].as_array().unwrap(),
    );
    assert!(tops[0].is_null() && ranks[0].is_null());
    for i in 1..tokens.len() {
        let top = tops[i].as_array().unwrap();
        assert_eq!(top.len(), 3);
        let t: Vec<f64> = top.iter().map(|e| e["logprob"].as_f64().unwrap()).collect();
        assert!(
            t.windows(2).all(|w| w[0] >= w[1]),
            "top-k not sorted at {i}"
        );
        let rank = ranks[i].as_u64().unwrap();
        let lp = lps[i].as_f64().unwrap();
        assert!(rank >= 1 && lp <= t[0] + 1e-6);
        assert_eq!(
            rank == 1,
            top[0]["id"] == tokens[i],
            "rank 1 iff the actual token is the top choice"
        );
        if rank <= 3 {
            assert!((t[rank as usize - 1] - lp).abs() < 1e-6);
        }
    }
}

#[test]
fn text_file_and_token_inputs_agree() {
    let model = default_model();
    let text = "Scoring the same text three ways gives the same numbers.";
    let a = json_ok(&["score", "--model", &model, "--text", text, "--json"]);
    let file = std::env::temp_dir().join(format!("tandem-score-{}.txt", std::process::id()));
    std::fs::write(&file, text).unwrap();
    let b = json_ok(&[
        "score",
        "--model",
        &model,
        "--file",
        file.to_str().unwrap(),
        "--json",
    ]);
    std::fs::remove_file(&file).unwrap();
    let ids = a["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let c = json_ok(&["score", "--model", &model, "--tokens", &ids, "--json"]);
    assert_eq!(a, b);
    assert_eq!(a, c);
}

#[test]
fn too_long_input_names_both_lengths_unless_windowed() {
    let model = default_model();
    let text = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen";
    let out = tandem(&[
        "score",
        "--model",
        &model,
        "--text",
        text,
        "--max-model-len",
        "8",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("exceeds") && err.contains(" 8"),
        "unclear error: {err}"
    );
    let full = json_ok(&["score", "--model", &model, "--text", text, "--json"]);
    let n = full["num_tokens"].as_u64().unwrap() as usize;
    assert!(n > 8, "the text must be longer than the window");
    let w = json_ok(&[
        "score",
        "--model",
        &model,
        "--text",
        text,
        "--max-model-len",
        "8",
        "--window",
        "8",
        "--stride",
        "4",
        "--json",
    ]);
    let (a, b) = (
        full["token_logprobs"].as_array().unwrap(),
        w["token_logprobs"].as_array().unwrap(),
    );
    assert_eq!(b.len(), n);
    assert!(
        b[1..].iter().all(Value::is_f64),
        "every position after the first is scored once"
    );
    assert_eq!(
        a[..8],
        b[..8],
        "the first window is an ordinary prefix pass"
    );
    assert_ne!(
        a[8..],
        b[8..],
        "later positions see only the window's context"
    );
}

#[test]
fn bad_model_paths_get_clear_errors() {
    let out = tandem(&["score", "--model", "/nonexistent/x.gguf", "--text", "hi"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such file"));
    let not_a_model =
        std::env::temp_dir().join(format!("tandem-not-a-model-{}.bin", std::process::id()));
    std::fs::write(&not_a_model, b"hello world, not a model").unwrap();
    let out = tandem(&[
        "score",
        "--model",
        not_a_model.to_str().unwrap(),
        "--text",
        "hi",
    ]);
    std::fs::remove_file(&not_a_model).unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("neither a GGUF file"));
    let out = tandem(&["score", "--model", &default_model(), "--tokens", "1,999999"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("outside the vocabulary"));
    // A model directory whose config names an unknown model_type is refused (strict loading).
    let dir = std::env::temp_dir().join(format!("tandem-bad-model-type-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(fixture("llama_untied")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
    let config = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let config = config.replace(r#""model_type": "llama""#, r#""model_type": "gpt2""#);
    std::fs::write(dir.join("config.json"), config).unwrap();
    let out = tandem(&["score", "--model", dir.to_str().unwrap(), "--text", "hi"]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("unsupported architecture `gpt2` in `model_type`")
            && stderr.contains("llama, mistral, qwen2, qwen3"),
        "{stderr}"
    );
}

/// `--device cuda` without a CUDA driver is one clear line naming the library; with one, it
/// scores like the CPU (f32: the fixture's logprobs within 1e-4). `--device auto` always works.
#[test]
fn cuda_device_scores_or_names_the_missing_driver() {
    let model = fixture("llama_untied");
    let model = model.to_str().unwrap();
    let args = [
        "score",
        "--model",
        model,
        "--tokens",
        "1,5,9,13,17",
        "--json",
    ];
    let cpu = json_ok(&[&args[..], &["--device", "cpu", "--kernels", "scalar"]].concat());
    let auto = json_ok(&[&args[..], &["--device", "auto"]].concat());
    assert_eq!(auto["num_tokens"], cpu["num_tokens"]);
    let out = tandem(&[&args[..], &["--device", "cuda", "--dtype", "f32"]].concat());
    match tandem_cuda::probe() {
        Err(_) => {
            assert!(
                !out.status.success(),
                "--device cuda must fail without a driver"
            );
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
            assert!(
                err.contains("libcuda") && err.contains("--device cuda"),
                "{err}"
            );
        }
        Ok(_) => {
            let gpu: Value = serde_json::from_slice(&out.stdout).expect("JSON from CUDA");
            let (a, b) = (&gpu["token_logprobs"], &cpu["token_logprobs"]);
            for i in 1..5 {
                let d = (a[i].as_f64().unwrap() - b[i].as_f64().unwrap()).abs();
                assert!(d < 1e-4, "position {i}: {d}");
            }
        }
    }
}
