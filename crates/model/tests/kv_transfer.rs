//! Moving KV blocks between runners (`ModelRunner::read_blocks` / `write_blocks`, the base of
//! disaggregated prefill): a runner that continues from blocks another runner computed gives
//! bitwise the logits the first one gives, for every CPU KV dtype, and the cached positions'
//! logits (from the final hidden states moved with the blocks) are equal too.

use std::path::Path;

use tandem_model::batch::{BlockId, ForwardBatch, OutputSelection, TokenId};
use tandem_model::cpu_runner::{CpuRunner, KvSpec};
use tandem_model::hf_config::load_hf_config;
use tandem_model::kv_store::KvDtype;
use tandem_model::model_builder::{build_host_model, NameScheme};
use tandem_model::runner::ModelRunner;
use tandem_model::safetensors::load_safetensors_dir;
use tandem_model::transformer::Model;

const BLOCK: usize = 4;

fn runner(name: &str, dtype: KvDtype, block_size: usize) -> CpuRunner {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(name);
    let info = load_hf_config(&dir).expect("config");
    let tensors = load_safetensors_dir(&dir).expect("tensors");
    let host =
        build_host_model(info.config, tensors, NameScheme::HuggingFace, None).expect("model");
    let spec = KvSpec {
        block_size,
        num_blocks: 12,
        dtype: Some(dtype),
    };
    CpuRunner::new(Model::new(host, 2), spec).expect("runner")
}

fn ids(n: usize) -> Vec<TokenId> {
    (0..n as u32)
        .map(|i| TokenId((i * 37 + 11) % 200))
        .collect()
}

fn forward_bits(
    r: &mut CpuRunner,
    tokens: &[TokenId],
    start: usize,
    table: &[BlockId],
) -> Vec<u32> {
    let batch = ForwardBatch::single(tokens.to_vec(), start, table.to_vec(), OutputSelection::All);
    let logits = r.forward(&batch).expect("forward");
    logits.as_slice().iter().map(|x| x.to_bits()).collect()
}

fn blocks(v: &[u32]) -> Vec<BlockId> {
    v.iter().copied().map(BlockId).collect()
}

#[test]
fn a_runner_continues_bitwise_from_moved_blocks() {
    let tokens = ids(17);
    for dtype in [KvDtype::F32, KvDtype::F16, KvDtype::Q8] {
        let mut source = runner("qwen3", dtype, BLOCK);
        let mut dest = runner("qwen3", dtype, BLOCK);
        let format = source
            .kv_block_format()
            .expect("the CPU runner moves blocks");
        assert_eq!(Some(format), dest.kv_block_format());
        let (src_table, dst_table) = (blocks(&[5, 1, 7, 3, 8]), blocks(&[2, 9, 0, 4, 6]));
        forward_bits(&mut source, &tokens[..12], 0, &src_table);
        let mut bytes = Vec::new();
        source
            .read_blocks(&src_table[..3], &mut bytes)
            .expect("read");
        assert_eq!(bytes.len(), 3 * format.bytes_per_block, "{dtype:?}");
        let per_token = source.kv_geometry().bytes_per_token;
        assert_eq!(format.bytes_per_block, per_token * BLOCK, "{dtype:?}");
        dest.write_blocks(&dst_table[..3], &bytes).expect("write");

        let want = forward_bits(&mut source, &tokens[12..], 12, &src_table);
        let got = forward_bits(&mut dest, &tokens[12..], 12, &dst_table);
        assert!(want == got, "{dtype:?}: the continuation's logits differ");
        let cached = |r: &mut CpuRunner, t: &[BlockId]| -> Vec<u32> {
            let l = r.cached_logits(t, 0..12).expect("cached logits");
            l.as_slice().iter().map(|x| x.to_bits()).collect()
        };
        assert!(
            cached(&mut source, &src_table) == cached(&mut dest, &dst_table),
            "{dtype:?}: the moved hidden states give other logits"
        );
        let mut again = Vec::new();
        dest.read_blocks(&dst_table[..3], &mut again)
            .expect("read back");
        assert!(again == bytes, "{dtype:?}: a block reads back as written");
    }
}

#[test]
fn formats_differ_where_blocks_are_not_interchangeable() {
    let base = runner("qwen3", KvDtype::F16, BLOCK)
        .kv_block_format()
        .expect("format");
    let others = [
        runner("qwen3", KvDtype::F32, BLOCK),
        runner("qwen3", KvDtype::F16, 8),
        runner("qwen2", KvDtype::F16, BLOCK),
    ];
    for r in others {
        let f = r.kv_block_format().expect("format");
        assert_ne!(f.compatibility, base.compatibility, "{f:?}");
    }
}

#[test]
fn malformed_writes_are_refused_and_change_nothing() {
    let mut r = runner("qwen3", KvDtype::F16, BLOCK);
    let table = blocks(&[0, 1]);
    forward_bits(&mut r, &ids(8), 0, &table);
    let size = r.kv_block_format().expect("format").bytes_per_block;
    let mut before = Vec::new();
    r.read_blocks(&table, &mut before).expect("read");
    let garbage = vec![0x55u8; 2 * size];
    let short = r
        .write_blocks(&table, &garbage[..2 * size - 1])
        .expect_err("short data");
    assert!(short.to_string().contains("bytes"), "{short}");
    let outside = r
        .write_blocks(&blocks(&[1, 12]), &garbage)
        .expect_err("block 12 of 12");
    assert!(outside.to_string().contains("block 12"), "{outside}");
    let mut after = Vec::new();
    r.read_blocks(&table, &mut after).expect("read");
    assert!(before == after, "a refused write changed a block");
    assert!(r.read_blocks(&blocks(&[12]), &mut after).is_err());
}
