//! GPU cases C51, C53, C60–C65 and the transport (issue 5) on a machine without a GPU:
//! tensors labelled `kDLCUDA`/`kDLCUDAManaged` over host memory, with a
//! [`SimulatedRuntime`] runtime that records every call and runs "kernels" (work queued on a
//! stream) only when that stream is synchronized. The routing, staging, pipelining, stream
//! and device-check code is the code a CUDA tensor runs through; only the runtime differs.
//!
//! The suite `device_cases` of tests/mpi (main.rs): `cargo test` runs it at 1 rank,
//! scripts/test.sh under `mpirun -n 2` and `-n 3`. The same cases against the real CUDA
//! runtime are the suite `gpu` (tests/mpi/gpu.rs, feature `cuda`, skipped without a GPU).

use crate::harness;
use dlpack_mpi::comm::TensorComm;
use dlpack_mpi::device::{device_type, Device};
use dlpack_mpi::dlpack::{
    acquire_with_runtime, AcquireOptions, DLDataType, DLTensor, ExportRequest, Exporter,
    ManagedTensor, Owned, StreamPolicy, Tensor, TensorView,
};
use dlpack_mpi::dtype::ReduceOp;
use dlpack_mpi::runtime::{DeviceRuntime, RuntimeCall, SimulatedRuntime};
use dlpack_mpi::settings::DEVICE_ENV;
use dlpack_mpi::transport::{
    select_device, select_device_at, DeviceComm, DeviceSource, NodeLocal, Route, Transport,
};
use dlpack_mpi::Error;
use half::f16;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

type Outcome = Result<(), String>;

const CUDA0: Device = Device::new(device_type::CUDA, 0);
const CUDA1: Device = Device::new(device_type::CUDA, 1);
const MANAGED: Device = Device::new(device_type::CUDA_MANAGED, 0);
const PINNED: Device = Device::new(device_type::CUDA_HOST, 0);

macro_rules! call {
    ($e:expr) => {
        $e.map_err(|e| format!("{} failed: {e}", stringify!($e)))?
    };
}

mod strided;

mod agreement;

mod forms;

mod nonblocking;

mod fused;
mod plans;

fn take<'e, E: Exporter>(e: &'e E, rt: &dyn DeviceRuntime) -> Result<ManagedTensor<'e>, String> {
    acquire_with_runtime(e, &AcquireOptions::default(), Some(rt)).map_err(|e| e.to_string())
}

fn on(device: Device, vals: Vec<f32>) -> Owned<f32> {
    Owned::new(vals).labelled(device)
}

fn staged<'c>(
    w: &'c SimpleCommunicator,
    rt: &'c SimulatedRuntime,
) -> DeviceComm<'c, SimpleCommunicator> {
    DeviceComm::new(w, Some(rt as &dyn DeviceRuntime), Transport::Staged)
        .expect("staged always works")
}

fn copies(rt: &SimulatedRuntime) -> (usize, usize) {
    rt.calls().iter().fold((0, 0), |(h, d), c| match c {
        RuntimeCall::CopyToHost { .. } => (h + 1, d),
        RuntimeCall::CopyToDevice { .. } => (h, d + 1),
        _ => (h, d),
    })
}

/// An exporter labelled CUDA that records the stream it is asked for and, like a
/// producer with a kernel still running, queues the filling of its storage on that stream:
/// the values exist only once the consumer synchronizes the stream (C61).
struct AsyncKernel<'r> {
    storage: Owned<f32>,
    rt: &'r SimulatedRuntime,
    fill: f32,
    asked: std::sync::Mutex<Vec<Option<isize>>>,
    answers_query: bool,
}

impl<'r> AsyncKernel<'r> {
    fn new(rt: &'r SimulatedRuntime, len: usize, fill: f32, answers_query: bool) -> Self {
        AsyncKernel {
            storage: on(CUDA0, vec![0.0; len]),
            rt,
            fill,
            asked: std::sync::Mutex::new(Vec::new()),
            answers_query,
        }
    }
}

impl Exporter for AsyncKernel<'_> {
    fn dlpack_device(&self) -> Option<Device> {
        self.answers_query.then_some(CUDA0)
    }

    fn dlpack(&self, request: &ExportRequest) -> dlpack_mpi::Result<ManagedTensor<'_>> {
        self.asked.lock().unwrap().push(request.stream);
        let t = self.storage.dlpack(request)?;
        let (addr, n, fill) = (t.data_ptr() as usize, t.num_elements() as usize, self.fill);
        // The "kernel": ordered before the stream the consumer named (legacy default when
        // none was named, as the array API says).
        let stream = request.stream.unwrap_or(1);
        self.rt.enqueue(stream, move || {
            // SAFETY: the storage lives in the exporter, which outlives the tensor whose
            // acquisition synchronizes this stream; nothing else touches it meanwhile.
            let s = unsafe { std::slice::from_raw_parts_mut(addr as *mut f32, n) };
            for (i, v) in s.iter_mut().enumerate() {
                *v = fill + i as f32;
            }
        });
        Ok(t)
    }
}

/// A runtime that forgets to synchronize: the control that shows C61 can fail.
struct NoSync<'a>(&'a SimulatedRuntime);

// SAFETY: every method but `synchronize` is the simulated runtime's; skipping its
// synchronization breaks no memory promise here (the simulated "device" is host memory
// written synchronously), only the ordering the C61 control is about.
unsafe impl DeviceRuntime for NoSync<'_> {
    fn describe(&self) -> String {
        "simulated device without synchronization".into()
    }
    fn consumer_stream(&self, d: Device) -> dlpack_mpi::Result<isize> {
        self.0.consumer_stream(d)
    }
    fn synchronize(&self, _: Device, _: isize) -> dlpack_mpi::Result<()> {
        Ok(())
    }
    fn check_pointer(&self, d: Device, p: *const std::ffi::c_void) -> dlpack_mpi::Result<()> {
        self.0.check_pointer(d, p)
    }
    fn alloc_pinned(&self, b: usize) -> dlpack_mpi::Result<std::ptr::NonNull<u8>> {
        self.0.alloc_pinned(b)
    }
    unsafe fn free_pinned(&self, p: std::ptr::NonNull<u8>, b: usize) {
        // SAFETY: forwarded contract.
        unsafe { self.0.free_pinned(p, b) }
    }
    unsafe fn copy_to_host(
        &self,
        d: Device,
        dst: *mut u8,
        src: *const std::ffi::c_void,
        b: usize,
    ) -> dlpack_mpi::Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.0.copy_to_host(d, dst, src, b) }
    }
    unsafe fn copy_to_device(
        &self,
        d: Device,
        dst: *mut std::ffi::c_void,
        src: *const u8,
        b: usize,
    ) -> dlpack_mpi::Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.0.copy_to_device(d, dst, src, b) }
    }
}

fn c51_consumer_stream_and_minus_one(_w: &SimpleCommunicator) -> Outcome {
    let rt = SimulatedRuntime::new();
    let k = AsyncKernel::new(&rt, 4, 1.0, true);
    drop(call!(acquire_with_runtime(
        &k,
        &AcquireOptions::default(),
        Some(&rt)
    )));
    let unsync = AcquireOptions {
        stream: StreamPolicy::Unsynchronized,
        ..AcquireOptions::default()
    };
    drop(call!(acquire_with_runtime(&k, &unsync, Some(&rt))));
    let asked = k.asked.lock().unwrap().clone();
    let consumer = call!(rt.consumer_stream(CUDA0));
    ensure_eq!(asked, vec![Some(consumer), Some(-1)]);
    ensure!(
        ![0, 1, 2, -1].contains(&consumer),
        "the consumer's own stream must be a handle, got {consumer}"
    );
    // The default policy synchronized exactly that stream, and ran the queued kernel.
    let syncs: Vec<_> = rt
        .calls()
        .into_iter()
        .filter(|c| matches!(c, RuntimeCall::Synchronize { .. }))
        .collect();
    ensure_eq!(
        syncs,
        vec![RuntimeCall::Synchronize {
            device: CUDA0,
            stream: consumer,
            completed: 1
        }]
    );
    Ok(())
}

fn c53_no_device_query_syncs_legacy_stream(_w: &SimpleCommunicator) -> Outcome {
    let rt = SimulatedRuntime::new();
    let k = AsyncKernel::new(&rt, 3, 5.0, false);
    let t = call!(acquire_with_runtime(
        &k,
        &AcquireOptions::default(),
        Some(&rt)
    ));
    ensure_eq!(t.device(), CUDA0);
    drop(t);
    ensure_eq!(k.asked.lock().unwrap().clone(), vec![None]);
    ensure!(
        rt.calls().contains(&RuntimeCall::Synchronize {
            device: CUDA0,
            stream: 1,
            completed: 1
        }),
        "a tensor asked for without a stream must be ordered by the legacy stream: {:?}",
        rt.calls()
    );
    Ok(())
}

/// Acquire from the asynchronous producer through `rt`, all-reduce (sum) through a staged
/// DeviceComm, and compare with the values the kernel writes.
fn async_kernel_allreduce(
    w: &SimpleCommunicator,
    sim: &SimulatedRuntime,
    rt: &dyn DeviceRuntime,
) -> Outcome {
    const N: usize = 100_000;
    let k = AsyncKernel::new(sim, N, w.rank() as f32, true);
    let mut out = on(CUDA0, vec![-1.0; N]);
    {
        let send = call!(acquire_with_runtime(
            &k,
            &AcquireOptions::default(),
            Some(rt)
        ));
        let mut recv = take(&out, rt)?;
        let dc = call!(DeviceComm::new(w, Some(rt), Transport::Staged));
        call!(dc.all_reduce_tensor(&send, &mut recv, ReduceOp::Sum));
    }
    let size = w.size() as f32;
    let rank_sum = (0..w.size()).map(|r| r as f32).sum::<f32>();
    for (i, v) in out.as_slice().iter().enumerate() {
        let want = rank_sum + size * i as f32;
        ensure!(
            *v == want,
            "element {i}: got {v}, the kernel's sum is {want}"
        );
    }
    Ok(())
}

fn c61_async_kernel_is_ordered_before_mpi(w: &SimpleCommunicator) -> Outcome {
    let sim = SimulatedRuntime::new();
    async_kernel_allreduce(w, &sim, &sim)?;
    // Control: the same pipeline with the synchronization removed must not pass.
    let sim2 = SimulatedRuntime::new();
    let broken = async_kernel_allreduce(w, &sim2, &NoSync(&sim2));
    ensure!(
        broken.is_err(),
        "without synchronization the receiver must see stale values; the case cannot fail"
    );
    Ok(())
}

fn c60_pinned_host_is_host_memory(w: &SimpleCommunicator) -> Outcome {
    let rt = SimulatedRuntime::new();
    let src = on(PINNED, vec![w.rank() as f32 + 0.5; 32]);
    let mut dst = on(PINNED, vec![0.0; 32]);
    {
        let s = take(&src, &rt)?;
        let mut d = take(&dst, &rt)?;
        let dc = staged(w, &rt);
        call!(dc.all_reduce_tensor(&s, &mut d, ReduceOp::Max));
        ensure_eq!(dc.last_route(), Some(Route::Host));
    }
    ensure_eq!(dst.as_slice()[31], (w.size() - 1) as f32 + 0.5);
    ensure!(
        rt.calls().is_empty(),
        "pinned host memory made runtime calls: {:?}",
        rt.calls()
    );
    Ok(())
}

fn c62_other_device_current(w: &SimpleCommunicator) -> Outcome {
    let rt = SimulatedRuntime::new();
    rt.set_current_device(0);
    let src = on(CUDA1, vec![1.0; 64]);
    let mut dst = on(CUDA1, vec![0.0; 64]);
    {
        let s = take(&src, &rt)?;
        let mut d = take(&dst, &rt)?;
        rt.place(s.data_ptr(), 256, CUDA1);
        rt.place(d.data_ptr(), 256, CUDA1);
        call!(staged(w, &rt).all_reduce_tensor(&s, &mut d, ReduceOp::Sum));
    }
    ensure_eq!(dst.as_slice()[63], w.size() as f32);
    ensure_eq!(rt.current_device(), 0);
    for c in rt.calls() {
        if let RuntimeCall::CopyToHost { current, .. } | RuntimeCall::CopyToDevice { current, .. } =
            c
        {
            ensure_eq!(current, 1);
        }
    }
    // Memory of device 1 labelled device 0: DeviceMismatch naming both, before MPI.
    let liar = on(CUDA0, vec![1.0; 8]);
    let mut out = on(CUDA0, vec![0.0; 8]);
    let s = take(&liar, &rt)?;
    rt.place(s.data_ptr(), 32, CUDA1);
    let mut d = take(&out, &rt)?;
    match staged(w, &rt).all_reduce_tensor(&s, &mut d, ReduceOp::Sum) {
        Err(Error::DeviceMismatch {
            reported_type: 2,
            reported_id: 0,
            actual_type: 2,
            actual_id: 1,
        }) => {}
        other => {
            return Err(format!(
                "expected DeviceMismatch (2,0) vs (2,1), got {other:?}"
            ))
        }
    }
    drop(d);
    ensure_eq!(out.as_slice()[0], 0.0);
    Ok(())
}

fn c63_managed_is_synchronized_not_copied(w: &SimpleCommunicator) -> Outcome {
    let rt = SimulatedRuntime::new();
    let src = on(MANAGED, vec![2.0; 16]);
    let mut dst = on(MANAGED, vec![0.0; 16]);
    {
        let s = take(&src, &rt)?;
        let mut d = take(&dst, &rt)?;
        let dc = staged(w, &rt);
        call!(dc.all_reduce_tensor(&s, &mut d, ReduceOp::Sum));
        ensure_eq!(dc.last_route(), Some(Route::Managed));
    }
    ensure_eq!(dst.as_slice()[15], 2.0 * w.size() as f32);
    ensure_eq!(copies(&rt), (0, 0));
    let syncs = rt
        .calls()
        .iter()
        .filter(|c| matches!(c, RuntimeCall::Synchronize { device, .. } if *device == MANAGED))
        .count();
    ensure_eq!(syncs, 2);
    Ok(())
}

/// Every collective through staging, float32 and float16 (whose reduction is a host
/// function), checked value by value.
fn c64_staged_every_collective(w: &SimpleCommunicator) -> Outcome {
    let rt = SimulatedRuntime::new();
    let dc = staged(w, &rt);
    let (rank, size) = (w.rank() as usize, w.size() as usize);
    let n = 6;
    // all-reduce, float32 and float16
    let src = on(CUDA0, (0..n).map(|i| (rank * 10 + i) as f32).collect());
    let mut dst = on(CUDA0, vec![0.0; n]);
    {
        let s = take(&src, &rt)?;
        let mut d = take(&dst, &rt)?;
        call!(dc.all_reduce_tensor(&s, &mut d, ReduceOp::Sum));
        ensure_eq!(dc.last_route(), Some(Route::Staged));
    }
    let ranks: usize = (0..size).sum();
    for i in 0..n {
        ensure_eq!(dst.as_slice()[i], (ranks * 10 + i * size) as f32);
    }
    let h: Vec<f16> = (0..n).map(|i| f16::from_f32((rank + i) as f32)).collect();
    let hsrc = Owned::new(h).labelled(CUDA0);
    let mut hdst = Owned::new(vec![f16::ZERO; n]).labelled(CUDA0);
    {
        let s = take(&hsrc, &rt)?;
        let mut d = take(&hdst, &rt)?;
        call!(dc.all_reduce_tensor(&s, &mut d, ReduceOp::Max));
    }
    for i in 0..n {
        ensure_eq!(hdst.as_slice()[i].to_f32(), (size - 1 + i) as f32);
    }
    // in-place all-reduce
    let mut inplace = on(CUDA0, vec![1.5; n]);
    {
        let mut t = take(&inplace, &rt)?;
        call!(dc.all_reduce_tensor_in_place(&mut t, ReduceOp::Sum));
    }
    ensure_eq!(inplace.as_slice()[n - 1], 1.5 * size as f32);
    // broadcast from the last rank
    let root = (size - 1) as i32;
    let mut b = on(CUDA0, vec![if rank == size - 1 { 7.0 } else { 0.0 }; n]);
    {
        let mut t = take(&b, &rt)?;
        call!(dc.broadcast_tensor(&mut t, root));
    }
    ensure_eq!(b.as_slice(), &[7.0; 6][..]);
    // all-gather and all-to-all
    let mine = on(CUDA0, vec![rank as f32; 2]);
    let mut all = on(CUDA0, vec![-1.0; 2 * size]);
    {
        let s = take(&mine, &rt)?;
        let mut d = take(&all, &rt)?;
        call!(dc.all_gather_tensor(&s, &mut d));
    }
    let want: Vec<f32> = (0..size).flat_map(|r| [r as f32, r as f32]).collect();
    ensure_eq!(all.as_slice(), &want[..]);
    let a2a = on(CUDA0, (0..size).map(|r| (rank * 100 + r) as f32).collect());
    let mut got = on(CUDA0, vec![-1.0; size]);
    {
        let s = take(&a2a, &rt)?;
        let mut d = take(&got, &rt)?;
        call!(dc.all_to_all_tensor(&s, &mut d));
    }
    let want: Vec<f32> = (0..size).map(|r| (r * 100 + rank) as f32).collect();
    ensure_eq!(got.as_slice(), &want[..]);
    // reduce and gather to rank 0 (others pass no receive tensor)
    let one = on(CUDA0, vec![rank as f32 + 1.0; 3]);
    let mut red = on(CUDA0, vec![0.0; 3]);
    let mut gat = on(CUDA0, vec![0.0; 3 * size]);
    {
        let s = take(&one, &rt)?;
        let mut r = take(&red, &rt)?;
        let mut g = take(&gat, &rt)?;
        // Every rank passes its receive tensors: only the root's may change (the others are
        // ignored, never staged or copied back).
        let (rr, gg): (Option<&mut dyn Tensor>, Option<&mut dyn Tensor>) =
            (Some(&mut r), Some(&mut g));
        call!(dc.reduce_tensor(&s, rr, ReduceOp::Sum, 0));
        call!(dc.gather_tensor(&s, gg, 0));
    }
    if rank != 0 {
        ensure_eq!(red.as_slice(), &[0.0; 3][..]);
        ensure!(
            gat.as_slice().iter().all(|v| *v == 0.0),
            "a non-root gather tensor changed"
        );
    }
    if rank == 0 {
        ensure_eq!(red.as_slice()[2], (1..=size).sum::<usize>() as f32);
        let want: Vec<f32> = (0..size).flat_map(|r| [r as f32 + 1.0; 3]).collect();
        ensure_eq!(gat.as_slice(), &want[..]);
    }
    // the pool reuses its buffers: running the same all-reduce again allocates nothing
    let before = rt
        .calls()
        .iter()
        .filter(|c| matches!(c, RuntimeCall::AllocPinned { .. }))
        .count();
    {
        let s = take(&src, &rt)?;
        let mut d = take(&dst, &rt)?;
        call!(dc.all_reduce_tensor(&s, &mut d, ReduceOp::Sum));
    }
    let after = rt
        .calls()
        .iter()
        .filter(|c| matches!(c, RuntimeCall::AllocPinned { .. }))
        .count();
    ensure_eq!(before, after);
    drop(dc);
    ensure_eq!(rt.pinned_live_bytes(), 0);
    Ok(())
}

/// A staged send of 10 MiB with 1 MiB parts: ten copies out, ten messages, reassembled on
/// the receiver — into device memory (staged) and into host memory.
fn pipelined_point_to_point(w: &SimpleCommunicator) -> Outcome {
    let (rank, size) = (w.rank(), w.size());
    if size < 2 {
        return Ok(()); // a blocking pipelined send to oneself would wait for itself
    }
    const N: usize = 10 << 18; // 10 MiB of f32
    let rt = SimulatedRuntime::new();
    let dc = staged(w, &rt).with_pipeline_chunk(Some(1 << 20));
    ensure_eq!(dc.pipeline_chunk_bytes(), 1 << 20);
    if rank == 0 {
        let src = on(CUDA0, (0..N).map(|i| i as f32).collect());
        let s = take(&src, &rt)?;
        call!(dc.send_tensor(&s, 1, 9));
        call!(dc.send_tensor(&s, 1, 10));
        let (to_host, _) = copies(&rt);
        ensure_eq!(to_host, 20);
        call!(dc.send_tensor(&s, 1, 12));
        ensure!(
            rt.calls()
                .iter()
                .all(|c| !matches!(c, RuntimeCall::CopyToHost { bytes, .. } if *bytes > 1 << 20)),
            "a part larger than 1 MiB was copied"
        );
    } else if rank == 1 {
        let mut dst = on(CUDA0, vec![0.0; N]);
        {
            let mut d = take(&dst, &rt)?;
            let status = call!(dc.recv_tensor(&mut d, 0, 9));
            ensure_eq!(status.source_rank(), 0);
        }
        ensure_eq!(copies(&rt).1, 10);
        let v = dst.as_slice();
        ensure!(
            v.iter().enumerate().all(|(i, x)| *x == i as f32),
            "device receive differs"
        );
        let mut host = Owned::new(vec![0.0f32; N]);
        {
            let mut d = take(&host, &rt)?;
            call!(dc.recv_tensor(&mut d, 0, 10));
            ensure_eq!(dc.last_route(), Some(Route::Host));
        }
        let v = host.as_slice();
        ensure!(
            v.iter().enumerate().all(|(i, x)| *x == i as f32),
            "host receive differs"
        );
        // A read-only host tensor is refused before any part is received; the message
        // stays queued for a fitting receive.
        let ro = Owned::new(vec![0.0f32; N]).read_only();
        {
            let mut d = take(&ro, &rt)?;
            match dc.recv_tensor(&mut d, 0, 12) {
                Err(Error::ReadOnly) => {}
                other => return Err(format!("read-only host receive: got {other:?}")),
            }
        }
        let mut again = Owned::new(vec![0.0f32; N]);
        {
            let mut d = take(&again, &rt)?;
            call!(dc.recv_tensor(&mut d, 0, 12));
        }
        ensure_eq!(again.as_slice()[N - 1], (N - 1) as f32);
    }
    // A sender without pipelining, a pipelining receiver: one message, still received.
    if rank == 1 {
        let src = on(CUDA0, vec![3.0; N]);
        let s = take(&src, &rt)?;
        call!(staged(w, &rt)
            .with_pipeline_chunk(None)
            .send_tensor(&s, 0, 11));
    } else if rank == 0 {
        let mut dst = on(CUDA0, vec![0.0; N]);
        {
            let mut d = take(&dst, &rt)?;
            call!(dc.recv_tensor(&mut d, 1, 11));
        }
        ensure!(
            dst.as_slice().iter().all(|x| *x == 3.0),
            "single-message receive differs"
        );
    }
    Ok(())
}

fn c65_empty_tensor_makes_no_runtime_call(w: &SimpleCommunicator) -> Outcome {
    let rt = SimulatedRuntime::new();
    let empty = on(CUDA0, Vec::new());
    let mut out = on(CUDA0, Vec::new());
    let s = take(&empty, &rt)?;
    let mut d = take(&out, &rt)?;
    ensure!(s.data_ptr().is_null() || s.num_elements() == 0, "not empty");
    rt.clear_calls();
    call!(staged(w, &rt).all_reduce_tensor(&s, &mut d, ReduceOp::Sum));
    let size = w.size();
    let (rank, next, prev) = (
        w.rank(),
        (w.rank() + 1) % size,
        (w.rank() + size - 1) % size,
    );
    let _ = rank;
    call!(staged(w, &rt).sendrecv_tensor(&s, next, 5, &mut d, prev, 5));
    ensure!(
        rt.calls().is_empty(),
        "an empty tensor made runtime calls: {:?}",
        rt.calls()
    );
    drop(d);
    ensure_eq!(out.as_slice().len(), 0);
    Ok(())
}

/// The two calls a selection makes, in order, before anything else reaches the runtime.
fn selected(ordinal: i32) -> Vec<RuntimeCall> {
    vec![
        RuntimeCall::DeviceCount { count: 2 },
        RuntimeCall::SelectDevice { ordinal },
    ]
}

/// Two simulated devices per node: each rank gets its node-local rank modulo 2 (all ranks of
/// these runs share one node, so the node-local rank is the world rank), and the selection
/// is the runtime's first call; the rank's tensors then live on that device.
fn device_per_node_local_rank(w: &SimpleCommunicator) -> Outcome {
    let local = NodeLocal::of(w);
    ensure_eq!((local.rank, local.size), (w.rank(), w.size()));
    let rt = SimulatedRuntime::with_devices(2);
    let sel = call!(select_device_at(local, &rt, None, None));
    ensure_eq!(sel.ordinal, w.rank() % 2);
    ensure_eq!(sel.source, DeviceSource::NodeLocalRank);
    ensure_eq!(
        (sel.local_rank, sel.local_size, sel.device_count),
        (w.rank(), w.size(), 2)
    );
    ensure_eq!(rt.calls(), selected(sel.ordinal));
    ensure_eq!(rt.current_device(), sel.ordinal);
    // A staged all-reduce on the selected device copies with that device current.
    let mine = Device::new(device_type::CUDA, sel.ordinal);
    let x = on(mine, vec![1.0f32; 4]);
    let mut out = on(mine, vec![0.0f32; 4]);
    {
        let s = take(&x, &rt)?;
        let mut d = take(&out, &rt)?;
        call!(staged(w, &rt).all_reduce_tensor(&s, &mut d, ReduceOp::Sum));
    }
    ensure_eq!(out.as_slice(), &[w.size() as f32; 4][..]);
    let calls = rt.calls();
    ensure_eq!(calls[..2], selected(sel.ordinal)[..]);
    ensure!(
        calls.iter().all(|c| match c {
            RuntimeCall::CopyToHost { current, .. } | RuntimeCall::CopyToDevice { current, .. } =>
                *current == sel.ordinal,
            _ => true,
        }),
        "a copy ran on another device: {calls:?}"
    );
    // Through the environment (unset here): the same answer.
    std::env::remove_var(DEVICE_ENV);
    let rt = SimulatedRuntime::with_devices(2);
    let again = call!(select_device(w, &rt, None));
    ensure_eq!(again, sel);
    ensure_eq!(rt.calls(), selected(sel.ordinal));
    Ok(())
}

/// `DLPACK_MPI_DEVICE` wins over the node-local rank, an explicit ordinal over both; a bad
/// value is a typed error before any runtime call; an ordinal the node lacks is refused
/// before any context is made.
fn device_overrides_and_refusals(w: &SimpleCommunicator) -> Outcome {
    let local = NodeLocal::of(w);
    let rt = SimulatedRuntime::with_devices(2);
    let sel = call!(select_device_at(local, &rt, None, Some("1")));
    ensure_eq!((sel.ordinal, sel.source), (1, DeviceSource::Environment));
    ensure_eq!(rt.calls(), selected(1));
    let rt = SimulatedRuntime::with_devices(2);
    let sel = call!(select_device_at(local, &rt, Some(0), Some("1")));
    ensure_eq!((sel.ordinal, sel.source), (0, DeviceSource::Flag));
    ensure_eq!(rt.calls(), selected(0));
    // The process environment, as `select_device` reads it.
    std::env::set_var(DEVICE_ENV, "1");
    let rt = SimulatedRuntime::with_devices(2);
    let from_env = select_device(w, &rt, None);
    std::env::set_var(DEVICE_ENV, "gpu1");
    let rt_bad = SimulatedRuntime::with_devices(2);
    let bad = select_device(w, &rt_bad, None);
    std::env::remove_var(DEVICE_ENV);
    let from_env = call!(from_env);
    ensure_eq!(
        (from_env.ordinal, from_env.source),
        (1, DeviceSource::Environment)
    );
    ensure_eq!(rt.calls(), selected(1));
    match bad {
        Err(Error::InvalidSetting { name, value, .. }) => {
            ensure_eq!((name, value.as_str()), (DEVICE_ENV, "gpu1"));
        }
        other => return Err(format!("expected InvalidSetting, got {other:?}")),
    }
    ensure!(rt_bad.calls().is_empty(), "{:?}", rt_bad.calls());
    ensure_eq!(rt_bad.selected_device(), None);
    for (flag, env) in [(Some(2), None), (None, Some("2")), (Some(-1), None)] {
        let rt = SimulatedRuntime::with_devices(2);
        match select_device_at(local, &rt, flag, env) {
            Err(Error::UnsupportedDevice { device_id, .. }) => {
                ensure_eq!(device_id, flag.unwrap_or(2));
            }
            other => {
                return Err(format!(
                    "{flag:?}/{env:?}: expected UnsupportedDevice, got {other:?}"
                ))
            }
        }
        ensure_eq!(rt.calls(), vec![RuntimeCall::DeviceCount { count: 2 }]);
        ensure_eq!(rt.selected_device(), None);
    }
    Ok(())
}

/// With `DLPACK_MPI_CUDA_AWARE=1`, `Auto` goes direct for contiguous tensors and still
/// stages strided ones and half-precision reductions; `Direct` is refused when MPI is not
/// CUDA-aware.
fn direct_route_and_its_exceptions(w: &SimpleCommunicator) -> Outcome {
    let rt = SimulatedRuntime::new();
    std::env::set_var("DLPACK_MPI_CUDA_AWARE", "1");
    let dc = DeviceComm::new(w, Some(&rt as &dyn DeviceRuntime), Transport::Auto);
    std::env::set_var("DLPACK_MPI_CUDA_AWARE", "0");
    let refused = DeviceComm::new(w, Some(&rt as &dyn DeviceRuntime), Transport::Direct);
    std::env::remove_var("DLPACK_MPI_CUDA_AWARE");
    let dc = call!(dc);
    ensure!(dc.is_direct(), "Auto with an aware MPI must go direct");
    match refused {
        Err(Error::TransportUnavailable {
            transport: "direct",
            reason,
        }) => {
            ensure!(reason.contains("not CUDA-aware"), "reason: {reason}")
        }
        other => return Err(format!("expected TransportUnavailable, got {other:?}")),
    }
    let src = on(CUDA0, vec![1.0; 8]);
    let mut dst = on(CUDA0, vec![0.0; 8]);
    {
        let s = take(&src, &rt)?;
        let mut d = take(&dst, &rt)?;
        rt.clear_calls();
        call!(dc.all_reduce_tensor(&s, &mut d, ReduceOp::Sum));
        ensure_eq!(dc.last_route(), Some(Route::Direct));
        ensure_eq!(copies(&rt), (0, 0));
    }
    ensure_eq!(dst.as_slice()[7], w.size() as f32);
    let strided = on(CUDA0, vec![1.0; 8])
        .with_layout(&[4], Some(&[2]), 0)
        .map_err(|e| e.to_string())?;
    let mut four = on(CUDA0, vec![0.0; 4]);
    {
        let s = take(&strided, &rt)?;
        let mut d = take(&four, &rt)?;
        rt.clear_calls();
        call!(dc.all_reduce_tensor(&s, &mut d, ReduceOp::Sum));
        // Packed on the device into a scratch buffer, sent contiguous (no derived datatype
        // over device memory), nothing copied to the host.
        ensure_eq!(dc.last_route(), Some(Route::Direct));
        ensure_eq!(copies(&rt), (0, 0));
        ensure_eq!(rt.bytes_copied(), 16);
    }
    ensure_eq!(four.as_slice(), &[w.size() as f32; 4][..]);
    let h = Owned::new(vec![f16::ONE; 4]).labelled(CUDA0);
    let mut hout = Owned::new(vec![f16::ZERO; 4]).labelled(CUDA0);
    {
        let s = take(&h, &rt)?;
        let mut d = take(&hout, &rt)?;
        call!(dc.all_reduce_tensor(&s, &mut d, ReduceOp::Sum));
        ensure_eq!(dc.last_route(), Some(Route::Staged));
    }
    ensure_eq!(hout.as_slice()[0].to_f32(), w.size() as f32);
    Ok(())
}

/// Refusals before MPI and before any copy: ROCm, no runtime, a read-only device receive.
fn refusals(w: &SimpleCommunicator) -> Outcome {
    let rt = SimulatedRuntime::new();
    let rocm = Owned::new(vec![1.0f32; 4]).labelled(Device::new(device_type::ROCM, 0));
    let unsync = AcquireOptions {
        stream: StreamPolicy::Unsynchronized,
        ..AcquireOptions::default()
    };
    let t = call!(acquire_with_runtime(&rocm, &unsync, Some(&rt)));
    let mut out = on(CUDA0, vec![0.0; 4]);
    let mut d = take(&out, &rt)?;
    match staged(w, &rt).all_reduce_tensor(&t, &mut d, ReduceOp::Sum) {
        Err(Error::UnsupportedDevice {
            device_type: 10, ..
        }) => {}
        other => return Err(format!("ROCm: expected UnsupportedDevice, got {other:?}")),
    }
    let cuda = on(CUDA0, vec![1.0; 4]);
    let s = take(&cuda, &rt)?;
    let hostonly = call!(DeviceComm::new(w, None, Transport::Staged));
    match hostonly.all_reduce_tensor(&s, &mut d, ReduceOp::Sum) {
        Err(Error::UnsupportedDevice { reason, .. }) => {
            ensure!(reason.contains("feature `cuda`"), "reason: {reason}")
        }
        other => {
            return Err(format!(
                "no runtime: expected UnsupportedDevice, got {other:?}"
            ))
        }
    }
    drop(d);
    let ro = on(CUDA0, vec![0.0; 4]).read_only();
    let mut r = take(&ro, &rt)?;
    rt.clear_calls();
    match staged(w, &rt).all_reduce_tensor(&s, &mut r, ReduceOp::Sum) {
        Err(Error::ReadOnly) => {}
        other => return Err(format!("read-only: expected ReadOnly, got {other:?}")),
    }
    ensure_eq!(copies(&rt), (0, 0));
    drop(r);
    ensure_eq!(out.as_slice(), &[0.0; 4][..]);
    // A send and a receive over the same device bytes: BuffersAlias, as on host memory.
    let mut buf = vec![1.0f32; 8];
    let mut shape = [7i64];
    let mut dl = DLTensor {
        data: buf.as_mut_ptr().cast(),
        device: CUDA0.into(),
        ndim: 1,
        dtype: DLDataType {
            code: 2,
            bits: 32,
            lanes: 1,
        },
        shape: shape.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    };
    let mut dl2 = dl;
    dl2.byte_offset = 4;
    let size = w.size();
    let (next, prev) = ((w.rank() + 1) % size, (w.rank() + size - 1) % size);
    {
        // SAFETY: both DLTensors describe 7 floats inside `buf` (elements 0..7 and 1..8),
        // which outlives the views; nothing else touches `buf` meanwhile.
        let a = call!(unsafe { TensorView::from_raw(&mut dl) });
        // SAFETY: as above.
        let mut b = call!(unsafe { TensorView::from_raw(&mut dl2) });
        rt.clear_calls();
        match staged(w, &rt).sendrecv_tensor(&a, next, 6, &mut b, prev, 6) {
            Err(Error::BuffersAlias {
                send_bytes: 28,
                recv_bytes: 28,
                ..
            }) => {}
            other => return Err(format!("overlapping device spans: got {other:?}")),
        }
        ensure_eq!(copies(&rt), (0, 0));
    }
    ensure_eq!(buf, vec![1.0f32; 8]);
    Ok(())
}

type Case = fn(&SimpleCommunicator) -> Outcome;

const CASES: &[(&str, Case)] = &[
    (
        "c51_consumer_stream_and_minus_one",
        c51_consumer_stream_and_minus_one,
    ),
    (
        "c53_no_device_query_syncs_legacy_stream",
        c53_no_device_query_syncs_legacy_stream,
    ),
    (
        "c60_pinned_host_is_host_memory",
        c60_pinned_host_is_host_memory,
    ),
    (
        "c61_async_kernel_is_ordered_before_mpi",
        c61_async_kernel_is_ordered_before_mpi,
    ),
    ("c62_other_device_current", c62_other_device_current),
    (
        "c63_managed_is_synchronized_not_copied",
        c63_managed_is_synchronized_not_copied,
    ),
    ("c64_staged_every_collective", c64_staged_every_collective),
    (
        "c65_empty_tensor_makes_no_runtime_call",
        c65_empty_tensor_makes_no_runtime_call,
    ),
    ("pipelined_point_to_point", pipelined_point_to_point),
    (
        "direct_route_and_its_exceptions",
        direct_route_and_its_exceptions,
    ),
    ("refusals", refusals),
    ("device_per_node_local_rank", device_per_node_local_rank),
    (
        "device_overrides_and_refusals",
        device_overrides_and_refusals,
    ),
];

/// The suite `device_cases` (see the binary's `main`).
pub fn run(w: &SimpleCommunicator, filter: &[String]) -> harness::End {
    if w.rank() == 0 {
        println!("running simulated-device cases at {} rank(s)", w.size());
    }
    let (passed, failed) = harness::run_cases(
        w,
        CASES
            .iter()
            .chain(strided::CASES)
            .chain(agreement::CASES)
            .chain(forms::CASES)
            .chain(nonblocking::CASES)
            .chain(fused::CASES)
            .chain(plans::CASES)
            .copied(),
        filter,
        |case| case(w),
    );
    harness::report(w, passed, failed);
    harness::End::Ran { passed, failed }
}
