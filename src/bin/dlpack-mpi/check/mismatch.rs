//! The mismatch section of `check`: collectives whose arguments are valid on each rank but
//! do not match across ranks (MPI-4.1 §6.1), run on this MPI through the run's
//! `DeviceComm`, each of which must end in `Error::CollectiveMismatch` on every rank (the
//! agreement's fingerprint), with no rank left waiting, followed by a matching all-reduce
//! that must deliver exact values. Without the fingerprint each probe hangs the job, aborts
//! it or returns wrong data. Skipped at one rank (no peer can differ) and under
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
    let ok = failures.is_empty() && after;
    if root && (!ok || !quiet) {
        if ok {
            println!(
                "mismatched arguments (MPI-4.1 §6.1): {} probes at {} ranks, each ended in \
                 CollectiveMismatch on every rank, none waited; the next matching collective \
                 was exact",
                PROBES.len(),
                w.size()
            );
        } else {
            println!(
                "FAIL mismatched arguments: {} of {} probes did not end in CollectiveMismatch \
                 on every rank ({}){}",
                failures.len(),
                PROBES.len(),
                failures.join("; "),
                if after {
                    ""
                } else {
                    "; the matching all-reduce after them was wrong"
                }
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
