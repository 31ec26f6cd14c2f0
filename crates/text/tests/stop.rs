//! The stop-string matcher on its own: limits, hold-back across chunks, which stop string
//! wins, and the streaming ≡ non-streaming invariant for every way of cutting the text.

use proptest::prelude::*;
use tandem_text::{
    StopMatch, StopStringError, StopStringMatcher, StopStrings, MAX_STOP_STRINGS,
    MAX_STOP_STRING_BYTES,
};

fn stops(list: &[&str]) -> StopStrings {
    StopStrings::new(list.iter().copied()).expect("valid stop strings")
}

/// Feeds `chunks` and returns the text emitted after each one, then the final flush, and
/// the stop match. Checks that nothing is emitted after the stop.
fn run(list: &[&str], include: bool, chunks: &[&str]) -> (Vec<String>, String, Option<StopMatch>) {
    let mut m = StopStringMatcher::new(stops(list), include);
    let mut out = Vec::new();
    let mut stopped = None;
    for chunk in chunks {
        let delta = m.push(chunk);
        if stopped.is_some() {
            assert_eq!(delta.text, "", "text after the stop");
            assert_eq!(delta.stopped, None, "second stop");
        }
        if delta.stopped.is_some() {
            stopped = delta.stopped;
        }
        out.push(delta.text);
    }
    let tail = m.finish();
    if stopped.is_some() {
        assert_eq!(tail, "");
    }
    (out, tail, stopped)
}

/// The non-streamed reference, written independently of the matcher: scan end offsets in
/// increasing order; the first offset where some stop string ends is the stop; among
/// stop strings ending there, the longest (then the first listed). Returns the output text
/// and the index of the matched stop string.
fn reference(text: &str, list: &[&str], include: bool) -> (String, Option<usize>) {
    for end in 0..=text.len() {
        if !text.is_char_boundary(end) {
            continue;
        }
        let mut best: Option<usize> = None;
        for (i, s) in list.iter().enumerate() {
            if text[..end].ends_with(s) && best.is_none_or(|b| s.len() > list[b].len()) {
                best = Some(i);
            }
        }
        if let Some(i) = best {
            let cut = if include { end } else { end - list[i].len() };
            return (text[..cut].to_owned(), Some(i));
        }
    }
    (text.to_owned(), None)
}

#[test]
fn limits_are_enforced_with_typed_errors() {
    let ok: Vec<String> = (0..MAX_STOP_STRINGS).map(|i| format!("s{i}")).collect();
    assert!(StopStrings::new(ok.clone()).is_ok());
    let mut too_many = ok;
    too_many.push("x".into());
    assert_eq!(
        StopStrings::new(too_many),
        Err(StopStringError::TooMany {
            count: MAX_STOP_STRINGS + 1,
            max: MAX_STOP_STRINGS
        })
    );
    assert!(StopStrings::new(["é".repeat(MAX_STOP_STRING_BYTES / 2)]).is_ok());
    assert_eq!(
        StopStrings::new(["a", &"é".repeat(MAX_STOP_STRING_BYTES / 2 + 1)]),
        Err(StopStringError::TooLong {
            index: 1,
            len: MAX_STOP_STRING_BYTES + 2,
            max: MAX_STOP_STRING_BYTES
        })
    );
    assert_eq!(
        StopStrings::new(["a", ""]),
        Err(StopStringError::Empty { index: 1 })
    );
    assert!(StopStrings::new(Vec::<String>::new()).is_ok_and(|s| s.is_empty()));
}

#[test]
fn holds_back_only_what_could_start_a_stop_string() {
    let (out, tail, stopped) = run(&["world"], false, &["hello wo", "rl", "d!", " more"]);
    assert_eq!(out, ["hello ", "", "", ""]);
    assert_eq!((tail.as_str(), stopped.map(|s| s.index)), ("", Some(0)));

    // A false start is released as soon as it can no longer match.
    let (out, tail, stopped) = run(&["world"], false, &["hello wo", "rk", "s"]);
    assert_eq!(out, ["hello ", "work", "s"]);
    assert_eq!((tail.as_str(), stopped), ("", None));

    // Generation ends in the middle of a possible stop string: the final flush emits it.
    let (out, tail, stopped) = run(&["world"], false, &["hello", " wor"]);
    assert_eq!(out, ["hello", " "]);
    assert_eq!((tail.as_str(), stopped), ("wor", None));
}

#[test]
fn a_stop_string_spanning_many_chunks() {
    let text = "abc<|stop here|>def";
    let chunks: Vec<String> = text.chars().map(String::from).collect();
    let chunks: Vec<&str> = chunks.iter().map(String::as_str).collect();
    let (out, tail, stopped) = run(&["<|stop here|>"], false, &chunks);
    assert_eq!(out.concat() + &tail, "abc");
    assert_eq!(
        out.iter().filter(|t| !t.is_empty()).count(),
        3,
        "one char at a time"
    );
    assert_eq!(
        stopped,
        Some(StopMatch {
            index: 0,
            stop: "<|stop here|>".into()
        })
    );
}

#[test]
fn a_stop_string_at_the_very_start() {
    let (out, tail, stopped) = run(&["Hi"], false, &["H", "i there"]);
    assert_eq!(out, ["", ""]);
    assert_eq!(tail, "");
    assert_eq!(stopped.map(|s| s.index), Some(0));
    let (out, _, _) = run(&["Hi"], true, &["H", "i there"]);
    assert_eq!(out, ["", "Hi"]);
}

#[test]
fn include_stop_str_in_output_emits_the_stop_string_last() {
    let (out, tail, stopped) = run(&["END"], true, &["one E", "N", "D two"]);
    assert_eq!(out, ["one ", "", "END"]);
    assert_eq!(tail, "");
    assert!(stopped.is_some());
}

#[test]
fn stop_strings_that_are_prefixes_or_suffixes_of_each_other() {
    // The one complete first wins: "ab" completes before "abc" could.
    let (out, _, stopped) = run(&["abc", "ab"], false, &["xa", "bc"]);
    assert_eq!(out.concat(), "x");
    assert_eq!(stopped.map(|s| s.index), Some(1));
    // "abc" never completes, "ab" did: same answer whatever comes next.
    let (out, _, stopped) = run(&["abc", "ab"], false, &["xa", "bd"]);
    assert_eq!(out.concat(), "x");
    assert_eq!(stopped.map(|s| s.index), Some(1));
    // "bc" completes inside "abcd" before "abcd" does.
    let (out, _, stopped) = run(&["abcd", "bc"], false, &["xabcd"]);
    assert_eq!(out.concat(), "xa");
    assert_eq!(stopped.map(|s| s.index), Some(1));
    // Both complete at the same offset: the longer one ("lazy dog") wins.
    let (out, _, stopped) = run(&["dog", "lazy dog"], false, &["the lazy", " dog barks"]);
    assert_eq!(out.concat(), "the ");
    assert_eq!(stopped.map(|s| s.index), Some(1));
    // Duplicates: the first listed.
    let (_, _, stopped) = run(&["x", "x"], true, &["ax"]);
    assert_eq!(stopped.map(|s| s.index), Some(0));
}

#[test]
fn multibyte_stop_strings_and_text() {
    let (out, tail, stopped) = run(&["🦀!"], false, &["日本", "🦀", "x🦀", "!", "z"]);
    assert_eq!(out, ["日本", "", "🦀x", "", ""]);
    assert_eq!(tail, "");
    assert!(stopped.is_some());
}

#[test]
fn without_stop_strings_everything_passes_through() {
    let (out, tail, stopped) = run(&[], false, &["a", "", "bc"]);
    assert_eq!(out, ["a", "", "bc"]);
    assert_eq!((tail.as_str(), stopped), ("", None));
}

/// Text over a small alphabet (so stop strings overlap and repeat), cut at random points.
fn text_chunks_and_stops() -> impl Strategy<Value = (String, Vec<usize>, Vec<String>, bool)> {
    let alphabet = prop::sample::select(vec!["a", "b", "c", "é", "🦀"]);
    let word = |max| prop::collection::vec(alphabet.clone(), 1..max).prop_map(|v| v.concat());
    (
        word(40),
        prop::collection::vec(0usize..200, 0..12),
        prop::collection::vec(word(5), 0..5),
        any::<bool>(),
    )
        .prop_map(|(text, cuts, stops, include)| (text, cuts, stops, include))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn any_chunking_gives_the_non_streamed_text((text, cuts, list, include) in text_chunks_and_stops()) {
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (text.len() + 1)).filter(|&c| text.is_char_boundary(c)).collect();
        cuts.extend([0, text.len()]);
        cuts.sort_unstable();
        let chunks: Vec<&str> = cuts.windows(2).map(|w| &text[w[0]..w[1]]).collect();
        let list: Vec<&str> = list.iter().map(String::as_str).collect();
        let (out, tail, stopped) = run(&list, include, &chunks);
        let (expected, index) = reference(&text, &list, include);
        prop_assert_eq!(out.concat() + &tail, expected);
        prop_assert_eq!(stopped.map(|s| s.index), index);
    }
}
