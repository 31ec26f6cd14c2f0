//! Serving metrics for `GET /metrics`, in the Prometheus text format with vLLM's metric names
//! and meanings, so dashboards built for vLLM read tandem unchanged.
//!
//! The engine thread owns a [`ServingMetrics`]: it learns of every submitted request, every
//! generated token and every finish, and times them with a monotonic clock. Each loop turn it
//! publishes a [`MetricsSnapshot`] (these counters plus the scheduler's and speculation's
//! life-time counters) beside the health snapshot; the handler renders the latest one.
//!
//! Latencies are measured on the engine thread, from the moment a request is added to the
//! engine: time to first token (`vllm:time_to_first_token_seconds`), the gap between
//! consecutive tokens of one request (`vllm:inter_token_latency_seconds`), and add-to-finish
//! (`vllm:e2e_request_latency_seconds`); and, per prompt (a request's `n` samples share one
//! queue), the time from its admission to the start of the first step that scheduled it
//! (`vllm:request_queue_time_seconds`).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Instant;

use tandem_engine::speculative::SpecStats;
use tandem_engine::{SchedulerStats, SeqId};
use tandem_text::Finish;

const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
const E2E_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// A cumulative histogram over fixed upper bounds (seconds).
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    bounds: &'static [f64],
    /// `[bounds.len()]`: observations `<= bounds[i]` and above the previous bound.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, seconds: f64) {
        if let Some(i) = self.bounds.iter().position(|&b| seconds <= b) {
            self.counts[i] += 1;
        }
        self.sum += seconds;
        self.count += 1;
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (bound, n) in self.bounds.iter().zip(&self.counts) {
            cumulative += n;
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }
}

/// Per-request timing while it runs.
#[derive(Debug, Clone, Copy)]
struct RequestClock {
    added: Instant,
    last_token: Option<Instant>,
    /// True until the request is first scheduled, for requests whose queue time counts
    /// (the first sample of each prompt).
    queued: bool,
}

/// Finished requests by reason, in `vllm:request_success_total`'s label order.
const REASONS: [&str; 5] = ["stop", "length", "abort", "error", "refused"];

/// Counters and histograms owned by the engine thread.
#[derive(Debug, Clone, Default)]
pub struct ServingMetrics {
    clocks: HashMap<SeqId, RequestClock>,
    counters: MetricsSnapshot,
}

impl ServingMetrics {
    /// A request (one sample of a group) was added with a prompt of `prompt_tokens`.
    /// Samples of one prompt count its tokens once: pass 0 for the siblings.
    /// The first sample's queue time is measured (see [`ServingMetrics::on_step`]).
    pub fn on_added(&mut self, id: SeqId, prompt_tokens: usize, first_sample: bool) {
        let now = Instant::now();
        self.counters.prompt_tokens += prompt_tokens as u64;
        self.clocks.insert(
            id,
            RequestClock {
                added: now,
                last_token: None,
                queued: first_sample,
            },
        );
    }

    /// A step that began at `started` ran; `scheduled(id)` tells whether a request has left
    /// the waiting queue by now (it ran in this step or an earlier one). Each queued request
    /// that has gets its queue time, `started - added`.
    pub fn on_step(&mut self, started: Instant, scheduled: impl Fn(SeqId) -> bool) {
        for (&id, clock) in self.clocks.iter_mut().filter(|(_, c)| c.queued) {
            if scheduled(id) {
                clock.queued = false;
                let waited = started.saturating_duration_since(clock.added);
                self.counters.queue.observe(waited.as_secs_f64());
            }
        }
    }

    /// Request `id` generated a token.
    pub fn on_token(&mut self, id: SeqId) {
        let now = Instant::now();
        self.counters.generation_tokens += 1;
        let Some(clock) = self.clocks.get_mut(&id) else {
            return;
        };
        match clock.last_token {
            None => self
                .counters
                .ttft
                .observe((now - clock.added).as_secs_f64()),
            Some(last) => self.counters.itl.observe((now - last).as_secs_f64()),
        }
        clock.last_token = Some(now);
    }

    /// Request `id` ended with `reason` (also for aborts on client disconnect).
    pub fn on_finished(&mut self, id: SeqId, reason: &Finish) {
        let Some(clock) = self.clocks.remove(&id) else {
            return;
        };
        let slot = match reason {
            Finish::Stop => 0,
            Finish::Length => 1,
            Finish::Abort => 2,
            Finish::Error(_) => 3,
            Finish::Refused(_) => 4,
        };
        self.counters.finished[slot] += 1;
        self.counters
            .e2e
            .observe(clock.added.elapsed().as_secs_f64());
    }

    /// The counters with the engine's own life-time counters filled in.
    pub fn snapshot(&self, scheduler: SchedulerStats, spec: SpecStats) -> MetricsSnapshot {
        let mut s = self.counters.clone();
        s.preemptions = scheduler.num_preemptions;
        (s.steps, s.steps_planned_ahead) = (scheduler.num_steps, scheduler.num_planned_ahead);
        s.prefix_cache_queries = scheduler.prefix_cache_queries;
        s.prefix_cache_hits = scheduler.prefix_cache_hits;
        s.spec = spec;
        s
    }
}

/// Everything `/metrics` shows beyond the health gauges, as of the engine's last loop turn.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsSnapshot {
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    /// Finished requests by reason: stop, length, abort, error.
    pub finished: [u64; 5],
    pub preemptions: u64,
    /// Engine steps, and of them those planned while the previous one still ran.
    pub steps: u64,
    pub steps_planned_ahead: u64,
    /// Tokens looked up in the prefix cache at admissions, and those found.
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    pub spec: SpecStats,
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
    pub queue: Histogram,
}

impl Default for MetricsSnapshot {
    fn default() -> Self {
        MetricsSnapshot {
            prompt_tokens: 0,
            generation_tokens: 0,
            finished: [0; 5],
            preemptions: 0,
            steps: 0,
            steps_planned_ahead: 0,
            prefix_cache_queries: 0,
            prefix_cache_hits: 0,
            spec: SpecStats::default(),
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(E2E_BUCKETS),
            queue: Histogram::new(E2E_BUCKETS),
        }
    }
}

/// The scheduler gauges shown beside the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gauges {
    pub running: usize,
    pub waiting: usize,
    pub kv_used_blocks: usize,
    pub kv_total_blocks: usize,
}

/// The LoRA adapters in use, as vLLM's `vllm:lora_requests_info` reports them (what the
/// Gateway API Inference Extension reads to send a request to a replica that already runs
/// its adapter).
#[derive(Debug, Clone, PartialEq)]
pub struct LoraGauge {
    /// Names of the adapters of running requests.
    pub running: Vec<String>,
    /// Names of the adapters of waiting requests.
    pub waiting: Vec<String>,
    /// How many adapters one step may run: every loaded one.
    pub max_lora: usize,
    /// Seconds since the Unix epoch (vLLM's value of the gauge: when it was set).
    pub time: f64,
}

impl LoraGauge {
    fn render(&self, out: &mut String) {
        let name = "vllm:lora_requests_info";
        let _ = writeln!(
            out,
            "# HELP {name} Running stats on LoRA requests.\n# TYPE {name} gauge"
        );
        let list = |names: &[String]| escape_label(&names.join(","));
        let (running, waiting) = (list(&self.running), list(&self.waiting));
        let _ = writeln!(
            out,
            "{name}{{max_lora=\"{}\",running_lora_adapters=\"{running}\",waiting_lora_adapters=\"{waiting}\"}} {}",
            self.max_lora, self.time
        );
    }
}

/// Renders the Prometheus text exposition of `gauges` and `m` for `model_name` (and of `lora`,
/// when the server has adapters).
pub fn render(
    model_name: &str,
    gauges: Gauges,
    m: &MetricsSnapshot,
    lora: Option<&LoraGauge>,
) -> String {
    let labels = format!("model_name=\"{}\"", escape_label(model_name));
    let mut out = String::new();
    if let Some(lora) = lora {
        lora.render(&mut out);
    }
    let usage = if gauges.kv_total_blocks == 0 {
        0.0
    } else {
        gauges.kv_used_blocks as f64 / gauges.kv_total_blocks as f64
    };
    let gauge_rows: [(&str, &str, f64); 4] = [
        (
            "vllm:num_requests_running",
            "Sequences in the running set.",
            gauges.running as f64,
        ),
        (
            "vllm:num_requests_waiting",
            "Sequences waiting (fresh or preempted).",
            gauges.waiting as f64,
        ),
        (
            "vllm:kv_cache_usage_perc",
            "KV cache usage: 1 means every block is in use.",
            usage,
        ),
        (
            "tandem:kv_blocks_in_use",
            "KV blocks held by live sequences.",
            gauges.kv_used_blocks as f64,
        ),
    ];
    for (name, help, value) in gauge_rows {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        let _ = writeln!(out, "{name}{{{labels}}} {value}");
    }
    let counter_rows: [(&str, &str, u64); 10] = [
        (
            "vllm:prompt_tokens_total",
            "Prompt tokens admitted.",
            m.prompt_tokens,
        ),
        (
            "vllm:generation_tokens_total",
            "Tokens generated.",
            m.generation_tokens,
        ),
        (
            "vllm:num_preemptions_total",
            "Recompute preemptions.",
            m.preemptions,
        ),
        (
            "tandem:engine_steps_total",
            "Engine steps that computed something.",
            m.steps,
        ),
        (
            "tandem:engine_steps_planned_ahead_total",
            "Engine steps planned while the previous step still ran (overlapped steps).",
            m.steps_planned_ahead,
        ),
        (
            "vllm:prefix_cache_queries_total",
            "Prompt tokens looked up in the prefix cache at admission.",
            m.prefix_cache_queries,
        ),
        (
            "vllm:prefix_cache_hits_total",
            "Prompt tokens found in the prefix cache at admission.",
            m.prefix_cache_hits,
        ),
        (
            "vllm:spec_decode_num_drafts_total",
            "Verifications of a sequence with at least one draft token.",
            m.spec.num_drafts,
        ),
        (
            "vllm:spec_decode_num_draft_tokens_total",
            "Draft tokens verified.",
            m.spec.num_draft_tokens,
        ),
        (
            "vllm:spec_decode_num_accepted_tokens_total",
            "Draft tokens accepted.",
            m.spec.num_accepted_tokens,
        ),
    ];
    for (name, help, value) in counter_rows {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        let _ = writeln!(out, "{name}{{{labels}}} {value}");
    }
    let name = "vllm:request_success_total";
    let _ = writeln!(out, "# HELP {name} Finished requests by finish reason.");
    let _ = writeln!(out, "# TYPE {name} counter");
    for (reason, n) in REASONS.iter().zip(m.finished) {
        let _ = writeln!(out, "{name}{{{labels},finished_reason=\"{reason}\"}} {n}");
    }
    m.ttft.render(
        &mut out,
        "vllm:time_to_first_token_seconds",
        "Time from a request's admission to its first token.",
        &labels,
    );
    m.itl.render(
        &mut out,
        "vllm:inter_token_latency_seconds",
        "Time between consecutive tokens of a request.",
        &labels,
    );
    m.e2e.render(
        &mut out,
        "vllm:e2e_request_latency_seconds",
        "Time from a request's admission to its end.",
        &labels,
    );
    m.queue.render(
        &mut out,
        "vllm:request_queue_time_seconds",
        "Time a request spent waiting before its first scheduled step.",
        &labels,
    );
    out
}

/// Escapes a Prometheus label value (backslash, quote, newline).
pub(crate) fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let mut h = Histogram::new(&[0.1, 1.0]);
        h.observe(0.05);
        h.observe(0.5);
        h.observe(5.0);
        let mut out = String::new();
        h.render(&mut out, "x", "help", "a=\"b\"");
        assert!(out.contains("x_bucket{a=\"b\",le=\"0.1\"} 1\n"));
        assert!(out.contains("x_bucket{a=\"b\",le=\"1\"} 2\n"));
        assert!(out.contains("x_bucket{a=\"b\",le=\"+Inf\"} 3\n"));
        assert!(out.contains("x_count{a=\"b\"} 3\n"));
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
