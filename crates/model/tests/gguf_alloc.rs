//! Parsing untrusted GGUF bytes never allocates more than the input size plus 64 KiB at
//! peak, however large the counts and lengths it claims. A counting global allocator
//! (this test binary only) measures the peak live bytes during each parse.
//!
//! The tests hold [`SERIAL`] while measuring so no other test thread allocates meanwhile.

mod gguf_corpus;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use gguf_corpus::{all_cases, small_valid, Enc};
use tandem_model::gguf::{GgufError, GgufFile, MetadataValue};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn record_alloc(size: usize) {
    let live = LIVE.fetch_add(size, Ordering::SeqCst) + size;
    PEAK.fetch_max(live, Ordering::SeqCst);
}

// SAFETY: forwards every call to the system allocator unchanged; only counts sizes.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        record_alloc(layout.size());
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        record_alloc(layout.size());
        System.alloc_zeroed(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            record_alloc(new_size - layout.size());
        } else {
            LIVE.fetch_sub(layout.size() - new_size, Ordering::SeqCst);
        }
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const SLACK: usize = 64 * 1024;

/// Held by each test for its whole run: the counters are global.
static SERIAL: Mutex<()> = Mutex::new(());

/// Peak bytes allocated above the live total at the start of the parse.
fn parse_peak(bytes: &[u8]) -> usize {
    let base = LIVE.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    let result = GgufFile::parse_bytes(bytes);
    let peak = PEAK.load(Ordering::SeqCst) - base;
    drop(result);
    peak
}

#[test]
fn parsing_malformed_input_allocates_at_most_input_size_plus_64k() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // The counter sees this: a 1 MiB allocation must register as >= 1 MiB of peak.
    let base = LIVE.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    let probe = vec![1u8; 1 << 20];
    assert!(PEAK.load(Ordering::SeqCst) - base >= 1 << 20);
    drop(probe);

    let mut inputs: Vec<(String, Vec<u8>)> = all_cases()
        .into_iter()
        .map(|c| (c.name.to_string(), c.bytes))
        .collect();
    let valid = small_valid();
    for cut in 0..valid.len() {
        inputs.push((format!("truncated at {cut}"), valid[..cut].to_vec()));
    }
    inputs.push(("small valid file".into(), valid));
    let mut worst = (0, String::new());
    for (name, bytes) in &inputs {
        let peak = parse_peak(bytes);
        assert!(
            peak <= bytes.len() + SLACK,
            "{name}: peak {peak} bytes for a {}-byte input",
            bytes.len()
        );
        if peak > worst.0 {
            worst = (peak, name.clone());
        }
    }
    // The worst case is small: no count was trusted before its bytes were checked.
    assert!(
        worst.0 < SLACK,
        "worst peak {} bytes ({})",
        worst.0,
        worst.1
    );
}

/// Metadata is stored unpacked, one `MetadataValue` per element, so a well-formed prefix
/// costs up to `size_of::<MetadataValue>()` bytes per encoded byte (a u8 array) before a
/// later error is found. This pins that documented constant-factor bound.
#[test]
fn a_long_valid_prefix_costs_at_most_a_constant_factor() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let n = 100_000;
    let mut e = Enc::header(3, 0, 2).str(b"k").u32(9).u32(0).u64(n as u64);
    e = e.zeros(n).str(b"k2").u32(8).u64(10).raw(b"abc");
    let bytes = e.0;
    let peak = parse_peak(&bytes);
    assert!(matches!(
        GgufFile::parse_bytes(&bytes),
        Err(GgufError::StringTooLong { len: 10, .. })
    ));
    let bound = std::mem::size_of::<MetadataValue>() * bytes.len() + SLACK;
    assert!(peak <= bound, "peak {peak} bytes, bound {bound}");
    assert!(peak >= n, "the array was materialised: peak {peak}");
}
