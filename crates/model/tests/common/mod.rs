//! The default-model references recorded by `scripts/make_default_model_reference.py`, and
//! the comparison of a model's scores against them (shared by the fidelity tests).
#![allow(dead_code)]

use tandem_model::batch::TokenId;
use tandem_model::cpu_runner::{CpuRunner, KvSpec};
use tandem_model::kv_store::KvDtype;
use tandem_model::scoring::{score_tokens, ScoreOptions};
use tandem_model::transformer::Model;

pub struct Reference {
    tokens: Vec<TokenId>,
    hf_logprobs: Vec<Option<f64>>,
    hf_argmax: Vec<u32>,
    llama_logprobs: Vec<Option<f64>>,
}

pub fn references() -> Vec<Reference> {
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

/// How far a model's scores are from the fp32 dequantized reference.
pub struct Fidelity {
    /// Mean |Δlogprob| of the actual tokens vs the fp32 reference.
    pub mean_abs_dlogprob: f64,
    /// Fraction of positions whose most likely next token matches the reference's.
    pub top1_agreement: f64,
    /// llama.cpp's mean |Δlogprob| vs the same reference, over the same positions.
    pub llama_cpp_mean_abs_dlogprob: f64,
    pub positions: usize,
}

/// Scores the references with `model` (one scoring context of up to 4,096 tokens).
pub fn fidelity(model: Model) -> Fidelity {
    fidelity_with_kv(model, None)
}

/// [`fidelity`] with the KV cache stored as `dtype` (`None`: the model's default).
pub fn fidelity_with_kv(model: Model, dtype: Option<KvDtype>) -> Fidelity {
    let spec = KvSpec {
        block_size: 16,
        num_blocks: 4096 / 16,
        dtype,
    };
    let mut runner = CpuRunner::new(model, spec).expect("KV pool");
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
        let out = score_tokens(&mut runner, &r.tokens, &opts, &mut |_, _| {}).expect("score");
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
    Fidelity {
        mean_abs_dlogprob: sum_hf / n as f64,
        top1_agreement: top1 as f64 / rows as f64,
        llama_cpp_mean_abs_dlogprob: sum_llama / n as f64,
        positions: n,
    }
}
