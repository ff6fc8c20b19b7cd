//! The owning import guard [`ManagedTensor`] and the borrowed [`TensorView`], with the
//! validation both constructors run (see the [module docs](super) for the trust boundary).

use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;

use super::{
    sealed, DLManagedTensor, DLManagedTensorVersioned, DLTensor, Tensor, FLAG_READ_ONLY,
    MAJOR_VERSION,
};
use crate::error::{Error, Result};
use crate::layout;

/// Checks the fields of a `DLTensor` that every consumer relies on.
///
/// # Safety
/// `t.shape` must be NULL or point to `t.ndim` readable `i64` (when `t.ndim > 0`), and
/// `t.strides` likewise.
unsafe fn validate(t: &DLTensor) -> Result<()> {
    let Ok(ndim) = usize::try_from(t.ndim) else {
        return Err(Error::InvalidTensor {
            field: "ndim".into(),
            value: t.ndim.into(),
            reason: "ndim must be >= 0",
        });
    };
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
        let address = t.data as usize;
        let end = address as u128 + u128::from(t.byte_offset);
        if end > usize::MAX as u128 {
            return Err(Error::Overflow {
                quantity: "data + byte_offset",
                lhs: address as i128,
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
/// the exporter for the built-in Rust exporters. Specs (module `spec`) borrow the guard, so
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
///
/// # Threads
///
/// A guard is `Send`: it may be moved to another thread and dropped there, so the deleter
/// may run on a thread other than the one that imported the tensor. dlpack.h puts no thread
/// affinity on the deleter (and producers that need a lock, like Python's capsule deleters,
/// take it themselves), so the import contract ([`ManagedTensor::from_raw_versioned`])
/// requires a deleter callable from any thread; the built-in exporters' deleters only touch
/// an atomic.
///
/// ```
/// use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned};
/// let owned = Owned::new(vec![1.0f32; 4]);
/// let t = acquire(&owned, &AcquireOptions::default())?;
/// std::thread::scope(|s| {
///     s.spawn(move || drop(t)); // the deleter runs on this thread
/// });
/// // The writable lease came back: the storage can be exported again.
/// assert!(acquire(&owned, &AcquireOptions::default()).is_ok());
/// # Ok::<(), dlpack_mpi::Error>(())
/// ```
///
/// A guard is not `Sync`: a shared reference hands out the producer's memory to read
/// (and specs that MPI reads from), and DLPack says nothing about concurrent readers on
/// several threads (for device memory, reads are ordered on one stream). Each thread
/// imports its own tensors.
///
/// ```compile_fail,E0277
/// fn shared_between_threads<T: Sync>() {}
/// shared_between_threads::<dlpack_mpi::dlpack::ManagedTensor<'static>>();
/// ```
///
/// A tensor that a spec borrows cannot be moved to another thread (or dropped, which would
/// run the deleter) while the spec is alive:
///
/// ```compile_fail,E0505
/// use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned};
/// use dlpack_mpi::spec::SendSpec;
/// let owned = Owned::new(vec![1.0f32; 4]);
/// let t = acquire(&owned, &AcquireOptions::default()).unwrap();
/// let spec = SendSpec::new(&t).unwrap();
/// std::thread::scope(|s| {
///     s.spawn(move || drop(t));
/// });
/// assert_eq!(spec.len_elems(), 4);
/// ```
pub struct ManagedTensor<'a> {
    owner: Owner,
    release: Option<ReleaseContext>,
    /// Set by [`ManagedTensor::mark_immutable`]: the producer's array type.
    immutable: Option<&'static str>,
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
    /// the tensor to this consumer, as DLPack intends. The deleter must be callable from any
    /// thread (the guard is `Send`; see "Threads" on [`ManagedTensor`]).
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
            immutable: None,
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
            immutable: None,
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

    /// Marks the tensor read-only because the consumer knows that the producer's arrays are
    /// immutable (`producer` names their type), whatever its flags say: it then reports
    /// `READ_ONLY` and is refused as a receive buffer with [`Error::Immutable`].
    #[cfg(feature = "python")]
    pub(crate) fn mark_immutable(&mut self, producer: &'static str) {
        self.immutable = Some(producer);
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
        let given = match self.owner {
            Owner::Legacy(_) => 0,
            // SAFETY: the guard owns a valid struct until drop.
            Owner::Versioned(p) => unsafe { (*p.as_ptr()).flags },
        };
        if self.immutable.is_some() {
            given | FLAG_READ_ONLY
        } else {
            given
        }
    }

    fn immutable_producer(&self) -> Option<&'static str> {
        self.immutable
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
///
/// A view is neither `Send` nor `Sync`: it is a pointer into memory whose owner (a C
/// library, a Python object) stays on the caller's thread and made no promise about other
/// threads.
///
/// ```compile_fail,E0277
/// fn to_another_thread<T: Send>() {}
/// to_another_thread::<dlpack_mpi::dlpack::TensorView<'static>>();
/// ```
///
/// A view is writable unless marked read-only ([`TensorView::from_raw_read_only`],
/// [`TensorView::read_only`], [`TensorView::immutable`]): a `DLTensor` carries no flags
/// (only `DLManagedTensorVersioned` does, DLPack v1.0), so the caller says what it knows.
pub struct TensorView<'a> {
    tensor: NonNull<DLTensor>,
    /// `None`: writable; `Some(None)`: `READ_ONLY` ([`Error::ReadOnly`]); `Some(Some(p))`:
    /// the arrays of producer `p` are immutable ([`Error::Immutable`]).
    read_only: Option<Option<&'static str>>,
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
            read_only: None,
            _owner: PhantomData,
        })
    }

    /// Validates a borrowed `DLTensor*` that must never be written: the view reports
    /// `READ_ONLY` in [`Tensor::flags`], and using it as a receive buffer (or through
    /// `as_mut_slice`) is [`Error::ReadOnly`], before any MPI call. Sending it is allowed.
    ///
    /// # Safety
    /// `ptr` must be NULL or point to a valid `DLTensor` whose `shape`, `strides` and data
    /// stay valid and unchanged (by anyone else) for `'a`. Nothing is written through the
    /// view, so the data may be shared with other readers.
    ///
    /// # Errors
    /// As [`TensorView::from_raw`].
    pub unsafe fn from_raw_read_only(ptr: *const DLTensor) -> Result<Self> {
        // SAFETY: the caller's contract, which is `from_raw`'s for readers; the view is
        // marked read-only before it is returned, so it is never written through.
        unsafe { Self::from_raw(ptr.cast_mut()) }.map(TensorView::read_only)
    }

    /// Marks this view `READ_ONLY` (DLPack `DLPACK_FLAG_BITMASK_READ_ONLY`): receiving into
    /// it is [`Error::ReadOnly`] from then on; sending it is unchanged.
    #[must_use]
    pub fn read_only(mut self) -> Self {
        if self.read_only.is_none() {
            self.read_only = Some(None);
        }
        self
    }

    /// Marks this view read-only because `producer`'s arrays are immutable (e.g.
    /// `"jax.Array"`): receiving into it is [`Error::Immutable`] naming the producer, as
    /// for an imported tensor of such a producer.
    #[must_use]
    pub fn immutable(mut self, producer: &'static str) -> Self {
        self.read_only = Some(Some(producer));
        self
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
        if self.read_only.is_some() {
            FLAG_READ_ONLY
        } else {
            0
        }
    }

    fn immutable_producer(&self) -> Option<&'static str> {
        self.read_only.flatten()
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
            .field("read_only", &self.read_only)
            .finish()
    }
}

/// Unit tests of the guard's unsafe code: import, validation, the deleter's single call,
/// slices. Pure Rust (no MPI, no FFI), so `scripts/miri.sh` runs them under Miri.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::dlpack::{
        acquire, AcquireOptions, DLDataType, DLDevice, DLPackVersion, Owned, SliceMut,
        FLAG_READ_ONLY,
    };
    use std::ffi::c_void;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A heap-built tensor as a C producer would hand it out: the deleter frees the struct,
    /// the arrays and the storage, and bumps a counter the test keeps.
    struct Ctx {
        deletes: Arc<AtomicUsize>,
        _storage: Vec<i32>,
        _shape: Vec<i64>,
        _strides: Vec<i64>,
    }

    unsafe extern "C" fn free_versioned(p: *mut DLManagedTensorVersioned) {
        // SAFETY: built by `versioned` from a Box; the guard calls this once.
        let m = unsafe { Box::from_raw(p) };
        // SAFETY: manager_ctx is the Box<Ctx> leaked by `versioned`.
        let ctx = unsafe { Box::from_raw(m.manager_ctx.cast::<Ctx>()) };
        ctx.deletes.fetch_add(1, Ordering::SeqCst);
    }

    unsafe extern "C" fn free_legacy(p: *mut DLManagedTensor) {
        // SAFETY: built by `legacy` from a Box; the guard calls this once.
        let m = unsafe { Box::from_raw(p) };
        // SAFETY: manager_ctx is the Box<Ctx> leaked by `legacy`.
        let ctx = unsafe { Box::from_raw(m.manager_ctx.cast::<Ctx>()) };
        ctx.deletes.fetch_add(1, Ordering::SeqCst);
    }

    fn parts(
        values: &[i32],
        shape: Option<&[i64]>,
        strides: Option<&[i64]>,
        deletes: &Arc<AtomicUsize>,
    ) -> (DLTensor, *mut c_void) {
        let mut storage = values.to_vec();
        let mut shape_v = shape.map(<[i64]>::to_vec).unwrap_or_default();
        let mut strides_v = strides.map(<[i64]>::to_vec).unwrap_or_default();
        let t = DLTensor {
            data: storage.as_mut_ptr().cast(),
            device: DLDevice {
                device_type: 1,
                device_id: 0,
            },
            ndim: shape.map_or(0, |s| {
                i32::try_from(s.len()).expect("test shapes are short")
            }),
            dtype: DLDataType {
                code: 0,
                bits: 32,
                lanes: 1,
            },
            shape: if shape.is_some() {
                shape_v.as_mut_ptr()
            } else {
                std::ptr::null_mut()
            },
            strides: if strides.is_some() {
                strides_v.as_mut_ptr()
            } else {
                std::ptr::null_mut()
            },
            byte_offset: 0,
        };
        let ctx = Box::new(Ctx {
            deletes: deletes.clone(),
            _storage: storage,
            _shape: shape_v,
            _strides: strides_v,
        });
        (t, Box::into_raw(ctx).cast())
    }

    fn versioned(
        values: &[i32],
        shape: Option<&[i64]>,
        major: u32,
        flags: u64,
        deletes: &Arc<AtomicUsize>,
    ) -> *mut DLManagedTensorVersioned {
        let (dl_tensor, ctx) = parts(values, shape, None, deletes);
        Box::into_raw(Box::new(DLManagedTensorVersioned {
            version: DLPackVersion { major, minor: 3 },
            manager_ctx: ctx,
            deleter: Some(free_versioned),
            flags,
            dl_tensor,
        }))
    }

    fn legacy(
        values: &[i32],
        shape: Option<&[i64]>,
        strides: Option<&[i64]>,
        deletes: &Arc<AtomicUsize>,
    ) -> *mut DLManagedTensor {
        let (dl_tensor, ctx) = parts(values, shape, strides, deletes);
        Box::into_raw(Box::new(DLManagedTensor {
            dl_tensor,
            manager_ctx: ctx,
            deleter: Some(free_legacy),
        }))
    }

    fn counter() -> Arc<AtomicUsize> {
        Arc::default()
    }

    #[test]
    fn versioned_import_reads_fields_and_deletes_once() {
        let deletes = counter();
        let p = versioned(
            &[1, 2, 3, 4, 5, 6],
            Some(&[2, 3]),
            1,
            FLAG_READ_ONLY,
            &deletes,
        );
        // SAFETY: built just now, owned by nobody else.
        let mut t = unsafe { ManagedTensor::from_raw_versioned(p) }.unwrap();
        assert_eq!(t.version(), Some((1, 3)));
        assert!(t.is_versioned());
        assert_eq!((t.ndim(), t.shape()), (2, &[2i64, 3][..]));
        assert_eq!(t.strides_elems(), None);
        assert_eq!(t.num_elements(), 6);
        assert!(t.is_read_only() && !t.is_copied());
        assert_eq!(t.as_slice::<i32>().unwrap(), &[1, 2, 3, 4, 5, 6]);
        assert_eq!(t.as_mut_slice::<i32>(), Err(Error::ReadOnly));
        assert!(format!("{t:?}").contains("int32"));
        assert_eq!(deletes.load(Ordering::SeqCst), 0);
        drop(t);
        assert_eq!(deletes.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn legacy_import_writes_through_the_mutable_slice() {
        let deletes = counter();
        let p = legacy(&[5, 6, 7], Some(&[3]), Some(&[1]), &deletes);
        // SAFETY: as above.
        let mut t = unsafe { ManagedTensor::from_raw_legacy(p) }.unwrap();
        assert_eq!((t.version(), t.flags()), (None, 0));
        t.as_mut_slice::<i32>().unwrap()[1] = 60;
        assert_eq!(t.as_slice::<i32>().unwrap(), &[5, 60, 7]);
        assert_eq!(t.strides_elems(), Some(&[1i64][..]));
        drop(t);
        assert_eq!(deletes.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn refused_imports_delete_once() {
        for major in [0, 2, u32::MAX] {
            let deletes = counter();
            let p = versioned(&[1], Some(&[1]), major, 0, &deletes);
            // SAFETY: as above.
            let e = unsafe { ManagedTensor::from_raw_versioned(p) }.unwrap_err();
            assert_eq!(e, Error::UnsupportedVersion { major, minor: 3 });
            assert_eq!(deletes.load(Ordering::SeqCst), 1);
        }
        let deletes = counter();
        let p = legacy(&[1, 2], Some(&[-2]), None, &deletes);
        // SAFETY: as above.
        let e = unsafe { ManagedTensor::from_raw_legacy(p) }.unwrap_err();
        assert!(
            matches!(&e, Error::InvalidTensor { field, value: -2, .. } if field == "shape[0]"),
            "{e:?}"
        );
        assert_eq!(deletes.load(Ordering::SeqCst), 1);
        // SAFETY: NULL is allowed and refused.
        let e = unsafe { ManagedTensor::from_raw_legacy(std::ptr::null_mut()) }.unwrap_err();
        assert_eq!(
            e,
            Error::NullPointer {
                field: "DLManagedTensor*"
            }
        );
    }

    #[test]
    fn strided_tensors_are_not_slices() {
        let deletes = counter();
        let p = legacy(&[1, 2, 3, 4], Some(&[2]), Some(&[2]), &deletes);
        // SAFETY: as above.
        let t = unsafe { ManagedTensor::from_raw_legacy(p) }.unwrap();
        assert!(matches!(
            t.as_slice::<i32>(),
            Err(Error::NonContiguous { axis: 0, .. })
        ));
        assert!(matches!(
            t.as_slice::<u32>(),
            Err(Error::DtypeMismatch { .. })
        ));
        drop(t);
        assert_eq!(deletes.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn views_validate_and_never_delete() {
        let mut storage = [1.5f64, 2.5];
        let mut shape = [1i64];
        let mut t = DLTensor {
            data: storage.as_mut_ptr().cast(),
            device: DLDevice {
                device_type: 1,
                device_id: 0,
            },
            ndim: 1,
            dtype: DLDataType {
                code: 2,
                bits: 64,
                lanes: 1,
            },
            shape: shape.as_mut_ptr(),
            strides: std::ptr::null_mut(),
            byte_offset: 8,
        };
        {
            // SAFETY: the struct, its shape and the storage outlive the view (this block).
            let mut v = unsafe { TensorView::from_raw(&mut t) }.unwrap();
            assert_eq!(v.as_slice::<f64>().unwrap(), &[2.5]);
            v.as_mut_slice::<f64>().unwrap()[0] = 4.0;
        }
        assert_eq!(storage, [1.5, 4.0]);
        {
            // SAFETY: as above; nothing is written through the read-only views.
            let mut v = unsafe { TensorView::from_raw_read_only(&t) }.unwrap();
            assert!(v.is_read_only());
            assert_eq!(v.as_slice::<f64>().unwrap(), &[4.0]);
            assert_eq!(v.as_mut_slice::<f64>(), Err(Error::ReadOnly));
            // SAFETY: as above.
            let mut v = unsafe { TensorView::from_raw(&mut t) }
                .unwrap()
                .immutable("jax.Array");
            assert!(v.is_read_only());
            assert_eq!(
                v.as_mut_slice::<f64>(),
                Err(Error::Immutable {
                    producer: "jax.Array"
                })
            );
        }
        assert_eq!(storage, [1.5, 4.0]);
        t.ndim = -1;
        // SAFETY: as above.
        let refused = unsafe { TensorView::from_raw(&mut t) };
        assert!(matches!(refused, Err(Error::InvalidTensor { .. })));
    }

    #[test]
    fn built_in_exporters_round_trip() {
        let data = [1u8, 2, 3];
        let t = acquire(&data[..], &AcquireOptions::default()).unwrap();
        assert_eq!(t.as_slice::<u8>().unwrap(), &[1, 2, 3]);
        assert!(t.is_read_only());
        let owned = Owned::new(vec![0i16; 6])
            .with_layout(&[3], Some(&[-2]), 8)
            .unwrap();
        {
            let t = acquire(&owned, &AcquireOptions::default()).unwrap();
            assert_eq!(t.strides_elems(), Some(&[-2i64][..]));
            // A second writable export of the same storage is refused while one lives.
            assert!(matches!(
                acquire(&owned, &AcquireOptions::default()),
                Err(Error::StorageBusy {
                    writable: true,
                    readers: 0,
                    ..
                })
            ));
        }
        assert!(acquire(&owned, &AcquireOptions::default()).is_ok());
        let mut buf = [0u32; 4];
        {
            let slice = SliceMut::new(&mut buf[..]);
            let mut t = acquire(&slice, &AcquireOptions::default()).unwrap();
            t.as_mut_slice::<u32>()
                .unwrap()
                .copy_from_slice(&[9, 8, 7, 6]);
        }
        assert_eq!(buf, [9, 8, 7, 6]);
    }
}
