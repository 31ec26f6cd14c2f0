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

use load_check::{exercise, no_panic, run_five_tokens, run_five_tokens_on};
use serde_json::{json, Value};
use tandem_model::loader::load_model;
use tandem_model::lora::load_peft_adapter;
use tandem_model::tokenizer::Tokenizer;
use tandem_model::transformer::Model;

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

/// Every (JSON pointer, replacement) pair: each value of `root`, nested ones too (the first
/// three elements of a list), replaced by each of its variants, or removed (`None`). The
/// children of a key in `opaque` (a vocabulary, its merges) are not visited one by one.
fn mutations(root: &Value, opaque: &[&str]) -> Vec<(String, Option<Value>)> {
    let mut out = Vec::new();
    let mut stack = vec![(String::new(), root)];
    while let Some((pointer, value)) = stack.pop() {
        let children: Vec<(String, &Value)> = match value {
            Value::Object(map) => map
                .iter()
                .map(|(key, child)| (key.replace('~', "~0").replace('/', "~1"), child))
                .collect(),
            Value::Array(items) => items
                .iter()
                .take(3)
                .enumerate()
                .map(|(i, c)| (i.to_string(), c))
                .collect(),
            _ => continue,
        };
        for (step, child) in children {
            let at = format!("{pointer}/{step}");
            out.push((at.clone(), None));
            out.extend(variants(child).into_iter().map(|v| (at.clone(), Some(v))));
            let last = at.rsplit('/').next().unwrap_or_default();
            if !opaque.contains(&last) {
                stack.push((at, child));
            }
        }
    }
    out
}

/// `root` with the value at `pointer` replaced, or removed.
fn apply(root: &Value, pointer: &str, replacement: &Option<Value>) -> Value {
    let mut out = root.clone();
    let (parent, last) = pointer.rsplit_once('/').expect("a non-empty pointer");
    let last = last.replace("~1", "/").replace("~0", "~");
    match (
        out.pointer_mut(parent).expect("the path exists"),
        replacement,
    ) {
        (Value::Object(map), Some(v)) => drop(map.insert(last, v.clone())),
        (Value::Object(map), None) => drop(map.remove(&last)),
        (Value::Array(items), Some(v)) => items[last.parse::<usize>().expect("index")] = v.clone(),
        (Value::Array(items), None) => drop(items.remove(last.parse::<usize>().expect("index"))),
        _ => unreachable!("a pointer's parent is an object or a list"),
    }
    out
}

/// Loads the directory and, when it loads, runs five tokens through it. `Ok(true)` when it
/// loaded.
fn load_and_run(dir: &Path) -> Result<bool, String> {
    let Ok(loaded) = load_model(dir) else {
        return Ok(false);
    };
    exercise(&loaded.tokenizer);
    run_five_tokens(loaded.host).map(|()| true)
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A copy of the fixture `name` (`hf/llama_tied`, `lora/qwen3`) in a fresh temporary
/// directory.
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
        let dir = copy_fixture(&format!("hf/{name}"), &tmp);
        assert_eq!(load_and_run(&dir), Ok(true), "{name}: the fixture itself");
        let (mut loaded, mut refused) = (0, 0);
        for file in JSON_FILES {
            let Ok(text) = std::fs::read_to_string(dir.join(file)) else {
                continue;
            };
            let root: Value = serde_json::from_str(&text).expect("fixture json");
            for (path, replacement) in mutations(&root, &[]) {
                let changed = apply(&root, &path, &replacement);
                std::fs::write(dir.join(file), changed.to_string()).expect("write");
                let label = format!("{name}/{file}: {path} = {replacement:?}");
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

/// `tokenizer.json` (shared by the fixtures) gets the same treatment, but for the entries of
/// its vocabulary and merges: each mutation builds a tokenizer, or fails with a typed error.
#[test]
fn mutated_tokenizer_json_builds_or_fails_cleanly() {
    let tmp = std::env::temp_dir().join(format!("tandem-tokenizer-json-{}", std::process::id()));
    let dir = copy_fixture("hf/llama_tied", &tmp);
    let text = std::fs::read_to_string(dir.join("tokenizer.json")).expect("tokenizer.json");
    let root: Value = serde_json::from_str(&text).expect("fixture json");
    let build = || Tokenizer::from_hf_dir(&dir).map_err(|e| e.to_string());
    assert_eq!(build().map(|t| exercise(&t)), Ok(()), "the fixture itself");
    let (mut failures, mut built, mut refused) = (Vec::new(), 0, 0);
    for (path, replacement) in mutations(&root, &["vocab", "merges"]) {
        let changed = apply(&root, &path, &replacement);
        std::fs::write(dir.join("tokenizer.json"), changed.to_string()).expect("write");
        let label = format!("tokenizer.json: {path} = {replacement:.60?}");
        let outcome = no_panic(&label, &mut failures, || Ok(build().map(|t| exercise(&t))));
        match outcome {
            Some(Ok(())) => built += 1,
            Some(Err(_)) => refused += 1,
            None => {}
        }
    }
    std::fs::remove_dir_all(&tmp).ok();
    eprintln!("tokenizer.json: {built} mutations built a tokenizer, {refused} refused");
    assert!(built > 0 && refused > 0, "{built} built, {refused} refused");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Loads the adapter in `dir` for the Llama fixture and, when it loads, runs five tokens with
/// it. `Ok(true)` when it loaded.
fn adapt_and_run(dir: &Path) -> Result<bool, String> {
    let base = load_model(&fixture("hf/llama_tied")).map_err(|e| e.to_string())?;
    let mut model = Model::new(base.host, 1);
    let Ok(adapter) = load_peft_adapter(dir, &model.config) else {
        return Ok(false);
    };
    let id = model.add_adapter(adapter).map_err(|e| e.to_string())?;
    run_five_tokens_on(&mut model, Some(id)).map(|()| true)
}

/// The Llama fixture's PEFT adapter with every value of its `adapter_config.json` in turn
/// removed or replaced: it loads and runs, or fails with a typed error.
#[test]
fn mutated_adapter_configs_load_to_an_error_or_a_working_adapter() {
    let tmp = std::env::temp_dir().join(format!("tandem-adapter-mutations-{}", std::process::id()));
    let dir = copy_fixture("lora/llama_tied", &tmp);
    let text = std::fs::read_to_string(dir.join("adapter_config.json")).expect("config");
    let root: Value = serde_json::from_str(&text).expect("fixture json");
    assert_eq!(adapt_and_run(&dir), Ok(true), "the fixture itself");
    let (mut failures, mut loaded, mut refused) = (Vec::new(), 0, 0);
    for (path, replacement) in mutations(&root, &[]) {
        let changed = apply(&root, &path, &replacement);
        std::fs::write(dir.join("adapter_config.json"), changed.to_string()).expect("write");
        let label = format!("adapter_config.json: {path} = {replacement:.60?}");
        match no_panic(&label, &mut failures, || adapt_and_run(&dir)) {
            Some(true) => loaded += 1,
            Some(false) => refused += 1,
            None => {}
        }
    }
    std::fs::remove_dir_all(&tmp).ok();
    eprintln!("adapter_config.json: {loaded} mutations loaded and ran, {refused} refused");
    assert!(
        loaded > 0 && refused > 0,
        "{loaded} loaded, {refused} refused"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
