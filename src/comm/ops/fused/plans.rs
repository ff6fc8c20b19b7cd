//! The plans of the fused collectives (issue 32): the same members, buckets and calls as
//! [`super::all_reduce_tensors`], [`super::broadcast_tensors`] and
//! [`super::reduce_scatter_block_tensors`], built once into a batch whose first packed
//! bucket carries the plan's identity where it can ([`super::mark`]), and run step after
//! step by [`crate::comm::Plan`] ([`crate::comm::engine::plan`]). A plan of one tensor is
//! the plan of a list of one.

use mpi::topology::{Communicator, Rank};

use super::{check_devices, signature, Fused};
use crate::comm::engine::call::{Batch, Operation};
use crate::comm::engine::checks::{check_intra, check_rank, missing};
use crate::comm::engine::plan::{build, settings_words, Plan};
use crate::comm::engine::signature::Signature;
use crate::comm::engine::stager::Endpoint;
use crate::dlpack::{Tensor, TensorListMut};
use crate::dtype::ReduceOp;
use crate::error::{Error, Result};
use crate::mpi_library::ensure_matching;

/// Whether `send`'s and `recv`'s members are in device memory a stager places (then the
/// plan's buckets are device buckets, packed again on the device before each step), after
/// refusing mixed devices as the unplanned collectives do.
fn on_device(recv: &[&dyn Tensor], send: Option<&[&dyn Tensor]>, staged: bool) -> Result<bool> {
    let on = check_devices(recv.iter().copied(), staged)?;
    if let Some(s) = send {
        if check_devices(s.iter().copied(), staged)? != on {
            let (a, b) = (s.first(), recv.first());
            return Err(Error::MixedDevices {
                index: 0,
                device: a.map_or_else(String::new, |t| format!("{} (the send list's)", t.device())),
                first: b.map_or_else(String::new, |t| {
                    format!("{} (the receive list's)", t.device())
                }),
            });
        }
    }
    Ok(on)
}

/// The batch of a prepared fused operation.
fn batch(op: Operation<'_>) -> Result<Box<dyn Batch>> {
    op.into_batch().ok_or_else(|| missing("a fused batch"))
}

/// The build's and each step's signatures of the plan `names` over `written` (the members
/// the unplanned collective's signature lists), `with` adding the operation's arguments;
/// with `staged`, whether the list is a device list the stager packs (its buckets carry no
/// identity, so a plan of device memory on one rank against host memory on another would
/// send messages of different sizes: the build names it instead, `in device memory`).
fn signatures<L: TensorListMut + ?Sized>(
    (name, step): (&'static str, &'static str),
    (written, staged): (&mut L, bool),
    with: impl Fn(Signature<'static>) -> Signature<'static>,
) -> (Signature<'static>, Signature<'static>) {
    let members = super::written(written);
    let device = check_devices(members.iter().copied(), staged).unwrap_or(false);
    let words = settings_words();
    let of = |n| {
        with(signature(n, members.iter().copied()))
            .device_buckets(device)
            .plan_settings(words)
    };
    (of(name), of(step))
}

/// `plan_all_reduce_tensors_in_place` (`send` `None`) and `plan_all_reduce_tensors`: the
/// plan of [`super::all_reduce_tensors`] over `recv` (from `send`).
pub(in crate::comm) fn plan_all_reduce<'a, E, L, S>(
    tc: &'a E,
    send: Option<&'a mut S>,
    recv: &'a mut L,
    op: ReduceOp,
) -> Result<Plan<'a, L, S>>
where
    E: Endpoint + ?Sized,
    L: TensorListMut + ?Sized,
    S: TensorListMut + ?Sized,
{
    let comm = tc.communicator();
    check_intra(comm)?;
    let size = comm.size();
    let staged = tc.stager().is_some();
    let names = if send.is_some() {
        (
            "plan_all_reduce_tensors",
            "a step of plan_all_reduce_tensors",
        )
    } else {
        (
            "plan_all_reduce_tensors_in_place",
            "a step of plan_all_reduce_tensors_in_place",
        )
    };
    let sigs = signatures(names, (recv, staged), |s| s.reduce(op));
    build(tc, (recv, send), sigs, |recv, send| {
        ensure_matching()?;
        let on = on_device(recv, send, staged)?;
        let stager = tc.stager().filter(|_| on);
        batch(Fused::all_reduce(send, recv, op, stager, Some(size))?)
    })
}

/// `plan_broadcast_tensors`: the plan of [`super::broadcast_tensors`] over `list` from
/// `root`.
pub(in crate::comm) fn plan_broadcast<'a, E, L>(
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
    let names = ("plan_broadcast_tensors", "a step of plan_broadcast_tensors");
    let sigs = signatures(names, (list, staged), |s| s.root(root));
    build(tc, (list, None), sigs, |members, _| {
        ensure_matching()?;
        check_rank(root, size)?;
        let on = on_device(members, None, staged)?;
        let stager = tc.stager().filter(|_| on);
        batch(Fused::broadcast(
            members,
            root,
            is_root,
            stager,
            Some(size),
        )?)
    })
}

/// `plan_reduce_scatter_block_tensors`: the plan of
/// [`super::reduce_scatter_block_tensors`] from `send` into `recv`.
pub(in crate::comm) fn plan_reduce_scatter_block<'a, E, L, S>(
    tc: &'a E,
    send: &'a mut S,
    recv: &'a mut L,
    op: ReduceOp,
) -> Result<Plan<'a, L, S>>
where
    E: Endpoint + ?Sized,
    L: TensorListMut + ?Sized,
    S: TensorListMut + ?Sized,
{
    let comm = tc.communicator();
    check_intra(comm)?;
    let size = comm.size();
    let staged = tc.stager().is_some();
    let names = (
        "plan_reduce_scatter_block_tensors",
        "a step of plan_reduce_scatter_block_tensors",
    );
    let sigs = signatures(names, (recv, staged), |s| s.reduce(op));
    build(tc, (recv, Some(send)), sigs, |recv, send| {
        ensure_matching()?;
        let send = send.ok_or_else(|| missing("reduce-scatter send list"))?;
        if on_device(recv, Some(send), staged)? {
            let d = recv[0].device();
            return Err(Error::UnsupportedDevice {
                device_type: d.device_type,
                device_id: d.device_id,
                reason: "a planned reduce-scatter takes host memory only for now (a device \
                         list: the unplanned reduce_scatter_block_tensors)",
            });
        }
        batch(Fused::reduce_scatter(
            send,
            recv,
            op,
            size,
            None,
            Some(size),
        )?)
    })
}
