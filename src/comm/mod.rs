//! Checked tensor operations on every rsmpi communicator.
//!
//! [`TensorComm`] is implemented for every [`Communicator`]. Each method builds the specs
//! (all checks of [`crate::spec`]), checks the local arguments against each other — ranks in
//! the communicator, dtypes equal, counts consistent with the communicator size, reductions
//! allowed for the dtype, vector blocks inside their tensors — and only then calls MPI. A
//! mismatch is an `Err` on the rank that sees it; no MPI call has been made with the bad
//! arguments, so MPI never aborts the job over them.
//!
//! What cannot be checked locally: that every rank passes matching counts and dtypes to a
//! collective (MPI-4.1 §6.1 makes that the caller's obligation). For point-to-point receives
//! the incoming size **is** checked first ([`TensorComm::recv_tensor`]): the message is
//! probed, and a size mismatch is [`Error::CountMismatch`] naming both counts, with the
//! message left unreceived so that the job goes on and nothing is lost (C43).
//!
//! All counts and displacements are in DLPack elements.
//!
//! Layout: the trait is here, its operations in `p2p` (send, receive, send-receive),
//! `collective` (broadcast, gathers, scatters, all-to-alls) and `reduce` (reductions, with
//! the half-precision operations of `halfops`, public as [`crate::halfops`]); `checks`
//! holds the argument checks and `packing` the packing policy ([`Packing`]). Raw MPI calls
//! go through the crate's private `raw` module.

mod checks;
mod collective;
mod p2p;
mod packing;
pub(crate) mod reduce;
mod sides;

use mpi::point_to_point::Status;
use mpi::request::{Request, Scope};
use mpi::topology::{Communicator, Rank};
use mpi::traits::*;
use mpi::Tag;

pub(crate) use checks::{check_rank, check_tag};
pub use packing::{
    default_pack_threshold_for, inner_block_bytes, pack_threshold_bytes, packing,
    parse_pack_threshold, parse_packing, set_pack_threshold_bytes, set_packing, Packing,
    DEFAULT_PACK_THRESHOLD_BYTES, MPICH_PACK_THRESHOLD_BYTES, PACKING_ENV, PACK_THRESHOLD_ENV,
};

use crate::dlpack::Tensor;
use crate::dtype::ReduceOp;
#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::spec::{RecvSpec, SendSpec};

/// Checked tensor operations, for every rsmpi [`Communicator`].
///
/// Tensors are passed as `&dyn Tensor` (any [`crate::dlpack::ManagedTensor`] or
/// [`crate::dlpack::TensorView`]). Arguments only the root uses are `Option`s; they are
/// required at the root and ignored elsewhere.
pub trait TensorComm: Communicator {
    /// Blocking standard-mode send of all elements of `tensor` to `dest` (MPI-4.1 §3.2.1).
    ///
    /// # Errors
    /// [`Error::InvalidRank`], [`Error::InvalidTag`] and the errors of [`SendSpec::new`].
    fn send_tensor(&self, tensor: &dyn Tensor, dest: Rank, tag: Tag) -> Result<()> {
        p2p::send(self, tensor, dest, tag)
    }

    /// Blocking receive into `tensor` from `source` with `tag`. The incoming message is
    /// probed first (`MPI_Probe`, §3.8.1) and received only when its size is exactly the
    /// tensor's.
    ///
    /// **Threads** (`MPI_THREAD_MULTIPLE`): the probe and the receive are two calls, so two
    /// threads receiving from the same `(source, tag)` at once may each probe one message
    /// and receive the other's (MPI-4.1 §3.8.2). Give concurrent receivers distinct tags or
    /// sources (then it is safe: a probe matches only its own messages). A matched probe
    /// (`MPI_Mprobe`) would close the window but take the message off the queue, so that a
    /// size mismatch could no longer leave it for a fitting receive (C43).
    ///
    /// # Errors
    /// [`Error::CountMismatch`] naming the expected and arriving element counts (the
    /// message stays unreceived: a later receive with a fitting tensor gets it);
    /// [`Error::InvalidRank`]; [`Error::InvalidTag`]; the errors of [`RecvSpec::new`].
    fn recv_tensor(&self, tensor: &mut dyn Tensor, source: Rank, tag: Tag) -> Result<Status> {
        p2p::recv(self, tensor, source, tag)
    }

    /// Send `send` to `dest` and receive `recv` from `source` at once (`MPI_Sendrecv`
    /// semantics, deadlock-free in a ring). The incoming size is checked as in
    /// [`TensorComm::recv_tensor`] while the send is in flight (with the same rule for
    /// threads: concurrent receivers use distinct `(source, tag)`).
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
        p2p::sendrecv(self, send, dest, send_tag, recv, source, recv_tag)
    }

    /// Nonblocking send inside an rsmpi scope (`MPI_Isend`, §3.7.2). Build the spec before
    /// the scope; the request borrows it, so the tensor outlives the request.
    ///
    /// The only error is a bad rank, returned before anything is posted; check ranks before
    /// posting several requests, because a request dropped uncompleted when `?` leaves the
    /// scope makes rsmpi panic.
    ///
    /// # Errors
    /// [`Error::InvalidRank`], [`Error::InvalidTag`].
    fn immediate_send_tensor<'a, 't: 'a, Sc: Scope<'a>>(
        &self,
        scope: Sc,
        spec: &'a SendSpec<'t>,
        dest: Rank,
        tag: Tag,
    ) -> Result<Request<'a, SendSpec<'t>, Sc>> {
        check_rank(dest, self.target_size())?;
        check_tag(tag)?;
        Ok(self
            .process_at_rank(dest)
            .immediate_send_with_tag(scope, spec, tag))
    }

    /// Nonblocking receive inside an rsmpi scope (`MPI_Irecv`, §3.7.2). The size cannot be
    /// probed before posting; a longer message is an MPI truncation error, so use it where
    /// sizes are agreed (or use [`TensorComm::recv_tensor`]).
    ///
    /// # Errors
    /// [`Error::InvalidRank`], [`Error::InvalidTag`].
    fn immediate_recv_tensor<'a, 't: 'a, Sc: Scope<'a>>(
        &self,
        scope: Sc,
        spec: &'a mut RecvSpec<'t>,
        source: Rank,
        tag: Tag,
    ) -> Result<Request<'a, RecvSpec<'t>, Sc>> {
        check_rank(source, self.target_size())?;
        check_tag(tag)?;
        Ok(self
            .process_at_rank(source)
            .immediate_receive_into_with_tag(scope, spec, tag))
    }

    /// Broadcast `tensor` from `root` (`MPI_Bcast`, §6.4). At the root the tensor is only
    /// read (it may be `READ_ONLY`); elsewhere it is received into.
    ///
    /// # Errors
    /// [`Error::InvalidRank`]; the errors of [`SendSpec::new`] at the root and of
    /// [`RecvSpec::new`] elsewhere.
    fn broadcast_tensor(&self, tensor: &mut dyn Tensor, root: Rank) -> Result<()> {
        collective::broadcast(self, tensor, root)
    }

    /// Reduce `send` from every rank into `recv` at `root` (`MPI_Reduce`, §6.9.1).
    ///
    /// # Errors
    /// [`Error::UnsupportedReduction`], [`Error::DtypeMismatch`], [`Error::CountMismatch`]
    /// (also when the root has no `recv`), [`Error::InvalidRank`], spec errors.
    fn reduce_tensor(
        &self,
        send: &dyn Tensor,
        recv: Option<&mut dyn Tensor>,
        op: ReduceOp,
        root: Rank,
    ) -> Result<()> {
        reduce::reduce(self, send, recv, op, root)
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
        reduce::all_reduce(self, send, recv, op)
    }

    /// In-place all-reduce: `tensor` is both input and output (`MPI_IN_PLACE`, §6.9.6).
    ///
    /// # Errors
    /// [`Error::UnsupportedReduction`], the errors of [`RecvSpec::new`].
    fn all_reduce_tensor_in_place(&self, tensor: &mut dyn Tensor, op: ReduceOp) -> Result<()> {
        reduce::all_reduce_in_place(self, tensor, op)
    }

    /// Gather every rank's `send` into `recv` at `root`, rank order (`MPI_Gather`, §6.5).
    /// `recv` has `size × send` elements.
    ///
    /// # Errors
    /// [`Error::CountMismatch`], [`Error::DtypeMismatch`], [`Error::InvalidRank`], spec
    /// errors.
    fn gather_tensor(
        &self,
        send: &dyn Tensor,
        recv: Option<&mut dyn Tensor>,
        root: Rank,
    ) -> Result<()> {
        collective::gather(self, send, recv, root)
    }

    /// Gather blocks of varying size (`MPI_Gatherv`, §6.5). At the root, `recv` is the
    /// tensor with `counts` and `displacements` (one per rank, in elements); its own block
    /// must equal its `send` count.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`], [`Error::OutOfBounds`], [`Error::BlocksOverlap`],
    /// [`Error::CountMismatch`], [`Error::DtypeMismatch`], [`Error::InvalidRank`], spec
    /// errors.
    fn gatherv_tensor(
        &self,
        send: &dyn Tensor,
        recv: Option<(&mut dyn Tensor, &[i64], &[i64])>,
        root: Rank,
    ) -> Result<()> {
        collective::gatherv(self, send, recv, root)
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
        collective::scatter(self, send, recv, root)
    }

    /// Scatter blocks of varying size (`MPI_Scatterv`, §6.6).
    ///
    /// # Errors
    /// As [`TensorComm::gatherv_tensor`].
    fn scatterv_tensor(
        &self,
        send: Option<(&dyn Tensor, &[i64], &[i64])>,
        recv: &mut dyn Tensor,
        root: Rank,
    ) -> Result<()> {
        collective::scatterv(self, send, recv, root)
    }

    /// Every rank gathers every rank's `send` into `recv` (`MPI_Allgather`, §6.7).
    ///
    /// # Errors
    /// [`Error::CountMismatch`], [`Error::DtypeMismatch`], spec errors.
    fn all_gather_tensor(&self, send: &dyn Tensor, recv: &mut dyn Tensor) -> Result<()> {
        collective::all_gather(self, send, recv)
    }

    /// All-gather with blocks of varying size (`MPI_Allgatherv`, §6.7): `counts` and
    /// `displacements` (elements, one per rank) place each rank's block in `recv`;
    /// `counts[rank]` must equal this rank's `send` count.
    ///
    /// # Errors
    /// As [`TensorComm::gatherv_tensor`].
    fn all_gatherv_tensor(
        &self,
        send: &dyn Tensor,
        recv: &mut dyn Tensor,
        counts: &[i64],
        displacements: &[i64],
    ) -> Result<()> {
        collective::all_gatherv(self, send, recv, counts, displacements)
    }

    /// Personalized exchange: block `i` of `send` goes to rank `i`, block `j` of `recv`
    /// comes from rank `j` (`MPI_Alltoall`, §6.8). Both have `size × block` elements.
    ///
    /// # Errors
    /// [`Error::CountMismatch`] (counts differ or are not a multiple of the size),
    /// [`Error::DtypeMismatch`], spec errors.
    fn all_to_all_tensor(&self, send: &dyn Tensor, recv: &mut dyn Tensor) -> Result<()> {
        collective::all_to_all(self, send, recv)
    }

    /// All-to-all with blocks of varying size (`MPI_Alltoallv`, §6.8).
    ///
    /// # Errors
    /// As [`TensorComm::gatherv_tensor`], for both sides.
    #[allow(clippy::too_many_arguments)]
    fn all_to_allv_tensor(
        &self,
        send: &dyn Tensor,
        send_counts: &[i64],
        send_displacements: &[i64],
        recv: &mut dyn Tensor,
        recv_counts: &[i64],
        recv_displacements: &[i64],
    ) -> Result<()> {
        collective::all_to_allv(
            self,
            send,
            send_counts,
            send_displacements,
            recv,
            recv_counts,
            recv_displacements,
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
        reduce::reduce_scatter_block(self, send, recv, op)
    }
}

impl<C: Communicator + ?Sized> TensorComm for C {}
