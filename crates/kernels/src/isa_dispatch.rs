//! One function compiled three ways: portable code (plain IEEE operations, a fixed order)
//! compiled for AVX-512, for AVX2, or as it is, and dispatched on an [`Isa`] at run time.
//! LLVM only widens the vectors; it never reorders floating-point operations, so every
//! variant gives the same bits.
//!
//! [`Isa`]: crate::isa::Isa

/// `$with(isa, args)`: `$portable` compiled for AVX-512 or AVX2 where `isa` names one and
/// the CPU has it, else as it is (the same operations, so every variant gives the same bits).
macro_rules! with_isa {
    ($(#[$doc:meta])* $with:ident => $portable:ident($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        $(#[$doc])*
        pub fn $with(isa: $crate::isa::Isa, $($arg: $ty),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            {
                /// # Safety
                /// The CPU must have AVX-512 F and VL.
                #[target_feature(enable = "avx512f,avx512vl")]
                unsafe fn avx512($($arg: $ty),*) -> $ret {
                    $portable($($arg),*)
                }
                /// # Safety
                /// The CPU must have AVX2.
                #[target_feature(enable = "avx2")]
                unsafe fn avx2($($arg: $ty),*) -> $ret {
                    $portable($($arg),*)
                }
                if matches!(isa, $crate::isa::Isa::Avx512 | $crate::isa::Isa::Avx512Int8) && isa.is_available() {
                    // SAFETY: the CPU has AVX-512 F and VL (`is_available` just checked).
                    return unsafe { avx512($($arg),*) };
                }
                if matches!(isa, $crate::isa::Isa::Avx2 | $crate::isa::Isa::Avx2Int8) && isa.is_available() {
                    // SAFETY: the CPU has AVX2 (`is_available` just checked).
                    return unsafe { avx2($($arg),*) };
                }
            }
            let _ = isa;
            $portable($($arg),*)
        }
    };
}

pub(crate) use with_isa;
