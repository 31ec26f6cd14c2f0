//! Sequences: one generation request's tokens, progress, parameters and KV blocks.
//!
//! Token accounting (ARCHITECTURE.md § The engine step): `tokens` holds prompt + output [+ draft]
//! tokens and `num_tokens() == tokens.len()`. `num_computed_tokens` counts the leading tokens whose
//! K/V are in the KV store. The scheduler grants `num_tokens() - num_computed_tokens` more each
//! step until they meet; the row of the last known token yields the logits of the next one.
//!
//! Speculative decoding (later) appends draft tokens at the end with [`Sequence::append_draft`];
//! they count in `num_tokens()` so the scheduler grants and leases KV for them like any other
//! token. After verification, [`Sequence::rollback_to`] drops the rejected tail: it truncates
//! `tokens`, clamps `num_computed_tokens` and shrinks the block table to the blocks the
//! remaining tokens need. Accepted drafts become output with [`Sequence::commit_drafts`].

use tandem_model::batch::{AdapterId, TokenId};

use crate::block_table::BlockTable;
use crate::prefix_cache::{BlockKey, PrefixHasher};

/// A sequence's id, unique for the scheduler's lifetime; also its arrival order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

/// A map keyed by sequence, with a fast hasher: the engine looks sequences up several
/// times per row per step (keys are the engine's own counters, not adversarial input).
pub type SeqMap<V> = std::collections::HashMap<SeqId, V, foldhash::fast::RandomState>;

/// Why a sequence stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// An EOS token (unless `ignore_eos`) or one of `stop_token_ids` was generated; that token
    /// is the last output token.
    Stop,
    /// `max_tokens` output tokens, or the longest sequence the engine can hold.
    Length,
    /// The client aborted it.
    Abort,
    /// The step computing it failed (a fault of the engine or the model).
    Error(String),
    /// The request's own parameters left nothing to sample: its grammar reached a dead end
    /// (complete while `min_tokens` forbids EOS), or every token was suppressed. The
    /// request's fault (a server answers 400), found only when its row came to be sampled.
    Refused(String),
}

impl FinishReason {
    /// Whether the request ended in failure ([`FinishReason::Error`] or
    /// [`FinishReason::Refused`]).
    pub fn is_failure(&self) -> bool {
        matches!(self, FinishReason::Error(_) | FinishReason::Refused(_))
    }
}

/// Where a sequence is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeqStatus {
    /// Queued, never scheduled; owns no blocks.
    Waiting,
    /// Admitted: scheduled every step it gets budget for; may own blocks.
    Running,
    /// Evicted by recompute preemption and queued again; owns no blocks and has
    /// `num_computed_tokens == 0`.
    Preempted,
    /// Done; owns no blocks.
    Finished(FinishReason),
}

/// How a scheduler orders requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SchedulingPolicy {
    /// First come, first served (arrival order).
    #[default]
    Fcfs,
    /// By `priority` (smaller value first), then arrival.
    Priority,
}

/// What the scheduler needs of a request: output limits, stop tokens and priority. (How
/// tokens are chosen lives in [`crate::sampler::SamplingParams`].)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestParams {
    /// Output tokens to generate at most. 0 computes the prompt only (for its prompt logprobs;
    /// the engine refuses it otherwise) and finishes with `Length`.
    pub max_tokens: usize,
    /// Keep generating past the model's EOS tokens.
    pub ignore_eos: bool,
    /// Tokens that end the sequence (they are kept as its last output token).
    pub stop_token_ids: Vec<TokenId>,
    /// Smaller is more urgent under [`SchedulingPolicy::Priority`]; ignored under FCFS.
    pub priority: i32,
    /// Prefix-cache isolation key: requests share cached KV blocks only with requests of the
    /// same salt (`None` is a salt of its own).
    pub cache_salt: Option<String>,
    /// The LoRA adapter the request runs with (registered with the model runner), if any.
    /// Part of the prefix-cache key: blocks computed under one adapter are never reused
    /// under another.
    pub adapter: Option<AdapterId>,
}

impl Default for RequestParams {
    fn default() -> RequestParams {
        RequestParams {
            max_tokens: 16,
            ignore_eos: false,
            stop_token_ids: Vec::new(),
            priority: 0,
            cache_salt: None,
            adapter: None,
        }
    }
}

/// One request's state inside the scheduler.
#[derive(Debug)]
pub struct Sequence {
    id: SeqId,
    /// `[num_tokens]` prompt, then output, then draft tokens.
    tokens: Vec<TokenId>,
    prompt_len: usize,
    /// Trailing draft tokens in `tokens` (0 without speculation).
    num_draft: usize,
    num_computed_tokens: usize,
    status: SeqStatus,
    params: RequestParams,
    block_table: BlockTable,
    /// Driven by its owner (a beam search): the scheduler computes its tokens but never
    /// appends sampled tokens, applies stop conditions, or expects an output for it.
    managed: bool,
    /// Prefix-cache state, see [`PrefixState`].
    prefix: PrefixState,
}

/// What a sequence knows of the prefix cache.
#[derive(Debug, Clone, Default)]
pub struct PrefixState {
    /// Keys of the leading full blocks of `tokens`, computed once (block `i`'s key at `i`).
    pub keys: Vec<BlockKey>,
    /// Leading blocks of the current table already in the cache (hit or registered).
    pub num_registered: usize,
    /// Prompt tokens found in the cache when the sequence was first admitted.
    pub num_cached_tokens: Option<usize>,
}

impl Sequence {
    /// A waiting sequence over a non-empty prompt, with an empty block table.
    pub fn new(
        id: SeqId,
        prompt: Vec<TokenId>,
        params: RequestParams,
        table: BlockTable,
    ) -> Sequence {
        assert!(!prompt.is_empty(), "the scheduler refuses empty prompts");
        Sequence {
            id,
            prompt_len: prompt.len(),
            tokens: prompt,
            num_draft: 0,
            num_computed_tokens: 0,
            status: SeqStatus::Waiting,
            params,
            block_table: table,
            managed: false,
            prefix: PrefixState::default(),
        }
    }

    /// A copy of this sequence under a new id: the same tokens, progress, status and
    /// parameters, and a block table sharing every block (each gains one holder; a shared
    /// block is copied on the first write, see [`BlockTable::prepare_write`]). Asserts there
    /// are no drafts.
    pub fn fork(&self, id: SeqId) -> Sequence {
        assert_eq!(self.num_draft, 0, "a sequence with drafts is never forked");
        Sequence {
            id,
            tokens: self.tokens.clone(),
            prompt_len: self.prompt_len,
            num_draft: 0,
            num_computed_tokens: self.num_computed_tokens,
            status: self.status.clone(),
            params: self.params.clone(),
            block_table: self.block_table.fork(),
            managed: self.managed,
            prefix: self.prefix.clone(),
        }
    }

    /// Whether an owner (a beam search) drives this sequence's tokens.
    pub fn is_managed(&self) -> bool {
        self.managed
    }

    /// Marks the sequence as driven by its owner (see [`Sequence::is_managed`]).
    pub fn set_managed(&mut self) {
        self.managed = true;
    }

    /// The id.
    pub fn id(&self) -> SeqId {
        self.id
    }

    /// Prompt + output + draft tokens.
    pub fn num_tokens(&self) -> usize {
        self.tokens.len()
    }

    /// Leading tokens whose K/V are in the store.
    pub fn num_computed_tokens(&self) -> usize {
        self.num_computed_tokens
    }

    /// Tokens still to compute: `num_tokens() - num_computed_tokens()`.
    pub fn num_uncomputed(&self) -> usize {
        self.tokens.len() - self.num_computed_tokens
    }

    /// Prompt length in tokens.
    pub fn prompt_len(&self) -> usize {
        self.prompt_len
    }

    /// All tokens: prompt, output, drafts.
    pub fn tokens(&self) -> &[TokenId] {
        &self.tokens
    }

    /// The committed output tokens (no drafts).
    pub fn output(&self) -> &[TokenId] {
        &self.tokens[self.prompt_len..self.tokens.len() - self.num_draft]
    }

    /// Trailing draft tokens.
    pub fn num_draft(&self) -> usize {
        self.num_draft
    }

    /// Leading tokens that are both computed and committed (not drafts): the only ones whose
    /// blocks a prefix cache may register, since drafts can still be rolled back.
    pub fn num_committed_computed(&self) -> usize {
        self.num_computed_tokens
            .min(self.tokens.len() - self.num_draft)
    }

    /// The status.
    pub fn status(&self) -> &SeqStatus {
        &self.status
    }

    /// The request parameters.
    pub fn params(&self) -> &RequestParams {
        &self.params
    }

    /// The block table.
    pub fn block_table(&self) -> &BlockTable {
        &self.block_table
    }

    /// The block table, to lease blocks.
    pub fn block_table_mut(&mut self) -> &mut BlockTable {
        &mut self.block_table
    }

    /// The prefix-cache state.
    pub fn prefix(&self) -> &PrefixState {
        &self.prefix
    }

    /// The prefix-cache state, to record hits and registrations.
    pub fn prefix_mut(&mut self) -> &mut PrefixState {
        &mut self.prefix
    }

    /// Computes (once) the prefix-cache keys of the first `n` full blocks of `block_size`
    /// tokens; returns the root key they chain from (model identity, cache salt and adapter).
    pub fn ensure_block_keys(
        &mut self,
        hasher: &PrefixHasher,
        block_size: usize,
        n: usize,
    ) -> BlockKey {
        let root = hasher.root(self.params.cache_salt.as_deref(), self.params.adapter);
        hasher.extend_keys(&mut self.prefix.keys, root, &self.tokens, block_size, n);
        root
    }

    /// Full block `i` as the prefix cache sees it: its parent's key (`root` for block 0),
    /// its own key and its tokens. Needs [`Sequence::ensure_block_keys`] up to `i` first.
    pub fn keyed_block(
        &self,
        root: BlockKey,
        i: usize,
        block_size: usize,
    ) -> (BlockKey, BlockKey, &[TokenId]) {
        let keys = &self.prefix.keys;
        let parent = if i == 0 { root } else { keys[i - 1] };
        (
            parent,
            keys[i],
            &self.tokens[i * block_size..(i + 1) * block_size],
        )
    }

    /// Takes blocks found in the prefix cache for the first `num_tokens` tokens (whole
    /// blocks) of a sequence that holds no block yet: the table takes over the references,
    /// and those tokens count as computed.
    pub fn adopt_cached(&mut self, blocks: &[tandem_model::batch::BlockId], num_tokens: usize) {
        assert!(
            self.block_table.is_empty() && self.num_computed_tokens == 0,
            "cached blocks start an empty sequence"
        );
        assert!(
            num_tokens < self.tokens.len(),
            "the last token is always computed"
        );
        for &b in blocks {
            self.block_table.push_acquired(b);
        }
        self.num_computed_tokens = num_tokens;
        self.prefix.num_registered = blocks.len();
    }

    /// Undoes [`Sequence::adopt_cached`] when admission fails after it: releases the blocks.
    pub fn release_cached(&mut self) {
        self.block_table.clear();
        self.num_computed_tokens = 0;
        self.prefix.num_registered = 0;
    }

    /// Sets the status; leaving `Running` for anything but `Running` releases every block.
    pub fn set_status(&mut self, status: SeqStatus) {
        if status != SeqStatus::Running {
            self.block_table.clear();
            self.prefix.num_registered = 0;
        }
        self.status = status;
    }

    /// Recompute preemption: drop drafts and blocks, forget computed tokens, mark preempted.
    /// Output tokens stay; they are recomputed with the prompt when it runs again.
    pub fn preempt(&mut self) {
        self.rollback_to(self.tokens.len() - self.num_draft);
        self.num_computed_tokens = 0;
        self.set_status(SeqStatus::Preempted);
    }

    /// Records that `n` more tokens' K/V were written. Asserts they exist.
    pub fn advance_computed(&mut self, n: usize) {
        assert!(
            self.num_computed_tokens + n <= self.tokens.len(),
            "cannot compute past the known tokens"
        );
        self.num_computed_tokens += n;
    }

    /// Appends one committed output token. Asserts there are no drafts pending.
    pub fn append_output(&mut self, token: TokenId) {
        assert_eq!(self.num_draft, 0, "commit or roll back drafts first");
        self.tokens.push(token);
    }

    /// Appends speculative draft tokens after the committed ones.
    pub fn append_draft(&mut self, drafts: &[TokenId]) {
        self.tokens.extend_from_slice(drafts);
        self.num_draft += drafts.len();
    }

    /// Turns the first `accepted` drafts into output and rolls back the rest. Without drafts
    /// it changes nothing: in particular it keeps a block leased past the tokens for a step
    /// planned ahead (`scheduler/ahead.rs`).
    pub fn commit_drafts(&mut self, accepted: usize) {
        assert!(
            accepted <= self.num_draft,
            "cannot accept more drafts than exist"
        );
        if self.num_draft == 0 {
            return;
        }
        let keep = self.tokens.len() - self.num_draft + accepted;
        self.rollback_to(keep);
        self.num_draft = 0;
    }

    /// Truncates to the first `num_tokens` tokens (never into the prompt): clamps
    /// `num_computed_tokens` and releases the blocks the remaining tokens do not need.
    pub fn rollback_to(&mut self, num_tokens: usize) {
        assert!(
            (self.prompt_len..=self.tokens.len()).contains(&num_tokens),
            "rollback must stay within the output"
        );
        let dropped = self.tokens.len() - num_tokens;
        self.tokens.truncate(num_tokens);
        self.num_draft = self.num_draft.saturating_sub(dropped);
        self.num_computed_tokens = self.num_computed_tokens.min(num_tokens);
        self.block_table.truncate_to_tokens(num_tokens);
        let full = num_tokens / self.block_table.allocator().block_size();
        self.prefix.keys.truncate(full);
        self.prefix.num_registered = self.prefix.num_registered.min(full);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block_allocator::BlockAllocator;

    fn toks(v: &[u32]) -> Vec<TokenId> {
        v.iter().copied().map(TokenId).collect()
    }

    #[test]
    fn drafts_roll_back_with_their_blocks() {
        let a = BlockAllocator::new(8, 2).expect("valid pool");
        let mut s = Sequence::new(
            SeqId(0),
            toks(&[1, 2, 3]),
            RequestParams::default(),
            BlockTable::new(a.clone()),
        );
        s.set_status(SeqStatus::Running);
        s.append_output(TokenId(4));
        s.append_draft(&toks(&[5, 6, 7]));
        assert_eq!(s.num_tokens(), 7);
        assert_eq!(s.output(), &toks(&[4])[..]);
        s.block_table_mut().ensure_capacity(7).expect("room");
        s.advance_computed(7);
        assert_eq!(a.num_free(), 4);
        assert_eq!(s.num_committed_computed(), 4, "drafts are not committed");
        s.commit_drafts(1);
        assert_eq!(s.tokens(), &toks(&[1, 2, 3, 4, 5])[..]);
        assert_eq!(s.output(), &toks(&[4, 5])[..]);
        assert_eq!(s.num_computed_tokens(), 5);
        assert_eq!(s.block_table().len(), 3);
        assert_eq!(a.num_free(), 5);
        s.preempt();
        assert_eq!(s.num_computed_tokens(), 0);
        assert_eq!(
            s.num_tokens(),
            5,
            "preemption keeps the output for recompute"
        );
        assert!(a.is_idle());
        assert_eq!(s.status(), &SeqStatus::Preempted);
    }
}
