//! The `dlpack-mpi` command line under `mpirun` (and once without it): every flag of
//! `check`, `bench` and `info`, by what it prints, writes and exits with.
//!
//! `mpirun` is `$DLPACK_MPI_MPIRUN` or `mpirun`; Open MPI's root and oversubscription
//! permissions are given through its environment variables, which other launchers ignore.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_dlpack-mpi");

fn mpirun(n: u32, args: &[&str], env: &[(&str, &str)]) -> Output {
    let launcher = std::env::var("DLPACK_MPI_MPIRUN").unwrap_or_else(|_| "mpirun".into());
    let mut cmd = Command::new(launcher);
    cmd.args(["-n", &n.to_string(), BIN])
        .args(args)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("mpirun starts")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("dlpack-mpi-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir.join(name)
}

#[test]
fn check_patterns_reports_and_summary() {
    let json = scratch("check.json");
    let junit = scratch("check.xml");
    let out = mpirun(
        2,
        &[
            "check",
            "-v",
            "--producer",
            "rust",
            "-k",
            "allreduce/float32",
            "-e",
            "*/negative/*",
            "--len",
            "7",
            "--json",
            json.to_str().unwrap(),
            "--junit",
            junit.to_str().unwrap(),
        ],
        &[],
    );
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    // A substring: float32 and float32x4, of allreduce and of its nonblocking form
    // iallreduce, and of fused-allreduce, ifused-allreduce and plan-allreduce (no broadcast
    // layout); not allreduce-inplace nor plan-allreduce-max; negative excluded; length 7 has
    // no 0-d case: 2 × (2 × 5 + 3 × 4).
    let lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with("PASS ")).collect();
    assert_eq!(lines.len(), 44, "{stdout}");
    for l in &lines {
        assert!(l.contains("allreduce/float32"), "{l}");
        assert!(!l.contains("negative"), "{l}");
        // The name, then the producer (`[numpy]` or `[rust]`).
        assert!(l.split(' ').nth(1).unwrap().ends_with("/cpu/host/7"), "{l}");
        assert!(l.ends_with(']'), "{l}");
    }
    assert!(
        stdout.contains("44 passed, 0 failed, 0 skipped"),
        "{stdout}"
    );
    // Not a terminal: no progress bar on standard error.
    assert_eq!(text(&out.stderr).trim(), "", "stderr not empty");

    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["ranks"], 2);
    assert_eq!(report["passed"], 44);
    assert_eq!(report["failed"], 0);
    let cases = report["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 44);
    assert!(cases.iter().all(|c| c["status"] == "pass" && c["len"] == 7));
    assert_eq!(cases[0]["name"], "allreduce/float32/contiguous/cpu/host/7");
    assert_eq!(
        cases[10]["name"],
        "iallreduce/float32/contiguous/cpu/host/7"
    );

    let xml = std::fs::read_to_string(&junit).unwrap();
    assert_eq!(xml.matches("<testcase ").count(), 44, "{xml}");
    assert!(xml.contains(r#"tests="44" failures="0""#), "{xml}");
    assert!(
        xml.contains(r#"name="allreduce/float32x4/step/cpu/host/7""#),
        "{xml}"
    );
}

#[test]
fn check_failure_names_index_values_and_rank_and_failfast_stops() {
    let json = scratch("fail.json");
    let junit = scratch("fail.xml");
    let out = mpirun(
        2,
        &[
            "check",
            "--op",
            "allreduce",
            "--dtype",
            "float32",
            "--layout",
            "contiguous",
            "--len",
            "7,1000",
            "-q",
            "--inject-fault",
            "allreduce/float32/contiguous/*",
            "--json",
            json.to_str().unwrap(),
            "--junit",
            junit.to_str().unwrap(),
        ],
        &[],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let fails: Vec<&str> = stdout.lines().filter(|l| l.starts_with("FAIL ")).collect();
    assert_eq!(fails.len(), 2, "{stdout}");
    assert!(
        fails[0].starts_with(
            "FAIL allreduce/float32/contiguous/cpu/host/7: rank 1: sum: first difference at \
             index 3: expected "
        ),
        "{}",
        fails[0]
    );
    assert!(fails[0].contains(", got 56.5"), "{}", fails[0]);
    assert!(!stdout.contains("PASS "), "-q prints no passes: {stdout}");
    assert!(stdout.contains("0 passed, 2 failed, 0 skipped"), "{stdout}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["failed"], 2);
    assert!(report["cases"][0]["message"]
        .as_str()
        .unwrap()
        .contains("index 3"));
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert_eq!(xml.matches("<failure").count(), 2, "{xml}");

    // -x: the first failure ends the run.
    let out = mpirun(
        2,
        &[
            "check",
            "-v",
            "--op",
            "allreduce",
            "--dtype",
            "float32",
            "--len",
            "7",
            "-x",
            "--inject-fault",
            "allreduce/float32/fortran/*",
        ],
        &[],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("PASS allreduce/float32/contiguous/cpu/host/7"));
    assert!(stdout.contains("FAIL allreduce/float32/fortran/cpu/host/7"));
    assert!(
        !stdout.contains("transposed"),
        "ran past the failure: {stdout}"
    );
    assert!(stdout.contains("1 passed, 1 failed, 0 skipped"), "{stdout}");
}

/// The nonblocking collectives (`ibcast`, `iallreduce`, …): under the default `--len` they
/// run lengths 0, 1, 7 and 1000 (every layout, 0-d included), under an explicit `--len` the
/// lengths given.
#[test]
fn check_nonblocking_collectives_lengths() {
    let list = |args: &[&str]| -> Vec<String> {
        let mut all = vec!["check", "--list", "--dtype", "float32"];
        all.extend_from_slice(args);
        let out = mpirun(1, &all, &[]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        text(&out.stdout).lines().map(str::to_string).collect()
    };
    let names = list(&[
        "--op",
        "allreduce,iallreduce",
        "--layout",
        "contiguous,scalar",
    ]);
    let lens = |op: &str| -> Vec<&str> {
        let prefix = format!("{op}/float32/contiguous/cpu/host/");
        names
            .iter()
            .filter_map(|n| n.strip_prefix(&prefix))
            .collect()
    };
    assert_eq!(
        lens("allreduce"),
        ["0", "1", "7", "1000", "65536"],
        "{names:?}"
    );
    assert_eq!(lens("iallreduce"), ["0", "1", "7", "1000"], "{names:?}");
    assert!(names.contains(&"iallreduce/float32/scalar/cpu/host/1".to_string()));
    assert_eq!(names.len(), 11, "{names:?}");
    let names = list(&["--op", "iallreduce", "--layout", "step", "--len", "65536"]);
    assert_eq!(names, ["iallreduce/float32/step/cpu/host/65536"]);
}

/// At 2 ranks (one rank completing each request with `wait`, the other with a `test` loop)
/// the nonblocking collectives pass on host and simulated device memory, with their own
/// JUnit class, and a corrupted result fails.
#[test]
fn check_nonblocking_collectives_pass_and_fail() {
    let junit = scratch("nonblocking.xml");
    let ops = "ibcast,ireduce,igatherv,iscatter,ialltoallv,ireduce-scatter-block,ifused-allreduce";
    for device in [
        &["--device", "cpu"][..],
        &["--device", "cuda", "--simulate-device"],
    ] {
        let mut args = vec!["check", "-v", "--producer", "rust", "--op", ops];
        args.extend_from_slice(&["--dtype", "int32,float32x4", "--layout", "step,negative"]);
        args.extend_from_slice(&["--len", "7,1000", "--junit", junit.to_str().unwrap()]);
        args.extend_from_slice(device);
        let out = mpirun(2, &args, &[("DLPACK_MPI_CUDA_AWARE", "0")]);
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
        // 7 operations × 2 dtypes × 2 layouts × 2 lengths (fused lists: mixed in step).
        let passed = stdout.lines().filter(|l| l.starts_with("PASS i")).count();
        assert_eq!(passed, 56, "{stdout}");
        assert!(stdout.ends_with("\n56 passed, 0 failed, 0 skipped, 0 not applicable\n"));
        let line = match device.len() {
            2 => "PASS ialltoallv/float32x4/negative/cpu/host/1000 [rust]",
            _ => "PASS ialltoallv/float32x4/negative/cuda/staged/1000 [cuda:0 staged]",
        };
        assert!(stdout.contains(line), "{stdout}");
        let xml = std::fs::read_to_string(&junit).unwrap();
        assert!(xml.contains(r#"classname="dlpack-mpi.check.ireduce-scatter-block""#));
    }

    let out = mpirun(
        2,
        &[
            "check",
            "-q",
            "--op",
            "iallreduce",
            "--dtype",
            "float32",
            "--layout",
            "contiguous",
            "--len",
            "7",
            "--inject-fault",
            "iallreduce/",
        ],
        &[],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let fail = "FAIL iallreduce/float32/contiguous/cpu/host/7: rank 1: sum: first difference at \
                index 3";
    assert!(stdout.starts_with(fail), "{stdout}");
}

#[test]
fn check_list_verbose_and_rank0_decides() {
    let out = mpirun(2, &["check", "--list", "-k", "*/bool/scalar/*"], &[]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0));
    let names: Vec<&str> = stdout.lines().collect();
    // The nonblocking collectives' default lengths (0, 1, 7, 1000) include the 0-d case.
    assert_eq!(names.len(), 29, "one 0-d bool case per operation: {stdout}");
    assert_eq!(names[0], "send-recv/bool/scalar/cpu/host/1");
    assert_eq!(names[15], "reduce-scatter-block/bool/scalar/cpu/host/1");
    assert_eq!(names[16], "ibcast/bool/scalar/cpu/host/1");
    assert_eq!(names[28], "ireduce-scatter-block/bool/scalar/cpu/host/1");

    let out = mpirun(
        2,
        &[
            "check", "--op", "bcast", "--dtype", "int8", "--len", "1", "-vv",
        ],
        &[],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("MPI library: "), "{stdout}");
    assert!(
        stdout
            .lines()
            .filter(|l| l.starts_with("PASS "))
            .all(|l| l.ends_with(" ms]")),
        "{stdout}"
    );
}

/// The default output of a clean 4-rank run over every operation and dtype (0-d tensors, to
/// keep it short): no case lines, a line per operation, a matrix row per dtype, no dtype
/// skipped for want of a producer (`auto` has Rust make what no installed producer makes),
/// the reductions on transfer-only dtypes not applicable, and under 100 lines in all.
#[test]
fn check_default_output_is_one_screen() {
    let out = mpirun(
        4,
        &["check", "--layout", "scalar", "--len", "1"],
        // Open MPI's saturating 8-bit sums (a known bug) need longer tensors; off anyway.
        &[("OMPI_MCA_op", "^avx")],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines.len() < 100, "{} lines: {stdout}", lines.len());
    assert!(
        lines[0].starts_with("dlpack-mpi check: 962 cases at 4 rank(s)"),
        "{stdout}"
    );
    // The mismatch section: each probe ended in errors on every rank, not a hang.
    assert!(
        stdout.contains(
            "mismatched arguments (MPI-4.1 §6.1): 6 probes at 4 ranks, each ended in \
             CollectiveMismatch on every rank, none waited"
        ),
        "{stdout}"
    );
    for case_line in ["PASS ", "SKIP ", "N/A ", "FAIL ", "KNOWN-BUG"] {
        assert!(!stdout.contains(case_line), "{case_line}: {stdout}");
    }
    // 37 operations (16 blocking, 13 nonblocking collectives, 5 fused, 3 plans) × 26
    // dtypes; 14 reductions × 10 transfer-only dtypes do not apply, nor the maximum of
    // bool, complex64 and complex128.
    assert_eq!(
        lines.last().copied(),
        Some("819 passed, 0 failed, 0 skipped, 143 not applicable"),
        "{stdout}"
    );
    let ops: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("  ") && l.ends_with(" not applicable"))
        .collect();
    assert_eq!(ops.len(), 37, "{stdout}");
    assert!(ops[0].starts_with("  a send-recv "), "{}", ops[0]);
    // A reduction, a nonblocking, a fused and a planned one: 16 dtypes reduce, 10 are
    // transfer-only.
    for (i, op) in [
        (4, "e reduce"),
        (28, "C ireduce-scatter-block"),
        (32, "G fused-reduce-scatter"),
        (34, "I plan-allreduce"),
    ] {
        let counts = " 16 passed    0 failed    0 skipped   0 known bugs   10 not applicable";
        let line = ops[i];
        assert!(
            line.starts_with(&format!("  {op} ")) && line.ends_with(counts),
            "{line}"
        );
    }
    let row = |dtype: &str| -> &str {
        lines
            .iter()
            .copied()
            .find(|l| l.starts_with(&format!("  {dtype:<20} ")))
            .unwrap_or_else(|| panic!("no row {dtype}: {stdout}"))
    };
    let cells = |dtype: &str| row(dtype)[23..60].to_string();
    let letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJK";
    let header = format!("  {:<20} {letters}  tensors made by", "");
    assert_eq!(row("").trim_end(), header.trim_end());
    assert_eq!(cells("float32"), ".".repeat(37));
    assert_eq!(cells("int8"), ".".repeat(37));
    // Transfer-only: moved by every operation, reduced by none (reduce, allreduce,
    // allreduce-inplace, reduce-scatter-block, their nonblocking forms, the fused ones and
    // the plans').
    for dtype in ["complex32", "bcomplex32", "float8_e5m2", "float8_e8m0fnu"] {
        assert_eq!(
            cells(dtype),
            "....---........-.---........---.----.",
            "{dtype}"
        );
    }
    // No installed Python producer makes complex32: Rust stands in, and says so.
    assert!(row("complex32").ends_with("  rust*") || row("complex32").ends_with("  rust"));
    if cfg!(feature = "python") {
        assert!(row("float32").ends_with("  numpy"), "{}", row("float32"));
        assert!(
            row("complex32").ends_with("  rust*"),
            "{}",
            row("complex32")
        );
        assert!(stdout.contains("\n  rust*: Rust-made tensors"), "{stdout}");
    }
}

/// A failure is printed in full as it happens and marks its cell `F`; `-v` prints every
/// case, not-applicable ones as `N/A` with the reason.
#[test]
fn check_default_output_failures_and_verbose_cases() {
    let args = [
        "check",
        "--producer",
        "rust",
        "--op",
        "bcast,allreduce",
        "--dtype",
        "int8,float8_e5m2",
        "--layout",
        "scalar",
        "--len",
        "1",
        "--inject-fault",
        "allreduce/int8/*",
    ];
    let out = mpirun(2, &args, &[]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let fails: Vec<&str> = stdout.lines().filter(|l| l.starts_with("FAIL ")).collect();
    assert_eq!(fails.len(), 1, "{stdout}");
    assert!(
        fails[0].starts_with("FAIL allreduce/int8/scalar/cpu/host/1: rank 1: sum: first difference at index 0: expected "),
        "{}",
        fails[0]
    );
    assert!(!stdout.contains("PASS "), "{stdout}");
    assert!(
        stdout.contains(&format!("\n  {:<20} .F  ", "int8")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("\n  {:<20} .-  ", "float8_e5m2")),
        "{stdout}"
    );
    assert!(stdout.contains("\n  b allreduce "), "{stdout}");
    assert!(
        stdout.ends_with("\n2 passed, 1 failed, 0 skipped, 1 not applicable\n"),
        "{stdout}"
    );

    let mut verbose = args.to_vec();
    verbose.push("-v");
    let out = mpirun(2, &verbose, &[]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let cases: Vec<&str> = stdout
        .lines()
        .filter(|l| ["PASS ", "FAIL ", "N/A "].iter().any(|p| l.starts_with(p)))
        .collect();
    assert_eq!(cases.len(), 4, "{stdout}");
    assert!(
        cases[0].starts_with("PASS bcast/int8/scalar/cpu/host/1 ["),
        "{}",
        cases[0]
    );
    assert!(
        cases[3].starts_with(
            "N/A allreduce/float8_e5m2/scalar/cpu/host/1 (float8_e5m2 is transfer-only: MPI has \
             no reduction for it) ["
        ),
        "{}",
        cases[3]
    );
    // -q: the failure and the closing line, no matrix.
    let mut quiet = args.to_vec();
    quiet.push("-q");
    let out = mpirun(2, &quiet, &[]);
    let stdout = text(&out.stdout);
    assert_eq!(stdout.lines().count(), 2, "{stdout}");
}

/// A job of the agreement tests below: its exit status (`None`: it had to be stopped), its
/// output and how long it took.
struct Job {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    took: Duration,
}

impl Job {
    /// Standard output and error, for assertion messages.
    fn all(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }
}

/// How long a job of the agreement tests may take before it counts as hung: they end in
/// seconds (the ranks agree on their arguments before any work); before, `check : bench`
/// printed nothing for minutes.
const AGREE_LIMIT: Duration = Duration::from_secs(60);

/// An MPMD job, one rank per part (`mpirun -n 1 BIN PART0 : -n 1 BIN PART1 …`), with `env`
/// added; stopped after [`AGREE_LIMIT`] (`SIGTERM` to `mpirun`, then `SIGKILL`), which
/// fails the test.
fn mpmd(parts: &[&[&str]], env: &[(&str, &str)]) -> Job {
    let launcher = std::env::var("DLPACK_MPI_MPIRUN").unwrap_or_else(|_| "mpirun".into());
    let mut cmd = Command::new(launcher);
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            cmd.arg(":");
        }
        cmd.args(["-n", "1", BIN]).args(*part);
    }
    within(cmd, env)
}

/// `args` at `n` ranks under mpirun, as [`mpmd`].
fn mpirun_within(n: u32, args: &[&str], env: &[(&str, &str)]) -> Job {
    let launcher = std::env::var("DLPACK_MPI_MPIRUN").unwrap_or_else(|_| "mpirun".into());
    let mut cmd = Command::new(launcher);
    cmd.args(["-n", &n.to_string(), BIN]).args(args);
    within(cmd, env)
}

/// Runs `cmd` (an mpirun line) with `env` added, its output to files (no pipe fills up
/// while it is polled), stopped after [`AGREE_LIMIT`], which fails the test.
fn within(mut cmd: Command, env: &[(&str, &str)]) -> Job {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static JOBS: AtomicUsize = AtomicUsize::new(0);
    let tag = JOBS.fetch_add(1, Ordering::SeqCst);
    let (out, err) = (
        scratch(&format!("job{tag}.out")),
        scratch(&format!("job{tag}.err")),
    );
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).expect("stdout file"))
        .stderr(std::fs::File::create(&err).expect("stderr file"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let started = Instant::now();
    let mut child = cmd.spawn().expect("mpirun starts");
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if started.elapsed() > AGREE_LIMIT {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            std::thread::sleep(Duration::from_secs(5));
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let read = |p: &PathBuf| std::fs::read_to_string(p).unwrap_or_default();
    let job = Job {
        code: status.and_then(|s| s.code()),
        stdout: read(&out),
        stderr: read(&err),
        took: started.elapsed(),
    };
    assert!(
        status.is_some(),
        "still running after {AGREE_LIMIT:?}: stopped\n{}",
        job.all()
    );
    job
}

/// Asserts that `job` ended with exit status 2, printed nothing on standard output, and
/// that its standard error holds each of `says`.
#[track_caller]
fn assert_refused(job: &Job, says: &[&str]) {
    assert_eq!(job.code, Some(2), "{}", job.all());
    assert!(job.stdout.trim().is_empty(), "stdout: {}", job.all());
    for s in says {
        assert!(job.stderr.contains(s), "no {s:?} in:\n{}", job.all());
    }
    assert!(!job.stderr.contains("MPI_ERR"), "{}", job.all());
}

/// Different subcommands on two ranks end at once, exit status 2 on every rank, the line
/// naming which rank runs what. Before, only rank 0's arguments counted: `check : bench`
/// printed nothing for minutes (check's `--timeout` never fired), and `check : info`
/// aborted the job with `MPI_ERR_TRUNCATE`.
#[test]
fn ranks_with_different_subcommands_stop_at_once() {
    let bench = ["bench", "--op", "latency", "--sizes", "8", "--iters", "10"];
    let job = mpmd(&[&["check"], &bench], &[]);
    assert_refused(
        &job,
        &[
            "dlpack-mpi: the ranks were started with different arguments, so none runs: rank 1 \
             runs \"bench --op latency --sizes 8 --iters 10\", rank 0 runs \"check\"; the \
             subcommand: bench on rank 1, check on rank 0 (every rank must run the same \
             subcommand with the same options",
        ],
    );
    let job = mpmd(&[&["check"], &["info"]], &[]);
    assert_refused(
        &job,
        &[
            "rank 1 runs \"info\", rank 0 runs \"check\"; the subcommand: info on rank 1, check \
           on rank 0",
        ],
    );
    // A rank asking for help is told apart from one running a command.
    let job = mpmd(&[&["check", "--list"], &["check", "--help"]], &[]);
    assert_refused(
        &job,
        &[
            "the command line: help or the version asked for on rank 1, a subcommand to run on \
           rank 0",
        ],
    );
}

/// The same subcommand with different options: exit status 2 on every rank, naming the
/// option and each rank's value. Before, rank 0's options were every rank's: a rank given
/// a dtype that does not exist ran rank 0's cases and the job exited 0.
#[test]
fn ranks_with_different_options_stop_at_once() {
    let a = ["check", "--op", "bcast", "--dtype", "int8", "--len", "3,4"];
    let b = ["check", "--op", "bcast", "--dtype", "int16", "--len", "3,4"];
    let job = mpmd(&[&a, &b], &[]);
    assert_refused(
        &job,
        &[
            "rank 1 runs \"check --op bcast --dtype int16 --len 3,4\", rank 0 runs \"check --op \
           bcast --dtype int8 --len 3,4\"; --dtype: \"int16\" on rank 1, \"int8\" on rank 0 (",
        ],
    );
    // The same options written differently are the same: the job runs.
    let c = [
        "check", "--op", "bcast", "--dtype", "int8", "--len", "3", "--len", "4", "-q",
    ];
    let d = [
        "check",
        "--op=bcast",
        "--dtype=int8",
        "--len=3,4",
        "--quiet",
    ];
    let job = mpmd(&[&c, &d], &[]);
    assert_eq!(job.code, Some(0), "{}", job.all());
    assert!(job.stdout.contains("12 passed, 0 failed"), "{}", job.all());
    // `--gpu` is each rank's own (a rank of a multi-GPU node picks its device).
    let gpu = [
        "check",
        "--device",
        "cuda",
        "--simulate-device",
        "--op",
        "bcast",
        "--dtype",
        "int8",
        "--len",
        "1",
        "-q",
    ];
    let mut gpu0 = gpu.to_vec();
    gpu0.extend(["--gpu", "0"]);
    let job = mpmd(&[&gpu0, &gpu], &[("DLPACK_MPI_CUDA_AWARE", "0")]);
    assert_eq!(job.code, Some(0), "{}", job.all());
    // A setting every rank must share is compared too.
    let script = "if [ \"${OMPI_COMM_WORLD_RANK:-$PMI_RANK}\" = 1 ]; then \
                  export DLPACK_MPI_BUCKET_BYTES=4096; fi; exec \"$0\" \"$@\"";
    let launcher = std::env::var("DLPACK_MPI_MPIRUN").unwrap_or_else(|_| "mpirun".into());
    let mut cmd = Command::new(launcher);
    cmd.args(["-n", "2", "sh", "-c", script, BIN, "check", "-k", "fused"]);
    let job = within(cmd, &[]);
    assert_refused(
        &job,
        &[
            "every rank runs \"check -k fused\"; DLPACK_MPI_BUCKET_BYTES: 4096 on rank 1, \
           26214400 on rank 0 (",
        ],
    );
}

/// Options clap refuses on one rank only: that rank says clap's message, the other says
/// which rank was refused; exit status 2 on both, within seconds (before, the other ranks
/// waited for it, or the job exited 0 with rank 0's options).
#[test]
fn an_invalid_option_on_one_rank_stops_every_rank() {
    let job = mpmd(
        &[&["check", "--len", "1"], &["check", "--len", "seven"]],
        &[],
    );
    assert_refused(
        &job,
        &[
            "dlpack-mpi: rank 1: invalid value 'seven' for '--len <LEN>'",
            "dlpack-mpi: rank 0 stops: the arguments of rank 1 were refused (rank 1: \"check \
             --len seven\"; its own line says why)",
        ],
    );
    // Refused alike on every rank: clap's one line, once.
    let job = mpirun_within(2, &["check", "--frobnicate"], &[]);
    assert_refused(&job, &["unexpected argument '--frobnicate'"]);
    let ours = job.stderr.lines().filter(|l| l.starts_with("dlpack-mpi"));
    assert_eq!(ours.count(), 1, "{}", job.all());
    // Help on every rank: printed once, exit status 0.
    let job = mpirun_within(2, &["check", "--help"], &[]);
    assert_eq!(job.code, Some(0), "{}", job.all());
    assert_eq!(job.stdout.matches("--timeout").count(), 1, "{}", job.all());
}

/// A report path that cannot be written ends the run before the first case or measurement
/// (before: after the whole run, 85 s, and the report was lost), exit status 2, naming the
/// flag, the path and the system's error.
#[test]
fn an_unwritable_report_path_stops_before_any_work() {
    let missing = scratch("no-such-dir").join("r.json");
    let path = missing.to_str().unwrap();
    for (args, flag) in [
        (&["check", "--json", path][..], "check: cannot write --json"),
        (&["check", "--junit", path], "check: cannot write --junit"),
        (&["bench", "--csv", path], "bench: cannot write --csv"),
        (
            &["bench", "--op", "latency", "--plot", path],
            "bench: cannot write --plot",
        ),
        (
            &["bench", "--op", "fused", "--json", path],
            "bench: cannot write --json",
        ),
    ] {
        let job = mpirun_within(2, args, &[]);
        let says = format!("dlpack-mpi {flag} {path}: No such file or directory");
        assert_refused(&job, &[&says]);
        // The whole default matrix takes minutes; a refusal at start, seconds.
        assert!(
            job.took < Duration::from_secs(30),
            "{:?}: {}",
            job.took,
            job.all()
        );
    }
    // A writable path is created at the start, and the report written at the end.
    let json = scratch("made-at-start.json");
    let _ = std::fs::remove_file(&json);
    let job = mpirun_within(
        2,
        &[
            "check",
            "-q",
            "--op",
            "bcast",
            "--dtype",
            "int8",
            "--len",
            "1",
            "--json",
            json.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(job.code, Some(0), "{}", job.all());
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["passed"], 7);
}

/// A misspelt `DLPACK_MPI_*` name (`DLPACK_MPI_BUCKET_SIZE` for `DLPACK_MPI_BUCKET_BYTES`)
/// was ignored in silence; `check` and `bench` now refuse it on every rank that has it,
/// naming the closest known name, exit status 2; `info` says it and goes on;
/// `DLPACK_MPI_UNKNOWN_NAMES=ignore` lets it pass.
#[test]
fn a_misspelt_setting_name_is_refused() {
    let misspelt = ("DLPACK_MPI_BUCKET_SIZE", "1024");
    let says = "environment variable DLPACK_MPI_BUCKET_SIZE is not a dlpack-mpi setting (did \
                you mean DLPACK_MPI_BUCKET_BYTES?); DLPACK_MPI_UNKNOWN_NAMES=ignore runs it \
                anyway";
    for args in [
        &["check", "--op", "bcast", "--dtype", "int8", "--len", "1"][..],
        &["bench", "--op", "latency", "--sizes", "8", "--iters", "10"],
    ] {
        let job = mpirun_within(2, args, &[misspelt]);
        assert_refused(
            &job,
            &[
                &format!("dlpack-mpi: rank 0: {says}"),
                &format!("dlpack-mpi: rank 1: {says}"),
            ],
        );
    }
    let job = mpirun_within(1, &["info"], &[misspelt]);
    assert_eq!(job.code, Some(0), "{}", job.all());
    assert!(job.stdout.contains("MPI built against"), "{}", job.all());
    assert!(
        job.stderr
            .contains("(did you mean DLPACK_MPI_BUCKET_BYTES?); ignored"),
        "{}",
        job.all()
    );
    let job = mpirun_within(
        2,
        &[
            "check", "-q", "--op", "bcast", "--dtype", "int8", "--len", "1",
        ],
        &[misspelt, ("DLPACK_MPI_UNKNOWN_NAMES", "ignore")],
    );
    assert_eq!(job.code, Some(0), "{}", job.all());
    assert!(job.stderr.trim().is_empty(), "{}", job.all());
}

/// `bench --iters` that cannot end within the run's time budget (`--timeout`, an hour by
/// default) is refused before any measurement, naming the limit (before: accepted, and the
/// run went on for ever); one that can is watched by `--timeout`, exit status 3.
#[test]
fn bench_refuses_iterations_beyond_its_time_budget() {
    let job = mpirun_within(2, &["bench", "--iters", "99999999999"], &[]);
    assert_refused(
        &job,
        &[
            "dlpack-mpi bench: --iters 99999999999 cannot end within --timeout 3600 s: with \
             --rounds 5 the run makes at least ",
            "the most that fits is --iters ",
        ],
    );
    let job = mpirun_within(
        2,
        &[
            "bench",
            "--op",
            "latency",
            "--sizes",
            "8",
            "--iters",
            "100000000",
            "--timeout",
            "2",
        ],
        &[],
    );
    assert_refused(
        &job,
        &[
            "--iters 100000000 cannot end within --timeout 2 s: with --rounds 5 the run makes at \
           least 500000000 iterations (--op latency: each operation's smallest message, one \
           path), at least 50 ns each, 25 s; the most that fits is --iters 8000000 (",
        ],
    );
    // Within the bound and still too long: the watchdog ends it.
    let job = mpirun_within(
        2,
        &[
            "bench",
            "--op",
            "latency",
            "--sizes",
            "8",
            "--iters",
            "4000000",
            "--rounds",
            "1",
            "--timeout",
            "2",
        ],
        &[],
    );
    assert_eq!(job.code, Some(3), "{}", job.all());
    assert!(
        job.stderr.contains(
            "dlpack-mpi bench: still running after --timeout 2 s: ending the run (exit status 3)"
        ),
        "{}",
        job.all()
    );
}

#[test]
fn check_refusals_are_one_line_and_exit_2() {
    for (args, says) in [
        (
            &["check", "-k", "nosuch"][..],
            "-k `nosuch` matches no case",
        ),
        (&["check", "-e", "nosuch"], "-e `nosuch` matches no case"),
        (
            &["check", "--dtype", "float128"],
            "unknown dtype `float128`",
        ),
        (
            &["check", "--device", "cuda-host", "--transport", "staged"],
            "transport `staged` applies to CUDA device memory",
        ),
        (
            &["check", "--transport", "staged"],
            "transport `staged` applies to CUDA device memory",
        ),
        (
            &["check", "--frobnicate"],
            "unexpected argument '--frobnicate'",
        ),
        (
            &["bench", "--device", "cuda-managed"],
            "bench runs on device `cpu` or `cuda`",
        ),
        (
            &[
                "bench",
                "--device",
                "cuda",
                "--simulate-device",
                "--op",
                "strided",
            ],
            "--device cuda benchmarks ping-pong",
        ),
        (&["bench", "--sizes", "3"], "size `3` is outside"),
        (
            &["bench", "--op", "fused", "--check"],
            "--check checks every iteration of latency",
        ),
        (
            &["bench", "--op", "strided", "--strided-storage", "48K"],
            "is not a power of two from 32 KiB to 64 MiB",
        ),
        (
            &["bench", "--op", "overlap", "--layout", "step"],
            "--op overlap all-reduces contiguous tensors only",
        ),
        (
            &["bench", "--op", "overlap", "--csv", "x.csv"],
            "--op overlap writes --json, not --csv or --plot",
        ),
    ] {
        let out = mpirun(2, args, &[]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        // Open MPI adds its own lines about a non-zero exit; ours is exactly one.
        let ours: Vec<&&str> = lines
            .iter()
            .filter(|l| l.starts_with("dlpack-mpi"))
            .collect();
        assert_eq!(ours.len(), 1, "{args:?}: {stderr}");
        assert!(ours[0].contains(says), "{args:?}: {stderr}");
        let stdout = text(&out.stdout);
        assert!(stdout.trim().is_empty(), "{args:?}: stdout {stdout}");
    }
}

/// Regression: an empty `-k ''` matched every case (it is a substring of every name) and an
/// empty `-e ''` excluded every case, so `check` ran nothing and exited 0 ("0 passed");
/// a `-k` and `-e` that cancel out did the same. A check that selects no case now refuses
/// in one line with exit 2, like a pattern that matches no case.
#[test]
fn regression_check_empty_patterns_and_empty_selection_are_refused() {
    for (args, says) in [
        (&["check", "--len", "1", "-k", ""][..], "-k `` is empty"),
        (&["check", "--len", "1", "-e", ""], "-e `` is empty"),
        (
            &["check", "--len", "1", "-k", "x", "-e", ""],
            "-e `` is empty",
        ),
        (
            &["check", "--len", "1", "-k", "bcast/int8/", "-e", "bcast/"],
            "no case left to run",
        ),
    ] {
        let out = mpirun(2, args, &[]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        let ours: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("dlpack-mpi"))
            .collect();
        assert_eq!(ours.len(), 1, "{args:?}: {stderr}");
        assert!(ours[0].contains(says), "{args:?}: {stderr}");
        let stdout = text(&out.stdout);
        assert!(stdout.trim().is_empty(), "{args:?}: stdout {stdout}");
    }
}

/// A `DLPACK_MPI_*` setting that is not one of its values stops `check` and `bench` before
/// any case or measurement, exit 2, every rank naming the variable and the value (before,
/// a bad `DLPACK_MPI_HALF_OPS` or `DLPACK_MPI_PACKING` failed each case that read it, exit
/// 1); one rank's bad value stops the others too. `info` says it and goes on.
#[test]
fn bad_settings_are_refused_before_any_case() {
    for (var, value, args) in [
        (
            "DLPACK_MPI_HALF_OPS",
            "native",
            &["check", "--dtype", "float16"][..],
        ),
        ("DLPACK_MPI_PACKING", "packed", &["check", "-k", "strided"]),
        ("DLPACK_MPI_BUCKET_BYTES", "0", &["check", "-k", "fused"]),
        (
            "DLPACK_MPI_AGREEMENT",
            "none",
            &["bench", "--sizes", "8", "--iters", "2"],
        ),
        // (before: one line from rank 0, "cannot select a GPU: …", exit 2)
        (
            "DLPACK_MPI_DEVICE",
            "x",
            &[
                "check",
                "--device",
                "cuda",
                "--simulate-device",
                "--op",
                "bcast",
            ],
        ),
    ] {
        let out = mpirun(2, args, &[(var, value)]);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert_eq!(
            out.status.code(),
            Some(2),
            "{var}={value} {args:?}: {stderr}"
        );
        for rank in 0..2 {
            let says = format!(
                "dlpack-mpi: rank {rank}: environment variable {var}={value:?} is not valid"
            );
            assert!(stderr.contains(&says), "{var}: no {says:?} in {stderr}");
        }
        assert!(!stdout.contains("passed"), "{var}: cases ran: {stdout}");
    }
    // Only the last rank's value is bad: both ranks stop, only it says why.
    let script = "if [ \"${OMPI_COMM_WORLD_RANK:-$PMI_RANK}\" = 1 ]; then \
                  export DLPACK_MPI_HALF_OPS=nativ; fi; exec \"$0\" \"$@\"";
    let launcher = std::env::var("DLPACK_MPI_MPIRUN").unwrap_or_else(|_| "mpirun".into());
    let out = Command::new(launcher)
        .args([
            "-n",
            "2",
            "sh",
            "-c",
            script,
            BIN,
            "check",
            "-k",
            "nosuchcase",
        ])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .output()
        .expect("mpirun starts");
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("rank 1: environment variable DLPACK_MPI_HALF_OPS=\"nativ\""),
        "{stderr}"
    );
    assert!(!stderr.contains("rank 0: environment"), "{stderr}");
    // info goes on, and says it.
    let out = mpirun(1, &["info"], &[("DLPACK_MPI_PACKING", "packed")]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("MPI built against"), "{stdout}");
    assert!(
        stderr.contains("DLPACK_MPI_PACKING=\"packed\" is not valid"),
        "{stderr}"
    );
}

/// Regression: a `DLPACK_MPI_CUDA_AWARE` value that is not UTF-8 was read as unset (the
/// library's own answer was used silently); it is now an invalid setting, named.
#[cfg(unix)]
#[test]
fn regression_info_refuses_non_utf8_cuda_aware_override() {
    use std::os::unix::ffi::OsStrExt;
    let launcher = std::env::var("DLPACK_MPI_MPIRUN").unwrap_or_else(|_| "mpirun".into());
    let out = Command::new(launcher)
        .args(["-n", "1", BIN, "info"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env(
            "DLPACK_MPI_CUDA_AWARE",
            std::ffi::OsStr::from_bytes(b"1\xff"),
        )
        .output()
        .expect("mpirun starts");
    let stdout = text(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.starts_with("CUDA-aware MPI:"))
        .unwrap_or_else(|| panic!("no CUDA-aware line: {stdout}"));
    assert!(
        line.contains("DLPACK_MPI_CUDA_AWARE=\"1\u{fffd}\" is not valid"),
        "{line}"
    );
}

/// Without the `python` feature, `--producer numpy` is refused and `auto` means Rust.
#[cfg(not(feature = "python"))]
#[test]
fn check_producer_numpy_needs_the_feature() {
    let out = mpirun(2, &["check", "--producer", "numpy"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("producer `numpy` needs Python support"));
    let out = mpirun(
        2,
        &["check", "--op", "bcast", "--dtype", "int8", "--len", "1"],
        &[],
    );
    assert!(text(&out.stdout).contains("Rust-made tensors"));
}

/// With the `python` feature, `--producer numpy` makes NumPy arrays and skips the dtypes
/// NumPy lacks with the reason; `--producer rust` still makes Rust tensors; the default
/// (`auto`, issue 15) takes float32 from NumPy and bfloat16 from JAX (when installed, else
/// Paddle, else Rust), and every case line names its producer.
#[cfg(feature = "python")]
#[test]
fn check_producer_numpy() {
    let args = [
        "check",
        "-v",
        "--op",
        "bcast",
        "--dtype",
        "bfloat16,float32",
        "--len",
        "7",
    ];
    let out = mpirun(2, &args, &[]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("PASS bcast/float32/negative/cpu/host/7 [numpy]\n"),
        "{stdout}"
    );
    assert!(
        ["jax", "paddle", "rust"]
            .iter()
            .any(|p| stdout.contains(&format!("bcast/bfloat16/contiguous/cpu/host/7 [{p}]\n"))),
        "{stdout}"
    );
    assert!(!stdout.contains("FAIL"), "{stdout}");
    let mut args = args.to_vec();
    args.extend(["--producer", "numpy"]);
    let out = mpirun(2, &args, &[]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("NumPy 2."), "{stdout}");
    assert!(
        stdout.contains(
            "SKIP bcast/bfloat16/contiguous/cpu/host/7 (NumPy has no dtype bfloat16) [numpy]"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("PASS bcast/float32/negative/cpu/host/7"),
        "{stdout}"
    );
    assert!(stdout.contains("6 passed, 0 failed, 6 skipped"), "{stdout}");
    let mut rust = args[..args.len() - 2].to_vec();
    rust.extend(["--producer", "rust"]);
    let out = mpirun(2, &rust, &[]);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("Rust-made tensors"), "{stdout}");
    assert!(
        stdout.contains("12 passed, 0 failed, 0 skipped"),
        "{stdout}"
    );
}

#[test]
fn bench_without_mpirun_says_so() {
    let mut cmd = Command::new(BIN);
    cmd.args(["bench", "--op", "latency", "--sizes", "8"]);
    for (k, _) in std::env::vars() {
        if k.starts_with("OMPI_") || k.starts_with("PMI") || k.starts_with("SLURM_") {
            cmd.env_remove(k);
        }
    }
    let out = cmd
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("needs at least 2 ranks, and this process was not started by mpirun"),
        "{stderr}"
    );
}

#[test]
fn bench_csv_and_plot() {
    let csv = scratch("bench.csv");
    let svg = scratch("bench.svg");
    let out = mpirun(
        2,
        &[
            "bench",
            "--op",
            "latency",
            "--sizes",
            "8,1K",
            "--iters",
            "50",
            "--rounds",
            "2",
            "--csv",
            csv.to_str().unwrap(),
            "--plot",
            svg.to_str().unwrap(),
        ],
        &[],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("verification (one call per size and path"));
    assert!(stdout.contains(": passed"), "{stdout}");
    let table = std::fs::read_to_string(&csv).unwrap();
    let rows: Vec<Vec<&str>> = table.lines().map(|l| l.split(',').collect()).collect();
    assert_eq!(
        rows[0],
        [
            "op",
            "layout",
            "device",
            "ranks",
            "bytes",
            "iters",
            "path",
            "median_us",
            "best_us",
            "ratio_median",
            "ratio_best",
            "mb_per_s"
        ]
    );
    assert_eq!(rows.len(), 1 + 2 * 4, "{table}");
    for r in &rows[1..] {
        assert_eq!(&r[..4], ["latency", "contiguous", "cpu", "2"]);
        let median: f64 = r[7].parse().unwrap();
        assert!(median > 0.0, "{r:?}");
        if r[6] == "raw" {
            assert_eq!(r[9], "1.0", "raw is its own baseline: {r:?}");
        }
    }
    assert_eq!(
        rows[1..].iter().map(|r| r[6]).collect::<Vec<_>>(),
        ["raw", "dlpack", "reused", "checked", "raw", "dlpack", "reused", "checked"]
    );
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.starts_with("<svg"), "not an SVG");
    for label in ["raw", "dlpack", "latency: µs per message", "latency: MB/s"] {
        assert!(plot.contains(label), "plot lacks {label}");
    }
    // Per panel (latency, bandwidth) and path: a curve and its legend sample, drawn 2 wide.
    for color in ["#000000", "#FF0000", "#0000FF", "#00FF00"] {
        let wide = format!(r#"stroke="{color}" stroke-width="2""#);
        assert_eq!(plot.matches(&wide).count(), 4, "{color}");
    }
}

#[test]
fn bench_layout_and_collectives_verify() {
    let out = mpirun(
        3,
        &[
            "bench", "--op", "alltoall", "--layout", "step", "--sizes", "64", "--iters", "20",
            "--rounds", "1",
        ],
        &[],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("# alltoall: all-to-all over 3 ranks"),
        "{stdout}"
    );
    assert!(stdout.contains("only the checked path"), "{stdout}");
    assert!(
        stdout.contains("every element checked): passed"),
        "{stdout}"
    );
}

/// `--op strided` on a small storage: one JSON object per (case, path) with the issue's
/// fields, every case and path present, and every checked delivery intact (no timing).
#[test]
fn bench_strided_json_and_checked_deliveries() {
    let json = scratch("strided.json");
    let out = mpirun(
        2,
        &[
            "bench",
            "--op",
            "strided",
            "--strided-storage",
            "32K",
            "--iters",
            "1",
            "--rounds",
            "2",
            "--json",
            json.to_str().unwrap(),
        ],
        &[],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    // 17 cases × 4 paths × (the first message, the warm-up's last, 2 rounds' last).
    assert!(
        stdout.contains("verification (every element of 272 deliveries checked on rank 1): passed"),
        "{stdout}"
    );
    let rows: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = rows.as_array().expect("a JSON array");
    let mut cases = vec!["step 2".to_string()];
    cases.extend((0..=12).map(|k| format!("block {}", 1 << k)));
    cases.extend(["transpose", "permute 3-D", "reversed"].map(String::from));
    assert_eq!(rows.len(), cases.len() * 4);
    for (row, (case, path)) in rows.iter().zip(
        cases
            .iter()
            .flat_map(|c| ["contiguous", "derived", "pack", "auto"].map(|p| (c, p))),
    ) {
        let o = row.as_object().expect("an object");
        // The strided writer's keys, among the common ones (tests/cli_bench.rs).
        for key in ["best_us", "block_elems", "case", "median_us", "path"] {
            assert!(o.contains_key(key), "{key}: {row}");
        }
        assert_eq!(
            (o["case"].as_str(), o["path"].as_str()),
            (Some(case.as_str()), Some(path))
        );
        let block = o["block_elems"].as_u64().unwrap();
        match case.strip_prefix("block ") {
            Some(b) => assert_eq!(block, b.parse::<u64>().unwrap(), "{row}"),
            None => assert_eq!(block, 1, "{row}"),
        }
        let (median, best) = (
            o["median_us"].as_f64().unwrap(),
            o["best_us"].as_f64().unwrap(),
        );
        assert!(median > 0.0 && best > 0.0 && best <= median, "{row}");
    }
}

/// `--op overlap` on a small tensor: one JSON object {case, path, median_us} per (case,
/// path), the all-reduce case's four paths and the posting case's two, the ratio and the
/// posting cost in the text, and every checked call intact (no timing).
#[test]
fn bench_overlap_json() {
    let json = scratch("overlap.json");
    let out = mpirun(
        2,
        &[
            "bench",
            "--op",
            "overlap",
            "--sizes",
            "64K",
            "--iters",
            "20",
            "--rounds",
            "2",
            "--overlap-slices",
            "8",
            "--json",
            json.to_str().unwrap(),
        ],
        &[],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("allreduce-64KiB-f32: posted / max(compute, blocking) = "),
        "{stdout}"
    );
    assert!(
        stdout.contains("post-8B (8 B per rank, iters 20): post "),
        "{stdout}"
    );
    assert!(
        stdout.contains("every element checked): passed"),
        "{stdout}"
    );
    let rows: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = rows.as_array().expect("a JSON array");
    let want = [
        ("allreduce-64KiB-f32", "compute"),
        ("allreduce-64KiB-f32", "blocking"),
        ("allreduce-64KiB-f32", "posted"),
        ("allreduce-64KiB-f32", "raw-posted"),
        ("post-8B", "post"),
        ("post-8B", "raw"),
    ];
    assert_eq!(rows.len(), want.len(), "{rows:?}");
    for (row, (case, path)) in rows.iter().zip(want) {
        let o = row.as_object().expect("an object");
        // The overlap writer's keys, among the common ones (tests/cli_bench.rs).
        for key in ["case", "median_us", "path"] {
            assert!(o.contains_key(key), "{key}: {row}");
        }
        assert_eq!(
            (o["case"].as_str(), o["path"].as_str()),
            (Some(case), Some(path))
        );
        assert!(o["median_us"].as_f64().unwrap() > 0.0, "{row}");
    }
}

/// `--op fused`, small: every path in `--json`, mpi4py's two unless a line says why not.
#[test]
fn bench_fused_json_and_mpi4py_paths() {
    let json = scratch("fused.json").display().to_string();
    let cmd = "bench --op fused --fused-scale 4096 --iters 9 --rounds 1 --json ".to_owned() + &json;
    let out = mpirun(2, &cmd.split(' ').collect::<Vec<_>>(), &[]);
    let stdout = text(&out.stdout);
    let has = |s: &str| stdout.contains(s);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    let skipped = has("mpi4py-loop, mpi4py-concat: skipped (");
    assert_ne!(skipped, has("faster way on every list: "), "{stdout}");
    let rows = std::fs::read_to_string(&json).unwrap();
    // The model lists are built into the binary: a plain clone runs them too.
    for case in ["resnet50", "bert-base", "256x1KiB"] {
        let n = rows.matches(&format!("\"case\": \"{case}\"")).count();
        assert_eq!(n, if skipped { 3 } else { 5 }, "{case}: {rows}");
    }
    let n = rows.matches("\"mpi4py-").count();
    assert_eq!(n, 6 * usize::from(!skipped), "{rows}");
}

#[test]
fn info_reports_cuda_awareness_and_its_source() {
    let out = mpirun(2, &["info"], &[]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout.contains("MPI standard: "), "{stdout}");
    assert!(stdout.contains("ranks: 2 on 1 host(s)"), "{stdout}");
    assert!(stdout.contains("devices: cpu"), "{stdout}");
    let aware = stdout
        .lines()
        .find(|l| l.starts_with("CUDA-aware MPI: "))
        .expect("a CUDA-aware line");
    if stdout.contains("MPI library: Open MPI") {
        // Debian's Open MPI has the cuda extension, built without CUDA.
        assert_eq!(
            aware,
            "CUDA-aware MPI: no (Open MPI's MPIX_Query_cuda_support())"
        );
    }
    let out = mpirun(2, &["info"], &[("DLPACK_MPI_CUDA_AWARE", "1")]);
    assert!(text(&out.stdout).contains("CUDA-aware MPI: yes (set by DLPACK_MPI_CUDA_AWARE)"));
    let out = mpirun(2, &["info"], &[("DLPACK_MPI_CUDA_AWARE", "maybe")]);
    assert!(text(&out.stdout).contains(
        "CUDA-aware MPI: unknown: environment variable DLPACK_MPI_CUDA_AWARE=\"maybe\" is not valid"
    ));
}

/// On a terminal, a progress bar; `script` gives the process one (skipped without it).
#[test]
fn check_progress_bar_on_a_terminal() {
    let have_script = Command::new("script").arg("--version").output().is_ok();
    if !have_script {
        eprintln!("SKIP: no `script` (util-linux) to make a terminal");
        return;
    }
    let log = scratch("tty.log");
    let out = Command::new("script")
        .args(["-qec"])
        .arg(format!(
            "{BIN} check -q --op bcast --dtype int8,int16 --len 1000,65536"
        ))
        .arg(&log)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    let typed = std::fs::read_to_string(&log).unwrap();
    // 2 dtypes × 6 layouts × 2 lengths; the bar shows "k/24", then is cleared.
    assert!(typed.contains("/24 "), "no progress bar: {typed}");
    assert!(typed.contains("24 passed, 0 failed, 0 skipped"), "{typed}");
}

/// The GPU path on a machine without a GPU: `--simulate-device` labels host memory as CUDA
/// memory and simulates the runtime, so every CUDA tensor is staged through pinned buffers.
#[test]
fn check_simulated_cuda_device_is_staged() {
    let json = scratch("gpu.json");
    let out = mpirun(
        2,
        &[
            "check",
            "-v",
            "--device",
            "cuda",
            "--simulate-device",
            "--op",
            "allreduce,sendrecv,bcast",
            "--dtype",
            "float32,int32",
            "--layout",
            "contiguous,step",
            "--len",
            "0,7,1000",
            "--json",
            json.to_str().unwrap(),
        ],
        &[("DLPACK_MPI_CUDA_AWARE", "0")],
    );
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert!(
        stdout.contains("CUDA tensors staged through pinned host buffers"),
        "{stdout}"
    );
    // 3 ops × 2 dtypes × 2 layouts × 3 lengths.
    let pass: Vec<&str> = stdout.lines().filter(|l| l.starts_with("PASS ")).collect();
    assert_eq!(pass.len(), 36, "{stdout}");
    for l in &pass {
        assert!(l.contains("/cuda/staged/"), "{l}");
        assert!(l.ends_with(" [cuda:0 staged]"), "{l}");
    }
    assert!(
        stdout.contains("PASS allreduce/float32/step/cuda/staged/1000 [cuda:0 staged]"),
        "{stdout}"
    );
    assert!(
        stdout.contains("36 passed, 0 failed, 0 skipped"),
        "{stdout}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let cases = report["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 36);
    assert!(cases
        .iter()
        .all(|c| c["device"] == "cuda" && c["transport"] == "staged" && c["route"] == "staged"));

    // `all` with a (simulated) runtime: every device, names unique; -k picks one device.
    let out = mpirun(
        2,
        &[
            "check",
            "--device",
            "all",
            "--simulate-device",
            "--list",
            "-k",
            "bcast/int8/contiguous/*",
            "--len",
            "7",
        ],
        &[("DLPACK_MPI_CUDA_AWARE", "0")],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    let names: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        names,
        [
            "bcast/int8/contiguous/cpu/host/7",
            "bcast/int8/contiguous/cuda-host/host/7",
            "bcast/int8/contiguous/cuda/staged/7",
            "bcast/int8/contiguous/cuda-managed/managed/7",
        ]
    );
}

/// `--device cuda` without a GPU runtime, and `--transport direct` with an MPI that is not
/// CUDA-aware, are refused in one line with exit 2.
#[test]
fn check_gpu_refusals() {
    let mut cases: Vec<(Vec<&str>, &str)> = vec![(
        vec![
            "check",
            "--device",
            "cuda",
            "--simulate-device",
            "--transport",
            "direct",
        ],
        "transport direct is not available: MPI is not CUDA-aware (the answer: no (set by \
         DLPACK_MPI_CUDA_AWARE)); use the staged transport, or set DLPACK_MPI_CUDA_AWARE=1 if \
         this MPI is CUDA-aware",
    )];
    if !cfg!(feature = "cuda") {
        cases.push((
            vec!["check", "--device", "cuda"],
            "dlpack-mpi check: device `cuda` needs a GPU runtime: this build lacks feature `cuda`",
        ));
        cases.push((
            vec!["bench", "--device", "cuda"],
            "dlpack-mpi bench: device `cuda` needs a GPU runtime: this build lacks feature `cuda`",
        ));
    }
    for (args, says) in cases {
        let out = mpirun(2, &args, &[("DLPACK_MPI_CUDA_AWARE", "0")]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        let ours: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("dlpack-mpi"))
            .collect();
        assert_eq!(ours.len(), 1, "{args:?}: {stderr}");
        assert!(ours[0].contains(says), "{args:?}: {stderr}");
        let stdout = text(&out.stdout);
        assert!(stdout.trim().is_empty(), "{args:?}: stdout {stdout}");
    }
}

/// The GPU bench on a simulated device: staged next to the pinned copy and host MPI, with
/// the ratio and every value checked.
#[test]
fn bench_simulated_cuda_device() {
    let out = mpirun(
        2,
        &[
            "bench",
            "--device",
            "cuda",
            "--simulate-device",
            "--sizes",
            "4K,64K",
            "--iters",
            "50",
            "--rounds",
            "2",
        ],
        &[("DLPACK_MPI_CUDA_AWARE", "0")],
    );
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert!(stdout.contains("GPU runtime: simulated device"), "{stdout}");
    assert!(
        stdout.contains("copy = device → pinned host → device copy"),
        "{stdout}"
    );
    assert!(
        stdout.contains("direct = DeviceComm with device pointers (not run: transport direct"),
        "{stdout}"
    );
    for op in ["ping-pong", "allreduce"] {
        assert!(
            stdout.contains(&format!("{op} staged/copy at 64 MiB: not measured")),
            "{stdout}"
        );
    }
    // Two sizes per operation, each verified; the copy and staged columns hold numbers.
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.trim_start().starts_with("4 KiB") || l.trim_start().starts_with("64 KiB"))
        .collect();
    assert_eq!(rows.len(), 4, "{stdout}");
    for r in &rows {
        let cols: Vec<&str> = r.split_whitespace().collect();
        // size (2 words), host, copy, staged, direct, copy GB/s, staged GB/s, ratio, verified
        assert_eq!(cols.len(), 10, "{r}");
        // Times in µs are positive; rates and the ratio are printed with two decimals and
        // read 0.00 when a round is slow on a loaded machine (timing is for benchmarks, not
        // tests), so they need only be finite numbers.
        for c in [&cols[2], &cols[3], &cols[4]] {
            assert!(c.parse::<f64>().is_ok_and(|v| v > 0.0), "{r}");
        }
        for c in [&cols[6], &cols[7], &cols[8]] {
            assert!(
                c.parse::<f64>().is_ok_and(|v| v.is_finite() && v >= 0.0),
                "{r}"
            );
        }
        assert_eq!(cols[5], "—", "{r}");
        assert_eq!(cols[9], "yes", "{r}");
    }
    assert!(
        stdout.contains("values: every delivered element checked: passed"),
        "{stdout}"
    );
}

#[test]
fn info_reports_the_gpu_runtime() {
    let out = mpirun(1, &["info"], &[]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with("GPU runtime: "))
        .unwrap_or_else(|| panic!("no GPU runtime line: {stdout}"));
    if cfg!(feature = "cuda") {
        assert!(
            line.starts_with("GPU runtime: CUDA driver ")
                || line.starts_with("GPU runtime: none: no CUDA driver found"),
            "{line}"
        );
    } else {
        assert_eq!(
            line,
            "GPU runtime: none: this build lacks feature `cuda` (build with `--features cuda`)"
        );
    }
    // Next to the CUDA-awareness line.
    let lines: Vec<&str> = stdout.lines().collect();
    let at = lines.iter().position(|l| *l == line).unwrap();
    assert!(lines[at - 1].starts_with("CUDA-aware MPI: "), "{stdout}");
}

/// `info` says which device each rank would use (or why none); with the simulated runtime it
/// chooses as `check` does: the node-local rank modulo the device count, or `--gpu`.
#[test]
fn info_reports_the_device_selection() {
    let device_lines = |out: &Output| -> Vec<String> {
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{stdout}");
        let lines: Vec<&str> = stdout.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.starts_with("GPU device: "))
            .unwrap_or_else(|| panic!("no GPU device line: {stdout}"));
        // Right after the GPU runtime line.
        assert!(lines[at - 1].starts_with("GPU runtime: "), "{stdout}");
        lines[at..]
            .iter()
            .take_while(|l| !l.starts_with("devices: "))
            .map(|l| l.to_string())
            .collect()
    };
    let plain = device_lines(&mpirun(1, &["info"], &[]));
    if !cfg!(feature = "cuda") {
        assert_eq!(plain, ["GPU device: none (no GPU runtime)"]);
    } else {
        assert_eq!(plain.len(), 1, "{plain:?}");
        assert!(
            plain[0].starts_with("GPU device: CUDA device ")
                || plain[0].starts_with("GPU device: none"),
            "{plain:?}"
        );
    }
    let sim = device_lines(&mpirun(1, &["info", "--simulate-device"], &[]));
    assert_eq!(
        sim,
        ["GPU device: CUDA device 0 of 1 (node-local rank 0 of 1, modulo 1)"]
    );
    // Two ranks on this node, two simulated devices: one each, one line per rank.
    let two = device_lines(&mpirun(
        2,
        &["info", "--simulate-device", "--simulated-devices", "2"],
        &[],
    ));
    assert_eq!(
        two,
        [
            "GPU device: rank 0: CUDA device 0 of 2 (node-local rank 0 of 2, modulo 2)",
            "            rank 1: CUDA device 1 of 2 (node-local rank 1 of 2, modulo 2)",
        ]
    );
    let flag = device_lines(&mpirun(
        1,
        &["info", "--simulate-device", "--gpu", "0"],
        &[],
    ));
    assert_eq!(
        flag,
        ["GPU device: CUDA device 0 of 1 (set by --gpu; node-local rank 0 of 1)"]
    );
    // An unreadable override: info still exits 0 and says why there is no device.
    let bad = device_lines(&mpirun(
        1,
        &["info", "--simulate-device"],
        &[("DLPACK_MPI_DEVICE", "x")],
    ));
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(
        bad[0].starts_with("GPU device: none: ") && bad[0].contains("DLPACK_MPI_DEVICE=\"x\""),
        "{bad:?}"
    );
}

/// `--gpu N` and `DLPACK_MPI_DEVICE`: a device the (simulated, one-device) runtime has runs
/// and the header says which; one it lacks, an unreadable variable, or `--gpu` without a
/// CUDA device is refused in one line with exit 2.
#[test]
fn check_and_bench_gpu_selection() {
    let aware = ("DLPACK_MPI_CUDA_AWARE", "0");
    let run = [
        "check",
        "--device",
        "cuda",
        "--simulate-device",
        "--op",
        "bcast",
        "--dtype",
        "int8",
        "--len",
        "7",
    ];
    let mut with_flag = run.to_vec();
    with_flag.extend(["--gpu", "0"]);
    for (n, args, says) in [
        (
            1,
            &run[..],
            "rank 0 on CUDA device 0 of 1 (node-local rank 0 of 1, modulo 1); CUDA tensors",
        ),
        (
            2,
            &with_flag[..],
            "rank 0 on CUDA device 0 of 1 (set by --gpu; node-local rank 0 of 2); CUDA tensors",
        ),
    ] {
        let out = mpirun(n, args, &[aware]);
        let stdout = text(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{stdout}\n{}",
            text(&out.stderr)
        );
        let header = stdout.lines().next().unwrap_or("");
        assert!(header.starts_with("dlpack-mpi check: "), "{stdout}");
        assert!(header.contains(says), "{header}");
        assert!(stdout.contains("6 passed, 0 failed, 0 skipped"), "{stdout}");
    }
    // Two simulated devices at 2 ranks: rank 1 uses device 1, every case passes.
    let mut two = run.to_vec();
    two.extend(["--simulated-devices", "2", "--op", "allreduce,sendrecv"]);
    let out = mpirun(2, &two, &[aware]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("rank 0 on CUDA device 0 of 2 (node-local rank 0 of 2, modulo 2)"),
        "{stdout}"
    );
    assert!(stdout.contains(" 0 failed, 0 skipped"), "{stdout}");

    let bench = [
        "bench",
        "--device",
        "cuda",
        "--simulate-device",
        "--op",
        "allreduce",
        "--sizes",
        "4K",
        "--iters",
        "5",
        "--rounds",
        "1",
    ];
    let out = mpirun(2, &bench, &[aware]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains(
            "[--simulate-device]; rank 0 on CUDA device 0 of 1 (node-local rank 0 of 2, \
             modulo 1); f32"
        ),
        "{stdout}"
    );

    let mut five = run.to_vec();
    five.extend(["--gpu", "5"]);
    let mut bench5 = bench.to_vec();
    bench5.extend(["--gpu", "5"]);
    // The arguments, an environment variable, and the start of the refusal.
    type Refusal<'a> = (&'a [&'a str], Option<(&'a str, &'a str)>, &'a str);
    let refusals: [Refusal<'_>; 4] = [
        (
            &five,
            None,
            "dlpack-mpi check: cannot use the GPU chosen by --gpu 5: unsupported device \
             (device_type 2, device_id 5)",
        ),
        (
            &bench5,
            None,
            "dlpack-mpi bench: cannot use the GPU chosen by --gpu 5: unsupported device \
             (device_type 2, device_id 5)",
        ),
        (
            &run,
            Some(("DLPACK_MPI_DEVICE", "3")),
            "dlpack-mpi check: cannot use the GPU chosen by DLPACK_MPI_DEVICE=3",
        ),
        (
            &["check", "--gpu", "1"],
            None,
            "dlpack-mpi check: --gpu 1 applies to CUDA device memory, and no CUDA device is \
             selected",
        ),
    ];
    for (args, env, says) in refusals {
        let mut vars = vec![aware];
        vars.extend(env);
        let out = mpirun(2, args, &vars);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        let ours: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("dlpack-mpi"))
            .collect();
        assert_eq!(ours.len(), 1, "{args:?}: {stderr}");
        assert!(ours[0].starts_with(says), "{args:?}: {stderr}");
        assert!(text(&out.stdout).trim().is_empty(), "{args:?}");
    }
}

/// `--producer auto` in a build with Python support whose interpreter imports no Python
/// producer (here NumPy, JAX and Paddle hidden behind packages that raise ImportError, as a
/// virtual environment without them would) says so on every output level: one line on
/// standard error, under `-q` too, naming NumPy's import error; the run goes on with
/// Rust-made tensors and passes.
#[test]
fn auto_producer_fallback_is_said_under_quiet() {
    let dir = scratch("no-python-producers");
    for m in ["numpy", "jax", "paddle"] {
        std::fs::create_dir_all(dir.join(m)).expect("package dir");
        std::fs::write(
            dir.join(m).join("__init__.py"),
            format!("raise ImportError('{m} hidden by tests/cli.rs')\n"),
        )
        .expect("package file");
    }
    let path = dir.to_string_lossy().into_owned();
    let args = [
        "check", "-q", "--op", "bcast", "--dtype", "float32", "--len", "7",
    ];
    let out = mpirun(2, &args, &[("PYTHONPATH", &path)]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert_eq!(
        stdout.lines().last(),
        Some("6 passed, 0 failed, 0 skipped, 0 not applicable"),
        "{stdout}"
    );
    let notice: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("--producer auto: no Python producer"))
        .collect();
    assert_eq!(notice.len(), 1, "{stderr}");
    assert!(
        notice[0].contains("so every tensor is Rust-made")
            && notice[0].contains("numpy hidden by tests/cli.rs"),
        "{}",
        notice[0]
    );
}
