//! Counters of disaggregated prefill (ARCHITECTURE.md § KV transfer) for `/metrics`: what a
//! prefill instance sent, what a decode instance asked its peer for, received and put into
//! its prefix cache, and how often it fell back to computing a prompt itself.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::metrics::escape_label;

/// Monotonic counters, shared by the handlers.
#[derive(Debug, Default)]
pub struct KvTransferStats {
    /// Prompts this instance prefilled for a peer, blocks and bytes it answered.
    pub prefills: AtomicU64,
    pub blocks_sent: AtomicU64,
    pub bytes_sent: AtomicU64,
    /// Prompts whose blocks were all in this instance's prefix cache: nothing was fetched.
    pub cached_here: AtomicU64,
    /// Requests to prefill peers.
    pub fetches: AtomicU64,
    /// Requests to a peer that failed (no answer, an error, or blocks refused on import).
    pub peer_errors: AtomicU64,
    /// Prompts no peer computed, which were then computed here.
    pub failures: AtomicU64,
    pub blocks_received: AtomicU64,
    pub bytes_received: AtomicU64,
    /// Received blocks newly put into the prefix cache (blocks already cached are not).
    pub blocks_imported: AtomicU64,
    /// Microseconds spent waiting on the peer, summed.
    fetch_micros: AtomicU64,
}

fn add(counter: &AtomicU64, n: usize) {
    counter.fetch_add(n as u64, Ordering::Relaxed);
}

impl KvTransferStats {
    pub fn on_sent(&self, blocks: usize, bytes: usize) {
        add(&self.prefills, 1);
        add(&self.blocks_sent, blocks);
        add(&self.bytes_sent, bytes);
    }

    pub fn on_fetched(&self, blocks: usize, bytes: usize, waited: Duration) {
        add(&self.blocks_received, blocks);
        add(&self.bytes_received, bytes);
        let micros = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
        self.fetch_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// The counters in the Prometheus text format, labelled with the model's name.
    pub fn render(&self, model_name: &str) -> String {
        let labels = format!("model_name=\"{}\"", escape_label(model_name));
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let rows: [(&str, &str, f64); 11] = [
            (
                "prefills_total",
                "Prompts prefilled for a peer.",
                get(&self.prefills) as f64,
            ),
            (
                "blocks_sent_total",
                "KV blocks sent to peers.",
                get(&self.blocks_sent) as f64,
            ),
            (
                "bytes_sent_total",
                "KV bytes sent to peers.",
                get(&self.bytes_sent) as f64,
            ),
            (
                "cached_here_total",
                "Prompts whose blocks were all cached here: nothing fetched.",
                get(&self.cached_here) as f64,
            ),
            (
                "fetches_total",
                "Requests to prefill peers.",
                get(&self.fetches) as f64,
            ),
            (
                "peer_errors_total",
                "Requests to a prefill peer that failed (no answer, error, refused blocks).",
                get(&self.peer_errors) as f64,
            ),
            (
                "failures_total",
                "Prompts no prefill peer computed, computed here instead.",
                get(&self.failures) as f64,
            ),
            (
                "blocks_received_total",
                "KV blocks received from the prefill peer.",
                get(&self.blocks_received) as f64,
            ),
            (
                "bytes_received_total",
                "KV bytes received from the prefill peer.",
                get(&self.bytes_received) as f64,
            ),
            (
                "blocks_imported_total",
                "Received KV blocks added to the prefix cache.",
                get(&self.blocks_imported) as f64,
            ),
            (
                "fetch_seconds_total",
                "Seconds spent waiting on the prefill peer.",
                get(&self.fetch_micros) as f64 / 1e6,
            ),
        ];
        let mut out = String::new();
        for (name, help, value) in rows {
            let name = format!("tandem:kv_transfer_{name}");
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            let _ = writeln!(out, "{name}{{{labels}}} {value}");
        }
        out
    }
}
