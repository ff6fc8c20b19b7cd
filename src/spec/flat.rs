//! The contiguous form of one side of an operation ([`FlatSpec`]), and the packing that
//! makes it: a strided tensor is copied into a scratch buffer in logical row-major order,
//! and a receive scratch is copied back after MPI completes (the `Packing::Copy` path).
//!
//! Used where a derived datatype cannot serve: MPI's predefined reductions are defined on
//! predefined datatypes only (Open MPI refuses them on derived types: "MPI_SUM is not defined
//! for non-intrinsic datatypes"), per-rank blocks need a buffer that splits into equal units,
//! and user code may prefer a packed copy on stacks where derived datatypes are slow. The
//! element order is the one [`crate::layout::Plan::offsets`] gives, so a packed buffer holds
//! exactly what a derived datatype would send.

use std::ffi::c_void;

use mpi::datatype::{AsDatatype, Buffer, BufferMut, Collection, DatatypeRef, Pointer, PointerMut};
use mpi::ffi::MPI_Datatype;
use mpi::raw::FromRaw;
use mpi::Count;

use super::kernels;
use super::scratch::Scratch;
use super::{RecvSpec, SendSpec};
use crate::dlpack::Tensor;
use crate::dtype::{ElementType, MpiUnit};
use crate::error::Error;
use crate::error::Result;
use crate::layout::{self, Plan};

/// The packed byte count of `plan`'s elements, `elem` bytes each.
fn packed_bytes(plan: &Plan, elem: usize) -> Result<usize> {
    usize::try_from(plan.len_elems)
        .ok()
        .and_then(|n| n.checked_mul(elem))
        .ok_or(Error::Overflow {
            quantity: "packed bytes of the strided elements",
            lhs: i128::from(plan.len_elems),
            operator: "*",
            rhs: elem as i128,
        })
}

/// The error for a layout the pack kernels refuse (a stride whose byte distance overflows
/// `isize`); none for a tensor a spec was built from.
fn refused(plan: &Plan, elem: usize) -> Error {
    Error::Overflow {
        quantity: "byte strides of the strided elements",
        lhs: i128::from(plan.highest_elem - plan.lowest_elem),
        operator: "*",
        rhs: elem as i128,
    }
}

/// Copies the elements of `tensor` into a pooled buffer, in logical order, with the pack
/// kernels ([`super::kernels::pack`]). The caller has validated the tensor with a send spec
/// (host memory, address range) and passes its element size in bytes.
///
/// # Errors
/// Layout errors of [`layout::plan`] (none for a tensor a spec was built from);
/// [`Error::Overflow`]; [`Error::InvalidSetting`] for a bad pool cap.
pub(crate) fn pack(tensor: &dyn Tensor, elem: usize) -> Result<Scratch> {
    let plan = layout::plan(tensor.shape(), tensor.strides_elems())?;
    let mut out = Scratch::take(packed_bytes(&plan, elem)?)?;
    let base = tensor.first_element_ptr().cast::<u8>().cast_const();
    // SAFETY: the spec checked that every element lies in the address range the producer
    // vouches for (`byte_range`); `out` is a buffer of our own, disjoint from the tensor.
    let done = unsafe { kernels::pack(base, &plan.axes, elem, &mut out) };
    if done {
        Ok(out)
    } else {
        Err(refused(&plan, elem))
    }
}

/// Copies `data` (logical order) into the elements of `tensor` with the unpack kernels
/// ([`super::kernels::unpack`]). The caller has validated the tensor with a receive spec
/// (writable, elements disjoint) and passes its element size; `data` holds every element.
///
/// # Errors
/// Layout errors of [`layout::plan`] (none for a tensor a spec was built from);
/// [`Error::Overflow`] when `data` is not the tensor's packed size.
pub(crate) fn unpack(tensor: &mut dyn Tensor, elem: usize, data: &[u8]) -> Result<()> {
    let plan = layout::plan(tensor.shape(), tensor.strides_elems())?;
    let base = tensor.first_element_ptr().cast::<u8>();
    // SAFETY: as in `pack`; the receive spec proved the tensor writable and its elements
    // disjoint, `&mut` makes this the only access, and `data` is not the tensor's memory.
    let done = unsafe { kernels::unpack(data, base, &plan.axes, elem) };
    if done {
        Ok(())
    } else {
        Err(refused(&plan, elem))
    }
}

/// One side of an operation as `units` consecutive units of the element's predefined MPI
/// type: the tensor's own memory when its elements are one run, else a scratch buffer in
/// logical order. MPI's predefined reductions take predefined datatypes only, and per-rank
/// blocks need a buffer that splits into equal units, so these paths hand MPI a `FlatSpec`.
///
/// A send side is made whole by [`FlatSpec::send`]. A receive side takes two steps, because
/// the receive spec borrows the tensor exclusively: [`FlatSpec::recv`] reads the validated
/// spec (which then ends), and [`FlatSpec::ready`] makes the scratch from the tensor. After
/// MPI completes, [`FlatSpec::finish`] copies a scratch back into the tensor.
#[derive(Debug)]
pub(crate) struct FlatSpec {
    /// First unit: the tensor's validated first element, the scratch buffer, or NULL when
    /// empty (or, between `recv` and `ready`, for a strided tensor).
    pub(crate) ptr: *mut c_void,
    /// Number of DLPack elements.
    pub(crate) len_elems: i64,
    /// Number of units of `unit` (elements × lanes).
    pub(crate) units: usize,
    /// The elements' dtype and MPI unit.
    pub(crate) element: ElementType,
    /// The predefined MPI unit type of the elements.
    pub(crate) unit: MpiUnit,
    /// Bytes per DLPack element (`lanes × unit` bytes).
    pub(crate) elem_bytes: usize,
    /// Whether the tensor's elements are one run (then no scratch is needed).
    pub(crate) contiguous: bool,
    /// The packed copy in logical order (strided tensors, after `send`/`ready`).
    scratch: Option<Scratch>,
    /// The large-count datatype of all `units` (sent with count 1) when they exceed MPI's
    /// `int` ([`FlatSpec::whole`]); `None`: `units` of `unit`.
    large: Option<MPI_Datatype>,
}

impl FlatSpec {
    /// The send side: the tensor's own run, or a packed copy of its elements.
    ///
    /// # Errors
    /// Layout errors of [`layout::plan`] (none for a tensor `s` was built from).
    pub(crate) fn send(send: &dyn Tensor, s: &SendSpec<'_>) -> Result<Self> {
        let e = s.element_type();
        let mut flat = FlatSpec {
            ptr: s.pointer() as *mut c_void,
            len_elems: s.len_elems(),
            units: units_of(s.len_elems(), &e)?,
            element: e,
            unit: e.row.unit,
            elem_bytes: e.size_bytes(),
            contiguous: s.is_contiguous(),
            scratch: None,
            large: None,
        };
        if !flat.contiguous {
            flat.set_scratch(pack(send, flat.elem_bytes)?);
        }
        Ok(flat)
    }

    /// The facts of a receive side, read from its validated spec. A strided receive has no
    /// buffer until [`FlatSpec::ready`].
    ///
    /// # Errors
    /// [`Error::Overflow`] when the units do not fit `usize` (not for a receive spec, whose
    /// disjoint elements lie in an address range that fits `usize`).
    pub(crate) fn recv(r: &mut RecvSpec<'_>) -> Result<Self> {
        let e = r.element_type();
        let contiguous = r.is_contiguous();
        Ok(FlatSpec {
            ptr: if contiguous {
                r.pointer_mut()
            } else {
                std::ptr::null_mut()
            },
            len_elems: r.len_elems(),
            units: units_of(r.len_elems(), &e)?,
            element: e,
            unit: e.row.unit,
            elem_bytes: e.size_bytes(),
            contiguous,
            scratch: None,
            large: None,
        })
    }

    /// The receive buffer, after the spec that [`FlatSpec::recv`] read has ended: the
    /// tensor's memory when it is one run, else a scratch buffer. `preserve`: the operation
    /// reads the buffer (in place) or leaves parts of it alone (v-variants), so the scratch
    /// starts as a packed copy of the current values; else it starts zeroed.
    ///
    /// # Errors
    /// Layout errors of [`layout::plan`] (none for a tensor a spec was built from).
    pub(crate) fn ready(mut self, recv: &dyn Tensor, preserve: bool) -> Result<Self> {
        if self.contiguous {
            return Ok(self);
        }
        let data = if preserve {
            pack(recv, self.elem_bytes)?
        } else {
            // Every byte is written by MPI before `finish` reads it (the sizes are checked).
            Scratch::take(self.units * self.unit.size_bytes())?
        };
        self.set_scratch(data);
        Ok(self)
    }

    /// A flat used as one rsmpi buffer: its unit count must fit MPI's `int`.
    ///
    /// # Errors
    /// [`Error::CountTooLarge`] with the unit count.
    pub(crate) fn counted(self) -> Result<Self> {
        if self.units > i32::MAX as usize {
            return Err(Error::CountTooLarge {
                count: self.units as u64,
            });
        }
        Ok(self)
    }

    /// A flat used as one rsmpi buffer of any size: beyond MPI's `int` units it is one
    /// large-count datatype (`contiguous(q, contiguous(2^30, unit))` plus the rest, see
    /// [`super::datatype::large_contiguous`]) sent with count 1, so a packed copy of more
    /// than `i32::MAX` units goes whole (point-to-point, where the receiver compares the
    /// whole message).
    ///
    /// # Errors
    /// As [`super::datatype::large_contiguous`].
    pub(crate) fn whole(mut self) -> Result<Self> {
        if self.units > i32::MAX as usize {
            let units =
                u64::try_from(self.units).map_err(|_| Error::CountTooLarge { count: u64::MAX })?;
            self.large = Some(super::datatype::large_contiguous(self.unit, units)?);
        }
        Ok(self)
    }

    /// Whether [`FlatSpec::whole`] made this flat one large-count datatype (count 1).
    pub(crate) fn is_large(&self) -> bool {
        self.large.is_some()
    }

    /// Copies a receive scratch back into `recv` (nothing to do for a contiguous tensor).
    ///
    /// # Errors
    /// Layout errors of [`layout::plan`] (none for a tensor a spec was built from).
    pub(crate) fn finish(self, recv: &mut dyn Tensor) -> Result<()> {
        match self.scratch {
            Some(data) => unpack(recv, self.elem_bytes, &data),
            None => Ok(()),
        }
    }

    /// Keeps `data` as the buffer. An empty scratch is handed to MPI as NULL: an empty
    /// Vec's dangling `0x1` is Open MPI's `MPI_IN_PLACE`.
    fn set_scratch(&mut self, mut data: Scratch) {
        self.ptr = if data.is_empty() {
            std::ptr::null_mut()
        } else {
            data.as_mut_ptr().cast()
        };
        self.scratch = Some(data);
    }
}

/// `len_elems` elements of `e` as a number of MPI units (elements × lanes).
///
/// # Errors
/// [`Error::Overflow`] when that does not fit `usize` (a send spec may describe more
/// elements than its address range holds: stride 0 repeats one element).
fn units_of(len_elems: i64, e: &ElementType) -> Result<usize> {
    usize::try_from(len_elems)
        .ok()
        .and_then(|n| n.checked_mul(e.units_per_element()))
        .ok_or(Error::Overflow {
            quantity: "MPI units of a flat buffer (elements × lanes)",
            lhs: i128::from(len_elems),
            operator: "*",
            rhs: i128::from(e.dtype.lanes),
        })
}

// SAFETY: `ptr` is the tensor's validated first element (contiguous, from a spec), the
// scratch buffer this value owns, or NULL when empty; it holds `units` units of `unit`.
unsafe impl Pointer for FlatSpec {
    fn pointer(&self) -> *const c_void {
        self.ptr
    }
}

// SAFETY: as above; a receive flat comes from a validated receive spec (writable, disjoint
// elements) or owns its scratch.
unsafe impl PointerMut for FlatSpec {
    fn pointer_mut(&mut self) -> *mut c_void {
        self.ptr
    }
}

// SAFETY: `units` fits an int whenever a FlatSpec is used as an rsmpi buffer (`counted`),
// or the large-count type describes them all with count 1 (`whole`).
unsafe impl Collection for FlatSpec {
    fn count(&self) -> Count {
        if self.large.is_some() {
            return 1;
        }
        Count::try_from(self.units).unwrap_or(Count::MAX)
    }
}

// SAFETY: the predefined unit type of the elements, or the large-count type of all units.
unsafe impl AsDatatype for FlatSpec {
    type Out = DatatypeRef<'static>;
    fn as_datatype(&self) -> Self::Out {
        match self.large {
            // SAFETY: a committed type the derived-type cache keeps for the whole process.
            Some(t) => unsafe { DatatypeRef::from_raw(t) },
            None => self.unit.datatype(),
        }
    }
}

// SAFETY: see the impls above.
unsafe impl Buffer for FlatSpec {}
// SAFETY: see the impls above.
unsafe impl BufferMut for FlatSpec {}
