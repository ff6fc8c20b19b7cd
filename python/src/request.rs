//! Nonblocking operations: `Comm.isend`, `Comm.iallreduce`, … return a [`Request`] that owns
//! the arrays until MPI is done with them; `Request.wait`, `Request.test`, `waitall`.

use std::cell::RefCell;
use std::ptr::NonNull;
use std::thread::ThreadId;

use dlpack_mpi::comm::{Blocks, BroadcastBuffer, TensorComm, TensorRequest};
use dlpack_mpi::dlpack::Tensor;
use mpi::request::Scope;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::args::{self, Array, Operand};
use crate::comm::{all_blocks, on, Comm, Ep};
use crate::detached;
use crate::errors::to_py;
use crate::status::Status;

/// rsmpi's scope of the requests made here: like `Lent` it keeps no record, for
/// requests whose buffers live for `'a`. The [`Request`] that holds such a request completes
/// it (or waits for it) before it frees what `'a` lends ([`Parts`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Lent;

// SAFETY: rsmpi's contract for a scope: every request registered with it completes before
// the buffers it names are freed. The buffers are in [`Parts`] and the communicator in the
// `Comm` object; `Request` keeps both alive until its request has completed or been waited
// for (`wait`, `test`, or `Drop`, which waits, or leaks both if MPI was finalized).
unsafe impl<'a> Scope<'a> for Lent {
    fn register(&self) {}

    unsafe fn unregister(&self) {}
}

/// The arrays and block lists a pending request points into: each moved to a heap box of its
/// own when lent, freed (each array's deleter called once) by [`Parts::release`] or on drop,
/// after the request.
#[derive(Default)]
pub(crate) struct Parts {
    lists: RefCell<Vec<NonNull<[Array]>>>,
    blocks: RefCell<Vec<NonNull<[i64]>>>,
}

impl Parts {
    /// Moves `arrays` to the heap and lends them for as long as `self` is borrowed.
    // Returning `&mut` from `&self` is an arena's: each call lends a new box of its own,
    // which nothing else references and which is freed only with `&mut self`.
    #[allow(clippy::mut_from_ref)]
    fn list(&self, arrays: Vec<Array>) -> &mut [Array] {
        let raw = NonNull::from(Box::leak(arrays.into_boxed_slice()));
        self.lists.borrow_mut().push(raw);
        // SAFETY: a box leaked just above, referenced nowhere else, freed only by `release`
        // (which takes `&mut self`, so after this borrow ends).
        unsafe { &mut *raw.as_ptr() }
    }

    /// One array, as [`Parts::list`].
    #[allow(clippy::mut_from_ref)]
    fn one(&self, array: Array) -> &mut Array {
        &mut self.list(vec![array])[0]
    }

    /// An operand, as [`Parts::list`].
    #[allow(clippy::mut_from_ref)]
    fn operand(&self, operand: Operand) -> &mut [Array] {
        match operand {
            Operand::One(t) => std::slice::from_mut(self.one(t)),
            Operand::List(l) => self.list(l),
        }
    }

    /// A block list, as [`Parts::list`].
    fn blocks(&self, blocks: Vec<i64>) -> &[i64] {
        let raw = NonNull::from(Box::leak(blocks.into_boxed_slice()));
        self.blocks.borrow_mut().push(raw);
        // SAFETY: as in `list`.
        unsafe { &*raw.as_ptr() }
    }

    /// Frees everything: the arrays are released (their deleters run).
    fn release(&mut self) {
        for raw in self.lists.get_mut().drain(..) {
            // SAFETY: leaked by `list`, freed once (drained); no reference to it is used any
            // more (`&mut self`; for a request's parts, `Request` drops the request first).
            drop(unsafe { Box::from_raw(raw.as_ptr()) });
        }
        for raw in self.blocks.get_mut().drain(..) {
            // SAFETY: as above, for `blocks`.
            drop(unsafe { Box::from_raw(raw.as_ptr()) });
        }
    }

    /// Forgets everything without releasing it (MPI was finalized with the request
    /// pending: the memory may still be MPI's).
    fn leak(&mut self) {
        self.lists.get_mut().clear();
        self.blocks.get_mut().clear();
    }
}

impl Drop for Parts {
    fn drop(&mut self) {
        self.release();
    }
}

/// A nonblocking operation in flight, from `Comm.isend`, `Comm.iallreduce`, …. It owns the
/// operation's arrays until MPI is done with them: `wait()` (or a `test()` that returns
/// `True`, or `waitall`) completes it and releases them, raising the operation's error if
/// it failed (`PeerRefused`, `CollectiveMismatch`, `CountMismatch` for a receive, …). A request
/// dropped before it completes is waited for then (with the GIL released); do not write to
/// the arrays, nor read a receive array, before it completes.
#[pyclass(module = "dlpack_mpi")]
pub struct Request {
    /// The thread that posted it: the only one that may complete it (its progress, and the
    /// library's queue of pending agreements, are that thread's).
    owner: ThreadId,
    /// The operation; `None` once completed. Dropped before `parts` (explicitly in `Drop`).
    pending: Option<TensorRequest<'static, Lent>>,
    /// What `pending` points into.
    parts: Parts,
    /// The communicator `pending` borrows (its endpoint lives in it).
    comm: Option<Py<Comm>>,
    /// The method that made it, for `repr`.
    op: &'static str,
    /// The receive's element count (`Some` for `irecv`: `wait` returns a `Status`).
    receive: Option<i64>,
    /// The receive's status, once completed.
    status: Option<Status>,
    /// The error it completed with, raised again by each later `wait` or `test`.
    failed: Option<PyErr>,
}

impl Request {
    /// Posts an operation on `comm` (endpoint for `cpu` tensors): `post` lends the arrays
    /// from the request's [`Parts`] and posts, with the GIL released (a communicator's first
    /// nonblocking collective agrees at the post).
    fn post(
        comm: &Bound<'_, Comm>,
        op: &'static str,
        cpu: bool,
        receive: Option<i64>,
        post: impl for<'p> FnOnce(&'p Parts, Ep<'p>) -> dlpack_mpi::Result<TensorRequest<'p, Lent>>,
    ) -> PyResult<Request> {
        let py = comm.py();
        let ep = comm.get().endpoint(py, cpu)?;
        let parts = Parts::default();
        let posted = detached(py, || post(&parts, ep));
        let request = posted.map_err(|e| to_py(py, e))?;
        // SAFETY: the request borrows `parts` and the `Comm` object's value; both are moved
        // into the `Request` beside it (the boxes `parts` lends do not move with it, and a
        // Python object's value does not move), which drops or completes the request
        // before it releases them (`Request::finish`, `Drop`).
        let request = unsafe {
            std::mem::transmute::<TensorRequest<'_, Lent>, TensorRequest<'static, Lent>>(request)
        };
        Ok(Request {
            owner: std::thread::current().id(),
            pending: Some(request),
            parts,
            comm: Some(comm.clone().unbind()),
            op,
            receive,
            status: None,
            failed: None,
        })
    }

    /// `RuntimeError` unless this is the thread that posted the request.
    fn on_owner(&self) -> PyResult<()> {
        if std::thread::current().id() == self.owner {
            Ok(())
        } else {
            Err(PyRuntimeError::new_err(format!(
                "this {} request was posted by another thread: only that thread may wait for \
                 or test it (its progress is that thread's)",
                self.op
            )))
        }
    }

    /// The outcome of a completed operation: the arrays released, the status kept.
    fn finish(
        &mut self,
        py: Python<'_>,
        outcome: dlpack_mpi::Result<mpi::point_to_point::Status>,
    ) -> PyResult<()> {
        self.parts.release();
        self.comm = None;
        let status = outcome.map_err(|e| {
            let e = to_py(py, e);
            self.failed = Some(e.clone_ref(py));
            e
        })?;
        self.status = self.receive.map(|count| Status::of(&status, count));
        Ok(())
    }
}

#[pymethods]
impl Request {
    /// Waits until the operation completes (the GIL released meanwhile) and releases its
    /// arrays; returns the `Status` of a receive, `None` for the others. Raises the
    /// operation's error. Waiting again returns the same.
    fn wait(&mut self, py: Python<'_>) -> PyResult<Option<Status>> {
        self.on_owner()?;
        if let Some(request) = self.pending.take() {
            let outcome = detached(py, || request.wait());
            self.finish(py, outcome)?;
        }
        match &self.failed {
            Some(e) => Err(e.clone_ref(py)),
            None => Ok(self.status.clone()),
        }
    }

    /// Whether the operation has completed (once `True`, its arrays are released and its
    /// error raised, as `wait()` would).
    fn test(&mut self, py: Python<'_>) -> PyResult<bool> {
        self.on_owner()?;
        let Some(request) = self.pending.take() else {
            return match &self.failed {
                Some(e) => Err(e.clone_ref(py)),
                None => Ok(true),
            };
        };
        match request.test() {
            Ok(outcome) => {
                self.finish(py, outcome)?;
                Ok(true)
            }
            Err(request) => {
                self.pending = Some(request);
                Ok(false)
            }
        }
    }

    /// Whether the operation has completed (as `test()` found last).
    #[getter]
    fn done(&self) -> bool {
        self.pending.is_none()
    }

    fn __repr__(&self) -> String {
        format!(
            "<dlpack_mpi.Request {} {}>",
            self.op,
            if self.pending.is_some() {
                "pending"
            } else {
                "done"
            }
        )
    }
}

// SAFETY: every access that touches the request's state (`wait`, `test`, `Drop`'s wait)
// happens on the thread that posted it (`on_owner`; on another thread `Drop` leaks it);
// pyo3 gives `&mut self` to one caller at a time, and `done`/`repr` read only a flag and a
// name.
unsafe impl Send for Request {}
// SAFETY: as for `Send` above.
unsafe impl Sync for Request {}

impl Drop for Request {
    fn drop(&mut self) {
        let Some(request) = self.pending.take() else {
            return;
        };
        let exiting = Python::attach(|py| {
            py.import("sys")
                .and_then(|sys| sys.call_method0("is_finalizing"))
                .and_then(|b| b.is_truthy())
                .unwrap_or(true)
        });
        if exiting || mpi::environment::is_finalized() || std::thread::current().id() != self.owner
        {
            // The interpreter is exiting (a request left pending at exit must not keep the
            // process from ending, as mpi4py's do not), MPI is gone and may still hold the
            // buffers, or this thread may not complete the request (`on_owner`): keep
            // everything, call nothing.
            std::mem::forget(request);
            self.parts.leak();
            return;
        }
        Python::attach(|py| detached(py, move || drop(request)));
        self.parts.release();
    }
}

/// Waits for every request of `requests` (in order, the GIL released) and releases their
/// arrays; returns their `wait()` results. Every request is completed even when one fails;
/// the first error is raised then.
#[pyfunction]
pub(crate) fn waitall(
    py: Python<'_>,
    requests: Vec<PyRefMut<'_, Request>>,
) -> PyResult<Vec<Option<Status>>> {
    let mut out = Vec::with_capacity(requests.len());
    let mut first = None;
    for mut r in requests {
        match r.wait(py) {
            Ok(s) => out.push(s),
            Err(e) => {
                out.push(None);
                first.get_or_insert(e);
            }
        }
    }
    match first {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

#[pymethods]
impl Comm {
    /// Nonblocking `send` (`MPI_Isend`); returns a `Request`.
    #[pyo3(signature = (buf, dest, tag = 0))]
    fn isend(
        slf: &Bound<'_, Self>,
        buf: &Bound<'_, PyAny>,
        dest: i32,
        tag: i32,
    ) -> PyResult<Request> {
        let t = args::acquire(slf.py(), buf)?;
        let cpu = args::on_cpu([&t]);
        Request::post(slf, "isend", cpu, None, move |parts, ep| {
            let t = parts.one(t);
            on!(ep, c => c.immediate_send_tensor(Lent, t, dest, tag))
        })
    }

    /// Nonblocking `recv` (`MPI_Irecv`, posted before the message's size is known);
    /// `wait()` returns its `Status`. A message of another size raises `CountMismatch` at
    /// completion: it has been received by then (a longer one truncated, which MPI reports
    /// as an error where the communicator's error handler lets it), so no `Unfit` holds
    /// it; `recv` matches first and raises `Unfit` instead.
    #[pyo3(signature = (buf, source, tag = 0))]
    fn irecv(
        slf: &Bound<'_, Self>,
        buf: &Bound<'_, PyAny>,
        source: i32,
        tag: i32,
    ) -> PyResult<Request> {
        let t = args::acquire(slf.py(), buf)?;
        let (cpu, count) = (args::on_cpu([&t]), args::elements(&t));
        Request::post(slf, "irecv", cpu, Some(count), move |parts, ep| {
            let t = parts.one(t);
            on!(ep, c => c.immediate_recv_tensor(Lent, t, source, tag))
        })
    }

    /// Nonblocking `bcast` (`MPI_Ibcast`; a list: the fused form).
    #[pyo3(signature = (buf, root = 0))]
    fn ibcast(slf: &Bound<'_, Self>, buf: &Bound<'_, PyAny>, root: i32) -> PyResult<Request> {
        let py = slf.py();
        let this = slf.borrow();
        let buf = this.read(py, "ibcast", true, || args::operand(py, buf))?;
        let at_root = this.my_rank() == root;
        let cpu = args::on_cpu(buf.arrays());
        let list = matches!(buf, Operand::List(_));
        Request::post(slf, "ibcast", cpu, None, move |parts, ep| {
            let arrays = parts.operand(buf);
            if list {
                return on!(ep, c => c.immediate_broadcast_tensors(Lent, arrays, root));
            }
            let t = &mut arrays[0];
            let buffer = if at_root {
                BroadcastBuffer::Send(t)
            } else {
                BroadcastBuffer::Recv(t)
            };
            on!(ep, c => c.immediate_broadcast_tensor_from(Lent, buffer, root))
        })
    }

    /// Nonblocking `reduce` (`MPI_Ireduce`).
    #[pyo3(signature = (sendbuf, recvbuf = None, op = None, root = 0))]
    fn ireduce(
        slf: &Bound<'_, Self>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: Option<&Bound<'_, PyAny>>,
        op: Option<&Bound<'_, PyAny>>,
        root: i32,
    ) -> PyResult<Request> {
        let py = slf.py();
        let this = slf.borrow();
        let (op, s, r) = this.read(py, "ireduce", true, || {
            let op = args::reduce_op(py, op)?;
            Ok((
                op,
                args::acquire(py, sendbuf)?,
                this.root_recv(py, recvbuf, root)?,
            ))
        })?;
        let cpu = args::on_cpu([&s].into_iter().chain(r.as_ref()));
        Request::post(slf, "ireduce", cpu, None, move |parts, ep| {
            let s = parts.one(s);
            let r = r.map(|r| parts.one(r) as &mut dyn Tensor);
            on!(ep, c => c.immediate_reduce_tensor(Lent, s, r, op, root))
        })
    }

    /// Nonblocking `allreduce` (`MPI_Iallreduce`; in place when `recvbuf` is `None`; lists:
    /// the fused form, whose buckets are posted as the request progresses).
    #[pyo3(signature = (sendbuf, recvbuf = None, op = None))]
    fn iallreduce(
        slf: &Bound<'_, Self>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: Option<&Bound<'_, PyAny>>,
        op: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Request> {
        let py = slf.py();
        let this = slf.borrow();
        let (op, send, recv) = this.read(py, "iallreduce", true, || {
            args::reduce_operands(py, sendbuf, recvbuf, op)
        })?;
        let cpu = args::on_cpu(
            send.arrays()
                .iter()
                .chain(recv.iter().flat_map(Operand::arrays)),
        );
        let list = matches!(send, Operand::List(_));
        Request::post(slf, "iallreduce", cpu, None, move |parts, ep| {
            let s = parts.operand(send);
            let r = recv.map(|r| parts.operand(r));
            match (list, r) {
                (false, None) => {
                    on!(ep, c => c.immediate_all_reduce_tensor_in_place(Lent, &mut s[0], op))
                }
                (false, Some(r)) => {
                    on!(ep, c => c.immediate_all_reduce_tensor(Lent, &s[0], &mut r[0], op))
                }
                (true, None) => {
                    on!(ep, c => c.immediate_all_reduce_tensors_in_place(Lent, s, op))
                }
                (true, Some(r)) => {
                    on!(ep, c => c.immediate_all_reduce_tensors(Lent, &*s, r, op))
                }
            }
        })
    }

    /// Nonblocking `reduce_scatter_block` (`MPI_Ireduce_scatter_block`; lists: the fused
    /// form).
    #[pyo3(signature = (sendbuf, recvbuf, op = None))]
    fn ireduce_scatter_block(
        slf: &Bound<'_, Self>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: &Bound<'_, PyAny>,
        op: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Request> {
        let py = slf.py();
        let this = slf.borrow();
        let (op, send, recv) = this.read(py, "ireduce_scatter_block", true, || {
            args::reduce_operands(py, sendbuf, Some(recvbuf), op)
        })?;
        let recv = recv.expect("a receive operand was given");
        let cpu = args::on_cpu(send.arrays().iter().chain(recv.arrays()));
        let list = matches!(send, Operand::List(_));
        Request::post(slf, "ireduce_scatter_block", cpu, None, move |parts, ep| {
            let s = parts.operand(send);
            let r = parts.operand(recv);
            if list {
                on!(ep, c => c.immediate_reduce_scatter_block_tensors(Lent, &*s, r, op))
            } else {
                on!(ep, c => c.immediate_reduce_scatter_block_tensor(Lent, &s[0], &mut r[0], op))
            }
        })
    }

    /// Nonblocking `gather` (`MPI_Igather`).
    #[pyo3(signature = (sendbuf, recvbuf = None, root = 0))]
    fn igather(
        slf: &Bound<'_, Self>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: Option<&Bound<'_, PyAny>>,
        root: i32,
    ) -> PyResult<Request> {
        let py = slf.py();
        let this = slf.borrow();
        let (s, r) = this.read(py, "igather", true, || {
            Ok((
                args::acquire(py, sendbuf)?,
                this.root_recv(py, recvbuf, root)?,
            ))
        })?;
        let cpu = args::on_cpu([&s].into_iter().chain(r.as_ref()));
        Request::post(slf, "igather", cpu, None, move |parts, ep| {
            let s = parts.one(s);
            let r = r.map(|r| parts.one(r) as &mut dyn Tensor);
            on!(ep, c => c.immediate_gather_tensor(Lent, s, r, root))
        })
    }

    /// Nonblocking `gatherv` (`MPI_Igatherv`).
    #[pyo3(signature = (sendbuf, recvbuf = None, counts = None, displs = None, root = 0))]
    fn igatherv(
        slf: &Bound<'_, Self>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: Option<&Bound<'_, PyAny>>,
        counts: Option<&Bound<'_, PyAny>>,
        displs: Option<&Bound<'_, PyAny>>,
        root: i32,
    ) -> PyResult<Request> {
        let py = slf.py();
        let this = slf.borrow();
        let (s, r, blocks) = this.read(py, "igatherv", true, || {
            this.gatherv_operands(py, (sendbuf, recvbuf), (counts, displs), root)
        })?;
        let cpu = args::on_cpu([&s].into_iter().chain(r.as_ref()));
        Request::post(slf, "igatherv", cpu, None, move |parts, ep| {
            let s = parts.one(s);
            let recv = match (r, blocks) {
                (Some(r), Some((c, d))) => {
                    let r = parts.one(r) as &mut dyn Tensor;
                    let (c, d) = (parts.blocks(c), parts.blocks(d));
                    Some((r, Blocks::new(c, d)))
                }
                _ => None,
            };
            on!(ep, c => c.immediate_gatherv_tensor(Lent, s, recv, root))
        })
    }

    /// Nonblocking `scatter` (`MPI_Iscatter`).
    #[pyo3(signature = (sendbuf, recvbuf, root = 0))]
    fn iscatter(
        slf: &Bound<'_, Self>,
        sendbuf: Option<&Bound<'_, PyAny>>,
        recvbuf: &Bound<'_, PyAny>,
        root: i32,
    ) -> PyResult<Request> {
        let py = slf.py();
        let this = slf.borrow();
        let (s, r) = this.read(py, "iscatter", true, || {
            Ok((
                this.root_send(py, sendbuf, root)?,
                args::acquire(py, recvbuf)?,
            ))
        })?;
        let cpu = args::on_cpu(s.iter().chain([&r]));
        Request::post(slf, "iscatter", cpu, None, move |parts, ep| {
            let s = s.map(|s| parts.one(s) as &dyn Tensor);
            let r = parts.one(r);
            on!(ep, c => c.immediate_scatter_tensor(Lent, s, r, root))
        })
    }

    /// Nonblocking `scatterv` (`MPI_Iscatterv`).
    #[pyo3(signature = (sendbuf, recvbuf, counts = None, displs = None, root = 0))]
    fn iscatterv(
        slf: &Bound<'_, Self>,
        sendbuf: Option<&Bound<'_, PyAny>>,
        recvbuf: &Bound<'_, PyAny>,
        counts: Option<&Bound<'_, PyAny>>,
        displs: Option<&Bound<'_, PyAny>>,
        root: i32,
    ) -> PyResult<Request> {
        let py = slf.py();
        let this = slf.borrow();
        let (s, r, blocks) = this.read(py, "iscatterv", true, || {
            this.scatterv_operands(py, (sendbuf, recvbuf), (counts, displs), root)
        })?;
        let cpu = args::on_cpu(s.iter().chain([&r]));
        Request::post(slf, "iscatterv", cpu, None, move |parts, ep| {
            let send = match (s, blocks) {
                (Some(s), Some((c, d))) => {
                    let s = parts.one(s) as &dyn Tensor;
                    let (c, d) = (parts.blocks(c), parts.blocks(d));
                    Some((s, Blocks::new(c, d)))
                }
                _ => None,
            };
            let r = parts.one(r);
            on!(ep, c => c.immediate_scatterv_tensor(Lent, send, r, root))
        })
    }

    /// Nonblocking `allgather` (`MPI_Iallgather`).
    fn iallgather(
        slf: &Bound<'_, Self>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: &Bound<'_, PyAny>,
    ) -> PyResult<Request> {
        let py = slf.py();
        let (s, r) = slf
            .borrow()
            .read(py, "iallgather", true, || args::pair(py, sendbuf, recvbuf))?;
        let cpu = args::on_cpu([&s, &r]);
        Request::post(slf, "iallgather", cpu, None, move |parts, ep| {
            let (s, r) = (parts.one(s), parts.one(r));
            on!(ep, c => c.immediate_all_gather_tensor(Lent, s, r))
        })
    }

    /// Nonblocking `allgatherv` (`MPI_Iallgatherv`).
    #[pyo3(signature = (sendbuf, recvbuf, counts, displs = None))]
    fn iallgatherv(
        slf: &Bound<'_, Self>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: &Bound<'_, PyAny>,
        counts: &Bound<'_, PyAny>,
        displs: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Request> {
        let py = slf.py();
        let ((s, r), (c, d)) = slf.borrow().read(py, "iallgatherv", true, || {
            Ok((
                args::pair(py, sendbuf, recvbuf)?,
                all_blocks(counts, displs)?,
            ))
        })?;
        let cpu = args::on_cpu([&s, &r]);
        Request::post(slf, "iallgatherv", cpu, None, move |parts, ep| {
            let (s, r) = (parts.one(s), parts.one(r));
            let (c, d) = (parts.blocks(c), parts.blocks(d));
            on!(ep, x => x.immediate_all_gatherv_tensor(Lent, s, r, Blocks::new(c, d)))
        })
    }

    /// Nonblocking `alltoall` (`MPI_Ialltoall`).
    fn ialltoall(
        slf: &Bound<'_, Self>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: &Bound<'_, PyAny>,
    ) -> PyResult<Request> {
        let py = slf.py();
        let (s, r) = slf
            .borrow()
            .read(py, "ialltoall", true, || args::pair(py, sendbuf, recvbuf))?;
        let cpu = args::on_cpu([&s, &r]);
        Request::post(slf, "ialltoall", cpu, None, move |parts, ep| {
            let (s, r) = (parts.one(s), parts.one(r));
            on!(ep, c => c.immediate_all_to_all_tensor(Lent, s, r))
        })
    }

    /// Nonblocking `alltoallv` (`MPI_Ialltoallv`).
    #[pyo3(signature = (sendbuf, sendcounts, recvbuf, recvcounts, sdispls = None, rdispls = None))]
    fn ialltoallv(
        slf: &Bound<'_, Self>,
        sendbuf: &Bound<'_, PyAny>,
        sendcounts: &Bound<'_, PyAny>,
        recvbuf: &Bound<'_, PyAny>,
        recvcounts: &Bound<'_, PyAny>,
        sdispls: Option<&Bound<'_, PyAny>>,
        rdispls: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Request> {
        let py = slf.py();
        let ((s, r), send_blocks, recv_blocks) =
            slf.borrow().read(py, "ialltoallv", true, || {
                Ok((
                    args::pair(py, sendbuf, recvbuf)?,
                    all_blocks(sendcounts, sdispls)?,
                    all_blocks(recvcounts, rdispls)?,
                ))
            })?;
        let cpu = args::on_cpu([&s, &r]);
        Request::post(slf, "ialltoallv", cpu, None, move |parts, ep| {
            let (s, r) = (parts.one(s), parts.one(r));
            let send = Blocks::new(parts.blocks(send_blocks.0), parts.blocks(send_blocks.1));
            let recv = Blocks::new(parts.blocks(recv_blocks.0), parts.blocks(recv_blocks.1));
            on!(ep, c => c.immediate_all_to_allv_tensor(Lent, (&*s, send), (r, recv)))
        })
    }
}
