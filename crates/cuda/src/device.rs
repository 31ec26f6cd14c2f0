//! Finding GPUs ([`probe`]) and opening one: its context and the single stream all work
//! of a runner is queued on.

use std::sync::Arc;

use cudarc::driver::{result as driver, sys, CudaContext, CudaStream};

use crate::error::{catch_binding_panic, CudaError};
use crate::libs::CudaLib;

/// One GPU as the driver describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    pub ordinal: usize,
    pub name: String,
    /// `(major, minor)`, e.g. `(9, 0)` for Hopper.
    pub compute_capability: (i32, i32),
    pub total_memory_bytes: usize,
}

/// What [`probe`] found: the driver's CUDA version and every device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The driver's CUDA version as `(major, minor)`, e.g. `(13, 0)`.
    pub driver_version: (i32, i32),
    pub devices: Vec<GpuInfo>,
}

impl DeviceInfo {
    pub fn device_count(&self) -> usize {
        self.devices.len()
    }
}

/// Loads the driver and lists the GPUs, without creating a context (no device memory is
/// used). A machine without the NVIDIA driver gets [`CudaError::LibraryNotFound`].
pub fn probe() -> Result<DeviceInfo, CudaError> {
    CudaLib::Driver.require()?;
    catch_binding_panic(|| {
        driver::init()?;
        let mut version = 0;
        // SAFETY: `version` is valid for writes of one int; the driver is initialised.
        unsafe { sys::cuDriverGetVersion(&mut version) }.result()?;
        let count = driver::device::get_count()?;
        let devices = (0..count)
            .map(gpu_info)
            .collect::<Result<Vec<_>, CudaError>>()?;
        Ok(DeviceInfo {
            driver_version: (version / 1000, version % 1000 / 10),
            devices,
        })
    })
}

fn gpu_info(ordinal: i32) -> Result<GpuInfo, CudaError> {
    use sys::CUdevice_attribute::{
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR as MAJOR,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR as MINOR,
    };
    let dev = driver::device::get(ordinal)?;
    // SAFETY: `dev` is a device handle the driver just returned; these queries only read
    // its properties.
    let (major, minor, total) = unsafe {
        (
            driver::device::get_attribute(dev, MAJOR)?,
            driver::device::get_attribute(dev, MINOR)?,
            driver::device::total_mem(dev)?,
        )
    };
    Ok(GpuInfo {
        ordinal: ordinal as usize,
        name: driver::device::get_name(dev)?,
        compute_capability: (major, minor),
        total_memory_bytes: total,
    })
}

/// An opened GPU: its primary context and the runner's stream.
#[derive(Debug)]
pub(crate) struct Device {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub info: GpuInfo,
}

impl Device {
    /// Opens GPU `ordinal` and checks that NVRTC and cuBLAS can be loaded too.
    pub fn open(ordinal: usize) -> Result<Device, CudaError> {
        let found = probe()?;
        let info = found
            .devices
            .get(ordinal)
            .cloned()
            .ok_or(CudaError::NoSuchDevice {
                ordinal,
                count: found.device_count(),
            })?;
        CudaLib::Nvrtc.require()?;
        CudaLib::Cublas.require()?;
        let ctx = CudaContext::new(ordinal)?;
        // SAFETY: the runner queues all of its work on one stream, in order, so cudarc's
        // per-buffer events (which order work across streams) are not needed.
        unsafe { ctx.disable_event_tracking() };
        // A stream of its own, not the legacy default stream, which cannot be captured
        // into a CUDA graph.
        let stream = ctx.new_stream()?;
        Ok(Device { ctx, stream, info })
    }

    /// Makes the context current on the calling thread (the engine may move the runner).
    pub fn bind(&self) -> Result<(), CudaError> {
        self.ctx.bind_to_thread()?;
        Ok(())
    }

    /// `(free, total)` device memory in bytes.
    pub fn memory(&self) -> Result<(usize, usize), CudaError> {
        Ok(self.ctx.mem_get_info()?)
    }
}
