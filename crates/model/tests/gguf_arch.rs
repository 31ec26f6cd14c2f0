//! GGUF files of the Gemma 3, Phi-3, Qwen3-MoE and Mixtral HF fixtures written by llama.cpp's
//! own converter (`scripts/make_gguf_arch_fixtures.py`: Gemma's norms as 1 + w, its local
//! RoPE base and linear scaling, the layer pattern; Phi-3's fused `attn_qkv` and `ffn_up`;
//! the experts merged into 3-D tensors), loaded by tandem's GGUF path: the logits must match
//! transformers fp32 on the same weights (the HF fixtures' references) within 1e-3, as the HF
//! path does. Mixtral in the converter's Q8_0 checks the int8 kernels through the experts.

use std::path::{Path, PathBuf};

use tandem_kernels::Isa;
use tandem_model::batch::{BlockId, ForwardBatch, OutputSelection, SeqSpan, TokenId};
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
    for name in ["gemma3", "phi3", "qwen3_moe_norm", "mixtral"] {
        let mut model = load(&format!("{name}.gguf"), Isa::best_exact());
        for (i, (ids, want)) in sequences(name).iter().enumerate() {
            let got = logits(&mut model, ids);
            let diff = max_abs_diff(&got, want);
            eprintln!("{name}.gguf seq {i}: max |Δlogit| = {diff:.2e}");
            assert!(diff <= 1e-3, "{name}.gguf seq {i}: max |Δlogit| = {diff}");
        }
    }
}

/// Mixtral in Q8_0: the int8 kernels (activations rounded to 8 bits) stay about as close to
/// the fp32 reference of the unquantized weights as the exact product of the same Q8_0
/// weights, whose distance is the weights' own rounding.
#[test]
fn mixtral_q8_0_through_the_int8_kernels_stays_close() {
    let Some(int8) = [Isa::Avx512Int8, Isa::Avx2Int8]
        .into_iter()
        .find(|i| i.is_available())
    else {
        panic!("this test needs an x86-64 CPU with AVX2");
    };
    let mut exact = load("mixtral_q8_0.gguf", Isa::best_exact());
    let mut quant = load("mixtral_q8_0.gguf", int8);
    let (mut d_exact, mut d_int8, mut count) = (0.0f64, 0.0f64, 0usize);
    for (ids, want) in sequences("mixtral") {
        let (a, b) = (logits(&mut exact, &ids), logits(&mut quant, &ids));
        d_exact += a
            .iter()
            .zip(&want)
            .map(|(x, y)| (x - y).abs() as f64)
            .sum::<f64>();
        d_int8 += b
            .iter()
            .zip(&want)
            .map(|(x, y)| (x - y).abs() as f64)
            .sum::<f64>();
        count += want.len();
    }
    let (d_exact, d_int8) = (d_exact / count as f64, d_int8 / count as f64);
    eprintln!("mixtral Q8_0 mean |Δlogit| vs fp32: exact {d_exact:.2e}, {int8} {d_int8:.2e}");
    assert!(d_exact > 0.0 && d_exact < 0.25, "Q8_0 weights: {d_exact}");
    assert!(
        d_int8 <= 2.0 * d_exact,
        "{int8}: {d_int8} vs exact {d_exact}"
    );
}

/// Through the int8 kernels too, a token's logits do not depend on the batch it is in, though
/// its neighbours share some of its experts.
#[test]
fn mixtral_q8_0_batch_neighbours_change_nothing() {
    let isa = Isa::best();
    let mut model = load("mixtral_q8_0.gguf", isa);
    let seqs: Vec<Vec<TokenId>> = sequences("mixtral").into_iter().map(|s| s.0).collect();
    let alone: Vec<f32> = seqs
        .iter()
        .flat_map(|ids| logits(&mut model, ids))
        .collect();
    let (a, b) = (&seqs[0], &seqs[1]);
    let (na, nb) = (a.len().div_ceil(16), b.len().div_ceil(16));
    let mut kv = KvStore::with_dtype(&model.config, 16, na + nb, KvDtype::F32).expect("kv");
    let span = |start, len, blocks: std::ops::Range<usize>| SeqSpan {
        start,
        len,
        num_cached: 0,
        block_table: blocks.map(|i| BlockId(i as u32)).collect(),
        adapter: None,
    };
    let batch = ForwardBatch {
        tokens: a.iter().chain(b).copied().collect(),
        seqs: vec![span(0, a.len(), 0..na), span(a.len(), b.len(), na..na + nb)],
        output: OutputSelection::All,
    };
    let both = model.forward(&batch, &mut kv).expect("forward");
    assert!(
        both.as_slice() == &alone[..],
        "{isa}: a batch changed a sequence"
    );
}

fn load(file: &str, isa: Isa) -> Model {
    let path = fixtures().join("gguf_arch").join(file);
    Model::with_kernels(load_gguf_model(&path).expect("load").0, 2, isa)
}

/// The logits of every position of `ids`, one sequence alone.
fn logits(model: &mut Model, ids: &[TokenId]) -> Vec<f32> {
    let blocks = ids.len().div_ceil(16);
    let mut kv = KvStore::with_dtype(&model.config, 16, blocks, KvDtype::F32).expect("kv");
    let table = (0..blocks as u32).map(BlockId).collect();
    let batch = ForwardBatch::single(ids.to_vec(), 0, table, OutputSelection::All);
    let got = model.forward(&batch, &mut kv).expect("forward");
    got.as_slice().to_vec()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max)
}
