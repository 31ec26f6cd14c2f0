//! Where a forward step's time goes: CUDA events recorded between the operations of one
//! eager step give each operation's device time; the wall clock around the whole call gives
//! what the host adds (layout, copies, waiting). Off unless [`crate::CudaRunner::profile_forward`]
//! asks for it: the forward pass then only checks an empty `Option`.

use std::cell::RefCell;
use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};

use crate::error::CudaError;

/// Device milliseconds per operation kind (summed over layers), in first-seen order, and
/// the step's wall time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepProfile {
    pub ops: Vec<(&'static str, f64)>,
    /// From the first to the last event: the device's busy span.
    pub device_ms: f64,
    /// The whole `forward` call on the host, copies of the logits included.
    pub wall_ms: f64,
}

/// Events recorded during one profiled step.
#[derive(Debug, Default)]
pub(crate) struct EventLog {
    events: RefCell<Option<Vec<(&'static str, CudaEvent)>>>,
}

impl EventLog {
    /// Starts recording: an event now on `stream`.
    pub fn start(&self, ctx: &Arc<CudaContext>, stream: &CudaStream) -> Result<(), CudaError> {
        let e = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        e.record(stream)?;
        *self.events.borrow_mut() = Some(vec![("start", e)]);
        Ok(())
    }

    /// Marks the end of operation `name` (nothing unless recording).
    pub fn mark(
        &self,
        name: &'static str,
        ctx: &Arc<CudaContext>,
        stream: &CudaStream,
    ) -> Result<(), CudaError> {
        if let Some(events) = self.events.borrow_mut().as_mut() {
            let e = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
            e.record(stream)?;
            events.push((name, e));
        }
        Ok(())
    }

    /// Stops recording and sums the device time per operation name.
    pub fn finish(&self, wall_ms: f64) -> Result<StepProfile, CudaError> {
        let events = self.events.borrow_mut().take().unwrap_or_default();
        let mut profile = StepProfile {
            wall_ms,
            ..StepProfile::default()
        };
        for pair in events.windows(2) {
            let ms = f64::from(pair[0].1.elapsed_ms(&pair[1].1)?);
            let name = pair[1].0;
            match profile.ops.iter_mut().find(|(n, _)| *n == name) {
                Some((_, total)) => *total += ms,
                None => profile.ops.push((name, ms)),
            }
            profile.device_ms += ms;
        }
        Ok(profile)
    }
}
