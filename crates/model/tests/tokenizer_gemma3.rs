//! Gemma 3 270M's tokenizer (SentencePiece-style, 262,144 pieces, from the real GGUF:
//! `--model gemma3-270m`, fetched into the cache on first use) against llama.cpp: every
//! string of fixtures/gemma3_270m/tokenizer_reference.json (the tokenizer corpus plus prose,
//! code, multilingual text and Gemma chat turns, recorded by scripts/make_gemma3_reference.py)
//! must give exactly llama.cpp's ids, and decoding must give the text back.

mod llama_cpp_corpus;

use llama_cpp_corpus::{assert_decode_inverts_encode, assert_encodes_like_llama_cpp, Case};
use serde::Deserialize;
use tandem_model::gguf::GgufFile;
use tandem_model::tokenizer::Tokenizer;

#[derive(Deserialize)]
struct Reference {
    add_bos_token: bool,
    model_sha256: String,
    cases: Vec<Case>,
}

fn tokenizer() -> Tokenizer {
    let path = tandem_model::default_model::known_model_path("gemma3-270m")
        .expect("the Gemma 3 270M model is needed; this test does not skip");
    let file = GgufFile::open(&path).expect("the model opens");
    Tokenizer::from_gguf_metadata(&file.metadata).expect("its tokenizer builds")
}

fn reference() -> Reference {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/gemma3_270m/tokenizer_reference.json"
    );
    let text = std::fs::read_to_string(path).expect("fixture exists");
    serde_json::from_str(&text).expect("fixture parses")
}

#[test]
fn encodes_every_string_exactly_like_llama_cpp() {
    let tok = tokenizer();
    let reference = reference();
    assert_eq!(
        reference.model_sha256,
        tandem_model::default_model::GEMMA3_270M.sha256
    );
    assert!(reference.cases.len() >= 300, "corpus too small");
    assert_eq!(tok.vocab_size(), 262_144);
    assert_eq!(tok.add_bos(), reference.add_bos_token);
    assert_encodes_like_llama_cpp(&tok, &reference.cases);
}

#[test]
fn decode_inverts_encode() {
    assert_decode_inverts_encode(&tokenizer(), &reference().cases);
}

/// `<end_of_turn>` ends a generation (as llama.cpp's end-of-generation set has it), after
/// the metadata's EOS.
#[test]
fn end_of_turn_stops_generation() {
    let tok = tokenizer();
    let eot = tok.encode("<end_of_turn>", false).expect("encodes");
    assert_eq!(eot.len(), 1);
    assert_eq!(tok.eos_ids(), vec![1, eot[0]]);
}
