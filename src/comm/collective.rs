//! The collectives of [`super::TensorComm`] that move data without reducing it: broadcast,
//! gather, scatter, all-gather and all-to-all, with their v-variants.
//!
//! Receive buffers of gathers and all-to-alls, and send buffers of scatters, are handed to
//! MPI as [`FlatSpec`]s: per-rank blocks need a buffer that splits into equal units of the
//! predefined type, so a strided side travels as a packed copy.

use mpi::datatype::{AsDatatype, Collection, Partition, PartitionMut, Pointer};
use mpi::raw::AsRaw;
use mpi::topology::{Communicator, Rank};
use mpi::traits::*;

use super::bcast::BroadcastBuffer;
use super::checks::{
    check_count, check_intra, check_pair, check_rank, missing, rank_blocks, rank_index,
};
use super::packing::{inner_run_elems, packs_run};
use super::sides::{RecvSide, SendSide};
use crate::dlpack::Tensor;
use crate::error::Result;
use crate::raw;
use crate::spec::flat::FlatSpec;
use crate::spec::{RecvSpec, SendSpec};

/// The receive side `$r` (a `RecvSpec` of `$recv`) as the policy wants it (`$packed`): the
/// spec, or a scratch (not preserved: the operation writes every element).
macro_rules! recv_side {
    ($r:ident, $packed:expr, $recv:expr) => {
        if $packed {
            RecvSide::Packed(FlatSpec::recv(&mut $r)?.ready(&*$recv, false)?.counted()?)
        } else {
            RecvSide::Spec($r)
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
    check_rank(root, comm.size())?;
    let process = comm.process_at_rank(root);
    if comm.rank() == root {
        let tensor = buffer.sent();
        let side = SendSide::new(tensor, SendSpec::new(tensor)?)?;
        let (ptr, count, datatype) = (
            side.pointer() as *mut std::ffi::c_void,
            side.count(),
            side.as_datatype().as_raw(),
        );
        // SAFETY: MPI_Bcast only reads the buffer at the root (MPI-4.1 §6.4); it holds
        // `count` readable units of `datatype` (the tensor, or its packed copy).
        unsafe { raw::bcast(ptr, count, datatype, root, comm.as_raw()) };
    } else {
        let tensor = buffer.received(comm.rank(), root)?;
        let run = inner_run_elems(&*tensor);
        let mut spec = RecvSpec::new(&mut *tensor)?;
        if packs_run(spec.is_contiguous(), run, spec.element_type().size_bytes())? {
            let recv_flat = FlatSpec::recv(&mut spec)?;
            let mut flat = recv_flat.ready(&*tensor, false)?.counted()?;
            process.broadcast_into(&mut flat);
            flat.finish(tensor)?;
        } else {
            process.broadcast_into(&mut spec);
        }
    }
    Ok(())
}

/// [`super::TensorComm::gather_tensor`].
pub(super) fn gather<C: Communicator + ?Sized>(
    comm: &C,
    send: &dyn Tensor,
    recv: Option<&mut dyn Tensor>,
    root: Rank,
) -> Result<()> {
    check_intra(comm)?;
    check_rank(root, comm.size())?;
    let s = SendSpec::new(send)?;
    let process = comm.process_at_rank(root);
    if comm.rank() == root {
        let recv = recv.ok_or_else(|| missing("gather receive buffer"))?;
        let mut r = RecvSpec::new(&mut *recv)?;
        check_pair("gather send vs receive", &s, &r)?;
        let size = comm.size();
        check_count(
            || format!("gather receive (= send count × {size} ranks)"),
            s.len_elems() * i64::from(size),
            r.len_elems(),
        )?;
        let recv_flat = FlatSpec::recv(&mut r)?;
        let mut rf = recv_flat.ready(&*recv, false)?.counted()?;
        process.gather_into_root(&SendSide::new(send, s)?, &mut rf);
        rf.finish(recv)
    } else {
        process.gather_into(&SendSide::new(send, s)?);
        Ok(())
    }
}

/// [`super::TensorComm::gatherv_tensor`].
pub(super) fn gatherv<C: Communicator + ?Sized>(
    comm: &C,
    send: &dyn Tensor,
    recv: Option<(&mut dyn Tensor, &[i64], &[i64])>,
    root: Rank,
) -> Result<()> {
    check_intra(comm)?;
    check_rank(root, comm.size())?;
    let s = SendSpec::new(send)?;
    let process = comm.process_at_rank(root);
    if comm.rank() == root {
        let (recv, counts, displs) = recv.ok_or_else(|| missing("gatherv receive buffer"))?;
        let mut r = RecvSpec::new(&mut *recv)?;
        check_pair("gatherv send vs receive", &s, &r)?;
        let (cu, du) = rank_blocks(comm, r.len_elems(), &r.element_type(), counts, displs, true)?;
        check_count(
            || format!("gatherv counts[{root}] (the root's own send)"),
            counts[rank_index(root)],
            s.len_elems(),
        )?;
        let recv_flat = FlatSpec::recv(&mut r)?;
        let mut rf = recv_flat.ready(&*recv, true)?.counted()?;
        let sent = SendSide::new(send, s)?;
        {
            let mut part = PartitionMut::new(&mut rf, &cu[..], &du[..]);
            process.gather_varcount_into_root(&sent, &mut part);
        }
        rf.finish(recv)
    } else {
        process.gather_varcount_into(&SendSide::new(send, s)?);
        Ok(())
    }
}

/// [`super::TensorComm::scatter_tensor`].
pub(super) fn scatter<C: Communicator + ?Sized>(
    comm: &C,
    send: Option<&dyn Tensor>,
    recv: &mut dyn Tensor,
    root: Rank,
) -> Result<()> {
    check_intra(comm)?;
    check_rank(root, comm.size())?;
    let run = inner_run_elems(&*recv);
    let mut r = RecvSpec::new(&mut *recv)?;
    let packed = packs_run(r.is_contiguous(), run, r.element_type().size_bytes())?;
    let process = comm.process_at_rank(root);
    let side = if comm.rank() == root {
        let send = send.ok_or_else(|| missing("scatter send buffer"))?;
        let s = SendSpec::new(send)?;
        check_pair("scatter send vs receive", &s, &r)?;
        let size = comm.size();
        check_count(
            || format!("scatter send (= receive count × {size} ranks)"),
            r.len_elems() * i64::from(size),
            s.len_elems(),
        )?;
        let sf = FlatSpec::send(send, &s)?.counted()?;
        let mut side = recv_side!(r, packed, recv);
        process.scatter_into_root(&sf, &mut side);
        side
    } else {
        let mut side = recv_side!(r, packed, recv);
        process.scatter_into(&mut side);
        side
    };
    match side {
        RecvSide::Packed(f) => f.finish(recv),
        RecvSide::Spec(_) => Ok(()),
    }
}

/// [`super::TensorComm::scatterv_tensor`].
pub(super) fn scatterv<C: Communicator + ?Sized>(
    comm: &C,
    send: Option<(&dyn Tensor, &[i64], &[i64])>,
    recv: &mut dyn Tensor,
    root: Rank,
) -> Result<()> {
    check_intra(comm)?;
    check_rank(root, comm.size())?;
    let run = inner_run_elems(&*recv);
    let mut r = RecvSpec::new(&mut *recv)?;
    let packed = packs_run(r.is_contiguous(), run, r.element_type().size_bytes())?;
    let process = comm.process_at_rank(root);
    let side = if comm.rank() == root {
        let (send, counts, displs) = send.ok_or_else(|| missing("scatterv send buffer"))?;
        let s = SendSpec::new(send)?;
        check_pair("scatterv send vs receive", &s, &r)?;
        let (cu, du) = rank_blocks(
            comm,
            s.len_elems(),
            &s.element_type(),
            counts,
            displs,
            false,
        )?;
        check_count(
            || format!("scatterv counts[{root}] (the root's own receive)"),
            counts[rank_index(root)],
            r.len_elems(),
        )?;
        let sf = FlatSpec::send(send, &s)?.counted()?;
        let mut side = recv_side!(r, packed, recv);
        let part = Partition::new(&sf, &cu[..], &du[..]);
        process.scatter_varcount_into_root(&part, &mut side);
        side
    } else {
        let mut side = recv_side!(r, packed, recv);
        process.scatter_varcount_into(&mut side);
        side
    };
    match side {
        RecvSide::Packed(f) => f.finish(recv),
        RecvSide::Spec(_) => Ok(()),
    }
}

/// [`super::TensorComm::all_gather_tensor`].
pub(super) fn all_gather<C: Communicator + ?Sized>(
    comm: &C,
    send: &dyn Tensor,
    recv: &mut dyn Tensor,
) -> Result<()> {
    check_intra(comm)?;
    let s = SendSpec::new(send)?;
    let mut r = RecvSpec::new(&mut *recv)?;
    check_pair("all-gather send vs receive", &s, &r)?;
    let size = comm.size();
    check_count(
        || format!("all-gather receive (= send count × {size} ranks)"),
        s.len_elems() * i64::from(size),
        r.len_elems(),
    )?;
    let recv_flat = FlatSpec::recv(&mut r)?;
    let mut rf = recv_flat.ready(&*recv, false)?.counted()?;
    comm.all_gather_into(&SendSide::new(send, s)?, &mut rf);
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
    let s = SendSpec::new(send)?;
    let mut r = RecvSpec::new(&mut *recv)?;
    check_pair("all-gatherv send vs receive", &s, &r)?;
    let (cu, du) = rank_blocks(
        comm,
        r.len_elems(),
        &r.element_type(),
        counts,
        displacements,
        true,
    )?;
    let rank = comm.rank();
    check_count(
        || format!("all-gatherv counts[{rank}] (this rank's send)"),
        counts[rank_index(rank)],
        s.len_elems(),
    )?;
    let recv_flat = FlatSpec::recv(&mut r)?;
    let mut rf = recv_flat.ready(&*recv, true)?.counted()?;
    // The send side is flattened too: Open MPI 4.1's all-gatherv hangs at 3 ranks when
    // one rank sends a derived datatype of 64 Ki elements (found by `dlpack-mpi check
    // --layout step`).
    let sf = FlatSpec::send(send, &s)?.counted()?;
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
    let s = SendSpec::new(send)?;
    let mut r = RecvSpec::new(&mut *recv)?;
    check_pair("all-to-all send vs receive", &s, &r)?;
    check_count(|| "all-to-all receive".into(), s.len_elems(), r.len_elems())?;
    let size = i64::from(comm.size());
    let n = s.len_elems();
    check_count(
        || format!("all-to-all send (a multiple of {size} ranks)"),
        n - n % size,
        n,
    )?;
    let recv_flat = FlatSpec::recv(&mut r)?;
    let sf = FlatSpec::send(send, &s)?.counted()?;
    let mut rf = recv_flat.ready(&*recv, false)?.counted()?;
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
    let s = SendSpec::new(send)?;
    let mut r = RecvSpec::new(&mut *recv)?;
    check_pair("all-to-allv send vs receive", &s, &r)?;
    let (scu, sdu) = rank_blocks(
        comm,
        s.len_elems(),
        &s.element_type(),
        send_counts,
        send_displacements,
        false,
    )?;
    let (rcu, rdu) = rank_blocks(
        comm,
        r.len_elems(),
        &r.element_type(),
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
    let recv_flat = FlatSpec::recv(&mut r)?;
    let sf = FlatSpec::send(send, &s)?.counted()?;
    let mut rf = recv_flat.ready(&*recv, true)?.counted()?;
    {
        let sp = Partition::new(&sf, &scu[..], &sdu[..]);
        let mut rp = PartitionMut::new(&mut rf, &rcu[..], &rdu[..]);
        comm.all_to_all_varcount_into(&sp, &mut rp);
    }
    rf.finish(recv)
}
