//! The host-memory benches (`--op latency`, `bandwidth`, `allreduce`, `allgatherv`,
//! `alltoall`): every path of [`PATHS`] on the same aligned buffers, warmed up, timed in
//! rotated rounds (as a whole and in batches: `sampled`), every iteration checked under
//! `--check`, then one call per path checked element by element. Uses `common`, `sampled`,
//! `args` and `report`.

use dlpack_mpi::comm::{Blocks, TensorComm};
use dlpack_mpi::dlpack::{acquire, AcquireOptions, ManagedTensor};
use dlpack_mpi::dtype::ReduceOp;
use dlpack_mpi::spec::{RecvSpec, SendSpec};
use mpi::collective::SystemOperation;
use mpi::datatype::PartitionMut;
use mpi::request::{scope, Request, Scope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use super::args::{iters_for, BenchArgs, BenchLayout, Op, DEFAULT_MAX_SIZE};
use super::common::{
    fmt_size, round_trips_ticked, timed_laps, value, Aligned, Elem, Laps, Leg, ELEM,
};
use super::report::{print_row, print_sweep_footer, print_sweep_header, Path, Row, PATHS};
use super::sampled::{measure, Plan, Run, Timing};
use crate::common::all_ranks;

type Res<T> = dlpack_mpi::Result<T>;

/// Messages in flight per window of `--op bandwidth` for messages of `bytes`: 64 (as
/// osu_bw), fewer above 1 MiB so that a window holds at most 64 MiB (the receiver needs a
/// buffer per message).
fn window_for(bytes: usize) -> usize {
    ((64 << 20) / bytes.max(1)).clamp(1, 64)
}

/// The paths that exist for `op` with `layout`: per-message and reused specs go straight to
/// rsmpi, which cannot reduce or split into blocks a strided (derived-datatype) buffer; there
/// only the checked path (which packs) runs beside raw.
fn available(op: Op, layout: BenchLayout) -> Vec<Path> {
    if layout == BenchLayout::Contiguous || op.point_to_point() {
        PATHS.to_vec()
    } else {
        vec![Path::Raw, Path::Checked]
    }
}

/// Distance in storage elements between logical elements of a buffer on `path`.
fn stride_of(path: Path, layout: BenchLayout) -> usize {
    if path == Path::Raw || layout == BenchLayout::Contiguous {
        1
    } else {
        2
    }
}

/// An aligned buffer able to hold `n` logical elements in `layout`, holding `fill(k)` at
/// storage index `k`, exporting `n` elements in `layout`.
fn buffer(layout: BenchLayout, n: usize, fill: impl Fn(usize) -> Elem) -> Res<Aligned> {
    let stride = stride_of(Path::Dlpack, layout);
    let mut a = Aligned::new(n * stride, 0.0);
    for (k, x) in a.raw(n * stride).iter_mut().enumerate() {
        *x = fill(k);
    }
    a.set_layout(&[n as i64], Some(&[stride as i64]))
}

fn acquired(buf: &Aligned) -> Res<ManagedTensor<'_>> {
    acquire(&buf.owned, &AcquireOptions::default())
}

/// `iters` timed round trips of a ping-pong ([`round_trips_ticked`]), `laps` ticked after
/// each: the seconds they took on this rank.
fn ping_pong<E>(
    world: &SimpleCommunicator,
    iters: u64,
    laps: &mut Laps,
    leg: impl FnMut(Leg) -> Result<(), E>,
) -> Result<f64, E> {
    let rank = world.rank();
    timed_laps(world, laps, |laps| {
        round_trips_ticked(rank, iters, || laps.tick(), leg)
    })
}

/// One timed ping-pong run of `iters` round trips, a batch every `batch`; seconds per
/// message (half a round trip) on rank 0, 0 elsewhere.
fn latency_once(
    world: &SimpleCommunicator,
    path: Path,
    buf: &mut Aligned,
    n: usize,
    (iters, batch): (u64, u64),
) -> Res<Timing> {
    if sits_out(world) {
        return Ok(Timing::default());
    }
    let rank = world.rank();
    let other = 1 - rank;
    let peer = world.process_at_rank(other);
    let mut laps = Laps::new(batch);
    let elapsed = match path {
        Path::Raw => {
            let b = buf.raw(n);
            ping_pong(world, iters, &mut laps, |leg| {
                match leg {
                    Leg::Send => peer.send(&*b),
                    Leg::Recv => {
                        peer.receive_into(&mut *b);
                    }
                }
                Ok::<(), dlpack_mpi::Error>(())
            })?
        }
        Path::Dlpack => {
            let mut t = acquired(buf)?;
            ping_pong(world, iters, &mut laps, |leg| {
                match leg {
                    Leg::Send => peer.send(&SendSpec::new(&t)?),
                    Leg::Recv => {
                        peer.receive_into(&mut RecvSpec::new(&mut t)?);
                    }
                }
                Ok(())
            })?
        }
        Path::Reused => {
            let mut t = acquired(buf)?;
            // One spec serves both directions: `as_send` reads the receive buffer.
            let mut r = RecvSpec::new(&mut t)?;
            ping_pong(world, iters, &mut laps, |leg| {
                match leg {
                    Leg::Send => peer.send(&r.as_send()),
                    Leg::Recv => {
                        peer.receive_into(&mut r);
                    }
                }
                Ok(())
            })?
        }
        Path::Checked => {
            let mut t = acquired(buf)?;
            ping_pong(world, iters, &mut laps, |leg| match leg {
                Leg::Send => world.send_tensor(&t, other, 0),
                Leg::Recv => world.recv_tensor(&mut t, other, 0).map(drop),
            })?
        }
    };
    Ok(if rank == 0 {
        Timing {
            secs: elapsed / (2 * iters) as f64,
            batches: laps.secs.iter().map(|s| s / 2.0).collect(),
            problem: None,
        }
    } else {
        Timing::default()
    })
}

/// Waits for every request of a window (rsmpi panics on a request dropped uncompleted).
fn wait_all<'a, B: ?Sized, S: Scope<'a>>(reqs: Vec<Request<'a, B, S>>) {
    for r in reqs {
        r.wait();
    }
}

fn acquire_all(bufs: &[Aligned]) -> Res<Vec<ManagedTensor<'_>>> {
    bufs.iter().map(acquired).collect()
}

fn recv_specs<'t>(ts: &'t mut [ManagedTensor<'_>]) -> Res<Vec<RecvSpec<'t>>> {
    ts.iter_mut().map(RecvSpec::new).collect()
}

/// Posts the requests `posts` makes, one by one, until one fails, then waits for every one
/// posted: the first failure.
fn post_window<'a, B: ?Sized + 'a, S: Scope<'a>>(
    posts: impl Iterator<Item = Res<Request<'a, B, S>>>,
) -> Res<()> {
    let mut reqs = Vec::with_capacity(posts.size_hint().0);
    let mut failed = None;
    for post in posts {
        match post {
            Ok(r) => reqs.push(r),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    wait_all(reqs);
    failed.map_or(Ok(()), Err)
}

/// Posts one nonblocking receive from rank 0 per spec (through `TensorComm` when `checked`,
/// else rsmpi directly) and waits for all of them.
fn recv_window(
    world: &SimpleCommunicator,
    specs: &mut [RecvSpec<'_>],
    checked: bool,
    tag: mpi::Tag,
) -> Res<()> {
    let peer = world.process_at_rank(0);
    scope(|sc| {
        post_window(specs.iter_mut().map(|spec| {
            if checked {
                world.immediate_recv_spec(sc, spec, 0, tag)
            } else {
                Ok(peer.immediate_receive_into_with_tag(sc, spec, tag))
            }
        }))
    })
}

/// Posts `window` nonblocking sends to rank 1 (`specs[i]`, or `reused` past the end of
/// `specs`; through `TensorComm` when `checked`, else rsmpi directly) and waits for all.
fn send_window(
    world: &SimpleCommunicator,
    specs: &[SendSpec<'_>],
    reused: &SendSpec<'_>,
    window: usize,
    checked: bool,
    tag: mpi::Tag,
) -> Res<()> {
    let peer = world.process_at_rank(1);
    scope(|sc| {
        post_window((0..window).map(|i| {
            let spec = specs.get(i).unwrap_or(reused);
            if checked {
                world.immediate_send_spec(sc, spec, 1, tag)
            } else {
                Ok(peer.immediate_send_with_tag(sc, spec, tag))
            }
        }))
    })
}

/// Tag of the bandwidth messages.
const BW_TAG: mpi::Tag = 1;

/// Rank 1's side of [`bandwidth_once`]: `iters` windows received into `recv`, each
/// acknowledged by 1 byte.
fn bandwidth_recv(
    world: &SimpleCommunicator,
    path: Path,
    recv: &mut [Aligned],
    n: usize,
    iters: u64,
) -> Res<()> {
    let peer = world.process_at_rank(0);
    let ack = 0u8;
    match path {
        Path::Raw => {
            let mut bufs: Vec<&mut [Elem]> = recv.iter_mut().map(|b| b.raw(n)).collect();
            world.barrier();
            for _ in 0..iters {
                scope(|sc| {
                    let reqs: Vec<_> = bufs
                        .iter_mut()
                        .map(|b| peer.immediate_receive_into_with_tag(sc, &mut **b, BW_TAG))
                        .collect();
                    wait_all(reqs);
                });
                peer.send(&ack);
            }
        }
        Path::Reused => {
            let mut ts = acquire_all(recv)?;
            let mut specs = recv_specs(&mut ts)?;
            world.barrier();
            for _ in 0..iters {
                recv_window(world, &mut specs, false, BW_TAG)?;
                peer.send(&ack);
            }
        }
        Path::Dlpack | Path::Checked => {
            let mut ts = acquire_all(recv)?;
            world.barrier();
            for _ in 0..iters {
                let mut specs = recv_specs(&mut ts)?;
                recv_window(world, &mut specs, path == Path::Checked, BW_TAG)?;
                peer.send(&ack);
            }
        }
    }
    Ok(())
}

/// One timed bandwidth run: `iters` windows of `window` nonblocking sends from rank 0 to
/// rank 1 (into `window` distinct receive buffers), each window acknowledged by 1 byte, a
/// batch every `batch` windows; seconds per message on rank 0, 0 elsewhere.
fn bandwidth_once(
    world: &SimpleCommunicator,
    path: Path,
    send: &mut Aligned,
    recv: &mut [Aligned],
    (n, window): (usize, usize),
    (iters, batch): (u64, u64),
) -> Res<Timing> {
    if sits_out(world) {
        return Ok(Timing::default());
    }
    let rank = world.rank();
    if rank == 1 {
        bandwidth_recv(world, path, recv, n, iters)?;
        return Ok(Timing::default());
    }
    let peer = world.process_at_rank(1);
    let mut ack = 0u8;
    let mut laps = Laps::new(batch);
    let elapsed = if path == Path::Raw {
        let b = send.raw(n);
        timed_laps(world, &mut laps, |laps| {
            for _ in 0..iters {
                scope(|sc| {
                    let reqs: Vec<_> = (0..window)
                        .map(|_| peer.immediate_send_with_tag(sc, &*b, BW_TAG))
                        .collect();
                    wait_all(reqs);
                });
                peer.receive_into(&mut ack);
                laps.tick();
            }
            Ok::<(), dlpack_mpi::Error>(())
        })?
    } else {
        let t = acquired(send)?;
        let reused = SendSpec::new(&t)?;
        timed_laps(world, &mut laps, |laps| {
            for _ in 0..iters {
                let specs = match path {
                    Path::Reused => Vec::new(),
                    _ => (0..window)
                        .map(|_| SendSpec::new(&t))
                        .collect::<Res<Vec<_>>>()?,
                };
                send_window(
                    world,
                    &specs,
                    &reused,
                    window,
                    path == Path::Checked,
                    BW_TAG,
                )?;
                peer.receive_into(&mut ack);
                laps.tick();
            }
            Ok(())
        })?
    };
    let per_message = |s: f64| s / window as f64;
    Ok(Timing {
        secs: per_message(elapsed / iters as f64),
        batches: laps.secs.iter().map(|&s| per_message(s)).collect(),
        problem: None,
    })
}

/// A collective benchmarked by [`collective_once`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Collective {
    Allreduce,
    Allgatherv,
    Alltoall,
}

impl Collective {
    /// The collective of a collective `op`.
    fn of(op: Op) -> Collective {
        match op {
            Op::Allreduce => Collective::Allreduce,
            Op::Allgatherv => Collective::Allgatherv,
            _ => Collective::Alltoall,
        }
    }

    /// Elements sent and received per rank for blocks of `n` elements over `p` ranks.
    fn lens(self, n: usize, p: usize) -> (usize, usize) {
        match self {
            Collective::Allreduce => (n, n),
            Collective::Allgatherv => (n, p * n),
            Collective::Alltoall => (p * n, p * n),
        }
    }
}

/// The calls of one [`collective_once`]: which collective, on blocks of how many elements,
/// how often, with the all-gatherv partition (counts and displacements in elements). Each
/// form ticks its laps after every call.
struct Calls<'w> {
    world: &'w SimpleCommunicator,
    what: Collective,
    iters: u64,
    counts32: Vec<i32>,
    displs32: Vec<i32>,
    counts: Vec<i64>,
    displs: Vec<i64>,
}

impl Calls<'_> {
    /// rsmpi on plain slices.
    fn raw(&self, s: &[Elem], r: &mut [Elem], laps: &mut Laps) {
        let (world, sum) = (self.world, SystemOperation::sum());
        for _ in 0..self.iters {
            match self.what {
                Collective::Allreduce => world.all_reduce_into(s, &mut *r, sum),
                Collective::Allgatherv => world.all_gather_varcount_into(
                    s,
                    &mut PartitionMut::new(&mut *r, &self.counts32[..], &self.displs32[..]),
                ),
                Collective::Alltoall => world.all_to_all_into(s, &mut *r),
            }
            laps.tick();
        }
    }

    /// Specs built for every call.
    fn per_message(
        &self,
        s: &ManagedTensor<'_>,
        r: &mut ManagedTensor<'_>,
        laps: &mut Laps,
    ) -> Res<()> {
        let (world, sum) = (self.world, SystemOperation::sum());
        for _ in 0..self.iters {
            let sspec = SendSpec::new(s)?;
            let mut rspec = RecvSpec::new(r)?;
            match self.what {
                Collective::Allreduce => world.all_reduce_into(&sspec, &mut rspec, sum),
                Collective::Allgatherv => world.all_gather_varcount_into(
                    &sspec,
                    &mut PartitionMut::new(&mut rspec, &self.counts32[..], &self.displs32[..]),
                ),
                Collective::Alltoall => world.all_to_all_into(&sspec, &mut rspec),
            }
            laps.tick();
        }
        Ok(())
    }

    /// The same specs for every call.
    fn reused(&self, sspec: &SendSpec<'_>, mut rspec: RecvSpec<'_>, laps: &mut Laps) -> Res<()> {
        let (world, sum) = (self.world, SystemOperation::sum());
        match self.what {
            Collective::Allgatherv => {
                let mut v = PartitionMut::new(&mut rspec, &self.counts32[..], &self.displs32[..]);
                for _ in 0..self.iters {
                    world.all_gather_varcount_into(sspec, &mut v);
                    laps.tick();
                }
            }
            Collective::Allreduce => {
                for _ in 0..self.iters {
                    world.all_reduce_into(sspec, &mut rspec, sum);
                    laps.tick();
                }
            }
            Collective::Alltoall => {
                for _ in 0..self.iters {
                    world.all_to_all_into(sspec, &mut rspec);
                    laps.tick();
                }
            }
        }
        Ok(())
    }

    /// `TensorComm`.
    fn checked(
        &self,
        s: &ManagedTensor<'_>,
        r: &mut ManagedTensor<'_>,
        laps: &mut Laps,
    ) -> Res<()> {
        let world = self.world;
        for _ in 0..self.iters {
            match self.what {
                Collective::Allreduce => world.all_reduce_tensor(s, r, ReduceOp::Sum)?,
                Collective::Allgatherv => {
                    world.all_gatherv_tensor(s, r, Blocks::new(&self.counts, &self.displs))?
                }
                Collective::Alltoall => world.all_to_all_tensor(s, r)?,
            }
            laps.tick();
        }
        Ok(())
    }
}

/// One timed run of `iters` calls of a collective on `n` elements per rank's block (the
/// whole vector for all-reduce), a batch every `batch` calls; seconds per call of the
/// slowest rank, on every rank (a batch's: the slowest rank's time of that batch).
fn collective_once(
    world: &SimpleCommunicator,
    (what, path): (Collective, Path),
    send: &mut Aligned,
    recv: &mut Aligned,
    n: usize,
    (iters, batch): (u64, u64),
) -> Res<Timing> {
    let p = world.size() as usize;
    let (send_n, recv_n) = what.lens(n, p);
    let counts32 = vec![n as i32; p];
    let displs32: Vec<i32> = (0..p).map(|i| (i * n) as i32).collect();
    let calls = Calls {
        world,
        what,
        iters,
        counts: counts32.iter().map(|&c| i64::from(c)).collect(),
        displs: displs32.iter().map(|&d| i64::from(d)).collect(),
        counts32,
        displs32,
    };
    let mut laps = Laps::new(batch);
    let elapsed = match path {
        Path::Raw => {
            let s = send.raw(send_n);
            let r = recv.raw(recv_n);
            timed_laps(world, &mut laps, |laps| {
                calls.raw(s, r, laps);
                Ok::<(), dlpack_mpi::Error>(())
            })?
        }
        Path::Dlpack => {
            let (s, mut r) = (acquired(send)?, acquired(recv)?);
            timed_laps(world, &mut laps, |laps| calls.per_message(&s, &mut r, laps))?
        }
        Path::Reused => {
            let (s, mut r) = (acquired(send)?, acquired(recv)?);
            let sspec = SendSpec::new(&s)?;
            let rspec = RecvSpec::new(&mut r)?;
            timed_laps(world, &mut laps, |laps| calls.reused(&sspec, rspec, laps))?
        }
        Path::Checked => {
            let (s, mut r) = (acquired(send)?, acquired(recv)?);
            timed_laps(world, &mut laps, |laps| calls.checked(&s, &mut r, laps))?
        }
    };
    let max = SystemOperation::max();
    let mut slowest = 0.0f64;
    world.all_reduce_into(&(elapsed / iters as f64), &mut slowest, max);
    let mut batches = vec![0.0f64; laps.secs.len()];
    world.all_reduce_into(&laps.secs[..], &mut batches[..], max);
    Ok(Timing {
        secs: slowest,
        batches,
        problem: None,
    })
}

/// Checks what a rank received in one [`Run::Checked`] call: `got(l)` is logical element
/// `l` of the receive buffer and `want(l)` what it must hold. Returns a message for the
/// first difference.
fn first_difference(
    what: &str,
    path: Path,
    len: usize,
    got: impl Fn(usize) -> Elem,
    want: impl Fn(usize) -> Elem,
) -> Option<String> {
    (0..len).find(|&l| got(l) != want(l)).map(|l| {
        format!(
            "{what} via {}: element {l} is {}, expected {}",
            path.name(),
            got(l),
            want(l)
        )
    })
}

/// [`first_difference`] for a point-to-point receive: `n` logical elements `stride` apart in
/// `store` must be rank 0's send values.
fn from_rank_0(what: &str, path: Path, store: &[Elem], n: usize, stride: usize) -> Option<String> {
    first_difference(
        what,
        path,
        n,
        |l| store[l * stride],
        |l| value(0, l * stride),
    )
}

/// What one size of one operation needs: the world, the options, the paths that run, and
/// the size in bytes, elements and iterations per round.
struct Size<'a> {
    world: &'a SimpleCommunicator,
    args: &'a BenchArgs,
    op: Op,
    paths: &'a [Path],
    bytes: usize,
    n: usize,
    iters: u64,
}

impl Size<'_> {
    /// [`measure`] over the available paths (`msgs_per_iter` messages per iteration), then
    /// one [`Run::Checked`] call per path: the [`Row`], and what this rank received wrong
    /// (under `--check`, in every iteration; then in the call after the timing).
    fn measure(
        &self,
        msgs_per_iter: f64,
        mut run: impl FnMut(Path, Run) -> Res<Timing>,
    ) -> Res<(Row, Vec<String>)> {
        let plan = Plan {
            rounds: self.args.rounds,
            iters: self.iters,
            check: self.args.check,
            spoil: self.args.inject_wrong,
            msgs_per_iter,
        };
        let m = measure(self.world, &plan, self.paths, &mut run)?;
        let mut problems = m.problems;
        for &p in self.paths {
            problems.extend(run(p, Run::Checked { spoil: false })?.problem);
        }
        let mut paths: [Option<_>; 4] = Default::default();
        let mut samples: [Option<_>; 4] = Default::default();
        for (&p, s) in self.paths.iter().zip(m.paths) {
            paths[p as usize] = Some(s.rounds);
            samples[p as usize] = Some(s.samples);
        }
        let row = Row {
            op: self.op,
            bytes: self.bytes,
            iters: self.iters,
            ranks: self.world.size(),
            batch: m.batch,
            paths,
            samples,
        };
        Ok((row, problems))
    }

    /// Ping-pong: the row, and what rank 1 received (and rank 0 got back) wrong.
    fn latency(&self) -> Res<(Row, Vec<String>)> {
        let (world, layout, n) = (self.world, self.args.layout, self.n);
        let rank = world.rank();
        let mut buf = buffer(layout, n, |k| if rank == 0 { value(0, k) } else { -1.0 })?;
        self.measure(2.0, |path, how| {
            let spoil = match how {
                Run::Timed { iters, batch } => {
                    return latency_once(world, path, &mut buf, n, (iters, batch))
                }
                Run::Checked { spoil } => spoil,
            };
            let stride = stride_of(path, layout);
            if rank == 1 {
                buf.raw(n * stride).fill(-1.0);
            }
            let mut t = latency_once(world, path, &mut buf, n, (1, 1))?;
            if rank <= 1 {
                let store = buf.raw(n * stride);
                spoiled(store, spoil);
                let what = format!("rank {rank}: latency");
                t.problem = from_rank_0(&what, path, store, n, stride);
                // Rank 0 sends this buffer again: back to its value.
                store[0] = value(0, 0);
            }
            Ok(t)
        })
    }

    /// Windows of nonblocking sends: the row, and what rank 1 received wrong.
    fn bandwidth(&self) -> Res<(Row, Vec<String>)> {
        let (world, layout, n) = (self.world, self.args.layout, self.n);
        let rank = world.rank();
        let window = window_for(self.bytes);
        let mut send = buffer(layout, if rank == 0 { n } else { 0 }, |k| value(0, k))?;
        let mut recv = (0..if rank == 1 { window } else { 0 })
            .map(|_| buffer(layout, n, |_| -1.0))
            .collect::<Res<Vec<_>>>()?;
        let sizes = (n, window);
        self.measure(window as f64, |path, how| {
            let spoil = match how {
                Run::Timed { iters, batch } => {
                    let counts = (iters, batch);
                    return bandwidth_once(world, path, &mut send, &mut recv, sizes, counts);
                }
                Run::Checked { spoil } => spoil,
            };
            let stride = stride_of(path, layout);
            for b in recv.iter_mut() {
                b.raw(n * stride).fill(-1.0);
            }
            let mut t = bandwidth_once(world, path, &mut send, &mut recv, sizes, (1, 1))?;
            t.problem = recv.iter_mut().enumerate().find_map(|(m, b)| {
                let store = b.raw(n * stride);
                spoiled(store, spoil && m == 0);
                let what = format!("rank 1: bandwidth (message {m} of the window)");
                from_rank_0(&what, path, store, n, stride)
            });
            Ok(t)
        })
    }

    /// A collective: the row, and what this rank received wrong.
    fn collective(&self) -> Res<(Row, Vec<String>)> {
        let (world, layout, n) = (self.world, self.args.layout, self.n);
        let (rank, p) = (world.rank(), world.size());
        let what = Collective::of(self.op);
        let (send_n, recv_n) = what.lens(n, p as usize);
        let mut send = buffer(layout, send_n, |k| value(rank, k))?;
        let mut recv = buffer(layout, recv_n, |_| -1.0)?;
        let name = format!("rank {rank}: {}", self.op.name());
        self.measure(1.0, |path, how| {
            let (op, counts) = ((what, path), (1, 1));
            let spoil = match how {
                Run::Timed { iters, batch } => {
                    return collective_once(world, op, &mut send, &mut recv, n, (iters, batch))
                }
                Run::Checked { spoil } => spoil,
            };
            let stride = stride_of(path, layout);
            recv.raw(recv_n * stride).fill(-1.0);
            let mut t = collective_once(world, op, &mut send, &mut recv, n, counts)?;
            let store = recv.raw(recv_n * stride);
            spoiled(store, spoil);
            let want = |l: usize| -> Elem {
                match what {
                    // Σ_r value(r, k) = p·(k mod 4096) + 4096·p(p−1)/2.
                    Collective::Allreduce => (0..p).map(|r| value(r, l * stride)).sum(),
                    Collective::Allgatherv => value((l / n) as i32, (l % n) * stride),
                    Collective::Alltoall => {
                        value((l / n) as i32, (rank as usize * n + l % n) * stride)
                    }
                }
            };
            t.problem = first_difference(&name, path, recv_n, |l| store[l * stride], want);
            Ok(t)
        })
    }
}

/// The test hook `--inject-wrong`: when `spoil`, the first received element becomes -2, a
/// value no rank sends.
fn spoiled(store: &mut [Elem], spoil: bool) {
    if spoil {
        if let Some(x) = store.first_mut() {
            *x = -2.0;
        }
    }
}

/// At most this many wrong iterations are printed per size and rank (then a count).
const PRINTED_PROBLEMS: usize = 5;

/// `dlpack-mpi bench: {line}` on standard error in one write, so that the launcher does not
/// interleave it with another rank's line (`eprintln!` writes its pieces one by one).
fn say(line: &str) {
    use std::io::Write as _;
    let _ = std::io::stderr().write_all(format!("dlpack-mpi bench: {line}\n").as_bytes());
}

/// Runs one operation over its sizes; returns its rows and whether every path delivered
/// the expected values (checked once per size and path after the timing, and in every
/// iteration under `--check`).
pub fn sweep(world: &SimpleCommunicator, args: &BenchArgs, op: Op) -> Res<(Vec<Row>, bool)> {
    let root = world.rank() == 0;
    if op.point_to_point() && world.size() < 2 {
        if root {
            println!("{}: skipped (needs at least 2 ranks)\n", op.name());
        }
        return Ok((Vec::new(), true));
    }
    let list = args.sizes_or(op.default_sizes(args.max_size.unwrap_or(DEFAULT_MAX_SIZE) as usize));
    let paths = available(op, args.layout);
    if root {
        print_sweep_header(op, world.size(), args, paths.len() == PATHS.len());
    }
    let mut rows = Vec::new();
    let mut ok = true;
    for bytes in list {
        let size = Size {
            world,
            args,
            op,
            paths: &paths,
            bytes,
            n: bytes / ELEM,
            iters: iters_for(args.iters, bytes),
        };
        let (row, problems) = match op {
            Op::Latency => size.latency()?,
            Op::Bandwidth => size.bandwidth()?,
            _ => size.collective()?,
        };
        for m in problems.iter().take(PRINTED_PROBLEMS) {
            say(&format!("{m} ({})", fmt_size(bytes)));
        }
        if problems.len() > PRINTED_PROBLEMS {
            say(&format!(
                "rank {}: {} ({}): {} more wrong deliveries not shown",
                world.rank(),
                op.name(),
                fmt_size(bytes),
                problems.len() - PRINTED_PROBLEMS
            ));
        }
        ok &= problems.is_empty();
        if root {
            print_row(&row);
        }
        rows.push(row);
    }
    let all_ok = all_ranks(world, ok);
    if root {
        print_sweep_footer(op, &rows, all_ok, args.check);
    }
    Ok((rows, all_ok))
}

/// Whether this rank takes no part in a two-rank measurement (ranks above 1): it then waits
/// at the barrier the measured ranks end with.
pub(super) fn sits_out(world: &SimpleCommunicator) -> bool {
    let out = world.rank() > 1;
    if out {
        world.barrier();
    }
    out
}
