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

use mpi::datatype::{AsDatatype, Equivalence, Pointer, PointerMut};
use mpi::point_to_point::Status;
use mpi::raw::AsRaw;
use mpi::request::{Request, Scope};
use mpi::topology::{Communicator, Rank};
use mpi::traits::*;
use mpi::Tag;

use crate::dlpack::Tensor;
use crate::dtype::ReduceOp;
use crate::error::{Error, Result};
use crate::spec::{RecvSpec, SendSpec, VectorRecvSpec, VectorSendSpec};

extern "C" {
    /// `MPI_IN_PLACE`, from `src/shim.c`.
    static dlpack_mpi_in_place: *mut std::ffi::c_void;
    /// `MPI_TAG_UB` of `MPI_COMM_WORLD`, or -1, from `src/shim.c`.
    fn dlpack_mpi_tag_ub() -> std::ffi::c_int;
}

/// The largest valid tag (MPI guarantees at least 32767), read once.
fn tag_ub() -> Tag {
    static TAG_UB: std::sync::OnceLock<Tag> = std::sync::OnceLock::new();
    *TAG_UB.get_or_init(|| {
        // SAFETY: a plain attribute query; the shim checks MPI is initialized first.
        let ub = unsafe { dlpack_mpi_tag_ub() };
        if ub >= 32767 {
            ub
        } else {
            32767
        }
    })
}

fn check_rank(rank: Rank, size: Rank) -> Result<()> {
    if (0..size).contains(&rank) {
        Ok(())
    } else {
        Err(Error::InvalidRank { rank, size })
    }
}

fn check_tag(tag: Tag) -> Result<()> {
    let ub = tag_ub();
    if (0..=ub).contains(&tag) {
        Ok(())
    } else {
        Err(Error::InvalidTag { tag, tag_ub: ub })
    }
}

/// Collectives here are defined for intra-communicators only (an inter-communicator's
/// collectives use `MPI_ROOT`/`MPI_PROC_NULL` roots and remote-group counts).
fn check_intra<C: Communicator + ?Sized>(comm: &C) -> Result<()> {
    if comm.test_inter() {
        Err(Error::Intercommunicator)
    } else {
        Ok(())
    }
}

/// MPI forbids a send and a receive buffer of one call to overlap (MPI-4.1 §2.3, "buffers
/// ... must not alias"); Open MPI aborts with MPI_ERR_BUFFER. Checked on the byte ranges.
fn check_disjoint(s: &SendSpec<'_>, r: &RecvSpec<'_>) -> Result<()> {
    // Address ranges (conservative for interleaved strided tensors).
    let (s0, s1) = s.byte_range();
    let (r0, r1) = r.byte_range();
    if s0 < s1 && r0 < r1 && s0 < r1 && r0 < s1 {
        Err(Error::BuffersAlias {
            send_address: s0,
            send_bytes: s1 - s0,
            recv_address: r0,
            recv_bytes: r1 - r0,
        })
    } else {
        Ok(())
    }
}

/// Collectives whose buffers hold one block per rank (the root's receive of a gather, the
/// root's send of a scatter, both sides of all-to-all and reduce-scatter-block, the receive
/// of an all-gather) pass per-rank counts of the predefined type; a strided tensor (one
/// derived datatype for the whole tensor) or a count beyond `int` cannot be split that way.
/// The other side of those collectives may be strided: its one derived datatype has the
/// same type signature as the block it matches (MPI-4.1 §3.3.1).
fn check_blockable(
    operation: &'static str,
    len_elems: i64,
    derived: bool,
    contiguous: bool,
) -> Result<()> {
    match (derived, contiguous) {
        (false, _) => Ok(()),
        (true, false) => Err(Error::StridedNotSupported { operation }),
        (true, true) => Err(Error::CountTooLarge {
            count: len_elems.max(0) as u64,
        }),
    }
}

fn blockable_send(operation: &'static str, s: &SendSpec<'_>) -> Result<()> {
    check_blockable(operation, s.len_elems(), s.is_derived(), s.is_contiguous())
}

fn blockable_recv(operation: &'static str, r: &RecvSpec<'_>) -> Result<()> {
    check_blockable(operation, r.len_elems(), r.is_derived(), r.is_contiguous())
}

/// A send and a receive buffer of one collective: same dtype, and disjoint in memory.
fn check_pair(what: &'static str, s: &SendSpec<'_>, r: &RecvSpec<'_>) -> Result<()> {
    if s.dtype() != r.dtype() {
        return Err(Error::DtypeMismatch {
            what,
            left: s.dtype(),
            right: r.dtype(),
        });
    }
    check_disjoint(s, r)
}

fn check_count(what: impl FnOnce() -> String, expected: i64, actual: i64) -> Result<()> {
    if expected == actual {
        Ok(())
    } else {
        Err(Error::CountMismatch {
            what: what(),
            expected,
            actual,
        })
    }
}

fn missing(what: &'static str) -> Error {
    Error::CountMismatch {
        what: format!("{what} (no buffer given at the root)"),
        expected: 1,
        actual: 0,
    }
}

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
        check_rank(dest, self.target_size())?;
        check_tag(tag)?;
        let spec = SendSpec::new(tensor)?;
        self.process_at_rank(dest).send_with_tag(&spec, tag);
        Ok(())
    }

    /// Blocking receive into `tensor` from `source` with `tag`. The incoming message is
    /// probed first (`MPI_Probe`, §3.8.1) and received only when its size is exactly the
    /// tensor's.
    ///
    /// # Errors
    /// [`Error::CountMismatch`] naming the expected and arriving element counts (the
    /// message stays unreceived: a later receive with a fitting tensor gets it);
    /// [`Error::InvalidRank`]; [`Error::InvalidTag`]; the errors of [`RecvSpec::new`].
    fn recv_tensor(&self, tensor: &mut dyn Tensor, source: Rank, tag: Tag) -> Result<Status> {
        check_rank(source, self.target_size())?;
        check_tag(tag)?;
        let mut spec = RecvSpec::new(tensor)?;
        let process = self.process_at_rank(source);
        let status = process.probe_with_tag(tag);
        check_incoming(&spec, &status)?;
        Ok(process.receive_into_with_tag(&mut spec, tag))
    }

    /// Send `send` to `dest` and receive `recv` from `source` at once (`MPI_Sendrecv`
    /// semantics, deadlock-free in a ring). The incoming size is checked as in
    /// [`TensorComm::recv_tensor`] while the send is in flight.
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
        check_rank(dest, self.target_size())?;
        check_rank(source, self.target_size())?;
        check_tag(send_tag)?;
        check_tag(recv_tag)?;
        let s = SendSpec::new(send)?;
        let mut r = RecvSpec::new(recv)?;
        check_disjoint(&s, &r)?;
        let src = self.process_at_rank(source);
        let dst = self.process_at_rank(dest);
        mpi::request::scope(|scope| {
            let req = dst.immediate_send_with_tag(scope, &s, send_tag);
            let status = src.probe_with_tag(recv_tag);
            let checked = check_incoming(&r, &status);
            let result = checked.map(|()| src.receive_into_with_tag(&mut r, recv_tag));
            req.wait();
            result
        })
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
        check_intra(self)?;
        check_rank(root, self.size())?;
        let process = self.process_at_rank(root);
        if self.rank() == root {
            let spec = SendSpec::new(&*tensor)?;
            // SAFETY: MPI_Bcast only reads the buffer at the root (MPI-4.1 §6.4); the spec
            // describes `count` readable units of `datatype` inside the borrowed tensor.
            unsafe {
                mpi::ffi::MPI_Bcast(
                    spec.pointer() as *mut std::ffi::c_void,
                    spec.mpi_count(),
                    spec.as_datatype().as_raw(),
                    root,
                    self.as_raw(),
                );
            }
        } else {
            let mut spec = RecvSpec::new(tensor)?;
            process.broadcast_into(&mut spec);
        }
        Ok(())
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
        check_intra(self)?;
        check_rank(root, self.size())?;
        let s = SendSpec::new(send)?;
        s.element_type().check_reduction(op)?;
        let mop = op_handle(op, s.dtype())?;
        let process = self.process_at_rank(root);
        let unit = s.element_type().row.unit;
        if self.rank() == root {
            let recv = recv.ok_or_else(|| missing("reduce receive buffer"))?;
            let mut r = RecvSpec::new(&mut *recv)?;
            check_pair("reduce send vs receive", &s, &r)?;
            check_count(|| "reduce receive".into(), s.len_elems(), r.len_elems())?;
            if !needs_flat(&s, r.is_derived()) {
                process.reduce_into_root(&s, &mut r, op.system_operation());
                return Ok(());
            }
            let info = recv_info(&mut r);
            // `r` ends here (non-lexical lifetime): the tensor is used directly below.
            let sf = flat_send(send, &s)?;
            let rf = flat_recv(&*recv, info)?;
            in_chunks(sf.units, unit.size_bytes(), |offset, n| {
                // SAFETY: as in all_reduce_tensor.
                unsafe {
                    mpi::ffi::MPI_Reduce(
                        sf.ptr.cast::<u8>().add(offset).cast(),
                        rf.ptr.cast::<u8>().add(offset).cast(),
                        n,
                        unit.datatype().as_raw(),
                        mop,
                        root,
                        self.as_raw(),
                    );
                }
            });
            finish_recv(rf, recv, info.3)
        } else if !needs_flat(&s, false) {
            process.reduce_into(&s, op.system_operation());
            Ok(())
        } else {
            let sf = flat_send(send, &s)?;
            in_chunks(sf.units, unit.size_bytes(), |offset, n| {
                // SAFETY: the send buffer holds `units` units; the receive buffer is not
                // significant at non-root ranks (MPI-4.1 §6.9.1).
                unsafe {
                    mpi::ffi::MPI_Reduce(
                        sf.ptr.cast::<u8>().add(offset).cast(),
                        std::ptr::null_mut(),
                        n,
                        unit.datatype().as_raw(),
                        mop,
                        root,
                        self.as_raw(),
                    );
                }
            });
            Ok(())
        }
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
        check_intra(self)?;
        let s = SendSpec::new(send)?;
        s.element_type().check_reduction(op)?;
        let mop = op_handle(op, s.dtype())?;
        let mut r = RecvSpec::new(recv)?;
        check_pair("all-reduce send vs receive", &s, &r)?;
        check_count(|| "all-reduce receive".into(), s.len_elems(), r.len_elems())?;
        if !needs_flat(&s, r.is_derived()) {
            self.all_reduce_into(&s, &mut r, op.system_operation());
            return Ok(());
        }
        // Strided or beyond-int: predefined reductions need predefined datatypes, so reduce
        // contiguous copies (or the tensors' own runs) in chunks of at most 2^30 units.
        let info = recv_info(&mut r);
        // `r` ends here (non-lexical lifetime): the tensor is used directly below.
        let unit = s.element_type().row.unit;
        let sf = flat_send(send, &s)?;
        let rf = flat_recv(recv, info)?;
        in_chunks(sf.units, unit.size_bytes(), |offset, n| {
            // SAFETY: both buffers hold `units` units of `unit` (checked counts and spans);
            // the chunk lies inside both; send and receive are disjoint (checked).
            unsafe {
                mpi::ffi::MPI_Allreduce(
                    sf.ptr.cast::<u8>().add(offset).cast(),
                    rf.ptr.cast::<u8>().add(offset).cast(),
                    n,
                    unit.datatype().as_raw(),
                    mop,
                    self.as_raw(),
                );
            }
        });
        finish_recv(rf, recv, info.3)
    }

    /// In-place all-reduce: `tensor` is both input and output (`MPI_IN_PLACE`, §6.9.6).
    ///
    /// # Errors
    /// [`Error::UnsupportedReduction`], the errors of [`RecvSpec::new`].
    fn all_reduce_tensor_in_place(&self, tensor: &mut dyn Tensor, op: ReduceOp) -> Result<()> {
        check_intra(self)?;
        let mut r = RecvSpec::new(tensor)?;
        r.element_type().check_reduction(op)?;
        let mop = op_handle(op, r.dtype())?;
        let unit = r.element_type().row.unit;
        let units = r.len_elems() as usize * r.element_type().units_per_element();
        let (derived, count) = (r.is_derived(), r.mpi_count());
        let info = recv_info(&mut r);
        // `r` ends here (non-lexical lifetime): the tensor is used directly below.
        if !derived && units <= REDUCE_CHUNK_UNITS {
            // SAFETY: MPI_IN_PLACE as the send buffer makes MPI read and write the tensor's
            // `count` units, which the receive spec proved writable and disjoint.
            unsafe {
                mpi::ffi::MPI_Allreduce(
                    dlpack_mpi_in_place,
                    info.1,
                    count,
                    unit.datatype().as_raw(),
                    mop,
                    self.as_raw(),
                );
            }
            return Ok(());
        }
        let flat = flat_recv(&*tensor, info)?;
        in_chunks(flat.units, unit.size_bytes(), |offset, n| {
            // SAFETY: the flat buffer holds `units` units; the chunk lies inside it.
            unsafe {
                mpi::ffi::MPI_Allreduce(
                    dlpack_mpi_in_place,
                    flat.ptr.cast::<u8>().add(offset).cast(),
                    n,
                    unit.datatype().as_raw(),
                    mop,
                    self.as_raw(),
                );
            }
        });
        finish_recv(flat, tensor, info.3)
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
        check_intra(self)?;
        check_rank(root, self.size())?;
        let s = SendSpec::new(send)?;
        let process = self.process_at_rank(root);
        if self.rank() == root {
            let mut r = RecvSpec::new(recv.ok_or_else(|| missing("gather receive buffer"))?)?;
            check_pair("gather send vs receive", &s, &r)?;
            blockable_recv("gather blocks", &r)?;
            let size = self.size();
            check_count(
                || format!("gather receive (= send count × {size} ranks)"),
                s.len_elems() * i64::from(size),
                r.len_elems(),
            )?;
            process.gather_into_root(&s, &mut r);
        } else {
            process.gather_into(&s);
        }
        Ok(())
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
        check_intra(self)?;
        check_rank(root, self.size())?;
        let s = SendSpec::new(send)?;
        let process = self.process_at_rank(root);
        if self.rank() == root {
            let (t, counts, displs) = recv.ok_or_else(|| missing("gatherv receive buffer"))?;
            let r = RecvSpec::new(t)?;
            check_pair("gatherv send vs receive", &s, &r)?;
            blockable_recv("gatherv blocks", &r)?;
            let mut v = vector_recv(self, r, counts, displs)?;
            check_count(
                || format!("gatherv counts[{root}] (the root's own send)"),
                counts[root as usize],
                s.len_elems(),
            )?;
            process.gather_varcount_into_root(&s, &mut v);
        } else {
            process.gather_varcount_into(&s);
        }
        Ok(())
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
        check_intra(self)?;
        check_rank(root, self.size())?;
        let mut r = RecvSpec::new(recv)?;
        let process = self.process_at_rank(root);
        if self.rank() == root {
            let s = SendSpec::new(send.ok_or_else(|| missing("scatter send buffer"))?)?;
            check_pair("scatter send vs receive", &s, &r)?;
            blockable_send("scatter blocks", &s)?;

            let size = self.size();
            check_count(
                || format!("scatter send (= receive count × {size} ranks)"),
                r.len_elems() * i64::from(size),
                s.len_elems(),
            )?;
            process.scatter_into_root(&s, &mut r);
        } else {
            process.scatter_into(&mut r);
        }
        Ok(())
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
        check_intra(self)?;
        check_rank(root, self.size())?;
        let mut r = RecvSpec::new(recv)?;
        let process = self.process_at_rank(root);
        if self.rank() == root {
            let (t, counts, displs) = send.ok_or_else(|| missing("scatterv send buffer"))?;
            let s = SendSpec::new(t)?;
            check_pair("scatterv send vs receive", &s, &r)?;
            blockable_send("scatterv blocks", &s)?;

            let v = vector_send(self, s, counts, displs)?;
            check_count(
                || format!("scatterv counts[{root}] (the root's own receive)"),
                counts[root as usize],
                r.len_elems(),
            )?;
            process.scatter_varcount_into_root(&v, &mut r);
        } else {
            process.scatter_varcount_into(&mut r);
        }
        Ok(())
    }

    /// Every rank gathers every rank's `send` into `recv` (`MPI_Allgather`, §6.7).
    ///
    /// # Errors
    /// [`Error::CountMismatch`], [`Error::DtypeMismatch`], spec errors.
    fn all_gather_tensor(&self, send: &dyn Tensor, recv: &mut dyn Tensor) -> Result<()> {
        check_intra(self)?;
        let s = SendSpec::new(send)?;
        let mut r = RecvSpec::new(recv)?;
        check_pair("all-gather send vs receive", &s, &r)?;
        blockable_recv("all-gather blocks", &r)?;
        let size = self.size();
        check_count(
            || format!("all-gather receive (= send count × {size} ranks)"),
            s.len_elems() * i64::from(size),
            r.len_elems(),
        )?;
        self.all_gather_into(&s, &mut r);
        Ok(())
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
        check_intra(self)?;
        let s = SendSpec::new(send)?;
        let r = RecvSpec::new(recv)?;
        check_pair("all-gatherv send vs receive", &s, &r)?;
        blockable_recv("all-gatherv blocks", &r)?;
        let mut v = vector_recv(self, r, counts, displacements)?;
        let rank = self.rank();
        check_count(
            || format!("all-gatherv counts[{rank}] (this rank's send)"),
            counts[rank as usize],
            s.len_elems(),
        )?;
        self.all_gather_varcount_into(&s, &mut v);
        Ok(())
    }

    /// Personalized exchange: block `i` of `send` goes to rank `i`, block `j` of `recv`
    /// comes from rank `j` (`MPI_Alltoall`, §6.8). Both have `size × block` elements.
    ///
    /// # Errors
    /// [`Error::CountMismatch`] (counts differ or are not a multiple of the size),
    /// [`Error::DtypeMismatch`], spec errors.
    fn all_to_all_tensor(&self, send: &dyn Tensor, recv: &mut dyn Tensor) -> Result<()> {
        check_intra(self)?;
        let s = SendSpec::new(send)?;
        let mut r = RecvSpec::new(recv)?;
        check_pair("all-to-all send vs receive", &s, &r)?;
        blockable_send("all-to-all blocks", &s)?;
        blockable_recv("all-to-all blocks", &r)?;
        check_count(|| "all-to-all receive".into(), s.len_elems(), r.len_elems())?;
        let size = i64::from(self.size());
        let n = s.len_elems();
        check_count(
            || format!("all-to-all send (a multiple of {size} ranks)"),
            n - n % size,
            n,
        )?;
        self.all_to_all_into(&s, &mut r);
        Ok(())
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
        check_intra(self)?;
        let s = SendSpec::new(send)?;
        let r = RecvSpec::new(recv)?;
        check_pair("all-to-allv send vs receive", &s, &r)?;
        blockable_send("all-to-allv blocks", &s)?;
        blockable_recv("all-to-allv blocks", &r)?;
        let vs = vector_send(self, s, send_counts, send_displacements)?;
        let mut vr = vector_recv(self, r, recv_counts, recv_displacements)?;
        let rank = self.rank() as usize;
        check_count(
            || format!("all-to-allv recv_counts[{rank}] (the block this rank sends itself)"),
            send_counts[rank],
            recv_counts[rank],
        )?;
        self.all_to_all_varcount_into(&vs, &mut vr);
        Ok(())
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
        check_intra(self)?;
        let s = SendSpec::new(send)?;
        s.element_type().check_reduction(op)?;
        let mut r = RecvSpec::new(recv)?;
        check_pair("reduce-scatter-block send vs receive", &s, &r)?;
        blockable_send("reduce-scatter-block blocks", &s)?;
        blockable_recv("reduce-scatter-block blocks", &r)?;
        let size = self.size();
        check_count(
            || format!("reduce-scatter-block send (= receive count × {size} ranks)"),
            r.len_elems() * i64::from(size),
            s.len_elems(),
        )?;
        let mop = op_handle(op, s.dtype())?;
        // SAFETY: `r` holds `count` units of `unit` (its predefined type: blockable), `s`
        // holds `size × count`; they are disjoint (checked).
        unsafe {
            mpi::ffi::MPI_Reduce_scatter_block(
                s.pointer(),
                r.pointer_mut(),
                r.mpi_count(),
                r.as_datatype().as_raw(),
                mop,
                self.as_raw(),
            );
        }
        Ok(())
    }
}

/// Units per chunk when a reduction is split: element-wise reductions may be cut anywhere.
const REDUCE_CHUNK_UNITS: usize = 1 << 30;

/// The contiguous form of one side of a reduction: the tensor's own memory when it is one
/// run, else a packed copy (MPI's predefined reductions take predefined datatypes only).
struct Flat {
    ptr: *mut std::ffi::c_void,
    units: usize,
    scratch: Option<Vec<u8>>,
}

fn flat_send(send: &dyn Tensor, s: &SendSpec<'_>) -> Result<Flat> {
    let e = s.element_type();
    let units = s.len_elems() as usize * e.units_per_element();
    if s.is_contiguous() {
        return Ok(Flat {
            ptr: s.pointer() as *mut _,
            units,
            scratch: None,
        });
    }
    let mut data = crate::pack::pack(send, e.size_bytes())?;
    Ok(Flat {
        ptr: scratch_ptr(&mut data),
        units,
        scratch: Some(data),
    })
}

/// Receive side, after its spec validated it (and was dropped): the tensor's memory when it
/// is one run, else a scratch buffer holding its current values (for in-place use) that
/// [`finish_recv`] unpacks.
fn flat_recv(recv: &dyn Tensor, info: (bool, *mut std::ffi::c_void, usize, usize)) -> Result<Flat> {
    let (contiguous, ptr, units, elem) = info;
    if contiguous {
        return Ok(Flat {
            ptr,
            units,
            scratch: None,
        });
    }
    let mut data = crate::pack::pack(recv, elem)?;
    Ok(Flat {
        ptr: scratch_ptr(&mut data),
        units,
        scratch: Some(data),
    })
}

/// What the reduction paths need from a receive spec: contiguous?, pointer, units, element
/// size in bytes.
fn recv_info(r: &mut RecvSpec<'_>) -> (bool, *mut std::ffi::c_void, usize, usize) {
    let e = r.element_type();
    (
        r.is_contiguous(),
        r.pointer_mut(),
        r.len_elems() as usize * e.units_per_element(),
        e.size_bytes(),
    )
}

/// NULL for an empty scratch buffer (an empty Vec's dangling 0x1 is Open MPI's
/// MPI_IN_PLACE).
fn scratch_ptr(data: &mut [u8]) -> *mut std::ffi::c_void {
    if data.is_empty() {
        std::ptr::null_mut()
    } else {
        data.as_mut_ptr().cast()
    }
}

fn finish_recv(flat: Flat, recv: &mut dyn Tensor, elem: usize) -> Result<()> {
    match flat.scratch {
        Some(data) => crate::pack::unpack(recv, elem, &data),
        None => Ok(()),
    }
}

/// Whether a reduction takes the flat path: a strided side (packed copy) or more than 2^30
/// units (chunks). Every rank decides the same way for the same element count, so the
/// sequence of MPI calls matches across ranks.
fn needs_flat(s: &SendSpec<'_>, recv_derived: bool) -> bool {
    let units = s.len_elems() as usize * s.element_type().units_per_element();
    s.is_derived()
        || recv_derived
        || units > REDUCE_CHUNK_UNITS
        || crate::halfops::is_half(s.dtype())
}

/// The MPI operation for `op` on `dtype`: predefined, or user-defined for half precision.
fn op_handle(op: ReduceOp, dtype: crate::dtype::DType) -> Result<mpi::ffi::MPI_Op> {
    if crate::halfops::is_half(dtype) {
        crate::halfops::op(dtype, op)
    } else {
        Ok(op.system_operation().as_raw())
    }
}

/// Calls `f(send_offset_bytes, recv_offset_bytes, count)` for consecutive chunks of at most
/// 2^30 units, so that no count exceeds MPI's int.
fn in_chunks(units: usize, unit_bytes: usize, mut f: impl FnMut(usize, i32)) {
    if units == 0 {
        // Still one call: every rank must make the same collective calls.
        return f(0, 0);
    }
    let mut done = 0;
    while done < units {
        let n = (units - done).min(REDUCE_CHUNK_UNITS);
        f(done * unit_bytes, n as i32);
        done += n;
    }
}

impl<C: Communicator + ?Sized> TensorComm for C {}

fn vector_recv<'t, C: Communicator + ?Sized>(
    comm: &C,
    r: RecvSpec<'t>,
    counts: &[i64],
    displs: &[i64],
) -> Result<VectorRecvSpec<'t>> {
    check_len(comm, counts, displs)?;
    VectorRecvSpec::new(r, counts, displs)
}

fn vector_send<'t, C: Communicator + ?Sized>(
    comm: &C,
    s: SendSpec<'t>,
    counts: &[i64],
    displs: &[i64],
) -> Result<VectorSendSpec<'t>> {
    check_len(comm, counts, displs)?;
    VectorSendSpec::new(s, counts, displs)
}

fn check_len<C: Communicator + ?Sized>(comm: &C, counts: &[i64], displs: &[i64]) -> Result<()> {
    let size = comm.size() as usize;
    for (what, list) in [("counts", counts), ("displacements", displs)] {
        if list.len() != size {
            return Err(Error::LengthMismatch {
                what,
                expected: size,
                actual: list.len(),
            });
        }
    }
    Ok(())
}

/// Compares a probed message with a receive spec: the message must be exactly `count`
/// items of the spec's datatype (so strided and large-count receives compare whole
/// messages); the error reports elements.
fn check_incoming(spec: &RecvSpec<'_>, status: &Status) -> Result<()> {
    if status.count(spec.as_datatype()) == spec.mpi_count() {
        return Ok(());
    }
    let bytes = i64::from(status.count(u8::equivalent_datatype()));
    let elem = spec.element_type().size_bytes() as i64;
    Err(Error::CountMismatch {
        what: format!(
            "incoming message from rank {} tag {} ({} of {}-byte elements)",
            status.source_rank(),
            status.tag(),
            if bytes >= 0 {
                format!("{bytes} bytes")
            } else {
                "more than 2^31 bytes".to_string()
            },
            elem
        ),
        expected: spec.len_elems(),
        actual: if bytes >= 0 { bytes / elem } else { -1 },
    })
}
