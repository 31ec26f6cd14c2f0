//! Graceful drain (ARCHITECTURE.md § Connections and drain). On the first SIGTERM or SIGINT
//! (or [`crate::RunningServer::drain`]) the server keeps its socket open but admits nothing
//! new: `/health` answers 503 at once, so a load balancer stops routing to it, and every other
//! request gets 503 with `Retry-After` and `Connection: close`. Requests already admitted run
//! to their end, for at most `--shutdown-timeout`; what still runs then is aborted (its
//! `finish_reason` is `"abort"`, and a warning names how many). A second signal stops at once.
//!
//! [`admission`] is the middleware that refuses, also for overflow connections (see
//! [`crate::connections`]); it counts the requests inside handlers, so a drain does not end
//! while one is between admission and the engine.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::connections::Overflow;
use crate::engine_thread::EngineHandle;
use crate::error::ApiError;
use crate::http_limits::closing;

/// Whether a drain has begun, and how many requests are inside handlers.
#[derive(Debug, Default)]
pub struct Drain {
    draining: AtomicBool,
    in_handlers: AtomicUsize,
}

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// Every admitted request finished.
    Idle,
    /// `--shutdown-timeout` passed with requests still running.
    TimedOut,
    /// A second signal (or an immediate shutdown) cut it short.
    Forced,
}

impl Drain {
    /// Stops admitting requests; `/health` turns 503.
    pub fn begin(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Waits until nothing is admitted and running, `timeout` passes, or `forced` resolves.
    pub async fn settle(
        &self,
        engine: &EngineHandle,
        timeout: Duration,
        forced: impl std::future::Future<Output = ()>,
    ) -> Settled {
        let idle = async {
            loop {
                let busy =
                    self.in_handlers.load(Ordering::SeqCst) > 0 || engine.snapshot().in_flight > 0;
                if !busy {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::select! {
            _ = idle => Settled::Idle,
            _ = tokio::time::sleep(timeout) => Settled::TimedOut,
            _ = forced => Settled::Forced,
        }
    }
}

/// Refuses requests while draining or on an overflow connection (503, `/health` included
/// while draining, `/health` answered on overflow), and counts those it lets in.
pub async fn admission(State(drain): State<Arc<Drain>>, req: Request, next: Next) -> Response {
    let health = req.uri().path() == "/health";
    if drain.is_draining() {
        if health {
            let body = json!({"status": "draining"});
            return (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
        }
        return closing(ApiError::unavailable(
            "the server is shutting down; retry on another replica",
        ));
    }
    if req.extensions().get::<Overflow>().is_some() && !health {
        return closing(ApiError::unavailable(
            "too many connections (--max-connections); retry later",
        ));
    }
    drain.in_handlers.fetch_add(1, Ordering::SeqCst);
    // A guard, so a handler dropped mid-way (client gone) is uncounted too.
    let _inside = InHandler(&drain.in_handlers);
    next.run(req).await
}

/// Uncounts a request when its handler ends or is dropped.
struct InHandler<'a>(&'a AtomicUsize);

impl Drop for InHandler<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
