//! `dlpack-mpi check`: every operation × every transferable dtype × several lengths.
//!
//! Each case makes its tensors through the public producer path (`Owned` exporter →
//! `acquire`, NumPy's `__dlpack__`, or cudarc device memory through `CudaExport`), runs one
//! operation through `DeviceComm` (which routes each tensor: host memory straight to
//! `TensorComm`, CUDA memory direct or staged through pinned buffers), and compares what arrived with the
//! values computed here independently of MPI (closed forms over rank and index, reductions
//! folded in the element type's own arithmetic, from inputs whose sums are exact in any
//! order at any rank count). Verdicts are combined across ranks; rank 0
//! prints each failure as it happens (every case with `-v`: `PASS`/`FAIL`/`SKIP`/`N/A`/
//! `NOT-CHECKABLE`/`KNOWN-BUG` with the reason), then a line per operation, the operation ×
//! dtype matrix and the known MPI-library bugs, and closes with
//! `N passed, N failed, N skipped, N not applicable` (and `, N not checkable` when a case
//! was). A failure names the first differing index, the expected and arrived values, and
//! the rank that saw it. Not applicable: a combination MPI or DLPack rules out (a
//! reduction on a transfer-only dtype), which is not a skip. Not checkable: a float sum over
//! more ranks than exact inputs in that few elements can carry (`exact`).
//!
//! # Files
//!
//! Each file uses only the files listed before it (and `crate::common`, which `bench` and
//! `info` share, and `crate::launch`), so there is no cycle:
//!
//! 1. `args`: the command line ([`CheckArgs`], [`Producer`], `--transport`, `--device` and
//!    `--offset` values); `placement`: where each rank's tensors of a case live (`--device`)
//!    and at which offset (`--offset`), and the guarded buffer of an offset tensor.
//! 2. `matrix`: operations ([`matrix::Op`]), layouts, case names.
//! 3. `context`: the run's and the case's context, passed explicitly; verdicts;
//!    `nonblocking`: how a case calls its operation (blocking, or posted in an rsmpi scope
//!    and completed by `wait` or a `test` loop); `exact`: the inputs of the float sums,
//!    exact in any order at any rank count, and when they cannot carry every rank's data.
//! 4. `store`: tensor storage by producer (`Owned`, NumPy, JAX, Paddle, cudarc);
//!    `producers`: which producer makes each dtype (`--producer auto`), JAX/Paddle tensors.
//! 5. `kind`: one dtype's reference values, tensors and comparisons; the `Runner` trait.
//! 6. `cases`: the case body of each operation.
//! 7. `dtypes`: the table of dtypes; `fused`: the case of the fused collectives over lists
//!    of tensors (`cases` calls it; its mixed lists take float32 and int32 from `dtypes`);
//!    `plans`: the case of their plans, built once and run step after step, the members
//!    written and checked between steps (the same lists as `fused`'s).
//! 8. `select`: which cases run (`--op`…, `-k`/`-e`), agreed by every rank.
//! 9. `setup`: devices, GPU runtime and each rank's GPU, and communicator, agreed by every
//!    rank; `mismatch`: the probes of mismatched arguments across ranks (the agreement's
//!    fingerprint, MPI-4.1 §6.1).
//! 10. `summary`: the verdict people read: a line per operation, the operation × dtype
//!     matrix, skips by reason, known MPI-library bugs by matrix cell.
//! 11. `report`: header, lines, closing counts, JSON and JUnit reports.
//! 12. `watchdog`: `--timeout`, a thread per rank that knows where the rank is and ends a
//!     run that overruns, with the report of the cases before.
//! 13. `run`: running the cases, verdicts combined across ranks.
//! 14. this file: [`run`], the entry point.

// `check` needs no `unsafe` (main.rs denies it crate-wide; only bench's GPU baseline allows it).
#![forbid(unsafe_code)]

mod args;
mod cases;
mod context;
mod dtypes;
mod exact;
mod fused;
mod kind;
mod matrix;
mod mismatch;
mod nonblocking;
mod placement;
mod plans;
mod producers;
mod report;
mod run;
mod select;
mod setup;
mod store;
mod summary;
mod watchdog;

use std::process::ExitCode;

use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

pub use args::CheckArgs;
// The type of `CheckArgs::producer`, named by main.rs's tests.
#[cfg(test)]
pub use args::{DeviceChoice, OffsetArg, Producer};
use context::RunContext;
use report::Tally;
use watchdog::{Reports, Stage, Watch};

/// Runs the check matrix. Exit status: 0 when no case failed, 1 when one did, 2 when the
/// options were refused (one line on standard error) or a report could not be written (a
/// `--json`/`--junit` path is tried before the first case), 3
/// (`report::TIMED_OUT_STATUS`) when a case ran past `--timeout` (the watchdog ends the
/// process).
pub fn run(w: &SimpleCommunicator, args: &CheckArgs) -> ExitCode {
    let refuse = |why: &str| {
        if w.rank() == 0 {
            eprintln!("dlpack-mpi check: {why}");
        }
        ExitCode::from(2)
    };
    // First: a report that cannot be written is found now, not after the run (`--list`
    // writes none).
    let reports = [
        ("--json", args.json.as_deref()),
        ("--junit", args.junit.as_deref()),
    ];
    if !args.list {
        if let Err(why) = crate::common::try_reports(w, &reports) {
            return refuse(&why);
        }
    }
    let kinds = dtypes::kinds();
    let setup = match setup::setup(w, args) {
        Ok(s) => s,
        Err(why) => return refuse(&why),
    };
    let dc = &setup.dc;
    let Some((made_by, indices)) = select::agree_on_cases(w, &kinds, args, &setup.placements)
    else {
        return ExitCode::from(2);
    };
    let run = RunContext::new(setup.gpu, made_by);
    let producer_line = report::producer_line(w, made_by);
    let cases = run::cases(&kinds, &indices, &setup.placements);
    let root = w.rank() == 0;
    if args.list {
        if root {
            report::list(&cases);
        }
        return ExitCode::SUCCESS;
    }
    // Whole in the reports and under -vv; the header shows its first line up to the first comma.
    let library = crate::common::library_version();
    if root && !args.quiet {
        let gpu = (dc, setup.gpu);
        report::header(w, args, &cases, gpu, &producer_line, &library);
    }
    let faults = match run::Faults::new(args, w.size()) {
        Ok(f) => f,
        Err(why) => return refuse(&why),
    };
    let started = std::time::Instant::now();
    let reports = Reports {
        args: args.clone(),
        library: library.clone(),
        started,
        cases: cases.len(),
    };
    let watch = Watch::start(w, Tally::new(run.ordinal, &cases), reports);
    watch.enter(Stage::Probes);
    faults.hang_in(report::PROBES, w.rank());
    let probed = mismatch::run(w, dc, args.quiet);
    watch.leave();
    run::run_cases(w, args, (&run, dc), &cases, (&faults, &watch));
    let mut tally = watch.finish();
    let mut status = i32::from(tally.any_failed() || !probed);
    if root {
        let seconds = started.elapsed().as_secs_f64();
        if let Err(why) = tally.finish((w.size(), args), library, seconds, None) {
            eprintln!("dlpack-mpi check: cannot write the report: {why}");
            status = 2;
        }
    }
    crate::common::agreed_exit(w, status)
}

/// After [`run`], before `MPI_Finalize`: the finalize may take `--timeout`, at least
/// [`crate::launch::FINALIZE_FLOOR`] (no limit at `--timeout 0`;
/// [`crate::launch::guard_finalize`]: exit status 3 and a line naming it after that), and
/// `--inject-hang finalize[:RANK]` makes that rank hang here for ever, before its
/// finalize, which the others' finalize waits for.
pub fn before_finalize(
    w: &SimpleCommunicator,
    args: &CheckArgs,
) -> Option<crate::launch::FinalizeGuard> {
    let guard = (args.timeout > 0.0 && args.timeout.is_finite()).then(|| {
        let limit = std::time::Duration::from_secs_f64(args.timeout);
        crate::launch::guard_finalize(w.rank(), limit.max(crate::launch::FINALIZE_FLOOR))
    });
    if let Ok(faults) = run::Faults::new(args, w.size()) {
        faults.hang_in(report::FINALIZE, w.rank());
    }
    guard
}
