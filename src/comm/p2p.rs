//! The point-to-point operations of [`super::TensorComm`]: send, receive (probed first) and
//! send-receive. A strided tensor goes as one derived datatype, or as a packed copy under
//! [`super::Packing::Copy`].

use mpi::point_to_point::Status;
use mpi::topology::{Communicator, Rank};
use mpi::traits::*;
use mpi::Tag;

use super::checks::{check_disjoint, check_incoming, check_incoming_flat, check_rank, check_tag};
use super::packing::copy_packing;
use crate::dlpack::Tensor;
use crate::error::Result;
use crate::spec::flat::FlatSpec;
use crate::spec::{RecvSpec, SendSpec};

/// [`super::TensorComm::send_tensor`].
pub(super) fn send<C: Communicator + ?Sized>(
    comm: &C,
    tensor: &dyn Tensor,
    dest: Rank,
    tag: Tag,
) -> Result<()> {
    check_rank(dest, comm.target_size())?;
    check_tag(tag)?;
    let spec = SendSpec::new(tensor)?;
    if copy_packing(spec.is_contiguous())? {
        let flat = FlatSpec::send(tensor, &spec)?.counted()?;
        comm.process_at_rank(dest).send_with_tag(&flat, tag);
    } else {
        comm.process_at_rank(dest).send_with_tag(&spec, tag);
    }
    Ok(())
}

/// [`super::TensorComm::recv_tensor`].
pub(super) fn recv<C: Communicator + ?Sized>(
    comm: &C,
    tensor: &mut dyn Tensor,
    source: Rank,
    tag: Tag,
) -> Result<Status> {
    check_rank(source, comm.target_size())?;
    check_tag(tag)?;
    let mut spec = RecvSpec::new(&mut *tensor)?;
    let process = comm.process_at_rank(source);
    let status = process.probe_with_tag(tag);
    check_incoming(&spec, &status)?;
    if copy_packing(spec.is_contiguous())? {
        let recv_flat = FlatSpec::recv(&mut spec)?;
        let mut flat = recv_flat.ready(&*tensor, false)?.counted()?;
        let status = process.receive_into_with_tag(&mut flat, tag);
        flat.finish(tensor)?;
        return Ok(status);
    }
    Ok(process.receive_into_with_tag(&mut spec, tag))
}

#[allow(clippy::too_many_arguments)]
/// [`super::TensorComm::sendrecv_tensor`].
pub(super) fn sendrecv<C: Communicator + ?Sized>(
    comm: &C,
    send: &dyn Tensor,
    dest: Rank,
    send_tag: Tag,
    recv: &mut dyn Tensor,
    source: Rank,
    recv_tag: Tag,
) -> Result<Status> {
    check_rank(dest, comm.target_size())?;
    check_rank(source, comm.target_size())?;
    check_tag(send_tag)?;
    check_tag(recv_tag)?;
    let s = SendSpec::new(send)?;
    let mut r = RecvSpec::new(&mut *recv)?;
    check_disjoint(&s, &r)?;
    let src = comm.process_at_rank(source);
    let dst = comm.process_at_rank(dest);
    if copy_packing(s.is_contiguous() && r.is_contiguous())? {
        let recv_flat = FlatSpec::recv(&mut r)?;
        let sf = FlatSpec::send(send, &s)?.counted()?;
        let mut rf = recv_flat.ready(&*recv, false)?.counted()?;
        let result = mpi::request::scope(|scope| {
            let req = dst.immediate_send_with_tag(scope, &sf, send_tag);
            let status = src.probe_with_tag(recv_tag);
            let checked = check_incoming_flat(&rf, &status);
            let result = checked.map(|()| src.receive_into_with_tag(&mut rf, recv_tag));
            req.wait();
            result
        })?;
        rf.finish(recv)?;
        return Ok(result);
    }
    mpi::request::scope(|scope| {
        let req = dst.immediate_send_with_tag(scope, &s, send_tag);
        let status = src.probe_with_tag(recv_tag);
        let checked = check_incoming(&r, &status);
        let result = checked.map(|()| src.receive_into_with_tag(&mut r, recv_tag));
        req.wait();
        result
    })
}
