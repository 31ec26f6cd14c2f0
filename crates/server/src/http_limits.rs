//! Request-body limits applied before any handler (ARCHITECTURE.md § Connections and drain):
//!
//! - a `Content-Length` over `--max-body-bytes` gets 413 before the body is read, so hyper,
//!   which sends `100 Continue` only when the body is first polled, never sends it;
//! - the whole body must arrive within `--body-timeout` (a total deadline, not a gap between
//!   chunks, so a client trickling one byte at a time is cut too): else 408 and the
//!   connection closes;
//! - a chunked body over the limit gets 413 as soon as it passes the limit.
//!
//! The body is read with `http_body_util::Limited` under `tokio::time::timeout` and handed on
//! in memory; the handlers read it again for free.
//!
//! A request with both `Content-Length` and `Transfer-Encoding` never gets here with both:
//! hyper follows RFC 9112 § 6.1 (the length is dropped, the chunked coding frames the body,
//! the connection closes after the response), so it cannot smuggle a second request.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};

use crate::error::ApiError;

/// What [`body_limits`] enforces.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    pub max_bytes: usize,
    pub timeout: Duration,
}

/// The middleware: see the module docs.
pub async fn body_limits(State(limits): State<BodyLimits>, req: Request, next: Next) -> Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.max_bytes as u64) {
        return closing(ApiError::too_large(limits.max_bytes));
    }
    let (parts, body) = req.into_parts();
    let read = Limited::new(body, limits.max_bytes).collect();
    let bytes = match tokio::time::timeout(limits.timeout, read).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
            return closing(ApiError::too_large(limits.max_bytes));
        }
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "reading a request body failed");
            return closing(ApiError::bad_request(
                format!("the request body could not be read: {e}"),
                None,
            ));
        }
        Err(_) => {
            tracing::debug!(timeout = ?limits.timeout, "request body timed out");
            return closing(body_timeout(limits.timeout));
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// 408 for a body that did not arrive in time.
fn body_timeout(timeout: Duration) -> ApiError {
    ApiError {
        status: StatusCode::REQUEST_TIMEOUT,
        message: format!(
            "the request body did not arrive within {} s",
            timeout.as_secs_f64()
        ),
        kind: "invalid_request_error",
        param: None,
        code: Some("body_timeout"),
    }
}

/// `error` as a response that closes the connection (the rest of its body is unread).
pub fn closing(error: ApiError) -> Response {
    let mut response = error.into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}
