//! Collectives whose arguments are valid on each rank but do not match across ranks
//! (issue 23; MPI-4.1 §6.1): the agreement's fingerprint catches each before any rank
//! enters the data operation. In every case every rank returns
//! `Error::CollectiveMismatch` naming rank 0 and the last rank (the one that differs) with
//! both ranks' arguments in words, and then the same collective with matching arguments
//! delivers exact values (the mismatch left nothing behind on the communicator).
//!
//! Without the fingerprint these cases hang (a broadcast whose root differs, a broadcast
//! against an all-reduce), abort the job (`MPI_ERR_TRUNCATE`: float64 against float32, 1001
//! against 1000 elements) or return wrong data (`Sum` against `Max`, all-gatherv counts).
//! scripts/test.sh runs each case in its own job (`--suite mismatch` and the case's name as
//! the filter) at 2, 3 and 4 ranks under a short timeout, which fails a case that waits;
//! `cargo test` runs them all at 1 rank (no peer can differ there: each checks that the
//! call succeeds).

use crate::harness;
use dlpack_mpi::comm::{Blocks, TensorComm};
use dlpack_mpi::device::{device_type, Device};
use dlpack_mpi::dlpack::{acquire, acquire_with_runtime, AcquireOptions, Owned};
use dlpack_mpi::dtype::ReduceOp;
use dlpack_mpi::runtime::{DeviceRuntime, SimulatedRuntime};
use dlpack_mpi::transport::{DeviceComm, Transport};
use dlpack_mpi::Error;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

type Outcome = Result<(), String>;

fn opts() -> AcquireOptions {
    AcquireOptions::default()
}

/// Whether this rank is the one that differs (the last; none at 1 rank).
fn differs(w: &SimpleCommunicator) -> bool {
    w.size() > 1 && w.rank() == w.size() - 1
}

/// Checks that `got` is the mismatch error every rank must return: rank 0's arguments
/// contain `ours`, the last rank's contain `theirs`. At 1 rank the call must succeed.
fn expect_mismatch(
    w: &SimpleCommunicator,
    got: Result<(), Error>,
    ours: &str,
    theirs: &str,
) -> Outcome {
    if w.size() == 1 {
        return got.map_err(|e| format!("at 1 rank the call must succeed: {e}"));
    }
    match got {
        Err(Error::CollectiveMismatch {
            rank,
            arguments,
            other_rank,
            other_arguments,
        }) => {
            ensure_eq!((rank, other_rank), (0, w.size() - 1));
            ensure!(
                arguments.contains(ours),
                "rank 0's arguments {arguments:?} lack {ours:?}"
            );
            ensure!(
                other_arguments.contains(theirs),
                "the other rank's arguments {other_arguments:?} lack {theirs:?}"
            );
            Ok(())
        }
        other => Err(format!("expected CollectiveMismatch, got {other:?}")),
    }
}

/// An all-reduce with matching arguments after a mismatch: every element is the sum of
/// the ranks + 1 (also the adversarial suite's check that nothing was left behind).
pub(crate) fn then_all_reduce_works(w: &SimpleCommunicator) -> Outcome {
    let n = 1000;
    let send = Owned::new(vec![w.rank() as f32 + 1.0; n]);
    let mut recv = Owned::new(vec![0.0f32; n]);
    {
        let s = acquire(&send, &opts()).map_err(|e| e.to_string())?;
        let mut r = acquire(&recv, &opts()).map_err(|e| e.to_string())?;
        w.all_reduce_tensor(&s, &mut r, ReduceOp::Sum)
            .map_err(|e| format!("the matching all-reduce after it: {e}"))?;
    }
    let size = w.size() as f32;
    let want = size * (size + 1.0) / 2.0;
    ensure!(
        recv.as_slice().iter().all(|&v| v == want),
        "after: {:?}",
        &recv.as_slice()[..4]
    );
    Ok(())
}

fn broadcast_root_differs(w: &SimpleCommunicator) -> Outcome {
    let data = Owned::new((0..1000).map(|i| i as f32).collect::<Vec<_>>());
    let root = i32::from(differs(w));
    let got = {
        let mut t = acquire(&data, &opts()).map_err(|e| e.to_string())?;
        w.broadcast_tensor(&mut t, root)
    };
    expect_mismatch(w, got, "broadcast float32 × 1000 root 0", "root 1")?;
    then_all_reduce_works(w)
}

fn all_reduce_dtype_differs(w: &SimpleCommunicator) -> Outcome {
    let got = if differs(w) {
        let (send, recv) = (
            Owned::new(vec![1.0f64; 1000]),
            Owned::new(vec![0.0f64; 1000]),
        );
        let s = acquire(&send, &opts()).map_err(|e| e.to_string())?;
        let mut r = acquire(&recv, &opts()).map_err(|e| e.to_string())?;
        w.all_reduce_tensor(&s, &mut r, ReduceOp::Sum)
    } else {
        let (send, recv) = (
            Owned::new(vec![1.0f32; 1000]),
            Owned::new(vec![0.0f32; 1000]),
        );
        let s = acquire(&send, &opts()).map_err(|e| e.to_string())?;
        let mut r = acquire(&recv, &opts()).map_err(|e| e.to_string())?;
        w.all_reduce_tensor(&s, &mut r, ReduceOp::Sum)
    };
    expect_mismatch(w, got, "all_reduce float32 × 1000 sum", "float64")?;
    then_all_reduce_works(w)
}

fn all_reduce_count_differs(w: &SimpleCommunicator) -> Outcome {
    let n = if differs(w) { 1001 } else { 1000 };
    let (send, recv) = (Owned::new(vec![1.0f32; n]), Owned::new(vec![0.0f32; n]));
    let got = {
        let s = acquire(&send, &opts()).map_err(|e| e.to_string())?;
        let mut r = acquire(&recv, &opts()).map_err(|e| e.to_string())?;
        w.all_reduce_tensor(&s, &mut r, ReduceOp::Sum)
    };
    expect_mismatch(w, got, "× 1000", "× 1001")?;
    then_all_reduce_works(w)
}

fn all_reduce_op_differs(w: &SimpleCommunicator) -> Outcome {
    let op = if differs(w) {
        ReduceOp::Max
    } else {
        ReduceOp::Sum
    };
    let send = Owned::new((0..1000).map(|i| (i % 7) as f32).collect::<Vec<_>>());
    let mut recv = Owned::new(vec![-1.0f32; 1000]);
    let got = {
        let s = acquire(&send, &opts()).map_err(|e| e.to_string())?;
        let mut r = acquire(&recv, &opts()).map_err(|e| e.to_string())?;
        w.all_reduce_tensor(&s, &mut r, op)
    };
    expect_mismatch(w, got, " sum", " max")?;
    if w.size() > 1 {
        // No rank entered the data operation: the receive buffer is untouched.
        ensure!(
            recv.as_slice().iter().all(|&v| v == -1.0),
            "recv was written"
        );
    }
    then_all_reduce_works(w)
}

fn broadcast_against_all_reduce(w: &SimpleCommunicator) -> Outcome {
    let send = Owned::new(vec![1.0f32; 1000]);
    let recv = Owned::new(vec![0.0f32; 1000]);
    let got = {
        let s = acquire(&send, &opts()).map_err(|e| e.to_string())?;
        let mut r = acquire(&recv, &opts()).map_err(|e| e.to_string())?;
        if differs(w) {
            w.broadcast_tensor(&mut r, 0)
        } else {
            w.all_reduce_tensor(&s, &mut r, ReduceOp::Sum)
        }
    };
    expect_mismatch(
        w,
        got,
        "all_reduce float32 × 1000 sum",
        "broadcast float32 × 1000 root 0",
    )?;
    then_all_reduce_works(w)
}

/// Counts `1, 2, …, size` on every rank but the last, which passes them rotated by one
/// (`2, …, size, 1`): each array valid on its own rank (its own block is its send count).
fn all_gatherv_counts_differ(w: &SimpleCommunicator) -> Outcome {
    let size = w.size() as usize;
    let mut counts: Vec<i64> = (1..=size as i64).collect();
    if differs(w) {
        counts.rotate_left(1);
    }
    let displs: Vec<i64> = counts
        .iter()
        .scan(0, |at, &c| {
            let d = *at;
            *at += c;
            Some(d)
        })
        .collect();
    let total: i64 = counts.iter().sum();
    let mine = counts[w.rank() as usize] as usize;
    let send = Owned::new(vec![w.rank() as f32; mine]);
    let recv = Owned::new(vec![0.0f32; total as usize]);
    let got = {
        let s = acquire(&send, &opts()).map_err(|e| e.to_string())?;
        let mut r = acquire(&recv, &opts()).map_err(|e| e.to_string())?;
        w.all_gatherv_tensor(&s, &mut r, Blocks::new(&counts, &displs))
    };
    let (ours, theirs) = if size == 2 {
        ("counts [1, 2]", "counts [2, 1]")
    } else if size == 3 {
        ("counts [1, 2, 3]", "counts [2, 3, 1]")
    } else {
        (
            "all_gatherv float32 counts [1, 2",
            "all_gatherv float32 counts [2, 3",
        )
    };
    expect_mismatch(w, got, ours, theirs)?;
    then_all_reduce_works(w)
}

/// The same catch on `DeviceComm` (simulated CUDA memory, staged): `Sum` against `Max`.
fn device_sum_against_max(w: &SimpleCommunicator) -> Outcome {
    let rt = SimulatedRuntime::new();
    let dc = DeviceComm::new(w, Some(&rt as &dyn DeviceRuntime), Transport::Staged)
        .map_err(|e| e.to_string())?;
    let cuda = Device::new(device_type::CUDA, 0);
    let send = Owned::new(vec![2.0f32; 64]).labelled(cuda);
    let recv = Owned::new(vec![0.0f32; 64]).labelled(cuda);
    let op = if differs(w) {
        ReduceOp::Max
    } else {
        ReduceOp::Sum
    };
    let got = {
        let rt: &dyn DeviceRuntime = &rt;
        let s = acquire_with_runtime(&send, &opts(), Some(rt)).map_err(|e| e.to_string())?;
        let mut r = acquire_with_runtime(&recv, &opts(), Some(rt)).map_err(|e| e.to_string())?;
        dc.all_reduce_tensor(&s, &mut r, op)
    };
    expect_mismatch(
        w,
        got,
        "all_reduce float32 × 64 sum",
        "all_reduce float32 × 64 max",
    )?;
    then_all_reduce_works(w)
}

/// The last rank reduces float16 with dlpack-mpi's own operations
/// (`DLPACK_MPI_HALF_OPS=library`), the others with MPI's own (`mpi`: whatever the rounding
/// probe of the default `auto` finds). Where this build's MPI has its own float16 datatype
/// (MPICH ≥ 5: `MPIX_C_FLOAT16`) the ranks would pass different datatypes (MPICH aborts the
/// job: "Message truncated"), so every rank returns the mismatch, naming both forms;
/// elsewhere both settings mean dlpack-mpi's operations and the sum is exact. The setting is
/// restored afterwards.
fn half_ops_differ(w: &SimpleCommunicator) -> Outcome {
    use dlpack_mpi::comm::halfops;
    use dlpack_mpi::settings::{half_ops, set_half_ops, HalfOps};
    use half::f16;
    let before = half_ops().map_err(|e| e.to_string())?;
    let native = halfops::native_available();
    set_half_ops(if differs(w) {
        HalfOps::Library
    } else {
        HalfOps::Mpi
    });
    let n = 1000;
    let send = Owned::new(vec![f16::from_f32(w.rank() as f32 + 1.0); n]);
    let mut recv = Owned::new(vec![f16::ZERO; n]);
    let got = {
        let s = acquire(&send, &opts()).map_err(|e| e.to_string())?;
        let mut r = acquire(&recv, &opts()).map_err(|e| e.to_string())?;
        w.all_reduce_tensor(&s, &mut r, ReduceOp::Sum)
    };
    set_half_ops(before);
    if native {
        expect_mismatch(
            w,
            got,
            "all_reduce float16 × 1000 sum (float16 by MPI's own datatype)",
            "all_reduce float16 × 1000 sum (float16 by dlpack-mpi's operations)",
        )?;
        if w.size() > 1 {
            ensure!(
                recv.as_slice().iter().all(|&v| v == f16::ZERO),
                "recv was written"
            );
        }
    } else {
        got.map_err(|e| format!("both settings reduce with dlpack-mpi's operations here: {e}"))?;
        let size = w.size() as f32;
        let want = f16::from_f32(size * (size + 1.0) / 2.0);
        ensure!(
            recv.as_slice().iter().all(|&v| v == want),
            "after: {:?}",
            &recv.as_slice()[..4]
        );
    }
    then_all_reduce_works(w)
}

type Case = fn(&SimpleCommunicator) -> Outcome;

const CASES: &[(&str, Case)] = &[
    ("broadcast_root_differs", broadcast_root_differs),
    ("all_reduce_dtype_differs", all_reduce_dtype_differs),
    ("all_reduce_count_differs", all_reduce_count_differs),
    ("all_reduce_op_differs", all_reduce_op_differs),
    ("broadcast_against_all_reduce", broadcast_against_all_reduce),
    ("all_gatherv_counts_differ", all_gatherv_counts_differ),
    ("device_sum_against_max", device_sum_against_max),
    ("half_ops_differ", half_ops_differ),
];

/// The names of the cases, for scripts/test.sh's one job per case.
pub fn names() -> impl Iterator<Item = &'static str> {
    CASES.iter().map(|(name, _)| *name)
}

pub fn run(w: &SimpleCommunicator, filter: &[String]) -> harness::End {
    if w.rank() == 0 {
        println!("running mismatched-argument cases at {} rank(s)", w.size());
    }
    let (passed, failed) = harness::run_cases(w, CASES.iter().copied(), filter, |case| case(w));
    harness::report(w, passed, failed);
    harness::End::Ran { passed, failed }
}
