//! The default model (SmolLM2-135M-Instruct, Q4_1 + Q8_0 embedding) against two references
//! recorded by `scripts/make_default_model_reference.py` on the same token ids:
//! - the exact fp32 function of the quantized weights (HF transformers loading the GGUF and
//!   dequantizing it), which tandem's scalar path must match within mean |Δlogprob| ≤ 0.01;
//! - llama.cpp, which quantizes activations to 8 bits and is the bar for faster paths.

use tandem_model::batch::TokenId;
use tandem_model::loader::load_gguf_model;
use tandem_model::scoring::{score_tokens, ScoreOptions};

struct Reference {
    tokens: Vec<TokenId>,
    hf_logprobs: Vec<Option<f64>>,
    hf_argmax: Vec<u32>,
    llama_logprobs: Vec<Option<f64>>,
}

fn references() -> Vec<Reference> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/default_model/reference.json"
    );
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("reference.json"))
            .expect("json");
    let f64s = |v: &serde_json::Value| -> Vec<Option<f64>> {
        v.as_array()
            .expect("array")
            .iter()
            .map(|x| x.as_f64())
            .collect()
    };
    r["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .map(|p| Reference {
            tokens: p["tokens"]
                .as_array()
                .expect("tokens")
                .iter()
                .map(|t| TokenId(t.as_u64().expect("id") as u32))
                .collect(),
            hf_logprobs: f64s(&p["hf_fp32"]["token_logprobs"]),
            hf_argmax: p["hf_fp32"]["argmax"]
                .as_array()
                .expect("argmax")
                .iter()
                .map(|t| t.as_u64().expect("id") as u32)
                .collect(),
            llama_logprobs: f64s(&p["llama_cpp"]["token_logprobs"]),
        })
        .collect()
}

#[test]
fn scalar_path_matches_the_fp32_dequantized_reference() {
    let path = tandem_model::default_model::test_model_path()
        .expect("the default model is needed; this test does not skip");
    let (model, _) = load_gguf_model(&path, 2).expect("load");
    let refs = references();
    assert!(
        refs.len() >= 5 && refs.iter().all(|r| r.tokens.len() >= 64),
        "fixture too small"
    );
    let (mut sum_hf, mut sum_llama, mut n, mut top1, mut rows) = (0.0, 0.0, 0usize, 0usize, 0usize);
    for r in &refs {
        let opts = ScoreOptions {
            top_k: 1,
            ..ScoreOptions::default()
        };
        let out = score_tokens(&model, &r.tokens, &opts, &mut |_, _| {}).expect("score");
        for (i, p) in out.positions.iter().enumerate() {
            let (Some(p), Some(hf), Some(ll)) = (p, r.hf_logprobs[i], r.llama_logprobs[i]) else {
                assert!(i == 0, "position {i} lacks a score");
                continue;
            };
            sum_hf += (p.logprob as f64 - hf).abs();
            sum_llama += (ll - hf).abs();
            n += 1;
        }
        // argmax[i] is the reference's most likely next token after position i.
        for i in 0..r.tokens.len() - 1 {
            let ours = out.positions[i + 1].as_ref().expect("scored").top[0].0 .0;
            top1 += usize::from(ours == r.hf_argmax[i]);
            rows += 1;
        }
    }
    let (mean_hf, mean_llama) = (sum_hf / n as f64, sum_llama / n as f64);
    let agreement = top1 as f64 / rows as f64;
    eprintln!(
        "tandem vs fp32 reference: mean |Δlogprob| {mean_hf:.2e} over {n} positions, top-1 agreement {agreement:.4}; \
         llama.cpp vs fp32 reference: mean |Δlogprob| {mean_llama:.5}"
    );
    assert!(mean_hf <= 0.01, "mean |Δlogprob| {mean_hf} > 0.01");
    assert!(agreement >= 0.98, "top-1 agreement {agreement} < 0.98");
}
