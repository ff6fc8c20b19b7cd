//! The GPU runtime, below acquisition: what both [`crate::dlpack::acquire`] and the transport
//! ask of a GPU (consumer streams, stream synchronization, pointer checks, pinned host
//! buffers, device ↔ host copies), as the trait [`DeviceRuntime`].
//!
//! - [`SimulatedRuntime`] implements it on host memory so that the stream, staging and routing
//!   logic can be tested on a machine without a GPU: a tensor *labelled* `kDLCUDA` whose
//!   bytes are really host memory goes through exactly the code a CUDA tensor goes through,
//!   and the simulated runtime records every call it gets ([`RuntimeCall`]).
//! - `cuda::CudaRuntime` (feature `cuda`) implements it with the CUDA driver API.
//! - [`default_runtime`] picks the CUDA driver when this build has it and it loads.
//!
//! This module sits under [`crate::dlpack`] (docs/ARCHITECTURE.md, dependency order): it
//! uses only [`crate::error`] and [`crate::device`] (the `DLDevice` and the DLPack stream
//! table), never the DLPack structs, the specs, `comm` or the transport.

use std::ffi::c_void;
use std::ptr::NonNull;

use crate::device::{device_type, Device};
use crate::error::{Error, Result};

#[cfg(feature = "cuda")]
pub mod cuda;
mod simulated;
pub mod strided;

pub use simulated::{RuntimeCall, SimulatedRuntime};

/// The earlier name of [`SimulatedRuntime`] (it is a runtime, not a device).
#[deprecated(note = "renamed dlpack_mpi::runtime::SimulatedRuntime")]
#[doc(hidden)]
pub type SimulatedDevice = SimulatedRuntime;
pub use strided::{Copy2d, CopyKind, Direction, StridedCopy};

/// What acquisition and the transport ask of a GPU runtime. Every method that names a `device` runs with
/// that device current and restores the caller's current device before it returns
/// (CASES C62). Copies are complete when the method returns.
///
/// Stream values are DLPack's (dlpack.h, `__dlpack__` stream table): for CUDA `1` is the
/// legacy default stream, `2` the per-thread default stream, `-1` means "do not
/// synchronize", any other value is a `CUstream` handle; `0` is never used.
///
/// # Safety
/// The crate hands MPI and its own copies the memory a runtime reports, so an
/// implementation keeps what each method documents: [`DeviceRuntime::alloc_pinned`] and
/// [`DeviceRuntime::alloc_device`] return `bytes` bytes of their kind of memory, valid and
/// used by nothing else until freed; [`DeviceRuntime::check_pointer`] returns `Ok` only for
/// memory of the device named; [`DeviceRuntime::synchronize`] returns once the producer's
/// work on the stream is complete; the copies copy what they are given and are complete on
/// return. (`SimulatedRuntime` and `cuda::CudaRuntime` are the crate's.)
///
/// ```compile_fail,E0200
/// // A runtime of one's own is an `unsafe impl`: its allocations reach MPI.
/// struct Mine;
/// impl dlpack_mpi::runtime::DeviceRuntime for Mine {
///     fn describe(&self) -> String { String::new() }
///     fn consumer_stream(&self, _: dlpack_mpi::device::Device) -> dlpack_mpi::Result<isize> { Ok(-1) }
///     fn synchronize(&self, _: dlpack_mpi::device::Device, _: isize) -> dlpack_mpi::Result<()> { Ok(()) }
///     fn check_pointer(&self, _: dlpack_mpi::device::Device, _: *const std::ffi::c_void) -> dlpack_mpi::Result<()> { Ok(()) }
///     fn alloc_pinned(&self, _: usize) -> dlpack_mpi::Result<std::ptr::NonNull<u8>> { Ok(std::ptr::NonNull::dangling()) }
///     unsafe fn free_pinned(&self, _: std::ptr::NonNull<u8>, _: usize) {}
///     unsafe fn copy_to_host(&self, _: dlpack_mpi::device::Device, _: *mut u8, _: *const std::ffi::c_void, _: usize) -> dlpack_mpi::Result<()> { Ok(()) }
///     unsafe fn copy_to_device(&self, _: dlpack_mpi::device::Device, _: *mut std::ffi::c_void, _: *const u8, _: usize) -> dlpack_mpi::Result<()> { Ok(()) }
/// }
/// ```
pub unsafe trait DeviceRuntime: Send + Sync {
    /// A one-line description for reports (`dlpack-mpi info`, check headers).
    fn describe(&self) -> String;

    /// How many devices of this runtime the process can see (for CUDA: `cuDeviceGetCount`,
    /// after `CUDA_VISIBLE_DEVICES`). Makes no context. The default is one device.
    fn device_count(&self) -> usize {
        1
    }

    /// Makes `ordinal` this process's device: its context is made (for CUDA: the primary
    /// context, `cuDevicePrimaryCtxRetain`) and current on the calling thread, and it is the
    /// device of the runtime's own allocations (pinned buffers). Call it once, before anything
    /// else asks the runtime for a context; [`crate::transport::select_device`] does, with the
    /// node-local rank. Without a call, the runtime behaves as if device 0 were selected and
    /// makes a device's context only when a tensor on it is first used. The default accepts
    /// ordinal 0 only.
    ///
    /// # Errors
    /// [`Error::UnsupportedDevice`] when `ordinal` is not below [`DeviceRuntime::device_count`];
    /// [`Error::Cuda`] when the context cannot be made (e.g. an `EXCLUSIVE_PROCESS` GPU
    /// another process holds).
    fn select_device(&self, ordinal: i32) -> Result<()> {
        check_ordinal(ordinal, self.device_count())
    }

    /// The stream the consumer owns on `device`, handed to producers under
    /// [`crate::dlpack::StreamPolicy::Synchronize`] `{ stream: None }`.
    ///
    /// # Errors
    /// [`Error::Cuda`] when the stream cannot be created.
    fn consumer_stream(&self, device: Device) -> Result<isize>;

    /// Blocks until all work submitted to `stream` on `device` is done; `-1` returns at once.
    ///
    /// # Errors
    /// [`Error::Cuda`].
    fn synchronize(&self, device: Device, stream: isize) -> Result<()>;

    /// Checks that `ptr` (non-NULL, the tensor's first element) is memory of `device`'s kind
    /// and ordinal: device memory of that ordinal for `kDLCUDA`, managed memory for
    /// `kDLCUDAManaged` (`cuPointerGetAttribute`: `MEMORY_TYPE`, `IS_MANAGED`,
    /// `DEVICE_ORDINAL`).
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] with the label as the reported device and what the pointer
    /// is as the actual one (`kDLCPU` for memory the driver does not know).
    fn check_pointer(&self, device: Device, ptr: *const c_void) -> Result<()>;

    /// Allocates `bytes` (> 0) of page-locked host memory, usable from every device.
    ///
    /// # Errors
    /// [`Error::Cuda`] (out of pinned memory).
    fn alloc_pinned(&self, bytes: usize) -> Result<NonNull<u8>>;

    /// Frees a buffer from [`DeviceRuntime::alloc_pinned`].
    ///
    /// # Safety
    /// `ptr` and `bytes` come from one `alloc_pinned` call of this runtime, freed once.
    unsafe fn free_pinned(&self, ptr: NonNull<u8>, bytes: usize);

    /// Copies `bytes` from device memory `src` on `device` to host memory `dst`.
    ///
    /// # Safety
    /// `src..src+bytes` is device memory of `device`, `dst..dst+bytes` writable host memory;
    /// neither is written by anyone else meanwhile.
    ///
    /// # Errors
    /// [`Error::Cuda`].
    unsafe fn copy_to_host(
        &self,
        device: Device,
        dst: *mut u8,
        src: *const c_void,
        bytes: usize,
    ) -> Result<()>;

    /// Copies `bytes` from host memory `src` to device memory `dst` on `device`.
    ///
    /// # Safety
    /// As [`DeviceRuntime::copy_to_host`], the other way round.
    ///
    /// # Errors
    /// [`Error::Cuda`].
    unsafe fn copy_to_device(
        &self,
        device: Device,
        dst: *mut c_void,
        src: *const u8,
        bytes: usize,
    ) -> Result<()>;

    /// Runs `copies`, pitched 2-D copies of `kind` between memory of `device` and host
    /// memory (or within `device`'s memory), all complete on return. For CUDA: one
    /// `cuMemcpy2DAsync` each on the device's consumer stream, then one synchronization.
    /// [`StridedCopy`] makes such copies from a strided tensor's layout. The default copies
    /// row by row with [`DeviceRuntime::copy_to_host`]/[`DeviceRuntime::copy_to_device`].
    ///
    /// # Safety
    /// For every copy, each source row (`src + r × src_pitch`, `width_bytes` bytes, `r <
    /// height`) is readable memory of its side, each destination row writable; the device
    /// side is memory of `device`; sources and destinations do not overlap, and nobody else
    /// writes them meanwhile.
    ///
    /// # Errors
    /// [`Error::Cuda`]; with the default, [`Error::UnsupportedDevice`] for
    /// [`CopyKind::DeviceToDevice`].
    unsafe fn copy_2d(&self, device: Device, kind: CopyKind, copies: &[Copy2d]) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { strided::copy_2d_by_rows(self, device, kind, copies) }
    }

    /// Allocates `bytes` (> 0) of memory on `device` (for CUDA `cuMemAlloc`, in the device's
    /// primary context): the direct route's scratch buffers for strided tensors.
    ///
    /// # Errors
    /// [`Error::Cuda`] (out of device memory); the default, for runtimes without device
    /// allocation, is [`Error::UnsupportedDevice`].
    fn alloc_device(&self, device: Device, bytes: usize) -> Result<NonNull<u8>> {
        let _ = bytes;
        Err(Error::UnsupportedDevice {
            device_type: device.device_type,
            device_id: device.device_id,
            reason: "this GPU runtime cannot allocate device memory",
        })
    }

    /// Frees a buffer from [`DeviceRuntime::alloc_device`]. The default does nothing (its
    /// `alloc_device` never allocates).
    ///
    /// # Safety
    /// `ptr` and `bytes` come from one `alloc_device(device, bytes)` call of this runtime,
    /// freed once, with no copy using it pending.
    unsafe fn free_device(&self, device: Device, ptr: NonNull<u8>, bytes: usize) {
        let _ = (device, ptr, bytes);
    }
}

/// The runtime that `acquire` and the transport use when the caller names none: the CUDA
/// driver when this build has feature `cuda` and the driver library loads, else `None`
/// (device tensors are then refused with [`Error::UnsupportedDevice`]).
pub fn default_runtime() -> Option<&'static dyn DeviceRuntime> {
    #[cfg(feature = "cuda")]
    {
        cuda::CudaRuntime::global()
            .ok()
            .map(|r| r as &dyn DeviceRuntime)
    }
    #[cfg(not(feature = "cuda"))]
    {
        None
    }
}

/// The rule both runtimes apply to a pointer whose memory is `actual` and whose tensor is
/// labelled `label`: `kDLCUDAManaged` needs managed memory; `kDLCUDA` needs device memory of
/// that ordinal, or managed memory (device-addressable, so accepted).
///
/// # Errors
/// [`Error::DeviceMismatch`] with the label as the reported device and `actual` as the
/// actual one.
fn check_placement(label: Device, actual: Device) -> Result<()> {
    let managed = actual.device_type == device_type::CUDA_MANAGED;
    let fits = match label.device_type {
        device_type::CUDA_MANAGED => managed,
        _ => actual == label || managed,
    };
    if fits {
        Ok(())
    } else {
        Err(Error::DeviceMismatch {
            reported_type: label.device_type,
            reported_id: label.device_id,
            actual_type: actual.device_type,
            actual_id: actual.device_id,
        })
    }
}

/// `Ok` when `ordinal` names one of `count` devices.
///
/// # Errors
/// [`Error::UnsupportedDevice`] (as `kDLCUDA`) naming the ordinal and saying how many there are.
pub(crate) fn check_ordinal(ordinal: i32, count: usize) -> Result<()> {
    if usize::try_from(ordinal).is_ok_and(|o| o < count) {
        Ok(())
    } else {
        Err(Error::UnsupportedDevice {
            device_type: device_type::CUDA,
            device_id: ordinal,
            reason: "no device with this ordinal is visible to this process",
        })
    }
}
