//! `tandem generate` with structured-output flags on the default model: `--regex`,
//! `--choice` (with `--n 4`) and `--json-schema` outputs match at temperature 1, and a bad
//! regex is refused naming the flag.
#![allow(clippy::unwrap_used)] // helpers outside #[test] functions

use std::process::{Command, Output};

use serde_json::Value;

fn tandem(args: &[&str]) -> Output {
    let m = tandem_model::default_model::test_model_path()
        .expect("the default model is needed; this test does not skip");
    let m = m.display().to_string();
    let mut all = vec!["generate", "--model", &m, "--kv-cache-memory", "256MiB"];
    all.extend_from_slice(args);
    Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(&all)
        .output()
        .expect("run tandem")
}

/// The `--json` results of a successful run.
fn results(args: &[&str]) -> Vec<Value> {
    let out = tandem(args);
    assert!(
        out.status.success(),
        "tandem generate {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("UTF-8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect()
}

fn texts(args: &[&str]) -> Vec<String> {
    let mut all = vec!["--temperature", "1", "--seed", "5", "--json"];
    all.extend_from_slice(args);
    results(&all)
        .into_iter()
        .map(|r| {
            assert_eq!(r["finish_reason"], "stop", "{r}");
            r["text"].as_str().unwrap().to_string()
        })
        .collect()
}

#[test]
fn structured_flags_constrain_every_sample() {
    let rx = regex::Regex::new("^[a-z]{3,8}@example\\.(com|org)$").unwrap();
    let p = [
        "--prompt",
        "My email address is",
        "--n",
        "4",
        "--max-tokens",
        "40",
    ];
    for t in texts(&[&p[..], &["--regex", "[a-z]{3,8}@example\\.(com|org)"]].concat()) {
        assert!(rx.is_match(&t), "{t:?}");
    }
    let choice = ["--choice", "red", "--choice", "green", "--choice", "blue"];
    for t in texts(&[&p[..], &choice[..]].concat()) {
        assert!(["red", "green", "blue"].contains(&t.as_str()), "{t:?}");
    }
    let dir = std::env::temp_dir().join(format!("tandem-schema-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let schema = dir.join("schema.json");
    std::fs::write(
        &schema,
        r#"{"type":"object","properties":{"city":{"type":"string","maxLength":16},
            "population":{"type":"integer","minimum":0,"maximum":100000000}},
            "required":["city","population"],"additionalProperties":false}"#,
    )
    .unwrap();
    let s = schema.display().to_string();
    for t in texts(&[&p[..], &["--json-schema", &s]].concat()) {
        let v: Value = serde_json::from_str(&t).unwrap_or_else(|e| panic!("{t:?}: {e}"));
        assert!(
            v["city"].as_str().is_some_and(|c| c.chars().count() <= 16),
            "{t}"
        );
        assert!(v["population"].as_u64().is_some(), "{t}");
        assert_eq!(v.as_object().map(|o| o.len()), Some(2), "{t}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_regex_is_refused_naming_the_flag() {
    let out = tandem(&["--prompt", "x", "--regex", "("]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--regex"), "{err}");
}
