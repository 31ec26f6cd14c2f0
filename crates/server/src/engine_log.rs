//! The engine's periodic log line (target `tandem::engine`), like vLLM's: every interval while
//! the engine has work, the prompt and generation throughput over the interval, requests
//! running and waiting, KV-cache usage, the prefix-cache hit rate and the speculative
//! acceptance rate over the interval (absent when nothing was looked up or drafted).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::engine_thread::EngineSnapshot;

/// Counters at the previous line.
#[derive(Debug)]
pub struct EngineLog {
    interval: Duration,
    last: Instant,
    prompt_tokens: u64,
    generation_tokens: u64,
    cache_queries: u64,
    cache_hits: u64,
    draft_tokens: u64,
    accepted_tokens: u64,
}

impl EngineLog {
    pub fn new(interval: Duration) -> EngineLog {
        EngineLog {
            interval,
            last: Instant::now(),
            prompt_tokens: 0,
            generation_tokens: 0,
            cache_queries: 0,
            cache_hits: 0,
            draft_tokens: 0,
            accepted_tokens: 0,
        }
    }

    /// Writes the line when the interval has passed and something ran in it.
    pub fn tick(&mut self, snapshot: &Arc<Mutex<EngineSnapshot>>) {
        let elapsed = self.last.elapsed();
        if elapsed < self.interval {
            return;
        }
        let s = match snapshot.lock() {
            Ok(s) => s.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        let m = &s.metrics;
        let prompt = m.prompt_tokens.saturating_sub(self.prompt_tokens);
        let generated = m.generation_tokens.saturating_sub(self.generation_tokens);
        let busy = s.running + s.waiting > 0 || prompt + generated > 0;
        self.last = Instant::now();
        let rate = |part: u64, whole: u64| (whole > 0).then(|| pct(part, whole));
        let hit = rate(
            m.prefix_cache_hits.saturating_sub(self.cache_hits),
            m.prefix_cache_queries.saturating_sub(self.cache_queries),
        );
        let accept = rate(
            m.spec
                .num_accepted_tokens
                .saturating_sub(self.accepted_tokens),
            m.spec.num_draft_tokens.saturating_sub(self.draft_tokens),
        );
        self.prompt_tokens = m.prompt_tokens;
        self.generation_tokens = m.generation_tokens;
        self.cache_queries = m.prefix_cache_queries;
        self.cache_hits = m.prefix_cache_hits;
        self.draft_tokens = m.spec.num_draft_tokens;
        self.accepted_tokens = m.spec.num_accepted_tokens;
        if !busy {
            return;
        }
        let secs = elapsed.as_secs_f64();
        let used = s.kv_total_blocks.saturating_sub(s.kv_free_blocks);
        tracing::info!(
            target: "tandem::engine",
            prompt_tokens_per_s = round1(prompt as f64 / secs),
            generation_tokens_per_s = round1(generated as f64 / secs),
            running = s.running,
            waiting = s.waiting,
            kv_usage_pct = pct(used as u64, s.kv_total_blocks as u64),
            prefix_cache_hit_pct = hit,
            spec_acceptance_pct = accept,
            "engine"
        );
    }
}

fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        return 0.0;
    }
    round1(part as f64 * 100.0 / whole as f64)
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}
