//! The point-to-point operations of [`super::TensorComm`]: send, receive (matched probe
//! first) and send-receive, and [`Unreceived::recv_into`] for a message a receive held. A
//! strided tensor goes as one derived datatype, or as a packed copy when the packing policy
//! ([`super::Packing`]) packs it; each side is decided on its own. A packed copy beyond
//! MPI's `int` units goes whole as one large-count datatype ([`FlatSpec::whole`]).
//!
//! A receive matches its message with `MPI_Mprobe` (MPI-4.1 §3.8.2) and receives exactly
//! that message with `MPI_Mrecv` (§3.8.3), after comparing its size with the tensor; a
//! message that does not fit is returned in [`Error::Unfit`], held for a later receive.

use mpi::datatype::{Buffer, BufferMut};
use mpi::point_to_point::{Destination, Source, Status};
use mpi::topology::{Communicator, Rank};
use mpi::Tag;

use super::checks::{check_disjoint, check_incoming, check_incoming_flat, check_rank, check_tag};
use super::packing::{inner_run_elems, packs, packs_run};
use super::sides::SendSide;
use crate::dlpack::Tensor;
use crate::dtype::DType;
use crate::error::{Error, Matched, Result, Unreceived};
use crate::layout;
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
    let side = send_side(tensor, SendSpec::new(tensor)?)?;
    comm.process_at_rank(dest).send_with_tag(&side, tag);
    Ok(())
}

/// The send side of a point-to-point message: the spec, or a packed copy of any size
/// (one large-count datatype beyond `int` units).
fn send_side<'t>(tensor: &dyn Tensor, spec: SendSpec<'t>) -> Result<SendSide<'t>> {
    let elem = spec.element_type().size_bytes();
    if packs(tensor, spec.is_contiguous(), elem)? {
        return Ok(SendSide::Packed(FlatSpec::send(tensor, &spec)?.whole()?));
    }
    Ok(SendSide::Spec(spec))
}

/// A receive buffer made ready before its message is matched: the spec itself (the
/// tensor's run, or a derived datatype over its elements), or a flat buffer (a packed
/// scratch, unpacked into the tensor after MPI completes).
enum Target<'t> {
    Spec(RecvSpec<'t>),
    Flat(FlatSpec),
}

/// The receive buffer for `tensor`: every check of [`RecvSpec::new`] and the packing
/// policy, and the scratch allocated, before any message is matched.
fn target(tensor: &mut dyn Tensor) -> Result<Target<'_>> {
    if layout::check_c_contiguous(tensor.shape(), tensor.strides_elems()).is_ok() {
        return Ok(Target::Spec(RecvSpec::new(tensor)?));
    }
    let run = inner_run_elems(&*tensor);
    let flat = {
        let mut spec = RecvSpec::new(&mut *tensor)?;
        let elem = spec.element_type().size_bytes();
        if packs_run(spec.is_contiguous(), run, elem)? {
            Some(FlatSpec::recv(&mut spec)?)
        } else {
            None
        }
    };
    match flat {
        Some(flat) => Ok(Target::Flat(flat.ready(&*tensor, false)?.whole()?)),
        None => Ok(Target::Spec(RecvSpec::new(tensor)?)),
    }
}

impl Target<'_> {
    /// Whether the matched message is exactly this buffer's size.
    fn fits(&self, status: &Status) -> Result<()> {
        match self {
            Target::Spec(spec) => check_incoming(spec, status),
            Target::Flat(flat) => check_incoming_flat(flat, status),
        }
    }

    /// Receives `matched` (which [`Target::fits`]); returns the flat to unpack, if any.
    fn receive(self, matched: Matched) -> (Status, Option<FlatSpec>) {
        match self {
            Target::Spec(mut spec) => (matched.receive_into(&mut spec), None),
            Target::Flat(mut flat) => (matched.receive_into(&mut flat), Some(flat)),
        }
    }
}

/// Unpacks a packed receive into its tensor (nothing for a spec receive).
fn finish(flat: Option<FlatSpec>, tensor: &mut dyn Tensor) -> Result<()> {
    flat.map_or(Ok(()), |f| f.finish(tensor))
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
    let target = target(tensor)?;
    let matched = Matched::probe(&comm.process_at_rank(source), tag);
    if let Err(mismatch) = target.fits(&matched.status()) {
        return Err(unfit(mismatch, matched, None));
    }
    let (status, flat) = target.receive(matched);
    finish(flat, tensor)?;
    Ok(status)
}

/// [`Error::Unfit`] holding `matched` (a held message still alive at `MPI_Finalize` is
/// discarded there, see [`Unreceived`]).
pub(crate) fn unfit(mismatch: Error, matched: Matched, sent: Option<(DType, Vec<i64>)>) -> Error {
    Error::Unfit {
        mismatch: Box::new(mismatch),
        message: Unreceived::new(matched, sent),
    }
}

/// Receives the matched message `matched` into `tensor` when it fits; otherwise returns it
/// held in [`Error::Unfit`] (with `sent`, the checked protocol's dtype and shape).
pub(crate) fn recv_matched(
    tensor: &mut dyn Tensor,
    matched: Matched,
    sent: Option<(DType, Vec<i64>)>,
) -> Result<Status> {
    let target = match target(tensor) {
        Ok(t) => t,
        Err(e) => return Err(unfit(e, matched, sent)),
    };
    if let Err(mismatch) = target.fits(&matched.status()) {
        return Err(unfit(mismatch, matched, sent));
    }
    let (status, flat) = target.receive(matched);
    finish(flat, tensor)?;
    Ok(status)
}

impl Unreceived {
    /// Receives the held message into `tensor` (`MPI_Mrecv`, MPI-4.1 §3.8.3), which must be
    /// exactly its size (any layout: a strided tensor receives in logical row-major order,
    /// as [`super::TensorComm::recv_tensor`]).
    ///
    /// # Errors
    /// - [`Error::Unfit`] (with this same held message inside, still held) when `tensor`
    ///   does not fit it, around [`Error::CountMismatch`] or an error of [`RecvSpec::new`]
    ///   for `tensor`: try again with another tensor.
    /// - [`Error::AlreadyReceived`] when a clone of this value received or discarded it.
    ///
    /// # Examples
    /// ```no_run
    /// use dlpack_mpi::comm::TensorComm;
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
    let sent = send_side(send, s)?;
    let src = comm.process_at_rank(source);
    let dst = comm.process_at_rank(dest);
    if packed {
        let recv_flat = FlatSpec::recv(&mut r)?;
        let mut rf = recv_flat.ready(&*recv, false)?.whole()?;
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

/// Sends `s` to `dst` while matching (`MPI_Mprobe`), checking (`check`) and receiving into
/// `r` the message from `src`: the body of [`sendrecv`], for either form of each side. A
/// message that does not fit is returned held in [`Error::Unfit`] once the send is done.
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
        let matched = Matched::probe(src, recv_tag);
        let result = match check(r, &matched.status()) {
            Ok(()) => Ok(matched.receive_into(r)),
            Err(mismatch) => Err(unfit(mismatch, matched, None)),
        };
        req.wait();
        result
    })
}
