//! Staging placement: where a tensor's bytes are ([`Placement`], from the tensor's
//! [`Facts`], no MPI datatype built), and its stand-in for one operation ([`Stage`]): a
//! pinned host copy, a device scratch buffer that only a CUDA-aware MPI may take
//! ([`Reach::MpiOnly`]), or the tensor itself (the direct route's device pointer, managed
//! memory), never a device pointer relabelled as host memory.

use std::ffi::c_void;

use super::pool::{PinnedBuf, PinnedPool};
use super::route::{no_runtime, no_runtime_error, Route};
use super::DeviceComm;
use crate::comm::{BucketMember, Operand, StagedBucket, StagedTensor, Stager, Staging};
use crate::device::{Device, MemoryKind};
use crate::dlpack::{DLTensor, Tensor, TensorView};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout;
use crate::runtime::{CopyKind, DeviceRuntime, Direction, StridedCopy};
use crate::spec::facts::{access_checks, Facts};
use crate::spec::{Access, Reach};
use mpi::topology::Communicator;

/// A validated device tensor with its route decided; nothing allocated or copied yet.
#[derive(Debug, Clone)]
pub(super) struct Placement {
    pub(super) route: Route,
    pub(super) device: Device,
    /// The tensor's facts (element, span, contiguity, layout plan), computed once.
    pub(super) facts: Facts,
    /// For a strided `kDLCUDA` tensor: how its elements are copied packed (staged: to and
    /// from a pinned buffer; direct: to and from a device scratch buffer). `None`: contiguous,
    /// managed, or a layout the 2-D copies cannot express within
    /// [`MAX_STRIDED_COPIES`](crate::runtime::strided::MAX_STRIDED_COPIES) copies (then the
    /// whole span is staged).
    pub(super) packed: Option<StridedCopy>,
}

impl Placement {
    /// Validates `t` for `access`, decides its route, and checks its pointer with the
    /// runtime. `None`: host memory, which MPI takes as it is.
    ///
    /// # Errors
    /// [`Error::UnsupportedDevice`] (ROCm and others, or no runtime), [`Error::ReadOnly`] /
    /// [`Error::IsCopied`] / [`Error::Overlap`] for tensors MPI writes, the errors of
    /// [`Facts::measure`], and [`Error::DeviceMismatch`] from the runtime's pointer check.
    pub(super) fn of(
        t: &dyn Tensor,
        reduce: Option<DType>,
        access: Access,
        direct: bool,
        runtime: Option<&dyn DeviceRuntime>,
    ) -> Result<Option<Placement>> {
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
        if access.writes() && t.is_read_only() {
            return Err(t.read_only_error());
        }
        if access.writes() && t.is_copied() {
            return Err(Error::IsCopied);
        }
        let runtime = runtime.ok_or_else(|| no_runtime(device))?;
        let facts = Facts::measure(t)?;
        if access.writes() {
            layout::check_no_overlap(t.shape(), t.strides_elems())?;
        }
        let packed = match (&facts.plan, kind) {
            (Some(plan), MemoryKind::Cuda) if facts.len_elems > 0 => {
                StridedCopy::plan(&plan.axes, facts.element.size_bytes())
            }
            _ => None,
        };
        let goes_direct = facts.is_contiguous() || packed.is_some();
        let route = Route::of_device_tensor(kind, direct, goes_direct, reduce);
        if facts.len_elems > 0 {
            // Empty tensors (C65) make no runtime call: their pointer may be NULL.
            runtime.check_pointer(device, facts.first as *const c_void)?;
        }
        Ok(Some(Placement {
            route,
            device,
            facts,
            packed,
        }))
    }

    /// A send and a receive tensor whose device spans overlap are [`Error::BuffersAlias`],
    /// as `TensorComm` says of host memory (staging would hide the overlap).
    pub(super) fn check_disjoint(send: &Placement, recv: &Placement) -> Result<()> {
        let (a, b) = (&send.facts, &recv.facts);
        if a.start < a.end && b.start < b.end && a.start < b.end && b.start < a.end {
            return Err(Error::BuffersAlias {
                send_address: a.start,
                send_bytes: a.span_bytes(),
                recv_address: b.start,
                recv_bytes: b.span_bytes(),
            });
        }
        Ok(())
    }
}

/// A staged tensor: its placement and, when MPI works on a buffer of ours, the `DLTensor`
/// over that buffer (the pinned copy, labelled host memory because it is; or the device
/// scratch, keeping the tensor's device).
struct Placed {
    placement: Placement,
    stand_in: Option<Box<DLTensor>>,
}

/// A tensor's stand-in for one operation.
pub(super) struct Stage<'p, 'r> {
    placed: Option<Placed>,
    buf: Option<PinnedBuf<'p, 'r>>,
    /// Set when the span (or the packed elements) is copied back to the device after the
    /// operation.
    runtime: Option<&'r dyn DeviceRuntime>,
}

impl<'p, 'r> Stage<'p, 'r> {
    /// Host memory: the caller's tensor goes to MPI as it is.
    pub(super) fn host() -> Self {
        Stage {
            placed: None,
            buf: None,
            runtime: None,
        }
    }

    /// Stages `t` as placed: for the staged route, a pinned copy of its span (read from the
    /// device when MPI reads it or when the span has gaps), or of its elements alone, packed,
    /// when the placement has a [`StridedCopy`]; for the direct route with a `StridedCopy`, a
    /// packed copy in a device scratch buffer. Builds the `DLTensor` over the buffer that
    /// the operation's view is made from (compact row-major when packed); the direct and
    /// managed routes without a buffer hand MPI the caller's tensor itself.
    pub(super) fn new(
        t: &dyn Tensor,
        placement: Option<Placement>,
        access: Access,
        pool: &'p PinnedPool<'r>,
        runtime: Option<&'r dyn DeviceRuntime>,
    ) -> Result<Self> {
        let Some(placement) = placement else {
            return Ok(Stage::host());
        };
        let x = &placement.facts;
        let packs = placement.packed.is_some() && placement.route != Route::Managed;
        if (placement.route != Route::Staged && !packs) || x.len_elems == 0 {
            return Ok(Stage {
                placed: Some(Placed {
                    placement,
                    stand_in: None,
                }),
                buf: None,
                runtime: None,
            });
        }
        let runtime = runtime.ok_or_else(no_runtime_error)?;
        let buf = if let Some(plan) = placement.packed.as_ref().filter(|_| packs) {
            Self::pack(&placement, plan, access, pool, runtime)?
        } else {
            Self::copy_span(&placement, access, pool, runtime)?
        };
        let mut stand_in = Box::new(*t.dl_tensor());
        if placement.route == Route::Staged {
            // The pinned copy is host memory.
            stand_in.device = Device::CPU.into();
        }
        if packs {
            stand_in.data = buf.ptr().cast();
            stand_in.strides = std::ptr::null_mut();
        } else {
            stand_in.data = buf.ptr().wrapping_add(x.first as usize - x.start).cast();
        }
        stand_in.byte_offset = 0;
        Ok(Stage {
            placed: Some(Placed {
                placement,
                stand_in: Some(stand_in),
            }),
            buf: Some(buf),
            runtime: access.writes().then_some(runtime),
        })
    }

    /// The staged route without a plan: a pinned copy of the whole span.
    fn copy_span(
        placement: &Placement,
        access: Access,
        pool: &'p PinnedPool<'r>,
        runtime: &'r dyn DeviceRuntime,
    ) -> Result<PinnedBuf<'p, 'r>> {
        let x = &placement.facts;
        let buf = pool.take(x.span_bytes())?;
        if access.reads() || !x.is_dense() {
            // SAFETY: the span is the device memory the tensor's elements occupy (layout
            // arithmetic, pointer checked); the buffer holds at least `span_bytes` bytes.
            unsafe {
                runtime.copy_to_host(
                    placement.device,
                    buf.ptr(),
                    x.start as *const c_void,
                    x.span_bytes(),
                )
            }?;
        }
        Ok(buf)
    }

    /// A strided tensor's elements, packed: in a pinned buffer (staged) or a device scratch
    /// buffer (direct), read from the tensor unless MPI only writes them (then every element
    /// is written back from the buffer, and nothing else of the span is touched).
    fn pack(
        placement: &Placement,
        plan: &StridedCopy,
        access: Access,
        pool: &'p PinnedPool<'r>,
        runtime: &'r dyn DeviceRuntime,
    ) -> Result<PinnedBuf<'p, 'r>> {
        let buf = match placement.route {
            Route::Direct => pool.take_device(placement.device, plan.packed_bytes())?,
            _ => pool.take(plan.packed_bytes())?,
        };
        if access.reads() {
            // SAFETY: the plan is the tensor's own (its merged axes and element size); its
            // elements are device memory of `placement.device` (pointer checked, layout
            // arithmetic); the buffer holds at least `packed_bytes` bytes of the other memory
            // and is fresh from the pool (no overlap, no other user).
            unsafe { Self::run_plan(placement, plan, &buf, runtime, Direction::Pack) }?;
        }
        Ok(buf)
    }

    /// Runs `plan`, the packing of the tensor `placement` describes, between its elements
    /// and `buf` in `direction`: device to device on the direct route, device to host (pack)
    /// or host to device (unpack) otherwise.
    ///
    /// # Safety
    /// As [`StridedCopy::run`]: the plan is the tensor's own; its elements are memory of
    /// `placement.device`, writable to unpack; `buf` holds at least `packed_bytes` bytes of
    /// the memory the route packs into, and nothing else uses either meanwhile.
    unsafe fn run_plan(
        placement: &Placement,
        plan: &StridedCopy,
        buf: &PinnedBuf<'_, '_>,
        runtime: &dyn DeviceRuntime,
        direction: Direction,
    ) -> Result<()> {
        let kind = match (placement.route, direction) {
            (Route::Direct, _) => CopyKind::DeviceToDevice,
            (_, Direction::Pack) => CopyKind::DeviceToHost,
            (_, Direction::Unpack) => CopyKind::HostToDevice,
        };
        let first = placement.facts.first as *const c_void;
        // SAFETY: the caller's contract.
        unsafe {
            plan.run(
                runtime,
                placement.device,
                kind,
                first,
                buf.ptr().cast(),
                direction,
            )
        }
    }

    pub(super) fn route(&self) -> Route {
        self.placed
            .as_ref()
            .map_or(Route::Host, |p| p.placement.route)
    }

    /// The view over the buffer MPI works on; `None`: the caller's tensor itself.
    pub(super) fn stand_in_view(&self) -> Result<Option<TensorView<'_>>> {
        let Some(dl) = self.placed.as_ref().and_then(|p| p.stand_in.as_deref()) else {
            return Ok(None);
        };
        let dl: *const DLTensor = dl;
        // SAFETY: the DLTensor lives in the Box for as long as `self`; its shape and strides
        // point into the caller's tensor, which outlives the operation; its data is the
        // buffer `self` owns. The view never writes the DLTensor struct itself.
        unsafe { TensorView::from_raw(dl.cast_mut()) }.map(Some)
    }

    /// How what MPI works on reaches it: a device pointer on the direct route (the
    /// caller's or the device scratch) only a CUDA-aware MPI may take; host memory
    /// otherwise (the pinned copy, managed memory).
    fn stand_in_reach(&self) -> Reach {
        match &self.placed {
            Some(p) if p.placement.route == Route::Direct => Reach::MpiOnly,
            _ => Reach::Host,
        }
    }

    /// After MPI wrote the host copy (or the device scratch): copies it back to the device.
    pub(super) fn finish(&self) -> Result<()> {
        if let (Some(placed), Some(buf), Some(rt)) = (&self.placed, &self.buf, self.runtime) {
            let p = &placed.placement;
            if let Some(plan) = &p.packed {
                // SAFETY: as in `pack`, the other way round: the tensor's elements are
                // writable (a receive tensor: checked writable and free of overlap).
                return unsafe { Self::run_plan(p, plan, buf, rt, Direction::Unpack) };
            }
            // SAFETY: the span is device memory of p.device (checked by check_pointer and
            // the layout arithmetic); the buffer holds at least `span_bytes` bytes.
            unsafe {
                rt.copy_to_device(
                    p.device,
                    p.facts.start as *mut c_void,
                    buf.ptr(),
                    p.facts.span_bytes(),
                )
            }?;
        }
        Ok(())
    }
}

// SAFETY: the view is the stand-in this stage owns (a pinned host copy, `Reach::Host`, or a
// device scratch buffer, `Reach::MpiOnly`) sized from the tensor's facts, or `None` for the
// caller's own tensor; both stay valid while the stage lives.
unsafe impl StagedTensor for Stage<'_, '_> {
    fn view(&self) -> Result<Option<TensorView<'_>>> {
        self.stand_in_view()
    }

    fn reach(&self) -> Reach {
        self.stand_in_reach()
    }

    fn finish(&self) -> Result<()> {
        Stage::finish(self)
    }
}

/// The checks of a host tensor MPI writes that a parted receive makes itself (it is
/// received without `TensorComm`).
///
/// # Errors
/// As [`access_checks`].
pub(super) fn host_write_checks(t: &dyn Tensor) -> Result<()> {
    access_checks(t)
}

/// A staged operand as the operations see it; `None` for host memory (the caller's
/// tensor, checked as such) and for an operand not declared.
fn boxed<'s>(st: Stage<'s, 's>, declared: bool) -> Option<Box<dyn StagedTensor + 's>> {
    (declared && st.route() != Route::Host).then(|| Box::new(st) as Box<dyn StagedTensor + 's>)
}

// SAFETY: every stand-in is a `Stage` and every bucket a `DeviceBucket`, whose own impls
// keep their contracts; buckets are allocated for the `bytes` and `blocks` asked.
unsafe impl<C: Communicator + ?Sized> Stager for DeviceComm<'_, C> {
    fn stage(&self, send: Option<Operand<'_>>, recv: Option<Operand<'_>>) -> Result<Staging<'_>> {
        let ps = match send {
            Some(o) => Some((o.tensor, self.place(o.tensor, o.reduce, Access::Read)?)),
            None => None,
        };
        let pr = match recv {
            Some(o) => Some((
                o.tensor,
                self.place(o.tensor, o.reduce, o.access)?,
                o.access,
            )),
            None => None,
        };
        let (declared_s, declared_r) = (ps.is_some(), pr.is_some());
        let (s, r) = self.stage_pair(ps, pr)?;
        Ok(Staging {
            send: boxed(s, declared_s),
            recv: boxed(r, declared_r),
        })
    }

    fn stage_bucket(
        &self,
        members: &[BucketMember<'_>],
        shape: (usize, usize),
        reduce: Option<DType>,
    ) -> Result<Box<dyn StagedBucket + '_>> {
        Ok(Box::new(self.bucket(members, shape, reduce)?))
    }
}
