//! Property tests of the block allocator and RAII block tables over random interleavings of
//! allocate / share / free / grow / truncate / fork / drop, against a plain model of the
//! expected refcounts.

use proptest::prelude::*;
use tandem_engine::block_allocator::BlockAllocator;
use tandem_engine::block_table::BlockTable;
use tandem_engine::model::batch::BlockId;

#[derive(Debug, Clone)]
enum Op {
    Allocate,
    Share(usize),
    Free(usize),
    NewTable,
    Grow(usize, usize),
    Truncate(usize, usize),
    Fork(usize),
    DropTable(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        Just(Op::Allocate),
        any::<usize>().prop_map(Op::Share),
        any::<usize>().prop_map(Op::Free),
        Just(Op::NewTable),
        (any::<usize>(), 0usize..40).prop_map(|(t, n)| Op::Grow(t, n)),
        (any::<usize>(), 0usize..40).prop_map(|(t, n)| Op::Truncate(t, n)),
        any::<usize>().prop_map(Op::Fork),
        any::<usize>().prop_map(Op::DropTable),
    ]
}

/// Expected refcounts: raw references held by the test plus one per table entry.
fn expected(num_blocks: usize, raw: &[BlockId], tables: &[BlockTable]) -> Vec<u32> {
    let mut rc = vec![0u32; num_blocks];
    for b in raw.iter().chain(tables.iter().flat_map(|t| t.blocks())) {
        rc[b.0 as usize] += 1;
    }
    rc
}

fn apply(a: &BlockAllocator, op: &Op, raw: &mut Vec<BlockId>, tables: &mut Vec<BlockTable>) {
    let pick = |i: usize, n: usize| (n > 0).then(|| i % n);
    match *op {
        Op::Allocate => {
            let free_before = a.num_free();
            match a.allocate() {
                Some(b) => raw.push(b),
                None => assert_eq!(free_before, 0, "allocation failed with free blocks"),
            }
        }
        Op::Share(i) => {
            if let Some(i) = pick(i, raw.len()) {
                a.share(raw[i]).expect("held block");
                raw.push(raw[i]);
            }
        }
        Op::Free(i) => {
            if let Some(i) = pick(i, raw.len()) {
                a.free(raw.swap_remove(i)).expect("held block");
            }
        }
        Op::NewTable => tables.push(BlockTable::new(a.clone())),
        Op::Grow(t, n) => {
            if let Some(t) = pick(t, tables.len()) {
                let (before, free) = (tables[t].len(), a.num_free());
                let need = n.div_ceil(a.block_size()).saturating_sub(before);
                match tables[t].ensure_capacity(n) {
                    Ok(()) => assert_eq!(tables[t].len(), before + need),
                    Err(e) => {
                        assert!(need > free, "refused {need} blocks with {free} free");
                        assert_eq!(e.needed, need);
                        assert_eq!(tables[t].len(), before);
                    }
                }
            }
        }
        Op::Truncate(t, n) => {
            if let Some(t) = pick(t, tables.len()) {
                let before = tables[t].len();
                tables[t].truncate_to_tokens(n);
                assert_eq!(tables[t].len(), before.min(n.div_ceil(a.block_size())));
            }
        }
        Op::Fork(t) => {
            if let Some(t) = pick(t, tables.len()) {
                let f = tables[t].fork();
                tables.push(f);
            }
        }
        Op::DropTable(t) => {
            if let Some(t) = pick(t, tables.len()) {
                drop(tables.swap_remove(t));
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn refcounts_and_free_list_stay_consistent(
        num_blocks in 1usize..12,
        block_size in 1usize..6,
        ops in prop::collection::vec(op(), 0..80),
    ) {
        let a = BlockAllocator::new(num_blocks, block_size).expect("valid pool");
        let mut raw = Vec::new();
        let mut tables = Vec::new();
        for op in &ops {
            apply(&a, op, &mut raw, &mut tables);
            a.check_invariants().expect("allocator invariants");
            let want = expected(num_blocks, &raw, &tables);
            let got: Vec<u32> = (0..num_blocks)
                .map(|b| a.refcount(BlockId(b as u32)).expect("inside the pool"))
                .collect();
            prop_assert_eq!(&got, &want);
            let in_use = want.iter().filter(|&&r| r > 0).count();
            prop_assert_eq!(a.num_free() + in_use, a.num_total());
        }
        // Every exit path releases: drop the tables, free the raw references.
        drop(tables);
        for b in raw {
            a.free(b).expect("held block");
        }
        prop_assert!(a.is_idle());
        a.check_invariants().expect("allocator invariants");
    }
}
