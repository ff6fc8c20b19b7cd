//! `dlpack_mpi.Comm`: an mpi4py communicator and the blocking operations on it. The
//! nonblocking forms (`isend`, `iallreduce`, …) are in `request.rs`.

use std::mem::ManuallyDrop;
use std::sync::OnceLock;

use dlpack_mpi::comm::{refuse_collective, Blocks, BroadcastBuffer, TensorComm};
use dlpack_mpi::dlpack::Tensor;
use dlpack_mpi::transport::{DeviceComm, Transport};
use dlpack_mpi::{Error, Result};
use mpi::ffi::MPI_Comm;
use mpi::raw::{AsRaw, FromRaw};
use mpi::topology::SimpleCommunicator;
use mpi::traits::Communicator;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::args::{self, Array, Operand};
use crate::detached;
use crate::errors::to_py;
use crate::status::Status;

/// Where an operation's tensors go: plain MPI (every tensor in CPU memory), or the device
/// transport (CUDA memory direct to a CUDA-aware MPI or staged through pinned host memory;
/// pinned and managed memory).
#[derive(Clone, Copy)]
pub(crate) enum Ep<'c> {
    Host(&'c SimpleCommunicator),
    Device(&'c DeviceComm<'static, SimpleCommunicator>),
}

/// `on!(ep, c => body)`: `body` with `c` the endpoint's communicator, whichever it is (the
/// operations are [`TensorComm`]'s on both).
macro_rules! on {
    ($ep:expr, $c:ident => $body:expr) => {
        match $ep {
            $crate::comm::Ep::Host($c) => $body,
            $crate::comm::Ep::Device($c) => $body,
        }
    };
}
pub(crate) use on;

/// An mpi4py communicator for DLPack arrays: `Comm()` is `MPI.COMM_WORLD`, `Comm(comm)`
/// uses `comm` itself (the same `MPI_Comm`, messages and collectives match those of mpi4py
/// and C ranks on it), `Comm(comm, dup=True)` a duplicate (`comm.Dup()`, its own matching
/// space; free it with `c.mpi4py.Free()`).
///
/// Every method takes any object with `__dlpack__` (NumPy, JAX, Paddle, CuPy, PyTorch):
/// strided views are sent as one message in logical (row-major) order, receive arrays must
/// be writable (JAX arrays never are), and each array is released once MPI is done with it
/// (at the end of the call; for the `i…` forms when the request completes). Counts and
/// displacements are in elements. The collectives check first that every rank made the
/// same call (the agreement, `configure(agreement=...)`), so a mistake is an exception on
/// every rank instead of a hang. Errors are subclasses of `dlpack_mpi.Error`.
///
/// `op`, the reduction of `reduce`, `allreduce`, `reduce_scatter_block` and their `i…`
/// forms: `"sum"` (also `None`, the default), `"prod"`, `"min"`, `"max"`, `"land"`, `"lor"`,
/// `"lxor"`, `"band"`, `"bor"`, `"bxor"` (any case), or mpi4py's `MPI.SUM`, `MPI.PROD`, ….
/// The blocking methods return `None` unless their doc says otherwise; the `i…` forms a
/// `Request`.
#[pyclass(module = "dlpack_mpi", frozen)]
pub struct Comm {
    /// The device transport, made at the first non-CPU tensor. Declared before `handle`,
    /// which it borrows, so that it is dropped first.
    device: OnceLock<DeviceComm<'static, SimpleCommunicator>>,
    /// The communicator; never freed here (mpi4py owns it).
    handle: Box<ManuallyDrop<SimpleCommunicator>>,
    /// The mpi4py object.
    py_comm: Py<PyAny>,
    /// Where the mpi4py object keeps its `MPI_Comm` (`MPI._addressof`): mpi4py's `Free()`
    /// sets it to `MPI_COMM_NULL` there, which [`Comm::handle`] reads before each use.
    address: usize,
    /// This rank and the size, read once (they never change for a communicator).
    rank: i32,
    size: i32,
}

// SAFETY: the one member that is not `Send` and `Sync` by itself is the MPI handle (in
// `handle`, and borrowed by `device`): a value (a pointer under Open MPI, an int under MPICH)
// that MPI lets any thread use (MPI-4.1 §11.6: concurrent calls need `MPI_THREAD_MULTIPLE`,
// which mpi4py requests by default; below it, the program's threads take turns, as with
// mpi4py's own communicators). Nothing here mutates it; `DeviceComm`'s own state is a
// `Mutex` and atomics, and its runtime is `Send + Sync`.
unsafe impl Send for Comm {}
// SAFETY: as for `Send` above.
unsafe impl Sync for Comm {}

impl Comm {
    /// The communicator, while the mpi4py communicator it came from is alive: after its
    /// `Free()` (or `Disconnect()`) a `ValueError`, where MPI would be handed a freed handle.
    pub(crate) fn handle(&self) -> PyResult<&SimpleCommunicator> {
        // SAFETY: `address` is the `MPI_Comm` field of the mpi4py object `py_comm` keeps
        // alive; read afresh each time (mpi4py writes it when it frees the communicator).
        let now = unsafe { std::ptr::read_volatile(self.address as *const MPI_Comm) };
        if now == self.handle.as_raw() {
            Ok(&self.handle)
        } else {
            Err(PyValueError::new_err(
                "the mpi4py communicator of this dlpack_mpi.Comm was freed (Free() or \
                 Disconnect()): make a new Comm from a live communicator",
            ))
        }
    }

    /// The endpoint for tensors all in CPU memory (`cpu`) or not.
    pub(crate) fn endpoint(&self, py: Python<'_>, cpu: bool) -> PyResult<Ep<'_>> {
        let handle = self.handle()?;
        if cpu {
            return Ok(Ep::Host(handle));
        }
        if let Some(d) = self.device.get() {
            return Ok(Ep::Device(d));
        }
        // SAFETY: `handle` is a box whose heap address does not change while `self` lives,
        // and `device`, which holds this reference, is dropped before it (field order).
        let comm: &'static SimpleCommunicator =
            unsafe { &*std::ptr::from_ref::<SimpleCommunicator>(&self.handle) };
        let runtime = dlpack_mpi::runtime::default_runtime();
        let device = DeviceComm::new(comm, runtime, Transport::Auto).map_err(|e| to_py(py, e))?;
        Ok(Ep::Device(self.device.get_or_init(|| device)))
    }

    /// Runs `f` on the endpoint of `cpu` with the GIL released.
    fn call<R>(
        &self,
        py: Python<'_>,
        cpu: bool,
        f: impl FnOnce(Ep<'_>) -> Result<R>,
    ) -> PyResult<R> {
        let ep = self.endpoint(py, cpu)?;
        detached(py, || f(ep)).map_err(|e| to_py(py, e))
    }

    /// The arguments of collective `op` (a method's name), read by `f`. When they cannot be
    /// read (an object without `__dlpack__`, a reduction MPI does not have), the peers are
    /// told (their call raises `PeerRefused` with this error's text, instead of waiting for
    /// this rank: `dlpack_mpi::comm::refuse_collective`) and the error is raised here.
    pub(crate) fn read<T>(
        &self,
        py: Python<'_>,
        op: &'static str,
        nonblocking: bool,
        f: impl FnOnce() -> PyResult<T>,
    ) -> PyResult<T> {
        f().inspect_err(|err| {
            let refusal = Error::Python {
                call: format!("dlpack_mpi.Comm.{op}(...)"),
                exception: err.to_string(),
            };
            if let Ok(handle) = self.handle() {
                detached(py, || refuse_collective(handle, op, nonblocking, refusal));
            }
        })
    }

    /// This rank in the communicator.
    pub(crate) fn my_rank(&self) -> i32 {
        self.rank
    }
}

/// The displacements given, or the blocks laid end to end.
fn displs_or_packed(counts: &[i64], displs: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<i64>> {
    match displs.filter(|d| !d.is_none()) {
        Some(d) => args::blocks("displs", d),
        None => Ok(args::packed_displs(counts)),
    }
}

/// The counts and displacements of a v-collective's root (`None` elsewhere: only the root
/// reads them).
fn root_blocks(
    is_root: bool,
    counts: Option<&Bound<'_, PyAny>>,
    displs: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<(Vec<i64>, Vec<i64>)>> {
    if !is_root {
        return Ok(None);
    }
    let counts = counts
        .filter(|c| !c.is_none())
        .ok_or_else(|| PyValueError::new_err("counts is required at the root"))?;
    let counts = args::blocks("counts", counts)?;
    let displs = displs_or_packed(&counts, displs)?;
    Ok(Some((counts, displs)))
}

/// The counts and displacements of every rank's call (all-gatherv, all-to-allv).
pub(crate) fn all_blocks(
    counts: &Bound<'_, PyAny>,
    displs: Option<&Bound<'_, PyAny>>,
) -> PyResult<(Vec<i64>, Vec<i64>)> {
    let counts = args::blocks("counts", counts)?;
    let displs = displs_or_packed(&counts, displs)?;
    Ok((counts, displs))
}

#[pymethods]
impl Comm {
    #[new]
    #[pyo3(signature = (comm = None, *, dup = false))]
    fn new(py: Python<'_>, comm: Option<&Bound<'_, PyAny>>, dup: bool) -> PyResult<Self> {
        let mpi = py.import("mpi4py.MPI")?;
        let comm = match comm.filter(|c| !c.is_none()) {
            Some(c) => c.clone(),
            None => mpi.getattr("COMM_WORLD")?,
        };
        if !comm.is_instance(&mpi.getattr("Intracomm")?)? {
            return Err(PyTypeError::new_err(format!(
                "comm must be an mpi4py intracommunicator (MPI.COMM_WORLD, comm.Split(...)), \
                 not {}",
                comm.get_type().name()?
            )));
        }
        if comm.eq(mpi.getattr("COMM_NULL")?)? {
            return Err(PyValueError::new_err("comm is MPI.COMM_NULL"));
        }
        let comm = if dup { comm.call_method0("Dup")? } else { comm };
        // mpi4py's documented way to hand its handle to C (`MPI._addressof`): the address of
        // the `MPI_Comm` it stores (a pointer under Open MPI, an int under MPICH).
        let address: usize = mpi.call_method1("_addressof", (&comm,))?.extract()?;
        // SAFETY: `address` points to the `MPI_Comm` field of the live mpi4py object `comm`;
        // the handle is copied out while `comm` is alive.
        let raw: MPI_Comm = unsafe { std::ptr::read(address as *const MPI_Comm) };
        // SAFETY: `raw` is the live intracommunicator of `comm` (checked above), which
        // `py_comm` keeps alive; `ManuallyDrop` keeps rsmpi from freeing it (mpi4py owns it).
        // rsmpi keeps MPI_COMM_WORLD and MPI_COMM_SELF apart from other handles.
        let handle = if raw == SimpleCommunicator::world().as_raw() {
            SimpleCommunicator::world()
        } else if raw == SimpleCommunicator::self_comm().as_raw() {
            SimpleCommunicator::self_comm()
        } else {
            // SAFETY: as above (neither world nor self, as rsmpi's `from_raw` requires).
            unsafe { SimpleCommunicator::from_raw(raw) }
        };
        let (rank, size) = (handle.rank(), handle.size());
        Ok(Comm {
            device: OnceLock::new(),
            handle: Box::new(ManuallyDrop::new(handle)),
            py_comm: comm.unbind(),
            address,
            rank,
            size,
        })
    }

    /// This process's rank in the communicator.
    #[getter]
    fn rank(&self) -> i32 {
        self.rank
    }

    /// The number of processes in the communicator.
    #[getter]
    fn size(&self) -> i32 {
        self.size
    }

    /// The mpi4py communicator this wraps.
    #[getter]
    fn mpi4py(&self, py: Python<'_>) -> Py<PyAny> {
        self.py_comm.clone_ref(py)
    }

    /// After `OutOfStep` (a rank skipped or added a collective, so every later collective
    /// on this communicator raises it at once): clears it, so that collectives run again.
    /// Collective: every rank calls it at the same point, with no nonblocking collective of
    /// this `Comm` pending, once the program has brought its ranks back into step; it is a
    /// barrier. Returns whether this rank was out of step.
    fn reset_out_of_step(&self, py: Python<'_>) -> PyResult<bool> {
        let handle = self.handle()?;
        Ok(detached(py, || dlpack_mpi::comm::reset_out_of_step(handle)))
    }

    fn __repr__(&self) -> String {
        format!("<dlpack_mpi.Comm rank {} of {}>", self.rank, self.size)
    }

    /// Blocking send of all of `buf` to `dest` (`MPI_Send`; a strided `buf` as one message
    /// in logical order, which any receiver of as many elements reads).
    #[pyo3(signature = (buf, dest, tag = 0))]
    fn send(&self, py: Python<'_>, buf: &Bound<'_, PyAny>, dest: i32, tag: i32) -> PyResult<()> {
        let t = args::acquire(py, buf)?;
        self.call(
            py,
            args::on_cpu([&t]),
            |ep| on!(ep, c => c.send_tensor(&t, dest, tag)),
        )
    }

    /// Blocking receive into `buf` from `source` with `tag` (`dlpack_mpi.ANY_SOURCE` and
    /// `dlpack_mpi.ANY_TAG`, which are mpi4py's `MPI.ANY_SOURCE` and `MPI.ANY_TAG`, take any);
    /// returns the `Status`, which names the message's source and tag. The
    /// message is matched first and received only when it is exactly `buf`'s size: one that
    /// is not raises `Unfit`, whose `message` holds it (receive it with
    /// `e.message.recv_into(bigger)`; no other receive can take it).
    #[pyo3(signature = (buf, source, tag = 0))]
    fn recv(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        source: i32,
        tag: i32,
    ) -> PyResult<Status> {
        let mut t = args::acquire(py, buf)?;
        let count = args::elements(&t);
        let cpu = args::on_cpu([&t]);
        let status = self.call(
            py,
            cpu,
            |ep| on!(ep, c => c.recv_tensor(&mut t, source, tag)),
        )?;
        Ok(Status::of(&status, count))
    }

    /// Sends `sendbuf` to `dest` and receives `recvbuf` from `source` at once
    /// (`MPI_Sendrecv`: deadlock-free in a ring); returns the receive's `Status`.
    #[pyo3(signature = (sendbuf, dest, recvbuf, source, sendtag = 0, recvtag = 0))]
    #[allow(clippy::too_many_arguments)]
    fn sendrecv(
        &self,
        py: Python<'_>,
        sendbuf: &Bound<'_, PyAny>,
        dest: i32,
        recvbuf: &Bound<'_, PyAny>,
        source: i32,
        sendtag: i32,
        recvtag: i32,
    ) -> PyResult<Status> {
        let s = args::acquire(py, sendbuf)?;
        let mut r = args::acquire(py, recvbuf)?;
        let count = args::elements(&r);
        let cpu = args::on_cpu([&s, &r]);
        let status = self.call(
            py,
            cpu,
            |ep| on!(ep, c => c.sendrecv_tensor(&s, dest, sendtag, &mut r, source, recvtag)),
        )?;
        Ok(Status::of(&status, count))
    }

    /// Broadcast from `root` (`MPI_Bcast`): `buf` is sent at the root (it may be read-only
    /// there) and received into elsewhere. A list of arrays is the fused form: every
    /// member, as few messages (members writable on every rank).
    #[pyo3(signature = (buf, root = 0))]
    fn bcast(&self, py: Python<'_>, buf: &Bound<'_, PyAny>, root: i32) -> PyResult<()> {
        let mut buf = self.read(py, "bcast", false, || args::operand(py, buf))?;
        let cpu = args::on_cpu(buf.arrays());
        let at_root = self.my_rank() == root;
        self.call(py, cpu, |ep| match &mut buf {
            Operand::List(list) => on!(ep, c => c.broadcast_tensors(&mut list[..], root)),
            Operand::One(t) => {
                let buffer = if at_root {
                    BroadcastBuffer::Send(t)
                } else {
                    BroadcastBuffer::Recv(t)
                };
                on!(ep, c => c.broadcast_tensor_from(buffer, root))
            }
        })
    }

    /// Reduction to `root` (`MPI_Reduce`): `recvbuf` (same dtype and count as `sendbuf`) is
    /// required at the root and ignored elsewhere.
    /// `op`: a reduction name (`"sum"` when `None`) or an `MPI.Op`; see `Comm`.
    #[pyo3(signature = (sendbuf, recvbuf = None, op = None, root = 0))]
    fn reduce(
        &self,
        py: Python<'_>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: Option<&Bound<'_, PyAny>>,
        op: Option<&Bound<'_, PyAny>>,
        root: i32,
    ) -> PyResult<()> {
        let (op, s, mut r) = self.read(py, "reduce", false, || {
            let op = args::reduce_op(py, op)?;
            let s = args::acquire(py, sendbuf)?;
            Ok((op, s, self.root_recv(py, recvbuf, root)?))
        })?;
        let cpu = args::on_cpu([&s].into_iter().chain(r.as_ref()));
        self.call(py, cpu, |ep| {
            on!(ep, c => c.reduce_tensor(&s, r.as_mut().map(|r| r as &mut dyn Tensor), op, root))
        })
    }

    /// All-reduce (`MPI_Allreduce`): into `recvbuf`, or in place in `sendbuf` when `recvbuf`
    /// is `None`. A list of arrays (and a list of as many receive arrays, or `None`) is the
    /// fused form: the members of one dtype reduced in buckets, as few messages.
    /// `op`: a reduction name (`"sum"` when `None`) or an `MPI.Op`; see `Comm`.
    #[pyo3(signature = (sendbuf, recvbuf = None, op = None))]
    fn allreduce(
        &self,
        py: Python<'_>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: Option<&Bound<'_, PyAny>>,
        op: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (op, mut send, mut recv) = self.read(py, "allreduce", false, || {
            args::reduce_operands(py, sendbuf, recvbuf, op)
        })?;
        let cpu = args::on_cpu(
            send.arrays()
                .iter()
                .chain(recv.iter().flat_map(|r| r.arrays())),
        );
        self.call(py, cpu, |ep| match (&mut send, &mut recv) {
            (Operand::One(s), None) => on!(ep, c => c.all_reduce_tensor_in_place(s, op)),
            (Operand::One(s), Some(Operand::One(r))) => {
                on!(ep, c => c.all_reduce_tensor(s, r, op))
            }
            (Operand::List(s), None) => {
                on!(ep, c => c.all_reduce_tensors_in_place(&mut s[..], op))
            }
            (Operand::List(s), Some(Operand::List(r))) => {
                on!(ep, c => c.all_reduce_tensors(&s[..], &mut r[..], op))
            }
            _ => unreachable!("args::reduce_operands pairs a list with a list"),
        })
    }

    /// Gather to `root` (`MPI_Gather`): `recvbuf` holds size × `sendbuf`'s elements, rank i's
    /// block at element i × count; required at the root, ignored elsewhere.
    #[pyo3(signature = (sendbuf, recvbuf = None, root = 0))]
    fn gather(
        &self,
        py: Python<'_>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: Option<&Bound<'_, PyAny>>,
        root: i32,
    ) -> PyResult<()> {
        let (s, mut r) = self.read(py, "gather", false, || {
            Ok((
                args::acquire(py, sendbuf)?,
                self.root_recv(py, recvbuf, root)?,
            ))
        })?;
        let cpu = args::on_cpu([&s].into_iter().chain(r.as_ref()));
        self.call(
            py,
            cpu,
            |ep| on!(ep, c => c.gather_tensor(&s, r.as_mut().map(|r| r as &mut dyn Tensor), root)),
        )
    }

    /// Gather of blocks of different sizes (`MPI_Gatherv`): at the root, rank i's block is
    /// `counts[i]` elements at element `displs[i]` of `recvbuf` (`displs` defaults to the
    /// blocks end to end); `counts` and `displs` are read at the root only.
    #[pyo3(signature = (sendbuf, recvbuf = None, counts = None, displs = None, root = 0))]
    fn gatherv(
        &self,
        py: Python<'_>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: Option<&Bound<'_, PyAny>>,
        counts: Option<&Bound<'_, PyAny>>,
        displs: Option<&Bound<'_, PyAny>>,
        root: i32,
    ) -> PyResult<()> {
        let (s, mut r, blocks) = self.read(py, "gatherv", false, || {
            self.gatherv_operands(py, (sendbuf, recvbuf), (counts, displs), root)
        })?;
        let cpu = args::on_cpu([&s].into_iter().chain(r.as_ref()));
        self.call(py, cpu, |ep| {
            let recv = r
                .as_mut()
                .zip(blocks.as_ref())
                .map(|(r, (c, d))| (r as &mut dyn Tensor, Blocks::new(c, d)));
            on!(ep, c => c.gatherv_tensor(&s, recv, root))
        })
    }

    /// Scatter from `root` (`MPI_Scatter`): the root's `sendbuf` holds size × `recvbuf`'s
    /// elements; `sendbuf` is ignored (may be `None`) elsewhere.
    #[pyo3(signature = (sendbuf, recvbuf, root = 0))]
    fn scatter(
        &self,
        py: Python<'_>,
        sendbuf: Option<&Bound<'_, PyAny>>,
        recvbuf: &Bound<'_, PyAny>,
        root: i32,
    ) -> PyResult<()> {
        let (s, mut r) = self.read(py, "scatter", false, || {
            Ok((
                self.root_send(py, sendbuf, root)?,
                args::acquire(py, recvbuf)?,
            ))
        })?;
        let cpu = args::on_cpu(s.iter().chain([&r]));
        self.call(
            py,
            cpu,
            |ep| on!(ep, c => c.scatter_tensor(s.as_ref().map(|s| s as &dyn Tensor), &mut r, root)),
        )
    }

    /// Scatter of blocks of different sizes (`MPI_Scatterv`): at the root, rank i gets
    /// `counts[i]` elements from element `displs[i]` of `sendbuf`; `counts` and `displs` are
    /// read at the root only.
    #[pyo3(signature = (sendbuf, recvbuf, counts = None, displs = None, root = 0))]
    fn scatterv(
        &self,
        py: Python<'_>,
        sendbuf: Option<&Bound<'_, PyAny>>,
        recvbuf: &Bound<'_, PyAny>,
        counts: Option<&Bound<'_, PyAny>>,
        displs: Option<&Bound<'_, PyAny>>,
        root: i32,
    ) -> PyResult<()> {
        let (s, mut r, blocks) = self.read(py, "scatterv", false, || {
            self.scatterv_operands(py, (sendbuf, recvbuf), (counts, displs), root)
        })?;
        let cpu = args::on_cpu(s.iter().chain([&r]));
        self.call(py, cpu, |ep| {
            let send = s
                .as_ref()
                .zip(blocks.as_ref())
                .map(|(s, (c, d))| (s as &dyn Tensor, Blocks::new(c, d)));
            on!(ep, c => c.scatterv_tensor(send, &mut r, root))
        })
    }

    /// All-gather (`MPI_Allgather`): `recvbuf` holds size × `sendbuf`'s elements.
    fn allgather(
        &self,
        py: Python<'_>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let (s, mut r) = self.read(py, "allgather", false, || args::pair(py, sendbuf, recvbuf))?;
        self.call(
            py,
            args::on_cpu([&s, &r]),
            |ep| on!(ep, c => c.all_gather_tensor(&s, &mut r)),
        )
    }

    /// All-gather of blocks of different sizes (`MPI_Allgatherv`): rank i's block is
    /// `counts[i]` elements at element `displs[i]` of `recvbuf`, on every rank.
    #[pyo3(signature = (sendbuf, recvbuf, counts, displs = None))]
    fn allgatherv(
        &self,
        py: Python<'_>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: &Bound<'_, PyAny>,
        counts: &Bound<'_, PyAny>,
        displs: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let ((s, mut r), (counts, displs)) = self.read(py, "allgatherv", false, || {
            Ok((
                args::pair(py, sendbuf, recvbuf)?,
                all_blocks(counts, displs)?,
            ))
        })?;
        self.call(
            py,
            args::on_cpu([&s, &r]),
            |ep| on!(ep, c => c.all_gatherv_tensor(&s, &mut r, Blocks::new(&counts, &displs))),
        )
    }

    /// All-to-all (`MPI_Alltoall`): `sendbuf` and `recvbuf` hold size blocks of equal size;
    /// block j of `sendbuf` goes to rank j.
    fn alltoall(
        &self,
        py: Python<'_>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let (s, mut r) = self.read(py, "alltoall", false, || args::pair(py, sendbuf, recvbuf))?;
        self.call(
            py,
            args::on_cpu([&s, &r]),
            |ep| on!(ep, c => c.all_to_all_tensor(&s, &mut r)),
        )
    }

    /// All-to-all of blocks of different sizes (`MPI_Alltoallv`): `sendcounts[j]` elements
    /// from `sdispls[j]` go to rank j, `recvcounts[i]` elements from rank i land at
    /// `rdispls[i]` (displacements default to the blocks end to end).
    #[pyo3(signature = (sendbuf, sendcounts, recvbuf, recvcounts, sdispls = None, rdispls = None))]
    #[allow(clippy::too_many_arguments)]
    fn alltoallv(
        &self,
        py: Python<'_>,
        sendbuf: &Bound<'_, PyAny>,
        sendcounts: &Bound<'_, PyAny>,
        recvbuf: &Bound<'_, PyAny>,
        recvcounts: &Bound<'_, PyAny>,
        sdispls: Option<&Bound<'_, PyAny>>,
        rdispls: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let ((s, mut r), (sc, sd), (rc, rd)) = self.read(py, "alltoallv", false, || {
            Ok((
                args::pair(py, sendbuf, recvbuf)?,
                all_blocks(sendcounts, sdispls)?,
                all_blocks(recvcounts, rdispls)?,
            ))
        })?;
        self.call(py, args::on_cpu([&s, &r]), |ep| {
            on!(ep, c => c.all_to_allv_tensor(&s, Blocks::new(&sc, &sd), &mut r, Blocks::new(&rc, &rd)))
        })
    }

    /// Reduce-scatter with equal blocks (`MPI_Reduce_scatter_block`): `sendbuf` holds size ×
    /// `recvbuf`'s elements; rank i gets the reduction of every rank's block i. Lists of
    /// arrays are the fused form (member k of `recvbuf` gets block i of member k).
    /// `op`: a reduction name (`"sum"` when `None`) or an `MPI.Op`; see `Comm`.
    #[pyo3(signature = (sendbuf, recvbuf, op = None))]
    fn reduce_scatter_block(
        &self,
        py: Python<'_>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: &Bound<'_, PyAny>,
        op: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (op, send, recv) = self.read(py, "reduce_scatter_block", false, || {
            args::reduce_operands(py, sendbuf, Some(recvbuf), op)
        })?;
        let (send, mut recv) = (send, recv.expect("a receive operand was given"));
        let cpu = args::on_cpu(send.arrays().iter().chain(recv.arrays()));
        self.call(py, cpu, |ep| match (&send, &mut recv) {
            (Operand::One(s), Operand::One(r)) => {
                on!(ep, c => c.reduce_scatter_block_tensor(s, r, op))
            }
            (Operand::List(s), Operand::List(r)) => {
                on!(ep, c => c.reduce_scatter_block_tensors(&s[..], &mut r[..], op))
            }
            _ => unreachable!("args::reduce_operands pairs a list with a list"),
        })
    }
}

impl Comm {
    /// The receive array of a rooted collective: acquired at the root (`None` there is
    /// refused by the library, on every rank), `None` (not even acquired) elsewhere.
    pub(crate) fn root_recv(
        &self,
        py: Python<'_>,
        recvbuf: Option<&Bound<'_, PyAny>>,
        root: i32,
    ) -> PyResult<Option<Array>> {
        if self.my_rank() != root {
            return Ok(None);
        }
        args::acquire_optional(py, recvbuf)
    }

    /// A gatherv's operands (its `i…` form's too): the send array, and at the root the
    /// receive array and the blocks (`counts`, `displs` or the blocks end to end).
    #[allow(clippy::type_complexity)]
    pub(crate) fn gatherv_operands(
        &self,
        py: Python<'_>,
        (sendbuf, recvbuf): (&Bound<'_, PyAny>, Option<&Bound<'_, PyAny>>),
        (counts, displs): (Option<&Bound<'_, PyAny>>, Option<&Bound<'_, PyAny>>),
        root: i32,
    ) -> PyResult<(Array, Option<Array>, Option<(Vec<i64>, Vec<i64>)>)> {
        let blocks = root_blocks(self.my_rank() == root, counts, displs)?;
        let send = args::acquire(py, sendbuf)?;
        Ok((send, self.root_recv(py, recvbuf, root)?, blocks))
    }

    /// A scatterv's operands (its `i…` form's too): at the root the send array and the
    /// blocks, and the receive array.
    #[allow(clippy::type_complexity)]
    pub(crate) fn scatterv_operands(
        &self,
        py: Python<'_>,
        (sendbuf, recvbuf): (Option<&Bound<'_, PyAny>>, &Bound<'_, PyAny>),
        (counts, displs): (Option<&Bound<'_, PyAny>>, Option<&Bound<'_, PyAny>>),
        root: i32,
    ) -> PyResult<(Option<Array>, Array, Option<(Vec<i64>, Vec<i64>)>)> {
        let blocks = root_blocks(self.my_rank() == root, counts, displs)?;
        let send = self.root_send(py, sendbuf, root)?;
        Ok((send, args::acquire(py, recvbuf)?, blocks))
    }

    /// The send array of a rooted scatter: acquired at the root, `None` elsewhere.
    pub(crate) fn root_send(
        &self,
        py: Python<'_>,
        sendbuf: Option<&Bound<'_, PyAny>>,
        root: i32,
    ) -> PyResult<Option<Array>> {
        if self.my_rank() != root {
            return Ok(None);
        }
        args::acquire_optional(py, sendbuf)
    }
}
