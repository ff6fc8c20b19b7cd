//! The point-to-point operations of [`super::TensorComm`]: send, receive (probed first) and
//! send-receive. A strided tensor goes as one derived datatype, or as a packed copy when the
//! packing policy ([`super::Packing`]) packs it; each side is decided on its own.

use mpi::datatype::{Buffer, BufferMut};
use mpi::point_to_point::{Destination, Source, Status};
use mpi::topology::{Communicator, Rank};
use mpi::Tag;

use super::checks::{check_disjoint, check_incoming, check_incoming_flat, check_rank, check_tag};
use super::packing::{inner_run_elems, packs_run};
use super::sides::SendSide;
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
    let side = SendSide::new(tensor, SendSpec::new(tensor)?)?;
    comm.process_at_rank(dest).send_with_tag(&side, tag);
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
    let run = inner_run_elems(&*tensor);
    let mut spec = RecvSpec::new(&mut *tensor)?;
    let packed = packs_run(spec.is_contiguous(), run, spec.element_type().size_bytes())?;
    let process = comm.process_at_rank(source);
    let status = process.probe_with_tag(tag);
    check_incoming(&spec, &status)?;
    if packed {
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
    let run = inner_run_elems(&*recv);
    let s = SendSpec::new(send)?;
    let mut r = RecvSpec::new(&mut *recv)?;
    check_disjoint(&s, &r)?;
    let packed = packs_run(r.is_contiguous(), run, r.element_type().size_bytes())?;
    let sent = SendSide::new(send, s)?;
    let src = comm.process_at_rank(source);
    let dst = comm.process_at_rank(dest);
    if packed {
        let recv_flat = FlatSpec::recv(&mut r)?;
        let mut rf = recv_flat.ready(&*recv, false)?.counted()?;
        let tags = (send_tag, recv_tag);
        let result = exchange(&dst, &src, tags, &sent, &mut rf, check_incoming_flat)?;
        rf.finish(recv)?;
        return Ok(result);
    }
    exchange(
        &dst,
        &src,
        (send_tag, recv_tag),
        &sent,
        &mut r,
        check_incoming,
    )
}

/// Sends `s` to `dst` while probing for, checking (`check`) and receiving into `r` from
/// `src`: the body of [`sendrecv`], for either form of each side.
fn exchange<P: Destination + Source, S: Buffer, R: BufferMut>(
    dst: &P,
    src: &P,
    (send_tag, recv_tag): (Tag, Tag),
    s: &S,
    r: &mut R,
    check: impl FnOnce(&R, &Status) -> Result<()>,
) -> Result<Status> {
    mpi::request::scope(|scope| {
        let req = dst.immediate_send_with_tag(scope, s, send_tag);
        let status = src.probe_with_tag(recv_tag);
        let checked = check(r, &status);
        let result = checked.map(|()| src.receive_into_with_tag(r, recv_tag));
        req.wait();
        result
    })
}
