//! Raw MPI calls: thin wrappers over the C functions of MPI that rsmpi's safe API does not
//! offer in the form this crate needs (a collective on a raw buffer with a user-defined
//! operation, `MPI_IN_PLACE`, a chunk of a larger buffer).
//!
//! This module is the one place where the crate calls MPI's C API directly, apart from
//! `spec/datatype.rs` (the `MPI_Type_*` calls that build and free derived datatypes) and
//! `comm/reduce/halfops.rs` (`MPI_Op_create` for the half-precision operations). Each
//! wrapper is an `unsafe fn` whose `# Safety` section is MPI's contract on its buffers;
//! callers check every argument (ranks, counts, dtypes, disjointness) before calling. The
//! return codes are not read: the communicator's error handler is `MPI_ERRORS_ARE_FATAL`
//! unless the user changed it, as for every rsmpi call.

use std::ffi::c_void;

use mpi::ffi::{MPI_Comm, MPI_Datatype, MPI_Op};
use mpi::topology::Rank;
use mpi::Count;

extern "C" {
    /// `MPI_IN_PLACE`, from `src/shim.c`.
    static dlpack_mpi_in_place: *mut c_void;
}

/// `MPI_IN_PLACE` (MPI-4.1 §2.5.4), as a send-buffer argument.
pub(crate) fn in_place() -> *mut c_void {
    // SAFETY: a constant the C shim initialises at load time and never writes again.
    unsafe { dlpack_mpi_in_place }
}

/// `MPI_Bcast` (MPI-4.1 §6.4).
///
/// # Safety
/// `buffer` holds `count` units of `datatype`, readable at the root and writable elsewhere,
/// and stays valid until the call returns; every rank of `comm` makes the matching call.
pub(crate) unsafe fn bcast(
    buffer: *mut c_void,
    count: Count,
    datatype: MPI_Datatype,
    root: Rank,
    comm: MPI_Comm,
) {
    // SAFETY: the caller's contract above is MPI_Bcast's.
    unsafe { mpi::ffi::MPI_Bcast(buffer, count, datatype, root, comm) };
}

/// `MPI_Reduce` (MPI-4.1 §6.9.1).
///
/// # Safety
/// `send` holds `count` readable units of `datatype`; at the root `recv` holds `count`
/// writable units, disjoint from `send` (elsewhere it is not significant and may be NULL);
/// `op` is defined on `datatype`; every rank of `comm` makes the matching call.
pub(crate) unsafe fn reduce(
    send: *const c_void,
    recv: *mut c_void,
    count: Count,
    datatype: MPI_Datatype,
    op: MPI_Op,
    root: Rank,
    comm: MPI_Comm,
) {
    // SAFETY: the caller's contract above is MPI_Reduce's.
    unsafe { mpi::ffi::MPI_Reduce(send, recv, count, datatype, op, root, comm) };
}

/// `MPI_Allreduce` (MPI-4.1 §6.9.6); `send` may be [`in_place`].
///
/// # Safety
/// `recv` holds `count` writable units of `datatype`; `send` holds `count` readable units
/// disjoint from `recv`, or is `MPI_IN_PLACE` (then `recv` is read too); `op` is defined on
/// `datatype`; every rank of `comm` makes the matching call.
pub(crate) unsafe fn all_reduce(
    send: *const c_void,
    recv: *mut c_void,
    count: Count,
    datatype: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) {
    // SAFETY: the caller's contract above is MPI_Allreduce's.
    unsafe { mpi::ffi::MPI_Allreduce(send, recv, count, datatype, op, comm) };
}

/// `MPI_Reduce_scatter_block` (MPI-4.1 §6.10.1).
///
/// # Safety
/// `recv` holds `count` writable units of `datatype`; `send` holds `size × count` readable
/// units, disjoint from `recv`; `op` is defined on `datatype`; every rank of `comm` (of
/// `size` ranks) makes the matching call.
pub(crate) unsafe fn reduce_scatter_block(
    send: *const c_void,
    recv: *mut c_void,
    count: Count,
    datatype: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) {
    // SAFETY: the caller's contract above is MPI_Reduce_scatter_block's.
    unsafe { mpi::ffi::MPI_Reduce_scatter_block(send, recv, count, datatype, op, comm) };
}
