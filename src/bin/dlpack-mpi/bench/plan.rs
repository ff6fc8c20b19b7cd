//! `--op plan`: the planned fused all-reduce ([`TensorComm::plan_all_reduce_tensors_in_place`],
//! sum of f32, in place; one `Plan::run` per iteration) next to today's unplanned fused
//! all-reduce of the same members ([`TensorComm::all_reduce_tensors_in_place`]), to one
//! all-reduce of a single tensor of the same total elements (the limit), to mpi4py's ways on
//! NumPy arrays of the same shapes (the model lists only: `mpi4py-loop`, `mpi4py-concat` as
//! in `--op fused`, [`super::fused_mpi4py`]; `mpi4py-persistent`, one `Allreduce_init` per
//! member once, then `Startall`/`Waitall`, [`super::plan_mpi4py`], MPI-4 only), and, at
//! 8 bytes, to rsmpi's `MPI_Allreduce` on the same buffer (`raw`) and to the checked
//! single-tensor all-reduce. Uses `common`, `json`, `args`, `fused_mpi4py` and
//! `plan_mpi4py`; prints its own table. Not part of `all`.
//!
//! Cases, as `--op fused` (its lists, read from the same files built into the binary): the
//! gradient lists of ResNet-50 (161 tensors) and BERT-base (199), every member's element
//! count divided by `--fused-scale`; 256 tensors of 256 f32 (1 KiB each, never scaled); and
//! `8B`, one tensor of two f32 (never scaled).
//!
//! Paths (every path of a case runs on the same member buffers; the plan is built once per
//! case, before the warm-up, and kept for every round):
//!
//! - **planned**: `plan.run()` (blocking step);
//! - **planned-start**: `plan.start(scope)?.wait()` (the nonblocking step in an rsmpi scope, waited at once);
//! - **fused**: `all_reduce_tensors_in_place` over the plan's members (lent by
//!   `Plan::tensors_mut`: every check and the agreement at every call);
//! - **contiguous** (lists): `all_reduce_tensor_in_place` of one tensor of the list's total
//!   elements;
//! - **raw** (`8B`): rsmpi's `all_reduce_into` (`MPI_Allreduce`, `MPI_SUM` of `MPI_FLOAT`)
//!   from a separate send buffer into the planned member's own elements;
//! - **checked** (`8B`): `all_reduce_tensor_in_place` of the planned member;
//! - **mpi4py-loop**, **mpi4py-concat**, **mpi4py-persistent** (model lists, feature
//!   `python`, skipped with a line when NumPy or mpi4py cannot be used or, for the
//!   persistent way, when mpi4py's MPI is older than MPI-4.0).
//!
//! Timing as `--op fused`: on zeros (sums stay zeros), warm-up then `--rounds` rounds with
//! the paths' order rotated, a round's time the slowest rank's mean per iteration; the
//! table has the median and the best round, `--json` one object per (case, path) with p50
//! and p99 over the rounds. After the timing every path runs once more on distinct values
//! per rank and every element is checked (the planned paths after writing the members
//! through `Plan::tensors_mut`).
//!
//! [`TensorComm::plan_all_reduce_tensors_in_place`]:
//!     dlpack_mpi::comm::TensorComm::plan_all_reduce_tensors_in_place
//! [`TensorComm::all_reduce_tensors_in_place`]:
//!     dlpack_mpi::comm::TensorComm::all_reduce_tensors_in_place

use std::io::Write;

use dlpack_mpi::comm::{Plan, TensorComm};
use dlpack_mpi::dlpack::{acquire, AcquireOptions, ManagedTensor, Tensor};
use dlpack_mpi::dtype::ReduceOp;
use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use super::args::{iters_for, BenchArgs};
use super::common::{
    allreduce_factor, fmt_size, measure_rounds, met, timed, value, Aligned, Elem, Samples, ELEM,
};
use super::fused_mpi4py::{Members, Mpi4py, Way};
use super::json::JsonRow;
use super::plan_mpi4py::{Persistent, PersistentMembers};
use crate::common::all_ranks;

type Res<T> = dlpack_mpi::Result<T>;

/// Target: planned within this factor of contiguous (medians) for `256x1KiB`.
pub const TARGET_PLANNED_VS_CONTIGUOUS: f64 = 1.25;
/// Target: planned at most this factor of unplanned fused, and of mpi4py's fastest way
/// (medians), for the model lists.
pub const TARGET_PLANNED_VS_FUSED: f64 = 1.0;
/// Target: the planned 8-byte step at most this many µs slower than raw (medians).
pub const TARGET_SMALL_OVER_RAW_US: f64 = 0.1;
/// The many-small-tensors case.
const SMALL_CASE: &str = "256x1KiB";
/// The 8-byte case: one tensor of two f32.
const TINY_CASE: &str = "8B";

/// A path of `--op plan`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanPath {
    /// `Plan::run`.
    Planned,
    /// `Plan::start`, then `PlanRequest::wait`.
    PlannedStart,
    /// `all_reduce_tensors_in_place` over the same members.
    Fused,
    /// `all_reduce_tensor_in_place` of one tensor of the list's total elements.
    Contiguous,
    /// rsmpi's `all_reduce_into` into the planned member's elements.
    Raw,
    /// `all_reduce_tensor_in_place` of the planned member.
    Checked,
    /// mpi4py: one `Allreduce(MPI.IN_PLACE, …)` per NumPy member, a Python loop.
    Mpi4pyLoop,
    /// mpi4py: `np.concatenate`, one `Allreduce`, copied back.
    Mpi4pyConcat,
    /// mpi4py: one persistent `Allreduce_init` per member, made once; `Startall`/`Waitall`.
    Mpi4pyPersistent,
}

/// The paths of the lists, in measuring and column order (mpi4py's after them, model
/// lists only, when they load).
const LIST_PATHS: [PlanPath; 4] = [
    PlanPath::Planned,
    PlanPath::PlannedStart,
    PlanPath::Fused,
    PlanPath::Contiguous,
];
/// The paths of the 8-byte case.
const TINY_PATHS: [PlanPath; 4] = [
    PlanPath::Planned,
    PlanPath::PlannedStart,
    PlanPath::Raw,
    PlanPath::Checked,
];
/// mpi4py's paths.
const MPI4PY_PATHS: [PlanPath; 3] = [
    PlanPath::Mpi4pyLoop,
    PlanPath::Mpi4pyConcat,
    PlanPath::Mpi4pyPersistent,
];

impl PlanPath {
    /// The name in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            PlanPath::Planned => "planned",
            PlanPath::PlannedStart => "planned-start",
            PlanPath::Fused => "fused",
            PlanPath::Contiguous => "contiguous",
            PlanPath::Raw => "raw",
            PlanPath::Checked => "checked",
            PlanPath::Mpi4pyLoop => "mpi4py-loop",
            PlanPath::Mpi4pyConcat => "mpi4py-concat",
            PlanPath::Mpi4pyPersistent => "mpi4py-persistent",
        }
    }

    /// `--op fused`'s mpi4py way, for its two paths.
    fn way(self) -> Option<Way> {
        match self {
            PlanPath::Mpi4pyLoop => Some(Way::Loop),
            PlanPath::Mpi4pyConcat => Some(Way::Concat),
            _ => None,
        }
    }
}

/// Results of one case.
#[derive(Debug)]
pub struct PlanRow {
    /// `resnet50`, `bert-base`, `256x1KiB`, `8B`.
    pub case: String,
    /// Members of the list.
    pub tensors: usize,
    /// Total elements of the list.
    pub elems: usize,
    /// Iterations per round.
    pub iters: u64,
    /// Whether the plan's steps start MPI-4 persistent collectives (`Plan::is_persistent`).
    pub persistent: bool,
    /// µs per iteration (one all-reduce of the whole list) of every round, slowest rank.
    pub paths: Vec<(PlanPath, Samples)>,
}

impl PlanRow {
    /// The median of `p` (NaN when it did not run).
    pub fn median(&self, p: PlanPath) -> f64 {
        self.paths
            .iter()
            .find(|(q, _)| *q == p)
            .map_or(f64::NAN, |(_, s)| s.median())
    }

    /// Median of `a` over median of `b` (NaN when either did not run).
    pub fn ratio(&self, a: PlanPath, b: PlanPath) -> f64 {
        self.median(a) / self.median(b)
    }

    /// Median of `a` minus median of `b`, µs.
    pub fn over(&self, a: PlanPath, b: PlanPath) -> f64 {
        self.median(a) - self.median(b)
    }

    /// mpi4py's fastest path (by median), when any ran.
    pub fn mpi4py_best(&self) -> Option<PlanPath> {
        MPI4PY_PATHS
            .into_iter()
            .filter(|p| self.median(*p).is_finite())
            .min_by(|a, b| self.median(*a).total_cmp(&self.median(*b)))
    }
}

/// A list of tensors: its name and every member's shape.
struct List {
    name: String,
    shapes: Vec<Vec<i64>>,
    /// Whether mpi4py's paths run on it (the model lists).
    mpi4py: bool,
}

/// The cases: `--op fused`'s (the model lists that can be read, members divided by
/// `scale`; `256x1KiB`), mpi4py's paths on the model lists only, and `8B`.
fn lists(scale: u64, root: bool) -> Vec<List> {
    let mut out: Vec<List> = super::fused::lists(scale, root)
        .into_iter()
        .map(|l| List {
            mpi4py: l.name != SMALL_CASE,
            name: l.name,
            shapes: l.shapes,
        })
        .collect();
    out.push(List {
        name: TINY_CASE.into(),
        shapes: vec![vec![2]],
        mpi4py: false,
    });
    out
}

/// mpi4py's arrays of one case, for the paths that run.
struct Py {
    /// `--op fused`'s NumPy members (loop and concat).
    members: Option<Members>,
    /// The persistent way's members and requests.
    persistent: Option<PersistentMembers>,
}

impl Py {
    fn none() -> Py {
        Py {
            members: None,
            persistent: None,
        }
    }

    fn missing(path: PlanPath) -> dlpack_mpi::Error {
        dlpack_mpi::Error::Python {
            call: format!("--op plan, path {}", path.name()),
            exception: "NumPy and mpi4py are not loaded".into(),
        }
    }

    /// `iters` iterations of `path`, timed in Python: seconds on this rank.
    fn elapsed(&self, path: PlanPath, iters: u64) -> Res<f64> {
        match (path.way(), &self.members, &self.persistent) {
            (Some(way), Some(m), _) => m.elapsed(way, iters),
            (None, _, Some(p)) if path == PlanPath::Mpi4pyPersistent => p.elapsed(iters),
            _ => Err(Py::missing(path)),
        }
    }

    /// Every element of `path`'s arrays: rank `rank`'s values (`Some`), or zeros.
    fn fill(&self, path: PlanPath, rank: Option<i32>) -> Res<()> {
        match (path.way(), &self.members, &self.persistent) {
            (Some(_), Some(m), _) => m.fill(rank),
            (None, _, Some(p)) if path == PlanPath::Mpi4pyPersistent => p.fill(rank),
            _ => Err(Py::missing(path)),
        }
    }

    /// The first element (index in the list, value) of `path`'s arrays that is not the sum
    /// over `ranks`.
    fn check(&self, path: PlanPath, ranks: i32) -> Res<Option<(usize, f32)>> {
        match (path.way(), &self.members, &self.persistent) {
            (Some(_), Some(m), _) => m.check(ranks),
            (None, _, Some(p)) if path == PlanPath::Mpi4pyPersistent => p.check(ranks),
            _ => Err(Py::missing(path)),
        }
    }
}

/// What the paths of one case run on, the plan's members among them.
struct Steps<'p, 'a, 'm> {
    world: &'a SimpleCommunicator,
    plan: &'p mut Plan<'a, Vec<ManagedTensor<'m>>>,
    /// The one tensor of the list's total elements.
    contig: ManagedTensor<'m>,
    /// The raw path's send buffer: the list's total elements.
    send: Vec<Elem>,
    py: &'p Py,
}

/// `f` for every element of the plan's members in list order, with its index in the list.
fn each_member_elem(
    list: &mut [ManagedTensor<'_>],
    mut f: impl FnMut(usize, &mut Elem),
) -> Res<()> {
    let mut k = 0;
    for t in list {
        for x in t.as_mut_slice::<Elem>()? {
            f(k, x);
            k += 1;
        }
    }
    Ok(())
}

impl Steps<'_, '_, '_> {
    /// One timed run of `iters` iterations of `path`; seconds per iteration of the slowest
    /// rank.
    fn once(&mut self, path: PlanPath, iters: u64) -> Res<f64> {
        let (world, sum) = (self.world, ReduceOp::Sum);
        let elapsed = match path {
            PlanPath::Planned => {
                let plan = &mut *self.plan;
                timed(world, || (0..iters).try_for_each(|_| plan.run()))?
            }
            PlanPath::PlannedStart => {
                let plan = &mut *self.plan;
                timed(world, || {
                    (0..iters).try_for_each(|_| {
                        mpi::request::scope(|scope| plan.start(scope).and_then(|step| step.wait()))
                    })
                })?
            }
            PlanPath::Fused => {
                let list = self.plan.tensors_mut();
                timed(world, || {
                    (0..iters).try_for_each(|_| world.all_reduce_tensors_in_place(list, sum))
                })?
            }
            PlanPath::Contiguous => {
                let t = &mut self.contig;
                timed(world, || {
                    (0..iters).try_for_each(|_| world.all_reduce_tensor_in_place(t, sum))
                })?
            }
            PlanPath::Checked => {
                let list = self.plan.tensors_mut();
                timed(world, || {
                    (0..iters).try_for_each(|_| {
                        list.iter_mut()
                            .try_for_each(|t| world.all_reduce_tensor_in_place(t, sum))
                    })
                })?
            }
            PlanPath::Raw => {
                // Each member's elements, and its part of the send buffer, before the timing.
                let mut pairs = Vec::new();
                let mut rest = &self.send[..];
                for t in self.plan.tensors_mut().iter_mut() {
                    let recv = t.as_mut_slice::<Elem>()?;
                    let (send, after) = rest.split_at(recv.len().min(rest.len()));
                    rest = after;
                    pairs.push((send, recv));
                }
                timed(world, || {
                    for _ in 0..iters {
                        for (send, recv) in pairs.iter_mut() {
                            world.all_reduce_into(*send, &mut **recv, SystemOperation::sum());
                        }
                    }
                    Ok::<(), dlpack_mpi::Error>(())
                })?
            }
            PlanPath::Mpi4pyLoop | PlanPath::Mpi4pyConcat | PlanPath::Mpi4pyPersistent => {
                self.py.elapsed(path, iters)?
            }
        };
        let local = elapsed / iters as f64;
        let mut out = 0.0f64;
        world.all_reduce_into(&local, &mut out, SystemOperation::max());
        Ok(out)
    }

    /// Every element of `path`'s buffers: rank `rank`'s values (`Some`), or zeros; the raw
    /// path's send buffer takes the values and its receive buffer (the member) zeros.
    fn fill(&mut self, path: PlanPath, rank: Option<i32>) -> Res<()> {
        let at = |k: usize| rank.map_or(0.0, |r| value(r, k));
        match path {
            PlanPath::Contiguous => {
                for (k, x) in self.contig.as_mut_slice::<Elem>()?.iter_mut().enumerate() {
                    *x = at(k);
                }
                Ok(())
            }
            PlanPath::Raw => {
                for (k, x) in self.send.iter_mut().enumerate() {
                    *x = at(k);
                }
                each_member_elem(self.plan.tensors_mut(), |_, x| *x = 0.0)
            }
            p if p.way().is_some() || p == PlanPath::Mpi4pyPersistent => self.py.fill(p, rank),
            _ => each_member_elem(self.plan.tensors_mut(), |k, x| *x = at(k)),
        }
    }

    /// Whether `path`'s result holds the sum over `p` ranks of [`value`] (the first wrong
    /// element of the list, if any).
    fn check(&mut self, path: PlanPath, p: i32) -> Res<Option<(usize, f32)>> {
        let want = |k: usize| (0..p).map(|r| value(r, k)).sum::<f32>();
        let got: Vec<Elem> = match path {
            PlanPath::Contiguous => self.contig.as_slice::<Elem>()?.to_vec(),
            p if p.way().is_some() || p == PlanPath::Mpi4pyPersistent => {
                return self.py.check(p, self.world.size());
            }
            _ => {
                let mut all = Vec::new();
                for t in self.plan.tensors() {
                    all.extend_from_slice(t.as_slice::<Elem>()?);
                }
                all
            }
        };
        Ok((0..got.len())
            .find(|&k| got[k] != want(k))
            .map(|k| (k, got[k])))
    }
}

fn acquired(buf: &Aligned) -> Res<ManagedTensor<'_>> {
    acquire(&buf.owned, &AcquireOptions::default())
}

/// One more call of every path on distinct values per rank; whether every element of every
/// path holds the sum (on this rank; a message on stderr for the first wrong one).
fn verify(
    world: &SimpleCommunicator,
    paths: &[PlanPath],
    case: &str,
    st: &mut Steps<'_, '_, '_>,
) -> Res<bool> {
    let mut ok = true;
    for &p in paths {
        st.fill(p, Some(world.rank()))?;
        st.once(p, 1)?;
        if let Some((k, got)) = st.check(p, world.size())? {
            eprintln!(
                "dlpack-mpi bench: rank {}: {case}, {}: element {k} of the list is {got}",
                world.rank(),
                p.name()
            );
            ok = false;
        }
        st.fill(p, None)?;
    }
    Ok(ok)
}

/// mpi4py, when it loaded on every rank: its ways, each `Ok` or why it is skipped.
struct Loaded {
    fused: Result<Mpi4py, String>,
    persistent: Result<Persistent, String>,
}

impl Loaded {
    /// mpi4py's paths that run.
    fn paths(&self) -> Vec<PlanPath> {
        let mut out = Vec::new();
        if self.fused.is_ok() {
            out.extend([PlanPath::Mpi4pyLoop, PlanPath::Mpi4pyConcat]);
        }
        if self.persistent.is_ok() {
            out.push(PlanPath::Mpi4pyPersistent);
        }
        out
    }

    /// The arrays of `list` for the paths that run (none for the lists without mpi4py).
    fn arrays(&self, list: &List) -> Res<Py> {
        if !list.mpi4py {
            return Ok(Py::none());
        }
        let members = self.fused.as_ref().ok();
        let persistent = self.persistent.as_ref().ok();
        Ok(Py {
            members: members.map(|m| m.members(&list.shapes)).transpose()?,
            persistent: persistent.map(|m| m.members(&list.shapes)).transpose()?,
        })
    }
}

/// NumPy and mpi4py when they load on every rank (else why not, rank 0's reason when it has
/// one), and the persistent way where every rank's mpi4py has it.
fn load_mpi4py(world: &SimpleCommunicator) -> Loaded {
    let local = Mpi4py::load(world);
    let fused = if all_ranks(world, local.is_ok()) {
        local
    } else {
        Err(local
            .err()
            .unwrap_or_else(|| "NumPy and mpi4py did not load on every rank".into()))
    };
    let persistent = match &fused {
        Err(why) => Err(why.clone()),
        Ok(_) => {
            let local = Persistent::load();
            if all_ranks(world, local.is_ok()) {
                local
            } else {
                Err(local
                    .err()
                    .unwrap_or_else(|| "the persistent way is not available on every rank".into()))
            }
        }
    };
    Loaded { fused, persistent }
}

/// One case: its row, and whether every path delivered the sum.
fn case(
    world: &SimpleCommunicator,
    args: &BenchArgs,
    mpi4py: &Loaded,
    list: &List,
) -> Res<(PlanRow, bool)> {
    let tiny = list.name == TINY_CASE;
    let mut paths: Vec<PlanPath> = if tiny {
        TINY_PATHS.to_vec()
    } else {
        LIST_PATHS.to_vec()
    };
    if list.mpi4py {
        paths.extend(mpi4py.paths());
    }
    let mut members = Vec::with_capacity(list.shapes.len());
    for s in &list.shapes {
        let n = s.iter().product::<i64>() as usize;
        members.push(Aligned::new(n, 0.0).set_layout(s, None)?);
    }
    let total: usize = list
        .shapes
        .iter()
        .map(|s| s.iter().product::<i64>() as usize)
        .sum();
    let contig = Aligned::new(total, 0.0).set_layout(&[total as i64], None)?;
    let py = mpi4py.arrays(list)?;
    let iters = iters_for(args.iters, total * ELEM);
    let mut ts = members.iter().map(acquired).collect::<Res<Vec<_>>>()?;
    let mut plan = world.plan_all_reduce_tensors_in_place(&mut ts, ReduceOp::Sum)?;
    let persistent = plan.is_persistent();
    let mut st = Steps {
        world,
        plan: &mut plan,
        contig: acquired(&contig)?,
        send: vec![0.0; if tiny { total } else { 0 }],
        py: &py,
    };
    let samples = measure_rounds(world, args.rounds, iters, &paths, |p, it| st.once(p, it))?;
    let ok = verify(world, &paths, &list.name, &mut st)?;
    let row = PlanRow {
        case: list.name.clone(),
        tensors: list.shapes.len(),
        elems: total,
        iters,
        persistent,
        paths: paths.into_iter().zip(samples).collect(),
    };
    Ok((row, ok))
}

/// What `--op plan` measures (and why mpi4py's paths are skipped, if they are).
fn print_header(ranks: i32, args: &BenchArgs, mpi4py: &Loaded) {
    let check = match dlpack_mpi::settings::plan_check() {
        Ok(c) => format!("{c:?}").to_lowercase(),
        Err(e) => format!("unreadable ({e})"),
    };
    let mechanism = match dlpack_mpi::settings::plan_mechanism() {
        Ok(m) => format!("{m:?}").to_lowercase(),
        Err(e) => format!("unreadable ({e})"),
    };
    println!(
        "# plan: all-reduce (sum of f32, in place) of a list of tensors over {ranks} ranks, µs \
         per all-reduce of the whole list, slowest rank; rounds: {}; buckets {} (first {}); \
         plan check {check} (DLPACK_MPI_PLAN_CHECK), mechanism {mechanism} \
         (DLPACK_MPI_PLAN_MECHANISM); model lists' members divided by --fused-scale {}",
        args.rounds,
        fmt_size(dlpack_mpi::settings::bucket_bytes().unwrap_or(0)),
        fmt_size(dlpack_mpi::settings::first_bucket_bytes().unwrap_or(0)),
        args.fused_scale
    );
    println!(
        "paths: planned = plan_all_reduce_tensors_in_place built once per case, then \
         plan.run() per iteration; planned-start = plan.start(scope)?.wait(); fused = \
         all_reduce_tensors_in_place over the same members; contiguous = \
         all_reduce_tensor_in_place of one tensor of the same total elements (the limit); \
         8B: raw = rsmpi all_reduce_into (MPI_Allreduce) into the planned member's elements, \
         checked = all_reduce_tensor_in_place of it"
    );
    match &mpi4py.fused {
        Ok(m) => println!(
            "mpi4py paths, model lists ({}, attached to this MPI_COMM_WORLD; NumPy float32 \
             arrays of the members' shapes; timed in Python): mpi4py-loop, mpi4py-concat as \
             --op fused; mpi4py-persistent = comm.Allreduce_init(MPI.IN_PLACE, a, op=MPI.SUM) \
             per member once, then MPI.Prequest.Startall + MPI.Request.Waitall per iteration",
            m.about()
        ),
        Err(why) => println!("mpi4py-loop, mpi4py-concat, mpi4py-persistent: skipped ({why})"),
    }
    if let (Ok(_), Err(why)) = (&mpi4py.fused, &mpi4py.persistent) {
        println!("mpi4py-persistent: skipped ({why})");
    }
}

/// The table of one case, flushed at once.
fn print_row(r: &PlanRow) {
    let steps = if r.persistent {
        "MPI-4 persistent collectives"
    } else {
        "blocking and nonblocking collectives"
    };
    println!(
        "{} ({} tensors, {}, {} iters; the plan's steps: {steps}):",
        r.case,
        r.tensors,
        fmt_size(r.elems * ELEM),
        r.iters
    );
    for (p, s) in &r.paths {
        println!(
            "  {:>18} median {:>12.3} µs  best {:>12.3} µs",
            p.name(),
            s.median(),
            s.best()
        );
    }
    let _ = std::io::stdout().flush();
}

/// The ratios against the targets, and the verdict of the checks.
fn print_summary(rows: &[PlanRow], ok: bool) {
    use PlanPath::{Checked, Contiguous, Fused, Planned, PlannedStart, Raw};
    for r in rows {
        if r.case == TINY_CASE {
            let d = r.over(Planned, Raw);
            println!(
                "{}: planned − raw = {d:+.3} µs (medians; target ≤ +{TARGET_SMALL_OVER_RAW_US} \
                 µs: {}); planned-start − raw = {:+.3} µs; checked − raw = {:+.3} µs",
                r.case,
                met(d <= TARGET_SMALL_OVER_RAW_US),
                r.over(PlannedStart, Raw),
                r.over(Checked, Raw)
            );
            continue;
        }
        let (pc, pf) = (r.ratio(Planned, Contiguous), r.ratio(Planned, Fused));
        if r.case == SMALL_CASE {
            println!(
                "{}: planned / contiguous = {pc:.3} (medians; target ≤ \
                 {TARGET_PLANNED_VS_CONTIGUOUS:.2}: {}); planned / fused = {pf:.3}; fused / \
                 contiguous = {:.3}",
                r.case,
                met(pc <= TARGET_PLANNED_VS_CONTIGUOUS),
                r.ratio(Fused, Contiguous)
            );
            continue;
        }
        println!(
            "{}: planned / fused = {pf:.3} (medians; target ≤ {TARGET_PLANNED_VS_FUSED:.1}: \
             {}); planned / contiguous = {pc:.3}",
            r.case,
            met(pf <= TARGET_PLANNED_VS_FUSED)
        );
        if let Some(best) = r.mpi4py_best() {
            let pm = r.ratio(Planned, best);
            println!(
                "{}: planned / mpi4py's fastest way = {pm:.3} (medians; its fastest: {}; \
                 target ≤ {TARGET_PLANNED_VS_FUSED:.1}: {})",
                r.case,
                best.name(),
                met(pm <= TARGET_PLANNED_VS_FUSED)
            );
        }
    }
    println!(
        "verification (one call per case and path after the timing, every element checked): \
         {}\n",
        if ok { "passed" } else { "FAILED" }
    );
}

/// Runs `--op plan`: the rows, and whether every checked call delivered the sum.
pub fn plan(world: &SimpleCommunicator, args: &BenchArgs) -> Res<(Vec<PlanRow>, bool)> {
    let root = world.rank() == 0;
    let mpi4py = load_mpi4py(world);
    if root {
        print_header(world.size(), args, &mpi4py);
    }
    let mut rows = Vec::new();
    let mut ok = true;
    for list in lists(args.fused_scale, root) {
        let (row, good) = case(world, args, &mpi4py, &list)?;
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
pub fn json_rows(rows: &[PlanRow], ranks: i32) -> Vec<JsonRow> {
    rows.iter()
        .flat_map(|r| {
            r.paths.iter().map(move |(p, s)| {
                JsonRow::new("plan", &r.case, p.name(), r.elems * ELEM)
                    .times(ranks, r.iters, s, s, r.iters)
                    .bus(r.elems * ELEM, allreduce_factor(ranks))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The model lists parse to `--op fused`'s members and totals; the small cases follow.
    #[test]
    fn cases_are_the_fused_lists_and_two_small_ones() {
        let l = lists(1, false);
        let sizes: Vec<(&str, usize, i64)> = l
            .iter()
            .map(|l| {
                let total = l.shapes.iter().map(|s| s.iter().product::<i64>()).sum();
                (l.name.as_str(), l.shapes.len(), total)
            })
            .collect();
        assert_eq!(
            sizes,
            [
                ("resnet50", 161, 25_557_032),
                ("bert-base", 199, 109_482_240),
                (SMALL_CASE, 256, 65_536),
                (TINY_CASE, 1, 2),
            ]
        );
        let scaled = lists(1000, false);
        assert!(scaled[0].shapes.iter().all(|s| s.len() == 1 && s[0] >= 1));
        assert_eq!(scaled[2].shapes, l[2].shapes, "256x1KiB is never scaled");
        assert!(l[0].mpi4py && l[1].mpi4py && !l[2].mpi4py && !l[3].mpi4py);
    }

    /// Ratios and differences of medians; mpi4py's fastest among the paths that ran.
    #[test]
    fn ratios_and_differences_of_medians() {
        let row = PlanRow {
            case: TINY_CASE.into(),
            tensors: 1,
            elems: 2,
            iters: 1,
            persistent: false,
            paths: vec![
                (PlanPath::Planned, Samples(vec![1.5, 1.25, 1.75])),
                (PlanPath::Raw, Samples(vec![1.0, 1.5])),
                (PlanPath::Mpi4pyLoop, Samples(vec![9.0])),
                (PlanPath::Mpi4pyConcat, Samples(vec![4.0])),
            ],
        };
        assert_eq!(row.over(PlanPath::Planned, PlanPath::Raw), 0.25);
        assert_eq!(row.ratio(PlanPath::Planned, PlanPath::Raw), 1.2);
        assert!(row.median(PlanPath::Fused).is_nan());
        assert_eq!(row.mpi4py_best(), Some(PlanPath::Mpi4pyConcat));
    }
}
