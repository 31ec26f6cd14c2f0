//! Helpers for the server tests: start a server in-process on a free loopback port with
//! the small fixture model or the default model, and speak HTTP/1.1 to it over a plain TCP
//! socket (so tests control disconnects byte by byte).

#![allow(dead_code)]

pub mod python_env;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tandem_engine::engine::Engine;
use tandem_engine::SchedulerConfig;
use tandem_model::cpu_runner::{CpuRunner, KvSpec};
use tandem_model::host_model::HostModel;
use tandem_model::loader::{load_model, LoadedModel};
use tandem_model::queued_runner::QueuedRunner;
use tandem_model::runner::ModelRunner;
use tandem_model::tokenizer::Tokenizer;
use tandem_model::transformer::Model;
use tandem_server::{RunningServer, ServerConfig};

/// The fixture model: a random-weight two-layer Llama with a 320-token vocabulary.
pub fn fixture_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/hf/llama_untied")
}

/// The default model: `$TANDEM_TEST_MODEL`, else the cache (fetched on first use).
pub fn default_model_path() -> PathBuf {
    tandem_model::default_model::test_model_path()
        .expect("the default model is needed; this test does not skip")
}

/// Loads a model.
pub fn load(path: &std::path::Path) -> LoadedModel {
    load_model(path).unwrap_or_else(|e| panic!("loading {}: {e}", path.display()))
}

/// A runner over the model at `path` whose pool holds one scoring context of up to 2,048
/// tokens in blocks of 16 (the reference of teacher-forced scores).
pub fn scoring_runner(path: &std::path::Path) -> Box<dyn ModelRunner> {
    let mut config = SchedulerConfig::new(2048 / 16, 16, 2048);
    config.enable_prefix_caching = false;
    cpu_runner(load(path).host, &config)
}

/// A runner over `host` on 1 kernel thread with `config`'s pool, keys and values as the
/// model's default.
pub fn cpu_runner(host: HostModel, config: &SchedulerConfig) -> Box<dyn ModelRunner> {
    let spec = KvSpec {
        block_size: config.block_size,
        num_blocks: config.num_blocks,
        dtype: None,
    };
    Box::new(CpuRunner::new(Model::new(host, 1), spec).expect("KV pool"))
}

/// An engine over `lm` with room for `num_blocks` blocks of 16 tokens.
pub fn engine(lm: LoadedModel, num_blocks: usize) -> (Engine, Arc<Tokenizer>, Option<String>) {
    engine_with(lm, num_blocks, |_| {})
}

/// [`engine`] with `sched` adjusting the scheduler's config.
pub fn engine_with(
    lm: LoadedModel,
    num_blocks: usize,
    sched: impl FnOnce(&mut SchedulerConfig),
) -> (Engine, Arc<Tokenizer>, Option<String>) {
    engine_over(lm, num_blocks, sched, |r| r)
}

/// [`engine_with`], the CPU runner inside what `wrap` makes of it.
pub fn engine_over(
    lm: LoadedModel,
    num_blocks: usize,
    sched: impl FnOnce(&mut SchedulerConfig),
    wrap: impl FnOnce(Box<dyn ModelRunner>) -> Box<dyn ModelRunner>,
) -> (Engine, Arc<Tokenizer>, Option<String>) {
    let max_len = lm.host.config.context_len.min(2048);
    let mut config = SchedulerConfig::new(num_blocks, 16, max_len);
    config.eos_token_ids = lm.eos_token_ids.clone();
    sched(&mut config);
    let runner = wrap(cpu_runner(lm.host, &config));
    let engine = Engine::new(runner, config, 0).expect("engine config is valid");
    (engine, Arc::new(lm.tokenizer), lm.chat_template)
}

/// [`start_server`] over an engine whose runner overlaps steps (`QueuedRunner`: each step
/// runs at its launch), so the engine plans each step ahead of the previous one's result as
/// it does on a GPU.
pub fn start_overlapped_server(path: &std::path::Path) -> RunningServer {
    let wrap = |r| Box::new(QueuedRunner::new(r)) as Box<dyn ModelRunner>;
    let (engine, tokenizer, template) = engine_over(load(path), 256, |_| {}, wrap);
    let mut config = ServerConfig::new("test-model");
    config.addr = SocketAddr::from(([127, 0, 0, 1], 0));
    tandem_server::start(engine, tokenizer, template, config).expect("server starts")
}

/// A server on 127.0.0.1 with a free port; `tweak` adjusts the config.
pub fn start_server(
    path: &std::path::Path,
    tweak: impl FnOnce(&mut ServerConfig),
) -> RunningServer {
    start_server_with(path, |_| {}, tweak)
}

/// A server over the model at `path` with `template` as its chat template.
pub fn start_server_with_template(path: &std::path::Path, template: &str) -> RunningServer {
    let (engine, tokenizer, _) = engine(load(path), 256);
    let mut config = ServerConfig::new("test-model");
    config.addr = SocketAddr::from(([127, 0, 0, 1], 0));
    tandem_server::start(engine, tokenizer, Some(template.into()), config).expect("server starts")
}

/// [`start_server`] with `sched` adjusting the scheduler's config too.
pub fn start_server_with(
    path: &std::path::Path,
    sched: impl FnOnce(&mut SchedulerConfig),
    tweak: impl FnOnce(&mut ServerConfig),
) -> RunningServer {
    let (engine, tokenizer, template) = engine_with(load(path), 256, sched);
    let mut config = ServerConfig::new("test-model");
    config.addr = SocketAddr::from(([127, 0, 0, 1], 0));
    tweak(&mut config);
    tandem_server::start(engine, tokenizer, template, config).expect("server starts")
}

/// An HTTP response, body de-chunked.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The SSE frames' payloads (`data: X\n\n` -> X), asserting the exact framing.
    pub fn sse_data(&self) -> Vec<String> {
        assert!(
            self.body.ends_with("data: [DONE]\n\n"),
            "stream must end with [DONE]: {:?}",
            self.body
        );
        self.body
            .split_terminator("\n\n")
            .map(|frame| {
                frame
                    .strip_prefix("data: ")
                    .unwrap_or_else(|| panic!("frame without `data: `: {frame:?}"))
                    .to_string()
            })
            .collect()
    }
}

/// Writes one request (`Connection: close`) and returns the open socket.
pub fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120)))
        .expect("timeout");
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        req.push_str("Content-Type: application/json\r\n");
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).expect("write head");
    s.write_all(body.as_bytes()).expect("write body");
    s
}

/// Reads the status line and headers.
pub fn read_head(r: &mut BufReader<TcpStream>) -> (u16, Vec<(String, String)>) {
    let mut line = String::new();
    r.read_line(&mut line).expect("status line");
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {line:?}"));
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line).expect("header line");
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    (status, headers)
}

/// Reads one chunk of a chunked body; `None` at the last (empty) chunk.
pub fn read_chunk(r: &mut BufReader<TcpStream>) -> Option<Vec<u8>> {
    let mut line = String::new();
    r.read_line(&mut line).expect("chunk size");
    let size =
        usize::from_str_radix(line.trim(), 16).unwrap_or_else(|_| panic!("chunk size {line:?}"));
    let mut data = vec![0; size + 2];
    r.read_exact(&mut data).expect("chunk data");
    data.truncate(size);
    (size > 0).then_some(data)
}

/// One request, the whole response.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Reply {
    let mut r = BufReader::new(send(addr, method, path, headers, body));
    let (status, headers) = read_head(&mut r);
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let mut body = Vec::new();
    if chunked {
        while let Some(c) = read_chunk(&mut r) {
            body.extend(c);
        }
    } else {
        r.read_to_end(&mut body).expect("body");
    }
    Reply {
        status,
        headers,
        body: String::from_utf8(body).expect("UTF-8 body"),
    }
}

pub fn post(addr: SocketAddr, path: &str, body: &Value) -> Reply {
    request(addr, "POST", path, &[], &body.to_string())
}

pub fn get(addr: SocketAddr, path: &str) -> Reply {
    request(addr, "GET", path, &[], "")
}

/// Polls `/health` until `done` holds for its JSON, or panics after `timeout`.
pub fn wait_health(addr: SocketAddr, timeout: Duration, done: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let h = get(addr, "/health").json();
        if done(&h) {
            return h;
        }
        assert!(
            start.elapsed() < timeout,
            "health never reached the state: {h}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The engine is idle: nothing running, waiting or in flight, every KV block free.
pub fn idle(h: &Value) -> bool {
    h["running"] == 0
        && h["waiting"] == 0
        && h["in_flight"] == 0
        && h["kv_free_blocks"] == h["kv_total_blocks"]
}

/// The concatenated text of a stream's chunks for choice `index` (`text` or
/// `delta.content`), and the finish reasons seen.
pub fn stream_text(frames: &[String], index: u64) -> (String, Vec<String>) {
    let mut text = String::new();
    let mut finish = Vec::new();
    for f in frames.iter().filter(|f| f.as_str() != "[DONE]") {
        let v: Value = serde_json::from_str(f).expect("chunk JSON");
        for c in v["choices"].as_array().expect("choices") {
            if c["index"] != index {
                continue;
            }
            let piece = c["text"]
                .as_str()
                .or(c["delta"]["content"].as_str())
                .unwrap_or("");
            text.push_str(piece);
            if let Some(r) = c["finish_reason"].as_str() {
                finish.push(r.to_string());
            }
        }
    }
    (text, finish)
}

/// Asserts an OpenAI-style error body with `status`, naming `param` (in `param` and in the
/// message) when given.
pub fn assert_error(r: &Reply, status: u16, param: Option<&str>) {
    assert_eq!(r.status, status, "{}", r.body);
    let v = r.json();
    let e = v["error"]
        .as_object()
        .unwrap_or_else(|| panic!("no error object: {}", r.body));
    for key in ["message", "type", "param", "code"] {
        assert!(e.contains_key(key), "error body lacks {key}: {}", r.body);
    }
    assert!(!e["message"].as_str().expect("message").is_empty());
    if let Some(p) = param {
        assert_eq!(e["param"], p, "{}", r.body);
        assert!(
            e["message"].as_str().expect("message").contains(p),
            "{}",
            r.body
        );
    }
}
