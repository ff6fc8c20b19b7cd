//! Every form of the one operation list on `DeviceComm` (issue 21): the windowed
//! point-to-point operations, the shared-root broadcast and the nonblocking operations,
//! which `DeviceComm` gained by implementing `TensorComm` instead of repeating its list.
//! Values are checked element by element; copies are counted on the simulated runtime.

use super::*;
use dlpack_mpi::comm::BroadcastBuffer;

/// Rank 0 sends the window `[2, 6)` of a staged CUDA tensor to rank 1, which receives it
/// into the window `[1, 5)` of its own CUDA tensor: the four values land there, the other
/// elements keep theirs (the staged copy is read from the device first), and the route is
/// the staged one.
fn staged_windows_keep_the_rest(w: &SimpleCommunicator) -> Outcome {
    if w.size() < 2 || w.rank() > 1 {
        return Ok(());
    }
    let rt = SimulatedRuntime::new();
    let dc = staged(w, &rt);
    let mut mine = if w.rank() == 0 {
        on(CUDA0, (0..8).map(|i| i as f32).collect())
    } else {
        on(CUDA0, vec![-1.0; 8])
    };
    {
        let mut t = take(&mine, &rt)?;
        if w.rank() == 0 {
            call!(dc.send_tensor_range(&t, 2..6, 1, 21));
        } else {
            let status = call!(dc.recv_tensor_range(&mut t, 1..5, 0, 21));
            ensure_eq!(status.source_rank(), 0);
        }
        ensure_eq!(dc.last_route(), Some(Route::Staged));
    }
    if w.rank() == 1 {
        let want = [-1.0, 2.0, 3.0, 4.0, 5.0, -1.0, -1.0, -1.0];
        ensure_eq!(mine.as_slice(), &want[..]);
    }
    Ok(())
}

/// `broadcast_tensor_from` on `DeviceComm`: the root holds a shared, `READ_ONLY` CUDA
/// tensor (never written, so allowed), every other rank a CUDA tensor that receives it.
fn shared_root_broadcast_on_the_device(w: &SimpleCommunicator) -> Outcome {
    let rt = SimulatedRuntime::new();
    let dc = staged(w, &rt);
    let root = w.size() - 1;
    let vals: Vec<f32> = (0..6).map(|i| 10.0 + i as f32).collect();
    let src = on(CUDA0, vals.clone()).read_only();
    let mut dst = on(CUDA0, vec![0.0; 6]);
    if w.rank() == root {
        let t = take(&src, &rt)?;
        call!(dc.broadcast_tensor_from(BroadcastBuffer::Send(&t), root));
        ensure_eq!(copies(&rt).1, 0);
    } else {
        let mut t = take(&dst, &rt)?;
        call!(dc.broadcast_tensor_from(BroadcastBuffer::Recv(&mut t), root));
    }
    if w.rank() != root {
        ensure_eq!(dst.as_slice(), &vals[..]);
    }
    Ok(())
}

/// Nonblocking operations on `DeviceComm`: host tensors post as on any communicator (the
/// staged device forms are in `nonblocking.rs`).
fn immediate_forms_on_the_device(w: &SimpleCommunicator) -> Outcome {
    if w.size() < 2 || w.rank() > 1 {
        return Ok(());
    }
    let rt = SimulatedRuntime::new();
    let dc = staged(w, &rt);
    let other = 1 - w.rank();
    let send = Owned::new(vec![w.rank() as f32 + 1.0; 5]);
    let mut recv = Owned::new(vec![0.0f32; 5]);
    {
        let s = call!(acquire_with_runtime(
            &send,
            &AcquireOptions::default(),
            Some(&rt)
        ));
        let mut r = call!(acquire_with_runtime(
            &recv,
            &AcquireOptions::default(),
            Some(&rt)
        ));
        let done: Result<(), Error> = mpi::request::scope(|scope| {
            let rr = dc.immediate_recv_tensor(scope, &mut r, other, 22)?;
            let sr = dc.immediate_send_tensor(scope, &s, other, 22)?;
            sr.wait()?;
            rr.wait().map(drop)
        });
        call!(done);
    }
    ensure_eq!(recv.as_slice(), &[other as f32 + 1.0; 5][..]);
    Ok(())
}

/// On the direct route (MPI declared CUDA-aware; the simulated device memory is host
/// memory, so MPI can read it) a contiguous CUDA tensor is posted nonblocking as its own
/// device pointer: the values arrive and nothing is copied between host and device.
fn immediate_direct_posts_the_device_pointer(w: &SimpleCommunicator) -> Outcome {
    if w.size() < 2 || w.rank() > 1 {
        return Ok(());
    }
    let rt = SimulatedRuntime::new();
    std::env::set_var("DLPACK_MPI_CUDA_AWARE", "1");
    let dc = DeviceComm::new(w, Some(&rt as &dyn DeviceRuntime), Transport::Direct);
    std::env::remove_var("DLPACK_MPI_CUDA_AWARE");
    let dc = call!(dc);
    let other = 1 - w.rank();
    let send = on(CUDA0, vec![7.0 + w.rank() as f32; 6]);
    let mut recv = on(CUDA0, vec![0.0; 6]);
    {
        let s = take(&send, &rt)?;
        let mut r = take(&recv, &rt)?;
        rt.clear_calls();
        let done: Result<(), Error> = mpi::request::scope(|scope| {
            let rr = dc.immediate_recv_tensor(scope, &mut r, other, 24)?;
            let sr = dc.immediate_send_tensor(scope, &s, other, 24)?;
            sr.wait()?;
            rr.wait().map(drop)
        });
        call!(done);
        ensure_eq!(copies(&rt), (0, 0));
        ensure_eq!(dc.last_route(), Some(Route::Direct));
    }
    ensure_eq!(recv.as_slice(), &[7.0 + other as f32; 6][..]);
    Ok(())
}

/// A root-only operand given at another rank is checked there as at the root, without
/// staging: the last rank passes a `READ_ONLY` CUDA receive tensor to a gather rooted at
/// rank 0. It returns `ReadOnly`, every other rank `PeerRefused` naming it, and the last
/// rank copied its send to the host (staged before the preparation found the refusal) and
/// nothing else: the receive operand was never staged. Then the same gather with a
/// writable tensor (still unused there) delivers every rank's block at the root.
fn root_only_operands_are_checked_elsewhere(w: &SimpleCommunicator) -> Outcome {
    let (rank, size) = (w.rank(), w.size());
    if size < 2 {
        return Ok(());
    }
    let last = size - 1;
    let rt = SimulatedRuntime::new();
    let dc = staged(w, &rt);
    let mine = on(CUDA0, vec![rank as f32; 2]);
    let all = 2 * size as usize;
    for refuse in [true, false] {
        let recv = on(CUDA0, vec![-1.0; all]);
        let mut recv = if refuse && rank == last {
            recv.read_only()
        } else {
            recv
        };
        {
            let s = take(&mine, &rt)?;
            let mut r = take(&recv, &rt)?;
            rt.clear_calls();
            let got = dc.gather_tensor(&s, Some(&mut r), 0);
            match (refuse, rank == last, got) {
                (true, true, Err(Error::ReadOnly)) => ensure_eq!(copies(&rt), (1, 0)),
                (true, false, Err(Error::PeerRefused { rank: who, .. })) => ensure_eq!(who, last),
                (false, _, Ok(())) if rank != 0 => ensure_eq!(copies(&rt), (1, 0)),
                (false, _, Ok(())) => {}
                (refuse, _, other) => {
                    return Err(format!("refusing {refuse} at rank {rank}: got {other:?}"))
                }
            }
        }
        if !refuse && rank == 0 {
            let want: Vec<f32> = (0..size).flat_map(|r| [r as f32; 2]).collect();
            ensure_eq!(recv.as_slice(), &want[..]);
        }
    }
    Ok(())
}

pub(super) const CASES: &[(&str, Case)] = &[
    ("staged_windows_keep_the_rest", staged_windows_keep_the_rest),
    (
        "shared_root_broadcast_on_the_device",
        shared_root_broadcast_on_the_device,
    ),
    (
        "immediate_forms_on_the_device",
        immediate_forms_on_the_device,
    ),
    (
        "immediate_direct_posts_the_device_pointer",
        immediate_direct_posts_the_device_pointer,
    ),
    (
        "root_only_operands_are_checked_elsewhere",
        root_only_operands_are_checked_elsewhere,
    ),
];
