//! What rank 0 shows and writes: the header, a line per case, the closing counts, and the
//! JSON and JUnit reports.

use std::io::Write;

use dlpack_mpi::transport::Route;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use super::args::{CheckArgs, Producer};
use super::context::{Verdict, SATURATING_SUM_BUG};
use super::matrix::Comm;
use super::producers::send_producer;
use super::select::Case;
use super::store::numpy_version;
use crate::launch::{Dev, Gpu};

/// The MPI library's version string (`-v`, reports); the header shows its first line up to
/// the first comma.
pub(super) fn library_name() -> String {
    mpi::environment::library_version()
        .unwrap_or_default()
        .trim_end_matches(['\0', '\n'])
        .trim()
        .to_string()
}

/// Who made the tensors, for the header (every rank checks NumPy; one that cannot import it
/// aborts the run).
pub(super) fn producer_line(w: &SimpleCommunicator, made_by: Producer) -> String {
    match made_by {
        Producer::Numpy => match numpy_version() {
            Ok(v) => format!("NumPy {v} arrays"),
            Err(why) => {
                eprintln!("dlpack-mpi check: rank {}: {why}", w.rank());
                w.abort(2)
            }
        },
        Producer::Rust => "Rust-made tensors".to_string(),
        Producer::Jax => "JAX arrays (receive buffers: NumPy, Paddle or Rust)".to_string(),
        Producer::Paddle => "Paddle tensors".to_string(),
        Producer::Auto => {
            "tensors from the first installed producer of each dtype (NumPy, JAX, Paddle; Rust \
             for the rest)"
                .to_string()
        }
    }
}

/// `--list`: the case names, one a line (rank 0).
pub(super) fn list(cases: &[Case<'_>]) {
    // A closed pipe (`--list | head`) ends the listing quietly.
    let mut out = std::io::stdout().lock();
    for c in cases {
        if writeln!(out, "{}", c.name()).is_err() {
            break;
        }
    }
}

/// The header line (and with `-v` the MPI library's version) before the cases (rank 0).
pub(super) fn header(
    w: &SimpleCommunicator,
    args: &CheckArgs,
    cases: &[Case<'_>],
    (dc, gpu): (&Comm<'_>, Option<Gpu>),
    producer_line: &str,
    library: &str,
) {
    let mut devices: Vec<&str> = Vec::new();
    for c in cases {
        if !devices.contains(&c.dev.name()) {
            devices.push(c.dev.name());
        }
    }
    let gpu = match gpu {
        Some(g) if cases.iter().any(|c| c.dev.needs_runtime()) => format!(
            " (GPU runtime: {}; rank 0 on {}; CUDA tensors {})",
            g.runtime.describe(),
            g.selection,
            if dc.is_direct() {
                "direct to a CUDA-aware MPI"
            } else {
                "staged through pinned host buffers"
            }
        ),
        _ => String::new(),
    };
    println!(
        "dlpack-mpi check: {} case{} at {} rank(s), device {}{gpu}, {producer_line}, {}",
        cases.len(),
        if cases.len() == 1 { "" } else { "s" },
        w.size(),
        devices.join(", "),
        library
            .lines()
            .next()
            .and_then(|l| l.split(',').next())
            .unwrap_or("")
    );
    if args.verbose {
        println!("MPI library: {library}");
    }
}

/// The counts and records of the cases run so far (rank 0).
#[derive(Default)]
pub(super) struct Tally {
    /// Rank 0's CUDA device ordinal, shown in `cuda` case lines (`[cuda:0 staged]`).
    ordinal: i32,
    passed: u32,
    failed: u32,
    skipped: u32,
    known: u32,
    records: Vec<Record>,
}

impl Tally {
    /// No case yet; `cuda` case lines name device `ordinal` (this rank's, 0 without a GPU).
    pub(super) fn new(ordinal: i32) -> Tally {
        Tally {
            ordinal,
            ..Tally::default()
        }
    }

    /// Counts and records the agreed verdict `v` of `case`, and returns the line to print,
    /// if any, and whether `-x` stops the run here.
    pub(super) fn add(
        &mut self,
        args: &CheckArgs,
        case: &Case<'_>,
        route: Option<Route>,
        v: Verdict,
        seconds: f64,
    ) -> (Option<String>, bool) {
        // Who made the case's (send) tensors: `cpu` cases by the run's producer, others by
        // Rust (`Owned`, cudarc).
        let producer = match case.dev {
            Dev::Cpu => send_producer(case.kind.dtype()),
            _ => Producer::Rust,
        };
        let name = match case.dev {
            // Host memory: the name says it all (`cpu/host`).
            Dev::Cpu => case.name(),
            dev => format!(
                "{} [{} {}]",
                case.name(),
                dev.short(self.ordinal),
                route.map_or_else(|| case.transport.to_string(), |r| r.to_string())
            ),
        };
        // Every `cpu` line names its producer (other devices' lines name their route), then
        // with -v the time.
        let mut took = match case.dev {
            Dev::Cpu => format!(" [{}]", producer.name()),
            _ => String::new(),
        };
        if args.verbose {
            took.push_str(&format!(" [{:.2} ms]", seconds * 1e3));
        }
        let mut stop = false;
        let (status, message, line) = match v {
            Verdict::Pass => {
                self.passed += 1;
                let line = (!args.quiet).then(|| format!("PASS {name}{took}"));
                ("pass", None, line)
            }
            Verdict::Skip(why) => {
                self.skipped += 1;
                let line = (!args.quiet).then(|| format!("SKIP {name} ({why}){took}"));
                ("skip", Some(why), line)
            }
            Verdict::KnownBug(why) => {
                self.known += 1;
                let why = format!("{why}; {SATURATING_SUM_BUG}");
                let line = Some(format!("KNOWN-BUG {name}: {why}{took}"));
                ("known-bug", Some(why), line)
            }
            Verdict::Fail(why) => {
                self.failed += 1;
                stop = args.failfast;
                let line = Some(format!("FAIL {name}: {why}{took}"));
                ("fail", Some(why), line)
            }
        };
        self.records.push(Record {
            name: case.name(),
            op: case.op.name(),
            dtype: case.kind.name(),
            layout: case.layout.name(),
            device: case.dev.name(),
            producer: producer.name(),
            transport: case.transport,
            route: route.map(|r| r.to_string()),
            len: case.len,
            status,
            message,
            seconds,
        });
        (line, stop)
    }

    /// Whether a case failed.
    pub(super) fn any_failed(&self) -> bool {
        self.failed > 0
    }

    /// The closing lines and the reports of `--junit` and `--json` (rank 0), after `seconds`.
    ///
    /// # Errors
    /// A report that cannot be written, in words.
    pub(super) fn finish(
        &self,
        w: &SimpleCommunicator,
        args: &CheckArgs,
        library: String,
        seconds: f64,
    ) -> Result<(), String> {
        let (passed, failed, skipped, known) = (self.passed, self.failed, self.skipped, self.known);
        if known > 0 {
            println!(
                "{known} case{} hit known MPI-library bugs (KNOWN-BUG lines above; counted as neither \
                 passed, failed nor skipped): the library \
                 computed a wrong result; see the workaround given there",
                if known == 1 { "" } else { "s" }
            );
        }
        println!("{passed} passed, {failed} failed, {skipped} skipped");
        if let Some(path) = &args.junit {
            write_junit(path, &self.records, seconds)?;
        }
        if let Some(path) = &args.json {
            let report = Report {
                tool: format!("dlpack-mpi {}", env!("CARGO_PKG_VERSION")),
                mpi_library: library,
                ranks: w.size(),
                passed,
                failed,
                skipped,
                known_bugs: known,
                cases: &self.records,
            };
            write_json(path, &report)?;
        }
        Ok(())
    }
}

/// One finished case, as the JSON and JUnit reports hold it.
#[derive(Debug, serde::Serialize)]
pub(super) struct Record {
    name: String,
    op: &'static str,
    dtype: &'static str,
    layout: &'static str,
    device: &'static str,
    /// Who made the send tensors: `numpy`, `jax`, `paddle` or `rust`.
    producer: &'static str,
    /// The transport part of the name: `host`, `managed`, `direct` or `staged`.
    transport: &'static str,
    /// The route the tensors took (`host`, `managed`, `direct`, `staged`; rank 0's, the
    /// most telling of the case's operations); absent when no operation ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    route: Option<String>,
    /// Logical elements per tensor.
    len: i64,
    /// `pass`, `fail`, `skip` or `known-bug`.
    status: &'static str,
    /// Why it failed, was skipped or hit a known bug.
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    /// Wall time of the case on rank 0, including the agreement of the verdicts.
    seconds: f64,
}

/// The JSON report.
#[derive(Debug, serde::Serialize)]
struct Report<'r> {
    tool: String,
    mpi_library: String,
    ranks: i32,
    passed: u32,
    failed: u32,
    skipped: u32,
    known_bugs: u32,
    cases: &'r [Record],
}

fn write_junit(path: &std::path::Path, records: &[Record], seconds: f64) -> Result<(), String> {
    use quick_junit::{NonSuccessKind, TestCase, TestCaseStatus, TestSuite};
    let mut suite = TestSuite::new("dlpack-mpi check");
    for r in records {
        let mut status = match r.status {
            "pass" => TestCaseStatus::success(),
            "fail" => TestCaseStatus::non_success(NonSuccessKind::Failure),
            // A known MPI-library bug: a wrong result the runner recognised; reported with
            // its own type so that CI shows it without failing the run.
            _ => TestCaseStatus::skipped(),
        };
        if let Some(m) = &r.message {
            status.set_message(m.as_str());
        }
        if r.status == "known-bug" {
            status.set_type("known-mpi-library-bug");
        }
        let mut case = TestCase::new(r.name.as_str(), status);
        case.set_classname(format!("dlpack-mpi.check.{}", r.op));
        case.set_time(std::time::Duration::from_secs_f64(r.seconds));
        suite.add_test_case(case);
    }
    suite.set_time(std::time::Duration::from_secs_f64(seconds));
    let mut report = quick_junit::Report::new("dlpack-mpi");
    report.add_test_suite(suite);
    let file = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    report
        .serialize(std::io::BufWriter::new(file))
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn write_json(path: &std::path::Path, report: &Report<'_>) -> Result<(), String> {
    let file = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    serde_json::to_writer_pretty(&mut out, report)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    writeln!(out).map_err(|e| format!("{}: {e}", path.display()))
}
