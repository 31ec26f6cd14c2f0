//! The engine thread's admin commands, as [`EngineHandle`] methods: emptying the prefix
//! cache, dumping the step trace, and registering and forgetting LoRA adapters.

use tandem_engine::EngineError;
use tandem_model::batch::AdapterId;
use tandem_model::lora::LoraAdapter;
use tokio::sync::oneshot;

use super::{Command, EngineHandle, SubmitError};

impl EngineHandle {
    /// Empties the prefix cache (results never change, only the cost of later prefills);
    /// returns the number of blocks it forgot.
    pub async fn reset_prefix_cache(&self) -> Result<usize, SubmitError> {
        let (reply, reply_rx) = oneshot::channel();
        self.commands
            .send(Command::ResetPrefixCache(reply))
            .map_err(|_| SubmitError::Unavailable)?;
        reply_rx.await.map_err(|_| SubmitError::Unavailable)
    }

    /// Registers a LoRA adapter with the engine's runner (`/v1/load_lora_adapter`).
    pub async fn add_adapter(
        &self,
        adapter: LoraAdapter,
    ) -> Result<Result<AdapterId, EngineError>, SubmitError> {
        let (reply, reply_rx) = oneshot::channel();
        let command = Command::AddAdapter(Box::new(adapter), reply);
        self.commands
            .send(command)
            .map_err(|_| SubmitError::Unavailable)?;
        reply_rx.await.map_err(|_| SubmitError::Unavailable)
    }

    /// Forgets a LoRA adapter (`/v1/unload_lora_adapter`); refused while a request uses it.
    pub async fn remove_adapter(
        &self,
        id: AdapterId,
    ) -> Result<Result<(), EngineError>, SubmitError> {
        let (reply, reply_rx) = oneshot::channel();
        let command = Command::RemoveAdapter(id, reply);
        self.commands
            .send(command)
            .map_err(|_| SubmitError::Unavailable)?;
        reply_rx.await.map_err(|_| SubmitError::Unavailable)
    }

    /// The step timeline recorded so far as Chrome trace JSON, also written to the trace
    /// file when one is set; `Ok(None)` when the engine records none.
    pub async fn dump_trace(&self) -> Result<Option<String>, SubmitError> {
        let (reply, reply_rx) = oneshot::channel();
        self.commands
            .send(Command::DumpTrace(reply))
            .map_err(|_| SubmitError::Unavailable)?;
        reply_rx.await.map_err(|_| SubmitError::Unavailable)
    }
}
