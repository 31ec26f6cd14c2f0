//! `carry_tokens`: an overlapped step's carried tokens, written on the device from the
//! picks of the step before (see `launched_steps.rs`), and the token each output row's
//! penalties count once more (`processing.cu`).

use super::*;

/// A carried token: (row, output row of the step before, output row of this step).
type Triple = (usize, usize, usize);

/// The reference: each triple's row takes its pick (a negative pick reads as 0) and its
/// output notes the pick as drawn; every other row keeps its token, every other output -1.
fn carried_reference(
    tokens: &[i32],
    picks: &[i32],
    triples: &[Triple],
    outputs: usize,
) -> (Vec<i32>, Vec<i32>) {
    let mut out = tokens.to_vec();
    let mut carried = vec![-1; outputs];
    for &(row, from, output) in triples {
        out[row] = picks[from].max(0);
        carried[output] = picks[from];
    }
    (out, carried)
}

fn run(
    dtype: CudaDtype,
    tokens: &[i32],
    picks: &[i32],
    triples: &[Triple],
    outputs: usize,
) -> (Vec<i32>, Vec<i32>) {
    let k = kernels(dtype);
    let flat: Vec<i32> = triples
        .iter()
        .flat_map(|&(r, f, o)| [r as i32, f as i32, o as i32])
        .collect();
    let (mut t, mut p, mut q) = (Buf::of(tokens), Buf::of(picks), Buf::of(&flat));
    let mut c = Buf::of(&vec![77i32; outputs.max(1)]);
    k.carry_tokens(t.ptr(), p.ptr(), q.ptr(), triples.len(), c.ptr(), outputs)
        .expect("launch");
    let mut carried = c.read::<i32>();
    carried.truncate(outputs);
    (t.read::<i32>(), carried)
}

#[test]
fn carried_rows_take_the_picks_bitwise_and_other_rows_keep_their_tokens() {
    for dtype in MODES {
        // Picks with the sign bit's neighbours and high bits set: copied, not converted.
        let picks = [5, -1, 0x7fff_fff0, 17, 1 << 30, 3];
        // Placeholders the carried rows overwrite, and rows no triple names.
        let tokens = [900, 901, 902, 903, 904, 905, 906];
        // Out of order, one output before carried twice, a None pick, and not every row.
        let triples = [(6, 2, 4), (0, 4, 0), (3, 1, 2), (2, 0, 1), (5, 0, 3)];
        let got = run(dtype, &tokens, &picks, &triples, 6);
        let want = carried_reference(&tokens, &picks, &triples, 6);
        assert_eq!(got, want, "{dtype:?}");
        assert_eq!(
            got.0,
            [1 << 30, 901, 5, 0, 904, 5, 0x7fff_fff0],
            "{dtype:?}"
        );
        assert_eq!(got.1, [1 << 30, 5, -1, 5, 0x7fff_fff0, -1], "{dtype:?}");
    }
}

#[test]
fn carry_tokens_covers_more_triples_than_a_block_has_threads() {
    for dtype in MODES {
        let n = 700;
        let mut r = rng(11);
        let picks: Vec<i32> = (0..n).map(|_| r.random_range(-3..50_000)).collect();
        let tokens: Vec<i32> = (0..n as i32).map(|i| -i - 1).collect();
        // Two rows of three carry the pick of a shuffled output; every row is an output.
        let triples: Vec<Triple> = (0..n)
            .filter(|i| i % 3 != 1)
            .map(|i| (i, (i * 7 + 3) % n, i))
            .collect();
        let got = run(dtype, &tokens, &picks, &triples, n);
        let want = carried_reference(&tokens, &picks, &triples, n);
        assert_eq!(got, want, "{dtype:?}");
    }
}

#[test]
fn no_carried_triples_leave_the_tokens_alone() {
    let tokens = [4, 8, 15];
    let (got, carried) = run(CudaDtype::F32, &tokens, &[1, 2], &[], 2);
    assert_eq!(got, tokens);
    assert_eq!(
        carried,
        [77, 77],
        "nothing launched without a carried token"
    );
}
