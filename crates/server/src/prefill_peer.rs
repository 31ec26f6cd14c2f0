//! The decode side of disaggregated serving (ARCHITECTURE.md § KV transfer): before a
//! request runs, its prompt is computed by a prefill peer (`POST /v1/kv/prefill` there) and
//! the blocks it answers are put into this engine's prefix cache; the request then adopts
//! them at admission and computes only its last partial block before decoding.
//!
//! With several peers, a prompt goes to the one with the fewest prompts in flight from here
//! (ties in turn); a peer that fails is left alone for a while (1 s, doubling with each
//! further failure up to a minute, so that a peer that hangs does not cost every request the
//! timeout) and the next one is asked. When none answers (down, slower than
//! `ServerConfig::prefill_peer_timeout`, refusing, or sending blocks of another model) the
//! request computes its prompt here: a fallback that is logged and counted, never an error
//! to the client. Results are the same either way (the prefix cache never changes a
//! result).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
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

/// Bytes of an error answer read for the log.
const ERROR_BODY_BYTES: usize = 4096;
/// The longest pause after failures.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// An HTTP client for one prefill peer.
#[derive(Debug)]
pub struct PrefillPeer {
    client: Client<HttpConnector, Full<Bytes>>,
    /// `host:port`, for the log.
    authority: String,
    uri: Uri,
    /// Fetches from this server waiting on the peer now.
    in_flight: AtomicUsize,
    timeout: Duration,
    /// Sent as `Authorization: Bearer` (this server's own key: the pair shares one).
    api_key: Option<String>,
    /// Consecutive failures, and until when the peer is left alone.
    backoff: Mutex<(u32, Option<Instant>)>,
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

impl PrefillPeer {
    /// A client of the peer at `authority` (`host:port`).
    pub fn new(
        authority: &str,
        timeout: Duration,
        api_key: Option<String>,
    ) -> Result<PrefillPeer, String> {
        Ok(PrefillPeer {
            client: Client::builder(TokioExecutor::new()).build_http(),
            authority: authority.to_string(),
            uri: peer_uri(authority)?,
            in_flight: AtomicUsize::new(0),
            timeout,
            api_key,
            backoff: Mutex::new((0, None)),
        })
    }

    fn backoff(&self) -> std::sync::MutexGuard<'_, (u32, Option<Instant>)> {
        self.backoff.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the peer is being left alone after failures.
    fn resting(&self) -> bool {
        self.backoff().1.is_some_and(|until| Instant::now() < until)
    }

    fn record(&self, ok: bool) {
        let mut b = self.backoff();
        if ok {
            *b = (0, None);
        } else {
            let pause = Duration::from_secs(1) * 2u32.saturating_pow(b.0.min(6));
            *b = (
                b.0.saturating_add(1),
                Some(Instant::now() + pause.min(MAX_BACKOFF)),
            );
        }
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
            let cap = if status == StatusCode::OK {
                limit
            } else {
                ERROR_BODY_BYTES
            };
            let read = Limited::new(response.into_body(), cap).collect().await;
            if status != StatusCode::OK {
                let text = read.map(|b| b.to_bytes()).unwrap_or_default();
                return Err(format!("{status}: {}", String::from_utf8_lossy(&text)));
            }
            read.map(|b| b.to_bytes())
                .map_err(|e| format!("reading the answer (at most {limit} bytes): {e}"))
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| format!("no answer within {:?}", self.timeout))?
    }
}

/// The prefill instances a decode server asks, and whose turn it is.
#[derive(Debug)]
pub struct PrefillPeers {
    peers: Vec<PrefillPeer>,
    turn: AtomicUsize,
}

impl PrefillPeers {
    /// Clients of the peers at `authorities` (`host:port` each); `None` for none.
    pub fn new(
        authorities: &[String],
        timeout: Duration,
        api_key: Option<String>,
    ) -> Result<Option<PrefillPeers>, String> {
        if authorities.is_empty() {
            return Ok(None);
        }
        let peers = authorities
            .iter()
            .map(|a| PrefillPeer::new(a, timeout, api_key.clone()))
            .collect::<Result<_, _>>()?;
        Ok(Some(PrefillPeers {
            peers,
            turn: AtomicUsize::new(0),
        }))
    }

    /// The peers to try, in order: those not resting after a failure, fewest fetches in
    /// flight first, ties starting from the one whose turn it is.
    fn order(&self) -> Vec<&PrefillPeer> {
        let n = self.peers.len();
        let turn = self.turn.fetch_add(1, Ordering::Relaxed) % n;
        let mut order: Vec<(usize, usize)> = (0..n)
            .map(|k| (turn + k) % n)
            .filter(|&i| !self.peers[i].resting())
            .map(|i| (self.peers[i].in_flight.load(Ordering::Relaxed), i))
            .collect();
        order.sort_by_key(|&(load, _)| load); // stable: ties keep the turn order
        order.into_iter().map(|(_, i)| &self.peers[i]).collect()
    }
}

/// Has a prefill peer compute the prompt of every request in `requests` (those with at
/// least one block to adopt) and puts the blocks into the prefix cache, all prompts at once.
/// `model` is the name the client used (the peer resolves adapters by the same names).
pub async fn prefill_remotely(app: &App, requests: &[SampleGroup], model: &str) {
    if app.prefill_peers.is_none() {
        return;
    }
    // What the engine will refuse anyway costs a peer nothing: a full queue, a prompt too long.
    let waiting = app.engine.snapshot().waiting;
    if waiting > 0 && waiting + requests.len() > app.config.limits.max_waiting_requests {
        return;
    }
    let (bs, max_len) = (app.limits.kv_block_size, app.limits.max_model_len);
    let mut tasks = tokio::task::JoinSet::new();
    let worth = |r: &&SampleGroup| r.0.prompt.len() > bs && r.0.prompt.len() < max_len;
    for (request, _) in requests.iter().filter(worth) {
        let key = PromptKey {
            prompt: request.prompt.clone(),
            cache_salt: request.limits.cache_salt.clone(),
            adapter: request.limits.adapter,
        };
        let (app, model) = (app.clone(), model.to_string());
        tasks.spawn(async move { prefill_one(&app, &model, key).await });
    }
    while tasks.join_next().await.is_some() {}
}

/// Imports `key`'s prompt's blocks from the first peer that answers; the blocks added.
async fn prefill_one(app: &App, model: &str, key: PromptKey) {
    let Some(peers) = &app.prefill_peers else {
        return;
    };
    let stats = &app.kv_transfer;
    let imported = async {
        let cached = app.engine.cached_prefix(key.clone()).await;
        let (cached, adoptable) = cached.map_err(|e| e.to_string())?;
        if cached >= adoptable {
            stats.cached_here.fetch_add(1, Ordering::Relaxed);
            return Ok(0);
        }
        let mut error = "every prefill peer failed recently; left alone for a while".into();
        for peer in peers.order() {
            match import_from(app, peer, model, &key, (cached, adoptable)).await {
                Ok(added) => return Ok(added),
                Err(e) => {
                    stats.peer_errors.fetch_add(1, Ordering::Relaxed);
                    error = format!("{}: {e}", peer.authority);
                }
            }
        }
        Err(error)
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
                "no prefill peer computed the prompt; computing it here"
            );
        }
    }
}

/// Fetches blocks `cached..adoptable` of `key`'s prompt from `peer` and imports them.
async fn import_from(
    app: &App,
    peer: &PrefillPeer,
    model: &str,
    key: &PromptKey,
    (cached, adoptable): (usize, usize),
) -> Result<usize, String> {
    let stats = &app.kv_transfer;
    stats.fetches.fetch_add(1, Ordering::Relaxed);
    let limit = HEADER_BYTES + (adoptable - cached) * app.limits.kv_bytes_per_block;
    let started = Instant::now();
    peer.in_flight.fetch_add(1, Ordering::Relaxed);
    let fetched = peer.fetch(model, key, cached, limit).await;
    peer.in_flight.fetch_sub(1, Ordering::Relaxed);
    let payload = fetched.and_then(|bytes| {
        let size = bytes.len();
        let payload = KvPayload::decode(Vec::from(bytes)).map_err(|e| e.to_string())?;
        stats.on_fetched(payload.num_blocks(), size, started.elapsed());
        Ok(payload)
    });
    let added = match payload {
        Ok(payload) => match app.engine.import_prefix(key.clone(), payload).await {
            Ok(Ok(added)) => Ok(added),
            Ok(Err(e)) => Err(e.to_string()),
            Err(e) => Err(e.to_string()),
        },
        Err(e) => Err(e),
    };
    peer.record(added.is_ok());
    added
}
