//! The server checked with the official `openai` Python client (tests/py/; the pinned
//! release, installed on first use into the target directory), over real HTTP: the API with
//! the small fixture model, and the error statuses (401, 404, 413, 429) with the default
//! model (slow enough to keep one request running while the queue fills).

mod server_common;

use std::process::Command;

use server_common::*;

/// Runs the Python checks against `server` with `extra` arguments; panics on failure. The
/// pinned `openai` client comes from a private environment under the target directory,
/// created on first use (see `server_common::python_env`).
fn run_python(server: &tandem_server::RunningServer, extra: &[&str]) {
    let site = python_env::openai_site_dir();
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/test_openai_client.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg("--base-url")
        .arg(format!("http://{}/v1", server.addr()))
        .arg("--model")
        .arg("test-model")
        .arg("--openai-version")
        .arg(python_env::OPENAI_VERSION)
        .args(extra)
        .env("PYTHONPATH", site)
        .output()
        .expect("python3 runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_ne!(
        out.status.code(),
        Some(3),
        "the pinned `openai` package is not importable from {}\n{stderr}",
        site.display()
    );
    assert!(
        out.status.success(),
        "openai client checks failed:\n{stdout}\n{stderr}"
    );
}

#[test]
fn official_openai_client_works_against_the_server() {
    let server = start_server(&fixture_path(), |_| {});
    run_python(&server, &[]);
    wait_health(server.addr(), std::time::Duration::from_secs(5), idle);
    server.shutdown().expect("clean shutdown");
}

#[test]
fn official_openai_client_sees_401_404_413_and_429() {
    let server = start_server_with(
        &default_model_path(),
        |s| s.max_num_seqs = 1,
        |c| {
            c.api_key = Some("py-key".into());
            c.limits.max_body_bytes = 64 * 1024;
            c.limits.max_waiting_requests = 1;
        },
    );
    run_python(&server, &["--api-key", "py-key", "--limits"]);
    wait_health(server.addr(), std::time::Duration::from_secs(30), idle);
    server.shutdown().expect("clean shutdown");
}
