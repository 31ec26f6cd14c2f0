//! The graceful drain (ARCHITECTURE.md § Connections and drain): on SIGTERM, streams in flight
//! finish normally, `/health` turns 503, new requests get 503, and the server ends cleanly;
//! past `shutdown_timeout` what still runs is aborted. On the default model, whose streams last
//! long enough for the drain to be seen.

mod server_common;

use std::io::BufReader;
use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::json;
use server_common::*;

/// A long greedy stream: its reply's finish reasons and the time it ended.
fn stream(addr: SocketAddr, max_tokens: usize, started: mpsc::Sender<()>) -> Vec<String> {
    let body = json!({"prompt": [5, 6, 7], "max_tokens": max_tokens, "temperature": 0,
                      "ignore_eos": true, "stream": true});
    let socket = send(addr, "POST", "/v1/completions", &[], &body.to_string());
    let mut r = BufReader::new(socket);
    assert_eq!(read_head(&mut r).0, 200);
    let mut data = Vec::new();
    let first = read_chunk(&mut r).expect("a first chunk");
    data.extend(first);
    let _ = started.send(());
    while let Some(c) = read_chunk(&mut r) {
        data.extend(c);
    }
    let reply = Reply {
        status: 200,
        headers: Vec::new(),
        body: String::from_utf8(data).expect("UTF-8"),
    };
    stream_text(&reply.sse_data(), 0).1
}

fn start_streams(
    addr: SocketAddr,
    n: usize,
    max_tokens: usize,
) -> Vec<std::thread::JoinHandle<Vec<String>>> {
    let (tx, rx) = mpsc::channel();
    let streams: Vec<_> = (0..n)
        .map(|_| {
            let tx = tx.clone();
            std::thread::spawn(move || stream(addr, max_tokens, tx))
        })
        .collect();
    for _ in 0..n {
        rx.recv_timeout(Duration::from_secs(60))
            .expect("every stream starts");
    }
    streams
}

#[test]
fn sigterm_lets_8_streams_finish_refuses_new_requests_and_ends_cleanly() {
    let (engine, tokenizer, template) = engine(load(&default_model_path()), 1024);
    let mut config = tandem_server::ServerConfig::new("test-model");
    config.addr = SocketAddr::from(([127, 0, 0, 1], 0));
    let server =
        tandem_server::start_with_signals(engine, tokenizer, template, config).expect("starts");
    let addr = server.addr();
    let streams = start_streams(addr, 8, 200);
    let term = std::process::Command::new("kill")
        .args(["-TERM", &std::process::id().to_string()])
        .status()
        .expect("kill runs");
    assert!(term.success());
    let start = Instant::now();
    loop {
        let h = get(addr, "/health");
        if h.status == 503 {
            assert_eq!(h.json()["status"], "draining");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "health stays {}",
            h.status
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let refused = post(
        addr,
        "/v1/completions",
        &json!({"prompt": [5], "max_tokens": 1}),
    );
    assert_error(&refused, 503, None);
    assert_eq!(refused.header("retry-after"), Some("1"));
    for s in streams {
        assert_eq!(s.join().expect("stream thread"), vec!["length".to_string()]);
    }
    server.wait().expect("a clean end");
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "the socket is closed"
    );
}

#[test]
fn past_the_shutdown_timeout_running_requests_are_aborted() {
    let server = start_server(&default_model_path(), |c| {
        c.shutdown_timeout = Duration::from_millis(100);
    });
    let addr = server.addr();
    let streams = start_streams(addr, 2, 1500);
    let start = Instant::now();
    server.drain();
    for s in streams {
        assert_eq!(s.join().expect("stream thread"), vec!["abort".to_string()]);
    }
    server.wait().expect("a clean end");
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_second_stop_during_a_drain_ends_it_at_once() {
    let server = start_server(&default_model_path(), |c| {
        c.shutdown_timeout = Duration::from_secs(600);
    });
    let addr = server.addr();
    let streams = start_streams(addr, 2, 1500);
    server.drain();
    assert_eq!(get(addr, "/health").status, 503);
    let start = Instant::now();
    // What a second SIGTERM sends.
    server.shutdown().expect("a clean end");
    for s in streams {
        assert_eq!(s.join().expect("stream thread"), vec!["abort".to_string()]);
    }
    assert!(start.elapsed() < Duration::from_secs(10));
}
