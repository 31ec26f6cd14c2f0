//! The 16-lane f32 vector the SIMD kernels are written against: one AVX-512 register or two
//! AVX2 registers. Lane `l` of a vector loaded at column `c0` holds column `c0 + l`, so the
//! accumulators of [`crate::dot16`] map one-to-one onto lanes.

use std::arch::x86_64::__m128i;

/// 16 f32 lanes with the few operations the kernels need. Every arithmetic operation is the
/// lane-wise IEEE operation with round-to-nearest (no fused multiply-add), so results are
/// bitwise equal to the scalar code doing the same operations.
///
/// # Safety
/// Every method may only run on a CPU with the implementor's target features (checked with
/// [`crate::isa::Isa::is_available`] before any kernel table is built). Pointer arguments
/// must be valid for reading (or writing, for `store`) the stated number of bytes; no
/// alignment is required.
pub(super) trait Lanes16: Copy {
    /// How many of these vectors the CPU's registers hold (32 for AVX-512, 8 for AVX2's
    /// pairs of 8-lane registers): kernels that keep many accumulators check it.
    const IN_REGISTERS: usize;
    /// All lanes `0.0`.
    unsafe fn zero() -> Self;
    /// All lanes `v`.
    unsafe fn splat(v: f32) -> Self;
    /// 16 f32 from `p` (64 bytes).
    unsafe fn load(p: *const f32) -> Self;
    /// Writes the 16 lanes to `p` (64 bytes).
    unsafe fn store(self, p: *mut f32);
    unsafe fn add(self, o: Self) -> Self;
    unsafe fn sub(self, o: Self) -> Self;
    unsafe fn mul(self, o: Self) -> Self;
    /// Lane-wise `self · b + c` rounded once (fused multiply-add).
    unsafe fn mul_add(self, b: Self, c: Self) -> Self;
    /// Lane-wise `self > o ? self : o` (so a NaN in `o` is kept).
    unsafe fn max(self, o: Self) -> Self;
    /// Lane-wise `self < o ? self : o` (so a NaN in `o` is kept).
    unsafe fn min(self, o: Self) -> Self;
    /// Lane-wise `f32::from_bits(bits(self).wrapping_sub(bias) << 23)`.
    unsafe fn shifted_exponent(self, bias: u32) -> Self;
    /// The 16 bytes of `b` as unsigned integers, converted exactly.
    unsafe fn from_u8(b: __m128i) -> Self;
    /// The 16 bytes of `b` as signed integers, converted exactly.
    unsafe fn from_i8(b: __m128i) -> Self;
    /// 16 little-endian binary16 values from `p` (32 bytes), converted exactly.
    unsafe fn load_f16(p: *const u8) -> Self;
    /// 16 little-endian bfloat16 values from `p` (32 bytes), converted exactly.
    unsafe fn load_bf16(p: *const u8) -> Self;
    /// The lanes in order.
    unsafe fn to_array(self) -> [f32; 16];
    /// The sum of the lanes by exactly the tree of [`crate::dot16::tree_sum`]
    /// (`v[l] + v[l + 8]`, then `+ v[l + 4]`, `+ v[l + 2]`, `+ v[l + 1]`): bitwise equal to it.
    unsafe fn tree_sum(self) -> f32;
    /// The largest lane (by `>`, in an order of the implementor's choosing: the lanes must
    /// hold no NaN, and which of a `+0.0` and a `-0.0` maximum is returned is unspecified).
    unsafe fn max_lane(self) -> f32;
    /// Lane `p` holds `a[p].tree_sum()` (bitwise: the same additions).
    unsafe fn tree_sum_16(a: &[Self; 16]) -> Self;
}
