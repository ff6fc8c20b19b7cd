//! `dlpack-mpi check --timeout` under `mpirun`: a rank made to hang in one case (the hidden
//! `--inject-hang PATTERN:RANK`) ends the run within a bound, with exit status 3, a verdict
//! naming the case and the ranks still inside it, and the text, JSON and JUnit reports of
//! the cases before it.
//!
//! `mpirun` is `$DLPACK_MPI_MPIRUN` or `mpirun`, as in tests/cli.rs. Each job is watched
//! here too: one that outlives [`JOB_LIMIT`] is stopped (`SIGTERM` to `mpirun`, which ends
//! its ranks) and the test fails.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_dlpack-mpi");

/// The exit status of a run that a case ended by running past `--timeout` (docs/CLI.md).
const TIMED_OUT: i32 = 3;

/// How long a job may take here before it counts as hung (the runs take about 5 s).
const JOB_LIMIT: Duration = Duration::from_secs(60);

/// How long past `--timeout` a timed-out job may take to end (rank 0 waits up to 2 s for
/// the others' word; the rest is mpirun's start and end on a loaded 2-core machine).
const END_WITHIN: Duration = Duration::from_secs(15);

struct Job {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    took: Duration,
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("dlpack-mpi-cli-timeout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir.join(name)
}

/// `check ARGS` at `n` ranks under mpirun, stopped after [`JOB_LIMIT`]; `tag` names its
/// output files.
fn check(n: u32, args: &[&str], tag: &str) -> Job {
    let launcher = std::env::var("DLPACK_MPI_MPIRUN").unwrap_or_else(|_| "mpirun".into());
    let (out, err) = (
        scratch(&format!("{tag}.out")),
        scratch(&format!("{tag}.err")),
    );
    let started = Instant::now();
    let mut child = Command::new(launcher)
        .args(["-n", &n.to_string(), BIN, "check"])
        .args(args)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).expect("stdout file"))
        .stderr(std::fs::File::create(&err).expect("stderr file"))
        .spawn()
        .expect("mpirun starts");
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if started.elapsed() > JOB_LIMIT {
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
        "still running after {JOB_LIMIT:?}: stopped\n{}\n{}",
        job.stdout,
        job.stderr
    );
    job
}

#[test]
fn hung_rank_ends_the_run_with_the_reports_of_the_cases_before() {
    let (json, junit) = (scratch("hang.json"), scratch("hang.xml"));
    let job = check(
        2,
        &[
            "-v",
            "--producer",
            "rust",
            "--op",
            "allreduce",
            "--dtype",
            "float32",
            "--layout",
            "contiguous,fortran,transposed",
            "--len",
            "7",
            "--timeout",
            "3",
            "--inject-hang",
            "allreduce/float32/transposed/*:1",
            "--json",
            json.to_str().unwrap(),
            "--junit",
            junit.to_str().unwrap(),
        ],
        "hang",
    );
    let all = format!("{}\n{}", job.stdout, job.stderr);
    assert_eq!(job.code, Some(TIMED_OUT), "{all}");
    assert!(job.took >= Duration::from_secs(3), "{:?}: {all}", job.took);
    assert!(
        job.took < Duration::from_secs(3) + END_WITHIN,
        "{:?}: {all}",
        job.took
    );
    // The cases before it, then the verdict: the case and the ranks still inside it.
    let out = &job.stdout;
    assert!(
        out.contains("PASS allreduce/float32/contiguous/cpu/host/7"),
        "{all}"
    );
    assert!(
        out.contains("PASS allreduce/float32/fortran/cpu/host/7"),
        "{all}"
    );
    let verdict = out
        .lines()
        .find(|l| l.starts_with("TIMEOUT allreduce/float32/transposed/cpu/host/7: not done after "))
        .unwrap_or_else(|| panic!("no TIMEOUT line: {all}"));
    assert!(
        verdict.contains("(--timeout 3); still inside it: ranks 0, 1 (running it)"),
        "{verdict}"
    );
    assert!(
        out.contains("\n2 passed, 0 failed, 0 skipped, 0 not applicable\n"),
        "{all}"
    );
    assert!(
        out.contains(
            "TIMEOUT: the run stopped in case 3 of 3, allreduce/float32/transposed/cpu/host/7 \
             (ranks 0, 1 still inside after "
        ),
        "{all}"
    );
    // The hung rank says so on its own standard error.
    assert!(
        job.stderr
            .contains("rank 1: TIMEOUT allreduce/float32/transposed/cpu/host/7: not done after"),
        "{all}"
    );

    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("JSON written")).unwrap();
    assert_eq!(report["passed"], 2);
    assert_eq!(report["failed"], 0);
    let t = &report["timed_out"];
    assert_eq!(t["case"], "allreduce/float32/transposed/cpu/host/7");
    assert_eq!(t["number"], 3);
    assert_eq!(t["limit_seconds"], 3.0);
    assert_eq!(t["ranks_inside"], serde_json::json!([0, 1]));
    let cases = report["cases"].as_array().unwrap();
    let statuses: Vec<&str> = cases
        .iter()
        .map(|c| c["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["pass", "pass", "timeout"], "{report}");
    assert_eq!(cases[1]["name"], "allreduce/float32/fortran/cpu/host/7");

    let xml = std::fs::read_to_string(&junit).expect("JUnit written");
    assert_eq!(xml.matches("<testcase ").count(), 3, "{xml}");
    assert!(
        xml.contains(r#"tests="3" failures="0" errors="1""#),
        "{xml}"
    );
    assert!(xml.contains(r#"type="timeout""#), "{xml}");
}

/// Rank 0 itself hung: its watchdog reports (the main thread sleeps); `-q` prints the
/// verdict too.
#[test]
fn hung_rank_0_still_reports_under_quiet() {
    let job = check(
        2,
        &[
            "-q",
            "--producer",
            "rust",
            "--op",
            "bcast",
            "--dtype",
            "int8",
            "--layout",
            "contiguous",
            "--len",
            "7,1000",
            "--timeout",
            "2",
            "--inject-hang",
            "*/1000:0",
        ],
        "hang0",
    );
    let all = format!("{}\n{}", job.stdout, job.stderr);
    assert_eq!(job.code, Some(TIMED_OUT), "{all}");
    assert!(
        job.took < Duration::from_secs(2) + END_WITHIN,
        "{:?}: {all}",
        job.took
    );
    assert!(
        job.stdout
            .contains("TIMEOUT bcast/int8/contiguous/cpu/host/1000: not done after "),
        "{all}"
    );
    assert!(job.stdout.contains("still inside it: "), "{all}");
    assert!(!job.stdout.contains("PASS "), "-q: {all}");
    assert!(
        job.stdout.contains("\n1 passed, 0 failed, 0 skipped"),
        "{all}"
    );
}

/// The bcast cases of int8 at length 7 at 2 ranks, `--timeout 2`, with `--inject-hang
/// HANG` and a JSON report (its path returned); `tag` names the files.
fn small_run_hung_in(hang: &str, tag: &str) -> (Job, PathBuf) {
    let json = scratch(&format!("{tag}.json"));
    let job = check(
        2,
        &[
            "--producer",
            "rust",
            "--op",
            "bcast",
            "--dtype",
            "int8",
            "--len",
            "7",
            "--timeout",
            "2",
            "--inject-hang",
            hang,
            "--json",
            json.to_str().unwrap(),
        ],
        tag,
    );
    (job, json)
}

/// A hang before the cases, in the mismatch probes: the verdict says so, the JSON report
/// holds no case.
#[test]
fn hang_in_the_mismatch_probes() {
    let (job, json) = small_run_hung_in("probes:1", "probes");
    let all = format!("{}\n{}", job.stdout, job.stderr);
    assert_eq!(job.code, Some(TIMED_OUT), "{all}");
    assert!(
        job.stdout.contains(
            "TIMEOUT: the run stopped in the mismatched-argument probes, before the first case"
        ),
        "{all}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("JSON written")).unwrap();
    assert_eq!(
        report["timed_out"]["case"],
        "the mismatched-argument probes"
    );
    assert_eq!(report["cases"], serde_json::json!([]));
}

/// A rank held up after the cases, before its `MPI_Finalize` (which the other rank's
/// finalize waits for): the cases' verdict was printed and the JSON report written, then
/// that rank ends itself after `--timeout` (at least 5 s) with exit status 3 and a line
/// saying where it was, and the launcher ends the other, which is inside `MPI_Finalize`
/// and would end itself only 10 s later (ranks that end themselves inside `MPI_Finalize`
/// crashed Open MPI 4.1.4's `mpirun` 1 time in 5).
#[test]
fn hang_in_mpi_finalize() {
    let (job, json) = small_run_hung_in("finalize:1", "finalize");
    let all = format!("{}\n{}", job.stdout, job.stderr);
    assert_eq!(job.code, Some(TIMED_OUT), "{all}");
    assert!(job.took < Duration::from_secs(5) + END_WITHIN, "{all}");
    assert!(
        job.stderr.contains(
            "dlpack-mpi: rank 1: not at MPI_Finalize 5 s after the command ended: ending the \
             process (exit status 3)"
        ),
        "{all}"
    );
    assert!(
        !job.stderr.contains("rank 0: MPI_Finalize has not returned"),
        "the launcher ends rank 0: {all}"
    );
    assert!(job.stdout.contains(" passed, 0 failed"), "{all}");
    assert!(
        !job.stdout.contains("TIMEOUT"),
        "the cases did not time out: {all}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("JSON written")).unwrap();
    assert!(report["timed_out"].is_null(), "{report}");
    assert!(
        !report["cases"].as_array().expect("cases").is_empty(),
        "{report}"
    );
}

#[test]
fn timeout_refuses_what_is_not_seconds() {
    for bad in ["-1", "soon", "nan"] {
        let out = Command::new(BIN)
            .args(["check", "--timeout", bad])
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{bad}: {stderr}");
        assert!(stderr.contains("--timeout"), "{bad}: {stderr}");
    }
}
