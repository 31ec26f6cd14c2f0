//! `config.json` parsing against the fixtures made by scripts/make_hf_fixtures.py (whose
//! parameters are restated here as the expected values) and against hand-written configs in
//! the transformers 4.x and 5.x layouts.

// Test helpers outside #[test] functions unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use tandem_model::config::{Llama3RopeScaling, RopeConfig, RopeStyle};
use tandem_model::hf_config::{load_hf_config, parse_hf_config, HfModelInfo};
use tandem_model::{Architecture, ModelConfig, ModelError};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(name)
}

fn load(name: &str) -> HfModelInfo {
    load_hf_config(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn rope(theta: f32) -> RopeConfig {
    RopeConfig {
        theta,
        style: RopeStyle::Neox,
        llama3_scaling: None,
    }
}

/// llama_tied as the fixture script builds it.
fn llama_tied() -> ModelConfig {
    ModelConfig {
        architecture: Architecture::Llama,
        vocab_size: 320,
        hidden_size: 64,
        intermediate_size: 128,
        num_layers: 2,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 16,
        rms_norm_eps: 1e-5,
        rope: rope(10000.0),
        context_len: 256,
        tie_word_embeddings: true,
        qkv_bias: false,
        qk_norm: false,
        features: Default::default(),
    }
}

#[test]
fn llama_tied_and_its_copies() {
    for (name, dtype) in [
        ("llama_tied", "float32"),
        ("llama_sharded", "float32"),
        ("llama_tied_bf16", "bfloat16"),
        ("llama_tied_f16", "float16"),
    ] {
        let info = load(name);
        assert_eq!(info.config, llama_tied(), "{name}");
        assert_eq!(info.config.q_dim(), 64);
        assert_eq!(info.config.kv_dim(), 32, "GQA: 2 kv heads of 16");
        assert_eq!(info.eos_token_ids, vec![2], "{name}");
        assert_eq!(info.bos_token_id, Some(1), "{name}");
        assert_eq!(info.torch_dtype.as_deref(), Some(dtype), "{name}");
    }
}

#[test]
fn llama_untied_is_mha() {
    let want = ModelConfig {
        num_kv_heads: 4,
        rms_norm_eps: 1e-6,
        tie_word_embeddings: false,
        ..llama_tied()
    };
    assert_eq!(load("llama_untied").config, want);
}

#[test]
fn llama3_rope_scaling() {
    let scaling = Llama3RopeScaling {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 64,
    };
    let want = ModelConfig {
        rope: RopeConfig {
            theta: 500000.0,
            style: RopeStyle::Neox,
            llama3_scaling: Some(scaling),
        },
        ..llama_tied()
    };
    let got = load("llama3_rope").config;
    assert_eq!(got, want);
    // The fixture was chosen so that the scaling keeps pair 0, smooths pair 1 and divides
    // pairs 2..8 by the factor; check that it really changes frequencies.
    let scaled = got.rope.inv_freqs(16);
    let plain = rope(500000.0).inv_freqs(16);
    assert_eq!(scaled[0], plain[0]);
    assert!(scaled[1] < plain[1] && scaled[1] > plain[1] / 8.0);
    for i in 2..8 {
        assert!(
            (scaled[i] - plain[i] / 8.0).abs() <= plain[i] * 1e-6,
            "pair {i}"
        );
    }
}

#[test]
fn mistral_reads_as_llama() {
    let want = ModelConfig {
        rope: rope(1.0e6),
        context_len: 512,
        tie_word_embeddings: false,
        ..llama_tied()
    };
    let info = load("mistral");
    assert_eq!(info.config, want);
    assert_eq!(info.eos_token_ids, vec![2]);
}

#[test]
fn qwen2_has_qkv_bias_and_generation_eos_list() {
    let want = ModelConfig {
        architecture: Architecture::Qwen2,
        rms_norm_eps: 1e-6,
        rope: rope(1.0e6),
        context_len: 1024,
        qkv_bias: true,
        ..llama_tied()
    };
    let info = load("qwen2");
    assert_eq!(info.config, want);
    // config.json says 0; generation_config.json's list wins, in its order.
    assert_eq!(info.eos_token_ids, vec![2, 0]);
    assert_eq!(info.bos_token_id, None);
}

#[test]
fn qwen3_has_qk_norm_and_wide_heads() {
    let want = ModelConfig {
        architecture: Architecture::Qwen3,
        head_dim: 32,
        rms_norm_eps: 1e-6,
        rope: rope(1.0e6),
        context_len: 1024,
        qk_norm: true,
        features: Default::default(),
        ..llama_tied()
    };
    let got = load("qwen3").config;
    assert_eq!(got, want);
    assert_eq!(got.q_dim(), 128, "q is wider than hidden_size");
    assert_eq!(got.kv_dim(), 64);
}

/// The same Llama 3 model written by transformers 4.x (`rope_theta` + `rope_scaling`,
/// `torch_dtype`) and 5.x (`rope_parameters`, `dtype`).
const LLAMA3_V4: &str = r#"{
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
  "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
  "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "tie_word_embeddings": true,
  "rope_theta": 500000.0,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "bos_token_id": 128000, "eos_token_id": 128001, "torch_dtype": "bfloat16",
  "attention_bias": false, "mlp_bias": false, "hidden_act": "silu",
  "transformers_version": "4.45.0.dev0"
}"#;

const LLAMA3_V5: &str = r#"{
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
  "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
  "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "tie_word_embeddings": true,
  "rope_parameters": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                      "original_max_position_embeddings": 8192, "rope_theta": 500000.0,
                      "rope_type": "llama3"},
  "bos_token_id": 128000, "eos_token_id": 128001, "dtype": "bfloat16",
  "attention_bias": false, "mlp_bias": false, "hidden_act": "silu", "pad_token_id": null,
  "transformers_version": "5.24.0"
}"#;

#[test]
fn transformers_4_and_5_layouts_agree() {
    let v4 = parse_hf_config(LLAMA3_V4, None).unwrap();
    let v5 = parse_hf_config(LLAMA3_V5, None).unwrap();
    assert_eq!(v4, v5);
    let c = &v4.config;
    assert_eq!((c.head_dim, c.num_kv_heads, c.context_len), (64, 8, 131072));
    assert_eq!(c.rope.theta, 500000.0);
    assert_eq!(
        c.rope.llama3_scaling,
        Some(Llama3RopeScaling {
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        })
    );
    assert_eq!(v4.torch_dtype.as_deref(), Some("bfloat16"));
    assert_eq!(
        (v4.bos_token_id, v4.eos_token_ids),
        (Some(128000), vec![128001])
    );
}

#[test]
fn old_scaling_spelling_and_default_rope() {
    // 4.x files from before the rename say `type`; rope_theta defaults to 10000.
    let old = LLAMA3_V4.replace(r#""rope_type": "llama3""#, r#""type": "llama3""#);
    assert_eq!(
        parse_hf_config(&old, None).unwrap(),
        parse_hf_config(LLAMA3_V4, None).unwrap()
    );
    let plain_v4 = r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "vocab_size": 320, "max_position_embeddings": 256, "rope_scaling": null}"#;
    let plain_v5 = r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "vocab_size": 320, "max_position_embeddings": 256,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}"#;
    let a = parse_hf_config(plain_v4, None).unwrap().config;
    assert_eq!(a, parse_hf_config(plain_v5, None).unwrap().config);
    // Defaults: kv heads = heads, head_dim = hidden / heads, untied, eps 1e-6.
    assert_eq!((a.num_kv_heads, a.head_dim), (4, 16));
    assert!(!a.tie_word_embeddings);
    assert_eq!(a.rms_norm_eps, 1e-6);
    assert_eq!(a.rope, rope(10000.0));
}

const QWEN3_MIN: &str = r#"{"architectures": ["Qwen3ForCausalLM"], "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 320, "max_position_embeddings": 1024,
    "eos_token_id": 5}"#;

#[test]
fn qwen3_head_dim_defaults_to_128_as_in_transformers() {
    let c = parse_hf_config(QWEN3_MIN, None).unwrap().config;
    assert_eq!(c.head_dim, 128);
    assert!(c.qk_norm && !c.qkv_bias);
}

#[test]
fn eos_falls_back_to_config_and_accepts_lists() {
    let info = parse_hf_config(QWEN3_MIN, None).unwrap();
    assert_eq!(info.eos_token_ids, vec![5]);
    let info = parse_hf_config(QWEN3_MIN, Some(r#"{"eos_token_id": null}"#)).unwrap();
    assert_eq!(
        info.eos_token_ids,
        vec![5],
        "null in generation_config is absent"
    );
    let info = parse_hf_config(QWEN3_MIN, Some(r#"{"eos_token_id": [7, 5, 9]}"#)).unwrap();
    assert_eq!(info.eos_token_ids, vec![7, 5, 9]);
    let info = parse_hf_config(
        QWEN3_MIN,
        Some(r#"{"eos_token_id": 11, "bos_token_id": 3}"#),
    );
    let info = info.unwrap();
    assert_eq!((info.eos_token_ids, info.bos_token_id), (vec![11], Some(3)));
    let none = QWEN3_MIN.replace(r#""eos_token_id": 5"#, r#""eos_token_id": null"#);
    assert!(parse_hf_config(&none, None)
        .unwrap()
        .eos_token_ids
        .is_empty());
}

/// Mistral's window is honoured by the attention (every layer slides, the context stays
/// the trained one); Qwen's, which tandem does not implement, caps the context instead.
#[test]
fn sliding_window_caps_context_only_when_active() {
    let mistral = r#"{"architectures": ["MistralForCausalLM"], "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "vocab_size": 320, "max_position_embeddings": 32768, "sliding_window": 4096}"#;
    let c = parse_hf_config(mistral, None).unwrap().config;
    assert_eq!(c.context_len, 32768);
    assert_eq!(
        (c.features.window(0), c.features.window(1)),
        (Some(4096), Some(4096))
    );
    let qwen_off = QWEN3_MIN.replace("\"eos_token_id\": 5", "\"sliding_window\": 256");
    assert_eq!(
        parse_hf_config(&qwen_off, None).unwrap().config.context_len,
        1024
    );
    let qwen_on = qwen_off.replace(
        "\"sliding_window\"",
        "\"use_sliding_window\": true, \"sliding_window\"",
    );
    assert_eq!(
        parse_hf_config(&qwen_on, None).unwrap().config.context_len,
        256
    );
}

fn config_error(json: &str) -> String {
    match parse_hf_config(json, None) {
        Err(ModelError::Config(msg)) => msg,
        other => panic!("expected a config error, got {other:?}"),
    }
}

#[test]
fn unsupported_architectures_are_typed() {
    let gpt2 = QWEN3_MIN.replace("Qwen3ForCausalLM", "GPT2LMHeadModel");
    match parse_hf_config(&gpt2, None) {
        Err(ModelError::UnsupportedArchitecture { name, .. }) => {
            assert_eq!(name, "GPT2LMHeadModel")
        }
        other => panic!("{other:?}"),
    }
    let by_type = QWEN3_MIN.replace(
        r#""architectures": ["Qwen3ForCausalLM"]"#,
        r#""model_type": "gemma""#,
    );
    assert!(matches!(
        parse_hf_config(&by_type, None),
        Err(ModelError::UnsupportedArchitecture { name, .. }) if name == "gemma"
    ));
    let none = QWEN3_MIN.replace(r#""architectures": ["Qwen3ForCausalLM"],"#, "");
    assert!(config_error(&none).contains("architectures"));
}

#[test]
fn errors_name_the_field() {
    let cases = [
        (QWEN3_MIN.replace("\"hidden_size\": 64,", ""), "hidden_size"),
        (
            QWEN3_MIN.replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": -2"),
            "num_hidden_layers",
        ),
        (
            QWEN3_MIN.replace("\"vocab_size\": 320", "\"vocab_size\": \"big\""),
            "vocab_size",
        ),
        (
            QWEN3_MIN.replace("\"eos_token_id\": 5", "\"eos_token_id\": 320"),
            "eos_token_id",
        ),
        (
            LLAMA3_V5.replace("\"factor\": 32.0, ", ""),
            "rope_parameters.factor",
        ),
        (
            LLAMA3_V4.replace("\"llama3\"", "\"yarn\""),
            "rope_scaling.rope_type",
        ),
        (
            LLAMA3_V5.replace("\"llama3\"", "\"linear\""),
            "rope_parameters.rope_type",
        ),
        (
            LLAMA3_V5.replace("\"high_freq_factor\": 4.0", "\"high_freq_factor\": 1.0"),
            "high_freq_factor",
        ),
        (
            LLAMA3_V4.replace("\"attention_bias\": false", "\"attention_bias\": true"),
            "attention_bias",
        ),
        (
            LLAMA3_V4.replace("\"mlp_bias\": false", "\"mlp_bias\": true"),
            "mlp_bias",
        ),
        (LLAMA3_V4.replace("\"silu\"", "\"gelu\""), "hidden_act"),
        (
            LLAMA3_V4.replace("\"rope_theta\": 500000.0", "\"rope_theta\": \"x\""),
            "rope_theta",
        ),
    ];
    for (json, field) in cases {
        let msg = config_error(&json);
        assert!(msg.contains(field), "`{msg}` does not name `{field}`");
    }
}

#[test]
fn validation_and_malformed_json_are_config_errors() {
    assert!(config_error("{not json").contains("config.json"));
    assert!(config_error("[1, 2]").contains("not a JSON object"));
    let odd_kv = QWEN3_MIN.replace("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3");
    assert!(config_error(&odd_kv).contains("num_kv_heads"));
    // Qwen2 ignores attention_bias (its q/k/v always have a bias, o_proj never).
    let qwen2 = QWEN3_MIN
        .replace("Qwen3", "Qwen2")
        .replace("\"eos_token_id\": 5", "\"attention_bias\": true");
    assert!(parse_hf_config(&qwen2, None).unwrap().config.qkv_bias);
    let bad_gen = parse_hf_config(QWEN3_MIN, Some("{\"eos_token_id\": [1, \"x\"]}"));
    assert!(matches!(bad_gen, Err(ModelError::Config(m)) if m.contains("generation_config.json")));
}

#[test]
fn a_directory_without_config_is_not_a_model() {
    let dir = fixture("no_such_model");
    assert!(matches!(
        load_hf_config(&dir),
        Err(ModelError::NotAModel(_))
    ));
}

/// Expected values checked against transformers 5.24's `AutoConfig` on the same JSON.
#[test]
fn rope_precedence_follows_transformers() {
    let base = r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "vocab_size": 320, "max_position_embeddings": 256"#;
    let parse =
        |extra: &str| parse_hf_config(&format!("{base}{extra}}}"), None).map(|i| i.config.rope);
    // A non-empty rope_scaling wins over rope_parameters; its theta comes from the top level
    // and original_max_position_embeddings defaults to max_position_embeddings.
    let both = r#", "rope_theta": 1234.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0},
        "rope_parameters": {"rope_type": "default", "rope_theta": 99.0}"#;
    let want = RopeConfig {
        llama3_scaling: Some(Llama3RopeScaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 256,
        }),
        ..rope(1234.0)
    };
    assert_eq!(parse(both).unwrap(), want);
    assert_eq!(parse(r#", "rope_theta": 1234.0"#).unwrap(), rope(1234.0));
    assert_eq!(parse("").unwrap(), rope(10000.0));
    // rope_parameters' own theta wins over the top-level one.
    let v5 = r#", "rope_theta": 1234.0, "rope_parameters": {"rope_type": "default", "rope_theta": 99.0}"#;
    assert_eq!(parse(v5).unwrap(), rope(99.0));
    let nested =
        r#", "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 99.0}}"#;
    assert!(
        matches!(parse(nested), Err(ModelError::Config(m)) if m.contains("rope_parameters.full_attention"))
    );
}

/// The `config.json` corruptions of issue 21, which used to load as Qwen2: each is refused
/// with a typed error naming the field and, for unknown names, the supported ones.
#[test]
fn bad_model_type_and_architectures_are_refused() {
    let qwen2 = QWEN3_MIN.replace("Qwen3", "Qwen2");
    let with = |extra: &str| qwen2.replacen('{', &format!("{{{extra}, "), 1);
    for bad in ["gpt2", "qwen9"] {
        match parse_hf_config(&with(&format!(r#""model_type": "{bad}""#)), None) {
            Err(e @ ModelError::UnsupportedArchitecture { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains(bad) && msg.contains("model_type"), "{msg}");
                assert!(msg.contains("llama, mistral, qwen2, qwen3"), "{msg}");
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
    let msg = config_error(&with(r#""model_type": 5"#));
    assert!(
        msg.contains("model_type") && msg.contains("must be a string"),
        "{msg}"
    );
    let msg = config_error(&with(r#""model_type": "llama""#));
    assert!(
        msg.contains("disagrees") && msg.contains("Qwen2ForCausalLM"),
        "{msg}"
    );
    // Agreeing names load; so does model_type alone.
    let ok = parse_hf_config(&with(r#""model_type": "qwen2""#), None).unwrap();
    assert_eq!(ok.config.architecture, Architecture::Qwen2);

    let empty = qwen2.replace(r#"["Qwen2ForCausalLM"]"#, "[]");
    let msg = config_error(&empty);
    assert!(
        msg.contains("architectures") && msg.contains("empty"),
        "{msg}"
    );
    assert!(
        msg.contains("Qwen2ForCausalLM"),
        "lists the supported classes: {msg}"
    );
    let msg = config_error(&qwen2.replace(r#"["Qwen2ForCausalLM"]"#, "[5]"));
    assert!(msg.contains("architectures"), "{msg}");
    let two = qwen2.replace(r#"["Qwen2ForCausalLM"]"#, r#"["Qwen2ForCausalLM", "X"]"#);
    assert!(config_error(&two).contains("exactly one"));
    match parse_hf_config(
        &qwen2.replace(r#"["Qwen2ForCausalLM"]"#, r#"["Qwen9"]"#),
        None,
    ) {
        Err(ModelError::UnsupportedArchitecture {
            name,
            field,
            supported,
        }) => {
            assert_eq!((name.as_str(), field.as_str()), ("Qwen9", "architectures"));
            assert!(supported.contains("LlamaForCausalLM"));
        }
        other => panic!("{other:?}"),
    }
}

/// `torch_dtype` (or 5.x `dtype`) must name a type safetensors checkpoints tandem reads hold.
#[test]
fn unsupported_torch_dtypes_are_refused_with_the_supported_list() {
    let qwen2 = QWEN3_MIN.replace("Qwen3", "Qwen2");
    let with = |extra: &str| qwen2.replacen('{', &format!("{{{extra}, "), 1);
    for (field, value) in [
        ("torch_dtype", "float8"),
        ("dtype", "int4"),
        ("torch_dtype", "auto"),
    ] {
        match parse_hf_config(&with(&format!(r#""{field}": "{value}""#)), None) {
            Err(e @ ModelError::UnsupportedDtype { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains(value) && msg.contains(field), "{msg}");
                assert!(msg.contains("float32, float16, bfloat16"), "{msg}");
            }
            other => panic!("{value}: {other:?}"),
        }
    }
    let msg = config_error(&with(r#""torch_dtype": 16"#));
    assert!(msg.contains("torch_dtype"), "{msg}");
    for ok in ["float32", "float16", "bfloat16"] {
        let info = parse_hf_config(&with(&format!(r#""torch_dtype": "{ok}""#)), None).unwrap();
        assert_eq!(info.torch_dtype.as_deref(), Some(ok));
    }
}

/// The Gemma 3 fixture's config: every Gemma feature read as transformers defines it.
#[test]
fn gemma3_config_reads_every_feature() {
    let c = load("gemma3").config;
    assert_eq!(c.architecture, tandem_model::config::Architecture::Gemma3);
    assert!(c.qk_norm && !c.qkv_bias && c.tie_word_embeddings);
    let f = &c.features;
    assert_eq!(f.embedding_scale, Some(8.0)); // sqrt(64)
    assert_eq!(f.attention_scale, Some(0.25)); // query_pre_attn_scalar 16
    assert_eq!(f.final_logit_softcap, Some(5.0));
    assert_eq!(f.rope_linear_factor, Some(4.0));
    assert_eq!(c.rope.theta, 1e6);
    assert_eq!(f.local_rope.map(|r| r.theta), Some(1e4));
    let windows: Vec<_> = (0..3).map(|l| f.window(l)).collect();
    assert_eq!(windows, [Some(8), None, Some(8)]);
}

/// Gemma 3's 4.x fields (`rope_local_base_freq`, `sliding_window_pattern`, `rope_scaling`)
/// and its defaults; what tandem does not compute is refused by name.
#[test]
fn gemma3_legacy_fields_defaults_and_refusals() {
    let base = r#"{"architectures": ["Gemma3ForCausalLM"], "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 7, "num_attention_heads": 4,
        "vocab_size": 320, "rope_theta": 500000.0, "rope_local_base_freq": 20000.0,
        "sliding_window": 16, "sliding_window_pattern": 3,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0}}"#;
    let c = parse_hf_config(base, None).unwrap().config;
    let slides: Vec<bool> = (0..7).map(|l| c.features.window(l).is_some()).collect();
    assert_eq!(slides, [true, true, false, true, true, false, true]);
    assert_eq!(c.rope.theta, 500000.0);
    assert_eq!(c.features.local_rope.map(|r| r.theta), Some(20000.0));
    assert_eq!(c.features.rope_linear_factor, Some(8.0));
    assert_eq!((c.head_dim, c.context_len), (256, 131072));
    assert_eq!(c.features.attention_scale, Some(1.0 / 16.0)); // 256^-0.5
    let scalar = base.replacen('{', r#"{"query_pre_attn_scalar": 64, "#, 1);
    let c = parse_hf_config(&scalar, None).unwrap().config;
    assert_eq!(c.features.attention_scale, Some(0.125)); // not head_dim's 1/16
    for (extra, field) in [
        (
            r#""attn_logit_softcapping": 50.0"#,
            "attn_logit_softcapping",
        ),
        (r#""hidden_activation": "gelu""#, "hidden_activation"),
        (
            r#""use_bidirectional_attention": true"#,
            "use_bidirectional_attention",
        ),
    ] {
        let json = base.replacen('{', &format!("{{{extra}, "), 1);
        assert!(config_error(&json).contains(field), "{field}");
    }
}

/// Phi-3: its window on every layer; its long-context RoPE (`longrope`) is refused by name.
#[test]
fn phi3_window_and_refused_longrope() {
    let c = load("phi3").config;
    assert_eq!(c.architecture, tandem_model::config::Architecture::Phi3);
    assert_eq!(
        (c.features.window(0), c.features.window(1)),
        (Some(8), Some(8))
    );
    let text = std::fs::read_to_string(fixture("phi3").join("config.json")).unwrap();
    let long = text.replace(
        r#""rope_type": "default""#,
        r#""rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0]"#,
    );
    assert!(
        config_error(&long).contains("longrope"),
        "{}",
        config_error(&long)
    );
}
