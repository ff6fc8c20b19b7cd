//! [`DeviceComm`]: every [`TensorComm`] operation for tensors on any device. It is the
//! operations' [`Stager`] (placement and staging of each operand) and keeps only what is
//! its own: the parted point-to-point protocol ([`super::pipeline`]) of `send_tensor` and
//! `recv_tensor`.

use std::sync::atomic::{AtomicU8, Ordering};

use mpi::point_to_point::Status;
use mpi::topology::{Communicator, Rank};
use mpi::Tag;

use super::bucket::{bucket_route, DeviceBucket, PlacedMember};
use super::pipeline::{
    Pipe, DEFAULT_PIPELINE_CHUNK_BYTES, MAX_PIPELINE_CHUNK_BYTES, MIN_PIPELINE_CHUNK_BYTES,
};
use super::pool::PinnedPool;
use super::route::{Route, Transport};
use super::stage::{Placement, Stage};
use super::{cuda_awareness, CudaAwareness};
use crate::comm::{
    any_source, any_tag, check_peer, p2p, BucketMember, Endpoint, Sealed, Stager, TensorComm,
};
use crate::device::Device;
use crate::dlpack::Tensor;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::runtime::DeviceRuntime;
use crate::spec::Access;

/// Tensor operations for tensors on any device: every [`TensorComm`] operation (the same
/// list, written once: `DeviceComm` implements the trait and is its operations' stager),
/// with each tensor routed as [`Route`] says. Host tensors pass straight through. Call the
/// operations with `TensorComm` in scope (`use dlpack_mpi::comm::TensorComm`).
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
/// memory. Collectives are staged whole; an operand only the root uses is checked at the
/// other ranks as at the root (its facts; no runtime call, no copy) and never staged there. On the direct route MPI gets the device pointer itself (or the device scratch
/// buffer), never relabelled as host memory: the operations hand it to MPI as one
/// contiguous run and refuse any host-side pack of it.
///
/// **Nonblocking** operations (`immediate_*`, point-to-point and collectives) take every
/// tensor the blocking ones take: the [`TensorRequest`](crate::comm::TensorRequest) owns the
/// staged copies (pinned buffers, device scratch) until it completes, a send's copy is made
/// at the post and a receive's copied back to the device at completion (`wait`, `test`, or
/// the request's `Drop`). A nonblocking send is one ordinary message (never parted); a
/// nonblocking receive takes one ordinary message, so its sender must not part it: pair it
/// with a nonblocking send, a host sender, or a `DeviceComm` whose parting is off
/// ([`DeviceComm::pipeline_chunk_bytes`] 0) — a parted message's 40-byte header would
/// complete it with [`Error::CountMismatch`].
///
/// **Pipelining** (point-to-point only): a large staged contiguous send goes out in parts,
/// and `recv_tensor` recognises both forms, into a receive tensor of any
/// layout; the [`pipeline`](super::pipeline) module documents the wire format.
///
/// The errors are [`TensorComm`]'s plus
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
    /// [`crate::runtime::default_runtime`]; `None` handles host tensors only). `transport` decides
    /// whether CUDA tensors go direct: `Auto` asks [`cuda_awareness`] (call after
    /// `MPI_Init` and after the runtime made a CUDA context).
    ///
    /// # Errors
    /// [`Error::MpiLibraryMismatch`] when the process loaded another MPI release than the
    /// one this build was compiled against ([`crate::mpi_library::ensure_matching`]: the
    /// staged paths below reach MPI without every operand's facts);
    /// [`Error::TransportUnavailable`] for `Direct` when MPI is not CUDA-aware (handing it
    /// device pointers would crash) or there is no runtime; [`Error::InvalidSetting`] from
    /// `DLPACK_MPI_CUDA_AWARE`.
    pub fn new(
        comm: &'c C,
        runtime: Option<&'c dyn DeviceRuntime>,
        transport: Transport,
    ) -> Result<Self> {
        crate::mpi_library::ensure_matching()?;
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
                            crate::settings::CUDA_AWARE_ENV
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

    /// Whether CUDA tensors take the direct route (strided ones through a device scratch
    /// buffer).
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

    pub(super) fn note(&self, route: Route) {
        self.last_route.store(route as u8, Ordering::Relaxed);
    }

    pub(super) fn pipe(&self) -> Pipe<'_, 'c, C> {
        Pipe {
            comm: self.comm,
            runtime: self.runtime,
            pool: &self.pool,
            part_bytes: self.chunk_bytes,
        }
    }

    pub(super) fn place(
        &self,
        t: &dyn Tensor,
        reduce: Option<DType>,
        access: Access,
    ) -> Result<Option<Placement>> {
        Placement::of(t, reduce, access, self.direct, self.runtime)
    }

    /// Places the members of a fused bucket and packs them into one device bucket
    /// ([`Stager::stage_bucket`]): every member placed (an in-place member once, for
    /// [`Access::Update`]) and on one device before anything is allocated or copied;
    /// `(bytes, blocks)` as there.
    pub(super) fn bucket(
        &self,
        members: &[BucketMember<'_>],
        (bytes, blocks): (usize, usize),
        reduce: Option<DType>,
    ) -> Result<DeviceBucket<'_, 'c>> {
        let same = |a: &dyn Tensor, b: &dyn Tensor| {
            std::ptr::eq(
                std::ptr::from_ref(a).cast::<u8>(),
                std::ptr::from_ref(b).cast::<u8>(),
            )
        };
        let mut placed = Vec::with_capacity(members.len());
        let mut device = None;
        for m in members {
            let wrap = |e| Error::Member {
                index: m.index,
                source: Box::new(e),
            };
            let place = |t: &dyn Tensor, access| match self.place(t, reduce, access) {
                Ok(Some(p)) => Ok(p),
                Ok(None) => Err(wrap(Error::MixedDevices {
                    index: m.index,
                    device: t.device().to_string(),
                    first: "device memory".into(),
                })),
                Err(e) => Err(wrap(e)),
            };
            let (pack, unpack) = match (m.pack, m.unpack) {
                (Some(p), Some(u)) if same(p, u) => {
                    let x = place(u, Access::Update)?;
                    (Some(x.clone()), Some(x))
                }
                (p, u) => (
                    p.map(|t| place(t, Access::Read)).transpose()?,
                    u.map(|t| place(t, Access::Write)).transpose()?,
                ),
            };
            for d in pack.iter().chain(&unpack).map(|p| p.device) {
                match device {
                    None => device = Some(d),
                    Some(first) if first != d => {
                        return Err(wrap(Error::MixedDevices {
                            index: m.index,
                            device: d.to_string(),
                            first: first.to_string(),
                        }))
                    }
                    Some(_) => {}
                }
            }
            placed.push(PlacedMember {
                index: m.index,
                pack,
                unpack,
                at: m.at,
            });
        }
        let route = bucket_route(&placed);
        let device = device.unwrap_or(Device::CPU);
        let bucket = DeviceBucket::new(
            &placed,
            (bytes, blocks, device, route),
            &self.pool,
            self.runtime,
        )?;
        self.note(route);
        Ok(bucket)
    }

    /// Places `send` (read) and `recv` (`access`), checks that placed spans are disjoint,
    /// then stages both (every refusal comes before any copy) and notes the route.
    pub(super) fn stage_pair(
        &self,
        send: Option<(&dyn Tensor, Option<Placement>)>,
        recv: Option<(&dyn Tensor, Option<Placement>, Access)>,
    ) -> Result<(Stage<'_, 'c>, Stage<'_, 'c>)> {
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
        Ok((send, recv))
    }
}

impl<C: Communicator + ?Sized> Sealed for DeviceComm<'_, C> {}

impl<'c, C: Communicator + ?Sized> Endpoint for DeviceComm<'c, C> {
    type Comm = C;

    fn communicator(&self) -> &C {
        self.comm
    }

    fn stager(&self) -> Option<&dyn Stager> {
        Some(self)
    }
}

impl<C: Communicator + ?Sized> TensorComm for DeviceComm<'_, C> {
    /// [`TensorComm::send_tensor`]; a staged contiguous tensor above the pipeline part size
    /// goes out in parts ([`pipeline`](super::pipeline)).
    ///
    /// # Errors
    /// As [`TensorComm::send_tensor`] and the [type docs](DeviceComm).
    fn send_tensor(&self, tensor: &dyn Tensor, dest: Rank, tag: Tag) -> Result<()> {
        check_peer(self.comm, dest, tag)?;
        let placement = self.place(tensor, None, Access::Read)?;
        if let Some(p) = placement.as_ref().filter(|p| self.pipe().parts_send(p)) {
            self.note(Route::Staged);
            return self.pipe().send_parts(p, dest, tag);
        }
        p2p::send(self, tensor, dest, tag)
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
    fn recv_tensor(&self, tensor: &mut dyn Tensor, source: Rank, tag: Tag) -> Result<Status> {
        if source == any_source() || tag == any_tag() {
            // A wildcard receive takes one plain message (a parted send's parts must be
            // received from its source, with its tag).
            return p2p::recv(self, tensor, source, tag);
        }
        check_peer(self.comm, source, tag)?;
        let placement = self.place(&*tensor, None, Access::Write)?;
        if let Some(x) = self.parted_candidate(&*tensor, placement.as_ref())? {
            // The element count of a candidate fits usize (its bytes do).
            let total = usize::try_from(x.len_elems).unwrap_or(0);
            if let Some(first) = self
                .pipe()
                .recv_part_header(source, tag, total, x.element)?
            {
                if x.is_contiguous() {
                    return self.recv_parted(placement, &*tensor, &x, tag, first);
                }
                return self.recv_parted_strided(placement, tensor, (&x, total), tag, first);
            }
        }
        p2p::recv(self, tensor, source, tag)
    }
}
