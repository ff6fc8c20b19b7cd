//! The MPI library check of the library itself (`dlpack_mpi::mpi_library::ensure_matching`):
//! a program that loaded another MPI release than the one it was built against is told by
//! its first dlpack-mpi operation, not run silently on it.
//!
//! The suite `library` of tests/mpi (main.rs), first of the suites, so that its first case
//! is the first operation of the process when every suite runs. Each case asks
//! `MpiLibrary::current().check()` what the operations must do and compares: where this
//! process loaded the library it was built against (every ordinary run) they run and are
//! exact; where it did not (scripts/wheel-mpi-test.sh runs the suite with LD_LIBRARY_PATH
//! pointing at Debian's library of the wheel's soname), an all-reduce, a spec and a fused
//! list each return `Error::MpiLibraryMismatch` (the fused one not wrapped in
//! `Error::Member`), and with the override (`set_allow_mpi_mismatch`, as
//! `DLPACK_MPI_ALLOW_MPI_MISMATCH=1`) they run. Rank 0 prints which of the two it saw
//! (`library: …`), which the script checks.

use crate::harness;
use dlpack_mpi::comm::TensorComm;
use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned, Tensor};
use dlpack_mpi::dtype::ReduceOp;
use dlpack_mpi::mpi_library::MpiLibrary;
use dlpack_mpi::settings::{allow_mpi_mismatch, set_allow_mpi_mismatch};
use dlpack_mpi::spec::SendSpec;
use dlpack_mpi::Error;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

type Outcome = Result<(), String>;

fn s(e: Error) -> String {
    e.to_string()
}

/// An f64 all-reduce (sum) of 8 elements: element i on rank r is r + i.
fn all_reduce(w: &SimpleCommunicator) -> Result<Result<(), Error>, String> {
    let (rank, size) = (f64::from(w.rank()), f64::from(w.size()));
    let send = Owned::new((0..8).map(|i| rank + f64::from(i)).collect::<Vec<_>>());
    let recv = Owned::new(vec![f64::NAN; 8]);
    let opts = AcquireOptions::default();
    let outcome = {
        let x = acquire(&send, &opts).map_err(s)?;
        let mut y = acquire(&recv, &opts).map_err(s)?;
        w.all_reduce_tensor(&x, &mut y, ReduceOp::Sum)
    };
    if outcome.is_ok() {
        let sum_r = size * (size - 1.0) / 2.0;
        let want: Vec<f64> = (0..8).map(|i| sum_r + size * f64::from(i)).collect();
        ensure_eq!(recv.into_vec(), want);
    }
    Ok(outcome)
}

/// A fused in-place all-reduce of two members.
fn fused(w: &SimpleCommunicator) -> Result<Result<(), Error>, String> {
    let (a, b) = (Owned::new(vec![1.0f32; 4]), Owned::new(vec![2i32; 3]));
    let opts = AcquireOptions::default();
    let outcome = {
        let mut list = [
            acquire(&a, &opts).map_err(s)?,
            acquire(&b, &opts).map_err(s)?,
        ];
        w.all_reduce_tensors_in_place(&mut list, ReduceOp::Sum)
    };
    if outcome.is_ok() {
        ensure_eq!(a.into_vec(), vec![w.size() as f32; 4]);
        ensure_eq!(b.into_vec(), vec![2 * w.size(); 3]);
    }
    Ok(outcome)
}

/// A send spec of a 2-element tensor (built, not sent).
fn spec() -> Result<Result<(), Error>, String> {
    let t = Owned::new(vec![1u8, 2]);
    let x = acquire(&t, &AcquireOptions::default()).map_err(s)?;
    let outcome = SendSpec::new(&x as &dyn Tensor).map(drop);
    Ok(outcome)
}

/// Without the override, every operation does what `MpiLibrary::check` says: runs (and is
/// exact) on the library it was built against, returns its mismatch on another.
fn first_operations_tell_the_library(w: &SimpleCommunicator) -> Outcome {
    let library = MpiLibrary::current();
    let expected = library.check();
    if allow_mpi_mismatch() == Ok(true) {
        // DLPACK_MPI_ALLOW_MPI_MISMATCH in the environment: the next case covers it.
        return Ok(());
    }
    for (what, got) in [
        ("all_reduce_tensor", all_reduce(w)?),
        ("SendSpec::new", spec()?),
        ("all_reduce_tensors_in_place", fused(w)?),
    ] {
        if got != expected {
            return Err(format!(
                "{what}: returned {got:?}, but the process loaded {:?} from {:?}, built \
                 against {:?}, whose check is {expected:?}",
                library.loaded, library.file, library.built
            ));
        }
    }
    if w.rank() == 0 {
        match &expected {
            Ok(()) => println!(
                "library: {} loaded, the one this build was compiled against: the operations ran",
                library.loaded
            ),
            Err(e) => println!("library: every operation refused: {e}"),
        }
    }
    Ok(())
}

/// With the override (the setter; `DLPACK_MPI_ALLOW_MPI_MISMATCH=1` alike) the operations
/// run, and are exact, whichever library the process loaded.
fn the_override_runs_them(w: &SimpleCommunicator) -> Outcome {
    let before = allow_mpi_mismatch().unwrap_or(false);
    set_allow_mpi_mismatch(true);
    let outcomes = (all_reduce(w), spec(), fused(w));
    set_allow_mpi_mismatch(before);
    let (reduced, specified, fused) = outcomes;
    ensure_eq!(reduced?, Ok(()));
    ensure_eq!(specified?, Ok(()));
    ensure_eq!(fused?, Ok(()));
    if w.rank() == 0 && MpiLibrary::current().check().is_err() {
        println!("library: with the override every operation ran, exact");
    }
    Ok(())
}

type Case = fn(&SimpleCommunicator) -> Outcome;

const CASES: &[(&str, Case)] = &[
    (
        "first_operations_tell_the_library",
        first_operations_tell_the_library,
    ),
    ("the_override_runs_them", the_override_runs_them),
];

pub fn run(w: &SimpleCommunicator, filter: &[String]) -> harness::End {
    if w.rank() == 0 {
        println!("running MPI library cases at {} rank(s)", w.size());
    }
    let (passed, failed) = harness::run_cases(w, CASES.iter().copied(), filter, |case| case(w));
    harness::report(w, passed, failed);
    harness::End::Ran { passed, failed }
}
