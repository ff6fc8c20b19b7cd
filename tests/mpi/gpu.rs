//! GPU cases against the real CUDA driver (feature `cuda`): C61 with a real asynchronous
//! kernel, C64 staged (and direct when MPI is CUDA-aware), C65, a pipelined 64 MiB send,
//! strided device tensors packed by `cuMemcpy2DAsync` (step 2, transposed, Fortran order, a
//! 3-D permutation; issue 13, item 4), C51 through the cudarc exporter, and a host pointer
//! labelled CUDA (DeviceMismatch).
//! scripts/gpu-check.sh runs it at 2 ranks on a GPU machine.
//!
//! **Skipping.** The ranks agree before any case whether every one of them has a CUDA
//! driver and can use its device; when one cannot, every rank that cannot prints its own
//! reason (`GPU cases: rank N: cannot run: …`) and all skip together. A skip exits 0, or 3
//! when `DLPACK_MPI_REQUIRE_GPU=1` (gpu-check.sh sets it: on a GPU machine a skip is a
//! failure).
//!
//! **No rank is left waiting.** Within a case the ranks agree (an all-reduce, [`agreed`])
//! after every fallible step, so a step that fails on one rank ends the case on every rank
//! before the next transfer. A failure inside a transfer cannot be announced that way (the
//! peer is already waiting in MPI): a watchdog thread aborts the job when a case runs longer
//! than `DLPACK_MPI_CASE_TIMEOUT_S` seconds (default 60; the cases take seconds).
//!
//! C62 needs two GPUs and C63 managed memory through the exporter; both are covered on the
//! simulated device (tests/mpi/device_cases.rs) and skipped here.

use dlpack_mpi::comm::TensorComm;
use std::ffi::c_void;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::harness;
use cudarc::driver::{result, sys, CudaContext, CudaStream};
use dlpack_mpi::device::{device_type, Device};
use dlpack_mpi::dlpack::{acquire, AcquireOptions, CudaExport, Owned, StreamPolicy};
use dlpack_mpi::dtype::ReduceOp;
use dlpack_mpi::runtime::cuda::CudaRuntime;
use dlpack_mpi::runtime::DeviceRuntime;
use dlpack_mpi::settings::DEVICE_ENV;
use dlpack_mpi::transport::{
    select_device_at, DeviceComm, DeviceSelection, NodeLocal, Route, Transport,
};
use dlpack_mpi::Error;
use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

type Outcome = Result<(), String>;

/// `result` where every rank of `w` succeeded; else `Err` on every rank: the rank's own
/// message where it failed, "rank N failed at this step" where it did not. Collective: every
/// rank calls it at the same points of a case, so all leave a failed case together.
fn agreed<T>(w: &SimpleCommunicator, result: Result<T, String>) -> Result<T, String> {
    let mine = if result.is_err() { w.rank() } else { w.size() };
    let mut first = 0;
    w.all_reduce_into(&mine, &mut first, SystemOperation::min());
    match result {
        Ok(_) if first < w.size() => Err(format!(
            "rank {first} failed at this step (its message is printed by that rank)"
        )),
        other => other,
    }
}

/// A fallible step of a case, agreed on by every rank ([`agreed`]): `?` on every rank when
/// it failed on any.
macro_rules! step {
    ($w:expr, $e:expr) => {
        agreed(
            $w,
            $e.map_err(|e| format!("{} failed: {e:?}", stringify!($e))),
        )?
    };
}

/// `Ok` when `cond`, else the message: for checks that are agreed on with [`agreed`].
fn check(cond: bool, message: impl FnOnce() -> String) -> Outcome {
    if cond {
        Ok(())
    } else {
        Err(message())
    }
}

/// Aborts the job when the armed stage outlives its limit: a peer that failed inside a
/// transfer leaves this rank waiting in MPI, where no agreement reaches it. Its thread ends
/// within 250 ms of the `Watchdog`'s drop.
struct Watchdog {
    stage: Arc<Mutex<(String, Instant)>>,
}

impl Watchdog {
    /// Starts the watch thread with the limit from `DLPACK_MPI_CASE_TIMEOUT_S` (default 60 s).
    fn start(rank: i32) -> Self {
        let limit_s: u64 = std::env::var("DLPACK_MPI_CASE_TIMEOUT_S")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&s| s > 0)
            .unwrap_or(60);
        let stage = Arc::new(Mutex::new(("start-up".to_string(), Instant::now())));
        let watched = Arc::clone(&stage);
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(250));
            // The suite has ended (its `Watchdog` dropped): the other suites of the binary
            // are not watched.
            if Arc::strong_count(&watched) == 1 {
                return;
            }
            let (name, since) = watched.lock().expect("watchdog lock").clone();
            if since.elapsed() > Duration::from_secs(limit_s) {
                let line = format!(
                    "rank {rank}: {name}: still running after {limit_s} s \
                     (DLPACK_MPI_CASE_TIMEOUT_S): a peer probably failed inside a transfer; \
                     aborting the job\n"
                );
                let _ = std::io::stderr().write_all(line.as_bytes());
                std::process::abort();
            }
        });
        Watchdog { stage }
    }

    /// Restarts the clock for the stage `name`.
    fn arm(&self, name: &str) {
        *self.stage.lock().expect("watchdog lock") = (name.to_string(), Instant::now());
    }
}

macro_rules! call {
    ($e:expr) => {
        $e.map_err(|e| format!("{} failed: {e:?}", stringify!($e)))?
    };
}

/// `out[i] = base + i` after spinning `spin` clock cycles per thread: an asynchronous
/// kernel still running when the tensor is exported.
const FILL_PTX: &str = r#"
.version 7.0
.target sm_52
.address_size 64
.visible .entry slow_fill(.param .u64 out, .param .f32 base, .param .u32 n, .param .u64 spin)
{
    .reg .pred %p<3>;
    .reg .b32 %r<6>;
    .reg .f32 %f<4>;
    .reg .b64 %rd<9>;
    ld.param.u64 %rd1, [out];
    ld.param.f32 %f1, [base];
    ld.param.u32 %r1, [n];
    ld.param.u64 %rd5, [spin];
    mov.u64 %rd6, %clock64;
SPIN:
    mov.u64 %rd7, %clock64;
    sub.s64 %rd8, %rd7, %rd6;
    setp.lt.u64 %p2, %rd8, %rd5;
    @%p2 bra SPIN;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    cvt.rn.f32.u32 %f2, %r5;
    add.f32 %f3, %f1, %f2;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r5, 4;
    add.s64 %rd4, %rd2, %rd3;
    st.global.f32 [%rd4], %f3;
DONE:
    ret;
}
"#;

struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    fill: sys::CUfunction,
}

impl Gpu {
    fn new(ordinal: usize) -> Result<Self, String> {
        let ctx = call!(CudaContext::new(ordinal));
        let stream = call!(ctx.new_stream());
        call!(ctx.bind_to_thread());
        let src = std::ffi::CString::new(FILL_PTX).map_err(|e| e.to_string())?;
        // SAFETY: a NUL-terminated PTX image; the module lives for the process.
        let module = call!(unsafe { result::module::load_data(src.as_ptr().cast()) });
        let name = c"slow_fill";
        // SAFETY: the module was just loaded and has this entry.
        let fill = call!(unsafe { result::module::get_function(module, name.into()) });
        Ok(Gpu { ctx, stream, fill })
    }

    /// Launches `slow_fill` on the producer's stream; returns at once.
    fn launch_fill(&self, ptr: sys::CUdeviceptr, base: f32, n: u32, spin: u64) -> Outcome {
        call!(self.ctx.bind_to_thread());
        let (mut p, mut b, mut len, mut s) = (ptr, base, n, spin);
        let mut params: [*mut c_void; 4] = [
            (&mut p as *mut u64).cast(),
            (&mut b as *mut f32).cast(),
            (&mut len as *mut u32).cast(),
            (&mut s as *mut u64).cast(),
        ];
        // SAFETY: the kernel's four parameters, by address; the output holds n floats.
        call!(unsafe {
            result::launch_kernel(
                self.fill,
                (n.div_ceil(256), 1, 1),
                (256, 1, 1),
                0,
                self.stream.cu_stream(),
                &mut params,
            )
        });
        Ok(())
    }
}

fn dc<'c>(
    w: &'c SimpleCommunicator,
    rt: &'c CudaRuntime,
    t: Transport,
) -> Result<DeviceComm<'c, SimpleCommunicator>, String> {
    Ok(call!(DeviceComm::new(w, Some(rt as &dyn DeviceRuntime), t)))
}

/// Every element of `host` is `rank_sum + size * i` (the all-reduced `slow_fill`).
fn expect_fill_sums(host: &[f32], rank_sum: f32, size: f32) -> Outcome {
    for (i, v) in host.iter().enumerate() {
        let want = rank_sum + size * i as f32;
        ensure!(
            *v == want,
            "element {i}: got {v}, the kernel's sum is {want}"
        );
    }
    Ok(())
}

fn c61_real_kernel(w: &SimpleCommunicator, gpu: &Gpu, rt: &CudaRuntime, t: Transport) -> Outcome {
    const N: usize = 100_000;
    let mut slice = step!(w, gpu.stream.alloc_zeros::<f32>(N));
    let mut out = step!(w, gpu.stream.alloc_zeros::<f32>(N));
    let ptr = {
        let (p, _rec) = cudarc::driver::DevicePtr::device_ptr(&slice, &gpu.stream);
        p
    };
    // ~50 ms of spinning at 2 GHz: the kernel is certainly running during the export.
    agreed(
        w,
        gpu.launch_fill(ptr, w.rank() as f32, N as u32, 100_000_000),
    )?;
    let comm = agreed(w, dc(w, rt, t))?;
    {
        let e = CudaExport::new(&slice);
        let s = step!(w, acquire(&e, &AcquireOptions::default()));
        let mut o = CudaExport::new_mut(&mut out);
        let mut r = step!(w, acquire(&o, &AcquireOptions::default()));
        step!(w, comm.all_reduce_tensor(&s, &mut r, ReduceOp::Sum));
        drop(r);
        let _ = &mut o;
    }
    let host = step!(w, gpu.stream.clone_dtoh(&out));
    let size = w.size() as f32;
    let rank_sum = (0..w.size()).map(|r| r as f32).sum::<f32>();
    agreed(w, expect_fill_sums(&host, rank_sum, size))?;
    // Control: the same with the consumer promising readiness (-1) while the kernel runs.
    step!(w, gpu.stream.memset_zeros(&mut slice));
    agreed(w, gpu.launch_fill(ptr, 1000.0, N as u32, 100_000_000))?;
    let unsync = AcquireOptions {
        stream: StreamPolicy::Unsynchronized,
        ..AcquireOptions::default()
    };
    let stale = {
        let e = CudaExport::new(&slice);
        let s = step!(w, acquire(&e, &unsync));
        let mut o = CudaExport::new_mut(&mut out);
        let mut r = step!(w, acquire(&o, &unsync));
        step!(w, comm.all_reduce_tensor(&s, &mut r, ReduceOp::Sum));
        drop(r);
        let _ = &mut o;
        let host = step!(w, gpu.stream.clone_dtoh(&out));
        host.iter().any(|v| *v < 1000.0 * size)
    };
    if w.rank() == 0 {
        println!(
            "  C61 control ({t:?}, Unsynchronized while the kernel runs): stale values seen: {}",
            if stale {
                "yes (synchronization is what makes the case pass)"
            } else {
                "no"
            }
        );
    }
    Ok(())
}

fn c64_ring_and_pipeline(
    w: &SimpleCommunicator,
    gpu: &Gpu,
    rt: &CudaRuntime,
    t: Transport,
) -> Outcome {
    let (rank, size) = (w.rank(), w.size());
    let comm = agreed(w, dc(w, rt, t))?;
    let next = (rank + 1) % size;
    let prev = (rank + size - 1) % size;
    let n = 1000;
    let src = step!(
        w,
        gpu.stream.clone_htod(
            &(0..n)
                .map(|i| (rank * 10_000 + i) as f32)
                .collect::<Vec<_>>()
        )
    );
    let mut dst = step!(w, gpu.stream.alloc_zeros::<f32>(n as usize));
    {
        let e = CudaExport::new(&src);
        let s = step!(w, acquire(&e, &AcquireOptions::default()));
        let mut o = CudaExport::new_mut(&mut dst);
        let mut r = step!(w, acquire(&o, &AcquireOptions::default()));
        step!(w, comm.sendrecv_tensor(&s, next, 1, &mut r, prev, 1));
        let route = comm.last_route();
        let want = if comm.is_direct() {
            Route::Direct
        } else {
            Route::Staged
        };
        agreed(w, check(route == Some(want), || format!("route {route:?}")))?;
        drop(r);
        let _ = &mut o;
    }
    let got = step!(w, gpu.stream.clone_dtoh(&dst));
    let want: Vec<f32> = (0..n).map(|i| (prev * 10_000 + i) as f32).collect();
    agreed(
        w,
        check(got == want, || format!("ring: got {got:?}, want {want:?}")),
    )?;
    if size >= 2 {
        c64_pipelined(w, gpu, &comm)?;
    }
    c65_empty(w, gpu, &comm)
}

/// 64 MiB from rank 0 to rank 1 (pipelined in 4 MiB parts when staged). Every rank takes
/// every step (the others with one-element buffers), so the agreements line up.
fn c64_pipelined(
    w: &SimpleCommunicator,
    gpu: &Gpu,
    comm: &DeviceComm<'_, SimpleCommunicator>,
) -> Outcome {
    const BIG: usize = 16 << 20;
    let rank = w.rank();
    let len = |r| if rank == r { BIG } else { 1 };
    let pattern: Vec<f32> = (0..len(0)).map(|i| (i % 65_536) as f32).collect();
    let big_src = step!(w, gpu.stream.clone_htod(&pattern));
    let mut big_dst = step!(w, gpu.stream.alloc_zeros::<f32>(len(1)));
    {
        let e = CudaExport::new(&big_src);
        let s = step!(w, acquire(&e, &AcquireOptions::default()));
        let mut o = CudaExport::new_mut(&mut big_dst);
        let mut r = step!(w, acquire(&o, &AcquireOptions::default()));
        step!(
            w,
            match rank {
                0 => comm.send_tensor(&s, 1, 2),
                1 => comm.recv_tensor(&mut r, 0, 2).map(|_| ()),
                _ => Ok(()),
            }
        );
        drop(r);
        let _ = &mut o;
    }
    let host = step!(w, gpu.stream.clone_dtoh(&big_dst));
    agreed(
        w,
        check(
            rank != 1
                || host
                    .iter()
                    .enumerate()
                    .all(|(i, v)| *v == (i % 65_536) as f32),
            || "64 MiB receive differs".into(),
        ),
    )
}

/// A strided layout over `storage` f32 elements: name, shape, strides (elements).
type StridedLayout = (&'static str, &'static [i64], &'static [i64], usize);

/// Step 2 (1 Mi elements: 4 MiB packed, 8 MiB span), transposed, Fortran order, a 3-D
/// permutation, and rows of a wider matrix (one 2-D copy of wide rows).
const STRIDED: &[StridedLayout] = &[
    ("step-2", &[1 << 20], &[2], 2 << 20),
    ("transposed 96x80", &[96, 80], &[1, 96], 96 * 80),
    ("Fortran 5x6x7", &[5, 6, 7], &[1, 5, 30], 210),
    ("permuted 3x4x5", &[3, 4, 5], &[1, 15, 3], 60),
    ("rows 64x100 of 64x128", &[64, 100], &[128, 1], 64 * 128),
];

/// Strided device tensors in a ring (issue 13, item 4): the sender's elements are packed by
/// 2-D copies (device → pinned host staged, device → device scratch direct) and unpacked into
/// a strided receive tensor of the same layout; the bytes between its elements keep their
/// sentinel.
fn strided_ring(w: &SimpleCommunicator, gpu: &Gpu, rt: &CudaRuntime, t: Transport) -> Outcome {
    let (rank, size) = (w.rank(), w.size());
    let comm = agreed(w, dc(w, rt, t))?;
    let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
    for (k, &(name, shape, strides, storage)) in STRIDED.iter().enumerate() {
        let values: Vec<f32> = (0..storage)
            .map(|i| (rank * 4_000_000) as f32 + i as f32)
            .collect();
        let src = step!(w, gpu.stream.clone_htod(&values));
        let mut dst = step!(w, gpu.stream.clone_htod(&vec![-7.0f32; storage]));
        {
            let e = step!(
                w,
                CudaExport::new(&src).with_layout(shape, Some(strides), 0)
            );
            let s = step!(w, acquire(&e, &AcquireOptions::default()));
            let mut o = step!(
                w,
                CudaExport::new_mut(&mut dst).with_layout(shape, Some(strides), 0)
            );
            let mut r = step!(w, acquire(&o, &AcquireOptions::default()));
            let tag = 30 + k as i32;
            step!(w, comm.sendrecv_tensor(&s, next, tag, &mut r, prev, tag));
            let route = comm.last_route();
            let want = if comm.is_direct() {
                Route::Direct
            } else {
                Route::Staged
            };
            agreed(
                w,
                check(route == Some(want), || format!("{name}: route {route:?}")),
            )?;
            drop(r);
            let _ = &mut o;
        }
        let got = step!(w, gpu.stream.clone_dtoh(&dst));
        let plan = step!(w, dlpack_mpi::layout::plan(shape, Some(strides)));
        let mut want = vec![-7.0f32; storage];
        for o in plan.offsets() {
            want[o as usize] = (prev * 4_000_000) as f32 + o as f32;
        }
        let first_bad = got.iter().zip(&want).position(|(g, w)| g != w);
        agreed(
            w,
            check(first_bad.is_none(), || {
                let i = first_bad.unwrap_or(0);
                format!("{name}: storage[{i}] = {}, want {}", got[i], want[i])
            }),
        )?;
    }
    Ok(())
}

/// C65: an empty device tensor. One-element allocations exported with shape `[0]`: a
/// zero-byte cudarc allocation is a 0-byte `cuMemAllocAsync` whose failing free would
/// surface later, in an unrelated call. The output's element must stay as it was.
fn c65_empty(
    w: &SimpleCommunicator,
    gpu: &Gpu,
    comm: &DeviceComm<'_, SimpleCommunicator>,
) -> Outcome {
    let one = step!(w, gpu.stream.clone_htod(&[1.0f32]));
    let mut one_out = step!(w, gpu.stream.clone_htod(&[7.0f32]));
    {
        let e = step!(w, CudaExport::new(&one).with_layout(&[0], None, 0));
        let s = step!(w, acquire(&e, &AcquireOptions::default()));
        let mut o = step!(
            w,
            CudaExport::new_mut(&mut one_out).with_layout(&[0], None, 0)
        );
        let mut r = step!(w, acquire(&o, &AcquireOptions::default()));
        step!(w, comm.all_reduce_tensor(&s, &mut r, ReduceOp::Sum));
        drop(r);
        let _ = &mut o;
    }
    let after = step!(w, gpu.stream.clone_dtoh(&one_out));
    agreed(
        w,
        check(after == [7.0], || {
            format!("an empty all-reduce wrote its output's storage: {after:?}")
        }),
    )
}

fn host_pointer_labelled_cuda(w: &SimpleCommunicator, rt: &CudaRuntime, ordinal: i32) -> Outcome {
    // Labelled with this rank's own device: no context is made on another one.
    let liar = Owned::new(vec![1.0f32; 8]).labelled(Device::new(device_type::CUDA, ordinal));
    let unsync = AcquireOptions {
        stream: StreamPolicy::Unsynchronized,
        ..AcquireOptions::default()
    };
    let s = step!(w, acquire(&liar, &unsync));
    let mut out = Owned::new(vec![0.0f32; 8]);
    let mut r = step!(w, acquire(&out, &unsync));
    let comm = agreed(w, dc(w, rt, Transport::Staged))?;
    // Refused before any transfer on every rank (the placement check is local).
    let refused = match comm.all_reduce_tensor(&s, &mut r, ReduceOp::Sum) {
        Err(Error::DeviceMismatch {
            reported_type: 2,
            actual_type: 1,
            ..
        }) => Ok(()),
        other => Err(format!(
            "expected DeviceMismatch (2,0) vs (1,0), got {other:?}"
        )),
    };
    agreed(w, refused)?;
    drop(r);
    let first = out.as_slice()[0];
    agreed(
        w,
        check(first == 0.0, || format!("output written: {first}")),
    )
}

/// Whether every rank has a CUDA runtime and its device: each rank that has not prints its
/// own reason; rank 0 says how many could not. Collective.
fn gpu_on_every_rank(
    w: &SimpleCommunicator,
    mine: Result<(&'static CudaRuntime, Gpu, DeviceSelection), String>,
) -> Option<(&'static CudaRuntime, Gpu, DeviceSelection)> {
    if let Err(reason) = &mine {
        // One write per line: Rust's stderr is unbuffered, and the ranks' lines interleave.
        let line = format!("GPU cases: rank {}: cannot run: {reason}\n", w.rank());
        let _ = std::io::stderr().write_all(line.as_bytes());
    }
    let mut failing = 0i32;
    w.all_reduce_into(
        &i32::from(mine.is_err()),
        &mut failing,
        SystemOperation::sum(),
    );
    if failing == 0 {
        return mine.ok();
    }
    if w.rank() == 0 {
        println!(
            "GPU cases: skipped: {failing} of {} rank(s) cannot use a CUDA device (reasons above)",
            w.size()
        );
    }
    None
}

/// The suite `gpu` (see the binary's `main`).
pub fn run(w: &SimpleCommunicator, filter: &[String]) -> harness::End {
    let dog = Watchdog::start(w.rank());
    // The node-local split is collective: every rank makes it, whether its runtime loads or not.
    let local = NodeLocal::of(w);
    let env = std::env::var_os(DEVICE_ENV).map(|v| v.to_string_lossy().into_owned());
    let mine = CudaRuntime::global()
        .map_err(|e| e.to_string())
        .and_then(|rt| {
            // The runtime's first context is made here, on this rank's own device.
            let sel = select_device_at(local, rt, None, env.as_deref())
                .map_err(|e| format!("{}: {e}", rt.describe()))?;
            let ordinal = sel.ordinal as usize;
            Gpu::new(ordinal)
                .map(|g| (rt, g, sel))
                .map_err(|e| format!("device {ordinal} ({}): {e}", rt.describe()))
        });
    let Some((rt, gpu, sel)) = gpu_on_every_rank(w, mine) else {
        let required = std::env::var("DLPACK_MPI_REQUIRE_GPU").is_ok_and(|v| v == "1");
        if required {
            if w.rank() == 0 {
                eprintln!("GPU cases: DLPACK_MPI_REQUIRE_GPU=1: a skip is a failure");
            }
            return harness::End::Skipped { status: 3 };
        }
        return harness::End::Skipped { status: 0 };
    };
    let aware_here = dlpack_mpi::transport::cuda_awareness()
        .map(|a| a.aware)
        .unwrap_or(false);
    let mut aware_all = 0i32;
    w.all_reduce_into(
        &i32::from(aware_here),
        &mut aware_all,
        SystemOperation::min(),
    );
    let aware = aware_all == 1;
    if w.rank() == 0 {
        println!(
            "running GPU cases at {} rank(s) on {}; rank 0: {sel}; MPI CUDA-aware: {aware}",
            w.size(),
            rt.describe()
        );
    }
    let mut transports = vec![Transport::Staged];
    if aware {
        transports.push(Transport::Direct);
    }
    let mut cases: Vec<(String, Box<dyn Fn() -> Outcome + '_>)> = Vec::new();
    for t in transports {
        let (g, r, ww) = (&gpu, rt, w);
        cases.push((
            format!("c61_real_kernel_{t}"),
            Box::new(move || c61_real_kernel(ww, g, r, t)),
        ));
        cases.push((
            format!("c64_c65_ring_pipeline_empty_{t}"),
            Box::new(move || c64_ring_and_pipeline(ww, g, r, t)),
        ));
        cases.push((
            format!("strided_2d_copies_{t}"),
            Box::new(move || strided_ring(ww, g, r, t)),
        ));
    }
    cases.push((
        "host_pointer_labelled_cuda".into(),
        Box::new(|| host_pointer_labelled_cuda(w, rt, sel.ordinal)),
    ));
    let named = cases.into_iter().map(|(n, c)| (n.clone(), (n, c)));
    let (passed, failed) = harness::run_cases(w, named, filter, |(name, case)| {
        dog.arm(name);
        let outcome = case();
        dog.arm(&format!(
            "after {name} (waiting for the other ranks' verdict)"
        ));
        outcome
    });
    harness::report(w, passed, failed);
    harness::End::Ran { passed, failed }
}
