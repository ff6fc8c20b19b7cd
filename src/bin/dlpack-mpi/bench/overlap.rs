//! `--op overlap`: a nonblocking all-reduce overlapped with a computation, against the
//! blocking all-reduce and the computation alone, and the cost of posting one. Uses
//! `common`, `args` and `overlap_report`.
//!
//! The computation is arithmetic in registers (8 independent f64 multiply-add chains, no
//! memory traffic, so it does not compete with the all-reduce for memory bandwidth), a fixed
//! `--overlap-work` units per element of the tensor (by default
//! [`OVERLAP_UNITS_PER_ELEM`](super::args::OVERLAP_UNITS_PER_ELEM)), split into
//! `--overlap-slices` equal slices with a `test()` of the pending request after each slice
//! until it completes; then the remaining slices run without tests and `wait()` ends the
//! iteration.

use std::time::Instant;

use dlpack_mpi::comm::{TensorComm, TensorRequest};
use dlpack_mpi::dlpack::{acquire, AcquireOptions, ManagedTensor};
use dlpack_mpi::dtype::ReduceOp;
use mpi::collective::SystemOperation;
use mpi::request::{scope, Request, Scope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use super::args::{iters_for, BenchArgs, DEFAULT_MAX_SIZE};
use super::common::{fmt_size, measure_rounds, timed, value, Aligned, ELEM};
use super::overlap_report::{
    print_overlap_header, print_overlap_row, print_overlap_summary, print_overlap_verdict,
    print_post_row, OverlapPath, OverlapRow, Progress, OVERLAP_PATHS, POST_PATHS,
};
use crate::common::all_ranks;

type Res<T> = dlpack_mpi::Result<T>;

/// Bytes of the posting case.
const POST_BYTES: usize = 8;
/// Independent multiply-add chains of one unit.
const LANES: usize = 8;

/// `units` units of arithmetic: every lane `x ← x·a + b` (converging to 1, never
/// overflowing), then the lanes hidden from the optimizer.
fn compute(units: u64, lanes: &mut [f64; LANES]) {
    const A: f64 = 0.999_999;
    const B: f64 = 1e-6;
    for _ in 0..units {
        for x in lanes.iter_mut() {
            *x = *x * A + B;
        }
    }
    *lanes = std::hint::black_box(*lanes);
}

/// A pending nonblocking operation the computation tests between its slices.
trait Pending: Sized {
    /// `MPI_Test`: `Ok` with the outcome when complete, `Err(self)` while pending.
    fn poll(self) -> std::result::Result<Res<()>, Self>;
    /// `MPI_Wait`.
    fn finish(self) -> Res<()>;
}

impl<'a, Sc: Scope<'a>> Pending for TensorRequest<'a, Sc> {
    fn poll(self) -> std::result::Result<Res<()>, Self> {
        self.test().map(|done| done.map(drop))
    }

    fn finish(self) -> Res<()> {
        self.wait().map(drop)
    }
}

impl<'a, B: ?Sized, Sc: Scope<'a>> Pending for Request<'a, B, Sc> {
    fn poll(self) -> std::result::Result<Res<()>, Self> {
        self.test().map(|_| Ok(()))
    }

    fn finish(self) -> Res<()> {
        self.wait();
        Ok(())
    }
}

/// One all-reduce case: the world, the tensor's elements and the computation's slices.
struct Case<'w> {
    world: &'w SimpleCommunicator,
    /// Elements of the tensor.
    n: usize,
    slices: u32,
    /// Units per slice.
    per_slice: u64,
}

fn acquired(buf: &Aligned) -> Res<ManagedTensor<'_>> {
    acquire(&buf.owned, &AcquireOptions::default())
}

/// The slowest rank's seconds per iteration of `elapsed` seconds over `iters` (collective).
fn slowest(world: &SimpleCommunicator, elapsed: f64, iters: u64) -> f64 {
    let local = elapsed / iters as f64;
    let mut out = 0.0f64;
    world.all_reduce_into(&local, &mut out, SystemOperation::max());
    out
}

impl Case<'_> {
    /// The computation, testing `pending` after every slice until it completes, then its
    /// wait: the number of tests up to the one that saw it complete (`slices + 1`: only the
    /// wait did), and the seconds spent inside the tests and the wait.
    fn overlapped(&self, pending: impl Pending, lanes: &mut [f64; LANES]) -> Res<(u32, f64)> {
        let mut pending = Some(pending);
        let mut tests = self.slices + 1;
        let mut in_mpi = 0.0;
        for k in 1..=self.slices {
            compute(self.per_slice, lanes);
            if let Some(p) = pending.take() {
                let start = Instant::now();
                let polled = p.poll();
                in_mpi += start.elapsed().as_secs_f64();
                match polled {
                    Ok(done) => {
                        done?;
                        tests = k;
                    }
                    Err(p) => pending = Some(p),
                }
            }
        }
        if let Some(p) = pending {
            let start = Instant::now();
            p.finish()?;
            in_mpi += start.elapsed().as_secs_f64();
        }
        Ok((tests, in_mpi))
    }

    /// One timed run of `iters` iterations of `path` (an all-reduce path); seconds per
    /// iteration of the slowest rank. `posted` and `raw-posted` record this rank's progress
    /// in `progress`.
    fn once(
        &self,
        path: OverlapPath,
        bufs: &mut [Aligned; 2],
        iters: u64,
        progress: &mut [Progress; 2],
    ) -> Res<f64> {
        let (world, sum) = (self.world, SystemOperation::sum());
        let mut lanes = [1.5f64; LANES];
        let [send, recv] = bufs;
        let elapsed = match path {
            OverlapPath::Compute => timed(world, || {
                for _ in 0..iters * u64::from(self.slices) {
                    compute(self.per_slice, &mut lanes);
                }
                Ok::<(), dlpack_mpi::Error>(())
            })?,
            OverlapPath::Blocking => {
                let (s, mut r) = (acquired(send)?, acquired(recv)?);
                timed(world, || {
                    (0..iters).try_for_each(|_| world.all_reduce_tensor(&s, &mut r, ReduceOp::Sum))
                })?
            }
            OverlapPath::Posted => {
                let (s, mut r) = (acquired(send)?, acquired(recv)?);
                timed(world, || {
                    for _ in 0..iters {
                        let got = scope(|sc| {
                            let q =
                                world.immediate_all_reduce_tensor(sc, &s, &mut r, ReduceOp::Sum)?;
                            self.overlapped(q, &mut lanes)
                        })?;
                        progress[0].record(got);
                    }
                    Ok(())
                })?
            }
            _ => {
                let (s, r) = (send.raw(self.n), recv.raw(self.n));
                timed(world, || {
                    for _ in 0..iters {
                        let got = scope(|sc| {
                            let q = world.immediate_all_reduce_into(sc, &*s, &mut *r, sum);
                            self.overlapped(q, &mut lanes)
                        })?;
                        progress[1].record(got);
                    }
                    Ok(())
                })?
            }
        };
        Ok(slowest(world, elapsed, iters))
    }
}

/// One timed run of `iters` posts of `path` (`post` or `raw`) on `n` elements, each waited
/// for untimed; seconds per post of the slowest rank.
fn post_once(
    world: &SimpleCommunicator,
    path: OverlapPath,
    bufs: &mut [Aligned; 2],
    n: usize,
    iters: u64,
) -> Res<f64> {
    let [send, recv] = bufs;
    let mut posting = 0.0f64;
    world.barrier();
    if path == OverlapPath::Post {
        let (s, mut r) = (acquired(send)?, acquired(recv)?);
        for _ in 0..iters {
            scope(|sc| {
                let start = Instant::now();
                let q = world.immediate_all_reduce_tensor(sc, &s, &mut r, ReduceOp::Sum);
                posting += start.elapsed().as_secs_f64();
                q?.wait().map(drop)
            })?;
        }
    } else {
        let (s, r) = (send.raw(n), recv.raw(n));
        for _ in 0..iters {
            scope(|sc| {
                let start = Instant::now();
                let q = world.immediate_all_reduce_into(sc, &*s, &mut *r, SystemOperation::sum());
                posting += start.elapsed().as_secs_f64();
                q.wait();
            });
        }
    }
    Ok(slowest(world, posting, iters))
}

/// The send buffer (rank `rank`'s values) and the receive buffer of `n` elements.
fn buffers(rank: i32, n: usize) -> Res<[Aligned; 2]> {
    let mut send = Aligned::new(n, 0.0);
    for (k, x) in send.raw(n).iter_mut().enumerate() {
        *x = value(rank, k);
    }
    let send = send.set_layout(&[n as i64], None)?;
    let recv = Aligned::new(n, -1.0).set_layout(&[n as i64], None)?;
    Ok([send, recv])
}

/// Whether one more call of `run` leaves the sum over the ranks in the receive buffer
/// (this rank; a message for the first wrong element on stderr).
fn verified(
    world: &SimpleCommunicator,
    what: &str,
    bufs: &mut [Aligned; 2],
    n: usize,
    run: impl FnOnce(&mut [Aligned; 2]) -> Res<f64>,
) -> Res<bool> {
    bufs[1].raw(n).fill(-1.0);
    run(bufs)?;
    let p = world.size();
    let got = bufs[1].raw(n);
    let bad = (0..n).find(|&k| got[k] != (0..p).map(|r| value(r, k)).sum::<f32>());
    if let Some(k) = bad {
        eprintln!(
            "dlpack-mpi bench: rank {}: {what}: element {k} is {}, expected {}",
            world.rank(),
            got[k],
            (0..p).map(|r| value(r, k)).sum::<f32>()
        );
    }
    Ok(bad.is_none())
}

/// The all-reduce case of `bytes`: its row, and whether every path delivered the sum.
fn allreduce_case(cx: &Case<'_>, args: &BenchArgs, bytes: usize) -> Res<(OverlapRow, bool)> {
    let world = cx.world;
    let mut bufs = buffers(world.rank(), cx.n)?;
    let iters = iters_for(args.iters, bytes);
    let mut progress = <[Progress; 2]>::default();
    let samples = measure_rounds(world, args.rounds, iters, &OVERLAP_PATHS, |p, it| {
        cx.once(p, &mut bufs, it, &mut progress)
    })?;
    let mut ok = true;
    for p in &mut progress {
        let mine = p.in_mpi_us.median();
        world.all_reduce_into(&mine, &mut p.slowest_in_mpi_us, SystemOperation::max());
    }
    let mut scratch = <[Progress; 2]>::default();
    for p in &OVERLAP_PATHS[1..] {
        ok &= verified(world, p.name(), &mut bufs, cx.n, |b| {
            cx.once(*p, b, 1, &mut scratch)
        })?;
    }
    let row = OverlapRow {
        case: format!("allreduce-{}-f32", fmt_size(bytes).replace(' ', "")),
        bytes,
        iters,
        paths: OVERLAP_PATHS.iter().copied().zip(samples).collect(),
        progress,
    };
    Ok((row, ok))
}

/// The posting case (8 B): its row, and whether both paths delivered the sum.
fn post_case(world: &SimpleCommunicator, args: &BenchArgs) -> Res<(OverlapRow, bool)> {
    let n = POST_BYTES / ELEM;
    let mut bufs = buffers(world.rank(), n)?;
    let samples = measure_rounds(world, args.rounds, args.iters, &POST_PATHS, |p, it| {
        post_once(world, p, &mut bufs, n, it)
    })?;
    let mut ok = true;
    for p in POST_PATHS {
        ok &= verified(world, p.name(), &mut bufs, n, |b| {
            post_once(world, p, b, n, 1)
        })?;
    }
    let row = OverlapRow {
        case: format!("post-{POST_BYTES}B"),
        bytes: POST_BYTES,
        iters: args.iters,
        paths: POST_PATHS.iter().copied().zip(samples).collect(),
        progress: Default::default(),
    };
    Ok((row, ok))
}

/// Runs `--op overlap`: one all-reduce case per size (16 MiB unless `--sizes`), then the
/// posting case; returns the rows and whether every checked call delivered the sum.
pub fn overlap(world: &SimpleCommunicator, args: &BenchArgs) -> Res<(Vec<OverlapRow>, bool)> {
    let root = world.rank() == 0;
    let max = args.max_size.unwrap_or(DEFAULT_MAX_SIZE) as usize;
    let slices = args.overlap_slices;
    if root {
        print_overlap_header(world.size(), args.rounds, slices, args.overlap_work);
    }
    let mut rows = Vec::new();
    let mut ok = true;
    for bytes in args.sizes_or(super::args::Op::Overlap.default_sizes(max)) {
        let n = bytes / ELEM;
        let cx = Case {
            world,
            n,
            slices,
            per_slice: (args.overlap_work * n as u64).div_ceil(u64::from(slices)),
        };
        let (row, good) = allreduce_case(&cx, args, bytes)?;
        if root {
            print_overlap_row(&row);
        }
        ok &= good;
        rows.push(row);
    }
    if root {
        print_overlap_summary(&rows, slices);
    }
    let (row, good) = post_case(world, args)?;
    if root {
        print_post_row(&row);
    }
    rows.push(row);
    let all_ok = all_ranks(world, ok && good);
    if root {
        print_overlap_verdict(all_ok);
    }
    Ok((rows, all_ok))
}
