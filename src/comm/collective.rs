//! The collectives of [`super::TensorComm`] that move data without reducing it: broadcast,
//! gather, scatter, all-gather and all-to-all, with their v-variants.
//!
//! Receive buffers of gathers and all-to-alls, and send buffers of scatters, are handed to
//! MPI as [`FlatSpec`]s: per-rank blocks need a buffer that splits into equal units of the
//! predefined type, so a strided side travels as a packed copy.
//!
//! Each operation first runs every fallible step in a preparation block (checks, specs,
//! packed copies, scratch; an error leaves the block through `local!`), then agrees on the
//! outcome across the ranks (`agree`, see [`super::Agreement`]), and only then calls MPI:
//! after agreement nothing can fail before the data operation.

use mpi::datatype::{AsDatatype, Collection, Partition, PartitionMut, Pointer};
use mpi::raw::AsRaw;
use mpi::topology::{Communicator, Rank};
use mpi::traits::*;

use mpi::Count;

use super::agree::agree;
use super::bcast::BroadcastBuffer;
use super::checks::{
    check_count, check_intra, check_pair, check_rank, missing, rank_blocks, rank_index,
};
use super::packing::{inner_run_elems, packs_run};
use super::sides::{RecvSide, SendSide};
use crate::dlpack::Tensor;
use crate::dtype::ElementType;
use crate::error::Result;
use crate::raw;
use crate::spec::flat::FlatSpec;
use crate::spec::{RecvSpec, SendSpec};

/// The receive side `$r` (a `RecvSpec` of `$recv`) as the policy wants it (`$packed`): the
/// spec, or a scratch (not preserved: the operation writes every element). An error leaves
/// the preparation block `$l` (see `local!`).
macro_rules! recv_side {
    ($l:lifetime, $r:ident, $packed:expr, $recv:expr) => {
        if $packed {
            RecvSide::Packed(local!(
                $l,
                FlatSpec::recv(&mut $r)
                    .and_then(|f| f.ready(&*$recv, false))
                    .and_then(FlatSpec::counted)
            ))
        } else {
            RecvSide::Spec($r)
        }
    };
}

/// Copies a packed receive side `$side` back into `$recv` after the operation.
macro_rules! finish_side {
    ($side:expr, $recv:expr) => {
        match $side {
            RecvSide::Packed(f) => f.finish($recv),
            RecvSide::Spec(_) => Ok(()),
        }
    };
}

/// [`super::TensorComm::broadcast_tensor_from`] and [`super::TensorComm::broadcast_tensor`].
pub(super) fn broadcast<C: Communicator + ?Sized>(
    comm: &C,
    buffer: BroadcastBuffer<'_>,
    root: Rank,
) -> Result<()> {
    check_intra(comm)?;
    let root_ok = check_rank(root, comm.size());
    if comm.rank() == root {
        let t = buffer.sent();
        let side = agree(
            comm,
            root_ok.and_then(|()| SendSide::new(t, SendSpec::new(t)?)),
        )?;
        let (ptr, count, datatype) = (
            side.pointer() as *mut std::ffi::c_void,
            side.count(),
            side.as_datatype().as_raw(),
        );
        // SAFETY: MPI_Bcast only reads the buffer at the root (MPI-4.1 §6.4); it holds
        // `count` readable units of `datatype` (the tensor, or its packed copy).
        unsafe { raw::bcast(ptr, count, datatype, root, comm.as_raw()) };
        return Ok(());
    }
    // A non-root that passed the root's form (`BroadcastBuffer::Send`) refuses like any
    // other local check: through the agreement, so that no rank is left in MPI_Bcast.
    let tensor = match buffer.received(comm.rank(), root) {
        Ok(tensor) => tensor,
        Err(e) => return agree(comm, Err(e)),
    };
    let run = inner_run_elems(&*tensor);
    let prepared = 'prep: {
        local!('prep, root_ok);
        let mut r = local!('prep, RecvSpec::new(&mut *tensor));
        let elem = r.element_type().size_bytes();
        let packed = local!('prep, packs_run(r.is_contiguous(), run, elem));
        Ok(recv_side!('prep, r, packed, tensor))
    };
    let mut side = agree(comm, prepared)?;
    comm.process_at_rank(root).broadcast_into(&mut side);
    finish_side!(side, tensor)
}

/// [`super::TensorComm::gather_tensor`]. A `recv` given at a non-root rank is checked as at
/// the root (and not used).
pub(super) fn gather<C: Communicator + ?Sized>(
    comm: &C,
    send: &dyn Tensor,
    mut recv: Option<&mut dyn Tensor>,
    root: Rank,
) -> Result<()> {
    check_intra(comm)?;
    let (size, is_root) = (comm.size(), comm.rank() == root);
    let prepared = 'prep: {
        local!('prep, check_rank(root, size));
        let s = local!('prep, SendSpec::new(send));
        let rf = match recv.as_deref_mut() {
            Some(recv) => {
                let mut r = local!('prep, RecvSpec::new(&mut *recv));
                local!('prep, check_pair("gather send vs receive", &s, &r));
                local!(
                    'prep,
                    check_count(
                        || format!("gather receive (= send count × {size} ranks)"),
                        s.len_elems().saturating_mul(i64::from(size)),
                        r.len_elems(),
                    )
                );
                if !is_root {
                    None
                } else {
                    Some(local!(
                        'prep,
                        FlatSpec::recv(&mut r)
                            .and_then(|f| f.ready(&*recv, false))
                            .and_then(FlatSpec::counted)
                    ))
                }
            }
            None if is_root => break 'prep Err(missing("gather receive buffer")),
            None => None,
        };
        Ok((local!('prep, SendSide::new(send, s)), rf))
    };
    let (side, rf) = agree(comm, prepared)?;
    let process = comm.process_at_rank(root);
    match (rf, recv) {
        (Some(mut rf), Some(recv)) => {
            process.gather_into_root(&side, &mut rf);
            rf.finish(recv)
        }
        _ => {
            process.gather_into(&side);
            Ok(())
        }
    }
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
pub(super) fn gatherv<C: Communicator + ?Sized>(
    comm: &C,
    send: &dyn Tensor,
    mut recv: Option<(&mut dyn Tensor, &[i64], &[i64])>,
    root: Rank,
) -> Result<()> {
    check_intra(comm)?;
    let is_root = comm.rank() == root;
    let prepared = 'prep: {
        local!('prep, check_rank(root, comm.size()));
        let s = local!('prep, SendSpec::new(send));
        let at_root = match recv.as_mut() {
            Some((recv, counts, displs)) => {
                let mut r = local!('prep, RecvSpec::new(&mut **recv));
                local!('prep, check_pair("gatherv send vs receive", &s, &r));
                let (len, e) = (r.len_elems(), r.element_type());
                let blocks = local!(
                    'prep,
                    own_blocks(comm, "gatherv", (len, &e), counts, displs, true, s.len_elems())
                );
                if !is_root {
                    None
                } else {
                    let rf = local!(
                        'prep,
                        FlatSpec::recv(&mut r)
                            .and_then(|f| f.ready(&**recv, true))
                            .and_then(FlatSpec::counted)
                    );
                    Some((rf, blocks))
                }
            }
            None if is_root => break 'prep Err(missing("gatherv receive buffer")),
            None => None,
        };
        Ok((local!('prep, SendSide::new(send, s)), at_root))
    };
    let (sent, at_root) = agree(comm, prepared)?;
    let process = comm.process_at_rank(root);
    match (at_root, recv) {
        (Some((mut rf, (cu, du))), Some((recv, _, _))) => {
            {
                let mut part = PartitionMut::new(&mut rf, &cu[..], &du[..]);
                process.gather_varcount_into_root(&sent, &mut part);
            }
            rf.finish(recv)
        }
        _ => {
            process.gather_varcount_into(&sent);
            Ok(())
        }
    }
}

/// [`super::TensorComm::scatter_tensor`]. A `send` given at a non-root rank is checked as
/// at the root (and not used).
pub(super) fn scatter<C: Communicator + ?Sized>(
    comm: &C,
    send: Option<&dyn Tensor>,
    recv: &mut dyn Tensor,
    root: Rank,
) -> Result<()> {
    check_intra(comm)?;
    let (size, is_root) = (comm.size(), comm.rank() == root);
    let run = inner_run_elems(&*recv);
    let prepared = 'prep: {
        local!('prep, check_rank(root, size));
        let mut r = local!('prep, RecvSpec::new(&mut *recv));
        let elem = r.element_type().size_bytes();
        let packed = local!('prep, packs_run(r.is_contiguous(), run, elem));
        let sf = match send {
            Some(send) => {
                let s = local!('prep, SendSpec::new(send));
                local!('prep, check_pair("scatter send vs receive", &s, &r));
                local!(
                    'prep,
                    check_count(
                        || format!("scatter send (= receive count × {size} ranks)"),
                        r.len_elems().saturating_mul(i64::from(size)),
                        s.len_elems(),
                    )
                );
                let flat = || FlatSpec::send(send, &s).and_then(FlatSpec::counted);
                if is_root {
                    Some(local!('prep, flat()))
                } else {
                    None
                }
            }
            None if is_root => break 'prep Err(missing("scatter send buffer")),
            None => None,
        };
        Ok((sf, recv_side!('prep, r, packed, recv)))
    };
    let (sf, mut side) = agree(comm, prepared)?;
    let process = comm.process_at_rank(root);
    match &sf {
        Some(sf) => process.scatter_into_root(sf, &mut side),
        None => process.scatter_into(&mut side),
    }
    finish_side!(side, recv)
}

/// [`super::TensorComm::scatterv_tensor`]. A `send` given at a non-root rank is checked as
/// at the root (its `counts[rank]` against this rank's receive; not used).
pub(super) fn scatterv<C: Communicator + ?Sized>(
    comm: &C,
    send: Option<(&dyn Tensor, &[i64], &[i64])>,
    recv: &mut dyn Tensor,
    root: Rank,
) -> Result<()> {
    check_intra(comm)?;
    let is_root = comm.rank() == root;
    let run = inner_run_elems(&*recv);
    let prepared = 'prep: {
        local!('prep, check_rank(root, comm.size()));
        let mut r = local!('prep, RecvSpec::new(&mut *recv));
        let elem = r.element_type().size_bytes();
        let packed = local!('prep, packs_run(r.is_contiguous(), run, elem));
        let at_root = match send {
            Some((send, counts, displs)) => {
                let s = local!('prep, SendSpec::new(send));
                local!('prep, check_pair("scatterv send vs receive", &s, &r));
                let (len, e) = (s.len_elems(), s.element_type());
                let blocks = local!(
                    'prep,
                    own_blocks(comm, "scatterv", (len, &e), counts, displs, false, r.len_elems())
                );
                let flat = || FlatSpec::send(send, &s).and_then(FlatSpec::counted);
                if is_root {
                    Some((local!('prep, flat()), blocks))
                } else {
                    None
                }
            }
            None if is_root => break 'prep Err(missing("scatterv send buffer")),
            None => None,
        };
        Ok((at_root, recv_side!('prep, r, packed, recv)))
    };
    let (at_root, mut side) = agree(comm, prepared)?;
    let process = comm.process_at_rank(root);
    match &at_root {
        Some((sf, (cu, du))) => {
            let part = Partition::new(sf, &cu[..], &du[..]);
            process.scatter_varcount_into_root(&part, &mut side);
        }
        None => process.scatter_varcount_into(&mut side),
    }
    finish_side!(side, recv)
}

/// [`super::TensorComm::all_gather_tensor`].
pub(super) fn all_gather<C: Communicator + ?Sized>(
    comm: &C,
    send: &dyn Tensor,
    recv: &mut dyn Tensor,
) -> Result<()> {
    check_intra(comm)?;
    let prepared = 'prep: {
        let s = local!('prep, SendSpec::new(send));
        let mut r = local!('prep, RecvSpec::new(&mut *recv));
        local!('prep, check_pair("all-gather send vs receive", &s, &r));
        let size = comm.size();
        local!(
            'prep,
            check_count(
                || format!("all-gather receive (= send count × {size} ranks)"),
                s.len_elems().saturating_mul(i64::from(size)),
                r.len_elems(),
            )
        );
        let rf = local!(
            'prep,
            FlatSpec::recv(&mut r)
                .and_then(|f| f.ready(&*recv, false))
                .and_then(FlatSpec::counted)
        );
        Ok((local!('prep, SendSide::new(send, s)), rf))
    };
    let (side, mut rf) = agree(comm, prepared)?;
    comm.all_gather_into(&side, &mut rf);
    rf.finish(recv)
}

/// [`super::TensorComm::all_gatherv_tensor`].
pub(super) fn all_gatherv<C: Communicator + ?Sized>(
    comm: &C,
    send: &dyn Tensor,
    recv: &mut dyn Tensor,
    counts: &[i64],
    displacements: &[i64],
) -> Result<()> {
    check_intra(comm)?;
    let prepared = 'prep: {
        let s = local!('prep, SendSpec::new(send));
        let mut r = local!('prep, RecvSpec::new(&mut *recv));
        local!('prep, check_pair("all-gatherv send vs receive", &s, &r));
        let (len, e, own) = (r.len_elems(), r.element_type(), s.len_elems());
        let blocks = local!(
            'prep,
            own_blocks(comm, "all-gatherv", (len, &e), counts, displacements, true, own)
        );
        let rf = local!(
            'prep,
            FlatSpec::recv(&mut r)
                .and_then(|f| f.ready(&*recv, true))
                .and_then(FlatSpec::counted)
        );
        // The send side is flattened too: Open MPI 4.1's all-gatherv hangs at 3 ranks when
        // one rank sends a derived datatype of 64 Ki elements (found by `dlpack-mpi check
        // --layout step`).
        let sf = local!('prep, FlatSpec::send(send, &s).and_then(FlatSpec::counted));
        Ok((sf, rf, blocks))
    };
    let (sf, mut rf, (cu, du)) = agree(comm, prepared)?;
    {
        let mut part = PartitionMut::new(&mut rf, &cu[..], &du[..]);
        comm.all_gather_varcount_into(&sf, &mut part);
    }
    rf.finish(recv)
}

/// [`super::TensorComm::all_to_all_tensor`].
pub(super) fn all_to_all<C: Communicator + ?Sized>(
    comm: &C,
    send: &dyn Tensor,
    recv: &mut dyn Tensor,
) -> Result<()> {
    check_intra(comm)?;
    let prepared = 'prep: {
        let s = local!('prep, SendSpec::new(send));
        let mut r = local!('prep, RecvSpec::new(&mut *recv));
        local!('prep, check_pair("all-to-all send vs receive", &s, &r));
        let n = s.len_elems();
        local!(
            'prep,
            check_count(|| "all-to-all receive".into(), n, r.len_elems())
        );
        let size = i64::from(comm.size());
        local!(
            'prep,
            check_count(
                || format!("all-to-all send (a multiple of {size} ranks)"),
                n - n % size,
                n,
            )
        );
        let rf = local!(
            'prep,
            FlatSpec::recv(&mut r)
                .and_then(|f| f.ready(&*recv, false))
                .and_then(FlatSpec::counted)
        );
        let sf = local!('prep, FlatSpec::send(send, &s).and_then(FlatSpec::counted));
        Ok((sf, rf))
    };
    let (sf, mut rf) = agree(comm, prepared)?;
    comm.all_to_all_into(&sf, &mut rf);
    rf.finish(recv)
}

#[allow(clippy::too_many_arguments)]
/// [`super::TensorComm::all_to_allv_tensor`].
pub(super) fn all_to_allv<C: Communicator + ?Sized>(
    comm: &C,
    send: &dyn Tensor,
    send_counts: &[i64],
    send_displacements: &[i64],
    recv: &mut dyn Tensor,
    recv_counts: &[i64],
    recv_displacements: &[i64],
) -> Result<()> {
    check_intra(comm)?;
    let prepared = 'prep: {
        let s = local!('prep, SendSpec::new(send));
        let mut r = local!('prep, RecvSpec::new(&mut *recv));
        local!('prep, check_pair("all-to-allv send vs receive", &s, &r));
        let (se, re) = (s.element_type(), r.element_type());
        let sends = local!(
            'prep,
            rank_blocks(comm, s.len_elems(), &se, send_counts, send_displacements, false)
        );
        let recvs = local!(
            'prep,
            rank_blocks(comm, r.len_elems(), &re, recv_counts, recv_displacements, true)
        );
        let rank = rank_index(comm.rank());
        local!(
            'prep,
            check_count(
                || format!("all-to-allv recv_counts[{rank}] (the block this rank sends itself)"),
                send_counts[rank],
                recv_counts[rank],
            )
        );
        let rf = local!(
            'prep,
            FlatSpec::recv(&mut r)
                .and_then(|f| f.ready(&*recv, true))
                .and_then(FlatSpec::counted)
        );
        let sf = local!('prep, FlatSpec::send(send, &s).and_then(FlatSpec::counted));
        Ok((sf, rf, sends, recvs))
    };
    let (sf, mut rf, (scu, sdu), (rcu, rdu)) = agree(comm, prepared)?;
    {
        let sp = Partition::new(&sf, &scu[..], &sdu[..]);
        let mut rp = PartitionMut::new(&mut rf, &rcu[..], &rdu[..]);
        comm.all_to_all_varcount_into(&sp, &mut rp);
    }
    rf.finish(recv)
}
