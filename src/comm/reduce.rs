//! The reductions of [`super::TensorComm`]: reduce, all-reduce (also in place) and
//! reduce-scatter-block.
//!
//! rsmpi's safe calls serve the common case (contiguous tensors of a predefined type, at
//! most 2^30 units). Otherwise both sides are encoded [`Encoding::Chunked`]: MPI's predefined
//! operations take predefined datatypes only, so a strided side is reduced as a packed copy;
//! more than 2^30 units are reduced in chunks of at most 2^30 (an element-wise reduction may
//! be cut anywhere); and half-precision dtypes use the user-defined operations of
//! [`halfops`]. Those calls go through the raw wrappers of `crate::raw`.
//!
//! Each reduction runs every check and builds its buffers first, then agrees across the
//! ranks (`agree`, see [`super::Agreement`]) before the first MPI call.

pub mod halfops;

use mpi::datatype::{AsDatatype, Collection};
use mpi::ffi::MPI_Op;
use mpi::raw::AsRaw;
use mpi::topology::{Communicator, Rank};
use mpi::traits::*;

use super::agree::{agree, prepare};
use super::checks::{check_count, check_intra, check_pair, check_rank, missing};
use super::operands::{read_facts, side_in, side_out, write_facts};
use super::signature::Signature;
use super::stager::{with_pair, with_stand_ins, with_write, Kind, ReadIn, Unused, WriteIn};
use super::TensorComm;
use crate::dlpack::Tensor;
use crate::dtype::{DType, ReduceOp};
use crate::error::Result;
use crate::raw;
#[cfg(doc)]
use crate::spec::encoding::Encoding;
use crate::spec::encoding::Need;
use crate::spec::facts::Facts;
use crate::spec::side::{In, Out, Side};
use crate::spec::Access;

/// Units per chunk when a reduction is split: element-wise reductions may be cut anywhere.
const REDUCE_CHUNK_UNITS: usize = 1 << 30;

/// Whether a reduction takes the chunked path: a strided or beyond-`int` side (packed or
/// large; `recv`: the receive side's facts where one is used), more than 2^30 units
/// (chunks), or a half-precision dtype (user-defined operation). Every rank decides the same
/// way for the same element count, so the sequence of MPI calls matches across ranks.
fn needs_chunks(s: &Facts, recv: Option<&Facts>) -> bool {
    let derived =
        |f: &Facts| !f.is_contiguous() || f.units().map_or(true, |u| u > i32::MAX as usize);
    let units = i128::from(s.len_elems) * i128::from(s.element.units_per_element_i64());
    derived(s)
        || recv.is_some_and(derived)
        || units > REDUCE_CHUNK_UNITS as i128
        || halfops::is_half(s.element.dtype)
}

/// The encoding both sides of a reduction need.
fn need(chunked: bool) -> Need {
    if chunked {
        Need::Chunks
    } else {
        Need::Units
    }
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

/// A reduction's sides after its preparation: send, receive (`None` at a non-root rank of
/// a reduce), the operation's handle, and whether it goes in chunks (raw calls) rather than
/// through rsmpi's safe call.
struct Reduction<'s, 'r> {
    send: Side<'s, In>,
    recv: Option<Side<'r, Out>>,
    op: MPI_Op,
    chunked: bool,
}

/// Every check of a reduction with a send and a receive tensor (`pair` and `count` name
/// them in errors), then both sides.
fn prepare_pair<'s, 'r>(
    (pair, count): (&'static str, &'static str),
    (send, s_reach): ReadIn<'s>,
    (recv, r_reach): WriteIn<'r>,
    op: ReduceOp,
) -> Result<Reduction<'s, 'r>> {
    let sf = read_facts(send, s_reach)?;
    sf.element.check_reduction(op)?;
    let mop = op_handle(op, sf.element.dtype)?;
    let rf = write_facts(&*recv, Access::Write, r_reach)?;
    check_pair(pair, &sf, &rf)?;
    check_count(|| count.into(), sf.len_elems, rf.len_elems)?;
    let chunked = needs_chunks(&sf, Some(&rf));
    let recv = side_out(recv, rf, need(chunked), Access::Write)?;
    Ok(Reduction {
        send: side_in(send, sf, need(chunked))?,
        recv: Some(recv),
        op: mop,
        chunked,
    })
}

/// [`super::TensorComm::reduce_tensor`]. A `recv` given at a non-root rank is checked as at
/// the root (and not used); a device stager does not take it there.
pub(super) fn reduce<T: TensorComm + ?Sized>(
    tc: &T,
    send: &dyn Tensor,
    recv: Option<&mut dyn Tensor>,
    op: ReduceOp,
    root: Rank,
) -> Result<()> {
    let comm = tc.communicator();
    let sig = Signature::of("reduce")
        .root(root)
        .dtype(send.dtype())
        .count(send.num_elements())
        .reduce(op);
    check_intra(comm)?;
    let is_root = comm.rank() == root;
    let unused = if is_root {
        Unused::Neither
    } else {
        Unused::Recv
    };
    let declared = (Some(send.dtype()), unused);
    let recv = recv.map(|r| (r, Access::Write));
    let kind = Kind::Collective(sig);
    with_stand_ins(
        tc.stager(),
        comm,
        kind,
        Some(send),
        recv,
        declared,
        |s, r| {
            let s = s.ok_or_else(|| missing("reduce send buffer"))?;
            match r {
                Some(r) if is_root => reduce_at_root(comm, &sig, s, r, op),
                None if is_root => agree(comm, &sig, Err(missing("reduce receive buffer"))),
                r => reduce_at_leaf(comm, &sig, s, r, op, root),
            }
        },
    )
}

/// A non-root rank's side of [`reduce`] (also a rank whose `root` is out of range).
fn reduce_at_leaf<C: Communicator + ?Sized>(
    comm: &C,
    sig: &Signature<'_>,
    send: ReadIn<'_>,
    recv: Option<WriteIn<'_>>,
    op: ReduceOp,
    root: Rank,
) -> Result<()> {
    let prepared = prepare(move || {
        check_rank(root, comm.size())?;
        let sf = read_facts(send.0, send.1)?;
        sf.element.check_reduction(op)?;
        let mop = op_handle(op, sf.element.dtype)?;
        if let Some((recv, r_reach)) = recv {
            let rf = write_facts(&*recv, Access::Write, r_reach)?;
            check_pair("reduce send vs receive", &sf, &rf)?;
            check_count(|| "reduce receive".into(), sf.len_elems, rf.len_elems)?;
        }
        let chunked = needs_chunks(&sf, None);
        Ok(Reduction {
            send: side_in(send.0, sf, need(chunked))?,
            recv: None,
            op: mop,
            chunked,
        })
    });
    let r = agree(comm, sig, prepared)?;
    if !r.chunked {
        comm.process_at_rank(root)
            .reduce_into(&r.send, op.system_operation());
        return Ok(());
    }
    let (sp, datatype) = (r.send.ptr(), r.send.unit_datatype().as_raw());
    in_chunks(r.send.units(), r.send.unit_bytes(), |offset, n| {
        // SAFETY: the send buffer holds `units` units of `datatype` and the chunk lies
        // inside it; the receive buffer is not significant at non-root ranks (MPI-4.1
        // §6.9.1); every rank makes the same chunked calls (`needs_chunks`).
        unsafe {
            raw::reduce(
                at(sp, offset),
                std::ptr::null_mut(),
                n,
                datatype,
                r.op,
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
    sig: &Signature<'_>,
    send: ReadIn<'_>,
    recv: WriteIn<'_>,
    op: ReduceOp,
) -> Result<()> {
    let root = comm.rank();
    let names = ("reduce send vs receive", "reduce receive");
    let r = agree(comm, sig, prepare_pair(names, send, recv, op))?;
    let Reduction {
        send,
        recv,
        op: mop,
        chunked,
    } = r;
    let Some(mut recv) = recv else { return Ok(()) };
    if !chunked {
        comm.process_at_rank(root)
            .reduce_into_root(&send, &mut recv, op.system_operation());
        return recv.finish();
    }
    let datatype = send.unit_datatype().as_raw();
    let (sp, rp) = (send.ptr(), recv.ptr());
    in_chunks(send.units(), send.unit_bytes(), |offset, n| {
        // SAFETY: both buffers hold `units` units of `datatype` (checked counts and spans);
        // the chunk lies inside both; send and receive are disjoint (checked).
        unsafe {
            raw::reduce(
                at(sp, offset),
                at(rp, offset),
                n,
                datatype,
                mop,
                root,
                comm.as_raw(),
            );
        }
    });
    recv.finish()
}

/// [`super::TensorComm::all_reduce_tensor`].
pub(super) fn all_reduce<T: TensorComm + ?Sized>(
    tc: &T,
    send: &dyn Tensor,
    recv: &mut dyn Tensor,
    op: ReduceOp,
) -> Result<()> {
    let comm = tc.communicator();
    let sig = Signature::of("all_reduce")
        .dtype(send.dtype())
        .count(send.num_elements())
        .reduce(op);
    check_intra(comm)?;
    let operands = (send, (recv, Access::Write));
    with_pair(
        tc,
        Kind::Collective(sig),
        operands,
        Some(send.dtype()),
        |s, r| {
            let names = ("all-reduce send vs receive", "all-reduce receive");
            let prepared = prepare_pair(names, s, r, op);
            let Reduction {
                send,
                recv,
                op: mop,
                chunked,
            } = agree(comm, &sig, prepared)?;
            let Some(mut recv) = recv else { return Ok(()) };
            if !chunked {
                comm.all_reduce_into(&send, &mut recv, op.system_operation());
                return recv.finish();
            }
            // Strided or beyond-int: predefined reductions need predefined datatypes, so reduce
            // contiguous copies (or the tensors' own runs) in chunks of at most 2^30 units.
            let datatype = send.unit_datatype().as_raw();
            let (sp, rp) = (send.ptr(), recv.ptr());
            in_chunks(send.units(), send.unit_bytes(), |offset, n| {
                // SAFETY: both buffers hold `units` units of `datatype` (checked counts and
                // spans); the chunk lies inside both; send and receive are disjoint (checked).
                unsafe {
                    raw::all_reduce(
                        at(sp, offset),
                        at(rp, offset),
                        n,
                        datatype,
                        mop,
                        comm.as_raw(),
                    );
                }
            });
            recv.finish()
        },
    )
}

/// [`super::TensorComm::all_reduce_tensor_in_place`]: the tensor's own run, or a packed
/// copy of its values, reduced in place in chunks of at most 2^30 units (one call for most
/// tensors).
pub(super) fn all_reduce_in_place<T: TensorComm + ?Sized>(
    tc: &T,
    tensor: &mut dyn Tensor,
    op: ReduceOp,
) -> Result<()> {
    let comm = tc.communicator();
    let sig = Signature::of("all_reduce_in_place")
        .dtype(tensor.dtype())
        .count(tensor.num_elements())
        .reduce(op);
    check_intra(comm)?;
    let dt = Some(tensor.dtype());
    with_write(
        tc,
        Kind::Collective(sig),
        (tensor, Access::Update),
        dt,
        |(t, reach)| {
            let prepared = prepare(move || {
                let rf = write_facts(&*t, Access::Update, reach)?;
                rf.element.check_reduction(op)?;
                let mop = op_handle(op, rf.element.dtype)?;
                Ok((side_out(t, rf, Need::Chunks, Access::Update)?, mop))
            });
            let (side, mop) = agree(comm, &sig, prepared)?;
            let (ptr, datatype) = (side.ptr(), side.unit_datatype().as_raw());
            in_chunks(side.units(), side.unit_bytes(), |offset, n| {
                // SAFETY: MPI_IN_PLACE as the send buffer makes MPI read and write the side's
                // units (the tensor's own run, checked writable and disjoint, or a packed copy
                // of its values); the chunk lies inside it.
                unsafe {
                    raw::all_reduce(
                        raw::in_place(),
                        at(ptr, offset),
                        n,
                        datatype,
                        mop,
                        comm.as_raw(),
                    );
                }
            });
            side.finish()
        },
    )
}

/// [`super::TensorComm::reduce_scatter_block_tensor`].
pub(super) fn reduce_scatter_block<T: TensorComm + ?Sized>(
    tc: &T,
    send: &dyn Tensor,
    recv: &mut dyn Tensor,
    op: ReduceOp,
) -> Result<()> {
    let comm = tc.communicator();
    let sig = Signature::of("reduce_scatter_block")
        .dtype(send.dtype())
        .count(recv.num_elements())
        .reduce(op);
    check_intra(comm)?;
    let operands = (send, (recv, Access::Write));
    let dt = Some(send.dtype());
    with_pair(
        tc,
        Kind::Collective(sig),
        operands,
        dt,
        |(s, s_reach), (r, r_reach)| {
            let prepared = prepare(move || {
                let sf = read_facts(s, s_reach)?;
                sf.element.check_reduction(op)?;
                let mop = op_handle(op, sf.element.dtype)?;
                let rf = write_facts(&*r, Access::Write, r_reach)?;
                check_pair("reduce-scatter-block send vs receive", &sf, &rf)?;
                let size = comm.size();
                check_count(
                    || format!("reduce-scatter-block send (= receive count × {size} ranks)"),
                    rf.len_elems.saturating_mul(i64::from(size)),
                    sf.len_elems,
                )?;
                let recv = side_out(r, rf, Need::Units, Access::Write)?;
                Ok((side_in(s, sf, Need::Units)?, recv, mop))
            });
            let (send, recv, mop) = agree(comm, &sig, prepared)?;
            // SAFETY: `recv` holds `count` units of the predefined type, `send` holds
            // `size × count`; both are contiguous runs and disjoint (checked).
            unsafe {
                raw::reduce_scatter_block(
                    send.ptr(),
                    recv.ptr(),
                    recv.count(),
                    recv.as_datatype().as_raw(),
                    mop,
                    comm.as_raw(),
                );
            }
            recv.finish()
        },
    )
}
