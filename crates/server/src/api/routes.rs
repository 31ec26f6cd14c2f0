//! The router: routes, the API-key check, `x-request-id`, `/health`, `/v1/models`, and
//! JSON 404/405.

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderValue, Request, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::json;
use std::sync::Arc;
use tandem_model::batch::AdapterId;

use super::{adapters, chat, completions, kv_prefill, score, tokenize, App};
use crate::access_log::access_log;
use crate::drain::{admission, Drain};
use crate::error::ApiError;
use crate::http_limits::{body_limits, BodyLimits};
use crate::metrics::{render, Gauges, LoraGauge};

/// All routes over `app`, behind the layers (outermost first): `x-request-id`, the access
/// line, admission (drain and overflow refusals), the API key (every route but `/health`, and
/// `/metrics` unless `metrics_require_key`; unknown routes too, so they answer 404 only with
/// the key), and the body limits.
pub fn router(app: App, drain: Arc<Drain>) -> Router {
    let limit = app.config.limits.max_body_bytes;
    let body = BodyLimits {
        max_bytes: limit,
        timeout: app.config.connections.body_timeout,
    };
    let mut routes = Router::new();
    if app.config.runtime_lora_updates {
        routes = routes
            .route("/v1/load_lora_adapter", post(adapters::load_lora_adapter))
            .route(
                "/v1/unload_lora_adapter",
                post(adapters::unload_lora_adapter),
            );
    }
    if app.config.kv_producer {
        routes = routes.route("/v1/kv/prefill", post(kv_prefill::prefill));
    }
    routes
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/score", post(score::score))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/reset_prefix_cache", post(reset_prefix_cache))
        .route("/debug/trace", post(debug_trace))
        .route("/tokenizer_info", get(tokenize::tokenizer_info))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(body, body_limits))
        .layer(middleware::from_fn_with_state(app.clone(), require_api_key))
        .layer(middleware::from_fn_with_state(drain, admission))
        .layer(middleware::from_fn(access_log))
        .layer(middleware::from_fn_with_state(app.clone(), request_id))
        .with_state(app)
}

/// `POST /reset_prefix_cache` (vLLM's admin route): empties the prefix cache;
/// answers `{"reset_blocks": n}`.
async fn reset_prefix_cache(State(app): State<App>) -> Response {
    match app.engine.reset_prefix_cache().await {
        Ok(n) => axum::Json(json!({ "reset_blocks": n })).into_response(),
        Err(e) => ApiError::unavailable(e.to_string()).into_response(),
    }
}

/// `POST /debug/trace`: the engine's step timeline (Chrome trace JSON, the last steps of its
/// ring), also written to the `--trace` file; 404 when the server records none.
async fn debug_trace(State(app): State<App>) -> Response {
    match app.engine.dump_trace().await {
        Ok(Some(json)) => (
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            json,
        )
            .into_response(),
        Ok(None) => {
            ApiError::not_found("the step trace is off: start the server with --trace FILE")
                .into_response()
        }
        Err(e) => ApiError::unavailable(e.to_string()).into_response(),
    }
}

/// The `x-request-id` header.
const REQUEST_ID: &str = "x-request-id";

/// Echoes the request's `x-request-id` on its response (every route, errors included), or
/// a fresh one when it brings none or one that is not 1 to 128 visible ASCII characters; the
/// inner layers read it from the request.
async fn request_id(State(app): State<App>, mut req: Request<Body>, next: Next) -> Response {
    let given = req
        .headers()
        .get(REQUEST_ID)
        .filter(|v| {
            let b = v.as_bytes();
            (1..=128).contains(&b.len()) && b.iter().all(|c| c.is_ascii_graphic())
        })
        .cloned();
    let id = match given {
        Some(v) => v,
        None => HeaderValue::from_str(&app.response_id("req"))
            .unwrap_or_else(|_| HeaderValue::from_static("req")),
    };
    req.headers_mut().insert(REQUEST_ID, id.clone());
    let mut response = next.run(req).await;
    response.headers_mut().insert(REQUEST_ID, id);
    response
}

async fn not_found(uri: Uri) -> Response {
    ApiError::route_not_found(uri.path()).into_response()
}

async fn method_not_allowed() -> Response {
    ApiError::method_not_allowed().into_response()
}

/// Rejects requests without the right `Authorization: Bearer <key>` when a key is set, on
/// every path but `/health` and, unless `metrics_require_key`, `/metrics` (vLLM's rule: only
/// the API routes need the key; a Prometheus scraper rarely carries one).
async fn require_api_key(State(app): State<App>, req: Request<Body>, next: Next) -> Response {
    let path = req.uri().path();
    let open = path == "/health" || (path == "/metrics" && !app.config.metrics_require_key);
    if let (Some(key), false) = (&app.config.api_key, open) {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !constant_time_eq(given.trim().as_bytes(), key.as_bytes()) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

/// Compares two byte strings in time that depends only on their lengths, not on where
/// they first differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let len = a.len().max(b.len());
    let mut diff = u8::from(a.len() != b.len());
    for i in 0..len {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

async fn health(State(app): State<App>) -> Response {
    let s = app.engine.snapshot();
    let status = if s.alive {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = json!({
        "status": if s.alive { "ok" } else { "unavailable" },
        "running": s.running,
        "waiting": s.waiting,
        "in_flight": s.in_flight,
        "disconnects": s.disconnects,
        "kv_free_blocks": s.kv_free_blocks,
        "kv_total_blocks": s.kv_total_blocks,
    });
    (status, axum::Json(body)).into_response()
}

/// Prometheus text exposition of the serving metrics (see [`crate::metrics`]).
async fn metrics(State(app): State<App>) -> Response {
    let s = app.engine.snapshot();
    let gauges = Gauges {
        running: s.running,
        waiting: s.waiting,
        kv_used_blocks: s.kv_total_blocks.saturating_sub(s.kv_free_blocks),
        kv_total_blocks: s.kv_total_blocks,
    };
    let named = |ids: &[AdapterId]| -> Vec<String> {
        ids.iter()
            .filter_map(|&a| app.adapters.name_of(a))
            .collect()
    };
    let lora_enabled = !app.config.adapter_names.is_empty() || app.config.runtime_lora_updates;
    let lora = lora_enabled.then(|| LoraGauge {
        running: named(&s.adapters[0]),
        waiting: named(&s.adapters[1]),
        max_lora: app.adapters.loaded().len(),
        time: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64()),
    });
    let mut text = render(app.config.served_name(), gauges, &s.metrics, lora.as_ref());
    if app.config.kv_producer || !app.config.prefill_peers.is_empty() {
        text.push_str(&app.kv_transfer.render(app.config.served_name()));
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// The card `/v1/models` lists for the base model, or for one of its LoRA adapters (with
/// the base model as `parent`, as vLLM lists them).
fn model_card(app: &App, adapter: Option<AdapterId>) -> serde_json::Value {
    let base = app.config.served_name();
    let mut card = json!({
        "id": base,
        "object": "model",
        "created": app.started,
        "owned_by": "tandem",
        "root": base,
        "parent": null,
        "max_model_len": app.limits.max_model_len,
    });
    if let Some(name) = adapter.and_then(|a| app.adapters.name_of(a)) {
        card["id"] = json!(name);
        card["root"] = json!(name);
        card["parent"] = json!(base);
    }
    card
}

async fn models(State(app): State<App>) -> Response {
    let adapters = app.adapters.loaded().into_iter().map(|(id, _)| Some(id));
    let data: Vec<_> = std::iter::once(None)
        .chain(adapters)
        .map(|a| model_card(&app, a))
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

async fn model(State(app): State<App>, Path(id): Path<String>) -> Response {
    match app.check_model(Some(&id)) {
        Ok(served) => axum::Json(model_card(&app, served.adapter)).into_response(),
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn constant_time_eq_is_equality() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }
}
