//! Strict loading of Hugging Face directories: copies of the `llama_untied` fixture whose
//! `config.json` or `model.safetensors` was changed are refused with an error naming the
//! field or tensor, except for what the rules allow (an old `rotary_emb.inv_freq` buffer, a
//! norm stored in another float type: safetensors checkpoints store every tensor in the
//! model's dtype, F32, F16 or BF16, and each converts exactly to f32).

// Test helpers outside #[test] functions unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use serde_json::{json, Value};
use tandem_model::loader::load_model;
use tandem_model::ModelError;

/// A tensor as written: name, dtype, shape, bytes.
type Tensor = (String, Dtype, Vec<usize>, Vec<u8>);

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(name)
}

fn read_tensors(path: &Path) -> Vec<Tensor> {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<Tensor> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// A copy of the `llama_untied` fixture with its config and tensors edited; loads it,
/// removes it.
fn load_variant(
    edit_config: impl FnOnce(&mut Value),
    edit_tensors: impl FnOnce(&mut Vec<Tensor>),
) -> Result<(), ModelError> {
    load_variant_of("llama_untied", edit_config, edit_tensors)
}

/// [`load_variant`] of the fixture `name`.
fn load_variant_of(
    name: &str,
    edit_config: impl FnOnce(&mut Value),
    edit_tensors: impl FnOnce(&mut Vec<Tensor>),
) -> Result<(), ModelError> {
    let fixture = || fixture(name);
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("tandem-hf-strict-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        std::fs::copy(fixture().join(f), dir.join(f)).unwrap();
    }
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture().join("config.json")).unwrap())
            .unwrap();
    edit_config(&mut config);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut tensors = read_tensors(&fixture().join("model.safetensors"));
    edit_tensors(&mut tensors);
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    let bytes = safetensors::serialize(views, None).unwrap();
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
    let result = load_model(&dir).map(|_| ());
    std::fs::remove_dir_all(&dir).unwrap();
    result
}

fn config_only(edit: impl FnOnce(&mut Value)) -> Result<(), ModelError> {
    load_variant(edit, |_| {})
}

fn tensors_only(edit: impl FnOnce(&mut Vec<Tensor>)) -> Result<(), ModelError> {
    load_variant(|_| {}, edit)
}

fn f32_tensor(name: &str, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let bytes = (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect();
    (name.to_string(), Dtype::F32, shape.to_vec(), bytes)
}

fn remove(tensors: &mut Vec<Tensor>, name: &str) -> Tensor {
    let i = tensors.iter().position(|t| t.0 == name).unwrap();
    tensors.remove(i)
}

#[test]
fn the_unchanged_copy_and_the_allowed_variants_load() {
    config_only(|_| {}).unwrap();
    // transformers < 4.31 saved this buffer; it is recomputed from the config.
    tensors_only(|t| {
        t.push(f32_tensor(
            "model.layers.1.self_attn.rotary_emb.inv_freq",
            &[8],
        ))
    })
    .unwrap();
    // A norm in BF16 inside an F32 checkpoint: a float type, converted exactly.
    tensors_only(|t| {
        let (name, _, shape, bytes) = remove(t, "model.layers.0.input_layernorm.weight");
        let bf16: Vec<u8> = bytes.chunks_exact(4).flat_map(|b| [b[2], b[3]]).collect();
        t.push((name, Dtype::BF16, shape, bf16));
    })
    .unwrap();
}

#[test]
fn extra_tensors_are_listed_with_the_allowed_extras() {
    let e = tensors_only(|t| {
        t.push(f32_tensor("model.layers.0.mlp.extra.weight", &[4]));
        t.push(f32_tensor("vision_tower.proj", &[2, 2]));
    })
    .unwrap_err();
    match &e {
        ModelError::UnusedTensors { names, .. } => {
            assert_eq!(
                names,
                &["model.layers.0.mlp.extra.weight", "vision_tower.proj"]
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().contains("rotary_emb.inv_freq"), "{e}");
}

#[test]
fn a_missing_tensor_is_named() {
    for name in ["model.layers.1.mlp.up_proj.weight", "lm_head.weight"] {
        let e = tensors_only(|t| drop(remove(t, name))).unwrap_err();
        assert!(
            matches!(&e, ModelError::MissingTensor(n) if n == name),
            "{e:?}"
        );
    }
}

#[test]
fn num_hidden_layers_must_match_the_layers_present() {
    for declared in [1, 3] {
        let e = config_only(|c| c["num_hidden_layers"] = json!(declared)).unwrap_err();
        assert!(
            matches!(&e, ModelError::LayerCount { key, declared: d, .. }
                if key == "num_hidden_layers" && *d == declared),
            "{e:?}"
        );
        assert!(
            e.to_string().contains("model.layers.0 to model.layers.1"),
            "{e}"
        );
    }
}

#[test]
fn head_counts_and_sizes_must_match_the_shapes() {
    let cases = [
        ("num_key_value_heads", json!(2), "need 32 rows"),
        ("num_attention_heads", json!(8), "need 128 rows"),
        ("vocab_size", json!(300), "has 320 rows"),
        ("hidden_size", json!(32), "has 64 columns"),
    ];
    for (field, value, says) in cases {
        let e = config_only(|c| c[field] = value).unwrap_err();
        assert!(
            matches!(&e, ModelError::Hyperparameter { key, .. } if key == field),
            "{field}: {e:?}"
        );
        assert!(e.to_string().contains(says), "{field}: {e}");
    }
}

#[test]
fn a_transposed_matrix_names_the_tensor_and_both_shapes() {
    let name = "model.layers.0.mlp.down_proj.weight";
    let e = tensors_only(|t| {
        let i = t.iter().position(|x| x.0 == name).unwrap();
        t[i].2 = vec![128, 64];
    })
    .unwrap_err();
    assert!(
        matches!(&e, ModelError::BadTensor { name: n, .. } if n == name),
        "{e:?}"
    );
    assert!(e.to_string().contains("[128, 64]") && e.to_string().contains("[64, 128]"));
}

#[test]
fn config_corruptions_do_not_load_the_directory() {
    let e = config_only(|c| c["model_type"] = json!("gpt2")).unwrap_err();
    assert!(
        matches!(e, ModelError::UnsupportedArchitecture { .. }),
        "{e:?}"
    );
    let e = config_only(|c| c["architectures"] = json!([])).unwrap_err();
    assert!(matches!(e, ModelError::Config(_)), "{e:?}");
    let e = config_only(|c| c["dtype"] = json!("float8")).unwrap_err();
    assert!(matches!(e, ModelError::UnsupportedDtype { .. }), "{e:?}");
}

/// Mixture-of-experts checkpoints: the expert count, the experts used per token and the
/// layers' sparsity must agree with the tensors, each expert's matrices must be present.
#[test]
fn expert_corruptions_are_named() {
    let moe = |edit: &dyn Fn(&mut Value), tensors: &dyn Fn(&mut Vec<Tensor>)| {
        load_variant_of("qwen3_moe", edit, tensors).map_err(|e| e.to_string())
    };
    moe(&|_| {}, &|_| {}).unwrap();
    let fewer = moe(&|c| c["num_local_experts"] = json!(4), &|_| {}).unwrap_err();
    assert!(
        fewer.contains("model.layers.0.mlp.gate.weight") && fewer.contains("[4, 32]"),
        "{fewer}"
    );
    let missing = "model.layers.1.mlp.experts.3.up_proj.weight";
    let e = moe(&|_| {}, &|t| drop(remove(t, missing))).unwrap_err();
    assert!(e.contains(missing), "{e}");
    let e = moe(&|c| c["num_experts_per_tok"] = json!(9), &|_| {}).unwrap_err();
    assert!(e.contains("experts used per token (9)"), "{e}");
    let e = moe(&|c| c["mlp_only_layers"] = json!([0]), &|_| {}).unwrap_err();
    assert!(e.contains("mlp_only_layers"), "{e}");
    let e = moe(&|c| c["num_experts"] = json!(6), &|_| {}).unwrap_err();
    assert!(e.contains("num_experts") && e.contains("(6)"), "{e}");
    let e = load_variant_of(
        "mixtral",
        |_| {},
        |t| {
            drop(remove(
                t,
                "model.layers.0.block_sparse_moe.experts.7.w2.weight",
            ))
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("experts.7.w2.weight"), "{e}");
}
