//! [`DeviceComm`]: every [`TensorComm`] operation for tensors on any device, routed per
//! tensor (ARCHITECTURE.md, "Transport"):
//!
//! | memory | route | what MPI gets |
//! |---|---|---|
//! | `kDLCPU`, `kDLCUDAHost`, `kDLROCMHost` | [`Route::Host`] | the tensor itself |
//! | `kDLCUDAManaged` | [`Route::Managed`] | the managed pointer (host-accessible once the producer is synchronized, which `acquire` did) |
//! | `kDLCUDA`, MPI CUDA-aware, contiguous, no user-defined reduction | [`Route::Direct`] | the device pointer |
//! | any other `kDLCUDA` | [`Route::Staged`] | a pinned host copy of the tensor's byte span |
//! | `kDLROCM` and the rest | — | [`Error::UnsupportedDevice`] |
//!
//! **Staging.** Before an operation the bytes a tensor touches (its *span*: from its lowest
//! to one past its highest element, so strided views keep their layout and are described
//! by the same derived datatype) are copied device → pinned host for tensors MPI reads; the
//! operation runs on host memory; then the span is copied pinned host → device for tensors
//! MPI wrote. A receive span with gaps (a step slice) is first read from the device, so the
//! bytes between elements keep their values. Pinned buffers (sizes rounded up to a power of
//! two, at least 64 KiB) come from a pool owned by the `DeviceComm` and are reused; the pool
//! keeps at most [`MAX_POOLED_BYTES`] and frees the rest. A send and a receive tensor whose
//! device spans overlap are [`Error::BuffersAlias`], as on host memory.
//!
//! **Pipelining** (point-to-point only). A staged contiguous send of more than
//! [`DeviceComm::pipeline_chunk_bytes`] bytes (default 4 MiB) goes out as consecutive
//! messages of that many bytes (whole elements; same tag; MPI's non-overtaking rule keeps
//! them in order, §3.5) through two pinned buffers, so the copy of part *k + 1* overlaps the
//! transfer of part *k*. [`DeviceComm::recv_tensor`] recognises both forms by probing the
//! first message (its size is either the whole tensor or one part), so any `DeviceComm`
//! receives from any `DeviceComm` whatever their devices and transports. Both sides must use
//! the same part size; a plain [`TensorComm::recv_tensor`] sees a pipelined message as a
//! [`Error::CountMismatch`] (nothing is received). Every part's size is checked as it
//! arrives ([`Error::CountMismatch`] naming the part; nothing more is copied to the device);
//! a part longer than expected is MPI's truncation error. One ambiguity remains: a single
//! message exactly one part long, sent to a receive tensor larger than one part, is taken
//! for the first part of a pipelined message — sizes must agree, as for any MPI receive.
//! Collectives are staged whole; operands only the root uses are ignored at other ranks.
//! A device copy that fails after some parts of a pipelined send went out returns the error
//! to the sender, and the receiver keeps waiting for the missing parts (a CUDA failure in
//! the middle of a message cannot be announced to the peer without a protocol of its own).
//!
//! **Direct exceptions.** Strided device tensors are staged even when MPI is CUDA-aware
//! (derived datatypes over device memory are packed element by element by Open MPI's and
//! MPICH's CUDA paths, and are where CUDA-aware stacks have had bugs); float16/bfloat16
//! reductions are staged because their MPI operation is a host function (`halfops`)
//! that cannot read device memory. `DeviceComm` offers no nonblocking collectives, so Open
//! MPI's unreliable nonblocking reductions on device memory are never reached.

use std::ffi::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;

use mpi::point_to_point::Status;
use mpi::raw::AsRaw;
use mpi::topology::{Communicator, Rank};
use mpi::traits::*;
use mpi::Tag;

use super::{cuda_awareness, CudaAwareness};
use crate::comm::{check_rank, check_tag, TensorComm};
use crate::device::{Device, MemoryKind};
use crate::dlpack::{DLTensor, Tensor, TensorView};
use crate::dtype::{DType, ElementType, ReduceOp};
use crate::error::{Error, Result};
use crate::halfops;
use crate::runtime::DeviceRuntime;
use crate::spec::{RecvSpec, SendSpec};

/// Default part size of pipelined staged point-to-point messages, in bytes.
pub const DEFAULT_PIPELINE_CHUNK_BYTES: usize = 4 << 20;
/// Largest part size accepted (so that a part's count always fits MPI's `int`).
pub const MAX_PIPELINE_CHUNK_BYTES: usize = 1 << 30;
const MIN_PINNED_BYTES: usize = 64 << 10;
/// Pinned bytes a `DeviceComm` keeps for reuse; buffers beyond are freed when released.
pub const MAX_POOLED_BYTES: usize = 1 << 30;

/// How device memory reaches MPI, as asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// `Direct` when the MPI library is CUDA-aware ([`cuda_awareness`]), else `Staged`.
    #[default]
    Auto,
    /// Device pointers go to MPI (a CUDA-aware MPI is required).
    Direct,
    /// Device memory is copied through pinned host buffers.
    Staged,
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Transport::Auto => "auto",
            Transport::Direct => "direct",
            Transport::Staged => "staged",
        })
    }
}

/// How one tensor of an operation reached MPI.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Route {
    /// Host memory (pageable or pinned): the tensor itself.
    Host = 1,
    /// CUDA managed memory, handed to MPI as host-accessible memory.
    Managed = 2,
    /// A device pointer handed to a CUDA-aware MPI.
    Direct = 3,
    /// Copied through a pinned host buffer.
    Staged = 4,
}

impl Route {
    fn from_u8(v: u8) -> Option<Route> {
        Some(match v {
            1 => Route::Host,
            2 => Route::Managed,
            3 => Route::Direct,
            4 => Route::Staged,
            _ => return None,
        })
    }
}

impl std::fmt::Display for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Route::Host => "host",
            Route::Managed => "managed",
            Route::Direct => "direct",
            Route::Staged => "staged",
        })
    }
}

/// Reused pinned host buffers (addresses kept as integers: the pool hands each out to one
/// user at a time).
struct PinnedPool<'r> {
    runtime: Option<&'r dyn DeviceRuntime>,
    free: Mutex<Vec<(usize, usize)>>,
}

impl<'r> PinnedPool<'r> {
    fn take(&self, bytes: usize) -> Result<PinnedBuf<'_, 'r>> {
        let runtime = self.runtime.ok_or_else(no_runtime_error)?;
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let best = free
            .iter()
            .enumerate()
            .filter(|(_, (_, cap))| *cap >= bytes)
            .min_by_key(|(_, (_, cap))| *cap)
            .map(|(i, _)| i);
        let (addr, cap) = match best {
            Some(i) => free.swap_remove(i),
            None => {
                drop(free);
                let cap = bytes
                    .checked_next_power_of_two()
                    .unwrap_or(bytes)
                    .max(MIN_PINNED_BYTES);
                (runtime.alloc_pinned(cap)?.as_ptr() as usize, cap)
            }
        };
        Ok(PinnedBuf {
            pool: self,
            addr,
            cap,
        })
    }
}

impl Drop for PinnedPool<'_> {
    fn drop(&mut self) {
        let Some(runtime) = self.runtime else { return };
        let free = std::mem::take(self.free.get_mut().unwrap_or_else(|p| p.into_inner()));
        for (addr, cap) in free {
            if let Some(p) = NonNull::new(addr as *mut u8) {
                // SAFETY: every pooled buffer came from this runtime's alloc_pinned(cap)
                // and is in the free list exactly once (no PinnedBuf can outlive the pool).
                unsafe { runtime.free_pinned(p, cap) };
            }
        }
    }
}

struct PinnedBuf<'p, 'r> {
    pool: &'p PinnedPool<'r>,
    addr: usize,
    cap: usize,
}

impl PinnedBuf<'_, '_> {
    fn ptr(&self) -> *mut u8 {
        self.addr as *mut u8
    }
}

impl Drop for PinnedBuf<'_, '_> {
    fn drop(&mut self) {
        let mut free = self.pool.free.lock().unwrap_or_else(|p| p.into_inner());
        let pooled: usize = free.iter().map(|(_, cap)| cap).sum();
        if pooled + self.cap <= MAX_POOLED_BYTES {
            free.push((self.addr, self.cap));
            return;
        }
        drop(free);
        if let (Some(rt), Some(p)) = (self.pool.runtime, NonNull::new(self.ptr())) {
            // SAFETY: allocated by this runtime's alloc_pinned(cap); no longer in use (the
            // buffer is being dropped) and not in the free list.
            unsafe { rt.free_pinned(p, self.cap) };
        }
    }
}

const NO_RUNTIME: &str =
    "CUDA memory needs a GPU runtime: build with feature `cuda` on a machine with the CUDA driver";

fn no_runtime_error() -> Error {
    Error::UnsupportedDevice {
        device_type: crate::device::device_type::CUDA,
        device_id: 0,
        reason: NO_RUNTIME,
    }
}

/// What an operation does with a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// MPI reads it.
    Read,
    /// MPI writes it (every element).
    Write,
    /// MPI reads and writes it (in-place reductions, broadcast at any rank).
    ReadWrite,
}

/// A validated tensor with its route decided; nothing allocated or copied yet.
struct Plan {
    route: Route,
    device: Device,
    /// The tensor's `DLTensor` relabelled as host memory (same data pointer).
    dl: Box<DLTensor>,
    /// Address of the first element, and the span `[start, start + span)` it touches.
    first: usize,
    start: usize,
    span: usize,
    contiguous: bool,
    len_elems: i64,
    element: ElementType,
}

/// A tensor's host-side stand-in for one operation.
struct Stage<'p, 'r> {
    plan: Option<Plan>,
    buf: Option<PinnedBuf<'p, 'r>>,
    runtime: Option<&'r dyn DeviceRuntime>,
}

enum HostRef<'a> {
    Orig(&'a dyn Tensor),
    View(TensorView<'a>),
}

impl HostRef<'_> {
    fn get(&self) -> &dyn Tensor {
        match self {
            HostRef::Orig(t) => *t,
            HostRef::View(v) => v,
        }
    }
}

enum HostMut<'a> {
    Orig(&'a mut (dyn Tensor + 'a)),
    View(TensorView<'a>),
}

impl<'a> HostMut<'a> {
    fn get(&mut self) -> &mut (dyn Tensor + 'a) {
        match self {
            HostMut::Orig(t) => &mut **t,
            HostMut::View(v) => v,
        }
    }
}

impl<'p, 'r> Stage<'p, 'r> {
    fn host() -> Self {
        Stage {
            plan: None,
            buf: None,
            runtime: None,
        }
    }

    fn route(&self) -> Route {
        self.plan.as_ref().map_or(Route::Host, |p| p.route)
    }

    /// The relabelled `DLTensor` as a view (host memory: the pinned copy, or the same
    /// pointer for direct and managed routes).
    fn dl_view<'s>(&'s self) -> Result<Option<TensorView<'s>>> {
        let Some(plan) = &self.plan else {
            return Ok(None);
        };
        let dl: *const DLTensor = &*plan.dl;
        // SAFETY: the DLTensor lives in the Box for as long as `self`; its shape and strides
        // point into the caller's tensor, which outlives the operation; its data is the
        // pinned buffer (owned by `self`) or the caller's memory. The view never writes the
        // DLTensor struct itself.
        unsafe { TensorView::from_raw(dl.cast_mut()) }.map(Some)
    }

    fn view<'a>(&'a self, orig: &'a dyn Tensor) -> Result<HostRef<'a>> {
        Ok(match self.dl_view()? {
            Some(v) => HostRef::View(v),
            None => HostRef::Orig(orig),
        })
    }

    fn view_mut<'a>(&'a self, orig: &'a mut (dyn Tensor + 'a)) -> Result<HostMut<'a>> {
        Ok(match self.dl_view()? {
            Some(v) => HostMut::View(v),
            None => HostMut::Orig(orig),
        })
    }

    /// After MPI wrote the host copy: copies it back to the device.
    fn finish(&self) -> Result<()> {
        if let (Some(plan), Some(buf), Some(rt)) = (&self.plan, &self.buf, self.runtime) {
            // SAFETY: the span is device memory of plan.device (checked by check_pointer
            // and the layout arithmetic); the buffer holds at least `span` bytes.
            unsafe {
                rt.copy_to_device(plan.device, plan.start as *mut c_void, buf.ptr(), plan.span)
            }?;
        }
        Ok(())
    }
}

/// Tensor operations for tensors on any device: [`TensorComm`]'s operations, with each
/// tensor routed as the [module docs](self) say. Host tensors pass straight through.
///
/// Method names and arguments are [`TensorComm`]'s; the errors are theirs plus
/// [`Error::UnsupportedDevice`] (ROCm, no GPU runtime), [`Error::DeviceMismatch`] (the
/// pointer is not memory of the labelled device), [`Error::ReadOnly`]/[`Error::IsCopied`]
/// for receive tensors, and [`Error::Cuda`] from copies — all before any MPI call, except
/// a copy back to the device after a receive.
pub struct DeviceComm<'c, C: Communicator + ?Sized> {
    comm: &'c C,
    runtime: Option<&'c dyn DeviceRuntime>,
    direct: bool,
    awareness: Option<CudaAwareness>,
    pool: PinnedPool<'c>,
    chunk_bytes: usize,
    last_route: AtomicU8,
}

impl<C: Communicator + ?Sized> std::fmt::Debug for DeviceComm<'_, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceComm")
            .field("direct", &self.direct)
            .field("awareness", &self.awareness)
            .field("chunk_bytes", &self.chunk_bytes)
            .finish_non_exhaustive()
    }
}

impl<'c, C: Communicator + ?Sized> DeviceComm<'c, C> {
    /// A device-aware view of `comm`. `runtime` is the GPU runtime (usually
    /// [`super::default_runtime`]; `None` handles host tensors only). `transport` decides
    /// whether CUDA tensors go direct: `Auto` asks [`cuda_awareness`] (call after
    /// `MPI_Init` and after the runtime made a CUDA context).
    ///
    /// # Errors
    /// [`Error::TransportUnavailable`] for `Direct` when MPI is not CUDA-aware (handing it
    /// device pointers would crash) or there is no runtime; [`Error::InvalidSetting`] from
    /// `DLPACK_MPI_CUDA_AWARE`.
    pub fn new(
        comm: &'c C,
        runtime: Option<&'c dyn DeviceRuntime>,
        transport: Transport,
    ) -> Result<Self> {
        let (direct, awareness) = match transport {
            Transport::Staged => (false, None),
            Transport::Auto => {
                let a = cuda_awareness()?;
                (a.aware && runtime.is_some(), Some(a))
            }
            Transport::Direct => {
                if runtime.is_none() {
                    return Err(Error::TransportUnavailable {
                        transport: "direct",
                        reason: "there is no GPU runtime".into(),
                    });
                }
                let a = cuda_awareness()?;
                if !a.aware {
                    return Err(Error::TransportUnavailable {
                        transport: "direct",
                        reason: format!(
                            "MPI is not CUDA-aware (the answer: {a}); use the staged \
                             transport, or set {}=1 if this MPI is CUDA-aware",
                            super::CUDA_AWARE_ENV
                        ),
                    });
                }
                (true, Some(a))
            }
        };
        Ok(DeviceComm {
            comm,
            runtime,
            direct,
            awareness,
            pool: PinnedPool {
                runtime,
                free: Mutex::new(Vec::new()),
            },
            chunk_bytes: DEFAULT_PIPELINE_CHUNK_BYTES,
            last_route: AtomicU8::new(0),
        })
    }

    /// Sets the part size of pipelined staged point-to-point messages (bytes; `None` or
    /// `Some(0)`: no pipelining, one message each). Values above
    /// [`MAX_PIPELINE_CHUNK_BYTES`] are lowered to it. Both ends must agree.
    pub fn with_pipeline_chunk(mut self, bytes: Option<usize>) -> Self {
        self.chunk_bytes = bytes.unwrap_or(0).min(MAX_PIPELINE_CHUNK_BYTES);
        self
    }

    /// The part size of pipelined messages in bytes (0: off).
    pub fn pipeline_chunk_bytes(&self) -> usize {
        self.chunk_bytes
    }

    /// Whether contiguous CUDA tensors go to MPI as device pointers.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// The CUDA-awareness answer `Transport::Auto`/`Direct` was decided from.
    pub fn awareness(&self) -> Option<CudaAwareness> {
        self.awareness
    }

    /// The underlying communicator.
    pub fn comm(&self) -> &'c C {
        self.comm
    }

    /// The most telling route the last operation used (staged over direct over managed over
    /// host); `None` before the first operation.
    pub fn last_route(&self) -> Option<Route> {
        Route::from_u8(self.last_route.load(Ordering::Relaxed))
    }

    fn note(&self, stages: &[&Stage<'_, '_>]) {
        let worst = stages
            .iter()
            .map(|s| s.route())
            .max()
            .unwrap_or(Route::Host);
        self.last_route.store(worst as u8, Ordering::Relaxed);
    }

    /// Validates `t`, decides its route, and checks its pointer with the runtime.
    fn plan(&self, t: &dyn Tensor, reduce: Option<DType>, access: Access) -> Result<Option<Plan>> {
        let device = t.device();
        let kind = device.memory_kind();
        match kind {
            MemoryKind::Host | MemoryKind::PinnedHost => return Ok(None),
            MemoryKind::Cuda | MemoryKind::CudaManaged => {}
            _ => {
                device.check_host_accessible()?;
                return Ok(None);
            }
        }
        let writes = access != Access::Read;
        if writes && t.is_read_only() {
            return Err(Error::ReadOnly);
        }
        if writes && t.is_copied() {
            return Err(Error::IsCopied);
        }
        let Some(runtime) = self.runtime else {
            return Err(Error::UnsupportedDevice {
                device_type: device.device_type,
                device_id: device.device_id,
                reason: NO_RUNTIME,
            });
        };
        let mut dl = Box::new(*t.dl_tensor());
        dl.device = Device::CPU.into();
        let dl_ptr: *mut DLTensor = &mut *dl;
        // SAFETY: `dl` is a copy of a validated DLTensor whose arrays live as long as `t`;
        // the views below only do layout arithmetic (no access to the device memory).
        let (start, end, contiguous, len_elems, element) = unsafe {
            let view = TensorView::from_raw(dl_ptr)?;
            let spec = SendSpec::new(&view)?;
            let (start, end) = spec.byte_range();
            let facts = (
                start,
                end,
                spec.is_contiguous(),
                spec.len_elems(),
                spec.element_type(),
            );
            if writes {
                let mut w = TensorView::from_raw(dl_ptr)?;
                RecvSpec::new(&mut w)?;
            }
            facts
        };
        let first = t.first_element_ptr() as usize;
        let user_op = reduce.is_some_and(halfops::is_half);
        let route = if kind == MemoryKind::CudaManaged {
            Route::Managed
        } else if self.direct && contiguous && !user_op {
            Route::Direct
        } else {
            Route::Staged
        };
        if len_elems > 0 {
            // Empty tensors (C65) make no runtime call: their pointer may be NULL.
            runtime.check_pointer(device, first as *const c_void)?;
        }
        Ok(Some(Plan {
            route,
            device,
            dl,
            first,
            start,
            span: end.saturating_sub(start),
            contiguous,
            len_elems,
            element,
        }))
    }

    /// Plans and stages `t`: for the staged route, a pinned copy of its span (read from
    /// the device when MPI reads it or when the span has gaps).
    fn stage(
        &self,
        t: &dyn Tensor,
        reduce: Option<DType>,
        access: Access,
    ) -> Result<Stage<'_, 'c>> {
        let Some(plan) = self.plan(t, reduce, access)? else {
            return Ok(Stage::host());
        };
        self.stage_plan(plan, access)
    }

    fn stage_plan(&self, mut plan: Plan, access: Access) -> Result<Stage<'_, 'c>> {
        if plan.route != Route::Staged || plan.len_elems == 0 {
            return Ok(Stage {
                plan: Some(plan),
                buf: None,
                runtime: None,
            });
        }
        let runtime = self.runtime.ok_or_else(no_runtime_error)?;
        let buf = self.pool.take(plan.span)?;
        let dense = plan.span as u128 == plan.len_elems as u128 * plan.element.size_bytes() as u128;
        if access != Access::Write || !dense {
            // SAFETY: the span is the device memory the tensor's elements occupy (layout
            // arithmetic, pointer checked); the buffer holds at least `span` bytes.
            unsafe {
                runtime.copy_to_host(
                    plan.device,
                    buf.ptr(),
                    plan.start as *const c_void,
                    plan.span,
                )
            }?;
        }
        plan.dl.data = buf.ptr().wrapping_add(plan.first - plan.start).cast();
        plan.dl.byte_offset = 0;
        let writes = access != Access::Read;
        Ok(Stage {
            plan: Some(plan),
            buf: Some(buf),
            runtime: writes.then_some(runtime),
        })
    }

    fn stage_planned(&self, plan: Option<Plan>, access: Access) -> Result<Stage<'_, 'c>> {
        match plan {
            Some(p) => self.stage_plan(p, access),
            None => Ok(Stage::host()),
        }
    }

    /// Plans a send and a receive tensor, then stages both: every refusal comes before any
    /// copy.
    fn stage_pair(
        &self,
        send: &dyn Tensor,
        recv: &dyn Tensor,
        reduce: Option<DType>,
        recv_access: Access,
    ) -> Result<(Stage<'_, 'c>, Stage<'_, 'c>)> {
        let ps = self.plan(send, reduce, Access::Read)?;
        let pr = self.plan(recv, reduce, recv_access)?;
        if let (Some(a), Some(b)) = (&ps, &pr) {
            // Staging would hide an overlap that TensorComm refuses on host memory.
            let (a1, b1) = (a.start + a.span, b.start + b.span);
            if a.span > 0 && b.span > 0 && a.start < b1 && b.start < a1 {
                return Err(Error::BuffersAlias {
                    send_address: a.start,
                    send_bytes: a.span,
                    recv_address: b.start,
                    recv_bytes: b.span,
                });
            }
        }
        Ok((
            self.stage_planned(ps, Access::Read)?,
            self.stage_planned(pr, recv_access)?,
        ))
    }

    // ----- point-to-point -------------------------------------------------------------

    /// [`TensorComm::send_tensor`] for a tensor on any device; a staged contiguous tensor
    /// above the pipeline part size goes out in parts (module docs).
    ///
    /// # Errors
    /// As [`TensorComm::send_tensor`] and the [type docs](DeviceComm).
    pub fn send_tensor(&self, tensor: &dyn Tensor, dest: Rank, tag: Tag) -> Result<()> {
        check_rank(dest, self.comm.target_size())?;
        check_tag(tag)?;
        let plan = self.plan(tensor, None, Access::Read)?;
        if let Some(p) = plan.as_ref().filter(|p| self.pipelines(p)) {
            self.last_route
                .store(Route::Staged as u8, Ordering::Relaxed);
            return self.send_parts(p, dest, tag);
        }
        let stage = match plan {
            Some(p) => self.stage_plan(p, Access::Read)?,
            None => Stage::host(),
        };
        self.note(&[&stage]);
        self.comm.send_tensor(stage.view(tensor)?.get(), dest, tag)
    }

    /// [`TensorComm::recv_tensor`] for a tensor on any device. The incoming message is
    /// probed: one message of the tensor's size, or (for a contiguous tensor larger than
    /// one part) the first part of a pipelined send. For a pipelined message the returned
    /// status is its first part's (source and tag are the message's).
    ///
    /// # Errors
    /// As [`TensorComm::recv_tensor`] and the [type docs](DeviceComm).
    pub fn recv_tensor(&self, tensor: &mut dyn Tensor, source: Rank, tag: Tag) -> Result<Status> {
        check_rank(source, self.comm.target_size())?;
        check_tag(tag)?;
        let plan = self.plan(&*tensor, None, Access::Write)?;
        // Could a pipelined message be meant for this tensor? Only one larger than a part.
        let candidate = match &plan {
            Some(p) => Some((p.contiguous, p.span, p.element)),
            // Host memory: the receive checks (READ_ONLY, IS_COPIED, overlap) happen here,
            // because a pipelined message is received without TensorComm; a small tensor
            // (the per-message common case) skips this and gets them from TensorComm.
            None if self.chunk_bytes > 0
                && tensor.dtype().size_bytes().is_some_and(|b| {
                    b as u128 * tensor.num_elements() as u128 > self.chunk_bytes as u128
                }) =>
            {
                let r = RecvSpec::new(&mut *tensor)?;
                Some((
                    r.is_contiguous(),
                    r.len_elems() as usize * r.element_type().size_bytes(),
                    r.element_type(),
                ))
            }
            None => None,
        };
        if let Some((true, bytes, element)) =
            candidate.filter(|&(_, bytes, _)| self.chunk_bytes > 0 && bytes > self.chunk_bytes)
        {
            let status = self.comm.process_at_rank(source).probe_with_tag(tag);
            let part_elems = self.part_elems(element.size_bytes());
            let part_units = part_elems * element.units_per_element();
            if status.count(element.row.unit.datatype()) as i64 == part_units as i64 {
                let total = bytes / element.size_bytes();
                return self.recv_parts(plan, tensor, total, element, tag, status);
            }
        }
        let stage = match plan {
            Some(p) => self.stage_plan(p, Access::Write)?,
            None => Stage::host(),
        };
        self.note(&[&stage]);
        let status = self
            .comm
            .recv_tensor(stage.view_mut(tensor)?.get(), source, tag)?;
        stage.finish()?;
        Ok(status)
    }

    /// [`TensorComm::sendrecv_tensor`] for tensors on any device (staged whole, never
    /// pipelined: both directions are one message each).
    ///
    /// # Errors
    /// As [`TensorComm::sendrecv_tensor`] and the [type docs](DeviceComm).
    #[allow(clippy::too_many_arguments)]
    pub fn sendrecv_tensor(
        &self,
        send: &dyn Tensor,
        dest: Rank,
        send_tag: Tag,
        recv: &mut dyn Tensor,
        source: Rank,
        recv_tag: Tag,
    ) -> Result<Status> {
        let (s, r) = self.stage_pair(send, &*recv, None, Access::Write)?;
        self.note(&[&s, &r]);
        let status = self.comm.sendrecv_tensor(
            s.view(send)?.get(),
            dest,
            send_tag,
            r.view_mut(recv)?.get(),
            source,
            recv_tag,
        )?;
        r.finish()?;
        Ok(status)
    }

    fn pipelines(&self, p: &Plan) -> bool {
        p.route == Route::Staged
            && p.contiguous
            && self.chunk_bytes > 0
            && p.span > self.chunk_bytes
    }

    fn part_elems(&self, elem_bytes: usize) -> usize {
        (self.chunk_bytes / elem_bytes.max(1)).max(1)
    }

    /// Pipelined staged send: copy part k+1 while part k is in flight.
    fn send_parts(&self, p: &Plan, dest: Rank, tag: Tag) -> Result<()> {
        let runtime = self.runtime.ok_or_else(no_runtime_error)?;
        let elem = p.element.size_bytes();
        let part = self.part_elems(elem);
        let bufs = [self.pool.take(part * elem)?, self.pool.take(part * elem)?];
        let datatype = p.element.row.unit.datatype().as_raw();
        let upe = p.element.units_per_element();
        let total = p.len_elems as usize;
        let mut reqs: [Option<mpi::ffi::MPI_Request>; 2] = [None, None];
        let mut result = Ok(());
        let mut k = 0;
        while k * part < total {
            let i = k % 2;
            wait(&mut reqs[i]);
            let n = part.min(total - k * part);
            // SAFETY: part k of the contiguous device span; the buffer holds part × elem
            // bytes and no request uses it (waited above).
            let copied = unsafe {
                runtime.copy_to_host(
                    p.device,
                    bufs[i].ptr(),
                    (p.first + k * part * elem) as *const c_void,
                    n * elem,
                )
            };
            if let Err(e) = copied {
                result = Err(e);
                break;
            }
            let mut req = std::mem::MaybeUninit::<mpi::ffi::MPI_Request>::uninit();
            // SAFETY: the buffer holds n elements (n × upe units ≤ MAX_PIPELINE_CHUNK_BYTES,
            // which fits `int`) and stays untouched until the request is waited for below.
            unsafe {
                mpi::ffi::MPI_Isend(
                    bufs[i].ptr().cast(),
                    (n * upe) as c_int,
                    datatype,
                    dest,
                    tag,
                    self.comm.as_raw(),
                    req.as_mut_ptr(),
                );
                reqs[i] = Some(req.assume_init());
            }
            k += 1;
        }
        for r in &mut reqs {
            wait(r);
        }
        result
    }

    /// Pipelined receive: part k+1 is posted before part k is copied to the device.
    #[allow(clippy::too_many_arguments)]
    fn recv_parts(
        &self,
        plan: Option<Plan>,
        tensor: &mut dyn Tensor,
        total: usize,
        element: ElementType,
        tag: Tag,
        first_status: Status,
    ) -> Result<Status> {
        // Fix the sender: parts from another source must not interleave.
        let source = first_status.source_rank();
        let elem = element.size_bytes();
        let part = self.part_elems(elem);
        let upe = element.units_per_element();
        let datatype = element.row.unit.datatype().as_raw();
        let parts = total.div_ceil(part);
        let staged = plan.as_ref().is_some_and(|p| p.route == Route::Staged);
        // Where part k lands: straight into the tensor, or into pinned buffer k % 2.
        let base = match &plan {
            Some(p) => p.first,
            None => tensor.first_element_ptr() as usize,
        };
        let runtime = self.runtime;
        let bufs = if staged {
            Some([self.pool.take(part * elem)?, self.pool.take(part * elem)?])
        } else {
            None
        };
        self.last_route.store(
            plan.as_ref().map_or(Route::Host, |p| p.route) as u8,
            Ordering::Relaxed,
        );
        let target = |k: usize| -> *mut u8 {
            match &bufs {
                Some(b) => b[k % 2].ptr(),
                None => (base + k * part * elem) as *mut u8,
            }
        };
        let post = |k: usize| -> mpi::ffi::MPI_Request {
            let n = part.min(total - k * part);
            let mut req = std::mem::MaybeUninit::<mpi::ffi::MPI_Request>::uninit();
            // SAFETY: the target holds n elements (pinned part buffer, or part k of the
            // contiguous receive tensor, checked writable by `plan`/`SendSpec`); it is not
            // read until the request completes.
            unsafe {
                mpi::ffi::MPI_Irecv(
                    target(k).cast(),
                    (n * upe) as c_int,
                    datatype,
                    source,
                    tag,
                    self.comm.as_raw(),
                    req.as_mut_ptr(),
                );
                req.assume_init()
            }
        };
        let mut reqs: [Option<mpi::ffi::MPI_Request>; 2] = [Some(post(0)), None];
        let mut result = Ok(());
        for k in 0..parts {
            let i = k % 2;
            let n = part.min(total - k * part);
            let arrived = wait_count(&mut reqs[i], datatype);
            if result.is_ok() && arrived != Some((n * upe) as i64) {
                // A part of another size: the sender's tensor differs from this one.
                result = Err(Error::CountMismatch {
                    what: format!("pipelined receive, part {k} of {parts}"),
                    expected: n as i64,
                    actual: arrived.map_or(-1, |u| u / upe as i64),
                });
            }
            if k + 1 < parts && result.is_ok() {
                reqs[(k + 1) % 2] = Some(post(k + 1));
            }
            if let (Some(b), Some(p), Some(rt), true) = (&bufs, &plan, runtime, result.is_ok()) {
                let n = part.min(total - k * part);
                // SAFETY: part k of the contiguous device span; buffer i holds it and no
                // request writes buffer i now (part k+1 went to the other one).
                result = unsafe {
                    rt.copy_to_device(
                        p.device,
                        (p.first + k * part * elem) as *mut c_void,
                        b[i].ptr(),
                        n * elem,
                    )
                };
            }
        }
        for r in &mut reqs {
            wait(r);
        }
        result.map(|()| first_status)
    }

    // ----- collectives ------------------------------------------------------------------

    /// [`TensorComm::broadcast_tensor`] for a tensor on any device.
    ///
    /// # Errors
    /// As [`TensorComm::broadcast_tensor`] and the [type docs](DeviceComm).
    pub fn broadcast_tensor(&self, tensor: &mut dyn Tensor, root: Rank) -> Result<()> {
        let is_root = self.comm.rank() == root;
        let access = if is_root { Access::Read } else { Access::Write };
        let s = self.stage(&*tensor, None, access)?;
        self.note(&[&s]);
        self.comm
            .broadcast_tensor(s.view_mut(tensor)?.get(), root)?;
        s.finish()
    }

    /// [`TensorComm::reduce_tensor`] for tensors on any device.
    ///
    /// # Errors
    /// As [`TensorComm::reduce_tensor`] and the [type docs](DeviceComm).
    pub fn reduce_tensor(
        &self,
        send: &dyn Tensor,
        recv: Option<&mut dyn Tensor>,
        op: ReduceOp,
        root: Rank,
    ) -> Result<()> {
        // Only the root uses it (TensorComm ignores it elsewhere): never stage it, copy it
        // back, or refuse it at other ranks, where the root is already in the collective.
        let recv = if self.comm.rank() == root { recv } else { None };
        let dt = Some(send.dtype());
        match recv {
            Some(recv) => {
                let (s, r) = self.stage_pair(send, &*recv, dt, Access::Write)?;
                self.note(&[&s, &r]);
                self.comm.reduce_tensor(
                    s.view(send)?.get(),
                    Some(r.view_mut(recv)?.get()),
                    op,
                    root,
                )?;
                r.finish()
            }
            None => {
                let s = self.stage(send, dt, Access::Read)?;
                self.note(&[&s]);
                self.comm.reduce_tensor(s.view(send)?.get(), None, op, root)
            }
        }
    }

    /// [`TensorComm::all_reduce_tensor`] for tensors on any device.
    ///
    /// # Errors
    /// As [`TensorComm::all_reduce_tensor`] and the [type docs](DeviceComm).
    pub fn all_reduce_tensor(
        &self,
        send: &dyn Tensor,
        recv: &mut dyn Tensor,
        op: ReduceOp,
    ) -> Result<()> {
        let dt = Some(send.dtype());
        let (s, r) = self.stage_pair(send, &*recv, dt, Access::Write)?;
        self.note(&[&s, &r]);
        self.comm
            .all_reduce_tensor(s.view(send)?.get(), r.view_mut(recv)?.get(), op)?;
        r.finish()
    }

    /// [`TensorComm::all_reduce_tensor_in_place`] for a tensor on any device.
    ///
    /// # Errors
    /// As [`TensorComm::all_reduce_tensor_in_place`] and the [type docs](DeviceComm).
    pub fn all_reduce_tensor_in_place(&self, tensor: &mut dyn Tensor, op: ReduceOp) -> Result<()> {
        let s = self.stage(&*tensor, Some(tensor.dtype()), Access::ReadWrite)?;
        self.note(&[&s]);
        self.comm
            .all_reduce_tensor_in_place(s.view_mut(tensor)?.get(), op)?;
        s.finish()
    }

    /// [`TensorComm::reduce_scatter_block_tensor`] for tensors on any device.
    ///
    /// # Errors
    /// As [`TensorComm::reduce_scatter_block_tensor`] and the [type docs](DeviceComm).
    pub fn reduce_scatter_block_tensor(
        &self,
        send: &dyn Tensor,
        recv: &mut dyn Tensor,
        op: ReduceOp,
    ) -> Result<()> {
        let dt = Some(send.dtype());
        let (s, r) = self.stage_pair(send, &*recv, dt, Access::Write)?;
        self.note(&[&s, &r]);
        self.comm
            .reduce_scatter_block_tensor(s.view(send)?.get(), r.view_mut(recv)?.get(), op)?;
        r.finish()
    }

    /// [`TensorComm::gather_tensor`] for tensors on any device.
    ///
    /// # Errors
    /// As [`TensorComm::gather_tensor`] and the [type docs](DeviceComm).
    pub fn gather_tensor(
        &self,
        send: &dyn Tensor,
        recv: Option<&mut dyn Tensor>,
        root: Rank,
    ) -> Result<()> {
        // Only the root uses it (TensorComm ignores it elsewhere): never stage it, copy it
        // back, or refuse it at other ranks, where the root is already in the collective.
        let recv = if self.comm.rank() == root { recv } else { None };
        match recv {
            Some(recv) => {
                let (s, r) = self.stage_pair(send, &*recv, None, Access::Write)?;
                self.note(&[&s, &r]);
                self.comm.gather_tensor(
                    s.view(send)?.get(),
                    Some(r.view_mut(recv)?.get()),
                    root,
                )?;
                r.finish()
            }
            None => {
                let s = self.stage(send, None, Access::Read)?;
                self.note(&[&s]);
                self.comm.gather_tensor(s.view(send)?.get(), None, root)
            }
        }
    }

    /// [`TensorComm::gatherv_tensor`] for tensors on any device.
    ///
    /// # Errors
    /// As [`TensorComm::gatherv_tensor`] and the [type docs](DeviceComm).
    pub fn gatherv_tensor(
        &self,
        send: &dyn Tensor,
        recv: Option<(&mut dyn Tensor, &[i64], &[i64])>,
        root: Rank,
    ) -> Result<()> {
        // Only the root uses it (TensorComm ignores it elsewhere): never stage it, copy it
        // back, or refuse it at other ranks, where the root is already in the collective.
        let recv = if self.comm.rank() == root { recv } else { None };
        match recv {
            Some((recv, counts, displs)) => {
                // A varying receive may leave gaps: read the span first (ReadWrite).
                let (s, r) = self.stage_pair(send, &*recv, None, Access::ReadWrite)?;
                self.note(&[&s, &r]);
                self.comm.gatherv_tensor(
                    s.view(send)?.get(),
                    Some((r.view_mut(recv)?.get(), counts, displs)),
                    root,
                )?;
                r.finish()
            }
            None => {
                let s = self.stage(send, None, Access::Read)?;
                self.note(&[&s]);
                self.comm.gatherv_tensor(s.view(send)?.get(), None, root)
            }
        }
    }

    /// [`TensorComm::scatter_tensor`] for tensors on any device.
    ///
    /// # Errors
    /// As [`TensorComm::scatter_tensor`] and the [type docs](DeviceComm).
    pub fn scatter_tensor(
        &self,
        send: Option<&dyn Tensor>,
        recv: &mut dyn Tensor,
        root: Rank,
    ) -> Result<()> {
        // Only the root uses it (TensorComm ignores it elsewhere): never stage it, copy it
        // back, or refuse it at other ranks, where the root is already in the collective.
        let send = if self.comm.rank() == root { send } else { None };
        let ps = match send {
            Some(t) => self.plan(t, None, Access::Read)?,
            None => None,
        };
        let pr = self.plan(&*recv, None, Access::Write)?;
        let s = self.stage_planned(ps, Access::Read)?;
        let r = self.stage_planned(pr, Access::Write)?;
        self.note(&[&s, &r]);
        let sv = match send {
            Some(t) => Some(s.view(t)?),
            None => None,
        };
        self.comm
            .scatter_tensor(sv.as_ref().map(HostRef::get), r.view_mut(recv)?.get(), root)?;
        r.finish()
    }

    /// [`TensorComm::scatterv_tensor`] for tensors on any device.
    ///
    /// # Errors
    /// As [`TensorComm::scatterv_tensor`] and the [type docs](DeviceComm).
    pub fn scatterv_tensor(
        &self,
        send: Option<(&dyn Tensor, &[i64], &[i64])>,
        recv: &mut dyn Tensor,
        root: Rank,
    ) -> Result<()> {
        // Only the root uses it (TensorComm ignores it elsewhere): never stage it, copy it
        // back, or refuse it at other ranks, where the root is already in the collective.
        let send = if self.comm.rank() == root { send } else { None };
        let ps = match send {
            Some((t, _, _)) => self.plan(t, None, Access::Read)?,
            None => None,
        };
        // A block shorter than the tensor leaves its tail untouched: read the span first.
        let pr = self.plan(&*recv, None, Access::ReadWrite)?;
        let s = self.stage_planned(ps, Access::Read)?;
        let r = self.stage_planned(pr, Access::ReadWrite)?;
        self.note(&[&s, &r]);
        let sv = match send {
            Some((t, c, d)) => Some((s.view(t)?, c, d)),
            None => None,
        };
        self.comm.scatterv_tensor(
            sv.as_ref().map(|(v, c, d)| (v.get(), *c, *d)),
            r.view_mut(recv)?.get(),
            root,
        )?;
        r.finish()
    }

    /// [`TensorComm::all_gather_tensor`] for tensors on any device.
    ///
    /// # Errors
    /// As [`TensorComm::all_gather_tensor`] and the [type docs](DeviceComm).
    pub fn all_gather_tensor(&self, send: &dyn Tensor, recv: &mut dyn Tensor) -> Result<()> {
        let (s, r) = self.stage_pair(send, &*recv, None, Access::Write)?;
        self.note(&[&s, &r]);
        self.comm
            .all_gather_tensor(s.view(send)?.get(), r.view_mut(recv)?.get())?;
        r.finish()
    }

    /// [`TensorComm::all_gatherv_tensor`] for tensors on any device.
    ///
    /// # Errors
    /// As [`TensorComm::all_gatherv_tensor`] and the [type docs](DeviceComm).
    pub fn all_gatherv_tensor(
        &self,
        send: &dyn Tensor,
        recv: &mut dyn Tensor,
        counts: &[i64],
        displacements: &[i64],
    ) -> Result<()> {
        let (s, r) = self.stage_pair(send, &*recv, None, Access::ReadWrite)?;
        self.note(&[&s, &r]);
        self.comm.all_gatherv_tensor(
            s.view(send)?.get(),
            r.view_mut(recv)?.get(),
            counts,
            displacements,
        )?;
        r.finish()
    }

    /// [`TensorComm::all_to_all_tensor`] for tensors on any device.
    ///
    /// # Errors
    /// As [`TensorComm::all_to_all_tensor`] and the [type docs](DeviceComm).
    pub fn all_to_all_tensor(&self, send: &dyn Tensor, recv: &mut dyn Tensor) -> Result<()> {
        let (s, r) = self.stage_pair(send, &*recv, None, Access::Write)?;
        self.note(&[&s, &r]);
        self.comm
            .all_to_all_tensor(s.view(send)?.get(), r.view_mut(recv)?.get())?;
        r.finish()
    }

    /// [`TensorComm::all_to_allv_tensor`] for tensors on any device.
    ///
    /// # Errors
    /// As [`TensorComm::all_to_allv_tensor`] and the [type docs](DeviceComm).
    #[allow(clippy::too_many_arguments)]
    pub fn all_to_allv_tensor(
        &self,
        send: &dyn Tensor,
        send_counts: &[i64],
        send_displacements: &[i64],
        recv: &mut dyn Tensor,
        recv_counts: &[i64],
        recv_displacements: &[i64],
    ) -> Result<()> {
        let (s, r) = self.stage_pair(send, &*recv, None, Access::ReadWrite)?;
        self.note(&[&s, &r]);
        self.comm.all_to_allv_tensor(
            s.view(send)?.get(),
            send_counts,
            send_displacements,
            r.view_mut(recv)?.get(),
            recv_counts,
            recv_displacements,
        )?;
        r.finish()
    }
}

/// Waits for a posted request, if any.
/// Waits for a posted receive and returns how many `datatype` units arrived.
fn wait_count(
    req: &mut Option<mpi::ffi::MPI_Request>,
    datatype: mpi::ffi::MPI_Datatype,
) -> Option<i64> {
    let mut r = req.take()?;
    let mut status = std::mem::MaybeUninit::<mpi::ffi::MPI_Status>::uninit();
    let mut count: c_int = -1;
    // SAFETY: a request posted by this module and not yet completed; the status is written
    // by MPI_Wait before MPI_Get_count reads it.
    unsafe {
        mpi::ffi::MPI_Wait(&mut r, status.as_mut_ptr());
        mpi::ffi::MPI_Get_count(status.as_ptr(), datatype, &mut count);
    }
    Some(i64::from(count))
}

fn wait(req: &mut Option<mpi::ffi::MPI_Request>) {
    if let Some(mut r) = req.take() {
        // SAFETY: a request posted by this module and not yet completed.
        unsafe { mpi::ffi::MPI_Wait(&mut r, mpi::ffi::RSMPI_STATUS_IGNORE) };
    }
}
