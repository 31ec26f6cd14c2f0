//! Giving the heap's free memory back to the operating system.
//!
//! A load builds and drops many small temporaries (a large vocabulary's merges, on several
//! threads); the allocator keeps the pages they freed, which then count in the process's
//! resident memory for as long as it serves. Trimming after the load returns them.

/// Returns the free memory of every heap arena to the operating system where the allocator
/// can (glibc's `malloc_trim`; elsewhere nothing).
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only releases memory the allocator holds free; it touches no
    // live allocation and is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}
