//! The default model's chat template (read from the GGUF at `$TANDEM_TEST_MODEL` or in the default model cache) renders
//! conversations exactly as transformers' `apply_chat_template(..., tokenize=False)` did
//! (fixtures/default_model/chat_template_reference.json, made by
//! scripts/make_default_model_reference.py).

use std::path::PathBuf;

use serde::Deserialize;
use tandem_model::chat_template::{ChatMessage, ChatTemplate};
use tandem_model::gguf::GgufFile;
use tandem_model::tokenizer::Tokenizer;

#[derive(Deserialize)]
struct Case {
    messages: Vec<ChatMessage>,
    add_generation_prompt: bool,
    text: String,
}

#[derive(Deserialize)]
struct Reference {
    bos_token: String,
    eos_token: String,
    cases: Vec<Case>,
}

fn model_path() -> PathBuf {
    tandem_model::default_model::test_model_path()
        .expect("the default model is needed (TANDEM_TEST_MODEL); this test does not skip")
}

#[test]
fn renders_like_transformers() {
    let file = GgufFile::open(&model_path()).expect("the default model opens");
    let tok = Tokenizer::from_gguf_metadata(&file.metadata).expect("its tokenizer builds");
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/default_model/chat_template_reference.json"
    );
    let reference: Reference =
        serde_json::from_str(&std::fs::read_to_string(path).expect("fixture exists"))
            .expect("fixture parses");
    assert_eq!(tok.bos_token(), Some(reference.bos_token.as_str()));
    assert_eq!(tok.eos_token(), Some(reference.eos_token.as_str()));
    let source = tok
        .chat_template()
        .expect("the default model has a chat template");
    let template = ChatTemplate::new(
        source,
        tok.bos_token().map(str::to_owned),
        tok.eos_token().map(str::to_owned),
    )
    .expect("template compiles");
    assert!(reference.cases.len() >= 8);
    for case in &reference.cases {
        let text = template
            .render(&case.messages, case.add_generation_prompt)
            .expect("renders");
        assert_eq!(text, case.text, "messages {:?}", case.messages);
    }
}
