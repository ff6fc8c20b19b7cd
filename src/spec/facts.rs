//! The facts of a tensor that every encoding of it needs, computed once ([`Facts`]): its
//! element type, element count, first element, byte range, and, when its elements are not
//! one run, the merged-axes layout plan that a pack, an unpack, a derived datatype and a
//! device copy all read.
//!
//! A contiguous tensor computes no plan and allocates nothing (the per-message hot path);
//! a strided one plans once ([`layout::plan`]), and that plan travels with the facts to the
//! encoding that uses it.

use std::ffi::c_void;

use super::operand::{Access, Reach};
use crate::device::Device;
use crate::dlpack::Tensor;
use crate::dtype::{self, ElementType};
use crate::error::{Error, Result};
use crate::layout::{self, Plan};

/// What a tensor's elements are and where they lie, in elements and bytes.
// repr(C), word-sized fields first (as `spec::Described` and `ElementType`): facts are
// moved out of a `Result` on every message, and small fields at odd offsets made those
// moves hit store-forwarding stalls.
#[derive(Debug, Clone)]
#[repr(C)]
pub(crate) struct Facts {
    /// The first element (`data + byte_offset`); the tensor's pointer even when it is empty.
    pub(crate) first: *mut c_void,
    /// Number of DLPack elements.
    pub(crate) len_elems: i64,
    /// Lowest byte address an element touches.
    pub(crate) start: usize,
    /// One past the highest byte address an element touches.
    pub(crate) end: usize,
    /// The merged-axes plan when the elements are not one run in logical order; `None`
    /// for a C-contiguous tensor (`layout`'s rule: extent-1 axes ignored). Boxed: the
    /// contiguous hot path moves small facts and allocates nothing.
    pub(crate) plan: Option<Box<Plan>>,
    /// MPI units (elements × lanes) of the elements; `None` when that overflows `usize`.
    units: Option<usize>,
    /// The DLPack dtype and its MPI unit.
    pub(crate) element: ElementType,
    /// How the memory reaches MPI: [`Reach::Host`] unless a stager said otherwise.
    pub(crate) reach: Reach,
    /// The device the tensor's label names.
    pub(crate) device: Device,
}

impl Facts {
    /// The facts of `t` for an operation that does `access` to it. `reach`: the stager's
    /// word on how the memory reaches MPI, or `None` for a tensor no stager has seen (then
    /// its device label must be host-accessible, and it is [`Reach::Host`]).
    ///
    /// The checks run in this order, each before any MPI call: the MPI library the process
    /// loaded is the one this build was compiled against
    /// ([`crate::mpi_library::ensure_matching`], [`Error::MpiLibraryMismatch`]: decided at
    /// the first call of the process, one atomic load after it); for an access that writes,
    /// `READ_ONLY` ([`Error::ReadOnly`]/[`Error::Immutable`], C41), `IS_COPIED`
    /// ([`Error::IsCopied`], C42) and overlapping elements ([`Error::Overlap`], C26); the
    /// device ([`Error::UnsupportedDevice`], naming `DeviceComm` for CUDA memory); then the
    /// facts themselves ([`Facts::measure`]).
    ///
    /// # Errors
    /// As listed above and as [`Facts::measure`].
    #[inline]
    pub(crate) fn of<T: Tensor + ?Sized>(
        t: &T,
        access: Access,
        reach: Option<Reach>,
    ) -> Result<Self> {
        // Every operation, spec and checked message computes its operands' facts before it
        // enters MPI: the one place that tells a program running on another MPI than it was
        // built against (a dependent program has no run path of ours), whatever it calls.
        crate::mpi_library::ensure_matching()?;
        if access.writes() {
            access_checks(t)?;
        }
        let device = t.device();
        let reach = match reach {
            Some(r) => r,
            None => {
                device.check_host_accessible()?;
                Reach::Host
            }
        };
        Self::measure_as(t, reach, device)
    }

    /// The facts of `t` alone, without access or device checks (the transport makes its
    /// own before it stages device memory). [`Reach::Host`] until a caller says otherwise;
    /// the device is [`Device::CPU`] until [`Facts::of`] reads the label.
    ///
    /// # Errors
    /// [`Error::UnsupportedDtype`] (no MPI type of the dtype's size), the layout errors of
    /// [`layout::plan`], and [`Error::Overflow`] when the byte range leaves the address
    /// space.
    #[inline]
    pub(crate) fn measure<T: Tensor + ?Sized>(t: &T) -> Result<Self> {
        Self::measure_as(t, Reach::Host, Device::CPU)
    }

    /// [`Facts::measure`], with the reach and device recorded (built in place: one move
    /// out of the `Result` per operand).
    #[inline]
    fn measure_as<T: Tensor + ?Sized>(t: &T, reach: Reach, device: Device) -> Result<Self> {
        let element = dtype::lookup(t.dtype())?;
        let first = t.first_element_ptr();
        match layout::check_c_contiguous(t.shape(), t.strides_elems()) {
            Ok(()) => Self::run_as(first, t.num_elements(), element, (reach, device)),
            Err(Error::NonContiguous { .. }) => {
                let mut f = Self::strided(t, first, element)?;
                (f.reach, f.device) = (reach, device);
                Ok(f)
            }
            Err(e) => Err(e),
        }
    }

    /// `len_elems` consecutive elements from `first`.
    #[inline]
    pub(crate) fn run(first: *mut c_void, len_elems: i64, element: ElementType) -> Result<Self> {
        Self::run_as(first, len_elems, element, (Reach::Host, Device::CPU))
    }

    #[inline]
    fn run_as(
        first: *mut c_void,
        len_elems: i64,
        element: ElementType,
        (reach, device): (Reach, Device),
    ) -> Result<Self> {
        let span = layout::byte_span(len_elems, element.size_bytes())?;
        let start = first as usize;
        let end = start.checked_add(span).ok_or(Error::Overflow {
            quantity: "first element + byte span",
            lhs: start as i128,
            operator: "+",
            rhs: span as i128,
        })?;
        Ok(Facts {
            first,
            len_elems,
            element,
            start,
            end,
            plan: None,
            units: units_of(len_elems, &element),
            reach,
            device,
        })
    }

    #[cold]
    fn strided<T: Tensor + ?Sized>(
        t: &T,
        first: *mut c_void,
        element: ElementType,
    ) -> Result<Self> {
        let plan = layout::plan(t.shape(), t.strides_elems())?;
        let size = element.size_bytes() as i128;
        let base = first as usize as i128;
        let start = base + i128::from(plan.lowest_elem) * size;
        let end = base + (i128::from(plan.highest_elem) + 1) * size;
        let (Ok(start_u), Ok(end_u)) = (usize::try_from(start), usize::try_from(end)) else {
            return Err(Error::Overflow {
                quantity: "address range of the strided elements",
                lhs: start,
                operator: "..",
                rhs: end,
            });
        };
        Ok(Facts {
            first,
            len_elems: plan.len_elems,
            element,
            start: start_u,
            end: end_u,
            units: units_of(plan.len_elems, &element),
            plan: Some(Box::new(plan)),
            reach: Reach::Host,
            device: Device::CPU,
        })
    }

    /// The elements `[displacement, displacement + count)` of a contiguous tensor's facts,
    /// bounds-checked (`what` names the window in the error).
    ///
    /// # Errors
    /// [`Error::StridedNotSupported`] for strided facts; [`Error::OutOfBounds`];
    /// [`Error::Overflow`].
    pub(crate) fn window(&self, what: &str, displacement: i64, count: i64) -> Result<Self> {
        if !self.is_contiguous() {
            return Err(Error::StridedNotSupported {
                operation: "element ranges",
            });
        }
        layout::check_range(|| what.to_string(), displacement, count, self.len_elems)?;
        let offset_bytes = layout::byte_span(displacement, self.element.size_bytes())?;
        let first = self.first.cast::<u8>().wrapping_add(offset_bytes).cast();
        let mut w = Self::run(first, count, self.element)?;
        (w.reach, w.device) = (self.reach, self.device);
        Ok(w)
    }

    /// Whether the elements are one run in logical order.
    #[inline]
    pub(crate) fn is_contiguous(&self) -> bool {
        self.plan.is_none()
    }

    /// Bytes from the lowest to one past the highest byte an element touches.
    pub(crate) fn span_bytes(&self) -> usize {
        self.end - self.start
    }

    /// Bytes of the elements themselves (`len_elems × element size`), when that fits.
    pub(crate) fn packed_bytes(&self) -> Result<usize> {
        usize::try_from(self.len_elems)
            .ok()
            .and_then(|n| n.checked_mul(self.element.size_bytes()))
            .ok_or(Error::Overflow {
                quantity: "packed bytes of the strided elements",
                lhs: i128::from(self.len_elems),
                operator: "*",
                rhs: self.element.size_bytes() as i128,
            })
    }

    /// Whether the span holds nothing but the elements (a receive need not read it first).
    pub(crate) fn is_dense(&self) -> bool {
        self.span_bytes() as i128 == i128::from(self.len_elems) * self.element.size_bytes() as i128
    }

    /// Number of MPI units (elements × lanes) of the elements.
    ///
    /// # Errors
    /// [`Error::Overflow`] when that does not fit `usize` (a stride-0 view may describe
    /// more elements than its address range holds).
    #[inline]
    pub(crate) fn units(&self) -> Result<usize> {
        self.units.ok_or(Error::Overflow {
            quantity: "MPI units of a flat buffer (elements × lanes)",
            lhs: i128::from(self.len_elems),
            operator: "*",
            rhs: i128::from(self.element.dtype.lanes),
        })
    }

    /// The contiguous inner block in elements: the innermost merged axis's extent when its
    /// stride is one element, else 1; the whole tensor when contiguous.
    pub(crate) fn inner_run_elems(&self) -> usize {
        match &self.plan {
            None => usize::try_from(self.len_elems).unwrap_or(usize::MAX),
            Some(plan) => match plan.axes.last() {
                Some(a) if a.stride_elems == 1 => usize::try_from(a.extent).unwrap_or(usize::MAX),
                _ => 1,
            },
        }
    }
}

/// `len_elems` elements of `element` as MPI units (elements × lanes); `None` on overflow.
#[inline]
fn units_of(len_elems: i64, element: &ElementType) -> Option<usize> {
    usize::try_from(len_elems)
        .ok()
        .and_then(|n| n.checked_mul(element.units_per_element()))
}

/// The checks of a tensor MPI writes: not `READ_ONLY`, not `IS_COPIED`, elements disjoint.
///
/// # Errors
/// [`Error::ReadOnly`] / [`Error::Immutable`], [`Error::IsCopied`], [`Error::Overlap`].
#[inline]
pub(crate) fn access_checks<T: Tensor + ?Sized>(t: &T) -> Result<()> {
    if t.is_read_only() {
        return Err(t.read_only_error());
    }
    if t.is_copied() {
        return Err(Error::IsCopied);
    }
    layout::check_no_overlap(t.shape(), t.strides_elems())
}

/// The error for a layout the pack kernels refuse (a stride whose byte distance overflows
/// `isize`); none for a tensor whose facts were computed.
pub(crate) fn kernel_refusal(plan: &Plan, elem: usize) -> Error {
    Error::Overflow {
        quantity: "byte strides of the strided elements",
        lhs: i128::from(plan.highest_elem - plan.lowest_elem),
        operator: "*",
        rhs: elem as i128,
    }
}
