//! The server on Gemma 3 270M (`gemma3-270m`, fetched on first use like the CLI does), checked
//! with the official `openai` Python client (tests/py/test_gemma3_chat.py; the pinned release,
//! installed on first use into the target directory): chat completions render Gemma's turn
//! format (its tokens equal those of the format written out by hand, and so do the
//! completions), the reply ends at <end_of_turn> with `finish_reason` stop and no marker in
//! the text (the pretrained 270M never ends a turn by itself: a logit bias and `min_tokens`
//! put <end_of_turn> after the first greedy tokens), streamed deltas concatenate to the
//! greedy text, a `stop` string cuts it, and logprobs come with the greedy token as the most
//! likely one. The server runs in-process (as `tandem serve` builds it) on a free loopback
//! port.

mod server_common;

use std::time::Duration;

use server_common::*;

#[test]
fn gemma3_chat_template_stop_token_streaming_and_logprobs() {
    let path = tandem_model::default_model::known_model_path("gemma3-270m")
        .expect("the Gemma 3 270M model is needed; this test does not skip");
    let server = start_server(&path, |_| {});
    let out = python_env::run_script(server.addr(), "test_gemma3_chat.py", "test-model", &[]);
    eprintln!("{out}");
    wait_health(server.addr(), Duration::from_secs(30), idle);
    server.shutdown().expect("clean shutdown");
}
