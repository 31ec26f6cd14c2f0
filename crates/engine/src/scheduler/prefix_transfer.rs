//! The scheduler's side of KV transfer (ARCHITECTURE.md § KV transfer): which cached blocks
//! hold a prompt's leading blocks (to send them), and free blocks taken for leading blocks
//! computed by another instance, registered in the prefix cache once written (to receive
//! them).
//!
//! Received blocks enter the cache exactly as blocks this engine computed: keyed by the
//! receiving request's own chain (its tokens, cache salt and adapter), then released, so
//! they wait cached-free at the back of the free queue and cost no capacity; the request
//! submitted next adopts them at admission like any cache hit, and computes the rest.

use tandem_model::batch::{AdapterId, BlockId, TokenId};

use super::prefix::adoptable_blocks;
use super::Scheduler;
use crate::prefix_cache::BlockKey;

/// The cache salt and LoRA adapter a prompt's blocks are keyed under.
pub type CacheScope<'a> = (Option<&'a str>, Option<AdapterId>);

impl Scheduler {
    /// `(parent key, key)` of each of the first `n` full blocks of `prompt` under `scope`;
    /// `None` with the prefix cache off.
    fn prompt_block_keys(
        &self,
        prompt: &[TokenId],
        (cache_salt, adapter): CacheScope<'_>,
        n: usize,
    ) -> Option<Vec<(BlockKey, BlockKey)>> {
        let hasher = self.prefix_hasher.as_ref()?;
        let root = hasher.root(cache_salt, adapter);
        let mut keys = Vec::with_capacity(n);
        hasher.extend_keys(&mut keys, root, prompt, self.config.block_size, n);
        let parents = std::iter::once(root).chain(keys.iter().copied());
        Some(parents.zip(keys.iter().copied()).collect())
    }

    /// The longest run of `prompt`'s leading blocks the prefix cache holds, in order, among
    /// those a request for `prompt` could adopt (all full blocks before its last token);
    /// none with the cache off. Nothing is taken: the caller reads them before the next step.
    pub fn cached_prefix_blocks(&self, prompt: &[TokenId], scope: CacheScope<'_>) -> Vec<BlockId> {
        let bs = self.config.block_size;
        let n = adoptable_blocks(prompt.len(), bs);
        let Some(keys) = self.prompt_block_keys(prompt, scope, n) else {
            return Vec::new();
        };
        let mut blocks = Vec::new();
        for (i, (parent, key)) in keys.into_iter().enumerate() {
            let tokens = &prompt[i * bs..(i + 1) * bs];
            match self.allocator.find_cached(parent, key, tokens) {
                Some(b) => blocks.push(b),
                None => break,
            }
        }
        blocks
    }

    /// Puts full blocks `first..first + num_blocks` of `prompt`, computed elsewhere, into the
    /// prefix cache under `scope`, up to the blocks a request for `prompt` could adopt:
    /// `write(j, block)` fills pool block `block` with the payload's block `j` (prompt block
    /// `first + j`). Returns the number of blocks registered, or `write`'s first error (then
    /// nothing is registered).
    ///
    /// The blocks before `first` must be cached here: they are held meanwhile, so the
    /// import cannot evict them, and without them nothing is taken (a request adopts only a
    /// run of leading blocks). Blocks already cached are kept as they are; each other one
    /// takes a block from the free queue (evicting the least recently used cached-free
    /// block, as a prefill here would) until it runs dry. Every block taken is released at
    /// the end, most specific first: received blocks wait cached-free.
    pub fn import_blocks<E>(
        &mut self,
        prompt: &[TokenId],
        scope: CacheScope<'_>,
        (first, num_blocks): (usize, usize),
        mut write: impl FnMut(usize, BlockId) -> Result<(), E>,
    ) -> Result<usize, E> {
        let bs = self.config.block_size;
        let n = first
            .saturating_add(num_blocks)
            .min(adoptable_blocks(prompt.len(), bs));
        let keys = self.prompt_block_keys(prompt, scope, n).unwrap_or_default();
        let (mut held, mut written) = (Vec::with_capacity(n), Vec::new());
        for (i, &(parent, key)) in keys.iter().enumerate() {
            let tokens = &prompt[i * bs..(i + 1) * bs];
            if let Some(b) = self.allocator.acquire_cached(parent, key, tokens) {
                held.push(b);
            } else if i < first {
                break; // a gap before the payload: nothing after it could be adopted
            } else if let Some(b) = self.allocator.allocate() {
                held.push(b);
                written.push((i, b));
            } else {
                break;
            }
        }
        let filled = written.iter().try_for_each(|&(i, b)| write(i - first, b));
        let mut registered = 0;
        if filled.is_ok() {
            for &(i, b) in &written {
                let (parent, key) = keys[i];
                let tokens = &prompt[i * bs..(i + 1) * bs];
                registered += usize::from(self.allocator.register(b, parent, key, tokens));
            }
        }
        for &b in held.iter().rev() {
            self.allocator
                .free(b)
                .expect("an import holds each of its blocks once");
        }
        filled.map(|()| registered)
    }
}
