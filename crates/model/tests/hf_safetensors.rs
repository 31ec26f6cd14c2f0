//! The safetensors loader against the `safetensors` crate (an independent reader and
//! writer), the committed fixtures, and crafted malformed files.

// Test helpers outside #[test] functions unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use safetensors::tensor::{serialize, SafeTensors, TensorView};
use safetensors::Dtype;
use tandem_kernels::DType;
use tandem_model::safetensors::{load_safetensors_dir, parse_header};
use tandem_model::weights::TensorSet;
use tandem_model::ModelError;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(name)
}

/// A fresh, empty directory for one test.
fn tmp_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("hf_safetensors")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A safetensors file from a raw header and data section.
fn raw_file(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

fn dtype_of(d: Dtype) -> DType {
    match d {
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        other => panic!("fixture holds {other:?}"),
    }
}

/// Every tensor of `file`, as the `safetensors` crate reads it, is in `set` unchanged.
fn assert_matches_reference(set: &TensorSet, file: &Path) -> BTreeSet<String> {
    let bytes = std::fs::read(file).unwrap();
    let reference = SafeTensors::deserialize(&bytes).unwrap();
    let mut names = BTreeSet::new();
    for (name, view) in reference.tensors() {
        let t = set.require(&name).unwrap();
        assert_eq!(t.shape, view.shape(), "{name}");
        assert_eq!(t.dtype, dtype_of(view.dtype()), "{name}");
        assert_eq!(t.data, view.data(), "{name}");
        names.insert(name);
    }
    names
}

#[test]
fn single_file_fixtures_match_the_reference_reader() {
    for (name, dtype, lm_head) in [
        ("llama_tied", DType::F32, false),
        ("llama_untied", DType::F32, true),
        ("llama3_rope", DType::F32, false),
        ("mistral", DType::F32, true),
        ("qwen2", DType::F32, false),
        ("qwen3", DType::F32, false),
        ("llama_tied_bf16", DType::BF16, false),
        ("llama_tied_f16", DType::F16, false),
    ] {
        let dir = fixture(name);
        let set = load_safetensors_dir(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        let names = assert_matches_reference(&set, &dir.join("model.safetensors"));
        assert_eq!(names.len(), set.len(), "{name}: no extra tensors");
        assert_eq!(set.get("lm_head.weight").is_some(), lm_head, "{name}");
        let embed = set.require("model.embed_tokens.weight").unwrap();
        assert_eq!(
            (embed.dtype, embed.shape),
            (dtype, &[320, 64][..]),
            "{name}"
        );
    }
}

#[test]
fn sharded_fixture_loads_every_indexed_tensor() {
    let dir = fixture("llama_sharded");
    let set = load_safetensors_dir(&dir).unwrap();
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("model.safetensors.index.json")).unwrap())
            .unwrap();
    let map = index["weight_map"].as_object().unwrap();
    let shards: BTreeSet<&str> = map.values().map(|v| v.as_str().unwrap()).collect();
    assert!(shards.len() >= 2, "the fixture must be sharded");
    let mut seen = BTreeSet::new();
    for shard in shards {
        seen.extend(assert_matches_reference(&set, &dir.join(shard)));
    }
    let listed: BTreeSet<String> = map.keys().cloned().collect();
    assert_eq!(seen, listed);
    assert_eq!(set.len(), listed.len());
    // Same seed and architecture as llama_tied: the same bytes, tensor by tensor.
    let single = load_safetensors_dir(&fixture("llama_tied")).unwrap();
    assert_eq!(single.len(), set.len());
    for name in single.names() {
        assert_eq!(
            set.require(name).unwrap().data,
            single.require(name).unwrap().data
        );
    }
}

#[test]
fn crafted_valid_file_round_trips() {
    let a: Vec<u8> = [1.0f32, -2.5, 3.25, 0.0, 7.0, 8.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let b: Vec<u8> = (0u8..8).collect();
    let c: Vec<u8> = vec![0x80, 0x3f];
    let tensors = vec![
        ("a", TensorView::new(Dtype::F32, vec![2, 3], &a).unwrap()),
        ("b", TensorView::new(Dtype::BF16, vec![4], &b).unwrap()),
        ("scalar", TensorView::new(Dtype::F16, vec![], &c).unwrap()),
    ];
    let meta = [("format".to_string(), "pt".to_string())]
        .into_iter()
        .collect();
    let bytes = serialize(tensors, Some(meta)).unwrap();
    let dir = tmp_dir("valid");
    std::fs::write(dir.join("model.safetensors"), &bytes).unwrap();
    let set = load_safetensors_dir(&dir).unwrap();
    assert_eq!(set.len(), 3);
    let t = set.require("a").unwrap();
    assert_eq!((t.dtype, t.shape), (DType::F32, &[2, 3][..]));
    let values: Vec<f32> = t
        .data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(values, vec![1.0, -2.5, 3.25, 0.0, 7.0, 8.0]);
    assert_eq!(set.require("b").unwrap().data, &b[..]);
    let s = set.require("scalar").unwrap();
    assert_eq!((s.dtype, s.shape.len(), s.data), (DType::F16, 0, &c[..]));
}

/// The error from parsing `bytes`, as text, checked to be of the expected kind.
fn header_error(bytes: &[u8], tensor: Option<&str>) -> String {
    match (
        parse_header(bytes, Path::new("crafted.safetensors")),
        tensor,
    ) {
        (Err(ModelError::BadTensor { name, reason }), Some(want)) => {
            assert_eq!(name, want);
            reason
        }
        (Err(ModelError::Safetensors(msg)), None) => msg,
        (other, _) => panic!("unexpected result {other:?}"),
    }
}

#[test]
fn malformed_headers_are_rejected() {
    assert!(header_error(&[1, 0, 0], None).contains("no header"));
    let mut huge = u64::MAX.to_le_bytes().to_vec();
    huge.extend_from_slice(b"{}");
    assert!(header_error(&huge, None).contains("header length"));
    let mut over_cap = (200u64 << 20).to_le_bytes().to_vec();
    over_cap.extend_from_slice(b"{}");
    assert!(header_error(&over_cap, None).contains("header length"));
    let full = raw_file(
        r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
        &[0; 4],
    );
    assert!(
        header_error(&full[..20], None).contains("header length"),
        "truncated header"
    );
    assert!(header_error(&raw_file(r#"{"a": "#, &[]), None).contains("JSON"));
    assert!(header_error(&raw_file("[1, 2]", &[]), None).contains("JSON object"));
}

#[test]
fn bad_tensor_entries_name_the_tensor() {
    let cases = [
        (
            r#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,32]}}"#,
            "outside",
        ),
        (
            r#"{"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}}"#,
            "outside",
        ),
        (
            r#"{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}}"#,
            "needs 16",
        ),
        (
            r#"{"w":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}}"#,
            "`I64`",
        ),
        (
            r#"{"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}}"#,
            "overflows",
        ),
        (
            r#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[-1,16]}}"#,
            "malformed",
        ),
        (
            r#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16],"x":1}}"#,
            "malformed",
        ),
        (r#"{"w":{"dtype":"F32","shape":[4]}}"#, "malformed"),
    ];
    let dup = r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},
                  "w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#;
    assert!(header_error(&raw_file(dup, &[0; 8]), Some("w")).contains("twice"));
    for (header, reason) in cases {
        let msg = header_error(&raw_file(header, &[0; 24]), Some("w"));
        assert!(msg.contains(reason), "{header}: `{msg}` lacks `{reason}`");
    }
}

#[test]
fn overlapping_tensors_are_rejected() {
    let header = r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},
                     "b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}}"#;
    assert!(header_error(&raw_file(header, &[0; 24]), Some("b")).contains("overlaps tensor `a`"));
    // Same range twice is an overlap too; adjacent ranges and empty tensors are fine.
    let twice = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                    "b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    assert!(parse_header(&raw_file(twice, &[0; 8]), Path::new("x")).is_err());
    let ok = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                 "e":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},
                 "b":{"dtype":"BF16","shape":[4],"data_offsets":[8,16]}}"#;
    let t = parse_header(&raw_file(ok, &[0; 16]), Path::new("x")).unwrap();
    let header_end = 8 + ok.len();
    let offsets: Vec<_> = t
        .iter()
        .map(|t| (t.name.as_str(), t.offset - header_end))
        .collect();
    assert_eq!(offsets, vec![("a", 0), ("e", 8), ("b", 8)]);
}

/// A directory holding `shards` (name -> file bytes) and an index with `weight_map`.
fn sharded_dir(name: &str, weight_map: &[(&str, &str)], shards: &[(&str, Vec<u8>)]) -> PathBuf {
    let dir = tmp_dir(name);
    for (file, bytes) in shards {
        std::fs::write(dir.join(file), bytes).unwrap();
    }
    let map: BTreeMap<_, _> = weight_map.iter().copied().collect();
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    dir
}

fn one_tensor(name: &str) -> Vec<u8> {
    let header = format!(r#"{{"{name}":{{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}}}"#);
    raw_file(&header, &[0; 8])
}

fn dir_error(dir: &Path) -> String {
    match load_safetensors_dir(dir) {
        Err(e @ ModelError::Safetensors(_)) => e.to_string(),
        other => panic!("expected a safetensors error, got {other:?}"),
    }
}

#[test]
fn index_shard_names_must_stay_inside_the_directory() {
    let shards = [("s1.safetensors", one_tensor("a"))];
    for evil in ["../s1.safetensors", "/etc/hostname", "sub/../../x", ""] {
        let dir = sharded_dir("traversal", &[("a", evil)], &shards);
        let msg = dir_error(&dir);
        assert!(msg.contains("not a plain relative path"), "{evil}: {msg}");
    }
}

#[test]
fn index_and_shards_must_agree() {
    let good = sharded_dir(
        "agree",
        &[("a", "s1.safetensors"), ("b", "s2.safetensors")],
        &[
            ("s1.safetensors", one_tensor("a")),
            ("s2.safetensors", one_tensor("b")),
        ],
    );
    assert_eq!(load_safetensors_dir(&good).unwrap().len(), 2);

    let missing_tensor = sharded_dir(
        "missing_tensor",
        &[("a", "s1.safetensors"), ("b", "s1.safetensors")],
        &[("s1.safetensors", one_tensor("a"))],
    );
    assert!(dir_error(&missing_tensor).contains("tensor `b` is not in its shard"));

    let unlisted = sharded_dir(
        "unlisted",
        &[("a", "s1.safetensors")],
        &[
            ("s1.safetensors", one_tensor("a")),
            ("s2.safetensors", one_tensor("b")),
        ],
    );
    // s2 is never opened: nothing refers to it.
    assert_eq!(load_safetensors_dir(&unlisted).unwrap().len(), 1);
    let misplaced = sharded_dir(
        "misplaced",
        &[("a", "s1.safetensors"), ("b", "s2.safetensors")],
        &[
            ("s1.safetensors", one_tensor("a")),
            ("s2.safetensors", one_tensor("a")),
        ],
    );
    assert!(load_safetensors_dir(&misplaced).is_err());

    let missing_shard = sharded_dir("missing_shard", &[("a", "gone.safetensors")], &[]);
    assert!(matches!(
        load_safetensors_dir(&missing_shard),
        Err(ModelError::Io { .. })
    ));

    let empty = sharded_dir("empty", &[], &[]);
    assert!(dir_error(&empty).contains("weight_map is empty"));
}

#[test]
fn malformed_index_or_no_checkpoint() {
    let dir = tmp_dir("bad_index");
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        "{\"weight_map\": [1]}",
    )
    .unwrap();
    assert!(dir_error(&dir).contains("malformed index"));
    let empty = tmp_dir("no_checkpoint");
    assert!(dir_error(&empty).contains("neither"));
    // A bad single file surfaces its error through the directory loader too.
    let bad = tmp_dir("bad_single");
    let header = r#"{"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}"#;
    std::fs::write(bad.join("model.safetensors"), raw_file(header, &[0; 8])).unwrap();
    match load_safetensors_dir(&bad) {
        Err(ModelError::BadTensor { name, reason }) => {
            assert_eq!(name, "w");
            assert!(reason.contains("F64"));
        }
        other => panic!("{other:?}"),
    }
}
