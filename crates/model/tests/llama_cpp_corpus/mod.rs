//! The comparison both real-model tokenizer tests make: every string of a corpus recorded
//! from llama.cpp must encode to exactly llama.cpp's ids, and decoding must give it back.

use serde::Deserialize;
use tandem_model::tokenizer::Tokenizer;

/// One recorded string and llama.cpp's ids for it (BOS included when the model adds one).
#[derive(Deserialize)]
pub struct Case {
    pub text: String,
    pub ids: Vec<u32>,
}

/// Fails listing every string whose ids differ from llama.cpp's.
pub fn assert_encodes_like_llama_cpp(tok: &Tokenizer, cases: &[Case]) {
    let mut mismatches = Vec::new();
    for case in cases {
        let ids = tok.encode(&case.text, true).expect("encodes");
        if ids != case.ids {
            mismatches.push(format!(
                "{:?}\n  llama.cpp {:?}\n  tandem    {:?}",
                case.text, case.ids, ids
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} strings differ:\n{}",
        mismatches.len(),
        cases.len(),
        mismatches.join("\n")
    );
}

/// Decoding the ids of every string (no special tokens added) gives the string back;
/// returns each string's ids for further checks.
pub fn assert_decode_inverts_encode(tok: &Tokenizer, cases: &[Case]) -> Vec<Vec<u32>> {
    cases
        .iter()
        .map(|case| {
            let ids = tok.encode(&case.text, false).expect("encodes");
            let text = tok.decode(&ids, false).expect("decodes");
            assert_eq!(text, case.text, "round trip of {:?} via {ids:?}", case.text);
            ids
        })
        .collect()
}
