//! Prefix-cache keys (ARCHITECTURE.md § Prefix cache): what identifies the contents of a full KV
//! block.
//!
//! A full block's K/V depend on every token up to its end, so its key is chained: the key of
//! block `i` hashes the key of block `i - 1` and block `i`'s own token ids; the chain starts
//! from a root key that hashes the isolation keys (the model's identity and the request's
//! `cache_salt`), so two tenants with different salts never share a block. Keys are 128 bits
//! from two SipHash instances with random keys drawn at start-up: clients cannot predict
//! them, so they cannot aim a collision at another tenant's prefix. On top of that a hit is
//! accepted only when the block's stored parent key and token ids equal the request's (see
//! [`crate::block_allocator::BlockAllocator::acquire_cached`]), so even a collision cannot
//! serve the wrong K/V.
//!
//! Only blocks whose every token is computed and committed are keyed: speculative drafts can
//! still be rolled back and never enter the cache.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hash};

use tandem_model::batch::{AdapterId, TokenId};

/// The identity of a full block's contents (and of everything before it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockKey(pub u128);

/// What the pool remembers of a cached block, to verify a hit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedBlock {
    /// This block's key.
    pub key: BlockKey,
    /// The key of the block before it (the root key for a sequence's first block).
    pub parent: BlockKey,
    /// The block's token ids.
    pub tokens: Box<[TokenId]>,
}

/// Computes block keys with per-process random hash keys.
#[derive(Debug, Clone)]
pub struct PrefixHasher {
    lo: RandomState,
    hi: RandomState,
    model_identity: u64,
}

impl PrefixHasher {
    /// A hasher for one model; `model_identity` separates caches of different models.
    pub fn new(model_identity: u64) -> PrefixHasher {
        PrefixHasher {
            lo: RandomState::new(),
            hi: RandomState::new(),
            model_identity,
        }
    }

    fn key_of(&self, value: impl Hash + Copy) -> BlockKey {
        let (lo, hi) = (self.lo.hash_one(value), self.hi.hash_one(value));
        BlockKey(u128::from(lo) | (u128::from(hi) << 64))
    }

    /// The key a sequence's first block chains from: model identity, cache salt and LoRA
    /// adapter.
    pub fn root(&self, cache_salt: Option<&str>, adapter: Option<AdapterId>) -> BlockKey {
        self.key_of((0u8, self.model_identity, cache_salt, adapter))
    }

    /// The key of a full block with `tokens` after the block keyed `parent`.
    pub fn chain(&self, parent: BlockKey, tokens: &[TokenId]) -> BlockKey {
        self.key_of((1u8, parent.0, tokens))
    }

    /// The keys of the full blocks of `tokens`, continuing `known` (keys already computed for
    /// the first blocks): block `i` covers `tokens[i * block_size..(i + 1) * block_size]`.
    pub fn extend_keys(
        &self,
        known: &mut Vec<BlockKey>,
        root: BlockKey,
        tokens: &[TokenId],
        block_size: usize,
        num_blocks: usize,
    ) {
        while known.len() < num_blocks {
            let i = known.len();
            let parent = known.last().copied().unwrap_or(root);
            known.push(self.chain(parent, &tokens[i * block_size..(i + 1) * block_size]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(v: &[u32]) -> Vec<TokenId> {
        v.iter().copied().map(TokenId).collect()
    }

    #[test]
    fn keys_depend_on_tokens_parent_salt_adapter_and_model() {
        let h = PrefixHasher::new(7);
        let root = h.root(None, None);
        let a = h.chain(root, &toks(&[1, 2]));
        assert_eq!(
            a,
            h.chain(root, &toks(&[1, 2])),
            "deterministic within a hasher"
        );
        assert_ne!(a, h.chain(root, &toks(&[2, 1])));
        assert_ne!(a, h.chain(h.root(Some("tenant"), None), &toks(&[1, 2])));
        assert_ne!(h.root(Some("a"), None), h.root(Some("b"), None));
        assert_ne!(root, h.root(None, Some(AdapterId(0))));
        assert_ne!(
            h.root(None, Some(AdapterId(0))),
            h.root(None, Some(AdapterId(1)))
        );
        assert_ne!(h.chain(a, &toks(&[3])), h.chain(root, &toks(&[3])));
        let other = PrefixHasher::new(7);
        assert_ne!(
            a,
            other.chain(other.root(None, None), &toks(&[1, 2])),
            "keys are seeded per hasher, so clients cannot predict them"
        );
        let mut keys = Vec::new();
        h.extend_keys(&mut keys, root, &toks(&[1, 2, 3, 4, 5]), 2, 2);
        assert_eq!(keys, vec![a, h.chain(a, &toks(&[3, 4]))]);
    }
}
