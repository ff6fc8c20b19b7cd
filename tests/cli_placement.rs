//! `dlpack-mpi check`'s placement and alignment axes under `mpirun` at 2 ranks:
//! `--offset` (tensors at byte offsets, through `byte_offset` and a shifted `data`) and
//! `--device SEND:RECV` / `--device mpich-all` (send and receive tensors, or even and odd
//! ranks, on different memories; CUDA memory simulated), by the case names, counts and
//! verdicts they print, the JSON they write, and a failure they report.
//!
//! `mpirun` is `$DLPACK_MPI_MPIRUN` or `mpirun`, as in tests/cli.rs.

use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_dlpack-mpi");

fn mpirun(n: u32, args: &[&str]) -> Output {
    let launcher = std::env::var("DLPACK_MPI_MPIRUN").unwrap_or_else(|_| "mpirun".into());
    Command::new(launcher)
        .args(["-n", &n.to_string(), BIN])
        .args(args)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        .output()
        .expect("mpirun starts")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `check` at 2 ranks with `args`: its standard output, after asserting the exit status.
fn check(args: &[&str], status: i32) -> String {
    let mut all = vec!["check"];
    all.extend_from_slice(args);
    let out = mpirun(2, &all);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(status),
        "{args:?}\n{stdout}\n{}",
        text(&out.stderr)
    );
    stdout
}

/// The case lines of `stdout` with `verdict` (`PASS`, `SKIP`, `FAIL`): `VERDICT name …`
/// (not the summary's `SKIP 3 cases …`).
fn lines<'s>(stdout: &'s str, verdict: &str) -> Vec<&'s str> {
    stdout
        .lines()
        .filter(|l| {
            let mut words = l.split(' ');
            words.next() == Some(verdict) && words.next().is_some_and(|n| n.contains('/'))
        })
        .collect()
}

/// Every offset in both forms beside the aligned case: names end `/off3b`, `/off3p`, … (the
/// aligned one as before), every dtype's values exact, and the JSON names the offset.
#[test]
fn check_offsets_in_both_forms() {
    let json =
        std::env::temp_dir().join(format!("dlpack-mpi-placement-{}.json", std::process::id()));
    let stdout = check(
        &[
            "-v",
            "--producer",
            "rust",
            "--op",
            "allreduce,send-recv,allgatherv,fused-allreduce",
            "--dtype",
            "float16,int32,complex128",
            "--layout",
            "contiguous,negative,step",
            "--len",
            "7",
            "--offset",
            "0,1,4095",
            "--json",
            json.to_str().unwrap(),
        ],
        0,
    );
    // 4 operations × 3 dtypes × 3 layouts × (the aligned case + 2 offsets × 2 forms).
    let pass = lines(&stdout, "PASS");
    assert_eq!(pass.len(), 4 * 3 * 3 * 5, "{stdout}");
    assert!(
        stdout.contains("180 passed, 0 failed, 0 skipped"),
        "{stdout}"
    );
    for part in [
        "/7 ",
        "/7/off1b ",
        "/7/off1p ",
        "/7/off4095b ",
        "/7/off4095p ",
    ] {
        assert_eq!(
            pass.iter().filter(|l| l.contains(part)).count(),
            36,
            "{part}: {stdout}"
        );
    }
    assert!(
        stdout.contains("PASS allreduce/float16/negative/cpu/host/7/off1p [rust]\n"),
        "{stdout}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let cases = report["cases"].as_array().unwrap();
    // The offsets of a case follow it.
    let at = cases
        .iter()
        .position(|c| c["name"] == "allreduce/float16/contiguous/cpu/host/7")
        .unwrap();
    assert!(cases[at].get("offset").is_none(), "{}", cases[at]);
    assert_eq!(
        cases[at + 1]["name"],
        "allreduce/float16/contiguous/cpu/host/7/off1b"
    );
    assert_eq!(cases[at + 1]["offset"], "off1b");
    assert_eq!(cases[at + 2]["offset"], "off1p");
    assert_eq!(
        cases[at + 4]["name"],
        "allreduce/float16/contiguous/cpu/host/7/off4095p"
    );
    let _ = std::fs::remove_file(&json);
}

/// NumPy makes the shifted-pointer form itself (its `__dlpack__` exports `data` at the
/// first element, `byte_offset` 0); the `byte_offset` form, which NumPy cannot make, is
/// Rust's, and each line says who made it.
#[cfg(feature = "python")]
#[test]
fn check_offsets_from_numpy() {
    let stdout = check(
        &[
            "-v",
            "--producer",
            "numpy",
            "--op",
            "bcast,reduce",
            "--dtype",
            "float32,uint16",
            "--layout",
            "contiguous,transposed",
            "--len",
            "7",
            "--offset",
            "3",
        ],
        0,
    );
    let pass = lines(&stdout, "PASS");
    assert_eq!(pass.len(), 2 * 2 * 2 * 2, "{stdout}");
    assert!(pass.iter().all(|l| {
        (l.contains("/off3p ") && l.ends_with("[numpy]"))
            || (l.contains("/off3b ") && l.ends_with("[rust]"))
    }));
}

/// `--device SEND:RECV`: send tensors on one memory, receive tensors on the other, both in
/// the name (`cpu:cuda`, transports `host+staged`) and in the line (`[cpu:0->cuda:0 …]`);
/// a fused list with its send and receive lists on different memories is a skip with the
/// library's reason; with an offset too.
#[test]
fn check_send_and_receive_on_different_memories() {
    let stdout = check(
        &[
            "-v",
            "--producer",
            "rust",
            "--device",
            "cpu:cuda",
            "--simulate-device",
            "--op",
            "send-recv,isend-irecv,allreduce,allreduce-inplace,fused-allreduce-into",
            "--dtype",
            "float32",
            "--layout",
            "contiguous",
            "--len",
            "7",
            "--offset",
            "0,5",
        ],
        0,
    );
    assert!(
        stdout.contains(
            "PASS send-recv/float32/contiguous/cpu:cuda/host+staged/7 [cpu:0->cuda:0 staged] [rust]\n"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "PASS allreduce/float32/contiguous/cpu:cuda/host+staged/7/off5p [cpu:0->cuda:0 staged]"
        ),
        "{stdout}"
    );
    assert_eq!(lines(&stdout, "PASS").len(), 4 * 3, "{stdout}");
    let skips = lines(&stdout, "SKIP");
    assert_eq!(skips.len(), 3, "{stdout}");
    assert!(
        skips.iter().all(|l| l.contains("fused-allreduce-into/")
            && l.contains("a fused list takes one kind of memory")),
        "{stdout}"
    );
    assert!(
        stdout.contains("12 passed, 0 failed, 3 skipped"),
        "{stdout}"
    );
    // The reverse, and host memories only (no GPU runtime needed).
    let stdout = check(
        &[
            "-q",
            "--producer",
            "rust",
            "--device",
            "cuda-host:cpu",
            "--op",
            "gather,scatterv",
            "--len",
            "0,7",
        ],
        0,
    );
    assert!(
        stdout.ends_with(" passed, 0 failed, 0 skipped, 0 not applicable\n"),
        "{stdout}"
    );
}

/// `--device mpich-all`: a case per memory with the even ranks' tensors on it and the odd
/// ranks' on (simulated) CUDA memory, MPICH's `-memtype=all`.
#[test]
fn check_mpich_memtype_all() {
    let stdout = check(
        &[
            "-v",
            "--producer",
            "rust",
            "--device",
            "mpich-all",
            "--simulate-device",
            "--op",
            "allreduce,isend-irecv",
            "--dtype",
            "bfloat16",
            "--layout",
            "step",
            "--len",
            "7",
        ],
        0,
    );
    let pass = lines(&stdout, "PASS");
    assert_eq!(pass.len(), 8, "{stdout}");
    for (even, transport) in [
        ("cpu", "host+staged"),
        ("cuda-host", "host+staged"),
        ("cuda", "staged"),
        ("cuda-managed", "managed+staged"),
    ] {
        let name = format!("allreduce/bfloat16/step/even-{even}+odd-cuda/{transport}/7 [");
        assert!(pass.iter().any(|l| l.contains(&name)), "{name}: {stdout}");
    }
    assert!(stdout.contains("8 passed, 0 failed, 0 skipped"), "{stdout}");
}

/// A wrong value in an offset case, or in a case of two memories, is a failure like any
/// other (`--inject-fault` corrupts what the last rank received): only the matching cases
/// fail, exit status 1.
#[test]
fn check_placement_failures_are_reported() {
    let stdout = check(
        &[
            "-q",
            "--producer",
            "rust",
            "--device",
            "cuda:cpu",
            "--simulate-device",
            "--op",
            "allgather",
            "--dtype",
            "int64",
            "--layout",
            "contiguous",
            "--len",
            "7",
            "--offset",
            "0,2",
            "--inject-fault",
            "*/off2p",
        ],
        1,
    );
    let fails = lines(&stdout, "FAIL");
    assert_eq!(fails.len(), 1, "{stdout}");
    assert!(
        fails[0].starts_with(
            "FAIL allgather/int64/contiguous/cuda:cpu/staged+host/7/off2p [cuda:0->cpu:0 "
        ) && fails[0].contains("rank 1: gathered: first difference at index 3"),
        "{stdout}"
    );
    assert!(stdout.contains("2 passed, 1 failed, 0 skipped"), "{stdout}");
}

/// Refusals in one line, exit status 2: an offset out of range; without feature `cuda`, a
/// placement that needs a GPU runtime (a sweep such as `all:all` leaves the GPU memories out
/// instead).
#[test]
fn check_placement_refusals() {
    let mut cases: Vec<(&[&str], &str)> = vec![(
        &["--offset", "65537"],
        "`65537` is not a number of bytes from 0 to 65536",
    )];
    if !cfg!(feature = "cuda") {
        cases.push((
            &["--device", "cpu:cuda"],
            "device `cpu:cuda` needs a GPU runtime",
        ));
        cases.push((
            &["--device", "mpich-all"],
            "device `mpich-all` needs a GPU runtime",
        ));
    }
    for (args, says) in cases {
        let mut all = vec!["check"];
        all.extend_from_slice(args);
        let out = mpirun(2, &all);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        let ours: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("dlpack-mpi"))
            .collect();
        assert_eq!(ours.len(), 1, "{args:?}: {stderr}");
        assert!(ours[0].contains(says), "{args:?}: {stderr}");
    }
    if !cfg!(feature = "cuda") {
        // Without a GPU runtime: the four placements of the two host memories.
        let listed = check(
            &[
                "--list",
                "--device",
                "all:all",
                "--op",
                "bcast",
                "--dtype",
                "int8",
                "--layout",
                "contiguous",
                "--len",
                "1",
            ],
            0,
        );
        let names: Vec<&str> = listed.lines().collect();
        assert_eq!(
            names,
            [
                "bcast/int8/contiguous/cpu/host/1",
                "bcast/int8/contiguous/cpu:cuda-host/host/1",
                "bcast/int8/contiguous/cuda-host:cpu/host/1",
                "bcast/int8/contiguous/cuda-host/host/1",
            ]
        );
    }
}
