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

use std::ffi::c_void;
use std::process::ExitCode;
use std::ptr::NonNull;

use dlpack_mpi::device::{device_type, Device};
use dlpack_mpi::dlpack::{acquire_with_runtime, AcquireOptions, Owned, Tensor};
use dlpack_mpi::dtype::ReduceOp;
use dlpack_mpi::transport::{DeviceComm, DeviceRuntime, Transport};
use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use crate::bench::{BenchArgs, Op};
use crate::Gpu;

type Res<T> = Result<T, String>;

/// The ratio target (staged bandwidth / pinned-copy bandwidth) at `TARGET_BYTES`.
const TARGET_RATIO: f64 = 0.80;
const TARGET_BYTES: usize = 64 << 20;
/// Default size range of the GPU bench.
const MIN_SIZE: usize = 4 << 10;
const DEFAULT_MAX: usize = 256 << 20;

fn ers(err: dlpack_mpi::Error) -> String {
    err.to_string()
}

/// The device all buffers are on.
const CUDA0: Device = Device::new(device_type::CUDA, 0);

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
            return Ok(DevBuf::Sim(Owned::new(data.to_vec()).labelled(CUDA0)));
        }
        #[cfg(feature = "cuda")]
        {
            let stream = cudarc::driver::CudaContext::new(0)
                .map_err(|e| format!("CUDA: {e}"))?
                .default_stream();
            let slice = stream.clone_htod(data).map_err(|e| format!("CUDA: {e}"))?;
            Ok(DevBuf::Cuda(slice, stream))
        }
        #[cfg(not(feature = "cuda"))]
        Err(crate::no_runtime_reason())
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
                let export = dlpack_mpi::cuda::CudaExport::new_mut(slice);
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

/// `iters` device → pinned → device copies of `bytes` at `dev_ptr`; seconds per copy pair.
/// With `check`, the pinned buffer must then hold `expect`'s bytes.
#[allow(unsafe_code)]
fn copy_pairs(
    rt: &dyn DeviceRuntime,
    dev_ptr: *mut c_void,
    pinned: &Pinned<'_>,
    bytes: usize,
    iters: u64,
    check: Option<&[f32]>,
) -> Res<f64> {
    if bytes > pinned.bytes {
        return Err("pinned buffer too small".into());
    }
    let t0 = mpi::time();
    for _ in 0..iters {
        // SAFETY: `dev_ptr..+bytes` is the device buffer of the tensor the caller holds
        // (acquired, so no one else writes it meanwhile); the pinned buffer holds at least
        // `bytes` bytes and is only used here.
        unsafe {
            rt.copy_to_host(CUDA0, pinned.ptr.as_ptr(), dev_ptr, bytes)
                .map_err(ers)?;
            rt.copy_to_device(CUDA0, dev_ptr, pinned.ptr.as_ptr(), bytes)
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GpuPath {
    Host,
    Copy,
    Staged,
    Direct,
}

const GPU_PATHS: [GpuPath; 4] = [
    GpuPath::Host,
    GpuPath::Copy,
    GpuPath::Staged,
    GpuPath::Direct,
];

impl GpuPath {
    fn name(self) -> &'static str {
        match self {
            GpuPath::Host => "host",
            GpuPath::Copy => "copy",
            GpuPath::Staged => "staged",
            GpuPath::Direct => "direct",
        }
    }
}

fn value(r: i32, k: usize) -> f32 {
    ((k % 4096) + 4096 * r as usize) as f32
}

fn first_bad(expect: impl Iterator<Item = f32>, got: &[f32]) -> Option<String> {
    expect
        .zip(got)
        .position(|(e, g)| e != *g)
        .map(|i| format!("index {i}: got {}", got[i]))
}

/// One size of one operation: seconds per message/call for every path (NaN: not run), and
/// whether every delivered value was right.
struct GpuRow {
    bytes: usize,
    secs: [f64; 4],
    verified: Result<(), String>,
}

struct Ctx<'a> {
    world: &'a SimpleCommunicator,
    gpu: Gpu,
    staged: DeviceComm<'a, SimpleCommunicator>,
    direct: Option<DeviceComm<'a, SimpleCommunicator>>,
    rounds: u32,
    iters: u64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Ping-pong at `bytes` between ranks 0 and 1 (others wait at barriers).
fn pingpong(cx: &Ctx<'_>, bytes: usize) -> Res<GpuRow> {
    let w = cx.world;
    let (rank, n) = (w.rank(), bytes / 4);
    let iters = crate::bench::iters_for(cx.iters, bytes);
    let rt = cx.gpu.runtime;
    let mine: Vec<f32> = (0..n).map(|k| value(rank, k)).collect();
    let mut dev = DevBuf::new(&cx.gpu, &mine)?;
    let mut host = mine.clone();
    let pinned = Pinned::new(rt, bytes)?;
    let mut secs = [f64::NAN; 4];
    let mut bad: Option<String> = None;
    let active = rank < 2;
    let other = 1 - rank.min(1);
    for path in GPU_PATHS {
        let comm = match path {
            GpuPath::Staged => Some(&cx.staged),
            GpuPath::Direct => match &cx.direct {
                Some(d) => Some(d),
                None => continue,
            },
            _ => None,
        };
        // One checked message 0 → 1 (rank 1's buffer first reset).
        if rank == 1 {
            host.fill(-1.0);
            dev.write(&host)?;
        } else if rank == 0 {
            host.copy_from_slice(&mine);
            dev.write(&mine)?;
        }
        w.barrier();
        let peer = w.process_at_rank(other);
        match (path, comm) {
            (GpuPath::Copy, _) if active => {
                dev.with_tensor(rt, |t| {
                    copy_pairs(rt, t.first_element_ptr(), &pinned, bytes, 1, Some(&host))
                })?;
            }
            (GpuPath::Host, _) if rank == 0 => peer.send(&host[..]),
            (GpuPath::Host, _) if rank == 1 => {
                peer.receive_into(&mut host[..]);
            }
            (_, Some(dc)) if rank == 0 => {
                dev.with_tensor(rt, |t| dc.send_tensor(&*t, 1, 7).map_err(ers))?
            }
            (_, Some(dc)) if rank == 1 => {
                dev.with_tensor(rt, |t| dc.recv_tensor(t, 0, 7).map(drop).map_err(ers))?
            }
            _ => {}
        }
        if rank == 1 && path != GpuPath::Copy {
            let got = if path == GpuPath::Host {
                host.clone()
            } else {
                dev.read()?
            };
            if let Some(why) = first_bad((0..n).map(|k| value(0, k)), &got) {
                bad.get_or_insert(format!("{}: rank 1: {why}", path.name()));
            }
        }
        // Timed rounds.
        let mut samples = Vec::new();
        for _ in 0..cx.rounds {
            w.barrier();
            if !active {
                continue;
            }
            let t = match (path, comm) {
                (GpuPath::Copy, _) => dev.with_tensor(rt, |t| {
                    copy_pairs(rt, t.first_element_ptr(), &pinned, bytes, iters, None)
                })?,
                (GpuPath::Host, _) => {
                    let t0 = mpi::time();
                    for _ in 0..iters {
                        if rank == 0 {
                            peer.send(&host[..]);
                            peer.receive_into(&mut host[..]);
                        } else {
                            peer.receive_into(&mut host[..]);
                            peer.send(&host[..]);
                        }
                    }
                    (mpi::time() - t0) / (2 * iters) as f64
                }
                (_, Some(dc)) => dev.with_tensor(rt, |t| {
                    let t0 = mpi::time();
                    for _ in 0..iters {
                        if rank == 0 {
                            dc.send_tensor(&*t, other, 8).map_err(ers)?;
                            dc.recv_tensor(t, other, 8).map_err(ers)?;
                        } else {
                            dc.recv_tensor(t, other, 8).map_err(ers)?;
                            dc.send_tensor(&*t, other, 8).map_err(ers)?;
                        }
                    }
                    Ok((mpi::time() - t0) / (2 * iters) as f64)
                })?,
                _ => f64::NAN,
            };
            samples.push(t);
        }
        secs[path as usize] = median(samples);
    }
    // Rank 0 reports: its times, and rank 1's verdict.
    let verified = agree_verdict(w, bad);
    Ok(GpuRow {
        bytes,
        secs,
        verified,
    })
}

/// All-reduce (sum) at `bytes` on every rank.
fn allreduce(cx: &Ctx<'_>, bytes: usize) -> Res<GpuRow> {
    let w = cx.world;
    let (rank, size, n) = (w.rank(), w.size(), bytes / 4);
    let iters = crate::bench::iters_for(cx.iters, bytes);
    let rt = cx.gpu.runtime;
    let mine: Vec<f32> = (0..n).map(|k| value(rank, k)).collect();
    let expect: Vec<f32> = (0..n)
        .map(|k| (0..size).map(|r| value(r, k)).sum())
        .collect();
    let mut send = DevBuf::new(&cx.gpu, &mine)?;
    let fill = vec![-1.0f32; n];
    let mut recv = DevBuf::new(&cx.gpu, &fill)?;
    let (hsend, mut hrecv) = (mine.clone(), fill.clone());
    let pinned = Pinned::new(rt, bytes)?;
    let mut secs = [f64::NAN; 4];
    let mut bad: Option<String> = None;
    for path in GPU_PATHS {
        let comm = match path {
            GpuPath::Staged => Some(&cx.staged),
            GpuPath::Direct => match &cx.direct {
                Some(d) => Some(d),
                None => continue,
            },
            _ => None,
        };
        recv.write(&fill)?;
        hrecv.copy_from_slice(&fill);
        w.barrier();
        let once =
            |send: &mut DevBuf, recv: &mut DevBuf, hrecv: &mut [f32], times: u64| -> Res<f64> {
                let t0 = mpi::time();
                match (path, comm) {
                    (GpuPath::Host, _) => {
                        for _ in 0..times {
                            w.all_reduce_into(&hsend[..], hrecv, SystemOperation::sum());
                        }
                    }
                    (GpuPath::Copy, _) => {
                        // The staging of one call: the send tensor's copy out, the result's in.
                        return send.with_tensor(rt, |t| {
                            copy_pairs(rt, t.first_element_ptr(), &pinned, bytes, times, None)
                        });
                    }
                    (_, Some(dc)) => send.with_tensor(rt, |s| {
                        recv.with_tensor(rt, |d| {
                            for _ in 0..times {
                                dc.all_reduce_tensor(&*s, d, ReduceOp::Sum).map_err(ers)?;
                            }
                            Ok(())
                        })
                    })?,
                    _ => {}
                }
                Ok((mpi::time() - t0) / times as f64)
            };
        once(&mut send, &mut recv, &mut hrecv, 1)?;
        let got = match path {
            GpuPath::Host => hrecv.clone(),
            GpuPath::Copy => expect.clone(),
            _ => recv.read()?,
        };
        if let Some(why) = first_bad(expect.iter().copied(), &got) {
            bad.get_or_insert(format!("{}: rank {rank}: {why}", path.name()));
        }
        if path == GpuPath::Copy {
            send.with_tensor(rt, |t| {
                copy_pairs(rt, t.first_element_ptr(), &pinned, bytes, 1, Some(&mine))
            })
            .map_err(|why| {
                bad.get_or_insert(format!("rank {rank}: {why}"));
            })
            .ok();
        }
        let mut samples = Vec::new();
        for _ in 0..cx.rounds {
            w.barrier();
            let mine_t = once(&mut send, &mut recv, &mut hrecv, iters)?;
            let mut slowest = 0.0f64;
            w.all_reduce_into(&mine_t, &mut slowest, SystemOperation::max());
            samples.push(slowest);
        }
        secs[path as usize] = median(samples);
    }
    let verified = agree_verdict(w, bad);
    Ok(GpuRow {
        bytes,
        secs,
        verified,
    })
}

/// Every rank's verification problem (the lowest rank's message) on every rank.
fn agree_verdict(w: &SimpleCommunicator, bad: Option<String>) -> Result<(), String> {
    crate::agreed(w, bad.map_or(Ok(()), Err))
}

fn gbs(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

fn print_header(op: &str, cx: &Ctx<'_>) {
    println!(
        "{op}: µs per {} (median of {} round(s)); GB/s = 10^9 bytes/s (sizes: K = 2^10, \
         M = 2^20 bytes); staged/copy = staged bandwidth / pinned-copy bandwidth",
        if op == "ping-pong" {
            "message"
        } else {
            "call, slowest rank"
        },
        cx.rounds
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

fn print_row(r: &GpuRow) {
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
        crate::bench::fmt_size(r.bytes),
        us(GpuPath::Host),
        us(GpuPath::Copy),
        us(GpuPath::Staged),
        us(GpuPath::Direct),
        gbs(r.bytes, copy),
        gbs(r.bytes, staged),
        copy / staged,
        match &r.verified {
            Ok(()) => "yes".to_string(),
            Err(why) => format!("NO: {why}"),
        }
    );
}

/// Refuses what the GPU bench does not do, in one line.
pub fn refuse(args: &BenchArgs) -> Option<String> {
    if !matches!(args.op, Op::Latency | Op::Allreduce | Op::All) {
        return Some(format!(
            "--device cuda benchmarks ping-pong (--op latency) and allreduce, not --op {}",
            args.op.name()
        ));
    }
    if args.layout != crate::bench::BenchLayout::Contiguous {
        return Some("--device cuda benchmarks contiguous tensors only (no --layout step)".into());
    }
    if args.csv.is_some() || args.plot.is_some() {
        return Some("--csv and --plot are not available with --device cuda yet".into());
    }
    None
}

/// Runs the GPU bench (options already checked, the runtime agreed by all ranks).
pub fn run(world: &SimpleCommunicator, args: &BenchArgs, gpu: Gpu) -> ExitCode {
    let root = world.rank() == 0;
    let direct = crate::agreed(
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
    let sizes: Vec<usize> = match &args.sizes {
        Some(s) => s.0.iter().map(|&b| b as usize).collect(),
        None => crate::bench::sizes(MIN_SIZE, args.max_size.map_or(DEFAULT_MAX, |m| m as usize)),
    };
    if root {
        println!(
            "dlpack-mpi {} bench --device cuda: ranks: {}; {}; GPU runtime: {}{}; f32; iters {} \
             (up to {}), rounds {}",
            env!("CARGO_PKG_VERSION"),
            world.size(),
            crate::bench::library_line().split(',').next().unwrap_or(""),
            gpu.runtime.describe(),
            if gpu.simulated {
                " [--simulate-device]"
            } else {
                ""
            },
            args.iters,
            crate::bench::fmt_size(crate::bench::SCALE_REF),
            args.rounds,
        );
        if gpu.simulated {
            println!(
                "simulated device: \"device\" memory is host memory and copies are memcpy; \
                 these figures test the code path and say nothing about GPU speed"
            );
        }
        println!(
            "paths: host = rsmpi on host Vec<f32>; copy = device → pinned host → device copy of \
             the same bytes (runtime copy_to_host + copy_to_device, no MPI); staged = DeviceComm \
             through pinned buffers; direct = DeviceComm with device pointers ({})\n",
            match &direct {
                Ok(_) => "available".to_string(),
                Err(why) => format!("not run: {why}"),
            }
        );
    }
    let cx = Ctx {
        world,
        gpu,
        staged,
        direct: direct.ok(),
        rounds: args.rounds,
        iters: args.iters,
    };
    let ops: Vec<&str> = match args.op {
        Op::Latency => vec!["ping-pong"],
        Op::Allreduce => vec!["allreduce"],
        _ if world.size() < 2 => {
            if root {
                println!("ping-pong: skipped (needs 2 ranks)\n");
            }
            vec!["allreduce"]
        }
        _ => vec!["ping-pong", "allreduce"],
    };
    let mut ok = true;
    for op in ops {
        if root {
            print_header(op, &cx);
        }
        let mut at_target = None;
        for &bytes in &sizes {
            let row = if op == "ping-pong" {
                pingpong(&cx, bytes)
            } else {
                allreduce(&cx, bytes)
            };
            let row = match row {
                Ok(r) => r,
                Err(why) => {
                    eprintln!("dlpack-mpi bench: rank {}: {why}", world.rank());
                    world.abort(1)
                }
            };
            ok &= row.verified.is_ok();
            if bytes == TARGET_BYTES {
                at_target =
                    Some(row.secs[GpuPath::Copy as usize] / row.secs[GpuPath::Staged as usize]);
            }
            if root {
                print_row(&row);
            }
        }
        if root {
            match at_target {
                Some(r) => println!(
                    "{op} staged/copy at 64 MiB: {r:.2} (target ≥ {TARGET_RATIO:.2} on a real \
                     GPU): {}\n",
                    if r >= TARGET_RATIO { "met" } else { "NOT met" }
                ),
                None => println!(
                    "{op} staged/copy at 64 MiB: not measured (64 MiB is not among the sizes)\n"
                ),
            }
        }
    }
    if root {
        println!(
            "values: {}",
            if ok {
                "every delivered element checked: passed"
            } else {
                "WRONG VALUES delivered (lines marked NO)"
            }
        );
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
