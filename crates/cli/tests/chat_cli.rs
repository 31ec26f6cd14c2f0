//! `tandem chat` end to end on the default model: a beam-search answer is printed (beam
//! search streams nothing), and several samples per turn are refused naming the flag.
#![allow(clippy::unwrap_used)] // helpers outside #[test] functions

use std::io::Write;
use std::process::{Command, Output, Stdio};

fn chat(args: &[&str], input: &str) -> Output {
    let model = tandem_model::default_model::test_model_path()
        .expect("the default model is needed; this test does not skip")
        .display()
        .to_string();
    let mut all = vec!["chat", "--model", &model, "--kv-cache-memory", "256MiB"];
    all.extend_from_slice(args);
    let mut child = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(&all)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tandem chat");
    // A chat that refuses its arguments may exit before reading its input: writing it then
    // fails with a broken pipe, and the exit status and stderr tell the rest.
    if let Err(e) = child.stdin.take().unwrap().write_all(input.as_bytes()) {
        assert_eq!(
            e.kind(),
            std::io::ErrorKind::BrokenPipe,
            "writing the chat input: {e}"
        );
    }
    child.wait_with_output().unwrap()
}

#[test]
fn a_beam_search_answer_is_printed_and_several_samples_are_refused() {
    let greedy = chat(
        &["--temperature", "0", "--max-tokens", "8"],
        "Name a fruit.\n",
    );
    let beam = chat(
        &["--beam-width", "1", "--max-tokens", "8"],
        "Name a fruit.\n",
    );
    assert!(greedy.status.success() && beam.status.success());
    let (greedy, beam) = (
        String::from_utf8(greedy.stdout).unwrap(),
        String::from_utf8(beam.stdout).unwrap(),
    );
    // A beam of width 1 is greedy decoding: the same answer, printed once.
    let answer = greedy.strip_prefix("> ").unwrap().lines().next().unwrap();
    assert!(!answer.trim().is_empty(), "{greedy:?}");
    assert_eq!(beam, greedy);
    let out = chat(&["--n", "2"], "Hi\n");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--n 2") && !err.contains("panicked"), "{err}");
}
