//! Instruction-set selection for the kernels: what the CPU offers (detected once, at run
//! time), and the process-wide choice of kernel variant.
//!
//! The crate never requires `-C target-cpu=native`: the SIMD variants are compiled with
//! `#[target_feature(enable = …)]` and only called after [`Isa::is_available`] said yes.
//!
//! The process-wide choice ([`active`]) is made once, on first use: the best available
//! [`Isa`], unless [`set_forced`] chose one before. Tests that compare variants inside one
//! process use [`crate::matmul::matmul_with`] instead of the global setting.

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

/// A kernel variant. See [`crate::matmul`] for which ones are bitwise equal to [`Isa::Scalar`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable Rust; the reference every other variant is tested against.
    Scalar,
    /// 256-bit AVX2 (needs AVX2, FMA and F16C).
    Avx2,
    /// 512-bit AVX-512 (needs AVX-512 F, BW and VL, and F16C).
    Avx512,
    /// [`Isa::Avx2`], except that quantized weights (all but Q2_K), packed at load
    /// time, are multiplied in int8 with activations quantized to 8 bits (`vpmaddubsw`):
    /// faster, bitwise equal to the scalar int8 reference ([`crate::packed`]), **not** to the
    /// exact product.
    Avx2Int8,
    /// [`Isa::Avx512`], except that quantized weights (all but Q2_K), packed at load
    /// time, are multiplied in int8 with activations quantized to 8 bits (VNNI `vpdpbusd`; also needs
    /// AVX512-VNNI): the default where available; bitwise equal to the scalar int8
    /// reference, **not** to the exact product.
    Avx512Int8,
}

impl Isa {
    /// Every variant: the exact ones slowest first, then the int8 ones.
    pub const ALL: [Isa; 5] = [
        Isa::Scalar,
        Isa::Avx2,
        Isa::Avx512,
        Isa::Avx2Int8,
        Isa::Avx512Int8,
    ];

    /// Whether this CPU can run the variant.
    pub fn is_available(self) -> bool {
        let f = features();
        match self {
            Isa::Scalar => true,
            Isa::Avx2 | Isa::Avx2Int8 => f.avx2 && f.fma && f.f16c,
            Isa::Avx512 => f.avx512f && f.avx512bw && f.avx512vl && f.f16c,
            Isa::Avx512Int8 => Isa::Avx512.is_available() && f.avx512vnni,
        }
    }

    /// Whether the variant's results are bitwise equal to [`Isa::Scalar`]'s (the int8 ones
    /// are not: they round the activations to 8 bits).
    pub fn is_exact(self) -> bool {
        !matches!(self, Isa::Avx2Int8 | Isa::Avx512Int8)
    }

    /// The available variants, in the order of [`Isa::ALL`] (always starts with
    /// [`Isa::Scalar`]).
    pub fn available() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.is_available()).collect()
    }

    /// The default: the fastest available variant. That is an int8 one wherever the CPU has
    /// AVX2 (activations rounded to 8 bits for quantized weights (all but Q2_K), as
    /// llama.cpp does; still batch-, chunk- and thread-invariant bitwise, see
    /// [`crate::packed`]); the exact variants are a `--kernels` choice away
    /// ([`Isa::best_exact`]).
    pub fn best() -> Isa {
        [Isa::Avx512Int8, Isa::Avx2Int8]
            .into_iter()
            .find(|i| i.is_available())
            .unwrap_or_else(Isa::best_exact)
    }

    /// The fastest available variant whose every result is bitwise equal to [`Isa::Scalar`].
    pub fn best_exact() -> Isa {
        Isa::ALL
            .into_iter()
            .filter(|i| i.is_exact())
            .rev()
            .find(|i| i.is_available())
            .unwrap_or(Isa::Scalar)
    }

    /// Lower-case name, as accepted by [`FromStr`]: `scalar`, `avx2`, `avx512`, `avx2-int8`,
    /// `avx512-int8`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Avx2Int8 => "avx2-int8",
            Isa::Avx512Int8 => "avx512-int8",
        }
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Isa {
    type Err = IsaError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Isa::ALL
            .into_iter()
            .find(|i| i.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| IsaError::UnknownName(s.to_owned()))
    }
}

/// Why an ISA could not be chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IsaError {
    /// The CPU lacks a feature the variant needs.
    Unavailable(Isa),
    /// The process-wide choice was already made (by an earlier `set_forced` or a kernel call).
    AlreadyChosen(Isa),
    /// Not one of the names of [`Isa::name`].
    UnknownName(String),
}

impl fmt::Display for IsaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IsaError::Unavailable(i) => write!(f, "the CPU does not support the {i} kernels"),
            IsaError::AlreadyChosen(i) => {
                write!(
                    f,
                    "the kernel ISA was already chosen ({i}); force it before first use"
                )
            }
            IsaError::UnknownName(s) => {
                write!(
                    f,
                    "unknown kernel ISA {s:?} (expected scalar, avx2, avx512, avx2-int8 or avx512-int8)"
                )
            }
        }
    }
}

impl std::error::Error for IsaError {}

static ACTIVE: OnceLock<Isa> = OnceLock::new();

/// Chooses the process-wide ISA; call once at start-up, before the first kernel call.
/// Fails if the CPU cannot run `isa` or if the choice was already made (then a different
/// choice is rejected; forcing the ISA already chosen is fine).
pub fn set_forced(isa: Isa) -> Result<(), IsaError> {
    if !isa.is_available() {
        return Err(IsaError::Unavailable(isa));
    }
    let chosen = *ACTIVE.get_or_init(|| isa);
    if chosen == isa {
        Ok(())
    } else {
        Err(IsaError::AlreadyChosen(chosen))
    }
}

/// The process-wide ISA: the one forced by [`set_forced`], else [`Isa::best`] (fixed on first
/// call).
pub fn active() -> Isa {
    *ACTIVE.get_or_init(Isa::best)
}

/// The CPU features the kernels care about (all `false` off x86-64).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuFeatures {
    pub avx2: bool,
    pub fma: bool,
    pub f16c: bool,
    pub avx512f: bool,
    pub avx512bw: bool,
    pub avx512vl: bool,
    pub avx512vnni: bool,
    pub avx512bf16: bool,
}

/// The CPU's features, detected on first call.
pub fn features() -> &'static CpuFeatures {
    static FEATURES: OnceLock<CpuFeatures> = OnceLock::new();
    FEATURES.get_or_init(detect)
}

#[cfg(target_arch = "x86_64")]
fn detect() -> CpuFeatures {
    CpuFeatures {
        avx2: is_x86_feature_detected!("avx2"),
        fma: is_x86_feature_detected!("fma"),
        f16c: is_x86_feature_detected!("f16c"),
        avx512f: is_x86_feature_detected!("avx512f"),
        avx512bw: is_x86_feature_detected!("avx512bw"),
        avx512vl: is_x86_feature_detected!("avx512vl"),
        avx512vnni: is_x86_feature_detected!("avx512vnni"),
        avx512bf16: is_x86_feature_detected!("avx512bf16"),
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> CpuFeatures {
    CpuFeatures::default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for isa in Isa::ALL {
            assert_eq!(isa.name().parse::<Isa>(), Ok(isa));
        }
        assert_eq!("AVX512".parse::<Isa>(), Ok(Isa::Avx512));
        assert!(matches!(
            "sse".parse::<Isa>(),
            Err(IsaError::UnknownName(_))
        ));
    }

    #[test]
    fn best_is_available_and_exact_and_scalar_always_is() {
        assert!(Isa::best().is_available());
        assert!(Isa::best_exact().is_available() && Isa::best_exact().is_exact());
        assert_eq!(Isa::available()[0], Isa::Scalar);
        assert!(Isa::available().contains(&Isa::best()));
    }

    #[test]
    fn forcing_after_the_choice_is_rejected_unless_equal() {
        let chosen = active();
        assert_eq!(set_forced(chosen), Ok(()));
        for other in Isa::available().into_iter().filter(|&i| i != chosen) {
            assert_eq!(set_forced(other), Err(IsaError::AlreadyChosen(chosen)));
        }
    }
}
