//! The default model's tokenizer, built from the real GGUF (`$TANDEM_TEST_MODEL` or the default model cache),
//! against llama.cpp: every string of the corpus in
//! fixtures/default_model/tokenizer_reference.json must give exactly llama.cpp's ids
//! (recorded by scripts/make_default_model_reference.py with llama-cpp-python), and decoding
//! must give the text back.

mod llama_cpp_corpus;

use std::path::PathBuf;

use llama_cpp_corpus::{assert_decode_inverts_encode, assert_encodes_like_llama_cpp, Case};
use serde::Deserialize;
use tandem_model::gguf::GgufFile;
use tandem_model::tokenizer::Tokenizer;

#[derive(Deserialize)]
struct Reference {
    tokenizer_pre: String,
    add_bos_token: bool,
    cases: Vec<Case>,
}

fn model_path() -> PathBuf {
    tandem_model::default_model::test_model_path()
        .expect("the default model is needed (TANDEM_TEST_MODEL); this test does not skip")
}

fn tokenizer() -> Tokenizer {
    let file = GgufFile::open(&model_path()).expect("the default model opens");
    Tokenizer::from_gguf_metadata(&file.metadata).expect("its tokenizer builds")
}

fn reference() -> Reference {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/default_model/tokenizer_reference.json"
    );
    let text = std::fs::read_to_string(path).expect("fixture exists");
    serde_json::from_str(&text).expect("fixture parses")
}

#[test]
fn encodes_every_corpus_string_exactly_like_llama_cpp() {
    let tok = tokenizer();
    let reference = reference();
    assert!(reference.cases.len() >= 220, "corpus too small");
    assert!(tok.description().contains(&reference.tokenizer_pre));
    assert_eq!(tok.add_bos(), reference.add_bos_token);
    assert_encodes_like_llama_cpp(&tok, &reference.cases);
}

#[test]
fn decode_inverts_encode_on_the_corpus() {
    let tok = tokenizer();
    let cases = reference().cases;
    let all_ids = assert_decode_inverts_encode(&tok, &cases);
    for (case, ids) in cases.iter().zip(&all_ids) {
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&id| tok.token_bytes(id).expect("id in vocabulary").to_vec())
            .collect();
        assert_eq!(
            bytes,
            case.text.as_bytes(),
            "token bytes of {:?}",
            case.text
        );
    }
}

#[test]
fn special_tokens_and_settings_follow_the_metadata() {
    let tok = tokenizer();
    // From the GGUF metadata (gguf-py): 49152 tokens, bos 1, eos 2, add_bos_token false;
    // ids 0..=16 are control tokens.
    assert_eq!(tok.vocab_size(), 49_152);
    assert_eq!(tok.bos_id(), Some(1));
    assert_eq!(tok.eos_ids().first(), Some(&2));
    assert!(
        tok.eos_ids().contains(&0),
        "<|endoftext|> ends generation too"
    );
    assert!(!tok.add_bos() && !tok.add_eos());
    assert_eq!(tok.bos_token(), Some("<|im_start|>"));
    assert_eq!(tok.eos_token(), Some("<|im_end|>"));
    assert_eq!(tok.token_to_id("<|im_start|>"), Some(1));
    assert_eq!(tok.token_to_piece(216).as_deref(), Some("Ġ"));
    assert!(tok.is_special(1) && !tok.is_special(216));
    assert!(tok
        .chat_template()
        .is_some_and(|t| t.contains("<|im_start|>")));

    let ids = tok
        .encode("<|im_start|>user\nHi<|im_end|>", true)
        .expect("encodes");
    assert_eq!((ids[0], *ids.last().expect("non-empty")), (1, 2));
    assert_eq!(tok.decode(&ids, true).expect("decodes"), "user\nHi");
    assert!(tok.decode(&[49_152], false).is_err());
    assert_eq!(tok.token_bytes(49_152), None);
}
