//! What the int8 kernels `packed_avx2` and `packed_vnni` share: the one mapping from a packed
//! matrix's record kind to their const parameters, and the loop over a group's tiles of
//! tokens. The const parameters: `Q8` (8-bit weights, else nibbles), `MIN` (a
//! min table), `SUPER` (scales as 8-bit multipliers of a super-block's f16), `HALVES` (Q6_K's
//! two scales per record), `TABLE` (nibbles index the IQ4 levels), `PLANE` (a line of fifth
//! bits completes the nibbles).

/// `$tiles::<Q8, MIN, SUPER, HALVES, TABLE, PLANE>($args)` with the flags of `$kind` (a
/// macro, not a function taking a closure: the call must stay inside the caller's target
/// features).
macro_rules! with_kind_flags {
    ($kind:expr, $tiles:ident($($arg:expr),* $(,)?)) => {{
        use crate::packed::RecordKind as K;
        match $kind {
            K::Nibbles => $tiles::<false, false, false, false, false, false>($($arg),*),
            K::NibblesMin => $tiles::<false, true, false, false, false, false>($($arg),*),
            K::NibblesMinSuper => $tiles::<false, true, true, false, false, false>($($arg),*),
            K::Bytes => $tiles::<true, false, false, false, false, false>($($arg),*),
            K::Plane => $tiles::<false, false, false, false, false, true>($($arg),*),
            K::PlaneMin => $tiles::<false, true, false, false, false, true>($($arg),*),
            K::TableNibbles => $tiles::<false, false, false, false, true, false>($($arg),*),
            K::TableNibblesSuper => $tiles::<false, false, true, false, true, false>($($arg),*),
            K::PlaneMinSuper => $tiles::<false, true, true, false, false, true>($($arg),*),
            K::Halves => $tiles::<true, false, true, true, false, false>($($arg),*),
        }
    }};
}

/// Defines the calling kernel module's `tiles::<Q8, MIN, SUPER, HALVES, TABLE, PLANE>(w, g,
/// xq, out, scales)`: every token of `xq`, the module's `TILE` at a time, then the remainder,
/// each through the module's `tile`. The full tiles after the first prefetch the next group,
/// a share each; the first leaves the scale tables in `scales` for the others.
macro_rules! define_tiles {
    () => {
        #[inline(always)]
        unsafe fn tiles<
            const Q8: bool,
            const MIN: bool,
            const SUPER: bool,
            const HALVES: bool,
            const TABLE: bool,
            const PLANE: bool,
        >(
            w: &PackedMatrix,
            g: usize,
            xq: &QuantizedRows,
            out: &mut GroupOut,
            scales: &mut [f32],
        ) {
            let n = xq.n_tokens();
            let (full, blocks) = (n / TILE, w.cols() / BLOCK);
            let plan = GroupPrefetch::plan(w, g, full);
            let mut tables = |i| ScaleTables::for_tile(SUPER, full, i, scales, blocks);
            let mut t0 = 0;
            while t0 + TILE <= n {
                let (fetch, st) = (plan.tile(t0 / TILE), tables(t0 / TILE));
                tile::<TILE, Q8, MIN, SUPER, HALVES, TABLE, PLANE>(w, g, xq, t0, fetch, st, out);
                t0 += TILE;
            }
            let (own, st) = (GroupPrefetch::OWN, tables(full));
            match n - t0 {
                3 => tile::<3, Q8, MIN, SUPER, HALVES, TABLE, PLANE>(w, g, xq, t0, own, st, out),
                2 => tile::<2, Q8, MIN, SUPER, HALVES, TABLE, PLANE>(w, g, xq, t0, own, st, out),
                1 => tile::<1, Q8, MIN, SUPER, HALVES, TABLE, PLANE>(w, g, xq, t0, own, st, out),
                _ => {}
            }
        }
    };
}
