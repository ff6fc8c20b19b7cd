//! CUDA through the driver API (cudarc 0.19, feature `cuda`): the [`CudaRuntime`] that
//! acquisition and the transport use. The DLPack exporter for cudarc's slices,
//! `CudaExport`, is a producer and lives with the others in `dlpack` (`dlpack/cudarc.rs`);
//! it orders its stream through `wait_for_stream` here.
//!
//! The driver library (`libcuda.so`) is loaded at run time: a build with this feature runs
//! on machines without CUDA, where [`CudaRuntime::global`] answers an error and GPU tests
//! skip. Nothing here lets cudarc free memory it does not own: the runtime's pinned buffers,
//! streams and contexts are raw driver handles, and exported tensors borrow the slice.
//!
//! **Contexts.** Every call for a tensor runs in the primary context of the tensor's device
//! (`DLDevice::device_id`, CASES C62), and the context that was current before is current
//! again afterwards. A device's primary context is retained only when it is first needed —
//! by [`DeviceRuntime::select_device`] or by the first tensor on that device — never for
//! every device at start-up: a rank of a multi-GPU node makes a context on its own device
//! only (on an `EXCLUSIVE_PROCESS` GPU a context elsewhere would fail or block a peer). The
//! runtime's own pinned buffers belong to the selected device (device 0 when none was). **Streams.** Each device has one consumer stream (non-blocking), handed
//! to producers under `StreamPolicy::Synchronize` and used for staging copies.

use std::ffi::c_void;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, OnceLock};

use cudarc::driver::{result, sys, CudaStream, DriverError};

use super::strided::{Copy2d, CopyKind};
use super::{check_placement, DeviceRuntime};
use crate::device::{
    device_type, Device, CUDA_LEGACY_DEFAULT_STREAM, CUDA_PER_THREAD_DEFAULT_STREAM, NO_SYNC_STREAM,
};
use crate::error::{Error, Result};

fn cu(call: &'static str) -> impl Fn(DriverError) -> Error {
    move |e| Error::Cuda {
        call,
        code: e.0 as u32,
        name: e
            .error_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|_| format!("CUresult {}", e.0 as u32)),
    }
}

/// A DLPack CUDA stream value as a `CUstream` (`1` → `CU_STREAM_LEGACY`, `2` →
/// `CU_STREAM_PER_THREAD`, anything else is the handle itself).
pub(crate) fn cu_stream(stream: isize) -> sys::CUstream {
    match stream {
        CUDA_LEGACY_DEFAULT_STREAM => 0x1 as sys::CUstream,
        CUDA_PER_THREAD_DEFAULT_STREAM => 0x2 as sys::CUstream,
        s => s as sys::CUstream,
    }
}

struct DeviceState {
    dev: sys::CUdevice,
    /// The primary context, retained on first use and kept for the process (`CUcontext` as
    /// an address).
    ctx: Mutex<Option<usize>>,
    /// The consumer stream, created on first use (`CUstream` as an address).
    stream: Mutex<Option<usize>>,
}

/// The CUDA driver as a [`DeviceRuntime`]: one per process ([`CudaRuntime::global`]).
pub struct CudaRuntime {
    devices: Vec<DeviceState>,
    driver_version: i32,
    /// The ordinal given to `select_device` (0 until then): the device of pinned buffers and
    /// of labels that name no CUDA ordinal (`kDLCUDAHost`, `kDLCUDAManaged`).
    home: AtomicI32,
}

// SAFETY: CUDA driver handles (contexts, streams) may be used from any thread; the mutable
// state (lazily created streams) is behind mutexes.
unsafe impl Send for CudaRuntime {}
// SAFETY: as above.
unsafe impl Sync for CudaRuntime {}

impl std::fmt::Debug for CudaRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

enum InitFailure {
    NoLibrary,
    NoDevice,
    Driver(Error),
}

/// Restores the context that was current when it was made.
struct CtxGuard {
    prev: sys::CUcontext,
    switched: bool,
}

impl Drop for CtxGuard {
    fn drop(&mut self) {
        if self.switched {
            // SAFETY: `prev` was current on this thread a moment ago (or NULL: none).
            let _ = unsafe { result::ctx::set_current(self.prev) };
        }
    }
}

impl CudaRuntime {
    /// The process's runtime: the driver loaded and initialized, its devices counted (once;
    /// later calls return the same answer). No context is made here (module docs).
    ///
    /// # Errors
    /// [`Error::UnsupportedDevice`] when no CUDA driver library loads or there is no
    /// device; [`Error::Cuda`] when `cuInit` or `cuDeviceGet` fails.
    pub fn global() -> Result<&'static CudaRuntime> {
        static GLOBAL: OnceLock<std::result::Result<CudaRuntime, InitFailureRecord>> =
            OnceLock::new();
        match GLOBAL.get_or_init(|| Self::init().map_err(InitFailureRecord::from)) {
            Ok(r) => Ok(r),
            Err(f) => Err(f.error()),
        }
    }

    fn init() -> std::result::Result<CudaRuntime, InitFailure> {
        // SAFETY: only tries to open the library by its usual names.
        if !unsafe { sys::is_culib_present() } {
            return Err(InitFailure::NoLibrary);
        }
        result::init().map_err(|e| InitFailure::Driver(cu("cuInit")(e)))?;
        let count = result::device::get_count()
            .map_err(|e| InitFailure::Driver(cu("cuDeviceGetCount")(e)))?;
        if count <= 0 {
            return Err(InitFailure::NoDevice);
        }
        let mut devices = Vec::new();
        for ordinal in 0..count {
            let dev = result::device::get(ordinal)
                .map_err(|e| InitFailure::Driver(cu("cuDeviceGet")(e)))?;
            devices.push(DeviceState {
                dev,
                ctx: Mutex::new(None),
                stream: Mutex::new(None),
            });
        }
        let mut version = 0;
        // SAFETY: writes one int.
        let _ = unsafe { sys::cuDriverGetVersion(&mut version) };
        Ok(CudaRuntime {
            devices,
            driver_version: version,
            home: AtomicI32::new(0),
        })
    }

    /// Number of CUDA devices.
    pub fn device_count(&self) -> usize {
        self.devices.len()
    }

    fn state(&self, device: Device) -> Result<&DeviceState> {
        usize::try_from(device.device_id)
            .ok()
            .and_then(|i| self.devices.get(i))
            .ok_or(Error::UnsupportedDevice {
                device_type: device.device_type,
                device_id: device.device_id,
                reason: "device_id is not the ordinal of a CUDA device of this machine",
            })
    }

    /// The CUDA device whose context serves `device`: itself for `kDLCUDA`, the selected
    /// device for the other CUDA kinds (pinned host and managed memory have no ordinal).
    fn ordinal_for(&self, device: Device) -> Device {
        if device.device_type == device_type::CUDA {
            device
        } else {
            Device::new(device_type::CUDA, self.home.load(Ordering::Relaxed))
        }
    }

    /// The primary context of `state`'s device, retained on first use.
    fn context(state: &DeviceState) -> Result<sys::CUcontext> {
        let mut slot = state.ctx.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = *slot {
            return Ok(c as sys::CUcontext);
        }
        // SAFETY: `dev` comes from cuDeviceGet; the reference is kept for the process.
        let ctx = unsafe { result::primary_ctx::retain(state.dev) }
            .map_err(cu("cuDevicePrimaryCtxRetain"))?;
        *slot = Some(ctx as usize);
        Ok(ctx)
    }

    /// Makes `device`'s primary context current until the guard drops.
    fn enter(&self, device: Device) -> Result<CtxGuard> {
        let state = self.state(self.ordinal_for(device))?;
        let ctx = Self::context(state)?;
        let prev = result::ctx::get_current()
            .map_err(cu("cuCtxGetCurrent"))?
            .unwrap_or(std::ptr::null_mut());
        if prev == ctx {
            return Ok(CtxGuard {
                prev,
                switched: false,
            });
        }
        // SAFETY: a primary context retained for the life of the process.
        unsafe { result::ctx::set_current(ctx) }.map_err(cu("cuCtxSetCurrent"))?;
        Ok(CtxGuard {
            prev,
            switched: true,
        })
    }

    /// The consumer stream of `device` (its context must be current).
    fn stream(&self, device: Device) -> Result<sys::CUstream> {
        let state = self.state(self.ordinal_for(device))?;
        let mut slot = state.stream.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = *slot {
            return Ok(s as sys::CUstream);
        }
        let s = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(cu("cuStreamCreate"))?;
        *slot = Some(s as usize);
        Ok(s)
    }

    /// Runs `submit` (asynchronous copies on `device`'s consumer stream, the device's
    /// context current), then one `cuStreamSynchronize`, also after a failed submission, so
    /// that no copy is left running: complete on return. The error is the submission's,
    /// else the synchronization's.
    fn copy_and_wait(
        &self,
        device: Device,
        submit: impl FnOnce(sys::CUstream) -> Result<()>,
    ) -> Result<()> {
        let _ctx = self.enter(device)?;
        let stream = self.stream(device)?;
        let submitted = submit(stream);
        // SAFETY: the runtime's own stream.
        let synced =
            unsafe { result::stream::synchronize(stream) }.map_err(cu("cuStreamSynchronize"));
        submitted.and(synced)
    }
}

/// The init failure kept for later callers (errors are not `Clone`).
enum InitFailureRecord {
    NoLibrary,
    NoDevice,
    Driver {
        call: &'static str,
        code: u32,
        name: String,
    },
}

impl From<InitFailure> for InitFailureRecord {
    fn from(f: InitFailure) -> Self {
        match f {
            InitFailure::NoLibrary => InitFailureRecord::NoLibrary,
            InitFailure::NoDevice => InitFailureRecord::NoDevice,
            InitFailure::Driver(Error::Cuda { call, code, name }) => {
                InitFailureRecord::Driver { call, code, name }
            }
            InitFailure::Driver(_) => InitFailureRecord::NoDevice,
        }
    }
}

impl InitFailureRecord {
    fn error(&self) -> Error {
        let unsupported = |reason| Error::UnsupportedDevice {
            device_type: device_type::CUDA,
            device_id: 0,
            reason,
        };
        match self {
            InitFailureRecord::NoLibrary => {
                unsupported("no CUDA driver library (libcuda.so) could be loaded")
            }
            InitFailureRecord::NoDevice => unsupported("the CUDA driver reports no device"),
            InitFailureRecord::Driver { call, code, name } => Error::Cuda {
                call,
                code: *code,
                name: name.clone(),
            },
        }
    }
}

// SAFETY: allocations are the driver's (`cuMemHostAlloc`, `cuMemAlloc`) of the size asked,
// freed once by the matching call; pointers are checked with `cuPointerGetAttribute`;
// `synchronize` is `cuStreamSynchronize` on the stream named; copies are synchronous or
// synchronized before returning.
unsafe impl DeviceRuntime for CudaRuntime {
    fn describe(&self) -> String {
        format!(
            "CUDA driver {}.{}, {} device(s)",
            self.driver_version / 1000,
            self.driver_version % 1000 / 10,
            self.devices.len()
        )
    }

    fn device_count(&self) -> usize {
        self.devices.len()
    }

    /// Retains `ordinal`'s primary context, makes it current on the calling thread (and
    /// leaves it current: a CUDA-aware MPI library and cudarc find it there), and makes it the
    /// home of pinned buffers.
    fn select_device(&self, ordinal: i32) -> Result<()> {
        super::check_ordinal(ordinal, self.devices.len())?;
        let state = self.state(Device::new(device_type::CUDA, ordinal))?;
        let ctx = Self::context(state)?;
        // SAFETY: a primary context retained for the life of the process.
        unsafe { result::ctx::set_current(ctx) }.map_err(cu("cuCtxSetCurrent"))?;
        self.home.store(ordinal, Ordering::Relaxed);
        Ok(())
    }

    fn consumer_stream(&self, device: Device) -> Result<isize> {
        let _ctx = self.enter(device)?;
        Ok(self.stream(device)? as isize)
    }

    fn synchronize(&self, device: Device, stream: isize) -> Result<()> {
        if stream == NO_SYNC_STREAM {
            return Ok(());
        }
        let _ctx = self.enter(device)?;
        // SAFETY: a DLPack stream value of this device (legacy/per-thread or a handle the
        // consumer handed out).
        unsafe { result::stream::synchronize(cu_stream(stream)) }.map_err(cu("cuStreamSynchronize"))
    }

    fn check_pointer(&self, device: Device, ptr: *const c_void) -> Result<()> {
        let _ctx = self.enter(device)?;
        let addr = ptr as sys::CUdeviceptr;
        let mut memory_type: u32 = 0;
        let mut managed: u64 = 0;
        let mut ordinal: i32 = -1;
        // SAFETY: each call writes one attribute value into a local of sufficient size.
        let known = unsafe {
            sys::cuPointerGetAttribute(
                (&mut memory_type as *mut u32).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                addr,
            )
        } == sys::CUresult::CUDA_SUCCESS;
        if known {
            // SAFETY: as above.
            unsafe {
                let _ = sys::cuPointerGetAttribute(
                    (&mut managed as *mut u64).cast(),
                    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED,
                    addr,
                );
                let _ = sys::cuPointerGetAttribute(
                    (&mut ordinal as *mut i32).cast(),
                    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                    addr,
                );
            }
        }
        let actual = if !known {
            Device::CPU
        } else if managed != 0 {
            Device::new(device_type::CUDA_MANAGED, 0)
        } else if memory_type == sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
            Device::new(device_type::CUDA, ordinal)
        } else {
            Device::new(device_type::CUDA_HOST, 0)
        };
        check_placement(device, actual)
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<std::ptr::NonNull<u8>> {
        let _ctx = self.enter(Device::new(device_type::CUDA_HOST, 0))?;
        // SAFETY: allocates; PORTABLE makes it pinned for every context.
        let p = unsafe { result::malloc_host(bytes.max(1), sys::CU_MEMHOSTALLOC_PORTABLE) }
            .map_err(cu("cuMemHostAlloc"))?;
        std::ptr::NonNull::new(p.cast::<u8>()).ok_or(Error::Cuda {
            call: "cuMemHostAlloc",
            code: 2,
            name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
        })
    }

    unsafe fn free_pinned(&self, ptr: std::ptr::NonNull<u8>, _bytes: usize) {
        if let Ok(_ctx) = self.enter(Device::new(device_type::CUDA_HOST, 0)) {
            // SAFETY: from alloc_pinned (caller's contract).
            let _ = unsafe { result::free_host(ptr.as_ptr().cast()) };
        }
    }

    unsafe fn copy_to_host(
        &self,
        device: Device,
        dst: *mut u8,
        src: *const c_void,
        bytes: usize,
    ) -> Result<()> {
        self.copy_and_wait(device, |stream| {
            // SAFETY: caller's contract (device span and host buffer of `bytes`); the stream
            // is synchronized before `copy_and_wait` returns, so the copy is complete.
            unsafe { sys::cuMemcpyDtoHAsync_v2(dst.cast(), src as sys::CUdeviceptr, bytes, stream) }
                .result()
                .map_err(cu("cuMemcpyDtoHAsync"))
        })
    }

    unsafe fn copy_to_device(
        &self,
        device: Device,
        dst: *mut c_void,
        src: *const u8,
        bytes: usize,
    ) -> Result<()> {
        self.copy_and_wait(device, |stream| {
            // SAFETY: as in copy_to_host.
            unsafe { sys::cuMemcpyHtoDAsync_v2(dst as sys::CUdeviceptr, src.cast(), bytes, stream) }
                .result()
                .map_err(cu("cuMemcpyHtoDAsync"))
        })
    }

    /// One `cuMemcpy2DAsync` per copy on the device's consumer stream, then one
    /// `cuStreamSynchronize` (also after a failed submission, so no copy is left running).
    unsafe fn copy_2d(&self, device: Device, kind: CopyKind, copies: &[Copy2d]) -> Result<()> {
        self.copy_and_wait(device, |stream| {
            for c in copies.iter().filter(|c| c.bytes() > 0) {
                let params = memcpy2d(kind, c);
                // SAFETY: caller's contract (every row valid on its side, disjoint); the
                // parameters live until the call returns (the driver copies them).
                unsafe { sys::cuMemcpy2DAsync_v2(&params, stream) }
                    .result()
                    .map_err(cu("cuMemcpy2DAsync"))?;
            }
            Ok(())
        })
    }

    /// `cuMemAlloc` in `device`'s primary context.
    fn alloc_device(&self, device: Device, bytes: usize) -> Result<std::ptr::NonNull<u8>> {
        let _ctx = self.enter(device)?;
        // SAFETY: allocates; the context is current.
        let p = unsafe { result::malloc_sync(bytes.max(1)) }.map_err(cu("cuMemAlloc"))?;
        std::ptr::NonNull::new(p as *mut u8).ok_or(Error::Cuda {
            call: "cuMemAlloc",
            code: 2,
            name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
        })
    }

    unsafe fn free_device(&self, device: Device, ptr: std::ptr::NonNull<u8>, _bytes: usize) {
        if let Ok(_ctx) = self.enter(device) {
            // SAFETY: from alloc_device on this device (caller's contract), no copy pending
            // (every copy of this runtime is synchronized before it returns).
            let _ = unsafe { result::free_sync(ptr.as_ptr() as sys::CUdeviceptr) };
        }
    }
}

/// The `CUDA_MEMCPY2D` of one [`Copy2d`] of `kind` (host sides as host pointers, device
/// sides as device pointers).
fn memcpy2d(kind: CopyKind, c: &Copy2d) -> sys::CUDA_MEMCPY2D {
    let (src_device, dst_device) = match kind {
        CopyKind::DeviceToHost => (true, false),
        CopyKind::HostToDevice => (false, true),
        CopyKind::DeviceToDevice => (true, true),
    };
    let memory = |device: bool| {
        if device {
            sys::CUmemorytype::CU_MEMORYTYPE_DEVICE
        } else {
            sys::CUmemorytype::CU_MEMORYTYPE_HOST
        }
    };
    sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: memory(src_device),
        srcHost: if src_device { std::ptr::null() } else { c.src },
        srcDevice: if src_device {
            c.src as sys::CUdeviceptr
        } else {
            0
        },
        srcArray: std::ptr::null_mut(),
        srcPitch: c.src_pitch,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: memory(dst_device),
        dstHost: if dst_device {
            std::ptr::null_mut()
        } else {
            c.dst
        },
        dstDevice: if dst_device {
            c.dst as sys::CUdeviceptr
        } else {
            0
        },
        dstArray: std::ptr::null_mut(),
        dstPitch: c.dst_pitch,
        WidthInBytes: c.width_bytes,
        Height: c.height,
    }
}

/// Runs `f`, which may bind another context to the calling thread (as cudarc's calls do), and
/// makes the context that was current before current again.
pub(crate) fn keeping_current_context<R>(f: impl FnOnce() -> R) -> R {
    let _restore = result::ctx::get_current().ok().map(|prev| CtxGuard {
        prev: prev.unwrap_or(std::ptr::null_mut()),
        switched: true,
    });
    f()
}

/// Makes the DLPack CUDA stream `consumer` (`1`, `2` or a handle; not `-1` or `0`) wait for
/// the work queued so far on cudarc's `producer` stream: an event recorded on `producer`
/// (`cuEventRecord`), waited on by `consumer` (`cuStreamWaitEvent`), in `producer`'s
/// context, with the caller's current context restored afterwards. Returns at once; nothing
/// is synchronized on the host.
///
/// # Errors
/// [`Error::Cuda`] naming the driver call that failed.
pub(crate) fn wait_for_stream(producer: &CudaStream, consumer: isize) -> Result<()> {
    let target = cu_stream(consumer);
    let ctx = producer.context();
    let prev = result::ctx::get_current()
        .map_err(cu("cuCtxGetCurrent"))?
        .unwrap_or(std::ptr::null_mut());
    ctx.bind_to_thread().map_err(cu("cuCtxSetCurrent"))?;
    let _restore = CtxGuard {
        prev,
        switched: prev != ctx.cu_ctx(),
    };
    let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
        .map_err(cu("cuEventCreate"))?;
    // SAFETY: a fresh event, the producer's live stream, and a stream value of the
    // consumer's; destroying an event with a pending wait is allowed (the driver releases it
    // once the wait is resolved).
    unsafe {
        let ordered = result::event::record(event, producer.cu_stream())
            .map_err(cu("cuEventRecord"))
            .and_then(|()| {
                result::stream::wait_event(
                    target,
                    event,
                    sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                )
                .map_err(cu("cuStreamWaitEvent"))
            });
        let _ = result::event::destroy(event);
        ordered
    }
}
