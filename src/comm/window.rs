//! Windowed point-to-point transfers: elements `[start, end)` of a tensor, in elements and
//! logical row-major order (mpi4py's `[buf, count, displacement]` buffer form with
//! `displacement = start`, `count = end - start`), blocking and nonblocking. The message is
//! the window's elements in logical order, whatever the layout.
//!
//! The bounds are checked first (a typed [`crate::Error::OutOfBounds`] naming the
//! displacement, count and tensor length, before any MPI call). A contiguous tensor's
//! window is a [`SendSpec::range`]/[`RecvSpec::range`] (no copy). A strided tensor's window
//! goes through a packed copy of the **whole** tensor (the pack kernels work on whole
//! layouts): a send packs it and sends the window's part; a receive packs the current
//! values, receives into the window's part and unpacks the whole, so the elements outside
//! the window keep their values. That costs one pass over the tensor, whatever the policy
//! ([`super::Packing`]) says (a derived datatype for a window of a strided layout is not
//! built).

use std::ops::Range;

use mpi::datatype::{AsDatatype, Collection, PointerMut};
use mpi::point_to_point::{Destination, Status};
use mpi::raw::AsRaw;
use mpi::request::Scope;
use mpi::topology::{Communicator, Rank};
use mpi::traits::Equivalence;
use mpi::Tag;

use super::checks::{check_incoming, check_rank, check_tag};
use super::p2p::unfit;

use super::immediate::{post_recv, post_send, Posted, TensorRequest};
use super::sides::SendSide;
use crate::dlpack::Tensor;
use crate::error::{Error, Matched, Result};
use crate::layout;
use crate::raw;
use crate::spec::flat::FlatSpec;
use crate::spec::{elems_to_units, RecvSpec, SendSpec};

/// `(displacement, count)` of `elems`, in elements; an end before the start is a negative
/// count, which the range check refuses.
fn displacement_count(elems: &Range<i64>) -> (i64, i64) {
    (elems.start, elems.end.saturating_sub(elems.start))
}

/// The bounds check of a window of a tensor of `len` elements.
fn check_window(displacement: i64, count: i64, len: i64) -> Result<()> {
    layout::check_range(|| "range".to_string(), displacement, count, len)
}

/// Elements `[displacement, displacement + count)` (checked) of a packed copy `flat`: their
/// first byte, their count in units of the predefined unit type, that type.
fn window_of(flat: &FlatSpec, displacement: i64, count: i64) -> Result<Posted<*mut u8>> {
    let offset_bytes = layout::byte_span(displacement, flat.elem_bytes)?;
    let units = elems_to_units(count, &flat.element)?;
    let ptr = if count == 0 {
        std::ptr::null_mut() // never the tensor's pointer for an empty buffer (MPI_IN_PLACE)
    } else {
        flat.ptr.cast::<u8>().wrapping_add(offset_bytes)
    };
    Ok((ptr, units, flat.unit.datatype()))
}

/// A count MPI was given, as a `usize` (never negative here).
fn units(count: mpi::Count) -> usize {
    usize::try_from(count).unwrap_or(0)
}

/// [`super::TensorComm::send_tensor_range`].
pub(super) fn send<C: Communicator + ?Sized>(
    comm: &C,
    tensor: &dyn Tensor,
    elems: Range<i64>,
    dest: Rank,
    tag: Tag,
) -> Result<()> {
    check_rank(dest, comm.target_size())?;
    check_tag(tag)?;
    let (displacement, count) = displacement_count(&elems);
    let spec = SendSpec::new(tensor)?;
    check_window(displacement, count, spec.len_elems())?;
    if spec.is_contiguous() {
        let window = spec.range_of(displacement, count)?;
        comm.process_at_rank(dest).send_with_tag(&window, tag);
        return Ok(());
    }
    let flat = FlatSpec::send(tensor, &spec)?;
    let (ptr, count, datatype) = window_of(&flat, displacement, count)?;
    // SAFETY: `ptr` holds `count` units of `datatype` inside the packed copy `flat`, which
    // lives until the request is waited for just below.
    let mut request = Some(unsafe {
        raw::isend(
            ptr,
            units(count),
            datatype.as_raw(),
            dest,
            tag,
            comm.as_raw(),
        )
    }?);
    raw::wait(&mut request);
    drop(flat);
    Ok(())
}

/// [`super::TensorComm::recv_tensor_range`].
pub(super) fn recv<C: Communicator + ?Sized>(
    comm: &C,
    tensor: &mut dyn Tensor,
    elems: Range<i64>,
    source: Rank,
    tag: Tag,
) -> Result<Status> {
    check_rank(source, comm.target_size())?;
    check_tag(tag)?;
    let (displacement, count) = displacement_count(&elems);
    let mut spec = RecvSpec::new(&mut *tensor)?;
    check_window(displacement, count, spec.len_elems())?;
    let process = comm.process_at_rank(source);
    // The message is matched (`MPI_Mprobe`), so a concurrent receiver on the same
    // (source, tag) cannot take it; one that does not fit is held in `Error::Unfit`.
    if spec.is_contiguous() {
        let mut window = RecvSpec::range(&mut *tensor, displacement, count)?;
        let matched = Matched::probe(&process, tag);
        if let Err(mismatch) = check_incoming(&window, &matched.status()) {
            return Err(unfit(mismatch, matched, None));
        }
        return Ok(matched.receive_into(&mut window));
    }
    let flat = FlatSpec::recv(&mut spec)?.ready(&*tensor, true)?;
    let (ptr, units_posted, datatype) = window_of(&flat, displacement, count)?;
    let matched = Matched::probe(&process, tag);
    let arrived = check_arrived(
        &matched.status(),
        (units_posted, datatype),
        count,
        flat.elem_bytes,
    );
    if let Err(mismatch) = arrived {
        return Err(unfit(mismatch, matched, None));
    }
    // SAFETY: `ptr` has room for `units_posted` units of `datatype` inside the scratch
    // `flat` owns, which nothing else touches until the receive returns; the size was
    // compared just above.
    let status = unsafe { matched.receive_raw(ptr.cast(), units_posted, datatype.as_raw()) };
    flat.finish(tensor)?;
    Ok(status)
}

/// A probed message against a window of `count_elems` elements posted as `posted` units of
/// `datatype`: equal, or [`Error::CountMismatch`] in elements (the caller holds the message
/// in [`Error::Unfit`]).
fn check_arrived(
    status: &Status,
    (posted, datatype): (mpi::Count, mpi::datatype::DatatypeRef<'static>),
    count_elems: i64,
    elem_bytes: usize,
) -> Result<()> {
    if status.count(datatype) == posted {
        return Ok(());
    }
    let bytes = i64::from(status.count(u8::equivalent_datatype()));
    let elem = i64::try_from(elem_bytes).unwrap_or(i64::MAX);
    Err(Error::CountMismatch {
        what: format!(
            "incoming message from rank {} tag {} ({bytes} bytes of {elem}-byte elements) for \
             a window",
            status.source_rank(),
            status.tag()
        ),
        expected: count_elems,
        actual: if bytes >= 0 { bytes / elem } else { -1 },
    })
}

/// [`super::TensorComm::immediate_send_tensor_range`].
pub(super) fn immediate_send<'a, C: Communicator + ?Sized, Sc: Scope<'a>>(
    comm: &C,
    scope: Sc,
    tensor: &'a dyn Tensor,
    elems: Range<i64>,
    dest: Rank,
    tag: Tag,
) -> Result<TensorRequest<'a, Sc>> {
    check_rank(dest, comm.target_size())?;
    check_tag(tag)?;
    let (displacement, count) = displacement_count(&elems);
    let spec = SendSpec::new(tensor)?;
    check_window(displacement, count, spec.len_elems())?;
    if spec.is_contiguous() {
        let window = spec.range_of(displacement, count)?;
        return post_send(comm, scope, SendSide::Spec(window), None, dest, tag);
    }
    let flat = FlatSpec::send(tensor, &spec)?;
    let (ptr, units, datatype) = window_of(&flat, displacement, count)?;
    let posted = (ptr.cast_const(), units, datatype);
    post_send(comm, scope, SendSide::Packed(flat), Some(posted), dest, tag)
}

/// [`super::TensorComm::immediate_recv_tensor_range`].
pub(super) fn immediate_recv<'a, C: Communicator + ?Sized, Sc: Scope<'a>>(
    comm: &C,
    scope: Sc,
    tensor: &'a mut dyn Tensor,
    elems: Range<i64>,
    source: Rank,
    tag: Tag,
) -> Result<TensorRequest<'a, Sc>> {
    check_rank(source, comm.target_size())?;
    check_tag(tag)?;
    let (displacement, count) = displacement_count(&elems);
    let mut spec = RecvSpec::new(&mut *tensor)?;
    check_window(displacement, count, spec.len_elems())?;
    let elem_bytes = spec.element_type().size_bytes_i64();
    let expected = (count, elem_bytes);
    if spec.is_contiguous() {
        let mut window = RecvSpec::range(&mut *tensor, displacement, count)?;
        let (units, datatype) = (window.count(), window.as_datatype());
        let posted = (window.pointer_mut().cast::<u8>(), units, datatype);
        return post_recv(comm, scope, tensor, None, posted, expected, source, tag);
    }
    let flat = FlatSpec::recv(&mut spec)?.ready(&*tensor, true)?;
    let posted = window_of(&flat, displacement, count)?;
    post_recv(
        comm,
        scope,
        tensor,
        Some(flat),
        posted,
        expected,
        source,
        tag,
    )
}
