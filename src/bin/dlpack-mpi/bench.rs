//! `dlpack-mpi bench`: ping-pong and all-reduce through dlpack-mpi next to raw rsmpi, on the
//! same 4096-byte-aligned buffers, interleaved in one run.
//!
//! Four paths are timed for every size, on the very same memory:
//!
//! - **raw**: rsmpi on a plain `&[f32]` / `&mut [f32]` slice of the storage.
//! - **dlpack**: the tensor is acquired once per round (untimed); every message builds its
//!   [`SendSpec`] / [`RecvSpec`] (the per-message cost a user of the specs pays: device,
//!   dtype, contiguity, overlap and count checks) and hands it to rsmpi
//!   (`send`, `receive_into`, `all_reduce_into`).
//! - **reused**: the specs are built once per round (untimed) and reused for every message:
//!   what an MPI call through a spec costs by itself.
//! - **checked**: [`TensorComm`] (`send_tensor` / `recv_tensor`, `all_reduce_tensor`), which
//!   adds argument checks and, for receives, an `MPI_Probe` before the receive.
//!
//! Each size is warmed up, then measured for `--rounds` rounds; within a round the paths run
//! one after the other, in an order rotated from round to round, with a barrier before
//! each. Reported: median and best round, in µs per message (ping-pong: half the
//! round-trip time; all-reduce: the slowest rank's time per call), and the ratios to raw.
//!
//! `--op strided` sends strided views of one 64 MiB f32 storage from rank 0 to rank 1
//! (one-way; rank 1 answers every message with a 1-byte ack, which ends the message's time):
//! every other element (shape `[N/2]`, stride `[2]`) and a transposed 4096 × 4096 matrix
//! (shape `[4096, 4096]`, strides `[1, 4096]`). Three paths, scheduled as above:
//!
//! - **derived**: [`SendSpec::new`] on the strided tensor per message (a cached, committed
//!   derived datatype, count 1) handed to rsmpi's `send`: MPI reads the elements in place.
//! - **pack**: a Rust loop copies the logical elements into a contiguous buffer (allocated
//!   once, reused; the copy is timed), which is then sent.
//! - **contiguous**: the same number of bytes sent from a contiguous slice (the lower bound).
//!
//! Rank 1 receives every message with `receive_into(&mut [f32])` of the logical size. Before
//! timing, one message per path is checked element by element on rank 1.

use std::io::Write;
use std::process::ExitCode;

use clap::ValueEnum;
use dlpack_mpi::comm::TensorComm;
use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned, Tensor};
use dlpack_mpi::dtype::ReduceOp;
use dlpack_mpi::spec::{RecvSpec, SendSpec};
use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

/// Alignment of the first element of every benchmarked buffer, in bytes.
const ALIGN: usize = 4096;
/// Element type of every message.
type Elem = f32;
/// Bytes per element.
const ELEM: usize = std::mem::size_of::<Elem>();
/// Smallest ping-pong message, bytes.
const PINGPONG_MIN: usize = 8;
/// Smallest and largest all-reduce message, bytes.
const ALLREDUCE_MIN: usize = 1 << 10;
const ALLREDUCE_MAX: usize = 16 << 20;
/// Sizes up to this many bytes run `--iters` iterations per round; larger ones run
/// `iters × SCALE_REF / size` (at least `MIN_ITERS`), so every round moves about the same
/// number of bytes.
const SCALE_REF: usize = 16 << 10;
const MIN_ITERS: u64 = 4;
/// The per-message target at the smallest size, µs (best round, dlpack − raw).
const TARGET_SMALL_US: f64 = 0.05;
/// The ratio target at ≥ 1 MiB (dlpack / raw).
const TARGET_LARGE_RATIO: f64 = 1.02;
const LARGE: usize = 1 << 20;

/// Which benchmark to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Op {
    /// Ping-pong between rank 0 and rank 1 (other ranks wait at barriers).
    Pingpong,
    /// All-reduce (sum of f32) over all ranks.
    Allreduce,
    /// Ping-pong, all-reduce, then strided (skipped when --max-size is below 64 MiB).
    All,
    /// Strided views (every other element; a transposed matrix) from rank 0 to rank 1:
    /// derived datatype vs pack-and-send vs contiguous send of the same bytes.
    Strided,
}

/// Options of `bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Which benchmark to run.
    #[arg(long, value_enum, default_value_t = Op::All)]
    pub op: Op,
    /// Timed rounds per size and path (median and best are reported).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub rounds: u32,
    /// Iterations per round for messages up to 16 KiB; larger messages run proportionally
    /// fewer (iters × 16 KiB / size, at least 4).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub iters: u64,
    /// Largest message in bytes (ping-pong from 8 B, all-reduce from 1 KiB up to at most
    /// 16 MiB); sizes are powers of two. Strided sizes are fixed (a 64 MiB storage); `all`
    /// skips them below 64 MiB.
    #[arg(long, default_value_t = 64 << 20, value_parser = clap::value_parser!(u64).range(8..=(1 << 30)))]
    pub max_size: u64,
}

/// A path through which messages are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Raw,
    Dlpack,
    Reused,
    Checked,
}

const PATHS: [Path; 4] = [Path::Raw, Path::Dlpack, Path::Reused, Path::Checked];

/// Per-round times of one path at one size, µs per message.
#[derive(Debug, Default, Clone)]
struct Samples(Vec<f64>);

impl Samples {
    fn median(&self) -> f64 {
        let mut v = self.0.clone();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n == 0 {
            f64::NAN
        } else if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    }

    fn best(&self) -> f64 {
        self.0.iter().copied().fold(f64::INFINITY, f64::min)
    }
}

/// Results of one size: samples of every path, in `PATHS` order.
#[derive(Debug)]
struct Row {
    bytes: usize,
    iters: u64,
    paths: [Samples; 4],
}

impl Row {
    fn get(&self, p: Path) -> &Samples {
        &self.paths[p as usize]
    }

    fn ratio_median(&self, p: Path) -> f64 {
        self.get(p).median() / self.get(Path::Raw).median()
    }

    fn ratio_best(&self, p: Path) -> f64 {
        self.get(p).best() / self.get(Path::Raw).best()
    }
}

/// A `Vec<f32>` with spare room, owned by the exporter, and the element offset at which it
/// is `ALIGN`-aligned.
struct Aligned {
    owned: Owned<Elem>,
    off: usize,
}

impl Aligned {
    fn new(max_elems: usize, fill: Elem) -> Self {
        let mut owned = Owned::new(vec![fill; max_elems + ALIGN / ELEM]);
        let addr = owned.as_slice().as_ptr() as usize;
        let off_bytes = (ALIGN - addr % ALIGN) % ALIGN;
        Aligned {
            owned,
            off: off_bytes / ELEM,
        }
    }

    /// Makes the exporter hand out `n` elements starting at the aligned address, and checks
    /// that the exported tensor and the raw slice start at the same aligned address.
    fn set_len(self, n: usize) -> dlpack_mpi::Result<Self> {
        self.set_layout(&[n as i64], None)
    }

    /// Makes the exporter hand out `shape` with `strides` (elements; `None` = compact) whose
    /// first element is the aligned address, and checks that address.
    fn set_layout(self, shape: &[i64], strides: Option<&[i64]>) -> dlpack_mpi::Result<Self> {
        let Aligned { owned, off } = self;
        let mut owned = owned.with_layout(shape, strides, (off * ELEM) as u64)?;
        let tensor_addr = {
            let t = acquire(&owned, &AcquireOptions::default())?;
            t.first_element_ptr() as usize
        };
        let raw_addr = owned.as_slice()[off..].as_ptr() as usize;
        assert_eq!(tensor_addr, raw_addr, "tensor and raw slice differ");
        assert_eq!(raw_addr % ALIGN, 0, "buffer not {ALIGN}-byte aligned");
        Ok(Aligned { owned, off })
    }

    fn raw(&mut self, n: usize) -> &mut [Elem] {
        let off = self.off;
        &mut self.owned.as_mut_slice()[off..off + n]
    }
}

fn iters_for(base: u64, bytes: usize) -> u64 {
    if bytes <= SCALE_REF {
        base
    } else {
        (base.saturating_mul(SCALE_REF as u64) / bytes as u64).max(MIN_ITERS)
    }
}

fn sizes(min: usize, max: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut s = min;
    while s <= max {
        v.push(s);
        s *= 2;
    }
    v
}

fn fmt_size(bytes: usize) -> String {
    if bytes >= 1 << 20 && bytes % (1 << 20) == 0 {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes % (1 << 10) == 0 {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} B")
    }
}

/// One timed ping-pong run of `iters` round trips; seconds per message (half a round trip)
/// on rank 0, 0 elsewhere.
fn pingpong_once(
    world: &SimpleCommunicator,
    path: Path,
    buf: &mut Aligned,
    n: usize,
    iters: u64,
) -> dlpack_mpi::Result<f64> {
    let rank = world.rank();
    if rank > 1 {
        world.barrier();
        return Ok(0.0);
    }
    let other = 1 - rank;
    let peer = world.process_at_rank(other);
    let start;
    match path {
        Path::Raw => {
            let b = buf.raw(n);
            world.barrier();
            start = mpi::time();
            if rank == 0 {
                for _ in 0..iters {
                    peer.send(&*b);
                    peer.receive_into(&mut *b);
                }
            } else {
                for _ in 0..iters {
                    peer.receive_into(&mut *b);
                    peer.send(&*b);
                }
            }
        }
        Path::Dlpack => {
            let mut t = acquire(&buf.owned, &AcquireOptions::default())?;
            world.barrier();
            start = mpi::time();
            if rank == 0 {
                for _ in 0..iters {
                    peer.send(&SendSpec::new(&t)?);
                    peer.receive_into(&mut RecvSpec::new(&mut t)?);
                }
            } else {
                for _ in 0..iters {
                    peer.receive_into(&mut RecvSpec::new(&mut t)?);
                    peer.send(&SendSpec::new(&t)?);
                }
            }
        }
        Path::Reused => {
            let mut t = acquire(&buf.owned, &AcquireOptions::default())?;
            // One spec serves both directions: `as_send` reads the receive buffer.
            let mut r = RecvSpec::new(&mut t)?;
            world.barrier();
            start = mpi::time();
            if rank == 0 {
                for _ in 0..iters {
                    peer.send(&r.as_send());
                    peer.receive_into(&mut r);
                }
            } else {
                for _ in 0..iters {
                    peer.receive_into(&mut r);
                    peer.send(&r.as_send());
                }
            }
        }
        Path::Checked => {
            let mut t = acquire(&buf.owned, &AcquireOptions::default())?;
            world.barrier();
            start = mpi::time();
            if rank == 0 {
                for _ in 0..iters {
                    world.send_tensor(&t, other, 0)?;
                    world.recv_tensor(&mut t, other, 0)?;
                }
            } else {
                for _ in 0..iters {
                    world.recv_tensor(&mut t, other, 0)?;
                    world.send_tensor(&t, other, 0)?;
                }
            }
        }
    }
    let elapsed = mpi::time() - start;
    Ok(if rank == 0 {
        elapsed / (2 * iters) as f64
    } else {
        0.0
    })
}

/// One timed all-reduce run of `iters` calls; seconds per call of the slowest rank, on
/// every rank.
fn allreduce_once(
    world: &SimpleCommunicator,
    path: Path,
    send: &mut Aligned,
    recv: &mut Aligned,
    n: usize,
    iters: u64,
) -> dlpack_mpi::Result<f64> {
    let sum = SystemOperation::sum();
    let start;
    match path {
        Path::Raw => {
            let s = send.raw(n);
            let r = recv.raw(n);
            world.barrier();
            start = mpi::time();
            for _ in 0..iters {
                world.all_reduce_into(&*s, &mut *r, sum);
            }
        }
        Path::Dlpack => {
            let s = acquire(&send.owned, &AcquireOptions::default())?;
            let mut r = acquire(&recv.owned, &AcquireOptions::default())?;
            world.barrier();
            start = mpi::time();
            for _ in 0..iters {
                world.all_reduce_into(&SendSpec::new(&s)?, &mut RecvSpec::new(&mut r)?, sum);
            }
        }
        Path::Reused => {
            let s = acquire(&send.owned, &AcquireOptions::default())?;
            let mut r = acquire(&recv.owned, &AcquireOptions::default())?;
            let s = SendSpec::new(&s)?;
            let mut r = RecvSpec::new(&mut r)?;
            world.barrier();
            start = mpi::time();
            for _ in 0..iters {
                world.all_reduce_into(&s, &mut r, sum);
            }
        }
        Path::Checked => {
            let s = acquire(&send.owned, &AcquireOptions::default())?;
            let mut r = acquire(&recv.owned, &AcquireOptions::default())?;
            world.barrier();
            start = mpi::time();
            for _ in 0..iters {
                world.all_reduce_tensor(&s, &mut r, ReduceOp::Sum)?;
            }
        }
    }
    let local = (mpi::time() - start) / iters as f64;
    let mut slowest = 0.0f64;
    world.all_reduce_into(&local, &mut slowest, SystemOperation::max());
    Ok(slowest)
}

/// Warm-up, then `rounds` rounds of every path in rotated order.
fn measure(
    world: &SimpleCommunicator,
    rounds: u32,
    bytes: usize,
    iters: u64,
    once: impl FnMut(Path, u64) -> dlpack_mpi::Result<f64>,
) -> dlpack_mpi::Result<Row> {
    let paths = measure_paths(world, rounds, iters, PATHS, once)?;
    Ok(Row {
        bytes,
        iters,
        paths,
    })
}

/// [`measure`] over any list of paths: samples (µs per message) in the order of `order`.
fn measure_paths<P: Copy, const N: usize>(
    world: &SimpleCommunicator,
    rounds: u32,
    iters: u64,
    order: [P; N],
    mut once: impl FnMut(P, u64) -> dlpack_mpi::Result<f64>,
) -> dlpack_mpi::Result<[Samples; N]> {
    let warm = (iters / 5).max(2);
    for p in order {
        once(p, warm)?;
    }
    let mut paths: [Samples; N] = std::array::from_fn(|_| Samples::default());
    for round in 0..rounds as usize {
        world.barrier();
        for k in 0..N {
            let i = (round + k) % N;
            let secs = once(order[i], iters)?;
            paths[i].0.push(secs * 1e6);
        }
    }
    world.barrier();
    Ok(paths)
}

fn print_header() {
    let mut line = format!(
        "{:>10} {:>8} | {:>8} {:>8}",
        "size", "iters", "raw med", "best"
    );
    for name in ["dlpack", "reused", "checked"] {
        line += &format!(
            " | {:>11} {:>8} {:>11} {:>6}",
            format!("{name} med"),
            "best",
            "/raw med",
            "best"
        );
    }
    println!("{line}");
}

fn print_row(r: &Row) {
    let w = r.get(Path::Raw);
    let mut line = format!(
        "{:>10} {:>8} | {:>8.3} {:>8.3}",
        fmt_size(r.bytes),
        r.iters,
        w.median(),
        w.best()
    );
    for p in [Path::Dlpack, Path::Reused, Path::Checked] {
        let x = r.get(p);
        line += &format!(
            " | {:>11.3} {:>8.3} {:>11.4} {:>6.4}",
            x.median(),
            x.best(),
            r.ratio_median(p),
            r.ratio_best(p)
        );
    }
    println!("{line}");
    let _ = std::io::stdout().flush();
}

fn met(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "NOT met"
    }
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
/// spread around 1.0 is what this machine's noise does to a ratio.
fn print_summary(rows: &[Row], small_target: bool) {
    if let Some(first) = rows.first() {
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
    }
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

fn pingpong(world: &SimpleCommunicator, args: &BenchArgs) -> dlpack_mpi::Result<()> {
    let root = world.rank() == 0;
    if world.size() < 2 {
        if root {
            println!("ping-pong: skipped (needs at least 2 ranks)\n");
        }
        return Ok(());
    }
    let max = args.max_size as usize;
    if root {
        println!(
            "# ping-pong, rank 0 <-> rank 1 (ranks: {}, others idle), f32, µs per message = \
             half round trip; rounds: {}; ratio = path / raw",
            world.size(),
            args.rounds
        );
        print_header();
    }
    let mut buf = Aligned::new(max / ELEM, 1.0);
    let mut rows = Vec::new();
    for bytes in sizes(PINGPONG_MIN, max) {
        let n = bytes / ELEM;
        buf = buf.set_len(n)?;
        let iters = iters_for(args.iters, bytes);
        let row = measure(world, args.rounds, bytes, iters, |p, it| {
            pingpong_once(world, p, &mut buf, n, it)
        })?;
        if root {
            print_row(&row);
        }
        rows.push(row);
    }
    if root {
        print_summary(&rows, true);
        println!();
    }
    Ok(())
}

/// Returns whether the last all-reduce result was right on this rank.
fn allreduce(world: &SimpleCommunicator, args: &BenchArgs) -> dlpack_mpi::Result<bool> {
    let root = world.rank() == 0;
    let max = (args.max_size as usize).min(ALLREDUCE_MAX);
    if max < ALLREDUCE_MIN {
        if root {
            println!("all-reduce: skipped (--max-size below 1 KiB)\n");
        }
        return Ok(true);
    }
    if root {
        println!(
            "# all-reduce (sum, f32) over all ranks ({}), µs per call of the slowest rank; \
             rounds: {}; ratio = path / raw",
            world.size(),
            args.rounds
        );
        print_header();
    }
    let mut send = Aligned::new(max / ELEM, 1.0);
    let mut recv = Aligned::new(max / ELEM, 0.0);
    let mut rows = Vec::new();
    for bytes in sizes(ALLREDUCE_MIN, max) {
        let n = bytes / ELEM;
        send = send.set_len(n)?;
        recv = recv.set_len(n)?;
        let iters = iters_for(args.iters, bytes);
        let row = measure(world, args.rounds, bytes, iters, |p, it| {
            allreduce_once(world, p, &mut send, &mut recv, n, it)
        })?;
        if root {
            print_row(&row);
        }
        rows.push(row);
    }
    // Every path summed the same all-ones buffer: each element is the number of ranks.
    let expected = world.size() as Elem;
    let n = ALLREDUCE_MIN / ELEM;
    let bad = recv.raw(n).iter().find(|&&x| x != expected).copied();
    if let Some(bad) = bad {
        eprintln!(
            "dlpack-mpi bench: rank {}: all-reduce result {bad}, expected {expected}",
            world.rank()
        );
    }
    if root {
        print_summary(&rows, false);
        println!();
    }
    Ok(bad.is_none())
}

/// Elements of the sender's storage in `--op strided` (64 MiB of f32), which both cases view.
/// Element `k` holds `k`, exact in f32 (`k < 2^24`), so the receiver can tell which storage
/// element it got.
const STRIDED_STORAGE: usize = (64 << 20) / ELEM;
/// Rows and columns of the transposed matrix.
const TRANSPOSE_DIM: usize = 4096;
/// Target for both cases: derived / pack ≤ 1 (the derived datatype at least as fast as
/// packing by hand and sending).
const TARGET_VS_PACK: f64 = 1.0;

/// A strided view of the sender's storage (one or two axes, strides in elements).
#[derive(Debug, Clone, Copy)]
struct Case {
    name: &'static str,
    shape: &'static [i64],
    strides: &'static [i64],
    /// Target for derived / contiguous, if any.
    contig_target: Option<f64>,
}

const CASES: [Case; 2] = [
    Case {
        name: "step 2",
        shape: &[(STRIDED_STORAGE / 2) as i64],
        strides: &[2],
        contig_target: Some(1.5),
    },
    Case {
        name: "transpose",
        shape: &[TRANSPOSE_DIM as i64, TRANSPOSE_DIM as i64],
        strides: &[1, TRANSPOSE_DIM as i64],
        contig_target: None,
    },
];

impl Case {
    /// `(rows, row stride, columns, column stride)`; a 1-d view is one row.
    fn dims(&self) -> (usize, usize, usize, usize) {
        match (self.shape, self.strides) {
            (&[n], &[s]) => (1, 0, n as usize, s as usize),
            (&[r, c], &[rs, cs]) => (r as usize, rs as usize, c as usize, cs as usize),
            _ => unreachable!("strided cases have one or two axes"),
        }
    }

    /// Number of logical elements.
    fn len(&self) -> usize {
        let (rows, _, cols, _) = self.dims();
        rows * cols
    }

    /// Storage index of logical element `l` (row-major).
    fn source_index(&self, l: usize) -> usize {
        let (_, row_stride, cols, col_stride) = self.dims();
        l / cols * row_stride + l % cols * col_stride
    }
}

/// The copy of the pack-and-send path: the logical elements of `case` in row-major order,
/// from `src` (first element at index 0) into `dst`.
fn pack(case: &Case, src: &[Elem], dst: &mut [Elem]) {
    let (_, row_stride, cols, col_stride) = case.dims();
    for (i, row) in dst.chunks_exact_mut(cols).enumerate() {
        let from = src[i * row_stride..].iter().step_by(col_stride);
        for (d, s) in row.iter_mut().zip(from) {
            *d = *s;
        }
    }
}

/// A path through which a strided view is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StridedPath {
    Derived,
    Pack,
    Contiguous,
}

const STRIDED_PATHS: [StridedPath; 3] = [
    StridedPath::Derived,
    StridedPath::Pack,
    StridedPath::Contiguous,
];

impl StridedPath {
    fn name(self) -> &'static str {
        match self {
            StridedPath::Derived => "derived",
            StridedPath::Pack => "pack",
            StridedPath::Contiguous => "contiguous",
        }
    }
}

/// The buffers of `--op strided`, each allocated at full size only on the rank that uses it.
struct StridedBuffers {
    /// Rank 0: the storage the strided tensors view and the contiguous path sends from.
    src: Aligned,
    /// Rank 0: the pack path's contiguous buffer (allocated once, reused).
    packed: Aligned,
    /// Rank 1: the receive buffer (logical size of the largest case).
    recv: Aligned,
}

/// One timed run of `iters` messages of `case` through `path`, rank 0 to rank 1, each
/// acknowledged by a 1-byte message back; seconds per message on rank 0, 0 elsewhere.
fn strided_once(
    world: &SimpleCommunicator,
    path: StridedPath,
    case: &Case,
    bufs: &mut StridedBuffers,
    iters: u64,
) -> dlpack_mpi::Result<f64> {
    let rank = world.rank();
    let n = case.len();
    let mut ack = 0u8;
    if rank > 1 {
        world.barrier();
        return Ok(0.0);
    }
    if rank == 1 {
        // The same receive on every path: the logical elements into a contiguous buffer.
        let peer = world.process_at_rank(0);
        let r = bufs.recv.raw(n);
        world.barrier();
        for _ in 0..iters {
            peer.receive_into(&mut *r);
            peer.send(&ack);
        }
        return Ok(0.0);
    }
    let peer = world.process_at_rank(1);
    let start;
    match path {
        StridedPath::Derived => {
            let t = acquire(&bufs.src.owned, &AcquireOptions::default())?;
            world.barrier();
            start = mpi::time();
            for _ in 0..iters {
                peer.send(&SendSpec::new(&t)?);
                peer.receive_into(&mut ack);
            }
        }
        StridedPath::Pack => {
            let src = bufs.src.raw(STRIDED_STORAGE);
            let dst = bufs.packed.raw(n);
            world.barrier();
            start = mpi::time();
            for _ in 0..iters {
                pack(case, src, dst);
                peer.send(&*dst);
                peer.receive_into(&mut ack);
            }
        }
        StridedPath::Contiguous => {
            let s = bufs.src.raw(n);
            world.barrier();
            start = mpi::time();
            for _ in 0..iters {
                peer.send(&*s);
                peer.receive_into(&mut ack);
            }
        }
    }
    Ok((mpi::time() - start) / iters as f64)
}

/// Sends one message of `case` through every path; rank 1 checks that it received the
/// logical elements (derived, pack) or the first storage elements (contiguous). Returns, on
/// every rank, whether all arrived intact.
fn strided_verify(
    world: &SimpleCommunicator,
    case: &Case,
    bufs: &mut StridedBuffers,
) -> dlpack_mpi::Result<bool> {
    let n = case.len();
    let mut ok = true;
    for p in STRIDED_PATHS {
        if world.rank() == 1 {
            bufs.recv.raw(n).fill(-1.0);
        }
        strided_once(world, p, case, bufs, 1)?;
        if world.rank() == 1 {
            let expected = |l: usize| match p {
                StridedPath::Contiguous => l as Elem,
                _ => case.source_index(l) as Elem,
            };
            let got = bufs.recv.raw(n);
            if let Some((l, &x)) = got.iter().enumerate().find(|&(l, &x)| x != expected(l)) {
                eprintln!(
                    "dlpack-mpi bench: rank 1: strided {} via {}: element {l} is {x}, expected {}",
                    case.name,
                    p.name(),
                    expected(l)
                );
                ok = false;
            }
        }
    }
    let mut all = 0i32;
    world.all_reduce_into(&i32::from(ok), &mut all, SystemOperation::min());
    Ok(all == 1)
}

/// Results of one strided case: samples of every path, in `STRIDED_PATHS` order.
#[derive(Debug)]
struct StridedRow {
    case: Case,
    iters: u64,
    paths: [Samples; 3],
}

impl StridedRow {
    fn get(&self, p: StridedPath) -> &Samples {
        &self.paths[p as usize]
    }

    /// `a / b` of the medians and of the best rounds.
    fn ratios(&self, a: StridedPath, b: StridedPath) -> (f64, f64) {
        (
            self.get(a).median() / self.get(b).median(),
            self.get(a).best() / self.get(b).best(),
        )
    }
}

fn print_strided_header() {
    let mut line = format!("{:>10} {:>8} {:>6}", "case", "logical", "iters");
    for name in ["contig", "pack", "derived"] {
        line += &format!(" | {:>12} {:>10}", format!("{name} med"), "best");
    }
    for name in ["derived/pack", "derived/contig"] {
        line += &format!(" | {:>18} {:>6}", format!("{name} med"), "best");
    }
    println!("{line}");
}

fn print_strided_row(r: &StridedRow) {
    let mut line = format!(
        "{:>10} {:>8} {:>6}",
        r.case.name,
        fmt_size(r.case.len() * ELEM),
        r.iters
    );
    for p in [
        StridedPath::Contiguous,
        StridedPath::Pack,
        StridedPath::Derived,
    ] {
        let x = r.get(p);
        line += &format!(" | {:>12.1} {:>10.1}", x.median(), x.best());
    }
    for base in [StridedPath::Pack, StridedPath::Contiguous] {
        let (med, best) = r.ratios(StridedPath::Derived, base);
        line += &format!(" | {med:>18.3} {best:>6.3}");
    }
    println!("{line}");
    let _ = std::io::stdout().flush();
}

fn print_strided_summary(rows: &[StridedRow], verified: bool) {
    println!(
        "verification (one message per case and path, every element checked on rank 1): {}",
        if verified { "passed" } else { "FAILED" }
    );
    for r in rows {
        let (pm, pb) = r.ratios(StridedPath::Derived, StridedPath::Pack);
        let (cm, cb) = r.ratios(StridedPath::Derived, StridedPath::Contiguous);
        let contig = match r.case.contig_target {
            Some(t) => format!(
                "target ≤ {t:.2}: median {}, best {}",
                met(cm <= t),
                met(cb <= t)
            ),
            None => "no target".to_string(),
        };
        println!(
            "{}: derived/pack {pm:.3} median, {pb:.3} best (target ≤ {TARGET_VS_PACK:.2}: median \
             {}, best {}); derived/contiguous {cm:.3} median, {cb:.3} best ({contig})",
            r.case.name,
            met(pm <= TARGET_VS_PACK),
            met(pb <= TARGET_VS_PACK),
        );
    }
}

/// Returns whether every path delivered the expected elements.
fn strided(world: &SimpleCommunicator, args: &BenchArgs) -> dlpack_mpi::Result<bool> {
    let rank = world.rank();
    let root = rank == 0;
    if world.size() < 2 {
        if root {
            println!("strided: skipped (needs at least 2 ranks)\n");
        }
        return Ok(true);
    }
    if root {
        println!(
            "# strided send, rank 0 -> rank 1 (ranks: {}, others idle), f32 views of a 64 MiB \
             storage; one-way: µs per message from the start of the pack or send to the receipt \
             of rank 1's 1-byte ack; rounds: {}; ratio = derived / path",
            world.size(),
            args.rounds
        );
        println!(
            "paths: derived = SendSpec::new(&strided tensor) per message (cached derived \
             datatype, count 1) + rsmpi send; pack = Rust loop into a reused contiguous buffer \
             (timed) + send; contig = send of the same bytes from a contiguous slice; rank 1 \
             receives into &mut [f32] of the logical size on every path"
        );
        print_strided_header();
    }
    let largest = CASES.iter().map(Case::len).max().unwrap_or(0);
    let mut bufs = StridedBuffers {
        src: Aligned::new(if root { STRIDED_STORAGE } else { 0 }, 0.0),
        packed: Aligned::new(if root { largest } else { 0 }, 0.0),
        recv: Aligned::new(if rank == 1 { largest } else { 0 }, -1.0),
    };
    if root {
        for (k, x) in bufs.src.raw(STRIDED_STORAGE).iter_mut().enumerate() {
            *x = k as Elem;
        }
    }
    let mut verified = true;
    let mut rows = Vec::new();
    for case in CASES {
        if root {
            bufs.src = bufs.src.set_layout(case.shape, Some(case.strides))?;
            let t = acquire(&bufs.src.owned, &AcquireOptions::default())?;
            let spec = SendSpec::new(&t)?;
            assert!(
                spec.is_derived() && spec.mpi_count() == 1,
                "{}: not sent as one derived datatype",
                case.name
            );
        }
        verified &= strided_verify(world, &case, &mut bufs)?;
        let iters = iters_for(args.iters, case.len() * ELEM);
        let paths = measure_paths(world, args.rounds, iters, STRIDED_PATHS, |p, it| {
            strided_once(world, p, &case, &mut bufs, it)
        })?;
        let row = StridedRow { case, iters, paths };
        if root {
            print_strided_row(&row);
        }
        rows.push(row);
    }
    if root {
        print_strided_summary(&rows, verified);
        println!();
    }
    Ok(verified)
}

/// Runs the benchmark; prints the tables on rank 0.
pub fn run(world: &SimpleCommunicator, args: &BenchArgs) -> ExitCode {
    if world.rank() == 0 {
        let library = mpi::environment::library_version()
            .map(|s| {
                s.trim_end_matches(['\0', '\n'])
                    .lines()
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_string()
            })
            .unwrap_or_default();
        println!(
            "dlpack-mpi {} bench: ranks: {}; {library}; buffers {ALIGN}-byte aligned, shared by \
             all paths; iters {} (up to {}), rounds {}; timer resolution {:.3} µs",
            env!("CARGO_PKG_VERSION"),
            world.size(),
            args.iters,
            fmt_size(SCALE_REF),
            args.rounds,
            mpi::time_resolution() * 1e6,
        );
        if args.op != Op::Strided {
            println!(
                "paths: raw = rsmpi on &[f32] / &mut [f32]; dlpack = SendSpec/RecvSpec built per \
                 message + rsmpi; reused = specs built once per round + rsmpi; checked = \
                 TensorComm (recv_tensor probes first)\n"
            );
        }
    }
    let result = match args.op {
        Op::Pingpong => pingpong(world, args).map(|()| true),
        Op::Allreduce => allreduce(world, args),
        Op::All => pingpong(world, args)
            .and_then(|()| allreduce(world, args))
            .and_then(|ok| {
                if args.max_size < (STRIDED_STORAGE * ELEM) as u64 {
                    if world.rank() == 0 {
                        println!("strided: skipped (--max-size below 64 MiB)\n");
                    }
                    Ok(ok)
                } else {
                    Ok(strided(world, args)? && ok)
                }
            }),
        Op::Strided => strided(world, args),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("dlpack-mpi bench: rank {}: {e}", world.rank());
            world.abort(1)
        }
    }
}
