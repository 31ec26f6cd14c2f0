//! On a machine without the NVIDIA driver, `probe` and `CudaRunner::new` return an error
//! naming the library, never panic. (On a machine with a GPU, `probe` must succeed.)

use tandem_cuda::{probe, CudaError};

#[test]
fn probe_reports_the_missing_driver_or_lists_devices() {
    match probe() {
        Ok(info) => assert!(info.driver_version.0 >= 11, "{info:?}"),
        Err(CudaError::LibraryNotFound {
            library, searched, ..
        }) => {
            assert!(library.contains("libcuda"), "{library}");
            assert!(searched.contains("libcuda.so"), "{searched}");
        }
        Err(other) => panic!("unexpected error: {other}"),
    }
}

#[test]
fn probe_error_message_names_the_library() {
    if let Err(e) = probe() {
        let msg = e.to_string();
        assert!(msg.contains("libcuda"), "{msg}");
    }
}

/// Writes a one-layer Llama with f32 weights (config.json and model.safetensors) to `dir`.
fn write_tiny_model(dir: &std::path::Path) {
    let (v, h, ff, q, kv) = (64usize, 64usize, 128usize, 64usize, 32usize);
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
        "intermediate_size": ff, "vocab_size": v, "tie_word_embeddings": true,
        "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 256,
        "torch_dtype": "float32"
    });
    std::fs::write(dir.join("config.json"), config.to_string()).expect("write config");
    let l = "model.layers.0";
    let tensors: Vec<(String, Vec<usize>)> = vec![
        ("model.embed_tokens.weight".into(), vec![v, h]),
        ("model.norm.weight".into(), vec![h]),
        (format!("{l}.input_layernorm.weight"), vec![h]),
        (format!("{l}.post_attention_layernorm.weight"), vec![h]),
        (format!("{l}.self_attn.q_proj.weight"), vec![q, h]),
        (format!("{l}.self_attn.k_proj.weight"), vec![kv, h]),
        (format!("{l}.self_attn.v_proj.weight"), vec![kv, h]),
        (format!("{l}.self_attn.o_proj.weight"), vec![h, q]),
        (format!("{l}.mlp.gate_proj.weight"), vec![ff, h]),
        (format!("{l}.mlp.up_proj.weight"), vec![ff, h]),
        (format!("{l}.mlp.down_proj.weight"), vec![h, ff]),
    ];
    let (mut header, mut data) = (serde_json::Map::new(), Vec::new());
    for (name, shape) in tensors {
        let n: usize = shape.iter().product();
        let start = data.len();
        for i in 0..n {
            data.extend_from_slice(&((i % 7) as f32 * 0.01).to_le_bytes());
        }
        let entry = serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [start, data.len()]});
        header.insert(name, entry);
    }
    let mut head = serde_json::Value::Object(header).to_string().into_bytes();
    head.resize(head.len().next_multiple_of(8), b' ');
    let mut file = (head.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&head);
    file.extend_from_slice(&data);
    std::fs::write(dir.join("model.safetensors"), file).expect("write weights");
}

#[test]
fn runner_without_a_driver_is_an_error_not_a_panic() {
    use tandem_model::model_builder::{build_host_model, NameScheme};
    let dir = std::env::temp_dir().join(format!("tandem-cuda-tiny-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    write_tiny_model(&dir);
    let info = tandem_model::hf_config::load_hf_config(&dir).expect("config");
    let tensors = tandem_model::safetensors::load_safetensors_dir(&dir).expect("weights");
    let host = build_host_model(info.config, tensors, NameScheme::HuggingFace, None).expect("host");
    let options = tandem_cuda::CudaOptions::new(dir.join("kernels"));
    let result = tandem_cuda::CudaRunner::new(&host, options);
    let _ = std::fs::remove_dir_all(&dir);
    if probe().is_err() {
        let err = result.expect_err("no driver, no runner");
        assert!(err.to_string().contains("libcuda"), "{err}");
    }
}
