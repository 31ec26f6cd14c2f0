//! Overload over real HTTP: a full waiting queue answers 429 with `Retry-After` and an
//! OpenAI error body (never a 5xx), admitted requests still complete, and service is normal
//! right after.

mod server_common;

use std::io::BufReader;
use std::net::Shutdown;
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use serde_json::{json, Value};
use server_common::*;

fn greedy(prompt: &str, max_tokens: u64) -> Value {
    json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true})
}

fn text(r: &Reply) -> String {
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["choices"][0]["text"]
        .as_str()
        .expect("text")
        .to_string()
}

fn assert_queue_full(r: &Reply) {
    assert_error(r, 429, None);
    assert_eq!(r.json()["error"]["code"], "queue_full", "{}", r.body);
    let retry: u64 = r
        .header("retry-after")
        .unwrap_or_else(|| panic!("429 without Retry-After: {:?}", r.headers))
        .parse()
        .expect("Retry-After in seconds");
    assert!(retry >= 1);
}

/// One request running (`max_num_seqs` 1) and a queue of 3: of 8 more requests sent at
/// once exactly 3 wait and 5 get 429; the 3 complete once the runner goes away.
#[test]
fn a_full_queue_answers_429_and_the_admitted_requests_complete() {
    let server = start_server_with(
        &default_model_path(),
        |s| s.max_num_seqs = 1,
        |c| c.limits.max_waiting_requests = 3,
    );
    let addr = server.addr();
    let reference = text(&post(addr, "/v1/completions", &greedy("The sky is", 6)));

    // The runner: a long streamed request, hung up on later.
    let long = json!({"prompt": "Tell a long story.", "max_tokens": 400, "temperature": 0,
                      "ignore_eos": true, "stream": true});
    let socket = send(addr, "POST", "/v1/completions", &[], &long.to_string());
    let mut r = BufReader::new(socket.try_clone().expect("clone"));
    assert_eq!(read_head(&mut r).0, 200);
    read_chunk(&mut r).expect("a first chunk");

    let (tx, rx) = mpsc::channel();
    let barrier = Arc::new(Barrier::new(8));
    for _ in 0..8 {
        let (tx, barrier) = (tx.clone(), barrier.clone());
        std::thread::spawn(move || {
            barrier.wait();
            let _ = tx.send(post(addr, "/v1/completions", &greedy("The sky is", 6)));
        });
    }
    let timeout = Duration::from_secs(60);
    for _ in 0..5 {
        let reply = rx.recv_timeout(timeout).expect("a quick refusal");
        assert_queue_full(&reply);
    }
    // (The snapshot /health reads is refreshed after the engine's current step.)
    wait_health(addr, timeout, |h| h["running"] == 1 && h["waiting"] == 3);
    assert!(
        rx.try_recv().is_err(),
        "the queued requests wait for the runner"
    );

    socket.shutdown(Shutdown::Both).expect("hang up");
    drop(r);
    for _ in 0..3 {
        let reply = rx.recv_timeout(timeout).expect("an admitted request ends");
        assert_eq!(text(&reply), reference);
    }
    wait_health(addr, timeout, idle);
    assert_eq!(
        text(&post(addr, "/v1/completions", &greedy("The sky is", 6))),
        reference
    );
    server.shutdown().expect("clean shutdown");
}

/// A burst of many more concurrent requests than the engine runs and queues: every answer
/// is a 200 or a 429 with Retry-After, nothing leaks, and the next request is answered as
/// before the burst.
#[test]
fn a_burst_gets_only_200_or_429_and_service_is_normal_after() {
    let server = start_server_with(
        &fixture_path(),
        |s| s.max_num_seqs = 2,
        |c| c.limits.max_waiting_requests = 2,
    );
    let addr = server.addr();
    let reference = text(&post(addr, "/v1/completions", &greedy("abc", 8)));
    const CLIENTS: usize = 48;
    let barrier = Arc::new(Barrier::new(CLIENTS));
    let handles: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let mut body = greedy("a longer prompt", 120);
                body["stream"] = json!(i % 2 == 0);
                barrier.wait();
                post(addr, "/v1/completions", &body)
            })
        })
        .collect();
    let mut counts = [0usize; 2];
    for h in handles {
        let r = h.join().expect("client thread");
        match r.status {
            200 => counts[0] += 1,
            429 => {
                assert_queue_full(&r);
                counts[1] += 1;
            }
            other => panic!("status {other}: {}", r.body),
        }
    }
    eprintln!("200: {}, 429: {}", counts[0], counts[1]);
    // The first two to arrive always find room in the queue.
    assert!(counts[0] >= 2, "{counts:?}");
    wait_health(addr, Duration::from_secs(30), idle);
    assert_eq!(
        text(&post(addr, "/v1/completions", &greedy("abc", 8))),
        reference
    );
    server.shutdown().expect("clean shutdown");
}
