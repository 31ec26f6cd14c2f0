//! The real default model (SmolLM2-135M-Instruct, Q4_1 with a Q8_0 embedding), read from
//! `$TANDEM_TEST_MODEL` or the default model cache (fetched on first use). Expected values were obtained with the reference reader
//! of gguf-py 0.19 (`gguf.GGUFReader(path)`: `len(r.tensors)`, `r.fields[...]`,
//! `r.data_offset`, and per tensor `tensor_type`, `shape` (ggml order), `data_offset`).

use std::path::PathBuf;

use tandem_kernels::DType;
use tandem_model::gguf::GgufFile;

fn model_path() -> PathBuf {
    tandem_model::default_model::test_model_path()
        .expect("the default model is needed; this test does not skip")
}

// From gguf-py 0.19. (It reports the rms epsilon as 9.999999747378752e-06, the f32 nearest
// to 1e-5.)
const N_TENSORS: usize = 272;
const N_METADATA: usize = 33;
const DATA_OFFSET: usize = 1_785_664;
const N_TOKENS: usize = 49_152;
const N_MERGES: usize = 48_900;
const FIRST_TOKENS: [&str; 4] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>"];
const FIRST_MERGES: [&str; 4] = ["Ġ t", "Ġ a", "i n", "h e"];
/// (name, type, ggml dims, offset relative to the data section)
const TENSORS: [(&str, DType, &[u64], u64); 6] = [
    ("token_embd.weight", DType::Q8_0, &[576, 49152], 0),
    ("blk.0.attn_norm.weight", DType::F32, &[576], 30_081_024),
    (
        "blk.0.ffn_down.weight",
        DType::Q4_1,
        &[1536, 576],
        30_083_328,
    ),
    ("blk.0.attn_k.weight", DType::Q4_1, &[576, 192], 31_744_512),
    ("blk.9.attn_v.weight", DType::Q4_1, &[576, 192], 96_505_344),
    ("output_norm.weight", DType::F32, &[576], 96_574_464),
];

#[test]
fn default_model_matches_gguf_py() {
    let file = GgufFile::open(&model_path()).expect("open the default model");
    assert_eq!(file.version, 3);
    assert_eq!(file.tensors.len(), N_TENSORS);
    assert_eq!(file.data_offset, DATA_OFFSET);
    assert_eq!(file.alignment, 32);
    let m = &file.metadata;
    assert_eq!(m.len(), N_METADATA);
    assert_eq!(m.str("general.architecture"), Ok("llama"));
    assert_eq!(m.str("tokenizer.ggml.model"), Ok("gpt2"));
    assert_eq!(m.str("tokenizer.ggml.pre"), Ok("smollm"));
    assert_eq!(m.u32("llama.block_count"), Ok(30));
    assert_eq!(m.u32("llama.context_length"), Ok(8192));
    assert_eq!(m.u32("llama.embedding_length"), Ok(576));
    assert_eq!(m.u32("llama.feed_forward_length"), Ok(1536));
    assert_eq!(m.u32("llama.attention.head_count"), Ok(9));
    assert_eq!(m.u32("llama.attention.head_count_kv"), Ok(3));
    assert_eq!(m.u32("llama.vocab_size"), Ok(49152));
    assert_eq!(m.f32("llama.rope.freq_base"), Ok(100_000.0));
    assert_eq!(m.f32("llama.attention.layer_norm_rms_epsilon"), Ok(1e-5));
    assert_eq!(m.bool("tokenizer.ggml.add_bos_token"), Ok(false));
    assert_eq!(m.u32("tokenizer.ggml.eos_token_id"), Ok(2));
    assert_eq!(m.str_array("general.languages"), Ok(vec!["en"]));
    let tokens = m.str_array("tokenizer.ggml.tokens").expect("tokens");
    assert_eq!(tokens.len(), N_TOKENS);
    assert_eq!(tokens[..4], FIRST_TOKENS);
    assert_eq!(tokens[N_TOKENS - 1], "ectable");
    let merges = m.str_array("tokenizer.ggml.merges").expect("merges");
    assert_eq!(merges.len(), N_MERGES);
    assert_eq!(merges[..4], FIRST_MERGES);
    assert_eq!(merges[N_MERGES - 1], "ect able");
    let types = m
        .i32_array("tokenizer.ggml.token_type")
        .expect("token types");
    assert_eq!(
        (types.len(), types[0], types[N_TOKENS - 1]),
        (N_TOKENS, 3, 1)
    );

    for (name, dtype, dims, offset) in TENSORS {
        let t = file.tensors.iter().find(|t| t.name == name).expect(name);
        assert_eq!(
            (t.dtype, &t.dims[..], t.offset),
            (dtype, dims, offset),
            "{name}"
        );
    }
    let count = |d: DType| file.tensors.iter().filter(|t| t.dtype == d).count();
    assert_eq!(
        (count(DType::Q4_1), count(DType::F32), count(DType::Q8_0)),
        (210, 61, 1)
    );

    let set = file.into_tensor_set().expect("tensor set");
    assert_eq!(set.len(), N_TENSORS);
    let emb = set.require("token_embd.weight").expect("embedding");
    assert_eq!(emb.shape, &[49152, 576]);
    assert_eq!(emb.data.len(), 30_081_024);
}
