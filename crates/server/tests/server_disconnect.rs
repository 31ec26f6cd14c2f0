//! Disconnects and shutdown with the default model (slow enough that a long request is
//! still running when the client goes away). Needs `TANDEM_TEST_MODEL`.

mod server_common;

use std::io::BufReader;
use std::net::Shutdown;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use server_common::*;

const LONG: u64 = 400;

fn long_request(stream: bool) -> String {
    json!({"prompt": "Write a very long story about a dragon.", "max_tokens": LONG,
           "temperature": 0, "ignore_eos": true, "stream": stream})
    .to_string()
}

#[test]
fn dropped_clients_abort_their_requests_and_free_the_pool() {
    let server = start_server(&default_model_path(), |_| {});
    let addr = server.addr();
    let before = get(addr, "/health").json();
    assert!(idle(&before), "{before}");

    // Streaming: read the head and two chunks, then hang up.
    let socket = send(addr, "POST", "/v1/completions", &[], &long_request(true));
    let mut r = BufReader::new(socket.try_clone().expect("clone"));
    let (status, _) = read_head(&mut r);
    assert_eq!(status, 200);
    for _ in 0..2 {
        read_chunk(&mut r).expect("a chunk before the end");
    }
    let busy = get(addr, "/health").json();
    assert_eq!(busy["in_flight"], 1, "{busy}");
    socket.shutdown(Shutdown::Both).expect("hang up");
    drop(r);
    let t = Instant::now();
    let h = wait_health(addr, Duration::from_secs(20), |h| {
        idle(h) && h["disconnects"] == 1
    });
    eprintln!("streaming disconnect noticed after {:?}: {h}", t.elapsed());

    // Non-streaming: hang up while the request runs.
    let socket = send(addr, "POST", "/v1/completions", &[], &long_request(false));
    wait_health(addr, Duration::from_secs(20), |h| h["running"] == 1);
    socket.shutdown(Shutdown::Both).expect("hang up");
    drop(socket);
    wait_health(addr, Duration::from_secs(20), |h| {
        idle(h) && h["disconnects"] == 2
    });

    // Two parallel samples sharing their prompt's blocks.
    let mut b: serde_json::Value = serde_json::from_str(&long_request(true)).expect("json");
    b["n"] = json!(2);
    let socket = send(addr, "POST", "/v1/completions", &[], &b.to_string());
    wait_health(addr, Duration::from_secs(20), |h| h["in_flight"] == 2);
    socket.shutdown(Shutdown::Both).expect("hang up");
    drop(socket);
    wait_health(addr, Duration::from_secs(20), |h| {
        idle(h) && h["disconnects"] == 4
    });

    // The server still serves.
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 3}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    // The snapshot is published right after the step that finished the request.
    wait_health(addr, Duration::from_secs(5), |h| {
        idle(h) && h["disconnects"] == 4
    });
    server.shutdown().expect("clean shutdown");
}

#[test]
fn chat_stream_equals_non_stream_with_the_real_template() {
    let server = start_server(&default_model_path(), |_| {});
    let addr = server.addr();
    let body = json!({"messages": [{"role": "user", "content": "What is the capital of France?"}],
                      "max_tokens": 24, "temperature": 0});
    let v = post(addr, "/v1/chat/completions", &body).json();
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_string();
    assert!(!text.is_empty());
    assert!(
        !text.contains("<|im_end|>") && !text.contains('\u{FFFD}'),
        "{text:?}"
    );
    let mut b = body.clone();
    b["stream"] = json!(true);
    let frames = post(addr, "/v1/chat/completions", &b).sse_data();
    let (streamed, finish) = stream_text(&frames, 0);
    assert_eq!(streamed, text);
    assert_eq!(
        finish,
        vec![v["choices"][0]["finish_reason"].as_str().expect("reason")]
    );
    server.shutdown().expect("clean shutdown");
}

#[test]
fn shutdown_aborts_in_flight_streams_and_returns() {
    let server = start_server(&default_model_path(), |_| {});
    let addr = server.addr();
    let socket = send(addr, "POST", "/v1/completions", &[], &long_request(true));
    let mut r = BufReader::new(socket);
    let (status, _) = read_head(&mut r);
    assert_eq!(status, 200);
    read_chunk(&mut r).expect("first chunk");
    let t = Instant::now();
    let stopper = std::thread::spawn(move || server.shutdown());
    let mut rest = String::new();
    while let Some(c) = read_chunk(&mut r) {
        rest.push_str(&String::from_utf8_lossy(&c));
    }
    stopper.join().expect("no panic").expect("clean shutdown");
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "shutdown took {:?}",
        t.elapsed()
    );
    assert!(rest.ends_with("data: [DONE]\n\n"), "{rest:?}");
    let finish: Vec<Value> = rest
        .split_terminator("\n\n")
        .filter_map(|f| serde_json::from_str::<Value>(f.trim_start_matches("data: ")).ok())
        .map(|v| v["choices"][0]["finish_reason"].clone())
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finish, vec![json!("abort")]);
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "still accepting after shutdown"
    );
}
