//! One collective data operation on prepared sides ([`Operation`]): the sides of its
//! operands and the one MPI call over them ([`Call`]), which runs blocking (`MPI_Bcast`,
//! `MPI_Allreduce`, …) or is posted nonblocking (`MPI_Ibcast`, `MPI_Iallreduce`, …, MPI-4.1
//! §6.12) from the same value. Every collective body of [`crate::comm`] prepares its
//! operation once; [`super::mode`] decides which of the two forms runs it.
//!
//! A [`Call`] holds raw buffer addresses, counts in MPI units and datatype handles taken
//! from the sides of the same [`Operation`]: the sides own what the addresses point to (the
//! tensors' borrows, packed copies in heap buffers that do not move with the side, derived
//! datatypes freed when the side drops), so an operation is always run or posted with its
//! sides alive, and a posted one is kept whole by the request until MPI completes it.

use std::ffi::c_void;
use std::fmt;
use std::ptr;

use mpi::datatype::{AsDatatype, Collection, Pointer};
use mpi::ffi::{MPI_Comm, MPI_Datatype, MPI_Op, MPI_Request};
use mpi::raw::AsRaw;
use mpi::topology::Rank;
use mpi::traits::Equivalence;
use mpi::Count;

use super::halfops;
use super::progress;
use crate::dtype::{DType, ReduceOp};
use crate::error::Result;
use crate::spec::facts::Facts;
use crate::spec::side::{Direction, In, Out, Side};

/// Units per chunk when a reduction is split: element-wise reductions may be cut anywhere,
/// and no count may exceed MPI's `int`.
pub(in crate::comm) const REDUCE_CHUNK_UNITS: usize = 1 << 30;

/// One buffer argument of an MPI call: first unit, count (units of `datatype`, per rank
/// where the call takes one block per rank) and datatype.
#[derive(Clone, Copy, Debug)]
pub(in crate::comm) struct Buf {
    ptr: *mut c_void,
    count: Count,
    datatype: MPI_Datatype,
}

impl Buf {
    /// The whole of `side`.
    pub(in crate::comm) fn of<D: Direction>(side: &Side<'_, D>) -> Buf {
        Buf {
            ptr: side.pointer().cast_mut(),
            count: side.count(),
            datatype: side.as_datatype().as_raw(),
        }
    }

    /// The same buffer as units of `datatype` (of the same size: MPI's own half-precision
    /// datatype for `MPI_UINT16_T` units).
    pub(in crate::comm) fn with_datatype(self, datatype: MPI_Datatype) -> Buf {
        Buf { datatype, ..self }
    }

    /// `count` units of `datatype` from `ptr` (a buffer of this crate's own).
    pub(in crate::comm) fn raw(ptr: *mut c_void, count: Count, datatype: MPI_Datatype) -> Buf {
        Buf {
            ptr,
            count,
            datatype,
        }
    }

    /// The same count and datatype from `ptr` instead (a plan's own buffer).
    pub(in crate::comm) fn with_ptr(self, ptr: *mut c_void) -> Buf {
        Buf { ptr, ..self }
    }

    /// No buffer (an argument that is not significant at this rank, MPI-4.1 §6.5).
    pub(in crate::comm) fn none() -> Buf {
        Buf {
            ptr: ptr::null_mut(),
            count: 0,
            datatype: u8::equivalent_datatype().as_raw(),
        }
    }

    /// One of `ranks` equal blocks of this buffer.
    pub(in crate::comm) fn per_rank(self, ranks: Rank) -> Buf {
        Buf {
            count: self.count / ranks.max(1),
            ..self
        }
    }
}

/// A buffer in per-rank blocks of varying size: counts and displacements in units of
/// `datatype`, one per rank, owned here (a nonblocking v-collective reads them until it
/// completes, MPI-4.1 §6.12).
#[derive(Debug)]
pub(in crate::comm) struct Varying {
    ptr: *mut c_void,
    counts: Vec<Count>,
    displacements: Vec<Count>,
    datatype: MPI_Datatype,
}

impl Varying {
    /// `side` in the blocks `(counts, displacements)` (units of the side's datatype).
    pub(in crate::comm) fn of<D: Direction>(
        side: &Side<'_, D>,
        (counts, displacements): (Vec<Count>, Vec<Count>),
    ) -> Varying {
        Varying {
            ptr: side.pointer().cast_mut(),
            counts,
            displacements,
            datatype: side.as_datatype().as_raw(),
        }
    }

    fn parts(&self) -> (*mut c_void, *const Count, *const Count, MPI_Datatype) {
        (
            self.ptr,
            self.counts.as_ptr(),
            self.displacements.as_ptr(),
            self.datatype,
        )
    }
}

/// A reduction's buffers, reduced in chunks of at most [`REDUCE_CHUNK_UNITS`] units of the
/// predefined `datatype` (one chunk for most tensors).
#[derive(Clone, Copy, Debug)]
pub(in crate::comm) struct Reduced {
    /// The send buffer, or `MPI_IN_PLACE` (then `recv` is read too).
    pub(in crate::comm) send: *const c_void,
    /// The receive buffer (NULL where it is not significant: a reduce's non-root ranks).
    pub(in crate::comm) recv: *mut c_void,
    pub(in crate::comm) units: usize,
    pub(in crate::comm) unit_bytes: usize,
    pub(in crate::comm) datatype: MPI_Datatype,
    pub(in crate::comm) op: MPI_Op,
}

/// One MPI collective call, by its arguments (MPI-4.1 chapter 6).
#[derive(Debug)]
pub(in crate::comm) enum Call {
    /// `MPI_Bcast`, §6.4.
    Bcast { buf: Buf, root: Rank },
    /// `MPI_Reduce` (§6.9.1) to `Some(root)`, `MPI_Allreduce` (§6.9.6) for `None`.
    Reduce {
        buffers: Reduced,
        root: Option<Rank>,
    },
    /// `MPI_Reduce_scatter_block`, §6.10.1 (`recv`: one rank's block).
    ReduceScatterBlock {
        send: *const c_void,
        recv: Buf,
        op: MPI_Op,
    },
    /// `MPI_Gather`, §6.5 (`recv`: one rank's block; not significant at non-roots).
    Gather { send: Buf, recv: Buf, root: Rank },
    /// `MPI_Gatherv`, §6.5 (`recv`: the root's only).
    Gatherv {
        send: Buf,
        recv: Option<Varying>,
        root: Rank,
    },
    /// `MPI_Scatter`, §6.6 (`send`: one rank's block; not significant at non-roots).
    Scatter { send: Buf, recv: Buf, root: Rank },
    /// `MPI_Scatterv`, §6.6 (`send`: the root's only).
    Scatterv {
        send: Option<Varying>,
        recv: Buf,
        root: Rank,
    },
    /// `MPI_Allgather`, §6.7 (`recv`: one rank's block).
    AllGather { send: Buf, recv: Buf },
    /// `MPI_Allgatherv`, §6.7.
    AllGatherv { send: Buf, recv: Varying },
    /// `MPI_Alltoall`, §6.8 (both: one rank's block).
    AllToAll { send: Buf, recv: Buf },
    /// `MPI_Alltoallv`, §6.8.
    AllToAllv { send: Varying, recv: Varying },
    /// Several calls over buffers of their own ([`Batch`]: a fused list's buckets); run
    /// and posted by [`Operation`], never by [`Call::run`] or [`Call::post`] (which do
    /// nothing for it).
    Batch(Box<dyn Batch>),
}

/// A data operation made of several calls over buffers it owns (a fused list's buckets),
/// run blocking or posted by [`Operation`] as one call is.
pub(in crate::comm) trait Batch: fmt::Debug {
    /// Runs every call on `comm` in `form` (blocking, or posted and polled; the same on
    /// every rank), with whatever copies in and out of its own buffers they need.
    ///
    /// # Safety
    /// As [`Call::run`] for each of its calls: every rank of `comm` runs the same batch
    /// (the agreement said so), and the tensors behind it are alive until it returns.
    unsafe fn run(&mut self, comm: MPI_Comm, form: Form);

    /// Posts every call's nonblocking form on `comm`, pushing the requests to `requests` in
    /// posting order.
    ///
    /// # Safety
    /// As [`Batch::run`], and `self` stays alive and untouched until every pushed request
    /// has completed, [`Batch::completed_one`] being told of each, in order.
    unsafe fn post(&mut self, comm: MPI_Comm, requests: &mut Vec<MPI_Request>);

    /// After the next of its requests (in posting order) completed.
    fn completed_one(&mut self);

    /// Whether a member is a packed copy.
    fn is_packed(&self) -> bool;

    /// After every request completed: the first error of finishing it, if any.
    ///
    /// # Errors
    /// The batch's own (a device copy back).
    fn outcome(self: Box<Self>) -> Result<()>;

    /// Before each step of a plan (the batch runs again): its requests and landings
    /// counted from zero, its identity `mark` written where it carries one, or the mark
    /// of a refused step (`refused`: the members are not touched, and MPI reads and writes
    /// the batch's own buffers only, so that the peers' step completes and sees the
    /// refusal where the mark can show it).
    fn rearm(&mut self, mark: u64, refused: bool);

    /// After each step of a plan: the first error of finishing it (a device copy back,
    /// an identity that differed, in which case no member was written from a packed
    /// bucket), if any.
    ///
    /// # Errors
    /// [`crate::Error::PlanMismatch`]; as [`Batch::outcome`].
    fn step_outcome(&mut self) -> Result<()>;

    /// How many requests [`Batch::post`] pushes (a plan reserves them at its build, so
    /// that no step allocates).
    fn requests(&self) -> usize;

    /// Makes every call's MPI-4 persistent form on `comm`, used by every later run and
    /// post instead of the call ([`Call::persist`]); `false` (nothing made) where one of
    /// them has none. The default makes none.
    ///
    /// # Safety
    /// As [`Batch::post`] for the batch's life; every rank of `comm` makes the same.
    unsafe fn persist(&mut self, comm: MPI_Comm) -> bool {
        let _ = comm;
        false
    }

    /// Whether a plan's step carries its identity here, and which mismatch this rank
    /// sees: words for the docs and errors.
    fn marked(&self) -> Option<&'static str>;
}

/// How a blocking collective's data operation goes to MPI. Every rank learns it from the
/// agreement ([`super::agree::agree`]), never from its own state alone: a blocking and a
/// nonblocking collective never match (MPI-4.1 §6.12), so the form must be the same on
/// every rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Form {
    /// The blocking call (`MPI_Allreduce`, `MPI_Bcast`, …): no rank had nonblocking
    /// collectives waiting for their agreements.
    Blocking,
    /// The nonblocking call, completed by polling ([`progress::wait_raw`]): some rank had,
    /// and it resolves them while it waits, so that no peer waits for it.
    Polled,
}

/// Where a call's requests go: `None` runs it blocking.
type Requests<'v> = Option<&'v mut Vec<MPI_Request>>;

/// A fresh slot for one posted request.
fn slot(requests: &mut Vec<MPI_Request>) -> *mut MPI_Request {
    // SAFETY: a constant handle of the MPI library (MPI_REQUEST_NULL).
    requests.push(unsafe { mpi::ffi::RSMPI_REQUEST_NULL });
    let last = requests.len() - 1;
    &mut requests[last]
}

/// Calls `f(offset_bytes, count)` for consecutive chunks of at most [`REDUCE_CHUNK_UNITS`]
/// units; one call with count 0 when there is nothing to reduce (every rank makes the same
/// calls).
fn in_chunks(units: usize, unit_bytes: usize, mut f: impl FnMut(usize, i32)) {
    if units == 0 {
        return f(0, 0);
    }
    let mut done = 0;
    while done < units {
        let n = (units - done).min(REDUCE_CHUNK_UNITS);
        // n ≤ 2^30 < i32::MAX: the cast neither truncates nor wraps.
        #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
        let count = n as i32;
        f(done * unit_bytes, count);
        done += n;
    }
}

/// `ptr + offset_bytes`; NULL and `MPI_IN_PLACE` stay as they are at every offset (a
/// chunk of an in-place reduction is in place too: `MPI_IN_PLACE + offset` is no buffer).
fn at<T>(ptr: *mut T, offset_bytes: usize) -> *mut T {
    let in_place = crate::raw::in_place();
    if offset_bytes == 0 || ptr.is_null() || ptr.cast::<c_void>() == in_place {
        return ptr;
    }
    ptr.cast::<u8>().wrapping_add(offset_bytes).cast()
}

/// One MPI collective written once for both forms: the blocking call `$blocking` when
/// `$requests` is `None`, else its nonblocking form `$immediate` with the same arguments and
/// a fresh request slot pushed to the list (MPI-4.1 §6.12: each nonblocking collective
/// takes its blocking form's arguments plus the request).
macro_rules! issue {
    ($requests:expr, $blocking:ident, $immediate:ident; $($arg:expr),+ $(,)?) => {
        match $requests {
            None => {
                mpi::ffi::$blocking($($arg),+);
            }
            Some(v) => {
                mpi::ffi::$immediate($($arg),+, slot(v));
            }
        }
    };
}

impl Call {
    /// How many requests [`Call::post`] pushes: one per chunk of a reduction, else one
    /// (none for a batch, which counts its own).
    pub(in crate::comm) fn requests(&self) -> usize {
        match self {
            Call::Reduce { buffers, .. } => buffers.units.div_ceil(REDUCE_CHUNK_UNITS).max(1),
            Call::Batch(_) => 0,
            _ => 1,
        }
    }

    /// Makes the call's MPI-4 persistent form on `comm` (`MPI_Allreduce_init`, …; one
    /// request per chunk of a reduction), pushing the inactive requests to `requests`;
    /// `false` (and nothing left pushed) where this MPI has none or the call has no
    /// persistent form here (a rooted reduce, the gathers and scatters: plans do not make
    /// them).
    ///
    /// # Safety
    /// As [`Call::post`] for as long as the requests live; every rank makes the same
    /// persistent calls in the same order, and the requests are freed while inactive.
    pub(in crate::comm) unsafe fn persist(
        &self,
        comm: MPI_Comm,
        requests: &mut Vec<MPI_Request>,
    ) -> bool {
        use crate::raw::{persistent, PersistentInit as P};
        let before = requests.len();
        let mut ok = true;
        let mut make = |init: P| {
            if ok {
                // SAFETY: the caller's contract.
                match unsafe { persistent(init, comm) } {
                    Some(r) => requests.push(r),
                    None => ok = false,
                }
            }
        };
        match self {
            Call::Bcast { buf: b, root } => make(P::Bcast(b.ptr, b.count, b.datatype, *root)),
            Call::Reduce {
                buffers: r,
                root: None,
            } => in_chunks(r.units, r.unit_bytes, |off, n| {
                let (s, d) = (at(r.send.cast_mut(), off).cast_const(), at(r.recv, off));
                make(P::AllReduce(s, d, n, r.datatype, r.op));
            }),
            Call::ReduceScatterBlock { send, recv: r, op } => {
                make(P::ReduceScatterBlock(
                    *send, r.ptr, r.count, r.datatype, *op,
                ));
            }
            Call::AllGather { send: s, recv: r } => make(P::AllGather(
                s.ptr, s.count, s.datatype, r.ptr, r.count, r.datatype,
            )),
            _ => ok = false,
        }
        if !ok {
            free_persistent(&mut requests.drain(before..).collect::<Vec<_>>());
        }
        ok
    }

    /// Runs the call, blocking, on `comm`.
    ///
    /// # Safety
    /// The buffers, counts and datatypes are those of live sides of one prepared
    /// [`Operation`] (checked against each other by the operation's body), `comm` is the
    /// intra-communicator they were checked for, and every rank makes the matching call.
    pub(in crate::comm) unsafe fn run(&self, comm: MPI_Comm) {
        // SAFETY: the caller's contract.
        unsafe { self.issue(comm, None) }
    }

    /// Posts the call's nonblocking form on `comm`, pushing its requests (one per chunk of
    /// a reduction, else one) to `requests`.
    ///
    /// # Safety
    /// As [`Call::run`], and the sides stay alive and untouched until every pushed request
    /// has completed.
    pub(in crate::comm) unsafe fn post(&self, comm: MPI_Comm, requests: &mut Vec<MPI_Request>) {
        // SAFETY: the caller's contract.
        unsafe { self.issue(comm, Some(requests)) }
    }

    /// The blocking or nonblocking form of the call (see [`issue!`]).
    unsafe fn issue(&self, comm: MPI_Comm, mut requests: Requests<'_>) {
        let none = Buf::none();
        let root_only = |v: &Option<Varying>| {
            v.as_ref().map_or(
                (none.ptr, ptr::null(), ptr::null(), none.datatype),
                Varying::parts,
            )
        };
        // SAFETY: (every arm) the contract of `run`/`post`: each pointer holds the counts
        // of its datatype that the arguments name, read or written as MPI's call says.
        unsafe {
            match self {
                Call::Bcast { buf: b, root } => {
                    issue!(requests, MPI_Bcast, MPI_Ibcast; b.ptr, b.count, b.datatype, *root, comm);
                }
                Call::Reduce { buffers: r, root } => in_chunks(r.units, r.unit_bytes, |off, n| {
                    let (s, d) = (at(r.send.cast_mut(), off).cast_const(), at(r.recv, off));
                    let (t, o) = (r.datatype, r.op);
                    match root {
                        Some(root) => issue!(requests.as_deref_mut(), MPI_Reduce, MPI_Ireduce;
                            s, d, n, t, o, *root, comm),
                        None => issue!(requests.as_deref_mut(), MPI_Allreduce, MPI_Iallreduce;
                            s, d, n, t, o, comm),
                    }
                }),
                Call::ReduceScatterBlock { send, recv: r, op } => {
                    issue!(requests, MPI_Reduce_scatter_block, MPI_Ireduce_scatter_block;
                        *send, r.ptr, r.count, r.datatype, *op, comm);
                }
                Call::Gather { send, recv, root } => {
                    let (s, r) = (send, recv);
                    issue!(requests, MPI_Gather, MPI_Igather;
                        s.ptr, s.count, s.datatype, r.ptr, r.count, r.datatype, *root, comm);
                }
                Call::Gatherv {
                    send: s,
                    recv,
                    root,
                } => {
                    let (rp, rc, rd, rt) = root_only(recv);
                    issue!(requests, MPI_Gatherv, MPI_Igatherv;
                        s.ptr, s.count, s.datatype, rp, rc, rd, rt, *root, comm);
                }
                Call::Scatter { send, recv, root } => {
                    let (s, r) = (send, recv);
                    issue!(requests, MPI_Scatter, MPI_Iscatter;
                        s.ptr, s.count, s.datatype, r.ptr, r.count, r.datatype, *root, comm);
                }
                Call::Scatterv {
                    send,
                    recv: r,
                    root,
                } => {
                    let (sp, sc, sd, st) = root_only(send);
                    issue!(requests, MPI_Scatterv, MPI_Iscatterv;
                        sp, sc, sd, st, r.ptr, r.count, r.datatype, *root, comm);
                }
                Call::AllGather { send: s, recv: r } => {
                    issue!(requests, MPI_Allgather, MPI_Iallgather;
                        s.ptr, s.count, s.datatype, r.ptr, r.count, r.datatype, comm);
                }
                Call::AllGatherv { send: s, recv } => {
                    let (rp, rc, rd, rt) = recv.parts();
                    issue!(requests, MPI_Allgatherv, MPI_Iallgatherv;
                        s.ptr, s.count, s.datatype, rp, rc, rd, rt, comm);
                }
                Call::AllToAll { send: s, recv: r } => {
                    issue!(requests, MPI_Alltoall, MPI_Ialltoall;
                        s.ptr, s.count, s.datatype, r.ptr, r.count, r.datatype, comm);
                }
                Call::AllToAllv { send, recv } => {
                    let (sp, sc, sd, st) = send.parts();
                    let (rp, rc, rd, rt) = recv.parts();
                    issue!(requests, MPI_Alltoallv, MPI_Ialltoallv;
                        sp, sc, sd, st, rp, rc, rd, rt, comm);
                }
                Call::Batch(_) => {}
            }
        }
    }
}

/// A collective's data operation, prepared: the sides MPI reads and writes (each optional:
/// a rank may take no part in one direction, as a gather's non-roots in the receive) and
/// the one call over them, or a batch of calls ([`Batch`]: a fused list's buckets). Built by a collective's
/// body after every check; run blocking by [`Operation::run`] or posted by a nonblocking
/// request, which keeps it whole until MPI completes.
#[derive(Debug)]
pub(in crate::comm) struct Operation<'t> {
    pub(in crate::comm) send: Option<Side<'t, In>>,
    pub(in crate::comm) recv: Option<Side<'t, Out>>,
    pub(in crate::comm) call: Call,
}

impl<'t> Operation<'t> {
    /// The operation of `call` over its sides (`None`: the rank takes no part in that
    /// direction).
    pub(in crate::comm) fn new(
        send: Option<Side<'t, In>>,
        recv: Option<Side<'t, Out>>,
        call: Call,
    ) -> Self {
        Operation { send, recv, call }
    }

    /// An operation of several calls over buffers of its own (a fused list's buckets), no
    /// sides.
    pub(in crate::comm) fn batch(batch: Box<dyn Batch>) -> Self {
        Operation {
            send: None,
            recv: None,
            call: Call::Batch(batch),
        }
    }
    /// The batch of an operation made by [`Operation::batch`] (`None` for another: a plan
    /// runs batches only).
    pub(in crate::comm) fn into_batch(self) -> Option<Box<dyn Batch>> {
        match self.call {
            Call::Batch(b) => Some(b),
            _ => None,
        }
    }
}

impl Operation<'_> {
    /// Runs the call on `comm` in `form` (the same on every rank), then unpacks the
    /// receive side.
    ///
    /// # Errors
    /// As [`Side::finish`].
    pub(in crate::comm) fn run(mut self, comm: MPI_Comm, form: Form) -> Result<()> {
        match &mut self.call {
            // SAFETY: the batch's buffers are its own, over members its body checked, alive
            // until it returns; every rank agreed on it.
            Call::Batch(b) => unsafe { b.run(comm, form) },
            // While nonblocking collectives wait for their agreements on some rank, every
            // rank posts and polls (`progress::wait_raw`), so that they are resolved meanwhile.
            call if form == Form::Polled => {
                let mut requests = Vec::with_capacity(1);
                // SAFETY: as below; the requests complete before this returns.
                unsafe { call.post(comm, &mut requests) };
                progress::wait_raw(&mut requests);
            }
            // SAFETY: the call's buffers are this operation's sides, alive until it returns;
            // its body checked them against each other; `comm` is the one they were checked
            // for (the body's communicator).
            call => unsafe { call.run(comm) },
        }
        self.finish()
    }

    /// Posts the call's nonblocking form on `comm`, pushing its requests to `requests`.
    ///
    /// # Safety
    /// As [`Call::post`]: the operation stays alive and untouched until every request
    /// completed, and [`Operation::completed_one`] is told of each, in order.
    pub(in crate::comm) unsafe fn post(&mut self, comm: MPI_Comm, requests: &mut Vec<MPI_Request>) {
        match &mut self.call {
            // SAFETY: the caller's contract.
            Call::Batch(b) => unsafe { b.post(comm, requests) },
            // SAFETY: the caller's contract.
            call => unsafe { call.post(comm, requests) },
        }
    }

    /// After the next of its requests (in posting order) completed: a fused list unpacks
    /// the buckets that have landed.
    pub(in crate::comm) fn completed_one(&mut self) {
        if let Call::Batch(b) = &mut self.call {
            b.completed_one();
        }
    }

    /// Whether a side or a fused member is a packed copy.
    pub(in crate::comm) fn is_packed(&self) -> bool {
        match &self.call {
            Call::Batch(b) => b.is_packed(),
            _ => {
                self.send.as_ref().is_some_and(|s| s.is_packed())
                    || self.recv.as_ref().is_some_and(|r| r.is_packed())
            }
        }
    }

    /// After MPI completed the call: unpacks the receive side into its tensor.
    ///
    /// # Errors
    /// As [`Side::finish`].
    pub(in crate::comm) fn finish(self) -> Result<()> {
        if let Call::Batch(b) = self.call {
            return b.outcome();
        }
        match self.recv {
            Some(r) => r.finish(),
            None => Ok(()),
        }
    }
}

/// Frees inactive persistent requests (made by [`Call::persist`]).
pub(in crate::comm) fn free_persistent(requests: &mut [MPI_Request]) {
    for r in requests {
        // SAFETY: an inactive persistent request of ours (its last start was completed).
        unsafe { mpi::ffi::MPI_Request_free(r) };
    }
}

/// Starts persistent requests (`MPI_Startall`, MPI-4.1 §3.9).
///
/// # Safety
/// Inactive persistent requests made by [`Call::persist`], whose buffers are ready (a send
/// buffer packed) and stay untouched until they complete.
pub(in crate::comm) unsafe fn start_persistent(requests: &mut [MPI_Request]) {
    if requests.is_empty() {
        return;
    }
    let n = i32::try_from(requests.len()).unwrap_or(i32::MAX);
    // SAFETY: the caller's contract.
    unsafe { mpi::ffi::MPI_Startall(n, requests.as_mut_ptr()) };
}

/// The datatype and MPI operation that reduce `dtype` with `op` when its units travel as
/// `unit`: `unit` and the predefined operation; for half precision MPI's own half datatype
/// and predefined operation, or `unit` and the user-defined one ([`halfops::reduction`]).
///
/// # Errors
/// [`halfops::reduction`]'s for half precision ([`crate::Error::UnsupportedReduction`],
/// [`crate::Error::MpiNotInitialized`], [`crate::Error::InvalidSetting`]).
pub(in crate::comm) fn handles(
    op: ReduceOp,
    dtype: DType,
    unit: MPI_Datatype,
) -> Result<(MPI_Datatype, MPI_Op)> {
    if halfops::is_half(dtype) {
        halfops::reduction(dtype, op, unit)
    } else {
        Ok((unit, op.system_operation().as_raw()))
    }
}

/// [`handles`]'s refusals, before the sides exist.
///
/// # Errors
/// As [`handles`].
pub(in crate::comm) fn check_handles(op: ReduceOp, dtype: DType) -> Result<()> {
    if halfops::is_half(dtype) {
        halfops::check(dtype, op)
    } else {
        Ok(())
    }
}

/// Whether elements of `facts` reduce with `op`: their dtype has the reduction
/// ([`crate::dtype::ElementType::check_reduction`]) and, for half precision, this MPI has
/// its operation ([`check_handles`]).
///
/// # Errors
/// [`crate::Error::UnsupportedReduction`]; as [`check_handles`].
pub(in crate::comm) fn check_reducible(op: ReduceOp, facts: &Facts) -> Result<()> {
    facts.element.check_reduction(op)?;
    check_handles(op, facts.element.dtype)
}
