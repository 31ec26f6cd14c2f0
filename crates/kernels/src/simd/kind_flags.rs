//! The one mapping from a packed matrix's record kind to the int8 kernels' const parameters,
//! shared by `packed_avx2` and `packed_vnni`: `Q8` (8-bit weights, else nibbles), `MIN` (a
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
