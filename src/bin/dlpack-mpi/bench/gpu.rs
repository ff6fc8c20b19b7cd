//! `dlpack-mpi bench --device cuda`: GPU tensors through `DeviceComm`, next to what the
//! staging costs by itself and to host-memory MPI, in one run.
//!
//! For every size (default 4 KiB … 256 MiB, powers of two; `--sizes`, `--max-size`), the
//! paths are, on f32 buffers:
//!
//! - **host**: rsmpi on host `Vec<f32>` buffers of the same size (what MPI costs without a
//!   device);
//! - **copy**: a device → pinned host → device copy of the same bytes through the runtime
//!   (`copy_to_host` + `copy_to_device`, a buffer from `alloc_pinned`), no MPI: the copies a
//!   staged message needs (the sender's and the receiver's);
//! - **staged**: `DeviceComm` with `Transport::Staged` (pinned staging, pipelined
//!   point-to-point above 4 MiB);
//! - **direct**: `DeviceComm` with `Transport::Direct`, when MPI is CUDA-aware.
//!
//! Ping-pong reports µs per message (half a round trip) on rank 0; all-reduce the slowest
//! rank's µs per call. Bandwidth is bytes / time; `staged/copy` is the staged path's
//! bandwidth over the copy's (copy time / staged time): the target is ≥ 0.80 at 64 MiB on a
//! real GPU. Before timing, each path delivers one message that is checked element by
//! element on the receiving rank(s).
//!
//! Uses `common`, `args` and `report`.

use dlpack_mpi::comm::TensorComm;
use std::ffi::c_void;
use std::process::ExitCode;
use std::ptr::NonNull;

use dlpack_mpi::dlpack::{acquire_with_runtime, AcquireOptions, Owned, Tensor};
use dlpack_mpi::dtype::ReduceOp;
use dlpack_mpi::runtime::DeviceRuntime;
use dlpack_mpi::transport::{DeviceComm, Transport};
use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use super::args::{iters_for, sizes, BenchArgs, BenchLayout, Op};
use super::common::{round_trips, value, Leg, Samples};
use super::report::{
    print_gpu_header, print_gpu_intro, print_gpu_row, print_gpu_target, print_gpu_values, GpuPath,
    GpuRow, GPU_PATHS, GPU_TARGET_BYTES,
};
use crate::common::library_line;
use crate::launch::Gpu;

type Res<T> = Result<T, String>;

/// Default size range of the GPU bench.
pub(super) const MIN_SIZE: usize = 4 << 10;
pub(super) const DEFAULT_MAX: usize = 256 << 20;

fn ers(err: dlpack_mpi::Error) -> String {
    err.to_string()
}

/// A device buffer of f32: labelled host memory (simulated) or cudarc device memory.
enum DevBuf {
    Sim(Owned<f32>),
    #[cfg(feature = "cuda")]
    Cuda(
        cudarc::driver::CudaSlice<f32>,
        std::sync::Arc<cudarc::driver::CudaStream>,
    ),
}

impl DevBuf {
    fn new(gpu: &Gpu, data: &[f32]) -> Res<DevBuf> {
        if gpu.simulated {
            return Ok(DevBuf::Sim(
                Owned::new(data.to_vec()).labelled(gpu.device()),
            ));
        }
        #[cfg(feature = "cuda")]
        {
            // The runtime's selected device (checked against its count: not negative).
            let ordinal = usize::try_from(gpu.ordinal()).map_err(|_| "negative CUDA ordinal")?;
            let stream = cudarc::driver::CudaContext::new(ordinal)
                .map_err(|e| format!("CUDA: {e}"))?
                .default_stream();
            let slice = stream.clone_htod(data).map_err(|e| format!("CUDA: {e}"))?;
            Ok(DevBuf::Cuda(slice, stream))
        }
        #[cfg(not(feature = "cuda"))]
        Err(crate::launch::no_runtime_reason())
    }

    /// Runs `f` with the buffer acquired as a writable tensor.
    fn with_tensor<R>(
        &mut self,
        rt: &dyn DeviceRuntime,
        f: impl FnOnce(&mut dyn Tensor) -> Res<R>,
    ) -> Res<R> {
        let options = AcquireOptions::default();
        match self {
            DevBuf::Sim(o) => {
                let mut t = acquire_with_runtime(&*o, &options, Some(rt)).map_err(ers)?;
                f(&mut t)
            }
            #[cfg(feature = "cuda")]
            DevBuf::Cuda(slice, _) => {
                let export = dlpack_mpi::dlpack::CudaExport::new_mut(slice);
                let mut t = acquire_with_runtime(&export, &options, Some(rt)).map_err(ers)?;
                f(&mut t)
            }
        }
    }

    fn read(&mut self) -> Res<Vec<f32>> {
        match self {
            DevBuf::Sim(o) => Ok(o.as_slice().to_vec()),
            #[cfg(feature = "cuda")]
            DevBuf::Cuda(slice, stream) => {
                stream.clone_dtoh(slice).map_err(|e| format!("CUDA: {e}"))
            }
        }
    }

    fn write(&mut self, data: &[f32]) -> Res<()> {
        match self {
            DevBuf::Sim(o) => {
                o.as_mut_slice().copy_from_slice(data);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            DevBuf::Cuda(slice, stream) => stream
                .memcpy_htod(data, slice)
                .map_err(|e| format!("CUDA: {e}")),
        }
    }
}

/// A page-locked host buffer of the runtime, freed on drop.
struct Pinned<'r> {
    rt: &'r dyn DeviceRuntime,
    ptr: NonNull<u8>,
    bytes: usize,
}

impl<'r> Pinned<'r> {
    fn new(rt: &'r dyn DeviceRuntime, bytes: usize) -> Res<Self> {
        let ptr = rt.alloc_pinned(bytes).map_err(ers)?;
        Ok(Pinned { rt, ptr, bytes })
    }
}

impl Drop for Pinned<'_> {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: `ptr` and `bytes` come from one `alloc_pinned` of this runtime, freed once.
        unsafe { self.rt.free_pinned(self.ptr, self.bytes) };
    }
}

/// `iters` device → pinned → device copies of `bytes` at `dev_ptr` (on `gpu`'s device);
/// seconds per copy pair. With `check`, the pinned buffer must then hold `expect`'s bytes.
#[allow(unsafe_code)]
fn copy_pairs(
    gpu: &Gpu,
    dev_ptr: *mut c_void,
    pinned: &Pinned<'_>,
    bytes: usize,
    iters: u64,
    check: Option<&[f32]>,
) -> Res<f64> {
    if bytes > pinned.bytes {
        return Err("pinned buffer too small".into());
    }
    let (rt, dev) = (gpu.runtime, gpu.device());
    let t0 = mpi::time();
    for _ in 0..iters {
        // SAFETY: `dev_ptr..+bytes` is the device buffer of the tensor the caller holds
        // (acquired, so no one else writes it meanwhile); the pinned buffer holds at least
        // `bytes` bytes and is only used here.
        unsafe {
            rt.copy_to_host(dev, pinned.ptr.as_ptr(), dev_ptr, bytes)
                .map_err(ers)?;
            rt.copy_to_device(dev, dev_ptr, pinned.ptr.as_ptr(), bytes)
                .map_err(ers)?;
        }
    }
    let secs = (mpi::time() - t0) / iters as f64;
    if let Some(expect) = check {
        // SAFETY: `bytes` initialized bytes of the pinned buffer, just written by the copy.
        let got = unsafe { std::slice::from_raw_parts(pinned.ptr.as_ptr(), bytes) };
        let want: Vec<u8> = expect.iter().flat_map(|x| x.to_ne_bytes()).collect();
        if got != &want[..bytes] {
            let i = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
            return Err(format!(
                "copy: byte {i} differs after device → host → device"
            ));
        }
    }
    Ok(secs)
}

fn first_bad(expect: impl Iterator<Item = f32>, got: &[f32]) -> Option<String> {
    expect
        .zip(got)
        .position(|(e, g)| e != *g)
        .map(|i| format!("index {i}: got {}", got[i]))
}

/// What every GPU measurement needs: the world, the runtime, the two `DeviceComm`s (direct
/// only when MPI is CUDA-aware on every rank), rounds and `--iters`.
struct Ctx<'a> {
    world: &'a SimpleCommunicator,
    gpu: Gpu,
    staged: DeviceComm<'a, SimpleCommunicator>,
    direct: Option<DeviceComm<'a, SimpleCommunicator>>,
    rounds: u32,
    iters: u64,
}

/// How a path sends: through the runtime or host MPI (`None`), or a `DeviceComm`.
type Route<'c, 'a> = Option<&'c DeviceComm<'a, SimpleCommunicator>>;

impl<'a> Ctx<'a> {
    /// The route of `path`; `None` when the path does not run (direct without a CUDA-aware
    /// MPI).
    fn route(&self, path: GpuPath) -> Option<Route<'_, 'a>> {
        match path {
            GpuPath::Staged => Some(Some(&self.staged)),
            GpuPath::Direct => self.direct.as_ref().map(Some),
            _ => Some(None),
        }
    }
}

/// The buffers of a ping-pong: this rank's values, its device buffer, a host buffer of the
/// same size, and the pinned buffer of the copy path.
struct PingBuffers<'r> {
    mine: Vec<f32>,
    dev: DevBuf,
    host: Vec<f32>,
    pinned: Pinned<'r>,
}

/// Ping-pong, before timing: one message 0 → 1 through `path` (rank 1's buffer first reset;
/// the copy path copies rank 0's and rank 1's own buffers), then what rank 1 got wrong.
fn pingpong_check(
    cx: &Ctx<'_>,
    path: GpuPath,
    route: Route<'_, '_>,
    b: &mut PingBuffers<'_>,
) -> Res<Option<String>> {
    let (w, rt) = (cx.world, cx.gpu.runtime);
    let (rank, n, bytes) = (w.rank(), b.mine.len(), b.mine.len() * 4);
    if rank == 1 {
        b.host.fill(-1.0);
        b.dev.write(&b.host)?;
    } else if rank == 0 {
        b.host.copy_from_slice(&b.mine);
        b.dev.write(&b.mine)?;
    }
    w.barrier();
    let peer = w.process_at_rank(1 - rank.min(1));
    match (path, route) {
        (GpuPath::Copy, _) if rank < 2 => {
            let (pinned, host) = (&b.pinned, &b.host);
            b.dev.with_tensor(rt, |t| {
                copy_pairs(&cx.gpu, t.first_element_ptr(), pinned, bytes, 1, Some(host))
            })?;
        }
        (GpuPath::Host, _) if rank == 0 => peer.send(&b.host[..]),
        (GpuPath::Host, _) if rank == 1 => {
            peer.receive_into(&mut b.host[..]);
        }
        (_, Some(dc)) if rank == 0 => b
            .dev
            .with_tensor(rt, |t| dc.send_tensor(&*t, 1, 7).map_err(ers))?,
        (_, Some(dc)) if rank == 1 => b
            .dev
            .with_tensor(rt, |t| dc.recv_tensor(t, 0, 7).map(drop).map_err(ers))?,
        _ => {}
    }
    if rank != 1 || path == GpuPath::Copy {
        return Ok(None);
    }
    let got = if path == GpuPath::Host {
        b.host.clone()
    } else {
        b.dev.read()?
    };
    Ok(first_bad((0..n).map(|k| value(0, k)), &got)
        .map(|why| format!("{}: rank 1: {why}", path.name())))
}

/// Ping-pong, one timed round of `iters` round trips through `path` on rank 0 or 1:
/// seconds per message (half a round trip; per copy pair for the copy path).
fn pingpong_round(
    cx: &Ctx<'_>,
    path: GpuPath,
    route: Route<'_, '_>,
    b: &mut PingBuffers<'_>,
    iters: u64,
) -> Res<f64> {
    let (w, rt) = (cx.world, cx.gpu.runtime);
    let (rank, bytes) = (w.rank(), b.mine.len() * 4);
    let other = 1 - rank.min(1);
    let peer = w.process_at_rank(other);
    let pinned = &b.pinned;
    let t0 = mpi::time();
    match (path, route) {
        (GpuPath::Copy, _) => {
            return b.dev.with_tensor(rt, |t| {
                copy_pairs(&cx.gpu, t.first_element_ptr(), pinned, bytes, iters, None)
            })
        }
        (GpuPath::Host, _) => {
            let host = &mut b.host;
            round_trips(rank, iters, |leg| {
                match leg {
                    Leg::Send => peer.send(&host[..]),
                    Leg::Recv => {
                        peer.receive_into(&mut host[..]);
                    }
                }
                Ok::<(), String>(())
            })?;
        }
        (_, Some(dc)) => b.dev.with_tensor(rt, |t| {
            round_trips(rank, iters, |leg| match leg {
                Leg::Send => dc.send_tensor(&*t, other, 8).map_err(ers),
                Leg::Recv => dc.recv_tensor(t, other, 8).map(drop).map_err(ers),
            })
        })?,
        _ => return Ok(f64::NAN),
    }
    Ok((mpi::time() - t0) / (2 * iters) as f64)
}

/// Ping-pong at `bytes` between ranks 0 and 1 (others wait at barriers).
fn pingpong(cx: &Ctx<'_>, bytes: usize) -> Res<GpuRow> {
    let w = cx.world;
    let rank = w.rank();
    let iters = iters_for(cx.iters, bytes);
    let mine: Vec<f32> = (0..bytes / 4).map(|k| value(rank, k)).collect();
    let mut b = PingBuffers {
        dev: DevBuf::new(&cx.gpu, &mine)?,
        host: mine.clone(),
        pinned: Pinned::new(cx.gpu.runtime, bytes)?,
        mine,
    };
    let mut secs = [f64::NAN; 4];
    let mut bad: Option<String> = None;
    for path in GPU_PATHS {
        let Some(route) = cx.route(path) else {
            continue;
        };
        if let Some(why) = pingpong_check(cx, path, route, &mut b)? {
            bad.get_or_insert(why);
        }
        let mut samples = Samples::default();
        for _ in 0..cx.rounds {
            w.barrier();
            if rank < 2 {
                samples
                    .0
                    .push(pingpong_round(cx, path, route, &mut b, iters)?);
            }
        }
        secs[path as usize] = samples.median();
    }
    // Rank 0 reports: its times, and rank 1's verdict.
    Ok(GpuRow {
        bytes,
        secs,
        verified: agree_verdict(w, bad),
    })
}

/// The buffers of an all-reduce: this rank's values, the expected sums, the device send and
/// receive buffers, their host twins, the receive buffer's reset value, and the pinned
/// buffer of the copy path.
struct ReduceBuffers<'r> {
    mine: Vec<f32>,
    expect: Vec<f32>,
    send: DevBuf,
    recv: DevBuf,
    hsend: Vec<f32>,
    hrecv: Vec<f32>,
    fill: Vec<f32>,
    pinned: Pinned<'r>,
}

/// `times` all-reduce calls through `path` (for the copy path: the staging of one call, the
/// send tensor's copy out and the result's in); seconds per call on this rank.
fn allreduce_once(
    cx: &Ctx<'_>,
    path: GpuPath,
    route: Route<'_, '_>,
    b: &mut ReduceBuffers<'_>,
    times: u64,
) -> Res<f64> {
    let (w, rt) = (cx.world, cx.gpu.runtime);
    let bytes = b.mine.len() * 4;
    let t0 = mpi::time();
    match (path, route) {
        (GpuPath::Host, _) => {
            for _ in 0..times {
                w.all_reduce_into(&b.hsend[..], &mut b.hrecv[..], SystemOperation::sum());
            }
        }
        (GpuPath::Copy, _) => {
            let pinned = &b.pinned;
            return b.send.with_tensor(rt, |t| {
                copy_pairs(&cx.gpu, t.first_element_ptr(), pinned, bytes, times, None)
            });
        }
        (_, Some(dc)) => {
            let recv = &mut b.recv;
            b.send.with_tensor(rt, |s| {
                recv.with_tensor(rt, |d| {
                    for _ in 0..times {
                        dc.all_reduce_tensor(&*s, d, ReduceOp::Sum).map_err(ers)?;
                    }
                    Ok(())
                })
            })?
        }
        _ => {}
    }
    Ok((mpi::time() - t0) / times as f64)
}

/// All-reduce, before timing: one call through `path` (receive buffers first reset), then
/// what this rank got wrong (the copy path: whether the bytes survived the round trip).
fn allreduce_check(
    cx: &Ctx<'_>,
    path: GpuPath,
    route: Route<'_, '_>,
    b: &mut ReduceBuffers<'_>,
) -> Res<Option<String>> {
    let (w, rt, rank) = (cx.world, cx.gpu.runtime, cx.world.rank());
    b.recv.write(&b.fill)?;
    b.hrecv.copy_from_slice(&b.fill);
    w.barrier();
    allreduce_once(cx, path, route, b, 1)?;
    let got = match path {
        GpuPath::Host => b.hrecv.clone(),
        GpuPath::Copy => b.expect.clone(),
        _ => b.recv.read()?,
    };
    let mut bad = first_bad(b.expect.iter().copied(), &got)
        .map(|why| format!("{}: rank {rank}: {why}", path.name()));
    if path == GpuPath::Copy {
        let (pinned, mine, bytes) = (&b.pinned, &b.mine, b.mine.len() * 4);
        if let Err(why) = b.send.with_tensor(rt, |t| {
            copy_pairs(&cx.gpu, t.first_element_ptr(), pinned, bytes, 1, Some(mine))
        }) {
            bad.get_or_insert(format!("rank {rank}: {why}"));
        }
    }
    Ok(bad)
}

/// All-reduce (sum) at `bytes` on every rank.
fn allreduce(cx: &Ctx<'_>, bytes: usize) -> Res<GpuRow> {
    let w = cx.world;
    let (rank, size, n) = (w.rank(), w.size(), bytes / 4);
    let iters = iters_for(cx.iters, bytes);
    let mine: Vec<f32> = (0..n).map(|k| value(rank, k)).collect();
    let fill = vec![-1.0f32; n];
    let mut b = ReduceBuffers {
        expect: (0..n)
            .map(|k| (0..size).map(|r| value(r, k)).sum())
            .collect(),
        send: DevBuf::new(&cx.gpu, &mine)?,
        recv: DevBuf::new(&cx.gpu, &fill)?,
        hsend: mine.clone(),
        hrecv: fill.clone(),
        pinned: Pinned::new(cx.gpu.runtime, bytes)?,
        mine,
        fill,
    };
    let mut secs = [f64::NAN; 4];
    let mut bad: Option<String> = None;
    for path in GPU_PATHS {
        let Some(route) = cx.route(path) else {
            continue;
        };
        if let Some(why) = allreduce_check(cx, path, route, &mut b)? {
            bad.get_or_insert(why);
        }
        let mut samples = Samples::default();
        for _ in 0..cx.rounds {
            w.barrier();
            let mine_t = allreduce_once(cx, path, route, &mut b, iters)?;
            let mut slowest = 0.0f64;
            w.all_reduce_into(&mine_t, &mut slowest, SystemOperation::max());
            samples.0.push(slowest);
        }
        secs[path as usize] = samples.median();
    }
    Ok(GpuRow {
        bytes,
        secs,
        verified: agree_verdict(w, bad),
    })
}

/// Every rank's verification problem (the lowest rank's message) on every rank.
fn agree_verdict(w: &SimpleCommunicator, bad: Option<String>) -> Result<(), String> {
    crate::launch::agreed(w, bad.map_or(Ok(()), Err))
}

/// Refuses what the GPU bench does not do, in one line.
pub fn refuse(args: &BenchArgs) -> Option<String> {
    if !matches!(args.op, Op::Latency | Op::Allreduce | Op::All) {
        return Some(format!(
            "--device cuda benchmarks ping-pong (--op latency) and allreduce, not --op {}",
            args.op.name()
        ));
    }
    if args.layout != BenchLayout::Contiguous {
        return Some("--device cuda benchmarks contiguous tensors only (no --layout step)".into());
    }
    if args.csv.is_some() || args.plot.is_some() || args.json.is_some() || args.check {
        return Some(
            "--csv, --plot, --json and --check are not available with --device cuda yet".into(),
        );
    }
    None
}

/// Runs one GPU operation (`ping-pong` or `allreduce`) over `sizes`, printing on rank 0;
/// returns whether every delivered value was right. A failure to measure aborts the job.
fn run_op(cx: &Ctx<'_>, op: &str, sizes: &[usize]) -> bool {
    let (world, root) = (cx.world, cx.world.rank() == 0);
    if root {
        print_gpu_header(op, cx.rounds);
    }
    let mut ok = true;
    let mut at_target = None;
    for &bytes in sizes {
        let row = if op == "ping-pong" {
            pingpong(cx, bytes)
        } else {
            allreduce(cx, bytes)
        };
        let row = match row {
            Ok(r) => r,
            Err(why) => {
                eprintln!("dlpack-mpi bench: rank {}: {why}", world.rank());
                world.abort(1)
            }
        };
        ok &= row.verified.is_ok();
        if bytes == GPU_TARGET_BYTES {
            at_target = Some(row.staged_per_copy());
        }
        if root {
            print_gpu_row(&row);
        }
    }
    if root {
        print_gpu_target(op, at_target);
    }
    ok
}

/// Runs the GPU bench (options already checked, the runtime agreed by all ranks).
pub fn run(world: &SimpleCommunicator, args: &BenchArgs, gpu: Gpu) -> ExitCode {
    let root = world.rank() == 0;
    let direct = crate::launch::agreed(
        world,
        DeviceComm::new(world, Some(gpu.runtime), Transport::Direct).map_err(ers),
    );
    let staged = match DeviceComm::new(world, Some(gpu.runtime), Transport::Staged) {
        Ok(dc) => dc,
        Err(err) => {
            eprintln!("dlpack-mpi bench: rank {}: {err}", world.rank());
            world.abort(2)
        }
    };
    let sizes = args.sizes_or(sizes(
        MIN_SIZE,
        args.max_size.map_or(DEFAULT_MAX, |m| m as usize),
    ));
    if root {
        let library = library_line();
        let why = direct.as_ref().err().map(String::as_str);
        print_gpu_intro(world.size(), &library, &gpu, args, why.map_or(Ok(()), Err));
    }
    let cx = Ctx {
        world,
        gpu,
        staged,
        direct: direct.ok(),
        rounds: args.rounds,
        iters: args.iters,
    };
    let ops: &[&str] = match args.op {
        Op::Latency => &["ping-pong"],
        Op::Allreduce => &["allreduce"],
        _ if world.size() < 2 => {
            if root {
                println!("ping-pong: skipped (needs 2 ranks)\n");
            }
            &["allreduce"]
        }
        _ => &["ping-pong", "allreduce"],
    };
    let mut ok = true;
    for op in ops {
        ok &= run_op(&cx, op, &sizes);
    }
    if root {
        print_gpu_values(ok);
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
