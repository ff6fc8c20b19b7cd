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
use dlpack_mpi::spec::{RecvSpec, SendSpec, VectorRecvSpec};
use mpi::collective::SystemOperation;
use mpi::datatype::PartitionMut;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

/// Alignment of the first element of every benchmarked buffer, in bytes.
const ALIGN: usize = 4096;
/// Element type of every message.
type Elem = f32;
/// Bytes per element.
const ELEM: usize = std::mem::size_of::<Elem>();
/// Sizes up to this many bytes run `--iters` iterations per round; larger ones run
/// `iters × SCALE_REF / size` (at least `MIN_ITERS`), so every round moves about the same
/// number of bytes.
pub(crate) const SCALE_REF: usize = 16 << 10;
const MIN_ITERS: u64 = 4;
/// The per-message target at the smallest size, µs (best round, dlpack − raw).
const TARGET_SMALL_US: f64 = 0.05;
/// The ratio target at ≥ 1 MiB (dlpack / raw).
const TARGET_LARGE_RATIO: f64 = 1.02;
const LARGE: usize = 1 << 20;
/// `--max-size` when not given (host memory).
const DEFAULT_MAX_SIZE: u64 = 64 << 20;

/// Which benchmark to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Op {
    /// Ping-pong between rank 0 and rank 1 (other ranks wait at barriers): µs per message
    /// (half a round trip), as osu_latency.
    #[value(alias = "pingpong")]
    Latency,
    /// Rank 0 streams a window of nonblocking sends to rank 1, which acknowledges each
    /// window: µs per message and MB/s, as osu_bw.
    Bandwidth,
    /// All-reduce (sum of f32) over all ranks: µs per call of the slowest rank.
    Allreduce,
    /// All-gatherv, every rank contributing one block of the size: µs per call of the
    /// slowest rank.
    Allgatherv,
    /// All-to-all, one block of the size to every rank: µs per call of the slowest rank.
    Alltoall,
    /// Strided views (every other element; a transposed matrix) from rank 0 to rank 1:
    /// derived datatype vs pack-and-send vs contiguous send of the same bytes.
    Strided,
    /// latency, bandwidth, allreduce, allgatherv, alltoall, then strided (skipped when
    /// --max-size is below 64 MiB).
    All,
}

impl Op {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::Latency => "latency",
            Op::Bandwidth => "bandwidth",
            Op::Allreduce => "allreduce",
            Op::Allgatherv => "allgatherv",
            Op::Alltoall => "alltoall",
            Op::Strided => "strided",
            Op::All => "all",
        }
    }

    /// Whether the operation is between rank 0 and rank 1 only.
    fn point_to_point(self) -> bool {
        matches!(self, Op::Latency | Op::Bandwidth | Op::Strided)
    }

    /// Default sizes, bytes (per rank's block for all-gatherv and all-to-all), for a
    /// largest size of `max`.
    fn default_sizes(self, max: usize) -> Vec<usize> {
        match self {
            Op::Latency => sizes(8, max),
            Op::Bandwidth => sizes(8, max.min(16 << 20)),
            Op::Allreduce => sizes(1 << 10, max.min(16 << 20)),
            _ => sizes(8, max.min(4 << 20)),
        }
    }
}

/// How the dlpack-mpi side lays out its tensors (`--layout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BenchLayout {
    /// Dense, C order.
    Contiguous,
    /// Every other element of a storage twice the size (stride 2): point-to-point goes
    /// through a derived datatype, collectives through packing. The raw path sends the same
    /// number of bytes from a contiguous slice: the lower bound.
    Step,
}

impl BenchLayout {
    fn name(self) -> &'static str {
        match self {
            BenchLayout::Contiguous => "contiguous",
            BenchLayout::Step => "step",
        }
    }
}

/// Message sizes in bytes: a comma-separated list of sizes (`8,1K,64KiB,4M`; K/M/G are
/// powers of 1024) or ranges `A:B` (every power of two from A to B).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sizes(pub Vec<u64>);

fn parse_one_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("size `{t}` is not a number of bytes"))?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        other => {
            return Err(format!(
                "size `{t}` has an unknown unit `{other}` (use K, M or G)"
            ))
        }
    };
    let bytes = n
        .checked_mul(scale)
        .filter(|b| (4..=1 << 30).contains(b))
        .ok_or_else(|| format!("size `{t}` is outside 4 B ..= 1 GiB"))?;
    if bytes % ELEM as u64 != 0 {
        return Err(format!(
            "size `{t}` is not a whole number of f32 elements (4 bytes)"
        ));
    }
    Ok(bytes)
}

fn parse_sizes(text: &str) -> Result<Sizes, String> {
    let mut out = Vec::new();
    for part in text.split(',').filter(|p| !p.trim().is_empty()) {
        match part.split_once(':') {
            Some((lo, hi)) => {
                let (lo, hi) = (parse_one_size(lo)?, parse_one_size(hi)?);
                if lo > hi {
                    return Err(format!("size range `{part}` runs backwards"));
                }
                let mut s = lo;
                while s <= hi {
                    out.push(s);
                    s *= 2;
                }
            }
            None => out.push(parse_one_size(part)?),
        }
    }
    if out.is_empty() {
        return Err("no sizes given".into());
    }
    out.sort_unstable();
    out.dedup();
    Ok(Sizes(out))
}

/// Options of `bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Which benchmark to run.
    #[arg(long, value_enum, default_value_t = Op::All)]
    pub op: Op,
    /// Message sizes in bytes (per rank's block for allgatherv and alltoall), e.g.
    /// `8,1K,1M` or `8:64M` (powers of two); default: powers of two up to --max-size.
    #[arg(long, value_parser = parse_sizes)]
    pub sizes: Option<Sizes>,
    /// Timed rounds per size and path (median and best are reported).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub rounds: u32,
    /// Iterations per round for messages up to 16 KiB; larger messages run proportionally
    /// fewer (iters × 16 KiB / size, at least 4).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub iters: u64,
    /// Largest message in bytes when --sizes is not given, default 64 MiB (latency from 8 B;
    /// bandwidth and all-reduce up to at most 16 MiB, all-gatherv and all-to-all 4 MiB).
    /// Strided sizes are fixed (a 64 MiB storage); `all` skips them below 64 MiB. With
    /// `--device cuda` the default sizes are 4 KiB … 256 MiB.
    #[arg(long, value_parser = clap::value_parser!(u64).range(8..=(1 << 30)))]
    pub max_size: Option<u64>,
    /// Where the tensors live; bench accepts `cpu` and `cuda` only (the other values are
    /// `check`'s). `cuda` (device memory through cudarc: feature `cuda` and a CUDA driver)
    /// runs ping-pong and allreduce only (`--op all` = both) through DeviceComm
    /// (staged, and direct when MPI is CUDA-aware) next to a device → pinned → device copy
    /// of the same bytes and to host-memory MPI, with the staged/copy bandwidth ratio.
    #[arg(long, value_enum, default_value_t = crate::DeviceArg::Cpu)]
    pub device: crate::DeviceArg,
    /// Testing without a GPU: `--device cuda` on host memory labelled `kDLCUDA`, with a
    /// simulated runtime.
    #[arg(long, hide = true)]
    pub simulate_device: bool,
    /// Layout of the dlpack-mpi side's tensors.
    #[arg(long, value_enum, default_value_t = BenchLayout::Contiguous)]
    pub layout: BenchLayout,
    /// Write every measurement to FILE as CSV (rank 0): one row per operation, size and path.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<std::path::PathBuf>,
    /// Draw latency and bandwidth against size, one curve per path, to FILE (SVG).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<std::path::PathBuf>,
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

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::Raw => "raw",
            Path::Dlpack => "dlpack",
            Path::Reused => "reused",
            Path::Checked => "checked",
        }
    }
}

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

/// Results of one size: samples of every path, in `PATHS` order (`None`: the path does not
/// exist for this operation and layout).
#[derive(Debug)]
struct Row {
    op: Op,
    bytes: usize,
    iters: u64,
    paths: [Option<Samples>; 4],
}

/// An empty sample set for paths that did not run (every statistic is NaN).
static NO_SAMPLES: Samples = Samples(Vec::new());

impl Row {
    fn get(&self, p: Path) -> &Samples {
        self.paths[p as usize].as_ref().unwrap_or(&NO_SAMPLES)
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

pub(crate) fn iters_for(base: u64, bytes: usize) -> u64 {
    if bytes <= SCALE_REF {
        base
    } else {
        (base.saturating_mul(SCALE_REF as u64) / bytes as u64).max(MIN_ITERS)
    }
}

pub(crate) fn sizes(min: usize, max: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut s = min;
    while s <= max {
        v.push(s);
        s *= 2;
    }
    v
}

pub(crate) fn fmt_size(bytes: usize) -> String {
    if bytes >= 1 << 20 && bytes % (1 << 20) == 0 {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes % (1 << 10) == 0 {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} B")
    }
}

/// Messages in flight per window of `--op bandwidth` for messages of `bytes`: 64 (as
/// osu_bw), fewer above 1 MiB so that a window holds at most 64 MiB (the receiver needs a
/// buffer per message).
fn window_for(bytes: usize) -> usize {
    ((64 << 20) / bytes.max(1)).clamp(1, 64)
}

/// The value stored at storage index `k` of rank `r`'s send buffer: exact in f32, distinct
/// per rank, and small enough that sums over a few ranks stay exact.
fn value(r: i32, k: usize) -> Elem {
    ((k % 4096) + 4096 * r as usize) as Elem
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
fn buffer(
    layout: BenchLayout,
    n: usize,
    fill: impl Fn(usize) -> Elem,
) -> dlpack_mpi::Result<Aligned> {
    let stride = stride_of(Path::Dlpack, layout);
    let mut a = Aligned::new(n * stride, 0.0);
    for (k, x) in a.raw(n * stride).iter_mut().enumerate() {
        *x = fill(k);
    }
    a.set_layout(&[n as i64], Some(&[stride as i64]))
}

/// One timed ping-pong run of `iters` round trips; seconds per message (half a round trip)
/// on rank 0, 0 elsewhere.
fn latency_once(
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

/// Waits for every request of a window (rsmpi panics on a request dropped uncompleted).
fn wait_all<'a, B: ?Sized, S: mpi::request::Scope<'a>>(reqs: Vec<mpi::request::Request<'a, B, S>>) {
    for r in reqs {
        r.wait();
    }
}

fn acquire_all(bufs: &[Aligned]) -> dlpack_mpi::Result<Vec<dlpack_mpi::dlpack::ManagedTensor<'_>>> {
    bufs.iter()
        .map(|b| acquire(&b.owned, &AcquireOptions::default()))
        .collect()
}

/// Posts one nonblocking receive from rank 0 per spec (through `TensorComm` when `checked`,
/// else rsmpi directly) and waits for all of them.
fn recv_window(
    world: &SimpleCommunicator,
    specs: &mut [RecvSpec<'_>],
    checked: bool,
    tag: mpi::Tag,
) -> dlpack_mpi::Result<()> {
    let peer = world.process_at_rank(0);
    mpi::request::scope(|sc| {
        let mut reqs = Vec::with_capacity(specs.len());
        let mut failed = None;
        for spec in specs.iter_mut() {
            if checked {
                match world.immediate_recv_tensor(sc, spec, 0, tag) {
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
) -> dlpack_mpi::Result<f64> {
    use mpi::request::scope;
    let rank = world.rank();
    if rank > 1 {
        world.barrier();
        return Ok(0.0);
    }
    let mut ack = 0u8;
    let tag = 1;
    if rank == 1 {
        let peer = world.process_at_rank(0);
        match path {
            Path::Raw => {
                let mut bufs: Vec<&mut [Elem]> = recv.iter_mut().map(|b| b.raw(n)).collect();
                world.barrier();
                for _ in 0..iters {
                    scope(|sc| {
                        let reqs: Vec<_> = bufs
                            .iter_mut()
                            .map(|b| peer.immediate_receive_into_with_tag(sc, &mut **b, tag))
                            .collect();
                        wait_all(reqs);
                    });
                    peer.send(&ack);
                }
            }
            Path::Reused => {
                let mut ts = acquire_all(recv)?;
                let mut specs = ts
                    .iter_mut()
                    .map(RecvSpec::new)
                    .collect::<dlpack_mpi::Result<Vec<_>>>()?;
                world.barrier();
                for _ in 0..iters {
                    recv_window(world, &mut specs, false, tag)?;
                    peer.send(&ack);
                }
            }
            Path::Dlpack | Path::Checked => {
                let mut ts = acquire_all(recv)?;
                world.barrier();
                for _ in 0..iters {
                    let mut specs = ts
                        .iter_mut()
                        .map(RecvSpec::new)
                        .collect::<dlpack_mpi::Result<Vec<_>>>()?;
                    recv_window(world, &mut specs, path == Path::Checked, tag)?;
                    peer.send(&ack);
                }
            }
        }
        return Ok(0.0);
    }
    let peer = world.process_at_rank(1);
    let start;
    match path {
        Path::Raw => {
            let b = send.raw(n);
            world.barrier();
            start = mpi::time();
            for _ in 0..iters {
                scope(|sc| {
                    let reqs: Vec<_> = (0..window)
                        .map(|_| peer.immediate_send_with_tag(sc, &*b, tag))
                        .collect();
                    wait_all(reqs);
                });
                peer.receive_into(&mut ack);
            }
        }
        Path::Dlpack | Path::Checked | Path::Reused => {
            let t = acquire(&send.owned, &AcquireOptions::default())?;
            let reused = SendSpec::new(&t)?;
            world.barrier();
            start = mpi::time();
            for _ in 0..iters {
                let specs = match path {
                    Path::Reused => Vec::new(),
                    _ => (0..window)
                        .map(|_| SendSpec::new(&t))
                        .collect::<dlpack_mpi::Result<Vec<_>>>()?,
                };
                let posted = scope(|sc| -> dlpack_mpi::Result<()> {
                    let mut reqs = Vec::with_capacity(window);
                    let mut failed = None;
                    for i in 0..window {
                        let spec = specs.get(i).unwrap_or(&reused);
                        match path {
                            Path::Reused | Path::Dlpack => {
                                reqs.push(peer.immediate_send_with_tag(sc, spec, tag));
                            }
                            _ => match world.immediate_send_tensor(sc, spec, 1, tag) {
                                Ok(r) => reqs.push(r),
                                Err(e) => {
                                    failed = Some(e);
                                    break;
                                }
                            },
                        }
                    }
                    wait_all(reqs);
                    failed.map_or(Ok(()), Err)
                });
                posted?;
                peer.receive_into(&mut ack);
            }
        }
    }
    Ok((mpi::time() - start) / (iters as f64 * window as f64))
}

/// A collective benchmarked by [`collective_once`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Collective {
    Allreduce,
    Allgatherv,
    Alltoall,
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
) -> dlpack_mpi::Result<f64> {
    let sum = SystemOperation::sum();
    let p = world.size() as usize;
    let (send_n, recv_n) = match what {
        Collective::Allreduce => (n, n),
        Collective::Allgatherv => (n, p * n),
        Collective::Alltoall => (p * n, p * n),
    };
    let counts32 = vec![n as i32; p];
    let displs32: Vec<i32> = (0..p).map(|i| (i * n) as i32).collect();
    let counts: Vec<i64> = counts32.iter().map(|&c| i64::from(c)).collect();
    let displs: Vec<i64> = displs32.iter().map(|&d| i64::from(d)).collect();
    let start;
    match path {
        Path::Raw => {
            let s = send.raw(send_n);
            let r = recv.raw(recv_n);
            world.barrier();
            start = mpi::time();
            for _ in 0..iters {
                match what {
                    Collective::Allreduce => world.all_reduce_into(&*s, &mut *r, sum),
                    Collective::Allgatherv => world.all_gather_varcount_into(
                        &*s,
                        &mut PartitionMut::new(&mut *r, &counts32[..], &displs32[..]),
                    ),
                    Collective::Alltoall => world.all_to_all_into(&*s, &mut *r),
                }
            }
        }
        Path::Dlpack => {
            let s = acquire(&send.owned, &AcquireOptions::default())?;
            let mut r = acquire(&recv.owned, &AcquireOptions::default())?;
            world.barrier();
            start = mpi::time();
            for _ in 0..iters {
                let sspec = SendSpec::new(&s)?;
                let rspec = RecvSpec::new(&mut r)?;
                match what {
                    Collective::Allreduce => world.all_reduce_into(&sspec, &mut { rspec }, sum),
                    Collective::Allgatherv => world.all_gather_varcount_into(
                        &sspec,
                        &mut VectorRecvSpec::new(rspec, &counts, &displs)?,
                    ),
                    Collective::Alltoall => world.all_to_all_into(&sspec, &mut { rspec }),
                }
            }
        }
        Path::Reused => {
            let s = acquire(&send.owned, &AcquireOptions::default())?;
            let mut r = acquire(&recv.owned, &AcquireOptions::default())?;
            let sspec = SendSpec::new(&s)?;
            let mut rspec = RecvSpec::new(&mut r)?;
            world.barrier();
            start = mpi::time();
            match what {
                Collective::Allgatherv => {
                    let mut v = VectorRecvSpec::new(rspec, &counts, &displs)?;
                    for _ in 0..iters {
                        world.all_gather_varcount_into(&sspec, &mut v);
                    }
                }
                Collective::Allreduce => {
                    for _ in 0..iters {
                        world.all_reduce_into(&sspec, &mut rspec, sum);
                    }
                }
                Collective::Alltoall => {
                    for _ in 0..iters {
                        world.all_to_all_into(&sspec, &mut rspec);
                    }
                }
            }
        }
        Path::Checked => {
            let s = acquire(&send.owned, &AcquireOptions::default())?;
            let mut r = acquire(&recv.owned, &AcquireOptions::default())?;
            world.barrier();
            start = mpi::time();
            for _ in 0..iters {
                match what {
                    Collective::Allreduce => world.all_reduce_tensor(&s, &mut r, ReduceOp::Sum)?,
                    Collective::Allgatherv => {
                        world.all_gatherv_tensor(&s, &mut r, &counts, &displs)?
                    }
                    Collective::Alltoall => world.all_to_all_tensor(&s, &mut r)?,
                }
            }
        }
    }
    let local = (mpi::time() - start) / iters as f64;
    let mut slowest = 0.0f64;
    world.all_reduce_into(&local, &mut slowest, SystemOperation::max());
    Ok(slowest)
}

/// Warm-up, then `rounds` rounds of every available path in rotated order.
fn measure(
    world: &SimpleCommunicator,
    op: Op,
    paths: &[Path],
    rounds: u32,
    bytes: usize,
    iters: u64,
    mut once: impl FnMut(Path, u64) -> dlpack_mpi::Result<f64>,
) -> dlpack_mpi::Result<Row> {
    let warm = (iters / 5).max(2);
    for &p in paths {
        once(p, warm)?;
    }
    let mut samples: [Option<Samples>; 4] = Default::default();
    for &p in paths {
        samples[p as usize] = Some(Samples::default());
    }
    for round in 0..rounds as usize {
        world.barrier();
        for k in 0..paths.len() {
            let p = paths[(round + k) % paths.len()];
            let secs = once(p, iters)?;
            if let Some(s) = samples[p as usize].as_mut() {
                s.0.push(secs * 1e6);
            }
        }
    }
    world.barrier();
    Ok(Row {
        op,
        bytes,
        iters,
        paths: samples,
    })
}

/// [`measure`] for the strided benchmark's fixed list of paths: samples (µs per message) in
/// the order of `order`.
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

fn print_header(bandwidth: bool) {
    let mut line = format!(
        "{:>10} {:>8} | {:>8} {:>8}",
        "size", "iters", "raw med", "best"
    );
    if bandwidth {
        line += &format!(" {:>9}", "MB/s");
    }
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

/// MB/s (10^6 bytes per second) of messages of `bytes` taking `us` µs each.
fn mb_per_s(bytes: usize, us: f64) -> f64 {
    bytes as f64 / us
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
    if r.op == Op::Bandwidth {
        line += &format!(" {:>9.1}", mb_per_s(r.bytes, w.median()));
    }
    for p in [Path::Dlpack, Path::Reused, Path::Checked] {
        if r.paths[p as usize].is_none() {
            line += &format!(" | {:>11} {:>8} {:>11} {:>6}", "-", "-", "-", "-");
            continue;
        }
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

/// Runs one operation over its sizes; returns its rows and whether every path delivered
/// the expected values (checked once per size and path after the timing).
fn sweep(
    world: &SimpleCommunicator,
    args: &BenchArgs,
    op: Op,
) -> dlpack_mpi::Result<(Vec<Row>, bool)> {
    let (rank, p) = (world.rank(), world.size());
    let root = rank == 0;
    if op.point_to_point() && p < 2 {
        if root {
            println!("{}: skipped (needs at least 2 ranks)\n", op.name());
        }
        return Ok((Vec::new(), true));
    }
    let list: Vec<usize> = match &args.sizes {
        Some(s) => s.0.iter().map(|&b| b as usize).collect(),
        None => op.default_sizes(args.max_size.unwrap_or(DEFAULT_MAX_SIZE) as usize),
    };
    let paths = available(op, args.layout);
    if root {
        let what = match op {
            Op::Latency => "ping-pong, rank 0 <-> rank 1 (others idle), µs per message = half \
                            round trip"
                .to_string(),
            Op::Bandwidth => "rank 0 -> rank 1 windows of nonblocking sends (64 messages, at \
                              most 64 MiB per window), µs per message; MB/s = 10^6 B/s of the \
                              raw path"
                .to_string(),
            Op::Allreduce => {
                format!("all-reduce (sum) over {p} ranks, µs per call of the slowest rank")
            }
            Op::Allgatherv => format!(
                "all-gatherv over {p} ranks, size = each rank's block, µs per call of the \
                 slowest rank"
            ),
            _ => format!(
                "all-to-all over {p} ranks, size = the block for each rank, µs per call of \
                 the slowest rank"
            ),
        };
        println!(
            "# {}: {what}; f32, {} layout; rounds: {}; ratio = path / raw",
            op.name(),
            args.layout.name(),
            args.rounds
        );
        if paths.len() < PATHS.len() {
            println!(
                "# strided collectives: only the checked path (which packs) runs beside raw \
                 (contiguous, same bytes)"
            );
        }
        print_header(op == Op::Bandwidth);
    }
    let mut rows = Vec::new();
    let mut ok = true;
    for bytes in list {
        let n = bytes / ELEM;
        let iters = iters_for(args.iters, bytes);
        let mut problems = Vec::new();
        let row = match op {
            Op::Latency => {
                let mut buf = buffer(
                    args.layout,
                    n,
                    |k| {
                        if rank == 0 {
                            value(0, k)
                        } else {
                            -1.0
                        }
                    },
                )?;
                let row = measure(world, op, &paths, args.rounds, bytes, iters, |path, it| {
                    latency_once(world, path, &mut buf, n, it)
                })?;
                for &path in &paths {
                    let stride = stride_of(path, args.layout);
                    if rank == 1 {
                        buf.raw(n * stride).fill(-1.0);
                    }
                    latency_once(world, path, &mut buf, n, 1)?;
                    if rank == 1 {
                        let store = buf.raw(n * stride);
                        problems.extend(from_rank_0("rank 1: latency", path, store, n, stride));
                    }
                }
                row
            }
            Op::Bandwidth => {
                let window = window_for(bytes);
                let mut send = buffer(args.layout, if rank == 0 { n } else { 0 }, |k| value(0, k))?;
                let mut recv = (0..if rank == 1 { window } else { 0 })
                    .map(|_| buffer(args.layout, n, |_| -1.0))
                    .collect::<dlpack_mpi::Result<Vec<_>>>()?;
                let row = measure(world, op, &paths, args.rounds, bytes, iters, |path, it| {
                    bandwidth_once(world, path, &mut send, &mut recv, n, window, it)
                })?;
                for &path in &paths {
                    let stride = stride_of(path, args.layout);
                    for b in recv.iter_mut() {
                        b.raw(n * stride).fill(-1.0);
                    }
                    bandwidth_once(world, path, &mut send, &mut recv, n, window, 1)?;
                    for b in recv.iter_mut() {
                        let store = b.raw(n * stride);
                        problems.extend(from_rank_0("rank 1: bandwidth", path, store, n, stride));
                    }
                }
                row
            }
            _ => {
                let what = match op {
                    Op::Allreduce => Collective::Allreduce,
                    Op::Allgatherv => Collective::Allgatherv,
                    _ => Collective::Alltoall,
                };
                let pu = p as usize;
                let (send_n, recv_n) = match what {
                    Collective::Allreduce => (n, n),
                    Collective::Allgatherv => (n, pu * n),
                    Collective::Alltoall => (pu * n, pu * n),
                };
                let mut send = buffer(args.layout, send_n, |k| value(rank, k))?;
                let mut recv = buffer(args.layout, recv_n, |_| -1.0)?;
                let row = measure(world, op, &paths, args.rounds, bytes, iters, |path, it| {
                    collective_once(world, what, path, &mut send, &mut recv, n, it)
                })?;
                for &path in &paths {
                    let stride = stride_of(path, args.layout);
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
                        &format!("rank {rank}: {}", op.name()),
                        path,
                        recv_n,
                        |l| store[l * stride],
                        want,
                    ));
                }
                row
            }
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
    let mut all_ok = 0i32;
    world.all_reduce_into(&i32::from(ok), &mut all_ok, SystemOperation::min());
    if root {
        println!(
            "verification (one call per size and path after the timing, every element \
             checked): {}",
            if all_ok == 1 { "passed" } else { "FAILED" }
        );
        print_summary(&rows, op == Op::Latency);
        println!();
    }
    Ok((rows, all_ok == 1))
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
fn strided(
    world: &SimpleCommunicator,
    args: &BenchArgs,
) -> dlpack_mpi::Result<(Vec<StridedRow>, bool)> {
    let rank = world.rank();
    let root = rank == 0;
    if world.size() < 2 {
        if root {
            println!("strided: skipped (needs at least 2 ranks)\n");
        }
        return Ok((Vec::new(), true));
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
    Ok((rows, verified))
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

fn write_csv(
    path: &std::path::Path,
    args: &BenchArgs,
    ranks: i32,
    rows: &[Row],
    strided: &[StridedRow],
) -> Result<(), String> {
    let fail = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let mut w = csv::Writer::from_path(path).map_err(|e| fail(&e))?;
    let layout = args.layout.name();
    for r in rows {
        for p in PATHS {
            if r.paths[p as usize].is_none() {
                continue;
            }
            let x = r.get(p);
            w.serialize(CsvRow {
                op: r.op.name(),
                layout,
                device: args.device.name(),
                ranks,
                bytes: r.bytes,
                iters: r.iters,
                path: p.name(),
                median_us: x.median(),
                best_us: x.best(),
                ratio_median: r.ratio_median(p),
                ratio_best: r.ratio_best(p),
                mb_per_s: mb_per_s(r.bytes, x.median()),
            })
            .map_err(|e| fail(&e))?;
        }
    }
    for r in strided {
        let op = format!("strided {}", r.case.name);
        let bytes = r.case.len() * ELEM;
        for p in STRIDED_PATHS {
            let x = r.get(p);
            let (ratio_median, ratio_best) = r.ratios(p, StridedPath::Contiguous);
            w.serialize(CsvRow {
                op: &op,
                layout: "strided",
                device: args.device.name(),
                ranks,
                bytes,
                iters: r.iters,
                path: p.name(),
                median_us: x.median(),
                best_us: x.best(),
                ratio_median,
                ratio_best,
                mb_per_s: mb_per_s(bytes, x.median()),
            })
            .map_err(|e| fail(&e))?;
        }
    }
    w.flush().map_err(|e| fail(&e))
}

/// Draws, for every operation measured, latency (µs, median) and bandwidth (MB/s) against
/// message size on log–log axes, one curve per path, into an SVG file.
fn write_plot(path: &std::path::Path, rows: &[Row], title: &str) -> Result<(), String> {
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
    let colors = [BLACK, RED, BLUE, GREEN];
    for (i, op) in ops.iter().enumerate() {
        let mine: Vec<&Row> = rows.iter().filter(|r| r.op == *op).collect();
        let (lo, hi) = (
            mine.iter().map(|r| r.bytes).min().unwrap_or(1) as f64,
            mine.iter().map(|r| r.bytes).max().unwrap_or(1) as f64,
        );
        let x_range = (lo * 0.8)..(hi * 1.25);
        for (j, bandwidth) in [false, true].into_iter().enumerate() {
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
                continue;
            }
            let area = &panels[2 * i + j];
            let caption = format!(
                "{}: {}",
                op.name(),
                if bandwidth {
                    "MB/s (median)"
                } else {
                    "µs per message (median)"
                }
            );
            let mut chart = ChartBuilder::on(area)
                .caption(caption, ("sans-serif", 15))
                .margin(8)
                .x_label_area_size(36)
                .y_label_area_size(60)
                .build_cartesian_2d(
                    x_range.clone().log_scale(),
                    ((y_lo * 0.8)..(y_hi * 1.25)).log_scale(),
                )
                .map_err(|e| fail(&e))?;
            chart
                .configure_mesh()
                .x_desc("message size, bytes")
                .x_label_formatter(&|b| fmt_size(*b as usize))
                .draw()
                .map_err(|e| fail(&e))?;
            for (k, &p) in PATHS.iter().enumerate() {
                let pts: Vec<(f64, f64)> = mine.iter().filter_map(|r| point(r, p)).collect();
                if pts.is_empty() {
                    continue;
                }
                let color = colors[k];
                chart
                    .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                    .map_err(|e| fail(&e))?
                    .label(p.name())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                    });
                chart
                    .draw_series(pts.into_iter().map(|xy| Circle::new(xy, 3, color.filled())))
                    .map_err(|e| fail(&e))?;
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .position(SeriesLabelPosition::UpperLeft)
                .draw()
                .map_err(|e| fail(&e))?;
        }
    }
    root.present().map_err(|e| fail(&e))
}

/// The library's version string, first line.
pub(crate) fn library_line() -> String {
    mpi::environment::library_version()
        .map(|s| {
            s.trim_end_matches(['\0', '\n'])
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        })
        .unwrap_or_default()
}

/// Refuses options this build or this job cannot honour, in one line; `None` = go on.
fn refuse(world: &SimpleCommunicator, args: &BenchArgs) -> Option<String> {
    if !matches!(args.device, crate::DeviceArg::Cpu | crate::DeviceArg::Cuda) {
        return Some(format!(
            "bench runs on device `cpu` or `cuda`, not `{}`",
            args.device.name()
        ));
    }
    if args.device == crate::DeviceArg::Cuda {
        if let Some(why) = crate::gpu_bench::refuse(args) {
            return Some(why);
        }
    }
    if args.op.point_to_point() && world.size() < 2 {
        return Some(if crate::under_launcher() {
            format!(
                "--op {} needs at least 2 ranks; this job has 1 (mpirun -n 2 …)",
                args.op.name()
            )
        } else {
            format!(
                "--op {} needs at least 2 ranks, and this process was not started by mpirun: \
                 run `mpirun -n 2 dlpack-mpi bench --op {}`",
                args.op.name(),
                args.op.name()
            )
        });
    }
    if args.op == Op::Strided && (args.layout != BenchLayout::Contiguous || args.sizes.is_some()) {
        return Some(
            "--op strided has fixed views (step 2 and a transpose of a 64 MiB storage): \
             --layout and --sizes do not apply"
                .into(),
        );
    }
    None
}

/// Runs the benchmark; prints the tables on rank 0. Exit status 0, 1 when a path delivered
/// wrong values, 2 when the options were refused or an output file could not be written.
pub fn run(world: &SimpleCommunicator, args: &BenchArgs) -> ExitCode {
    let root = world.rank() == 0;
    if let Some(why) = refuse(world, args) {
        if root {
            eprintln!("dlpack-mpi bench: {why}");
        }
        return ExitCode::from(2);
    }
    if args.device == crate::DeviceArg::Cuda {
        return match crate::agreed(world, crate::gpu_runtime(args.simulate_device)) {
            Ok(gpu) => crate::gpu_bench::run(world, args, gpu),
            Err(why) => {
                if root {
                    eprintln!("dlpack-mpi bench: device `cuda` needs a GPU runtime: {why}");
                }
                ExitCode::from(2)
            }
        };
    }
    if root {
        println!(
            "dlpack-mpi {} bench: ranks: {}; {}; buffers {ALIGN}-byte aligned, shared by \
             all paths; iters {} (up to {}), rounds {}; timer resolution {:.3} µs",
            env!("CARGO_PKG_VERSION"),
            world.size(),
            library_line(),
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
    let ops: &[Op] = match args.op {
        Op::All => &[
            Op::Latency,
            Op::Bandwidth,
            Op::Allreduce,
            Op::Allgatherv,
            Op::Alltoall,
            Op::Strided,
        ],
        _ => std::slice::from_ref(&args.op),
    };
    let mut rows = Vec::new();
    let mut strided_rows = Vec::new();
    let mut ok = true;
    for &op in ops {
        let result = if op == Op::Strided {
            if args.op == Op::All
                && (args.max_size.unwrap_or(DEFAULT_MAX_SIZE) < (STRIDED_STORAGE * ELEM) as u64
                    || args.sizes.is_some()
                    || args.layout != BenchLayout::Contiguous)
            {
                if root {
                    println!("strided: skipped (it needs --max-size ≥ 64 MiB, no --sizes, contiguous --layout)\n");
                }
                continue;
            }
            strided(world, args).map(|(r, good)| {
                strided_rows = r;
                good
            })
        } else {
            sweep(world, args, op).map(|(mut r, good)| {
                rows.append(&mut r);
                good
            })
        };
        match result {
            Ok(good) => ok &= good,
            Err(e) => {
                eprintln!("dlpack-mpi bench: rank {}: {e}", world.rank());
                world.abort(1)
            }
        }
    }
    let mut status = i32::from(!ok);
    if root {
        let mut written = Ok(());
        if let Some(path) = &args.csv {
            written =
                written.and_then(|()| write_csv(path, args, world.size(), &rows, &strided_rows));
        }
        if let Some(path) = &args.plot {
            let library = library_line();
            let title = format!(
                "dlpack-mpi bench: {} rank(s), {}, f32, {} layout",
                world.size(),
                library.split(',').next().unwrap_or(""),
                args.layout.name()
            );
            written = written.and_then(|()| write_plot(path, &rows, &title));
        }
        if let Err(why) = written {
            eprintln!("dlpack-mpi bench: cannot write: {why}");
            status = 2;
        }
    }
    world.process_at_rank(0).broadcast_into(&mut status);
    match status {
        0 => ExitCode::SUCCESS,
        1 => ExitCode::FAILURE,
        _ => ExitCode::from(2),
    }
}
