//! The forward pass against HF transformers (fp32) on the small random-weight fixtures made
//! by `scripts/make_hf_fixtures.py` and `scripts/make_sliding_window_fixtures.py` (Gemma 3,
//! Mistral and Phi-3 with a sliding window of 8 positions, shorter than the prompts) and
//! `scripts/make_moe_fixtures.py` (Qwen3-MoE with and without renormalised routing weights,
//! Mixtral), and the batch/chunk/thread invariants on the same models.

use std::path::{Path, PathBuf};

use tandem_kernels::attention::KvRows;
use tandem_model::batch::{BlockId, ForwardBatch, OutputSelection, SeqSpan, TokenId};
use tandem_model::hf_config::load_hf_config;
use tandem_model::kv_store::{KvDtype, KvStore};
use tandem_model::logits::Logits;
use tandem_model::model_builder::{build_host_model, NameScheme};
use tandem_model::safetensors::load_safetensors_dir;
use tandem_model::transformer::Model;

const FIXTURES: [&str; 15] = [
    "llama_tied",
    "llama_untied",
    "llama3_rope",
    "mistral",
    "qwen2",
    "qwen3",
    "llama_sharded",
    "llama_tied_bf16",
    "llama_tied_f16",
    "gemma3",
    "mistral_swa",
    "phi3",
    "qwen3_moe",
    "qwen3_moe_norm",
    "mixtral",
];

fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(name)
}

fn load(name: &str, threads: usize) -> Model {
    let dir = fixture_dir(name);
    let info = load_hf_config(&dir).expect("config");
    let tensors = load_safetensors_dir(&dir).expect("tensors");
    Model::new(
        build_host_model(info.config, tensors, NameScheme::HuggingFace, None).expect("model"),
        threads,
    )
}

/// (input ids, reference logits `[len, vocab]`) of each fixture sequence.
fn sequences(name: &str) -> Vec<(Vec<TokenId>, Vec<f32>)> {
    let dir = fixture_dir(name);
    let text = std::fs::read_to_string(dir.join("reference.json")).expect("reference.json");
    let r: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert_eq!(r["logits_encoding"], "f32le");
    r["sequences"]
        .as_array()
        .expect("sequences")
        .iter()
        .map(|s| {
            let ids = s["input_ids"].as_array().expect("ids");
            let ids = ids
                .iter()
                .map(|v| TokenId(v.as_u64().expect("id") as u32))
                .collect();
            let bytes =
                std::fs::read(dir.join(s["logits_file"].as_str().expect("file"))).expect("bin");
            let logits = bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            (ids, logits)
        })
        .collect()
}

/// Logits of every position of `tokens`, computed in chunks of `chunk` tokens.
fn run_chunked(model: &mut Model, tokens: &[TokenId], chunk: usize, block_size: usize) -> Vec<f32> {
    run_chunked_as(model, tokens, chunk, block_size, KvDtype::F32)
}

/// [`run_chunked`] with keys and values stored as `dtype`.
fn run_chunked_as(
    model: &mut Model,
    tokens: &[TokenId],
    chunk: usize,
    block_size: usize,
    dtype: KvDtype,
) -> Vec<f32> {
    let blocks = tokens.len().div_ceil(block_size);
    let mut kv = KvStore::with_dtype(&model.config, block_size, blocks + 3, dtype).expect("kv");
    // Use a scattered block table to exercise paging.
    let table: Vec<BlockId> = (0..blocks as u32).rev().map(|b| BlockId(b + 3)).collect();
    let mut out = Vec::new();
    let mut done = 0;
    while done < tokens.len() {
        let n = chunk.min(tokens.len() - done);
        let batch = ForwardBatch::single(
            tokens[done..done + n].to_vec(),
            done,
            table.clone(),
            OutputSelection::All,
        );
        out.extend_from_slice(model.forward(&batch, &mut kv).expect("forward").as_slice());
        done += n;
    }
    out
}

/// The LM head writes into a logits buffer handed back to the model
/// (`Model::recycle_logits`) whatever the buffer held and whatever its size: every chunk's
/// logits are the bits of a model that never recycles (Gemma 3's fixture also caps them).
#[test]
fn recycled_logits_buffers_change_no_logit() {
    for name in ["llama_untied", "gemma3"] {
        let ids = &sequences(name)[0].0;
        let (chunk, block_size) = (5, 16);
        let want = run_chunked(&mut load(name, 2), ids, chunk, block_size);
        let mut model = load(name, 2);
        let vocab = model.config.vocab_size;
        let blocks = ids.len().div_ceil(block_size);
        let mut kv =
            KvStore::with_dtype(&model.config, block_size, blocks + 3, KvDtype::F32).expect("kv");
        let table: Vec<BlockId> = (0..blocks as u32).rev().map(|b| BlockId(b + 3)).collect();
        let mut got = Vec::new();
        for (c, start) in (0..ids.len()).step_by(chunk).enumerate() {
            // NaN buffers larger, then smaller, than a chunk's logits; every third chunk's
            // own logits handed back on top.
            let rows = if c % 2 == 0 { 2 * chunk - 1 } else { 2 };
            let nan = vec![f32::NAN; rows * vocab];
            model.recycle_logits(Logits::new((0..rows).collect(), vocab, nan));
            let n = chunk.min(ids.len() - start);
            let tokens = ids[start..start + n].to_vec();
            let batch = ForwardBatch::single(tokens, start, table.clone(), OutputSelection::All);
            let logits = model.forward(&batch, &mut kv).expect("forward");
            got.extend_from_slice(logits.as_slice());
            if c % 3 == 2 {
                model.recycle_logits(logits);
            }
        }
        assert_eq!(got.len(), want.len(), "{name}");
        let same = got
            .iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{name}: recycled buffers changed logits");
    }
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max)
}

#[test]
fn logits_match_transformers_fp32() {
    for name in FIXTURES {
        let mut model = load(name, 2);
        for (i, (ids, want)) in sequences(name).iter().enumerate() {
            let got = run_chunked(&mut model, ids, ids.len(), 16);
            assert_eq!(got.len(), want.len(), "{name} seq {i}: logits size");
            let max_diff = max_abs_diff(&got, want);
            eprintln!("{name} seq {i}: max |Δlogit| = {max_diff:.2e}");
            assert!(
                max_diff <= 1e-3,
                "{name} seq {i}: max |Δlogit| = {max_diff}"
            );
        }
    }
}

/// An f16 KV cache: every fixture stays within what rounding keys and values to 11
/// significant bits allows, and the rounding really happens (the logits differ from the f32
/// cache's).
#[test]
fn f16_kv_stays_close_to_transformers() {
    let mut rounded = 0;
    for name in FIXTURES {
        let mut model = load(name, 2);
        for (i, (ids, want)) in sequences(name).iter().enumerate() {
            let got = run_chunked_as(&mut model, ids, ids.len(), 16, KvDtype::F16);
            let max_diff = max_abs_diff(&got, want);
            eprintln!("{name} seq {i} (f16 KV): max |Δlogit| = {max_diff:.2e}");
            assert!(
                max_diff <= F16_KV_TOLERANCE,
                "{name} seq {i}: max |Δlogit| = {max_diff} with an f16 KV cache"
            );
            rounded += usize::from(got != run_chunked(&mut model, ids, ids.len(), 16));
        }
    }
    assert!(
        rounded > 0,
        "the f16 cache gave the f32 cache's logits everywhere"
    );
}

/// Max |Δlogit| allowed with an f16 KV cache. The fixtures' logits reach about 7; keys and
/// values carry a relative error of at most 2^-11, which moved them by at most 1.4e-2 when
/// this was written (twice that is allowed).
const F16_KV_TOLERANCE: f32 = 3e-2;

/// An 8-bit KV cache on the fixture whose heads fill whole scale groups (qwen3: 32
/// dimensions): close to transformers, a real rounding, and chunking and paging change no
/// bit (each token's keys and values are quantized once, when written). Fixtures whose heads
/// are narrower are refused with an error naming the head dimension.
#[test]
fn q8_kv_stays_close_to_transformers_and_chunks_change_no_bit() {
    let name = "qwen3";
    let mut model = load(name, 2);
    for (i, (ids, want)) in sequences(name).iter().enumerate() {
        let got = run_chunked_as(&mut model, ids, ids.len(), 16, KvDtype::Q8);
        let max_diff = max_abs_diff(&got, want);
        eprintln!("{name} seq {i} (q8 KV): max |Δlogit| = {max_diff:.2e}");
        assert!(
            max_diff <= Q8_KV_TOLERANCE,
            "{name} seq {i}: max |Δlogit| = {max_diff} with a q8 KV cache"
        );
        let f16 = run_chunked_as(&mut model, ids, ids.len(), 16, KvDtype::F16);
        assert!(
            got != f16,
            "{name} seq {i}: the q8 cache gave the f16 cache's logits"
        );
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
        for (chunk, block) in [(1, 16), (5, 4), (7, 1)] {
            let parts = run_chunked_as(&mut model, ids, chunk, block, KvDtype::Q8);
            assert!(
                bits(&got) == bits(&parts),
                "{name} seq {i}: chunk {chunk} block {block} differs"
            );
        }
    }
    let narrow = load("llama_tied", 1);
    let err = KvStore::with_dtype(&narrow.config, 16, 4, KvDtype::Q8)
        .expect_err("a head of 16 dimensions cannot hold q8 groups of 32");
    assert!(err.to_string().contains("is 16"), "{err}");
}

/// A q8 block copied before a write (copy-on-write of a shared block) carries its codes and
/// its scales, in every layer; writing into the copy leaves the original as it was.
#[test]
fn q8_blocks_copy_codes_and_scales() {
    let config = load("qwen3", 1).config;
    let (block, kv_dim) = (4, config.kv_dim());
    let mut kv = KvStore::with_dtype(&config, block, 3, KvDtype::Q8).expect("kv");
    let row = |slot: usize, layer: usize, scale: f32| -> Vec<f32> {
        (0..kv_dim)
            .map(|c| ((slot * 31 + layer * 7 + c * 13) % 97) as f32 * scale - 40.0 * scale)
            .collect()
    };
    for layer in 0..config.num_layers {
        for slot in 0..block {
            let s = 0.01 * (1 + slot + layer) as f32;
            kv.write(
                layer,
                slot,
                &row(slot, layer, s),
                &row(slot + 5, layer, 2.0 * s),
            );
        }
    }
    let rows_of = |kv: &KvStore, layer: usize, first: usize| -> Vec<f32> {
        let KvRows::Q8 { keys, values } = kv.layer(layer) else {
            panic!("a q8 store lends 8-bit rows");
        };
        (first * kv_dim..(first + block) * kv_dim)
            .flat_map(|i| [keys.get(i), values.get(i)])
            .collect()
    };
    let before: Vec<Vec<f32>> = (0..config.num_layers).map(|l| rows_of(&kv, l, 0)).collect();
    kv.copy_block(BlockId(0), BlockId(2));
    for (layer, want) in before.iter().enumerate() {
        assert_eq!(
            &rows_of(&kv, layer, 2 * block),
            want,
            "layer {layer}: the copy"
        );
    }
    kv.write(0, 2 * block, &row(9, 0, 3.0), &row(9, 0, 3.0));
    assert_eq!(
        rows_of(&kv, 0, 0),
        before[0],
        "the original after a write into the copy"
    );
    assert_ne!(
        rows_of(&kv, 0, 2 * block),
        before[0],
        "the write into the copy"
    );
}

/// Max |Δlogit| allowed with a q8 KV cache: a value is off by up to 1/254 of its group's
/// largest magnitude (against f16's 2^-11 of itself). On this random-weight fixture (logits
/// up to about 7) it moved them by 0.113 and 0.091 when this was written (f16: 3.4e-3 and
/// 3.7e-3); a real model's distance is `default_model_fidelity_int8`'s.
const Q8_KV_TOLERANCE: f32 = 0.2;

#[test]
fn chunked_prefill_equals_one_pass_bitwise() {
    for name in [
        "llama_tied",
        "qwen2",
        "qwen3",
        "gemma3",
        "mistral_swa",
        "phi3",
        "qwen3_moe",
        "mixtral",
    ] {
        let mut model = load(name, 2);
        let (ids, _) = &sequences(name)[1];
        for dtype in [KvDtype::F32, KvDtype::F16] {
            let whole = run_chunked_as(&mut model, ids, ids.len(), 16, dtype);
            for (chunk, block) in [(1, 16), (5, 4), (16, 16), (7, 1)] {
                let parts = run_chunked_as(&mut model, ids, chunk, block, dtype);
                assert!(
                    whole == parts,
                    "{name} ({dtype:?} KV): chunk {chunk} block {block} differs from one pass"
                );
            }
        }
    }
}

#[test]
fn a_sequence_does_not_depend_on_its_batch_neighbours() {
    // In a mixture of experts, the neighbours share some of a token's experts.
    for name in [
        "llama_untied",
        "gemma3",
        "mistral_swa",
        "phi3",
        "qwen3_moe_norm",
        "mixtral",
    ] {
        batch_neighbours(name);
    }
}

fn batch_neighbours(name: &str) {
    let mut model = load(name, 2);
    let seqs = sequences(name);
    let alone: Vec<Vec<f32>> = seqs
        .iter()
        .map(|(ids, _)| run_chunked(&mut model, ids, ids.len(), 8))
        .collect();
    // Both sequences in one flat batch, each with its own block table.
    let (a, b) = (&seqs[0].0, &seqs[1].0);
    let (na, nb) = (a.len().div_ceil(8), b.len().div_ceil(8));
    let mut kv = KvStore::new(&model.config, 8, na + nb).expect("kv");
    let batch = ForwardBatch {
        tokens: a.iter().chain(b).copied().collect(),
        seqs: vec![
            SeqSpan {
                start: 0,
                len: a.len(),
                num_cached: 0,
                block_table: (0..na as u32).map(BlockId).collect(),
                adapter: None,
            },
            SeqSpan {
                start: a.len(),
                len: b.len(),
                num_cached: 0,
                block_table: (na as u32..(na + nb) as u32).map(BlockId).collect(),
                adapter: None,
            },
        ],
        output: OutputSelection::All,
    };
    let both = model.forward(&batch, &mut kv).expect("forward");
    let split = a.len() * model.config.vocab_size;
    assert!(
        both.as_slice()[..split] == alone[0][..],
        "{name}: first sequence changed in a batch"
    );
    assert!(
        both.as_slice()[split..] == alone[1][..],
        "{name}: second sequence changed in a batch"
    );
}

#[test]
fn one_and_two_threads_agree_bitwise() {
    for name in ["qwen3", "gemma3", "qwen3_moe"] {
        let (mut one, mut two) = (load(name, 1), load(name, 2));
        let (ids, _) = &sequences(name)[1];
        assert!(
            run_chunked(&mut one, ids, 4, 16) == run_chunked(&mut two, ids, 4, 16),
            "{name}"
        );
    }
}

#[test]
fn output_selection_last_and_rows_pick_the_same_logits() {
    let mut model = load("llama_tied", 2);
    let (ids, _) = &sequences("llama_tied")[0];
    let all = run_chunked(&mut model, ids, ids.len(), 16);
    let v = model.config.vocab_size;
    let mut kv = KvStore::new(&model.config, 16, 2).expect("kv");
    let table = vec![BlockId(0), BlockId(1)];
    let last = ForwardBatch::single(ids.clone(), 0, table.clone(), OutputSelection::Last);
    let got = model.forward(&last, &mut kv).expect("forward");
    assert_eq!(got.rows(), &[ids.len() - 1]);
    assert!(got.as_slice() == &all[(ids.len() - 1) * v..]);
    let rows = ForwardBatch::single(ids.clone(), 0, table, OutputSelection::Rows(vec![0, 3]));
    let got = model.forward(&rows, &mut kv).expect("forward");
    assert!(got.row(0) == &all[..v] && got.row(1) == &all[3 * v..4 * v]);
}

#[test]
fn malformed_batches_are_errors_not_panics() {
    let mut model = load("llama_tied", 1);
    let mut kv = KvStore::new(&model.config, 4, 2).expect("kv");
    let too_long = ForwardBatch::single(
        vec![TokenId(1); 9],
        0,
        vec![BlockId(0), BlockId(1)],
        OutputSelection::All,
    );
    assert!(
        model.forward(&too_long, &mut kv).is_err(),
        "9 tokens in 8 slots"
    );
    let bad_token = ForwardBatch::single(
        vec![TokenId(100_000)],
        0,
        vec![BlockId(0)],
        OutputSelection::All,
    );
    assert!(
        model.forward(&bad_token, &mut kv).is_err(),
        "token outside the vocabulary"
    );
    let bad_block =
        ForwardBatch::single(vec![TokenId(1)], 0, vec![BlockId(7)], OutputSelection::All);
    assert!(
        model.forward(&bad_block, &mut kv).is_err(),
        "block outside the store"
    );
}
