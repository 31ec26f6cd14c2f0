//! Faults of the model runner over real HTTP: a forward pass that fails, one that returns
//! a NaN row, one that panics. Each ends exactly the requests it touches (with a 500, the
//! engine's fault), frees their KV blocks, and the server goes on, or, after a panic, says
//! so: `/health` 503, new requests 503.

mod server_common;

use std::net::SocketAddr;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::json;
use server_common::*;
use tandem_model::batch::{BlockId, ForwardBatch};
use tandem_model::config::ModelConfig;
use tandem_model::error::{ModelError, Result};
use tandem_model::logits::Logits;
use tandem_model::runner::{KvGeometry, ModelRunner};
use tandem_server::{RunningServer, ServerConfig};

/// What goes wrong in the forward pass that `Fault::when` picks.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// The forward pass returns an error.
    Error,
    /// The first row of its logits is NaN.
    NanRow,
    /// The forward pass panics.
    Panic,
}

/// The CPU runner, with `fault` in the first forward pass whose batch selects at least
/// `rows` logits rows (once). Only the required methods: every other one goes through
/// `forward`, as the trait's defaults do.
#[derive(Debug)]
struct FaultyRunner {
    inner: Box<dyn ModelRunner>,
    fault: Fault,
    rows: usize,
    fired: Arc<AtomicUsize>,
}

impl ModelRunner for FaultyRunner {
    fn config(&self) -> &ModelConfig {
        self.inner.config()
    }

    fn kv_geometry(&self) -> KvGeometry {
        self.inner.kv_geometry()
    }

    fn forward(&mut self, batch: &ForwardBatch) -> Result<Logits> {
        let logits = self.inner.forward(batch)?;
        if logits.num_rows() < self.rows || self.fired.fetch_add(1, Ordering::SeqCst) > 0 {
            return Ok(logits);
        }
        match self.fault {
            Fault::Error => Err(ModelError::Batch("injected failure".into())),
            Fault::Panic => panic!("injected panic"),
            Fault::NanRow => {
                let (rows, vocab) = (logits.rows().to_vec(), logits.vocab_size());
                let mut data = logits.into_data();
                data[..vocab].fill(f32::NAN);
                Ok(Logits::new(rows, vocab, data))
            }
        }
    }

    fn copy_blocks(&mut self, copies: &[(BlockId, BlockId)]) -> Result<()> {
        self.inner.copy_blocks(copies)
    }

    fn cached_logits(&mut self, table: &[BlockId], positions: Range<usize>) -> Result<Logits> {
        self.inner.cached_logits(table, positions)
    }

    fn model_identity(&self) -> u64 {
        self.inner.model_identity()
    }

    fn describe(&self) -> String {
        format!("faulty {}", self.inner.describe())
    }
}

/// A server over the fixture model whose runner has `fault` once, in the first forward
/// pass with `rows` logits rows or more; the count of faults fired.
fn faulty_server(fault: Fault, rows: usize) -> (RunningServer, Arc<AtomicUsize>) {
    let fired = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&fired);
    let wrap = move |inner| {
        Box::new(FaultyRunner {
            inner,
            fault,
            rows,
            fired: counter,
        }) as Box<dyn ModelRunner>
    };
    let (engine, tokenizer, template) = engine_over(load(&fixture_path()), 64, |_| {}, wrap);
    let mut config = ServerConfig::new("test-model");
    config.addr = SocketAddr::from(([127, 0, 0, 1], 0));
    let server = tandem_server::start(engine, tokenizer, template, config).expect("starts");
    (server, fired)
}

/// `n` completions of 200 tokens at once (long enough to share steps); their statuses,
/// sorted.
fn concurrent(addr: SocketAddr, n: usize) -> Vec<u16> {
    let body = json!({"prompt": "Once upon a time", "max_tokens": 200, "ignore_eos": true});
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let body = body.clone();
            std::thread::spawn(move || post(addr, "/v1/completions", &body))
        })
        .collect();
    let mut statuses: Vec<u16> = threads
        .into_iter()
        .map(|t| {
            let r = t.join().expect("request thread");
            if r.status != 200 {
                assert_error(&r, r.status, None);
            }
            r.status
        })
        .collect();
    statuses.sort_unstable();
    statuses
}

#[test]
fn a_failed_forward_pass_ends_the_requests_in_it_and_the_server_goes_on() {
    let (server, fired) = faulty_server(Fault::Error, 2);
    let addr = server.addr();
    assert_eq!(concurrent(addr, 2), [500, 500], "both rode the failed step");
    assert_eq!(fired.load(Ordering::SeqCst), 1);
    assert_eq!(concurrent(addr, 2), [200, 200]);
    wait_health(addr, std::time::Duration::from_secs(10), idle);
    server.shutdown().expect("clean shutdown");
}

#[test]
fn a_nan_row_ends_its_request_only() {
    let (server, fired) = faulty_server(Fault::NanRow, 2);
    let addr = server.addr();
    assert_eq!(
        concurrent(addr, 2),
        [200, 500],
        "only the NaN row's request fails"
    );
    assert_eq!(fired.load(Ordering::SeqCst), 1);
    assert_eq!(concurrent(addr, 2), [200, 200]);
    wait_health(addr, std::time::Duration::from_secs(10), idle);
    server.shutdown().expect("clean shutdown");
}

#[test]
fn after_a_panic_health_and_new_requests_say_503() {
    let (server, fired) = faulty_server(Fault::Panic, 1);
    let addr = server.addr();
    assert_eq!(concurrent(addr, 1), [500]);
    assert_eq!(fired.load(Ordering::SeqCst), 1);
    assert_eq!(get(addr, "/health").status, 503);
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "hi", "max_tokens": 2}),
    );
    assert_error(&r, 503, None);
    server.shutdown().ok();
}
