//! The server checked with the official `openai` Python client (tests/py/), over real
//! HTTP, with the small fixture model.

mod server_common;

use std::process::Command;

use server_common::*;

#[test]
fn official_openai_client_works_against_the_server() {
    let server = start_server(&fixture_path(), |_| {});
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/test_openai_client.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg("--base-url")
        .arg(format!("http://{}/v1", server.addr()))
        .arg("--model")
        .arg("test-model")
        .output()
        .expect("python3 runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_ne!(
        out.status.code(),
        Some(3),
        "the `openai` Python package is missing: install it with `pip install openai`\n{stderr}"
    );
    assert!(
        out.status.success(),
        "openai client checks failed:\n{stdout}\n{stderr}"
    );
    wait_health(server.addr(), std::time::Duration::from_secs(5), idle);
    server.shutdown().expect("clean shutdown");
}
