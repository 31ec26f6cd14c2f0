//! The server checked with the official `openai` Python client (tests/py/; the pinned
//! release, installed on first use into the target directory), over real HTTP: the API with
//! the small fixture model, and the error statuses (401, 404, 413, 429) with the default
//! model (slow enough to keep one request running while the queue fills).

mod server_common;

use server_common::*;

/// Runs tests/py/test_openai_client.py against `server` with `extra` arguments.
fn run_python(server: &tandem_server::RunningServer, extra: &[&str]) {
    python_env::run_script(server.addr(), "test_openai_client.py", "test-model", extra);
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
