//! Raw MPI calls: thin wrappers over the C functions of MPI that rsmpi's safe API does not
//! offer in the form this crate needs (a collective on a raw buffer with a user-defined
//! operation, `MPI_IN_PLACE`, a chunk of a larger buffer).
//!
//! This module is the one place where the crate calls MPI's C API directly, apart from
//! `comm/engine/call.rs` (the collectives' data operations, blocking and nonblocking, on
//! prepared sides), `comm/engine/agree.rs` and `comm/engine/pending.rs` (a nonblocking
//! collective's agreement votes and its generalized request), `comm/engine/progress.rs` (the
//! shadow communicator and the waits that resolve pending agreements), `spec/datatype.rs`
//! (the `MPI_Type_*` calls that build and free derived datatypes),
//! `comm/engine/halfops.rs` (`MPI_Op_create` for the half-precision operations; in
//! `halfops/probe.rs`, the rounding probe's `MPI_Reduce_local`) and
//! `comm/engine/held.rs` (`MPI_Mprobe`/`MPI_Mrecv` of a matched message a receive holds). The
//! parted point-to-point messages of `transport::pipeline` post their parts here
//! too ([`isend`], [`irecv`], [`wait`], [`wait_count`]): rsmpi's safe requests borrow their
//! buffers for a scope, which the two alternating pinned buffers outgrow. Each
//! wrapper is an `unsafe fn` whose `# Safety` section is MPI's contract on its buffers;
//! callers check every argument (ranks, counts, dtypes, disjointness) before calling. The
//! return codes are not read: the communicator's error handler is `MPI_ERRORS_ARE_FATAL`
//! unless the user changed it, as for every rsmpi call.

use std::ffi::{c_int, c_void};
use std::mem::MaybeUninit;

use mpi::ffi::{MPI_Comm, MPI_Datatype, MPI_Op, MPI_Request, MPI_Status};

use crate::error::{Error, Result};

extern "C" {
    /// `MPI_IN_PLACE`, from `src/shim.c`.
    static dlpack_mpi_in_place: *mut c_void;
}
// The MPI-4 persistent collectives of `src/shim.c` (one line each: their C signatures).
#[rustfmt::skip]
extern "C" {
    fn dlpack_mpi_has_persistent_collectives() -> c_int;
    fn dlpack_mpi_allreduce_init(send: *const c_void, recv: *mut c_void, count: c_int, datatype: MPI_Datatype, op: MPI_Op, comm: MPI_Comm, request: *mut MPI_Request) -> c_int;
    fn dlpack_mpi_bcast_init(buf: *mut c_void, count: c_int, datatype: MPI_Datatype, root: c_int, comm: MPI_Comm, request: *mut MPI_Request) -> c_int;
    fn dlpack_mpi_reduce_scatter_block_init(send: *const c_void, recv: *mut c_void, count: c_int, datatype: MPI_Datatype, op: MPI_Op, comm: MPI_Comm, request: *mut MPI_Request) -> c_int;
    fn dlpack_mpi_allgather_init(send: *const c_void, send_count: c_int, send_type: MPI_Datatype, recv: *mut c_void, recv_count: c_int, recv_type: MPI_Datatype, comm: MPI_Comm, request: *mut MPI_Request) -> c_int;
}

/// Whether this build's MPI has the MPI-4 persistent collectives (`MPI_Allreduce_init`
/// and its kin, MPI-4.1 §6.13): MPICH ≥ 4, Open MPI ≥ 5 (from its `mpi.h`, `src/shim.c`).
pub(crate) fn has_persistent_collectives() -> bool {
    // SAFETY: a pure function of the shim, compiled against this build's mpi.h.
    unsafe { dlpack_mpi_has_persistent_collectives() != 0 }
}

/// One MPI-4 persistent collective (MPI-4.1 §6.13), by its arguments (`MPI_INFO_NULL`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum PersistentInit {
    /// `MPI_Allreduce_init`.
    AllReduce(*const c_void, *mut c_void, c_int, MPI_Datatype, MPI_Op),
    /// `MPI_Bcast_init`.
    Bcast(*mut c_void, c_int, MPI_Datatype, c_int),
    /// `MPI_Reduce_scatter_block_init`.
    ReduceScatterBlock(*const c_void, *mut c_void, c_int, MPI_Datatype, MPI_Op),
    /// `MPI_Allgather_init`.
    AllGather(
        *const c_void,
        c_int,
        MPI_Datatype,
        *mut c_void,
        c_int,
        MPI_Datatype,
    ),
}

/// Makes the persistent collective `init` on `comm`: its inactive request, or `None` where
/// this MPI has no persistent collectives or refused it.
///
/// # Safety
/// As the blocking collective of the same arguments, for as long as the request lives:
/// the buffers stay valid (and untouched while a start is pending), every rank of `comm`
/// makes the same persistent collective in the same order (MPI-4.1 §6.13), and the
/// request is freed with `MPI_Request_free` while inactive.
pub(crate) unsafe fn persistent(init: PersistentInit, comm: MPI_Comm) -> Option<MPI_Request> {
    if !has_persistent_collectives() {
        return None;
    }
    // SAFETY: a constant handle of the MPI library.
    let mut request = unsafe { mpi::ffi::RSMPI_REQUEST_NULL };
    // SAFETY: the caller's contract; each wrapper calls the MPI-4 function of its name.
    let rc = unsafe {
        match init {
            PersistentInit::AllReduce(s, r, n, t, o) => {
                dlpack_mpi_allreduce_init(s, r, n, t, o, comm, &mut request)
            }
            PersistentInit::Bcast(b, n, t, root) => {
                dlpack_mpi_bcast_init(b, n, t, root, comm, &mut request)
            }
            PersistentInit::ReduceScatterBlock(s, r, n, t, o) => {
                dlpack_mpi_reduce_scatter_block_init(s, r, n, t, o, comm, &mut request)
            }
            PersistentInit::AllGather(s, sn, st, r, rn, rt) => {
                dlpack_mpi_allgather_init(s, sn, st, r, rn, rt, comm, &mut request)
            }
        }
    };
    (rc == 0).then_some(request)
}

/// `MPI_IN_PLACE` (MPI-4.1 §2.5.4), as a send-buffer argument.
pub(crate) fn in_place() -> *mut c_void {
    // SAFETY: a constant the C shim initialises at load time and never writes again.
    unsafe { dlpack_mpi_in_place }
}

// Point-to-point on raw buffers: the parted messages of `transport::pipeline`, whose
// parts are posted as nonblocking requests on pinned staging buffers.

/// A posted nonblocking send or receive, not yet completed (only [`isend`] and [`irecv`]
/// make one).
pub(crate) struct Request(MPI_Request);

impl Request {
    /// The MPI handle, for a caller that completes it itself (`comm::engine::request` hands it
    /// to an rsmpi request registered with a scope).
    pub(crate) fn into_raw(self) -> MPI_Request {
        self.0
    }
}

fn count(units: usize) -> Result<c_int> {
    c_int::try_from(units).map_err(|_| Error::CountTooLarge {
        count: u64::try_from(units).unwrap_or(u64::MAX),
    })
}

/// The C signature `MPI_Isend` and `MPI_Irecv` share: buffer, count, datatype, peer rank,
/// tag, communicator, and the request they write.
type Post<B> =
    unsafe extern "C" fn(B, c_int, MPI_Datatype, c_int, c_int, MPI_Comm, *mut MPI_Request) -> c_int;

/// Posts `units` units of `datatype` at `buf` with `start` (`MPI_Isend` or `MPI_Irecv`) to
/// or from `peer`, and returns the request it wrote.
///
/// # Safety
/// `start` is `MPI_Isend` or `MPI_Irecv`; `buf` holds (for a send) or has room for (for a
/// receive) `units` units of `datatype`, and is not written (a send) or not accessed (a
/// receive) until the request is waited for; `datatype` and `comm` are valid handles.
unsafe fn post<B>(
    start: Post<B>,
    buf: B,
    units: usize,
    datatype: MPI_Datatype,
    peer: c_int,
    tag: c_int,
    comm: MPI_Comm,
) -> Result<Request> {
    let units = count(units)?;
    let mut req = MaybeUninit::<MPI_Request>::uninit();
    // SAFETY: the caller's contract on the buffer and handles; MPI writes the request
    // before returning (errors abort: MPI_ERRORS_ARE_FATAL).
    unsafe {
        start(buf, units, datatype, peer, tag, comm, req.as_mut_ptr());
        Ok(Request(req.assume_init()))
    }
}

/// `MPI_Isend` of `units` units of `datatype` from `buf` (MPI-4.1 §3.7.2).
///
/// # Safety
/// `buf` holds `units` units of `datatype` and is not written until the request is
/// waited for; `datatype` and `comm` are valid handles.
pub(crate) unsafe fn isend(
    buf: *const u8,
    units: usize,
    datatype: MPI_Datatype,
    dest: c_int,
    tag: c_int,
    comm: MPI_Comm,
) -> Result<Request> {
    // SAFETY: the caller's contract, which is `post`'s for a send.
    unsafe {
        post(
            mpi::ffi::MPI_Isend,
            buf.cast(),
            units,
            datatype,
            dest,
            tag,
            comm,
        )
    }
}

/// `MPI_Irecv` of up to `units` units of `datatype` into `buf` (MPI-4.1 §3.7.2).
///
/// # Safety
/// `buf` has room for `units` units of `datatype` and is not accessed until the request
/// is waited for; `datatype` and `comm` are valid handles.
pub(crate) unsafe fn irecv(
    buf: *mut u8,
    units: usize,
    datatype: MPI_Datatype,
    source: c_int,
    tag: c_int,
    comm: MPI_Comm,
) -> Result<Request> {
    // SAFETY: the caller's contract, which is `post`'s for a receive.
    unsafe {
        post(
            mpi::ffi::MPI_Irecv,
            buf.cast(),
            units,
            datatype,
            source,
            tag,
            comm,
        )
    }
}

/// Waits for a posted request, if any (`MPI_Wait`, status ignored).
pub(crate) fn wait(req: &mut Option<Request>) {
    if let Some(Request(mut r)) = req.take() {
        // SAFETY: a request posted by isend/irecv and not yet completed (taken out of
        // the Option, so it is waited for once).
        unsafe { mpi::ffi::MPI_Wait(&mut r, mpi::ffi::RSMPI_STATUS_IGNORE) };
    }
}

/// Waits for a posted receive and returns how many `datatype` units arrived
/// (`MPI_Wait`, then `MPI_Get_count`); `None` when nothing was posted.
pub(crate) fn wait_count(req: &mut Option<Request>, datatype: MPI_Datatype) -> Option<i64> {
    let Request(mut r) = req.take()?;
    let mut status = MaybeUninit::<MPI_Status>::uninit();
    let mut count: c_int = -1;
    // SAFETY: a request posted by irecv and not yet completed; the status is written by
    // MPI_Wait before MPI_Get_count reads it.
    unsafe {
        mpi::ffi::MPI_Wait(&mut r, status.as_mut_ptr());
        mpi::ffi::MPI_Get_count(status.as_ptr(), datatype, &mut count);
    }
    Some(i64::from(count))
}
