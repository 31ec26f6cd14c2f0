//! The decode side of disaggregated serving (ARCHITECTURE.md § KV transfer): before a
//! request runs, its prompt is computed by the prefill peer (`POST /v1/kv/prefill` there) and
//! the blocks it answers are put into this engine's prefix cache; the request then adopts
//! them at admission and computes only its last partial block before decoding.
//!
//! A peer that is down, slow (`ServerConfig::prefill_peer_timeout`), refuses, or answers
//! blocks of another model leaves the request to compute its prompt here: a fallback that is
//! logged and counted, never an error to the client. Results are the same either way (the
//! prefix cache never changes a result).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{header, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tandem_engine::kv_transfer::{KvPayload, HEADER_BYTES};

use crate::api::App;
use crate::engine_thread::{PromptKey, SampleGroup};

/// An HTTP client for one prefill peer.
#[derive(Debug, Clone)]
pub struct PrefillPeer {
    client: Client<HttpConnector, Full<Bytes>>,
    uri: Uri,
    timeout: Duration,
    /// Sent as `Authorization: Bearer` (this server's own key: the pair shares one).
    api_key: Option<String>,
}

impl PrefillPeer {
    /// A client of the peer at `authority` (`host:port`).
    pub fn new(
        authority: &str,
        timeout: Duration,
        api_key: Option<String>,
    ) -> Result<PrefillPeer, String> {
        let uri = peer_uri(authority)?;
        Ok(PrefillPeer {
            client: Client::builder(TokioExecutor::new()).build_http(),
            uri,
            timeout,
            api_key,
        })
    }

    /// The peer's blocks of `key`'s prompt from block `skip` on, at most `limit` bytes.
    async fn fetch(
        &self,
        model: &str,
        key: &PromptKey,
        skip: usize,
        limit: usize,
    ) -> Result<Bytes, String> {
        let body = serde_json::json!({
            "model": model,
            "prompt_token_ids": key.prompt.iter().map(|t| t.0).collect::<Vec<u32>>(),
            "cache_salt": key.cache_salt,
            "skip_blocks": skip,
        });
        let mut request =
            Request::post(self.uri.clone()).header(header::CONTENT_TYPE, "application/json");
        if let Some(k) = &self.api_key {
            request = request.header(header::AUTHORIZATION, format!("Bearer {k}"));
        }
        let request = request
            .body(Full::new(Bytes::from(body.to_string())))
            .map_err(|e| e.to_string())?;
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| e.to_string())?;
            let status = response.status();
            let bytes = Limited::new(response.into_body(), limit)
                .collect()
                .await
                .map_err(|e| format!("reading the answer: {e}"))?
                .to_bytes();
            if status != StatusCode::OK {
                let text = String::from_utf8_lossy(&bytes[..bytes.len().min(300)]).into_owned();
                return Err(format!("{status}: {text}"));
            }
            Ok(bytes)
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| format!("no answer within {:?}", self.timeout))?
    }
}

/// The URI of the prefill route of the peer at `authority` (`host:port`), or why it is not
/// one.
pub fn peer_uri(authority: &str) -> Result<Uri, String> {
    let not = |why: String| format!("--prefill-peer {authority:?} is not host:port{why}");
    let uri = format!("http://{authority}/v1/kv/prefill")
        .parse::<Uri>()
        .map_err(|e| not(format!(": {e}")))?;
    let a = uri.authority().ok_or_else(|| not(String::new()))?;
    if a.as_str() != authority || a.port_u16().is_none() {
        return Err(not(String::new()));
    }
    Ok(uri)
}

/// Has the prefill peer compute the prompt of every request in `requests` (those with at
/// least one block to adopt) and puts the blocks into the prefix cache, all prompts at once.
/// `model` is the name the client used (the peer resolves adapters by the same names).
pub async fn prefill_remotely(app: &App, requests: &[SampleGroup], model: &str) {
    let Some(peer) = &app.prefill_peer else {
        return;
    };
    let bs = app.limits.kv_block_size;
    let mut tasks = tokio::task::JoinSet::new();
    for (request, _) in requests.iter().filter(|(r, _)| r.prompt.len() > bs) {
        let key = PromptKey {
            prompt: request.prompt.clone(),
            cache_salt: request.limits.cache_salt.clone(),
            adapter: request.limits.adapter,
        };
        let (app, peer, model) = (app.clone(), peer.clone(), model.to_string());
        tasks.spawn(async move { prefill_one(&app, &peer, &model, key).await });
    }
    while tasks.join_next().await.is_some() {}
}

async fn prefill_one(app: &App, peer: &PrefillPeer, model: &str, key: PromptKey) {
    let stats = &app.kv_transfer;
    let imported = async {
        let cached = app.engine.cached_prefix(key.clone()).await;
        let (cached, usable) = cached.map_err(|e| e.to_string())?;
        if cached >= usable {
            stats.cached_here.fetch_add(1, Ordering::Relaxed);
            return Ok(0);
        }
        stats.fetches.fetch_add(1, Ordering::Relaxed);
        // The peer sends every full block from `cached` on.
        let bs = app.limits.kv_block_size;
        let full = key.prompt.len() / bs;
        let limit = HEADER_BYTES + (full - cached) * bs * app.limits.kv_bytes_per_token;
        let started = Instant::now();
        let bytes = peer.fetch(model, &key, cached, limit).await?;
        let payload = KvPayload::decode(Vec::from(bytes.clone())).map_err(|e| e.to_string())?;
        stats.on_fetched(payload.num_blocks(), bytes.len(), started.elapsed());
        let added = app.engine.import_prefix(key.clone(), payload).await;
        added.map_err(|e| e.to_string())?.map_err(|e| e.to_string())
    };
    match imported.await {
        Ok(added) => {
            stats
                .blocks_imported
                .fetch_add(added as u64, Ordering::Relaxed);
        }
        Err(e) => {
            stats.failures.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                error = %e,
                prompt_tokens = key.prompt.len(),
                "the prefill peer did not compute the prompt; computing it here"
            );
        }
    }
}
