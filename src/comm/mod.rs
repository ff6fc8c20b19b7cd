#![doc = include_str!("overview.md")]

#[macro_use]
mod twins;
#[macro_use]
mod planned;
mod deprecated;
mod engine;
mod ops;

use std::ops::Range;

use mpi::point_to_point::{Destination, Source, Status};
use mpi::request::{Request, Scope};
use mpi::topology::{Communicator, Rank};
use mpi::Tag;

pub use engine::agree::AGREEMENT_REASON_BYTES;
pub use engine::bcast::BroadcastBuffer;
pub use engine::blocks::Blocks;
pub(crate) use engine::checks::check_peer;
pub use engine::checks::{any_source, any_tag};
pub use engine::exchange::{Exchange, ExchangeRequest};
pub use engine::halfops;
pub use engine::packing::inner_block_bytes;
pub use engine::plan::{Plan, PlanRequest};
pub use engine::request::{test_any, wait_all, wait_any, TensorRequest};
pub(crate) use engine::stager::sealed::Sealed;
pub use engine::stager::Endpoint;
// The earlier paths of settings and `ALONE_BYTES`, deprecated (a glob: this module's wins).
#[cfg(doc)]
use crate::settings::{Agreement, Packing};
pub use deprecated::*;
#[doc(hidden)]
pub use engine::stager::{BucketMember, Operand, StagedBucket, StagedTensor, Stager, Staging};
pub use ops::fused::OWN_BUCKET_BYTES;
pub(crate) use ops::p2p;
pub(crate) use ops::p2p::{recv_matched, unfit};

use engine::mode::Blocking;
use engine::request::Immediate;
use ops::fused::{self, written};
use ops::{collective, reduce, window};

use crate::dlpack::{Tensor, TensorList, TensorListMut};
use crate::dtype::ReduceOp;
#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::spec::{RecvSpec, SendSpec};

/// Clears the out-of-step state of `comm` ([`Error::OutOfStep`]: a rank skipped or added a
/// collective, and every collective of this crate on `comm` has failed at once since), so
/// that its collectives run again. Collective: every rank of `comm` calls it, at the same
/// point, with none of this crate's nonblocking collectives on `comm` pending; it is a
/// barrier (`MPI_Ibarrier`, MPI-4.1 §6.12.1) on `comm`, polled as every blocking call of this
/// crate, and returns whether `comm` was out of step on this rank. The collective count
/// the agreement compares carries on (it is equal on every rank that got the error).
/// Call it after the program has brought its ranks back to the same collective order
/// (for example after each rank has left the loop that diverged); a rank that does not
/// call it leaves the others waiting in the barrier.
pub fn reset_out_of_step<C: Communicator + ?Sized>(comm: &C) -> bool {
    engine::ledger::reset(comm)
}

/// A collective this rank cannot make because its arguments could not even be read (a
/// language binding's array that failed to import, a reduction name it does not know):
/// takes part in the agreement of that collective with `error` as this rank's refusal, so
/// that the peers' call (named `op` in their error) returns [`Error::PeerRefused`] with
/// `error`'s text instead of waiting for this rank; returns `error` (or the agreement's own
/// error, [`Error::OutOfStep`]). `nonblocking` says which form the peers called (the two
/// forms' agreements differ: the trait's docs, "Nonblocking collectives"); the nonblocking
/// form returns at once, as the post of a refusing rank does. With
/// [`crate::settings::Agreement::Local`] or one rank, nothing is sent and `error` is
/// returned. Collective (on an intra-communicator): call it where the other ranks make the
/// collective.
pub fn refuse_collective<C: Communicator + ?Sized>(
    comm: &C,
    op: &'static str,
    nonblocking: bool,
    error: crate::error::Error,
) -> crate::error::Error {
    use engine::mode::{Blocking, Mode};
    let signature = engine::signature::Signature::of(op);
    let outcome = if nonblocking {
        mpi::request::scope(|scope| {
            Immediate(scope)
                .refuse(comm, signature, error)
                .and_then(TensorRequest::wait)
                .map(drop)
        })
    } else {
        Blocking.refuse(comm, signature, error)
    };
    match outcome {
        Err(e) => e,
        // A refusal is never agreed as a success; should it be, the caller still fails.
        Ok(()) => crate::error::Error::OutOfStep {
            first: format!("{op}: a refusal was agreed as a success"),
        },
    }
}

#[doc = include_str!("tensor_comm.md")]
pub trait TensorComm: Endpoint {
    /// Blocking standard-mode send of all elements of `tensor` to `dest` (MPI-4.1 §3.2.1).
    ///
    /// # Errors
    /// [`Error::InvalidRank`], [`Error::InvalidTag`] and the errors of [`SendSpec::new`].
    fn send_tensor(&self, tensor: &dyn Tensor, dest: Rank, tag: Tag) -> Result<()> {
        p2p::send(self, tensor, dest, tag)
    }

    /// Blocking receive into `tensor` from `source` with `tag` (`source` may be
    /// [`any_source`], `tag` [`any_tag`]: the status names the message's own; MPI-4.1
    /// §3.2.4). The incoming message is matched first (`MPI_Mprobe`, MPI-4.1 §3.8.2: it is taken off the queue for this call
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
    /// in logical row-major order). The [`TensorRequest`] borrows `tensor` for `'a` and
    /// owns a packed copy until it completes; dropping it uncompleted waits.
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
        p2p::immediate_send(self, scope, tensor, dest, tag)
    }

    /// Nonblocking receive into all elements of `tensor` from `source` inside an rsmpi
    /// scope (`MPI_Irecv`, MPI-4.1 §3.7.2): the nonblocking form of
    /// [`TensorComm::recv_tensor`], same argument and packing policy (a packed copy is
    /// unpacked into `tensor` at completion). The size cannot be probed before posting: a
    /// longer message is MPI's truncation
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
        p2p::immediate_recv(self, scope, tensor, source, tag)
    }

    /// Nonblocking send of a prebuilt spec inside an rsmpi scope (`MPI_Isend`, §3.7.2),
    /// used as given: a strided spec goes as its derived datatype, never packed (the
    /// [`Packing`] policy is not consulted). Build the spec before the scope; the request
    /// borrows it, so the tensor outlives the request.
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
        p2p::immediate_spec(self.communicator(), (dest, tag), |process| {
            process.immediate_send_with_tag(scope, spec, tag)
        })
    }

    /// Nonblocking receive into a prebuilt spec inside an rsmpi scope (`MPI_Irecv`,
    /// §3.7.2), used as given (never packed). The size cannot be probed before posting; a
    /// longer message is an MPI truncation error, so use it where sizes are agreed.
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
        p2p::immediate_spec(self.communicator(), (source, tag), |process| {
            process.immediate_receive_into_with_tag(scope, spec, tag)
        })
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

    // Nonblocking collectives (MPI-4.1 §6.12): see `twins.rs`.

    /// Nonblocking [`TensorComm::all_reduce_tensor`] (`MPI_Iallreduce`, MPI-4.1 §6.12.8).
    ///
    /// When the agreement and the data operation progress: the trait's docs, "Nonblocking
    /// collectives".
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

    nonblocking! {
        /// With `MPI_IN_PLACE`.
        immediate_all_reduce_tensor_in_place of all_reduce_tensor_in_place ("MPI_Iallreduce", "6.12.8")
        (&'a self, scope: Sc, tensor: &'a mut dyn Tensor, op: ReduceOp)
        => reduce::all_reduce_in_place(self, Immediate(scope), tensor, op)
    }

    nonblocking! {
        immediate_reduce_tensor of reduce_tensor ("MPI_Ireduce", "6.12.7")
        (&'a self, scope: Sc, send: &'a dyn Tensor, recv: Option<&'a mut dyn Tensor>, op: ReduceOp, root: Rank)
        => reduce::reduce(self, Immediate(scope), send, recv, op, root)
    }

    nonblocking! {
        immediate_reduce_scatter_block_tensor of reduce_scatter_block_tensor ("MPI_Ireduce_scatter_block", "6.12.9")
        (&'a self, scope: Sc, send: &'a dyn Tensor, recv: &'a mut dyn Tensor, op: ReduceOp)
        => reduce::reduce_scatter_block(self, Immediate(scope), send, recv, op)
    }

    nonblocking! {
        immediate_broadcast_tensor of broadcast_tensor ("MPI_Ibcast", "6.12.2")
        (&'a self, scope: Sc, tensor: &'a mut dyn Tensor, root: Rank)
        => collective::broadcast(self, Immediate(scope), BroadcastBuffer::Recv(tensor), root)
    }

    nonblocking! {
        immediate_broadcast_tensor_from of broadcast_tensor_from ("MPI_Ibcast", "6.12.2")
        (&'a self, scope: Sc, buffer: BroadcastBuffer<'a>, root: Rank)
        => collective::broadcast(self, Immediate(scope), buffer, root)
    }

    nonblocking! {
        immediate_gather_tensor of gather_tensor ("MPI_Igather", "6.12.3")
        (&'a self, scope: Sc, send: &'a dyn Tensor, recv: Option<&'a mut dyn Tensor>, root: Rank)
        => collective::gather(self, Immediate(scope), send, recv, root)
    }

    nonblocking! {
        /// The request owns the blocks in MPI units.
        immediate_gatherv_tensor of gatherv_tensor ("MPI_Igatherv", "6.12.3")
        (&'a self, scope: Sc, send: &'a dyn Tensor, recv: Option<(&'a mut dyn Tensor, Blocks<'a>)>, root: Rank)
        => collective::gatherv(self, Immediate(scope), send, recv.map(|(t, b)| (t, b.counts, b.displacements)), root)
    }

    nonblocking! {
        immediate_scatter_tensor of scatter_tensor ("MPI_Iscatter", "6.12.4")
        (&'a self, scope: Sc, send: Option<&'a dyn Tensor>, recv: &'a mut dyn Tensor, root: Rank)
        => collective::scatter(self, Immediate(scope), send, recv, root)
    }

    nonblocking! {
        immediate_scatterv_tensor of scatterv_tensor ("MPI_Iscatterv", "6.12.4")
        (&'a self, scope: Sc, send: Option<(&'a dyn Tensor, Blocks<'a>)>, recv: &'a mut dyn Tensor, root: Rank)
        => collective::scatterv(self, Immediate(scope), send.map(|(t, b)| (t, b.counts, b.displacements)), recv, root)
    }

    nonblocking! {
        immediate_all_gather_tensor of all_gather_tensor ("MPI_Iallgather", "6.12.5")
        (&'a self, scope: Sc, send: &'a dyn Tensor, recv: &'a mut dyn Tensor)
        => collective::all_gather(self, Immediate(scope), send, recv)
    }

    nonblocking! {
        immediate_all_gatherv_tensor of all_gatherv_tensor ("MPI_Iallgatherv", "6.12.5")
        (&'a self, scope: Sc, send: &'a dyn Tensor, recv: &'a mut dyn Tensor, blocks: Blocks<'a>)
        => collective::all_gatherv(self, Immediate(scope), send, recv, blocks.counts, blocks.displacements)
    }

    nonblocking! {
        immediate_all_to_all_tensor of all_to_all_tensor ("MPI_Ialltoall", "6.12.6")
        (&'a self, scope: Sc, send: &'a dyn Tensor, recv: &'a mut dyn Tensor)
        => collective::all_to_all(self, Immediate(scope), send, recv)
    }

    nonblocking! {
        immediate_all_to_allv_tensor of all_to_allv_tensor ("MPI_Ialltoallv", "6.12.6")
        (&'a self, scope: Sc, send: (&'a dyn Tensor, Blocks<'a>), recv: (&'a mut dyn Tensor, Blocks<'a>))
        => collective::all_to_allv(
            self,
            Immediate(scope),
            (send.0, send.1.counts, send.1.displacements),
            (recv.0, recv.1.counts, recv.1.displacements),
        )
    }

    // Fused collectives over lists of tensors: the trait's docs, "Lists".

    /// All-reduce every tensor of `tensors` in place, as few messages: the members of one
    /// dtype go in buckets (a pooled buffer each, members packed in list order in logical
    /// row-major order; strided members allowed), one `MPI_Allreduce` per bucket, each
    /// bucket unpacked into its members as it lands. Every rank passes a list of the same
    /// length, dtypes and element counts (the agreement compares them). The result of each
    /// member is what [`TensorComm::all_reduce_tensor_in_place`] gives it.
    /// `tensors` is any [`TensorListMut`] (`&mut guards` for a `Vec<ManagedTensor>`);
    /// members may differ in dtype.
    ///
    /// # Errors
    /// [`Error::Member`] naming the first member refused (its `READ_ONLY`, device, layout,
    /// or a reduction its dtype does not have; around [`Error::BuffersAlias`] when it shares
    /// memory with an earlier member); [`Error::MixedDevices`]; [`Error::CollectiveMismatch`]
    /// when the lists differ across ranks; the pool's errors. All before any data moves, on
    /// every rank.
    fn all_reduce_tensors_in_place<L>(&self, tensors: &mut L, op: ReduceOp) -> Result<()>
    where
        L: TensorListMut + ?Sized,
    {
        fused::all_reduce_tensors(self, Blocking, None, &written(tensors), op)
    }

    /// All-reduce the members of `send` into those of `recv` (pairwise: same length,
    /// dtype and count per member), as [`TensorComm::all_reduce_tensors_in_place`] does in
    /// place; the plural of [`TensorComm::all_reduce_tensor`].
    ///
    /// # Errors
    /// As [`TensorComm::all_reduce_tensors_in_place`], and [`Error::ListLengthMismatch`] for
    /// lists of different lengths, [`Error::Member`] around a pair's [`Error::DtypeMismatch`]
    /// or [`Error::CountMismatch`].
    fn all_reduce_tensors<S, L>(&self, send: &S, recv: &mut L, op: ReduceOp) -> Result<()>
    where
        S: TensorList + ?Sized,
        L: TensorListMut + ?Sized,
    {
        let send = send.tensors();
        fused::all_reduce_tensors(self, Blocking, Some(&send), &written(recv), op)
    }

    /// Broadcast every tensor of `tensors` from `root` as few messages (buckets as in
    /// [`TensorComm::all_reduce_tensors_in_place`]; one `MPI_Bcast` per bucket). At the root
    /// the members are only read (they may be `READ_ONLY`).
    ///
    /// # Errors
    /// As [`TensorComm::all_reduce_tensors_in_place`], and [`Error::InvalidRank`].
    fn broadcast_tensors<L>(&self, tensors: &mut L, root: Rank) -> Result<()>
    where
        L: TensorListMut + ?Sized,
    {
        fused::broadcast_tensors(self, Blocking, &written(tensors), root)
    }

    /// Reduce-scatter a list (`MPI_Reduce_scatter_block` per bucket): member `i` of `send`
    /// holds `size` × the elements of member `i` of `recv`; rank `r` receives the
    /// element-wise reduction of every rank's block `r`, member by member (what
    /// [`TensorComm::reduce_scatter_block_tensor`] gives each pair).
    ///
    /// # Errors
    /// As [`TensorComm::all_reduce_tensors`], and [`Error::CountTooLarge`] for a bucket
    /// beyond `int` units per rank.
    fn reduce_scatter_block_tensors<S, L>(&self, send: &S, recv: &mut L, op: ReduceOp) -> Result<()>
    where
        S: TensorList + ?Sized,
        L: TensorListMut + ?Sized,
    {
        let send = send.tensors();
        fused::reduce_scatter_block_tensors(self, Blocking, &send, &written(recv), op)
    }

    nonblocking! {
        /// The post checks every member, takes the buckets and posts the agreement;
        /// `test`/`wait` post every bucket once it completes (packing bucket k+1 while
        /// bucket k is on the wire) and unpack each as it lands. The request borrows the
        /// list (and so every member) until it completes (the trait's docs, "Lists").
        immediate_all_reduce_tensors_in_place [L: TensorListMut + ?Sized]
        of all_reduce_tensors_in_place ("MPI_Iallreduce", "6.12.8")
        (&'a self, scope: Sc, tensors: &'a mut L, op: ReduceOp)
        => fused::all_reduce_tensors(self, Immediate(scope), None, &written(tensors), op)
    }

    nonblocking! {
        immediate_all_reduce_tensors [S: TensorList + ?Sized, L: TensorListMut + ?Sized]
        of all_reduce_tensors ("MPI_Iallreduce", "6.12.8")
        (&'a self, scope: Sc, send: &'a S, recv: &'a mut L, op: ReduceOp)
        => fused::all_reduce_tensors(self, Immediate(scope), Some(&send.tensors()), &written(recv), op)
    }

    nonblocking! {
        immediate_reduce_scatter_block_tensors [S: TensorList + ?Sized, L: TensorListMut + ?Sized]
        of reduce_scatter_block_tensors ("MPI_Ireduce_scatter_block", "6.12.9")
        (&'a self, scope: Sc, send: &'a S, recv: &'a mut L, op: ReduceOp)
        => fused::reduce_scatter_block_tensors(self, Immediate(scope), &send.tensors(), &written(recv), op)
    }

    nonblocking! {
        immediate_broadcast_tensors [L: TensorListMut + ?Sized]
        of broadcast_tensors ("MPI_Ibcast", "6.12.2")
        (&'a self, scope: Sc, tensors: &'a mut L, root: Rank)
        => fused::broadcast_tensors(self, Immediate(scope), &written(tensors), root)
    }

    // Plans: a collective agreed once, run step after step (planned.rs, engine/plan.rs).
    plans!();

    // Exchanges: point-to-point messages matched once, run step after step
    // (ops/exchange.rs, engine/exchange.rs).

    /// Plans point-to-point messages between the same tensors, for halo exchanges and
    /// pipeline stages: this rank sends `sends[i]` to rank `to[i].0` with tag `to[i].1`, and
    /// receives `recvs[j]` from rank `from[j].0` with tag `from[j].1`, at every step.
    /// Collective: every rank of the communicator calls it (with empty lists if it
    /// exchanges nothing). The build checks every member, agrees in full, and cross-checks
    /// both ends of every message (tag, dtype, element count); then each
    /// [`Exchange::run`] or [`Exchange::start`] posts every receive and every send and
    /// completes them, with no agreement, no check and no allocation. Members may be
    /// strided (packed and unpacked in chunks that overlap the wire) and differ in shape
    /// from their peer's, as long as dtype and element count match: the wire is the
    /// elements in logical row-major order. Several members with the same peer and tag pair
    /// in list order (MPI-4.1 §3.5). The messages go on the duplicate of this communicator
    /// that its plans share, so they never meet an unplanned receive on this communicator;
    /// two exchanges with the same (peer, tag) stepped in different orders on two ranks,
    /// or in flight together, cross-match (give them distinct tags). Host memory only.
    ///
    /// # Errors
    /// At the build, on every rank: [`Error::Member`] naming a member (the receive members
    /// numbered after the send members) whose facts, rank ([`Error::InvalidRank`]: also
    /// [`any_source`]) or tag ([`Error::InvalidTag`]: also [`any_tag`]) this rank refuses,
    /// or a receive member that overlaps another member ([`Error::BuffersAlias`]);
    /// [`Error::ListLengthMismatch`] when `to` or `from` does not have one entry per
    /// member; [`Error::PeerRefused`] on the other ranks; [`Error::CollectiveMismatch`]
    /// when a rank calls another collective, or when the messages do not pair (a receive
    /// nobody sends, a send nobody receives, a dtype or element count that differs: in
    /// words); [`Error::Intercommunicator`]. The steps' errors: [`Exchange::run`].
    fn plan_exchange<'a, S, R>(
        &'a self,
        sends: &'a mut S,
        to: &[(Rank, Tag)],
        recvs: &'a mut R,
        from: &[(Rank, Tag)],
    ) -> Result<Exchange<'a, S, R>>
    where
        S: TensorListMut + ?Sized,
        R: TensorListMut + ?Sized,
    {
        ops::exchange::plan_exchange(self, sends, to, recvs, from)
    }

    // The earlier names, deprecated (hidden from the docs):
    renamed! {
        all_reduce_tensors_into => all_reduce_tensors,
        "renamed `all_reduce_tensors` (send list, receive list, op)"
        (&self, send: &[&dyn Tensor], recv: &mut [&mut dyn Tensor], op: ReduceOp) -> Result<()>
        = self.all_reduce_tensors(send, recv, op);

        reduce_scatter_tensors => reduce_scatter_block_tensors,
        "renamed `reduce_scatter_block_tensors`"
        (&self, send: &[&dyn Tensor], recv: &mut [&mut dyn Tensor], op: ReduceOp) -> Result<()>
        = self.reduce_scatter_block_tensors(send, recv, op);

        immediate_all_reduce_tensors_into ['a, 'b: 'a, 'c: 'a, Sc: Scope<'a> + Copy]
        => immediate_all_reduce_tensors,
        "renamed `immediate_all_reduce_tensors` (scope, send, receive, op)"
        (&'a self, scope: Sc, send: &'a [&'c dyn Tensor], recv: &'a mut [&'b mut dyn Tensor], op: ReduceOp)
        -> Result<TensorRequest<'a, Sc>>
        = self.immediate_all_reduce_tensors(scope, send, recv, op);

        immediate_reduce_scatter_tensors ['a, 'b: 'a, 'c: 'a, Sc: Scope<'a> + Copy]
        => immediate_reduce_scatter_block_tensors,
        "renamed `immediate_reduce_scatter_block_tensors`"
        (&'a self, scope: Sc, send: &'a [&'c dyn Tensor], recv: &'a mut [&'b mut dyn Tensor], op: ReduceOp)
        -> Result<TensorRequest<'a, Sc>>
        = self.immediate_reduce_scatter_block_tensors(scope, send, recv, op);
    }
}

impl<C: Communicator + ?Sized> TensorComm for C {}
