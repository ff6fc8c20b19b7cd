//! Staging placement: where a tensor's bytes are ([`Placement`], from `layout` and `dtype`
//! alone), and its host-side stand-in for one operation ([`Stage`]).

use std::ffi::c_void;

use super::pool::{PinnedBuf, PinnedPool};
use super::route::{no_runtime, no_runtime_error, Route};
use crate::device::{Device, MemoryKind};
use crate::dlpack::{DLTensor, Tensor, TensorView};
use crate::dtype::{self, DType, ElementType};
use crate::error::{Error, Result};
use crate::layout;
use crate::runtime::{CopyKind, DeviceRuntime, Direction, StridedCopy};

/// What an operation does with a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Access {
    /// MPI reads it.
    Read,
    /// MPI writes it (every element).
    Write,
    /// MPI reads and writes it (in-place reductions, broadcast at any rank, receives that
    /// may leave gaps).
    ReadWrite,
}

impl Access {
    fn writes(self) -> bool {
        self != Access::Read
    }
}

/// The bytes a tensor's elements occupy, and of what type: the facts staging needs, derived
/// from the layout plan and the dtype table (no MPI datatype is built).
#[derive(Debug, Clone, Copy)]
pub(super) struct Extent {
    /// Address of the first element (`data + byte_offset`).
    pub(super) first: usize,
    /// The span `[start, start + span_bytes)`: lowest to one past the highest byte an
    /// element touches.
    pub(super) start: usize,
    pub(super) span_bytes: usize,
    /// Whether the elements are one run in logical order (C-contiguous, `layout`'s rule).
    pub(super) contiguous: bool,
    pub(super) len_elems: i64,
    pub(super) element: ElementType,
}

impl Extent {
    /// The extent of `t`'s elements.
    ///
    /// # Errors
    /// [`Error::UnsupportedDtype`] (no MPI type), [`Error::Overflow`] when the span leaves
    /// the address space, and the layout errors of [`layout::plan`].
    pub(super) fn of(t: &dyn Tensor) -> Result<Extent> {
        let element = dtype::lookup(t.dtype())?;
        let first = t.first_element_ptr() as usize;
        let size = element.size_bytes();
        match layout::check_c_contiguous(t.shape(), t.strides_elems()) {
            Ok(()) => {
                let len_elems = t.num_elements();
                let span_bytes = layout::byte_span(len_elems, size)?;
                first.checked_add(span_bytes).ok_or(Error::Overflow {
                    quantity: "first element + byte span",
                    lhs: first as i128,
                    operator: "+",
                    rhs: span_bytes as i128,
                })?;
                Ok(Extent {
                    first,
                    start: first,
                    span_bytes,
                    contiguous: true,
                    len_elems,
                    element,
                })
            }
            Err(Error::NonContiguous { .. }) => {
                let plan = layout::plan(t.shape(), t.strides_elems())?;
                let (base, size) = (first as i128, size as i128);
                let start = base + i128::from(plan.lowest_elem) * size;
                let end = base + (i128::from(plan.highest_elem) + 1) * size;
                let (Ok(start_u), Ok(_), Ok(span_bytes)) = (
                    usize::try_from(start),
                    usize::try_from(end),
                    usize::try_from(end - start),
                ) else {
                    return Err(Error::Overflow {
                        quantity: "address range of the strided elements",
                        lhs: start,
                        operator: "..",
                        rhs: end,
                    });
                };
                Ok(Extent {
                    first,
                    start: start_u,
                    span_bytes,
                    contiguous: false,
                    len_elems: plan.len_elems,
                    element,
                })
            }
            Err(e) => Err(e),
        }
    }

    /// Whether the span holds nothing but the elements (a receive need not read it first).
    fn is_dense(&self) -> bool {
        self.span_bytes as i128 == i128::from(self.len_elems) * self.element.size_bytes() as i128
    }
}

/// A validated device tensor with its route decided; nothing allocated or copied yet.
#[derive(Debug, Clone)]
pub(super) struct Placement {
    pub(super) route: Route,
    pub(super) device: Device,
    pub(super) extent: Extent,
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
    /// [`Extent::of`], and [`Error::DeviceMismatch`] from the runtime's pointer check.
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
        let extent = Extent::of(t)?;
        if access.writes() {
            layout::check_no_overlap(t.shape(), t.strides_elems())?;
        }
        let packed = match kind {
            MemoryKind::Cuda if !extent.contiguous && extent.len_elems > 0 => {
                let plan = layout::plan(t.shape(), t.strides_elems())?;
                StridedCopy::plan(&plan.axes, extent.element.size_bytes())
            }
            _ => None,
        };
        let goes_direct = extent.contiguous || packed.is_some();
        let route = Route::of_device_tensor(kind, direct, goes_direct, reduce);
        if extent.len_elems > 0 {
            // Empty tensors (C65) make no runtime call: their pointer may be NULL.
            runtime.check_pointer(device, extent.first as *const c_void)?;
        }
        Ok(Some(Placement {
            route,
            device,
            extent,
            packed,
        }))
    }

    /// A send and a receive tensor whose device spans overlap are [`Error::BuffersAlias`],
    /// as `TensorComm` says of host memory (staging would hide the overlap).
    pub(super) fn check_disjoint(send: &Placement, recv: &Placement) -> Result<()> {
        let (a, b) = (&send.extent, &recv.extent);
        let (a1, b1) = (a.start + a.span_bytes, b.start + b.span_bytes);
        if a.span_bytes > 0 && b.span_bytes > 0 && a.start < b1 && b.start < a1 {
            return Err(Error::BuffersAlias {
                send_address: a.start,
                send_bytes: a.span_bytes,
                recv_address: b.start,
                recv_bytes: b.span_bytes,
            });
        }
        Ok(())
    }
}

/// A device tensor's host stand-in: its placement and its `DLTensor` relabelled as host
/// memory (the pinned copy, or the same pointer for the direct and managed routes).
struct Placed {
    placement: Placement,
    host: Box<DLTensor>,
}

/// A tensor's host-side stand-in for one operation.
pub(super) struct Stage<'p, 'r> {
    placed: Option<Placed>,
    buf: Option<PinnedBuf<'p, 'r>>,
    /// Set when the span (or the packed elements) is copied back to the device after the
    /// operation.
    runtime: Option<&'r dyn DeviceRuntime>,
}

/// The tensor a read operand hands to `TensorComm`: the caller's, or its host stand-in.
pub(super) enum HostRef<'a> {
    Orig(&'a dyn Tensor),
    View(TensorView<'a>),
}

impl HostRef<'_> {
    pub(super) fn get(&self) -> &dyn Tensor {
        match self {
            HostRef::Orig(t) => *t,
            HostRef::View(v) => v,
        }
    }
}

/// The tensor a written operand hands to `TensorComm`: the caller's, or its host stand-in.
pub(super) enum HostMut<'a> {
    Orig(&'a mut (dyn Tensor + 'a)),
    View(TensorView<'a>),
}

impl<'a> HostMut<'a> {
    pub(super) fn get(&mut self) -> &mut (dyn Tensor + 'a) {
        match self {
            HostMut::Orig(t) => &mut **t,
            HostMut::View(v) => v,
        }
    }
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
    /// packed copy in a device scratch buffer. Builds the host `DLTensor` the operation's
    /// views are made from (the one relabelling of the caller's tensor; compact row-major
    /// over the buffer when packed).
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
        let mut host = Box::new(*t.dl_tensor());
        host.device = Device::CPU.into();
        let x = placement.extent;
        let packs = placement.packed.is_some() && placement.route != Route::Managed;
        if (placement.route != Route::Staged && !packs) || x.len_elems == 0 {
            return Ok(Stage {
                placed: Some(Placed { placement, host }),
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
        if packs {
            host.data = buf.ptr().cast();
            host.strides = std::ptr::null_mut();
        } else {
            host.data = buf.ptr().wrapping_add(x.first - x.start).cast();
        }
        host.byte_offset = 0;
        Ok(Stage {
            placed: Some(Placed { placement, host }),
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
        let x = placement.extent;
        let buf = pool.take(x.span_bytes)?;
        if access != Access::Write || !x.is_dense() {
            // SAFETY: the span is the device memory the tensor's elements occupy (layout
            // arithmetic, pointer checked); the buffer holds at least `span_bytes` bytes.
            unsafe {
                runtime.copy_to_host(
                    placement.device,
                    buf.ptr(),
                    x.start as *const c_void,
                    x.span_bytes,
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
        let kind = Self::pack_kind(placement.route);
        let buf = match placement.route {
            Route::Direct => pool.take_device(placement.device, plan.packed_bytes())?,
            _ => pool.take(plan.packed_bytes())?,
        };
        if access != Access::Write {
            // SAFETY: the plan is the tensor's own (its merged axes and element size); its
            // elements are device memory of `placement.device` (pointer checked, layout
            // arithmetic); the buffer holds at least `packed_bytes` bytes of the other memory
            // and is fresh from the pool (no overlap, no other user).
            unsafe {
                plan.run(
                    runtime,
                    placement.device,
                    kind,
                    placement.extent.first as *const c_void,
                    buf.ptr().cast(),
                    Direction::Pack,
                )
            }?;
        }
        Ok(buf)
    }

    /// The copy kind of packing on `route` (its reverse unpacks).
    fn pack_kind(route: Route) -> CopyKind {
        match route {
            Route::Direct => CopyKind::DeviceToDevice,
            _ => CopyKind::DeviceToHost,
        }
    }

    pub(super) fn route(&self) -> Route {
        self.placed
            .as_ref()
            .map_or(Route::Host, |p| p.placement.route)
    }

    /// The host `DLTensor` as a view; `None` for host memory.
    fn host_view<'s>(&'s self) -> Result<Option<TensorView<'s>>> {
        let Some(placed) = &self.placed else {
            return Ok(None);
        };
        let dl: *const DLTensor = &*placed.host;
        // SAFETY: the DLTensor lives in the Box for as long as `self`; its shape and strides
        // point into the caller's tensor, which outlives the operation; its data is the
        // pinned buffer (owned by `self`) or the caller's memory. The view never writes the
        // DLTensor struct itself.
        unsafe { TensorView::from_raw(dl.cast_mut()) }.map(Some)
    }

    /// What `TensorComm` reads: the host stand-in, or `orig` itself for host memory.
    pub(super) fn view<'a>(&'a self, orig: &'a dyn Tensor) -> Result<HostRef<'a>> {
        Ok(match self.host_view()? {
            Some(v) => HostRef::View(v),
            None => HostRef::Orig(orig),
        })
    }

    /// What `TensorComm` writes: the host stand-in, or `orig` itself for host memory.
    pub(super) fn view_mut<'a>(&'a self, orig: &'a mut (dyn Tensor + 'a)) -> Result<HostMut<'a>> {
        Ok(match self.host_view()? {
            Some(v) => HostMut::View(v),
            None => HostMut::Orig(orig),
        })
    }

    /// After MPI wrote the host copy (or the device scratch): copies it back to the device.
    pub(super) fn finish(&self) -> Result<()> {
        if let (Some(placed), Some(buf), Some(rt)) = (&self.placed, &self.buf, self.runtime) {
            let p = &placed.placement;
            if let Some(plan) = &p.packed {
                let kind = match p.route {
                    Route::Direct => CopyKind::DeviceToDevice,
                    _ => CopyKind::HostToDevice,
                };
                // SAFETY: as in `pack`, the other way round: the tensor's elements are
                // writable (a receive tensor: checked writable and free of overlap).
                return unsafe {
                    plan.run(
                        rt,
                        p.device,
                        kind,
                        p.extent.first as *const c_void,
                        buf.ptr().cast(),
                        Direction::Unpack,
                    )
                };
            }
            // SAFETY: the span is device memory of p.device (checked by check_pointer and
            // the layout arithmetic); the buffer holds at least `span_bytes` bytes.
            unsafe {
                rt.copy_to_device(
                    p.device,
                    p.extent.start as *mut c_void,
                    buf.ptr(),
                    p.extent.span_bytes,
                )
            }?;
        }
        Ok(())
    }
}
