//! Import and ownership of DLPack tensors.
//!
//! [`ManagedTensor`] is the owning guard over a producer's `DLManagedTensor` (legacy) or
//! `DLManagedTensorVersioned`. It trusts the producer for exactly two things: that the
//! struct and the arrays it points to stay valid until the deleter runs, and that the deleter
//! releases them. Everything else (version, `ndim`, extents, `data`, `byte_offset`, counts) is
//! checked. This module is the only code in the crate that calls a DLPack deleter, and it
//! calls it exactly once: on drop, or on the error path of an import that fails validation
//! (the guard owns the tensor *before* it validates, CASES C11). A NULL deleter is never
//! called (C10).
//!
//! [`TensorView`] is the non-owning counterpart for a borrowed `DLTensor*` whose owner stays
//! the caller. Both implement [`Tensor`], the read-only accessors every spec is built from.
//!
//! The producer protocol ([`Exporter`], [`acquire`]) and the built-in exporters live in
//! a private submodule and are re-exported here.

use std::ffi::c_void;
use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;

pub use dlpack_rs::ffi::{
    DLDataType, DLDevice, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor,
};

use crate::device::Device;
use crate::dtype::{AnyBits, DType};
use crate::error::{Error, Result};
use crate::layout;

mod export;
#[cfg(feature = "python")]
pub(crate) use export::check_acquired;
pub use export::{
    acquire, AcquireOptions, DeviceQuery, ExportRequest, Exporter, Owned, SliceMut, StreamPolicy,
    CUDA_LEGACY_DEFAULT_STREAM, CUDA_PER_THREAD_DEFAULT_STREAM, NO_SYNC_STREAM,
    ROCM_DEFAULT_STREAM,
};

/// The DLPack major version this consumer reads (`DLPACK_MAJOR_VERSION`).
pub const MAJOR_VERSION: u32 = 1;
/// The DLPack minor version this crate's header copy has (`DLPACK_MINOR_VERSION`).
pub const MINOR_VERSION: u32 = dlpack_rs::ffi::DLPACK_MINOR_VERSION;
/// `DLPACK_FLAG_BITMASK_READ_ONLY`: the tensor must not be written.
pub const FLAG_READ_ONLY: u64 = 1;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`: the producer made a copy for this export; writes are not
/// seen by the producer's original.
pub const FLAG_IS_COPIED: u64 = 2;

mod sealed {
    pub trait Sealed {}
}

/// A validated `DLTensor`: what the specs are built from. Implemented by [`ManagedTensor`]
/// (owning) and [`TensorView`] (borrowed); sealed, because the accessors rely on the
/// validation their constructors perform (non-negative `ndim`, a readable `shape` of `ndim`
/// entries, a non-overflowing element count, non-NULL `data` for a non-empty tensor,
/// `data + byte_offset` inside the address space).
pub trait Tensor: sealed::Sealed {
    /// The underlying `DLTensor`.
    fn dl_tensor(&self) -> &DLTensor;

    /// `DLManagedTensorVersioned::flags` (0 for legacy tensors and views).
    fn flags(&self) -> u64;

    /// Number of dimensions (`DLTensor::ndim`, ≥ 0).
    #[inline]
    fn ndim(&self) -> usize {
        usize::try_from(self.dl_tensor().ndim).unwrap_or(0)
    }

    /// Extents, outermost first, in elements. Empty for a 0-d tensor.
    #[inline]
    fn shape(&self) -> &[i64] {
        let t = self.dl_tensor();
        let n = self.ndim();
        if n == 0 || t.shape.is_null() {
            return &[];
        }
        // SAFETY: the constructor checked `shape` is non-NULL for ndim > 0, and the producer's
        // contract (or the view's) says it points to `ndim` values that live as long as the
        // tensor, which `&self` borrows.
        unsafe { std::slice::from_raw_parts(t.shape, n) }
    }

    /// Strides in **elements**, outermost first; `None` when the producer gave NULL (compact
    /// row-major, allowed before DLPack v1.2) or for a 0-d tensor.
    #[inline]
    fn strides_elems(&self) -> Option<&[i64]> {
        let t = self.dl_tensor();
        let n = self.ndim();
        if n == 0 || t.strides.is_null() {
            return None;
        }
        // SAFETY: non-NULL strides point to `ndim` values by DLPack's contract, alive as long
        // as the tensor.
        Some(unsafe { std::slice::from_raw_parts(t.strides, n) })
    }

    /// The element type.
    #[inline]
    fn dtype(&self) -> DType {
        self.dl_tensor().dtype.into()
    }

    /// The device the bytes live on.
    #[inline]
    fn device(&self) -> Device {
        self.dl_tensor().device.into()
    }

    /// `DLTensor::byte_offset`, in bytes from `data` to the first element.
    fn byte_offset_bytes(&self) -> u64 {
        self.dl_tensor().byte_offset
    }

    /// `DLTensor::data` as given (the first element is at `data + byte_offset`).
    fn data_ptr(&self) -> *mut c_void {
        self.dl_tensor().data
    }

    /// Address of the first element (`data + byte_offset`), or NULL for a NULL `data`
    /// (only allowed for empty tensors).
    #[inline]
    fn first_element_ptr(&self) -> *mut c_void {
        let t = self.dl_tensor();
        if t.data.is_null() {
            return std::ptr::null_mut();
        }
        // The constructor checked that data + byte_offset does not overflow, so the cast is
        // lossless; wrapping_add keeps the pointer's provenance.
        t.data
            .cast::<u8>()
            .wrapping_add(t.byte_offset as usize)
            .cast()
    }

    /// Number of elements (product of the extents; 1 for 0-d, 0 for empty).
    #[inline]
    fn num_elements(&self) -> i64 {
        layout::num_elements(self.shape()).unwrap_or(0)
    }

    /// Whether `READ_ONLY` is set.
    #[inline]
    fn is_read_only(&self) -> bool {
        self.flags() & FLAG_READ_ONLY != 0
    }

    /// Whether `IS_COPIED` is set.
    #[inline]
    fn is_copied(&self) -> bool {
        self.flags() & FLAG_IS_COPIED != 0
    }

    /// The elements as a slice, for a C-contiguous host tensor of dtype `T::DTYPE` whose
    /// first element is aligned for `T` (DLPack does not promise alignment).
    ///
    /// `T` must accept every bit pattern ([`AnyBits`]): the bytes come from a foreign
    /// producer or an MPI peer. Read booleans as `u8` (allowed for the bool dtype).
    ///
    /// # Errors
    /// [`Error::DtypeMismatch`] if the dtype is not `T`'s; [`Error::UnsupportedDevice`] for
    /// non-host memory; [`Error::NonContiguous`] for strided layouts; [`Error::Misaligned`];
    /// [`Error::Overflow`] when the span does not fit the address space.
    fn as_slice<T: AnyBits>(&self) -> Result<&[T]>
    where
        Self: Sized,
    {
        let (ptr, n) = checked_host_elements::<T, Self>(self)?;
        if n == 0 {
            return Ok(&[]);
        }
        // SAFETY: checked: host memory, contiguous, dtype of size_of::<T>, aligned, n
        // elements from the first one within isize::MAX bytes; the producer keeps them alive
        // and unwritten while `self` is borrowed (the constructors' contracts).
        Ok(unsafe { std::slice::from_raw_parts(ptr.cast::<T>(), n) })
    }

    /// The elements as a mutable slice (same checks as [`Tensor::as_slice`], and the tensor
    /// must not be `READ_ONLY`).
    ///
    /// # Errors
    /// As [`Tensor::as_slice`], plus [`Error::ReadOnly`].
    fn as_mut_slice<T: AnyBits>(&mut self) -> Result<&mut [T]>
    where
        Self: Sized,
    {
        if self.is_read_only() {
            return Err(Error::ReadOnly);
        }
        let (ptr, n) = checked_host_elements::<T, Self>(self)?;
        if n == 0 {
            return Ok(&mut []);
        }
        // SAFETY: as in as_slice; `&mut self` makes this the only access through the tensor,
        // the constructors' contracts exclude other writers and readers while it is used
        // mutably, and T accepts every bit pattern.
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr.cast::<T>(), n) })
    }
}

fn checked_host_elements<T: AnyBits, S: Tensor>(t: &S) -> Result<(*mut c_void, usize)> {
    // Booleans are read as their bytes (u8): any byte may arrive, and not every byte is a
    // valid Rust bool.
    let bool_as_bytes = t.dtype() == DType::new(crate::dtype::code::BOOL, 8)
        && T::DTYPE == DType::new(crate::dtype::code::UINT, 8);
    if t.dtype() != T::DTYPE && !bool_as_bytes {
        return Err(Error::DtypeMismatch {
            what: "tensor vs requested element type",
            left: t.dtype(),
            right: T::DTYPE,
        });
    }
    t.device().check_host_accessible()?;
    layout::check_c_contiguous(t.shape(), t.strides_elems())?;
    let n = t.num_elements();
    let span = layout::byte_span(n, std::mem::size_of::<T>())?;
    let ptr = t.first_element_ptr();
    if n == 0 {
        return Ok((ptr, 0));
    }
    let address = ptr as usize;
    if address % std::mem::align_of::<T>() != 0 {
        return Err(Error::Misaligned {
            address,
            align: std::mem::align_of::<T>(),
        });
    }
    if span > isize::MAX as usize || address.checked_add(span).is_none() {
        return Err(Error::Overflow {
            quantity: "first element + byte span",
            lhs: address as i128,
            operator: "+",
            rhs: span as i128,
        });
    }
    Ok((ptr, n as usize))
}

/// Checks the fields of a `DLTensor` that every consumer relies on.
///
/// # Safety
/// `t.shape` must be NULL or point to `t.ndim` readable `i64` (when `t.ndim > 0`), and
/// `t.strides` likewise.
unsafe fn validate(t: &DLTensor) -> Result<()> {
    if t.ndim < 0 {
        return Err(Error::InvalidTensor {
            field: "ndim".into(),
            value: t.ndim.into(),
            reason: "ndim must be >= 0",
        });
    }
    let ndim = t.ndim as usize;
    let shape: &[i64] = if ndim == 0 {
        &[]
    } else if t.shape.is_null() {
        return Err(Error::InvalidTensor {
            field: "shape".into(),
            value: 0,
            reason: "shape is NULL but ndim > 0",
        });
    } else {
        // SAFETY: caller's contract: shape points to ndim readable values.
        unsafe { std::slice::from_raw_parts(t.shape, ndim) }
    };
    let n = layout::num_elements(shape)?;
    if t.data.is_null() {
        if n != 0 {
            return Err(Error::InvalidTensor {
                field: "data".into(),
                value: 0,
                reason: "data is NULL but the tensor has elements",
            });
        }
    } else {
        let base = t.data as usize as u128;
        let end = base + u128::from(t.byte_offset);
        if end > usize::MAX as u128 {
            return Err(Error::Overflow {
                quantity: "data + byte_offset",
                lhs: base as i128,
                operator: "+",
                rhs: t.byte_offset.into(),
            });
        }
    }
    if t.dtype.lanes == 0 {
        return Err(Error::InvalidTensor {
            field: "dtype.lanes".into(),
            value: 0,
            reason: "lanes must be >= 1",
        });
    }
    Ok(())
}

enum Owner {
    Legacy(NonNull<DLManagedTensor>),
    Versioned(NonNull<DLManagedTensorVersioned>),
}

/// An owned DLPack tensor: the guard that calls the producer's deleter exactly once.
///
/// It trusts the producer only for ownership and destruction (the struct stays valid until
/// the deleter runs; the deleter frees it); all fields are validated on import. The lifetime
/// `'a` is the longest the data may be used: `'static`-like for tensors from C, the borrow of
/// the exporter for the built-in Rust exporters. Specs ([`crate::spec`]) borrow the guard, so
/// no MPI request can outlive it and the deleter always runs after MPI is done.
///
/// # Examples
/// ```
/// use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned, Tensor};
/// let owned = Owned::new(vec![1i32, 2, 3]);
/// let t = acquire(&owned, &AcquireOptions::default())?;
/// assert_eq!(t.shape(), &[3]);
/// assert_eq!(t.as_slice::<i32>()?, &[1, 2, 3]);
/// # Ok::<(), dlpack_mpi::Error>(())
/// ```
pub struct ManagedTensor<'a> {
    owner: Owner,
    release: Option<ReleaseContext>,
    _data: PhantomData<&'a mut [u8]>,
}

/// Runs the deleter call it is given inside whatever context the producer's deleter needs
/// (the Python module takes the GIL). It must call the closure at most once; not calling
/// it leaks the tensor (the only sound choice when that context is gone, e.g. after the
/// Python interpreter has been finalized).
pub(crate) type ReleaseContext = fn(&mut dyn FnMut());

// SAFETY: the guard is the unique owner of the managed tensor; DLPack deleters may be called
// from any thread (dlpack.h places no thread affinity on them; Python capsule deleters that
// need the GIL take it themselves).
unsafe impl Send for ManagedTensor<'_> {}

impl<'a> ManagedTensor<'a> {
    /// Takes ownership of a legacy `DLManagedTensor*` and validates it.
    ///
    /// There is no version field in the legacy struct; its kind is given by the caller and
    /// never guessed (C02).
    ///
    /// # Safety
    /// `ptr` must be NULL or point to a valid `DLManagedTensor` whose ownership passes to the
    /// returned guard (nobody else calls its deleter); its `shape` and `strides` (when
    /// non-NULL) must point to `ndim` values; `data`, when the tensor is used, must be valid
    /// for the bytes its shape, strides, dtype and `byte_offset` describe, for `'a`. While
    /// the guard lives nothing else writes those bytes, and while it is used as a receive
    /// buffer (or through `as_mut_slice`) nothing else reads them either: the producer lends
    /// the tensor to this consumer, as DLPack intends.
    ///
    /// # Errors
    /// [`Error::NullPointer`] for a NULL `ptr`; any validation error of [`Tensor`] (the
    /// deleter has then been called).
    pub unsafe fn from_raw_legacy(ptr: *mut DLManagedTensor) -> Result<Self> {
        // SAFETY: the caller's contract.
        unsafe { Self::from_raw_legacy_in(ptr, None) }
    }

    /// [`ManagedTensor::from_raw_legacy`] whose deleter (also on the error path) runs inside
    /// `release`.
    ///
    /// # Safety
    /// As [`ManagedTensor::from_raw_legacy`].
    pub(crate) unsafe fn from_raw_legacy_in(
        ptr: *mut DLManagedTensor,
        release: Option<ReleaseContext>,
    ) -> Result<Self> {
        let ptr = NonNull::new(ptr).ok_or(Error::NullPointer {
            field: "DLManagedTensor*",
        })?;
        let guard = ManagedTensor {
            owner: Owner::Legacy(ptr),
            release,
            _data: PhantomData,
        };
        // SAFETY: caller's contract on shape and strides.
        unsafe { validate(guard.dl_tensor()) }?;
        Ok(guard)
    }

    /// Takes ownership of a `DLManagedTensorVersioned*`, checks its version, and validates
    /// it.
    ///
    /// # Safety
    /// As [`ManagedTensor::from_raw_legacy`], for the versioned struct. When the major
    /// version is not 1 only `version` and `deleter` are read (dlpack.h: the consumer "must
    /// call the deleter ... It is not safe to access any other fields").
    ///
    /// # Errors
    /// [`Error::NullPointer`]; [`Error::UnsupportedVersion`] when `version.major != 1`;
    /// validation errors. In every error case but NULL the deleter has been called.
    pub unsafe fn from_raw_versioned(ptr: *mut DLManagedTensorVersioned) -> Result<Self> {
        // SAFETY: the caller's contract.
        unsafe { Self::from_raw_versioned_in(ptr, None) }
    }

    /// [`ManagedTensor::from_raw_versioned`] whose deleter (also on the error paths) runs
    /// inside `release`.
    ///
    /// # Safety
    /// As [`ManagedTensor::from_raw_versioned`].
    pub(crate) unsafe fn from_raw_versioned_in(
        ptr: *mut DLManagedTensorVersioned,
        release: Option<ReleaseContext>,
    ) -> Result<Self> {
        let ptr = NonNull::new(ptr).ok_or(Error::NullPointer {
            field: "DLManagedTensorVersioned*",
        })?;
        let guard = ManagedTensor {
            owner: Owner::Versioned(ptr),
            release,
            _data: PhantomData,
        };
        // SAFETY: the caller's contract makes the struct readable; the version comes first
        // and is stable across every DLPack ABI.
        let version = unsafe { (*ptr.as_ptr()).version };
        if version.major != MAJOR_VERSION {
            // Dropping the guard calls the deleter, whose offset is stable across versions.
            drop(guard);
            return Err(Error::UnsupportedVersion {
                major: version.major,
                minor: version.minor,
            });
        }
        // SAFETY: caller's contract on shape and strides.
        unsafe { validate(guard.dl_tensor()) }?;
        Ok(guard)
    }

    /// `(major, minor)` of a versioned tensor; `None` for a legacy one.
    pub fn version(&self) -> Option<(u32, u32)> {
        match self.owner {
            Owner::Legacy(_) => None,
            Owner::Versioned(p) => {
                // SAFETY: the guard owns a valid struct until drop.
                let v = unsafe { (*p.as_ptr()).version };
                Some((v.major, v.minor))
            }
        }
    }

    /// Whether the producer handed a `DLManagedTensorVersioned` (as opposed to legacy).
    pub fn is_versioned(&self) -> bool {
        matches!(self.owner, Owner::Versioned(_))
    }
}

impl sealed::Sealed for ManagedTensor<'_> {}

impl Tensor for ManagedTensor<'_> {
    #[inline]
    fn dl_tensor(&self) -> &DLTensor {
        match self.owner {
            // SAFETY: the guard owns a valid struct until drop; `&self` bounds the borrow.
            Owner::Legacy(p) => unsafe { &(*p.as_ptr()).dl_tensor },
            // SAFETY: as above.
            Owner::Versioned(p) => unsafe { &(*p.as_ptr()).dl_tensor },
        }
    }

    #[inline]
    fn flags(&self) -> u64 {
        match self.owner {
            Owner::Legacy(_) => 0,
            // SAFETY: the guard owns a valid struct until drop.
            Owner::Versioned(p) => unsafe { (*p.as_ptr()).flags },
        }
    }
}

impl Drop for ManagedTensor<'_> {
    fn drop(&mut self) {
        let owner = &self.owner;
        let mut call = || match *owner {
            Owner::Legacy(p) => {
                // SAFETY: the guard owns the struct; reading the deleter is allowed.
                if let Some(deleter) = unsafe { (*p.as_ptr()).deleter } {
                    // SAFETY: DLPack: the consumer calls the deleter once when done; this is
                    // the only call (the guard is dropped once, and a release context calls
                    // this closure at most once).
                    unsafe { deleter(p.as_ptr()) };
                }
            }
            Owner::Versioned(p) => {
                // SAFETY: as above; `deleter` sits at a version-stable offset.
                if let Some(deleter) = unsafe { (*p.as_ptr()).deleter } {
                    // SAFETY: as above.
                    unsafe { deleter(p.as_ptr()) };
                }
            }
        };
        match self.release {
            Some(context) => context(&mut call),
            None => call(),
        }
    }
}

impl fmt::Debug for ManagedTensor<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManagedTensor")
            .field("version", &self.version())
            .field("dtype", &self.dtype().to_string())
            .field("shape", &self.shape())
            .field("strides_elems", &self.strides_elems())
            .field("byte_offset_bytes", &self.byte_offset_bytes())
            .field("device", &self.device().to_string())
            .field("flags", &self.flags())
            .finish()
    }
}

/// A borrowed, validated `DLTensor` whose owner stays the caller. No deleter is involved.
pub struct TensorView<'a> {
    tensor: NonNull<DLTensor>,
    _owner: PhantomData<&'a mut DLTensor>,
}

impl<'a> TensorView<'a> {
    /// Validates a borrowed `DLTensor*`.
    ///
    /// # Safety
    /// `ptr` must be NULL or point to a valid `DLTensor` whose `shape`, `strides` and data
    /// stay valid and unchanged (by anyone else) for `'a`. If the view is used as a receive
    /// buffer or through `as_mut_slice`, nothing else may read or write its data meanwhile.
    ///
    /// # Errors
    /// [`Error::NullPointer`] and the validation errors of [`Tensor`].
    pub unsafe fn from_raw(ptr: *mut DLTensor) -> Result<Self> {
        let tensor = NonNull::new(ptr).ok_or(Error::NullPointer { field: "DLTensor*" })?;
        // SAFETY: caller's contract.
        unsafe { validate(tensor.as_ref()) }?;
        Ok(TensorView {
            tensor,
            _owner: PhantomData,
        })
    }
}

impl sealed::Sealed for TensorView<'_> {}

impl Tensor for TensorView<'_> {
    #[inline]
    fn dl_tensor(&self) -> &DLTensor {
        // SAFETY: valid for 'a by the constructor's contract.
        unsafe { self.tensor.as_ref() }
    }

    #[inline]
    fn flags(&self) -> u64 {
        0
    }
}

impl fmt::Debug for TensorView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorView")
            .field("dtype", &self.dtype().to_string())
            .field("shape", &self.shape())
            .field("strides_elems", &self.strides_elems())
            .field("byte_offset_bytes", &self.byte_offset_bytes())
            .field("device", &self.device().to_string())
            .finish()
    }
}
