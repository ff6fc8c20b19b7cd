//! The host-memory benches (`--op latency`, `bandwidth`, `allreduce`, `allgatherv`,
//! `alltoall`): every path of [`PATHS`] on the same aligned buffers, warmed up, timed in
//! rotated rounds, then checked element by element. Uses `common`, `args` and `report`.

use dlpack_mpi::comm::{Blocks, TensorComm};
use dlpack_mpi::dlpack::{acquire, AcquireOptions, ManagedTensor};
use dlpack_mpi::dtype::ReduceOp;
use dlpack_mpi::spec::{RecvSpec, SendSpec, VectorRecvSpec};
use mpi::collective::SystemOperation;
use mpi::datatype::PartitionMut;
use mpi::request::{scope, Request, Scope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use super::args::{iters_for, BenchArgs, BenchLayout, Op, DEFAULT_MAX_SIZE};
use super::common::{
    all_ranks, fmt_size, measure_rounds, round_trips, timed, value, Aligned, Elem, Leg, ELEM,
};
use super::report::{print_row, print_sweep_footer, print_sweep_header, Path, Row, PATHS};

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

/// One timed ping-pong run of `iters` round trips; seconds per message (half a round trip)
/// on rank 0, 0 elsewhere.
fn latency_once(
    world: &SimpleCommunicator,
    path: Path,
    buf: &mut Aligned,
    n: usize,
    iters: u64,
) -> Res<f64> {
    let rank = world.rank();
    if rank > 1 {
        world.barrier();
        return Ok(0.0);
    }
    let other = 1 - rank;
    let peer = world.process_at_rank(other);
    let elapsed = match path {
        Path::Raw => {
            let b = buf.raw(n);
            timed(world, || {
                round_trips(rank, iters, |leg| {
                    match leg {
                        Leg::Send => peer.send(&*b),
                        Leg::Recv => {
                            peer.receive_into(&mut *b);
                        }
                    }
                    Ok::<(), dlpack_mpi::Error>(())
                })
            })?
        }
        Path::Dlpack => {
            let mut t = acquired(buf)?;
            timed(world, || {
                round_trips(rank, iters, |leg| {
                    match leg {
                        Leg::Send => peer.send(&SendSpec::new(&t)?),
                        Leg::Recv => {
                            peer.receive_into(&mut RecvSpec::new(&mut t)?);
                        }
                    }
                    Ok(())
                })
            })?
        }
        Path::Reused => {
            let mut t = acquired(buf)?;
            // One spec serves both directions: `as_send` reads the receive buffer.
            let mut r = RecvSpec::new(&mut t)?;
            timed(world, || {
                round_trips(rank, iters, |leg| {
                    match leg {
                        Leg::Send => peer.send(&r.as_send()),
                        Leg::Recv => {
                            peer.receive_into(&mut r);
                        }
                    }
                    Ok(())
                })
            })?
        }
        Path::Checked => {
            let mut t = acquired(buf)?;
            timed(world, || {
                round_trips(rank, iters, |leg| match leg {
                    Leg::Send => world.send_tensor(&t, other, 0),
                    Leg::Recv => world.recv_tensor(&mut t, other, 0).map(drop),
                })
            })?
        }
    };
    Ok(if rank == 0 {
        elapsed / (2 * iters) as f64
    } else {
        0.0
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
        let mut reqs = Vec::with_capacity(specs.len());
        let mut failed = None;
        for spec in specs.iter_mut() {
            if checked {
                match world.immediate_recv_spec(sc, spec, 0, tag) {
                    Ok(r) => reqs.push(r),
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            } else {
                reqs.push(peer.immediate_receive_into_with_tag(sc, spec, tag));
            }
        }
        wait_all(reqs);
        failed.map_or(Ok(()), Err)
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
        let mut reqs = Vec::with_capacity(window);
        let mut failed = None;
        for i in 0..window {
            let spec = specs.get(i).unwrap_or(reused);
            if checked {
                match world.immediate_send_spec(sc, spec, 1, tag) {
                    Ok(r) => reqs.push(r),
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            } else {
                reqs.push(peer.immediate_send_with_tag(sc, spec, tag));
            }
        }
        wait_all(reqs);
        failed.map_or(Ok(()), Err)
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
/// rank 1 (into `window` distinct receive buffers), each window acknowledged by 1 byte;
/// seconds per message on rank 0, 0 elsewhere.
fn bandwidth_once(
    world: &SimpleCommunicator,
    path: Path,
    send: &mut Aligned,
    recv: &mut [Aligned],
    n: usize,
    window: usize,
    iters: u64,
) -> Res<f64> {
    let rank = world.rank();
    if rank > 1 {
        world.barrier();
        return Ok(0.0);
    }
    if rank == 1 {
        bandwidth_recv(world, path, recv, n, iters)?;
        return Ok(0.0);
    }
    let peer = world.process_at_rank(1);
    let mut ack = 0u8;
    let elapsed = if path == Path::Raw {
        let b = send.raw(n);
        timed(world, || {
            for _ in 0..iters {
                scope(|sc| {
                    let reqs: Vec<_> = (0..window)
                        .map(|_| peer.immediate_send_with_tag(sc, &*b, BW_TAG))
                        .collect();
                    wait_all(reqs);
                });
                peer.receive_into(&mut ack);
            }
            Ok::<(), dlpack_mpi::Error>(())
        })?
    } else {
        let t = acquired(send)?;
        let reused = SendSpec::new(&t)?;
        timed(world, || {
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
            }
            Ok(())
        })?
    };
    Ok(elapsed / (iters as f64 * window as f64))
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
/// how often, with the all-gatherv partition (counts and displacements in elements).
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
    fn raw(&self, s: &[Elem], r: &mut [Elem]) {
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
        }
    }

    /// Specs built for every call.
    fn per_message(&self, s: &ManagedTensor<'_>, r: &mut ManagedTensor<'_>) -> Res<()> {
        let (world, sum) = (self.world, SystemOperation::sum());
        for _ in 0..self.iters {
            let sspec = SendSpec::new(s)?;
            let rspec = RecvSpec::new(r)?;
            match self.what {
                Collective::Allreduce => world.all_reduce_into(&sspec, &mut { rspec }, sum),
                Collective::Allgatherv => world.all_gather_varcount_into(
                    &sspec,
                    &mut VectorRecvSpec::new(rspec, &self.counts, &self.displs)?,
                ),
                Collective::Alltoall => world.all_to_all_into(&sspec, &mut { rspec }),
            }
        }
        Ok(())
    }

    /// The same specs for every call.
    fn reused(&self, sspec: &SendSpec<'_>, mut rspec: RecvSpec<'_>) -> Res<()> {
        let (world, sum) = (self.world, SystemOperation::sum());
        match self.what {
            Collective::Allgatherv => {
                let mut v = VectorRecvSpec::new(rspec, &self.counts, &self.displs)?;
                for _ in 0..self.iters {
                    world.all_gather_varcount_into(sspec, &mut v);
                }
            }
            Collective::Allreduce => {
                for _ in 0..self.iters {
                    world.all_reduce_into(sspec, &mut rspec, sum);
                }
            }
            Collective::Alltoall => {
                for _ in 0..self.iters {
                    world.all_to_all_into(sspec, &mut rspec);
                }
            }
        }
        Ok(())
    }

    /// `TensorComm`.
    fn checked(&self, s: &ManagedTensor<'_>, r: &mut ManagedTensor<'_>) -> Res<()> {
        let world = self.world;
        for _ in 0..self.iters {
            match self.what {
                Collective::Allreduce => world.all_reduce_tensor(s, r, ReduceOp::Sum)?,
                Collective::Allgatherv => {
                    world.all_gatherv_tensor(s, r, Blocks::new(&self.counts, &self.displs))?
                }
                Collective::Alltoall => world.all_to_all_tensor(s, r)?,
            }
        }
        Ok(())
    }
}

/// One timed run of `iters` calls of a collective on `n` elements per rank's block (the
/// whole vector for all-reduce); seconds per call of the slowest rank, on every rank.
fn collective_once(
    world: &SimpleCommunicator,
    what: Collective,
    path: Path,
    send: &mut Aligned,
    recv: &mut Aligned,
    n: usize,
    iters: u64,
) -> Res<f64> {
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
    let elapsed = match path {
        Path::Raw => {
            let s = send.raw(send_n);
            let r = recv.raw(recv_n);
            timed(world, || {
                calls.raw(s, r);
                Ok::<(), dlpack_mpi::Error>(())
            })?
        }
        Path::Dlpack => {
            let (s, mut r) = (acquired(send)?, acquired(recv)?);
            timed(world, || calls.per_message(&s, &mut r))?
        }
        Path::Reused => {
            let (s, mut r) = (acquired(send)?, acquired(recv)?);
            let sspec = SendSpec::new(&s)?;
            let rspec = RecvSpec::new(&mut r)?;
            timed(world, || calls.reused(&sspec, rspec))?
        }
        Path::Checked => {
            let (s, mut r) = (acquired(send)?, acquired(recv)?);
            timed(world, || calls.checked(&s, &mut r))?
        }
    };
    let local = elapsed / iters as f64;
    let mut slowest = 0.0f64;
    world.all_reduce_into(&local, &mut slowest, SystemOperation::max());
    Ok(slowest)
}

/// Checks, after one untimed call per path, what a rank received: `got(l)` is logical
/// element `l` of the receive buffer and `want(l)` what it must hold. Returns a message for
/// the first difference.
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
    /// [`measure_rounds`] over the available paths, as a [`Row`].
    fn measure(&self, once: impl FnMut(Path, u64) -> Res<f64>) -> Res<Row> {
        let samples = measure_rounds(self.world, self.args.rounds, self.iters, self.paths, once)?;
        let mut paths: [Option<_>; 4] = Default::default();
        for (&p, s) in self.paths.iter().zip(samples) {
            paths[p as usize] = Some(s);
        }
        Ok(Row {
            op: self.op,
            bytes: self.bytes,
            iters: self.iters,
            paths,
        })
    }

    /// Ping-pong: the row, and what rank 1 received wrong.
    fn latency(&self) -> Res<(Row, Vec<String>)> {
        let (world, layout, n) = (self.world, self.args.layout, self.n);
        let rank = world.rank();
        let mut buf = buffer(layout, n, |k| if rank == 0 { value(0, k) } else { -1.0 })?;
        let row = self.measure(|path, it| latency_once(world, path, &mut buf, n, it))?;
        let mut problems = Vec::new();
        for &path in self.paths {
            let stride = stride_of(path, layout);
            if rank == 1 {
                buf.raw(n * stride).fill(-1.0);
            }
            latency_once(world, path, &mut buf, n, 1)?;
            if rank == 1 {
                let store = buf.raw(n * stride);
                problems.extend(from_rank_0("rank 1: latency", path, store, n, stride));
            }
        }
        Ok((row, problems))
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
        let row = self
            .measure(|path, it| bandwidth_once(world, path, &mut send, &mut recv, n, window, it))?;
        let mut problems = Vec::new();
        for &path in self.paths {
            let stride = stride_of(path, layout);
            for b in recv.iter_mut() {
                b.raw(n * stride).fill(-1.0);
            }
            bandwidth_once(world, path, &mut send, &mut recv, n, window, 1)?;
            for b in recv.iter_mut() {
                let store = b.raw(n * stride);
                problems.extend(from_rank_0("rank 1: bandwidth", path, store, n, stride));
            }
        }
        Ok((row, problems))
    }

    /// A collective: the row, and what this rank received wrong.
    fn collective(&self) -> Res<(Row, Vec<String>)> {
        let (world, layout, n) = (self.world, self.args.layout, self.n);
        let (rank, p) = (world.rank(), world.size());
        let what = Collective::of(self.op);
        let (send_n, recv_n) = what.lens(n, p as usize);
        let mut send = buffer(layout, send_n, |k| value(rank, k))?;
        let mut recv = buffer(layout, recv_n, |_| -1.0)?;
        let row = self
            .measure(|path, it| collective_once(world, what, path, &mut send, &mut recv, n, it))?;
        let mut problems = Vec::new();
        for &path in self.paths {
            let stride = stride_of(path, layout);
            recv.raw(recv_n * stride).fill(-1.0);
            collective_once(world, what, path, &mut send, &mut recv, n, 1)?;
            let store = recv.raw(recv_n * stride);
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
            problems.extend(first_difference(
                &format!("rank {rank}: {}", self.op.name()),
                path,
                recv_n,
                |l| store[l * stride],
                want,
            ));
        }
        Ok((row, problems))
    }
}

/// Runs one operation over its sizes; returns its rows and whether every path delivered
/// the expected values (checked once per size and path after the timing).
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
        for m in &problems {
            eprintln!("dlpack-mpi bench: {m} ({})", fmt_size(bytes));
        }
        ok &= problems.is_empty();
        if root {
            print_row(&row);
        }
        rows.push(row);
    }
    let all_ok = all_ranks(world, ok);
    if root {
        print_sweep_footer(op, &rows, all_ok);
    }
    Ok((rows, all_ok))
}
