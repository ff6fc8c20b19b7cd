//! What the benches measured and how it is shown: the result rows of the host and GPU
//! benches, their text tables and summaries (rank 0 prints them), their `--json` objects,
//! `--csv` (strided rows too) and `--plot` (SVG through plotters). Uses `common`, `json`,
//! `args` and `strided_report`; measures nothing.

use std::io::Write;

use super::args::{BenchArgs, Op};
use super::common::{
    allreduce_factor, fmt_size, gather_factor, mb_per_s, met, Samples, SAMPLE_MIN_SECS,
};
use super::json::{algbw_gbs, JsonRow};
use super::strided_report::{StridedPath, StridedRow, STRIDED_PATHS};

/// The per-message target at the smallest size, µs (best round, dlpack − raw).
const TARGET_SMALL_US: f64 = 0.05;
/// The ratio target at ≥ 1 MiB (dlpack / raw).
const TARGET_LARGE_RATIO: f64 = 1.02;
const LARGE: usize = 1 << 20;
/// The GPU ratio target (staged bandwidth / pinned-copy bandwidth) at [`GPU_TARGET_BYTES`].
const GPU_TARGET_RATIO: f64 = 0.80;
/// The size at which the GPU ratio target is judged.
pub const GPU_TARGET_BYTES: usize = 64 << 20;

/// A path through which the host benches send messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// rsmpi on plain slices.
    Raw,
    /// Specs built per message, handed to rsmpi.
    Dlpack,
    /// Specs built once per round, handed to rsmpi.
    Reused,
    /// `TensorComm`.
    Checked,
}

/// Every host path, in column order.
pub const PATHS: [Path; 4] = [Path::Raw, Path::Dlpack, Path::Reused, Path::Checked];

impl Path {
    /// The name in tables, CSV and plots.
    pub fn name(self) -> &'static str {
        match self {
            Path::Raw => "raw",
            Path::Dlpack => "dlpack",
            Path::Reused => "reused",
            Path::Checked => "checked",
        }
    }
}

/// Results of one size: samples of every path, in `PATHS` order (`None`: the path does not
/// exist for this operation and layout).
#[derive(Debug)]
pub struct Row {
    /// The operation.
    pub op: Op,
    /// Message size in bytes (per rank's block for all-gatherv and all-to-all).
    pub bytes: usize,
    /// Iterations per round.
    pub iters: u64,
    /// Ranks in the job.
    pub ranks: i32,
    /// Iterations per latency sample.
    pub batch: u64,
    /// µs per message, the mean of every round, per path.
    pub paths: [Option<Samples>; 4],
    /// µs per message of every sample (a batch of `batch` iterations), per path.
    pub samples: [Option<Samples>; 4],
}

/// An empty sample set for paths that did not run (every statistic is NaN).
static NO_SAMPLES: Samples = Samples(Vec::new());

impl Row {
    /// The samples of `p` (empty when it did not run).
    pub fn get(&self, p: Path) -> &Samples {
        self.paths[p as usize].as_ref().unwrap_or(&NO_SAMPLES)
    }

    fn ratio_median(&self, p: Path) -> f64 {
        self.get(p).median() / self.get(Path::Raw).median()
    }

    fn ratio_best(&self, p: Path) -> f64 {
        self.get(p).best() / self.get(Path::Raw).best()
    }

    /// The latency samples of `p` (empty when it did not run).
    pub fn samples_of(&self, p: Path) -> &Samples {
        self.samples[p as usize].as_ref().unwrap_or(&NO_SAMPLES)
    }

    /// The bytes algbw divides by the time and nccl-tests' bus-bandwidth factor, for the
    /// operations that have a bandwidth (all but latency).
    pub fn bus(&self) -> Option<(usize, f64)> {
        let n = self.ranks;
        match self.op {
            Op::Bandwidth => Some((self.bytes, 1.0)),
            Op::Allreduce => Some((self.bytes, allreduce_factor(n))),
            Op::Allgatherv | Op::Alltoall => Some((n as usize * self.bytes, gather_factor(n))),
            _ => None,
        }
    }
}

/// The `--json` objects of the sweeps' rows: one per (size, path that ran).
pub fn json_rows(rows: &[Row]) -> Vec<JsonRow> {
    rows.iter()
        .flat_map(|r| {
            PATHS
                .into_iter()
                .filter(|&p| r.paths[p as usize].is_some())
                .map(move |p| {
                    let j = JsonRow::new(r.op.name(), r.op.name(), p.name(), r.bytes).times(
                        r.ranks,
                        r.iters,
                        r.get(p),
                        r.samples_of(p),
                        r.batch,
                    );
                    match r.bus() {
                        Some((bytes, factor)) => j.bus(bytes, factor),
                        None => j,
                    }
                })
        })
        .collect()
}

/// A path of the GPU bench.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuPath {
    /// rsmpi on host buffers.
    Host,
    /// Device → pinned → device copies, no MPI.
    Copy,
    /// `DeviceComm` through pinned staging.
    Staged,
    /// `DeviceComm` with device pointers.
    Direct,
}

/// Every GPU path, in measuring order.
pub const GPU_PATHS: [GpuPath; 4] = [
    GpuPath::Host,
    GpuPath::Copy,
    GpuPath::Staged,
    GpuPath::Direct,
];

impl GpuPath {
    /// The name in messages.
    pub fn name(self) -> &'static str {
        match self {
            GpuPath::Host => "host",
            GpuPath::Copy => "copy",
            GpuPath::Staged => "staged",
            GpuPath::Direct => "direct",
        }
    }
}

/// One size of one GPU operation: seconds per message/call for every path (NaN: not run),
/// and whether every delivered value was right.
pub struct GpuRow {
    /// Message size in bytes.
    pub bytes: usize,
    /// Median seconds per message or call, per path.
    pub secs: [f64; 4],
    /// The lowest rank's verification problem, on every rank.
    pub verified: Result<(), String>,
}

impl GpuRow {
    /// Staged bandwidth over pinned-copy bandwidth (copy time / staged time).
    pub fn staged_per_copy(&self) -> f64 {
        self.secs[GpuPath::Copy as usize] / self.secs[GpuPath::Staged as usize]
    }
}

/// The first lines of a host run: version, ranks, library, buffers, iterations, and (unless
/// only strided runs) what the paths are.
pub fn print_host_intro(ranks: i32, library: &str, args: &BenchArgs) {
    println!(
        "dlpack-mpi {} bench: ranks: {ranks}; {library}; buffers {}-byte aligned, shared by \
         all paths; iters {} (up to {}), rounds {}; timer resolution {:.3} µs",
        env!("CARGO_PKG_VERSION"),
        super::common::ALIGN,
        args.iters,
        fmt_size(super::args::SCALE_REF),
        args.rounds,
        mpi::time_resolution() * 1e6,
    );
    if !matches!(args.op, Op::Strided | Op::Overlap | Op::Fused | Op::Plan) {
        println!(
            "paths: raw = rsmpi on &[f32] / &mut [f32]; dlpack = SendSpec/RecvSpec built per \
             message + rsmpi; reused = specs built once per round + rsmpi; checked = \
             TensorComm (recv_tensor probes first)\n"
        );
    }
}

/// What `op` measures, how its samples and bandwidths are taken, and the column headers;
/// `all_paths`: every path of [`PATHS`] runs.
pub fn print_sweep_header(op: Op, ranks: i32, args: &BenchArgs, all_paths: bool) {
    let p = ranks;
    let (what, iteration) = match op {
        Op::Latency => (
            "ping-pong, rank 0 <-> rank 1 (others idle), µs per message = half round trip"
                .to_string(),
            "a round trip",
        ),
        Op::Bandwidth => (
            "rank 0 -> rank 1 windows of nonblocking sends (64 messages, at most 64 MiB per \
             window), µs per message; MB/s = 10^6 B/s of the raw path"
                .to_string(),
            "a window",
        ),
        Op::Allreduce => (
            format!("all-reduce (sum) over {p} ranks, µs per call of the slowest rank"),
            "a call",
        ),
        Op::Allgatherv => (
            format!(
                "all-gatherv over {p} ranks, size = each rank's block, µs per call of the \
                 slowest rank"
            ),
            "a call",
        ),
        _ => (
            format!(
                "all-to-all over {p} ranks, size = the block for each rank, µs per call of \
                 the slowest rank"
            ),
            "a call",
        ),
    };
    println!(
        "# {}: {what}; f32, {} layout; rounds: {}; ratio = path / raw",
        op.name(),
        args.layout.name(),
        args.rounds
    );
    print_sample_line(iteration, args.check, op.point_to_point());
    print_bus_line(op, ranks);
    if !all_paths {
        println!(
            "# strided collectives: only the checked path (which packs) runs beside raw \
             (contiguous, same bytes)"
        );
    }
    print_header(op);
}

/// The header line that says what med, best, p50 and p99 are taken over.
fn print_sample_line(iteration: &str, check: bool, point_to_point: bool) {
    let slowest = if point_to_point {
        "rank 0's time"
    } else {
        "the slowest rank's time of each sample"
    };
    if check {
        println!(
            "# --check: every iteration ({iteration}) runs alone after a barrier into receive \
             buffers filled with -1 and every received element is checked after it \
             (untimed); med, best: median and fastest of the rounds' means; p50, p99 over \
             every iteration (batch 1: rounds × iters samples per path, {slowest}); slower \
             than without --check"
        );
    } else {
        println!(
            "# med, best: median and fastest of the rounds' means; p50, p99: percentiles \
             (linear interpolation) of the samples, a sample = the mean of `batch` \
             consecutive iterations ({iteration}) of a round, {slowest}: batch 1 (each \
             iteration timed alone) where an iteration took ≥ {:.0} µs in the warm-up, else \
             the fewest iterations that took {:.0} µs, at most a round; rounds × \
             ⌈iters / batch⌉ samples per path",
            SAMPLE_MIN_SECS * 1e6,
            SAMPLE_MIN_SECS * 1e6,
        );
    }
}

/// The header line of the collectives' bandwidths (nothing for point-to-point).
fn print_bus_line(op: Op, ranks: i32) {
    let (bytes, factor, f) = match op {
        Op::Allreduce => ("the vector", "2(n−1)/n", allreduce_factor(ranks)),
        Op::Allgatherv | Op::Alltoall => (
            "n × the block (nccl-tests' total buffer)",
            "(n−1)/n",
            gather_factor(ranks),
        ),
        _ => return,
    };
    println!(
        "# algbw = bytes / med, bytes = {bytes}; busbw = algbw × {factor} = algbw × {f:.3} \
         (nccl-tests' factor, n = {ranks}); GB/s = 10^9 bytes/s; shown for raw and checked \
         (--json: every path)"
    );
}

fn print_header(op: Op) {
    let mut line = format!(
        "{:>10} {:>8} {:>6} | {:>9} {:>9} {:>9} {:>9}",
        "size", "iters", "batch", "raw med", "best", "p50", "p99"
    );
    let bus = !op.point_to_point();
    if op == Op::Bandwidth {
        line += &format!(" {:>9}", "MB/s");
    } else if bus {
        line += &format!(" {:>7} {:>7}", "algbw", "busbw");
    }
    for name in ["dlpack", "reused", "checked"] {
        line += &format!(
            " | {:>11} {:>9} {:>9} {:>9} {:>7}",
            format!("{name} med"),
            "best",
            "p50",
            "p99",
            "/raw"
        );
    }
    if bus {
        line += &format!(" {:>7} {:>7}", "algbw", "busbw");
    }
    println!("{line}");
}

/// ` algbw busbw` of path `p` of `r`, GB/s.
fn bus_cells(r: &Row, p: Path) -> String {
    match r.bus() {
        Some((bytes, factor)) => {
            let algbw = algbw_gbs(bytes, r.get(p).median());
            format!(" {:>7.3} {:>7.3}", algbw, algbw * factor)
        }
        None => String::new(),
    }
}

/// One line of the host table, flushed at once.
pub fn print_row(r: &Row) {
    let w = r.get(Path::Raw);
    let ws = r.samples_of(Path::Raw);
    let mut line = format!(
        "{:>10} {:>8} {:>6} | {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
        fmt_size(r.bytes),
        r.iters,
        r.batch,
        w.median(),
        w.best(),
        ws.percentile(0.5),
        ws.percentile(0.99)
    );
    let bus = !r.op.point_to_point();
    if r.op == Op::Bandwidth {
        line += &format!(" {:>9.1}", mb_per_s(r.bytes, w.median()));
    } else if bus {
        line += &bus_cells(r, Path::Raw);
    }
    for p in [Path::Dlpack, Path::Reused, Path::Checked] {
        if r.paths[p as usize].is_none() {
            line += &format!(" | {:>11} {:>9} {:>9} {:>9} {:>7}", "-", "-", "-", "-", "-");
            continue;
        }
        let (x, xs) = (r.get(p), r.samples_of(p));
        line += &format!(
            " | {:>11.3} {:>9.3} {:>9.3} {:>9.3} {:>7.4}",
            x.median(),
            x.best(),
            xs.percentile(0.5),
            xs.percentile(0.99),
            r.ratio_median(p),
        );
    }
    if bus {
        line += &bus_cells(r, Path::Checked);
    }
    println!("{line}");
    let _ = std::io::stdout().flush();
}

/// The end of one operation's table: the verdict of the verification (of every iteration
/// too under `check`) and the summary ([`print_summary`]).
pub fn print_sweep_footer(op: Op, rows: &[Row], verified: bool, check: bool) {
    let verdict = if verified { "passed" } else { "FAILED" };
    if check {
        println!(
            "verification (--check: every iteration of every round, and one call per size \
             and path after the timing, every element checked): {verdict}"
        );
    } else {
        println!(
            "verification (one call per size and path after the timing, every element \
             checked): {verdict}"
        );
    }
    print_summary(rows, op == Op::Latency);
    println!();
}

/// Worst (largest) value over `rows` and the size it occurred at, and the geometric mean.
fn worst_and_geomean(rows: &[&Row], f: impl Fn(&Row) -> f64) -> (f64, usize, f64) {
    let mut worst = (f64::NEG_INFINITY, 0);
    let mut log_sum = 0.0;
    for r in rows {
        let v = f(r);
        if v > worst.0 {
            worst = (v, r.bytes);
        }
        log_sum += v.ln();
    }
    (worst.0, worst.1, (log_sum / rows.len() as f64).exp())
}

/// Prints the smallest-size overhead (judged against the 0.05 µs target when `small_target`)
/// and the ≥ 1 MiB ratios against the 2 % target, with the `reused` path as a noise control:
/// it makes exactly the MPI calls of the `dlpack` path with no per-message work, so its
/// spread around 1.0 is what this machine's noise does to a ratio. Rows without the
/// `dlpack` path (strided collectives) get the checked path's ratios only.
fn print_summary(rows: &[Row], small_target: bool) {
    let Some(first) = rows.first() else {
        return;
    };
    if first.paths[Path::Dlpack as usize].is_none() {
        let (w, at, g) = worst_and_geomean(&rows.iter().collect::<Vec<_>>(), |r| {
            r.ratio_median(Path::Checked)
        });
        println!(
            "checked/raw (median): worst {w:.4} (at {}), geomean {g:.4}; raw sends the same \
             bytes contiguously",
            fmt_size(at)
        );
        return;
    }
    let diff = |p: Path| first.get(p).best() - first.get(Path::Raw).best();
    let diff_med = first.get(Path::Dlpack).median() - first.get(Path::Raw).median();
    let judged = if small_target {
        format!(
            "target: best ≤ {TARGET_SMALL_US:.3} µs: {}",
            met(diff(Path::Dlpack) <= TARGET_SMALL_US)
        )
    } else {
        "no target".to_string()
    };
    println!(
        "{}: dlpack − raw = {:+.3} µs best round, {diff_med:+.3} µs median ({judged}); \
         reused − raw = {:+.3} µs, checked − raw = {:+.3} µs (best rounds)",
        fmt_size(first.bytes),
        diff(Path::Dlpack),
        diff(Path::Reused),
        diff(Path::Checked),
    );
    print_large_ratios(rows);
}

/// The ≥ 1 MiB part of [`print_summary`].
fn print_large_ratios(rows: &[Row]) {
    let large: Vec<&Row> = rows.iter().filter(|r| r.bytes >= LARGE).collect();
    if large.is_empty() {
        println!("≥ 1 MiB: no sizes measured");
        return;
    }
    for (what, f) in [
        ("best round", Row::ratio_best as fn(&Row, Path) -> f64),
        ("median", Row::ratio_median),
    ] {
        let (w, at, g) = worst_and_geomean(&large, |r| f(r, Path::Dlpack));
        let (cw, cat, cg) = worst_and_geomean(&large, |r| f(r, Path::Reused));
        println!(
            "≥ 1 MiB, {what}: dlpack/raw worst {w:.4} (at {}), geomean {g:.4} (target ≤ \
             {TARGET_LARGE_RATIO:.2}: worst {}, geomean {}); control reused/raw worst {cw:.4} \
             (at {}), geomean {cg:.4}",
            fmt_size(at),
            met(w <= TARGET_LARGE_RATIO),
            met(g <= TARGET_LARGE_RATIO),
            fmt_size(cat),
        );
    }
}

/// The first lines of a GPU run: `gpu` is rank 0's. `direct`: whether the direct path
/// runs, or why not.
pub fn print_gpu_intro(
    ranks: i32,
    library: &str,
    gpu: &crate::launch::Gpu,
    args: &BenchArgs,
    direct: Result<(), &str>,
) {
    let simulated = gpu.simulated;
    println!(
        "dlpack-mpi {} bench --device cuda: ranks: {ranks}; {}; GPU runtime: {}{}; rank 0 on \
         {}; f32; iters {} (up to {}), rounds {}",
        env!("CARGO_PKG_VERSION"),
        library.split(',').next().unwrap_or(""),
        gpu.runtime.describe(),
        if simulated {
            " [--simulate-device]"
        } else {
            ""
        },
        gpu.selection,
        args.iters,
        fmt_size(super::args::SCALE_REF),
        args.rounds,
    );
    if simulated {
        println!(
            "simulated device: \"device\" memory is host memory and copies are memcpy; \
             these figures test the code path and say nothing about GPU speed"
        );
    }
    println!(
        "paths: host = rsmpi on host Vec<f32>; copy = device → pinned host → device copy of \
         the same bytes (runtime copy_to_host + copy_to_device, no MPI); staged = DeviceComm \
         through pinned buffers; direct = DeviceComm with device pointers ({})\n",
        match direct {
            Ok(()) => "available".to_string(),
            Err(why) => format!("not run: {why}"),
        }
    );
}

fn gbs(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

/// What a GPU operation (`ping-pong` or `allreduce`) measures and the column headers.
pub fn print_gpu_header(op: &str, rounds: u32) {
    println!(
        "{op}: µs per {} (median of {} round(s)); GB/s = 10^9 bytes/s (sizes: K = 2^10, \
         M = 2^20 bytes); staged/copy = staged bandwidth / pinned-copy bandwidth",
        if op == "ping-pong" {
            "message"
        } else {
            "call, slowest rank"
        },
        rounds
    );
    println!(
        "{:>9} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}  verified",
        "size",
        "host µs",
        "copy µs",
        "staged µs",
        "direct µs",
        "copy GB/s",
        "staged GB/s",
        "staged/copy"
    );
}

/// One line of a GPU table.
pub fn print_gpu_row(r: &GpuRow) {
    let us = |p: GpuPath| {
        let s = r.secs[p as usize];
        if s.is_nan() {
            "—".to_string()
        } else {
            format!("{:.2}", s * 1e6)
        }
    };
    let (copy, staged) = (
        r.secs[GpuPath::Copy as usize],
        r.secs[GpuPath::Staged as usize],
    );
    println!(
        "{:>9} {:>11} {:>11} {:>11} {:>11} {:>11.2} {:>11.2} {:>11.2}  {}",
        fmt_size(r.bytes),
        us(GpuPath::Host),
        us(GpuPath::Copy),
        us(GpuPath::Staged),
        us(GpuPath::Direct),
        gbs(r.bytes, copy),
        gbs(r.bytes, staged),
        r.staged_per_copy(),
        match &r.verified {
            Ok(()) => "yes".to_string(),
            Err(why) => format!("NO: {why}"),
        }
    );
}

/// The staged/copy ratio at 64 MiB (`None`: not among the sizes) against its target.
pub fn print_gpu_target(op: &str, at_target: Option<f64>) {
    match at_target {
        Some(r) => println!(
            "{op} staged/copy at 64 MiB: {r:.2} (target ≥ {GPU_TARGET_RATIO:.2} on a real \
             GPU): {}\n",
            met(r >= GPU_TARGET_RATIO)
        ),
        None => {
            println!("{op} staged/copy at 64 MiB: not measured (64 MiB is not among the sizes)\n")
        }
    }
}

/// The last line of a GPU run: whether every delivered value was right.
pub fn print_gpu_values(ok: bool) {
    println!(
        "values: {}",
        if ok {
            "every delivered element checked: passed"
        } else {
            "WRONG VALUES delivered (lines marked NO)"
        }
    );
}

/// One line of `--csv`: a measurement of one path at one size.
#[derive(Debug, serde::Serialize)]
struct CsvRow<'a> {
    op: &'a str,
    layout: &'a str,
    device: &'a str,
    ranks: i32,
    /// Message size in bytes (per rank's block for all-gatherv and all-to-all; the logical
    /// bytes of the view for strided).
    bytes: usize,
    iters: u64,
    path: &'a str,
    /// Median over rounds, µs per message (or per collective call).
    median_us: f64,
    /// Best round, µs per message.
    best_us: f64,
    /// median_us / the baseline's median_us (raw; contiguous for strided).
    ratio_median: f64,
    /// best_us / the baseline's best_us.
    ratio_best: f64,
    /// bytes / median_us: 10^6 bytes per second.
    mb_per_s: f64,
}

/// Writes every measurement of `rows` and `strided` to `path` as CSV (one row per operation,
/// size and path).
pub fn write_csv(
    path: &std::path::Path,
    args: &BenchArgs,
    ranks: i32,
    rows: &[Row],
    strided: &[StridedRow],
) -> Result<(), String> {
    let fail = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let mut w = csv::Writer::from_path(path).map_err(|e| fail(&e))?;
    let device = args.device.name();
    // One line: the operation and layout, size and iterations, the path, its samples and
    // its ratios to the baseline.
    let mut line = |(op, layout): (&str, &str), (bytes, iters), path, x: &Samples, ratios| {
        let (ratio_median, ratio_best) = ratios;
        w.serialize(CsvRow {
            op,
            layout,
            device,
            ranks,
            bytes,
            iters,
            path,
            median_us: x.median(),
            best_us: x.best(),
            ratio_median,
            ratio_best,
            mb_per_s: mb_per_s(bytes, x.median()),
        })
        .map_err(|e| fail(&e))
    };
    for r in rows {
        for p in PATHS {
            if r.paths[p as usize].is_none() {
                continue;
            }
            let ratios = (r.ratio_median(p), r.ratio_best(p));
            let op = (r.op.name(), args.layout.name());
            line(op, (r.bytes, r.iters), p.name(), r.get(p), ratios)?;
        }
    }
    for r in strided {
        let op = format!("strided {}", r.name);
        for p in STRIDED_PATHS {
            let ratios = r.ratios(p, StridedPath::Contiguous);
            line(
                (&op, "strided"),
                (r.bytes, r.iters),
                p.name(),
                r.get(p),
                ratios,
            )?;
        }
    }
    w.flush().map_err(|e| fail(&e))
}

/// Draws, for every operation measured, latency (µs, median) and bandwidth (MB/s) against
/// message size on log–log axes, one curve per path, into an SVG file.
pub fn write_plot(path: &std::path::Path, rows: &[Row], title: &str) -> Result<(), String> {
    use plotters::prelude::*;
    let fail = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let mut ops: Vec<Op> = Vec::new();
    for r in rows {
        if !ops.contains(&r.op) {
            ops.push(r.op);
        }
    }
    if ops.is_empty() {
        return Err(format!("{}: nothing was measured to plot", path.display()));
    }
    let root = SVGBackend::new(path, (1100, 360 * ops.len() as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let root = root
        .titled(title, ("sans-serif", 18))
        .map_err(|e| fail(&e))?;
    let panels = root.split_evenly((ops.len(), 2));
    for (i, op) in ops.iter().enumerate() {
        let mine: Vec<&Row> = rows.iter().filter(|r| r.op == *op).collect();
        for (j, bandwidth) in [false, true].into_iter().enumerate() {
            draw_panel(&panels[2 * i + j], *op, &mine, bandwidth).map_err(|e| fail(&e))?;
        }
    }
    root.present().map_err(|e| fail(&e))
}

/// The error of a plotters drawing call on an SVG file.
type DrawError = plotters::drawing::DrawingAreaErrorKind<std::io::Error>;

/// One panel of [`write_plot`]: the median latency (µs) or, with `bandwidth`, MB/s of `op`
/// against message size, one curve per path; nothing when no path has a positive value.
fn draw_panel(
    area: &plotters::drawing::DrawingArea<
        plotters::backend::SVGBackend<'_>,
        plotters::coord::Shift,
    >,
    op: Op,
    mine: &[&Row],
    bandwidth: bool,
) -> Result<(), DrawError> {
    use plotters::prelude::*;
    let colors = [BLACK, RED, BLUE, GREEN];
    let (lo, hi) = (
        mine.iter().map(|r| r.bytes).min().unwrap_or(1) as f64,
        mine.iter().map(|r| r.bytes).max().unwrap_or(1) as f64,
    );
    let x_range = (lo * 0.8)..(hi * 1.25);
    let point = |r: &Row, p: Path| -> Option<(f64, f64)> {
        let m = r.paths[p as usize].as_ref()?.median();
        let y = if bandwidth { mb_per_s(r.bytes, m) } else { m };
        (y.is_finite() && y > 0.0).then_some((r.bytes as f64, y))
    };
    let ys: Vec<f64> = mine
        .iter()
        .flat_map(|r| PATHS.iter().filter_map(move |&p| point(r, p)))
        .map(|(_, y)| y)
        .collect();
    let y_lo = ys.iter().copied().fold(f64::INFINITY, f64::min);
    let y_hi = ys.iter().copied().fold(0.0, f64::max);
    if ys.is_empty() {
        return Ok(());
    }
    let unit = if bandwidth {
        "MB/s (median)"
    } else {
        "µs per message (median)"
    };
    let mut chart = ChartBuilder::on(area)
        .caption(format!("{}: {unit}", op.name()), ("sans-serif", 15))
        .margin(8)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(
            x_range.log_scale(),
            ((y_lo * 0.8)..(y_hi * 1.25)).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc("message size, bytes")
        .x_label_formatter(&|b| fmt_size(*b as usize))
        .draw()?;
    for (k, &p) in PATHS.iter().enumerate() {
        let pts: Vec<(f64, f64)> = mine.iter().filter_map(|r| point(r, p)).collect();
        if pts.is_empty() {
            continue;
        }
        let color = colors[k];
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
            .label(p.name())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        chart.draw_series(pts.into_iter().map(|xy| Circle::new(xy, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
}
