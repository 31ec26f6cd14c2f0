//! Draft-model proposer: a second model runner with the target's vocabulary drafts `k`
//! tokens autoregressively, with its own KV pool, block allocator and per-sequence block
//! tables.
//!
//! Keeping in step: for each sequence the proposer remembers which tokens its KV store holds
//! (`cached`). Before proposing it keeps only the longest common prefix of `cached` and the
//! sequence's committed tokens (rejected drafts and anything else that changed fall away, and
//! their blocks are released), then computes the rest. The target's preemption does not touch
//! the draft's KV: the committed tokens are unchanged, so nothing needs recomputing. When its
//! pool runs dry it forgets the sequences not in the current batch, and proposes nothing
//! for a sequence that still does not fit.
//!
//! Drafts are drawn from the processed draft distribution with the request's sampling
//! settings (penalties see no history), from a stream keyed by the request's seed; greedy
//! requests get the draft model's argmax (certain drafts).

use tandem_model::batch::{ForwardBatch, OutputSelection, SeqSpan, TokenId};
use tandem_model::runner::ModelRunner;

use super::{Proposal, ProposalInput, Proposer};
use crate::block_allocator::BlockAllocator;
use crate::block_table::BlockTable;
use crate::error::{EngineError, Result};
use crate::sampler::{
    processed_argmax, processed_distribution, SamplerState, StreamRng, TokenDistribution,
};
use crate::sequence::{SeqId, SeqMap};

/// Salt separating the draft stream from the request's own stream of the same seed.
const DRAFT_STREAM_SALT: u64 = 0x6472_6166_745f_7331;

/// What the proposer keeps per sequence.
#[derive(Debug)]
struct DraftSeq {
    table: BlockTable,
    /// Tokens whose K/V are in the draft store, in position order.
    cached: Vec<TokenId>,
    rng: StreamRng,
    /// Empty history: only logit_bias and min_tokens of the processors apply.
    state: SamplerState,
}

/// One sequence's share of a proposal round.
#[derive(Debug)]
struct Job {
    /// Index into the inputs.
    input: usize,
    /// Drafts to produce.
    want: usize,
    /// Tokens to feed in the next forward.
    feed: Vec<TokenId>,
    drafts: Vec<TokenId>,
    dists: Vec<TokenDistribution>,
}

/// A draft model (a runner with its own KV pool) and the allocator of that pool.
#[derive(Debug)]
pub struct DraftModelProposer {
    runner: Box<dyn ModelRunner>,
    allocator: BlockAllocator,
    seqs: SeqMap<DraftSeq>,
}

impl DraftModelProposer {
    /// A proposer over the draft model `runner`, its allocator covering the runner's pool.
    /// Refuses a model whose vocabulary differs from `target_vocab`.
    pub fn new(runner: Box<dyn ModelRunner>, target_vocab: usize) -> Result<DraftModelProposer> {
        let vocab = runner.config().vocab_size;
        if vocab != target_vocab {
            return Err(EngineError::InvalidConfig(format!(
                "the draft model's vocabulary ({vocab}) differs from the target's ({target_vocab})"
            )));
        }
        let g = runner.kv_geometry();
        let allocator = BlockAllocator::new(g.num_blocks, g.block_size)?;
        Ok(DraftModelProposer {
            runner,
            allocator,
            seqs: SeqMap::default(),
        })
    }

    /// The draft pool (for accounting checks).
    pub fn allocator(&self) -> &BlockAllocator {
        &self.allocator
    }

    /// Sequences the proposer keeps KV for.
    pub fn num_tracked(&self) -> usize {
        self.seqs.len()
    }

    /// Syncs `input`'s state to its committed tokens and leases room for the tokens to feed
    /// plus `want - 1` drafts; the job, or `None` when it does not fit.
    fn prepare(&mut self, index: usize, input: &ProposalInput<'_>, want: usize) -> Option<Job> {
        let tokens = input.tokens;
        let max_len = self.runner.config().context_len;
        let want = want.min(max_len.saturating_sub(tokens.len()));
        if want == 0 {
            return None;
        }
        let seq = self.seqs.entry(input.seq_id).or_insert_with(|| DraftSeq {
            table: BlockTable::new(self.allocator.clone()),
            cached: Vec::new(),
            rng: StreamRng::new(input.seed ^ DRAFT_STREAM_SALT),
            state: SamplerState::new(input.seed, &[]),
        });
        // Keep the common prefix, and always recompute the last token (its row is needed).
        let keep = seq
            .cached
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count()
            .min(tokens.len() - 1);
        seq.cached.truncate(keep);
        seq.table.truncate_to_tokens(keep);
        seq.table.ensure_capacity(tokens.len() + want - 1).ok()?;
        Some(Job {
            input: index,
            want,
            feed: tokens[keep..].to_vec(),
            drafts: Vec::with_capacity(want),
            dists: Vec::new(),
        })
    }

    /// [`Self::prepare`], forgetting idle sequences once if the pool is dry.
    fn prepare_or_evict(
        &mut self,
        index: usize,
        inputs: &[ProposalInput<'_>],
        want: usize,
    ) -> Option<Job> {
        if let Some(job) = self.prepare(index, &inputs[index], want) {
            return Some(job);
        }
        self.seqs
            .retain(|id, _| inputs.iter().any(|i| i.seq_id == *id));
        let job = self.prepare(index, &inputs[index], want);
        if job.is_none() {
            self.seqs.remove(&inputs[index].seq_id);
        }
        job
    }

    /// Feeds every job's pending tokens in one forward pass and draws each job's next draft.
    fn advance(&mut self, jobs: &mut [Job], inputs: &[ProposalInput<'_>]) -> Result<()> {
        let mut batch = ForwardBatch {
            tokens: Vec::new(),
            seqs: Vec::new(),
            output: OutputSelection::Last,
        };
        for job in jobs.iter() {
            let seq = &self.seqs[&inputs[job.input].seq_id];
            batch.seqs.push(SeqSpan {
                start: batch.tokens.len(),
                len: job.feed.len(),
                num_cached: seq.cached.len(),
                block_table: seq.table.blocks().to_vec(),
                // The draft model runs without the target's adapter: it only proposes.
                adapter: None,
            });
            batch.tokens.extend_from_slice(&job.feed);
        }
        let logits = self
            .runner
            .forward(&batch)
            .map_err(|e| EngineError::InvalidConfig(format!("draft model forward: {e}")))?;
        for (row, job) in jobs.iter_mut().enumerate() {
            let input = &inputs[job.input];
            let seq = self
                .seqs
                .get_mut(&input.seq_id)
                .expect("jobs are for tracked sequences");
            seq.cached.append(&mut job.feed);
            let n_out = input.num_output_tokens + job.drafts.len();
            let Some(token) = draw(logits.row(row), input, seq, n_out, &mut job.dists) else {
                job.want = job.drafts.len(); // an unusable row: stop drafting this sequence
                continue;
            };
            job.drafts.push(TokenId(token));
            if job.drafts.len() < job.want {
                job.feed.push(TokenId(token));
            }
        }
        Ok(())
    }
}

/// The next draft from a draft-model row: the processed argmax for a greedy request, else a
/// draw from the processed distribution (pushed to `dists`). `None` for an unusable row.
fn draw(
    row: &[f32],
    input: &ProposalInput<'_>,
    seq: &mut DraftSeq,
    num_output: usize,
    dists: &mut Vec<TokenDistribution>,
) -> Option<u32> {
    if input.sampling.is_greedy() {
        return processed_argmax(row, input.sampling, &mut seq.state, num_output).ok();
    }
    let q = processed_distribution(row, input.sampling, &mut seq.state, num_output).ok()?;
    let token = q.draw(seq.rng.next_f64())?;
    dists.push(q);
    Some(token)
}

impl Proposer for DraftModelProposer {
    fn propose(&mut self, inputs: &[ProposalInput<'_>]) -> Result<Vec<Proposal>> {
        let mut jobs: Vec<Job> = (0..inputs.len())
            .filter_map(|i| self.prepare_or_evict(i, inputs, inputs[i].max_drafts))
            .collect();
        let mut done = Vec::with_capacity(jobs.len());
        while !jobs.is_empty() {
            self.advance(&mut jobs, inputs)?;
            let (finished, open): (Vec<Job>, Vec<Job>) =
                jobs.into_iter().partition(|j| j.drafts.len() >= j.want);
            done.extend(finished);
            jobs = open;
        }
        let mut out = vec![Proposal::default(); inputs.len()];
        for job in done {
            let greedy = inputs[job.input].sampling.is_greedy();
            out[job.input] = Proposal {
                tokens: job.drafts,
                dists: (!greedy).then_some(job.dists),
            };
        }
        Ok(out)
    }

    fn release(&mut self, seq_id: SeqId) {
        self.seqs.remove(&seq_id);
    }

    fn name(&self) -> &'static str {
        "draft"
    }
}
