//! GGUF files of the Gemma 3 and Phi-3 HF fixtures written by llama.cpp's own converter
//! (`scripts/make_gguf_arch_fixtures.py`: Gemma's norms as 1 + w, its local RoPE base and
//! linear scaling, the layer pattern; Phi-3's fused `attn_qkv` and `ffn_up`), loaded by
//! tandem's GGUF path: the logits must match transformers fp32 on the same weights (the HF
//! fixtures' references) within 1e-3, as the HF path does.

use std::path::{Path, PathBuf};

use tandem_kernels::Isa;
use tandem_model::batch::{BlockId, ForwardBatch, OutputSelection, TokenId};
use tandem_model::kv_store::{KvDtype, KvStore};
use tandem_model::loader::load_gguf_model;
use tandem_model::transformer::Model;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// (input ids, reference logits) of the HF fixture `name`.
fn sequences(name: &str) -> Vec<(Vec<TokenId>, Vec<f32>)> {
    let dir = fixtures().join("hf").join(name);
    let text = std::fs::read_to_string(dir.join("reference.json")).expect("reference.json");
    let r: serde_json::Value = serde_json::from_str(&text).expect("json");
    let seqs = r["sequences"].as_array().expect("sequences");
    seqs.iter()
        .map(|s| {
            let ids = s["input_ids"].as_array().expect("ids");
            let ids = ids.iter().map(|v| TokenId(v.as_u64().expect("id") as u32));
            let file = s["logits_file"].as_str().expect("file");
            let bytes = std::fs::read(dir.join(file)).expect("logits");
            let logits = bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            (ids.collect(), logits)
        })
        .collect()
}

#[test]
fn llama_cpp_conversions_match_transformers() {
    for name in ["gemma3", "phi3"] {
        let path = fixtures().join("gguf_arch").join(format!("{name}.gguf"));
        let host = load_gguf_model(&path).expect("load").0;
        let mut model = Model::with_kernels(host, 2, Isa::best_exact());
        for (i, (ids, want)) in sequences(name).iter().enumerate() {
            let blocks = ids.len().div_ceil(16);
            let mut kv = KvStore::with_dtype(&model.config, 16, blocks, KvDtype::F32).expect("kv");
            let table = (0..blocks as u32).map(BlockId).collect();
            let batch = ForwardBatch::single(ids.clone(), 0, table, OutputSelection::All);
            let got = model.forward(&batch, &mut kv).expect("forward");
            let diff = got
                .as_slice()
                .iter()
                .zip(want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            eprintln!("{name}.gguf seq {i}: max |Δlogit| = {diff:.2e}");
            assert!(diff <= 1e-3, "{name}.gguf seq {i}: max |Δlogit| = {diff}");
        }
    }
}
