//! [`CudaExport`] (feature `cuda`): a DLPack producer over cudarc 0.19's device memory
//! (`CudaSlice<T>`, `CudaView<T>`, `CudaViewMut<T>`), built on the same export block,
//! [`Lease`] and [`ExportLayout`] as the host producers. Stream ordering goes through the
//! CUDA runtime ([`crate::runtime::cuda`]).

use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::{sys, CudaEvent, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, SyncOnDrop};

use super::producers::{export_foreign, ExportLayout, Lease, ReleaseHook};
use super::{ExportRequest, Exporter, ManagedTensor, FLAG_READ_ONLY};
use crate::device::{device_type, Device, CUDA_LEGACY_DEFAULT_STREAM, NO_SYNC_STREAM};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::runtime::cuda::{cu_stream, keeping_current_context, wait_for_stream};

/// A DLPack exporter over cudarc device memory (`CudaSlice<T>`, `CudaView<T>`,
/// `CudaViewMut<T>`): a 1-d tensor of `len` elements of `T::DTYPE` on `(kDLCUDA, ordinal)`,
/// or any shape/strides that fit ([`CudaExport::with_layout`]).
///
/// **Streams** (array API `__dlpack__`): on each export it records an event on the slice's
/// own stream and makes the stream the consumer asked for wait on it — `None` and `1` the
/// legacy default stream, `2` the per-thread default stream, a handle that stream; `-1`
/// orders nothing; `0` is refused. The memory stays cudarc's: the tensor's deleter frees
/// only the shape arrays.
///
/// **cudarc's event tracking** (a context with several streams and event tracking on, the
/// cudarc default) stays true for the whole time MPI uses the memory:
///
/// - [`CudaExport::new`] takes the slice as a read (`DevicePtr::device_ptr`), which makes the
///   slice's stream wait for its last write; [`CudaExport::new_mut`] takes it as a write
///   (`DevicePtrMut::device_ptr_mut`), which waits for its last reads and write. Each export
///   then orders the consumer's stream after the slice's stream, so the consumer (the staging
///   copies, or a CUDA-aware MPI) sees those accesses complete.
/// - cudarc's read event (for `new`) or write event (for `new_mut`) is recorded when each
///   exported tensor is *released* — when its deleter runs, i.e. after MPI is done with it
///   (a blocking call returned, a request completed) — on the consumer's stream (the
///   request's stream; the slice's own stream for `-1`), not when the export is made. A
///   cudarc kernel launched later on any stream of the context, through `device_ptr_mut`
///   (after a read export) or `device_ptr`/`device_ptr_mut` (after a write export), waits for
///   that event, so it is ordered after everything the consumer queued on its stream before
///   releasing the tensor: it cannot overtake the MPI transfer. While the exporter lives,
///   Rust's borrow of the slice keeps cudarc from writing it (or, for `new_mut`, touching it)
///   at all.
///
/// What is not covered: a consumer that passed `-1` and used the memory on a stream of its
/// own must finish that work before releasing the tensor (DLPack's rule for `-1`); the
/// stream a consumer named must still be valid when it releases the tensor (the transport's
/// streams live for the process); with two tensors of one read export alive at once on
/// different streams, the release recorded last is the one cudarc waits for (cudarc keeps
/// one read event per slice). Without event tracking (one stream, or
/// `disable_event_tracking`), cudarc records nothing and neither does this exporter;
/// ordering is then the user's, as everywhere in cudarc.
pub struct CudaExport<'a, T> {
    ptr: sys::CUdeviceptr,
    storage_bytes: usize,
    tracking: Tracking,
    layout: ExportLayout,
    lease: Lease,
    _borrow: PhantomData<&'a T>,
}

/// What a release records: cudarc's read or write event of the slice, and the slice's
/// stream. The release hook's `ctx` points here.
struct Tracking {
    /// The event inside the slice (`CudaSlice::read`/`write`, or the view's), `None` when
    /// cudarc tracks no events for it. Valid while the exporter lives: the slice it lives in
    /// is borrowed by the exporter for `'a`.
    event: Option<NonNull<CudaEvent>>,
    /// The slice's stream (also keeps the `CudaStream` alive).
    stream: Arc<CudaStream>,
}

// SAFETY: `CudaEvent` is `Send + Sync` (cudarc: its methods are thread safe); the pointer is
// only ever read as a shared reference, while the slice that holds the event is borrowed.
unsafe impl Send for Tracking {}
// SAFETY: as above.
unsafe impl Sync for Tracking {}

/// Takes the event out of cudarc's guard so that dropping the guard records nothing now.
/// A `Sync` guard (not produced for device memory) is dropped, i.e. synchronizes as cudarc
/// intends.
fn defuse<'g>(mut guard: SyncOnDrop<'g>) -> Option<&'g CudaEvent> {
    match &mut guard {
        SyncOnDrop::Record(target) => target.take().map(|(event, _)| event),
        SyncOnDrop::Sync(_) => None,
    }
}

impl Tracking {
    /// Records the event on the consumer's `stream` (the slice's own for `-1`), through
    /// cudarc's own guard: only when cudarc manages stream synchronization in the context,
    /// an error is kept in the context's error slot (nothing panics), and the calling
    /// thread's current context is left as it was.
    fn record_release(&self, stream: isize) {
        let Some(event) = self.event else { return };
        // SAFETY: the event lives in the slice the exporter borrows, and the exporter
        // outlives every tensor it hands out (the tensor borrows it).
        let event = unsafe { event.as_ref() };
        keeping_current_context(|| {
            let on = if stream == NO_SYNC_STREAM {
                self.stream.clone()
            } else {
                // SAFETY: the consumer's stream value of this export, a stream of the slice's
                // device (DLPack `__dlpack__`), which the consumer keeps valid while it uses
                // the tensor, i.e. until this release; the wrapper borrows it and destroys
                // nothing when dropped below.
                unsafe { event.context().wrap_borrowed_stream(cu_stream(stream)) }
            };
            drop(SyncOnDrop::Record(Some((event, &*on))));
        });
    }
}

/// The release hook of [`CudaExport`]'s tensors.
///
/// # Safety
/// `ctx` points to the `Tracking` of a live exporter.
unsafe fn record_on_release(ctx: NonNull<c_void>, stream: isize) {
    // SAFETY: the caller's contract.
    let tracking: &Tracking = unsafe { ctx.cast().as_ref() };
    tracking.record_release(stream);
}

impl<'a, T: Element + DeviceRepr> CudaExport<'a, T> {
    /// A read-only export (`READ_ONLY` flag) of `slice`: a cudarc read, recorded when each
    /// tensor is released (type docs).
    pub fn new<S: DevicePtr<T>>(slice: &'a S) -> Self {
        let stream = slice.stream().clone();
        let (ptr, guard) = slice.device_ptr(&stream);
        let event = defuse(guard).map(NonNull::from);
        Self::make(ptr, slice.len(), stream, event, FLAG_READ_ONLY)
    }

    /// A writable export of `slice` (one writable tensor at a time): a cudarc write,
    /// recorded when each tensor is released (type docs).
    pub fn new_mut<S: DevicePtrMut<T>>(slice: &'a mut S) -> Self {
        let stream = slice.stream().clone();
        let len = slice.len();
        let (ptr, guard) = slice.device_ptr_mut(&stream);
        let event = defuse(guard).map(NonNull::from);
        Self::make(ptr, len, stream, event, 0)
    }

    fn make(
        ptr: sys::CUdeviceptr,
        len: usize,
        stream: Arc<CudaStream>,
        event: Option<NonNull<CudaEvent>>,
        flags: u64,
    ) -> Self {
        // cudarc opened this device as `cuDeviceGet(ordinal as i32)` (CudaContext::new), so
        // the same conversion names the device the context is on; a context exists only for
        // an ordinal that conversion accepted.
        #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
        let ordinal = stream.context().ordinal() as i32;
        CudaExport {
            ptr,
            storage_bytes: len * std::mem::size_of::<T>(),
            tracking: Tracking { event, stream },
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

    /// The consumer's stream value for `stream` (`None` → the legacy default stream), after
    /// making it wait for the work queued on the slice's stream.
    fn order_before(&self, stream: Option<isize>) -> Result<isize> {
        let target = match stream {
            Some(NO_SYNC_STREAM) => return Ok(NO_SYNC_STREAM),
            Some(0) => {
                return Err(Error::UnsupportedDevice {
                    device_type: device_type::CUDA,
                    device_id: self.layout.device().device_id,
                    reason: "CUDA stream 0 is disallowed by DLPack (ambiguous); use 1 or 2",
                })
            }
            None => CUDA_LEGACY_DEFAULT_STREAM,
            Some(s) => s,
        };
        wait_for_stream(&self.tracking.stream, target)?;
        Ok(target)
    }
}

impl<T: Element + DeviceRepr> Exporter for CudaExport<'_, T> {
    fn dlpack_device(&self) -> Option<Device> {
        Some(self.layout.device())
    }

    fn dlpack(&self, request: &ExportRequest) -> Result<ManagedTensor<'_>> {
        // CUdeviceptr is 64 bits; DLTensor::data is a host pointer.
        let address = usize::try_from(self.ptr).map_err(|_| {
            let device = self.layout.device();
            Error::UnsupportedDevice {
                device_type: device.device_type,
                device_id: device.device_id,
                reason: "the CUDA device pointer does not fit this host's pointers",
            }
        })?;
        let consumer = self.order_before(request.stream)?;
        let release = ReleaseHook {
            run: record_on_release,
            ctx: NonNull::from(&self.tracking).cast(),
            stream: consumer,
        };
        // SAFETY: the device memory is borrowed from cudarc for 'a (outliving `&self`),
        // writable only for `new_mut`; the layout is checked against the storage; the lease
        // and the tracking the hook reads live in `self`, which the tensor borrows.
        unsafe {
            export_foreign(
                address as *mut c_void,
                self.storage_bytes,
                &self.layout,
                Some(&self.lease),
                Some(release),
            )
        }
    }
}
