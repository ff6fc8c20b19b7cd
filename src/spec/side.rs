//! One side of an operation ([`Side`]): the one rsmpi buffer an operand becomes, whatever
//! its [`Encoding`]. It holds the tensor's borrow in every variant (`&'t` for what MPI
//! reads, `&'t mut` for what it writes), owns its packed copy, and finishes as a method:
//! [`Side::finish`] unpacks a receive's copy into the tensor after MPI completes.
//!
//! The direction is a type parameter ([`In`], [`Out`]): only an `Out` side is an rsmpi
//! `BufferMut`, so a side MPI only reads can never be handed to MPI to write.
//!
//! Packing runs the pack kernels over the plan of the operand's [`Facts`] (computed once),
//! in the order [`crate::layout::Plan::offsets`] gives, so a packed buffer holds exactly
//! what a derived datatype would send: the elements in logical row-major order.

use std::ffi::c_void;

use mpi::datatype::{AsDatatype, Buffer, BufferMut, Collection, DatatypeRef, Pointer, PointerMut};
use mpi::ffi::MPI_Datatype;
use mpi::raw::FromRaw;
use mpi::Count;

use super::encoding::Encoding;
use super::facts::{kernel_refusal, Facts};
use super::kernels;
use super::operand::Access;
use super::scratch::Scratch;
use crate::dlpack::Tensor;
use crate::dtype::{ElementType, MpiUnit};
use crate::error::{Error, Result};
use crate::layout::Plan;

/// The direction of a side: what the side borrows its tensor as.
pub(crate) trait Direction {
    /// The borrow of the tensor.
    type Ref<'t>;
}

/// A side MPI reads (a send buffer): borrows its tensor shared.
#[derive(Debug)]
pub(crate) struct In;

/// A side MPI writes (a receive buffer, or both ways in place): borrows its tensor
/// exclusively, and [`Side::finish`] unpacks into it.
#[derive(Debug)]
pub(crate) struct Out;

impl Direction for In {
    type Ref<'t> = &'t dyn Tensor;
}

impl Direction for Out {
    type Ref<'t> = &'t mut dyn Tensor;
}

/// One operand as one rsmpi buffer: `(pointer, count, datatype)` over the tensor's own
/// memory or over the packed copy this value owns.
pub(crate) struct Side<'t, D: Direction> {
    tensor: D::Ref<'t>,
    encoding: Encoding,
    element: ElementType,
    len_elems: i64,
    /// MPI units (elements × lanes) of the elements.
    units: usize,
    /// First unit handed to MPI: the tensor's first element, the packed copy, or NULL when
    /// there are no elements (an empty buffer's dangling pointer can be Open MPI's
    /// `MPI_IN_PLACE`).
    ptr: *mut c_void,
    count: Count,
    /// A committed large-count or derived datatype (count 1); `None`: `count` units of the
    /// element's predefined type.
    datatype: Option<MPI_Datatype>,
    /// The packed copy (strided operands packed or chunked).
    scratch: Option<Scratch>,
    /// The layout plan, kept for the unpack of an `Out` side's copy.
    plan: Option<Box<Plan>>,
}

impl<D: Direction> std::fmt::Debug for Side<'_, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Side")
            .field("encoding", &self.encoding)
            .field("len_elems", &self.len_elems)
            .field("count", &self.count)
            .finish_non_exhaustive()
    }
}

/// The MPI-facing parts of a side, before it takes its tensor's borrow.
struct Parts {
    units: usize,
    ptr: *mut c_void,
    count: Count,
    datatype: Option<MPI_Datatype>,
    scratch: Option<Scratch>,
}

impl Parts {
    /// Builds what `encoding` names for `facts`; `fill`: a packed copy starts as the
    /// tensor's values (`true`) or as scratch MPI overwrites (`false`).
    #[inline]
    fn build(facts: &Facts, encoding: Encoding, fill: bool) -> Result<Parts> {
        let units = facts.units()?;
        let unit = facts.element.row.unit;
        let own = if facts.len_elems == 0 {
            std::ptr::null_mut()
        } else {
            facts.first
        };
        let mut parts = Parts {
            units,
            ptr: own,
            count: 0,
            datatype: None,
            scratch: None,
        };
        match encoding {
            Encoding::Run => parts.count = int_count(units)?,
            Encoding::LargeRun => parts.large(unit)?,
            Encoding::Derived => {
                let plan = facts.plan.as_ref().ok_or(Error::StridedNotSupported {
                    operation: "derived datatypes of contiguous tensors",
                })?;
                let lanes = facts.element.dtype.lanes;
                parts.datatype = Some(super::datatype::strided(unit, lanes, &plan.axes)?);
                parts.count = 1;
            }
            Encoding::Packed { whole } => {
                parts.own_copy(facts, fill)?;
                match int_count(units) {
                    Ok(c) => parts.count = c,
                    Err(_) if whole => parts.large(unit)?,
                    Err(e) => return Err(e),
                }
            }
            Encoding::Chunked => {
                if !facts.is_contiguous() {
                    parts.own_copy(facts, fill)?;
                }
                parts.count = int_count(units).unwrap_or(Count::MAX);
            }
        }
        Ok(parts)
    }

    /// One large-count datatype of all units, count 1.
    fn large(&mut self, unit: MpiUnit) -> Result<()> {
        let units =
            u64::try_from(self.units).map_err(|_| Error::CountTooLarge { count: u64::MAX })?;
        self.datatype = Some(super::datatype::large_contiguous(unit, units)?);
        self.count = 1;
        Ok(())
    }

    /// The packed copy: the elements in logical order (`fill`), or scratch of that size.
    fn own_copy(&mut self, facts: &Facts, fill: bool) -> Result<()> {
        let mut data = if fill {
            pack(facts)?
        } else {
            // Every byte is written by MPI before `finish` reads it (sizes are checked).
            Scratch::take(facts.packed_bytes()?)?
        };
        self.ptr = if data.is_empty() {
            std::ptr::null_mut()
        } else {
            data.as_mut_ptr().cast()
        };
        self.scratch = Some(data);
        Ok(())
    }
}

/// `units` as MPI's `int` count.
///
/// # Errors
/// [`Error::CountTooLarge`] with the unit count.
fn int_count(units: usize) -> Result<Count> {
    Count::try_from(units).map_err(|_| Error::CountTooLarge {
        count: units as u64,
    })
}

impl<'t> Side<'t, In> {
    /// The side MPI reads, of `tensor` with `facts` (its own, from [`Facts::of`]) as
    /// `encoding` says (from [`Encoding::choose`]).
    ///
    /// # Errors
    /// [`Error::CountTooLarge`] for a run or copy beyond `int` units where the encoding
    /// counts in `int`; the errors of the derived and large-count datatypes
    /// ([`crate::derived`]); [`Error::Allocation`] and [`Error::InvalidSetting`] of the
    /// scratch pool; [`Error::Overflow`] for a layout the pack kernels refuse.
    #[inline]
    pub(crate) fn new(tensor: &'t dyn Tensor, facts: Facts, encoding: Encoding) -> Result<Self> {
        let parts = Parts::build(&facts, encoding, true)?;
        Ok(Side::assemble(tensor, facts, encoding, parts))
    }
}

impl<'t> Side<'t, Out> {
    /// The side MPI writes (`access` [`Access::Write`]) or reads and writes
    /// ([`Access::Update`]: a packed copy starts as the tensor's values), of `tensor` with
    /// `facts` (from [`Facts::of`] with the same access) as `encoding` says.
    ///
    /// # Errors
    /// As [`Side::<In>::new`].
    #[inline]
    pub(crate) fn new(
        tensor: &'t mut dyn Tensor,
        facts: Facts,
        encoding: Encoding,
        access: Access,
    ) -> Result<Self> {
        let parts = Parts::build(&facts, encoding, access.reads())?;
        Ok(Side::assemble(tensor, facts, encoding, parts))
    }

    /// After MPI completed: unpacks the packed copy into the tensor (nothing for a side
    /// over the tensor's own memory), and hands the copy back to the pool.
    ///
    /// # Errors
    /// [`Error::Overflow`] for a layout the unpack kernels refuse (none for facts a side
    /// was built from).
    #[must_use = "a packed receive reaches its tensor only when finished"]
    pub(crate) fn finish(self) -> Result<()> {
        match (self.scratch, self.plan) {
            (Some(data), Some(plan)) => unpack(self.tensor, &plan, self.element, &data),
            _ => Ok(()),
        }
    }

    /// Forgets the packed copy without unpacking it (a receive that did not complete with
    /// the expected size leaves the tensor as it was).
    pub(crate) fn discard(mut self) {
        self.scratch = None;
    }
}

impl<'t, D: Direction> Side<'t, D> {
    #[inline]
    fn assemble(tensor: D::Ref<'t>, facts: Facts, encoding: Encoding, parts: Parts) -> Self {
        Side {
            tensor,
            encoding,
            element: facts.element,
            len_elems: facts.len_elems,
            units: parts.units,
            ptr: parts.ptr,
            count: parts.count,
            datatype: parts.datatype,
            scratch: parts.scratch,
            plan: facts.plan,
        }
    }

    /// Whether this side owns a packed copy.
    pub(crate) fn is_packed(&self) -> bool {
        self.scratch.is_some()
    }

    /// Number of DLPack elements.
    pub(crate) fn len_elems(&self) -> i64 {
        self.len_elems
    }

    /// The element type.
    pub(crate) fn element(&self) -> ElementType {
        self.element
    }

    /// MPI units (elements × lanes) of the elements.
    pub(crate) fn units(&self) -> usize {
        self.units
    }

    /// The first unit handed to MPI (NULL when empty).
    pub(crate) fn ptr(&self) -> *mut c_void {
        self.ptr
    }

    /// The predefined datatype of one unit.
    pub(crate) fn unit_datatype(&self) -> DatatypeRef<'static> {
        self.element.row.unit.datatype()
    }

    /// Bytes of one unit.
    pub(crate) fn unit_bytes(&self) -> usize {
        self.element.row.unit.size_bytes()
    }

    /// The part `[displacement, displacement + count)` (elements) of a side whose units
    /// are consecutive (a run or a packed copy): `(first byte, count, unit datatype)`;
    /// NULL for an empty window. The caller has checked the window against the tensor.
    ///
    /// # Errors
    /// [`Error::Overflow`], [`Error::CountTooLarge`].
    pub(crate) fn window(
        &self,
        displacement: i64,
        count: i64,
    ) -> Result<(*mut u8, Count, DatatypeRef<'static>)> {
        let offset_bytes = crate::layout::byte_span(displacement, self.element.size_bytes())?;
        let units = super::elems_to_units(count, &self.element)?;
        let ptr = if count == 0 {
            std::ptr::null_mut()
        } else {
            self.ptr.cast::<u8>().wrapping_add(offset_bytes)
        };
        Ok((ptr, units, self.unit_datatype()))
    }
}

/// Copies the elements of the tensor `facts` describes into a pooled buffer, in logical
/// order, with the pack kernels. A contiguous tensor is copied as one run.
///
/// # Errors
/// [`Error::Overflow`]; [`Error::InvalidSetting`] and [`Error::Allocation`] of the pool.
pub(crate) fn pack(facts: &Facts) -> Result<Scratch> {
    let elem = facts.element.size_bytes();
    let mut out = Scratch::take(facts.packed_bytes()?)?;
    let base = facts.first.cast::<u8>().cast_const();
    let Some(plan) = &facts.plan else {
        if !out.is_empty() {
            // SAFETY: a contiguous tensor's elements are `packed_bytes` readable bytes from
            // its first element (the facts checked the range); `out` is our own buffer.
            unsafe { std::ptr::copy_nonoverlapping(base, out.as_mut_ptr(), out.len()) };
        }
        return Ok(out);
    };
    // SAFETY: the facts checked that every element lies in the address range the producer
    // vouches for and that the memory is host-readable (`Reach::Host`); `out` is a buffer
    // of our own, disjoint from the tensor.
    let done = unsafe { kernels::pack(base, &plan.axes, elem, &mut out) };
    if done {
        Ok(out)
    } else {
        Err(kernel_refusal(plan, elem))
    }
}

/// Copies `data` (logical order, every element) into the elements of `tensor`, whose layout
/// is `plan`, with the unpack kernels.
///
/// # Errors
/// [`Error::Overflow`] for a layout the kernels refuse.
pub(crate) fn unpack(
    tensor: &mut dyn Tensor,
    plan: &Plan,
    element: ElementType,
    data: &[u8],
) -> Result<()> {
    let elem = element.size_bytes();
    let base = tensor.first_element_ptr().cast::<u8>();
    // SAFETY: the side's facts proved the tensor writable, its elements disjoint and in
    // range, and host-writable; `&mut` makes this the only access, and `data` is not the
    // tensor's memory.
    let done = unsafe { kernels::unpack(data, base, &plan.axes, elem) };
    if done {
        Ok(())
    } else {
        Err(kernel_refusal(plan, elem))
    }
}

// SAFETY: `ptr` is the tensor's first element (its facts checked the range of every element
// and the device; the side borrows the tensor for 't), the packed copy this value owns, or
// NULL when empty; it holds `count` items of `as_datatype()`.
unsafe impl<D: Direction> Pointer for Side<'_, D> {
    #[inline]
    fn pointer(&self) -> *const c_void {
        self.ptr
    }
}

// SAFETY: only an `Out` side: its tensor is borrowed exclusively and its facts proved it
// writable (not READ_ONLY, not IS_COPIED) and free of overlap, or the pointer is the copy
// this value owns.
unsafe impl PointerMut for Side<'_, Out> {
    #[inline]
    fn pointer_mut(&mut self) -> *mut c_void {
        self.ptr
    }
}

// SAFETY: `count` is the number of `as_datatype()` items described: units of the predefined
// type (checked to fit `int`), or 1 of a large-count or derived datatype. A chunked side's
// count is not used by MPI (reductions pass chunk counts).
unsafe impl<D: Direction> Collection for Side<'_, D> {
    #[inline]
    fn count(&self) -> Count {
        self.count
    }
}

// SAFETY: the predefined unit type of the element (dtype table invariant: its size is the
// unit's), or the committed type the derived-type cache keeps for the whole process.
unsafe impl<D: Direction> AsDatatype for Side<'_, D> {
    type Out = DatatypeRef<'static>;
    #[inline]
    fn as_datatype(&self) -> Self::Out {
        match self.datatype {
            None => self.unit_datatype(),
            // SAFETY: a committed type the derived-type cache keeps for the whole process.
            Some(t) => unsafe { DatatypeRef::from_raw(t) },
        }
    }
}

// SAFETY: see the impls above.
unsafe impl<D: Direction> Buffer for Side<'_, D> {}
// SAFETY: see the impls above.
unsafe impl BufferMut for Side<'_, Out> {}

/// Sides of contiguous and packed encodings build no MPI datatype, so these run without
/// MPI. Not under Miri: the scratch pool asks MPI whether it is initialized (a C call) to
/// enlist itself for `MPI_Finalize`.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::dlpack::{acquire, AcquireOptions, Owned};
    use crate::spec::encoding::Need;

    /// A transposed 3 × 2 view packs into logical row-major order, computes its plan once
    /// (the facts'), and builds no datatype; the receive side unpacks into the view's
    /// elements only.
    #[test]
    #[cfg_attr(miri, ignore = "the scratch pool calls MPI_Initialized")]
    fn packed_sides_copy_in_logical_order_and_build_no_datatype() {
        let before = crate::spec::datatype::cached_count();
        // storage [0 1 2 3 4 5] as a 3 × 2 view with strides (1, 3): rows (0 3) (1 4) (2 5)
        let src = Owned::new((0..6).map(|i| i as f32).collect::<Vec<f32>>())
            .with_layout(&[3, 2], Some(&[1, 3]), 0)
            .unwrap();
        let s = acquire(&src, &AcquireOptions::default()).unwrap();
        let facts = Facts::of(&s, Access::Read, None).unwrap();
        assert!(facts.plan.is_some());
        let e = Encoding::choose(&facts, Need::Units, |_| Ok(false)).unwrap();
        let side = Side::<In>::new(&s, facts, e).unwrap();
        assert!(side.is_packed());
        assert_eq!((side.count(), side.units()), (6, 6));
        // SAFETY: the side's packed copy holds 6 f32 and lives until the end of the test.
        let packed = unsafe { std::slice::from_raw_parts(side.pointer().cast::<f32>(), 6) };
        assert_eq!(packed, &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);

        let mut dst = Owned::new(vec![-1.0f32; 8])
            .with_layout(&[3, 2], Some(&[1, 4]), 0)
            .unwrap();
        {
            let mut d = acquire(&dst, &AcquireOptions::default()).unwrap();
            let facts = Facts::of(&d, Access::Write, None).unwrap();
            let e = Encoding::choose(&facts, Need::Units, |_| Ok(false)).unwrap();
            let mut out = Side::<Out>::new(&mut d, facts, e, Access::Write).unwrap();
            let p = out.pointer_mut().cast::<f32>();
            for (i, v) in [10.0f32, 13.0, 11.0, 14.0, 12.0, 15.0].iter().enumerate() {
                // SAFETY: the packed copy holds 6 f32; MPI would write them the same way.
                unsafe { p.add(i).write(*v) };
            }
            out.finish().unwrap();
        }
        // (i, j) lives at i + 4 j: logical (0,0)=10 (0,1)=13 (1,0)=11 (1,1)=14 (2,0)=12 (2,1)=15
        assert_eq!(
            dst.as_slice(),
            &[10.0, 11.0, 12.0, -1.0, 13.0, 14.0, 15.0, -1.0]
        );
        assert_eq!(
            crate::spec::datatype::cached_count(),
            before,
            "no datatype was built"
        );
    }

    /// An update side's copy starts as the tensor's values; a write side's is scratch that
    /// MPI overwrites; a side over a contiguous tensor is the tensor itself (empty: NULL).
    #[test]
    #[cfg_attr(miri, ignore = "the scratch pool calls MPI_Initialized")]
    fn update_copies_values_and_runs_are_the_tensor() {
        let src = Owned::new(vec![1.0f32, 2.0, 3.0, 4.0])
            .with_layout(&[2], Some(&[2]), 0)
            .unwrap();
        let mut t = acquire(&src, &AcquireOptions::default()).unwrap();
        let facts = Facts::of(&t, Access::Update, None).unwrap();
        let side = Side::<Out>::new(&mut t, facts, Encoding::Chunked, Access::Update).unwrap();
        // SAFETY: the copy holds 2 f32.
        let copy = unsafe { std::slice::from_raw_parts(side.ptr().cast::<f32>(), 2) };
        assert_eq!(copy, &[1.0, 3.0]);
        side.discard();

        let run = Owned::new(vec![5u8; 3]);
        let r = acquire(&run, &AcquireOptions::default()).unwrap();
        let facts = Facts::of(&r, Access::Read, None).unwrap();
        let side = Side::<In>::new(&r, facts, Encoding::Run).unwrap();
        assert_eq!(side.pointer(), r.first_element_ptr().cast_const());
        assert!(!side.is_packed());
        let empty = Owned::new(Vec::<u8>::new());
        let e = acquire(&empty, &AcquireOptions::default()).unwrap();
        let facts = Facts::of(&e, Access::Read, None).unwrap();
        let side = Side::<In>::new(&e, facts, Encoding::Run).unwrap();
        assert!(side.pointer().is_null() && side.count() == 0);
    }
}
