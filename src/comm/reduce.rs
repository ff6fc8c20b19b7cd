//! The reductions of [`super::TensorComm`]: reduce, all-reduce (also in place) and
//! reduce-scatter-block.
//!
//! rsmpi's safe calls serve the common case (contiguous tensors of a predefined type, at
//! most `int` units). Otherwise the reduction goes through [`FlatSpec`]s: MPI's predefined
//! operations take predefined datatypes only, so a strided side is reduced as a packed copy;
//! more than 2^30 units are reduced in chunks of at most 2^30 (an element-wise reduction may
//! be cut anywhere); and half-precision dtypes use the user-defined operations of
//! [`halfops`]. Those calls go through the raw wrappers of `crate::raw`.

pub mod halfops;

use mpi::datatype::{AsDatatype, Collection, Pointer, PointerMut};
use mpi::ffi::MPI_Op;
use mpi::raw::AsRaw;
use mpi::topology::{Communicator, Rank};
use mpi::traits::*;

use super::checks::{check_count, check_intra, check_pair, check_rank, missing};
use crate::dlpack::Tensor;
use crate::dtype::{DType, ReduceOp};
use crate::error::Result;
use crate::raw;
use crate::spec::flat::FlatSpec;
use crate::spec::{RecvSpec, SendSpec};

/// Units per chunk when a reduction is split: element-wise reductions may be cut anywhere.
const REDUCE_CHUNK_UNITS: usize = 1 << 30;

/// Whether a reduction takes the flat path: a strided side (packed copy), more than 2^30
/// units (chunks), or a half-precision dtype (user-defined operation). Every rank decides
/// the same way for the same element count, so the sequence of MPI calls matches across
/// ranks.
fn needs_flat(s: &SendSpec<'_>, recv_derived: bool) -> bool {
    let units = i128::from(s.len_elems()) * i128::from(s.element_type().units_per_element_i64());
    s.is_derived()
        || recv_derived
        || units > REDUCE_CHUNK_UNITS as i128
        || halfops::is_half(s.dtype())
}

/// The MPI operation for `op` on `dtype`: predefined, or user-defined for half precision.
fn op_handle(op: ReduceOp, dtype: DType) -> Result<MPI_Op> {
    if halfops::is_half(dtype) {
        halfops::op(dtype, op)
    } else {
        Ok(op.system_operation().as_raw())
    }
}

/// Calls `f(offset_bytes, count)` for consecutive chunks of at most 2^30 units, so that no
/// count exceeds MPI's int; one call with count 0 when there is nothing to reduce.
fn in_chunks(units: usize, unit_bytes: usize, mut f: impl FnMut(usize, i32)) {
    if units == 0 {
        // Still one call: every rank must make the same collective calls.
        return f(0, 0);
    }
    let mut done = 0;
    while done < units {
        let n = (units - done).min(REDUCE_CHUNK_UNITS);
        // n ≤ REDUCE_CHUNK_UNITS = 2^30 < i32::MAX: the cast neither truncates nor wraps.
        #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
        let count = n as i32;
        f(done * unit_bytes, count);
        done += n;
    }
}

/// `ptr + offset_bytes` (NULL stays NULL for the empty chunk).
fn at(ptr: *mut std::ffi::c_void, offset_bytes: usize) -> *mut std::ffi::c_void {
    ptr.cast::<u8>().wrapping_add(offset_bytes).cast()
}

/// [`super::TensorComm::reduce_tensor`].
pub(super) fn reduce<C: Communicator + ?Sized>(
    comm: &C,
    send: &dyn Tensor,
    recv: Option<&mut dyn Tensor>,
    op: ReduceOp,
    root: Rank,
) -> Result<()> {
    check_intra(comm)?;
    check_rank(root, comm.size())?;
    let s = SendSpec::new(send)?;
    s.element_type().check_reduction(op)?;
    let mop = op_handle(op, s.dtype())?;
    if comm.rank() == root {
        let recv = recv.ok_or_else(|| missing("reduce receive buffer"))?;
        return reduce_at_root(comm, send, &s, recv, op, mop);
    }
    if !needs_flat(&s, false) {
        comm.process_at_rank(root)
            .reduce_into(&s, op.system_operation());
        return Ok(());
    }
    let sf = FlatSpec::send(send, &s)?;
    let datatype = sf.unit.datatype().as_raw();
    in_chunks(sf.units, sf.unit.size_bytes(), |offset, n| {
        // SAFETY: the send buffer holds `units` units of `datatype` and the chunk lies
        // inside it; the receive buffer is not significant at non-root ranks (MPI-4.1
        // §6.9.1); every rank makes the same chunked calls (`needs_flat`).
        unsafe {
            raw::reduce(
                at(sf.ptr, offset),
                std::ptr::null_mut(),
                n,
                datatype,
                mop,
                root,
                comm.as_raw(),
            );
        }
    });
    Ok(())
}

/// The root's side of [`reduce`].
fn reduce_at_root<C: Communicator + ?Sized>(
    comm: &C,
    send: &dyn Tensor,
    s: &SendSpec<'_>,
    recv: &mut dyn Tensor,
    op: ReduceOp,
    mop: MPI_Op,
) -> Result<()> {
    let root = comm.rank();
    let mut r = RecvSpec::new(&mut *recv)?;
    check_pair("reduce send vs receive", s, &r)?;
    check_count(|| "reduce receive".into(), s.len_elems(), r.len_elems())?;
    if !needs_flat(s, r.is_derived()) {
        comm.process_at_rank(root)
            .reduce_into_root(s, &mut r, op.system_operation());
        return Ok(());
    }
    let recv_flat = FlatSpec::recv(&mut r)?;
    // `r` ends here (non-lexical lifetime): the tensor is used directly below.
    let sf = FlatSpec::send(send, s)?;
    let rf = recv_flat.ready(&*recv, false)?;
    let datatype = sf.unit.datatype().as_raw();
    in_chunks(sf.units, sf.unit.size_bytes(), |offset, n| {
        // SAFETY: both buffers hold `units` units of `datatype` (checked counts and spans);
        // the chunk lies inside both; send and receive are disjoint (checked).
        unsafe {
            raw::reduce(
                at(sf.ptr, offset),
                at(rf.ptr, offset),
                n,
                datatype,
                mop,
                root,
                comm.as_raw(),
            );
        }
    });
    rf.finish(recv)
}

/// [`super::TensorComm::all_reduce_tensor`].
pub(super) fn all_reduce<C: Communicator + ?Sized>(
    comm: &C,
    send: &dyn Tensor,
    recv: &mut dyn Tensor,
    op: ReduceOp,
) -> Result<()> {
    check_intra(comm)?;
    let s = SendSpec::new(send)?;
    s.element_type().check_reduction(op)?;
    let mop = op_handle(op, s.dtype())?;
    let mut r = RecvSpec::new(&mut *recv)?;
    check_pair("all-reduce send vs receive", &s, &r)?;
    check_count(|| "all-reduce receive".into(), s.len_elems(), r.len_elems())?;
    if !needs_flat(&s, r.is_derived()) {
        comm.all_reduce_into(&s, &mut r, op.system_operation());
        return Ok(());
    }
    // Strided or beyond-int: predefined reductions need predefined datatypes, so reduce
    // contiguous copies (or the tensors' own runs) in chunks of at most 2^30 units.
    let recv_flat = FlatSpec::recv(&mut r)?;
    // `r` ends here (non-lexical lifetime): the tensor is used directly below.
    let sf = FlatSpec::send(send, &s)?;
    let rf = recv_flat.ready(&*recv, false)?;
    let datatype = sf.unit.datatype().as_raw();
    in_chunks(sf.units, sf.unit.size_bytes(), |offset, n| {
        // SAFETY: both buffers hold `units` units of `datatype` (checked counts and spans);
        // the chunk lies inside both; send and receive are disjoint (checked).
        unsafe {
            raw::all_reduce(
                at(sf.ptr, offset),
                at(rf.ptr, offset),
                n,
                datatype,
                mop,
                comm.as_raw(),
            );
        }
    });
    rf.finish(recv)
}

/// [`super::TensorComm::all_reduce_tensor_in_place`].
pub(super) fn all_reduce_in_place<C: Communicator + ?Sized>(
    comm: &C,
    tensor: &mut dyn Tensor,
    op: ReduceOp,
) -> Result<()> {
    check_intra(comm)?;
    let mut r = RecvSpec::new(&mut *tensor)?;
    r.element_type().check_reduction(op)?;
    let mop = op_handle(op, r.dtype())?;
    let (derived, count) = (r.is_derived(), r.mpi_count());
    let flat = FlatSpec::recv(&mut r)?;
    // `r` ends here (non-lexical lifetime): the tensor is used directly below.
    let datatype = flat.unit.datatype().as_raw();
    if !derived && flat.units <= REDUCE_CHUNK_UNITS {
        // SAFETY: MPI_IN_PLACE as the send buffer makes MPI read and write the tensor's
        // `count` units, which the receive spec proved writable and disjoint.
        unsafe {
            raw::all_reduce(
                raw::in_place(),
                flat.ptr,
                count,
                datatype,
                mop,
                comm.as_raw(),
            )
        };
        return Ok(());
    }
    let flat = flat.ready(&*tensor, true)?;
    in_chunks(flat.units, flat.unit.size_bytes(), |offset, n| {
        // SAFETY: the flat buffer holds `units` units of `datatype` (the tensor's own run or
        // a packed copy of its values); the chunk lies inside it.
        unsafe {
            raw::all_reduce(
                raw::in_place(),
                at(flat.ptr, offset),
                n,
                datatype,
                mop,
                comm.as_raw(),
            );
        }
    });
    flat.finish(tensor)
}

/// [`super::TensorComm::reduce_scatter_block_tensor`].
pub(super) fn reduce_scatter_block<C: Communicator + ?Sized>(
    comm: &C,
    send: &dyn Tensor,
    recv: &mut dyn Tensor,
    op: ReduceOp,
) -> Result<()> {
    check_intra(comm)?;
    let s = SendSpec::new(send)?;
    s.element_type().check_reduction(op)?;
    let mop = op_handle(op, s.dtype())?;
    let mut r = RecvSpec::new(&mut *recv)?;
    check_pair("reduce-scatter-block send vs receive", &s, &r)?;
    let size = comm.size();
    check_count(
        || format!("reduce-scatter-block send (= receive count × {size} ranks)"),
        r.len_elems() * i64::from(size),
        s.len_elems(),
    )?;
    let recv_flat = FlatSpec::recv(&mut r)?;
    let sf = FlatSpec::send(send, &s)?.counted()?;
    let mut rf = recv_flat.ready(&*recv, false)?.counted()?;
    // SAFETY: `rf` holds `count` units of `unit`, `sf` holds `size × count`; both are
    // contiguous runs of the predefined type and disjoint (checked).
    unsafe {
        raw::reduce_scatter_block(
            sf.pointer(),
            rf.pointer_mut(),
            rf.count(),
            rf.as_datatype().as_raw(),
            mop,
            comm.as_raw(),
        );
    }
    rf.finish(recv)
}
