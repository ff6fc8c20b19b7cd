//! CUDA through the driver API (cudarc 0.19, feature `cuda`): the [`CudaRuntime`] the
//! transport uses, and [`CudaExport`], a DLPack exporter for cudarc's `CudaSlice<T>`,
//! `CudaView<T>` and `CudaViewMut<T>`.
//!
//! The driver library (`libcuda.so`) is loaded at run time: a build with this feature runs
//! on machines without CUDA, where [`CudaRuntime::global`] answers an error and GPU tests
//! skip. Nothing here lets cudarc free memory it does not own: the runtime's pinned buffers,
//! streams and contexts are raw driver handles, and exported tensors borrow the slice.
//!
//! **Contexts.** Every call for a tensor runs in the primary context of the tensor's device
//! (`DLDevice::device_id`, CASES C62), and the context that was current before is current
//! again afterwards. **Streams.** Each device has one consumer stream (non-blocking), handed
//! to producers under `StreamPolicy::Synchronize` and used for staging copies.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{result, sys, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, DriverError};

use crate::device::{device_type, Device};
use crate::dlpack::export::{export_foreign, ExportLayout, Lease};
use crate::dlpack::{
    ExportRequest, Exporter, ManagedTensor, CUDA_LEGACY_DEFAULT_STREAM,
    CUDA_PER_THREAD_DEFAULT_STREAM, FLAG_READ_ONLY, NO_SYNC_STREAM,
};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::transport::DeviceRuntime;

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
fn cu_stream(stream: isize) -> sys::CUstream {
    match stream {
        CUDA_LEGACY_DEFAULT_STREAM => 0x1 as sys::CUstream,
        CUDA_PER_THREAD_DEFAULT_STREAM => 0x2 as sys::CUstream,
        s => s as sys::CUstream,
    }
}

struct DeviceState {
    ctx: sys::CUcontext,
    /// The consumer stream, created on first use (`CUstream` as an address).
    stream: Mutex<Option<usize>>,
}

/// The CUDA driver as a [`DeviceRuntime`]: one per process ([`CudaRuntime::global`]).
pub struct CudaRuntime {
    devices: Vec<DeviceState>,
    driver_version: i32,
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
    /// The process's runtime: the driver loaded, initialized, and the primary context of
    /// every device retained (once; later calls return the same answer).
    ///
    /// # Errors
    /// [`Error::UnsupportedDevice`] when no CUDA driver library loads or there is no
    /// device; [`Error::Cuda`] when `cuInit` or a context fails.
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
            // SAFETY: `dev` comes from cuDeviceGet; the reference is kept for the process.
            let ctx = unsafe { result::primary_ctx::retain(dev) }
                .map_err(|e| InitFailure::Driver(cu("cuDevicePrimaryCtxRetain")(e)))?;
            devices.push(DeviceState {
                ctx,
                stream: Mutex::new(None),
            });
        }
        let mut version = 0;
        // SAFETY: writes one int.
        let _ = unsafe { sys::cuDriverGetVersion(&mut version) };
        Ok(CudaRuntime {
            devices,
            driver_version: version,
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

    /// Makes `device`'s primary context current until the guard drops.
    fn enter(&self, device: Device) -> Result<CtxGuard> {
        let ordinal = if device.device_type == device_type::CUDA {
            device
        } else {
            Device::new(device_type::CUDA, 0)
        };
        let state = self.state(ordinal)?;
        let prev = result::ctx::get_current()
            .map_err(cu("cuCtxGetCurrent"))?
            .unwrap_or(std::ptr::null_mut());
        if prev == state.ctx {
            return Ok(CtxGuard {
                prev,
                switched: false,
            });
        }
        // SAFETY: a primary context retained for the life of the process.
        unsafe { result::ctx::set_current(state.ctx) }.map_err(cu("cuCtxSetCurrent"))?;
        Ok(CtxGuard {
            prev,
            switched: true,
        })
    }

    /// The consumer stream of `device` (its context must be current).
    fn stream(&self, device: Device) -> Result<sys::CUstream> {
        let ordinal = if device.device_type == device_type::CUDA {
            device
        } else {
            Device::new(device_type::CUDA, 0)
        };
        let state = self.state(ordinal)?;
        let mut slot = state.stream.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = *slot {
            return Ok(s as sys::CUstream);
        }
        let s = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(cu("cuStreamCreate"))?;
        *slot = Some(s as usize);
        Ok(s)
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

impl DeviceRuntime for CudaRuntime {
    fn describe(&self) -> String {
        format!(
            "CUDA driver {}.{}, {} device(s)",
            self.driver_version / 1000,
            self.driver_version % 1000 / 10,
            self.devices.len()
        )
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
        crate::transport::check_placement(device, actual)
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<std::ptr::NonNull<u8>> {
        let _ctx = self.enter(Device::new(device_type::CUDA, 0))?;
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
        if let Ok(_ctx) = self.enter(Device::new(device_type::CUDA, 0)) {
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
        let _ctx = self.enter(device)?;
        let stream = self.stream(device)?;
        // SAFETY: caller's contract (device span and host buffer of `bytes`); the stream is
        // synchronized before returning, so the copy is complete.
        unsafe {
            sys::cuMemcpyDtoHAsync_v2(dst.cast(), src as sys::CUdeviceptr, bytes, stream)
                .result()
                .map_err(cu("cuMemcpyDtoHAsync"))?;
            result::stream::synchronize(stream).map_err(cu("cuStreamSynchronize"))
        }
    }

    unsafe fn copy_to_device(
        &self,
        device: Device,
        dst: *mut c_void,
        src: *const u8,
        bytes: usize,
    ) -> Result<()> {
        let _ctx = self.enter(device)?;
        let stream = self.stream(device)?;
        // SAFETY: as in copy_to_host.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst as sys::CUdeviceptr, src.cast(), bytes, stream)
                .result()
                .map_err(cu("cuMemcpyHtoDAsync"))?;
            result::stream::synchronize(stream).map_err(cu("cuStreamSynchronize"))
        }
    }
}

/// A DLPack exporter over cudarc device memory (`CudaSlice<T>`, `CudaView<T>`,
/// `CudaViewMut<T>`): a 1-d tensor of `len` elements of `T::DTYPE` on `(kDLCUDA, ordinal)`,
/// or any shape/strides that fit ([`CudaExport::with_layout`]).
///
/// **Streams** (array API `__dlpack__`): on each export it records an event on the slice's
/// own stream and makes the stream the consumer asked for wait on it — `None` and `1` the
/// legacy default stream, `2` the per-thread default stream, a handle that stream; `-1`
/// orders nothing; `0` is refused. The memory stays cudarc's: the tensor's deleter frees
/// only the shape arrays.
pub struct CudaExport<'a, T> {
    ptr: sys::CUdeviceptr,
    storage_bytes: usize,
    stream: Arc<CudaStream>,
    layout: ExportLayout,
    lease: Lease,
    _borrow: PhantomData<&'a T>,
}

impl<'a, T: Element + DeviceRepr> CudaExport<'a, T> {
    /// A read-only export (`READ_ONLY` flag) of `slice`.
    pub fn new<S: DevicePtr<T>>(slice: &'a S) -> Self {
        let stream = slice.stream().clone();
        let ptr = slice.device_ptr(&stream).0;
        Self::make(ptr, slice.len(), stream, FLAG_READ_ONLY)
    }

    /// A writable export of `slice` (one writable tensor at a time).
    pub fn new_mut<S: DevicePtrMut<T>>(slice: &'a mut S) -> Self {
        let stream = slice.stream().clone();
        let len = slice.len();
        let ptr = slice.device_ptr_mut(&stream).0;
        Self::make(ptr, len, stream, 0)
    }

    fn make(ptr: sys::CUdeviceptr, len: usize, stream: Arc<CudaStream>, flags: u64) -> Self {
        let ordinal = stream.context().ordinal() as i32;
        CudaExport {
            ptr,
            storage_bytes: len * std::mem::size_of::<T>(),
            stream,
            layout: ExportLayout::new(
                T::DTYPE,
                len,
                flags,
                Device::new(device_type::CUDA, ordinal),
            ),
            lease: Lease::default(),
            _borrow: PhantomData,
        }
    }

    /// Exports as `dtype` instead of `T::DTYPE` (e.g. a `CudaSlice<u8>` of any element
    /// type's bytes), as a 1-d tensor covering the whole slice; follow with
    /// [`CudaExport::with_layout`] for another shape (its strides count `dtype` elements).
    ///
    /// # Errors
    /// [`Error::UnsupportedDtype`] for sub-byte dtypes; [`Error::ShapeMismatch`] when the
    /// slice is not a whole number of `dtype` elements.
    pub fn with_dtype(mut self, dtype: crate::dtype::DType) -> Result<Self> {
        let elem = dtype.size_bytes().ok_or(Error::UnsupportedDtype {
            dtype,
            reason: "exporters need a whole number of bytes per element",
        })?;
        if self.storage_bytes % elem != 0 {
            return Err(Error::ShapeMismatch {
                what: "CudaExport::with_dtype",
                expected: (self.storage_bytes / elem + 1) as u64 * elem as u64,
                actual: self.storage_bytes as u64,
            });
        }
        let device = self.layout.device();
        let flags = self.layout.flags();
        self.layout = ExportLayout::new(dtype, self.storage_bytes / elem, flags, device);
        Ok(self)
    }

    /// Exports with `shape`, strides (elements; `None` = compact row-major) and a byte
    /// offset from the slice's start.
    ///
    /// # Errors
    /// [`Error::LayoutOutsideStorage`] when an element would lie outside the slice;
    /// [`Error::Overflow`]/[`Error::InvalidTensor`] for a bad shape.
    pub fn with_layout(
        mut self,
        shape: &[i64],
        strides_elems: Option<&[i64]>,
        byte_offset_bytes: u64,
    ) -> Result<Self> {
        self.layout =
            self.layout
                .reshaped(shape, strides_elems, byte_offset_bytes, self.storage_bytes)?;
        Ok(self)
    }

    /// Makes the consumer's `stream` wait for the work queued on the slice's stream.
    fn order_before(&self, stream: Option<isize>) -> Result<()> {
        let target = match stream {
            Some(NO_SYNC_STREAM) => return Ok(()),
            Some(0) => {
                return Err(Error::UnsupportedDevice {
                    device_type: device_type::CUDA,
                    device_id: self.layout.device().device_id,
                    reason: "CUDA stream 0 is disallowed by DLPack (ambiguous); use 1 or 2",
                })
            }
            None => cu_stream(CUDA_LEGACY_DEFAULT_STREAM),
            Some(s) => cu_stream(s),
        };
        let ctx = self.stream.context();
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
        // SAFETY: a fresh event, the slice's live stream, and a stream value of the
        // consumer's; destroying an event with a pending wait is allowed (the driver
        // releases it once the wait is resolved).
        unsafe {
            let ordered = result::event::record(event, self.stream.cu_stream())
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
}

impl<T: Element + DeviceRepr> Exporter for CudaExport<'_, T> {
    fn dlpack_device(&self) -> Option<Device> {
        Some(self.layout.device())
    }

    fn dlpack(&self, request: &ExportRequest) -> Result<ManagedTensor<'_>> {
        self.order_before(request.stream)?;
        // SAFETY: the device memory is borrowed from cudarc for 'a (outliving `&self`),
        // writable only for `new_mut`; the layout is checked against the storage; the lease
        // lives in `self`.
        unsafe {
            export_foreign(
                self.ptr as usize as *mut c_void,
                self.storage_bytes,
                &self.layout,
                Some(&self.lease),
            )
        }
    }
}
