//! The contract between the scheduler and the runner (ARCHITECTURE.md § The engine step): what to
//! compute this step ([`StepPlan`]), what came out of it ([`StepResult`]), and what the clients
//! learn ([`SeqEvent`]). [`to_forward_batch`] maps a plan onto the model's flat batch.

use tandem_model::batch::{AdapterId, BlockId, ForwardBatch, OutputSelection, SeqSpan, TokenId};

use crate::sequence::{FinishReason, SeqId};

/// One sequence's share of a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledSeq {
    /// The sequence.
    pub seq_id: SeqId,
    /// Tokens already in the KV store; the new tokens sit at positions
    /// `num_computed..num_computed + tokens.len()`.
    pub num_computed: usize,
    /// `[len]` the new tokens to compute this step; never empty.
    pub tokens: Vec<TokenId>,
    /// Blocks holding positions `0..num_computed + tokens.len()`, in order (a snapshot).
    pub block_table: Vec<BlockId>,
    /// How many of the last rows need logits: 0 for a prompt chunk that stops short of the
    /// known tokens, 1 when the step reaches them (the next token is sampled), 1 + k when k
    /// speculative drafts are verified.
    pub num_output_rows: usize,
    /// The one new token is the pick of this sequence's output row in the step planned
    /// before this one, still running when this plan was made (`tokens` holds a placeholder;
    /// see `scheduler/ahead.rs`).
    pub carries_pick: bool,
    /// The LoRA adapter the sequence runs with.
    pub adapter: Option<AdapterId>,
}

impl ScheduledSeq {
    /// Number of new tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Never true for a scheduled sequence; present for API symmetry with `len`.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

/// Everything the runner computes in one step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepPlan {
    /// Step counter; the matching [`StepResult`] carries the same value.
    pub step: u64,
    /// The scheduled sequences, in flat-batch order.
    pub seqs: Vec<ScheduledSeq>,
    /// Sequences preempted (recompute) while planning this step.
    pub preempted: Vec<SeqId>,
    /// `(src, dst)` KV block copies (copy-on-write of shared blocks) the runner performs,
    /// in order, before the forward pass.
    pub block_copies: Vec<(BlockId, BlockId)>,
    /// Sequences admitted for the first time this step with the prefix cache on, and how
    /// many of their prompt tokens it held (possibly 0).
    pub first_admissions: Vec<(SeqId, usize)>,
}

impl StepPlan {
    /// Total new tokens: at most `max_num_batched_tokens`.
    pub fn num_batched_tokens(&self) -> usize {
        self.seqs.iter().map(ScheduledSeq::len).sum()
    }

    /// True when nothing is to be computed.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }
}

/// What the runner produced for one sequence with output rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqOutput {
    /// The sequence.
    pub seq_id: SeqId,
    /// Sampled tokens: exactly one without speculation.
    pub tokens: Vec<TokenId>,
}

/// The runner's answer to a [`StepPlan`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StepResult {
    /// The plan's step counter.
    pub step: u64,
    /// One entry per planned, unmanaged sequence with `num_output_rows > 0`, and one per
    /// sibling the plan's groups fork into this step (see [`Scheduler::pending_siblings`]),
    /// in any order.
    ///
    /// [`Scheduler::pending_siblings`]: crate::Scheduler::pending_siblings
    pub outputs: Vec<SeqOutput>,
}

/// What a client learns from a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeqEvent {
    /// A token was appended to the output.
    Token {
        /// The sequence.
        seq_id: SeqId,
        /// The token.
        token: TokenId,
    },
    /// The sequence finished; its blocks are released. Comes after its last `Token`.
    Finished {
        /// The sequence.
        seq_id: SeqId,
        /// Why.
        reason: FinishReason,
    },
}

/// The model's flat batch for `plan`: the new tokens of all sequences concatenated in plan
/// order, one span per sequence, and explicit output rows (the last `num_output_rows` rows of
/// each span).
pub fn to_forward_batch(plan: &StepPlan) -> ForwardBatch {
    let total = plan.num_batched_tokens();
    let mut tokens = Vec::with_capacity(total); // [num_tokens]
    let mut seqs = Vec::with_capacity(plan.seqs.len());
    let mut rows = Vec::new();
    for s in &plan.seqs {
        let start = tokens.len();
        assert!(
            s.num_output_rows <= s.len(),
            "a plan cannot ask logits for rows it does not compute"
        );
        tokens.extend_from_slice(&s.tokens);
        rows.extend(start + s.len() - s.num_output_rows..start + s.len());
        seqs.push(SeqSpan {
            start,
            len: s.len(),
            num_cached: s.num_computed,
            block_table: s.block_table.clone(),
            adapter: s.adapter,
        });
    }
    ForwardBatch {
        tokens,
        seqs,
        output: OutputSelection::Rows(rows),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forward_batch_tiles_spans_and_selects_last_rows() {
        let plan = StepPlan {
            first_admissions: Vec::new(),
            step: 3,
            seqs: vec![
                ScheduledSeq {
                    seq_id: SeqId(0),
                    num_computed: 4,
                    tokens: vec![TokenId(9)],
                    block_table: vec![BlockId(2), BlockId(5)],
                    num_output_rows: 1,
                    carries_pick: false,
                    adapter: None,
                },
                ScheduledSeq {
                    seq_id: SeqId(1),
                    num_computed: 0,
                    tokens: vec![TokenId(1), TokenId(2), TokenId(3)],
                    block_table: vec![BlockId(0)],
                    num_output_rows: 0,
                    carries_pick: false,
                    adapter: None,
                },
                ScheduledSeq {
                    seq_id: SeqId(2),
                    num_computed: 2,
                    tokens: vec![TokenId(7), TokenId(8)],
                    block_table: vec![BlockId(1)],
                    num_output_rows: 2,
                    carries_pick: false,
                    adapter: None,
                },
            ],
            preempted: vec![],
            block_copies: vec![],
        };
        let b = to_forward_batch(&plan);
        let t: Vec<u32> = b.tokens.iter().map(|t| t.0).collect();
        assert_eq!(t, vec![9, 1, 2, 3, 7, 8]);
        assert_eq!(b.output, OutputSelection::Rows(vec![0, 4, 5]));
        assert_eq!(b.positions(), vec![4, 0, 1, 2, 2, 3]);
        assert_eq!(b.seqs[2].start, 4);
        assert_eq!(b.seqs[0].context_len(), 5);
        b.validate(10, 4, 6).expect("consistent batch");
    }
}
