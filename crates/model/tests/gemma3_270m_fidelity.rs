//! Gemma 3 270M (`--model gemma3-270m`, Q4_K_M with Q5_0/Q8_0/Q6_K tensors) against the exact
//! fp32 function of its quantized weights (HF transformers loading the GGUF, dequantizing it;
//! recorded by `scripts/make_gemma3_reference.py` on llama.cpp's token ids). One prompt has
//! over 1,000 tokens, so the local layers' 512-position window slides.

use tandem_kernels::Isa;
use tandem_model::batch::TokenId;
use tandem_model::cpu_runner::{CpuRunner, KvSpec};
use tandem_model::loader::load_gguf_model;
use tandem_model::scoring::{score_tokens, ScoreOptions};
use tandem_model::transformer::Model;

struct Prompt {
    tokens: Vec<TokenId>,
    logprobs: Vec<Option<f64>>,
    argmax: Vec<u32>,
}

fn prompts() -> Vec<Prompt> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/gemma3_270m/reference.json"
    );
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("json");
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        let list = v.as_array().expect("ids");
        list.iter()
            .map(|t| t.as_u64().expect("id") as u32)
            .collect()
    };
    r["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .map(|p| Prompt {
            tokens: ids(&p["tokens"]).into_iter().map(TokenId).collect(),
            logprobs: p["hf_fp32"]["token_logprobs"]
                .as_array()
                .expect("logprobs")
                .iter()
                .map(|x| x.as_f64())
                .collect(),
            argmax: ids(&p["hf_fp32"]["argmax"]),
        })
        .collect()
}

/// (mean |Δlogprob|, top-1 agreement) of the model's scores against the reference.
fn distance(isa: Isa) -> (f64, f64) {
    let path = tandem_model::default_model::known_model_path("gemma3-270m")
        .expect("the Gemma 3 270M model is needed; this test does not skip");
    let model = Model::with_kernels(load_gguf_model(&path).expect("load").0, 2, isa);
    let spec = KvSpec {
        block_size: 16,
        num_blocks: 2048 / 16,
        dtype: None,
    };
    let mut runner = CpuRunner::new(model, spec).expect("KV pool");
    let (mut sum, mut n, mut top1, mut rows) = (0.0, 0usize, 0usize, 0usize);
    let prompts = prompts();
    assert!(
        prompts.iter().any(|p| p.tokens.len() > 1024),
        "no long prompt"
    );
    for p in &prompts {
        let opts = ScoreOptions {
            top_k: 1,
            ..ScoreOptions::default()
        };
        let out = score_tokens(&mut runner, &p.tokens, &opts, &mut |_, _| {}).expect("score");
        for (i, (got, want)) in out.positions.iter().zip(&p.logprobs).enumerate().skip(1) {
            let (Some(got), Some(want)) = (got, want) else {
                panic!("position {i} lacks a score");
            };
            sum += (got.logprob as f64 - want).abs();
            n += 1;
            top1 += usize::from(got.top[0].0 .0 == p.argmax[i - 1]);
            rows += 1;
        }
    }
    let (mean, agree) = (sum / n as f64, top1 as f64 / rows as f64);
    eprintln!(
        "gemma3-270m ({isa}): mean |Δlogprob| {mean:.2e} over {n} positions, top-1 {agree:.4}"
    );
    (mean, agree)
}

#[test]
fn exact_path_matches_the_fp32_dequantized_reference() {
    let (mean, top1) = distance(Isa::best_exact());
    assert!(mean <= 1e-3, "mean |Δlogprob| {mean}");
    assert!(top1 >= 0.99, "top-1 agreement {top1}");
}

#[test]
fn int8_path_stays_close_to_the_reference() {
    let isa = [Isa::Avx512Int8, Isa::Avx2Int8]
        .into_iter()
        .find(|i| i.is_available())
        .expect("this test needs an x86-64 CPU with AVX2");
    let (mean, top1) = distance(isa);
    assert!(mean <= 0.02, "mean |Δlogprob| {mean}");
    assert!(top1 >= 0.95, "top-1 agreement {top1}");
}
