//! An abort storm over real HTTP: 200 streaming requests, 32 at a time, half of them cut off
//! by the client at random points (before the response, or after a random number of chunks).
//! Afterwards `/metrics` shows nothing running or waiting and no KV block in use, the
//! requests that were not cut got exactly the text of an undisturbed run, and the server
//! still answers correctly; with and without overlapped steps.

mod server_common;

use std::collections::HashMap;
use std::io::BufReader;
use std::net::{Shutdown, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use server_common::*;

const REQUESTS: usize = 200;
const CONCURRENCY: usize = 32;
const MAX_TOKENS: u64 = 160;

fn body(stream: bool) -> Value {
    json!({"prompt": "storm", "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": true,
           "stream": stream})
}

/// xorshift64*: a fixed, reproducible sequence of cut points.
fn random(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

/// What one client does: `None` reads the whole stream and returns its text; `Some(k)`
/// hangs up after `k` chunks (0: before reading the response head).
fn client(addr: SocketAddr, cut: Option<usize>) -> Option<String> {
    let socket = send(
        addr,
        "POST",
        "/v1/completions",
        &[],
        &body(true).to_string(),
    );
    let mut r = BufReader::new(socket.try_clone().expect("clone"));
    if cut == Some(0) {
        socket.shutdown(Shutdown::Both).expect("hang up");
        return None;
    }
    let (status, _) = read_head(&mut r);
    assert_eq!(status, 200);
    let mut data = Vec::new();
    let mut chunks = 0;
    while let Some(c) = read_chunk(&mut r) {
        data.extend(c);
        chunks += 1;
        if Some(chunks) == cut {
            socket.shutdown(Shutdown::Both).expect("hang up");
            return None;
        }
    }
    let reply = Reply {
        status,
        headers: Vec::new(),
        body: String::from_utf8(data).expect("UTF-8"),
    };
    Some(stream_text(&reply.sse_data(), 0).0)
}

/// `/metrics` as `series -> value`.
fn metrics(addr: SocketAddr) -> HashMap<String, f64> {
    let r = get(addr, "/metrics");
    assert_eq!(r.status, 200, "{}", r.body);
    r.body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(k, v)| (k.to_string(), v.parse().expect("numeric")))
        .collect()
}

#[test]
fn two_hundred_streams_half_cut_leave_nothing_behind() {
    let m = storm(start_server(&fixture_path(), |_| {}));
    assert_eq!(
        m["tandem:engine_steps_planned_ahead_total{model_name=\"test-model\"}"],
        0.0
    );
}

/// The same storm with overlapped steps: every cut lands while a step is launched.
#[test]
fn two_hundred_streams_half_cut_with_overlapped_steps_leave_nothing_behind() {
    let m = storm(start_overlapped_server(&fixture_path()));
    let l = "{model_name=\"test-model\"}";
    let (ahead, steps) = (
        m[&format!("tandem:engine_steps_planned_ahead_total{l}")],
        m[&format!("tandem:engine_steps_total{l}")],
    );
    assert!(
        2.0 * ahead > steps,
        "{ahead} of {steps} steps planned ahead"
    );
}

/// Runs the storm; returns the metrics once settled.
fn storm(server: tandem_server::RunningServer) -> HashMap<String, f64> {
    let addr = server.addr();
    let reference = post(addr, "/v1/completions", &body(false)).json()["choices"][0]["text"]
        .as_str()
        .expect("text")
        .to_string();

    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let plan: Vec<Option<usize>> = (0..REQUESTS)
        .map(|i| {
            let r = random(&mut seed);
            (i % 2 == 1).then_some((r % 40) as usize)
        })
        .collect();
    let plan = Arc::new(plan);
    let next = Arc::new(AtomicUsize::new(0));
    let texts = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (plan, next, texts) = (plan.clone(), next.clone(), texts.clone());
            std::thread::spawn(move || loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(&cut) = plan.get(i) else { break };
                if let Some(text) = client(addr, cut) {
                    texts.lock().expect("lock").push(text);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("client thread");
    }
    let texts = texts.lock().expect("lock");
    assert_eq!(texts.len(), REQUESTS / 2);
    assert!(
        texts.iter().all(|t| *t == reference),
        "an uncut stream differs"
    );

    let l = "model_name=\"test-model\"";
    let start = Instant::now();
    let m = loop {
        let m = metrics(addr);
        let settled = [
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "tandem:kv_blocks_in_use",
        ]
        .iter()
        .all(|g| m[&format!("{g}{{{l}}}")] == 0.0);
        if settled {
            break m;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "never settled: {m:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(m[&format!("vllm:kv_cache_usage_perc{{{l}}}")], 0.0);
    let reason = |r: &str| m[&format!("vllm:request_success_total{{{l},finished_reason=\"{r}\"}}")];
    assert_eq!(reason("error"), 0.0);
    // The reference and the uncut streams ran to their length.
    assert!(reason("length") >= 1.0 + (REQUESTS / 2) as f64, "{m:?}");
    assert!(reason("length") + reason("abort") + reason("stop") <= 1.0 + REQUESTS as f64);
    let h = wait_health(addr, Duration::from_secs(10), idle);
    assert!(h["disconnects"].as_u64().expect("count") >= 1, "{h}");

    let after = post(addr, "/v1/completions", &body(false)).json();
    assert_eq!(after["choices"][0]["text"], reference.as_str());
    server.shutdown().expect("clean shutdown");
    m
}
