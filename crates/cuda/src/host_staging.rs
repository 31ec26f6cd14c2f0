//! Page-locked staging of a launched step's host inputs (`step_launch.rs`).
//!
//! A copy from pageable host memory to the device may wait for the stream (the driver must
//! first stage the bytes in page-locked memory of its own), and a launched step must not:
//! the device is still running the step before. So while a step is launched its uploads
//! (index arrays, output slots, row parameters, processors' token lists, carried pairs)
//! are written into a page-locked arena and copied from there asynchronously. Two arenas
//! alternate, one per launched step; an arena is reused only after the event recorded at
//! the end of its step, which has passed once that step was collected. Outside a launch
//! (the forward pass and scoring, which wait for their results anyway) copies go straight
//! from the caller's memory.

use std::sync::Arc;

use cudarc::driver::{
    result, CudaContext, CudaEvent, CudaSlice, CudaStream, DeviceRepr, PinnedHostSlice,
};

use crate::error::CudaError;
use crate::forward::ptr;

/// Bytes an arena starts with; it grows to the largest step's inputs.
const INITIAL_BYTES: usize = 1 << 20;
/// Alignment of each staged copy within an arena.
const ALIGN: usize = 64;

/// One step's page-locked inputs.
#[derive(Debug)]
struct Arena {
    memory: PinnedHostSlice<u8>,
    base: *mut u8,
    used: usize,
    /// Recorded after the last copy of the step that used the arena.
    done: Option<CudaEvent>,
    /// Smaller arenas this one outgrew during its step, freed when it is next reused.
    retired: Vec<PinnedHostSlice<u8>>,
}

impl Arena {
    fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Arena, CudaError> {
        // Write-combined (cudarc's default): the host only writes it, the device reads it.
        // SAFETY: uninitialised bytes; only bytes a copy wrote first are read by the device.
        let mut memory = unsafe { ctx.alloc_pinned::<u8>(bytes) }?;
        let base = memory.as_mut_ptr()?;
        Ok(Arena {
            memory,
            base,
            used: 0,
            done: None,
            retired: Vec::new(),
        })
    }
}

/// The two arenas and which one the launch in progress writes (`None`: no launch).
#[derive(Debug)]
pub(crate) struct HostStaging {
    ctx: Arc<CudaContext>,
    arenas: Vec<Arena>,
    current: usize,
    active: bool,
}

// SAFETY: the arenas' `base` pointers are addresses of allocations the struct owns, used
// only through `&mut self` (the runner is used from one thread at a time).
unsafe impl Send for HostStaging {}

impl HostStaging {
    pub fn new(ctx: &Arc<CudaContext>) -> Result<HostStaging, CudaError> {
        Ok(HostStaging {
            ctx: ctx.clone(),
            arenas: vec![
                Arena::new(ctx, INITIAL_BYTES)?,
                Arena::new(ctx, INITIAL_BYTES)?,
            ],
            current: 0,
            active: false,
        })
    }

    /// Starts staging a launched step's uploads in the arena the step before last used,
    /// once its copies are done (in the engine's order of launches and collects they are).
    pub fn begin_step(&mut self) -> Result<(), CudaError> {
        self.current ^= 1;
        let a = &mut self.arenas[self.current];
        if let Some(done) = a.done.take() {
            done.synchronize()?;
        }
        a.retired.clear();
        a.used = 0;
        self.active = true;
        Ok(())
    }

    /// Ends the launched step's staging: its arena waits for an event after its copies.
    /// Always called after [`Self::begin_step`], whether the launch succeeded or not.
    pub fn end_step(&mut self, stream: &CudaStream) -> Result<(), CudaError> {
        self.active = false;
        let event = stream.record_event(None);
        let a = &mut self.arenas[self.current];
        match event {
            Ok(e) => {
                a.done = Some(e);
                Ok(())
            }
            Err(e) => {
                // Without an event the arena cannot tell when its copies end: wait now.
                stream.synchronize()?;
                Err(e.into())
            }
        }
    }

    /// Copies `src` into the front of `dst` (which must be at least as long) on `stream`:
    /// through the current arena during a launch, else straight from `src`.
    pub fn copy<T: DeviceRepr>(
        &mut self,
        stream: &Arc<CudaStream>,
        src: &[T],
        dst: &mut CudaSlice<T>,
    ) -> Result<(), CudaError> {
        if src.len() > dst.len() {
            return Err(CudaError::Unsupported(format!(
                "{} values do not fit a device buffer of {}",
                src.len(),
                dst.len()
            )));
        }
        if src.is_empty() {
            return Ok(());
        }
        if !self.active {
            stream.memcpy_htod(src, dst)?;
            return Ok(());
        }
        let bytes = std::mem::size_of_val(src);
        let staged = self.reserve(bytes)?;
        // SAFETY: `src` is `bytes` bytes of plain device-representable values, and `staged`
        // is `bytes` bytes of the arena that no queued copy reads (`reserve` hands each
        // range out once per step, and the arena's previous step has completed).
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr() as *const u8, staged, bytes);
            let staged = std::slice::from_raw_parts(staged, bytes);
            result::memcpy_htod_async(ptr(dst, stream), staged, stream.cu_stream())?;
        }
        Ok(())
    }

    /// `bytes` bytes of the current arena for one copy, growing it if needed (the arena it
    /// outgrew is kept until the step's copies are done).
    fn reserve(&mut self, bytes: usize) -> Result<*mut u8, CudaError> {
        let ctx = self.ctx.clone();
        let a = &mut self.arenas[self.current];
        if a.used + bytes > a.memory.len() {
            let size = (2 * a.memory.len()).max(bytes.next_power_of_two());
            let grown = Arena::new(&ctx, size)?;
            let old = std::mem::replace(&mut a.memory, grown.memory);
            a.retired.push(old);
            a.base = grown.base;
            a.used = 0;
        }
        // SAFETY: `used + bytes` fits the allocation (checked above).
        let at = unsafe { a.base.add(a.used) };
        a.used += bytes.next_multiple_of(ALIGN);
        Ok(at)
    }
}
