//! The mismatch section of `check`: collectives whose arguments are valid on each rank but
//! do not match across ranks (MPI-4.1 §6.1), run on this MPI through the run's
//! `DeviceComm`, each of which must end in `Error::CollectiveMismatch` on every rank (the
//! agreement's fingerprint), with no rank left waiting, followed by a matching all-reduce
//! that must deliver exact values. Without the fingerprint each probe hangs the job, aborts
//! it or returns wrong data. Then the mistakes that span calls (issue 34), each on a fresh
//! duplicate of the world: the blocking form against the nonblocking one, fused lists that
//! differ in one member (named with its index), and a rank that skips a collective (named
//! out of step, every later call refused at once, until `reset_out_of_step`). Skipped at one rank (no peer can differ) and under
//! `DLPACK_MPI_AGREEMENT=local` (no agreement: the probes would hang).

use dlpack_mpi::comm::{Blocks, TensorComm};
use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned};
use dlpack_mpi::dtype::ReduceOp;
use dlpack_mpi::settings::{agreement, Agreement};
use dlpack_mpi::Error;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use super::matrix::Comm;
use crate::common::all_ranks;

/// One probe: its name, and its call on this rank (`differs`: this rank is the one whose
/// arguments differ).
type Probe = (&'static str, fn(&Comm<'_>, bool) -> Result<(), Error>);

const N: usize = 1000;

fn tensor<T: dlpack_mpi::dtype::AnyBits + Copy>(v: T, n: usize) -> Owned<T> {
    Owned::new(vec![v; n])
}

fn all_reduce<T: dlpack_mpi::dtype::AnyBits + Copy>(
    dc: &Comm<'_>,
    v: T,
    n: usize,
    op: ReduceOp,
) -> Result<(), Error> {
    let (s, r) = (tensor(v, n), tensor(v, n));
    let o = AcquireOptions::default();
    let (sg, mut rg) = (acquire(&s, &o)?, acquire(&r, &o)?);
    dc.all_reduce_tensor(&sg, &mut rg, op)
}

const PROBES: &[Probe] = &[
    ("broadcast root 0 against root 1", |dc, differs| {
        let t = tensor(1.0f32, N);
        let mut g = acquire(&t, &AcquireOptions::default())?;
        dc.broadcast_tensor(&mut g, i32::from(differs))
    }),
    ("all-reduce float32 against float64", |dc, differs| {
        if differs {
            all_reduce(dc, 1.0f64, N, ReduceOp::Sum)
        } else {
            all_reduce(dc, 1.0f32, N, ReduceOp::Sum)
        }
    }),
    ("all-reduce 1000 elements against 1001", |dc, differs| {
        all_reduce(dc, 1.0f32, N + usize::from(differs), ReduceOp::Sum)
    }),
    ("all-reduce sum against max", |dc, differs| {
        let op = if differs {
            ReduceOp::Max
        } else {
            ReduceOp::Sum
        };
        all_reduce(dc, 1.0f32, N, op)
    }),
    ("broadcast against all-reduce", |dc, differs| {
        if differs {
            let t = tensor(1.0f32, N);
            let mut g = acquire(&t, &AcquireOptions::default())?;
            dc.broadcast_tensor(&mut g, 0)
        } else {
            all_reduce(dc, 1.0f32, N, ReduceOp::Sum)
        }
    }),
    (
        "all-gatherv receive counts 1, 2, … against 2, …, 1",
        |dc, differs| {
            let w = dc.comm();
            let size = usize::try_from(w.size()).unwrap_or(1);
            let mut counts: Vec<i64> = (1..=i64::from(w.size())).collect();
            if differs {
                counts.rotate_left(1);
            }
            let displs = crate::common::displacements(&counts);
            let rank = usize::try_from(w.rank()).unwrap_or(0);
            let mine = usize::try_from(counts[rank.min(size - 1)]).unwrap_or(0);
            let total = usize::try_from(counts.iter().sum::<i64>()).unwrap_or(0);
            let (s, r) = (tensor(1.0f32, mine), tensor(0.0f32, total));
            let o = AcquireOptions::default();
            let (sg, mut rg) = (acquire(&s, &o)?, acquire(&r, &o)?);
            dc.all_gatherv_tensor(&sg, &mut rg, Blocks::new(&counts, &displs))
        },
    ),
];

/// Runs the probes and prints the section (rank 0; under `-q` only a failure). Returns
/// whether every probe ended in `CollectiveMismatch` on every rank and the matching
/// all-reduce after them was exact.
pub(super) fn run(w: &SimpleCommunicator, dc: &Comm<'_>, quiet: bool) -> bool {
    let root = w.rank() == 0;
    if w.size() < 2 {
        return true;
    }
    if !matches!(agreement(), Ok(Agreement::Collective)) {
        if root && !quiet {
            println!(
                "mismatched arguments: not probed (DLPACK_MPI_AGREEMENT=local: no agreement, \
                 so a mismatch would hang)"
            );
        }
        return true;
    }
    let differs = w.rank() == w.size() - 1;
    let mut failures = Vec::new();
    for (name, probe) in PROBES {
        let ended = match probe(dc, differs) {
            Err(Error::CollectiveMismatch { .. }) => true,
            Err(e) => {
                eprintln!(
                    "dlpack-mpi check: rank {}: mismatch probe {name}: {e}",
                    w.rank()
                );
                false
            }
            Ok(()) => {
                eprintln!(
                    "dlpack-mpi check: rank {}: mismatch probe {name}: returned Ok",
                    w.rank()
                );
                false
            }
        };
        if !all_ranks(w, ended) {
            failures.push(*name);
        }
    }
    let after = matching_all_reduce(w, dc);
    let program = program_probes(w, differs);
    let ok = failures.is_empty() && after && program.is_empty();
    if root && (!ok || !quiet) {
        if ok {
            println!(
                "mismatched arguments (MPI-4.1 §6.1): {} probes at {} ranks, each ended in \
                 CollectiveMismatch on every rank, none waited; the next matching collective \
                 was exact; mistakes across calls: {} probes ({}), each named on every rank, \
                 the skipped collective out of step until reset",
                PROBES.len(),
                w.size(),
                PROGRAM.len(),
                PROGRAM.join("; ")
            );
        } else {
            println!(
                "FAIL mismatched arguments: {} of {} probes did not end in CollectiveMismatch \
                 on every rank ({}){}; {} of {} probes of mistakes across calls failed ({})",
                failures.len(),
                PROBES.len(),
                failures.join("; "),
                if after {
                    ""
                } else {
                    "; the matching all-reduce after them was wrong"
                },
                program.len(),
                PROGRAM.len(),
                program.join("; ")
            );
        }
    }
    ok
}

/// A matching all-reduce after the probes: every element must be the sum over the ranks.
fn matching_all_reduce(w: &SimpleCommunicator, dc: &Comm<'_>) -> bool {
    let s = tensor(w.rank() + 1, N);
    let r = tensor(0i32, N);
    let o = AcquireOptions::default();
    let done = match (acquire(&s, &o), acquire(&r, &o)) {
        (Ok(st), Ok(mut rt)) => dc.all_reduce_tensor(&st, &mut rt, ReduceOp::Sum).is_ok(),
        _ => false,
    };
    let size = w.size();
    let mut r = r;
    let exact = done && r.as_slice().iter().all(|&v| v == size * (size + 1) / 2);
    all_ranks(w, exact)
}

/// The probes of mistakes that span calls (issue 34), each on a fresh duplicate of the
/// world with host tensors.
const PROGRAM: [&str; 3] = [
    "blocking against nonblocking all-reduce",
    "fused lists differing at member 3",
    "a rank that skipped a collective",
];

/// Runs [`PROGRAM`]'s probes; returns the names of those that failed on any rank (each
/// failure also on standard error, naming the rank).
fn program_probes(w: &SimpleCommunicator, differs: bool) -> Vec<&'static str> {
    let results = [form(w, differs), member(w, differs), skipped(w, differs)];
    PROGRAM
        .iter()
        .zip(results)
        .filter_map(|(name, got)| {
            if let Err(why) = &got {
                eprintln!("dlpack-mpi check: rank {}: probe {name}: {why}", w.rank());
            }
            (!all_ranks(w, got.is_ok())).then_some(*name)
        })
        .collect()
}

/// An all-reduce of 64 float32 on `c`, in the nonblocking form when `nonblocking`.
fn all_reduce_on(c: &SimpleCommunicator, nonblocking: bool) -> Result<(), Error> {
    let (s, r) = (tensor(1.0f32, 64), tensor(0.0f32, 64));
    let o = AcquireOptions::default();
    let (sg, mut rg) = (acquire(&s, &o)?, acquire(&r, &o)?);
    if nonblocking {
        mpi::request::scope(|scope| {
            c.immediate_all_reduce_tensor(scope, &sg, &mut rg, ReduceOp::Sum)?
                .wait()
                .map(drop)
        })
    } else {
        c.all_reduce_tensor(&sg, &mut rg, ReduceOp::Sum)
    }
}

/// `Ok` when `got` is the mismatch whose difference contains `word`.
fn named(got: Result<(), Error>, word: &str) -> Result<(), String> {
    match got {
        Err(Error::CollectiveMismatch { difference, .. }) if difference.contains(word) => Ok(()),
        other => Err(format!(
            "expected CollectiveMismatch naming {word:?}, got {other:?}"
        )),
    }
}

/// The last rank calls the nonblocking form where the others call the blocking one.
fn form(w: &SimpleCommunicator, differs: bool) -> Result<(), String> {
    let c = w.duplicate();
    named(all_reduce_on(&c, differs), "nonblocking form")?;
    all_reduce_on(&c, false).map_err(|e| format!("the matching call after it: {e}"))
}

/// Eight members `float32 [16]`; member 3 is `float64 [16]` on the last rank.
fn member(w: &SimpleCommunicator, differs: bool) -> Result<(), String> {
    let c = w.duplicate();
    let f32s: Vec<Owned<f32>> = (0..8).map(|_| tensor(1.0f32, 16)).collect();
    let f64s = tensor(1.0f64, 16);
    let o = AcquireOptions::default();
    let list = |odd: bool| -> Result<(), Error> {
        let mut guards = Vec::new();
        for (i, t) in f32s.iter().enumerate() {
            guards.push(if odd && i == 3 {
                acquire(&f64s, &o)?
            } else {
                acquire(t, &o)?
            });
        }
        let mut refs: Vec<&mut dyn dlpack_mpi::dlpack::Tensor> = guards
            .iter_mut()
            .map(|g| g as &mut dyn dlpack_mpi::dlpack::Tensor)
            .collect();
        c.all_reduce_tensors_in_place(&mut refs, ReduceOp::Max)
    };
    named(list(differs), "member 3: ")?;
    list(false).map_err(|e| format!("the matching call after it: {e}"))
}

/// The last rank skips the second of four all-reduces of different sizes: the second is a
/// mismatch, the third names the ranks out of step, the fourth returns at once; after
/// `reset_out_of_step` an all-reduce is exact.
fn skipped(w: &SimpleCommunicator, differs: bool) -> Result<(), String> {
    let c = w.duplicate();
    let step = |n: usize| -> Result<(), Error> {
        let (s, r) = (tensor(1.0f32, n), tensor(0.0f32, n));
        let o = AcquireOptions::default();
        let (sg, mut rg) = (acquire(&s, &o)?, acquire(&r, &o)?);
        c.all_reduce_tensor(&sg, &mut rg, ReduceOp::Sum)
    };
    let sizes: Vec<usize> = [8, 16, 24, 32]
        .into_iter()
        .enumerate()
        .filter(|&(i, _)| !(differs && i == 1))
        .map(|(_, n)| n)
        .collect();
    let got: Vec<Result<(), Error>> = sizes.iter().map(|&n| step(n)).collect();
    got[0].clone().map_err(|e| format!("the first call: {e}"))?;
    if !matches!(got[1], Err(Error::CollectiveMismatch { .. })) {
        return Err(format!(
            "the second call: expected a mismatch, got {:?}",
            got[1]
        ));
    }
    for (i, g) in got.iter().enumerate().skip(2) {
        if !matches!(g, Err(Error::OutOfStep { .. })) {
            return Err(format!("call {}: expected OutOfStep, got {g:?}", i + 1));
        }
    }
    dlpack_mpi::comm::reset_out_of_step(&c);
    all_reduce_on(&c, false).map_err(|e| format!("after reset_out_of_step: {e}"))
}
