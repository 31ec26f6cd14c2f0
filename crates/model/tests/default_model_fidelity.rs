//! The default model (SmolLM2-135M-Instruct, Q4_1 + Q8_0 embedding) against two references
//! recorded by `scripts/make_default_model_reference.py` on the same token ids:
//! - the exact fp32 function of the quantized weights (HF transformers loading the GGUF and
//!   dequantizing it), which tandem's scalar path must match within mean |Δlogprob| ≤ 0.01;
//! - llama.cpp, which quantizes activations to 8 bits and is the bar for faster paths.

mod common;

use tandem_model::loader::load_gguf_model;
use tandem_model::transformer::Model;

#[test]
fn scalar_path_matches_the_fp32_dequantized_reference() {
    // The fastest exact kernels (AVX-512 / AVX2 when present) are bitwise equal to the scalar
    // path; the default int8 ones are `default_model_fidelity_int8`'s subject.
    let isa = tandem_kernels::Isa::best_exact();
    let path = tandem_model::default_model::test_model_path()
        .expect("the default model is needed; this test does not skip");
    let model = Model::with_kernels(load_gguf_model(&path).expect("load").0, 2, isa);
    let f = common::fidelity(model);
    eprintln!(
        "tandem ({}) vs fp32 reference: mean |Δlogprob| {:.2e} over {} positions, top-1 agreement {:.4}; \
         llama.cpp vs fp32 reference: mean |Δlogprob| {:.5}",
        isa, f.mean_abs_dlogprob, f.positions, f.top1_agreement, f.llama_cpp_mean_abs_dlogprob
    );
    assert!(
        f.mean_abs_dlogprob <= 0.01,
        "mean |Δlogprob| {} > 0.01",
        f.mean_abs_dlogprob
    );
    assert!(
        f.top1_agreement >= 0.98,
        "top-1 agreement {} < 0.98",
        f.top1_agreement
    );
}
