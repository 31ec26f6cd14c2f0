//! The operator's log (README.md § Logs), captured in-process as JSON lines: one access line
//! per request with its fields, and the periodic engine line while the engine is busy.

mod server_common;

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use server_common::*;
use tandem_server::logging::{init_with_writer, LogFormat};

/// Everything logged in this test binary.
fn log() -> Arc<Mutex<Vec<u8>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = buf.clone();
        init_with_writer(LogFormat::Json, "debug", move || Sink(sink.clone()))
            .expect("the logger installs");
        buf
    })
    .clone()
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log lock").extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The JSON lines logged so far that `keep` accepts.
fn lines(keep: impl Fn(&Value) -> bool) -> Vec<Value> {
    let buf = log().lock().expect("log lock").clone();
    String::from_utf8(buf)
        .expect("UTF-8 log")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .filter(|v| keep(v))
        .collect()
}

/// The access lines of request `id`, once at least one was written (or after 5 s).
fn access_lines(id: &str) -> Vec<Value> {
    let of = |v: &Value| v["target"] == "tandem::access" && v["fields"]["request_id"] == id;
    let start = Instant::now();
    while lines(of).is_empty() && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    // A second line would come at once; give it the chance.
    std::thread::sleep(Duration::from_millis(50));
    lines(of)
}

fn with_id(addr: std::net::SocketAddr, id: &str, body: &Value) -> Reply {
    request(
        addr,
        "POST",
        "/v1/completions",
        &[("x-request-id", id)],
        &body.to_string(),
    )
}

#[test]
fn each_request_writes_exactly_one_access_line_with_its_fields() {
    log();
    let server = start_server(&fixture_path(), |_| {});
    let addr = server.addr();
    let plain = json!({"prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0, "ignore_eos": true});
    assert_eq!(with_id(addr, "acc-plain", &plain).status, 200);
    let mut streamed = plain.clone();
    streamed["stream"] = json!(true);
    streamed["n"] = json!(2);
    assert_eq!(with_id(addr, "acc-stream", &streamed).status, 200);
    let bad = json!({"prompt": [5], "max_tokens": -1});
    assert_eq!(with_id(addr, "acc-bad", &bad).status, 400);

    let l = access_lines("acc-plain");
    assert_eq!(l.len(), 1, "{l:?}");
    let f = &l[0]["fields"];
    assert_eq!(l[0]["level"], "INFO");
    assert_eq!(f["message"], "request");
    assert_eq!(f["method"], "POST");
    assert_eq!(f["route"], "/v1/completions");
    assert_eq!(f["status"], 200);
    assert_eq!(f["prompt_tokens"], 3);
    assert_eq!(f["output_tokens"], 4);
    assert_eq!(f["cached_tokens"], 0);
    assert_eq!(f["finish_reason"], "length");
    let (ttft, total) = (f["ttft_ms"].as_f64(), f["total_ms"].as_f64());
    assert!(ttft.is_some_and(|t| t >= 0.0) && total >= ttft, "{f}");

    let l = access_lines("acc-stream");
    assert_eq!(l.len(), 1, "{l:?}");
    let f = &l[0]["fields"];
    assert_eq!(f["status"], 200);
    assert_eq!(f["output_tokens"], 8);
    assert_eq!(f["finish_reason"], "length,length");
    assert!(f["cached_tokens"].is_u64(), "{f}");

    let l = access_lines("acc-bad");
    assert_eq!(l.len(), 1, "{l:?}");
    let f = &l[0]["fields"];
    assert_eq!(f["status"], 400);
    assert!(
        f.get("finish_reason").is_none() && f.get("ttft_ms").is_none(),
        "{f}"
    );
}

#[test]
fn the_engine_line_reports_throughput_while_busy() {
    log();
    let server = start_server(&fixture_path(), |c| {
        c.engine_log_interval = Some(Duration::from_millis(20));
    });
    let body =
        json!({"prompt": [5, 6, 7], "max_tokens": 200, "temperature": 0, "ignore_eos": true});
    assert_eq!(post(server.addr(), "/v1/completions", &body).status, 200);
    // The line covering the tail comes at the engine thread's next turn (within 0.5 s).
    let busy_line = |v: &Value| {
        v["target"] == "tandem::engine"
            && v["fields"]["generation_tokens_per_s"]
                .as_f64()
                .is_some_and(|t| t > 0.0)
    };
    let start = Instant::now();
    while lines(busy_line).is_empty() && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let engine = lines(busy_line);
    assert!(
        !engine.is_empty(),
        "no engine line with generation throughput"
    );
    let busy = &engine[0]["fields"];
    for key in ["prompt_tokens_per_s", "running", "waiting", "kv_usage_pct"] {
        assert!(busy.get(key).is_some(), "{key} missing: {busy}");
    }
}
