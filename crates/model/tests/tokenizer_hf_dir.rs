//! Tokenizers loaded from Hugging Face directories (two tiny trained tokenizers in
//! fixtures/tokenizer_hf/, made by scripts/make_tokenizer_hf_fixtures.py) give the ids that
//! transformers' AutoTokenizer gave for every corpus string, and decode back to the text.

use std::path::PathBuf;

use serde::Deserialize;
use tandem_model::chat_template::{ChatMessage, ChatTemplate};
use tandem_model::tokenizer::Tokenizer;

#[derive(Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
}

#[derive(Deserialize)]
struct Reference {
    bos_token: String,
    eos_token: String,
    cases: Vec<Case>,
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tokenizer_hf")
        .join(name)
}

fn load(name: &str) -> (Tokenizer, Reference) {
    let dir = fixture(name);
    let tok = Tokenizer::from_hf_dir(&dir).expect("tokenizer loads");
    let text = std::fs::read_to_string(dir.join("reference.json")).expect("reference exists");
    (tok, serde_json::from_str(&text).expect("reference parses"))
}

fn check_against_transformers(tok: &Tokenizer, reference: &Reference) {
    assert_eq!(tok.bos_token(), Some(reference.bos_token.as_str()));
    assert_eq!(tok.eos_token(), Some(reference.eos_token.as_str()));
    let mut mismatches = Vec::new();
    for case in &reference.cases {
        let ids = tok.encode(&case.text, true).expect("encodes");
        if ids != case.ids {
            mismatches.push(format!(
                "{:?}\n  transformers {:?}\n  tandem       {ids:?}",
                case.text, case.ids
            ));
        }
        let plain = tok.encode(&case.text, false).expect("encodes");
        assert_eq!(tok.decode(&plain, false).expect("decodes"), case.text);
    }
    assert!(
        mismatches.is_empty(),
        "{} differ:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}

#[test]
fn byte_level_directory_matches_transformers() {
    let (tok, reference) = load("byte_level");
    check_against_transformers(&tok, &reference);
    // The post-processor adds <|endoftext|> (id 0) in front; tokenizer_config does not say so.
    assert!(tok.add_bos() && !tok.add_eos());
    assert_eq!(tok.bos_id(), Some(0));
    // eos_token first, then generation_config's extra ids [2, 0].
    assert_eq!(tok.eos_ids(), vec![2, 0]);
    let tool = tok
        .token_to_id("<tool>")
        .expect("user-defined token exists");
    assert!(!tok.is_special(tool));
    assert_eq!(tok.decode(&[0, tool, 2], true).expect("decodes"), "<tool>");
    // The "default" entry of the chat template list is chosen.
    let template = tok.chat_template().expect("has a template");
    let rendered = ChatTemplate::new(
        template,
        Some("<|endoftext|>".into()),
        Some("<|im_end|>".into()),
    )
    .expect("compiles")
    .render(&[ChatMessage::new("user", " hi ")], true)
    .expect("renders");
    assert_eq!(rendered, "<|endoftext|>user: hi<|im_end|>\nassistant:");
}

#[test]
fn sentencepiece_directory_matches_transformers() {
    let (tok, reference) = load("sentencepiece");
    check_against_transformers(&tok, &reference);
    // add_bos_token = true in tokenizer_config.json, but no post-processor: transformers 5
    // adds nothing, and neither do we.
    assert!(!tok.add_bos());
    assert_eq!(tok.eos_ids(), vec![2]);
    // Byte fallback: "日" is not in the vocabulary and becomes three byte pieces.
    let ids = tok.encode("日", false).expect("encodes");
    let pieces: Vec<String> = ids
        .iter()
        .filter_map(|&id| tok.token_to_piece(id))
        .collect();
    assert!(
        pieces.ends_with(&[
            "<0xE6>".to_owned(),
            "<0x97>".to_owned(),
            "<0xA5>".to_owned()
        ]),
        "{pieces:?}"
    );
}

#[test]
fn missing_directory_is_an_error() {
    let err = Tokenizer::from_hf_dir(&fixture("no_such_dir")).expect_err("fails");
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
}

/// A model's padded embedding rows (ids past the vocabulary) are tokens of no text: every
/// corpus string decodes the same with padding ids among its tokens, and an id past the
/// padding is still an error.
#[test]
fn padding_ids_decode_to_no_text() {
    for name in ["byte_level", "sentencepiece"] {
        let (mut tok, reference) = load(name);
        let n = tok.vocab_size();
        tok.pad_to(n + 7);
        assert_eq!(tok.vocab_size(), n + 7, "{name}");
        let pad = (n + 3) as u32;
        assert_eq!(tok.token_bytes(pad), Some(&b""[..]), "{name}");
        for case in &reference.cases {
            let mut ids = case.ids.clone();
            let plain = tok.decode(&ids, true).expect("decodes");
            ids.insert(ids.len() / 2, pad);
            ids.push(pad);
            assert_eq!(tok.decode(&ids, true).expect("decodes"), plain, "{name}");
        }
        assert!(tok.decode(&[(n + 7) as u32], true).is_err(), "{name}");
        tok.pad_to(3);
        assert_eq!(tok.vocab_size(), n + 7, "never shrinks");
    }
}
