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
            ..
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

/// The `CollectiveMismatch` every rank must return, with `difference` containing each of
/// `words`; at 1 rank the call must succeed.
fn expect_difference(w: &SimpleCommunicator, got: Result<(), Error>, words: &[&str]) -> Outcome {
    if w.size() == 1 {
        return got.map_err(|e| format!("at 1 rank the call must succeed: {e}"));
    }
    match got {
        Err(Error::CollectiveMismatch { difference, .. }) => {
            for word in words {
                ensure!(
                    difference.contains(word),
                    "rank {}: the difference {difference:?} lacks {word:?}",
                    w.rank()
                );
            }
            Ok(())
        }
        other => Err(format!("expected CollectiveMismatch, got {other:?}")),
    }
}

/// An all-reduce of `n` float32 (every element the rank + 1), blocking or nonblocking;
/// checks the sum when it succeeds.
fn all_reduce_as(w: &SimpleCommunicator, n: usize, nonblocking: bool) -> Result<(), Error> {
    let send = Owned::new(vec![w.rank() as f32 + 1.0; n]);
    let mut recv = Owned::new(vec![0.0f32; n]);
    {
        let s = acquire(&send, &opts())?;
        let mut r = acquire(&recv, &opts())?;
        if nonblocking {
            mpi::request::scope(|scope| {
                w.immediate_all_reduce_tensor(scope, &s, &mut r, ReduceOp::Sum)?
                    .wait()
                    .map(drop)
            })?;
        } else {
            w.all_reduce_tensor(&s, &mut r, ReduceOp::Sum)?;
        }
    }
    let size = w.size() as f32;
    let want = size * (size + 1.0) / 2.0;
    if recv.as_slice().iter().any(|&v| v != want) {
        return Err(Error::PeerRefused {
            rank: w.rank(),
            reason: format!("wrong sum {:?}", &recv.as_slice()[..2]),
        });
    }
    Ok(())
}

/// The last rank calls the nonblocking form of an all-reduce where the others call the
/// blocking one, as the first nonblocking collective on a fresh communicator (issue 34: it
/// hung, silently): every rank returns the mismatch naming which rank used which form; the
/// matching collective after it is exact.
fn form_differs_first(w: &SimpleCommunicator) -> Outcome {
    let fresh = w.duplicate();
    let got = all_reduce_as(&fresh, 64, differs(w));
    let last = w.size() - 1;
    expect_difference(
        w,
        got,
        &[
            &format!("rank {last} called the nonblocking form"),
            "the blocking form",
            "§6.12",
        ],
    )?;
    all_reduce_as(&fresh, 64, false).map_err(|e| e.to_string())?;
    then_all_reduce_works(w)
}

/// The same after nonblocking collectives on the communicator (its agreements run as
/// `MPI_Iallreduce` on every rank), and the other way round: rank 0 blocking, the others
/// nonblocking.
fn form_differs_later(w: &SimpleCommunicator) -> Outcome {
    let fresh = w.duplicate();
    all_reduce_as(&fresh, 8, true).map_err(|e| e.to_string())?;
    let got = all_reduce_as(&fresh, 64, differs(w));
    expect_difference(
        w,
        got,
        &["called the nonblocking form", "the blocking form"],
    )?;
    let got = all_reduce_as(&fresh, 64, w.rank() != 0 && w.size() > 1);
    expect_difference(w, got, &["rank 0 called the blocking form"])?;
    all_reduce_as(&fresh, 64, true).map_err(|e| e.to_string())?;
    all_reduce_as(&fresh, 64, false).map_err(|e| e.to_string())?;
    then_all_reduce_works(w)
}

/// A fused list of `len` members `float32 [8]`, except member `odd` (if any) `float64
/// [8]`; all-reduced in place.
fn fused_list(w: &SimpleCommunicator, len: usize, odd: Option<usize>) -> Result<(), Error> {
    let f32s: Vec<Owned<f32>> = (0..len).map(|_| Owned::new(vec![1.0f32; 8])).collect();
    let f64s: Vec<Owned<f64>> = (0..len).map(|_| Owned::new(vec![1.0f64; 8])).collect();
    let mut ts = Vec::new();
    for i in 0..len {
        ts.push(if Some(i) == odd {
            acquire(&f64s[i], &opts())?
        } else {
            acquire(&f32s[i], &opts())?
        });
    }
    let mut refs: Vec<&mut dyn dlpack_mpi::dlpack::Tensor> = ts
        .iter_mut()
        .map(|t| t as &mut dyn dlpack_mpi::dlpack::Tensor)
        .collect();
    w.all_reduce_tensors_in_place(&mut refs, ReduceOp::Sum)
}

/// Member 57 of a 161-member list is float64 on the last rank: the error names the member,
/// its index, dtype and shape on each rank (issue 34: it named two hashes).
fn fused_member_differs(w: &SimpleCommunicator) -> Outcome {
    let odd = differs(w).then_some(57);
    let got = fused_list(w, 161, odd);
    let last = w.size() - 1;
    let others = if w.size() == 2 {
        "rank 0 float32 [8]".to_string()
    } else {
        "ranks 0".to_string()
    };
    expect_difference(
        w,
        got,
        &["member 57: ", &others, &format!("rank {last} float64 [8]")],
    )?;
    fused_list(w, 161, None).map_err(|e| e.to_string())?;
    then_all_reduce_works(w)
}

/// The last rank leaves the last member out: the error says which rank has which length
/// and where the first difference is.
fn fused_length_differs(w: &SimpleCommunicator) -> Outcome {
    let len = if differs(w) { 160 } else { 161 };
    let got = fused_list(w, len, None);
    let last = w.size() - 1;
    expect_difference(
        w,
        got,
        &[
            &format!("rank {last} has 160 members"),
            "161 members",
            "first difference at member 160",
            "no member",
        ],
    )?;
    fused_list(w, 161, None).map_err(|e| e.to_string())?;
    then_all_reduce_works(w)
}

/// An all-reduce of `n` elements, or a broadcast of `n` from root 0 when `bcast`.
fn step(w: &SimpleCommunicator, n: usize, bcast: bool) -> Result<(), Error> {
    if !bcast {
        return all_reduce_as(w, n, false);
    }
    let data = Owned::new(vec![w.rank() as f32; n]);
    let mut t = acquire(&data, &opts())?;
    w.broadcast_tensor(&mut t, 0)
}

/// The last rank skips the second of five collectives (issue 34: every later call was a
/// mismatch of hashes, then the program hung). The second call is a mismatch on every rank
/// (a broadcast against an all-reduce); the third finds the last rank out of step, naming
/// it (`at collective 4`, the others `at 3`); every later collective on the communicator
/// returns `OutOfStep` at once on every rank, however many each makes, so none hangs; after
/// `reset_out_of_step` on every rank the next collective is exact.
fn skipped_collective(w: &SimpleCommunicator) -> Outcome {
    let fresh = w.duplicate();
    // (elements, broadcast?) of the program's collectives.
    let program = [
        (10, false),
        (20, true),
        (30, false),
        (40, false),
        (50, false),
    ];
    let mine: Vec<(usize, bool)> = program
        .iter()
        .enumerate()
        .filter(|&(i, _)| !(differs(w) && i == 1))
        .map(|(_, &c)| c)
        .collect();
    let outcomes: Vec<Result<(), Error>> = mine.iter().map(|&(n, b)| step(&fresh, n, b)).collect();
    if w.size() == 1 {
        for o in outcomes {
            o.map_err(|e| e.to_string())?;
        }
        return Ok(());
    }
    outcomes[0].clone().map_err(|e| format!("first: {e}"))?;
    ensure!(
        matches!(outcomes[1], Err(Error::CollectiveMismatch { .. })),
        "second: {:?}",
        outcomes[1]
    );
    let last = w.size() - 1;
    match &outcomes[2] {
        Err(Error::OutOfStep { first }) => {
            ensure!(
                first.contains(&format!("rank {last} at collective 4"))
                    && first.contains("at 3")
                    && first.contains("skipped"),
                "third: {first}"
            );
        }
        other => return Err(format!("third: expected OutOfStep, got {other:?}")),
    }
    for (i, o) in outcomes.iter().enumerate().skip(3) {
        ensure!(
            matches!(o, Err(Error::OutOfStep { .. })),
            "call {i}: expected OutOfStep at once, got {o:?}"
        );
    }
    ensure!(
        dlpack_mpi::comm::reset_out_of_step(&fresh),
        "reset: was not out of step"
    );
    all_reduce_as(&fresh, 64, false).map_err(|e| format!("after reset: {e}"))?;
    then_all_reduce_works(w)
}

/// The last rank makes one collective more (it retries a broadcast the others made once):
/// named as one behind.
fn added_collective(w: &SimpleCommunicator) -> Outcome {
    let fresh = w.duplicate();
    let mut program = vec![(10, false), (20, true), (30, false), (40, false)];
    if differs(w) {
        program.insert(2, (20, true));
    }
    let outcomes: Vec<Result<(), Error>> =
        program.iter().map(|&(n, b)| step(&fresh, n, b)).collect();
    if w.size() == 1 {
        return outcomes
            .into_iter()
            .try_for_each(|o| o.map_err(|e| e.to_string()));
    }
    ensure!(
        matches!(outcomes[2], Err(Error::CollectiveMismatch { .. })),
        "third: {:?}",
        outcomes[2]
    );
    let last = w.size() - 1;
    match &outcomes[3] {
        Err(Error::OutOfStep { first }) => ensure!(
            first.contains(&format!("rank {last} at collective 3")) && first.contains("one more"),
            "fourth: {first}"
        ),
        other => return Err(format!("fourth: expected OutOfStep, got {other:?}")),
    }
    dlpack_mpi::comm::reset_out_of_step(&fresh);
    all_reduce_as(&fresh, 64, true).map_err(|e| format!("after reset: {e}"))?;
    then_all_reduce_works(w)
}

/// A mismatch of arguments, then the same call with matching ones on every rank (the odd
/// rank's wrong arguments equal the next call's): a retry, not a rank out of step.
fn retry_after_mismatch(w: &SimpleCommunicator) -> Outcome {
    let fresh = w.duplicate();
    let n = if differs(w) { 64 } else { 32 };
    let got = all_reduce_as(&fresh, n, false);
    expect_difference(w, got, &["× 32", "× 64"])?;
    all_reduce_as(&fresh, 64, false).map_err(|e| format!("the retry: {e}"))?;
    all_reduce_as(&fresh, 64, true).map_err(|e| format!("after it: {e}"))?;
    then_all_reduce_works(w)
}

/// At 2 ranks, the last rank runs with `Agreement::Local` (a peer that does not take part
/// in the agreement, as an mpi4py rank calling `Allreduce`) while rank 0 agrees (issue 34:
/// the job aborted with `MPI_ERR_TRUNCATE` inside the agreement, not a word from
/// dlpack-mpi). Rank 0's agreement runs with errors returned: it returns `OutOfStep`
/// naming the likely cause and the fix, and its later collectives on that communicator
/// fail at once; the peer's own all-reduce returns (its data is what MPI made of the
/// mismatch: not checked). Nothing aborts. Other sizes: skipped (MPI may leave the
/// third rank waiting). MPICH 5: skipped, as MPICH reports the conflict inside its own
/// shared-memory sub-communicators, whose error handler is fatal whatever the caller's
/// (a C program setting `MPI_ERRORS_RETURN` aborts the same): there the job still aborts.
fn peer_without_agreement(w: &SimpleCommunicator) -> Outcome {
    use dlpack_mpi::settings::{agreement, set_agreement, Agreement};
    let mpich = mpi::environment::library_version()
        .map(|v| v.contains("MPICH"))
        .unwrap_or(false);
    if w.size() != 2 || mpich {
        return Ok(());
    }
    let fresh = w.duplicate();
    let before = agreement().map_err(|e| e.to_string())?;
    if differs(w) {
        set_agreement(Agreement::Local);
    }
    let got = all_reduce_as(&fresh, 1000, false);
    set_agreement(before);
    if differs(w) {
        return Ok(());
    }
    match got {
        Err(Error::OutOfStep { first }) => ensure!(
            first.contains("DLPACK_MPI_AGREEMENT=local") && first.contains("mpi4py"),
            "{first}"
        ),
        other => return Err(format!("expected OutOfStep, got {other:?}")),
    }
    match all_reduce_as(&fresh, 8, false) {
        Err(Error::OutOfStep { .. }) => Ok(()),
        other => Err(format!(
            "the next call: expected OutOfStep at once, got {other:?}"
        )),
    }
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
    ("form_differs_first", form_differs_first),
    ("form_differs_later", form_differs_later),
    ("fused_member_differs", fused_member_differs),
    ("fused_length_differs", fused_length_differs),
    ("skipped_collective", skipped_collective),
    ("added_collective", added_collective),
    ("retry_after_mismatch", retry_after_mismatch),
    ("peer_without_agreement", peer_without_agreement),
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
