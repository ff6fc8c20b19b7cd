//! The built-in producers: [`Owned`] (owned storage), [`SliceMut`] (a borrowed `&mut [T]`),
//! read-only exports of `[T]` and `Vec<T>`, and what they share: the export block whose
//! deleter frees it ([`ManagedTensor`] calls it), the [`Lease`] that keeps writable exports
//! exclusive, and the [`ExportLayout`] checked against the storage. The CUDA producer
//! (`cudarc.rs`, feature `cuda`) uses the same pieces for device memory.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicIsize, Ordering};

use super::{
    DLManagedTensorVersioned, DLPackVersion, DLTensor, ExportRequest, Exporter, ManagedTensor,
    FLAG_IS_COPIED, FLAG_READ_ONLY, MAJOR_VERSION, MINOR_VERSION,
};
use crate::device::Device;
use crate::dtype::{AnyBits, DType, Element};
use crate::error::{Error, Result};
use crate::layout;

/// Borrow state of an exporter's storage, so that the built-in writable exporters follow
/// Rust's rule even though `__dlpack__` takes `&self`: any number of read-only exports, or
/// one writable export, alive at a time. `0` = none, `n > 0` = `n` read-only, `-1` = one
/// writable. Atomic because a `ManagedTensor` may be dropped on another thread.
#[derive(Debug, Default)]
pub(super) struct Lease(AtomicIsize);

impl Lease {
    /// Takes the lease for one export (`writable` or read-only) of a tensor of `dtype` and
    /// `shape` (named by the refusal).
    fn take(&self, writable: bool, (dtype, shape): (DType, &[i64])) -> Result<()> {
        // `now` is -1 (one writable export) or the count of read-only exports: a negative
        // value reads as no readers.
        let busy = |now: isize| Error::StorageBusy {
            dtype,
            shape: shape.to_vec(),
            writable,
            readers: usize::try_from(now).unwrap_or(0),
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

/// What a producer wants done when one of its tensors is released, before the lease is
/// given back: `run(ctx, stream)` (the CUDA exporter records cudarc's read or write event
/// there, `dlpack/cudarc.rs`). `ctx` points into the exporter, which the tensor borrows;
/// `stream` is the consumer's stream value of the export request.
#[derive(Clone, Copy)]
#[cfg_attr(not(any(feature = "cuda", test)), allow(dead_code))]
pub(super) struct ReleaseHook {
    /// Called once, from the deleter; must not panic (it runs inside an `extern "C"` fn).
    pub(super) run: unsafe fn(NonNull<c_void>, isize),
    /// Handed to `run`.
    pub(super) ctx: NonNull<c_void>,
    /// Handed to `run`.
    pub(super) stream: isize,
}

/// The heap block behind every tensor the built-in exporters hand out: the versioned struct
/// first (so the deleter can cast back), then the arrays it points to, the lease it holds and
/// the hook to run on release.
#[repr(C)]
struct Exported {
    managed: DLManagedTensorVersioned,
    shape: Box<[i64]>,
    strides: Option<Box<[i64]>>,
    lease: Option<NonNull<Lease>>,
    release: Option<ReleaseHook>,
}

unsafe extern "C" fn delete_exported(p: *mut DLManagedTensorVersioned) {
    if !p.is_null() {
        // SAFETY: `p` is the first field of a Box<Exported> leaked by `export_raw`, and the
        // guard calls this exactly once.
        let block = unsafe { Box::from_raw(p.cast::<Exported>()) };
        if let Some(hook) = block.release {
            // SAFETY: `ctx` points into the exporter, which the tensor borrows (alive while
            // the tensor is dropped); the producer that made the hook vouches for `run`.
            unsafe { (hook.run)(hook.ctx, hook.stream) };
        }
        if let Some(lease) = block.lease {
            // SAFETY: the lease lives in the exporter, which the tensor borrows, so it is
            // still alive while the tensor is dropped.
            unsafe { lease.as_ref() }.give_back();
        }
    }
}

/// What a built-in exporter describes: dtype, shape, strides, byte offset, flags, device.
#[derive(Debug, Clone)]
pub(super) struct ExportLayout {
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
/// has `READ_ONLY`; `lease`, if given, must outlive the returned tensor; `release`, if given,
/// must be safe to run once with its `ctx` and `stream` whenever the tensor is released.
unsafe fn export_raw<'a>(
    data: *mut c_void,
    l: &ExportLayout,
    lease: Option<&Lease>,
    release: Option<ReleaseHook>,
) -> Result<ManagedTensor<'a>> {
    let ndim = i32::try_from(l.shape.len()).map_err(|_| Error::InvalidTensor {
        field: "ndim".into(),
        value: l.shape.len() as i128,
        reason: "more axes than DLPack's int32 ndim holds",
    })?;
    if let Some(lease) = lease {
        lease.take(l.flags & FLAG_READ_ONLY == 0, (l.dtype, &l.shape))?;
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
        release,
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
        unsafe { export_raw(self.as_ptr() as *mut c_void, &layout, None, None) }
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
/// valid for `'a` (writable unless `READ_ONLY`); `lease` outlives the tensor; `release` may
/// run once whenever the tensor is released.
#[cfg(feature = "cuda")]
pub(super) unsafe fn export_foreign<'a>(
    data: *mut c_void,
    storage_bytes: usize,
    layout: &ExportLayout,
    lease: Option<&Lease>,
    release: Option<ReleaseHook>,
) -> Result<ManagedTensor<'a>> {
    layout.check_within(storage_bytes)?;
    // SAFETY: caller's contract; the layout stays inside the storage.
    unsafe { export_raw(data, layout, lease, release) }
}

/// A length of storage that exists (elements, or its bytes / element size) as a DLPack
/// extent.
// Lossless: a Rust allocation holds at most isize::MAX bytes (std::alloc::Layout) and a CUDA
// allocation at most the device's memory, so a count of elements of at least one byte is
// below 2^63 and fits i64 on every target.
#[allow(clippy::cast_possible_wrap)]
fn storage_extent(len: usize) -> i64 {
    len as i64
}

impl ExportLayout {
    /// A 1-d tensor of `len` elements of `dtype` on `device`.
    #[cfg(feature = "cuda")]
    pub(super) fn new(dtype: DType, len: usize, flags: u64, device: Device) -> Self {
        ExportLayout {
            dtype,
            shape: vec![storage_extent(len)],
            strides: None,
            byte_offset: 0,
            flags,
            device,
        }
    }

    /// The device exported tensors are labelled with.
    #[cfg(feature = "cuda")]
    pub(super) fn device(&self) -> Device {
        self.device
    }

    /// The DLPack flags exported tensors carry.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(super) fn flags(&self) -> u64 {
        self.flags
    }

    /// Replaces shape, strides (elements) and byte offset, checked against the storage.
    #[cfg(feature = "cuda")]
    pub(super) fn reshaped(
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
            shape: vec![storage_extent(len)],
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
    /// Bytes from the storage's start to the exported `DLTensor::data`
    /// ([`Owned::with_layout_at`]; 0 otherwise), at most the storage's size.
    data_offset_bytes: usize,
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
            data_offset_bytes: 0,
            lease: Lease::default(),
        }
    }

    /// Exports with `shape` (elements, outermost first) and compact row-major strides.
    ///
    /// # Errors
    /// [`Error::LayoutOutsideStorage`] when the shape needs more bytes than the storage has;
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
        self,
        shape: &[i64],
        strides_elems: Option<&[i64]>,
        byte_offset_bytes: u64,
    ) -> Result<Self> {
        self.with_layout_at(0, shape, strides_elems, byte_offset_bytes)
    }

    /// As [`Owned::with_layout`], with `DLTensor::data` at `data_offset_bytes` past the
    /// storage's start instead of at the start (`byte_offset` and the strides then count
    /// from there): the export of a producer whose `data` points inside its allocation, as
    /// NumPy's does for a slice (its `data` is the first element, `byte_offset` 0). DLPack
    /// asks for a 256-byte aligned `data` and an offset in `byte_offset`, and notes that
    /// producers do not all do so (dlpack.h, `DLTensor::data`): neither `data` nor the first
    /// element need be aligned here, for any dtype (the library's own kernels copy bytes;
    /// [`Tensor::as_slice`](super::Tensor::as_slice) refuses a misaligned one,
    /// [`Error::Misaligned`]). Every element must lie inside the storage between `data` and
    /// its end.
    ///
    /// # Errors
    /// As [`Owned::with_layout`]; [`Error::LayoutOutsideStorage`] also when
    /// `data_offset_bytes` is past the storage's end.
    ///
    /// # Examples
    /// ```
    /// use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned, Tensor};
    /// use dlpack_mpi::dtype::{code, DType};
    /// // Three float32 elements from 1 byte past the start of 16 bytes of storage.
    /// let mut owned = Owned::new(vec![0u8; 16])
    ///     .with_dtype(DType::new(code::FLOAT, 32))?
    ///     .with_layout_at(1, &[3], None, 0)?;
    /// let start = owned.as_slice().as_ptr() as usize;
    /// let t = acquire(&owned, &AcquireOptions::default())?;
    /// assert_eq!((t.data_ptr() as usize, t.byte_offset_bytes()), (start + 1, 0));
    /// assert_eq!(t.num_elements(), 3);
    /// # Ok::<(), dlpack_mpi::Error>(())
    /// ```
    pub fn with_layout_at(
        mut self,
        data_offset_bytes: usize,
        shape: &[i64],
        strides_elems: Option<&[i64]>,
        byte_offset_bytes: u64,
    ) -> Result<Self> {
        let storage = self.storage_bytes();
        let Some(after) = storage.checked_sub(data_offset_bytes) else {
            return Err(Error::LayoutOutsideStorage {
                first_byte: data_offset_bytes as i128,
                end_byte: data_offset_bytes as i128,
                storage_bytes: storage as u64,
            });
        };
        let mut l = self.layout.clone();
        l.shape = shape.to_vec();
        l.strides = strides_elems.map(<[i64]>::to_vec);
        l.byte_offset = byte_offset_bytes;
        l.check_within(after)?;
        self.layout = l;
        self.data_offset_bytes = data_offset_bytes;
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
        self.layout.shape = vec![storage_extent(bytes / elem)];
        self.layout.strides = None;
        self.layout.byte_offset = 0;
        self.data_offset_bytes = 0;
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
    /// alive, every other export is refused ([`Error::StorageBusy`]), and a writable export is
    /// refused while any tensor is alive: two live tensors never alias writably.
    fn dlpack(&self, _request: &ExportRequest) -> Result<ManagedTensor<'_>> {
        // `data_offset_bytes` is at most the storage's size (`with_layout_at`): the pointer
        // stays inside the allocation or one past its end, and keeps its provenance.
        let data = self
            .ptr
            .as_ptr()
            .cast::<u8>()
            .wrapping_add(self.data_offset_bytes);
        // SAFETY: the layout was checked to stay inside the storage from `data` on, which
        // lives as long as `&self`; the pointer comes from the owning Box, so writes through
        // it are allowed; the lease lives in `self`.
        unsafe { export_raw(data.cast(), &self.layout, Some(&self.lease), None) }
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
        unsafe {
            export_raw(
                self.ptr.as_ptr().cast(),
                &self.layout,
                Some(&self.lease),
                None,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dlpack::{acquire, AcquireOptions, Tensor};

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

    /// `with_layout_at` exports `data` that many bytes into the storage (any byte, for any
    /// dtype), counts `byte_offset` and the layout from there, keeps every element inside
    /// the storage, and `with_dtype` puts `data` back at the start.
    #[test]
    fn owned_layout_at_shifts_the_data_pointer() {
        let f32s = DType::new(crate::dtype::code::FLOAT, 32);
        let mut o = Owned::new(vec![0u8; 16])
            .with_dtype(f32s)
            .unwrap()
            .with_layout_at(3, &[2], Some(&[-1]), 4)
            .unwrap();
        let start = o.as_slice().as_ptr() as usize;
        {
            let t = acquire(&o, &AcquireOptions::default()).unwrap();
            assert_eq!(t.data_ptr() as usize, start + 3);
            assert_eq!(t.first_element_ptr() as usize, start + 7);
            assert_eq!((t.byte_offset_bytes(), t.num_elements()), (4, 2));
        }
        let mut o = o.with_layout_at(3, &[2], None, 0).unwrap();
        let at = o.as_slice().as_ptr() as usize + 3;
        {
            // Typed access refuses a misaligned first element; it is never read as f32.
            let t = acquire(&o, &AcquireOptions::default()).unwrap();
            match t.as_slice::<f32>() {
                Err(Error::Misaligned { address, align: 4 }) => assert_eq!(address, at),
                other => assert!(at % 4 == 0 && other.is_ok(), "{other:?}"),
            }
        }
        // 12 bytes from 3 (byte 15 is the last) fit; 13 do not, nor anything past the end.
        let o = o.with_layout_at(3, &[3], None, 0).unwrap();
        let o = o.with_layout_at(4, &[3], None, 0).unwrap();
        let err = o.with_layout_at(5, &[3], None, 0).err();
        assert!(
            matches!(err, Some(Error::LayoutOutsideStorage { .. })),
            "{err:?}"
        );
        let past = Owned::new(vec![0u8; 4]).with_layout_at(5, &[0], None, 0);
        assert!(matches!(past, Err(Error::LayoutOutsideStorage { .. })));
        let end = Owned::new(vec![0u8; 4])
            .with_layout_at(4, &[0], None, 0)
            .unwrap();
        {
            let t = acquire(&end, &AcquireOptions::default()).unwrap();
            assert_eq!(t.num_elements(), 0);
        }
        let mut back = end
            .with_dtype(DType::new(crate::dtype::code::UINT, 8))
            .unwrap();
        let start = back.as_slice().as_ptr() as usize;
        let t = acquire(&back, &AcquireOptions::default()).unwrap();
        assert_eq!((t.data_ptr() as usize, t.num_elements()), (start, 4));
    }

    /// A refused lease says which export was refused and what holds the storage: readers
    /// shut out a writer, a writer shuts out everyone.
    #[test]
    fn busy_lease_names_the_refused_export_and_the_holders() {
        let lease = Lease::default();
        let f32 = DType::new(crate::dtype::code::FLOAT, 32);
        let what = (f32, &[512i64, 1000][..]);
        let busy = |writable, readers| Error::StorageBusy {
            dtype: f32,
            shape: vec![512, 1000],
            writable,
            readers,
        };
        lease.take(false, what).unwrap();
        lease.take(false, what).unwrap();
        assert_eq!(lease.take(true, what), Err(busy(true, 2)));
        lease.give_back();
        lease.give_back();
        lease.take(true, what).unwrap();
        for writable in [true, false] {
            let err = lease.take(writable, what).unwrap_err();
            assert_eq!(err, busy(writable, 0));
            let text = err.to_string();
            assert!(text.contains("(writable)"), "{text}");
            assert!(
                text.contains("float32 tensor of shape [512, 1000]"),
                "{text}"
            );
        }
        lease.give_back();
        lease.take(true, what).unwrap();
    }

    /// The release hook runs once per tensor, when it is dropped, with the request's stream,
    /// while the lease is still held (the CUDA exporter's event is recorded before another
    /// export can begin).
    #[test]
    fn release_hook_runs_once_on_drop_before_the_lease_is_returned() {
        struct Seen {
            lease: Lease,
            calls: std::sync::Mutex<Vec<(isize, isize)>>,
        }
        /// # Safety
        /// `ctx` points to a live `Seen`.
        unsafe fn record(ctx: NonNull<c_void>, stream: isize) {
            // SAFETY: the caller's contract.
            let seen = unsafe { ctx.cast::<Seen>().as_ref() };
            let held = seen.lease.0.load(Ordering::Acquire);
            seen.calls.lock().unwrap().push((stream, held));
        }
        let data = [1.0f32, 2.0];
        let seen = Seen {
            lease: Lease::default(),
            calls: std::sync::Mutex::new(Vec::new()),
        };
        let layout = ExportLayout {
            flags: FLAG_READ_ONLY,
            ..ExportLayout::dense::<f32>(2)
        };
        let hook = ReleaseHook {
            run: record,
            ctx: NonNull::from(&seen).cast(),
            stream: 0x5100,
        };
        // SAFETY: `data` and `seen` outlive the tensor; READ_ONLY; `record` reads a `Seen`.
        let t = unsafe {
            export_raw(
                data.as_ptr() as *mut c_void,
                &layout,
                Some(&seen.lease),
                Some(hook),
            )
        }
        .unwrap();
        assert!(seen.calls.lock().unwrap().is_empty());
        drop(t);
        assert_eq!(*seen.calls.lock().unwrap(), [(0x5100, 1)]);
        assert_eq!(seen.lease.0.load(Ordering::Acquire), 0);
    }
}
