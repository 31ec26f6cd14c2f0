//! The per-ISA kernel table used by [`crate::matmul`]: row dequantization, the 1- and 4-row
//! f32 dots, and (SIMD only) the fused dequantize-and-dot of one stored row.
//!
//! Every variant here is **bitwise equal** to the scalar reference ([`crate::quant`]'s
//! dequantization and [`crate::dot16`]'s fixed 16-lane order): AVX-512 keeps the 16
//! accumulators in one register, AVX2 in two, both use a rounded multiply then a rounded add
//! (no FMA), the scalar tail and the same final tree.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod decode;
#[cfg(target_arch = "x86_64")]
mod kernels;
#[cfg(target_arch = "x86_64")]
mod lanes;

use crate::isa::Isa;
use crate::{dot16, quant, DType};

type DequantFn = unsafe fn(DType, &[u8], &mut [f32]);
type Dot1Fn = unsafe fn(&[f32], &[f32]) -> f32;
type Dot4Fn = unsafe fn([&[f32]; 4], &[f32]) -> [f32; 4];
type DotRowFn = unsafe fn(DType, &[u8], &[f32]) -> f32;

/// The kernels of one ISA. Built only by [`Kernels::new`], which checks that the CPU supports
/// the ISA: that check is what makes calling the (target-feature) function pointers sound.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Kernels {
    dequant: DequantFn,
    dot1: Dot1Fn,
    dot4: Dot4Fn,
    dot_row: Option<DotRowFn>,
}

impl Kernels {
    /// The kernels of `isa`, or `None` when this CPU cannot run them.
    pub(crate) fn new(isa: Isa) -> Option<Kernels> {
        if !isa.is_available() {
            return None;
        }
        match isa {
            Isa::Scalar => Some(Kernels {
                dequant: quant::dequantize_row,
                dot1: dot16::dot_1,
                dot4: dot16::dot_4,
                dot_row: None,
            }),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => Some(Kernels {
                dequant: avx2::dequantize_row,
                dot1: avx2::dot_1,
                dot4: avx2::dot_4,
                dot_row: Some(avx2::dot_row),
            }),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => Some(Kernels {
                dequant: avx512::dequantize_row,
                dot1: avx512::dot_1,
                dot4: avx512::dot_4,
                dot_row: Some(avx512::dot_row),
            }),
            #[cfg(not(target_arch = "x86_64"))]
            _ => None,
        }
    }

    /// As [`quant::dequantize_row`] (bitwise equal).
    pub(crate) fn dequantize_row(&self, dtype: DType, src: &[u8], dst: &mut [f32]) {
        // SAFETY: `new` built this table only after checking the CPU's features; the kernel
        // asserts the lengths itself.
        unsafe { (self.dequant)(dtype, src, dst) }
    }

    /// As [`dot16::dot_1`] (bitwise equal).
    pub(crate) fn dot_1(&self, w: &[f32], x: &[f32]) -> f32 {
        // SAFETY: as in `dequantize_row`.
        unsafe { (self.dot1)(w, x) }
    }

    /// As [`dot16::dot_4`] (bitwise equal).
    pub(crate) fn dot_4(&self, w: [&[f32]; 4], x: &[f32]) -> [f32; 4] {
        // SAFETY: as in `dequantize_row`.
        unsafe { (self.dot4)(w, x) }
    }

    /// Whether [`Kernels::dot_row`] has a fused kernel (else callers use scratch rows).
    pub(crate) fn has_fused_row(&self) -> bool {
        self.dot_row.is_some()
    }

    /// The dot of a stored row with `x`, bitwise equal to dequantizing the row and calling
    /// [`Kernels::dot_1`] (which is what it does when there is no fused kernel).
    pub(crate) fn dot_row(&self, dtype: DType, src: &[u8], x: &[f32]) -> f32 {
        match self.dot_row {
            // SAFETY: as in `dequantize_row`.
            Some(f) => unsafe { f(dtype, src, x) },
            None => {
                let mut w = vec![0.0f32; x.len()];
                self.dequantize_row(dtype, src, &mut w);
                self.dot_1(&w, x)
            }
        }
    }
}
