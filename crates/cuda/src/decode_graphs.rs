//! CUDA graphs of decode steps: the whole step (every layer's kernels and matrix products
//! and the LM head) recorded once per padded batch size and replayed with one launch,
//! instead of ~10 launches per layer from the host (vLLM's approach).
//!
//! A graph bakes in its launch shapes and buffer addresses, not the buffers' contents. So a
//! decode batch of `n` sequences is padded to the next bucket size (padding rows compute
//! into a scratch block nobody reads, and take no expert's route: the inputs say how many
//! rows are live), its index arrays are copied into the runner's fixed
//! input buffers, and the bucket's graph is replayed. Attention in a graph names enough
//! context partitions for the longest table the input buffers hold; partitions past a
//! token's context exit at once, and a token's arithmetic is the same as in an eager launch.
//! Graphs are recorded on first use of a bucket and dropped whenever the buffers they read
//! move (the workspace or the inputs grow).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaStream};

use crate::error::{catch_binding_panic, CudaError};

/// Padded batch sizes that get a graph. Larger decode batches run eagerly.
pub(crate) const GRAPH_BUCKETS: [usize; 15] =
    [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256];

/// The bucket a decode batch of `n` sequences is padded to, if any.
pub(crate) fn bucket_for(n: usize) -> Option<usize> {
    GRAPH_BUCKETS.iter().copied().find(|&b| b >= n)
}

/// A recorded graph, owned by one runner.
struct StepGraph(CudaGraph);

// SAFETY: a CUDA graph may be used from any thread as long as calls on it are serialized
// (CUDA's graph thread-safety rules). A `StepGraph` is owned by one `CudaRunner`, which is
// only ever used through `&mut self` on one thread at a time and binds its context first.
unsafe impl Send for StepGraph {}

/// The recorded graphs, by bucket.
#[derive(Default)]
pub(crate) struct DecodeGraphs {
    pub enabled: bool,
    graphs: HashMap<usize, StepGraph>,
    /// Graphs recorded so far (for `describe` and tests of the bookkeeping).
    pub recorded: usize,
    /// Why recording failed, when it did: graphs are off from then on.
    pub failure: Option<String>,
}

impl fmt::Debug for DecodeGraphs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buckets: Vec<_> = self.graphs.keys().collect();
        buckets.sort();
        f.debug_struct("DecodeGraphs")
            .field("enabled", &self.enabled)
            .field("buckets", &buckets)
            .finish()
    }
}

impl DecodeGraphs {
    pub fn new(enabled: bool) -> DecodeGraphs {
        DecodeGraphs {
            enabled,
            ..DecodeGraphs::default()
        }
    }

    /// Turns graphs off after the recording for `bucket` failed with `error`, with a warning:
    /// a device or driver that cannot capture a step still runs every step, eagerly.
    pub fn give_up(&mut self, bucket: usize, error: &CudaError) {
        tracing::warn!(
            "recording the CUDA graph of a {bucket}-sequence decode step failed ({error}); \
             decode steps run eagerly from now on"
        );
        self.enabled = false;
        self.failure = Some(format!("recording for batch {bucket} failed: {error}"));
    }

    /// Drops every graph (their buffers moved).
    pub fn clear(&mut self) {
        self.graphs.clear();
    }

    pub fn has(&self, bucket: usize) -> bool {
        self.graphs.contains_key(&bucket)
    }

    /// Replays the graph of `bucket`.
    pub fn launch(&self, bucket: usize) -> Result<(), CudaError> {
        let graph = self
            .graphs
            .get(&bucket)
            .ok_or_else(|| CudaError::Unsupported(format!("no graph for bucket {bucket}")))?;
        Ok(graph.0.launch()?)
    }

    /// Records what `work` queues on `stream` as the graph of `bucket`. Nothing runs while
    /// recording; if `work` fails (or panics) the capture is ended and discarded.
    pub fn record(
        &mut self,
        stream: &Arc<CudaStream>,
        bucket: usize,
        work: impl FnOnce() -> Result<(), CudaError>,
    ) -> Result<(), CudaError> {
        let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        let ended = bracketed(
            || Ok(stream.begin_capture(mode)?),
            work,
            || Ok(stream.end_capture(CUgraphInstantiate_flags(0))?),
        )?;
        let graph = ended.ok_or_else(|| {
            CudaError::Unsupported("stream capture recorded no graph".to_string())
        })?;
        graph.upload()?;
        self.graphs.insert(bucket, StepGraph(graph));
        self.recorded += 1;
        Ok(())
    }
}

/// Runs `work` between `begin` and `end`, and `end` whatever `work` does once `begin` has
/// succeeded: an error, or a panic (caught, as [`CudaError::Binding`]). A stream capture
/// left open would keep the stream capturing, and every later call on it would fail.
fn bracketed<T>(
    begin: impl FnOnce() -> Result<(), CudaError>,
    work: impl FnOnce() -> Result<(), CudaError>,
    end: impl FnOnce() -> Result<T, CudaError>,
) -> Result<T, CudaError> {
    begin()?;
    let queued = catch_binding_panic(work);
    let ended = end();
    queued?;
    ended
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn a_capture_is_ended_whether_its_work_succeeds_fails_or_panics() {
        let works: [Box<dyn FnOnce() -> Result<(), CudaError>>; 3] = [
            Box::new(|| Ok(())),
            Box::new(|| Err(CudaError::Unsupported("failed".into()))),
            Box::new(|| panic!("a binding panicked")),
        ];
        for (i, work) in works.into_iter().enumerate() {
            let ended = Cell::new(false);
            let end = || {
                ended.set(true);
                Ok(())
            };
            let r = bracketed(|| Ok(()), work, end);
            assert!(ended.get(), "work {i}: the capture was left open");
            match i {
                0 => assert!(r.is_ok()),
                1 => assert!(matches!(r, Err(CudaError::Unsupported(_))), "{r:?}"),
                _ => assert!(matches!(r, Err(CudaError::Binding(ref m)) if m.contains("panicked"))),
            }
        }
        // A capture that never began is not ended, and its work does not run.
        let (ran, ended) = (Cell::new(false), Cell::new(false));
        let r = bracketed(
            || Err(CudaError::Unsupported("no capture".into())),
            || {
                ran.set(true);
                Ok(())
            },
            || {
                ended.set(true);
                Ok(())
            },
        );
        assert!(r.is_err() && !ran.get() && !ended.get());
    }

    #[test]
    fn a_failed_recording_turns_graphs_off_and_keeps_why() {
        let mut g = DecodeGraphs::new(true);
        g.give_up(24, &CudaError::Unsupported("capture invalidated".into()));
        assert!(!g.enabled && !g.has(24));
        let why = g.failure.as_deref().unwrap_or_default();
        assert!(
            why.contains("batch 24") && why.contains("capture invalidated"),
            "{why}"
        );
    }

    #[test]
    fn buckets_cover_every_size_up_to_the_largest_and_pad_little() {
        assert_eq!(bucket_for(0), Some(1));
        assert_eq!(bucket_for(1), Some(1));
        assert_eq!(bucket_for(3), Some(4));
        assert_eq!(bucket_for(17), Some(24));
        assert_eq!(bucket_for(256), Some(256));
        assert_eq!(bucket_for(257), None);
        for n in 1..=256 {
            let b = bucket_for(n).expect("covered");
            assert!(b >= n && (b - n) * 2 <= b, "{n} -> {b}");
        }
    }
}
