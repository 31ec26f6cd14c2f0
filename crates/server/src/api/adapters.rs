//! LoRA adapters by name: which name is which adapter of the engine's runner, and vLLM's
//! runtime routes `POST /v1/load_lora_adapter` (`{"lora_name", "lora_path"}`) and
//! `POST /v1/unload_lora_adapter` (`{"lora_name"}`), served only with
//! `ServerConfig::runtime_lora_updates` (vLLM gates them behind
//! `VLLM_ALLOW_RUNTIME_LORA_UPDATING`: they read files of the server's machine).
//!
//! An adapter is read and checked on the blocking pool, then registered on the engine thread
//! between steps; its name answers requests from then on. Unloading is refused while a
//! request runs or waits with the adapter. Ids are never reused, so cached blocks and
//! requests keyed by an unloaded adapter can never meet a new one.

use std::path::PathBuf;
use std::sync::RwLock;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tandem_model::batch::AdapterId;
use tandem_model::lora::load_peft_adapter;

use super::body::{fields, json_object};
use super::{off_the_workers, App};
use crate::error::{ApiError, ApiResult};

/// The adapters' names, by id (`None`: unloaded), and a lock that serialises updates.
#[derive(Debug, Default)]
pub struct AdapterNames {
    names: RwLock<Vec<Option<String>>>,
    updates: tokio::sync::Mutex<()>,
}

impl AdapterNames {
    /// The adapters registered at start-up, adapter `i` named `names[i]`.
    pub fn new(names: &[String]) -> AdapterNames {
        AdapterNames {
            names: RwLock::new(names.iter().cloned().map(Some).collect()),
            updates: tokio::sync::Mutex::new(()),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<Option<String>>> {
        self.names
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The adapter named `name`.
    pub fn resolve(&self, name: &str) -> Option<AdapterId> {
        let names = self.read();
        let i = names.iter().position(|n| n.as_deref() == Some(name))?;
        Some(AdapterId(i as u32))
    }

    /// The name of adapter `id`, while it is loaded.
    pub fn name_of(&self, id: AdapterId) -> Option<String> {
        self.read().get(id.0 as usize)?.clone()
    }

    /// Every loaded adapter, in id order.
    pub fn loaded(&self) -> Vec<(AdapterId, String)> {
        let names = self.read();
        let named = names.iter().enumerate();
        named
            .filter_map(|(i, n)| Some((AdapterId(i as u32), n.clone()?)))
            .collect()
    }

    fn set(&self, id: AdapterId, name: Option<String>) {
        let mut names = self
            .names
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let i = id.0 as usize;
        if names.len() <= i {
            names.resize(i + 1, None);
        }
        names[i] = name;
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LoadFields {
    lora_name: String,
    lora_path: PathBuf,
    /// vLLM's; tandem reads its adapters from local directories only.
    #[serde(default)]
    #[allow(dead_code)]
    load_inplace: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UnloadFields {
    lora_name: String,
    /// vLLM's (ignored there too).
    #[serde(default)]
    #[allow(dead_code)]
    lora_int_id: Option<u64>,
}

/// `POST /v1/load_lora_adapter`.
pub async fn load_lora_adapter(
    State(app): State<App>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match load(app, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// `POST /v1/unload_lora_adapter`.
pub async fn unload_lora_adapter(
    State(app): State<App>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match unload(app, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn load(app: App, body: Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    let f: LoadFields = fields(&json_object(body, app.config.limits.max_body_bytes)?)?;
    let _one_at_a_time = app.adapters.updates.lock().await;
    if f.lora_name.is_empty() || app.config.model_names.contains(&f.lora_name) {
        return Err(ApiError::field(
            "lora_name",
            "must be a new name, not the base model's",
        ));
    }
    if app.adapters.resolve(&f.lora_name).is_some() {
        let msg = format!("the LoRA adapter '{}' has already been loaded", f.lora_name);
        return Err(ApiError::field("lora_name", msg));
    }
    let adapter = {
        let (config, path) = (app.model_config.clone(), f.lora_path.clone());
        let dtype = app.config.lora_dtype;
        let read = move || {
            let adapter = load_peft_adapter(&path, &config).map_err(|e| e.to_string());
            adapter.map(|a| a.with_dtype(dtype))
        };
        off_the_workers(move || Ok(read())).await?
    }
    .map_err(|e| ApiError::field("lora_path", e))?;
    let id = match app.engine.add_adapter(adapter).await {
        Ok(Ok(id)) => id,
        Ok(Err(e)) => return Err(ApiError::field("lora_path", e.to_string())),
        Err(e) => return Err(ApiError::unavailable(e.to_string())),
    };
    app.adapters.set(id, Some(f.lora_name.clone()));
    let text = format!(
        "Success: LoRA adapter '{}' added successfully.",
        f.lora_name
    );
    Ok(text.into_response())
}

async fn unload(app: App, body: Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    let f: UnloadFields = fields(&json_object(body, app.config.limits.max_body_bytes)?)?;
    let _one_at_a_time = app.adapters.updates.lock().await;
    let Some(id) = app.adapters.resolve(&f.lora_name) else {
        return Err(ApiError::not_found(format!(
            "the LoRA adapter '{}' cannot be found",
            f.lora_name
        )));
    };
    match app.engine.remove_adapter(id).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(ApiError::field("lora_name", e.to_string())),
        Err(e) => return Err(ApiError::unavailable(e.to_string())),
    }
    app.adapters.set(id, None);
    let text = format!(
        "Success: LoRA adapter '{}' removed successfully.",
        f.lora_name
    );
    Ok(text.into_response())
}
