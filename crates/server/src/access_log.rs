//! One access line per request (README.md § Logs), through `tracing` with target
//! `tandem::access`: request id, method, route, status, prompt / output / cached tokens, time to
//! first token, total time and finish reason.
//!
//! The [`access_log`] middleware makes an [`AccessRecord`] and runs the handler with it as a
//! task-local; a [`crate::generation::Generation`] made inside picks it up and fills in the
//! tokens as they come. The line is written when the last holder lets go: after the handler
//! for a plain body, after the last byte of an SSE stream (the stream owns the generation).
//!
//! Levels: 5xx at `warn`, `/health` and `/metrics` at `debug` (probes every few seconds would
//! drown the rest), everything else at `info`.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

use crate::generation::Finish;

tokio::task_local! {
    static CURRENT: AccessRecord;
}

/// The record the current request's handler runs with, if any.
pub fn current() -> Option<AccessRecord> {
    CURRENT.try_with(Clone::clone).ok()
}

/// A request's access line in the making; written when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct AccessRecord(Arc<Mutex<Access>>);

#[derive(Debug)]
struct Access {
    request_id: String,
    method: String,
    route: String,
    status: u16,
    started: Instant,
    first_token: Option<Instant>,
    prompt_tokens: Option<usize>,
    output_tokens: usize,
    cached_tokens: usize,
    finish: Vec<&'static str>,
}

impl AccessRecord {
    fn with<R>(&self, f: impl FnOnce(&mut Access) -> R) -> R {
        match self.0.lock() {
            Ok(mut a) => f(&mut a),
            Err(poisoned) => f(&mut poisoned.into_inner()),
        }
    }

    /// The prompt tokens of the request (all its prompts).
    pub fn prompt_tokens(&self, n: usize) {
        self.with(|a| a.prompt_tokens = Some(n));
    }

    /// Prompt tokens found in the prefix cache.
    pub fn cached_tokens(&self, n: usize) {
        self.with(|a| a.cached_tokens += n);
    }

    /// One generated token (the first sets the time to first token).
    pub fn token(&self) {
        self.with(|a| {
            a.output_tokens += 1;
            a.first_token.get_or_insert_with(Instant::now);
        });
    }

    /// A choice's finish reason.
    pub fn finished(&self, finish: &Finish) {
        self.with(|a| a.finish.push(finish.as_str()));
    }
}

impl Drop for Access {
    fn drop(&mut self) {
        let total_ms = self.started.elapsed().as_secs_f64() * 1e3;
        let ttft_ms = self
            .first_token
            .map(|t| (t - self.started).as_secs_f64() * 1e3);
        let finish = (!self.finish.is_empty()).then(|| self.finish.join(","));
        macro_rules! line {
            ($level:expr) => {
                tracing::event!(
                    target: "tandem::access",
                    $level,
                    request_id = %self.request_id,
                    method = %self.method,
                    route = %self.route,
                    status = self.status,
                    prompt_tokens = self.prompt_tokens,
                    output_tokens = self.output_tokens,
                    cached_tokens = self.cached_tokens,
                    ttft_ms = ttft_ms.map(round1),
                    total_ms = round1(total_ms),
                    finish_reason = finish.as_deref(),
                    "request"
                )
            };
        }
        if self.status >= 500 {
            line!(tracing::Level::WARN);
        } else if matches!(self.route.as_str(), "/health" | "/metrics") {
            line!(tracing::Level::DEBUG);
        } else {
            line!(tracing::Level::INFO);
        }
    }
}

fn round1(ms: f64) -> f64 {
    (ms * 10.0).round() / 10.0
}

/// The middleware (inside the one that sets `x-request-id` on the request).
pub async fn access_log(req: Request, next: Next) -> Response {
    let route = req.uri().path().to_string();
    let request_id = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_string();
    // Events inside the handler (errors) carry the request's id through this span.
    let span = tracing::info_span!("request", id = %request_id);
    let record = AccessRecord(Arc::new(Mutex::new(Access {
        request_id,
        method: req.method().to_string(),
        route,
        status: 0,
        started: Instant::now(),
        first_token: None,
        prompt_tokens: None,
        output_tokens: 0,
        cached_tokens: 0,
        finish: Vec::new(),
    })));
    let response = CURRENT
        .scope(record.clone(), next.run(req).instrument(span))
        .await;
    record.with(|a| a.status = response.status().as_u16());
    response
}
