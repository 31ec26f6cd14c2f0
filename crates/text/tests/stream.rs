//! `TextStream` (detokenizer + stop strings) on the default model's real tokenizer: the
//! concatenated deltas equal the non-streamed text (decode everything, cut at the first stop
//! string), with no U+FFFD from split characters and no byte of a stop string streamed
//! (ARCHITECTURE.md § Invariants, 7).

use std::sync::{Arc, OnceLock};

use proptest::prelude::*;
use tandem_model::gguf::GgufFile;
use tandem_model::tokenizer::Tokenizer;
use tandem_text::{StopStrings, TextOptions, TextStream};

/// The default model's tokenizer, loaded once per test binary.
fn tokenizer() -> Arc<Tokenizer> {
    static TOKENIZER: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOKENIZER
        .get_or_init(|| {
            let path = tandem_model::default_model::test_model_path()
                .expect("the default model is needed (TANDEM_TEST_MODEL); this test does not skip");
            let file = GgufFile::open(&path).expect("the default model opens");
            Arc::new(Tokenizer::from_gguf_metadata(&file.metadata).expect("its tokenizer builds"))
        })
        .clone()
}

struct Streamed {
    /// Text of each delta: one per pushed id, then `finish`.
    deltas: Vec<String>,
    /// Index of the matched stop string and the number of ids pushed when it matched.
    stopped: Option<(usize, usize)>,
}

impl Streamed {
    fn text(&self) -> String {
        self.deltas.concat()
    }
}

/// Streams `ids` one at a time until a stop string matches, then calls `finish`.
fn stream(ids: &[u32], stops: &[&str], include: bool, skip_special: bool) -> Streamed {
    let options = TextOptions {
        skip_special_tokens: skip_special,
        stop: StopStrings::new(stops.iter().copied()).expect("valid stop strings"),
        include_stop_str_in_output: include,
    };
    let mut ts = TextStream::new(tokenizer(), options);
    let mut deltas = Vec::new();
    let mut stopped = None;
    for (k, &id) in ids.iter().enumerate() {
        let delta = ts.push(id).expect("ids are in the vocabulary");
        deltas.push(delta.text);
        if let Some(m) = delta.stopped {
            assert_eq!(stops[m.index], m.stop);
            stopped = Some((m.index, k + 1));
            assert!(ts.is_stopped());
            break;
        }
    }
    let last = ts.finish();
    assert!(stopped.is_none() || last.text.is_empty());
    if let Some(m) = last.stopped {
        stopped = Some((m.index, ids.len()));
    }
    deltas.push(last.text);
    Streamed { deltas, stopped }
}

/// The non-streamed text, computed independently of the matcher: the first end offset at
/// which any stop string ends; at that offset the longest such stop string.
fn reference(text: &str, stops: &[&str], include: bool) -> (String, Option<usize>) {
    // (end, start, index): earliest end, then earliest start (longest), then first listed.
    let mut best: Option<(usize, usize, usize)> = None;
    for (i, s) in stops.iter().enumerate() {
        let Some(start) = text.find(s) else { continue };
        let key = (start + s.len(), start, i);
        if best.is_none_or(|b| key < b) {
            best = Some(key);
        }
    }
    match best {
        None => (text.to_owned(), None),
        Some((end, start, i)) => {
            let cut = if include { end } else { start };
            (text[..cut].to_owned(), Some(i))
        }
    }
}

fn encode(text: &str) -> Vec<u32> {
    tokenizer().encode(text, false).expect("encodes")
}

const FOX: &str = "The quick brown fox jumps over the lazy dog.";

#[test]
fn a_stop_string_spanning_several_tokens() {
    let stop = "brown fox jumps";
    let ids = encode(FOX);
    // The stop string covers at least 3 whole tokens of the text.
    let covered = encode(" brown fox jumps").len();
    assert!(covered >= 3, "{covered} tokens");
    let out = stream(&ids, &[stop], false, true);
    assert_eq!(out.text(), "The quick ");
    let (index, pushed) = out.stopped.expect("stopped");
    assert_eq!(index, 0);
    assert_eq!(
        tokenizer().decode(&ids[..pushed], true).expect("decodes"),
        "The quick brown fox jumps",
        "stops on the token that completes the stop string"
    );
    // No delta ever carried a byte of the stop string.
    assert!(out.deltas.iter().all(|d| !d.contains('b')));
    let out = stream(&ids, &[stop], true, true);
    assert_eq!(out.text(), "The quick brown fox jumps");
}

#[test]
fn a_stop_string_at_the_very_start() {
    let out = stream(&encode(FOX), &["The"], false, true);
    assert_eq!(out.text(), "");
    assert_eq!(out.stopped, Some((0, 1)));
    let out = stream(&encode(FOX), &["The q"], true, true);
    assert_eq!(out.text(), "The q");
}

#[test]
fn stop_strings_that_overlap() {
    let ids = encode(FOX);
    // "lazy" completes before "lazy dog".
    let out = stream(&ids, &["lazy dog", "lazy"], false, true);
    assert_eq!(
        (out.text().as_str(), out.stopped.map(|s| s.0)),
        ("The quick brown fox jumps over the ", Some(1))
    );
    // Both end at the same offset: the longer wins.
    let out = stream(&ids, &["dog", "the lazy dog"], false, true);
    assert_eq!(
        (out.text().as_str(), out.stopped.map(|s| s.0)),
        ("The quick brown fox jumps over ", Some(1))
    );
    // A word starting like a stop string but not matching is released.
    let out = stream(&ids, &["quiet"], false, true);
    assert_eq!((out.text().as_str(), out.stopped), (FOX, None));
}

#[test]
fn emoji_split_across_tokens_with_stop_strings() {
    let text = "Crabs 🦀🦀 like 日本 END and more";
    let ids = encode(text);
    let out = stream(&ids, &["END"], false, true);
    assert_eq!(out.text(), "Crabs 🦀🦀 like 日本 ");
    assert!(out.deltas.iter().all(|d| !d.contains('\u{FFFD}')));
    // A stop string that is an emoji split across byte tokens.
    let out = stream(&ids, &["🦀"], false, true);
    assert_eq!(out.text(), "Crabs ");
    let out = stream(&ids, &["本"], true, true);
    assert_eq!(out.text(), "Crabs 🦀🦀 like 日本");
}

#[test]
fn special_tokens_and_stop_strings() {
    let ids = encode("Sure.<|im_end|>");
    assert_eq!(stream(&ids, &[], false, true).text(), "Sure.");
    assert_eq!(stream(&ids, &[], false, false).text(), "Sure.<|im_end|>");
    // With special tokens kept, their text can be a stop string.
    let out = stream(&ids, &["<|im_end|>"], false, false);
    assert_eq!(
        (out.text().as_str(), out.stopped),
        ("Sure.", Some((0, ids.len())))
    );
    let out = stream(&ids, &["<|im_end|>"], false, true);
    assert_eq!((out.text().as_str(), out.stopped), ("Sure.", None));
}

#[test]
fn generation_ending_inside_a_possible_stop_string_flushes_it() {
    let ids = encode("Hello wor");
    let out = stream(&ids, &["world"], false, true);
    assert_eq!(out.text(), "Hello wor");
    assert_eq!(out.deltas.last().map(String::as_str), Some("wor"));
    assert_eq!(out.stopped, None);
}

/// Random text mixing ASCII words, accents, CJK and emoji (split into byte tokens), with
/// stop strings drawn from its substrings (plus one random string).
fn text_and_stops() -> impl Strategy<Value = (String, Vec<(usize, usize)>, String, bool)> {
    let piece = prop_oneof![
        prop::sample::select(vec![
            " the", " cat", "sat", ".", "\n", " ", "é", "ñ", "日本", "語"
        ])
        .prop_map(String::from),
        prop::sample::select(vec!["🦀", "🎉", "👍🏽", "❤️", "𝔘"]).prop_map(String::from),
        "\\PC{1,3}",
    ];
    (
        prop::collection::vec(piece, 0..30).prop_map(|v| v.concat()),
        prop::collection::vec((any::<usize>(), 1usize..12), 0..4),
        "[a-z🦀 ]{1,4}",
        any::<bool>(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn streaming_equals_non_streaming((text, picks, extra, include) in text_and_stops(), skip in any::<bool>()) {
        let ids = encode(&text);
        let decoded = tokenizer().decode(&ids, skip).expect("decodes");
        // Stop strings: substrings of the decoded text on character boundaries.
        let chars: Vec<usize> = decoded.char_indices().map(|(i, _)| i).chain([decoded.len()]).collect();
        let mut stops: Vec<String> = picks
            .iter()
            .filter(|_| chars.len() > 1)
            .map(|&(start, len)| {
                let a = start % (chars.len() - 1);
                let b = (a + len).min(chars.len() - 1);
                decoded[chars[a]..chars[b]].to_owned()
            })
            .collect();
        stops.push(extra);
        let stops: Vec<&str> = stops.iter().map(String::as_str).collect();
        let out = stream(&ids, &stops, include, skip);
        let (expected, index) = reference(&decoded, &stops, include);
        prop_assert_eq!(out.text(), expected);
        prop_assert_eq!(out.stopped.map(|s| s.0), index);
        if !decoded.contains('\u{FFFD}') {
            prop_assert!(out.deltas.iter().all(|d| !d.contains(char::REPLACEMENT_CHARACTER)));
        }
    }
}
