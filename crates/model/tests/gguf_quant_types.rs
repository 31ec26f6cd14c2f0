//! Every quantized tensor type loads from GGUF and computes, on the exact path, exactly the
//! function of its dequantized weights: a tiny llama whose matrices are stored as type T
//! scores bitwise like the same llama stored as F32 with those matrices dequantized (the
//! row formats themselves are checked against gguf in the kernels crate's tests).

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a test failure

use std::sync::atomic::{AtomicUsize, Ordering};

use tandem_kernels::quant::{dequantize_row, quantize_row};
use tandem_kernels::{DType, Isa};
use tandem_model::batch::TokenId;
use tandem_model::cpu_runner::{CpuRunner, KvSpec};
use tandem_model::gguf::{GgufWriter, MetadataValue};
use tandem_model::loader::load_gguf_model;
use tandem_model::scoring::{score_tokens, ScoreOptions};
use tandem_model::transformer::Model;
use MetadataValue::{String as Str, F32, U32};

/// Hidden size 256 so that every row holds whole 256-element blocks.
const H: u64 = 256;
const FF: u64 = 512;
const VOCAB: u64 = 64;
const KV_DIM: u64 = 128;

/// A deterministic pseudo-random value in [-0.5, 0.5) (xorshift).
fn values(n: u64, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

/// The tiny llama's GGUF bytes, every matrix stored as `stored` (F32 matrices hold the
/// dequantization of `quantized` instead, so both files define the same function).
fn tiny_llama(stored: DType, quantized: DType) -> Vec<u8> {
    let meta = [
        ("general.architecture", Str("llama".into())),
        ("llama.embedding_length", U32(H as u32)),
        ("llama.feed_forward_length", U32(FF as u32)),
        ("llama.block_count", U32(1)),
        ("llama.attention.head_count", U32(4)),
        ("llama.attention.head_count_kv", U32(2)),
        ("llama.attention.layer_norm_rms_epsilon", F32(1e-5)),
        ("llama.context_length", U32(64)),
    ];
    let mut w = GgufWriter::new(3);
    for (k, v) in meta {
        w = w.metadata(k, v);
    }
    let matrices: [(&str, [u64; 2]); 8] = [
        ("token_embd.weight", [H, VOCAB]),
        ("blk.0.attn_q.weight", [H, H]),
        ("blk.0.attn_k.weight", [H, KV_DIM]),
        ("blk.0.attn_v.weight", [H, KV_DIM]),
        ("blk.0.attn_output.weight", [H, H]),
        ("blk.0.ffn_gate.weight", [H, FF]),
        ("blk.0.ffn_up.weight", [H, FF]),
        ("blk.0.ffn_down.weight", [FF, H]),
    ];
    for (seed, (name, dims)) in matrices.into_iter().enumerate() {
        let cols = dims[0] as usize;
        let mut bytes = Vec::new();
        for row in values(dims[0] * dims[1], seed as u64 + 1).chunks(cols) {
            let mut q = vec![0u8; quantized.bytes_for(cols).unwrap()];
            quantize_row(quantized, row, &mut q);
            if stored == DType::F32 {
                let mut deq = vec![0.0f32; cols];
                dequantize_row(quantized, &q, &mut deq);
                bytes.extend(deq.iter().flat_map(|v| v.to_le_bytes()));
            } else {
                bytes.extend(q);
            }
        }
        w = w.tensor(name, stored, &dims, bytes);
    }
    for name in [
        "blk.0.attn_norm.weight",
        "blk.0.ffn_norm.weight",
        "output_norm.weight",
    ] {
        let ones: Vec<u8> = (0..H).flat_map(|_| 1.0f32.to_le_bytes()).collect();
        w = w.tensor(name, DType::F32, &[H], ones);
    }
    w.to_bytes()
}

/// Log-probabilities of a fixed token sequence under the model in `bytes`, run with `isa`.
fn score(bytes: &[u8], isa: Isa) -> Vec<f32> {
    static N: AtomicUsize = AtomicUsize::new(0);
    let path = std::env::temp_dir().join(format!(
        "tandem-quant-types-{}-{}.gguf",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&path, bytes).unwrap();
    let host = load_gguf_model(&path).unwrap().0;
    std::fs::remove_file(&path).unwrap();
    let spec = KvSpec {
        block_size: 16,
        num_blocks: 8,
        dtype: None,
    };
    let mut runner = CpuRunner::new(Model::with_kernels(host, 1, isa), spec).unwrap();
    let tokens: Vec<TokenId> = (0..24u32).map(|i| TokenId((i * 7 + 3) % 64)).collect();
    let out = score_tokens(
        &mut runner,
        &tokens,
        &ScoreOptions::default(),
        &mut |_, _| {},
    )
    .unwrap();
    out.positions
        .iter()
        .skip(1)
        .map(|p| p.as_ref().unwrap().logprob)
        .collect()
}

#[test]
fn every_quantized_type_scores_exactly_as_its_dequantized_f32_twin() {
    let exact: Vec<Isa> = Isa::available()
        .into_iter()
        .filter(|i| i.is_exact())
        .collect();
    for dtype in DType::ALL.into_iter().filter(|d| d.is_quantized()) {
        let twin = tiny_llama(DType::F32, dtype);
        let stored = tiny_llama(dtype, dtype);
        for &isa in &exact {
            let (a, b) = (score(&stored, isa), score(&twin, isa));
            assert!(a.iter().all(|v| v.is_finite()), "{dtype} {isa}: {a:?}");
            for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                assert_eq!(
                    x.to_bits(),
                    y.to_bits(),
                    "{dtype} {isa} position {i}: {x} vs {y}"
                );
            }
        }
    }
}
