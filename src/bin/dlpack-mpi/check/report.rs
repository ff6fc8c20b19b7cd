//! What rank 0 shows and writes: the header, a line per case, the closing counts, and the
//! JSON and JUnit reports; also after a `--timeout` ([`TimedOut`]), with the cases before it.

use std::io::Write;

use dlpack_mpi::transport::Route;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use super::args::{CheckArgs, Producer};
use super::context::{Verdict, SATURATING_SUM_BUG};
use super::matrix::{Comm, Op};
use super::placement::Placement;
use super::producers::{maker, run_producer, send_producer};
use super::select::Case;
use super::store::numpy_version;
use super::summary::{Counts, Outcome, Summary, STAND_IN};
use crate::launch::{Dev, Gpu};

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
    let mut devices: Vec<String> = Vec::new();
    for c in cases {
        if !devices.contains(&c.place.name()) {
            devices.push(c.place.name());
        }
    }
    let gpu = match gpu {
        Some(g) if cases.iter().any(|c| c.place.needs_runtime()) => format!(
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
    let halves = if cases
        .iter()
        .any(|c| matches!(c.kind.name(), "float16" | "bfloat16"))
    {
        half_reductions()
    } else {
        String::new()
    };
    println!(
        "dlpack-mpi check: {} case{} at {} rank(s), device {}{gpu}, {producer_line}{halves}, {}",
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
    if args.verbose >= 2 {
        println!("MPI library: {library}");
    }
}

/// How float16 and bfloat16 reduce, for the header: said only where this MPI has its own
/// half datatypes (MPICH ≥ 5), since elsewhere every setting means dlpack-mpi's operations;
/// which form each operation takes and why (the setting, or the rounding probe's verdict:
/// [`crate::common::half_reductions`]).
fn half_reductions() -> String {
    if !dlpack_mpi::comm::halfops::native_available() {
        return String::new();
    }
    match crate::common::half_reductions(false) {
        Ok(words) => format!(", half reductions: {words}"),
        Err(e) => format!(", half reductions: unknown: {e}"),
    }
}

/// The exit status of a run that a case ended by running past `--timeout` (0: every case
/// passed, 1: a case failed, 2: options refused or a report not written).
pub(super) const TIMED_OUT_STATUS: u8 = 3;

/// The counts and records of the cases run so far (rank 0).
pub(super) struct Tally {
    /// Rank 0's CUDA device ordinal, shown in `cuda` case lines (`[cuda:0 staged]`).
    ordinal: i32,
    counts: Counts,
    summary: Summary,
    records: Vec<Record>,
    /// The record of the case being run ([`Tally::begin`]), for a `--timeout` report.
    pending: Option<Record>,
}

/// A case (or the mismatch probes) that ran past `--timeout`, as rank 0 reports it.
#[derive(Debug, serde::Serialize)]
pub(super) struct TimedOut {
    /// The case's name, or [`PROBES`].
    pub case: String,
    /// Its place among the run's cases, from 1 (absent: the mismatch probes, before them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub number: Option<usize>,
    /// How many cases the run had.
    pub cases: usize,
    /// `--timeout`.
    pub limit_seconds: f64,
    /// How long rank 0 had been in it.
    pub elapsed_seconds: f64,
    /// The ranks that had not left it.
    pub ranks_inside: Vec<i32>,
    /// Where each rank was, in words (`ranks 0, 1 (running it)`).
    pub message: String,
}

/// The name of the mismatch probes' stage in `--timeout` reports.
pub(super) const PROBES: &str = "the mismatched-argument probes";

/// The name `--inject-hang` matches for `MPI_Finalize` (the pattern `finalize`).
pub(super) const FINALIZE: &str = "finalize";

/// `3.0 s`, or `0.012 s` under a second.
pub(super) fn seconds_text(s: f64) -> String {
    if s < 1.0 {
        format!("{s:.3} s")
    } else {
        format!("{s:.1} s")
    }
}

/// `rank 1` or `ranks 0, 1`.
pub(super) fn ranks_text(ranks: &[i32]) -> String {
    let list: Vec<String> = ranks.iter().map(i32::to_string).collect();
    match list.len() {
        1 => format!("rank {}", list[0]),
        _ => format!("ranks {}", list.join(", ")),
    }
}

impl TimedOut {
    /// The first line: `TIMEOUT name: still running after … s (--timeout …); where`.
    pub(super) fn line(&self) -> String {
        format!(
            "TIMEOUT {}: not done after {} (--timeout {}); {}",
            self.case,
            seconds_text(self.elapsed_seconds),
            self.limit_seconds,
            self.message
        )
    }

    /// The last line, after the counts of the cases before it.
    pub(super) fn closing(&self) -> String {
        let (place, before) = match self.number {
            Some(n) => (format!("case {n} of {}, {}", self.cases, self.case), n - 1),
            None => (format!("{}, before the first case", self.case), 0),
        };
        let not_run = self.cases - before - usize::from(self.number.is_some());
        format!(
            "TIMEOUT: the run stopped in {place} ({} still inside after {}); the counts \
             above are the {before} case{} before it; {not_run} case{} not run; exit status \
             {TIMED_OUT_STATUS}",
            ranks_text(&self.ranks_inside),
            seconds_text(self.elapsed_seconds),
            if before == 1 { "" } else { "s" },
            if not_run == 1 { "" } else { "s" },
        )
    }
}

impl Tally {
    /// No case yet of `cases`; `cuda` case lines name device `ordinal` (this rank's, 0
    /// without a GPU).
    pub(super) fn new(ordinal: i32, cases: &[Case<'_>]) -> Tally {
        let mut ops: Vec<Op> = Vec::new();
        let mut dtypes: Vec<&'static str> = Vec::new();
        for c in cases {
            if !ops.contains(&c.op) {
                ops.push(c.op);
            }
            if !dtypes.contains(&c.kind.name()) {
                dtypes.push(c.kind.name());
            }
        }
        ops.sort_by_key(|o| Op::ALL.iter().position(|x| x == o));
        Tally {
            ordinal,
            counts: Counts::default(),
            summary: Summary::new(ops, dtypes),
            records: Vec::new(),
            pending: None,
        }
    }

    /// `case` begins: its record stands ready for a `--timeout` report.
    pub(super) fn begin(&mut self, case: &Case<'_>) {
        let producer = case_producer(case);
        let record = Record::new(case, producer, None, Outcome::Fail, None, 0.0);
        self.pending = Some(Record {
            status: "timeout",
            ..record
        });
    }

    /// The name of the case being run (begun and not yet added).
    pub(super) fn current(&self) -> Option<&str> {
        self.pending.as_ref().map(|r| r.name.as_str())
    }

    /// Counts and records the agreed verdict `v` of `case`, and returns the line to print,
    /// if any, and whether `-x` stops the run here. Every case has a line with `-v`; without
    /// it only failures do (the rest is summed up at the end).
    pub(super) fn add(
        &mut self,
        args: &CheckArgs,
        case: &Case<'_>,
        route: Option<Route>,
        v: Verdict,
        seconds: f64,
    ) -> (Option<String>, bool) {
        let producer = case_producer(case);
        let name = self.display_name(case, route);
        // Every line with `cpu` tensors on rank 0 names its producer (other devices' lines
        // name their route), then with -vv the time.
        let (send0, recv0) = case.place.on_rank(0);
        let mut took = match (send0, recv0) {
            (Dev::Cpu, _) | (_, Dev::Cpu) => format!(" [{}]", producer.name()),
            _ => String::new(),
        };
        if args.verbose >= 2 {
            took.push_str(&format!(" [{:.2} ms]", seconds * 1e3));
        }
        self.pending = None;
        let cell = format!("{}/{}", case.op.name(), case.kind.name());
        let (outcome, message, line) = match v {
            Verdict::Pass => (Outcome::Pass, None, format!("PASS {name}{took}")),
            Verdict::NotApplicable(why) => {
                let line = format!("N/A {name} ({why}){took}");
                (Outcome::NotApplicable, Some(why), line)
            }
            Verdict::NotCheckable(why) => {
                self.summary.not_checkable(&why, cell, &case.name());
                let line = format!("NOT-CHECKABLE {name} ({why}){took}");
                (Outcome::NotCheckable, Some(why), line)
            }
            Verdict::Skip(why) => {
                self.summary.skip(&why, cell, &case.name());
                let line = format!("SKIP {name} ({why}){took}");
                (Outcome::Skip, Some(why), line)
            }
            Verdict::KnownBug(saw) => {
                self.summary
                    .known_bug(SATURATING_SUM_BUG, cell, &case.name(), &saw);
                let why = format!("{saw}; {SATURATING_SUM_BUG}");
                let line = format!("KNOWN-BUG {name}: {why}{took}");
                (Outcome::KnownBug, Some(why), line)
            }
            Verdict::Fail(why) => {
                let line = format!("FAIL {name}: {why}{took}");
                (Outcome::Fail, Some(why), line)
            }
        };
        self.counts.add(outcome);
        // Rust standing in for the Python producers, none of which makes the dtype.
        let stand_in = send0 == Dev::Cpu
            && run_producer() == Producer::Auto
            && send_producer(case.kind.dtype()) == Producer::Rust;
        let label = if stand_in { STAND_IN } else { producer.name() };
        self.summary.add(case.op, case.kind.name(), label, outcome);
        self.records.push(Record::new(
            case, producer, route, outcome, message, seconds,
        ));
        let shown = args.verbose >= 1 || outcome == Outcome::Fail;
        (
            shown.then_some(line),
            args.failfast && outcome == Outcome::Fail,
        )
    }

    /// The case's name in its line: `cpu` cases by name, other placements' with rank 0's
    /// memories (send then receive when they differ) and the route taken (`[cuda:0 staged]`,
    /// `[cpu:0->cuda:0 staged]`).
    fn display_name(&self, case: &Case<'_>, route: Option<Route>) -> String {
        if case.place == Placement::Same(Dev::Cpu) {
            // Host memory: the name says it all (`cpu/host`).
            return case.name();
        }
        let (send, recv) = case.place.on_rank(0);
        let on = match send == recv {
            true => send.short(self.ordinal),
            false => format!("{}->{}", send.short(self.ordinal), recv.short(self.ordinal)),
        };
        format!(
            "{} [{on} {}]",
            case.name(),
            route.map_or_else(|| case.transport.clone(), |r| r.to_string())
        )
    }

    /// Whether a case failed.
    pub(super) fn any_failed(&self) -> bool {
        self.counts.failed > 0
    }

    /// The verdict (without `-q`: a line per operation, the matrix, the skips by reason;
    /// always: the known MPI-library bugs), the closing lines, and the reports of `--junit`
    /// and `--json` (rank 0, run of `ranks`), after `seconds`. After a `--timeout`, the
    /// `TIMEOUT` line first and last, and the reports hold the case that timed out.
    ///
    /// # Errors
    /// A report that cannot be written, in words.
    pub(super) fn finish(
        &mut self,
        (ranks, args): (i32, &CheckArgs),
        library: String,
        seconds: f64,
        timeout: Option<&TimedOut>,
    ) -> Result<(), String> {
        let lines = self.closing_lines(args, timeout);
        {
            // A closed pipe (`check | head`) ends the output quietly.
            let mut out = std::io::stdout().lock();
            for l in &lines {
                if writeln!(out, "{l}").is_err() {
                    break;
                }
            }
            let _ = out.flush();
        }
        if let Some(t) = timeout {
            if let Some(mut r) = self.pending.take() {
                r.message = Some(t.message.clone());
                r.seconds = t.elapsed_seconds;
                self.records.push(r);
            }
        }
        if let Some(path) = &args.junit {
            write_junit(path, &self.records, seconds)?;
        }
        if let Some(path) = &args.json {
            let c = self.counts;
            let report = Report {
                tool: format!("dlpack-mpi {}", env!("CARGO_PKG_VERSION")),
                mpi_library: library,
                ranks,
                passed: c.passed,
                failed: c.failed,
                skipped: c.skipped,
                known_bugs: c.known,
                not_applicable: c.not_applicable,
                not_checkable: c.not_checkable,
                timed_out: timeout,
                cases: &self.records,
            };
            crate::common::write_json(path, &report)?;
        }
        Ok(())
    }

    /// The lines [`Tally::finish`] prints.
    fn closing_lines(&self, args: &CheckArgs, timeout: Option<&TimedOut>) -> Vec<String> {
        let c = self.counts;
        let mut lines: Vec<String> = timeout.iter().map(|t| t.line()).collect();
        // No summary of no case (a `--timeout` in the mismatch probes).
        if !args.quiet && !self.records.is_empty() {
            lines.push(String::new());
            lines.extend(self.summary.per_operation());
            lines.push(String::new());
            lines.extend(self.summary.matrix());
            lines.extend(self.summary.skip_reasons());
        }
        lines.extend(self.summary.known_bugs());
        if c.known > 0 {
            lines.push(format!(
                "{} case{} hit known MPI-library bugs (KNOWN-BUG lines above; counted as neither \
                 passed, failed nor skipped): the library \
                 computed a wrong result; see the workaround given there",
                c.known,
                if c.known == 1 { "" } else { "s" }
            ));
        }
        // The closing line: scripts and tests read its first three counts.
        let mut closing = format!(
            "{} passed, {} failed, {} skipped, {} not applicable",
            c.passed, c.failed, c.skipped, c.not_applicable
        );
        if c.not_checkable > 0 {
            closing.push_str(&format!(", {} not checkable", c.not_checkable));
        }
        lines.push(closing);
        lines.extend(timeout.map(TimedOut::closing));
        lines
    }
}

/// Who made `case`'s send tensors on rank 0: on `cpu` the run's producer where it makes
/// them (`maker`: not Paddle's negative-stride views unless pinned, not JAX's or Paddle's
/// offset tensors, NumPy's in the shifted-pointer form only), else Rust (`Owned`, cudarc).
fn case_producer(case: &Case<'_>) -> Producer {
    let dev = case.place.on_rank(0).0;
    maker(
        run_producer(),
        case.kind.dtype(),
        (false, dev),
        case.layout,
        case.offset,
    )
}

/// One finished case, as the JSON and JUnit reports hold it.
#[derive(Debug, serde::Serialize)]
pub(super) struct Record {
    name: String,
    op: &'static str,
    dtype: &'static str,
    layout: &'static str,
    /// The device part of the name: `cpu`, `cpu:cuda` (send and receive memories),
    /// `even-cpu+odd-cuda` (`--device mpich-all`).
    device: String,
    /// Who made the send tensors: `numpy`, `jax`, `paddle` or `rust`.
    producer: &'static str,
    /// The transport part of the name: `host`, `managed`, `direct` or `staged`, or several
    /// joined by `+` (`host+staged`).
    transport: String,
    /// The offset part of the name (`off3b`, `off3p`); absent without `--offset`.
    #[serde(skip_serializing_if = "Option::is_none")]
    offset: Option<String>,
    /// The route the tensors took (`host`, `managed`, `direct`, `staged`; rank 0's, the
    /// most telling of the case's operations); absent when no operation ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    route: Option<String>,
    /// Logical elements per tensor.
    len: i64,
    /// `pass`, `fail`, `skip`, `known-bug`, `not-applicable`, `not-checkable` or `timeout`
    /// (ran past `--timeout`: the run stopped there).
    status: &'static str,
    /// Why it failed, was skipped, hit a known bug, does not apply or is not checkable.
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    /// Wall time of the case on rank 0, including the agreement of the verdicts.
    seconds: f64,
}

impl Record {
    fn new(
        case: &Case<'_>,
        producer: Producer,
        route: Option<Route>,
        outcome: Outcome,
        message: Option<String>,
        seconds: f64,
    ) -> Record {
        Record {
            name: case.name(),
            op: case.op.name(),
            dtype: case.kind.name(),
            layout: case.layout.name(),
            device: case.place.name(),
            producer: producer.name(),
            transport: case.transport.clone(),
            offset: case.offset.name_part(),
            route: route.map(|r| r.to_string()),
            len: case.len,
            status: match outcome {
                Outcome::Pass => "pass",
                Outcome::NotApplicable => "not-applicable",
                Outcome::NotCheckable => "not-checkable",
                Outcome::Skip => "skip",
                Outcome::KnownBug => "known-bug",
                Outcome::Fail => "fail",
            },
            message,
            seconds,
        }
    }
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
    /// Cases of combinations that MPI or DLPack rules out (status `not-applicable`):
    /// counted in none of the other totals.
    not_applicable: u32,
    /// Float sums whose exact inputs could not carry every rank's data (status
    /// `not-checkable`, `super::exact`): counted in none of the other totals.
    not_checkable: u32,
    /// The case that ran past `--timeout` (absent: none did).
    #[serde(skip_serializing_if = "Option::is_none")]
    timed_out: Option<&'r TimedOut>,
    cases: &'r [Record],
}

fn write_junit(path: &std::path::Path, records: &[Record], seconds: f64) -> Result<(), String> {
    use quick_junit::{NonSuccessKind, TestCase, TestCaseStatus, TestSuite};
    let mut suite = TestSuite::new("dlpack-mpi check");
    for r in records {
        let mut status = match r.status {
            "pass" => TestCaseStatus::success(),
            "fail" => TestCaseStatus::non_success(NonSuccessKind::Failure),
            "timeout" => TestCaseStatus::non_success(NonSuccessKind::Error),
            // A known MPI-library bug (a wrong result the runner recognised), a combination
            // MPI or DLPack rules out, or a sum too wide for exact inputs: reported with its
            // own type so that CI shows it without failing the run.
            _ => TestCaseStatus::skipped(),
        };
        if let Some(m) = &r.message {
            status.set_message(m.as_str());
        }
        match r.status {
            "known-bug" => status.set_type("known-mpi-library-bug"),
            "not-applicable" => status.set_type("not-applicable"),
            "not-checkable" => status.set_type("not-checkable"),
            "timeout" => status.set_type("timeout"),
            _ => &mut status,
        };
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
