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
//! The files of this module, all re-exported here (`dlpack_mpi::dlpack::X`):
//! - `guard.rs`: [`ManagedTensor`], [`TensorView`] and the validation they share;
//! - `acquire.rs`: the producer protocol, [`Exporter`] and the consumer's [`acquire`], with
//!   its device-query and stream policies;
//! - `producers.rs`: the built-in exporters ([`Owned`], [`SliceMut`], `[T]`, `Vec<T>`);
//! - `list.rs`: lists of tensors as the fused collectives take them ([`TensorList`],
//!   [`TensorListMut`]: slices, `Vec`s and arrays of guards, views or references);
//! - `cudarc.rs` (feature `cuda`): `CudaExport`, the exporter of cudarc's device slices.
//!
//! GPU work during acquisition (consumer streams, synchronization) goes through
//! [`crate::runtime`], below this module; nothing here uses the specs, `comm` or the
//! transport.

use std::ffi::c_void;

pub use dlpack_rs::ffi::{
    DLDataType, DLDevice, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor,
};

use crate::device::Device;
use crate::dtype::{AnyBits, DType};
use crate::error::{Error, Result};
use crate::layout;

mod acquire;
#[cfg(feature = "cuda")]
mod cudarc;
mod guard;
pub(crate) mod list;
mod producers;

pub use acquire::{
    acquire, acquire_all, acquire_with_runtime, AcquireOptions, DeviceQuery, ExportRequest,
    Exporter, StreamPolicy,
};
#[cfg(feature = "python")]
pub(crate) use acquire::{acquire_from, check_acquired};
#[cfg(feature = "cuda")]
pub use cudarc::CudaExport;
pub use guard::{ManagedTensor, TensorView};
pub use list::{TensorList, TensorListMut};
pub use producers::{Owned, SliceMut};

// The DLPack stream table is defined in `crate::device` (below the runtime, which reads it
// too). Its earlier paths here stay for existing users, deprecated and hidden from the docs
// (Rust ignores `#[deprecated]` on a `pub use`, hence constants of their own).

/// Each name a deprecated constant of its own, equal to `crate::device`'s, with the note.
macro_rules! deprecated_stream_paths {
    ($($name:ident: $note:literal;)*) => {$(
        #[doc = concat!("Deprecated path of [`crate::device::", stringify!($name), "`].")]
        #[deprecated(note = $note)]
        #[doc(hidden)]
        pub const $name: isize = crate::device::$name;
    )*};
}

deprecated_stream_paths! {
    NO_SYNC_STREAM: "use dlpack_mpi::device::NO_SYNC_STREAM";
    CUDA_LEGACY_DEFAULT_STREAM: "use dlpack_mpi::device::CUDA_LEGACY_DEFAULT_STREAM";
    CUDA_PER_THREAD_DEFAULT_STREAM: "use dlpack_mpi::device::CUDA_PER_THREAD_DEFAULT_STREAM";
    ROCM_DEFAULT_STREAM: "use dlpack_mpi::device::ROCM_DEFAULT_STREAM";
}

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
        // Both implementors (sealed) validate the tensor when they are made (`validate` in
        // guard.rs): data + byte_offset ≤ usize::MAX for a non-NULL data, so byte_offset fits
        // usize and the cast is lossless. wrapping_add keeps the pointer's provenance.
        #[allow(clippy::cast_possible_truncation)]
        let offset_bytes = t.byte_offset as usize;
        t.data.cast::<u8>().wrapping_add(offset_bytes).cast()
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

    /// The producer's array type when the consumer knows its arrays are immutable although
    /// the tensor carries no `READ_ONLY` flag (a JAX array's legacy capsule, see the
    /// `python` module, feature `python`); such a tensor reports `READ_ONLY` in
    /// [`Tensor::flags`].
    fn immutable_producer(&self) -> Option<&'static str> {
        None
    }

    /// The error for writing into this read-only tensor: [`Error::Immutable`] naming the
    /// producer when [`Tensor::immutable_producer`] knows it, else [`Error::ReadOnly`].
    fn read_only_error(&self) -> Error {
        match self.immutable_producer() {
            Some(producer) => Error::Immutable { producer },
            None => Error::ReadOnly,
        }
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
            return Err(self.read_only_error());
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
    // `byte_span(n, ..)` above succeeded, and it converts n to usize first (refusing a
    // negative or too large n): the cast neither loses a sign nor truncates.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let len = n as usize;
    Ok((ptr, len))
}
