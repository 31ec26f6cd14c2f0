//! The KV transfer wire form against arbitrary bytes (a peer is another process: its answer
//! may be cut short, corrupted or hostile): decoding never panics, and whatever decodes is
//! self-consistent (its length is exactly its header's, every block can be read) and
//! re-encodes to the same bytes.

use proptest::prelude::*;
use tandem_engine::kv_transfer::{KvPayload, HEADER_BYTES};
use tandem_model::kv_store::KvDtype;
use tandem_model::runner::KvBlockFormat;

fn valid(blocks: usize, bytes_per_block: usize, first: u32) -> Vec<u8> {
    let format = KvBlockFormat {
        compatibility: 0xfeed_beef,
        dtype: KvDtype::F16,
        block_size: 16,
        bytes_per_block,
    };
    let mut p = KvPayload::with_capacity(format, first, blocks).expect("format");
    p.append_blocks(|out| {
        out.extend((0..blocks * bytes_per_block).map(|i| i as u8));
        Ok(())
    })
    .expect("whole blocks");
    p.into_bytes()
}

fn check(bytes: Vec<u8>) {
    let len = bytes.len();
    if let Ok(p) = KvPayload::decode(bytes.clone()) {
        let size = p.format().bytes_per_block;
        assert_eq!(len, HEADER_BYTES + p.num_blocks() * size);
        for i in 0..p.num_blocks() {
            assert_eq!(p.block(i).len(), size);
        }
        assert_eq!(p.into_bytes(), bytes);
    }
}

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..160)) {
        check(bytes);
    }

    #[test]
    fn corrupted_payloads_never_panic(
        blocks in 0usize..4,
        size in 1usize..24,
        first in any::<u32>(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        cut in any::<prop::sample::Index>(),
        shorten in any::<bool>(),
    ) {
        let mut bytes = valid(blocks, size, first);
        for (at, v) in edits {
            let i = at.index(bytes.len());
            bytes[i] = v;
        }
        if shorten {
            bytes.truncate(cut.index(bytes.len() + 1));
        }
        check(bytes);
    }
}

#[test]
fn an_intact_payload_decodes() {
    let p = KvPayload::decode(valid(3, 10, 7)).expect("valid");
    assert_eq!((p.first_block(), p.num_blocks()), (7, 3));
    assert_eq!(
        p.block(2),
        &(20..30).map(|i| i as u8).collect::<Vec<u8>>()[..]
    );
}
