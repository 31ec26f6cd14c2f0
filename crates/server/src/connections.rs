//! Accepting and serving connections (ARCHITECTURE.md § Connections and drain): hyper's HTTP/1
//! connection builder serves each accepted socket with the router, so the limits are hyper's
//! own mechanisms rather than hand-rolled ones:
//!
//! - **header timeout** ([`hyper::server::conn::http1::Builder::header_read_timeout`]): hyper
//!   starts its timer whenever a connection waits for a request head, on a new connection and
//!   on a kept-alive one between requests, so it bounds both a slow-header client and an idle
//!   keep-alive connection; either is closed when it fires;
//! - **body timeout**: the whole body must arrive within it (see [`crate::http_limits`]);
//! - **write timeout**: a connection whose writes are blocked that long (a client that
//!   stopped reading) is closed, and its request aborted (see [`crate::write_stall`]);
//! - **connection cap**: `max_connections` sockets are served normally. One more is still
//!   accepted and read, but as an *overflow* connection: keep-alive off, a short header timeout,
//!   and every route but `/health` answers 503 with `Retry-After` and `Connection: close`
//!   (see [`crate::drain::admission`]). A client so learns why it was refused, and a load
//!   balancer's health check still gets an answer while idle clients hold every slot; closing
//!   at once would make both look like a dead server.
//!
//! Every connection is watched by hyper-util's [`GracefulShutdown`], which at the end of a
//! drain lets responses in progress finish and closes idle connections.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use hyper::body::Incoming;
use hyper::Request;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tower::ServiceExt;

use crate::write_stall::StallGuard;

/// Timeouts and the connection cap (the `tandem serve` flags `--header-timeout`,
/// `--body-timeout`, `--max-connections`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Longest wait for a complete request head, on a new connection or between two
    /// requests of a kept-alive one; then the connection is closed.
    pub header_timeout: Duration,
    /// Longest time to receive a whole request body; then 408 and the connection closes.
    pub body_timeout: Duration,
    /// Longest time a write may stay blocked (the client reads nothing); then the
    /// connection closes and its request is aborted.
    pub write_timeout: Duration,
    /// Connections served normally at once; more are answered 503 (except `/health`).
    pub max_connections: usize,
}

/// Default `--header-timeout`: longer than any sane client takes to send its headers, short
/// enough that idle sockets do not pile up (nginx's `client_header_timeout` is 60 s, its
/// keep-alive 75 s; uvicorn's keep-alive is 5 s).
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `--body-timeout`: room for the 4 MiB default body over a slow link.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Default `--write-timeout`: nginx's `send_timeout`.
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(60);
/// Default `--max-connections`: below the usual 1,024 open-file limit, with room for the
/// overflow connections that answer 503.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
/// The header timeout of an overflow connection, at most: it gets one request.
const OVERFLOW_HEADER_TIMEOUT: Duration = Duration::from_secs(2);

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            write_timeout: DEFAULT_WRITE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

impl ConnectionLimits {
    /// Refuses zero values, naming the flag.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_connections == 0 {
            return Err("--max-connections must be at least 1".into());
        }
        if self.header_timeout.is_zero() {
            return Err("--header-timeout must be positive".into());
        }
        if self.body_timeout.is_zero() {
            return Err("--body-timeout must be positive".into());
        }
        if self.write_timeout.is_zero() {
            return Err("--write-timeout must be positive".into());
        }
        Ok(())
    }
}

/// Marks a request that came on an overflow connection (over `max_connections`).
#[derive(Debug, Clone, Copy)]
pub struct Overflow;

/// Serves accepted sockets with the router under the limits.
#[derive(Debug)]
pub struct Connections {
    router: Router,
    limits: ConnectionLimits,
    slots: Arc<Semaphore>,
    graceful: GracefulShutdown,
}

impl Connections {
    pub fn new(router: Router, limits: ConnectionLimits) -> Connections {
        let slots = Arc::new(Semaphore::new(limits.max_connections));
        Connections {
            router,
            limits,
            slots,
            graceful: GracefulShutdown::new(),
        }
    }

    /// Accepts connections until `stop` resolves; returns its output. A failed accept
    /// (out of file descriptors) is logged and retried shortly, as axum's `serve` does.
    pub async fn accept_until<T>(
        &self,
        listener: &TcpListener,
        stop: impl Future<Output = T>,
    ) -> T {
        tokio::pin!(stop);
        loop {
            tokio::select! {
                out = &mut stop => return out,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => self.serve(stream),
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                },
            }
        }
    }

    /// Serves one socket on its own task: normally while a slot is free, else as overflow.
    fn serve(&self, stream: TcpStream) {
        let permit = self.slots.clone().try_acquire_owned().ok();
        let overflow = permit.is_none();
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder.timer(TokioTimer::new());
        if overflow {
            tracing::debug!("connection over --max-connections: serving it as overflow");
            let timeout = self.limits.header_timeout.min(OVERFLOW_HEADER_TIMEOUT);
            builder.header_read_timeout(timeout).keep_alive(false);
        } else {
            builder.header_read_timeout(self.limits.header_timeout);
        }
        let service = self
            .router
            .clone()
            .map_request(move |req: Request<Incoming>| {
                let mut req = req.map(Body::new);
                if overflow {
                    req.extensions_mut().insert(Overflow);
                }
                req
            });
        let io = StallGuard::new(TokioIo::new(stream), self.limits.write_timeout);
        let conn = builder.serve_connection(io, TowerToHyperService::new(service));
        let conn = self.graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }

    /// Lets responses in progress finish and closes idle connections, for at most `grace`.
    pub async fn shut_down(self, grace: Duration) {
        if tokio::time::timeout(grace, self.graceful.shutdown())
            .await
            .is_err()
        {
            tracing::warn!(
                ?grace,
                "connections still open after the grace period; closing"
            );
        }
    }
}
