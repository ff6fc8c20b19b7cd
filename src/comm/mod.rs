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

use mpi::datatype::{
    AsDatatype, Buffer, BufferMut, Collection, Equivalence, Partition, PartitionMut, Pointer,
    PointerMut,
};
use mpi::point_to_point::Status;
use mpi::raw::AsRaw;
use mpi::request::{Request, Scope};
use mpi::topology::{Communicator, Rank};
use mpi::traits::*;
use mpi::Count;
use mpi::Tag;

use crate::dlpack::Tensor;
use crate::dtype::ReduceOp;
use crate::error::{Error, Result};
use crate::spec::{RecvSpec, SendSpec};

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

pub(crate) fn check_rank(rank: Rank, size: Rank) -> Result<()> {
    if (0..size).contains(&rank) {
        Ok(())
    } else {
        Err(Error::InvalidRank { rank, size })
    }
}

pub(crate) fn check_tag(tag: Tag) -> Result<()> {
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
        if copy_packing(spec.is_contiguous())? {
            let flat = flat_send(tensor, &spec)?.counted()?;
            self.process_at_rank(dest).send_with_tag(&flat, tag);
        } else {
            self.process_at_rank(dest).send_with_tag(&spec, tag);
        }
        Ok(())
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
        check_rank(source, self.target_size())?;
        check_tag(tag)?;
        let mut spec = RecvSpec::new(&mut *tensor)?;
        let process = self.process_at_rank(source);
        let status = process.probe_with_tag(tag);
        check_incoming(&spec, &status)?;
        if copy_packing(spec.is_contiguous())? {
            let info = recv_info(&mut spec);
            let mut flat = flat_recv(&*tensor, info, false)?.counted()?;
            let status = process.receive_into_with_tag(&mut flat, tag);
            finish_recv(flat, tensor, info.3)?;
            return Ok(status);
        }
        Ok(process.receive_into_with_tag(&mut spec, tag))
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
        check_rank(dest, self.target_size())?;
        check_rank(source, self.target_size())?;
        check_tag(send_tag)?;
        check_tag(recv_tag)?;
        let s = SendSpec::new(send)?;
        let mut r = RecvSpec::new(&mut *recv)?;
        check_disjoint(&s, &r)?;
        let src = self.process_at_rank(source);
        let dst = self.process_at_rank(dest);
        if copy_packing(s.is_contiguous() && r.is_contiguous())? {
            let info = recv_info(&mut r);
            let sf = flat_send(send, &s)?.counted()?;
            let mut rf = flat_recv(&*recv, info, false)?.counted()?;
            let result = mpi::request::scope(|scope| {
                let req = dst.immediate_send_with_tag(scope, &sf, send_tag);
                let status = src.probe_with_tag(recv_tag);
                let checked = check_incoming_units(rf.units, &status, info.3, rf.unit);
                let result = checked.map(|()| src.receive_into_with_tag(&mut rf, recv_tag));
                req.wait();
                result
            })?;
            finish_recv(rf, recv, info.3)?;
            return Ok(result);
        }
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
            let flat = if copy_packing(spec.is_contiguous())? {
                Some(flat_send(&*tensor, &spec)?.counted()?)
            } else {
                None
            };
            let (ptr, count, datatype) = match &flat {
                Some(f) => (f.ptr, f.count(), f.unit.datatype().as_raw()),
                None => (
                    spec.pointer() as *mut std::ffi::c_void,
                    spec.mpi_count(),
                    spec.as_datatype().as_raw(),
                ),
            };
            // SAFETY: MPI_Bcast only reads the buffer at the root (MPI-4.1 §6.4); it holds
            // `count` readable units of `datatype` (the tensor, or its packed copy).
            unsafe { mpi::ffi::MPI_Bcast(ptr, count, datatype, root, self.as_raw()) };
        } else {
            let mut spec = RecvSpec::new(&mut *tensor)?;
            if copy_packing(spec.is_contiguous())? {
                let info = recv_info(&mut spec);
                let mut flat = flat_recv(&*tensor, info, false)?.counted()?;
                process.broadcast_into(&mut flat);
                finish_recv(flat, tensor, info.3)?;
            } else {
                process.broadcast_into(&mut spec);
            }
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
            let rf = flat_recv(&*recv, info, false)?;
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
        let rf = flat_recv(recv, info, false)?;
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
        let flat = flat_recv(&*tensor, info, true)?;
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
            let recv = recv.ok_or_else(|| missing("gather receive buffer"))?;
            let mut r = RecvSpec::new(&mut *recv)?;
            check_pair("gather send vs receive", &s, &r)?;
            let size = self.size();
            check_count(
                || format!("gather receive (= send count × {size} ranks)"),
                s.len_elems() * i64::from(size),
                r.len_elems(),
            )?;
            let info = recv_info(&mut r);
            let mut rf = flat_recv(&*recv, info, false)?.counted()?;
            process.gather_into_root(&s, &mut rf);
            finish_recv(rf, recv, info.3)
        } else {
            process.gather_into(&s);
            Ok(())
        }
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
            let (recv, counts, displs) = recv.ok_or_else(|| missing("gatherv receive buffer"))?;
            let mut r = RecvSpec::new(&mut *recv)?;
            check_pair("gatherv send vs receive", &s, &r)?;
            let (cu, du) = blocks_in_units(self, &r, counts, displs, true)?;
            check_count(
                || format!("gatherv counts[{root}] (the root's own send)"),
                counts[root as usize],
                s.len_elems(),
            )?;
            let info = recv_info(&mut r);
            let mut rf = flat_recv(&*recv, info, true)?.counted()?;
            {
                let mut part = PartitionMut::new(&mut rf, &cu[..], &du[..]);
                process.gather_varcount_into_root(&s, &mut part);
            }
            finish_recv(rf, recv, info.3)
        } else {
            process.gather_varcount_into(&s);
            Ok(())
        }
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
            let send = send.ok_or_else(|| missing("scatter send buffer"))?;
            let s = SendSpec::new(send)?;
            check_pair("scatter send vs receive", &s, &r)?;
            let size = self.size();
            check_count(
                || format!("scatter send (= receive count × {size} ranks)"),
                r.len_elems() * i64::from(size),
                s.len_elems(),
            )?;
            let sf = flat_send(send, &s)?.counted()?;
            process.scatter_into_root(&sf, &mut r);
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
            let (send, counts, displs) = send.ok_or_else(|| missing("scatterv send buffer"))?;
            let s = SendSpec::new(send)?;
            check_pair("scatterv send vs receive", &s, &r)?;
            let (cu, du) = send_blocks_in_units(self, &s, counts, displs)?;
            check_count(
                || format!("scatterv counts[{root}] (the root's own receive)"),
                counts[root as usize],
                r.len_elems(),
            )?;
            let sf = flat_send(send, &s)?.counted()?;
            let part = Partition::new(&sf, &cu[..], &du[..]);
            process.scatter_varcount_into_root(&part, &mut r);
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
        let mut r = RecvSpec::new(&mut *recv)?;
        check_pair("all-gather send vs receive", &s, &r)?;
        let size = self.size();
        check_count(
            || format!("all-gather receive (= send count × {size} ranks)"),
            s.len_elems() * i64::from(size),
            r.len_elems(),
        )?;
        let info = recv_info(&mut r);
        let mut rf = flat_recv(&*recv, info, false)?.counted()?;
        self.all_gather_into(&s, &mut rf);
        finish_recv(rf, recv, info.3)
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
        let mut r = RecvSpec::new(&mut *recv)?;
        check_pair("all-gatherv send vs receive", &s, &r)?;
        let (cu, du) = blocks_in_units(self, &r, counts, displacements, true)?;
        let rank = self.rank();
        check_count(
            || format!("all-gatherv counts[{rank}] (this rank's send)"),
            counts[rank as usize],
            s.len_elems(),
        )?;
        let info = recv_info(&mut r);
        let mut rf = flat_recv(&*recv, info, true)?.counted()?;
        // The send side is flattened too: Open MPI 4.1's all-gatherv hangs at 3 ranks when
        // one rank sends a derived datatype of 64 Ki elements (found by `dlpack-mpi check
        // --layout step`).
        let sf = flat_send(send, &s)?.counted()?;
        {
            let mut part = PartitionMut::new(&mut rf, &cu[..], &du[..]);
            self.all_gather_varcount_into(&sf, &mut part);
        }
        finish_recv(rf, recv, info.3)
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
        let mut r = RecvSpec::new(&mut *recv)?;
        check_pair("all-to-all send vs receive", &s, &r)?;
        check_count(|| "all-to-all receive".into(), s.len_elems(), r.len_elems())?;
        let size = i64::from(self.size());
        let n = s.len_elems();
        check_count(
            || format!("all-to-all send (a multiple of {size} ranks)"),
            n - n % size,
            n,
        )?;
        let info = recv_info(&mut r);
        let sf = flat_send(send, &s)?.counted()?;
        let mut rf = flat_recv(&*recv, info, false)?.counted()?;
        self.all_to_all_into(&sf, &mut rf);
        finish_recv(rf, recv, info.3)
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
        let mut r = RecvSpec::new(&mut *recv)?;
        check_pair("all-to-allv send vs receive", &s, &r)?;
        let (scu, sdu) = send_blocks_in_units(self, &s, send_counts, send_displacements)?;
        let (rcu, rdu) = blocks_in_units(self, &r, recv_counts, recv_displacements, true)?;
        let rank = self.rank() as usize;
        check_count(
            || format!("all-to-allv recv_counts[{rank}] (the block this rank sends itself)"),
            send_counts[rank],
            recv_counts[rank],
        )?;
        let info = recv_info(&mut r);
        let sf = flat_send(send, &s)?.counted()?;
        let mut rf = flat_recv(&*recv, info, true)?.counted()?;
        {
            let sp = Partition::new(&sf, &scu[..], &sdu[..]);
            let mut rp = PartitionMut::new(&mut rf, &rcu[..], &rdu[..]);
            self.all_to_all_varcount_into(&sp, &mut rp);
        }
        finish_recv(rf, recv, info.3)
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
        let mop = op_handle(op, s.dtype())?;
        let mut r = RecvSpec::new(&mut *recv)?;
        check_pair("reduce-scatter-block send vs receive", &s, &r)?;
        let size = self.size();
        check_count(
            || format!("reduce-scatter-block send (= receive count × {size} ranks)"),
            r.len_elems() * i64::from(size),
            s.len_elems(),
        )?;
        let info = recv_info(&mut r);
        let sf = flat_send(send, &s)?.counted()?;
        let mut rf = flat_recv(&*recv, info, false)?.counted()?;
        // SAFETY: `rf` holds `count` units of `unit`, `sf` holds `size × count`; both are
        // contiguous runs of the predefined type and disjoint (checked).
        unsafe {
            mpi::ffi::MPI_Reduce_scatter_block(
                sf.pointer(),
                rf.pointer_mut(),
                rf.count(),
                rf.as_datatype().as_raw(),
                mop,
                self.as_raw(),
            );
        }
        finish_recv(rf, recv, info.3)
    }
}

/// Units per chunk when a reduction is split: element-wise reductions may be cut anywhere.
const REDUCE_CHUNK_UNITS: usize = 1 << 30;

/// The contiguous form of one side of a collective: the tensor's own memory when it is one
/// run, else a packed copy in logical order. MPI's predefined reductions take predefined
/// datatypes only, and per-rank blocks need a buffer that splits into equal units, so these
/// paths hand MPI a `Flat` of `count` units of the predefined unit type.
struct Flat {
    ptr: *mut std::ffi::c_void,
    units: usize,
    unit: crate::dtype::MpiUnit,
    scratch: Option<Vec<u8>>,
}

impl Flat {
    /// A flat used as one rsmpi buffer: its unit count must fit MPI's int.
    fn counted(self) -> Result<Self> {
        if self.units > i32::MAX as usize {
            return Err(Error::CountTooLarge {
                count: self.units as u64,
            });
        }
        Ok(self)
    }

    fn new(
        ptr: *mut std::ffi::c_void,
        units: usize,
        unit: crate::dtype::MpiUnit,
        scratch: Option<Vec<u8>>,
    ) -> Self {
        Flat {
            ptr,
            units,
            unit,
            scratch,
        }
    }
}

// SAFETY: `ptr` is the tensor's validated first element or the scratch buffer, holding
// `units` units of `unit`.
unsafe impl Pointer for Flat {
    fn pointer(&self) -> *const std::ffi::c_void {
        self.ptr
    }
}

// SAFETY: as above; receive flats come from validated receive specs or owned scratch.
unsafe impl PointerMut for Flat {
    fn pointer_mut(&mut self) -> *mut std::ffi::c_void {
        self.ptr
    }
}

// SAFETY: `units` fits an int whenever a Flat is used as an rsmpi buffer (blocked
// collectives check it: `fits_int`).
unsafe impl Collection for Flat {
    fn count(&self) -> mpi::Count {
        mpi::Count::try_from(self.units).unwrap_or(mpi::Count::MAX)
    }
}

// SAFETY: the predefined unit type of the elements.
unsafe impl AsDatatype for Flat {
    type Out = mpi::datatype::DatatypeRef<'static>;
    fn as_datatype(&self) -> Self::Out {
        self.unit.datatype()
    }
}

// SAFETY: see the impls above.
unsafe impl Buffer for Flat {}
// SAFETY: see the impls above.
unsafe impl BufferMut for Flat {}

fn flat_send(send: &dyn Tensor, s: &SendSpec<'_>) -> Result<Flat> {
    let e = s.element_type();
    let units = s.len_elems() as usize * e.units_per_element();
    if s.is_contiguous() {
        return Ok(Flat::new(s.pointer() as *mut _, units, e.row.unit, None));
    }
    let mut data = crate::pack::pack(send, e.size_bytes())?;
    Ok(Flat::new(
        scratch_ptr(&mut data),
        units,
        e.row.unit,
        Some(data),
    ))
}

/// Receive side, after its spec validated it (and was dropped): the tensor's memory when it
/// is one run, else a scratch buffer holding its current values (for in-place use) that
/// [`finish_recv`] unpacks.
fn flat_recv(recv: &dyn Tensor, info: RecvInfo, preserve: bool) -> Result<Flat> {
    let (contiguous, ptr, units, elem, unit) = info;
    if contiguous {
        return Ok(Flat::new(ptr, units, unit, None));
    }
    // `preserve`: the operation reads the buffer (in place) or leaves parts of it alone
    // (v-variants), so the scratch starts as a packed copy of the current values.
    let mut data = if preserve {
        crate::pack::pack(recv, elem)?
    } else {
        vec![0u8; units * unit.size_bytes()]
    };
    Ok(Flat::new(scratch_ptr(&mut data), units, unit, Some(data)))
}

/// What the flat paths need from a receive spec: contiguous?, pointer, units, element size
/// in bytes, unit type.
type RecvInfo = (
    bool,
    *mut std::ffi::c_void,
    usize,
    usize,
    crate::dtype::MpiUnit,
);

fn recv_info(r: &mut RecvSpec<'_>) -> RecvInfo {
    let e = r.element_type();
    (
        r.is_contiguous(),
        r.pointer_mut(),
        r.len_elems() as usize * e.units_per_element(),
        e.size_bytes(),
        e.row.unit,
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

/// Per-rank blocks of a receive tensor (elements) checked against it (inside, disjoint)
/// and converted to MPI units of its predefined type.
fn blocks_in_units<C: Communicator + ?Sized>(
    comm: &C,
    r: &RecvSpec<'_>,
    counts: &[i64],
    displs: &[i64],
    disjoint: bool,
) -> Result<(Vec<Count>, Vec<Count>)> {
    check_len(comm, counts, displs)?;
    crate::layout::check_blocks(counts, displs, counts.len(), r.len_elems(), disjoint)?;
    to_units(counts, displs, r.element_type().units_per_element())
}

/// Per-rank blocks of a send tensor (elements), checked and converted to units.
fn send_blocks_in_units<C: Communicator + ?Sized>(
    comm: &C,
    s: &SendSpec<'_>,
    counts: &[i64],
    displs: &[i64],
) -> Result<(Vec<Count>, Vec<Count>)> {
    check_len(comm, counts, displs)?;
    crate::layout::check_blocks(counts, displs, counts.len(), s.len_elems(), false)?;
    to_units(counts, displs, s.element_type().units_per_element())
}

fn to_units(counts: &[i64], displs: &[i64], lanes: usize) -> Result<(Vec<Count>, Vec<Count>)> {
    let unit = |x: &i64| {
        let u = i128::from(*x) * lanes as i128;
        Count::try_from(u).map_err(|_| Error::CountTooLarge {
            count: u.max(0) as u64,
        })
    };
    Ok((
        counts.iter().map(unit).collect::<Result<_>>()?,
        displs.iter().map(unit).collect::<Result<_>>()?,
    ))
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

/// Whether the [`crate::spec::Packing::Copy`] policy applies to a non-contiguous side.
fn copy_packing(contiguous: bool) -> Result<bool> {
    Ok(!contiguous && crate::spec::packing()? == crate::spec::Packing::Copy)
}

/// Compares a probed message with a flat receive buffer of `units` units.
fn check_incoming_units(
    units: usize,
    status: &Status,
    elem: usize,
    unit: crate::dtype::MpiUnit,
) -> Result<()> {
    if status.count(unit.datatype()) as i64 == units as i64 {
        return Ok(());
    }
    let bytes = i64::from(status.count(u8::equivalent_datatype()));
    let lanes = (elem / unit.size_bytes()).max(1);
    Err(Error::CountMismatch {
        what: format!(
            "incoming message from rank {} tag {} ({bytes} bytes of {elem}-byte elements)",
            status.source_rank(),
            status.tag()
        ),
        expected: (units / lanes) as i64,
        actual: if bytes >= 0 { bytes / elem as i64 } else { -1 },
    })
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
