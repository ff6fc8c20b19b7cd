//! [`CudaExport`] (feature `cuda`): a DLPack producer over cudarc 0.19's device memory
//! (`CudaSlice<T>`, `CudaView<T>`, `CudaViewMut<T>`), built on the same export block,
//! [`Lease`] and [`ExportLayout`] as the host producers. Stream ordering goes through the
//! CUDA runtime ([`crate::runtime::cuda`]).

use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{sys, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr};

use super::producers::{export_foreign, ExportLayout, Lease};
use super::{ExportRequest, Exporter, ManagedTensor, FLAG_READ_ONLY};
use crate::device::{device_type, Device, CUDA_LEGACY_DEFAULT_STREAM, NO_SYNC_STREAM};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::runtime::cuda::wait_for_stream;

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
            None => CUDA_LEGACY_DEFAULT_STREAM,
            Some(s) => s,
        };
        wait_for_stream(&self.stream, target)
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
