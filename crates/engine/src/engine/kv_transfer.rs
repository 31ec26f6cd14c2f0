//! Sending and receiving a prompt's KV blocks (disaggregated prefill, ARCHITECTURE.md § KV
//! transfer): [`Engine::export_prefix`] on the instance that computed a prompt,
//! [`Engine::import_prefix`] on the one that will continue it.
//!
//! Importing changes no result: the blocks enter the prefix cache under the receiving
//! request's own keys, and a request adopts cached blocks only where this engine would have
//! computed the same K/V (the same model in the same numeric mode, checked through the
//! payload's format). Called between steps.

use tandem_model::batch::{AdapterId, TokenId};

use super::Engine;
use crate::error::{EngineError, Result};
use crate::kv_transfer::KvPayload;

impl Engine {
    fn kv_block_format(&self) -> Result<tandem_model::runner::KvBlockFormat> {
        self.runner.kv_block_format().ok_or_else(|| {
            EngineError::KvTransfer(format!("{} cannot move KV blocks", self.runner.describe()))
        })
    }

    /// How many leading full blocks of `prompt` (under `cache_salt` and `adapter`) the
    /// prefix cache holds, and how many a request for `prompt` could adopt at most (all but
    /// the block of its last token).
    pub fn cached_prefix(
        &self,
        prompt: &[TokenId],
        cache_salt: Option<&str>,
        adapter: Option<AdapterId>,
    ) -> (usize, usize) {
        let cached = self
            .scheduler
            .cached_prefix_blocks(prompt, cache_salt, adapter);
        let bs = self.scheduler.config().block_size;
        (cached.len(), prompt.len().saturating_sub(1) / bs)
    }

    /// The leading full blocks of `prompt` (under `cache_salt` and `adapter`) that the
    /// prefix cache holds, the longest run, from block `skip` on (the receiver holds those
    /// before), as a payload for another instance. A prompt this engine has just computed
    /// has all its full blocks cached until they are evicted.
    pub fn export_prefix(
        &mut self,
        prompt: &[TokenId],
        (cache_salt, adapter): (Option<&str>, Option<AdapterId>),
        skip: u32,
    ) -> Result<KvPayload> {
        let format = self.kv_block_format()?;
        let cached = self
            .scheduler
            .cached_prefix_blocks(prompt, cache_salt, adapter);
        let blocks = cached.get(skip as usize..).unwrap_or_default();
        let mut payload = KvPayload::with_capacity(format, skip, blocks.len());
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
    /// under `cache_salt` and `adapter`, so that a request for `prompt` submitted next
    /// computes only the rest. Blocks already cached are kept; the others take free blocks
    /// (as a prefill here would) while any are left, and wait cached-free, costing no
    /// capacity. Returns how many blocks were added.
    /// Refused, changing nothing, when the payload does not fit this engine or the prompt,
    /// or the prefix cache is off.
    pub fn import_prefix(
        &mut self,
        prompt: &[TokenId],
        (cache_salt, adapter): (Option<&str>, Option<AdapterId>),
        payload: &KvPayload,
    ) -> Result<usize> {
        payload.check_format(self.kv_block_format()?)?;
        if !self.scheduler.prefix_caching() {
            return Err(EngineError::KvTransfer(
                "receiving KV blocks needs the prefix cache".into(),
            ));
        }
        let full = prompt.len() / self.scheduler.config().block_size;
        let end = payload.first_block() + payload.num_blocks();
        if end > full {
            return Err(EngineError::KvTransfer(format!(
                "blocks up to {end} for a prompt of {} tokens ({full} full blocks)",
                prompt.len()
            )));
        }
        if let Some(a) = adapter.filter(|&a| !self.runner.has_adapter(a)) {
            return Err(EngineError::KvTransfer(format!(
                "adapter {} is not registered",
                a.0
            )));
        }
        let import = self.scheduler.begin_import(
            prompt,
            (cache_salt, adapter),
            payload.first_block(),
            payload.num_blocks(),
        );
        let written = import
            .writes()
            .try_for_each(|(i, b)| self.runner.write_blocks(&[b], payload.block(i)));
        let added = self.scheduler.finish_import(import, written.is_ok());
        written.map_err(|e| EngineError::KvTransfer(e.to_string()))?;
        Ok(added)
    }
}
