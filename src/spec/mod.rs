//! Message descriptors `(pointer, count, datatype)` that plug into rsmpi.
//!
//! A [`SendSpec`] or [`RecvSpec`] is built from a validated [`Tensor`] and implements
//! rsmpi's buffer traits (`Pointer`, `Collection`, `AsDatatype`, `Buffer`; and `PointerMut`,
//! `BufferMut` for receives), so every rsmpi operation accepts it:
//!
//! ```no_run
//! use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned};
//! use dlpack_mpi::spec::{RecvSpec, SendSpec};
//! use mpi::traits::*;
//! let universe = mpi::initialize().unwrap();
//! let world = universe.world();
//! let data = Owned::new(vec![1.0f32; 8]);
//! let mut t = acquire(&data, &AcquireOptions::default())?;
//! if world.rank() == 0 {
//!     world.process_at_rank(1).send(&SendSpec::new(&t)?);
//! } else if world.rank() == 1 {
//!     world.process_at_rank(0).receive_into(&mut RecvSpec::new(&mut t)?);
//! }
//! # Ok::<(), dlpack_mpi::Error>(())
//! ```
//!
//! A spec borrows its tensor (`SendSpec<'t>` holds `&'t`, `RecvSpec<'t>` holds `&'t mut`),
//! and an rsmpi request borrows the spec, so the borrow checker proves that the producer's
//! deleter runs only after MPI is done with the pointer.
//!
//! **Threads.** Specs are neither `Send` nor `Sync`. A spec erases the type of the tensor it
//! borrows, and that may be a [`crate::dlpack::TensorView`] (not `Send`) or a
//! [`crate::dlpack::ManagedTensor`] (not `Sync`); a `SendSpec` is a shared borrow (`Send`
//! only if the tensor were `Sync`), a `RecvSpec` an exclusive one (`Send` only if the
//! tensor were `Send`). Build specs on the thread that makes the MPI call: move the guard,
//! not the spec.
//!
//! ```compile_fail,E0277
//! fn to_another_thread<T: Send>() {}
//! to_another_thread::<dlpack_mpi::spec::SendSpec<'static>>();
//! ```
//!
//! ```compile_fail,E0277
//! fn to_another_thread<T: Send>() {}
//! to_another_thread::<dlpack_mpi::spec::RecvSpec<'static>>();
//! ```
//!
//! ```compile_fail,E0277
//! fn shared_between_threads<T: Sync>() {}
//! shared_between_threads::<dlpack_mpi::spec::SendSpec<'static>>();
//! ```
//!
//! ```compile_fail,E0277
//! fn to_another_thread<T: Send>() {}
//! to_another_thread::<dlpack_mpi::spec::VectorRecvSpec<'static>>();
//! ```
//!
//! A spec cannot outlive its tensor (the deleter would run while MPI may still use the
//! pointer):
//!
//! ```compile_fail,E0597
//! use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned};
//! use dlpack_mpi::spec::SendSpec;
//! let owned = Owned::new(vec![1u8; 4]);
//! let spec = {
//!     let t = acquire(&owned, &AcquireOptions::default()).unwrap();
//!     SendSpec::new(&t).unwrap()
//! };
//! assert_eq!(spec.len_elems(), 4);
//! ```
//!
//! The same helpers accept what is allowed, so the failures above are the bounds:
//!
//! ```
//! fn to_another_thread<T: Send>() {}
//! to_another_thread::<dlpack_mpi::dlpack::ManagedTensor<'static>>();
//! let owned = dlpack_mpi::dlpack::Owned::new(vec![1u8; 4]);
//! let t = dlpack_mpi::dlpack::acquire(&owned, &Default::default())?;
//! let spec = dlpack_mpi::spec::SendSpec::new(&t)?;
//! assert_eq!(spec.len_elems(), 4);
//! # Ok::<(), dlpack_mpi::Error>(())
//! ```
//!
//! **Units.** Every count and displacement in this module's constructors is in DLPack
//! **elements**. `Collection::count` (what rsmpi passes to MPI) is in MPI datatype units:
//! elements × lanes (see [`crate::dtype`]).
//!
//! **Checks** (all before any MPI call): the device must be host-accessible (device memory
//! goes through the transport's `DeviceComm`, which stages or routes it), the dtype must
//! have an MPI type of its exact size, and the address range must not overflow. Any layout
//! is accepted: a contiguous tensor is `count` units of its predefined type, a strided one
//! is one derived datatype that visits its elements in place, and a contiguous count beyond
//! MPI's `int` is one large-count datatype (both sent with count 1, see
//! [`datatype`]). A receive spec also refuses `READ_ONLY` ([`Error::ReadOnly`], C41)
//! and `IS_COPIED` ([`Error::IsCopied`], C42) tensors and overlapping layouts
//! ([`Error::Overlap`], C26).
//!
//! Submodules: [`datatype`] builds and caches the committed
//! derived datatypes (its `MPI_Type_*` calls are, with `raw` and `halfops`, the only direct
//! calls of MPI's C API). The operand model the operations of [`crate::comm`] use: `facts`
//! (a tensor's element, extent, contiguity and layout plan, computed once), `operand`
//! ([`Access`], [`Reach`]), `encoding` (run, large run, derived datatype, packed copy or
//! chunked, chosen before any datatype is built) and `side` (the one rsmpi buffer an
//! operand becomes, owning its packed copy). Specs are built on the same facts.

use std::ffi::c_void;
use std::marker::PhantomData;

use mpi::datatype::{
    AsDatatype, Buffer, BufferMut, Collection, DatatypeRef, Partitioned, PartitionedBuffer,
    PartitionedBufferMut, Pointer, PointerMut,
};
use mpi::ffi::MPI_Datatype;
use mpi::raw::FromRaw;
use mpi::Count;

use crate::dlpack::Tensor;
use crate::dtype::{DType, ElementType};
use crate::error::{Error, Result};
use crate::layout;
use facts::Facts;

pub mod datatype;
pub(crate) mod encoding;
pub(crate) mod facts;
// Public only for tests/hostile_kernels.rs and benches/pack_kernels.rs, which drive the
// pack kernels directly; hidden from the docs, not part of the API (no stability promise).
#[doc(hidden)]
pub mod kernels;
mod operand;
pub mod scratch;
pub(crate) mod side;

pub use operand::{Access, Reach};

/// What both spec kinds share: where the first element is, how many elements, of what type,
/// and the `(count, datatype)` MPI gets.
// repr(C) (here and on ElementType): with Rust's reordering, the small dtype fields were
// packed at odd offsets and every spec copy out of a Result hit store-forwarding stalls;
// spec construction went from ~46 ns to ~19 ns with a fixed, aligned layout.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
struct Described {
    ptr: *mut c_void,
    len_elems: i64,
    element: ElementType,
    /// A committed derived datatype (strided layout, or a count beyond `int`), sent with
    /// `count = 1`; `None` = the element's predefined unit type, `count` units.
    derived: Option<MPI_Datatype>,
    count: Count,
    /// Whether the elements are one run in logical order (predefined or large-count type).
    contiguous: bool,
    /// Lowest and one-past-highest byte address an element touches.
    start: usize,
    end: usize,
}

impl Described {
    /// The spec of a tensor that MPI does `access` to: its facts (every check, once), and a
    /// derived datatype over its elements when they are not one run.
    #[inline]
    fn of<T: Tensor + ?Sized>(t: &T, access: Access) -> Result<Self> {
        let facts = Facts::of(t, access, None)?;
        match facts.plan {
            None => Ok(Self::contiguous(&facts)),
            Some(_) => Self::strided(&facts),
        }
    }

    #[inline]
    fn contiguous(facts: &Facts) -> Self {
        // A count beyond int gets its large-count datatype in `finish` (count 0 until then),
        // so that a range of a huge tensor does not build one for the whole.
        let count = elems_to_units(facts.len_elems, &facts.element).unwrap_or(0);
        Described {
            ptr: facts.first,
            len_elems: facts.len_elems,
            element: facts.element,
            derived: None,
            count,
            contiguous: true,
            start: facts.start,
            end: facts.end,
        }
        .empty_is_null()
    }

    #[cold]
    fn strided(facts: &Facts) -> Result<Self> {
        let axes = facts.plan.as_ref().map_or(&[][..], |p| &p.axes[..]);
        let e = facts.element;
        let derived = datatype::strided(e.row.unit, e.dtype.lanes, axes)?;
        Ok(Described {
            ptr: facts.first,
            len_elems: facts.len_elems,
            element: e,
            derived: Some(derived),
            count: 1,
            contiguous: false,
            start: facts.start,
            end: facts.end,
        })
    }

    /// The elements `[displacement, displacement + count)`, bounds-checked.
    fn range(&self, what: &str, displacement: i64, count: i64) -> Result<Self> {
        if !self.contiguous {
            return Err(Error::StridedNotSupported {
                operation: "element ranges",
            });
        }
        layout::check_range(|| what.to_string(), displacement, count, self.len_elems)?;
        let offset_bytes = layout::byte_span(displacement, self.element.size_bytes())?;
        let first = self.ptr.cast::<u8>().wrapping_add(offset_bytes).cast();
        Ok(Self::contiguous(&Facts::run(first, count, self.element)?))
    }

    /// Builds the large-count datatype of a contiguous run of more than `int` units.
    #[inline]
    fn finish(mut self) -> Result<Self> {
        if self.contiguous && self.count == 0 && self.len_elems > 0 {
            let units = u64::try_from(self.len_elems)
                .ok()
                .and_then(|n| n.checked_mul(u64::from(self.element.dtype.lanes)))
                .ok_or(Error::Overflow {
                    quantity: "MPI units (elements × lanes)",
                    lhs: i128::from(self.len_elems),
                    operator: "*",
                    rhs: i128::from(self.element.dtype.lanes),
                })?;
            self.derived = Some(datatype::large_contiguous(self.element.row.unit, units)?);
            self.count = 1;
        }
        Ok(self)
    }

    /// An empty buffer is handed to MPI as NULL, never as the tensor's pointer: a Rust
    /// dangling pointer for a 1-byte type is `0x1`, which *is* `MPI_IN_PLACE` in Open MPI,
    /// and would turn a zero-count collective into an in-place one.
    #[inline]
    fn empty_is_null(mut self) -> Self {
        if self.len_elems == 0 {
            self.ptr = std::ptr::null_mut();
        }
        self
    }

    #[inline]
    fn datatype(&self) -> DatatypeRef<'static> {
        match self.derived {
            None => self.element.row.unit.datatype(),
            // SAFETY: a committed type the derived-type cache keeps for the whole process.
            Some(t) => unsafe { DatatypeRef::from_raw(t) },
        }
    }
}

/// `elems` DLPack elements as an MPI count: `elems × lanes` units of the element's
/// predefined MPI type (an element of `lanes` lanes is that many consecutive units, see
/// [`crate::dtype`]). The crate's one element → MPI-count conversion: spec counts, per-rank
/// blocks and displacements ([`blocks_in_units`]) all go through it.
///
/// # Errors
/// [`Error::CountTooLarge`] when the units do not fit MPI's `int` ([`Count`]), with the
/// unit count (0 for a negative one; callers check block bounds first).
#[inline]
pub(crate) fn elems_to_units(elems: i64, element: &ElementType) -> Result<Count> {
    let units = i128::from(elems) * element.units_per_element() as i128;
    Count::try_from(units).map_err(|_| Error::CountTooLarge {
        count: u64::try_from(units.max(0)).unwrap_or(u64::MAX),
    })
}

/// Per-rank blocks `(counts, displacements)` in elements, checked against a tensor of
/// `len_elems` elements (each block inside it; pairwise disjoint when `disjoint`) and
/// converted to MPI units with [`elems_to_units`].
///
/// # Errors
/// [`Error::LengthMismatch`], [`Error::OutOfBounds`], [`Error::BlocksOverlap`] from
/// [`layout::check_blocks`]; [`Error::CountTooLarge`].
pub(crate) fn blocks_in_units(
    len_elems: i64,
    element: &ElementType,
    counts_elems: &[i64],
    displacements_elems: &[i64],
    disjoint: bool,
) -> Result<(Vec<Count>, Vec<Count>)> {
    layout::check_blocks(
        counts_elems,
        displacements_elems,
        counts_elems.len(),
        len_elems,
        disjoint,
    )?;
    let to_units = |list: &[i64]| {
        list.iter()
            .map(|&x| elems_to_units(x, element))
            .collect::<Result<Vec<_>>>()
    };
    Ok((to_units(counts_elems)?, to_units(displacements_elems)?))
}

/// The accessors both spec kinds share.
macro_rules! spec_accessors {
    () => {
        /// Number of DLPack elements described.
        pub fn len_elems(&self) -> i64 {
            self.d.len_elems
        }

        /// The resolved element type (DLPack dtype and MPI unit).
        pub fn element_type(&self) -> ElementType {
            self.d.element
        }

        /// The DLPack dtype.
        pub fn dtype(&self) -> DType {
            self.d.element.dtype
        }

        /// The MPI count: elements × lanes units of the predefined type, or 1 of a derived
        /// datatype (strided layouts, counts beyond `int`).
        pub fn mpi_count(&self) -> Count {
            self.d.count
        }

        /// Whether MPI gets a derived datatype (strided layout or large count) for this spec.
        pub fn is_derived(&self) -> bool {
            self.d.derived.is_some()
        }

        /// Whether the elements are one run in memory in logical order.
        pub fn is_contiguous(&self) -> bool {
            self.d.contiguous
        }

        /// Lowest and one-past-highest byte address the elements touch.
        pub fn byte_range(&self) -> (usize, usize) {
            (self.d.start, self.d.end)
        }
    };
}

/// A send buffer: `(pointer, count, datatype)` over a borrowed tensor.
#[derive(Debug, Clone, Copy)]
pub struct SendSpec<'t> {
    d: Described,
    _tensor: PhantomData<&'t ()>,
}

impl<'t> SendSpec<'t> {
    /// All elements of `tensor`, in row-major order.
    ///
    /// # Errors
    /// See the module docs: [`Error::MpiLibraryMismatch`] when the process loaded another
    /// MPI release than this build's ([`crate::mpi_library::ensure_matching`], checked once
    /// per process), [`Error::UnsupportedDevice`], [`Error::UnsupportedDtype`],
    /// [`Error::Overflow`], [`Error::CountTooLarge`]; [`Error::MpiNotInitialized`] when a
    /// strided or large-count tensor needs a derived datatype before `MPI_Init`.
    #[inline]
    pub fn new<T: Tensor + ?Sized>(tensor: &'t T) -> Result<Self> {
        Self::from_described(Described::of(tensor, Access::Read)?)
    }

    /// Elements `[displacement, displacement + count)` of `tensor` (mpi4py's
    /// `(count, displacement)` buffer form), both in elements.
    ///
    /// # Errors
    /// As [`SendSpec::new`], plus [`Error::OutOfBounds`] when the range leaves the tensor.
    pub fn range<T: Tensor + ?Sized>(
        tensor: &'t T,
        displacement_elems: i64,
        count_elems: i64,
    ) -> Result<Self> {
        Self::from_described(Described::of(tensor, Access::Read)?.range(
            "range",
            displacement_elems,
            count_elems,
        )?)
    }

    #[inline]
    fn from_described(d: Described) -> Result<Self> {
        Ok(SendSpec {
            d: d.finish()?,
            _tensor: PhantomData,
        })
    }

    spec_accessors!();

    /// Elements `[displacement, displacement + count)` of this spec.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`], [`Error::CountTooLarge`].
    pub fn range_of(&self, displacement_elems: i64, count_elems: i64) -> Result<SendSpec<'t>> {
        Self::from_described(self.d.range("range", displacement_elems, count_elems)?)
    }
}

// SAFETY: the pointer is the first element of `count` units of `as_datatype()` inside the
// tensor borrowed for 't (checked in `Described::of`/`range`).
unsafe impl Pointer for SendSpec<'_> {
    #[inline]
    fn pointer(&self) -> *const c_void {
        self.d.ptr
    }
}

// SAFETY: count is exactly the number of datatype units described.
unsafe impl Collection for SendSpec<'_> {
    #[inline]
    fn count(&self) -> Count {
        self.d.count
    }
}

// SAFETY: the datatype's size is the element unit's size (dtype table invariant).
unsafe impl AsDatatype for SendSpec<'_> {
    type Out = DatatypeRef<'static>;
    #[inline]
    fn as_datatype(&self) -> Self::Out {
        self.d.datatype()
    }
}

// SAFETY: Pointer + Collection + AsDatatype above describe readable memory.
unsafe impl Buffer for SendSpec<'_> {}

/// A receive buffer: `(pointer, count, datatype)` over an exclusively borrowed tensor.
#[derive(Debug)]
pub struct RecvSpec<'t> {
    d: Described,
    _tensor: PhantomData<&'t mut ()>,
}

impl<'t> RecvSpec<'t> {
    /// All elements of `tensor`.
    ///
    /// # Errors
    /// [`Error::ReadOnly`], [`Error::IsCopied`], [`Error::Overlap`], and the errors of
    /// [`SendSpec::new`].
    #[inline]
    pub fn new<T: Tensor + ?Sized>(tensor: &'t mut T) -> Result<Self> {
        Self::from_described(Self::writable(tensor)?)
    }

    /// Elements `[displacement, displacement + count)` of `tensor`.
    ///
    /// # Errors
    /// As [`RecvSpec::new`], plus [`Error::OutOfBounds`].
    pub fn range<T: Tensor + ?Sized>(
        tensor: &'t mut T,
        displacement_elems: i64,
        count_elems: i64,
    ) -> Result<Self> {
        Self::from_described(Self::writable(tensor)?.range(
            "range",
            displacement_elems,
            count_elems,
        )?)
    }

    #[inline]
    fn writable<T: Tensor + ?Sized>(tensor: &T) -> Result<Described> {
        Described::of(tensor, Access::Write)
    }

    #[inline]
    fn from_described(d: Described) -> Result<Self> {
        Ok(RecvSpec {
            d: d.finish()?,
            _tensor: PhantomData,
        })
    }

    spec_accessors!();

    /// Reads this receive buffer as a send buffer (for the root of a broadcast, or an
    /// in-place reduction). The returned spec borrows `self`.
    pub fn as_send(&self) -> SendSpec<'_> {
        SendSpec {
            d: self.d,
            _tensor: PhantomData,
        }
    }
}

// SAFETY: as for SendSpec.
unsafe impl Pointer for RecvSpec<'_> {
    #[inline]
    fn pointer(&self) -> *const c_void {
        self.d.ptr
    }
}

// SAFETY: the tensor is exclusively borrowed, not READ_ONLY/IS_COPIED and non-overlapping.
unsafe impl PointerMut for RecvSpec<'_> {
    #[inline]
    fn pointer_mut(&mut self) -> *mut c_void {
        self.d.ptr
    }
}

// SAFETY: count is exactly the number of datatype units described.
unsafe impl Collection for RecvSpec<'_> {
    #[inline]
    fn count(&self) -> Count {
        self.d.count
    }
}

// SAFETY: the datatype's size is the element unit's size.
unsafe impl AsDatatype for RecvSpec<'_> {
    type Out = DatatypeRef<'static>;
    #[inline]
    fn as_datatype(&self) -> Self::Out {
        self.d.datatype()
    }
}

// SAFETY: see the trait impls above.
unsafe impl Buffer for RecvSpec<'_> {}
// SAFETY: see the trait impls above.
unsafe impl BufferMut for RecvSpec<'_> {}

/// Per-rank `(counts, displacements)` in elements of a spec, checked and converted to MPI
/// units ([`blocks_in_units`]); a strided spec has no per-rank blocks.
fn blocks(
    d: &Described,
    counts_elems: &[i64],
    displacements_elems: &[i64],
    disjoint: bool,
) -> Result<(Vec<Count>, Vec<Count>)> {
    if !d.contiguous {
        return Err(Error::StridedNotSupported {
            operation: "per-rank blocks (v-variants)",
        });
    }
    blocks_in_units(
        d.len_elems,
        &d.element,
        counts_elems,
        displacements_elems,
        disjoint,
    )
}

/// A send buffer split into one block per rank (for rsmpi's scatterv and all-to-allv):
/// counts and displacements in elements, each block inside the tensor.
///
/// Deprecated: per-rank blocks are [`crate::comm::Blocks`], which the v-collectives of
/// [`crate::comm::TensorComm`] take (checked, in elements, strided tensors packed); over a
/// spec and rsmpi's own v-collectives, rsmpi's `Partition` takes the counts in MPI units.
#[deprecated(
    note = "use TensorComm's v-collectives with comm::Blocks, or rsmpi's Partition/PartitionMut over a SendSpec/RecvSpec (counts and displacements in MPI units)"
)]
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct VectorSendSpec<'t> {
    spec: SendSpec<'t>,
    counts: Vec<Count>,
    displs: Vec<Count>,
}

#[allow(deprecated)]
impl<'t> VectorSendSpec<'t> {
    /// Splits `spec` into blocks `[displacements[i], displacements[i] + counts[i])`.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] when the two lists differ in length;
    /// [`Error::OutOfBounds`] naming the block that leaves the tensor (C45);
    /// [`Error::CountTooLarge`].
    pub fn new(
        spec: SendSpec<'t>,
        counts_elems: &[i64],
        displacements_elems: &[i64],
    ) -> Result<Self> {
        let (counts, displs) = blocks(&spec.d, counts_elems, displacements_elems, false)?;
        Ok(VectorSendSpec {
            spec,
            counts,
            displs,
        })
    }

    /// The underlying spec.
    pub fn spec(&self) -> &SendSpec<'t> {
        &self.spec
    }
}

#[allow(deprecated)]
// SAFETY: delegates to the checked spec.
unsafe impl Pointer for VectorSendSpec<'_> {
    #[inline]
    fn pointer(&self) -> *const c_void {
        self.spec.pointer()
    }
}

#[allow(deprecated)]
// SAFETY: delegates to the checked spec.
unsafe impl AsDatatype for VectorSendSpec<'_> {
    type Out = DatatypeRef<'static>;
    #[inline]
    fn as_datatype(&self) -> Self::Out {
        self.spec.as_datatype()
    }
}

#[allow(deprecated)]
impl Partitioned for VectorSendSpec<'_> {
    fn counts(&self) -> &[Count] {
        &self.counts
    }
    fn displs(&self) -> &[Count] {
        &self.displs
    }
}

#[allow(deprecated)]
impl PartitionedBuffer for VectorSendSpec<'_> {}

/// A receive buffer split into one block per rank (for rsmpi's gatherv, all-gatherv,
/// all-to-allv): counts and displacements in elements; blocks inside the tensor and pairwise
/// disjoint.
///
/// Deprecated, as [`VectorSendSpec`] (rsmpi's `PartitionMut` over a [`RecvSpec`]).
#[deprecated(
    note = "use TensorComm's v-collectives with comm::Blocks, or rsmpi's Partition/PartitionMut over a SendSpec/RecvSpec (counts and displacements in MPI units)"
)]
#[doc(hidden)]
#[derive(Debug)]
pub struct VectorRecvSpec<'t> {
    spec: RecvSpec<'t>,
    counts: Vec<Count>,
    displs: Vec<Count>,
}

#[allow(deprecated)]
impl<'t> VectorRecvSpec<'t> {
    /// Splits `spec` into blocks `[displacements[i], displacements[i] + counts[i])`.
    ///
    /// # Errors
    /// As [`VectorSendSpec::new`], plus [`Error::BlocksOverlap`] when two non-empty blocks
    /// share an element.
    pub fn new(
        spec: RecvSpec<'t>,
        counts_elems: &[i64],
        displacements_elems: &[i64],
    ) -> Result<Self> {
        let (counts, displs) = blocks(&spec.d, counts_elems, displacements_elems, true)?;
        Ok(VectorRecvSpec {
            spec,
            counts,
            displs,
        })
    }

    /// The underlying spec.
    pub fn spec(&self) -> &RecvSpec<'t> {
        &self.spec
    }
}

#[allow(deprecated)]
// SAFETY: delegates to the checked spec.
unsafe impl PointerMut for VectorRecvSpec<'_> {
    #[inline]
    fn pointer_mut(&mut self) -> *mut c_void {
        self.spec.pointer_mut()
    }
}

#[allow(deprecated)]
// SAFETY: delegates to the checked spec.
unsafe impl AsDatatype for VectorRecvSpec<'_> {
    type Out = DatatypeRef<'static>;
    #[inline]
    fn as_datatype(&self) -> Self::Out {
        self.spec.as_datatype()
    }
}

#[allow(deprecated)]
impl Partitioned for VectorRecvSpec<'_> {
    fn counts(&self) -> &[Count] {
        &self.counts
    }
    fn displs(&self) -> &[Count] {
        &self.displs
    }
}

#[allow(deprecated)]
impl PartitionedBufferMut for VectorRecvSpec<'_> {}

/// Contiguous specs need no MPI (no derived datatype), so these run under Miri too.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::dlpack::{acquire, AcquireOptions, Owned};

    #[test]
    #[allow(deprecated)] // the vector specs, kept working while deprecated
    fn contiguous_specs_describe_the_tensor() {
        let owned = Owned::new(vec![0i32; 6]).with_shape(&[2, 3]).unwrap();
        let mut t = acquire(&owned, &AcquireOptions::default()).unwrap();
        let first = t.first_element_ptr() as usize;
        let s = SendSpec::new(&t).unwrap();
        assert_eq!((s.len_elems(), s.mpi_count()), (6, 6));
        assert!(s.is_contiguous() && !s.is_derived());
        assert_eq!(s.pointer() as usize, first);
        assert_eq!(s.byte_range(), (first, first + 24));
        let r = s.range_of(2, 3).unwrap();
        assert_eq!((r.pointer() as usize, r.count()), (first + 8, 3));
        assert!(matches!(s.range_of(4, 3), Err(Error::OutOfBounds { .. })));
        let v = VectorSendSpec::new(s, &[1, 2], &[0, 4]).unwrap();
        assert_eq!((v.counts(), v.displs()), (&[1, 2][..], &[0, 4][..]));
        let mut r = RecvSpec::new(&mut t).unwrap();
        assert_eq!(r.pointer_mut() as usize, first);
        assert_eq!(r.as_send().mpi_count(), 6);
        assert!(matches!(
            VectorRecvSpec::new(r, &[3, 3], &[0, 2]),
            Err(Error::BlocksOverlap { .. })
        ));
    }

    #[test]
    fn empty_specs_are_null_and_receives_respect_flags() {
        let empty = Owned::new(Vec::<u8>::new());
        let t = acquire(&empty, &AcquireOptions::default()).unwrap();
        let s = SendSpec::new(&t).unwrap();
        assert!(s.pointer().is_null());
        assert_eq!(s.count(), 0);
        drop(t);
        let ro = Owned::new(vec![1.0f64; 2]).read_only();
        let mut t = acquire(&ro, &AcquireOptions::default()).unwrap();
        assert_eq!(RecvSpec::new(&mut t).unwrap_err(), Error::ReadOnly);
        drop(t);
        let copied = Owned::new(vec![1.0f64; 2]).copied();
        let mut t = acquire(&copied, &AcquireOptions::default()).unwrap();
        assert_eq!(RecvSpec::new(&mut t).unwrap_err(), Error::IsCopied);
        assert_eq!(SendSpec::new(&t).unwrap().mpi_count(), 2);
    }
}
