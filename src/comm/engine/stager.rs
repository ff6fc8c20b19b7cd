//! The seam where device staging plugs in below the operations ([`Stager`]), and what an
//! operation runs on ([`Endpoint`]): every operation of [`crate::comm`]
//! declares its operands ([`Declared`]: the tensor, its [`Access`], the dtype of a
//! reduction it takes part in), hands them to its endpoint's stager, runs on the stand-ins
//! the stager returns, and lets the stager finish (copy back) after MPI is done. A plain
//! rsmpi communicator has no stager: its operands are the caller's tensors, checked as host
//! memory. `transport::DeviceComm` implements the traits.
//!
//! **The seam is sound.** A stager hands MPI raw addresses (a staged tensor's view, a
//! bucket's buffer), so its traits are `unsafe trait`s whose `# Safety` sections are the
//! contract MPI relies on, and [`Endpoint`], which supplies the stager, is sealed: safe code
//! outside this crate can neither implement a stager nor attach one to an operation (the
//! `compile_fail` examples on [`Endpoint`] and [`StagedBucket`]).
//!
//! Staging errors are this rank's alone while its peers may already be in the agreement:
//! a collective takes them into that agreement ([`super::agree`]), so its peers return
//! [`crate::Error::PeerRefused`] instead of waiting.

use std::ptr::NonNull;

use mpi::topology::Communicator;

use super::agree::agree;
use super::checks::missing;
use super::signature::Signature;
use crate::dlpack::{Tensor, TensorView};
use crate::dtype::DType;
use crate::error::Result;
use crate::spec::{Access, Reach};

/// The seal of [`Endpoint`]: nameable only inside this crate.
pub(crate) mod sealed {
    /// Implemented for every rsmpi communicator and for `transport::DeviceComm`.
    pub trait Sealed {}
}

impl<C: Communicator + ?Sized> sealed::Sealed for C {}

/// What the operations of [`crate::comm`] run on: an rsmpi communicator and
/// the device staging below it, if any. Sealed: implemented for every rsmpi
/// [`Communicator`] (no stager: the operands must be host memory) and for
/// `transport::DeviceComm` (its staging); it cannot be implemented outside this crate:
///
/// ```compile_fail,E0277
/// // An endpoint of its own: refused, `Endpoint` is sealed (and so is every trait built on it).
/// struct Mine(mpi::topology::SimpleCommunicator);
/// impl dlpack_mpi::comm::Endpoint for Mine {
///     type Comm = mpi::topology::SimpleCommunicator;
///     fn communicator(&self) -> &Self::Comm {
///         &self.0
///     }
/// }
/// ```
pub trait Endpoint: sealed::Sealed {
    /// The rsmpi communicator the operations run on.
    type Comm: Communicator + ?Sized;

    /// The communicator the operations run on (`self` for an rsmpi communicator).
    fn communicator(&self) -> &Self::Comm;

    /// The device staging below the operations; `None` (the default): the operands are
    /// the caller's tensors, which must be host memory.
    #[doc(hidden)]
    fn stager(&self) -> Option<&dyn Stager> {
        None
    }
}

impl<C: Communicator + ?Sized> Endpoint for C {
    type Comm = C;

    #[inline]
    fn communicator(&self) -> &C {
        self
    }
}

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
///
/// # Safety
/// The view [`StagedTensor::view`] returns describes memory that holds the view's elements
/// (its dtype, shape, strides and byte offset) for as long as `self` lives, readable and,
/// for an operand MPI writes, writable, and touched by nothing else meanwhile; it is host
/// memory unless [`StagedTensor::reach`] is [`Reach::MpiOnly`] (device memory that only a
/// CUDA-aware MPI may take, never read or written on the host by this crate).
pub unsafe trait StagedTensor {
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
///
/// # Safety
/// Every [`StagedTensor`] and [`StagedBucket`] it returns keeps its trait's contract; a
/// bucket of [`Stager::stage_bucket`] holds the `bytes` (and `blocks` × `bytes`) bytes it
/// was asked for.
pub unsafe trait Stager {
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
///
/// # Safety
/// [`StagedBucket::buffer`] is NULL (an empty bucket) or points to the `bytes` bytes the
/// bucket was made for, readable and writable while `self` lives and touched by nothing
/// else; [`StagedBucket::send_buffer`], when `Some`, points to `blocks` × `bytes` readable
/// bytes for as long. Both are host memory unless the reach is [`Reach::MpiOnly`]. MPI
/// reads and writes them by these addresses alone. So safe code cannot implement it:
///
/// ```compile_fail,E0200
/// // A bucket whose buffer is any address: refused, the trait is unsafe to implement.
/// struct Anywhere;
/// impl dlpack_mpi::comm::StagedBucket for Anywhere {
///     fn buffer(&self) -> (*mut u8, dlpack_mpi::spec::Reach) {
///         (8 as *mut u8, dlpack_mpi::spec::Reach::Host)
///     }
///     fn unpack(&self) -> dlpack_mpi::Result<()> {
///         Ok(())
///     }
/// }
/// ```
pub unsafe trait StagedBucket {
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

    /// Before a plan's step ([`crate::comm::Plan`]): packs the members again, as the
    /// bucket's making did (their current values), with the copies planned then: no
    /// allocation. The default refuses ([`crate::Error::TransportUnavailable`]).
    ///
    /// # Errors
    /// The runtime's copy errors; [`crate::Error::TransportUnavailable`] for a bucket that
    /// cannot be packed again (a reduce-scatter's send blocks).
    fn repack(&self) -> Result<()> {
        Err(crate::Error::TransportUnavailable {
            transport: "planned",
            reason: "this stager's buckets are packed once only".into(),
        })
    }
}

/// Whether operations run as collectives (a staging error then joins the agreement) or as
/// point-to-point (the error is returned).
#[derive(Debug, Clone)]
pub(in crate::comm) enum Kind<'a> {
    PointToPoint,
    /// A collective with its signature, which the agreement of a staging error carries.
    Collective(Signature<'a>),
}

/// A read operand's stand-in: the caller's tensor, or the stager's, with its reach
/// (`None`: no stager saw it, so its device label is checked as host memory).
pub(in crate::comm) type ReadIn<'a> = (&'a dyn Tensor, Option<Reach>);
/// A written operand's stand-in.
pub(in crate::comm) type WriteIn<'a> = (&'a mut dyn Tensor, Option<Reach>);

/// Which operand only the root uses, at a rank that is not the root: checked as at the root
/// (its facts against the other operand's), never staged, copied or handed to MPI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::comm) enum Unused {
    /// Both operands are used here.
    Neither,
    /// The send operand is the root's (a scatter's), unused here.
    Send,
    /// The receive operand is the root's (a gather's or a reduce's), unused here.
    Recv,
}

/// The operands a collective declares to its communicator's stager: the tensor MPI reads,
/// the tensor it writes (with how), the dtype of a reduction both take part in, and which
/// one only the root uses where this rank is not the root.
pub(in crate::comm) struct Declared<'a> {
    pub(in crate::comm) send: Option<&'a dyn Tensor>,
    pub(in crate::comm) recv: Option<(&'a mut dyn Tensor, Access)>,
    pub(in crate::comm) reduce: Option<DType>,
    pub(in crate::comm) unused: Unused,
}

impl<'a> Declared<'a> {
    /// A send and a receive operand, both used.
    pub(in crate::comm) fn pair(
        send: &'a dyn Tensor,
        recv: (&'a mut dyn Tensor, Access),
        reduce: Option<DType>,
    ) -> Self {
        Declared {
            send: Some(send),
            recv: Some(recv),
            reduce,
            unused: Unused::Neither,
        }
    }

    /// One operand MPI reads.
    pub(in crate::comm) fn read(send: &'a dyn Tensor) -> Self {
        Declared {
            send: Some(send),
            recv: None,
            reduce: None,
            unused: Unused::Neither,
        }
    }

    /// One operand MPI writes (or updates).
    pub(in crate::comm) fn write(
        recv: (&'a mut dyn Tensor, Access),
        reduce: Option<DType>,
    ) -> Self {
        Declared {
            send: None,
            recv: Some(recv),
            reduce,
            unused: Unused::Neither,
        }
    }
}

/// Runs `body` on the stand-ins of the `declared` operands that `stager` makes
/// ([`stand_ins`]), then finishes the receive's staging (copies it back). Without a stager
/// `body` gets the caller's tensors. An operand the root only uses, at another rank, is not
/// declared to the stager: `body` gets the caller's tensor as [`Reach::MpiOnly`] (its facts
/// and checks, no host access).
///
/// # Errors
/// The stager's (for a [`Kind::Collective`], agreed with the peers first) and `body`'s.
#[inline]
pub(in crate::comm) fn with_stand_ins<'a, C: Communicator + ?Sized, R>(
    stager: Option<&'a dyn Stager>,
    comm: &C,
    kind: Kind<'_>,
    declared: Declared<'a>,
    body: impl for<'x> FnOnce(Option<ReadIn<'x>>, Option<WriteIn<'x>>) -> Result<R>,
) -> Result<R> {
    if stager.is_none() {
        // Host memory, the common case: the caller's tensors, nothing staged or held.
        let Declared { send, recv, .. } = declared;
        return body(send.map(|t| (t, None)), recv.map(|(t, _)| (t, None)));
    }
    let (held, ins) = stand_ins(stager, declared);
    let (send, recv) = match ins {
        Ok(ins) => ins,
        Err(e) => return agreed(comm, kind, e),
    };
    // `body` takes the stand-ins for any lifetime and returns nothing that borrows them, so
    // they are gone when `held`, which owns the views they point to, drops below.
    let out = body(send, recv)?;
    match held {
        Some(h) => h.finish().map(|()| out),
        None => Ok(out),
    }
}

/// A staging error: for a collective on an intra-communicator, taken into the agreement
/// (its peers return `PeerRefused`); else returned.
fn agreed<C: Communicator + ?Sized, T>(comm: &C, kind: Kind<'_>, e: crate::Error) -> Result<T> {
    match kind {
        Kind::Collective(signature) if !comm.test_inter() => {
            agree(comm, &signature, Err(e)).map(|(t, _)| t)
        }
        _ => Err(e),
    }
}

/// [`with_stand_ins`] for an operation with one send and one receive operand.
///
/// # Errors
/// As [`with_stand_ins`].
#[inline]
pub(in crate::comm) fn with_pair<E: Endpoint + ?Sized, R>(
    tc: &E,
    kind: Kind<'_>,
    (send, recv): (&dyn Tensor, (&mut dyn Tensor, Access)),
    reduce: Option<DType>,
    body: impl FnOnce(ReadIn<'_>, WriteIn<'_>) -> Result<R>,
) -> Result<R> {
    let declared = Declared::pair(send, (&mut *recv.0, recv.1), reduce);
    with_stand_ins(tc.stager(), tc.communicator(), kind, declared, |s, r| {
        let (s, r) = s.zip(r).ok_or_else(|| missing("send and receive"))?;
        body(s, r)
    })
}

/// [`with_stand_ins`] for an operation with one read operand.
///
/// # Errors
/// As [`with_stand_ins`].
#[inline]
pub(in crate::comm) fn with_read<E: Endpoint + ?Sized, R>(
    tc: &E,
    kind: Kind<'_>,
    send: &dyn Tensor,
    body: impl FnOnce(ReadIn<'_>) -> Result<R>,
) -> Result<R> {
    let declared = Declared::read(send);
    with_stand_ins(tc.stager(), tc.communicator(), kind, declared, |s, _| {
        body(s.ok_or_else(|| missing("send"))?)
    })
}

/// [`with_stand_ins`] for an operation with one written (or updated) operand.
///
/// # Errors
/// As [`with_stand_ins`].
#[inline]
pub(in crate::comm) fn with_write<E: Endpoint + ?Sized, R>(
    tc: &E,
    kind: Kind<'_>,
    recv: (&mut dyn Tensor, Access),
    reduce: Option<DType>,
    body: impl FnOnce(WriteIn<'_>) -> Result<R>,
) -> Result<R> {
    let declared = Declared::write((&mut *recv.0, recv.1), reduce);
    with_stand_ins(tc.stager(), tc.communicator(), kind, declared, |_, r| {
        body(r.ok_or_else(|| missing("receive"))?)
    })
}

/// The stand-ins a device stager made for one nonblocking operation, owned by its request
/// until MPI completes: the staged copies and the views over them that the operation's
/// sides borrow.
pub(in crate::comm) struct Held<'a> {
    /// The views (send, receive) over the stand-ins, boxed so that the sides' borrows
    /// point to memory that does not move with this value; freed in `Drop`, before the
    /// staging they view.
    views: [Option<NonNull<TensorView<'a>>>; 2],
    staging: Staging<'a>,
}

impl Held<'_> {
    /// After MPI completed: copies a staged receive back to the device.
    ///
    /// # Errors
    /// The runtime's copy errors.
    pub(in crate::comm) fn finish(&self) -> Result<()> {
        match &self.staging.recv {
            Some(r) => r.finish(),
            None => Ok(()),
        }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        for v in self.views.iter_mut().filter_map(Option::take) {
            // SAFETY: made by `Box::into_raw` in `stand_ins` and freed only here; the
            // operation whose sides borrowed it was dropped before (field order of the
            // owners: operation first).
            drop(unsafe { Box::from_raw(v.as_ptr()) });
        }
    }
}

/// The view of one staged operand, boxed and given the request's lifetime (`None`,
/// `None`: not staged).
///
/// # Errors
/// The stand-in's [`StagedTensor::view`] errors.
fn boxed_view<'a>(
    staged: Option<&(dyn StagedTensor + 'a)>,
) -> Result<(Option<NonNull<TensorView<'a>>>, Option<Reach>)> {
    let Some(st) = staged else {
        return Ok((None, None));
    };
    let reach = Some(st.reach());
    let Some(view) = st.view()? else {
        return Ok((None, reach));
    };
    // SAFETY: the view borrows the stand-in, a heap object owned by the `Held` this view
    // goes into; the `Held` frees the view before the stand-in (its `Drop`, then its
    // fields), and the stand-in does not move when the `Held` moves. Only the lifetime
    // changes.
    let view = unsafe { std::mem::transmute::<TensorView<'_>, TensorView<'a>>(view) };
    Ok((Some(NonNull::from(Box::leak(Box::new(view)))), reach))
}

/// The stand-ins of an operation's send and receive operands (the caller's tensors where
/// nothing is staged).
pub(in crate::comm) type StandIns<'a> = (Option<ReadIn<'a>>, Option<WriteIn<'a>>);

/// Stages `declared` with `stager` for an operation that outlives the call. The staging
/// comes back with the outcome, as the request must own it even when a later step fails
/// after the stager copied.
pub(in crate::comm) fn stand_ins<'a>(
    stager: Option<&'a dyn Stager>,
    declared: Declared<'a>,
) -> (Option<Held<'a>>, Result<StandIns<'a>>) {
    let Declared {
        send,
        recv,
        reduce,
        unused,
    } = declared;
    let Some(stager) = stager else {
        return (
            None,
            Ok((send.map(|t| (t, None)), recv.map(|(t, _)| (t, None)))),
        );
    };
    let operand = |tensor, access| Operand {
        tensor,
        access,
        reduce,
    };
    let s_op = send
        .filter(|_| unused != Unused::Send)
        .map(|t| operand(t, Access::Read));
    let r_op = recv
        .as_ref()
        .filter(|_| unused != Unused::Recv)
        .map(|(t, a)| operand(&**t, *a));
    let staging = match stager.stage(s_op, r_op) {
        Ok(s) => s,
        Err(e) => return (None, Err(e)),
    };
    let mut held = Held {
        views: [None, None],
        staging,
    };
    let (s_view, mut s_reach) = match boxed_view(held.staging.send.as_deref()) {
        Ok(v) => v,
        Err(e) => return (Some(held), Err(e)),
    };
    held.views[0] = s_view;
    let (r_view, mut r_reach) = match boxed_view(held.staging.recv.as_deref()) {
        Ok(v) => v,
        Err(e) => return (Some(held), Err(e)),
    };
    held.views[1] = r_view;
    match unused {
        Unused::Send => s_reach = Some(Reach::MpiOnly),
        Unused::Recv => r_reach = Some(Reach::MpiOnly),
        Unused::Neither => {}
    }
    let s = send.map(|t| match s_view {
        // SAFETY: the view lives as long as `held`, which the request keeps after the
        // operation's sides (see `Held`).
        Some(v) => (unsafe { &*v.as_ptr() } as &dyn Tensor, s_reach),
        None => (t, s_reach),
    });
    let r = recv.map(|(t, _)| match r_view {
        // SAFETY: as above; the receive view is used only through this reference.
        Some(v) => (unsafe { &mut *v.as_ptr() } as &mut dyn Tensor, r_reach),
        None => (t, r_reach),
    });
    (Some(held), Ok((s, r)))
}

/// The stand-in of a nonblocking operation's one read operand: the caller's tensor, or
/// the copy a device stager made (the request owns it, [`Held`]).
///
/// # Errors
/// The stager's refusals and copy errors.
pub(in crate::comm) fn read_stand_in<'a>(
    stager: Option<&'a dyn Stager>,
    tensor: &'a dyn Tensor,
) -> Result<(Option<Held<'a>>, ReadIn<'a>)> {
    let (held, ins) = stand_ins(stager, Declared::read(tensor));
    let (s, _) = ins?;
    Ok((held, s.ok_or_else(|| missing("send buffer"))?))
}

/// The stand-in of a nonblocking operation's one written operand (`access`
/// [`Access::Write`] or [`Access::Update`]), as [`read_stand_in`].
///
/// # Errors
/// As [`read_stand_in`].
pub(in crate::comm) fn write_stand_in<'a>(
    stager: Option<&'a dyn Stager>,
    tensor: &'a mut dyn Tensor,
    access: Access,
) -> Result<(Option<Held<'a>>, WriteIn<'a>)> {
    let (held, ins) = stand_ins(stager, Declared::write((tensor, access), None));
    let (_, r) = ins?;
    Ok((held, r.ok_or_else(|| missing("receive buffer"))?))
}
