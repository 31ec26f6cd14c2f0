//! Connection limits over real sockets (ARCHITECTURE.md § Connections and drain): slow
//! headers, idle keep-alive, slow bodies and clients that stop reading are cut within their
//! timeouts; 413 comes before
//! `100 Continue`; over `max_connections` requests get 503 while `/health` still answers;
//! unknown routes answer 404 only with the API key; `/metrics` follows vLLM's key rule.

mod server_common;

use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use server_common::*;
use tandem_server::connections::ConnectionLimits;
use tandem_server::RunningServer;

const SHORT: Duration = Duration::from_millis(400);

fn server(max_connections: usize) -> RunningServer {
    start_server(&fixture_path(), |c| {
        c.connections = ConnectionLimits {
            header_timeout: SHORT,
            body_timeout: SHORT,
            write_timeout: SHORT,
            max_connections,
        };
        c.limits.max_body_bytes = 1000;
    })
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s
}

/// Reads until the server closes; returns what came and how long it took.
fn read_until_closed(s: &mut TcpStream) -> (String, Duration) {
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    (String::from_utf8_lossy(&got).into_owned(), start.elapsed())
}

#[test]
fn a_slow_header_client_is_closed_within_the_header_timeout() {
    let server = server(64);
    let mut s = connect(server.addr());
    s.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        .expect("write");
    let (_, took) = read_until_closed(&mut s);
    assert!(took < SHORT * 4, "closed after {took:?}");
}

#[test]
fn an_idle_keep_alive_connection_is_closed_within_the_header_timeout() {
    let server = server(64);
    let mut s = connect(server.addr());
    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("write");
    let mut r = BufReader::new(s.try_clone().expect("clone"));
    let (status, headers) = read_head(&mut r);
    assert_eq!(status, 200);
    let len: usize = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .expect("content-length");
    let mut body = vec![0; len];
    r.read_exact(&mut body).expect("body");
    // The connection stays open for another request, then is closed while idle.
    let start = Instant::now();
    let mut rest = Vec::new();
    let n = r.read_to_end(&mut rest).unwrap_or(0);
    assert_eq!(n, 0, "nothing more is sent");
    let took = start.elapsed();
    assert!(
        took >= SHORT / 2 && took < SHORT * 4,
        "closed after {took:?}"
    );
}

#[test]
fn a_slow_body_gets_408_and_the_connection_closes_within_the_body_timeout() {
    let server = server(64);
    let mut s = connect(server.addr());
    s.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro")
        .expect("write");
    let (reply, took) = read_until_closed(&mut s);
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(reply.contains("\"error\""), "{reply}");
    assert!(took < SHORT * 4, "closed after {took:?}");
}

#[test]
fn an_oversized_content_length_gets_413_before_100_continue() {
    let server = server(64);
    let mut s = connect(server.addr());
    s.write_all(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5000\r\n\r\n",
    )
    .expect("write");
    let (reply, _) = read_until_closed(&mut s);
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    assert!(!reply.contains("100 Continue"), "{reply}");
    assert!(reply.contains("\"error\""), "{reply}");
    // Within the limit, 100 Continue comes and the request goes through.
    let mut s = connect(server.addr());
    let body = br#"{"prompt": [5, 6], "max_tokens": 1}"#;
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).expect("write");
    let mut first = [0u8; 25];
    s.read_exact(&mut first).expect("100 Continue");
    assert!(first.starts_with(b"HTTP/1.1 100 Continue"));
    s.write_all(body).expect("body");
    let (reply, _) = read_until_closed(&mut s);
    assert!(reply.contains("HTTP/1.1 200"), "{reply}");
}

#[test]
fn over_max_connections_requests_get_503_while_health_answers() {
    // 4 slots, 64 idle clients: 60 of them overflow, yet /health answers every time.
    let server = start_server(&fixture_path(), |c| {
        c.connections.max_connections = 4;
        c.connections.header_timeout = Duration::from_secs(30);
    });
    let addr = server.addr();
    let idle: Vec<TcpStream> = (0..64).map(|_| connect(addr)).collect();
    std::thread::sleep(Duration::from_millis(100));
    for _ in 0..20 {
        let h = get(addr, "/health");
        assert_eq!(h.status, 200, "{}", h.body);
    }
    let r = post(addr, "/v1/completions", &serde_json::json!({"prompt": [5]}));
    assert_error(&r, 503, None);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert!(r.json()["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("--max-connections")));
    // Once the idle clients go, their slots are free again.
    drop(idle);
    let start = Instant::now();
    loop {
        let r = post(
            addr,
            "/v1/completions",
            &serde_json::json!({"prompt": [5], "max_tokens": 1}),
        );
        if r.status == 200 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "{}", r.body);
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn unknown_routes_answer_404_only_with_the_key_and_metrics_are_open_by_default() {
    let server = start_server(&fixture_path(), |c| c.api_key = Some("k3y".into()));
    let addr = server.addr();
    let key = [("authorization", "Bearer k3y")];
    assert_error(&get(addr, "/nope"), 401, None);
    assert_error(&request(addr, "DELETE", "/v1/models", &[], ""), 401, None);
    assert_error(&request(addr, "GET", "/nope", &key, ""), 404, None);
    assert_eq!(get(addr, "/health").status, 200);
    assert_eq!(get(addr, "/metrics").status, 200);
    let strict = start_server(&fixture_path(), |c| {
        c.api_key = Some("k3y".into());
        c.metrics_require_key = true;
    });
    assert_error(&get(strict.addr(), "/metrics"), 401, None);
    assert_eq!(
        request(strict.addr(), "GET", "/metrics", &key, "").status,
        200
    );
}

#[test]
fn content_length_with_transfer_encoding_is_framed_by_the_chunks_and_the_connection_closes() {
    let server = server(64);
    let mut s = connect(server.addr());
    let body = r#"{"prompt": [5], "max_tokens": 1}"#;
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n",
        body.len()
    );
    s.write_all(req.as_bytes()).expect("write");
    let (reply, _) = read_until_closed(&mut s);
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    // The connection closes after the response: the request behind it is never read.
    assert_eq!(reply.matches("HTTP/1.1").count(), 1, "{reply}");
}

#[test]
fn a_response_longer_than_the_header_timeout_is_not_cut() {
    let server = start_server(&default_model_path(), |c| {
        c.connections.header_timeout = Duration::from_millis(100);
    });
    let body = serde_json::json!({"prompt": [5, 6, 7], "max_tokens": 250, "temperature": 0,
                                  "ignore_eos": true, "stream": true});
    let start = Instant::now();
    let r = post(server.addr(), "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let (_, finish) = stream_text(&r.sse_data(), 0);
    assert_eq!(finish, vec!["length".to_string()]);
    // Meaningful only when the response outlasted the timeout (on the default model it does).
    assert!(start.elapsed() > Duration::from_millis(100));
}

/// A client that stops reading is cut off after the write timeout: with room for one
/// connection, its slot is free again (the next request is served, not refused as
/// overflow), and the engine goes idle.
#[test]
fn a_client_that_stops_reading_is_closed_after_the_write_timeout() {
    // A long header timeout: only the write timeout may free the slot.
    let server = start_server(&fixture_path(), |c| {
        c.connections = ConnectionLimits {
            header_timeout: Duration::from_secs(60),
            body_timeout: SHORT,
            write_timeout: SHORT,
            max_connections: 1,
        };
    });
    let addr = server.addr();
    // A small receive buffer (set before connecting) and 8 pipelined requests for 16
    // streams of 240 tokens with 20 alternatives each (about 2 MB apiece): more than the
    // socket buffers hold, so the server's writes block.
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    socket.connect(&addr.into()).expect("connect");
    let mut stalled: TcpStream = socket.into();
    let body = serde_json::json!({"prompt": "hi", "max_tokens": 240, "n": 16, "logprobs": 20,
                                  "ignore_eos": true, "stream": true})
    .to_string();
    let request = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stalled
        .write_all(request.repeat(8).as_bytes())
        .expect("write");
    // Read nothing; once the write timeout has cut it, the one slot serves a new client.
    let start = Instant::now();
    loop {
        let one = serde_json::json!({"prompt": "hi", "max_tokens": 1});
        let r = post(addr, "/v1/completions", &one);
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 503, "{}", r.body);
        let waited = start.elapsed();
        assert!(
            waited < Duration::from_secs(30),
            "the stalled client kept its slot"
        );
        std::thread::sleep(SHORT / 4);
    }
    wait_health(addr, Duration::from_secs(10), idle);
    // The stalled client finds its connection closed, its last response cut short.
    let (got, _) = read_until_closed(&mut stalled);
    assert!(
        got.matches("[DONE]").count() < 8,
        "every response was written"
    );
}
