//! `tandem serve` as a real process on the small fixture model: it prints its address
//! (port 0 picks a free one), answers /health and a completion, honours --api-key-file, and
//! exits with status 0 on SIGINT. Bad limit flags are refused before anything loads. With
//! `--log-format json`, stderr has one access line per request and the drain's lines.
#![allow(clippy::unwrap_used)] // helpers outside #[test] functions

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

fn fixture() -> String {
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../model/tests/fixtures/hf/llama_untied"
    )
    .to_string()
}

/// Starts `tandem serve` on a free loopback port; returns the child and its address.
fn serve(extra: &[&str]) -> (Child, SocketAddr) {
    let (child, addr, _) = serve_logged(extra);
    (child, addr)
}

/// [`serve`], with every stderr line collected.
fn serve_logged(extra: &[&str]) -> (Child, SocketAddr, Arc<Mutex<Vec<String>>>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args([
            "serve",
            "--model",
            &fixture(),
            "--port",
            "0",
            "--threads",
            "1",
        ])
        .args(["--kv-cache-memory", "16MiB"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tandem serve");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let log = Arc::new(Mutex::new(Vec::new()));
    let lines = log.clone();
    // Keep draining stderr so the server never blocks on it.
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            lines.lock().unwrap().push(line.clone());
            if let Some(rest) = line.split(" at http://").nth(1) {
                let addr = rest.split_whitespace().next().unwrap_or("").to_string();
                let _ = tx.send(addr);
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the server prints its address");
    (child, addr.parse().expect("a socket address"), log)
}

/// One HTTP/1.1 request; the status and the body.
fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: &str,
) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("a response head");
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, body.to_string())
}

fn interrupt(child: &mut Child) -> std::process::ExitStatus {
    let killed = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(killed.success());
    for _ in 0..300 {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    panic!("tandem serve did not exit within 30 s of SIGINT");
}

#[test]
fn serves_health_and_a_completion_then_exits_0_on_sigint() {
    let (mut child, addr) = serve(&[]);
    let (status, body) = http(addr, "GET", "/health", None, "");
    assert_eq!(status, 200, "{body}");
    let req = json!({"prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0, "ignore_eos": true});
    let (status, body) = http(addr, "POST", "/v1/completions", None, &req.to_string());
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(v["usage"]["completion_tokens"], 4, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let status = interrupt(&mut child);
    assert_eq!(status.code(), Some(0), "{status:?}");
}

#[test]
fn the_api_key_file_guards_the_api() {
    let path = std::env::temp_dir().join(format!("tandem-serve-key-{}", std::process::id()));
    std::fs::write(&path, "  file-s3cret\n").unwrap();
    let (mut child, addr) = serve(&["--api-key-file", path.to_str().unwrap()]);
    assert_eq!(http(addr, "GET", "/health", None, "").0, 200);
    assert_eq!(http(addr, "GET", "/v1/models", None, "").0, 401);
    assert_eq!(http(addr, "GET", "/v1/models", Some("wrong"), "").0, 401);
    let (status, body) = http(addr, "GET", "/v1/models", Some("file-s3cret"), "");
    assert_eq!(status, 200, "{body}");
    assert_eq!(interrupt(&mut child).code(), Some(0));
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_decode_server_takes_its_prompts_blocks_from_a_prefill_server_sharing_its_key() {
    let path = std::env::temp_dir().join(format!("tandem-disagg-key-{}", std::process::id()));
    std::fs::write(&path, "pair-s3cret\n").unwrap();
    let key = path.to_str().unwrap();
    let (prefill, peer) = serve(&["--api-key-file", key, "--kv-producer"]);
    let mut prefill = KillOnDrop(prefill);
    let peer = peer.to_string();
    let (decode, addr) = serve(&["--api-key-file", key, "--prefill-peer", &peer]);
    let mut decode = KillOnDrop(decode);
    let prompt: Vec<u32> = (0..40).map(|i| (i * 7 + 3) % 300 + 5).collect();
    let req = json!({"prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": true});
    let (status, body) = http(
        addr,
        "POST",
        "/v1/completions",
        Some("pair-s3cret"),
        &req.to_string(),
    );
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(
        v["usage"]["prompt_tokens_details"]["cached_tokens"], 32,
        "{v}"
    );
    assert_eq!(interrupt(&mut decode.0).code(), Some(0));
    assert_eq!(interrupt(&mut prefill.0).code(), Some(0));
    let _ = std::fs::remove_file(&path);
}

/// A server process stopped when the test ends, whether it passes or fails.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn bad_limit_flags_are_refused_naming_the_flag() {
    for (args, flag) in [
        (vec!["--max-n", "0"], "--max-n"),
        (vec!["--max-top-logprobs", "21"], "--max-top-logprobs"),
        (
            vec!["--max-waiting-requests", "0"],
            "--max-waiting-requests",
        ),
        (vec!["--max-connections", "0"], "--max-connections"),
        (vec!["--shutdown-timeout=-1"], "--shutdown-timeout"),
        (vec!["--log-format", "xml"], "--log-format"),
        (vec!["--prefill-peer", "nowhere"], "--prefill-peer"),
        (
            vec!["--prefill-peer-timeout", "0"],
            "--prefill-peer-timeout",
        ),
        (
            vec!["--prefill-peer", "127.0.0.1:9", "--no-prefix-caching"],
            "prefix cache",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_tandem"))
            .args(["serve", "--model", &fixture(), "--port", "0"])
            .args(&args)
            .output()
            .expect("run tandem serve");
        assert!(!out.status.success(), "{args:?} was accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
    }
}

#[test]
fn json_logs_have_one_access_line_per_request_and_sigterm_drains_to_exit_0() {
    let (mut child, addr, log) = serve_logged(&["--log-format", "json"]);
    let req = json!({"prompt": [5, 6, 7], "max_tokens": 3, "temperature": 0, "ignore_eos": true});
    let (status, body) = http(addr, "POST", "/v1/completions", None, &req.to_string());
    assert_eq!(status, 200, "{body}");
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(killed.success());
    let status = (0..300)
        .find_map(|_| {
            std::thread::sleep(Duration::from_millis(100));
            child.try_wait().unwrap()
        })
        .expect("tandem serve exits after SIGTERM");
    assert_eq!(status.code(), Some(0), "{status:?}");
    std::thread::sleep(Duration::from_millis(200));
    let json: Vec<Value> = log
        .lock()
        .unwrap()
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let access: Vec<&Value> = json
        .iter()
        .filter(|v| v["target"] == "tandem::access" && v["fields"]["route"] == "/v1/completions")
        .collect();
    assert_eq!(access.len(), 1, "{json:?}");
    let f = &access[0]["fields"];
    assert_eq!(f["status"], 200);
    assert_eq!(f["prompt_tokens"], 3);
    assert_eq!(f["output_tokens"], 3);
    assert_eq!(f["finish_reason"], "length");
    assert!(f["request_id"].as_str().is_some_and(|id| !id.is_empty()));
    let messages: Vec<&str> = json
        .iter()
        .filter_map(|v| v["fields"]["message"].as_str())
        .collect();
    assert!(
        messages.iter().any(|m| m.starts_with("draining")),
        "{messages:?}"
    );
    assert!(messages.contains(&"stopped"), "{messages:?}");
}
