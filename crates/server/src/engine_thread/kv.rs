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

impl PromptKey {
    /// The cache salt and adapter, as the engine takes them.
    fn scope(&self) -> (Option<&str>, Option<AdapterId>) {
        (self.cache_salt.as_deref(), self.adapter)
    }
}

pub(super) enum KvCommand {
    /// The blocks from the given one on.
    Export(
        PromptKey,
        u32,
        oneshot::Sender<Result<KvPayload, EngineError>>,
    ),
    /// Leading blocks cached, and blocks a request could adopt.
    Cached(PromptKey, oneshot::Sender<(usize, usize)>),
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
            KvCommand::Export(key, skip, reply) => {
                let out = match self.alive {
                    true => self.engine.export_prefix(&key.prompt, key.scope(), skip),
                    false => Err(dead()),
                };
                let _ = reply.send(out);
            }
            KvCommand::Cached(key, reply) => {
                let _ = reply.send(self.engine.cached_prefix(&key.prompt, key.scope()));
            }
            KvCommand::Import(key, payload, reply) => {
                let out = match self.alive {
                    true => self
                        .engine
                        .import_prefix(&key.prompt, key.scope(), &payload),
                    false => Err(dead()),
                };
                let _ = reply.send(out);
            }
        }
    }
}

impl EngineHandle {
    /// The prefix cache's leading blocks of `key`'s prompt, from block `skip` on, as a
    /// payload for another instance.
    pub async fn export_prefix(
        &self,
        key: PromptKey,
        skip: u32,
    ) -> Result<Result<KvPayload, EngineError>, SubmitError> {
        let (reply, reply_rx) = oneshot::channel();
        self.commands
            .send(Command::Kv(KvCommand::Export(key, skip, reply)))
            .map_err(|_| SubmitError::Unavailable)?;
        reply_rx.await.map_err(|_| SubmitError::Unavailable)
    }

    /// How many leading blocks of `key`'s prompt the prefix cache holds, and how many a
    /// request for it could adopt.
    pub async fn cached_prefix(&self, key: PromptKey) -> Result<(usize, usize), SubmitError> {
        let (reply, reply_rx) = oneshot::channel();
        self.commands
            .send(Command::Kv(KvCommand::Cached(key, reply)))
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
