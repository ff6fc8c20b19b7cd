//! Plans of device lists on `DeviceComm` (issue 32, item 1) on the simulated device: the
//! buckets and their device copies are planned at the build; each step packs the members
//! again on the device (one batch), crosses to the host once and back once (staged) or not
//! at all (direct), and unpacks (one batch): the same copies as the build's, no more.
//! Values change between steps and are checked element by element, gaps untouched; a
//! planned device reduce-scatter is refused on every rank.

use super::fused::{crossings, logical, member, on_device, val, SHAPES};
use super::*;

/// Writes rank `r`'s step-`k` values into the list's members (simulated device memory is
/// host memory; `SHAPES` gives each member's length and step).
fn fill(list: &mut [ManagedTensor<'_>], r: i32, k: usize) {
    for (m, (t, &(n, strided))) in list.iter_mut().zip(SHAPES).enumerate() {
        let step = if strided { 2 } else { 1 };
        let first = t.first_element_ptr().cast::<f32>();
        for i in 0..n {
            // SAFETY: element i of a member made by `member` (host memory labelled as a
            // device by the simulated runtime), no step in flight.
            unsafe { first.add(step * i).write(val(r, m + k, i)) };
        }
    }
}

/// The plan of [`SHAPES`] on `dc` (staged or direct), four steps, blocking and
/// nonblocking; every step's copies are `per_step` ((crossings), (device batches)).
fn steps(
    w: &SimpleCommunicator,
    rt: &SimulatedRuntime,
    dc: &DeviceComm<'_, SimpleCommunicator>,
    per_step: ((usize, usize, usize, usize), (usize, usize)),
) -> Outcome {
    let (me, p) = (w.rank(), w.size());
    let mut ms: Vec<Owned<f32>> = SHAPES
        .iter()
        .enumerate()
        .map(|(m, &(n, st))| member(CUDA0, m, n, st, me))
        .collect::<Result<_, _>>()?;
    {
        let mut ts: Vec<ManagedTensor<'_>> =
            ms.iter().map(|o| take(o, rt)).collect::<Result<_, _>>()?;
        let mut plan = call!(dc.plan_all_reduce_tensors_in_place(&mut ts, ReduceOp::Sum));
        ensure!(
            plan.checks().is_none(),
            "a device bucket carries no identity"
        );
        for k in 0..4 {
            fill(plan.tensors_mut(), me, k);
            rt.clear_calls();
            if k % 2 == 0 {
                call!(plan.run());
            } else {
                call!(mpi::request::scope(|scope| plan
                    .start(scope)
                    .and_then(|q| q.wait())));
            }
            ensure_eq!((crossings(rt), on_device(rt)), per_step);
            for (m, (t, &(n, st))) in plan.tensors().iter().zip(SHAPES).enumerate() {
                let step = if st { 2 } else { 1 };
                let first = t.first_element_ptr().cast::<f32>();
                for i in 0..n {
                    // SAFETY: as in `fill`.
                    let got = unsafe { first.add(step * i).read() };
                    let want: f32 = (0..p).map(|r| val(r, m + k, i)).sum();
                    ensure!(
                        got == want,
                        "step {k} member {m} element {i}: {got} vs {want}"
                    );
                }
            }
        }
    }
    for (m, (o, &(n, st))) in ms.iter_mut().zip(SHAPES).enumerate() {
        let want: Vec<f32> = (0..n)
            .map(|i| (0..p).map(|r| val(r, m + 3, i)).sum())
            .collect();
        ensure_eq!(logical(o, n, st)?, want);
    }
    Ok(())
}

/// Staged: each step packs (one batch), crosses 92 bytes each way once, and unpacks.
fn planned_staged(w: &SimpleCommunicator) -> Outcome {
    let rt = SimulatedRuntime::new();
    let dc = staged(w, &rt);
    steps(w, &rt, &dc, ((1, 92, 1, 92), (2, 184)))
}

/// Direct (a CUDA-aware MPI): MPI reduces the device bucket; nothing crosses.
fn planned_direct(w: &SimpleCommunicator) -> Outcome {
    let rt = SimulatedRuntime::new();
    std::env::set_var("DLPACK_MPI_CUDA_AWARE", "1");
    let dc = DeviceComm::new(w, Some(&rt as &dyn DeviceRuntime), Transport::Auto);
    std::env::remove_var("DLPACK_MPI_CUDA_AWARE");
    let dc = call!(dc);
    steps(w, &rt, &dc, ((0, 0, 0, 0), (2, 184)))
}

/// A planned reduce-scatter of a device list is refused on every rank (`UnsupportedDevice`
/// where the list is on the device, which is every rank here).
fn planned_reduce_scatter_refused(w: &SimpleCommunicator) -> Outcome {
    let (me, p) = (w.rank(), w.size() as usize);
    let rt = SimulatedRuntime::new();
    let dc = staged(w, &rt);
    let s = member(CUDA0, 0, 4 * p, false, me)?;
    let r = member(CUDA0, 1, 4, false, me)?;
    let (mut ts, mut tr) = (vec![take(&s, &rt)?], vec![take(&r, &rt)?]);
    match dc
        .plan_reduce_scatter_block_tensors(&mut ts, &mut tr, ReduceOp::Sum)
        .map(drop)
    {
        Err(Error::UnsupportedDevice { reason, .. }) => {
            ensure!(reason.contains("reduce-scatter"), "{reason}");
            Ok(())
        }
        other => Err(format!("rank {me}: {other:?}")),
    }
}

/// A list on the host on rank 0 and on the device elsewhere: the plan's buckets would
/// differ in size (host buckets carry the identity), so the build is a
/// `CollectiveMismatch` naming the device memory on every rank, not an MPI error.
fn planned_mixed_memory_is_refused(w: &SimpleCommunicator) -> Outcome {
    let (me, p) = (w.rank(), w.size());
    if p < 2 {
        return Ok(());
    }
    let rt = SimulatedRuntime::new();
    let dc = staged(w, &rt);
    let o = if me == 0 {
        Owned::new(vec![1.0f32; 7])
    } else {
        member(CUDA0, 0, 7, false, me)?
    };
    let mut ts = vec![take(&o, &rt)?];
    match dc
        .plan_all_reduce_tensors_in_place(&mut ts, ReduceOp::Sum)
        .map(drop)
    {
        Err(Error::CollectiveMismatch {
            difference,
            arguments,
            other_arguments,
            ..
        }) => {
            let words = format!("{difference} {arguments} {other_arguments}");
            ensure!(words.contains("in device memory"), "{words}");
            Ok(())
        }
        other => Err(format!("rank {me}: {other:?}")),
    }
}

pub(super) const CASES: &[(&str, Case)] = &[
    (
        "planned_mixed_memory_is_refused",
        planned_mixed_memory_is_refused,
    ),
    ("planned_staged", planned_staged),
    ("planned_direct", planned_direct),
    (
        "planned_reduce_scatter_refused",
        planned_reduce_scatter_refused,
    ),
];
