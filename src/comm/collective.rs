//! The collectives of [`super::TensorComm`] that move data without reducing it: broadcast,
//! gather, scatter, all-gather and all-to-all, with their v-variants.
//!
//! Each operation declares its operands to the communicator's stager (what MPI does with
//! each, [`Access`]), then runs every fallible step on the stand-ins in one preparation
//! (facts, checks against each other, sides with their packed copies), agrees on the
//! outcome across the ranks (`agree`, see [`super::Agreement`]), and only then calls MPI:
//! after agreement nothing can fail before the data operation. Per-rank blocks need a
//! buffer that splits into equal units of the predefined type ([`Need::Units`]: a strided
//! side travels as a packed copy); a broadcast's buffers and a gather's send follow the
//! packing policy ([`Need::Counted`]).

use mpi::datatype::{AsDatatype, Collection, Partition, PartitionMut, Pointer};
use mpi::raw::AsRaw;
use mpi::topology::{Communicator, Rank};
use mpi::traits::*;

use mpi::Count;

use super::agree::{agree, prepare};
use super::bcast::BroadcastBuffer;
use super::checks::{
    check_count, check_intra, check_pair, check_rank, missing, rank_blocks, rank_index,
};
use super::operands::{
    pair_facts, read_facts, read_side, side_in, side_out, write_facts, write_side,
};
use super::signature::Signature;
use super::stager::{with_pair, with_read, with_stand_ins, with_write, Kind, Unused};
use super::TensorComm;
use crate::dlpack::Tensor;
use crate::dtype::ElementType;
use crate::error::Result;
use crate::raw;
use crate::spec::encoding::Need;
use crate::spec::Access;

/// [`super::TensorComm::broadcast_tensor_from`] and [`super::TensorComm::broadcast_tensor`].
pub(super) fn broadcast<T: TensorComm + ?Sized>(
    tc: &T,
    buffer: BroadcastBuffer<'_>,
    root: Rank,
) -> Result<()> {
    let comm = tc.communicator();
    let sig = Signature::of("broadcast")
        .root(root)
        .dtype(buffer.sent().dtype())
        .count(buffer.sent().num_elements());
    check_intra(comm)?;
    let root_ok = check_rank(root, comm.size());
    if comm.rank() == root {
        return with_read(tc, Kind::Collective(sig), buffer.sent(), |(t, reach)| {
            let prepared = root_ok.and_then(|()| read_side(t, reach, Need::Counted));
            let side = agree(comm, &sig, prepared)?;
            let (ptr, count, datatype) = (
                side.pointer().cast_mut(),
                side.count(),
                side.as_datatype().as_raw(),
            );
            // SAFETY: MPI_Bcast only reads the buffer at the root (MPI-4.1 §6.4); it holds
            // `count` readable units of `datatype` (the tensor, or its packed copy).
            unsafe { raw::bcast(ptr, count, datatype, root, comm.as_raw()) };
            Ok(())
        });
    }
    // A non-root that passed the root's form (`BroadcastBuffer::Send`) refuses like any
    // other local check: through the agreement, so that no rank is left in MPI_Bcast.
    let tensor = match buffer.received(comm.rank(), root) {
        Ok(tensor) => tensor,
        Err(e) => return agree(comm, &sig, Err(e)),
    };
    let recv = (tensor, Access::Write);
    with_write(tc, Kind::Collective(sig), recv, None, |(t, reach)| {
        let prepared = root_ok.and_then(|()| write_side(t, Access::Write, reach, Need::Counted));
        let mut side = agree(comm, &sig, prepared)?;
        comm.process_at_rank(root).broadcast_into(&mut side);
        side.finish()
    })
}

/// [`super::TensorComm::gather_tensor`]. A `recv` given at a non-root rank is checked as at
/// the root (and not used); a device stager does not take it there.
pub(super) fn gather<T: TensorComm + ?Sized>(
    tc: &T,
    send: &dyn Tensor,
    recv: Option<&mut dyn Tensor>,
    root: Rank,
) -> Result<()> {
    let comm = tc.communicator();
    let sig = Signature::of("gather")
        .root(root)
        .dtype(send.dtype())
        .count(send.num_elements());
    check_intra(comm)?;
    let (size, is_root) = (comm.size(), comm.rank() == root);
    let recv = recv.map(|r| (r, Access::Write));
    let unused = (
        None,
        if is_root {
            Unused::Neither
        } else {
            Unused::Recv
        },
    );
    with_stand_ins(
        tc.stager(),
        comm,
        Kind::Collective(sig),
        Some(send),
        recv,
        unused,
        |s, r| {
            let prepared = prepare(move || {
                check_rank(root, size)?;
                let (s, s_reach) = s.ok_or_else(|| missing("gather send buffer"))?;
                let sf = read_facts(s, s_reach)?;
                let rf = match r {
                    Some((r, r_reach)) => {
                        let rf = write_facts(&*r, Access::Write, r_reach)?;
                        check_pair("gather send vs receive", &sf, &rf)?;
                        check_count(
                            || format!("gather receive (= send count × {size} ranks)"),
                            sf.len_elems.saturating_mul(i64::from(size)),
                            rf.len_elems,
                        )?;
                        if is_root {
                            Some(side_out(r, rf, Need::Units, Access::Write)?)
                        } else {
                            None
                        }
                    }
                    None if is_root => return Err(missing("gather receive buffer")),
                    None => None,
                };
                Ok((side_in(s, sf, Need::Counted)?, rf))
            });
            let (side, rf) = agree(comm, &sig, prepared)?;
            let process = comm.process_at_rank(root);
            match rf {
                Some(mut rf) => {
                    process.gather_into_root(&side, &mut rf);
                    rf.finish()
                }
                None => {
                    process.gather_into(&side);
                    Ok(())
                }
            }
        },
    )
}

/// The checks of a v-collective's per-rank side at `rank` (`(tensor elements, element
/// type)` of the tensor the blocks lie in, `counts`, `displs`) and its own block against
/// `own` elements: the block lists in MPI units.
fn own_blocks<C: Communicator + ?Sized>(
    comm: &C,
    what: &'static str,
    (len_elems, element): (i64, &ElementType),
    counts: &[i64],
    displs: &[i64],
    disjoint: bool,
    own: i64,
) -> Result<(Vec<Count>, Vec<Count>)> {
    let blocks = rank_blocks(comm, len_elems, element, counts, displs, disjoint)?;
    let rank = comm.rank();
    check_count(
        || format!("{what} counts[{rank}] (this rank's own block)"),
        counts[rank_index(rank)],
        own,
    )?;
    Ok(blocks)
}

/// [`super::TensorComm::gatherv_tensor`]. A `recv` given at a non-root rank is checked as
/// at the root (its `counts[rank]` against this rank's send; not used).
pub(super) fn gatherv<T: TensorComm + ?Sized>(
    tc: &T,
    send: &dyn Tensor,
    recv: Option<(&mut dyn Tensor, &[i64], &[i64])>,
    root: Rank,
) -> Result<()> {
    let comm = tc.communicator();
    let sig = Signature::of("gatherv").root(root).dtype(send.dtype());
    check_intra(comm)?;
    let is_root = comm.rank() == root;
    let unused = (
        None,
        if is_root {
            Unused::Neither
        } else {
            Unused::Recv
        },
    );
    let (recv, lists) = match recv {
        Some((r, c, d)) => (Some((r, Access::Update)), Some((c, d))),
        None => (None, None),
    };
    with_stand_ins(
        tc.stager(),
        comm,
        Kind::Collective(sig),
        Some(send),
        recv,
        unused,
        |s, r| {
            let prepared = prepare(move || {
                check_rank(root, comm.size())?;
                let (s, s_reach) = s.ok_or_else(|| missing("gatherv send buffer"))?;
                let sf = read_facts(s, s_reach)?;
                let at_root = match r.zip(lists) {
                    Some(((r, r_reach), (counts, displs))) => {
                        let rf = write_facts(&*r, Access::Update, r_reach)?;
                        check_pair("gatherv send vs receive", &sf, &rf)?;
                        let shape = (rf.len_elems, &rf.element);
                        let blocks =
                            own_blocks(comm, "gatherv", shape, counts, displs, true, sf.len_elems)?;
                        if is_root {
                            Some((side_out(r, rf, Need::Units, Access::Update)?, blocks))
                        } else {
                            None
                        }
                    }
                    None if is_root => return Err(missing("gatherv receive buffer")),
                    None => None,
                };
                Ok((side_in(s, sf, Need::Counted)?, at_root))
            });
            let (sent, at_root) = agree(comm, &sig, prepared)?;
            let process = comm.process_at_rank(root);
            match at_root {
                Some((mut rf, (cu, du))) => {
                    {
                        let mut part = PartitionMut::new(&mut rf, &cu[..], &du[..]);
                        process.gather_varcount_into_root(&sent, &mut part);
                    }
                    rf.finish()
                }
                None => {
                    process.gather_varcount_into(&sent);
                    Ok(())
                }
            }
        },
    )
}

/// [`super::TensorComm::scatter_tensor`]. A `send` given at a non-root rank is checked as
/// at the root (and not used); a device stager does not take it there.
pub(super) fn scatter<T: TensorComm + ?Sized>(
    tc: &T,
    send: Option<&dyn Tensor>,
    recv: &mut dyn Tensor,
    root: Rank,
) -> Result<()> {
    let comm = tc.communicator();
    let sig = Signature::of("scatter")
        .root(root)
        .dtype(recv.dtype())
        .count(recv.num_elements());
    check_intra(comm)?;
    let (size, is_root) = (comm.size(), comm.rank() == root);
    let unused = (
        None,
        if is_root {
            Unused::Neither
        } else {
            Unused::Send
        },
    );
    let recv = Some((recv, Access::Write));
    with_stand_ins(
        tc.stager(),
        comm,
        Kind::Collective(sig),
        send,
        recv,
        unused,
        |s, r| {
            let prepared = prepare(move || {
                check_rank(root, size)?;
                let (r, r_reach) = r.ok_or_else(|| missing("scatter receive buffer"))?;
                let rf = write_facts(&*r, Access::Write, r_reach)?;
                let sf = match s {
                    Some((s, s_reach)) => {
                        let sf = read_facts(s, s_reach)?;
                        check_pair("scatter send vs receive", &sf, &rf)?;
                        check_count(
                            || format!("scatter send (= receive count × {size} ranks)"),
                            rf.len_elems.saturating_mul(i64::from(size)),
                            sf.len_elems,
                        )?;
                        if is_root {
                            Some(side_in(s, sf, Need::Units)?)
                        } else {
                            None
                        }
                    }
                    None if is_root => return Err(missing("scatter send buffer")),
                    None => None,
                };
                Ok((sf, side_out(r, rf, Need::Counted, Access::Write)?))
            });
            let (sf, mut side) = agree(comm, &sig, prepared)?;
            let process = comm.process_at_rank(root);
            match &sf {
                Some(sf) => process.scatter_into_root(sf, &mut side),
                None => process.scatter_into(&mut side),
            }
            side.finish()
        },
    )
}

/// [`super::TensorComm::scatterv_tensor`]. A `send` given at a non-root rank is checked as
/// at the root (its `counts[rank]` against this rank's receive; not used). The receive is
/// an update: its count is this rank's block at the root, but the root's array is not
/// fingerprinted, so a root that sends fewer elements (an erroneous program, MPI-4.1 §6.6)
/// leaves the rest of the tensor as it was, never a previous message's bytes from a
/// pooled copy.
pub(super) fn scatterv<T: TensorComm + ?Sized>(
    tc: &T,
    send: Option<(&dyn Tensor, &[i64], &[i64])>,
    recv: &mut dyn Tensor,
    root: Rank,
) -> Result<()> {
    let comm = tc.communicator();
    let sig = Signature::of("scatterv").root(root).dtype(recv.dtype());
    check_intra(comm)?;
    let is_root = comm.rank() == root;
    let unused = (
        None,
        if is_root {
            Unused::Neither
        } else {
            Unused::Send
        },
    );
    let (send, lists) = match send {
        Some((s, c, d)) => (Some(s), Some((c, d))),
        None => (None, None),
    };
    let recv = Some((recv, Access::Update));
    with_stand_ins(
        tc.stager(),
        comm,
        Kind::Collective(sig),
        send,
        recv,
        unused,
        |s, r| {
            let prepared = prepare(move || {
                check_rank(root, comm.size())?;
                let (r, r_reach) = r.ok_or_else(|| missing("scatterv receive buffer"))?;
                let rf = write_facts(&*r, Access::Update, r_reach)?;
                let at_root = match s.zip(lists) {
                    Some(((s, s_reach), (counts, displs))) => {
                        let sf = read_facts(s, s_reach)?;
                        check_pair("scatterv send vs receive", &sf, &rf)?;
                        let shape = (sf.len_elems, &sf.element);
                        let blocks = own_blocks(
                            comm,
                            "scatterv",
                            shape,
                            counts,
                            displs,
                            false,
                            rf.len_elems,
                        )?;
                        if is_root {
                            Some((side_in(s, sf, Need::Units)?, blocks))
                        } else {
                            None
                        }
                    }
                    None if is_root => return Err(missing("scatterv send buffer")),
                    None => None,
                };
                Ok((at_root, side_out(r, rf, Need::Counted, Access::Update)?))
            });
            let (at_root, mut side) = agree(comm, &sig, prepared)?;
            let process = comm.process_at_rank(root);
            match &at_root {
                Some((sf, (cu, du))) => {
                    let part = Partition::new(sf, &cu[..], &du[..]);
                    process.scatter_varcount_into_root(&part, &mut side);
                }
                None => process.scatter_varcount_into(&mut side),
            }
            side.finish()
        },
    )
}

/// [`super::TensorComm::all_gather_tensor`].
pub(super) fn all_gather<T: TensorComm + ?Sized>(
    tc: &T,
    send: &dyn Tensor,
    recv: &mut dyn Tensor,
) -> Result<()> {
    let comm = tc.communicator();
    let sig = Signature::of("all_gather")
        .dtype(send.dtype())
        .count(send.num_elements());
    check_intra(comm)?;
    let operands = (send, (recv, Access::Write));
    with_pair(
        tc,
        Kind::Collective(sig),
        operands,
        None,
        |(s, s_reach), (r, r_reach)| {
            let prepared = prepare(move || {
                let (sf, rf) = pair_facts(
                    "all-gather send vs receive",
                    (s, s_reach),
                    (&*r, Access::Write, r_reach),
                )?;
                let size = comm.size();
                check_count(
                    || format!("all-gather receive (= send count × {size} ranks)"),
                    sf.len_elems.saturating_mul(i64::from(size)),
                    rf.len_elems,
                )?;
                let rf = side_out(r, rf, Need::Units, Access::Write)?;
                Ok((side_in(s, sf, Need::Counted)?, rf))
            });
            let (side, mut rf) = agree(comm, &sig, prepared)?;
            comm.all_gather_into(&side, &mut rf);
            rf.finish()
        },
    )
}

/// [`super::TensorComm::all_gatherv_tensor`].
pub(super) fn all_gatherv<T: TensorComm + ?Sized>(
    tc: &T,
    send: &dyn Tensor,
    recv: &mut dyn Tensor,
    counts: &[i64],
    displacements: &[i64],
) -> Result<()> {
    let comm = tc.communicator();
    let sig = Signature::of("all_gatherv")
        .dtype(send.dtype())
        .counts(counts);
    check_intra(comm)?;
    let operands = (send, (recv, Access::Update));
    with_pair(
        tc,
        Kind::Collective(sig),
        operands,
        None,
        |(s, s_reach), (r, r_reach)| {
            let prepared = prepare(move || {
                let (sf, rf) = pair_facts(
                    "all-gatherv send vs receive",
                    (s, s_reach),
                    (&*r, Access::Update, r_reach),
                )?;
                let (shape, own) = ((rf.len_elems, &rf.element), sf.len_elems);
                let blocks =
                    own_blocks(comm, "all-gatherv", shape, counts, displacements, true, own)?;
                let rf = side_out(r, rf, Need::Units, Access::Update)?;
                // The send side is flattened too: Open MPI 4.1's all-gatherv hangs at 3 ranks
                // when one rank sends a derived datatype of 64 Ki elements (found by
                // `dlpack-mpi check --layout step`).
                Ok((side_in(s, sf, Need::Units)?, rf, blocks))
            });
            let (sf, mut rf, (cu, du)) = agree(comm, &sig, prepared)?;
            {
                let mut part = PartitionMut::new(&mut rf, &cu[..], &du[..]);
                comm.all_gather_varcount_into(&sf, &mut part);
            }
            rf.finish()
        },
    )
}

/// [`super::TensorComm::all_to_all_tensor`].
pub(super) fn all_to_all<T: TensorComm + ?Sized>(
    tc: &T,
    send: &dyn Tensor,
    recv: &mut dyn Tensor,
) -> Result<()> {
    let comm = tc.communicator();
    let sig = Signature::of("all_to_all")
        .dtype(send.dtype())
        .count(send.num_elements());
    check_intra(comm)?;
    let operands = (send, (recv, Access::Write));
    with_pair(
        tc,
        Kind::Collective(sig),
        operands,
        None,
        |(s, s_reach), (r, r_reach)| {
            let prepared = prepare(move || {
                let (sf, rf) = pair_facts(
                    "all-to-all send vs receive",
                    (s, s_reach),
                    (&*r, Access::Write, r_reach),
                )?;
                let n = sf.len_elems;
                check_count(|| "all-to-all receive".into(), n, rf.len_elems)?;
                let size = i64::from(comm.size());
                check_count(
                    || format!("all-to-all send (a multiple of {size} ranks)"),
                    n - n % size,
                    n,
                )?;
                let rf = side_out(r, rf, Need::Units, Access::Write)?;
                Ok((side_in(s, sf, Need::Units)?, rf))
            });
            let (sf, mut rf) = agree(comm, &sig, prepared)?;
            comm.all_to_all_into(&sf, &mut rf);
            rf.finish()
        },
    )
}

/// [`super::TensorComm::all_to_allv_tensor`].
pub(super) fn all_to_allv<T: TensorComm + ?Sized>(
    tc: &T,
    (send, send_counts, send_displacements): (&dyn Tensor, &[i64], &[i64]),
    (recv, recv_counts, recv_displacements): (&mut dyn Tensor, &[i64], &[i64]),
) -> Result<()> {
    let comm = tc.communicator();
    let sig = Signature::of("all_to_allv").dtype(send.dtype());
    check_intra(comm)?;
    let operands = (send, (recv, Access::Update));
    with_pair(
        tc,
        Kind::Collective(sig),
        operands,
        None,
        |(s, s_reach), (r, r_reach)| {
            let prepared = prepare(move || {
                let (sf, rf) = pair_facts(
                    "all-to-allv send vs receive",
                    (s, s_reach),
                    (&*r, Access::Update, r_reach),
                )?;
                let (se, re) = (sf.element, rf.element);
                let sends = rank_blocks(
                    comm,
                    sf.len_elems,
                    &se,
                    send_counts,
                    send_displacements,
                    false,
                )?;
                let recvs = rank_blocks(
                    comm,
                    rf.len_elems,
                    &re,
                    recv_counts,
                    recv_displacements,
                    true,
                )?;
                let rank = rank_index(comm.rank());
                check_count(
                    || {
                        format!(
                            "all-to-allv recv_counts[{rank}] (the block this rank sends itself)"
                        )
                    },
                    send_counts[rank],
                    recv_counts[rank],
                )?;
                let rf = side_out(r, rf, Need::Units, Access::Update)?;
                Ok((side_in(s, sf, Need::Units)?, rf, sends, recvs))
            });
            let (sf, mut rf, (scu, sdu), (rcu, rdu)) = agree(comm, &sig, prepared)?;
            {
                let sp = Partition::new(&sf, &scu[..], &sdu[..]);
                let mut rp = PartitionMut::new(&mut rf, &rcu[..], &rdu[..]);
                comm.all_to_all_varcount_into(&sp, &mut rp);
            }
            rf.finish()
        },
    )
}
