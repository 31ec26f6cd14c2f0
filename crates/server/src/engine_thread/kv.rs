//! The engine thread's KV transfer commands (disaggregated prefill, ARCHITECTURE.md § KV
//! transfer), as [`EngineHandle`] methods: a prompt's cached blocks out
//! (`Engine::export_prefix`), another instance's blocks in (`Engine::import_prefix`). Both
//! run between steps.

use tandem_engine::kv_transfer::KvPayload;
use tandem_engine::EngineError;
use tandem_model::batch::{AdapterId, TokenId};
use tokio::sync::oneshot;

use super::{Command, EngineHandle, SubmitError, Worker};

/// Which prompt's blocks, under which cache salt and adapter.
#[derive(Debug, Clone)]
pub struct PromptKey {
    pub prompt: Vec<TokenId>,
    pub cache_salt: Option<String>,
    pub adapter: Option<AdapterId>,
}

pub(super) enum KvCommand {
    Export(PromptKey, oneshot::Sender<Result<KvPayload, EngineError>>),
    Import(
        PromptKey,
        Box<KvPayload>,
        oneshot::Sender<Result<usize, EngineError>>,
    ),
}

impl Worker {
    pub(super) fn handle_kv(&mut self, command: KvCommand) {
        let dead = || EngineError::InvalidConfig("the engine is not running".into());
        match command {
            KvCommand::Export(key, reply) => {
                let out = match self.alive {
                    true => {
                        let salt = key.cache_salt.as_deref();
                        self.engine.export_prefix(&key.prompt, salt, key.adapter)
                    }
                    false => Err(dead()),
                };
                let _ = reply.send(out);
            }
            KvCommand::Import(key, payload, reply) => {
                let out = match self.alive {
                    true => {
                        let salt = key.cache_salt.as_deref();
                        self.engine
                            .import_prefix(&key.prompt, salt, key.adapter, &payload)
                    }
                    false => Err(dead()),
                };
                let _ = reply.send(out);
            }
        }
    }
}

impl EngineHandle {
    /// The prefix cache's leading blocks of `key`'s prompt as a payload for another instance.
    pub async fn export_prefix(
        &self,
        key: PromptKey,
    ) -> Result<Result<KvPayload, EngineError>, SubmitError> {
        let (reply, reply_rx) = oneshot::channel();
        self.commands
            .send(Command::Kv(KvCommand::Export(key, reply)))
            .map_err(|_| SubmitError::Unavailable)?;
        reply_rx.await.map_err(|_| SubmitError::Unavailable)
    }

    /// Puts another instance's blocks of `key`'s prompt into the prefix cache; the number of
    /// blocks added.
    pub async fn import_prefix(
        &self,
        key: PromptKey,
        payload: KvPayload,
    ) -> Result<Result<usize, EngineError>, SubmitError> {
        let (reply, reply_rx) = oneshot::channel();
        let command = KvCommand::Import(key, Box::new(payload), reply);
        self.commands
            .send(Command::Kv(command))
            .map_err(|_| SubmitError::Unavailable)?;
        reply_rx.await.map_err(|_| SubmitError::Unavailable)
    }
}
