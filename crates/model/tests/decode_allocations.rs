//! The decode path allocates nothing but its answer: once a model has run decode steps, a
//! decode step's forward call makes exactly one heap allocation, the returned logits' row
//! list, also with fewer sequences and longer contexts than before (their values go into the
//! buffer of the step before, handed back as the engine does with `recycle_logits`).
//! Activations, the batch layout, RoPE angles, quantized activations and kernel tiles all
//! live in buffers the model and its threads keep.
//!
//! Every allocation of the process is counted (this binary's only test, so nothing else runs
//! beside it), on the default model with the default (int8) kernels and f16 KV cache.

use std::alloc::System;

use stats_alloc::{StatsAlloc, INSTRUMENTED_SYSTEM};
use tandem_model::batch::{BlockId, ForwardBatch, OutputSelection, SeqSpan, TokenId};
use tandem_model::kv_store::KvStore;
use tandem_model::loader::load_gguf_model;
use tandem_model::transformer::Model;

/// The system allocator, counting every allocation and reallocation.
#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Allocations and reallocations so far, in every thread.
fn allocations() -> usize {
    let stats = GLOBAL.stats();
    stats.allocations + stats.reallocations
}

const SEQS: usize = 5;
const BLOCK: usize = 16;
/// 256 positions: contexts past 128 positions, two of the attention's partitions, which
/// decode tasks of few sequences split among themselves (records kept by the model).
const BLOCKS_PER_SEQ: usize = 16;
const STEPS: usize = 24;

/// Prefills `seqs` sequences (prompts of `prompt..` tokens) on the blocks from `first_block`,
/// then decodes `STEPS` tokens for all of them together; returns the allocations of each
/// decode step's forward call.
fn decode_allocations(
    model: &mut Model,
    kv: &mut KvStore,
    first_block: u32,
    seqs: usize,
    prompt: usize,
) -> Vec<usize> {
    assert!(
        prompt + seqs + STEPS <= BLOCK * BLOCKS_PER_SEQ,
        "contexts fit their blocks"
    );
    let vocab = model.config.vocab_size as u32;
    let tables: Vec<Vec<BlockId>> = (0..seqs)
        .map(|s| {
            let first = first_block + (s * BLOCKS_PER_SEQ) as u32;
            (first..first + BLOCKS_PER_SEQ as u32)
                .map(BlockId)
                .collect()
        })
        .collect();
    let mut lens: Vec<usize> = (0..seqs).map(|s| prompt + s).collect();
    let mut tokens = Vec::new();
    let mut prompts = Vec::new();
    for (s, &len) in lens.iter().enumerate() {
        let start = tokens.len();
        tokens.extend((0..len).map(|i| TokenId((17 * i as u32 + 101 * s as u32 + 5) % vocab)));
        prompts.push(SeqSpan {
            start,
            len,
            num_cached: 0,
            block_table: tables[s].clone(),
            adapter: None,
        });
    }
    let prefill = ForwardBatch {
        tokens,
        seqs: prompts,
        output: OutputSelection::Last,
    };
    let prefilled = model.forward(&prefill, kv).expect("prefill");
    let mut next: Vec<TokenId> = argmax_rows(&prefilled);
    model.recycle_logits(prefilled);
    let mut counts = Vec::with_capacity(STEPS);
    for _ in 0..STEPS {
        let spans = (0..seqs)
            .map(|s| SeqSpan {
                start: s,
                len: 1,
                num_cached: lens[s],
                block_table: tables[s].clone(),
                adapter: None,
            })
            .collect();
        let step = ForwardBatch {
            tokens: next.clone(),
            seqs: spans,
            output: OutputSelection::Last,
        };
        let before = allocations();
        let logits = model.forward(&step, kv).expect("decode step");
        counts.push(allocations() - before);
        next = argmax_rows(&logits);
        model.recycle_logits(logits);
        lens.iter_mut().for_each(|l| *l += 1);
    }
    counts
}

fn argmax_rows(logits: &tandem_model::logits::Logits) -> Vec<TokenId> {
    (0..logits.rows().len())
        .map(|i| {
            let row = logits.row(i);
            let best = (0..row.len())
                .max_by(|&a, &b| row[a].total_cmp(&row[b]))
                .expect("a vocabulary is not empty");
            TokenId(best as u32)
        })
        .collect()
}

#[test]
fn a_decode_step_allocates_only_its_logits_row_list() {
    let path = tandem_model::default_model::test_model_path()
        .expect("the default model is needed; this test does not skip");
    let mut model = Model::new(load_gguf_model(&path).expect("load").0, 2);
    let blocks = 3 * SEQS * BLOCKS_PER_SEQ;
    let mut kv =
        KvStore::with_dtype(&model.config, BLOCK, blocks, model.default_kv_dtype()).expect("kv");
    // The first sequences grow the model's buffers (five on two threads: their attention is
    // split along the contexts); the next ones, fewer and with longer contexts, on other
    // blocks, must find them ready, whether their attention is split along the contexts
    // (three sequences) or by tokens (two, which share out evenly).
    let warm_up = decode_allocations(&mut model, &mut kv, 0, SEQS, 140);
    assert!(warm_up.iter().all(|&n| n >= 1), "{warm_up:?}");
    eprintln!("warm-up allocations per step: {warm_up:?}");
    let per_run = (SEQS * BLOCKS_PER_SEQ) as u32;
    let mut steady = decode_allocations(&mut model, &mut kv, per_run, 3, 173);
    steady.extend(decode_allocations(&mut model, &mut kv, 2 * per_run, 2, 180));
    assert!(
        steady.iter().all(|&n| n == 1),
        "allocations per decode step after warm-up: {steady:?} (want 1: the logits' row list)"
    );
}
