//! [`DeviceComm`]: every [`TensorComm`] operation for tensors on any device.

use std::cell::Cell;
use std::sync::atomic::{AtomicU8, Ordering};

use mpi::point_to_point::Status;
use mpi::topology::{Communicator, Rank};
use mpi::Tag;

use super::pipeline::{
    Pipe, DEFAULT_PIPELINE_CHUNK_BYTES, MAX_PIPELINE_CHUNK_BYTES, MIN_PIPELINE_CHUNK_BYTES,
};
use super::pool::PinnedPool;
use super::route::{Route, Transport};
use super::stage::{Access, Extent, Placement, Stage};
use super::{cuda_awareness, CudaAwareness};
use crate::comm::{agree, check_rank, check_tag, TensorComm};
use crate::dlpack::Tensor;
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};
use crate::layout;
use crate::runtime::DeviceRuntime;
use crate::spec::flat;
use crate::spec::scratch::Scratch;

/// Tensor operations for tensors on any device: [`TensorComm`]'s operations, with each
/// tensor routed as [`Route`] says. Host tensors pass straight through.
///
/// **Staging.** Before an operation a contiguous tensor's bytes are copied device → pinned
/// host for tensors MPI reads; the operation runs on host memory; then they are copied pinned
/// host → device for tensors MPI wrote. A strided tensor's elements alone are copied, packed
/// in logical row-major order by pitched 2-D copies ([`crate::runtime::StridedCopy`]), and
/// unpacked into its elements after a receive (the bytes between them are never touched).
/// A layout that needs more than
/// [`MAX_STRIDED_COPIES`](crate::runtime::strided::MAX_STRIDED_COPIES) 2-D copies (a long
/// reversed axis, say) is staged by its *span* (lowest to one past its highest element,
/// keeping its layout for `TensorComm`); such a receive span with gaps is first read from
/// the device, so the bytes between elements keep their values. On the direct route a
/// strided tensor is packed into a device scratch buffer (device → device), sent contiguous,
/// and unpacked; scratch buffers come from the same pool, which keeps at most
/// [`MAX_POOLED_DEVICE_BYTES`](super::MAX_POOLED_DEVICE_BYTES) of them. Pinned buffers (sizes rounded up to a power of
/// two, at least 64 KiB) come from a pool owned by the `DeviceComm` and are reused; the pool
/// keeps at most [`MAX_POOLED_BYTES`](super::MAX_POOLED_BYTES) and frees the rest. A send
/// and a receive tensor whose device spans overlap are [`Error::BuffersAlias`], as on host
/// memory. Collectives are staged whole; operands only the root uses are ignored at other
/// ranks.
///
/// **Pipelining** (point-to-point only): a large staged contiguous send goes out in parts,
/// and [`DeviceComm::recv_tensor`] recognises both forms, into a receive tensor of any
/// layout; the [`pipeline`](super::pipeline) module documents the wire format.
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

/// The operands of one operation, staged (each holds no borrow of its tensor: the views
/// handed to `TensorComm` are made from the caller's tensors).
struct Staging<'p, 'r> {
    send: Stage<'p, 'r>,
    recv: Stage<'p, 'r>,
}

impl<'c, C: Communicator + ?Sized> DeviceComm<'c, C> {
    /// A device-aware view of `comm`. `runtime` is the GPU runtime (usually
    /// [`crate::runtime::default_runtime`]; `None` handles host tensors only). `transport` decides
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
            pool: PinnedPool::new(runtime),
            chunk_bytes: DEFAULT_PIPELINE_CHUNK_BYTES,
            last_route: AtomicU8::new(0),
        })
    }

    /// Sets the part size of pipelined staged point-to-point messages (bytes; `None` or
    /// `Some(0)`: no pipelining, one message each). Other values are brought into
    /// [`MIN_PIPELINE_CHUNK_BYTES`]`..=`[`MAX_PIPELINE_CHUNK_BYTES`]. The ends need not
    /// agree: a parted message's header gives the receiver the sender's part size.
    pub fn with_pipeline_chunk(mut self, bytes: Option<usize>) -> Self {
        self.chunk_bytes = match bytes.unwrap_or(0) {
            0 => 0,
            b => b.clamp(MIN_PIPELINE_CHUNK_BYTES, MAX_PIPELINE_CHUNK_BYTES),
        };
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

    fn note(&self, route: Route) {
        self.last_route.store(route as u8, Ordering::Relaxed);
    }

    fn pipe(&self) -> Pipe<'_, 'c, C> {
        Pipe {
            comm: self.comm,
            runtime: self.runtime,
            pool: &self.pool,
            part_bytes: self.chunk_bytes,
        }
    }

    fn place(
        &self,
        t: &dyn Tensor,
        reduce: Option<DType>,
        access: Access,
    ) -> Result<Option<Placement>> {
        Placement::of(t, reduce, access, self.direct, self.runtime)
    }

    /// The one staging step of every operation: checks that placed send and receive spans
    /// are disjoint, then stages both (every refusal comes before any copy) and notes the
    /// route.
    fn stage(
        &self,
        send: Option<(&dyn Tensor, Option<Placement>)>,
        recv: Option<(&dyn Tensor, Option<Placement>, Access)>,
    ) -> Result<Staging<'_, 'c>> {
        if let (Some((_, Some(a))), Some((_, Some(b), _))) = (&send, &recv) {
            Placement::check_disjoint(a, b)?;
        }
        let (pool, rt) = (&self.pool, self.runtime);
        let send = match send {
            Some((t, p)) => Stage::new(t, p, Access::Read, pool, rt)?,
            None => Stage::host(),
        };
        let recv = match recv {
            Some((t, p, access)) => Stage::new(t, p, access, pool, rt)?,
            None => Stage::host(),
        };
        self.note(send.route().max(recv.route()));
        Ok(Staging { send, recv })
    }

    /// Runs `op` (a `TensorComm` operation) on the host stand-ins of a send and a receive
    /// tensor, then copies the receive span back to the device. `reduce`: the dtype of the
    /// reduction, which decides the route of half-precision tensors.
    fn pair<R>(
        &self,
        send: &dyn Tensor,
        recv: &mut dyn Tensor,
        access: Access,
        reduce: Option<DType>,
        op: impl FnOnce(&dyn Tensor, &mut dyn Tensor) -> Result<R>,
    ) -> Result<R> {
        let ps = self.place(send, reduce, Access::Read)?;
        let pr = self.place(&*recv, reduce, access)?;
        let st = self.stage(Some((send, ps)), Some((&*recv, pr, access)))?;
        let out = op(st.send.view(send)?.get(), st.recv.view_mut(recv)?.get())?;
        st.recv.finish()?;
        Ok(out)
    }

    /// [`DeviceComm::pair`] for an operation that only reads.
    fn read<R>(
        &self,
        send: &dyn Tensor,
        placement: Option<Placement>,
        op: impl FnOnce(&dyn Tensor) -> Result<R>,
    ) -> Result<R> {
        let st = self.stage(Some((send, placement)), None)?;
        op(st.send.view(send)?.get())
    }

    /// [`DeviceComm::pair`] for an operation on one tensor MPI writes (or reads and writes).
    fn write<R>(
        &self,
        recv: &mut dyn Tensor,
        placement: Option<Placement>,
        access: Access,
        op: impl FnOnce(&mut dyn Tensor) -> Result<R>,
    ) -> Result<R> {
        let st = self.stage(None, Some((&*recv, placement, access)))?;
        let out = op(st.recv.view_mut(recv)?.get())?;
        st.recv.finish()?;
        Ok(out)
    }

    // ----- point-to-point -------------------------------------------------------------

    /// [`TensorComm::send_tensor`]; a staged contiguous tensor above the pipeline part size
    /// goes out in parts ([`pipeline`](super::pipeline)).
    ///
    /// # Errors
    /// As [`TensorComm::send_tensor`] and the [type docs](DeviceComm).
    pub fn send_tensor(&self, tensor: &dyn Tensor, dest: Rank, tag: Tag) -> Result<()> {
        check_rank(dest, self.comm.target_size())?;
        check_tag(tag)?;
        let placement = self.place(tensor, None, Access::Read)?;
        if let Some(p) = placement.as_ref().filter(|p| self.pipe().parts_send(p)) {
            self.note(Route::Staged);
            return self.pipe().send_parts(p, dest, tag);
        }
        self.read(tensor, placement, |t| self.comm.send_tensor(t, dest, tag))
    }

    /// [`TensorComm::recv_tensor`]. For a tensor whose elements take more than
    /// [`MIN_PIPELINE_CHUNK_BYTES`] bytes (any layout) the incoming message is probed: one
    /// message of the tensor's size, or the part header of a parted send
    /// ([`pipeline`](super::pipeline)), whose returned status is the header's; a strided
    /// tensor receives the parts packed and unpacks them into its layout.
    ///
    /// # Errors
    /// As [`TensorComm::recv_tensor`] and the [type docs](DeviceComm); for a parted message,
    /// [`Error::SenderAborted`] (the sender stopped partway), [`Error::BadPartHeader`] and
    /// [`Error::CountMismatch`] as the [`pipeline`](super::pipeline) docs say.
    pub fn recv_tensor(&self, tensor: &mut dyn Tensor, source: Rank, tag: Tag) -> Result<Status> {
        check_rank(source, self.comm.target_size())?;
        check_tag(tag)?;
        let placement = self.place(&*tensor, None, Access::Write)?;
        if let Some(x) = self.parted_candidate(&*tensor, placement.as_ref())? {
            // The element count of a candidate fits usize (its bytes do).
            let total = usize::try_from(x.len_elems).unwrap_or(0);
            if let Some(first) = self
                .pipe()
                .recv_part_header(source, tag, total, x.element)?
            {
                if x.contiguous {
                    return self.recv_parted(placement, &*tensor, x, tag, first);
                }
                return self.recv_parted_strided(placement, tensor, (x, total), tag, first);
            }
        }
        self.write(tensor, placement, Access::Write, |t| {
            self.comm.recv_tensor(t, source, tag)
        })
    }

    /// The extent of a receive tensor a parted message could be meant for: elements of more
    /// bytes in all than the smallest part ([`MIN_PIPELINE_CHUNK_BYTES`]), whatever this
    /// side's part size (the sender's header gives its own), in any layout (a strided tensor
    /// receives the parts packed and unpacks them, [`DeviceComm::recv_parted_strided`]).
    fn parted_candidate(
        &self,
        tensor: &dyn Tensor,
        placement: Option<&Placement>,
    ) -> Result<Option<Extent>> {
        let x = match placement {
            Some(p) => p.extent,
            // Host memory: the receive checks (READ_ONLY, IS_COPIED, overlap) happen here,
            // because a parted message is received without TensorComm; a small tensor (the
            // per-message common case) skips this and gets them from TensorComm.
            None if tensor.dtype().size_bytes().is_some_and(|b| {
                b as i128 * i128::from(tensor.num_elements()) > MIN_PIPELINE_CHUNK_BYTES as i128
            }) =>
            {
                if tensor.is_read_only() {
                    return Err(tensor.read_only_error());
                }
                if tensor.is_copied() {
                    return Err(Error::IsCopied);
                }
                layout::check_no_overlap(tensor.shape(), tensor.strides_elems())?;
                Extent::of(tensor)?
            }
            None => return Ok(None),
        };
        let bytes = usize::try_from(x.len_elems)
            .ok()
            .and_then(|n| n.checked_mul(x.element.size_bytes()));
        Ok(bytes
            .is_some_and(|b| b > MIN_PIPELINE_CHUNK_BYTES)
            .then_some(x))
    }

    fn recv_parted(
        &self,
        placement: Option<Placement>,
        tensor: &dyn Tensor,
        x: Extent,
        tag: Tag,
        first: (Status, usize),
    ) -> Result<Status> {
        let pipe = self.pipe();
        let total = x.span_bytes / x.element.size_bytes();
        let staged = match placement.as_ref().filter(|p| p.route == Route::Staged) {
            Some(p) => Some((
                p,
                pipe.part_buffers(x.element, first.1)
                    .map_err(|e| self.refuse_parts(e, total, x, tag, &first))?,
            )),
            None => None,
        };
        self.note(placement.as_ref().map_or(Route::Host, |p| p.route));
        let base = placement
            .as_ref()
            .map_or(tensor.first_element_ptr() as usize, |p| p.extent.first);
        pipe.recv_parts(staged, base, total, x.element, tag, first)
    }

    /// A refusal after a valid part header, before any part was posted: receives and
    /// discards the parts ([`Pipe::drain`]) so that the sender completes, then returns `e`.
    fn refuse_parts(
        &self,
        e: Error,
        total: usize,
        x: Extent,
        tag: Tag,
        (header, part): &(Status, usize),
    ) -> Error {
        let n = u64::try_from(total).unwrap_or(u64::MAX);
        let parts = (*part, n, x.element.size_bytes());
        self.pipe()
            .drain(header.source_rank(), tag, parts, Some(x.element));
        e
    }

    /// A parted message into a strided receive tensor: the parts land in the tensor's
    /// contiguous host stand-in when staging packs it ([`Stage`]: a pinned buffer, or a
    /// device scratch on the direct route), else in a host scratch buffer that the pack
    /// kernels then unpack into the stand-in ([`crate::spec::flat::unpack`]); the stand-in
    /// goes to the device as for every staged receive. Nothing of the tensor changes unless
    /// every part arrived.
    fn recv_parted_strided(
        &self,
        placement: Option<Placement>,
        tensor: &mut dyn Tensor,
        (x, total): (Extent, usize),
        tag: Tag,
        first: (Status, usize),
    ) -> Result<Status> {
        let refuse = |e| self.refuse_parts(e, total, x, tag, &first);
        let st = self
            .stage(None, Some((&*tensor, placement, Access::Write)))
            .map_err(refuse)?;
        let pipe = self.pipe();
        let status = {
            let mut view = st.recv.view_mut(tensor).map_err(refuse)?;
            let t = view.get();
            if layout::check_c_contiguous(t.shape(), t.strides_elems()).is_ok() {
                let base = t.first_element_ptr() as usize;
                pipe.recv_parts(None, base, total, x.element, tag, first)?
            } else {
                let e = x.element.size_bytes();
                // total × e fits usize (parted_candidate).
                let mut packed = Scratch::take(total * e).map_err(refuse)?;
                let base = packed.as_mut_ptr() as usize;
                let status = pipe.recv_parts(None, base, total, x.element, tag, first)?;
                flat::unpack(t, e, &packed)?;
                status
            }
        };
        st.recv.finish()?;
        Ok(status)
    }

    /// [`TensorComm::sendrecv_tensor`] (staged whole, never in parts: both directions are
    /// one message each).
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
        self.pair(send, recv, Access::Write, None, |s, r| {
            self.comm
                .sendrecv_tensor(s, dest, send_tag, r, source, recv_tag)
        })
    }

    /// Runs one collective: `body` places and stages the tensors, then enters `TensorComm`'s
    /// collective through [`Self::enter`] (which makes the agreement across ranks). An error
    /// before that point (a placement refused, staging, a view) is this rank's alone, while
    /// its peers are already in the agreement: it is taken into that agreement, so that they
    /// return [`Error::PeerRefused`] instead of waiting (no rank left waiting). Errors after
    /// it (copying a result back to the device) are local, as in `TensorComm`.
    fn collective<R>(&self, body: impl FnOnce(&Cell<bool>) -> Result<R>) -> Result<R> {
        let entered = Cell::new(false);
        match body(&entered) {
            Err(e) if !entered.get() && !self.comm.test_inter() => agree(self.comm, Err(e)),
            other => other,
        }
    }

    /// The communicator, noting that `TensorComm`'s collective is being entered.
    fn enter(&self, entered: &Cell<bool>) -> &'c C {
        entered.set(true);
        self.comm
    }

    // ----- collectives ------------------------------------------------------------------

    /// [`TensorComm::broadcast_tensor`]: read at the root, written elsewhere.
    ///
    /// # Errors
    /// As [`TensorComm::broadcast_tensor`] and the [type docs](DeviceComm).
    pub fn broadcast_tensor(&self, tensor: &mut dyn Tensor, root: Rank) -> Result<()> {
        self.collective(|entered| {
            let is_root = self.comm.rank() == root;
            let access = if is_root { Access::Read } else { Access::Write };
            let placement = self.place(&*tensor, None, access)?;
            self.write(tensor, placement, access, |t| {
                self.enter(entered).broadcast_tensor(t, root)
            })
        })
    }

    /// [`TensorComm::reduce_tensor`]; `recv` is staged at the root only (other ranks ignore
    /// it, as `TensorComm` does: never staged, copied back or refused there).
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
        self.collective(|entered| {
            let dt = Some(send.dtype());
            match recv.filter(|_| self.comm.rank() == root) {
                Some(recv) => self.pair(send, recv, Access::Write, dt, |s, r| {
                    self.enter(entered).reduce_tensor(s, Some(r), op, root)
                }),
                None => self.read(send, self.place(send, dt, Access::Read)?, |s| {
                    self.enter(entered).reduce_tensor(s, None, op, root)
                }),
            }
        })
    }

    /// [`TensorComm::all_reduce_tensor`].
    ///
    /// # Errors
    /// As [`TensorComm::all_reduce_tensor`] and the [type docs](DeviceComm).
    pub fn all_reduce_tensor(
        &self,
        send: &dyn Tensor,
        recv: &mut dyn Tensor,
        op: ReduceOp,
    ) -> Result<()> {
        self.collective(|entered| {
            self.pair(send, recv, Access::Write, Some(send.dtype()), |s, r| {
                self.enter(entered).all_reduce_tensor(s, r, op)
            })
        })
    }

    /// [`TensorComm::all_reduce_tensor_in_place`].
    ///
    /// # Errors
    /// As [`TensorComm::all_reduce_tensor_in_place`] and the [type docs](DeviceComm).
    pub fn all_reduce_tensor_in_place(&self, tensor: &mut dyn Tensor, op: ReduceOp) -> Result<()> {
        self.collective(|entered| {
            let placement = self.place(&*tensor, Some(tensor.dtype()), Access::ReadWrite)?;
            self.write(tensor, placement, Access::ReadWrite, |t| {
                self.enter(entered).all_reduce_tensor_in_place(t, op)
            })
        })
    }

    /// [`TensorComm::reduce_scatter_block_tensor`].
    ///
    /// # Errors
    /// As [`TensorComm::reduce_scatter_block_tensor`] and the [type docs](DeviceComm).
    pub fn reduce_scatter_block_tensor(
        &self,
        send: &dyn Tensor,
        recv: &mut dyn Tensor,
        op: ReduceOp,
    ) -> Result<()> {
        self.collective(|entered| {
            self.pair(send, recv, Access::Write, Some(send.dtype()), |s, r| {
                self.enter(entered).reduce_scatter_block_tensor(s, r, op)
            })
        })
    }

    /// [`TensorComm::gather_tensor`]; `recv` is staged at the root only.
    ///
    /// # Errors
    /// As [`TensorComm::gather_tensor`] and the [type docs](DeviceComm).
    pub fn gather_tensor(
        &self,
        send: &dyn Tensor,
        recv: Option<&mut dyn Tensor>,
        root: Rank,
    ) -> Result<()> {
        self.collective(|entered| match recv.filter(|_| self.comm.rank() == root) {
            Some(recv) => self.pair(send, recv, Access::Write, None, |s, r| {
                self.enter(entered).gather_tensor(s, Some(r), root)
            }),
            None => self.read(send, self.place(send, None, Access::Read)?, |s| {
                self.enter(entered).gather_tensor(s, None, root)
            }),
        })
    }

    /// [`TensorComm::gatherv_tensor`]; `recv` is staged at the root only, and read from the
    /// device first (the blocks may leave gaps).
    ///
    /// # Errors
    /// As [`TensorComm::gatherv_tensor`] and the [type docs](DeviceComm).
    pub fn gatherv_tensor(
        &self,
        send: &dyn Tensor,
        recv: Option<(&mut dyn Tensor, &[i64], &[i64])>,
        root: Rank,
    ) -> Result<()> {
        self.collective(|entered| match recv.filter(|_| self.comm.rank() == root) {
            Some((recv, counts, displs)) => {
                self.pair(send, recv, Access::ReadWrite, None, |s, r| {
                    self.enter(entered)
                        .gatherv_tensor(s, Some((r, counts, displs)), root)
                })
            }
            None => self.read(send, self.place(send, None, Access::Read)?, |s| {
                self.enter(entered).gatherv_tensor(s, None, root)
            }),
        })
    }

    /// [`TensorComm::scatter_tensor`]; `send` is staged at the root only.
    ///
    /// # Errors
    /// As [`TensorComm::scatter_tensor`] and the [type docs](DeviceComm).
    pub fn scatter_tensor(
        &self,
        send: Option<&dyn Tensor>,
        recv: &mut dyn Tensor,
        root: Rank,
    ) -> Result<()> {
        self.collective(|entered| match send.filter(|_| self.comm.rank() == root) {
            Some(send) => self.pair(send, recv, Access::Write, None, |s, r| {
                self.enter(entered).scatter_tensor(Some(s), r, root)
            }),
            None => {
                let placement = self.place(&*recv, None, Access::Write)?;
                self.write(recv, placement, Access::Write, |r| {
                    self.enter(entered).scatter_tensor(None, r, root)
                })
            }
        })
    }

    /// [`TensorComm::scatterv_tensor`]; `send` is staged at the root only, and `recv` is
    /// read from the device first (a block shorter than the tensor leaves its tail as is).
    ///
    /// # Errors
    /// As [`TensorComm::scatterv_tensor`] and the [type docs](DeviceComm).
    pub fn scatterv_tensor(
        &self,
        send: Option<(&dyn Tensor, &[i64], &[i64])>,
        recv: &mut dyn Tensor,
        root: Rank,
    ) -> Result<()> {
        self.collective(|entered| match send.filter(|_| self.comm.rank() == root) {
            Some((send, c, d)) => self.pair(send, recv, Access::ReadWrite, None, |s, r| {
                self.enter(entered)
                    .scatterv_tensor(Some((s, c, d)), r, root)
            }),
            None => {
                let placement = self.place(&*recv, None, Access::ReadWrite)?;
                self.write(recv, placement, Access::ReadWrite, |r| {
                    self.enter(entered).scatterv_tensor(None, r, root)
                })
            }
        })
    }

    /// [`TensorComm::all_gather_tensor`].
    ///
    /// # Errors
    /// As [`TensorComm::all_gather_tensor`] and the [type docs](DeviceComm).
    pub fn all_gather_tensor(&self, send: &dyn Tensor, recv: &mut dyn Tensor) -> Result<()> {
        self.collective(|entered| {
            self.pair(send, recv, Access::Write, None, |s, r| {
                self.enter(entered).all_gather_tensor(s, r)
            })
        })
    }

    /// [`TensorComm::all_gatherv_tensor`]; `recv` is read from the device first (the
    /// blocks may leave gaps).
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
        self.collective(|entered| {
            self.pair(send, recv, Access::ReadWrite, None, |s, r| {
                self.enter(entered)
                    .all_gatherv_tensor(s, r, counts, displacements)
            })
        })
    }

    /// [`TensorComm::all_to_all_tensor`].
    ///
    /// # Errors
    /// As [`TensorComm::all_to_all_tensor`] and the [type docs](DeviceComm).
    pub fn all_to_all_tensor(&self, send: &dyn Tensor, recv: &mut dyn Tensor) -> Result<()> {
        self.collective(|entered| {
            self.pair(send, recv, Access::Write, None, |s, r| {
                self.enter(entered).all_to_all_tensor(s, r)
            })
        })
    }

    /// [`TensorComm::all_to_allv_tensor`]; `recv` is read from the device first (the
    /// blocks may leave gaps).
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
        self.collective(|entered| {
            self.pair(send, recv, Access::ReadWrite, None, |s, r| {
                self.enter(entered).all_to_allv_tensor(
                    s,
                    send_counts,
                    send_displacements,
                    r,
                    recv_counts,
                    recv_displacements,
                )
            })
        })
    }
}
