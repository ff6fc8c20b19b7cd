//! What `--op overlap` measured and how it is shown: its paths, result rows, text table,
//! ratios against the targets, and its `--json` objects. Uses `common` and `json`; measures
//! nothing.

use std::io::Write;

use super::common::{allreduce_factor, fmt_size, met, Samples};
use super::json::JsonRow;

/// Target: posted + computation + wait within this factor of the longer of the computation
/// alone and the blocking all-reduce (medians).
pub const TARGET_OVERLAP_RATIO: f64 = 1.25;
/// Target: posting a nonblocking all-reduce of 8 B costs at most this many µs (median).
pub const TARGET_POST_US: f64 = 2.0;

/// A path of `--op overlap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverlapPath {
    /// The computation alone, every slice, no MPI.
    Compute,
    /// `TensorComm::all_reduce_tensor`.
    Blocking,
    /// `TensorComm::immediate_all_reduce_tensor`, the computation with a `test()` after
    /// every slice until it completes, then `wait()`.
    Posted,
    /// rsmpi's `immediate_all_reduce_into` on slices of the same buffers, then the same
    /// computation and tests: what MPI itself overlaps, without the agreement.
    RawPosted,
    /// The `immediate_all_reduce_tensor` call alone (8 B; its wait is not timed).
    Post,
    /// rsmpi's `immediate_all_reduce_into` call alone on the same 8 B.
    RawPost,
}

/// The paths of an all-reduce case, in measuring and column order.
pub const OVERLAP_PATHS: [OverlapPath; 4] = [
    OverlapPath::Compute,
    OverlapPath::Blocking,
    OverlapPath::Posted,
    OverlapPath::RawPosted,
];

/// The paths of the posting case.
pub const POST_PATHS: [OverlapPath; 2] = [OverlapPath::Post, OverlapPath::RawPost];

impl OverlapPath {
    /// The name in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            OverlapPath::Compute => "compute",
            OverlapPath::Blocking => "blocking",
            OverlapPath::Posted => "posted",
            OverlapPath::RawPosted => "raw-posted",
            OverlapPath::Post => "post",
            OverlapPath::RawPost => "raw",
        }
    }
}

/// Results of one case of `--op overlap`.
#[derive(Debug)]
pub struct OverlapRow {
    /// `allreduce-16MiB-f32`, `post-8B`.
    pub case: String,
    /// Bytes of the all-reduced tensor.
    pub bytes: usize,
    /// Iterations per round.
    pub iters: u64,
    /// µs per iteration (all-reduce cases) or per post (the posting case) of every round,
    /// the slowest rank's, per path.
    pub paths: Vec<(OverlapPath, Samples)>,
    /// The progress of `posted` and `raw-posted` on this rank (empty for the posting case).
    pub progress: [Progress; 2],
}

/// How a posted all-reduce progressed on one rank, per iteration (warm-up included).
#[derive(Debug, Default)]
pub struct Progress {
    /// The `test()` calls up to the one that saw it complete (`slices + 1`: only the final
    /// wait did).
    pub tests: Samples,
    /// µs spent inside the tests and the wait.
    pub in_mpi_us: Samples,
    /// The largest median of `in_mpi_us` over the ranks.
    pub slowest_in_mpi_us: f64,
}

impl Progress {
    /// Adds one iteration's `(tests, seconds in MPI)`.
    pub fn record(&mut self, (tests, in_mpi): (u32, f64)) {
        self.tests.0.push(f64::from(tests));
        self.in_mpi_us.0.push(in_mpi * 1e6);
    }
}

impl OverlapRow {
    /// The samples of `p` (empty when it did not run: every statistic is NaN).
    pub fn get(&self, p: OverlapPath) -> &Samples {
        static NONE: Samples = Samples(Vec::new());
        self.paths
            .iter()
            .find(|(q, _)| *q == p)
            .map_or(&NONE, |(_, s)| s)
    }

    /// `p`'s median over the longer of the medians of `compute` and `blocking`.
    pub fn vs_longer(&self, p: OverlapPath) -> f64 {
        let longer = self
            .get(OverlapPath::Compute)
            .median()
            .max(self.get(OverlapPath::Blocking).median());
        self.get(p).median() / longer
    }
}

/// What `--op overlap` measures and the all-reduce table's column headers.
pub fn print_overlap_header(ranks: i32, rounds: u32, slices: u32, units_per_elem: u64) {
    println!(
        "# overlap: all-reduce (sum of f32) over {ranks} ranks, µs per iteration of the slowest \
         rank; rounds: {rounds}; computation = {units_per_elem} units of arithmetic per element \
         of the tensor (a unit: 8 independent f64 multiply-adds in registers, no memory \
         traffic), in {slices} slices"
    );
    println!(
        "paths: compute = the computation alone; blocking = all_reduce_tensor; posted = \
         immediate_all_reduce_tensor, the computation with a test() after every slice until \
         it completes, then wait(); raw-posted = the same with rsmpi's \
         immediate_all_reduce_into (no agreement); ratio = median / max(compute, blocking)"
    );
    let mut line = format!("{:>22} {:>5}", "case", "iters");
    for p in OVERLAP_PATHS {
        line += &format!(" | {:>14} {:>10}", format!("{} med", p.name()), "best");
    }
    line += &format!(" | {:>6} {:>10}", "posted", "raw-posted");
    println!("{line}");
}

/// One line of the all-reduce table, flushed at once.
pub fn print_overlap_row(r: &OverlapRow) {
    let mut line = format!("{:>22} {:>5}", r.case, r.iters);
    for p in OVERLAP_PATHS {
        let x = r.get(p);
        line += &format!(" | {:>14.1} {:>10.1}", x.median(), x.best());
    }
    line += &format!(
        " | {:>6.3} {:>10.3}",
        r.vs_longer(OverlapPath::Posted),
        r.vs_longer(OverlapPath::RawPosted)
    );
    println!("{line}");
    let _ = std::io::stdout().flush();
}

/// Where in the computation each all-reduce completed, and the ratios against the target.
pub fn print_overlap_summary(rows: &[OverlapRow], slices: u32) {
    for r in rows.iter().filter(|r| !r.progress[0].tests.0.is_empty()) {
        let in_wait = |p: &Progress| {
            let n = p.tests.0.iter().filter(|&&k| k > f64::from(slices)).count();
            format!("{n} of {}", p.tests.0.len())
        };
        for (name, p) in ["posted", "raw-posted"].iter().zip(&r.progress) {
            println!(
                "{}: {name}, medians over every iteration: completed at test() {:.0} of \
                 {slices} on rank 0 ({} iterations only in the final wait); inside test() and \
                 wait() {:.1} µs per iteration on rank 0, {:.1} µs on the slowest rank",
                r.case,
                p.tests.median(),
                in_wait(p),
                p.in_mpi_us.median(),
                p.slowest_in_mpi_us
            );
        }
        let m = r.vs_longer(OverlapPath::Posted);
        println!(
            "{}: posted / max(compute, blocking) = {m:.3} (medians; target ≤ \
             {TARGET_OVERLAP_RATIO:.2}: {}); raw-posted / max(compute, blocking) = {:.3}",
            r.case,
            met(m <= TARGET_OVERLAP_RATIO),
            r.vs_longer(OverlapPath::RawPosted)
        );
    }
}

/// The posting case's line: our post, raw rsmpi's, their ratio, and the target.
pub fn print_post_row(r: &OverlapRow) {
    let (ours, raw) = (r.get(OverlapPath::Post), r.get(OverlapPath::RawPost));
    println!(
        "{} ({} per rank, iters {}): post {:.3} µs median ({:.3} best); raw rsmpi post \
         {:.3} µs median ({:.3} best); post / raw = {:.3}; target post ≤ {TARGET_POST_US:.1} \
         µs: {}",
        r.case,
        fmt_size(r.bytes),
        r.iters,
        ours.median(),
        ours.best(),
        raw.median(),
        raw.best(),
        ours.median() / raw.median(),
        met(ours.median() <= TARGET_POST_US)
    );
}

/// The verdict of the checks after the timing.
pub fn print_overlap_verdict(ok: bool) {
    println!(
        "verification (one call per case and path after the timing, every element \
         checked): {}\n",
        if ok { "passed" } else { "FAILED" }
    );
}

/// The `--json` objects of `rows` over `ranks` ranks: one per (case, path); p50 and p99
/// over the rounds' means (one sample per round); bandwidths for `blocking` only (the other
/// paths' times include the computation, or are the post alone).
pub fn json_rows(rows: &[OverlapRow], ranks: i32) -> Vec<JsonRow> {
    rows.iter()
        .flat_map(|r| {
            r.paths.iter().map(move |(p, s)| {
                let j = JsonRow::new("overlap", &r.case, p.name(), r.bytes)
                    .times(ranks, r.iters, s, s, r.iters);
                if *p == OverlapPath::Blocking {
                    j.bus(r.bytes, allreduce_factor(ranks))
                } else {
                    j
                }
            })
        })
        .collect()
}
