//! The seam where device staging plugs in below the operations ([`Stager`]): every
//! operation of [`super::TensorComm`] declares its operands (the tensor, its [`Access`],
//! the dtype of a reduction it takes part in), hands them to its communicator's stager,
//! runs on the stand-ins the stager returns, and lets the stager finish (copy back) after
//! MPI is done. A plain rsmpi communicator has no stager: its operands are the caller's
//! tensors, checked as host memory. `transport::DeviceComm` implements the trait.
//!
//! Staging errors are this rank's alone while its peers may already be in the agreement:
//! a collective takes them into that agreement ([`super::agree`]), so its peers return
//! [`crate::Error::PeerRefused`] instead of waiting.

use mpi::topology::Communicator;

use super::agree::agree;
use super::signature::Signature;
use super::TensorComm;
use crate::dlpack::{Tensor, TensorView};
use crate::dtype::DType;
use crate::error::Result;
use crate::spec::{Access, Reach};

/// One operand of an operation, as declared to a [`Stager`].
#[derive(Clone, Copy)]
pub struct Operand<'a> {
    /// The caller's tensor.
    pub tensor: &'a dyn Tensor,
    /// What MPI does with it.
    pub access: Access,
    /// The dtype of the reduction it takes part in (half precision is reduced on the host).
    pub reduce: Option<DType>,
}

/// A tensor's stand-in for one operation, made by a [`Stager`].
pub trait StagedTensor {
    /// The tensor MPI works on in place of the caller's (a pinned copy, a device scratch
    /// buffer); `None`: the caller's own tensor.
    ///
    /// # Errors
    /// The validation errors of [`TensorView::from_raw`] (none for a stand-in the stager
    /// built).
    fn view(&self) -> Result<Option<TensorView<'_>>>;
    /// How the stand-in (or the caller's tensor) reaches MPI.
    fn reach(&self) -> Reach;
    /// After MPI wrote the stand-in: copies it back to the device.
    ///
    /// # Errors
    /// The runtime's copy errors.
    fn finish(&self) -> Result<()>;
}

/// What a [`Stager`] made of an operation's send and receive operands; `None` where the
/// operand was not declared, or is host memory the stager leaves to the operation.
pub struct Staging<'s> {
    /// The send operand's stand-in.
    pub send: Option<Box<dyn StagedTensor + 's>>,
    /// The receive operand's stand-in.
    pub recv: Option<Box<dyn StagedTensor + 's>>,
}

/// Device staging below the operations (implemented by `transport::DeviceComm`).
pub trait Stager {
    /// Places and stages an operation's operands: every refusal (placement, aliasing
    /// device spans) before any copy, then the copies MPI's reads need.
    ///
    /// # Errors
    /// The stager's refusals (devices, aliasing, allocation, copies).
    fn stage(&self, send: Option<Operand<'_>>, recv: Option<Operand<'_>>) -> Result<Staging<'_>>;

    /// Makes one bucket of a fused collective over device tensors: a buffer of `bytes`
    /// bytes (the members' elements, in list order, each in logical row-major order at
    /// its [`BucketMember::at`]) that MPI works on, with the members this rank packs
    /// already packed into it (copies on the device, then one copy of the whole bucket to
    /// a pinned host buffer when the bucket is staged). With `blocks` > 1 (a reduce-scatter
    /// among that many ranks), the members this rank packs go instead into a send buffer
    /// of `blocks` × `bytes` bytes ([`StagedBucket::send_buffer`]): block `r` of each
    /// member (its elements `r·n .. (r+1)·n`, `n` its receive's count) at `r × bytes + at`,
    /// and the bucket of `bytes` is written by MPI and unpacked. `reduce`: the dtype of the
    /// reduction (half precision is reduced on the host). Every refusal comes before any
    /// copy. The default refuses ([`crate::Error::TransportUnavailable`]).
    ///
    /// # Errors
    /// [`crate::Error::Member`] around a member's refusal (placement, a layout the device
    /// copies cannot express); [`crate::Error::Overflow`] for `blocks × bytes`; allocation
    /// and copy errors.
    fn stage_bucket(
        &self,
        members: &[BucketMember<'_>],
        (bytes, blocks): (usize, usize),
        reduce: Option<DType>,
    ) -> Result<Box<dyn StagedBucket + '_>> {
        let _ = (members, bytes, blocks, reduce);
        Err(crate::Error::TransportUnavailable {
            transport: "fused",
            reason: "this communicator's stager makes no device buckets".into(),
        })
    }
}

/// One member of a device bucket ([`Stager::stage_bucket`]).
#[derive(Clone, Copy)]
pub struct BucketMember<'a> {
    /// The member's index in its list (named by its errors).
    pub index: usize,
    /// The tensor this rank packs into the bucket (read), if any.
    pub pack: Option<&'a dyn Tensor>,
    /// The tensor this rank unpacks the bucket into (written; the same tensor as `pack`
    /// for an in-place reduction), if any.
    pub unpack: Option<&'a dyn Tensor>,
    /// Its first byte in the bucket.
    pub at: usize,
}

/// A device bucket made by [`Stager::stage_bucket`].
pub trait StagedBucket {
    /// The bucket's first byte as MPI takes it (a pinned host buffer, or device memory
    /// only a CUDA-aware MPI may take: [`Reach::MpiOnly`]); NULL for an empty bucket.
    fn buffer(&self) -> (*mut u8, Reach);
    /// A reduce-scatter's send buffer (every rank's blocks, `blocks` × `bytes` bytes), with
    /// the reach of [`Self::buffer`]; `None` for the other collectives, which work in place
    /// on the bucket.
    fn send_buffer(&self) -> Option<*const u8> {
        None
    }
    /// After MPI wrote the bucket: copies it back to the device (when staged) and unpacks
    /// it into the members this rank unpacks (copies on the device).
    ///
    /// # Errors
    /// The runtime's copy errors.
    fn unpack(&self) -> Result<()>;
}

/// Whether operations run as collectives (a staging error then joins the agreement) or as
/// point-to-point (the error is returned).
#[derive(Debug, Clone, Copy)]
pub(super) enum Kind<'a> {
    PointToPoint,
    /// A collective with its signature, which the agreement of a staging error carries.
    Collective(Signature<'a>),
}

/// A read operand's stand-in: the caller's tensor, or the stager's, with its reach
/// (`None`: no stager saw it, so its device label is checked as host memory).
pub(super) type ReadIn<'a> = (&'a dyn Tensor, Option<Reach>);
/// A written operand's stand-in.
pub(super) type WriteIn<'a> = (&'a mut dyn Tensor, Option<Reach>);

/// Which operand only the root uses, at a rank that is not the root: checked as at the root
/// (its facts against the other operand's), never staged, copied or handed to MPI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unused {
    /// Both operands are used here.
    Neither,
    /// The send operand is the root's (a scatter's), unused here.
    Send,
    /// The receive operand is the root's (a gather's or a reduce's), unused here.
    Recv,
}

/// Runs `body` on the stand-ins of `send` (read) and `recv` (written with `recv_access`)
/// that `stager` makes, then finishes the receive's staging. Without a stager `body` gets
/// the caller's tensors. `reduce`: the dtype of a reduction both take part in. An `unused`
/// operand is not declared to the stager: `body` gets the caller's tensor as
/// [`Reach::MpiOnly`] (its facts and checks, no host access: memory only a stager knows
/// how to reach is never read for an operand MPI does not take).
///
/// # Errors
/// The stager's (for a [`Kind::Collective`], agreed with the peers first) and `body`'s.
#[allow(clippy::too_many_arguments)]
#[inline]
pub(super) fn with_stand_ins<C: Communicator + ?Sized, R>(
    stager: Option<&dyn Stager>,
    comm: &C,
    kind: Kind<'_>,
    send: Option<&dyn Tensor>,
    recv: Option<(&mut dyn Tensor, Access)>,
    (reduce, unused): (Option<DType>, Unused),
    body: impl for<'x> FnOnce(Option<ReadIn<'x>>, Option<WriteIn<'x>>) -> Result<R>,
) -> Result<R> {
    let Some(stager) = stager else {
        let send = send.map(|t| (t, None));
        let recv = recv.map(|(t, _)| (t as &mut dyn Tensor, None));
        return body(send, recv);
    };
    let declared = |tensor, access| Operand {
        tensor,
        access,
        reduce,
    };
    let s_op = send
        .filter(|_| unused != Unused::Send)
        .map(|t| declared(t, Access::Read));
    let r_op = recv
        .as_ref()
        .filter(|_| unused != Unused::Recv)
        .map(|(t, a)| declared(&**t, *a));
    let staging = match stager.stage(s_op, r_op) {
        Ok(s) => s,
        Err(e) => return agreed(comm, kind, e),
    };
    let out = {
        let (sv, mut s_reach) = stand_in(staging.send.as_deref(), kind, comm)?;
        let (mut rv, mut r_reach) = stand_in(staging.recv.as_deref(), kind, comm)?;
        match unused {
            Unused::Send => s_reach = Some(Reach::MpiOnly),
            Unused::Recv => r_reach = Some(Reach::MpiOnly),
            Unused::Neither => {}
        }
        let s = send.map(|t| (sv.as_ref().map_or(t, |v| v as &dyn Tensor), s_reach));
        let r = match recv {
            Some((t, _)) => Some((
                match rv.as_mut() {
                    Some(v) => v as &mut dyn Tensor,
                    None => t,
                },
                r_reach,
            )),
            None => None,
        };
        body(s, r)?
    };
    if let Some(r) = &staging.recv {
        r.finish()?;
    }
    Ok(out)
}

/// The view and reach of one staged operand (`None`, `None`: not staged).
fn stand_in<'s, C: Communicator + ?Sized>(
    staged: Option<&'s (dyn StagedTensor + 's)>,
    kind: Kind<'_>,
    comm: &C,
) -> Result<(Option<TensorView<'s>>, Option<Reach>)> {
    let Some(st) = staged else {
        return Ok((None, None));
    };
    match st.view() {
        Ok(v) => Ok((v, Some(st.reach()))),
        Err(e) => agreed(comm, kind, e),
    }
}

/// A staging error: for a collective on an intra-communicator, taken into the agreement
/// (its peers return `PeerRefused`); else returned.
fn agreed<C: Communicator + ?Sized, T>(comm: &C, kind: Kind<'_>, e: crate::Error) -> Result<T> {
    match kind {
        Kind::Collective(signature) if !comm.test_inter() => agree(comm, &signature, Err(e)),
        _ => Err(e),
    }
}

/// [`with_stand_ins`] for an operation with one send and one receive operand.
///
/// # Errors
/// As [`with_stand_ins`].
#[inline]
pub(super) fn with_pair<T: TensorComm + ?Sized, R>(
    tc: &T,
    kind: Kind<'_>,
    (send, recv): (&dyn Tensor, (&mut dyn Tensor, Access)),
    reduce: Option<DType>,
    body: impl FnOnce(ReadIn<'_>, WriteIn<'_>) -> Result<R>,
) -> Result<R> {
    let comm = tc.communicator();
    with_stand_ins(
        tc.stager(),
        comm,
        kind,
        Some(send),
        Some(recv),
        (reduce, Unused::Neither),
        |s, r| {
            let (s, r) = s.zip(r).ok_or_else(|| not_declared("send and receive"))?;
            body(s, r)
        },
    )
}

/// [`with_stand_ins`] for an operation with one read operand.
///
/// # Errors
/// As [`with_stand_ins`].
#[inline]
pub(super) fn with_read<T: TensorComm + ?Sized, R>(
    tc: &T,
    kind: Kind<'_>,
    send: &dyn Tensor,
    body: impl FnOnce(ReadIn<'_>) -> Result<R>,
) -> Result<R> {
    let comm = tc.communicator();
    let declared = (None, Unused::Neither);
    with_stand_ins(
        tc.stager(),
        comm,
        kind,
        Some(send),
        None,
        declared,
        |s, _| body(s.ok_or_else(|| not_declared("send"))?),
    )
}

/// [`with_stand_ins`] for an operation with one written (or updated) operand.
///
/// # Errors
/// As [`with_stand_ins`].
#[inline]
pub(super) fn with_write<T: TensorComm + ?Sized, R>(
    tc: &T,
    kind: Kind<'_>,
    recv: (&mut dyn Tensor, Access),
    reduce: Option<DType>,
    body: impl FnOnce(WriteIn<'_>) -> Result<R>,
) -> Result<R> {
    let comm = tc.communicator();
    let declared = (reduce, Unused::Neither);
    with_stand_ins(
        tc.stager(),
        comm,
        kind,
        None,
        Some(recv),
        declared,
        |_, r| body(r.ok_or_else(|| not_declared("receive"))?),
    )
}

/// A declared operand that came back without a stand-in: not reached (each declared operand
/// gets one), but an error rather than a panic.
fn not_declared(what: &'static str) -> crate::Error {
    super::checks::missing(what)
}
