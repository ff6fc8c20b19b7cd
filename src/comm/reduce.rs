//! The reductions of [`super::TensorComm`]: reduce, all-reduce (also in place) and
//! reduce-scatter-block.
//!
//! rsmpi's safe calls serve the common case (contiguous tensors of a predefined type, at
//! most `int` units). Otherwise the reduction goes through [`FlatSpec`]s: MPI's predefined
//! operations take predefined datatypes only, so a strided side is reduced as a packed copy;
//! more than 2^30 units are reduced in chunks of at most 2^30 (an element-wise reduction may
//! be cut anywhere); and half-precision dtypes use the user-defined operations of
//! [`halfops`]. Those calls go through the raw wrappers of `crate::raw`.
//!
//! Each reduction runs every check and builds its buffers first, then agrees across the
//! ranks (`agree`, see [`super::Agreement`]) before the first MPI call.

pub mod halfops;

use mpi::datatype::{AsDatatype, Collection, Pointer, PointerMut};
use mpi::ffi::MPI_Op;
use mpi::raw::AsRaw;
use mpi::topology::{Communicator, Rank};
use mpi::traits::*;

use super::agree::agree;
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

/// The preparation of a reduction with a send and a receive tensor (`$pair` and `$count`
/// name them in errors): every check, then the specs or the flat runs, as one `Result`
/// (errors leave through `local!`, so that the ranks agree on them).
macro_rules! prepare {
    ($pair:expr, $count:expr, $send:expr, $recv:expr, $op:expr) => {
        'prep: {
            let s = local!('prep, SendSpec::new($send));
            local!('prep, s.element_type().check_reduction($op));
            let mop = local!('prep, op_handle($op, s.dtype()));
            let mut r = local!('prep, RecvSpec::new(&mut *$recv));
            local!('prep, check_pair($pair, &s, &r));
            local!(
                'prep,
                check_count(|| $count.into(), s.len_elems(), r.len_elems())
            );
            if !needs_flat(&s, r.is_derived()) {
                break 'prep Ok(Reduction::Specs(s, Some(r)));
            }
            let rf = local!(
                'prep,
                FlatSpec::recv(&mut r).and_then(|f| f.ready(&*$recv, false))
            );
            // `r` ends here (non-lexical lifetime): the tensor is used directly above.
            let sf = local!('prep, FlatSpec::send($send, &s));
            Ok(Reduction::Flat(sf, Some(rf), mop))
        }
    };
}

/// The buffers of a reduction after its preparation: the specs as built (rsmpi's safe
/// call), or flat runs (the raw chunked call). The receive side is `None` at a non-root
/// rank of a reduce.
enum Reduction<'s, 'r> {
    /// Contiguous sides of a predefined type, at most `int` units.
    Specs(SendSpec<'s>, Option<RecvSpec<'r>>),
    /// Flat runs (packed copies where strided), the operation's handle.
    Flat(FlatSpec, Option<FlatSpec>, MPI_Op),
}

/// [`super::TensorComm::reduce_tensor`]. A `recv` given at a non-root rank is checked as at
/// the root (and not used).
pub(super) fn reduce<C: Communicator + ?Sized>(
    comm: &C,
    send: &dyn Tensor,
    recv: Option<&mut dyn Tensor>,
    op: ReduceOp,
    root: Rank,
) -> Result<()> {
    check_intra(comm)?;
    match recv {
        Some(recv) if comm.rank() == root => reduce_at_root(comm, send, recv, op),
        None if comm.rank() == root => agree(comm, Err(missing("reduce receive buffer"))),
        recv => reduce_at_leaf(comm, send, recv, op, root),
    }
}

/// A non-root rank's side of [`reduce`] (also a rank whose `root` is out of range).
fn reduce_at_leaf<C: Communicator + ?Sized>(
    comm: &C,
    send: &dyn Tensor,
    recv: Option<&mut dyn Tensor>,
    op: ReduceOp,
    root: Rank,
) -> Result<()> {
    let prepared = 'prep: {
        local!('prep, check_rank(root, comm.size()));
        let s = local!('prep, SendSpec::new(send));
        local!('prep, s.element_type().check_reduction(op));
        let mop = local!('prep, op_handle(op, s.dtype()));
        if let Some(recv) = recv {
            let r = local!('prep, RecvSpec::new(recv));
            local!('prep, check_pair("reduce send vs receive", &s, &r));
            local!(
                'prep,
                check_count(|| "reduce receive".into(), s.len_elems(), r.len_elems())
            );
        }
        if !needs_flat(&s, false) {
            break 'prep Ok(Reduction::Specs(s, None));
        }
        Ok(Reduction::Flat(
            local!('prep, FlatSpec::send(send, &s)),
            None,
            mop,
        ))
    };
    match agree(comm, prepared)? {
        Reduction::Specs(s, _) => {
            comm.process_at_rank(root)
                .reduce_into(&s, op.system_operation());
        }
        Reduction::Flat(sf, _, mop) => {
            let datatype = sf.unit.datatype().as_raw();
            in_chunks(sf.units, sf.unit.size_bytes(), |offset, n| {
                // SAFETY: the send buffer holds `units` units of `datatype` and the chunk
                // lies inside it; the receive buffer is not significant at non-root ranks
                // (MPI-4.1 §6.9.1); every rank makes the same chunked calls (`needs_flat`).
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
        }
    }
    Ok(())
}

/// The root's side of [`reduce`].
fn reduce_at_root<C: Communicator + ?Sized>(
    comm: &C,
    send: &dyn Tensor,
    recv: &mut dyn Tensor,
    op: ReduceOp,
) -> Result<()> {
    let root = comm.rank();
    let prepared = prepare!("reduce send vs receive", "reduce receive", send, recv, op);
    match agree(comm, prepared)? {
        Reduction::Specs(s, r) => {
            if let Some(mut r) = r {
                comm.process_at_rank(root)
                    .reduce_into_root(&s, &mut r, op.system_operation());
            }
            Ok(())
        }
        Reduction::Flat(sf, rf, mop) => {
            let Some(rf) = rf else { return Ok(()) };
            let datatype = sf.unit.datatype().as_raw();
            in_chunks(sf.units, sf.unit.size_bytes(), |offset, n| {
                // SAFETY: both buffers hold `units` units of `datatype` (checked counts and
                // spans); the chunk lies inside both; send and receive are disjoint (checked).
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
    }
}

/// [`super::TensorComm::all_reduce_tensor`].
pub(super) fn all_reduce<C: Communicator + ?Sized>(
    comm: &C,
    send: &dyn Tensor,
    recv: &mut dyn Tensor,
    op: ReduceOp,
) -> Result<()> {
    check_intra(comm)?;
    let prepared = prepare!(
        "all-reduce send vs receive",
        "all-reduce receive",
        send,
        recv,
        op
    );
    match agree(comm, prepared)? {
        Reduction::Specs(s, r) => {
            if let Some(mut r) = r {
                comm.all_reduce_into(&s, &mut r, op.system_operation());
            }
            Ok(())
        }
        Reduction::Flat(sf, rf, mop) => {
            // Strided or beyond-int: predefined reductions need predefined datatypes, so
            // reduce contiguous copies (or the tensors' own runs) in chunks of at most 2^30
            // units.
            let Some(rf) = rf else { return Ok(()) };
            let datatype = sf.unit.datatype().as_raw();
            in_chunks(sf.units, sf.unit.size_bytes(), |offset, n| {
                // SAFETY: both buffers hold `units` units of `datatype` (checked counts and
                // spans); the chunk lies inside both; send and receive are disjoint (checked).
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
    }
}

/// [`super::TensorComm::all_reduce_tensor_in_place`].
pub(super) fn all_reduce_in_place<C: Communicator + ?Sized>(
    comm: &C,
    tensor: &mut dyn Tensor,
    op: ReduceOp,
) -> Result<()> {
    check_intra(comm)?;
    let prepared = 'prep: {
        let mut r = local!('prep, RecvSpec::new(&mut *tensor));
        local!('prep, r.element_type().check_reduction(op));
        let mop = local!('prep, op_handle(op, r.dtype()));
        let (derived, count) = (r.is_derived(), r.mpi_count());
        let flat = local!('prep, FlatSpec::recv(&mut r));
        // `r` ends here (non-lexical lifetime): the tensor is used directly below.
        if !derived && flat.units <= REDUCE_CHUNK_UNITS {
            break 'prep Ok((flat, Some(count), mop));
        }
        Ok((local!('prep, flat.ready(&*tensor, true)), None, mop))
    };
    let (flat, direct, mop) = agree(comm, prepared)?;
    let datatype = flat.unit.datatype().as_raw();
    if let Some(count) = direct {
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
    let prepared = 'prep: {
        let s = local!('prep, SendSpec::new(send));
        local!('prep, s.element_type().check_reduction(op));
        let mop = local!('prep, op_handle(op, s.dtype()));
        let mut r = local!('prep, RecvSpec::new(&mut *recv));
        local!(
            'prep,
            check_pair("reduce-scatter-block send vs receive", &s, &r)
        );
        let size = comm.size();
        local!(
            'prep,
            check_count(
                || format!("reduce-scatter-block send (= receive count × {size} ranks)"),
                r.len_elems().saturating_mul(i64::from(size)),
                s.len_elems(),
            )
        );
        let rf = local!(
            'prep,
            FlatSpec::recv(&mut r)
                .and_then(|f| f.ready(&*recv, false))
                .and_then(FlatSpec::counted)
        );
        let sf = local!('prep, FlatSpec::send(send, &s).and_then(FlatSpec::counted));
        Ok((sf, rf, mop))
    };
    let (sf, mut rf, mop) = agree(comm, prepared)?;
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
