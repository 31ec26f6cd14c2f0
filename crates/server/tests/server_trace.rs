//! `POST /debug/trace`: the engine's step timeline over HTTP, behind the API key, written to
//! the trace file too, and at exit; a 404 when the server records none.

mod server_common;

use serde_json::{json, Value};
use server_common::*;

fn traced_server(file: Option<std::path::PathBuf>, trace: bool) -> tandem_server::RunningServer {
    let (mut engine, tokenizer, template) = engine(load(&fixture_path()), 64);
    if trace {
        engine.enable_trace(1000);
    }
    let mut config = tandem_server::ServerConfig::new("test-model");
    config.addr = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    config.api_key = Some("k".into());
    config.trace_file = file;
    tandem_server::start(engine, tokenizer, template, config).expect("server starts")
}

#[test]
fn the_trace_comes_back_behind_the_key_and_is_written_at_exit() {
    let file = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("server_trace.json");
    let _ = std::fs::remove_file(&file);
    let server = traced_server(Some(file.clone()), true);
    let addr = server.addr();
    let auth = ("authorization", "Bearer k");
    let body = json!({"prompt": "hello there", "max_tokens": 3, "temperature": 0}).to_string();
    let r = request(addr, "POST", "/v1/completions", &[auth], &body);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(request(addr, "POST", "/debug/trace", &[], "").status, 401);
    let r = request(addr, "POST", "/debug/trace", &[auth], "");
    assert_eq!(r.status, 200, "{}", r.body);
    let trace = r.json();
    let events = trace["traceEvents"]
        .as_array()
        .expect("Chrome trace events");
    let steps = events.iter().filter(|e| e["cat"] == "step").count();
    assert!(
        steps >= 3,
        "a prefill and at least two decode steps: {steps}"
    );
    let names: Vec<&str> = events
        .iter()
        .filter(|e| e["pid"] == 2 && e["ph"] != "M")
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert_eq!(names.first(), Some(&"arrived"), "{names:?}");
    assert_eq!(names.last(), Some(&"finished"), "{names:?}");
    assert!(events.iter().any(|e| e["name"] == "detokenize"));
    let written: Value =
        serde_json::from_str(&std::fs::read_to_string(&file).expect("written on dump"))
            .expect("JSON");
    assert_eq!(
        written["traceEvents"].as_array().map(Vec::len),
        Some(events.len())
    );
    std::fs::remove_file(&file).expect("remove");
    server.shutdown().expect("clean shutdown");
    assert!(file.exists(), "the trace is written at exit");
}

#[test]
fn without_a_recorder_the_route_is_a_404() {
    let server = traced_server(None, false);
    let r = request(
        server.addr(),
        "POST",
        "/debug/trace",
        &[("authorization", "Bearer k")],
        "",
    );
    assert_eq!(r.status, 404, "{}", r.body);
    assert!(r.body.contains("--trace"), "{}", r.body);
    server.shutdown().expect("clean shutdown");
}
