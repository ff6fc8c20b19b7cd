//! Windowed point-to-point transfers: elements `[start, end)` of a tensor, in elements and
//! logical row-major order (mpi4py's `[buf, count, displacement]` buffer form with
//! `displacement = start`, `count = end - start`), blocking and nonblocking. The window is
//! a [`SendSpec::range`]/[`RecvSpec::range`], so its bounds are checked (a typed
//! [`crate::Error::OutOfBounds`] naming the displacement, count and tensor length) before
//! any MPI call; windows of strided tensors are refused
//! ([`crate::Error::StridedNotSupported`]).

use std::ops::Range;

use mpi::datatype::{AsDatatype, Collection, PointerMut};
use mpi::point_to_point::{Destination, Source, Status};
use mpi::request::Scope;
use mpi::topology::{Communicator, Rank};
use mpi::Tag;

use super::checks::{check_incoming, check_rank, check_tag};
use super::immediate::{post_recv, post_send, TensorRequest};
use super::sides::SendSide;
use crate::dlpack::Tensor;
use crate::error::Result;
use crate::spec::{RecvSpec, SendSpec};

/// `(displacement, count)` of `elems`, in elements; an end before the start is a negative
/// count, which the range check refuses.
fn displacement_count(elems: &Range<i64>) -> (i64, i64) {
    (elems.start, elems.end.saturating_sub(elems.start))
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
    let spec = SendSpec::range(tensor, displacement, count)?;
    comm.process_at_rank(dest).send_with_tag(&spec, tag);
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
    let mut spec = RecvSpec::range(tensor, displacement, count)?;
    let process = comm.process_at_rank(source);
    let status = process.probe_with_tag(tag);
    check_incoming(&spec, &status)?;
    Ok(process.receive_into_with_tag(&mut spec, tag))
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
    let spec = SendSpec::range(tensor, displacement, count)?;
    post_send(comm, scope, SendSide::Spec(spec), dest, tag)
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
    let mut spec = RecvSpec::range(&mut *tensor, displacement, count)?;
    let expected = (spec.len_elems(), spec.element_type().size_bytes_i64());
    let (count, datatype) = (spec.count(), spec.as_datatype());
    let direct = (spec.pointer_mut().cast::<u8>(), count, datatype);
    post_recv(comm, scope, tensor, None, direct, expected, source, tag)
}
