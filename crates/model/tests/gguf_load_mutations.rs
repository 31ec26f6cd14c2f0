//! A model file may say anything, and loading it must never panic. Every metadata key of the
//! real-architecture GGUF fixtures (Gemma 3, Phi-3, Qwen3-MoE, Mixtral in f32 and in Q8_0) is
//! in turn dropped, given another type, and set to edge values (0, 1, odd counts, `u32::MAX`,
//! negative numbers, NaN, infinities, huge and tiny floats, shortened and emptied arrays);
//! every tensor is dropped and, where it has two different dimensions, transposed. Each file
//! must load to a typed error, or to a model whose forward pass gives finite logits or a typed
//! error. The tokenizer keys of a byte-level BPE vocabulary (the default model) and of a
//! SentencePiece one get the same treatment, plus single-element corruptions of their arrays:
//! each builds a tokenizer or fails with a typed error, and what builds encodes and decodes
//! without a panic, for ids inside and outside its vocabulary.
//!
//! The byte-level fuzzing of the parser itself is in `gguf_proptest.rs` and
//! `gguf_malformed.rs`; this test reaches past the parser, into the configuration, the tensor
//! checks, the weights' preparation, the forward pass and the tokenizer builders.

mod load_check;

use std::path::{Path, PathBuf};

use load_check::{exercise, no_panic, run_five_tokens};
use tandem_kernels::DType;
use tandem_model::gguf::{GgufFile, GgufWriter, Metadata, MetadataValue};
use tandem_model::loader::load_gguf_model;
use tandem_model::tokenizer::Tokenizer;
use MetadataValue as V;

/// A GGUF file taken apart: its metadata in file order and its tensors with their bytes.
#[derive(Clone)]
struct Parts {
    meta: Vec<(String, MetadataValue)>,
    tensors: Vec<(String, DType, Vec<u64>, Vec<u8>)>,
}

impl Parts {
    fn read(path: &Path) -> Parts {
        let bytes = std::fs::read(path).expect("fixture");
        let (_, md, infos, data, _) = GgufFile::parse_bytes(&bytes).expect("valid fixture");
        let meta = md.keys().map(|k| (k.to_string(), value(&md, k))).collect();
        let tensors = infos
            .iter()
            .map(|t| {
                let start = data + t.offset as usize;
                let end = start + t.n_bytes().expect("sized") as usize;
                let bytes = bytes[start..end].to_vec();
                (t.name.clone(), t.dtype, t.dims.clone(), bytes)
            })
            .collect();
        Parts { meta, tensors }
    }

    fn to_bytes(&self) -> Vec<u8> {
        let mut w = GgufWriter::new(3);
        for (k, v) in &self.meta {
            w = w.metadata(k.clone(), v.clone());
        }
        for (name, dtype, dims, bytes) in &self.tensors {
            w = w.tensor(name.clone(), *dtype, dims, bytes.clone());
        }
        w.to_bytes()
    }
}

fn value(meta: &Metadata, key: &str) -> MetadataValue {
    meta.get(key).cloned().expect("a listed key")
}

/// The values a key is set to in turn: edge values of its kind and of other kinds.
fn variants(v: &MetadataValue) -> Vec<MetadataValue> {
    match v {
        V::U8(_)
        | V::I8(_)
        | V::U16(_)
        | V::I16(_)
        | V::U32(_)
        | V::I32(_)
        | V::U64(_)
        | V::I64(_) => [0, 1, 2, 3, 7, 1 << 20, 1 << 24, 1 << 30, u32::MAX]
            .map(V::U32)
            .into_iter()
            .chain([
                V::I32(-1),
                V::U64(u64::MAX),
                V::F32(1.5),
                V::String("x".into()),
            ])
            .collect(),
        V::F32(_) | V::F64(_) => [
            0.0,
            -1.0,
            f32::NAN,
            f32::INFINITY,
            -f32::INFINITY,
            1e30,
            1e-30,
        ]
        .map(V::F32)
        .into_iter()
        .chain([V::U32(3), V::String("x".into())])
        .collect(),
        V::Bool(b) => vec![V::Bool(!b), V::U32(1)],
        V::String(_) => vec![
            V::String(String::new()),
            V::String("llama".into()),
            V::U32(1),
        ],
        V::Array(items) => array_variants(items),
    }
}

fn array_variants(items: &[MetadataValue]) -> Vec<MetadataValue> {
    let mut out = vec![V::Array(vec![]), V::U32(1)];
    if items.len() > 1 {
        out.push(V::Array(items[..1].to_vec()));
        out.push(V::Array(items[..items.len() / 2].to_vec()));
        out.push(V::Array([items, items].concat()));
    }
    if let Some(first) = items.first() {
        let scalars = variants(first)
            .into_iter()
            .filter(|x| !matches!(x, V::Array(_)));
        out.extend(scalars.map(|x| V::Array(vec![x; items.len()])));
    }
    out
}

/// Arrays with one element replaced, at the start, the middle and the end: an empty or
/// unusual piece, a malformed merge or byte token, an unknown token type, a NaN score, or a
/// duplicate of its neighbour.
fn element_variants(items: &[MetadataValue]) -> Vec<MetadataValue> {
    let odd = [
        "",
        " ",
        "a",
        "a b c",
        "<0xZZ>",
        "<0x>",
        "<0x41>",
        "<|im_start|>",
    ]
    .map(|s| V::String(s.into()))
    .into_iter()
    .chain([V::I32(0), V::I32(99), V::I32(-5), V::F32(f32::NAN)]);
    let mut out = Vec::new();
    for at in [0, 1, items.len() / 2, items.len().saturating_sub(1)] {
        let Some(here) = items.get(at) else { continue };
        let neighbour = items[(at + 1) % items.len()].clone();
        for x in odd.clone().chain([neighbour]) {
            if x.type_id() == here.type_id() {
                let mut changed = items.to_vec();
                changed[at] = x;
                out.push(V::Array(changed));
            }
        }
    }
    out
}

/// Loads the file and, when it loads, runs five tokens through it. `Ok(true)` when it loaded.
fn load_and_run(path: &Path) -> Result<bool, String> {
    match load_gguf_model(path) {
        Ok((host, _)) => run_five_tokens(host).map(|()| true),
        Err(_) => Ok(false),
    }
}

fn model_mutations(base: &Parts) -> Vec<(String, Parts)> {
    let mut out = Vec::new();
    for (i, (key, value)) in base.meta.iter().enumerate() {
        let mut dropped = base.clone();
        dropped.meta.remove(i);
        out.push((format!("without {key}"), dropped));
        for v in variants(value) {
            let label = format!("{key} = {v:.60?}");
            let mut changed = base.clone();
            changed.meta[i].1 = v;
            out.push((label, changed));
        }
    }
    for (i, (name, dtype, dims, _)) in base.tensors.iter().enumerate() {
        let mut dropped = base.clone();
        dropped.tensors.remove(i);
        out.push((format!("without tensor {name}"), dropped));
        let mut swapped = dims.clone();
        if dims.len() >= 2 && dims[0] != dims[1] {
            swapped.swap(0, 1);
            if dtype.bytes_for(swapped[0] as usize).is_some() {
                let mut transposed = base.clone();
                transposed.tensors[i].2 = swapped;
                out.push((format!("tensor {name} transposed"), transposed));
            }
        }
    }
    out
}

fn fixture(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(path)
}

#[test]
fn mutated_model_files_load_to_an_error_or_a_working_model() {
    let dir = std::env::temp_dir().join(format!("tandem-gguf-mutations-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut failures = Vec::new();
    for name in [
        "gemma3",
        "phi3",
        "qwen3_moe_norm",
        "mixtral",
        "mixtral_q8_0",
    ] {
        let base = Parts::read(&fixture(&format!("gguf_arch/{name}.gguf")));
        let (mut loaded, mut refused) = (0, 0);
        for (label, parts) in model_mutations(&base) {
            let path = dir.join(format!("{name}.gguf"));
            std::fs::write(&path, parts.to_bytes()).expect("write");
            match no_panic(&format!("{name}: {label}"), &mut failures, || {
                load_and_run(&path)
            }) {
                Some(true) => loaded += 1,
                Some(false) => refused += 1,
                None => {}
            }
        }
        eprintln!("{name}: {loaded} mutations loaded and ran, {refused} refused");
        assert!(
            loaded > 0 && refused > 0,
            "{name}: {loaded} loaded, {refused} refused"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Builds the tokenizer of `meta` and, when it builds, uses it. `Ok(true)` when it built.
fn use_tokenizer(meta: &Metadata) -> Result<bool, String> {
    Ok(Tokenizer::from_gguf_metadata(meta)
        .map(|t| exercise(&t))
        .is_ok())
}

fn check_tokenizer_keys(label: &str, base: &Metadata, failures: &mut Vec<String>) {
    let keys: Vec<String> = (base.keys())
        .filter(|k| k.starts_with("tokenizer."))
        .map(str::to_string)
        .collect();
    assert!(
        use_tokenizer(base).expect("base"),
        "{label}: the base vocabulary"
    );
    let (mut built, mut refused) = (0, 0);
    for key in &keys {
        let original = value(base, key);
        let mut cases = variants(&original);
        if let V::Array(items) = &original {
            cases.extend(element_variants(items));
        }
        let mut without = Metadata::default();
        for k in base.keys().filter(|k| k != key) {
            without.insert(k.to_string(), value(base, k));
        }
        let mut cases: Vec<(String, Metadata)> = cases
            .into_iter()
            .map(|v| {
                let mut meta = base.clone();
                let name = format!("{key} = {v:.60?}");
                meta.insert(key.clone(), v);
                (name, meta)
            })
            .collect();
        cases.push((format!("without {key}"), without));
        for (name, meta) in cases {
            match no_panic(&format!("{label}: {name}"), failures, || {
                use_tokenizer(&meta)
            }) {
                Some(true) => built += 1,
                Some(false) => refused += 1,
                None => {}
            }
        }
    }
    eprintln!("{label}: {built} mutations built a tokenizer, {refused} refused");
    assert!(
        built > 0 && refused > 0,
        "{label}: {built} built, {refused} refused"
    );
}

#[test]
fn mutated_tokenizer_metadata_builds_or_fails_cleanly() {
    let mut failures = Vec::new();
    let spm = GgufFile::open(&fixture("tokenizer_spm/vocab.gguf")).expect("SentencePiece fixture");
    check_tokenizer_keys("SentencePiece fixture", &spm.metadata, &mut failures);
    let path = tandem_model::default_model::test_model_path()
        .expect("the default model is needed (TANDEM_TEST_MODEL); this test does not skip");
    let default = GgufFile::open(&path).expect("default model");
    check_tokenizer_keys("default model", &default.metadata, &mut failures);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
