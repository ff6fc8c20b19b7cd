//! `dlpack-mpi bench` reporting like OSU micro-benchmarks and nccl-tests, under `mpirun` at
//! 2 ranks: `--json` has every operation with p50 ≤ p99 and nccl-tests' algbw/busbw
//! (busbw = algbw × the factor for n = 2), `--check` verifies every iteration and passes,
//! and a wrong value found under `--check` (the hidden `--inject-wrong`) names the
//! operation, size, path, round, iteration and element, with exit status 1.
//!
//! `mpirun` is `$DLPACK_MPI_MPIRUN` or `mpirun`, as in tests/cli.rs; the runs are tiny
//! (a few iterations, 1–2 rounds), a few seconds each.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::{Map, Value};

const BIN: &str = env!("CARGO_BIN_EXE_dlpack-mpi");

/// `bench ARGS` at 2 ranks under mpirun.
fn bench(args: &[&str]) -> Output {
    bench_at(2, args)
}

/// `bench ARGS` at `ranks` ranks under mpirun.
fn bench_at(ranks: u32, args: &[&str]) -> Output {
    let launcher = std::env::var("DLPACK_MPI_MPIRUN").unwrap_or_else(|_| "mpirun".into());
    Command::new(launcher)
        .args(["-n", &ranks.to_string(), BIN, "bench"])
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

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("dlpack-mpi-cli-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir.join(name)
}

/// The keys every `--json` object has (`block_elems` is strided's alone).
const KEYS: [&str; 16] = [
    "algbw_bytes",
    "algbw_gbs",
    "batch_iters",
    "best_us",
    "busbw_factor",
    "busbw_gbs",
    "case",
    "iters",
    "median_us",
    "op",
    "p50_us",
    "p99_us",
    "path",
    "ranks",
    "samples",
    "size_bytes",
];

/// `bench ARGS --json FILE`, exit status 0: the objects of FILE, each with every key.
fn json_run(tag: &str, args: &[&str]) -> (String, Vec<Map<String, Value>>) {
    let json = scratch(&format!("{tag}.json"));
    let mut all = args.to_vec();
    all.extend(["--json", json.to_str().unwrap()]);
    let out = bench(&all);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    let rows: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows: Vec<Map<String, Value>> = rows
        .as_array()
        .expect("a JSON array")
        .iter()
        .map(|r| r.as_object().expect("an object").clone())
        .collect();
    for o in &rows {
        let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
        keys.retain(|k| *k != "block_elems");
        keys.sort_unstable();
        assert_eq!(keys, KEYS, "{o:?}");
        assert_eq!(o["ranks"], 2, "{o:?}");
    }
    (stdout, rows)
}

fn num(o: &Map<String, Value>, key: &str) -> f64 {
    o[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number: {o:?}"))
}

/// `a == b` within float rounding.
fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
}

/// The sweeps: every operation, size and path in one array; p50 ≤ p99; the samples and
/// their batches add up; algbw = algbw_bytes / median and busbw = algbw × nccl-tests'
/// factor at n = 2 (bytes: the vector for all-reduce, 2 × the block for all-gatherv and
/// all-to-all); none for latency.
#[test]
fn json_has_every_operation_with_percentiles_and_bus_bandwidth() {
    let args = "--op all --sizes 8,64K --iters 20 --rounds 2";
    let (stdout, rows) = json_run("sweeps", &args.split(' ').collect::<Vec<_>>());
    assert!(stdout.contains("strided: skipped"), "{stdout}");
    assert!(
        stdout.contains("busbw = algbw × 2(n−1)/n = algbw × 1.000"),
        "{stdout}"
    );
    let ops = [
        "latency",
        "bandwidth",
        "allreduce",
        "allgatherv",
        "alltoall",
    ];
    let paths = ["raw", "dlpack", "reused", "checked"];
    let want: Vec<(&str, u64, &str)> = ops
        .iter()
        .flat_map(|&op| [8u64, 65536].map(|s| (op, s)))
        .flat_map(|(op, s)| paths.map(|p| (op, s, p)))
        .collect();
    let got: Vec<(&str, u64, &str)> = rows
        .iter()
        .map(|o| {
            let (op, path) = (o["op"].as_str().unwrap(), o["path"].as_str().unwrap());
            assert_eq!(o["case"].as_str(), Some(op), "{o:?}");
            (op, o["size_bytes"].as_u64().unwrap(), path)
        })
        .collect();
    assert_eq!(got, want);
    for o in &rows {
        let (p50, p99, median) = (num(o, "p50_us"), num(o, "p99_us"), num(o, "median_us"));
        assert!(0.0 < p50 && p50 <= p99, "{o:?}");
        assert!(
            0.0 < num(o, "best_us") && num(o, "best_us") <= median,
            "{o:?}"
        );
        let (iters, batch) = (num(o, "iters") as u64, num(o, "batch_iters") as u64);
        assert!((1..=iters).contains(&batch), "{o:?}");
        assert_eq!(num(o, "samples") as u64, 2 * iters.div_ceil(batch), "{o:?}");
        let size = num(o, "size_bytes");
        let (bytes, factor) = match o["op"].as_str().unwrap() {
            "latency" => {
                for k in ["algbw_bytes", "algbw_gbs", "busbw_factor", "busbw_gbs"] {
                    assert!(o[k].is_null(), "{k}: {o:?}");
                }
                continue;
            }
            "bandwidth" => (size, 1.0),
            "allreduce" => (size, 1.0),
            _ => (2.0 * size, 0.5),
        };
        assert_eq!(num(o, "algbw_bytes"), bytes, "{o:?}");
        assert_eq!(num(o, "busbw_factor"), factor, "{o:?}");
        let algbw = num(o, "algbw_gbs");
        assert!(close(algbw, bytes / median / 1e3), "{o:?}");
        assert!(close(num(o, "busbw_gbs"), algbw * factor), "{o:?}");
    }
}

/// The JSON of `--op strided`, `overlap`, `fused` and `plan` (tiny): their old keys, the
/// common ones, p50 ≤ p99 over the rounds, and bandwidths where the time is a collective's
/// alone.
#[test]
fn json_of_strided_overlap_and_fused() {
    let runs = [
        "--op strided --strided-storage 32K --iters 1 --rounds 2",
        "--op overlap --sizes 64K --iters 4 --rounds 2 --overlap-slices 4",
        "--op fused --fused-scale 4096 --iters 2 --rounds 2",
        "--op plan --fused-scale 4096 --iters 2 --rounds 2",
    ];
    for (k, args) in runs.iter().enumerate() {
        let (_, rows) = json_run(&format!("other{k}"), &args.split(' ').collect::<Vec<_>>());
        assert!(!rows.is_empty(), "{args}");
        for o in &rows {
            let op = o["op"].as_str().unwrap();
            assert!(args.starts_with(&format!("--op {op} ")), "{args}: {o:?}");
            assert_eq!(o.contains_key("block_elems"), op == "strided", "{o:?}");
            assert_eq!(num(o, "samples"), 2.0, "one sample per round: {o:?}");
            assert!(num(o, "p50_us") <= num(o, "p99_us"), "{o:?}");
            let has_bus = op == "fused" || op == "plan" || o["path"] == "blocking";
            assert_eq!(!o["busbw_gbs"].is_null(), has_bus, "{o:?}");
            if has_bus {
                assert_eq!(num(o, "busbw_factor"), 1.0, "{o:?}");
                assert!(close(num(o, "busbw_gbs"), num(o, "algbw_gbs")), "{o:?}");
            }
        }
    }
}

/// `--op plan` (tiny lists) at 1 and 2 ranks: one JSON object per case and path — the
/// model lists and `256x1KiB` with the planned step (blocking and started), the unplanned
/// fused all-reduce and the contiguous limit, and mpi4py's ways unless a line says why not;
/// `8B` with the planned steps, raw `MPI_Allreduce` and the checked all-reduce — every
/// time positive, every planned step's result checked (the verification line), the
/// targets' lines printed.
#[test]
fn plan_json_rows_at_one_and_two_ranks() {
    for ranks in [1u32, 2] {
        let json = scratch(&format!("plan{ranks}.json"));
        let args = "--op plan --fused-scale 4096 --iters 20 --rounds 2 --json";
        let mut all: Vec<&str> = args.split(' ').collect();
        all.push(json.to_str().unwrap());
        let out = bench_at(ranks, &all);
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
        let verified = "verification (one call per case and path after the timing, every \
                        element checked): passed";
        assert!(stdout.contains(verified), "{stdout}");
        for line in [
            "256x1KiB: planned / contiguous = ",
            "resnet50: planned / fused = ",
            "bert-base: planned / fused = ",
            "8B: planned − raw = ",
        ] {
            assert!(stdout.contains(line), "{line}: {stdout}");
        }
        // mpi4py's ways run on the model lists, or a line says why not.
        let fused_ways =
            !stdout.contains("mpi4py-loop, mpi4py-concat, mpi4py-persistent: skipped (");
        let persistent = fused_ways && !stdout.contains("mpi4py-persistent: skipped (");
        let rows: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let got: Vec<(String, String)> = rows
            .as_array()
            .expect("a JSON array")
            .iter()
            .map(|o| {
                let o = o.as_object().expect("an object");
                assert_eq!(o["op"], "plan", "{o:?}");
                assert_eq!(o["ranks"], ranks, "{o:?}");
                assert_eq!(num(o, "samples"), 2.0, "one sample per round: {o:?}");
                for k in ["median_us", "best_us", "p50_us", "p99_us", "algbw_gbs"] {
                    assert!(num(o, k) > 0.0, "{k}: {o:?}");
                }
                assert!(num(o, "best_us") <= num(o, "median_us"), "{o:?}");
                // nccl-tests' all-reduce factor, 2(n−1)/n: 0 at one rank, 1 at two.
                let factor = 2.0 * f64::from(ranks - 1) / f64::from(ranks);
                assert_eq!(num(o, "busbw_factor"), factor, "{o:?}");
                let busbw = num(o, "algbw_gbs") * factor;
                assert!(close(num(o, "busbw_gbs"), busbw), "{o:?}");
                assert_eq!(num(o, "algbw_bytes"), num(o, "size_bytes"), "{o:?}");
                let case = o["case"].as_str().unwrap().to_string();
                (case, o["path"].as_str().unwrap().to_string())
            })
            .collect();
        let list_paths = ["planned", "planned-start", "fused", "contiguous"];
        let mut want: Vec<(String, String)> = Vec::new();
        for case in ["resnet50", "bert-base", "256x1KiB", "8B"] {
            let mut paths: Vec<&str> = match case {
                "8B" => vec!["planned", "planned-start", "raw", "checked"],
                _ => list_paths.to_vec(),
            };
            if case == "resnet50" || case == "bert-base" {
                if fused_ways {
                    paths.extend(["mpi4py-loop", "mpi4py-concat"]);
                }
                if persistent {
                    paths.push("mpi4py-persistent");
                }
            }
            want.extend(paths.iter().map(|p| (case.to_string(), p.to_string())));
        }
        assert_eq!(got, want, "{ranks} rank(s)");
        let size = |case: &str| {
            let o = rows.as_array().unwrap().iter().find(|o| o["case"] == case);
            o.and_then(|o| o["size_bytes"].as_u64())
        };
        assert_eq!(size("8B"), Some(8));
        assert_eq!(size("256x1KiB"), Some(256 << 10));
    }
}

/// `--check` on every operation of the sweeps: every iteration checked, passed.
#[test]
fn check_verifies_every_iteration_and_passes() {
    let args = "--op all --sizes 8,4K --iters 8 --rounds 2 --check";
    let out = bench(&args.split(' ').collect::<Vec<_>>());
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    let verdict = "verification (--check: every iteration of every round, and one call per \
                   size and path after the timing, every element checked): passed";
    assert_eq!(stdout.matches(verdict).count(), 5, "{stdout}");
    assert!(stdout.contains("# --check: every iteration (a call) runs alone"));
    // Batch 1: one sample per iteration.
    assert!(
        stdout
            .lines()
            .any(|l| l.trim_start().starts_with("4 KiB        8      1 |")),
        "{stdout}"
    );
}

/// A wrong value under `--check` names the operation, size, path, round, iteration and
/// element, and the exit status is 1.
#[test]
fn check_reports_a_wrong_iteration() {
    let args = "--op alltoall --sizes 64 --iters 5 --rounds 1 --check --inject-wrong 3";
    let out = bench(&args.split(' ').collect::<Vec<_>>());
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    // Rank r's first element is rank 0's element 16 r (blocks of 16 f32).
    for rank in 0..2 {
        let line = format!(
            "dlpack-mpi bench: rank {rank}: alltoall via raw: element 0 is -2, expected {} \
             (--check: round 1, iteration 3) (64 B)",
            16 * rank
        );
        assert!(stderr.contains(&line), "{line}\n{stderr}");
    }
    assert!(
        stdout.contains("every element checked): FAILED"),
        "{stdout}"
    );
}
