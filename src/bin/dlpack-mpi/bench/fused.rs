//! `--op fused`: the fused all-reduce of a list of tensors
//! ([`TensorComm::all_reduce_tensors_in_place`], sum of f32) next to one
//! `all_reduce_tensor_in_place` per member and to one `all_reduce_tensor_in_place` of a single
//! tensor of the same total elements (the limit), and to mpi4py's two ways on NumPy arrays of
//! the same shapes (`mpi4py-loop`, `mpi4py-concat`: [`super::fused_mpi4py`]; skipped with a
//! line when this build has no Python or NumPy or mpi4py cannot be used). Uses `common`,
//! `json`, `args` and `fused_mpi4py`; prints its own table. Not part of `all`.
//!
//! Cases: the gradient lists of ResNet-50 (161 tensors, 25.6 M f32) and BERT-base (199,
//! 109.5 M), from `benches/data/gradients-*.txt`, built into the binary (one tensor a line:
//! a name, then its dimensions; `#` comments; a list that does not parse is skipped with a
//! line), every member's element count divided by `--fused-scale` (rounded up); and 256
//! tensors of 256 f32 (1 KiB each, never scaled).
//!
//! Timing runs on zeros (sums stay zeros, no overflow to infinities over the iterations);
//! after the timing every path runs once more on distinct values per rank, and every element
//! is checked. Every path has the same rounds and iterations; a round's time is the slowest
//! rank's.
//!
//! [`TensorComm::all_reduce_tensors_in_place`]: dlpack_mpi::comm::TensorComm::all_reduce_tensors_in_place

use std::io::Write;

use dlpack_mpi::comm::TensorComm;
use dlpack_mpi::dlpack::{acquire, AcquireOptions, ManagedTensor, Tensor};
use dlpack_mpi::dtype::ReduceOp;
use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use super::args::{iters_for, BenchArgs};
use super::common::{
    allreduce_factor, fmt_size, measure_rounds, met, timed, value, Aligned, Samples, ELEM,
};
use super::fused_mpi4py::{Members, Mpi4py, Way};
use super::json::JsonRow;
use crate::common::all_ranks;

type Res<T> = dlpack_mpi::Result<T>;

/// Target: fused within this factor of contiguous (medians) for the model lists.
pub const TARGET_FUSED_VS_CONTIGUOUS: f64 = 1.15;
/// Target: one-by-one at least this many times fused (medians) for `256x1KiB`.
pub const TARGET_SMALL_SPEEDUP: f64 = 10.0;
/// The many-small-tensors case.
const SMALL_CASE: &str = "256x1KiB";

/// A path of `--op fused`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FusedPath {
    /// One `all_reduce_tensor_in_place` per member.
    OneByOne,
    /// One `all_reduce_tensors_in_place` over the list.
    Fused,
    /// One `all_reduce_tensor_in_place` of one tensor of the list's total elements.
    Contiguous,
    /// mpi4py: `comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)` per NumPy member, a Python loop.
    Mpi4pyLoop,
    /// mpi4py: `np.concatenate` of the members, one `Allreduce`, copied back.
    Mpi4pyConcat,
}

/// The Rust paths, in measuring and column order.
pub const RUST_PATHS: [FusedPath; 3] =
    [FusedPath::OneByOne, FusedPath::Fused, FusedPath::Contiguous];
/// The mpi4py paths, columns after the Rust paths (measured in the same rotated rounds) when
/// NumPy and mpi4py load.
pub const MPI4PY_PATHS: [FusedPath; 2] = [FusedPath::Mpi4pyLoop, FusedPath::Mpi4pyConcat];

impl FusedPath {
    /// The name in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            FusedPath::OneByOne => "one-by-one",
            FusedPath::Fused => "fused",
            FusedPath::Contiguous => "contiguous",
            FusedPath::Mpi4pyLoop => "mpi4py-loop",
            FusedPath::Mpi4pyConcat => "mpi4py-concat",
        }
    }

    /// mpi4py's way, for the mpi4py paths.
    fn way(self) -> Option<Way> {
        match self {
            FusedPath::Mpi4pyLoop => Some(Way::Loop),
            FusedPath::Mpi4pyConcat => Some(Way::Concat),
            _ => None,
        }
    }
}

/// Results of one case.
#[derive(Debug)]
pub struct FusedRow {
    /// `resnet50`, `bert-base`, `256x1KiB`.
    pub case: String,
    /// Members of the list.
    pub tensors: usize,
    /// Total elements of the list.
    pub elems: usize,
    /// Iterations per round.
    pub iters: u64,
    /// µs per iteration (one all-reduce of the whole list) of every round, slowest rank.
    pub paths: Vec<(FusedPath, Samples)>,
}

impl FusedRow {
    /// The median of `p` (NaN when it did not run).
    pub fn median(&self, p: FusedPath) -> f64 {
        self.paths
            .iter()
            .find(|(q, _)| *q == p)
            .map_or(f64::NAN, |(_, s)| s.median())
    }

    /// Median of `a` over median of `b`.
    pub fn ratio(&self, a: FusedPath, b: FusedPath) -> f64 {
        self.median(a) / self.median(b)
    }

    /// mpi4py's faster path (by median), when the mpi4py paths ran.
    pub fn mpi4py_best(&self) -> Option<FusedPath> {
        let ran = |p: &FusedPath| self.median(*p).is_finite();
        MPI4PY_PATHS
            .into_iter()
            .filter(ran)
            .min_by(|a, b| self.median(*a).total_cmp(&self.median(*b)))
    }
}

/// A list of tensors: its name and every member's shape.
pub(super) struct List {
    pub(super) name: String,
    pub(super) shapes: Vec<Vec<i64>>,
}

/// Reads a shape list: one tensor a line, a name then its dimensions; `#` starts a comment.
fn parse_shapes(text: &str) -> Result<Vec<Vec<i64>>, String> {
    let mut out = Vec::new();
    for (k, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        let mut words = line.split_whitespace();
        if words.next().is_none() {
            continue;
        }
        let dims = words
            .map(|w| w.parse::<i64>().ok().filter(|&d| d > 0))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| format!("line {}: dimensions are not positive integers", k + 1))?;
        out.push(if dims.is_empty() { vec![1] } else { dims });
    }
    Ok(out)
}

/// The model lists, built into the binary (so that an installed binary and a plain clone
/// both have them): the case's name, the file's name in `benches/data`, its text.
const MODEL_LISTS: [(&str, &str, &str); 2] = [
    (
        "resnet50",
        "gradients-resnet50.txt",
        include_str!("../../../../benches/data/gradients-resnet50.txt"),
    ),
    (
        "bert-base",
        "gradients-bert-base-uncased.txt",
        include_str!("../../../../benches/data/gradients-bert-base-uncased.txt"),
    ),
];

/// The model list `text` (`benches/data/{file}`), every member's elements divided by `scale`
/// (rounded up; the member becomes 1-D); `Err` says why it cannot be read.
fn model_list(name: &str, (file, text): (&str, &str), scale: u64) -> Result<List, String> {
    let shapes = parse_shapes(text).map_err(|e| format!("benches/data/{file}: {e}"))?;
    let shapes = if scale == 1 {
        shapes
    } else {
        let scaled = |s: Vec<i64>| vec![(s.iter().product::<i64>() as u64).div_ceil(scale) as i64];
        shapes.into_iter().map(scaled).collect()
    };
    Ok(List {
        name: name.into(),
        shapes,
    })
}

/// The cases: the two model lists (those that can be read) and `256x1KiB` (also
/// `--op plan`'s, which adds one).
pub(super) fn lists(scale: u64, root: bool) -> Vec<List> {
    let mut out = Vec::new();
    for (name, file, text) in MODEL_LISTS {
        match model_list(name, (file, text), scale) {
            Ok(l) => out.push(l),
            Err(why) if root => println!("{name}: skipped ({why})"),
            Err(_) => {}
        }
    }
    out.push(List {
        name: SMALL_CASE.into(),
        shapes: vec![vec![256]; 256],
    });
    out
}

/// The buffers of one case: every member's, the one contiguous tensor of the total, and the
/// NumPy members of the mpi4py paths (when they run).
struct Bufs {
    members: Vec<(Aligned, usize)>,
    contig: Aligned,
    total: usize,
    py: Option<Members>,
}

impl Bufs {
    fn new(list: &List, mpi4py: Option<&Mpi4py>) -> Res<Self> {
        let mut members = Vec::with_capacity(list.shapes.len());
        for s in &list.shapes {
            let n = s.iter().product::<i64>() as usize;
            members.push((Aligned::new(n, 0.0).set_layout(s, None)?, n));
        }
        let total = members.iter().map(|m| m.1).sum();
        let contig = Aligned::new(total, 0.0).set_layout(&[total as i64], None)?;
        let py = mpi4py.map(|m| m.members(&list.shapes)).transpose()?;
        Ok(Bufs {
            members,
            contig,
            total,
            py,
        })
    }

    /// Every member, acquired.
    fn acquired_members(&self) -> Res<Vec<ManagedTensor<'_>>> {
        self.members.iter().map(|m| acquired(&m.0)).collect()
    }

    /// The NumPy members, for mpi4py's `way`.
    fn numpy(&self, path: FusedPath) -> Res<(&Members, Way)> {
        match (&self.py, path.way()) {
            (Some(m), Some(way)) => Ok((m, way)),
            _ => Err(dlpack_mpi::Error::Python {
                call: format!("--op fused, path {}", path.name()),
                exception: "NumPy and mpi4py are not loaded".into(),
            }),
        }
    }

    /// Every element of `path`'s buffers: rank `rank`'s values (`Some`), or zeros.
    fn fill(&mut self, path: FusedPath, rank: Option<i32>) -> Res<()> {
        let at = |k: usize| rank.map_or(0.0, |r| value(r, k));
        if path.way().is_some() {
            return self.numpy(path)?.0.fill(rank);
        }
        if path == FusedPath::Contiguous {
            let n = self.total;
            for (k, x) in self.contig.raw(n).iter_mut().enumerate() {
                *x = at(k);
            }
            return Ok(());
        }
        let mut k = 0;
        for (buf, n) in &mut self.members {
            for x in buf.raw(*n) {
                *x = at(k);
                k += 1;
            }
        }
        Ok(())
    }

    /// Whether `path`'s buffers hold the sum over `p` ranks of [`value`] (the first wrong
    /// element, if any).
    fn check(&mut self, path: FusedPath, p: i32) -> Res<Option<(usize, f32)>> {
        let want = |k: usize| (0..p).map(|r| value(r, k)).sum::<f32>();
        if path.way().is_some() {
            return self.numpy(path)?.0.check(p);
        }
        if path == FusedPath::Contiguous {
            let n = self.total;
            let got = self.contig.raw(n);
            return Ok((0..n).find(|&k| got[k] != want(k)).map(|k| (k, got[k])));
        }
        let mut base = 0;
        for (buf, n) in &mut self.members {
            let got = buf.raw(*n);
            if let Some(i) = (0..*n).find(|&i| got[i] != want(base + i)) {
                return Ok(Some((base + i, got[i])));
            }
            base += *n;
        }
        Ok(None)
    }
}

fn acquired(buf: &Aligned) -> Res<ManagedTensor<'_>> {
    acquire(&buf.owned, &AcquireOptions::default())
}

/// One timed run of `iters` iterations of `path`; seconds per iteration of the slowest rank.
/// The tensors are acquired before the timing; the mpi4py paths are timed in Python (a
/// barrier, then `perf_counter` around the iterations, in one call).
fn once(world: &SimpleCommunicator, path: FusedPath, bufs: &Bufs, iters: u64) -> Res<f64> {
    let sum = ReduceOp::Sum;
    let elapsed = match path {
        FusedPath::OneByOne => {
            let mut ts = bufs.acquired_members()?;
            timed(world, || {
                for _ in 0..iters {
                    for t in ts.iter_mut() {
                        world.all_reduce_tensor_in_place(t, sum)?;
                    }
                }
                Ok::<(), dlpack_mpi::Error>(())
            })?
        }
        FusedPath::Fused => {
            let mut ts = bufs.acquired_members()?;
            let mut refs: Vec<&mut dyn Tensor> =
                ts.iter_mut().map(|t| t as &mut dyn Tensor).collect();
            timed(world, || {
                (0..iters).try_for_each(|_| world.all_reduce_tensors_in_place(&mut refs, sum))
            })?
        }
        FusedPath::Contiguous => {
            let mut t = acquired(&bufs.contig)?;
            timed(world, || {
                (0..iters).try_for_each(|_| world.all_reduce_tensor_in_place(&mut t, sum))
            })?
        }
        FusedPath::Mpi4pyLoop | FusedPath::Mpi4pyConcat => {
            let (members, way) = bufs.numpy(path)?;
            members.elapsed(way, iters)?
        }
    };
    let local = elapsed / iters as f64;
    let mut out = 0.0f64;
    world.all_reduce_into(&local, &mut out, SystemOperation::max());
    Ok(out)
}

/// One more call of every path on distinct values per rank; whether every element of every
/// path holds the sum (on this rank; a message on stderr for the first wrong one).
fn verify(
    world: &SimpleCommunicator,
    paths: &[FusedPath],
    case: &str,
    bufs: &mut Bufs,
) -> Res<bool> {
    let mut ok = true;
    for &p in paths {
        bufs.fill(p, Some(world.rank()))?;
        once(world, p, bufs, 1)?;
        if let Some((k, got)) = bufs.check(p, world.size())? {
            eprintln!(
                "dlpack-mpi bench: rank {}: {case}, {}: element {k} of the list is {got}",
                world.rank(),
                p.name()
            );
            ok = false;
        }
        bufs.fill(p, None)?;
    }
    Ok(ok)
}

/// One case: its row, and whether every path delivered the sum.
fn case(
    world: &SimpleCommunicator,
    args: &BenchArgs,
    mpi4py: Option<&Mpi4py>,
    list: &List,
) -> Res<(FusedRow, bool)> {
    let paths: Vec<FusedPath> = RUST_PATHS
        .into_iter()
        .chain(mpi4py.into_iter().flat_map(|_| MPI4PY_PATHS))
        .collect();
    let mut bufs = Bufs::new(list, mpi4py)?;
    let iters = iters_for(args.iters, bufs.total * ELEM);
    let samples = measure_rounds(world, args.rounds, iters, &paths, |p, it| {
        once(world, p, &bufs, it)
    })?;
    let ok = verify(world, &paths, &list.name, &mut bufs)?;
    let row = FusedRow {
        case: list.name.clone(),
        tensors: list.shapes.len(),
        elems: bufs.total,
        iters,
        paths: paths.into_iter().zip(samples).collect(),
    };
    Ok((row, ok))
}

/// What `--op fused` measures (and why the mpi4py paths are skipped, if they are) and the
/// column headers.
fn print_header(ranks: i32, args: &BenchArgs, mpi4py: &Result<Mpi4py, String>) {
    println!(
        "# fused: all-reduce (sum of f32, in place) of a list of tensors over {ranks} ranks, µs \
         per all-reduce of the whole list, slowest rank; rounds: {}; buckets {} (first {}); \
         model lists' members divided by --fused-scale {}",
        args.rounds,
        fmt_size(dlpack_mpi::settings::bucket_bytes().unwrap_or(0)),
        fmt_size(dlpack_mpi::settings::first_bucket_bytes().unwrap_or(0)),
        args.fused_scale
    );
    println!(
        "paths: one-by-one = all_reduce_tensor_in_place per member; fused = all_reduce_tensors_in_place \
         over the list; contiguous = all_reduce_tensor_in_place of one tensor of the same \
         total elements (the limit)"
    );
    let mut paths = RUST_PATHS.to_vec();
    match mpi4py {
        Ok(m) => {
            println!(
                "mpi4py paths ({}, attached to this MPI_COMM_WORLD; NumPy float32 arrays of \
                 the members' shapes, on 4 KiB pages as the other paths' buffers unless \
                 NUMPY_MADVISE_HUGEPAGE=1; timed in Python, perf_counter around the \
                 iterations): \
                 mpi4py-loop = comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM) per member in a \
                 Python loop; mpi4py-concat = np.concatenate of the flattened members, one \
                 Allreduce, np.copyto of the slices back into the members",
                m.about()
            );
            paths.extend(MPI4PY_PATHS);
        }
        Err(why) => println!("mpi4py-loop, mpi4py-concat: skipped ({why})"),
    }
    let mut line = format!(
        "{:>10} {:>7} {:>10} {:>6}",
        "case", "tensors", "MiB", "iters"
    );
    for p in &paths {
        line += &format!(" | {:>17} {:>10}", format!("{} med", p.name()), "best");
    }
    line += &format!(" | {:>10} {:>10}", "fus/contig", "1by1/fus");
    if mpi4py.is_ok() {
        line += &format!(" {:>10}", "fus/mpi4py");
    }
    println!("{line}");
}

/// One line of the table, flushed at once.
fn print_row(r: &FusedRow) {
    let mut line = format!(
        "{:>10} {:>7} {:>10.2} {:>6}",
        r.case,
        r.tensors,
        (r.elems * ELEM) as f64 / f64::from(1 << 20),
        r.iters
    );
    for (_, s) in &r.paths {
        line += &format!(" | {:>17.1} {:>10.1}", s.median(), s.best());
    }
    line += &format!(
        " | {:>10.3} {:>10.2}",
        r.ratio(FusedPath::Fused, FusedPath::Contiguous),
        r.ratio(FusedPath::OneByOne, FusedPath::Fused)
    );
    if let Some(best) = r.mpi4py_best() {
        line += &format!(" {:>10.3}", r.ratio(FusedPath::Fused, best));
    }
    println!("{line}");
    let _ = std::io::stdout().flush();
}

/// The ratios against the targets, and the verdict of the checks.
fn print_summary(rows: &[FusedRow], ok: bool) {
    let mut beats_mpi4py = true;
    for r in rows {
        let (fc, of) = (
            r.ratio(FusedPath::Fused, FusedPath::Contiguous),
            r.ratio(FusedPath::OneByOne, FusedPath::Fused),
        );
        if r.case == SMALL_CASE {
            println!(
                "{}: one-by-one / fused = {of:.2} (medians; target ≥ {TARGET_SMALL_SPEEDUP:.0}: \
                 {}); fused / contiguous = {fc:.3}",
                r.case,
                met(of >= TARGET_SMALL_SPEEDUP)
            );
        } else {
            println!(
                "{}: fused / contiguous = {fc:.3} (medians; target ≤ \
                 {TARGET_FUSED_VS_CONTIGUOUS:.2}: {}); one-by-one / fused = {of:.2}",
                r.case,
                met(fc <= TARGET_FUSED_VS_CONTIGUOUS)
            );
        }
        if let Some(best) = r.mpi4py_best() {
            let fm = r.ratio(FusedPath::Fused, best);
            beats_mpi4py &= fm < 1.0;
            println!(
                "{}: fused / min(mpi4py-loop, mpi4py-concat) = {fm:.3} (medians; mpi4py's \
                 faster way: {}; target < 1: {})",
                r.case,
                best.name(),
                met(fm < 1.0)
            );
        }
    }
    if rows.iter().any(|r| r.mpi4py_best().is_some()) {
        println!(
            "fused faster than mpi4py's faster way on every list: {}",
            met(beats_mpi4py)
        );
    }
    println!(
        "verification (one call per case and path after the timing, every element checked): \
         {}\n",
        if ok { "passed" } else { "FAILED" }
    );
}

/// NumPy and mpi4py when they load on every rank; else why not (rank 0's reason when it
/// has one).
fn load_mpi4py(world: &SimpleCommunicator) -> Result<Mpi4py, String> {
    let local = Mpi4py::load(world);
    if all_ranks(world, local.is_ok()) {
        return local;
    }
    match local {
        Err(why) => Err(why),
        Ok(_) => Err("NumPy and mpi4py did not load on every rank".into()),
    }
}

/// Runs `--op fused`: the rows, and whether every checked call delivered the sum.
pub fn fused(world: &SimpleCommunicator, args: &BenchArgs) -> Res<(Vec<FusedRow>, bool)> {
    let root = world.rank() == 0;
    let mpi4py = load_mpi4py(world);
    if root {
        print_header(world.size(), args, &mpi4py);
    }
    let mut rows = Vec::new();
    let mut ok = true;
    for list in lists(args.fused_scale, root) {
        let (row, good) = case(world, args, mpi4py.as_ref().ok(), &list)?;
        if root {
            print_row(&row);
        }
        ok &= good;
        rows.push(row);
    }
    let all_ok = all_ranks(world, ok);
    if root {
        print_summary(&rows, all_ok);
    }
    Ok((rows, all_ok))
}

/// The `--json` objects of `rows` over `ranks` ranks: one per (case, path); p50 and p99
/// over the rounds' means (one sample per round); the bandwidths of an all-reduce of the
/// whole list.
pub fn json_rows(rows: &[FusedRow], ranks: i32) -> Vec<JsonRow> {
    rows.iter()
        .flat_map(|r| {
            r.paths.iter().map(move |(p, s)| {
                JsonRow::new("fused", &r.case, p.name(), r.elems * ELEM)
                    .times(ranks, r.iters, s, s, r.iters)
                    .bus(r.elems * ELEM, allreduce_factor(ranks))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The built-in model lists parse to the members and totals their headers state.
    #[test]
    fn model_lists_are_built_in() {
        let sizes: Vec<(usize, i64)> = MODEL_LISTS
            .iter()
            .map(|&(name, file, text)| {
                let l = model_list(name, (file, text), 1).expect("parses");
                let total = l.shapes.iter().map(|s| s.iter().product::<i64>()).sum();
                (l.shapes.len(), total)
            })
            .collect();
        assert_eq!(sizes, [(161, 25_557_032), (199, 109_482_240)]);
        let scaled = model_list("resnet50", (MODEL_LISTS[0].1, MODEL_LISTS[0].2), 1000).unwrap();
        assert!(scaled.shapes.iter().all(|s| s.len() == 1 && s[0] >= 1));
    }
}
