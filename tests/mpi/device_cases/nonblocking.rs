//! Nonblocking operations on `DeviceComm` (issue 22, item 2) on the simulated device: the
//! request owns the pinned copies of the staged route and copies a receive back to the
//! device at completion. Byte counts of every device ↔ host copy are exact; values are
//! checked element by element.

use super::*;
use dlpack_mpi::comm::{wait_all, Blocks};

/// Bytes copied device → host and host → device.
fn bytes(rt: &SimulatedRuntime) -> (usize, usize) {
    rt.calls().iter().fold((0, 0), |(h, d), c| match c {
        RuntimeCall::CopyToHost { bytes, .. } => (h + bytes, d),
        RuntimeCall::CopyToDevice { bytes, .. } => (h, d + bytes),
        _ => (h, d),
    })
}

fn vals(r: i32, n: usize) -> Vec<f32> {
    (0..n).map(|i| (100 * r) as f32 + i as f32).collect()
}

fn sums(p: i32, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (0..p).map(|r| (100 * r) as f32 + i as f32).sum())
        .collect()
}

/// Staged point-to-point, nonblocking both ways: the sender copies its 5 f32 (20 bytes) to
/// the host once at the post, the receiver copies 20 bytes back to the device at `wait`,
/// and nothing else.
fn staged_point_to_point(w: &SimpleCommunicator) -> Outcome {
    if w.size() < 2 || w.rank() > 1 {
        return Ok(());
    }
    let rt = SimulatedRuntime::new();
    let dc = staged(w, &rt);
    let other = 1 - w.rank();
    let send = on(CUDA0, vals(w.rank(), 5));
    let mut recv = on(CUDA0, vec![-1.0; 5]);
    {
        let s = take(&send, &rt)?;
        let mut r = take(&recv, &rt)?;
        rt.clear_calls();
        let done: Result<(usize, usize), Error> = mpi::request::scope(|scope| {
            let rr = dc.immediate_recv_tensor(scope, &mut r, other, 22)?;
            let sr = dc.immediate_send_tensor(scope, &s, other, 22)?;
            let at_post = bytes(&rt);
            sr.wait()?;
            rr.wait().map(|_| at_post)
        });
        ensure_eq!(call!(done), (20, 0));
        ensure_eq!(bytes(&rt), (20, 20));
        ensure_eq!(dc.last_route(), Some(Route::Staged));
    }
    ensure_eq!(recv.as_slice(), &vals(other, 5)[..]);
    Ok(())
}

/// A staged nonblocking all-reduce of 6 f32: 24 bytes to the host at the post, 24 back to
/// the device at `wait`; the result is exact.
fn staged_all_reduce(w: &SimpleCommunicator) -> Outcome {
    let rt = SimulatedRuntime::new();
    let dc = staged(w, &rt);
    let send = on(CUDA0, vals(w.rank(), 6));
    let mut recv = on(CUDA0, vec![-1.0; 6]);
    {
        let s = take(&send, &rt)?;
        let mut r = take(&recv, &rt)?;
        rt.clear_calls();
        let done: Result<(usize, usize), Error> = mpi::request::scope(|scope| {
            let req = dc.immediate_all_reduce_tensor(scope, &s, &mut r, ReduceOp::Sum)?;
            let at_post = bytes(&rt);
            req.wait().map(|_| at_post)
        });
        ensure_eq!(call!(done), (24, 0));
        ensure_eq!(bytes(&rt), (24, 24));
    }
    ensure_eq!(recv.as_slice(), &sums(w.size(), 6)[..]);
    Ok(())
}

/// A strided (step-2) CUDA receiver of a staged nonblocking all-reduce and a staged
/// broadcast into a CUDA tensor, completed together by `wait_all` and in the same request
/// list as a host all-gatherv: logical row-major values land, the gaps keep theirs.
fn staged_strided_and_mixed(w: &SimpleCommunicator) -> Outcome {
    let (me, p) = (w.rank(), w.size());
    let rt = SimulatedRuntime::new();
    let dc = staged(w, &rt);
    let send = on(CUDA0, vals(me, 4));
    let mut recv = Owned::new(vec![-7.0f32; 8])
        .labelled(CUDA0)
        .with_layout(&[4], Some(&[2]), 0)
        .map_err(|e| e.to_string())?;
    let mut bc = on(CUDA0, if me == 0 { vals(9, 3) } else { vec![0.0; 3] });
    let hs = Owned::new(vals(me, 1 + me as usize));
    let total: usize = (0..p).map(|r| 1 + r as usize).sum();
    let mut hr = Owned::new(vec![0.0f32; total]);
    let counts: Vec<i64> = (0..p).map(|r| 1 + i64::from(r)).collect();
    let displs: Vec<i64> = (0..p)
        .map(|r| (0..r).map(|x| 1 + i64::from(x)).sum())
        .collect();
    {
        let s = take(&send, &rt)?;
        let mut r = take(&recv, &rt)?;
        let mut b = take(&bc, &rt)?;
        let hst = take(&hs, &rt)?;
        let mut hrt = take(&hr, &rt)?;
        let done: Result<(), Error> = mpi::request::scope(|scope| {
            let reqs = vec![
                dc.immediate_all_reduce_tensor(scope, &s, &mut r, ReduceOp::Sum)?,
                dc.immediate_broadcast_tensor(scope, &mut b, 0)?,
                w.immediate_all_gatherv_tensor(
                    scope,
                    &hst,
                    &mut hrt,
                    Blocks::new(&counts, &displs),
                )?,
            ];
            wait_all(reqs).into_iter().try_for_each(|r| r.map(drop))
        });
        call!(done);
    }
    let all = recv.as_slice().to_vec();
    ensure_eq!(
        all.iter().step_by(2).copied().collect::<Vec<_>>(),
        sums(p, 4)
    );
    ensure!(
        all.iter().skip(1).step_by(2).all(|&g| g == -7.0),
        "a gap was written: {all:?}"
    );
    ensure_eq!(bc.as_slice(), &vals(9, 3)[..]);
    let want: Vec<f32> = (0..p).flat_map(|r| vals(r, 1 + r as usize)).collect();
    ensure_eq!(hr.as_slice(), &want[..]);
    Ok(())
}

/// The last rank's CUDA receive tensor is `READ_ONLY`: its post returns `ReadOnly` (nothing
/// copied to its device), every other rank's `wait` returns `PeerRefused`, and no receiver
/// changed.
fn staged_refusal(w: &SimpleCommunicator) -> Outcome {
    let (me, p) = (w.rank(), w.size());
    if p < 2 {
        return Ok(());
    }
    let rt = SimulatedRuntime::new();
    let dc = staged(w, &rt);
    let send = on(CUDA0, vals(me, 3));
    let mut recv = if me == p - 1 {
        on(CUDA0, vec![-1.0; 3]).read_only()
    } else {
        on(CUDA0, vec![-1.0; 3])
    };
    let got = {
        let s = take(&send, &rt)?;
        let mut r = take(&recv, &rt)?;
        rt.clear_calls();
        let got: Result<Result<(), Error>, Error> = mpi::request::scope(|scope| {
            let req = dc.immediate_all_reduce_tensor(scope, &s, &mut r, ReduceOp::Sum)?;
            Ok(req.wait().map(drop))
        });
        got
    };
    if me == p - 1 {
        ensure!(
            matches!(got, Err(Error::ReadOnly)),
            "expected ReadOnly from the post, got {got:?}"
        );
    } else {
        match got {
            Ok(Err(Error::PeerRefused { rank, .. })) if rank == p - 1 => {}
            other => return Err(format!("expected PeerRefused from wait, got {other:?}")),
        }
    }
    ensure_eq!(bytes(&rt).1, 0);
    ensure_eq!(recv.as_slice(), &[-1.0; 3][..]);
    Ok(())
}

/// A staged request dropped before completion still copies its receive back to the device.
fn dropped_staged_request_copies_back(w: &SimpleCommunicator) -> Outcome {
    let rt = SimulatedRuntime::new();
    let dc = staged(w, &rt);
    let mut data = on(CUDA0, vals(w.rank(), 4));
    {
        let mut t = take(&data, &rt)?;
        rt.clear_calls();
        let done: Result<(), Error> = mpi::request::scope(|scope| {
            let req = dc.immediate_all_reduce_tensor_in_place(scope, &mut t, ReduceOp::Sum)?;
            drop(req);
            Ok(())
        });
        call!(done);
        ensure_eq!(bytes(&rt), (16, 16));
    }
    ensure_eq!(data.as_slice(), &sums(w.size(), 4)[..]);
    Ok(())
}

/// On the direct route (MPI declared CUDA-aware) a nonblocking all-reduce of contiguous
/// CUDA tensors posts their device pointers: nothing is copied.
fn direct_all_reduce_copies_nothing(w: &SimpleCommunicator) -> Outcome {
    let rt = SimulatedRuntime::new();
    std::env::set_var("DLPACK_MPI_CUDA_AWARE", "1");
    let dc = DeviceComm::new(w, Some(&rt as &dyn DeviceRuntime), Transport::Direct);
    std::env::remove_var("DLPACK_MPI_CUDA_AWARE");
    let dc = call!(dc);
    let send = on(CUDA0, vals(w.rank(), 5));
    let mut recv = on(CUDA0, vec![0.0; 5]);
    {
        let s = take(&send, &rt)?;
        let mut r = take(&recv, &rt)?;
        rt.clear_calls();
        let done: Result<(), Error> = mpi::request::scope(|scope| {
            dc.immediate_all_reduce_tensor(scope, &s, &mut r, ReduceOp::Max)?
                .wait()
                .map(drop)
        });
        call!(done);
        ensure_eq!(bytes(&rt), (0, 0));
        ensure_eq!(dc.last_route(), Some(Route::Direct));
    }
    ensure_eq!(recv.as_slice(), &vals(w.size() - 1, 5)[..]);
    Ok(())
}

pub(super) const CASES: &[(&str, Case)] = &[
    ("nonblocking_staged_point_to_point", staged_point_to_point),
    ("nonblocking_staged_all_reduce", staged_all_reduce),
    (
        "nonblocking_staged_strided_and_mixed",
        staged_strided_and_mixed,
    ),
    ("nonblocking_staged_refusal", staged_refusal),
    (
        "nonblocking_dropped_staged_request_copies_back",
        dropped_staged_request_copies_back,
    ),
    (
        "nonblocking_direct_all_reduce_copies_nothing",
        direct_all_reduce_copies_nothing,
    ),
];
