//! The producer protocol: [`Exporter`], the consumer's [`acquire`], and built-in exporters.
//!
//! This mirrors the Python array API's `__dlpack__` / `__dlpack_device__` pair
//! (array-api, "Data interchange mechanisms"): the consumer may ask the producer for its
//! device, then requests the tensor with a stream argument chosen from that device, and the
//! producer orders its pending work before that stream.
//!
//! Decided policies (ARCHITECTURE.md):
//! - **Device query** ([`DeviceQuery`]). By default a missing device query is allowed: the
//!   tensor is requested *without* a stream and the device in the returned `DLTensor`
//!   decides the routing (CASES C53). `DeviceQuery::Required` makes it an error (C54).
//! - **Streams** ([`StreamPolicy`]). Host devices get no stream (C50). For CUDA and ROCm the
//!   default `Synchronize` hands the producer the consumer's stream, which the consumer
//!   synchronizes before MPI reads the pointer; `Unsynchronized` passes `-1` (the caller
//!   promises the data is ready). Values follow the DLPack stream table: CUDA `1` = legacy
//!   default stream, `2` = per-thread default stream, `0` is disallowed (ambiguous) and never
//!   sent (C51); ROCm `0` = default stream, `1` and `2` never sent (C52).

use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicIsize, Ordering};

use super::{
    DLManagedTensorVersioned, DLPackVersion, DLTensor, ManagedTensor, Tensor, FLAG_IS_COPIED,
    FLAG_READ_ONLY, MAJOR_VERSION, MINOR_VERSION,
};
use crate::device::{Device, MemoryKind};
use crate::dtype::{AnyBits, DType, Element};
use crate::error::{Error, Result};
use crate::layout;
use crate::transport::{default_runtime, DeviceRuntime};

/// Stream value `-1`: "the consumer does not want the producer to synchronize" (DLPack).
pub const NO_SYNC_STREAM: isize = -1;
/// CUDA stream value `1`: the legacy default stream.
pub const CUDA_LEGACY_DEFAULT_STREAM: isize = 1;
/// CUDA stream value `2`: the per-thread default stream.
pub const CUDA_PER_THREAD_DEFAULT_STREAM: isize = 2;
/// ROCm stream value `0`: the default stream.
pub const ROCM_DEFAULT_STREAM: isize = 0;

/// What the consumer asks the producer for: the arguments of `__dlpack__`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportRequest {
    /// `stream`: `None` for host devices and when the device is unknown; otherwise a stream
    /// value from the DLPack table (see the module docs) that the producer must order its
    /// work before.
    pub stream: Option<isize>,
    /// `max_version`: the highest DLPack version the consumer reads, `(1, minor)`.
    pub max_version: (u32, u32),
    /// `copy`: `Some(false)` — this consumer never asks for a copy (a copy received into
    /// would be lost).
    pub copy: Option<bool>,
    /// `dl_device`: the device the consumer wants the tensor on; `None` = where it is.
    pub dl_device: Option<Device>,
}

impl Default for ExportRequest {
    fn default() -> Self {
        ExportRequest {
            stream: None,
            max_version: (MAJOR_VERSION, MINOR_VERSION),
            copy: Some(false),
            dl_device: None,
        }
    }
}

/// A DLPack producer: the Rust form of `__dlpack__` and `__dlpack_device__`.
///
/// Exported tensors borrow the exporter (`ManagedTensor<'_>`), so the exporter outlives
/// every tensor it hands out. Like `__dlpack__`, one exporter may hand out several tensors
/// that view the same memory; the consumer must not receive into two of them at once.
pub trait Exporter {
    /// `__dlpack_device__`: the device of the tensor that [`Exporter::dlpack`] would return,
    /// or `None` when the exporter does not implement the query.
    fn dlpack_device(&self) -> Option<Device> {
        None
    }

    /// `__dlpack__`: hands out a managed tensor honouring `request`.
    ///
    /// # Errors
    /// Whatever the producer refuses, typically as [`Error::Export`].
    fn dlpack(&self, request: &ExportRequest) -> Result<ManagedTensor<'_>>;
}

/// Whether the consumer requires the producer to answer the device query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceQuery {
    /// A missing query is allowed: the tensor is requested without a stream and the device
    /// in the returned tensor decides routing (mpi4py's reading).
    #[default]
    Optional,
    /// A missing query is [`Error::MissingDeviceQuery`] (the strict reading of the array
    /// API, where `__dlpack__` and `__dlpack_device__` come in pairs).
    Required,
}

/// How the producer's pending work is ordered before MPI reads the pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamPolicy {
    /// Pass a consumer stream to the producer and synchronize it before MPI touches the
    /// pointer (correct by default). `stream: None` uses the consumer's own stream; in a
    /// build without GPU support that is the device's default stream (CUDA legacy default
    /// `1`, ROCm `0`).
    Synchronize {
        /// A stream value from the DLPack table (never `0` for CUDA).
        stream: Option<isize>,
    },
    /// Pass `-1`: the caller promises the data is ready.
    Unsynchronized,
}

impl Default for StreamPolicy {
    fn default() -> Self {
        StreamPolicy::Synchronize { stream: None }
    }
}

/// Options of [`acquire`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AcquireOptions {
    /// Device-query policy.
    pub device_query: DeviceQuery,
    /// Stream policy.
    pub stream: StreamPolicy,
}

impl AcquireOptions {
    /// The stream value to request for a tensor on `device` (`None` when the device is
    /// unknown or host memory).
    ///
    /// # Errors
    /// [`Error::UnsupportedDevice`] when a user-given CUDA stream is `0` (disallowed by the
    /// DLPack stream table: it is ambiguous between the legacy and per-thread streams).
    pub fn stream_for(&self, device: Option<Device>) -> Result<Option<isize>> {
        let Some(device) = device else {
            return Ok(None);
        };
        let kind = device.memory_kind();
        if !kind.uses_streams() {
            return Ok(None);
        }
        let is_rocm = kind == MemoryKind::Rocm;
        match self.stream {
            StreamPolicy::Unsynchronized => Ok(Some(NO_SYNC_STREAM)),
            StreamPolicy::Synchronize { stream: Some(0) } if !is_rocm => {
                Err(Error::UnsupportedDevice {
                    device_type: device.device_type,
                    device_id: device.device_id,
                    reason: "CUDA stream 0 is disallowed by DLPack (ambiguous); use 1 or 2",
                })
            }
            StreamPolicy::Synchronize { stream: Some(s) } => Ok(Some(s)),
            StreamPolicy::Synchronize { stream: None } => Ok(Some(if is_rocm {
                ROCM_DEFAULT_STREAM
            } else {
                CUDA_LEGACY_DEFAULT_STREAM
            })),
        }
    }
}

impl AcquireOptions {
    /// [`AcquireOptions::stream_for`], with `runtime` owning the consumer stream of CUDA
    /// devices under `Synchronize { stream: None }`.
    ///
    /// # Errors
    /// As [`AcquireOptions::stream_for`]; [`Error::Cuda`] when the runtime cannot make its
    /// stream.
    pub fn stream_with_runtime(
        &self,
        device: Option<Device>,
        runtime: Option<&dyn DeviceRuntime>,
    ) -> Result<Option<isize>> {
        match (device, runtime, self.stream) {
            (Some(d), Some(rt), StreamPolicy::Synchronize { stream: None })
                if matches!(d.memory_kind(), MemoryKind::Cuda | MemoryKind::CudaManaged) =>
            {
                rt.consumer_stream(d).map(Some)
            }
            _ => self.stream_for(device),
        }
    }
}

/// The consumer side of the protocol: query the device (if the exporter answers), request
/// the tensor with the stream the policy picks, check the returned device, and order the
/// producer's work before MPI.
///
/// # Errors
/// [`Error::MissingDeviceQuery`] under [`DeviceQuery::Required`] when the exporter has no
/// device query; [`Error::DeviceMismatch`] when the tensor is not on the device the exporter
/// reported; [`Error::UnsupportedDevice`] for a device-memory tensor under
/// [`StreamPolicy::Synchronize`] in a build that cannot synchronize it; the exporter's own
/// errors. In every case a tensor that was handed out has been released.
///
/// # Examples
/// ```
/// use dlpack_mpi::dlpack::{acquire, AcquireOptions, Tensor};
/// let data = [1.5f64, 2.5];
/// let t = acquire(&data[..], &AcquireOptions::default())?;
/// assert!(t.is_read_only()); // exported from a shared borrow
/// # Ok::<(), dlpack_mpi::Error>(())
/// ```
pub fn acquire<'e, E: Exporter + ?Sized>(
    exporter: &'e E,
    options: &AcquireOptions,
) -> Result<ManagedTensor<'e>> {
    acquire_with_runtime(exporter, options, default_runtime())
}

/// [`acquire`] with an explicit GPU runtime (`None`: device tensors under
/// `Synchronize` are refused). Under [`StreamPolicy::Synchronize`] `{ stream: None }` the
/// producer of a CUDA tensor is handed the runtime's own consumer stream
/// ([`DeviceRuntime::consumer_stream`], CASES C51), which is synchronized after the export
/// and before the tensor is returned (C61). A tensor requested without a stream (no device
/// query, C53) that turns out to be CUDA memory is ordered by synchronizing the legacy
/// default stream, which the array API says the producer assumes when given no stream.
///
/// # Errors
/// As [`acquire`]; [`Error::Cuda`] when the synchronization fails.
pub fn acquire_with_runtime<'e, E: Exporter + ?Sized>(
    exporter: &'e E,
    options: &AcquireOptions,
    runtime: Option<&dyn DeviceRuntime>,
) -> Result<ManagedTensor<'e>> {
    let reported = exporter.dlpack_device();
    if reported.is_none() && options.device_query == DeviceQuery::Required {
        return Err(Error::MissingDeviceQuery);
    }
    let request = ExportRequest {
        stream: options.stream_with_runtime(reported, runtime)?,
        ..ExportRequest::default()
    };
    let tensor = exporter.dlpack(&request)?;
    check_acquired(tensor, reported, options, request.stream, runtime)
}

/// The consumer's checks after the export, shared with the Python consumer: the tensor is
/// on the device the producer reported, and device memory can be ordered before MPI.
///
/// # Errors
/// [`Error::DeviceMismatch`]; [`Error::UnsupportedDevice`] (see [`acquire`]). The tensor is
/// released on error.
pub(crate) fn check_acquired<'e>(
    tensor: ManagedTensor<'e>,
    reported: Option<Device>,
    options: &AcquireOptions,
    requested_stream: Option<isize>,
    runtime: Option<&dyn DeviceRuntime>,
) -> Result<ManagedTensor<'e>> {
    let actual = tensor.device();
    if let Some(r) = reported {
        if r != actual {
            return Err(Error::DeviceMismatch {
                reported_type: r.device_type,
                reported_id: r.device_id,
                actual_type: actual.device_type,
                actual_id: actual.device_id,
            });
        }
    }
    let synchronize = matches!(options.stream, StreamPolicy::Synchronize { .. });
    if actual.memory_kind().uses_streams() && synchronize {
        let cuda = matches!(
            actual.memory_kind(),
            MemoryKind::Cuda | MemoryKind::CudaManaged
        );
        let Some(runtime) = runtime.filter(|_| cuda) else {
            // No runtime for this device: the consumer stream cannot be synchronized, so
            // the pointer can never be handed to MPI safely.
            return Err(Error::UnsupportedDevice {
                device_type: actual.device_type,
                device_id: actual.device_id,
                reason: if cuda {
                    "cannot synchronize the consumer stream: no CUDA runtime (build with \
                     feature `cuda` on a machine with the CUDA driver)"
                } else {
                    "cannot synchronize the consumer stream: ROCm has no runtime in this build"
                },
            });
        };
        // A tensor requested without a stream: the producer assumed the legacy default one.
        let stream = requested_stream.unwrap_or(CUDA_LEGACY_DEFAULT_STREAM);
        runtime.synchronize(actual, stream)?;
    }
    Ok(tensor)
}

/// Borrow state of an exporter's storage, so that the built-in writable exporters follow
/// Rust's rule even though `__dlpack__` takes `&self`: any number of read-only exports, or
/// one writable export, alive at a time. `0` = none, `n > 0` = `n` read-only, `-1` = one
/// writable. Atomic because a `ManagedTensor` may be dropped on another thread.
#[derive(Debug, Default)]
pub(crate) struct Lease(AtomicIsize);

impl Lease {
    fn take(&self, writable: bool) -> Result<()> {
        let busy = |now: isize| {
            Error::Export(format!(
                "storage is already exported ({}); drop that tensor first",
                if now < 0 {
                    "writable".to_string()
                } else {
                    format!("{now} read-only")
                }
            ))
        };
        let mut now = self.0.load(Ordering::Acquire);
        loop {
            let next = match (writable, now) {
                (true, 0) => -1,
                (false, n) if n >= 0 => n + 1,
                _ => return Err(busy(now)),
            };
            match self
                .0
                .compare_exchange(now, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(()),
                Err(actual) => now = actual,
            }
        }
    }

    fn give_back(&self) {
        let _ = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                Some(if n < 0 { 0 } else { (n - 1).max(0) })
            });
    }
}

/// The heap block behind every tensor the built-in exporters hand out: the versioned struct
/// first (so the deleter can cast back), then the arrays it points to and the lease it holds.
#[repr(C)]
struct Exported {
    managed: DLManagedTensorVersioned,
    shape: Box<[i64]>,
    strides: Option<Box<[i64]>>,
    lease: Option<NonNull<Lease>>,
}

unsafe extern "C" fn delete_exported(p: *mut DLManagedTensorVersioned) {
    if !p.is_null() {
        // SAFETY: `p` is the first field of a Box<Exported> leaked by `export_raw`, and the
        // guard calls this exactly once.
        let block = unsafe { Box::from_raw(p.cast::<Exported>()) };
        if let Some(lease) = block.lease {
            // SAFETY: the lease lives in the exporter, which the tensor borrows, so it is
            // still alive while the tensor is dropped.
            unsafe { lease.as_ref() }.give_back();
        }
    }
}

/// What a built-in exporter describes: dtype, shape, strides, byte offset, flags, device.
#[derive(Debug, Clone)]
pub(crate) struct ExportLayout {
    dtype: DType,
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
    byte_offset: u64,
    flags: u64,
    device: Device,
}

/// Describes a tensor over memory the caller keeps alive for `'a`; with a `lease`, the
/// export is refused while it conflicts with another live export of the same storage.
///
/// # Safety
/// `data` (with the layout) must describe memory valid for `'a`, writable unless `flags`
/// has `READ_ONLY`; `lease`, if given, must outlive the returned tensor.
unsafe fn export_raw<'a>(
    data: *mut c_void,
    l: &ExportLayout,
    lease: Option<&Lease>,
) -> Result<ManagedTensor<'a>> {
    let ndim = i32::try_from(l.shape.len()).map_err(|_| Error::InvalidTensor {
        field: "ndim".into(),
        value: l.shape.len() as i128,
        reason: "more axes than DLPack's int32 ndim holds",
    })?;
    if let Some(lease) = lease {
        lease.take(l.flags & FLAG_READ_ONLY == 0)?;
    }
    let mut block = Box::new(Exported {
        managed: DLManagedTensorVersioned {
            version: DLPackVersion {
                major: MAJOR_VERSION,
                minor: MINOR_VERSION,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_exported),
            flags: l.flags,
            dl_tensor: DLTensor {
                data,
                device: l.device.into(),
                ndim,
                dtype: l.dtype.into(),
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: l.byte_offset,
            },
        },
        shape: l.shape.as_slice().into(),
        strides: l.strides.as_deref().map(Into::into),
        lease: lease.map(NonNull::from),
    });
    block.managed.dl_tensor.shape = block.shape.as_mut_ptr();
    if let Some(s) = block.strides.as_mut() {
        block.managed.dl_tensor.strides = s.as_mut_ptr();
    }
    let raw = Box::into_raw(block).cast::<DLManagedTensorVersioned>();
    // SAFETY: a freshly built versioned struct with a deleter that frees it (and gives the
    // lease back); the arrays live in the same block; the caller vouches for the data.
    unsafe { ManagedTensor::from_raw_versioned(raw) }
}

impl<T: Element> Exporter for [T] {
    fn dlpack_device(&self) -> Option<Device> {
        Some(Device::CPU)
    }

    /// Exports the slice as a 1-d, `READ_ONLY` tensor (a shared borrow cannot be written).
    fn dlpack(&self, _request: &ExportRequest) -> Result<ManagedTensor<'_>> {
        let layout = ExportLayout {
            flags: FLAG_READ_ONLY,
            ..ExportLayout::dense::<T>(self.len())
        };
        // SAFETY: the slice is valid for the borrow; READ_ONLY keeps it from being written.
        unsafe { export_raw(self.as_ptr() as *mut c_void, &layout, None) }
    }
}

impl<T: Element> Exporter for Vec<T> {
    fn dlpack_device(&self) -> Option<Device> {
        Some(Device::CPU)
    }

    /// Exports the vector as a 1-d, `READ_ONLY` tensor; use [`Owned`] for a writable one.
    fn dlpack(&self, request: &ExportRequest) -> Result<ManagedTensor<'_>> {
        self.as_slice().dlpack(request)
    }
}

/// Exports memory that is not host memory (the CUDA exporter): the layout is checked to lie
/// inside `storage_bytes` first.
///
/// # Safety
/// As `export_raw`: `data` points to `storage_bytes` bytes of memory of `layout.device`
/// valid for `'a` (writable unless `READ_ONLY`); `lease` outlives the tensor.
#[cfg(feature = "cuda")]
pub(crate) unsafe fn export_foreign<'a>(
    data: *mut c_void,
    storage_bytes: usize,
    layout: &ExportLayout,
    lease: Option<&Lease>,
) -> Result<ManagedTensor<'a>> {
    layout.check_within(storage_bytes)?;
    // SAFETY: caller's contract; the layout stays inside the storage.
    unsafe { export_raw(data, layout, lease) }
}

impl ExportLayout {
    /// A 1-d tensor of `len` elements of `dtype` on `device`.
    #[cfg(feature = "cuda")]
    pub(crate) fn new(dtype: DType, len: usize, flags: u64, device: Device) -> Self {
        ExportLayout {
            dtype,
            shape: vec![len as i64],
            strides: None,
            byte_offset: 0,
            flags,
            device,
        }
    }

    /// The device exported tensors are labelled with.
    #[cfg(feature = "cuda")]
    pub(crate) fn device(&self) -> Device {
        self.device
    }

    /// The DLPack flags exported tensors carry.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn flags(&self) -> u64 {
        self.flags
    }

    /// Replaces shape, strides (elements) and byte offset, checked against the storage.
    #[cfg(feature = "cuda")]
    pub(crate) fn reshaped(
        &self,
        shape: &[i64],
        strides: Option<&[i64]>,
        byte_offset: u64,
        storage_bytes: usize,
    ) -> Result<Self> {
        let l = ExportLayout {
            shape: shape.to_vec(),
            strides: strides.map(<[i64]>::to_vec),
            byte_offset,
            ..self.clone()
        };
        l.check_within(storage_bytes)?;
        Ok(l)
    }

    fn dense<T: Element>(len: usize) -> Self {
        ExportLayout {
            dtype: T::DTYPE,
            shape: vec![len as i64],
            strides: None,
            byte_offset: 0,
            flags: 0,
            device: Device::CPU,
        }
    }

    /// Checks that every element of the layout lies inside `storage_bytes` bytes.
    fn check_within(&self, storage_bytes: usize) -> Result<()> {
        let elem = self.dtype.size_bytes().ok_or(Error::UnsupportedDtype {
            dtype: self.dtype,
            reason: "exporters need a whole number of bytes per element",
        })?;
        let n = layout::num_elements(&self.shape)?;
        let strides = match &self.strides {
            Some(s) if s.len() != self.shape.len() => {
                return Err(Error::LengthMismatch {
                    what: "strides",
                    expected: self.shape.len(),
                    actual: s.len(),
                })
            }
            Some(s) => s.clone(),
            None => layout::compact_strides(&self.shape)?,
        };
        if n == 0 {
            return Ok(());
        }
        let overflow = |lhs: i128, op: &'static str, rhs: i128| Error::Overflow {
            quantity: "exported layout extent",
            lhs,
            operator: op,
            rhs,
        };
        // Lowest and highest element offsets relative to the first element, in elements.
        let (mut lo, mut hi) = (0i128, 0i128);
        for (&n, &s) in self.shape.iter().zip(&strides) {
            let reach = i128::from(s)
                .checked_mul(i128::from(n - 1))
                .ok_or_else(|| overflow(s.into(), "*", (n - 1).into()))?;
            let side = if reach < 0 { &mut lo } else { &mut hi };
            *side = side
                .checked_add(reach)
                .ok_or_else(|| overflow(*side, "+", reach))?;
        }
        let bytes = |elems: i128| {
            elems
                .checked_mul(elem as i128)
                .and_then(|b| b.checked_add(i128::from(self.byte_offset)))
                .ok_or_else(|| overflow(elems, "*", elem as i128))
        };
        let first_byte = bytes(lo)?;
        let end_byte = bytes(hi.checked_add(1).ok_or_else(|| overflow(hi, "+", 1))?)?;
        if first_byte < 0 || end_byte > storage_bytes as i128 {
            return Err(Error::LayoutOutsideStorage {
                first_byte,
                end_byte,
                storage_bytes: storage_bytes as u64,
            });
        }
        Ok(())
    }
}

/// A writable exporter that owns its storage (from a `Vec<T>` or `Box<[T]>`).
///
/// By default it exports a 1-d, C-contiguous tensor of `T::DTYPE`; the builder methods give
/// it another shape, strides, byte offset, dtype or flags, always checked so that every
/// element lies inside the storage. Tensors borrow the exporter; [`Owned::into_vec`] gives
/// the storage back once they are gone.
///
/// # Examples
/// ```
/// use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned, Tensor};
/// let owned = Owned::new(vec![0u8; 6]).with_shape(&[2, 3])?;
/// let t = acquire(&owned, &AcquireOptions::default())?;
/// assert_eq!((t.shape(), t.num_elements()), (&[2i64, 3][..], 6));
/// # Ok::<(), dlpack_mpi::Error>(())
/// ```
pub struct Owned<T: AnyBits> {
    ptr: NonNull<T>,
    len: usize,
    layout: ExportLayout,
    lease: Lease,
}

// SAFETY: Owned owns its Box<[T]> like a Vec does.
unsafe impl<T: AnyBits + Send> Send for Owned<T> {}
// SAFETY: shared access only exports tensors, serialized by the atomic lease.
unsafe impl<T: AnyBits + Sync> Sync for Owned<T> {}

impl<T: AnyBits> Owned<T> {
    /// Takes ownership of `data`; exports it as a 1-d tensor of `data.len()` elements.
    pub fn new(data: impl Into<Box<[T]>>) -> Self {
        let boxed: Box<[T]> = data.into();
        let len = boxed.len();
        let ptr = NonNull::new(Box::into_raw(boxed).cast::<T>()).unwrap_or(NonNull::dangling());
        Owned {
            ptr,
            len,
            layout: ExportLayout::dense::<T>(len),
            lease: Lease::default(),
        }
    }

    /// Exports with `shape` (elements, outermost first) and compact row-major strides.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] when the shape needs more bytes than the storage has;
    /// [`Error::InvalidTensor`]/[`Error::Overflow`] for a bad shape.
    pub fn with_shape(self, shape: &[i64]) -> Result<Self> {
        self.with_layout(shape, None, 0)
    }

    /// Exports with explicit strides (in elements; `None` = compact row-major) and a byte
    /// offset (bytes from the storage start to the first element).
    ///
    /// # Errors
    /// As [`Owned::with_shape`]; [`Error::LengthMismatch`] when `strides` has not one entry
    /// per axis. Negative strides are allowed as long as every element stays inside.
    pub fn with_layout(
        mut self,
        shape: &[i64],
        strides_elems: Option<&[i64]>,
        byte_offset_bytes: u64,
    ) -> Result<Self> {
        let mut l = self.layout.clone();
        l.shape = shape.to_vec();
        l.strides = strides_elems.map(<[i64]>::to_vec);
        l.byte_offset = byte_offset_bytes;
        l.check_within(self.storage_bytes())?;
        self.layout = l;
        Ok(self)
    }

    /// Exports as `dtype` instead of `T::DTYPE` (e.g. float8 or bool bytes in `u8` storage),
    /// as a 1-d tensor covering the whole storage.
    ///
    /// # Errors
    /// [`Error::UnsupportedDtype`] for sub-byte dtypes; [`Error::ShapeMismatch`] when the
    /// storage is not a whole number of `dtype` elements.
    pub fn with_dtype(mut self, dtype: DType) -> Result<Self> {
        let elem = dtype.size_bytes().ok_or(Error::UnsupportedDtype {
            dtype,
            reason: "exporters need a whole number of bytes per element",
        })?;
        let bytes = self.storage_bytes();
        if bytes % elem != 0 {
            return Err(Error::ShapeMismatch {
                what: "Owned::with_dtype",
                expected: (bytes / elem + 1) as u64 * elem as u64,
                actual: bytes as u64,
            });
        }
        self.layout.dtype = dtype;
        self.layout.shape = vec![(bytes / elem) as i64];
        self.layout.strides = None;
        self.layout.byte_offset = 0;
        Ok(self)
    }

    /// Sets `READ_ONLY` on every exported tensor.
    pub fn read_only(mut self) -> Self {
        self.layout.flags |= FLAG_READ_ONLY;
        self
    }

    /// Sets `IS_COPIED` on every exported tensor (as a producer that had to copy would).
    pub fn copied(mut self) -> Self {
        self.layout.flags |= FLAG_IS_COPIED;
        self
    }

    /// Labels exported tensors with `device` and answers the device query with it. The
    /// memory stays host memory: this exists to test the consumer protocol with fake device
    /// exporters, and such tensors are refused before MPI in a build without GPU support.
    pub fn labelled(mut self, device: Device) -> Self {
        self.layout.device = device;
        self
    }

    /// The storage, read through `&mut self` so that no exported tensor is alive.
    pub fn as_slice(&mut self) -> &[T] {
        // SAFETY: ptr/len come from a Box<[T]> owned by self; `&mut self` proves no tensor
        // (which borrows `&self`) is alive to write concurrently.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The storage, writable, through `&mut self` so that no exported tensor is alive.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as in as_slice; T accepts any bit pattern written through the slice.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Gives the storage back.
    pub fn into_vec(self) -> Vec<T> {
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: rebuilds the Box<[T]> leaked in `new`; ManuallyDrop prevents a double free.
        let boxed =
            unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(me.ptr.as_ptr(), me.len)) };
        // SAFETY: read the layout out of the ManuallyDrop so its Vecs are freed (the lease is
        // a plain atomic integer: nothing to free).
        drop(unsafe { std::ptr::read(&me.layout) });
        boxed.into_vec()
    }

    fn storage_bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }
}

impl<T: AnyBits> Drop for Owned<T> {
    fn drop(&mut self) {
        // SAFETY: rebuilds the Box<[T]> leaked in `new`, once.
        drop(unsafe {
            Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.ptr.as_ptr(),
                self.len,
            ))
        });
    }
}

impl<T: AnyBits> Exporter for Owned<T> {
    fn dlpack_device(&self) -> Option<Device> {
        Some(self.layout.device)
    }

    /// Exports the storage; writable unless [`Owned::read_only`]. While a writable tensor is
    /// alive, every other export is refused ([`Error::Export`]), and a writable export is
    /// refused while any tensor is alive: two live tensors never alias writably.
    fn dlpack(&self, _request: &ExportRequest) -> Result<ManagedTensor<'_>> {
        // SAFETY: the layout was checked to stay inside the storage, which lives as long as
        // `&self`; the pointer comes from the owning Box, so writes through it are allowed;
        // the lease lives in `self`.
        unsafe { export_raw(self.ptr.as_ptr().cast(), &self.layout, Some(&self.lease)) }
    }
}

/// A writable exporter over a borrowed `&mut [T]` (1-d, or any shape that fits). Like
/// [`Owned`], it hands out one writable tensor or several read-only ones at a time.
pub struct SliceMut<'a, T: AnyBits> {
    ptr: NonNull<T>,
    len: usize,
    layout: ExportLayout,
    lease: Lease,
    _borrow: PhantomData<&'a mut [T]>,
}

// SAFETY: holds an exclusive borrow of [T], like &mut [T].
unsafe impl<T: AnyBits + Send> Send for SliceMut<'_, T> {}
// SAFETY: shared access only exports tensors, serialized by the atomic lease.
unsafe impl<T: AnyBits + Sync> Sync for SliceMut<'_, T> {}

impl<'a, T: AnyBits> SliceMut<'a, T> {
    /// Exports `data` as a writable 1-d tensor.
    pub fn new(data: &'a mut [T]) -> Self {
        let len = data.len();
        SliceMut {
            ptr: NonNull::new(data.as_mut_ptr()).unwrap_or(NonNull::dangling()),
            len,
            layout: ExportLayout::dense::<T>(len),
            lease: Lease::default(),
            _borrow: PhantomData,
        }
    }

    /// Exports with `shape` (compact row-major), which must fit in the slice.
    ///
    /// # Errors
    /// [`Error::LayoutOutsideStorage`] when the shape needs more elements than the slice
    /// has; [`Error::InvalidTensor`]/[`Error::Overflow`] for a bad shape.
    pub fn with_shape(mut self, shape: &[i64]) -> Result<Self> {
        let mut l = self.layout.clone();
        l.shape = shape.to_vec();
        l.strides = None;
        l.check_within(self.len * std::mem::size_of::<T>())?;
        self.layout = l;
        Ok(self)
    }
}

impl<T: AnyBits> Exporter for SliceMut<'_, T> {
    fn dlpack_device(&self) -> Option<Device> {
        Some(Device::CPU)
    }

    /// As [`Owned`]'s export: one writable tensor at a time.
    fn dlpack(&self, _request: &ExportRequest) -> Result<ManagedTensor<'_>> {
        // SAFETY: the pointer comes from the exclusive borrow held for 'a, outliving `&self`;
        // the layout was checked against the slice; the lease lives in `self`.
        unsafe { export_raw(self.ptr.as_ptr().cast(), &self.layout, Some(&self.lease)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::device_type;

    #[test]
    fn stream_table() {
        let sync = AcquireOptions::default();
        let unsync = AcquireOptions {
            stream: StreamPolicy::Unsynchronized,
            ..Default::default()
        };
        let cuda = Some(Device::new(device_type::CUDA, 0));
        let rocm = Some(Device::new(device_type::ROCM, 0));
        assert_eq!(sync.stream_for(Some(Device::CPU)), Ok(None));
        assert_eq!(
            sync.stream_for(Some(Device::new(device_type::CUDA_HOST, 0))),
            Ok(None)
        );
        assert_eq!(sync.stream_for(None), Ok(None));
        assert_eq!(sync.stream_for(cuda), Ok(Some(1)));
        assert_eq!(unsync.stream_for(cuda), Ok(Some(-1)));
        assert_eq!(sync.stream_for(rocm), Ok(Some(0)));
        assert_eq!(unsync.stream_for(rocm), Ok(Some(-1)));
        let zero = AcquireOptions {
            stream: StreamPolicy::Synchronize { stream: Some(0) },
            ..Default::default()
        };
        assert!(zero.stream_for(cuda).is_err());
        assert_eq!(zero.stream_for(rocm), Ok(Some(0)));
    }

    #[test]
    fn owned_round_trip() {
        let o = Owned::new(vec![1u16, 2, 3]);
        {
            let mut t = acquire(&o, &AcquireOptions::default()).unwrap();
            t.as_mut_slice::<u16>().unwrap()[1] = 7;
        }
        assert_eq!(o.into_vec(), vec![1, 7, 3]);
    }

    #[test]
    fn owned_layout_bounds() {
        assert!(Owned::new(vec![0f32; 6])
            .with_layout(&[3], Some(&[2]), 0)
            .is_ok());
        assert!(Owned::new(vec![0f32; 5])
            .with_layout(&[3], Some(&[2]), 4)
            .is_err());
        assert!(Owned::new(vec![0f32; 3])
            .with_layout(&[3], Some(&[-1]), 8)
            .is_ok());
        assert!(Owned::new(vec![0f32; 3])
            .with_layout(&[3], Some(&[-1]), 4)
            .is_err());
        assert!(Owned::new(vec![0f32; 3]).with_shape(&[2, 2]).is_err());
        assert!(Owned::new(vec![0u8; 5])
            .with_dtype(DType::new(2, 16))
            .is_err());
    }
}
