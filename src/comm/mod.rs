#![doc = include_str!("overview.md")]

// `allow`: the settings re-exports left in `agree.rs` and `packing.rs` (`pub use
// crate::settings::…`, no longer re-exported from here) go when those files move; drop the
// two `allow`s with them.
#[allow(unused_imports)]
mod agree;
mod bcast;
mod blocks;
mod call;
mod checks;
mod collective;
mod fused;
mod held;
mod immediate;
mod mode;
mod operands;
pub(crate) mod p2p;
#[allow(unused_imports)]
mod packing;
mod pending;
pub(crate) mod reduce;
mod signature;
mod stager;
mod window;

use std::ops::Range;

use mpi::point_to_point::Status;
use mpi::request::{Request, Scope};
use mpi::topology::{Communicator, Rank};
use mpi::traits::*;
use mpi::Tag;

pub use agree::AGREEMENT_REASON_BYTES;
pub use bcast::BroadcastBuffer;
pub use blocks::Blocks;
pub(crate) use checks::{check_rank, check_tag};
pub use immediate::{test_any, wait_all, wait_any, TensorRequest};
pub(crate) use p2p::{recv_matched, unfit};
pub use packing::inner_block_bytes;
// The settings' earlier paths here (`comm::Agreement`, `comm::set_packing`, …; they are in
// `crate::settings`) and `ALONE_BYTES`, deprecated: a glob, so that any name this module
// declares or imports itself wins over them.
mod deprecated;
#[cfg(doc)]
use crate::settings::{Agreement, Packing};
pub use deprecated::*;

/// A member of a fused collective's list of at least this many bytes (256 KiB) has a bucket
/// of its own, reduced or broadcast on its own memory when it is contiguous: copying it into
/// a bucket and back costs more than the latency of one more collective (measured:
/// `docs/PERFORMANCE.md`, "Fused collectives"). A constant, so that every rank buckets a
/// list alike. (Named `ALONE_BYTES` before.)
pub const OWN_BUCKET_BYTES: usize = fused::ALONE_BYTES;
pub use reduce::halfops;
#[doc(hidden)]
pub use stager::{BucketMember, Operand, StagedBucket, StagedTensor, Stager, Staging};

use mode::{Blocking, Immediate};

use crate::dlpack::{Tensor, TensorList, TensorListMut};
use crate::dtype::ReduceOp;
#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::spec::{RecvSpec, SendSpec};

/// Checked tensor operations, for every rsmpi [`Communicator`] and for
/// `transport::DeviceComm` (the same list, written once).
///
/// Tensors are passed as `&dyn Tensor` (any [`crate::dlpack::ManagedTensor`] or
/// [`crate::dlpack::TensorView`]). Arguments only the root uses are `Option`s; they are
/// required at the root ([`Error::MissingBuffer`] without them); at another rank they may be
/// `None`, and when given they are checked as at the root (and not used; `DeviceComm`
/// neither stages nor copies them there).
///
/// Every collective (broadcast, reductions, gathers, scatters, all-to-alls) agrees across
/// the ranks before moving data (see [`Agreement`]): besides the errors each method lists,
/// it returns [`Error::PeerRefused`] when another rank refused its arguments, and
/// [`Error::InvalidSetting`] when `DLPACK_MPI_AGREEMENT` holds a value other than
/// `collective` or `local`. On any error no rank has entered the data operation (under
/// [`Agreement::Local`]: only this rank).
pub trait TensorComm {
    /// The rsmpi communicator the operations run on.
    type Comm: Communicator + ?Sized;

    /// The communicator the operations run on (`self` for an rsmpi communicator).
    fn communicator(&self) -> &Self::Comm;

    /// The device staging below the operations; `None` (the default): the operands are
    /// the caller's tensors, which must be host memory.
    #[doc(hidden)]
    fn stager(&self) -> Option<&dyn Stager> {
        None
    }

    /// Blocking standard-mode send of all elements of `tensor` to `dest` (MPI-4.1 §3.2.1).
    ///
    /// # Errors
    /// [`Error::InvalidRank`], [`Error::InvalidTag`] and the errors of [`SendSpec::new`].
    fn send_tensor(&self, tensor: &dyn Tensor, dest: Rank, tag: Tag) -> Result<()> {
        p2p::send(self, tensor, dest, tag)
    }

    /// Blocking receive into `tensor` from `source` with `tag`. The incoming message is
    /// matched first (`MPI_Mprobe`, MPI-4.1 §3.8.2: it is taken off the queue for this call
    /// alone) and received (`MPI_Mrecv`, §3.8.3) only when its size is exactly the
    /// tensor's. The tensor is checked, and a packing scratch allocated, before the probe.
    ///
    /// **Threads** (`MPI_THREAD_MULTIPLE`): two threads receiving from the same
    /// `(source, tag)` at once each get one whole message, never the other's: the message
    /// a thread matched is the message it receives or holds in its error.
    ///
    /// # Errors
    /// [`Error::Unfit`] when the matched message is not the tensor's size: its `mismatch`
    /// is [`Error::CountMismatch`] naming the expected and arriving element counts, and its
    /// `message` ([`crate::error::Unreceived`]) holds the message, which no other receive
    /// can take: receive it with [`crate::error::Unreceived::recv_into`] into a tensor of
    /// the right size ([`crate::error::Unreceived::len_bytes`]); dropping the error
    /// receives and discards it (C43). [`Error::InvalidRank`]; [`Error::InvalidTag`]; the
    /// errors of [`RecvSpec::new`] (nothing matched).
    fn recv_tensor(&self, tensor: &mut dyn Tensor, source: Rank, tag: Tag) -> Result<Status> {
        p2p::recv(self, tensor, source, tag)
    }

    /// Send `send` to `dest` and receive `recv` from `source` at once (`MPI_Sendrecv`
    /// semantics, deadlock-free in a ring). The incoming message is matched and its size
    /// checked as in [`TensorComm::recv_tensor`] while the send is in flight; one that
    /// does not fit is returned held in [`Error::Unfit`] once the send is complete. The
    /// send completes only when its receiver receives it (for messages beyond the MPI
    /// library's eager limit): if every rank of a ring holds its incoming message this way,
    /// their sends wait for each other forever, so size the receives to match.
    ///
    /// # Errors
    /// As [`TensorComm::send_tensor`] and [`TensorComm::recv_tensor`].
    #[allow(clippy::too_many_arguments)]
    fn sendrecv_tensor(
        &self,
        send: &dyn Tensor,
        dest: Rank,
        send_tag: Tag,
        recv: &mut dyn Tensor,
        source: Rank,
        recv_tag: Tag,
    ) -> Result<Status> {
        p2p::sendrecv(self, send, (dest, send_tag), recv, (source, recv_tag))
    }

    /// Nonblocking send of all elements of `tensor` to `dest` inside an rsmpi scope
    /// (`MPI_Isend`, MPI-4.1 §3.7.2): the nonblocking form of [`TensorComm::send_tensor`],
    /// with the same argument, packing policy ([`Packing`]) and wire format (the elements
    /// in logical row-major order).
    ///
    /// The returned [`TensorRequest`] borrows `tensor` for `'a` and owns the packed copy
    /// when the policy packs the layout (a pool buffer, handed back at completion);
    /// contiguous tensors and derived-datatype layouts go without a copy. Complete it with
    /// [`TensorRequest::wait`]; dropping it uncompleted waits (see [`TensorRequest`]).
    ///
    /// # Errors
    /// [`Error::InvalidRank`], [`Error::InvalidTag`] and the errors of [`SendSpec::new`]
    /// and of packing ([`Error::InvalidSetting`], [`Error::Allocation`],
    /// [`Error::CountTooLarge`]), all before anything is posted.
    fn immediate_send_tensor<'a, Sc: Scope<'a>>(
        &'a self,
        scope: Sc,
        tensor: &'a dyn Tensor,
        dest: Rank,
        tag: Tag,
    ) -> Result<TensorRequest<'a, Sc>> {
        immediate::send(self, scope, tensor, dest, tag)
    }

    /// Nonblocking receive into all elements of `tensor` from `source` inside an rsmpi
    /// scope (`MPI_Irecv`, MPI-4.1 §3.7.2): the nonblocking form of
    /// [`TensorComm::recv_tensor`], same argument and packing policy. A strided tensor the
    /// policy packs is received into a pool buffer the [`TensorRequest`] owns and unpacked
    /// into `tensor` at completion ([`TensorRequest::wait`]).
    ///
    /// The size cannot be probed before posting: a longer message is MPI's truncation
    /// error (fatal under the default error handler), a shorter one is
    /// [`Error::CountMismatch`] from [`TensorRequest::wait`]; use it where sizes are agreed
    /// (or use [`TensorComm::recv_tensor`]).
    ///
    /// # Errors
    /// [`Error::InvalidRank`], [`Error::InvalidTag`] and the errors of [`RecvSpec::new`]
    /// (e.g. [`Error::ReadOnly`], [`Error::Immutable`]) and of packing, before anything is
    /// posted.
    fn immediate_recv_tensor<'a, Sc: Scope<'a>>(
        &'a self,
        scope: Sc,
        tensor: &'a mut dyn Tensor,
        source: Rank,
        tag: Tag,
    ) -> Result<TensorRequest<'a, Sc>> {
        immediate::recv(self, scope, tensor, source, tag)
    }

    /// Nonblocking send of a prebuilt spec inside an rsmpi scope (`MPI_Isend`, §3.7.2),
    /// used as given: a strided spec goes as its derived datatype, never packed (the
    /// [`Packing`] policy is not consulted). Build the spec before the scope; the request
    /// borrows it, so the tensor outlives the request. (Named `immediate_send_tensor`
    /// before; that name now takes a tensor.)
    ///
    /// A request dropped uncompleted (e.g. when `?` leaves the scope after a later error)
    /// makes rsmpi panic: check arguments before posting several requests, or use
    /// [`TensorComm::immediate_send_tensor`], whose requests wait when dropped.
    ///
    /// # Errors
    /// [`Error::InvalidRank`], [`Error::InvalidTag`].
    fn immediate_send_spec<'a, 't: 'a, Sc: Scope<'a>>(
        &self,
        scope: Sc,
        spec: &'a SendSpec<'t>,
        dest: Rank,
        tag: Tag,
    ) -> Result<Request<'a, SendSpec<'t>, Sc>> {
        let comm = self.communicator();
        check_rank(dest, comm.target_size())?;
        check_tag(tag)?;
        Ok(comm
            .process_at_rank(dest)
            .immediate_send_with_tag(scope, spec, tag))
    }

    /// Nonblocking receive into a prebuilt spec inside an rsmpi scope (`MPI_Irecv`,
    /// §3.7.2), used as given (never packed). The size cannot be probed before posting; a
    /// longer message is an MPI truncation error, so use it where sizes are agreed. (Named
    /// `immediate_recv_tensor` before; that name now takes a tensor.)
    ///
    /// # Errors
    /// [`Error::InvalidRank`], [`Error::InvalidTag`].
    fn immediate_recv_spec<'a, 't: 'a, Sc: Scope<'a>>(
        &self,
        scope: Sc,
        spec: &'a mut RecvSpec<'t>,
        source: Rank,
        tag: Tag,
    ) -> Result<Request<'a, RecvSpec<'t>, Sc>> {
        let comm = self.communicator();
        check_rank(source, comm.target_size())?;
        check_tag(tag)?;
        Ok(comm
            .process_at_rank(source)
            .immediate_receive_into_with_tag(scope, spec, tag))
    }

    /// Blocking send of the window `elems` = `[start, end)` of `tensor` (in elements,
    /// logical row-major order) to `dest`: mpi4py's `[buf, count, displacement]` with
    /// `displacement = start`, `count = end - start`. The message is those `end - start`
    /// elements in logical order, for any layout: a contiguous tensor's window goes without
    /// a copy, a strided tensor's through a packed copy of the whole tensor.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] naming the displacement, count and tensor length when the
    /// window leaves the tensor (also for `end < start`); [`Error::InvalidRank`];
    /// [`Error::InvalidTag`]; the errors of [`SendSpec::new`] and of packing
    /// ([`Error::Allocation`], ...). All before any MPI call.
    fn send_tensor_range(
        &self,
        tensor: &dyn Tensor,
        elems: Range<i64>,
        dest: Rank,
        tag: Tag,
    ) -> Result<()> {
        window::send(self, tensor, elems, dest, tag)
    }

    /// Blocking receive into the window `elems` = `[start, end)` of `tensor` (elements),
    /// matched first as in [`TensorComm::recv_tensor`]: the message must be exactly
    /// `end - start` elements. Elements outside the window keep their values (a strided
    /// tensor is packed whole, received into, and unpacked whole).
    ///
    /// # Errors
    /// As [`TensorComm::send_tensor_range`], plus [`Error::Unfit`] around
    /// [`Error::CountMismatch`] (the message held, as in [`TensorComm::recv_tensor`]) and
    /// the errors of [`RecvSpec::range`] ([`Error::ReadOnly`], ...).
    fn recv_tensor_range(
        &self,
        tensor: &mut dyn Tensor,
        elems: Range<i64>,
        source: Rank,
        tag: Tag,
    ) -> Result<Status> {
        window::recv(self, tensor, elems, source, tag)
    }

    /// Nonblocking [`TensorComm::send_tensor_range`] (`MPI_Isend`, §3.7.2) inside an
    /// rsmpi scope; the [`TensorRequest`] owns the packed copy of a strided tensor.
    ///
    /// # Errors
    /// As [`TensorComm::send_tensor_range`], before anything is posted.
    fn immediate_send_tensor_range<'a, Sc: Scope<'a>>(
        &'a self,
        scope: Sc,
        tensor: &'a dyn Tensor,
        elems: Range<i64>,
        dest: Rank,
        tag: Tag,
    ) -> Result<TensorRequest<'a, Sc>> {
        window::immediate_send(self, scope, tensor, elems, dest, tag)
    }

    /// Nonblocking receive into the window `elems` of `tensor` (`MPI_Irecv`, §3.7.2);
    /// sizes as in [`TensorComm::immediate_recv_tensor`] (not probed: a shorter message is
    /// [`Error::CountMismatch`] from [`TensorRequest::wait`]). A strided tensor is packed
    /// whole when posted and unpacked whole at completion.
    ///
    /// # Errors
    /// As [`TensorComm::recv_tensor_range`] without the probe, before anything is posted.
    fn immediate_recv_tensor_range<'a, Sc: Scope<'a>>(
        &'a self,
        scope: Sc,
        tensor: &'a mut dyn Tensor,
        elems: Range<i64>,
        source: Rank,
        tag: Tag,
    ) -> Result<TensorRequest<'a, Sc>> {
        window::immediate_recv(self, scope, tensor, elems, source, tag)
    }

    /// Broadcast from `root` where each rank says what it holds (`MPI_Bcast`, §6.4): the
    /// root passes [`BroadcastBuffer::Send`] with a shared tensor (only read; it may be
    /// `READ_ONLY`) or [`BroadcastBuffer::Recv`]; every other rank passes
    /// [`BroadcastBuffer::Recv`] with a tensor of the root's count and dtype, which is
    /// written. Same wire format and packing policy as [`TensorComm::broadcast_tensor`].
    ///
    /// # Errors
    /// [`Error::BroadcastNotRoot`] when a rank other than `root` passes
    /// [`BroadcastBuffer::Send`]; [`Error::InvalidRank`]; [`Error::Intercommunicator`]; the
    /// errors of [`SendSpec::new`] at the root and of [`RecvSpec::new`] elsewhere. Like
    /// every local error of a collective, it is returned before the data operation, and the
    /// other ranks return [`Error::PeerRefused`] (under [`Agreement::Local`] they wait).
    fn broadcast_tensor_from(&self, buffer: BroadcastBuffer<'_>, root: Rank) -> Result<()> {
        collective::broadcast(self, Blocking, buffer.reborrow(), root)
    }

    /// Broadcast `tensor` from `root` (`MPI_Bcast`, §6.4). At the root the tensor is only
    /// read (it may be `READ_ONLY`); elsewhere it is received into. A root that holds only
    /// a shared `&dyn Tensor` uses [`TensorComm::broadcast_tensor_from`].
    ///
    /// # Errors
    /// [`Error::InvalidRank`]; the errors of [`SendSpec::new`] at the root and of
    /// [`RecvSpec::new`] elsewhere.
    fn broadcast_tensor(&self, tensor: &mut dyn Tensor, root: Rank) -> Result<()> {
        collective::broadcast(self, Blocking, BroadcastBuffer::Recv(tensor), root)
    }

    /// Reduce `send` from every rank into `recv` at `root` (`MPI_Reduce`, §6.9.1).
    ///
    /// # Errors
    /// [`Error::UnsupportedReduction`], [`Error::DtypeMismatch`], [`Error::CountMismatch`],
    /// [`Error::MissingBuffer`] (the root has no `recv`), [`Error::InvalidRank`], spec errors.
    fn reduce_tensor(
        &self,
        send: &dyn Tensor,
        recv: Option<&mut dyn Tensor>,
        op: ReduceOp,
        root: Rank,
    ) -> Result<()> {
        let recv = recv.map(|r| r as &mut dyn Tensor);
        reduce::reduce(self, Blocking, send, recv, op, root)
    }

    /// Element-wise reduction of `send` over all ranks into every rank's `recv`
    /// (`MPI_Allreduce`, §6.9.6).
    ///
    /// # Errors
    /// [`Error::UnsupportedReduction`], [`Error::DtypeMismatch`], [`Error::CountMismatch`],
    /// spec errors.
    fn all_reduce_tensor(
        &self,
        send: &dyn Tensor,
        recv: &mut dyn Tensor,
        op: ReduceOp,
    ) -> Result<()> {
        reduce::all_reduce(self, Blocking, send, recv, op)
    }

    /// In-place all-reduce: `tensor` is both input and output (`MPI_IN_PLACE`, §6.9.6).
    ///
    /// # Errors
    /// [`Error::UnsupportedReduction`], the errors of [`RecvSpec::new`].
    fn all_reduce_tensor_in_place(&self, tensor: &mut dyn Tensor, op: ReduceOp) -> Result<()> {
        reduce::all_reduce_in_place(self, Blocking, tensor, op)
    }

    /// Gather every rank's `send` into `recv` at `root`, rank order (`MPI_Gather`, §6.5).
    /// `recv` has `size × send` elements.
    ///
    /// # Errors
    /// [`Error::CountMismatch`], [`Error::DtypeMismatch`], [`Error::MissingBuffer`],
    /// [`Error::InvalidRank`], spec errors.
    fn gather_tensor(
        &self,
        send: &dyn Tensor,
        recv: Option<&mut dyn Tensor>,
        root: Rank,
    ) -> Result<()> {
        let recv = recv.map(|r| r as &mut dyn Tensor);
        collective::gather(self, Blocking, send, recv, root)
    }

    /// Gather blocks of varying size (`MPI_Gatherv`, §6.5). At the root, `recv` is the
    /// tensor with its per-rank [`Blocks`] (counts and displacements, one per rank, in
    /// elements); its own block must equal its `send` count.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`], [`Error::OutOfBounds`], [`Error::BlocksOverlap`],
    /// [`Error::CountMismatch`], [`Error::DtypeMismatch`], [`Error::MissingBuffer`],
    /// [`Error::InvalidRank`], spec errors.
    fn gatherv_tensor(
        &self,
        send: &dyn Tensor,
        recv: Option<(&mut dyn Tensor, Blocks<'_>)>,
        root: Rank,
    ) -> Result<()> {
        let recv = recv.map(|(t, b)| (t as &mut dyn Tensor, b.counts, b.displacements));
        collective::gatherv(self, Blocking, send, recv, root)
    }

    /// Scatter consecutive blocks of the root's `send` to every rank's `recv`
    /// (`MPI_Scatter`, §6.6). `send` has `size × recv` elements.
    ///
    /// # Errors
    /// As [`TensorComm::gather_tensor`].
    fn scatter_tensor(
        &self,
        send: Option<&dyn Tensor>,
        recv: &mut dyn Tensor,
        root: Rank,
    ) -> Result<()> {
        collective::scatter(self, Blocking, send, recv, root)
    }

    /// Scatter blocks of varying size (`MPI_Scatterv`, §6.6).
    ///
    /// # Errors
    /// As [`TensorComm::gatherv_tensor`].
    fn scatterv_tensor(
        &self,
        send: Option<(&dyn Tensor, Blocks<'_>)>,
        recv: &mut dyn Tensor,
        root: Rank,
    ) -> Result<()> {
        let send = send.map(|(t, b)| (t, b.counts, b.displacements));
        collective::scatterv(self, Blocking, send, recv, root)
    }

    /// Every rank gathers every rank's `send` into `recv` (`MPI_Allgather`, §6.7).
    ///
    /// # Errors
    /// [`Error::CountMismatch`], [`Error::DtypeMismatch`], spec errors.
    fn all_gather_tensor(&self, send: &dyn Tensor, recv: &mut dyn Tensor) -> Result<()> {
        collective::all_gather(self, Blocking, send, recv)
    }

    /// All-gather with blocks of varying size (`MPI_Allgatherv`, §6.7): `blocks` (counts
    /// and displacements in elements, one per rank) place each rank's block in `recv`;
    /// `blocks.counts[rank]` must equal this rank's `send` count, and every rank must pass
    /// the same counts (the agreement compares them: [`Error::CollectiveMismatch`]).
    ///
    /// # Errors
    /// As [`TensorComm::gatherv_tensor`].
    fn all_gatherv_tensor(
        &self,
        send: &dyn Tensor,
        recv: &mut dyn Tensor,
        blocks: Blocks<'_>,
    ) -> Result<()> {
        collective::all_gatherv(
            self,
            Blocking,
            send,
            recv,
            blocks.counts,
            blocks.displacements,
        )
    }

    /// Personalized exchange: block `i` of `send` goes to rank `i`, block `j` of `recv`
    /// comes from rank `j` (`MPI_Alltoall`, §6.8). Both have `size × block` elements.
    ///
    /// # Errors
    /// [`Error::CountMismatch`] (counts differ or are not a multiple of the size),
    /// [`Error::DtypeMismatch`], spec errors.
    fn all_to_all_tensor(&self, send: &dyn Tensor, recv: &mut dyn Tensor) -> Result<()> {
        collective::all_to_all(self, Blocking, send, recv)
    }

    /// All-to-all with blocks of varying size (`MPI_Alltoallv`, §6.8): block `i` of
    /// `send_blocks` goes to rank `i`, block `j` of `recv_blocks` comes from rank `j`.
    ///
    /// # Errors
    /// As [`TensorComm::gatherv_tensor`], for both sides.
    fn all_to_allv_tensor(
        &self,
        send: &dyn Tensor,
        send_blocks: Blocks<'_>,
        recv: &mut dyn Tensor,
        recv_blocks: Blocks<'_>,
    ) -> Result<()> {
        collective::all_to_allv(
            self,
            Blocking,
            (send, send_blocks.counts, send_blocks.displacements),
            (recv, recv_blocks.counts, recv_blocks.displacements),
        )
    }

    /// Reduce `send` element-wise over all ranks and scatter equal blocks of the result
    /// (`MPI_Reduce_scatter_block`, §6.10.1): `send` has `size × recv` elements.
    ///
    /// # Errors
    /// [`Error::UnsupportedReduction`], [`Error::CountMismatch`], [`Error::DtypeMismatch`],
    /// spec errors.
    fn reduce_scatter_block_tensor(
        &self,
        send: &dyn Tensor,
        recv: &mut dyn Tensor,
        op: ReduceOp,
    ) -> Result<()> {
        reduce::reduce_scatter_block(self, Blocking, send, recv, op)
    }

    // Nonblocking collectives (MPI-4.1 §6.12). Each is the blocking method's body run in
    // the nonblocking mode: the same arguments, checks, errors, wire format and agreement,
    // inside an rsmpi scope, returning a [`TensorRequest`] that owns the packed copies,
    // the staged copies of a `DeviceComm` and the operation's per-rank arrays until it
    // completes. Posting never waits for the peers (only a rank that refuses its own
    // arguments returns its error once they have posted the same collective); the data
    // operation is posted when the agreement completes, in `test`/`wait` (see
    // [`TensorComm::immediate_all_reduce_tensor`]).

    /// Nonblocking [`TensorComm::all_reduce_tensor`] (`MPI_Iallreduce`, MPI-4.1 §6.12.8).
    ///
    /// **What progresses when.** The post checks and prepares both sides (packing a strided
    /// `send`), and posts the agreement (`MPI_Iallreduce` of three `int64_t` on this
    /// communicator). [`TensorRequest::test`] and [`TensorRequest::wait`] (and the test
    /// or wait of any later request) complete the agreement and then post the data
    /// operation, on a duplicate of this communicator made at the first nonblocking
    /// collective, in posting order; `wait` then completes it and unpacks `recv`. MPI
    /// matches nonblocking collectives in the order each rank posts them (MPI-4.1 §6.12):
    /// post them in the same order on every rank, as blocking ones; they may be completed
    /// in any order. Under [`Agreement::Local`] the data operation is posted at once.
    ///
    /// # Errors
    /// As [`TensorComm::all_reduce_tensor`]: this rank's own refusal from the post; from
    /// [`TensorRequest::wait`], [`Error::PeerRefused`] and [`Error::CollectiveMismatch`].
    fn immediate_all_reduce_tensor<'a, Sc: Scope<'a> + Copy>(
        &'a self,
        scope: Sc,
        send: &'a dyn Tensor,
        recv: &'a mut dyn Tensor,
        op: ReduceOp,
    ) -> Result<TensorRequest<'a, Sc>> {
        reduce::all_reduce(self, Immediate(scope), send, recv, op)
    }

    /// Nonblocking [`TensorComm::all_reduce_tensor_in_place`] (`MPI_Iallreduce` with
    /// `MPI_IN_PLACE`); progress and errors as [`TensorComm::immediate_all_reduce_tensor`].
    ///
    /// # Errors
    /// As [`TensorComm::all_reduce_tensor_in_place`].
    fn immediate_all_reduce_tensor_in_place<'a, Sc: Scope<'a> + Copy>(
        &'a self,
        scope: Sc,
        tensor: &'a mut dyn Tensor,
        op: ReduceOp,
    ) -> Result<TensorRequest<'a, Sc>> {
        reduce::all_reduce_in_place(self, Immediate(scope), tensor, op)
    }

    /// Nonblocking [`TensorComm::reduce_tensor`] (`MPI_Ireduce`, §6.12.7).
    ///
    /// # Errors
    /// As [`TensorComm::reduce_tensor`] and [`TensorComm::immediate_all_reduce_tensor`].
    fn immediate_reduce_tensor<'a, Sc: Scope<'a> + Copy>(
        &'a self,
        scope: Sc,
        send: &'a dyn Tensor,
        recv: Option<&'a mut dyn Tensor>,
        op: ReduceOp,
        root: Rank,
    ) -> Result<TensorRequest<'a, Sc>> {
        reduce::reduce(self, Immediate(scope), send, recv, op, root)
    }

    /// Nonblocking [`TensorComm::reduce_scatter_block_tensor`]
    /// (`MPI_Ireduce_scatter_block`, §6.12.9).
    ///
    /// # Errors
    /// As [`TensorComm::reduce_scatter_block_tensor`].
    fn immediate_reduce_scatter_block_tensor<'a, Sc: Scope<'a> + Copy>(
        &'a self,
        scope: Sc,
        send: &'a dyn Tensor,
        recv: &'a mut dyn Tensor,
        op: ReduceOp,
    ) -> Result<TensorRequest<'a, Sc>> {
        reduce::reduce_scatter_block(self, Immediate(scope), send, recv, op)
    }

    /// Nonblocking [`TensorComm::broadcast_tensor`] (`MPI_Ibcast`, §6.12.2).
    ///
    /// # Errors
    /// As [`TensorComm::broadcast_tensor`].
    fn immediate_broadcast_tensor<'a, Sc: Scope<'a> + Copy>(
        &'a self,
        scope: Sc,
        tensor: &'a mut dyn Tensor,
        root: Rank,
    ) -> Result<TensorRequest<'a, Sc>> {
        let buffer = BroadcastBuffer::Recv(tensor);
        collective::broadcast(self, Immediate(scope), buffer, root)
    }

    /// Nonblocking [`TensorComm::broadcast_tensor_from`] (`MPI_Ibcast`, §6.12.2).
    ///
    /// # Errors
    /// As [`TensorComm::broadcast_tensor_from`].
    fn immediate_broadcast_tensor_from<'a, Sc: Scope<'a> + Copy>(
        &'a self,
        scope: Sc,
        buffer: BroadcastBuffer<'a>,
        root: Rank,
    ) -> Result<TensorRequest<'a, Sc>> {
        collective::broadcast(self, Immediate(scope), buffer, root)
    }

    /// Nonblocking [`TensorComm::gather_tensor`] (`MPI_Igather`, §6.12.3).
    ///
    /// # Errors
    /// As [`TensorComm::gather_tensor`].
    fn immediate_gather_tensor<'a, Sc: Scope<'a> + Copy>(
        &'a self,
        scope: Sc,
        send: &'a dyn Tensor,
        recv: Option<&'a mut dyn Tensor>,
        root: Rank,
    ) -> Result<TensorRequest<'a, Sc>> {
        collective::gather(self, Immediate(scope), send, recv, root)
    }

    /// Nonblocking [`TensorComm::gatherv_tensor`] (`MPI_Igatherv`, §6.12.3); the request
    /// owns the blocks in MPI units.
    ///
    /// # Errors
    /// As [`TensorComm::gatherv_tensor`].
    fn immediate_gatherv_tensor<'a, Sc: Scope<'a> + Copy>(
        &'a self,
        scope: Sc,
        send: &'a dyn Tensor,
        recv: Option<(&'a mut dyn Tensor, Blocks<'a>)>,
        root: Rank,
    ) -> Result<TensorRequest<'a, Sc>> {
        let recv = recv.map(|(t, b)| (t, b.counts, b.displacements));
        collective::gatherv(self, Immediate(scope), send, recv, root)
    }

    /// Nonblocking [`TensorComm::scatter_tensor`] (`MPI_Iscatter`, §6.12.4).
    ///
    /// # Errors
    /// As [`TensorComm::scatter_tensor`].
    fn immediate_scatter_tensor<'a, Sc: Scope<'a> + Copy>(
        &'a self,
        scope: Sc,
        send: Option<&'a dyn Tensor>,
        recv: &'a mut dyn Tensor,
        root: Rank,
    ) -> Result<TensorRequest<'a, Sc>> {
        collective::scatter(self, Immediate(scope), send, recv, root)
    }

    /// Nonblocking [`TensorComm::scatterv_tensor`] (`MPI_Iscatterv`, §6.12.4).
    ///
    /// # Errors
    /// As [`TensorComm::scatterv_tensor`].
    fn immediate_scatterv_tensor<'a, Sc: Scope<'a> + Copy>(
        &'a self,
        scope: Sc,
        send: Option<(&'a dyn Tensor, Blocks<'a>)>,
        recv: &'a mut dyn Tensor,
        root: Rank,
    ) -> Result<TensorRequest<'a, Sc>> {
        let send = send.map(|(t, b)| (t, b.counts, b.displacements));
        collective::scatterv(self, Immediate(scope), send, recv, root)
    }

    /// Nonblocking [`TensorComm::all_gather_tensor`] (`MPI_Iallgather`, §6.12.5).
    ///
    /// # Errors
    /// As [`TensorComm::all_gather_tensor`].
    fn immediate_all_gather_tensor<'a, Sc: Scope<'a> + Copy>(
        &'a self,
        scope: Sc,
        send: &'a dyn Tensor,
        recv: &'a mut dyn Tensor,
    ) -> Result<TensorRequest<'a, Sc>> {
        collective::all_gather(self, Immediate(scope), send, recv)
    }

    /// Nonblocking [`TensorComm::all_gatherv_tensor`] (`MPI_Iallgatherv`, §6.12.5).
    ///
    /// # Errors
    /// As [`TensorComm::all_gatherv_tensor`].
    fn immediate_all_gatherv_tensor<'a, Sc: Scope<'a> + Copy>(
        &'a self,
        scope: Sc,
        send: &'a dyn Tensor,
        recv: &'a mut dyn Tensor,
        blocks: Blocks<'a>,
    ) -> Result<TensorRequest<'a, Sc>> {
        let (counts, displacements) = (blocks.counts, blocks.displacements);
        collective::all_gatherv(self, Immediate(scope), send, recv, counts, displacements)
    }

    /// Nonblocking [`TensorComm::all_to_all_tensor`] (`MPI_Ialltoall`, §6.12.6).
    ///
    /// # Errors
    /// As [`TensorComm::all_to_all_tensor`].
    fn immediate_all_to_all_tensor<'a, Sc: Scope<'a> + Copy>(
        &'a self,
        scope: Sc,
        send: &'a dyn Tensor,
        recv: &'a mut dyn Tensor,
    ) -> Result<TensorRequest<'a, Sc>> {
        collective::all_to_all(self, Immediate(scope), send, recv)
    }

    /// Nonblocking [`TensorComm::all_to_allv_tensor`] (`MPI_Ialltoallv`, §6.12.6).
    ///
    /// # Errors
    /// As [`TensorComm::all_to_allv_tensor`].
    fn immediate_all_to_allv_tensor<'a, Sc: Scope<'a> + Copy>(
        &'a self,
        scope: Sc,
        send: (&'a dyn Tensor, Blocks<'a>),
        recv: (&'a mut dyn Tensor, Blocks<'a>),
    ) -> Result<TensorRequest<'a, Sc>> {
        collective::all_to_allv(
            self,
            Immediate(scope),
            (send.0, send.1.counts, send.1.displacements),
            (recv.0, recv.1.counts, recv.1.displacements),
        )
    }

    // Fused collectives over a list of tensors (`fused`): the members go in buckets of
    // one dtype (`settings::bucket_bytes`, `settings::first_bucket_bytes`), one agreement
    // for the list and one collective per bucket, packing, sending and unpacking
    // overlapped across buckets. A list is any `TensorList` (read) or `TensorListMut`
    // (written): a slice, `Vec` or array of guards, views or references to them. As for one
    // tensor, the plain name sends one list into another and `_in_place` works on one list.

    /// All-reduce every tensor of `tensors` in place, as few messages: the members of one
    /// dtype go in buckets (a pooled buffer each, members packed in list order in logical
    /// row-major order; strided members allowed), one `MPI_Allreduce` per bucket, each
    /// bucket unpacked into its members as it lands. Every rank passes a list of the same
    /// length, dtypes and element counts (the agreement compares them). The result of each
    /// member is what [`TensorComm::all_reduce_tensor_in_place`] gives it.
    ///
    /// `tensors` is any [`TensorListMut`]: `&mut guards` for a `Vec<ManagedTensor>`, a
    /// slice or array of them, or of `&mut dyn Tensor`; members may differ in dtype.
    ///
    /// # Errors
    /// [`Error::Member`] naming the first member refused (its `READ_ONLY`, device, layout,
    /// or a reduction its dtype does not have; around [`Error::BuffersAlias`] when it shares
    /// memory with an earlier member); [`Error::MixedDevices`]; [`Error::CollectiveMismatch`]
    /// when the lists differ across ranks; the pool's errors. All before any data moves, on
    /// every rank.
    fn all_reduce_tensors_in_place<L: TensorListMut + ?Sized>(
        &self,
        tensors: &mut L,
        op: ReduceOp,
    ) -> Result<()> {
        fused::all_reduce_tensors(self, Blocking, None, &mut tensors.tensors_mut(), op)
    }

    /// All-reduce the members of `send` into those of `recv` (pairwise: same length,
    /// dtype and count per member), as [`TensorComm::all_reduce_tensors_in_place`] does in
    /// place; the plural of [`TensorComm::all_reduce_tensor`]. (Before: the name of the
    /// in-place form, and this one was `all_reduce_tensors_into`.)
    ///
    /// # Errors
    /// As [`TensorComm::all_reduce_tensors_in_place`], and [`Error::ListLengthMismatch`] for
    /// lists of different lengths, [`Error::Member`] around a pair's [`Error::DtypeMismatch`]
    /// or [`Error::CountMismatch`].
    fn all_reduce_tensors<S: TensorList + ?Sized, L: TensorListMut + ?Sized>(
        &self,
        send: &S,
        recv: &mut L,
        op: ReduceOp,
    ) -> Result<()> {
        let send = send.tensors();
        fused::all_reduce_tensors(self, Blocking, Some(&send), &mut recv.tensors_mut(), op)
    }

    /// The earlier name of [`TensorComm::all_reduce_tensors`], deprecated.
    ///
    /// # Errors
    /// As [`TensorComm::all_reduce_tensors`].
    #[deprecated(note = "renamed `all_reduce_tensors` (send list, receive list, op)")]
    #[doc(hidden)]
    fn all_reduce_tensors_into(
        &self,
        send: &[&dyn Tensor],
        recv: &mut [&mut dyn Tensor],
        op: ReduceOp,
    ) -> Result<()> {
        self.all_reduce_tensors(send, recv, op)
    }

    /// Broadcast every tensor of `tensors` from `root` as few messages (buckets as in
    /// [`TensorComm::all_reduce_tensors_in_place`]; one `MPI_Bcast` per bucket). At the root
    /// the members are only read (they may be `READ_ONLY`).
    ///
    /// # Errors
    /// As [`TensorComm::all_reduce_tensors_in_place`], and [`Error::InvalidRank`].
    fn broadcast_tensors<L: TensorListMut + ?Sized>(
        &self,
        tensors: &mut L,
        root: Rank,
    ) -> Result<()> {
        fused::broadcast_tensors(self, Blocking, &mut tensors.tensors_mut(), root)
    }

    /// Reduce-scatter a list (`MPI_Reduce_scatter_block` per bucket): member `i` of `send`
    /// holds `size` × the elements of member `i` of `recv`; rank `r` receives the
    /// element-wise reduction of every rank's block `r`, member by member (what
    /// [`TensorComm::reduce_scatter_block_tensor`] gives each pair). (Before:
    /// `reduce_scatter_tensors`.)
    ///
    /// # Errors
    /// As [`TensorComm::all_reduce_tensors`], and [`Error::CountTooLarge`] for a bucket
    /// beyond `int` units per rank.
    fn reduce_scatter_block_tensors<S: TensorList + ?Sized, L: TensorListMut + ?Sized>(
        &self,
        send: &S,
        recv: &mut L,
        op: ReduceOp,
    ) -> Result<()> {
        let send = send.tensors();
        let recv = &mut recv.tensors_mut();
        fused::reduce_scatter_block_tensors(self, Blocking, &send, recv, op)
    }

    /// The earlier name of [`TensorComm::reduce_scatter_block_tensors`], deprecated.
    ///
    /// # Errors
    /// As [`TensorComm::reduce_scatter_block_tensors`].
    #[deprecated(note = "renamed `reduce_scatter_block_tensors`")]
    #[doc(hidden)]
    fn reduce_scatter_tensors(
        &self,
        send: &[&dyn Tensor],
        recv: &mut [&mut dyn Tensor],
        op: ReduceOp,
    ) -> Result<()> {
        self.reduce_scatter_block_tensors(send, recv, op)
    }

    /// Nonblocking [`TensorComm::all_reduce_tensors_in_place`]: the post checks every
    /// member, takes the buckets and posts the agreement; `test`/`wait` post every bucket
    /// once it completes (packing bucket k+1 while bucket k is on the wire) and unpack each
    /// as it lands. The request borrows the list (and so every member) until it completes.
    ///
    /// ```compile_fail,E0505
    /// use dlpack_mpi::comm::TensorComm;
    /// use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned};
    /// use dlpack_mpi::dtype::ReduceOp;
    /// let universe = mpi::initialize().unwrap();
    /// let world = universe.world();
    /// let (a, b) = (Owned::new(vec![1.0f32; 4]), Owned::new(vec![2.0f64; 3]));
    /// let opts = AcquireOptions::default();
    /// let mut grads = vec![acquire(&a, &opts).unwrap(), acquire(&b, &opts).unwrap()];
    /// mpi::request::scope(|scope| {
    ///     let req = world
    ///         .immediate_all_reduce_tensors_in_place(scope, &mut grads, ReduceOp::Sum)
    ///         .unwrap();
    ///     drop(grads); // refused: the request still borrows the list and its guards
    ///     req.wait().unwrap();
    /// });
    /// ```
    ///
    /// # Errors
    /// As [`TensorComm::all_reduce_tensors_in_place`]; this rank's refusal from the post,
    /// the peers' from [`TensorRequest::wait`].
    fn immediate_all_reduce_tensors_in_place<
        'a,
        L: TensorListMut + ?Sized,
        Sc: Scope<'a> + Copy,
    >(
        &'a self,
        scope: Sc,
        tensors: &'a mut L,
        op: ReduceOp,
    ) -> Result<TensorRequest<'a, Sc>> {
        let mut list = tensors.tensors_mut();
        // SAFETY: `list` lives until the fused call returns and is not touched meanwhile.
        let list = unsafe { detach_mut(&mut list) };
        fused::all_reduce_tensors(self, Immediate(scope), None, list, op)
    }

    /// Nonblocking [`TensorComm::all_reduce_tensors`]. (Before: the name of the in-place
    /// form, and this one was `immediate_all_reduce_tensors_into`.)
    ///
    /// # Errors
    /// As [`TensorComm::all_reduce_tensors`].
    fn immediate_all_reduce_tensors<
        'a,
        S: TensorList + ?Sized,
        L: TensorListMut + ?Sized,
        Sc: Scope<'a> + Copy,
    >(
        &'a self,
        scope: Sc,
        send: &'a S,
        recv: &'a mut L,
        op: ReduceOp,
    ) -> Result<TensorRequest<'a, Sc>> {
        let (mut send, mut recv) = (send.tensors(), recv.tensors_mut());
        // SAFETY: `send` and `recv` live until the fused call returns, untouched meanwhile.
        let (send, recv) = unsafe { (detach(&mut send), detach_mut(&mut recv)) };
        fused::all_reduce_tensors(self, Immediate(scope), Some(send), recv, op)
    }

    /// The earlier name of [`TensorComm::immediate_all_reduce_tensors`], deprecated.
    ///
    /// # Errors
    /// As [`TensorComm::immediate_all_reduce_tensors`].
    #[deprecated(note = "renamed `immediate_all_reduce_tensors` (scope, send, receive, op)")]
    #[doc(hidden)]
    fn immediate_all_reduce_tensors_into<'a, 'b: 'a, 'c: 'a, Sc: Scope<'a> + Copy>(
        &'a self,
        scope: Sc,
        send: &'a [&'c dyn Tensor],
        recv: &'a mut [&'b mut dyn Tensor],
        op: ReduceOp,
    ) -> Result<TensorRequest<'a, Sc>> {
        fused::all_reduce_tensors(self, Immediate(scope), Some(send), recv, op)
    }

    /// Nonblocking [`TensorComm::reduce_scatter_block_tensors`]. (Before:
    /// `immediate_reduce_scatter_tensors`.)
    ///
    /// # Errors
    /// As [`TensorComm::reduce_scatter_block_tensors`].
    fn immediate_reduce_scatter_block_tensors<
        'a,
        S: TensorList + ?Sized,
        L: TensorListMut + ?Sized,
        Sc: Scope<'a> + Copy,
    >(
        &'a self,
        scope: Sc,
        send: &'a S,
        recv: &'a mut L,
        op: ReduceOp,
    ) -> Result<TensorRequest<'a, Sc>> {
        let (mut send, mut recv) = (send.tensors(), recv.tensors_mut());
        // SAFETY: `send` and `recv` live until the fused call returns, untouched meanwhile.
        let (send, recv) = unsafe { (detach(&mut send), detach_mut(&mut recv)) };
        fused::reduce_scatter_block_tensors(self, Immediate(scope), send, recv, op)
    }

    /// The earlier name of [`TensorComm::immediate_reduce_scatter_block_tensors`],
    /// deprecated.
    ///
    /// # Errors
    /// As [`TensorComm::immediate_reduce_scatter_block_tensors`].
    #[deprecated(note = "renamed `immediate_reduce_scatter_block_tensors`")]
    #[doc(hidden)]
    fn immediate_reduce_scatter_tensors<'a, 'b: 'a, 'c: 'a, Sc: Scope<'a> + Copy>(
        &'a self,
        scope: Sc,
        send: &'a [&'c dyn Tensor],
        recv: &'a mut [&'b mut dyn Tensor],
        op: ReduceOp,
    ) -> Result<TensorRequest<'a, Sc>> {
        fused::reduce_scatter_block_tensors(self, Immediate(scope), send, recv, op)
    }

    /// Nonblocking [`TensorComm::broadcast_tensors`].
    ///
    /// # Errors
    /// As [`TensorComm::broadcast_tensors`].
    fn immediate_broadcast_tensors<'a, L: TensorListMut + ?Sized, Sc: Scope<'a> + Copy>(
        &'a self,
        scope: Sc,
        tensors: &'a mut L,
        root: Rank,
    ) -> Result<TensorRequest<'a, Sc>> {
        let mut list = tensors.tensors_mut();
        // SAFETY: `list` lives until the fused call returns and is not touched meanwhile.
        let list = unsafe { detach_mut(&mut list) };
        fused::broadcast_tensors(self, Immediate(scope), list, root)
    }
}

// The nonblocking fused collectives take a list as the slice of `&mut dyn Tensor` the fused
// engine takes, borrowed for the request's `'a`; the caller's list (`TensorList`,
// `TensorListMut`) gives it as a `Vec` made for the call. The engine keeps nothing that
// points into that slice once the call returns: a `Fused` has no lifetime (its members are
// `spec::facts::Facts`, the elements' addresses), and a device bucket borrows the tensors
// the slice's elements point to (reborrowed through them), which the request keeps
// borrowed for `'a` through the caller's list, never the elements themselves. So the `Vec`
// may go when the call returns, though the slice's type says `'a`.

/// `list` as a slice of lifetime `'a`, for a fused entry point.
///
/// # Safety
/// Pass the slice to one fused entry point only (`fused::all_reduce_tensors`,
/// `broadcast_tensors`, `reduce_scatter_block_tensors`), and keep `list` alive and
/// untouched until that call returns; use the slice for nothing else.
unsafe fn detach_mut<'a>(list: &mut [&'a mut dyn Tensor]) -> &'a mut [&'a mut dyn Tensor] {
    // SAFETY: a live slice's pointer and length; the caller bounds its use to the call
    // (see above).
    unsafe { std::slice::from_raw_parts_mut(list.as_mut_ptr(), list.len()) }
}

/// The read-only form of [`detach_mut`], for a send list.
///
/// # Safety
/// As [`detach_mut`].
unsafe fn detach<'a>(list: &mut [&'a dyn Tensor]) -> &'a [&'a dyn Tensor] {
    // SAFETY: as in `detach_mut`.
    unsafe { std::slice::from_raw_parts(list.as_ptr(), list.len()) }
}

impl<C: Communicator + ?Sized> TensorComm for C {
    type Comm = C;

    #[inline]
    fn communicator(&self) -> &C {
        self
    }
}
