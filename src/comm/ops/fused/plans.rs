//! The plans of the fused collectives (issue 32): the same members, buckets and calls as
//! [`super::all_reduce_tensors`] and [`super::broadcast_tensors`], built once into a batch
//! whose first packed bucket carries the plan's identity ([`super::mark`]), and run step
//! after step by [`crate::comm::Plan`] ([`crate::comm::engine::plan`]).

use mpi::topology::{Communicator, Rank};

use super::{check_devices, signature, Fused};
use crate::comm::engine::call::Batch;
use crate::comm::engine::checks::{check_intra, check_rank, missing};
use crate::comm::engine::plan::{build, Plan};
use crate::comm::engine::stager::Endpoint;
use crate::dlpack::{Tensor, TensorListMut};
use crate::dtype::ReduceOp;
use crate::error::{Error, Result};
use crate::mpi_library::ensure_matching;

/// Refuses a list in device memory on a communicator with a stager: a plan's steps would
/// stage it again each time (planned device staging is not built yet).
fn host_only(tensors: &[&dyn Tensor], staged: bool) -> Result<()> {
    if check_devices(tensors.iter().copied(), staged)? {
        let d = tensors[0].device();
        return Err(Error::UnsupportedDevice {
            device_type: d.device_type,
            device_id: d.device_id,
            reason: "plans take host memory only for now (device lists: the unplanned fused \
                     collectives, which stage them)",
        });
    }
    Ok(())
}

/// The batch of a prepared fused operation.
fn batch(op: crate::comm::engine::call::Operation<'_>) -> Result<Box<dyn Batch>> {
    op.into_batch().ok_or_else(|| missing("a fused batch"))
}

/// `plan_all_reduce_tensors_in_place`: the plan of
/// [`super::all_reduce_tensors`] in place over `list`.
pub(in crate::comm) fn plan_all_reduce_tensors_in_place<'a, E, L>(
    tc: &'a E,
    list: &'a mut L,
    op: ReduceOp,
) -> Result<Plan<'a, L>>
where
    E: Endpoint + ?Sized,
    L: TensorListMut + ?Sized,
{
    let comm = tc.communicator();
    check_intra(comm)?;
    let size = comm.size();
    let staged = tc.stager().is_some();
    let sigs = {
        let members = super::written(list);
        let of = |name| signature(name, members.iter().copied()).reduce(op);
        (
            of("plan_all_reduce_tensors_in_place"),
            of("a step of plan_all_reduce_tensors_in_place"),
        )
    };
    build(tc, list, sigs, |members| {
        ensure_matching()?;
        host_only(members, staged)?;
        batch(Fused::all_reduce(None, members, op, None, Some(size))?)
    })
}

/// `plan_broadcast_tensors`: the plan of [`super::broadcast_tensors`] over `list` from
/// `root`.
pub(in crate::comm) fn plan_broadcast_tensors<'a, E, L>(
    tc: &'a E,
    list: &'a mut L,
    root: Rank,
) -> Result<Plan<'a, L>>
where
    E: Endpoint + ?Sized,
    L: TensorListMut + ?Sized,
{
    let comm = tc.communicator();
    check_intra(comm)?;
    let (size, is_root) = (comm.size(), comm.rank() == root);
    let staged = tc.stager().is_some();
    let sigs = {
        let members = super::written(list);
        let of = |name| signature(name, members.iter().copied()).root(root);
        (
            of("plan_broadcast_tensors"),
            of("a step of plan_broadcast_tensors"),
        )
    };
    build(tc, list, sigs, |members| {
        ensure_matching()?;
        check_rank(root, size)?;
        host_only(members, staged)?;
        batch(Fused::broadcast(members, root, is_root, None, Some(size))?)
    })
}
