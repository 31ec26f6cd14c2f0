//! `tandem generate` end to end on the default model: streamed text ≡ JSON text (ARCHITECTURE.md §
//! Invariants, 7, for the CLI), JSONL batches in input order equal to single runs, seeded sampling,
//! stop strings, and clear errors for bad settings.
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
    let m = model();
    let mut all = vec![
        "generate",
        "--model",
        m.as_str(),
        "--kv-cache-memory",
        "256MiB",
    ];
    all.extend_from_slice(args);
    Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(&all)
        .output()
        .expect("run tandem")
}

fn ok_stdout(args: &[&str]) -> String {
    let out = tandem(args);
    assert!(
        out.status.success(),
        "tandem generate {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

fn json_lines(args: &[&str]) -> Vec<Value> {
    ok_stdout(args)
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect()
}

#[test]
fn streamed_text_equals_the_json_text() {
    let common = [
        "--prompt",
        "List three fruits and one vegetable:",
        "--max-tokens",
        "24",
        "--temperature",
        "0",
    ];
    let streamed = ok_stdout(&common);
    let mut args = common.to_vec();
    args.push("--json");
    let v = &json_lines(&args)[0];
    assert_eq!(
        streamed.strip_suffix('\n').unwrap(),
        v["text"].as_str().unwrap()
    );
    assert!(!streamed.contains('\u{FFFD}'));
    assert_eq!(
        v["usage"]["completion_tokens"].as_u64().unwrap() as usize,
        v["token_ids"].as_array().unwrap().len()
    );
    assert_eq!(
        v["logprobs"].as_array().unwrap().len(),
        v["token_ids"].as_array().unwrap().len()
    );
    assert!(["stop", "length"].contains(&v["finish_reason"].as_str().unwrap()));
    // Every token's logprob, a number (a log-probability: at most 0).
    for lp in v["logprobs"].as_array().unwrap() {
        assert!(lp.as_f64().is_some_and(|x| x <= 0.0), "logprob {lp}");
    }
    // One prompt with `--output` (and no `--json`) writes the same record to the file.
    let file = std::env::temp_dir().join(format!("tandem-generate-{}.jsonl", std::process::id()));
    let mut args = common.to_vec();
    args.extend(["--output", file.to_str().unwrap()]);
    let printed = ok_stdout(&args);
    let written = std::fs::read_to_string(&file).expect("the output file is written");
    std::fs::remove_file(&file).ok();
    assert!(printed.is_empty(), "nothing streams to stdout: {printed:?}");
    let w: Value = serde_json::from_str(written.lines().next().unwrap()).unwrap();
    assert_eq!(w["text"], v["text"]);
    assert_eq!(w["token_ids"], v["token_ids"]);
    assert_eq!(w["logprobs"], v["logprobs"]);
}

#[test]
fn a_jsonl_batch_matches_single_runs_in_input_order() {
    let prompts = [
        "Once upon a time",
        "The best way to learn Rust is",
        "2 + 2 =",
        "Paris is the capital of",
    ];
    let dir = std::env::temp_dir().join(format!("tandem-gen-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("in.jsonl");
    let lines: Vec<String> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| serde_json::json!({"prompt": p, "max_tokens": 8 + i, "seed": 40 + i, "temperature": 0.8}).to_string())
        .collect();
    std::fs::write(&input, lines.join("\n")).unwrap();
    let batch = json_lines(&["--input", input.to_str().unwrap(), "--json"]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(batch.len(), prompts.len());
    for (i, p) in prompts.iter().enumerate() {
        assert_eq!(batch[i]["index"], i);
        assert_eq!(batch[i]["prompt"], *p);
        let (max, seed) = ((8 + i).to_string(), (40 + i).to_string());
        let single = &json_lines(&[
            "--prompt",
            p,
            "--max-tokens",
            &max,
            "--seed",
            &seed,
            "--temperature",
            "0.8",
            "--json",
        ])[0];
        assert_eq!(
            batch[i]["token_ids"], single["token_ids"],
            "prompt {i}: batched differs from alone"
        );
        assert_eq!(batch[i]["text"], single["text"]);
    }
}

#[test]
fn stop_strings_end_the_text_before_the_stop() {
    let base = json_lines(&[
        "--prompt",
        "Count: 1, 2, 3, 4, 5, 6,",
        "--max-tokens",
        "20",
        "--temperature",
        "0",
        "--json",
    ]);
    let text = base[0]["text"].as_str().unwrap().to_string();
    let stop = " 9";
    let Some(cut) = text.find(stop) else {
        panic!("greedy continuation lacks {stop:?}: {text:?}")
    };
    let v = json_lines(&[
        "--prompt",
        "Count: 1, 2, 3, 4, 5, 6,",
        "--max-tokens",
        "20",
        "--temperature",
        "0",
        "--stop",
        stop,
        "--json",
    ]);
    assert_eq!(v[0]["text"].as_str().unwrap(), &text[..cut]);
    assert_eq!(v[0]["finish_reason"], "stop");
}

#[test]
fn n_samples_are_distinct_and_reproducible() {
    let args = [
        "--prompt",
        "A short poem about the sea:",
        "--max-tokens",
        "12",
        "--seed",
        "7",
        "--n",
        "3",
        "--json",
    ];
    let (a, b) = (json_lines(&args), json_lines(&args));
    assert_eq!(a.len(), 3);
    assert_eq!(a, b, "the same seed gives the same samples");
    assert!(
        a[0]["token_ids"] != a[1]["token_ids"] || a[1]["token_ids"] != a[2]["token_ids"],
        "siblings differ"
    );
    assert_eq!(a[2]["sample"], 2);
}

#[test]
fn bad_settings_are_refused_naming_the_field() {
    for (args, field) in [
        (vec!["--temperature", "-1"], "temperature"),
        (vec!["--top-p", "1.5"], "top_p"),
        (vec!["--n", "0"], "n = 0"),
        (vec!["--max-tokens", "100000"], "max_tokens"),
    ] {
        let mut all = vec!["--prompt", "hello"];
        all.extend(args.iter());
        let out = tandem(&all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(
            err.contains(field),
            "{args:?}: error does not name `{field}`: {err}"
        );
    }
}

#[test]
fn beam_search_of_width_one_is_greedy_and_wider_beams_score_no_worse() {
    let prompt = [
        "--prompt",
        "The capital of France is",
        "--max-tokens",
        "8",
        "--ignore-eos",
        "--json",
    ];
    let greedy = &json_lines(&[&prompt[..], &["--temperature", "0"]].concat())[0];
    let one = &json_lines(&[&prompt[..], &["--beam-width", "1"]].concat())[0];
    assert_eq!(one["token_ids"], greedy["token_ids"]);
    let three =
        &json_lines(&[&prompt[..], &["--beam-width", "3", "--length-penalty", "0"]].concat())[0];
    let beams = three["beams"].as_array().unwrap();
    assert_eq!(beams.len(), 3);
    let scores: Vec<f64> = beams.iter().map(|b| b["score"].as_f64().unwrap()).collect();
    assert!(
        scores.windows(2).all(|w| w[0] >= w[1]),
        "hypotheses sorted best first"
    );
    let greedy_sum: f64 = greedy["logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .sum();
    assert!(
        scores[0] >= greedy_sum - 1e-4,
        "the best beam is at least as likely as greedy"
    );
}

/// A beam request's record carries `logprobs: null` (its hypotheses carry their cumulative
/// logprobs), whether it succeeded or failed; the failed one names its error, and the run
/// fails after writing both records.
#[test]
fn beam_records_have_null_logprobs_even_when_the_request_failed() {
    let dir = std::env::temp_dir().join(format!("tandem-beam-records-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("in.jsonl");
    std::fs::write(
        &input,
        "{\"prompt\": \"Hi\", \"beam_width\": 2, \"max_tokens\": 3}\n\
         {\"prompt\": \"Hi\", \"beam_width\": 2, \"max_tokens\": 1000000}\n",
    )
    .unwrap();
    let out = tandem(&["--input", input.to_str().unwrap()]);
    std::fs::remove_dir_all(&dir).ok();
    assert!(!out.status.success(), "a failed request fails the run");
    let records: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 2);
    assert_eq!(records[0]["logprobs"], Value::Null);
    assert_eq!(records[0]["beams"].as_array().unwrap().len(), 2);
    assert_eq!(records[1]["logprobs"], Value::Null);
    assert_eq!(records[1]["finish_reason"], "error");
    assert!(records[1]["error"].as_str().unwrap().contains("max_tokens"));
}
