//! One collective data operation on prepared sides ([`Operation`]): the sides of its
//! operands and the one MPI call over them ([`Call`]), which runs blocking (`MPI_Bcast`,
//! `MPI_Allreduce`, …) or is posted nonblocking (`MPI_Ibcast`, `MPI_Iallreduce`, …, MPI-4.1
//! §6.12) from the same value. Every collective body of [`super::TensorComm`] prepares its
//! operation once; [`super::mode`] decides which of the two forms runs it.
//!
//! A [`Call`] holds raw buffer addresses, counts in MPI units and datatype handles taken
//! from the sides of the same [`Operation`]: the sides own what the addresses point to (the
//! tensors' borrows, packed copies in heap buffers that do not move with the side, derived
//! datatypes freed when the side drops), so an operation is always run or posted with its
//! sides alive, and a posted one is kept whole by the request until MPI completes it.

use std::ffi::c_void;
use std::ptr;

use mpi::datatype::{AsDatatype, Collection, Pointer};
use mpi::ffi::{MPI_Comm, MPI_Datatype, MPI_Op, MPI_Request};
use mpi::raw::AsRaw;
use mpi::topology::Rank;
use mpi::traits::Equivalence;
use mpi::Count;

use super::fused::Fused;
use crate::error::Result;
use crate::spec::side::{Direction, In, Out, Side};

/// Units per chunk when a reduction is split: element-wise reductions may be cut anywhere,
/// and no count may exceed MPI's `int`.
pub(super) const REDUCE_CHUNK_UNITS: usize = 1 << 30;

/// One buffer argument of an MPI call: first unit, count (units of `datatype`, per rank
/// where the call takes one block per rank) and datatype.
#[derive(Clone, Copy, Debug)]
pub(super) struct Buf {
    ptr: *mut c_void,
    count: Count,
    datatype: MPI_Datatype,
}

impl Buf {
    /// The whole of `side`.
    pub(super) fn of<D: Direction>(side: &Side<'_, D>) -> Buf {
        Buf {
            ptr: side.pointer().cast_mut(),
            count: side.count(),
            datatype: side.as_datatype().as_raw(),
        }
    }

    /// The same buffer as units of `datatype` (of the same size: MPI's own half-precision
    /// datatype for `MPI_UINT16_T` units).
    pub(super) fn with_datatype(self, datatype: MPI_Datatype) -> Buf {
        Buf { datatype, ..self }
    }

    /// `count` units of `datatype` from `ptr` (a buffer of this crate's own).
    pub(super) fn raw(ptr: *mut c_void, count: Count, datatype: MPI_Datatype) -> Buf {
        Buf {
            ptr,
            count,
            datatype,
        }
    }

    /// No buffer (an argument that is not significant at this rank, MPI-4.1 §6.5).
    pub(super) fn none() -> Buf {
        Buf {
            ptr: ptr::null_mut(),
            count: 0,
            datatype: u8::equivalent_datatype().as_raw(),
        }
    }

    /// One of `ranks` equal blocks of this buffer.
    pub(super) fn per_rank(self, ranks: Rank) -> Buf {
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
pub(super) struct Varying {
    ptr: *mut c_void,
    counts: Vec<Count>,
    displacements: Vec<Count>,
    datatype: MPI_Datatype,
}

impl Varying {
    /// `side` in the blocks `(counts, displacements)` (units of the side's datatype).
    pub(super) fn of<D: Direction>(
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
pub(super) struct Reduced {
    /// The send buffer, or `MPI_IN_PLACE` (then `recv` is read too).
    pub(super) send: *const c_void,
    /// The receive buffer (NULL where it is not significant: a reduce's non-root ranks).
    pub(super) recv: *mut c_void,
    pub(super) units: usize,
    pub(super) unit_bytes: usize,
    pub(super) datatype: MPI_Datatype,
    pub(super) op: MPI_Op,
}

/// One MPI collective call, by its arguments (MPI-4.1 chapter 6).
#[derive(Debug)]
pub(super) enum Call {
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
    /// A fused list's buckets, each with its own calls ([`Fused`]); run and posted by
    /// [`Operation`], never by [`Call::run`] or [`Call::post`] (which do nothing for it).
    Fused(Box<Fused>),
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

/// `ptr + offset_bytes` (NULL and `MPI_IN_PLACE` stay as they are at offset 0).
fn at<T>(ptr: *mut T, offset_bytes: usize) -> *mut T {
    if offset_bytes == 0 {
        return ptr;
    }
    ptr.cast::<u8>().wrapping_add(offset_bytes).cast()
}

impl Call {
    /// Runs the call, blocking, on `comm`.
    ///
    /// # Safety
    /// The buffers, counts and datatypes are those of live sides of one prepared
    /// [`Operation`] (checked against each other by the operation's body), `comm` is the
    /// intra-communicator they were checked for, and every rank makes the matching call.
    pub(super) unsafe fn run(&self, comm: MPI_Comm) {
        // SAFETY: the caller's contract.
        unsafe { self.issue(comm, None) }
    }

    /// Posts the call's nonblocking form on `comm`, pushing its requests (one per chunk of
    /// a reduction, else one) to `requests`.
    ///
    /// # Safety
    /// As [`Call::run`], and the sides stay alive and untouched until every pushed request
    /// has completed.
    pub(super) unsafe fn post(&self, comm: MPI_Comm, requests: &mut Vec<MPI_Request>) {
        // SAFETY: the caller's contract.
        unsafe { self.issue(comm, Some(requests)) }
    }

    /// The blocking or nonblocking form of the call.
    unsafe fn issue(&self, comm: MPI_Comm, requests: Requests<'_>) {
        // SAFETY: the contract of `run`/`post`, passed on.
        unsafe {
            match self {
                Call::Bcast { .. } | Call::Reduce { .. } | Call::ReduceScatterBlock { .. } => {
                    self.issue_reductions(comm, requests);
                }
                Call::Gather { .. } | Call::Gatherv { .. } => self.issue_gathers(comm, requests),
                Call::Scatter { .. } | Call::Scatterv { .. } => {
                    self.issue_scatters(comm, requests);
                }
                Call::AllGather { .. }
                | Call::AllGatherv { .. }
                | Call::AllToAll { .. }
                | Call::AllToAllv { .. } => {
                    self.issue_all(comm, requests);
                }
                Call::Fused(_) => {}
            }
        }
    }

    /// [`Call::issue`] of a broadcast or a reduction.
    unsafe fn issue_reductions(&self, comm: MPI_Comm, mut requests: Requests<'_>) {
        use mpi::ffi as f;
        // SAFETY: (every arm) the contract of `run`/`post`: each pointer holds the counts
        // of its datatype that the arguments name, read or written as MPI's call says.
        unsafe {
            match self {
                Call::Bcast { buf: b, root } => match requests {
                    None => f::MPI_Bcast(b.ptr, b.count, b.datatype, *root, comm),
                    Some(v) => f::MPI_Ibcast(b.ptr, b.count, b.datatype, *root, comm, slot(v)),
                },
                Call::Reduce { buffers: r, root } => {
                    in_chunks(r.units, r.unit_bytes, |off, n| {
                        let (s, d) = (at(r.send.cast_mut(), off).cast_const(), at(r.recv, off));
                        match (root, requests.as_deref_mut()) {
                            (Some(root), None) => {
                                f::MPI_Reduce(s, d, n, r.datatype, r.op, *root, comm);
                            }
                            (Some(root), Some(v)) => {
                                f::MPI_Ireduce(s, d, n, r.datatype, r.op, *root, comm, slot(v));
                            }
                            (None, None) => {
                                f::MPI_Allreduce(s, d, n, r.datatype, r.op, comm);
                            }
                            (None, Some(v)) => {
                                f::MPI_Iallreduce(s, d, n, r.datatype, r.op, comm, slot(v));
                            }
                        }
                    });
                    0
                }
                Call::ReduceScatterBlock { send, recv: r, op } => match requests {
                    None => {
                        f::MPI_Reduce_scatter_block(*send, r.ptr, r.count, r.datatype, *op, comm)
                    }
                    Some(v) => f::MPI_Ireduce_scatter_block(
                        *send,
                        r.ptr,
                        r.count,
                        r.datatype,
                        *op,
                        comm,
                        slot(v),
                    ),
                },
                _ => 0,
            };
        }
    }

    /// [`Call::issue`] of a gather.
    unsafe fn issue_gathers(&self, comm: MPI_Comm, requests: Requests<'_>) {
        use mpi::ffi as f;
        // SAFETY: (every arm) the contract of `run`/`post`: each pointer holds the counts
        // of its datatype that the arguments name, read or written as MPI's call says.
        unsafe {
            match self {
                Call::Gather {
                    send: s,
                    recv: r,
                    root,
                } => match requests {
                    None => f::MPI_Gather(
                        s.ptr, s.count, s.datatype, r.ptr, r.count, r.datatype, *root, comm,
                    ),
                    Some(v) => f::MPI_Igather(
                        s.ptr,
                        s.count,
                        s.datatype,
                        r.ptr,
                        r.count,
                        r.datatype,
                        *root,
                        comm,
                        slot(v),
                    ),
                },
                Call::Gatherv {
                    send: s,
                    recv,
                    root,
                } => {
                    let none = Buf::none();
                    let (rp, rc, rd, rt) = recv.as_ref().map_or(
                        (none.ptr, ptr::null(), ptr::null(), none.datatype),
                        Varying::parts,
                    );
                    match requests {
                        None => {
                            f::MPI_Gatherv(s.ptr, s.count, s.datatype, rp, rc, rd, rt, *root, comm)
                        }
                        Some(v) => f::MPI_Igatherv(
                            s.ptr,
                            s.count,
                            s.datatype,
                            rp,
                            rc,
                            rd,
                            rt,
                            *root,
                            comm,
                            slot(v),
                        ),
                    }
                }
                _ => 0,
            };
        }
    }

    /// [`Call::issue`] of a scatter.
    unsafe fn issue_scatters(&self, comm: MPI_Comm, requests: Requests<'_>) {
        use mpi::ffi as f;
        // SAFETY: (every arm) the contract of `run`/`post`: each pointer holds the counts
        // of its datatype that the arguments name, read or written as MPI's call says.
        unsafe {
            match self {
                Call::Scatter {
                    send: s,
                    recv: r,
                    root,
                } => match requests {
                    None => f::MPI_Scatter(
                        s.ptr, s.count, s.datatype, r.ptr, r.count, r.datatype, *root, comm,
                    ),
                    Some(v) => f::MPI_Iscatter(
                        s.ptr,
                        s.count,
                        s.datatype,
                        r.ptr,
                        r.count,
                        r.datatype,
                        *root,
                        comm,
                        slot(v),
                    ),
                },
                Call::Scatterv {
                    send,
                    recv: r,
                    root,
                } => {
                    let none = Buf::none();
                    let (sp, sc, sd, st) = send.as_ref().map_or(
                        (none.ptr, ptr::null(), ptr::null(), none.datatype),
                        Varying::parts,
                    );
                    match requests {
                        None => {
                            f::MPI_Scatterv(sp, sc, sd, st, r.ptr, r.count, r.datatype, *root, comm)
                        }
                        Some(v) => f::MPI_Iscatterv(
                            sp,
                            sc,
                            sd,
                            st,
                            r.ptr,
                            r.count,
                            r.datatype,
                            *root,
                            comm,
                            slot(v),
                        ),
                    }
                }
                _ => 0,
            };
        }
    }

    /// [`Call::issue`] of an all-gather or an all-to-all.
    unsafe fn issue_all(&self, comm: MPI_Comm, requests: Requests<'_>) {
        use mpi::ffi as f;
        // SAFETY: (every arm) the contract of `run`/`post`: each pointer holds the counts
        // of its datatype that the arguments name, read or written as MPI's call says.
        unsafe {
            match self {
                Call::AllGather { send: s, recv: r } => match requests {
                    None => f::MPI_Allgather(
                        s.ptr, s.count, s.datatype, r.ptr, r.count, r.datatype, comm,
                    ),
                    Some(v) => f::MPI_Iallgather(
                        s.ptr,
                        s.count,
                        s.datatype,
                        r.ptr,
                        r.count,
                        r.datatype,
                        comm,
                        slot(v),
                    ),
                },
                Call::AllGatherv { send: s, recv } => {
                    let (rp, rc, rd, rt) = recv.parts();
                    match requests {
                        None => f::MPI_Allgatherv(s.ptr, s.count, s.datatype, rp, rc, rd, rt, comm),
                        Some(v) => f::MPI_Iallgatherv(
                            s.ptr,
                            s.count,
                            s.datatype,
                            rp,
                            rc,
                            rd,
                            rt,
                            comm,
                            slot(v),
                        ),
                    }
                }
                Call::AllToAll { send: s, recv: r } => match requests {
                    None => f::MPI_Alltoall(
                        s.ptr, s.count, s.datatype, r.ptr, r.count, r.datatype, comm,
                    ),
                    Some(v) => f::MPI_Ialltoall(
                        s.ptr,
                        s.count,
                        s.datatype,
                        r.ptr,
                        r.count,
                        r.datatype,
                        comm,
                        slot(v),
                    ),
                },
                Call::AllToAllv { send, recv } => {
                    let (sp, sc, sd, st) = send.parts();
                    let (rp, rc, rd, rt) = recv.parts();
                    match requests {
                        None => f::MPI_Alltoallv(sp, sc, sd, st, rp, rc, rd, rt, comm),
                        Some(v) => f::MPI_Ialltoallv(sp, sc, sd, st, rp, rc, rd, rt, comm, slot(v)),
                    }
                }
                _ => 0,
            };
        }
    }
}

/// A collective's data operation, prepared: the sides MPI reads and writes (each optional:
/// a rank may take no part in one direction, as a gather's non-roots in the receive) and
/// the one call over them, or a fused list's buckets ([`Fused`]). Built by a collective's
/// body after every check; run blocking by [`Operation::run`] or posted by a nonblocking
/// request, which keeps it whole until MPI completes.
#[derive(Debug)]
pub(super) struct Operation<'t> {
    pub(super) send: Option<Side<'t, In>>,
    pub(super) recv: Option<Side<'t, Out>>,
    pub(super) call: Call,
}

impl<'t> Operation<'t> {
    /// The operation of a fused list: its buckets, no sides.
    pub(super) fn fused(fused: Fused) -> Self {
        Operation {
            send: None,
            recv: None,
            call: Call::Fused(Box::new(fused)),
        }
    }
}

impl Operation<'_> {
    /// Runs the call blocking on `comm`, then unpacks the receive side.
    ///
    /// # Errors
    /// As [`Side::finish`].
    pub(super) fn run(mut self, comm: MPI_Comm) -> Result<()> {
        match &mut self.call {
            // SAFETY: the buckets are the fused list's own buffers over members its body
            // checked, alive until it returns; every rank agreed on the list.
            Call::Fused(f) => unsafe { f.run(comm) },
            // While nonblocking collectives wait for their agreements, post and poll
            // (`comm::pending::wait_raw`) so that this rank resolves them meanwhile.
            call if super::pending::active() => {
                let mut requests = Vec::with_capacity(1);
                // SAFETY: as below; the requests complete before this returns.
                unsafe { call.post(comm, &mut requests) };
                super::pending::wait_raw(&mut requests);
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
    pub(super) unsafe fn post(&mut self, comm: MPI_Comm, requests: &mut Vec<MPI_Request>) {
        match &mut self.call {
            // SAFETY: the caller's contract.
            Call::Fused(f) => unsafe { f.post(comm, requests) },
            // SAFETY: the caller's contract.
            call => unsafe { call.post(comm, requests) },
        }
    }

    /// After the next of its requests (in posting order) completed: a fused list unpacks
    /// the buckets that have landed.
    pub(super) fn completed_one(&mut self) {
        if let Call::Fused(f) = &mut self.call {
            f.completed_one();
        }
    }

    /// Whether a side or a fused member is a packed copy.
    pub(super) fn is_packed(&self) -> bool {
        match &self.call {
            Call::Fused(f) => f.is_packed(),
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
    pub(super) fn finish(self) -> Result<()> {
        if let Call::Fused(f) = self.call {
            return f.outcome();
        }
        match self.recv {
            Some(r) => r.finish(),
            None => Ok(()),
        }
    }
}
