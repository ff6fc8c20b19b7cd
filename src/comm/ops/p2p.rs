//! The point-to-point operations of [`crate::comm`]: send, receive (matched probe
//! first) and send-receive, and [`Unreceived::recv_into`] for a message a receive held.
//! Each side is encoded for a message ([`Need::Message`]): its own run, one derived
//! datatype, or a packed copy when the packing policy ([`crate::comm::Packing`]) packs it (beyond
//! MPI's `int` units one large-count datatype), decided on its own.
//!
//! A receive matches its message with `MPI_Mprobe` (MPI-4.1 §3.8.2) and receives exactly
//! that message with `MPI_Mrecv` (§3.8.3), after comparing its size with the tensor; a
//! message that does not fit is returned in [`Error::Unfit`], held for a later receive.

use mpi::datatype::{AsDatatype, Buffer, Collection};
use mpi::point_to_point::{Destination, Source, Status};
use mpi::request::Scope;
use mpi::topology::{Communicator, Process, Rank};
use mpi::Tag;

use crate::comm::engine::checks::{
    any_source, check_disjoint, check_incoming, check_peer, check_rank, check_source, check_tag,
};
use crate::comm::engine::operands::{
    read_facts, read_side, side_in, side_out, write_facts, write_side,
};
use crate::comm::engine::request::{post_recv, post_send, TensorRequest};
use crate::comm::engine::stager::{
    read_stand_in, with_pair, with_read, with_write, write_stand_in,
};
use crate::comm::engine::stager::{Endpoint, Kind};
use crate::dlpack::Tensor;
use crate::dtype::DType;
use crate::error::{Error, Matched, Result, Unreceived};
use crate::spec::encoding::Need;
use crate::spec::side::{Out, Side};
use crate::spec::{Access, Reach};

/// `send_tensor`.
pub(crate) fn send<E: Endpoint + ?Sized>(
    tc: &E,
    tensor: &dyn Tensor,
    dest: Rank,
    tag: Tag,
) -> Result<()> {
    let comm = tc.communicator();
    check_peer(comm, dest, tag)?;
    with_read(tc, Kind::PointToPoint, tensor, |(t, reach)| {
        let side = read_side(t, reach, Need::Message)?;
        if !crate::comm::engine::progress::active() {
            comm.process_at_rank(dest).send_with_tag(&side, tag);
            return Ok(());
        }
        // Nonblocking collectives wait for their agreements: send nonblocking and resolve
        // them while the send completes (`progress::wait_raw`).
        use mpi::datatype::{AsDatatype, Collection, Pointer};
        use mpi::raw::AsRaw;
        let datatype = side.as_datatype().as_raw();
        let units = usize::try_from(side.count()).unwrap_or(0);
        // SAFETY: `side` holds `count` units of its datatype, alive and unwritten until the
        // request completes below.
        let posted = unsafe {
            crate::raw::isend(
                side.pointer().cast(),
                units,
                datatype,
                dest,
                tag,
                comm.as_raw(),
            )
        }?;
        crate::comm::engine::progress::wait_raw(&mut [posted.into_raw()]);
        Ok(())
    })
}

/// The receive side for `tensor`: every check of its facts and the packing policy, and
/// the scratch allocated, before any message is matched.
fn target(tensor: &mut dyn Tensor, reach: Option<Reach>) -> Result<Side<'_, Out>> {
    write_side(tensor, Access::Write, reach, Need::Message)
}

/// Receives `matched` into `side` when it is exactly the side's size, and unpacks it;
/// otherwise returns it held in [`Error::Unfit`] (with `sent`, the checked protocol's dtype
/// and shape).
fn receive(
    mut side: Side<'_, Out>,
    matched: Matched,
    sent: Option<(DType, Vec<i64>)>,
) -> Result<Status> {
    if let Err(mismatch) = check_incoming(&side, &matched.status()) {
        return Err(unfit(mismatch, matched, sent));
    }
    let status = matched.receive_into(&mut side);
    side.finish()?;
    Ok(status)
}

/// `recv_tensor`.
pub(crate) fn recv<E: Endpoint + ?Sized>(
    tc: &E,
    tensor: &mut dyn Tensor,
    source: Rank,
    tag: Tag,
) -> Result<Status> {
    let comm = tc.communicator();
    check_source(comm, source, tag)?;
    let recv = (tensor, Access::Write);
    with_write(tc, Kind::PointToPoint, recv, None, |(t, reach)| {
        let side = target(t, reach)?;
        receive(side, probe(comm, source, tag), None)
    })
}

/// The next message from `source` (a rank, or [`any_source`]) with `tag` (or
/// `MPI_ANY_TAG`), matched for this call alone (`MPI_Mprobe`).
fn probe<C: Communicator + ?Sized>(comm: &C, source: Rank, tag: Tag) -> Matched {
    if source == any_source() {
        Matched::probe(&comm.any_process(), tag)
    } else {
        Matched::probe(&comm.process_at_rank(source), tag)
    }
}

/// [`Error::Unfit`] holding `matched` (a held message still alive at `MPI_Finalize` is
/// discarded there, see [`Unreceived`]).
pub(crate) fn unfit(mismatch: Error, matched: Matched, sent: Option<(DType, Vec<i64>)>) -> Error {
    Error::Unfit {
        mismatch: Box::new(mismatch),
        message: Unreceived::new(matched, sent),
    }
}

/// Receives the matched message `matched` into `tensor` (host memory) when it fits;
/// otherwise returns it held in [`Error::Unfit`] (with `sent`, the checked protocol's
/// dtype and shape).
pub(crate) fn recv_matched(
    tensor: &mut dyn Tensor,
    matched: Matched,
    sent: Option<(DType, Vec<i64>)>,
) -> Result<Status> {
    match target(tensor, None) {
        Ok(side) => receive(side, matched, sent),
        Err(e) => Err(unfit(e, matched, sent)),
    }
}

impl Unreceived {
    /// Receives the held message into `tensor` (`MPI_Mrecv`, MPI-4.1 §3.8.3), which must be
    /// exactly its size (any layout: a strided tensor receives in logical row-major order,
    /// as `recv_tensor`).
    ///
    /// # Errors
    /// - [`Error::Unfit`] (with this same held message inside, still held) when `tensor`
    ///   does not fit it, around [`Error::CountMismatch`] or an error of
    ///   [`crate::spec::RecvSpec::new`] for `tensor`: try again with another tensor.
    /// - [`Error::AlreadyReceived`] when a clone of this value received or discarded it.
    ///
    /// # Examples
    /// ```no_run
    /// use dlpack_mpi::prelude::*;
    /// use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned};
    /// use dlpack_mpi::Error;
    /// let universe = mpi::initialize().unwrap();
    /// let world = universe.world();
    /// let small = Owned::new(vec![0f32; 4]);
    /// match world.recv_tensor(&mut acquire(&small, &AcquireOptions::default())?, 0, 7) {
    ///     Err(Error::Unfit { message, .. }) => {
    ///         let n = message.len_bytes() as usize / 4;
    ///         let fits = Owned::new(vec![0f32; n]);
    ///         message.recv_into(&mut acquire(&fits, &AcquireOptions::default())?)?;
    ///     }
    ///     other => {
    ///         other?;
    ///     }
    /// }
    /// # Ok::<(), dlpack_mpi::Error>(())
    /// ```
    pub fn recv_into(&self, tensor: &mut dyn Tensor) -> Result<Status> {
        let matched = self.take()?;
        let sent = self
            .sent_dtype()
            .zip(self.sent_shape().map(<[i64]>::to_vec));
        recv_matched(tensor, matched, sent).map_err(|e| self.hold_again(e))
    }

    /// An [`Error::Unfit`] from a receive of this value's message, turned back into one
    /// around this value (the message put back), so that every clone still holds it.
    pub(crate) fn hold_again(&self, e: Error) -> Error {
        match e {
            Error::Unfit { mismatch, message } => {
                if let Ok(m) = message.take() {
                    self.put_back(m);
                }
                Error::Unfit {
                    mismatch,
                    message: self.clone(),
                }
            }
            other => other,
        }
    }
}

/// `sendrecv_tensor`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sendrecv<E: Endpoint + ?Sized>(
    tc: &E,
    send: &dyn Tensor,
    (dest, send_tag): (Rank, Tag),
    recv: &mut dyn Tensor,
    (source, recv_tag): (Rank, Tag),
) -> Result<Status> {
    let comm = tc.communicator();
    // Both ranks, then both tags (the order of the errors when several are wrong).
    check_rank(dest, comm.target_size())?;
    if source != any_source() {
        check_rank(source, comm.target_size())?;
    }
    check_tag(send_tag)?;
    check_source(comm, source, recv_tag)?;
    let operands = (send, (recv, Access::Write));
    with_pair(
        tc,
        Kind::PointToPoint,
        operands,
        None,
        |(s, s_reach), (r, r_reach)| {
            let sf = read_facts(s, s_reach)?;
            let rf = write_facts(&*r, Access::Write, r_reach)?;
            check_disjoint(&sf, &rf)?;
            let sent = side_in(s, sf, Need::Message)?;
            let mut side = side_out(r, rf, Need::Message, Access::Write)?;
            let dst = comm.process_at_rank(dest);
            let tags = (send_tag, recv_tag);
            let status = if source == any_source() {
                exchange(&dst, &comm.any_process(), tags, &sent, &mut side)?
            } else {
                exchange(&dst, &comm.process_at_rank(source), tags, &sent, &mut side)?
            };
            side.finish()?;
            Ok(status)
        },
    )
}

/// Sends `s` to `dst` while matching (`MPI_Mprobe`), checking and receiving into `r` the
/// message from `src`. A message that does not fit is returned held in [`Error::Unfit`]
/// once the send is done.
fn exchange<D: Destination, P: Source, S: Buffer>(
    dst: &D,
    src: &P,
    (send_tag, recv_tag): (Tag, Tag),
    s: &S,
    r: &mut Side<'_, Out>,
) -> Result<Status> {
    mpi::request::scope(|scope| {
        let req = dst.immediate_send_with_tag(scope, s, send_tag);
        let matched = Matched::probe(src, recv_tag);
        let result = match check_incoming(r, &matched.status()) {
            Ok(()) => Ok(matched.receive_into(r)),
            Err(mismatch) => Err(unfit(mismatch, matched, None)),
        };
        req.wait();
        result
    })
}

/// `immediate_send_tensor`: the nonblocking form of [`send`] (`MPI_Isend`, MPI-4.1
/// §3.7.2), the request owning a packed copy until it completes.
pub(in crate::comm) fn immediate_send<'a, E: Endpoint + ?Sized, Sc: Scope<'a>>(
    tc: &'a E,
    scope: Sc,
    tensor: &'a dyn Tensor,
    dest: Rank,
    tag: Tag,
) -> Result<TensorRequest<'a, Sc>> {
    let comm = tc.communicator();
    check_peer(comm, dest, tag)?;
    let (held, (tensor, reach)) = read_stand_in(tc.stager(), tensor)?;
    let side = read_side(tensor, reach, Need::Counted)?;
    Ok(post_send(comm, scope, side, None, dest, tag)?.holding(held))
}

/// `immediate_recv_tensor`: the nonblocking form of [`recv`] (`MPI_Irecv`), its
/// completion checking the arrived size and unpacking.
pub(in crate::comm) fn immediate_recv<'a, E: Endpoint + ?Sized, Sc: Scope<'a>>(
    tc: &'a E,
    scope: Sc,
    tensor: &'a mut dyn Tensor,
    source: Rank,
    tag: Tag,
) -> Result<TensorRequest<'a, Sc>> {
    let comm = tc.communicator();
    check_source(comm, source, tag)?;
    let (held, (tensor, reach)) = write_stand_in(tc.stager(), tensor, Access::Write)?;
    let side = write_side(tensor, Access::Write, reach, Need::Counted)?;
    let expected = (side.len_elems(), side.element().size_bytes_i64());
    let posting = (side.ptr().cast::<u8>(), side.count(), side.as_datatype());
    Ok(post_recv(comm, scope, side, posting, expected, (source, tag))?.holding(held))
}

/// `immediate_send_spec` and `immediate_recv_spec`: `post` (the rsmpi post of a prebuilt
/// spec, as given) to the process `peer` of `comm`, after the peer's and the tag's checks.
///
/// # Errors
/// As [`check_peer`].
pub(in crate::comm) fn immediate_spec<'c, C, R>(
    comm: &'c C,
    (peer, tag): (Rank, Tag),
    post: impl FnOnce(Process<'c>) -> R,
) -> Result<R>
where
    C: Communicator + ?Sized,
{
    check_peer(comm, peer, tag)?;
    Ok(post(comm.process_at_rank(peer)))
}
