//! Strict GGUF loading: a tiny two-layer llama written with `GgufWriter` loads, and each
//! corruption the adversarial testing of issue 21 found (or that the same checks cover) is
//! refused with an error naming what is wrong. None of them loads.
//!
//! Rule on norm types: a GGUF norm or bias must be F32 (llama.cpp's converters write every
//! 1-D tensor as F32), so a Q4_0 or BF16 norm is refused even when its byte size fits.

// Test helpers outside #[test] functions unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};

use tandem_kernels::DType;
use tandem_model::gguf::{GgufError, GgufWriter, MetadataValue};
use tandem_model::loader::load_gguf_model;
use tandem_model::ModelError;
use MetadataValue::{String as Str, F32, U32};

const H: u64 = 64;
const FF: u64 = 128;
const VOCAB: u64 = 32;
const KV_DIM: u64 = 32;
const LAYERS: u64 = 2;

/// One tensor: ggml dims (innermost first) and its bytes.
#[derive(Clone)]
struct T {
    name: String,
    dtype: DType,
    dims: Vec<u64>,
    bytes: Vec<u8>,
}

/// A tiny GGUF model being built, then corrupted.
#[derive(Clone)]
struct Tiny {
    meta: Vec<(String, MetadataValue)>,
    tensors: Vec<T>,
}

fn f32_bytes(n: u64, seed: u64) -> Vec<u8> {
    (0..n)
        .flat_map(|i| (((i * 7 + seed) % 13) as f32 * 0.01 - 0.06).to_le_bytes())
        .collect()
}

fn f32_tensor(name: String, dims: &[u64], seed: u64) -> T {
    T {
        name,
        dtype: DType::F32,
        dims: dims.to_vec(),
        bytes: f32_bytes(dims.iter().product(), seed),
    }
}

impl Tiny {
    /// Llama: hidden 64, 4 heads of 16, 2 kv heads, FFN 128, vocabulary 32, 2 layers.
    fn llama() -> Tiny {
        let meta = [
            ("general.architecture", Str("llama".into())),
            ("llama.embedding_length", U32(H as u32)),
            ("llama.feed_forward_length", U32(FF as u32)),
            ("llama.block_count", U32(LAYERS as u32)),
            ("llama.attention.head_count", U32(4)),
            ("llama.attention.head_count_kv", U32(2)),
            ("llama.attention.layer_norm_rms_epsilon", F32(1e-5)),
            ("llama.context_length", U32(128)),
        ];
        let mut tensors = vec![f32_tensor("token_embd.weight".into(), &[H, VOCAB], 1)];
        for i in 0..LAYERS {
            let parts: [(&str, &[u64]); 9] = [
                ("attn_norm.weight", &[H]),
                ("attn_q.weight", &[H, H]),
                ("attn_k.weight", &[H, KV_DIM]),
                ("attn_v.weight", &[H, KV_DIM]),
                ("attn_output.weight", &[H, H]),
                ("ffn_norm.weight", &[H]),
                ("ffn_gate.weight", &[H, FF]),
                ("ffn_up.weight", &[H, FF]),
                ("ffn_down.weight", &[FF, H]),
            ];
            for (j, (part, dims)) in parts.into_iter().enumerate() {
                tensors.push(f32_tensor(
                    format!("blk.{i}.{part}"),
                    dims,
                    i * 10 + j as u64,
                ));
            }
        }
        tensors.push(f32_tensor("output_norm.weight".into(), &[H], 3));
        let meta = meta.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        Tiny { meta, tensors }
    }

    /// Qwen2: the llama above with q/k/v biases.
    fn qwen2() -> Tiny {
        let mut t = Tiny::llama();
        for (k, _) in &mut t.meta {
            *k = k.replace("llama.", "qwen2.");
        }
        t = t.set("general.architecture", Str("qwen2".into()));
        for i in 0..LAYERS {
            for (part, len) in [("attn_q", H), ("attn_k", KV_DIM), ("attn_v", KV_DIM)] {
                t = t.with(f32_tensor(format!("blk.{i}.{part}.bias"), &[len], 5));
            }
        }
        t
    }

    /// Qwen3: the llama above with RMSNorm weights on each head of q and k.
    fn qwen3() -> Tiny {
        let mut t = Tiny::llama();
        for (k, _) in &mut t.meta {
            *k = k.replace("llama.", "qwen3.");
        }
        t = t.set("general.architecture", Str("qwen3".into()));
        for i in 0..LAYERS {
            for part in ["attn_q_norm", "attn_k_norm"] {
                t = t.with(f32_tensor(format!("blk.{i}.{part}.weight"), &[16], 7));
            }
        }
        t
    }

    /// Mixtral: the llama above (filed as `llama`, as llama.cpp does) whose MLPs are 4
    /// experts of width FF, 2 per token: a router and the merged 3-D expert tensors.
    fn mixtral() -> Tiny {
        let mut t = Tiny::llama()
            .set("llama.expert_count", U32(4))
            .set("llama.expert_used_count", U32(2));
        for i in 0..LAYERS {
            for part in ["ffn_gate", "ffn_up", "ffn_down"] {
                t = t.without(&format!("blk.{i}.{part}.weight"));
            }
            t = t.with(f32_tensor(
                format!("blk.{i}.ffn_gate_inp.weight"),
                &[H, 4],
                8,
            ));
            for (part, dims) in [
                ("gate", [H, FF, 4]),
                ("up", [H, FF, 4]),
                ("down", [FF, H, 4]),
            ] {
                t = t.with(f32_tensor(
                    format!("blk.{i}.ffn_{part}_exps.weight"),
                    &dims,
                    9,
                ));
            }
        }
        t
    }

    fn set(mut self, key: &str, value: MetadataValue) -> Tiny {
        match self.meta.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value,
            None => self.meta.push((key.to_string(), value)),
        }
        self
    }

    fn with(mut self, t: T) -> Tiny {
        self.tensors.push(t);
        self
    }

    fn without(mut self, name: &str) -> Tiny {
        let before = self.tensors.len();
        self.tensors.retain(|t| t.name != name);
        assert_eq!(self.tensors.len(), before - 1, "{name}");
        self
    }

    fn edit(mut self, name: &str, f: impl FnOnce(&mut T)) -> Tiny {
        f(self.tensors.iter_mut().find(|t| t.name == name).unwrap());
        self
    }

    /// Changes a tensor's type id only, keeping the bytes written (as a hex editor would).
    fn retype_in_place(self, name: &str, dtype: DType) -> Tiny {
        self.edit(name, |t| t.dtype = dtype)
    }

    fn bytes(&self) -> Vec<u8> {
        let mut w = GgufWriter::new(3);
        for (k, v) in &self.meta {
            w = w.metadata(k.clone(), v.clone());
        }
        for t in &self.tensors {
            w = w.tensor(t.name.clone(), t.dtype, &t.dims, t.bytes.clone());
        }
        w.to_bytes()
    }

    fn load(&self) -> Result<(), ModelError> {
        load_bytes(&self.bytes())
    }

    /// Loads, expecting an error; returns it with its message.
    fn error(&self) -> (ModelError, String) {
        let e = self.load().expect_err("a corrupted model must not load");
        let msg = e.to_string();
        (e, msg)
    }
}

/// Bytes of `n` elements of a quantized type (zeros: valid blocks of value 0).
fn zeros_of(dtype: DType, n: usize) -> Vec<u8> {
    vec![0; dtype.bytes_for(n).unwrap()]
}

#[test]
fn the_tiny_models_load() {
    Tiny::llama().load().unwrap();
    Tiny::qwen2().load().unwrap();
    Tiny::qwen3().load().unwrap();
    // Quantized matrices are fine; so is rope_freqs (a known extra, read by the loader).
    let q = Tiny::llama()
        .edit("blk.0.ffn_up.weight", |t| {
            t.dtype = DType::Q4_0;
            t.bytes = zeros_of(DType::Q4_0, (H * FF) as usize);
        })
        .with(T {
            name: "rope_freqs.weight".into(),
            dtype: DType::F32,
            dims: vec![8],
            bytes: [1.0f32; 8].iter().flat_map(|x| x.to_le_bytes()).collect(),
        });
    q.load().unwrap();
}

#[test]
fn block_count_lowered_or_raised_names_the_key_and_the_layers_present() {
    for declared in [1u32, 3] {
        let (e, msg) = Tiny::llama()
            .set("llama.block_count", U32(declared))
            .error();
        assert!(
            matches!(&e, ModelError::LayerCount { key, declared: d, .. }
                if key == "llama.block_count" && *d == declared as usize),
            "{e:?}"
        );
        assert!(msg.contains("2 layers (blk.0 to blk.1)"), "{msg}");
    }
}

#[test]
fn a_hole_in_the_layer_numbers_is_a_layer_count_error() {
    let mut t = Tiny::llama();
    for x in &mut t.tensors {
        x.name = x.name.replace("blk.1.", "blk.2.");
    }
    let (e, msg) = t.error();
    assert!(matches!(e, ModelError::LayerCount { .. }), "{e:?}");
    assert!(msg.contains("missing: `1`)"), "{msg}");
    // A huge layer index is reported without walking up to it.
    let (e, msg) = Tiny::llama()
        .with(f32_tensor(
            "blk.4000000000.attn_norm.weight".into(),
            &[H],
            1,
        ))
        .error();
    assert!(matches!(e, ModelError::LayerCount { .. }), "{e:?}");
    assert!(
        msg.contains("3 layers numbered with holes (missing: `2`, `3`,")
            && msg.contains("and 3999999988 more"),
        "{msg}"
    );
}

#[test]
fn a_norm_retyped_in_place_leaves_bytes_no_tensor_accounts_for() {
    for dtype in [DType::Q4_0, DType::BF16] {
        let (e, msg) = Tiny::llama()
            .retype_in_place("blk.0.attn_norm.weight", dtype)
            .error();
        assert!(
            matches!(&e, ModelError::Gguf(GgufError::UnaccountedBytes { after, .. })
                if after == "`blk.0.attn_norm.weight`"),
            "{dtype}: {e:?}"
        );
        assert!(msg.contains("belong to no tensor"), "{msg}");
    }
    // The same for a quantized matrix whose type changed to a smaller one.
    let mut t = Tiny::llama().edit("blk.1.ffn_gate.weight", |t| {
        t.dtype = DType::Q4_1;
        t.bytes = zeros_of(DType::Q4_1, (H * FF) as usize);
    });
    t.load().unwrap();
    t = t.retype_in_place("blk.1.ffn_gate.weight", DType::Q4_0);
    assert!(matches!(
        t.error().0,
        ModelError::Gguf(GgufError::UnaccountedBytes { .. })
    ));
    // A last tensor retyped leaves bytes before the end of the file.
    let (_, msg) = Tiny::llama()
        .retype_in_place("output_norm.weight", DType::BF16)
        .error();
    assert!(msg.contains("the end of the file"), "{msg}");
}

#[test]
fn a_norm_of_a_non_f32_type_is_refused_even_when_its_size_fits() {
    for dtype in [DType::Q4_0, DType::BF16, DType::F16] {
        let (e, msg) = Tiny::llama()
            .edit("blk.1.ffn_norm.weight", |t| {
                t.dtype = dtype;
                t.bytes = zeros_of(dtype, H as usize);
            })
            .error();
        assert!(
            matches!(&e, ModelError::BadTensor { name, .. } if name == "blk.1.ffn_norm.weight"),
            "{dtype}: {e:?}"
        );
        assert!(
            msg.contains(&format!("type {dtype}")) && msg.contains("must be F32"),
            "{msg}"
        );
    }
    let (e, _) = Tiny::qwen2()
        .edit("blk.0.attn_k.bias", |t| {
            t.dtype = DType::F16;
            t.bytes = zeros_of(DType::F16, KV_DIM as usize);
        })
        .error();
    assert!(matches!(&e, ModelError::BadTensor { name, .. } if name == "blk.0.attn_k.bias"));
}

#[test]
fn a_missing_tensor_is_named() {
    let (e, _) = Tiny::llama().without("blk.1.ffn_up.weight").error();
    assert!(
        matches!(&e, ModelError::MissingTensor(n) if n == "blk.1.ffn_up.weight"),
        "{e:?}"
    );
    let (e, _) = Tiny::qwen2().without("blk.0.attn_v.bias").error();
    assert!(
        matches!(&e, ModelError::MissingTensor(n) if n == "blk.0.attn_v.bias"),
        "{e:?}"
    );
    let (e, _) = Tiny::qwen3().without("blk.1.attn_k_norm.weight").error();
    assert!(
        matches!(&e, ModelError::MissingTensor(n) if n == "blk.1.attn_k_norm.weight"),
        "{e:?}"
    );
    // A Qwen3 file relabelled llama: its q/k norms are unused, and listed.
    let mut relabelled = Tiny::qwen3();
    for (k, v) in &mut relabelled.meta {
        *k = k.replace("qwen3.", "llama.");
        if k == "general.architecture" {
            *v = Str("llama".into());
        }
    }
    match relabelled.error().0 {
        ModelError::UnusedTensors { names, .. } => {
            assert_eq!(names.len(), 4, "{names:?}");
            assert!(
                names.iter().all(|n| n.contains("_norm.weight")),
                "{names:?}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn extra_tensors_are_listed() {
    let (e, msg) = Tiny::llama()
        .with(f32_tensor("blk.0.attn_q.bias".into(), &[H], 1))
        .with(f32_tensor("mystery.weight".into(), &[4], 1))
        .error();
    match &e {
        ModelError::UnusedTensors { names, .. } => {
            assert_eq!(names, &["blk.0.attn_q.bias", "mystery.weight"]);
        }
        other => panic!("{other:?}"),
    }
    assert!(
        msg.contains("2 tensor(s)") && msg.contains("rope_freqs.weight"),
        "{msg}"
    );
}

#[test]
fn a_shape_mismatch_names_the_tensor_and_both_shapes() {
    let (e, msg) = Tiny::llama()
        .edit("blk.0.ffn_up.weight", |t| {
            t.dims = vec![H, 96];
            t.bytes = f32_bytes(H * 96, 0);
        })
        .error();
    assert!(matches!(&e, ModelError::BadTensor { name, .. } if name == "blk.0.ffn_up.weight"));
    assert!(
        msg.contains("[96, 64]") && msg.contains("[128, 64]"),
        "{msg}"
    );
    // rope_freqs holds one factor per rotated pair: head_dim / 2 = 8.
    let (e, msg) = Tiny::llama()
        .with(f32_tensor("rope_freqs.weight".into(), &[16], 1))
        .error();
    assert!(matches!(&e, ModelError::BadTensor { name, .. } if name == "rope_freqs.weight"));
    assert!(msg.contains("expected [8]"), "{msg}");
}

#[test]
fn head_counts_that_disagree_with_the_shapes_name_the_key() {
    let cases = [
        ("llama.attention.head_count_kv", U32(4), "need 64 rows"),
        ("llama.attention.key_length", U32(8), "need 32 rows"),
        ("llama.embedding_length", U32(32), "has 64 columns"),
        ("llama.vocab_size", U32(33), "has 32 rows"),
        ("llama.attention.value_length", U32(8), "head size is 16"),
        ("llama.rope.dimension_count", U32(8), "head size is 16"),
    ];
    for (key, value, says) in cases {
        let (e, msg) = Tiny::llama().set(key, value).error();
        let named = match &e {
            ModelError::Hyperparameter { key: k, .. } => k.as_str(),
            _ => "",
        };
        // key_length feeds head_dim, which the q check reports under the head count.
        let want = if key.ends_with("key_length") {
            "llama.attention.head_count"
        } else {
            key
        };
        assert_eq!(named, want, "{key}: {e:?}");
        assert!(msg.contains(says), "{key}: {msg}");
    }
    // 8 heads of 16 (the default head_dim would be 64 / 8 = 8, consistent with nothing).
    let (e, msg) = Tiny::llama()
        .set("llama.attention.head_count", U32(8))
        .set("llama.attention.key_length", U32(16))
        .error();
    assert!(matches!(e, ModelError::Hyperparameter { .. }), "{e:?}");
    assert!(msg.contains("(4 heads of 16)"), "{msg}");
}

#[test]
fn an_unknown_architecture_lists_the_supported_ones() {
    let (e, msg) = Tiny::llama()
        .set("general.architecture", Str("gpt2".into()))
        .error();
    assert!(
        matches!(&e, ModelError::UnsupportedArchitecture { name, field, .. }
            if name == "gpt2" && field == "general.architecture"),
        "{e:?}"
    );
    assert!(msg.contains("llama, qwen2, qwen3"), "{msg}");
}

/// The experts' counts, tensors and gating must agree with what the forward pass computes.
#[test]
fn expert_corruptions_name_the_key_or_tensor() {
    Tiny::mixtral().load().expect("the tiny Mixtral loads");
    let (_, msg) = Tiny::mixtral().set("llama.expert_count", U32(8)).error();
    assert!(
        msg.contains("blk.0.ffn_gate_exps.weight") && msg.contains("holds 4 matrices, expected 8"),
        "{msg}"
    );
    let (_, msg) = Tiny::mixtral()
        .set("llama.expert_used_count", U32(5))
        .error();
    assert!(msg.contains("experts used per token (5)"), "{msg}");
    let (e, _) = Tiny::mixtral()
        .without("blk.1.ffn_down_exps.weight")
        .error();
    assert!(
        matches!(&e, ModelError::MissingTensor(n) if n == "blk.1.ffn_down_exps.weight"),
        "{e:?}"
    );
    let (_, msg) = Tiny::mixtral()
        .edit("blk.0.ffn_up_exps.weight", |t| t.dims = vec![H, FF * 4])
        .error();
    assert!(msg.contains("expected 3 dimensions"), "{msg}");
    let (_, msg) = Tiny::mixtral()
        .set("llama.expert_gating_func", U32(2))
        .error();
    assert!(msg.contains("llama.expert_gating_func"), "{msg}");
    Tiny::mixtral()
        .set("llama.expert_gating_func", U32(0))
        .load()
        .expect("0 (unset) gating is softmax");
    // Early Mixtral conversions stored one tensor per expert.
    let legacy = Tiny::mixtral()
        .without("blk.0.ffn_gate_exps.weight")
        .with(f32_tensor("blk.0.ffn_gate.0.weight".into(), &[H, FF], 4));
    let (_, msg) = legacy.error();
    assert!(msg.contains("old Mixtral GGUF layout"), "{msg}");
    // With no experts declared, the file reads as a dense Llama whose MLP is missing.
    let (e, _) = Tiny::mixtral().set("llama.expert_count", U32(0)).error();
    assert!(matches!(e, ModelError::MissingTensor(_)), "{e:?}");
}

/// Byte range of the tensor-info table: from the first info (the embedding's name) to the
/// end of the last (name, dim count, dims, type, offset each).
fn tensor_table(t: &Tiny, bytes: &[u8]) -> std::ops::Range<usize> {
    let first = &t.tensors[0].name;
    let mut needle = (first.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(first.as_bytes());
    let start = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap();
    let len: usize = t
        .tensors
        .iter()
        .map(|x| 8 + x.name.len() + 4 + 8 * x.dims.len() + 4 + 8)
        .sum();
    start..start + len
}

/// Loads raw file bytes (through a temporary file of its own: tests run in parallel).
fn load_bytes(bytes: &[u8]) -> Result<(), ModelError> {
    static N: AtomicUsize = AtomicUsize::new(0);
    let path = std::env::temp_dir().join(format!(
        "tandem-strict-{}-{}.gguf",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&path, bytes).unwrap();
    let result = load_gguf_model(&path).map(|_| ());
    std::fs::remove_file(&path).unwrap();
    result
}

/// Every byte of the tensor table (names, dimension counts, dimensions, types, offsets)
/// flipped, every truncation, and every byte of the values that fix the shapes flipped: none
/// loads. (A flip in the tensor data, or in a value no tensor pins such as the RMS epsilon,
/// cannot be detected without a checksum, which GGUF does not have.)
#[test]
fn flips_and_truncations_of_the_structure_never_load() {
    let t = Tiny::llama();
    let bytes = t.bytes();
    let table = tensor_table(&t, &bytes);
    for i in table.clone() {
        for mask in [0x01u8, 0x80, 0xff] {
            let mut b = bytes.clone();
            b[i] ^= mask;
            assert!(
                load_bytes(&b).is_err(),
                "byte {i} ^ {mask:#x} of the table loads"
            );
        }
    }
    for key in [
        "llama.block_count",
        "llama.embedding_length",
        "llama.feed_forward_length",
        "llama.attention.head_count",
        "llama.attention.head_count_kv",
    ] {
        let mut needle = (key.len() as u64).to_le_bytes().to_vec();
        needle.extend_from_slice(key.as_bytes());
        let at = bytes
            .windows(needle.len())
            .position(|w| w == needle)
            .unwrap()
            + needle.len();
        // The u32 type id, then the 4 value bytes.
        for i in at + 4..at + 8 {
            for mask in [0x01u8, 0x02, 0x80, 0xff] {
                let mut b = bytes.clone();
                b[i] ^= mask;
                assert!(load_bytes(&b).is_err(), "{key} byte {i} ^ {mask:#x} loads");
            }
        }
    }
    for len in (0..bytes.len())
        .step_by(61)
        .chain(bytes.len() - 40..bytes.len())
    {
        assert!(
            load_bytes(&bytes[..len]).is_err(),
            "truncated to {len} loads"
        );
    }
    load_bytes(&bytes).unwrap();
}

#[test]
fn an_unsupported_tensor_type_lists_the_supported_ones() {
    let bytes = GgufWriter::new(3)
        .metadata("general.architecture", Str("llama".into()))
        .raw_tensor("blk.0.attn_q.weight", 16, &[256, 2], 0)
        .to_bytes();
    let msg = load_bytes(&bytes).unwrap_err().to_string();
    assert!(
        msg.contains("blk.0.attn_q.weight") && msg.contains("IQ2_XXS (ggml type id 16)"),
        "{msg}"
    );
    assert!(
        msg.contains(
            "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, \
             IQ4_NL, IQ4_XS"
        ),
        "{msg}"
    );
}
