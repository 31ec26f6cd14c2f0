//! A SentencePiece (`tokenizer.ggml.model = llama`) GGUF vocabulary against llama.cpp:
//! fixtures/tokenizer_spm/vocab.gguf (a small SentencePiece BPE model with byte fallback,
//! written by scripts/make_tokenizer_spm_fixture.py) must tokenize every corpus string to the
//! ids llama-cpp-python gave, and decode back to the text.

use std::path::PathBuf;

use serde::Deserialize;
use tandem_model::gguf::GgufFile;
use tandem_model::tokenizer::Tokenizer;

#[derive(Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
}

#[derive(Deserialize)]
struct Reference {
    cases: Vec<Case>,
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tokenizer_spm")
        .join(name)
}

#[test]
fn sentencepiece_gguf_matches_llama_cpp() {
    let file = GgufFile::open(&fixture("vocab.gguf")).expect("fixture opens");
    let tok = Tokenizer::from_gguf_metadata(&file.metadata).expect("tokenizer builds");
    assert!(tok.add_bos(), "add_bos_token is true in the fixture");
    let text = std::fs::read_to_string(fixture("reference.json")).expect("reference exists");
    let reference: Reference = serde_json::from_str(&text).expect("reference parses");
    let mut mismatches = Vec::new();
    for case in &reference.cases {
        let ids = tok.encode(&case.text, true).expect("encodes");
        if ids != case.ids {
            mismatches.push(format!(
                "{:?}\n  llama.cpp {:?}\n  tandem    {ids:?}",
                case.text, case.ids
            ));
        }
        let plain = tok.encode(&case.text, false).expect("encodes");
        let back = tok.decode(&plain, false).expect("decodes");
        if back != case.text {
            mismatches.push(format!("round trip {:?} -> {back:?}", case.text));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} mismatches:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}
