//! `carry_tokens`: an overlapped step's carried tokens, written on the device from the
//! picks of the step before (see `launched_steps.rs`).

use super::*;

/// The reference: each pair's row takes its pick (a negative pick reads as 0), every other
/// row keeps its token.
fn carried_reference(tokens: &[i32], picks: &[i32], pairs: &[(usize, usize)]) -> Vec<i32> {
    let mut out = tokens.to_vec();
    for &(row, from) in pairs {
        out[row] = picks[from].max(0);
    }
    out
}

fn run(dtype: CudaDtype, tokens: &[i32], picks: &[i32], pairs: &[(usize, usize)]) -> Vec<i32> {
    let k = kernels(dtype);
    let flat: Vec<i32> = pairs
        .iter()
        .flat_map(|&(r, f)| [r as i32, f as i32])
        .collect();
    let (mut t, mut p, mut q) = (Buf::of(tokens), Buf::of(picks), Buf::of(&flat));
    k.carry_tokens(t.ptr(), p.ptr(), q.ptr(), pairs.len())
        .expect("launch");
    t.read::<i32>()
}

#[test]
fn carried_rows_take_the_picks_bitwise_and_other_rows_keep_their_tokens() {
    for dtype in MODES {
        // Picks with the sign bit's neighbours and high bits set: copied, not converted.
        let picks = [5, -1, 0x7fff_fff0, 17, 1 << 30, 3];
        // Placeholders the carried rows overwrite, and rows no pair names.
        let tokens = [900, 901, 902, 903, 904, 905, 906];
        // Out of order, one output twice, a None pick, and not every row.
        let pairs = [(6, 2), (0, 4), (3, 1), (2, 0), (5, 0)];
        let got = run(dtype, &tokens, &picks, &pairs);
        let want = carried_reference(&tokens, &picks, &pairs);
        assert_eq!(got, want, "{dtype:?}");
        assert_eq!(got, [1 << 30, 901, 5, 0, 904, 5, 0x7fff_fff0], "{dtype:?}");
    }
}

#[test]
fn carry_tokens_covers_more_pairs_than_a_block_has_threads() {
    for dtype in MODES {
        let n = 700;
        let mut r = rng(11);
        let picks: Vec<i32> = (0..n).map(|_| r.random_range(-3..50_000)).collect();
        let tokens: Vec<i32> = (0..n as i32).map(|i| -i - 1).collect();
        // Every third row carries the pick of a shuffled output.
        let pairs: Vec<(usize, usize)> = (0..n)
            .filter(|i| i % 3 != 1)
            .map(|i| (i, (i * 7 + 3) % n))
            .collect();
        let got = run(dtype, &tokens, &picks, &pairs);
        assert_eq!(got, carried_reference(&tokens, &picks, &pairs), "{dtype:?}");
    }
}

#[test]
fn no_carried_pairs_leave_the_tokens_alone() {
    let tokens = [4, 8, 15];
    assert_eq!(run(CudaDtype::F32, &tokens, &[1, 2], &[]), tokens);
}
