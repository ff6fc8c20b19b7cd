//! The reductions of [`crate::comm`]: reduce, all-reduce (also in place) and
//! reduce-scatter-block, each one body for the blocking and the nonblocking form
//! ([`crate::comm::engine::mode`]).
//!
//! Both sides are contiguous runs of a predefined datatype for MPI's reduction: MPI's
//! predefined operations take predefined datatypes only, so a strided side is reduced as a
//! packed copy ([`Encoding::Chunked`]); more than 2^30 units are reduced in chunks of at most
//! 2^30 (an element-wise reduction may be cut anywhere, [`crate::comm::engine::call`]); and half-precision
//! dtypes use the user-defined operations of [`halfops`].
//!
//! Each reduction runs every check and builds its buffers first, then agrees across the
//! ranks (`agree`, see [`crate::comm::Agreement`]) before the first MPI call.

use mpi::raw::AsRaw;
use mpi::topology::{Communicator, Rank};

use crate::comm::engine::call::{check_reducible, handles};
use crate::comm::engine::call::{Buf, Call, Operation, Reduced, REDUCE_CHUNK_UNITS};
use crate::comm::engine::checks::{check_count, check_intra, check_pair, check_rank, missing};
use crate::comm::engine::halfops;
use crate::comm::engine::mode::{pair_collective, rooted_collective, Mode};
use crate::comm::engine::operands::{read_facts, side_in, side_out, write_facts};
use crate::comm::engine::signature::Signature;
use crate::comm::engine::stager::{Declared, Endpoint};
use crate::comm::engine::stager::{ReadIn, Unused, WriteIn};
use crate::dlpack::Tensor;
use crate::dtype::ReduceOp;
use crate::error::Result;
use crate::raw;
#[cfg(doc)]
use crate::spec::encoding::Encoding;
use crate::spec::encoding::Need;
use crate::spec::facts::Facts;
use crate::spec::side::{In, Side};
use crate::spec::Access;

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

/// The call of a reduction with `op` over `send` (its units, in chunks) into `recv` (NULL
/// where the receive is not significant), to `root` (`None`: every rank).
///
/// # Errors
/// As [`handles`].
fn reduction(
    send: &Side<'_, In>,
    recv: *mut std::ffi::c_void,
    op: ReduceOp,
    root: Option<Rank>,
) -> Result<Call> {
    let (datatype, op) = handles(op, send.element().dtype, send.unit_datatype().as_raw())?;
    Ok(Call::Reduce {
        buffers: Reduced {
            send: send.ptr().cast_const(),
            recv,
            units: send.units(),
            unit_bytes: send.unit_bytes(),
            datatype,
            op,
        },
        root,
    })
}

/// Every check of a reduction with a send and a receive tensor (`pair` and `count` name
/// them in errors), then both sides and the call to `root` (`None`: an all-reduce).
fn prepare_pair<'x>(
    (pair, count): (&'static str, &'static str),
    (send, s_reach): ReadIn<'x>,
    (recv, r_reach): WriteIn<'x>,
    op: ReduceOp,
    root: Option<Rank>,
) -> Result<Operation<'x>> {
    let sf = read_facts(send, s_reach)?;
    check_reducible(op, &sf)?;
    let rf = write_facts(&*recv, Access::Write, r_reach)?;
    check_pair(pair, &sf, &rf)?;
    check_count(|| count.into(), sf.len_elems, rf.len_elems)?;
    let chunked = needs_chunks(&sf, Some(&rf));
    let recv = side_out(recv, rf, need(chunked), Access::Write)?;
    let send = side_in(send, sf, need(chunked))?;
    let call = reduction(&send, recv.ptr(), op, root)?;
    Ok(Operation::new(Some(send), Some(recv), call))
}

/// `reduce_tensor` and its nonblocking form. A `recv` given at a
/// non-root rank is checked as at the root (and not used); a device stager does not take it
/// there.
pub(in crate::comm) fn reduce<'a, E: Endpoint + ?Sized, M: Mode<'a>>(
    tc: &'a E,
    mode: M,
    send: &'a dyn Tensor,
    recv: Option<&'a mut dyn Tensor>,
    op: ReduceOp,
    root: Rank,
) -> Result<M::Out> {
    let sig = Signature::of_tensor("reduce", send).root(root).reduce(op);
    let operands = (
        Some(send),
        recv.map(|r| (r, Access::Write)),
        Some(send.dtype()),
    );
    let rooted = (root, Unused::Recv);
    rooted_collective(
        tc,
        mode,
        sig,
        operands,
        rooted,
        move |s, r, (size, is_root)| {
            let s = s.ok_or_else(|| missing("reduce send buffer"))?;
            let names = ("reduce send vs receive", "reduce receive");
            match r {
                Some(r) if is_root => prepare_pair(names, s, r, op, Some(root)),
                None if is_root => Err(missing("reduce receive buffer")),
                r => reduce_at_leaf(size, s, r, op, root),
            }
        },
    )
}

/// A non-root rank's side of [`reduce`] (also a rank whose `root` is out of range), in a
/// communicator of `size` ranks.
fn reduce_at_leaf<'x>(
    size: Rank,
    send: ReadIn<'x>,
    recv: Option<WriteIn<'x>>,
    op: ReduceOp,
    root: Rank,
) -> Result<Operation<'x>> {
    check_rank(root, size)?;
    let sf = read_facts(send.0, send.1)?;
    check_reducible(op, &sf)?;
    if let Some((recv, r_reach)) = recv {
        let rf = write_facts(&*recv, Access::Write, r_reach)?;
        check_pair("reduce send vs receive", &sf, &rf)?;
        check_count(|| "reduce receive".into(), sf.len_elems, rf.len_elems)?;
    }
    let chunked = needs_chunks(&sf, None);
    let send = side_in(send.0, sf, need(chunked))?;
    // The receive buffer is not significant at non-root ranks (MPI-4.1 §6.9.1).
    let call = reduction(&send, std::ptr::null_mut(), op, Some(root))?;
    Ok(Operation::new(Some(send), None, call))
}

/// `all_reduce_tensor` and its nonblocking form.
pub(in crate::comm) fn all_reduce<'a, E: Endpoint + ?Sized, M: Mode<'a>>(
    tc: &'a E,
    mode: M,
    send: &'a dyn Tensor,
    recv: &'a mut dyn Tensor,
    op: ReduceOp,
) -> Result<M::Out> {
    let sig = Signature::of_tensor("all_reduce", send).reduce(op);
    let operands = (send, recv, Access::Write);
    let (what, reduce) = ("all-reduce send and receive", Some(send.dtype()));
    pair_collective(tc, mode, sig, operands, reduce, what, move |s, r| {
        let names = ("all-reduce send vs receive", "all-reduce receive");
        prepare_pair(names, s, r, op, None)
    })
}

/// `all_reduce_tensor_in_place` and its nonblocking form: the tensor's
/// own run, or a packed copy of its values, reduced in place (`MPI_IN_PLACE`) in chunks of
/// at most 2^30 units (one call for most tensors).
pub(in crate::comm) fn all_reduce_in_place<'a, E: Endpoint + ?Sized, M: Mode<'a>>(
    tc: &'a E,
    mode: M,
    tensor: &'a mut dyn Tensor,
    op: ReduceOp,
) -> Result<M::Out> {
    let comm = tc.communicator();
    let sig = Signature::of_tensor("all_reduce_in_place", tensor).reduce(op);
    check_intra(comm)?;
    let dt = Some(tensor.dtype());
    let declared = Declared::write((tensor, Access::Update), dt);
    mode.collective(tc, sig, declared, move |_, r| {
        let (t, reach) = r.ok_or_else(|| missing("all-reduce in-place buffer"))?;
        let rf = write_facts(&*t, Access::Update, reach)?;
        check_reducible(op, &rf)?;
        let dtype = rf.element.dtype;
        let side = side_out(t, rf, Need::Chunks, Access::Update)?;
        let (datatype, mop) = handles(op, dtype, side.unit_datatype().as_raw())?;
        // MPI_IN_PLACE as the send buffer makes MPI read and write the side's units (the
        // tensor's own run, checked writable and disjoint, or a packed copy of its values).
        let call = Call::Reduce {
            buffers: Reduced {
                send: raw::in_place().cast_const(),
                recv: side.ptr(),
                units: side.units(),
                unit_bytes: side.unit_bytes(),
                datatype,
                op: mop,
            },
            root: None,
        };
        Ok(Operation::new(None, Some(side), call))
    })
}

/// `reduce_scatter_block_tensor` and its nonblocking form.
pub(in crate::comm) fn reduce_scatter_block<'a, E: Endpoint + ?Sized, M: Mode<'a>>(
    tc: &'a E,
    mode: M,
    send: &'a dyn Tensor,
    recv: &'a mut dyn Tensor,
    op: ReduceOp,
) -> Result<M::Out> {
    let comm = tc.communicator();
    let sig = Signature::of("reduce_scatter_block")
        .dtype(send.dtype())
        .count(recv.num_elements())
        .reduce(op);
    let size = comm.size();
    let operands = (send, recv, Access::Write);
    let (what, reduce) = ("reduce-scatter-block send and receive", Some(send.dtype()));
    pair_collective(
        tc,
        mode,
        sig,
        operands,
        reduce,
        what,
        move |(s, s_reach), (r, r_reach)| {
            let sf = read_facts(s, s_reach)?;
            check_reducible(op, &sf)?;
            let dtype = sf.element.dtype;
            let rf = write_facts(&*r, Access::Write, r_reach)?;
            check_pair("reduce-scatter-block send vs receive", &sf, &rf)?;
            check_count(
                || format!("reduce-scatter-block send (= receive count × {size} ranks)"),
                rf.len_elems.saturating_mul(i64::from(size)),
                sf.len_elems,
            )?;
            let recv = side_out(r, rf, Need::Units, Access::Write)?;
            let send = side_in(s, sf, Need::Units)?;
            // `recv` holds `count` units of the predefined type, `send` `size × count`; both
            // are contiguous runs and disjoint (checked).
            let (datatype, mop) = handles(op, dtype, recv.unit_datatype().as_raw())?;
            let call = Call::ReduceScatterBlock {
                send: send.ptr().cast_const(),
                recv: Buf::of(&recv).with_datatype(datatype),
                op: mop,
            };
            Ok(Operation::new(Some(send), Some(recv), call))
        },
    )
}
