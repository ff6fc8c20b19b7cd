//! The multi-rank test suites in one binary (`harness = false`): a plain `main` that
//! initializes MPI once and runs the selected suites one after another, every case on every
//! rank (tests/mpi/harness.rs). `cargo test` runs every suite at 1 rank; scripts/test.sh runs
//! each suite under `mpirun` at the ranks docs/TESTING.md gives.
//!
//! ```text
//! cargo test --test mpi                                   # every suite, 1 rank
//! cargo test --test mpi -- --suite agreement              # one suite
//! mpirun -n 2 target/debug/deps/mpi-HASH --suite checked,faults
//! mpirun -n 3 target/debug/deps/mpi-HASH --suite mpi_cases c07 c27   # cases named *c07*, *c27*
//! target/debug/deps/mpi-HASH --list                       # the suites of this build
//! ```
//!
//! - `--suite NAME` (repeated, or `--suite A,B`): only these suites; they run in the order
//!   of [`SUITES`], whatever the order they are named in. Without it, every suite runs. A
//!   name this build does not have is refused (exit 2) before MPI starts.
//! - Every other argument that is not a flag filters the cases by name, as before: a case
//!   runs when its name contains one of them. Other flags are ignored.
//! - `--mismatch-cases`: prints the case names of the `mismatch` suite (scripts/test.sh
//!   runs each in a job of its own) and exits 0 without initializing MPI.
//! - `--list`: prints the names of the selected suites, one a line, and exits 0 without
//!   initializing MPI.
//!
//! Suites: `library` (first: the MPI library check of the first operations), `mpi_cases`, `immediate`, `nonblocking`, `fused`, `plans`, `exchanges`, `agreement`, `mismatch`, `adversarial`, `checked`,
//! `faults`, `device_cases`, `canaries`; with feature `cuda`, `gpu`; with feature `python`, `python_cases` and
//! `python_exchange` (last: the ML producers they import may start threads). Each prints
//! what its own binary printed before (rank 0: `running … at N rank(s)`, `test NAME ... ok`
//! per case, `test result: …`; `checked` and `faults` say at 1 rank that they are skipped).
//! After each suite, the process-wide settings a suite may change are put back as they were
//! before it, so each starts as it did in a process of its own: the packing policy
//! (`canaries` leaves its last one set), the agreement, and the environment
//! (`device_cases` sets and removes `DLPACK_MPI_DEVICE` and `DLPACK_MPI_CUDA_AWARE`). The
//! global allocator of `faults` (System, recording the largest allocation while one of its
//! cases arms it) is the binary's.
//!
//! The tests that need a process of their own stay binaries of their own: `threads`
//! (`MPI_THREAD_MULTIPLE`), `held_finalize` (what `MPI_Finalize` does), `mpi4py_interop`
//! (an MPMD job with an mpi4py rank), `large_transfer` (over 2 GiB per rank) and `leaks`
//! (resident memory of the process).
//!
//! Exit status: 0 when every case that ran passed; 1 when one failed; a skip's own status
//! before that (3: `gpu` without a usable GPU on some rank under `DLPACK_MPI_REQUIRE_GPU=1`);
//! 2 for a bad command line, or when a Python suite cannot set up its interpreter.

#[macro_use]
mod harness;
#[path = "../common/mod.rs"]
mod common;

mod adversarial;
mod agreement;
mod canaries;
mod checked;
mod device_cases;
mod exchanges;
mod faults;
mod fused;
#[cfg(feature = "cuda")]
mod gpu;
mod immediate;
mod library;
mod mismatch;
mod mpi_cases;
mod nonblocking;
mod plans;
#[cfg(feature = "python")]
mod python_cases;
#[cfg(feature = "python")]
mod python_exchange;

use std::ffi::OsString;

use dlpack_mpi::settings::{agreement, packing, set_agreement, set_packing, Agreement, Packing};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

/// A suite: runs its cases whose names pass the filters on every rank of the communicator.
type Suite = fn(&SimpleCommunicator, &[String]) -> harness::End;

/// Every suite of this build, in the order they run.
const SUITES: &[(&str, Suite)] = &[
    ("library", library::run),
    ("mpi_cases", mpi_cases::run),
    ("immediate", immediate::run),
    ("nonblocking", nonblocking::run),
    ("fused", fused::run),
    ("plans", plans::run),
    ("exchanges", exchanges::run),
    ("agreement", agreement::run),
    ("mismatch", mismatch::run),
    ("adversarial", adversarial::run),
    ("checked", checked::run),
    ("faults", faults::run),
    ("device_cases", device_cases::run),
    ("canaries", canaries::run),
    #[cfg(feature = "cuda")]
    ("gpu", gpu::run),
    #[cfg(feature = "python")]
    ("python_cases", python_cases::run),
    #[cfg(feature = "python")]
    ("python_exchange", python_exchange::run),
];

/// The suites a feature adds, for the message that refuses a name.
const FEATURE_SUITES: &[(&str, &str)] = &[
    ("gpu", "cuda"),
    ("python_cases", "python"),
    ("python_exchange", "python"),
];

/// The process-wide settings a suite may change, as they were before it.
struct Settings {
    packing: Option<Packing>,
    agreement: Option<Agreement>,
    env: Vec<(OsString, OsString)>,
}

impl Settings {
    fn now() -> Self {
        Settings {
            packing: packing().ok(),
            agreement: agreement().ok(),
            env: std::env::vars_os().collect(),
        }
    }

    /// Puts them back; an environment variable is written only where it differs.
    fn restore(&self) {
        if let Some(p) = self.packing {
            set_packing(p);
        }
        if let Some(a) = self.agreement {
            set_agreement(a);
        }
        for (name, _) in std::env::vars_os() {
            if !self.env.iter().any(|(n, _)| *n == name) {
                std::env::remove_var(&name);
            }
        }
        for (name, value) in &self.env {
            if std::env::var_os(name).as_ref() != Some(value) {
                std::env::set_var(name, value);
            }
        }
    }
}

/// The suites `names` selects (every suite when it is empty), in the order of [`SUITES`].
fn chosen(names: &[String]) -> Result<Vec<(&'static str, Suite)>, String> {
    for name in names {
        if SUITES.iter().any(|(n, _)| n == name) {
            continue;
        }
        let all: Vec<&str> = SUITES.iter().map(|(n, _)| *n).collect();
        let why = match FEATURE_SUITES.iter().find(|(n, _)| n == name) {
            Some((_, feature)) => {
                format!("this build has no suite {name} (it needs feature {feature})")
            }
            None => format!("no suite named {name}"),
        };
        return Err(format!("{why}; suites: {}", all.join(", ")));
    }
    Ok(SUITES
        .iter()
        .filter(|(n, _)| names.is_empty() || names.iter().any(|s| s == n))
        .copied()
        .collect())
}

fn main() {
    let sel = harness::selection().and_then(|sel| chosen(&sel.suites).map(|s| (sel, s)));
    let (sel, suites) = sel.unwrap_or_else(|e| {
        eprintln!("mpi: {e}");
        std::process::exit(2);
    });
    if sel.list {
        for (name, _) in &suites {
            println!("{name}");
        }
        return;
    }
    if std::env::args().any(|a| a == "--mismatch-cases") {
        // scripts/test.sh runs each mismatch case in its own job.
        mismatch::names().for_each(|name| println!("{name}"));
        return;
    }
    let universe = mpi::initialize().expect("MPI initializes once");
    let w = universe.world();
    let (mut passed, mut failed, mut status) = (0, 0, 0);
    let mut skipped = Vec::new();
    for &(name, run) in &suites {
        let before = Settings::now();
        match run(&w, &sel.filters) {
            harness::End::Ran {
                passed: p,
                failed: f,
            } => (passed, failed) = (passed + p, failed + f),
            harness::End::Skipped { status: s } => {
                skipped.push(name);
                if status == 0 {
                    status = s;
                }
            }
        }
        before.restore();
    }
    if suites.len() > 1 && w.rank() == 0 {
        let skipped = if skipped.is_empty() {
            "none".to_string()
        } else {
            skipped.join(", ")
        };
        println!(
            "\nmpi: {} suites at {} rank(s): {passed} cases passed, {failed} failed; skipped: {skipped}",
            suites.len(),
            w.size(),
        );
    }
    drop(universe);
    if status != 0 {
        std::process::exit(status);
    }
    if failed > 0 {
        std::process::exit(1);
    }
}
