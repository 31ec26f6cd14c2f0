//! `tandem serve`: the OpenAI-compatible HTTP server (README.md § serve). Loads the model, builds
//! the engine from the engine flags, and serves until SIGINT or SIGTERM: the first drains (see
//! `tandem_server::drain`), a second stops at once; the exit status is 0 either way.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use anyhow::Result;
use clap::Args;
use tandem_server::ServerConfig;

use crate::args::{EngineArgs, ModelArgs};
use crate::engine_setup::build_engine;
use crate::runner_setup::PreparedModel;
use crate::serve_limits::{KeyArgs, LimitArgs};
use crate::serve_ops::OpsArgs;

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// Port to listen on (0 picks a free one; the address is printed on stderr).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    #[command(flatten)]
    key: KeyArgs,
    /// Seed of the random streams of requests that bring no seed.
    #[arg(long, value_name = "S", default_value_t = 0)]
    seed: u64,
    #[command(flatten)]
    engine: EngineArgs,
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    ops: OpsArgs,
    /// Serve `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter` (vLLM's, behind its
    /// `VLLM_ALLOW_RUNTIME_LORA_UPDATING`): clients with the API key may then load adapters
    /// from this machine's directories.
    #[arg(long)]
    allow_runtime_lora_updating: bool,
    /// Serve `POST /v1/kv/prefill`: compute prompts for decode instances and answer their KV
    /// blocks (the prefill side of disaggregated serving).
    #[arg(long)]
    kv_producer: bool,
    /// Continue from the prefill instances at HOST:PORT (tandem serving with --kv-producer,
    /// same model, flags and API key; several: each prompt goes to the least busy): each
    /// prompt is computed there and its KV blocks enter this server's prefix cache before
    /// the request runs here.
    #[arg(long, value_name = "HOST:PORT", num_args = 1..)]
    prefill_peer: Vec<String>,
    /// Seconds a request waits on the prefill peer before computing its prompt here.
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    prefill_peer_timeout: f64,
}

pub fn run(a: ServeArgs) -> Result<()> {
    a.ops.init_logging()?;
    // Every flag is checked before the model loads.
    let mut config = ServerConfig::new("tandem");
    config.api_key = a.key.key()?;
    config.limits = a.limits.limits()?;
    a.ops.apply(&mut config)?;
    config.addr = SocketAddr::new(a.host, a.port);
    config.trace_file = a.engine.trace.clone();
    for peer in &a.prefill_peer {
        tandem_server::prefill_peer::peer_uri(peer).map_err(anyhow::Error::msg)?;
    }
    let t = a.prefill_peer_timeout;
    if !(t.is_finite() && t > 0.0 && t <= 86_400.0) {
        anyhow::bail!("--prefill-peer-timeout {t}: give seconds in (0, 86400]");
    }
    config.prefill_peer_timeout = std::time::Duration::from_secs_f64(t);
    if a.model.lora.is_some() {
        anyhow::bail!(
            "--lora: serve picks an adapter by each request's `model` (--lora-modules NAME=PATH)"
        );
    }
    let (lm, target) = PreparedModel::load(&a.model, a.engine.kv_cache_dtype)?;
    let tokenizer = Arc::new(lm.tokenizer);
    let engine = build_engine(
        target,
        lm.eos_token_ids.clone(),
        &a.model,
        &a.engine,
        a.seed,
    )?;
    let mut names = Vec::new();
    if let Some(stem) = lm.path.file_name().and_then(|s| s.to_str()) {
        names.push(stem.to_string());
    }
    if let Some(given) = a.model.model.as_ref().and_then(|p| p.to_str()) {
        names.push(given.to_string());
    }
    names.push(lm.path.display().to_string());
    names.dedup();
    config.model_names = names;
    config.adapter_names = a
        .model
        .lora_modules
        .iter()
        .map(|(n, _)| n.clone())
        .collect();
    config.runtime_lora_updates = a.allow_runtime_lora_updating;
    config.lora_dtype = a.model.lora_dtype.into();
    config.kv_producer = a.kv_producer;
    config.prefill_peers = a.prefill_peer.clone();
    if let Some(clash) = (config.adapter_names.iter()).find(|n| config.model_names.contains(n)) {
        anyhow::bail!("--lora-modules {clash}: the name is the base model's");
    }
    let server = tandem_server::start_with_signals(engine, tokenizer, lm.chat_template, config)?;
    eprintln!(
        "tandem: serving {} at http://{} (model name `{}`)",
        lm.path.display(),
        server.addr(),
        server.served_name()
    );
    server.wait()?;
    Ok(())
}
