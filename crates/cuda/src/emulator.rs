//! The kernel program run on the CPU, for the crate's tests (feature `emulator`): the same
//! CUDA C sources compiled as C++ by the build script against `emulator/`, where every
//! CUDA thread is a fiber and barriers and warp shuffles are the scheduler's. Kernels are
//! launched through [`crate::kernels::Kernels`]'s own wrappers, with host addresses for
//! device pointers, so a test exercises the launch shapes the GPU gets too.
//!
//! What it proves: indexing, tiling, barriers (a barrier that some threads skip is reported
//! as a deadlock; a missing one makes odd blocks, whose threads run in reverse order,
//! differ from even ones), the alignment of vector loads and stores (built with a trapping
//! alignment sanitizer: a misaligned `uint4` faults on a GPU), writes past a buffer's ends
//! (the tests' buffers sit between guard bytes, checked when dropped), the waits and
//! barriers around `cp.async` copies into shared memory (they garble their destination when
//! issued and land only when waited for), the order of every operation, and with it any
//! bitwise invariance the kernels promise. What it cannot: timing, memory-model races
//! between concurrently running blocks, and the last ulp of `expf` and `sqrtf`, which are
//! the C library's here.

use std::ffi::{c_char, c_void, CStr, CString};

use crate::error::CudaError;
use crate::kernels::{Arg, ATTN_PARTITION};
use crate::options::CudaDtype;

type LaunchFn = unsafe extern "C" fn(
    name: *const c_char,
    grid: *const u32,
    block: u32,
    shared: u32,
    args: *mut *mut c_void,
    num_args: usize,
    err: *mut c_char,
    err_len: usize,
) -> i32;
type NameFn = unsafe extern "C" fn(i: usize) -> *const c_char;

extern "C" {
    fn tandem_emu_launch_f32(
        name: *const c_char,
        grid: *const u32,
        block: u32,
        shared: u32,
        args: *mut *mut c_void,
        num_args: usize,
        err: *mut c_char,
        err_len: usize,
    ) -> i32;
    fn tandem_emu_launch_bf16(
        name: *const c_char,
        grid: *const u32,
        block: u32,
        shared: u32,
        args: *mut *mut c_void,
        num_args: usize,
        err: *mut c_char,
        err_len: usize,
    ) -> i32;
    fn tandem_emu_kernel_name_f32(i: usize) -> *const c_char;
    fn tandem_emu_kernel_name_bf16(i: usize) -> *const c_char;
    fn tandem_emu_attn_partition_f32() -> usize;
    fn tandem_emu_attn_partition_bf16() -> usize;
}

/// The emulated program of one numeric mode.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Emulator {
    launch: LaunchFn,
    name: NameFn,
}

impl Emulator {
    pub fn new(dtype: CudaDtype) -> Result<Emulator, CudaError> {
        // SAFETY: functions of the build script's generated program, taking no arguments.
        let partition = unsafe {
            match dtype {
                CudaDtype::F32 => tandem_emu_attn_partition_f32(),
                CudaDtype::Bf16 => tandem_emu_attn_partition_bf16(),
            }
        };
        if partition != ATTN_PARTITION {
            return Err(CudaError::Emulator(format!(
                "the emulated program was built with ATTN_PARTITION {partition}, the launches \
                 assume {ATTN_PARTITION} (build.rs and kernels.rs disagree)"
            )));
        }
        Ok(match dtype {
            CudaDtype::F32 => Emulator {
                launch: tandem_emu_launch_f32,
                name: tandem_emu_kernel_name_f32,
            },
            CudaDtype::Bf16 => Emulator {
                launch: tandem_emu_launch_bf16,
                name: tandem_emu_kernel_name_bf16,
            },
        })
    }

    /// Names of the kernels the emulated program defines.
    pub fn kernel_names(&self) -> Vec<String> {
        let mut names = Vec::new();
        loop {
            // SAFETY: the function returns a static C string, or null past the last kernel.
            let p = unsafe { (self.name)(names.len()) };
            if p.is_null() {
                return names;
            }
            // SAFETY: `p` is a NUL-terminated string literal of the generated program.
            names.push(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned());
        }
    }

    /// Runs kernel `name` to completion on the CPU. Pointer arguments are host addresses.
    pub fn launch(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: u32,
        shared: u32,
        args: &[Arg],
    ) -> Result<(), CudaError> {
        let mut values: Vec<*mut c_void> = args
            .iter()
            .map(|a| match a {
                Arg::Ptr(p) => p as *const u64 as *mut c_void,
                Arg::I32(v) => v as *const i32 as *mut c_void,
                Arg::F32(v) => v as *const f32 as *mut c_void,
                Arg::Qkv(s) => s as *const _ as *mut c_void,
                Arg::Attn(s) => s as *const _ as *mut c_void,
            })
            .collect();
        let cname = CString::new(name).map_err(|e| CudaError::Emulator(e.to_string()))?;
        let grid = [grid.0, grid.1, grid.2];
        let mut err = vec![0 as c_char; 512];
        // SAFETY: `values[i]` points to a live value of parameter i's C type (the wrappers
        // in kernels.rs pass each kernel's signature; the emulator checks the count), the
        // pointer arguments are addresses of host buffers as large as the wrapper documents,
        // and the kernel only reads `values` while this call runs. The emulated program does
        // not keep any pointer past the call.
        let rc = unsafe {
            (self.launch)(
                cname.as_ptr(),
                grid.as_ptr(),
                block,
                shared,
                values.as_mut_ptr(),
                values.len(),
                err.as_mut_ptr(),
                err.len(),
            )
        };
        if rc == 0 {
            return Ok(());
        }
        // SAFETY: the emulator wrote a NUL-terminated message of at most `err.len()` bytes.
        let msg = unsafe { CStr::from_ptr(err.as_ptr()) };
        Err(CudaError::Emulator(msg.to_string_lossy().into_owned()))
    }
}
