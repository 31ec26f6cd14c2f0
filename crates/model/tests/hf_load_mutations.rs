//! A model directory may say anything, and loading it must never panic. In each Hugging Face
//! fixture (Llama, Mistral with a sliding window, Qwen2, Qwen3, Qwen3-MoE, Mixtral, Phi-3,
//! Gemma 3, Llama 3 RoPE scaling), every value of `config.json`, `generation_config.json` and
//! `tokenizer_config.json`, nested ones included, is in turn removed and replaced by edge
//! values (0, 1, odd counts, huge and negative numbers, fractions, null, a string, a list, an
//! object). Each directory must load to a typed error, or to a model whose forward pass gives
//! finite logits or a typed error. The safetensors header and the tokenizer are covered by
//! their own malformed-input tests (`hf_safetensors.rs`, `tokenizer_hf_dir.rs`).

mod load_check;

use std::path::{Path, PathBuf};

use load_check::{no_panic, run_five_tokens};
use serde_json::{json, Value};
use tandem_model::loader::load_model;

const FIXTURES: [&str; 9] = [
    "llama_tied",
    "mistral_swa",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "mixtral",
    "phi3",
    "gemma3",
    "llama3_rope",
];
const JSON_FILES: [&str; 3] = [
    "config.json",
    "generation_config.json",
    "tokenizer_config.json",
];

/// The values a JSON value is replaced by in turn.
fn variants(v: &Value) -> Vec<Value> {
    let mut out = vec![
        json!(null),
        json!(0),
        json!(1),
        json!(3),
        json!(-1),
        json!(1.5),
        json!(1e300),
        json!(1 << 24),
        json!(1 << 30),
        json!(u64::MAX),
        json!("x"),
        json!([]),
        json!({}),
    ];
    match v {
        Value::Array(items) if !items.is_empty() => {
            out.push(json!([items[0]]));
            out.push(json!([items.clone(), items.clone()].concat()));
        }
        Value::Bool(b) => out.push(json!(!b)),
        Value::Number(n) if n.as_f64().is_some_and(|x| x > 0.0 && x < 1.0) => {
            out.extend([json!(1e-30), json!(0.999)]);
        }
        _ => {}
    }
    out
}

/// Every (path, replacement) pair: each value of `root`, nested ones too, replaced by each
/// of its variants, or removed (`None`).
fn mutations(root: &Value) -> Vec<(Vec<String>, Option<Value>)> {
    let mut out = Vec::new();
    let mut stack = vec![(Vec::<String>::new(), root)];
    while let Some((path, value)) = stack.pop() {
        let Value::Object(map) = value else { continue };
        for (key, child) in map {
            let mut at = path.clone();
            at.push(key.clone());
            out.push((at.clone(), None));
            out.extend(variants(child).into_iter().map(|v| (at.clone(), Some(v))));
            stack.push((at, child));
        }
    }
    out
}

fn apply(root: &Value, path: &[String], replacement: &Option<Value>) -> Value {
    let mut out = root.clone();
    let (last, parents) = path.split_last().expect("a non-empty path");
    let mut node = &mut out;
    for key in parents {
        node = node.get_mut(key).expect("the path exists");
    }
    let map = node.as_object_mut().expect("an object");
    match replacement {
        Some(v) => map.insert(last.clone(), v.clone()),
        None => map.remove(last),
    };
    out
}

/// Loads the directory and, when it loads, runs five tokens through it. `Ok(true)` when it
/// loaded.
fn load_and_run(dir: &Path) -> Result<bool, String> {
    let Ok(loaded) = load_model(dir) else {
        return Ok(false);
    };
    let _ = loaded.tokenizer.encode("Hello world", true);
    run_five_tokens(loaded.host).map(|()| true)
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(name)
}

/// A copy of the fixture `name` in a fresh temporary directory.
fn copy_fixture(name: &str, into: &Path) -> PathBuf {
    let dir = into.join(name);
    std::fs::create_dir_all(&dir).expect("temp dir");
    for entry in std::fs::read_dir(fixture(name)).expect("fixture") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), dir.join(entry.file_name())).expect("copy");
    }
    dir
}

#[test]
fn mutated_model_directories_load_to_an_error_or_a_working_model() {
    let tmp = std::env::temp_dir().join(format!("tandem-hf-mutations-{}", std::process::id()));
    let mut failures = Vec::new();
    for name in FIXTURES {
        let dir = copy_fixture(name, &tmp);
        assert_eq!(load_and_run(&dir), Ok(true), "{name}: the fixture itself");
        let (mut loaded, mut refused) = (0, 0);
        for file in JSON_FILES {
            let Ok(text) = std::fs::read_to_string(dir.join(file)) else {
                continue;
            };
            let root: Value = serde_json::from_str(&text).expect("fixture json");
            for (path, replacement) in mutations(&root) {
                let changed = apply(&root, &path, &replacement);
                std::fs::write(dir.join(file), changed.to_string()).expect("write");
                let label = format!("{name}/{file}: {} = {replacement:?}", path.join("."));
                match no_panic(&label, &mut failures, || load_and_run(&dir)) {
                    Some(true) => loaded += 1,
                    Some(false) => refused += 1,
                    None => {}
                }
            }
            std::fs::write(dir.join(file), text).expect("restore");
        }
        eprintln!("{name}: {loaded} mutations loaded and ran, {refused} refused");
        assert!(
            loaded > 0 && refused > 0,
            "{name}: {loaded} loaded, {refused} refused"
        );
    }
    std::fs::remove_dir_all(&tmp).ok();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
