//! Sending and receiving a prompt's KV blocks (disaggregated prefill, ARCHITECTURE.md § KV
//! transfer): [`Engine::export_prefix`] on the instance that computed a prompt,
//! [`Engine::import_prefix`] on the one that will continue it.
//!
//! Importing changes no result: the blocks enter the prefix cache under the receiving
//! request's own keys, and only from an instance whose blocks mean the same here (the same
//! model, numeric mode, KV layout and adapter: the payload's format, see
//! [`Engine::transfer_format`]). Called between steps.

use tandem_model::batch::{AdapterId, TokenId};
use tandem_model::runner::KvBlockFormat;

use super::Engine;
use crate::error::{EngineError, Result};
use crate::kv_transfer::KvPayload;
use crate::scheduler::{adoptable_blocks, CacheScope};

impl Engine {
    /// The format of blocks computed here under `adapter`: the runner's, its compatibility
    /// also hashing the adapter's weights. An error when the runner cannot move blocks or
    /// the adapter is not registered.
    pub fn transfer_format(&self, adapter: Option<AdapterId>) -> Result<KvBlockFormat> {
        let format = self.runner.kv_block_format().ok_or_else(|| {
            EngineError::KvTransfer(format!("{} cannot move KV blocks", self.runner.describe()))
        })?;
        let Some(a) = adapter else {
            return Ok(format);
        };
        let digest = self
            .runner
            .adapter_digest(a)
            .ok_or_else(|| EngineError::KvTransfer(format!("adapter {} is not registered", a.0)))?;
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (format.compatibility, digest).hash(&mut h);
        Ok(KvBlockFormat {
            compatibility: h.finish(),
            ..format
        })
    }

    /// How many leading blocks of `prompt` (under `scope`) the prefix cache holds, and how
    /// many a request for `prompt` could adopt at most (all full blocks before its last
    /// token).
    pub fn cached_prefix(&self, prompt: &[TokenId], scope: CacheScope<'_>) -> (usize, usize) {
        let cached = self.scheduler.cached_prefix_blocks(prompt, scope);
        let bs = self.scheduler.config().block_size;
        (cached.len(), adoptable_blocks(prompt.len(), bs))
    }

    /// The leading blocks of `prompt` (under `scope`) that the prefix cache holds, the
    /// longest run of those a request could adopt, from block `skip` on (the receiver holds
    /// those before), as a payload for another instance. A prompt this engine has just
    /// computed has all of them cached until they are evicted.
    pub fn export_prefix(
        &mut self,
        prompt: &[TokenId],
        scope: CacheScope<'_>,
        skip: u32,
    ) -> Result<KvPayload> {
        let format = self.transfer_format(scope.1)?;
        let cached = self.scheduler.cached_prefix_blocks(prompt, scope);
        let blocks = cached.get(skip as usize..).unwrap_or_default();
        let mut payload = KvPayload::with_capacity(format, skip, blocks.len())?;
        let runner = &mut self.runner;
        payload.append_blocks(|out| {
            runner
                .read_blocks(blocks, out)
                .map_err(|e| EngineError::KvTransfer(e.to_string()))
        })?;
        Ok(payload)
    }

    /// Puts the blocks of `payload`, full blocks of `prompt` computed by another instance
    /// (from its first block on: those before must be cached here), into the prefix cache
    /// under `scope`, so that a request for `prompt` submitted next computes only the rest
    /// (see `Scheduler::import_blocks`: free blocks only, released cached-free at once).
    /// Returns how many blocks were added. A payload that does not fit this engine or the
    /// prompt, or the prefix cache being off, is refused before anything is taken; a failed
    /// write registers nothing.
    pub fn import_prefix(
        &mut self,
        prompt: &[TokenId],
        scope: CacheScope<'_>,
        payload: &KvPayload,
    ) -> Result<usize> {
        payload.check_format(self.transfer_format(scope.1)?)?;
        if !self.scheduler.prefix_caching() {
            return Err(EngineError::KvTransfer(
                "receiving KV blocks needs the prefix cache".into(),
            ));
        }
        let full = prompt.len() / self.scheduler.config().block_size;
        let end = payload.first_block().saturating_add(payload.num_blocks());
        if end > full {
            return Err(EngineError::KvTransfer(format!(
                "blocks up to {end} for a prompt of {} tokens ({full} full blocks)",
                prompt.len()
            )));
        }
        let runner = &mut self.runner;
        let span = (payload.first_block(), payload.num_blocks());
        let added = self.scheduler.import_blocks(prompt, scope, span, |j, b| {
            runner.write_blocks(&[b], payload.block(j))
        });
        added.map_err(|e| EngineError::KvTransfer(e.to_string()))
    }
}
