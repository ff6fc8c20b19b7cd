//! The collectives of [`crate::comm`] that move data without reducing it: broadcast,
//! gather, scatter, all-gather and all-to-all, with their v-variants.
//!
//! Each operation declares its operands to the communicator's stager (what MPI does with
//! each, [`Access`]), then runs every fallible step on the stand-ins in one preparation
//! (facts, checks against each other, sides with their packed copies), agrees on the
//! outcome across the ranks (`agree`, see [`crate::comm::Agreement`]), and only then calls MPI:
//! after agreement nothing can fail before the data operation. Per-rank blocks need a
//! buffer that splits into equal units of the predefined type ([`Need::Units`]: a strided
//! side travels as a packed copy); a broadcast's buffers and a gather's send follow the
//! packing policy ([`Need::Counted`]).

use mpi::topology::{Communicator, Rank};
use mpi::Count;

use crate::comm::engine::bcast::BroadcastBuffer;
use crate::comm::engine::call::{Buf, Call, Operation, Varying};
use crate::comm::engine::checks::{
    check_count, check_intra, check_pair, check_rank, missing, rank_blocks, rank_index,
};
use crate::comm::engine::mode::{pair_collective, rooted_collective, Mode};
use crate::comm::engine::operands::{
    pair_facts, read_facts, read_side, side_in, side_out, write_facts, write_side,
};
use crate::comm::engine::signature::Signature;
use crate::comm::engine::stager::Unused;
use crate::comm::engine::stager::{Declared, Endpoint};
use crate::dlpack::Tensor;
use crate::dtype::ElementType;
use crate::error::Result;
use crate::spec::encoding::Need;
use crate::spec::facts::Facts;
use crate::spec::Access;

/// `broadcast_tensor_from`, `broadcast_tensor`
/// and their nonblocking forms.
pub(in crate::comm) fn broadcast<'a, E: Endpoint + ?Sized, M: Mode<'a>>(
    tc: &'a E,
    mode: M,
    buffer: BroadcastBuffer<'a>,
    root: Rank,
) -> Result<M::Out> {
    let comm = tc.communicator();
    let sig = Signature::of("broadcast")
        .root(root)
        .dtype(buffer.sent().dtype())
        .count(buffer.sent().num_elements());
    check_intra(comm)?;
    let root_ok = check_rank(root, comm.size());
    if comm.rank() == root {
        let declared = Declared::read(buffer.into_sent());
        return mode.collective(tc, sig, declared, move |s, _| {
            root_ok?;
            let (t, reach) = s.ok_or_else(|| missing("broadcast buffer"))?;
            // MPI_Bcast only reads the buffer at the root (MPI-4.1 §6.4).
            let side = read_side(t, reach, Need::Counted)?;
            let call = Call::Bcast {
                buf: Buf::of(&side),
                root,
            };
            Ok(Operation::new(Some(side), None, call))
        });
    }
    // A non-root that passed the root's form (`BroadcastBuffer::Send`) refuses like any
    // other local check: through the agreement, so that no rank is left in MPI_Bcast.
    let tensor = match buffer.received(comm.rank(), root) {
        Ok(tensor) => tensor,
        Err(e) => return mode.refuse(tc, sig, e),
    };
    let declared = Declared::write((tensor, Access::Write), None);
    mode.collective(tc, sig, declared, move |_, r| {
        root_ok?;
        let (t, reach) = r.ok_or_else(|| missing("broadcast buffer"))?;
        let side = write_side(t, Access::Write, reach, Need::Counted)?;
        let call = Call::Bcast {
            buf: Buf::of(&side),
            root,
        };
        Ok(Operation::new(None, Some(side), call))
    })
}

/// `gather_tensor` and its nonblocking form. A `recv` given at a
/// non-root rank is checked as at the root (and not used); a device stager does not take it
/// there.
pub(in crate::comm) fn gather<'a, E: Endpoint + ?Sized, M: Mode<'a>>(
    tc: &'a E,
    mode: M,
    send: &'a dyn Tensor,
    recv: Option<&'a mut dyn Tensor>,
    root: Rank,
) -> Result<M::Out> {
    let sig = Signature::of_tensor("gather", send).root(root);
    let operands = (Some(send), recv.map(|r| (r, Access::Write)), None);
    let rooted = (root, Unused::Recv);
    rooted_collective(
        tc,
        mode,
        sig,
        operands,
        rooted,
        move |s, r, (size, is_root)| {
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
            let side = side_in(s, sf, Need::Counted)?;
            let call = Call::Gather {
                send: Buf::of(&side),
                recv: rf
                    .as_ref()
                    .map_or(Buf::none(), |r| Buf::of(r).per_rank(size)),
                root,
            };
            Ok(Operation::new(Some(side), rf, call))
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

/// `gatherv_tensor` and its nonblocking form. A `recv` given at a
/// non-root rank is checked as at the root (its `counts[rank]` against this rank's send;
/// not used).
pub(in crate::comm) fn gatherv<'a, E: Endpoint + ?Sized, M: Mode<'a>>(
    tc: &'a E,
    mode: M,
    send: &'a dyn Tensor,
    recv: Option<(&'a mut dyn Tensor, &'a [i64], &'a [i64])>,
    root: Rank,
) -> Result<M::Out> {
    let comm = tc.communicator();
    let sig = Signature::of("gatherv").root(root).dtype(send.dtype());
    let (recv, lists) = match recv {
        Some((r, c, d)) => (Some((r, Access::Update)), Some((c, d))),
        None => (None, None),
    };
    let rooted = (root, Unused::Recv);
    let operands = (Some(send), recv, None);
    rooted_collective(
        tc,
        mode,
        sig,
        operands,
        rooted,
        move |s, r, (size, is_root)| {
            check_rank(root, size)?;
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
            let side = side_in(s, sf, Need::Counted)?;
            let send = Buf::of(&side);
            let (recv, call) = match at_root {
                Some((rf, blocks)) => {
                    let recv = Some(Varying::of(&rf, blocks));
                    (Some(rf), Call::Gatherv { send, recv, root })
                }
                None => (
                    None,
                    Call::Gatherv {
                        send,
                        recv: None,
                        root,
                    },
                ),
            };
            Ok(Operation::new(Some(side), recv, call))
        },
    )
}

/// `scatter_tensor` and its nonblocking form. A `send` given at a
/// non-root rank is checked as at the root (and not used); a device stager does not take it
/// there.
pub(in crate::comm) fn scatter<'a, E: Endpoint + ?Sized, M: Mode<'a>>(
    tc: &'a E,
    mode: M,
    send: Option<&'a dyn Tensor>,
    recv: &'a mut dyn Tensor,
    root: Rank,
) -> Result<M::Out> {
    let sig = Signature::of_tensor("scatter", recv).root(root);
    let operands = (send, Some((recv, Access::Write)), None);
    let rooted = (root, Unused::Send);
    rooted_collective(
        tc,
        mode,
        sig,
        operands,
        rooted,
        move |s, r, (size, is_root)| {
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
            let side = side_out(r, rf, Need::Counted, Access::Write)?;
            let call = Call::Scatter {
                send: sf
                    .as_ref()
                    .map_or(Buf::none(), |s| Buf::of(s).per_rank(size)),
                recv: Buf::of(&side),
                root,
            };
            Ok(Operation::new(sf, Some(side), call))
        },
    )
}

/// `scatterv_tensor` and its nonblocking form. A `send` given at a
/// non-root rank is checked as at the root (its `counts[rank]` against this rank's receive;
/// not used). The receive is an update: its count is this rank's block at the root, but the
/// root's array is not fingerprinted, so a root that sends fewer elements (an erroneous
/// program, MPI-4.1 §6.6) leaves the rest of the tensor as it was, never a previous
/// message's bytes from a pooled copy.
pub(in crate::comm) fn scatterv<'a, E: Endpoint + ?Sized, M: Mode<'a>>(
    tc: &'a E,
    mode: M,
    send: Option<(&'a dyn Tensor, &'a [i64], &'a [i64])>,
    recv: &'a mut dyn Tensor,
    root: Rank,
) -> Result<M::Out> {
    let comm = tc.communicator();
    let sig = Signature::of("scatterv").root(root).dtype(recv.dtype());
    let (send, lists) = match send {
        Some((s, c, d)) => (Some(s), Some((c, d))),
        None => (None, None),
    };
    let operands = (send, Some((recv, Access::Update)), None);
    let rooted = (root, Unused::Send);
    rooted_collective(
        tc,
        mode,
        sig,
        operands,
        rooted,
        move |s, r, (size, is_root)| {
            check_rank(root, size)?;
            let (r, r_reach) = r.ok_or_else(|| missing("scatterv receive buffer"))?;
            let rf = write_facts(&*r, Access::Update, r_reach)?;
            let at_root = match s.zip(lists) {
                Some(((s, s_reach), (counts, displs))) => {
                    let sf = read_facts(s, s_reach)?;
                    check_pair("scatterv send vs receive", &sf, &rf)?;
                    let shape = (sf.len_elems, &sf.element);
                    let blocks =
                        own_blocks(comm, "scatterv", shape, counts, displs, false, rf.len_elems)?;
                    if is_root {
                        Some((side_in(s, sf, Need::Units)?, blocks))
                    } else {
                        None
                    }
                }
                None if is_root => return Err(missing("scatterv send buffer")),
                None => None,
            };
            let side = side_out(r, rf, Need::Counted, Access::Update)?;
            let recv = Buf::of(&side);
            let (send, call) = match at_root {
                Some((sf, blocks)) => {
                    let send = Some(Varying::of(&sf, blocks));
                    (Some(sf), Call::Scatterv { send, recv, root })
                }
                None => (
                    None,
                    Call::Scatterv {
                        send: None,
                        recv,
                        root,
                    },
                ),
            };
            Ok(Operation::new(send, Some(side), call))
        },
    )
}

/// `all_gather_tensor` and its nonblocking form.
pub(in crate::comm) fn all_gather<'a, E: Endpoint + ?Sized, M: Mode<'a>>(
    tc: &'a E,
    mode: M,
    send: &'a dyn Tensor,
    recv: &'a mut dyn Tensor,
) -> Result<M::Out> {
    let comm = tc.communicator();
    let sig = Signature::of_tensor("all_gather", send);
    let size = comm.size();
    let names = ("all-gather send and receive", "all-gather send vs receive");
    let operands = (send, recv, Access::Write);
    moving_pair(tc, mode, sig, operands, names, move |(s, sf), (r, rf)| {
        check_count(
            || format!("all-gather receive (= send count × {size} ranks)"),
            sf.len_elems.saturating_mul(i64::from(size)),
            rf.len_elems,
        )?;
        let rf = side_out(r, rf, Need::Units, Access::Write)?;
        let side = side_in(s, sf, Need::Counted)?;
        let call = Call::AllGather {
            send: Buf::of(&side),
            recv: Buf::of(&rf).per_rank(size),
        };
        Ok(Operation::new(Some(side), Some(rf), call))
    })
}

/// `all_gatherv_tensor` and its nonblocking form.
pub(in crate::comm) fn all_gatherv<'a, E: Endpoint + ?Sized, M: Mode<'a>>(
    tc: &'a E,
    mode: M,
    send: &'a dyn Tensor,
    recv: &'a mut dyn Tensor,
    counts: &'a [i64],
    displacements: &'a [i64],
) -> Result<M::Out> {
    let comm = tc.communicator();
    let sig = Signature::of("all_gatherv")
        .dtype(send.dtype())
        .counts(counts);
    let names = (
        "all-gatherv send and receive",
        "all-gatherv send vs receive",
    );
    let operands = (send, recv, Access::Update);
    moving_pair(tc, mode, sig, operands, names, move |(s, sf), (r, rf)| {
        let (shape, own) = ((rf.len_elems, &rf.element), sf.len_elems);
        let blocks = own_blocks(comm, "all-gatherv", shape, counts, displacements, true, own)?;
        let rf = side_out(r, rf, Need::Units, Access::Update)?;
        // The send side is flattened too: Open MPI 4.1's all-gatherv hangs at 3 ranks when
        // one rank sends a derived datatype of 64 Ki elements (found by `dlpack-mpi check
        // --layout step`).
        let side = side_in(s, sf, Need::Units)?;
        let call = Call::AllGatherv {
            send: Buf::of(&side),
            recv: Varying::of(&rf, blocks),
        };
        Ok(Operation::new(Some(side), Some(rf), call))
    })
}

/// `all_to_all_tensor` and its nonblocking form.
pub(in crate::comm) fn all_to_all<'a, E: Endpoint + ?Sized, M: Mode<'a>>(
    tc: &'a E,
    mode: M,
    send: &'a dyn Tensor,
    recv: &'a mut dyn Tensor,
) -> Result<M::Out> {
    let comm = tc.communicator();
    let sig = Signature::of_tensor("all_to_all", send);
    let size = comm.size();
    let names = ("all-to-all send and receive", "all-to-all send vs receive");
    let operands = (send, recv, Access::Write);
    moving_pair(tc, mode, sig, operands, names, move |(s, sf), (r, rf)| {
        let n = sf.len_elems;
        check_count(|| "all-to-all receive".into(), n, rf.len_elems)?;
        let ranks = i64::from(size);
        check_count(
            || format!("all-to-all send (a multiple of {ranks} ranks)"),
            n - n % ranks,
            n,
        )?;
        let rf = side_out(r, rf, Need::Units, Access::Write)?;
        let side = side_in(s, sf, Need::Units)?;
        let call = Call::AllToAll {
            send: Buf::of(&side).per_rank(size),
            recv: Buf::of(&rf).per_rank(size),
        };
        Ok(Operation::new(Some(side), Some(rf), call))
    })
}

/// `all_to_allv_tensor` and its nonblocking form.
pub(in crate::comm) fn all_to_allv<'a, E: Endpoint + ?Sized, M: Mode<'a>>(
    tc: &'a E,
    mode: M,
    (send, send_counts, send_displacements): (&'a dyn Tensor, &'a [i64], &'a [i64]),
    (recv, recv_counts, recv_displacements): (&'a mut dyn Tensor, &'a [i64], &'a [i64]),
) -> Result<M::Out> {
    let comm = tc.communicator();
    let sig = Signature::of("all_to_allv").dtype(send.dtype());
    let names = (
        "all-to-allv send and receive",
        "all-to-allv send vs receive",
    );
    let operands = (send, recv, Access::Update);
    moving_pair(tc, mode, sig, operands, names, move |(s, sf), (r, rf)| {
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
            || format!("all-to-allv recv_counts[{rank}] (the block this rank sends itself)"),
            send_counts[rank],
            recv_counts[rank],
        )?;
        let rf = side_out(r, rf, Need::Units, Access::Update)?;
        let side = side_in(s, sf, Need::Units)?;
        let call = Call::AllToAllv {
            send: Varying::of(&side, sends),
            recv: Varying::of(&rf, recvs),
        };
        Ok(Operation::new(Some(side), Some(rf), call))
    })
}

/// The opening of the pair collectives that move data (all-gather(v), all-to-all(v)):
/// [`pair_collective`], then both operands' facts checked as a pair ([`pair_facts`]) for
/// `prepare`; `names`: the missing pair and the checked pair, in errors.
///
/// # Errors
/// As [`pair_collective`] and [`pair_facts`], then `prepare`'s.
fn moving_pair<'a, E, M, P>(
    tc: &'a E,
    mode: M,
    sig: Signature<'a>,
    (send, recv, access): (&'a dyn Tensor, &'a mut dyn Tensor, Access),
    (what, pair): (&'static str, &'static str),
    prepare: P,
) -> Result<M::Out>
where
    E: Endpoint + ?Sized,
    M: Mode<'a>,
    P: for<'x> FnOnce(
        (&'x dyn Tensor, Facts),
        (&'x mut dyn Tensor, Facts),
    ) -> Result<Operation<'x>>,
{
    let operands = (send, recv, access);
    pair_collective(
        tc,
        mode,
        sig,
        operands,
        None,
        what,
        move |(s, s_reach), (r, r_reach)| {
            let (sf, rf) = pair_facts(pair, (s, s_reach), (&*r, access, r_reach))?;
            prepare((s, sf), (r, rf))
        },
    )
}
