//! Large buffers backed by transparent huge pages where the kernel offers them.
//!
//! The decode step streams the packed weights once per step and reads each sequence's keys and
//! values through scattered blocks; with 4 KiB pages both walk far more pages than the TLB
//! holds (a KV block of one layer spans about two pages), and a miss costs a page walk the
//! hardware prefetchers do not hide. Linux backs a region with 2 MiB pages when it is advised
//! to (`MADV_HUGEPAGE`) before its pages are first touched.

/// Element types whose all-zero bytes are a valid zero value.
///
/// # Safety
/// Implementors must be plain data for which every byte being zero is a valid value.
pub unsafe trait ZeroBits: Copy {}

// SAFETY: zero bytes are `0.0` for both float types and `0` for the integers.
unsafe impl ZeroBits for f32 {}
// SAFETY: as above (`half::f16` is a transparent `u16`).
unsafe impl ZeroBits for half::f16 {}
// SAFETY: as above.
unsafe impl ZeroBits for u8 {}
// SAFETY: as above.
unsafe impl ZeroBits for i8 {}

/// A vector of `n` zero elements whose memory is advised onto huge pages and left untouched:
/// pages are faulted in (as 2 MiB pages where possible) only when first written, so a large
/// KV pool costs no resident memory until it is used.
pub fn zeroed_vec<T: ZeroBits>(n: usize) -> Vec<T> {
    let layout = match std::alloc::Layout::array::<T>(n) {
        Ok(l) if l.size() > 0 => l,
        Ok(_) => return Vec::new(),
        Err(_) => panic!("zeroed_vec: {n} elements overflow the address space"),
    };
    // SAFETY: `layout` has a non-zero size.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        std::alloc::handle_alloc_error(layout);
    }
    advise_huge_pages(ptr as usize, layout.size());
    // SAFETY: `ptr` was allocated by the global allocator with the layout of `[T; n]` (so
    // `Vec` frees it with the same layout), and its `n` elements are zero bytes, a valid `T`
    // by `ZeroBits`.
    unsafe { Vec::from_raw_parts(ptr.cast::<T>(), n, n) }
}

/// Advises the whole 2 MiB pages inside `[start, start + len)` onto huge pages.
pub(crate) fn advise_huge_pages(start: usize, len: usize) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let (first, last) = (start.next_multiple_of(HUGE), (start + len) / HUGE * HUGE);
        if last > first {
            // SAFETY: `[first, last)` lies inside an allocation the caller owns;
            // MADV_HUGEPAGE only changes how the kernel backs those pages, never their
            // contents. Failure is harmless (the advice is ignored).
            unsafe {
                libc::madvise(
                    first as *mut libc::c_void,
                    last - first,
                    libc::MADV_HUGEPAGE,
                );
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (start, len);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_vectors_are_zero_and_usable() {
        let mut v: Vec<f32> = zeroed_vec(3 << 20);
        assert!(v.iter().all(|&x| x == 0.0));
        v[12345] = 1.5;
        v.push(2.0);
        assert_eq!(v.len(), (3 << 20) + 1);
        let h: Vec<half::f16> = zeroed_vec(1000);
        assert!(h.iter().all(|x| x.to_f32() == 0.0));
        assert!(zeroed_vec::<u8>(0).is_empty());
    }
}
