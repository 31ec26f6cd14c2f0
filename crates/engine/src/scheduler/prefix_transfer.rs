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

use super::Scheduler;
use crate::prefix_cache::BlockKey;

/// Blocks held while received contents are written into them.
#[derive(Debug)]
pub struct PrefixImport {
    /// The prompt's tokens the import covers (whole blocks).
    tokens: Vec<TokenId>,
    /// The prompt block the payload starts at.
    first: usize,
    /// Every block the import holds: cache hits and new blocks, in chain order.
    held: Vec<BlockId>,
    /// The new blocks: (index of the prompt block, pool block, parent key, key).
    writes: Vec<(usize, BlockId, BlockKey, BlockKey)>,
}

impl PrefixImport {
    /// `(index of the payload's block, pool block)` of each block to write.
    pub fn writes(&self) -> impl Iterator<Item = (usize, BlockId)> + '_ {
        self.writes.iter().map(|&(i, b, _, _)| (i - self.first, b))
    }
}

impl Scheduler {
    /// The chained keys of the first `n` full blocks of `prompt` under `cache_salt` and
    /// `adapter`, with the root they chain from; `None` with the prefix cache off.
    fn prompt_keys(
        &self,
        prompt: &[TokenId],
        cache_salt: Option<&str>,
        adapter: Option<AdapterId>,
        n: usize,
    ) -> Option<(BlockKey, Vec<BlockKey>)> {
        let hasher = self.prefix_hasher.as_ref()?;
        let root = hasher.root(cache_salt, adapter);
        let mut keys = Vec::with_capacity(n);
        hasher.extend_keys(&mut keys, root, prompt, self.config.block_size, n);
        Some((root, keys))
    }

    /// The longest run of `prompt`'s leading full blocks the prefix cache holds, in order
    /// (none with the cache off). Nothing is taken: the caller reads them before the next
    /// step.
    pub fn cached_prefix_blocks(
        &self,
        prompt: &[TokenId],
        cache_salt: Option<&str>,
        adapter: Option<AdapterId>,
    ) -> Vec<BlockId> {
        let bs = self.config.block_size;
        let n = prompt.len() / bs;
        let Some((root, keys)) = self.prompt_keys(prompt, cache_salt, adapter, n) else {
            return Vec::new();
        };
        let mut blocks = Vec::new();
        for (i, &key) in keys.iter().enumerate() {
            let parent = if i == 0 { root } else { keys[i - 1] };
            let tokens = &prompt[i * bs..(i + 1) * bs];
            match self.allocator.find_cached(parent, key, tokens) {
                Some(b) => blocks.push(b),
                None => break,
            }
        }
        blocks
    }

    /// Takes blocks for full blocks `first..first + num_blocks` of `prompt` computed
    /// elsewhere, at most up to the blocks a request for `prompt` could adopt at admission
    /// (its last token is always computed). The blocks before `first` must be cached here:
    /// they are held, so the import cannot evict them, and without them it takes nothing (a
    /// request adopts only a run of leading blocks). Blocks already cached are held as they
    /// are; the others are taken from the free queue (evicting the least recently used
    /// cached-free block, as a prefill here would) until it runs dry. Nothing is registered
    /// until [`Scheduler::finish_import`].
    pub fn begin_import(
        &mut self,
        prompt: &[TokenId],
        (cache_salt, adapter): (Option<&str>, Option<AdapterId>),
        first: usize,
        num_blocks: usize,
    ) -> PrefixImport {
        let bs = self.config.block_size;
        let n = (first + num_blocks).min(prompt.len().saturating_sub(1) / bs);
        let mut import = PrefixImport {
            tokens: prompt[..n * bs].to_vec(),
            first,
            held: Vec::with_capacity(n),
            writes: Vec::new(),
        };
        let Some((root, keys)) = self.prompt_keys(prompt, cache_salt, adapter, n) else {
            return import;
        };
        for (i, &key) in keys.iter().enumerate() {
            let parent = if i == 0 { root } else { keys[i - 1] };
            let tokens = &prompt[i * bs..(i + 1) * bs];
            if let Some(b) = self.allocator.acquire_cached(parent, key, tokens) {
                import.held.push(b);
            } else if i < first {
                break; // a gap before the payload: nothing after it could be adopted
            } else if let Some(b) = self.allocator.allocate() {
                import.held.push(b);
                import.writes.push((i, b, parent, key));
            } else {
                break;
            }
        }
        import
    }

    /// Ends an import: when its blocks were `written`, registers them in the prefix cache;
    /// then releases every block it held, most specific first. Returns the number of blocks
    /// registered.
    pub fn finish_import(&mut self, import: PrefixImport, written: bool) -> usize {
        let bs = self.config.block_size;
        let mut registered = 0;
        if written {
            for &(i, b, parent, key) in &import.writes {
                let tokens = &import.tokens[i * bs..(i + 1) * bs];
                registered += usize::from(self.allocator.register(b, parent, key, tokens));
            }
        }
        for &b in import.held.iter().rev() {
            self.allocator
                .free(b)
                .expect("an import holds each of its blocks once");
        }
        registered
    }
}
