//! The int8 kernels (activations rounded to 8 bits, as llama.cpp does) on the default model:
//! they must stay no further from the fp32 dequantized reference than llama.cpp is.

mod common;

use tandem_kernels::Isa;
use tandem_model::loader::load_gguf_model;
use tandem_model::transformer::Model;

#[test]
fn int8_path_is_no_further_from_the_reference_than_llama_cpp() {
    let isa = [Isa::Avx512Int8, Isa::Avx2Int8]
        .into_iter()
        .find(|i| i.is_available())
        .expect(
            "this test needs an x86-64 CPU with AVX2 (the project's machines have AVX-512 VNNI)",
        );
    let path = tandem_model::default_model::test_model_path()
        .expect("the default model is needed; this test does not skip");
    let model = Model::with_kernels(load_gguf_model(&path).expect("load").0, 2, isa);
    let f = common::fidelity(model);
    eprintln!(
        "tandem ({isa}) vs fp32 reference: mean |Δlogprob| {:.5} over {} positions, top-1 agreement {:.4}; \
         llama.cpp: mean |Δlogprob| {:.5}",
        f.mean_abs_dlogprob, f.positions, f.top1_agreement, f.llama_cpp_mean_abs_dlogprob
    );
    assert!(
        f.mean_abs_dlogprob <= f.llama_cpp_mean_abs_dlogprob,
        "int8 path is further from the reference ({}) than llama.cpp ({})",
        f.mean_abs_dlogprob,
        f.llama_cpp_mean_abs_dlogprob
    );
    assert!(
        f.top1_agreement >= 0.95,
        "top-1 agreement {} < 0.95",
        f.top1_agreement
    );
}
