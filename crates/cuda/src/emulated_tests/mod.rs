//! The kernels run on the CPU emulator (see [`crate::emulator`]) through their launch
//! wrappers, against plain references computed here in f64, and against the host
//! functions whose results they promise to match bitwise. Every test runs both numeric
//! modes of the program (f32 and bf16 storage).

mod attention;
mod carried;
mod forward;
mod forward_models;
mod logprobs;
mod matmul;
mod moe;
mod moe_gemm;
mod processing;
mod q4;
mod q8;
mod rope_kv;
mod rows;
mod sampling;

use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::kernels::{DevPtr, Kernels};
use crate::options::CudaDtype;

pub(super) const MODES: [CudaDtype; 2] = [CudaDtype::F32, CudaDtype::Bf16];

pub(super) fn kernels(dtype: CudaDtype) -> Kernels {
    Kernels::emulated(dtype).expect("the emulated program loads")
}

pub(super) fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

pub(super) fn normal_ish(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| (rng.random::<f32>() + rng.random::<f32>() + rng.random::<f32>() - 1.5) * scale)
        .collect()
}

/// Plain values that may be viewed as bytes.
pub(super) trait Pod: Copy + Default {}
impl Pod for f32 {}
impl Pod for f64 {}
impl Pod for i32 {}
impl Pod for i64 {}
impl Pod for u16 {}
impl Pod for u32 {}
impl Pod for u8 {}

/// A buffer as the device has them: 16-byte aligned, addressed by a `DevPtr`, between two
/// guard regions of all-ones bytes (NaN as floats, -1 as integers: a kernel that reads past
/// either end gets values a test notices). Dropping the buffer checks that no kernel wrote
/// into the guards: on a GPU such a write corrupts another buffer, or faults.
pub(super) struct Buf {
    words: Vec<u128>,
    bytes: usize,
}

/// 16-byte words of guard on each side of a buffer.
const GUARD_WORDS: usize = 16;

impl Buf {
    pub fn zeroed(bytes: usize) -> Buf {
        let data_words = bytes.div_ceil(16).max(1);
        let mut words = vec![u128::MAX; data_words + 2 * GUARD_WORDS];
        words[GUARD_WORDS..GUARD_WORDS + data_words].fill(0);
        let mut b = Buf { words, bytes };
        let tail = b.bytes..data_words * 16; // the last word's bytes past the end
        b.data_bytes_mut(data_words * 16)[tail].fill(0xff);
        b
    }

    pub fn of<T: Pod>(values: &[T]) -> Buf {
        let mut b = Buf::zeroed(std::mem::size_of_val(values));
        // SAFETY: the data words hold at least `bytes` bytes, aligned for any `Pod` type,
        // and `values` is plain data of exactly that size.
        unsafe {
            std::ptr::copy_nonoverlapping(
                values.as_ptr() as *const u8,
                b.words[GUARD_WORDS..].as_mut_ptr() as *mut u8,
                b.bytes,
            );
        }
        b
    }

    /// The first `n` bytes from the start of the data.
    fn data_bytes_mut(&mut self, n: usize) -> &mut [u8] {
        let data = &mut self.words[GUARD_WORDS..];
        assert!(n <= data.len() * 16);
        // SAFETY: `n` bytes of the words from the data's start, which are plain integers.
        unsafe { std::slice::from_raw_parts_mut(data.as_mut_ptr() as *mut u8, n) }
    }

    /// The buffer's address, for a kernel to read or write while no reference to the
    /// buffer is alive.
    pub fn ptr(&mut self) -> DevPtr {
        self.words[GUARD_WORDS..].as_mut_ptr() as DevPtr
    }

    pub fn read<T: Pod>(&self) -> Vec<T> {
        let n = self.bytes / std::mem::size_of::<T>();
        let mut out = vec![T::default(); n];
        // SAFETY: as in `of`, in the other direction.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.words[GUARD_WORDS..].as_ptr() as *const u8,
                out.as_mut_ptr() as *mut u8,
                n * std::mem::size_of::<T>(),
            );
        }
        out
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        let data_words = self.words.len() - 2 * GUARD_WORDS;
        let bytes = self.bytes;
        let tail_ok = self.data_bytes_mut(data_words * 16)[bytes..]
            .iter()
            .all(|&b| b == 0xff);
        let (front, rest) = self.words.split_at(GUARD_WORDS);
        let back = &rest[data_words..];
        let intact = tail_ok && front.iter().chain(back).all(|&w| w == u128::MAX);
        if !intact && !std::thread::panicking() {
            panic!("a kernel wrote outside a buffer of {bytes} bytes");
        }
    }
}

/// Values stored as the program's `act_t`: f32, or bf16 bits rounded to nearest even.
pub(super) fn act_buf(dtype: CudaDtype, values: &[f32]) -> Buf {
    match dtype {
        CudaDtype::F32 => Buf::of(values),
        CudaDtype::Bf16 => {
            let bits: Vec<u16> = values
                .iter()
                .map(|&v| bf16::from_f32(v).to_bits())
                .collect();
            Buf::of(&bits)
        }
    }
}

/// `values` as the storage type holds them (rounded to bf16 in bf16 mode).
pub(super) fn as_stored(dtype: CudaDtype, values: &[f32]) -> Vec<f32> {
    match dtype {
        CudaDtype::F32 => values.to_vec(),
        CudaDtype::Bf16 => values.iter().map(|&v| bf16::from_f32(v).to_f32()).collect(),
    }
}

/// An `act_t` buffer read back as f32.
pub(super) fn read_act(dtype: CudaDtype, buf: &Buf) -> Vec<f32> {
    match dtype {
        CudaDtype::F32 => buf.read::<f32>(),
        CudaDtype::Bf16 => buf
            .read::<u16>()
            .into_iter()
            .map(|b| bf16::from_bits(b).to_f32())
            .collect(),
    }
}

/// Relative tolerance of a result stored as `dtype` (bf16 keeps 8 significant bits).
pub(super) fn tolerance(dtype: CudaDtype) -> f64 {
    match dtype {
        CudaDtype::F32 => 2e-5,
        CudaDtype::Bf16 => 8e-3,
    }
}

/// `y[n, m] = x[n, k] · W[m, k]ᵀ` in f64: the reference of the matrix products.
pub(super) fn reference_product(x: &[f32], w: &[f32], n: usize, m: usize, k: usize) -> Vec<f64> {
    (0..n * m)
        .map(|e| {
            let (row, col) = (e / m, e % m);
            (0..k)
                .map(|t| x[row * k + t] as f64 * w[col * k + t] as f64)
                .sum()
        })
        .collect()
}

/// Asserts `got` is `want` within `tol` of each element's magnitude (plus `tol` times the
/// largest magnitude, for elements near zero).
pub(super) fn assert_close(what: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs();
        assert!(
            err <= tol * (w.abs() + scale),
            "{what}[{i}]: got {g}, want {w} (error {err:e})"
        );
    }
}
