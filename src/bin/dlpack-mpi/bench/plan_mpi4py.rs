//! mpi4py's persistent way, the `mpi4py-persistent` path of `--op plan` (feature `python`):
//! NumPy float32 arrays of the members' shapes, one persistent all-reduce request per member
//! made once (`comm.Allreduce_init(MPI.IN_PLACE, a, op=MPI.SUM)`, MPI-4.0 §6.13, a
//! collective call), then each iteration `MPI.Prequest.Startall(reqs)` and
//! `MPI.Request.Waitall(reqs)`: what a Python user who plans writes. The requests are freed
//! when the arrays are.
//!
//! Loaded after `--op fused`'s [`super::fused_mpi4py::Mpi4py::load`] succeeded on every rank
//! (which imported mpi4py attached to this binary's MPI): [`Persistent::load`] imports the
//! same modules and says why the way is not available where mpi4py's MPI is older than
//! MPI-4.0 (Open MPI 4.1 implements MPI 3.1: its `Allreduce_init` raises
//! `NotImplementedError`), or where mpi4py has no `Comm.Allreduce_init`; no MPI call is
//! made then, so every rank decides alike. Timed as the other mpi4py paths: one Python call,
//! `comm.Barrier()`, then `time.perf_counter()` around all its iterations. Uses nothing of
//! `bench/`.

/// The values' period and per-rank step; [`super::common::value`] is
/// `(k % PERIOD + PERIOD * rank)` as f32, and the Python code writes and checks the same.
#[cfg(feature = "python")]
const PERIOD: usize = 4096;

#[cfg(feature = "python")]
mod imp {
    use dlpack_mpi::python::pyo3;
    use pyo3::prelude::*;
    use pyo3::types::PyDict;

    use super::PERIOD;

    /// The functions of the persistent way, run in their own namespace.
    const SETUP: &std::ffi::CStr = c"
from time import perf_counter
import numpy as np
import mpi4py
from mpi4py import MPI
comm = MPI.COMM_WORLD
why = None
version = MPI.Get_version()
if version < (4, 0):
    library = MPI.Get_library_version().strip(' \\0\\n').splitlines()[0].split(',')[0].strip()
    why = (f'{library} implements MPI {version[0]}.{version[1]}: persistent collectives '
           f'(Allreduce_init) are MPI-4.0')
elif not hasattr(comm, 'Allreduce_init'):
    why = f'mpi4py {mpi4py.__version__} has no Comm.Allreduce_init'

def members(shapes):
    xs = [np.zeros(s, dtype=np.float32) for s in shapes]
    reqs = [comm.Allreduce_init(MPI.IN_PLACE, a, op=MPI.SUM) for a in xs]
    return xs, reqs

def persistent(m, iters):
    reqs = m[1]
    Startall, Waitall = MPI.Prequest.Startall, MPI.Request.Waitall
    comm.Barrier()
    t = perf_counter()
    for _ in range(iters):
        Startall(reqs)
        Waitall(reqs)
    return perf_counter() - t

def free(m):
    for r in m[1]:
        r.Free()
    m[1].clear()

def fill(m, rank):
    base = 0
    for a in m[0]:
        n = a.size
        if rank is None:
            a.fill(0)
        else:
            a.reshape(-1)[:] = np.arange(base, base + n) % period + period * rank
        base += n

def check(m, ranks):
    base = 0
    for a in m[0]:
        n = a.size
        want = ranks * (np.arange(base, base + n) % period) + period * (ranks * (ranks - 1) // 2)
        got = a.reshape(-1)
        bad = np.flatnonzero(got != want)
        if bad.size:
            return base + int(bad[0]), float(got[bad[0]])
        base += n
    return None
";

    type Res<T> = dlpack_mpi::Result<T>;

    fn py_error(call: String, e: impl Into<PyErr>) -> dlpack_mpi::Error {
        dlpack_mpi::Error::Python {
            call,
            exception: e.into().to_string(),
        }
    }

    /// `ns[name](*args)`.
    fn call<'py>(
        py: Python<'py>,
        ns: &Py<PyDict>,
        name: &str,
        args: impl pyo3::call::PyCallArgs<'py>,
    ) -> Res<Bound<'py, PyAny>> {
        let fail = |e: PyErr| py_error(format!("{name}() of mpi4py-persistent"), e);
        let f = ns
            .bind(py)
            .get_item(name)
            .map_err(fail)?
            .ok_or_else(|| fail(pyo3::exceptions::PyKeyError::new_err(name.to_owned())))?;
        f.call1(args).map_err(fail)
    }

    /// mpi4py's persistent all-reduce, available.
    pub struct Persistent {
        ns: Py<PyDict>,
    }

    impl Persistent {
        /// The persistent way when this rank's mpi4py (already imported and attached) and
        /// its MPI have it; `Err` says why not. No MPI call.
        pub fn load() -> Result<Self, String> {
            Python::attach(|py| {
                let err = |e: PyErr| format!("the embedded Python: {e}");
                let ns = PyDict::new(py);
                ns.set_item("period", PERIOD).map_err(err)?;
                py.run(SETUP, Some(&ns), None).map_err(err)?;
                match ns.get_item("why").ok().flatten().filter(|v| !v.is_none()) {
                    Some(why) => Err(why.to_string()),
                    None => Ok(Persistent { ns: ns.unbind() }),
                }
            })
        }

        /// Zero-filled NumPy float32 arrays of `shapes` and their persistent requests (a
        /// collective call: every rank, in the same order).
        pub fn members(&self, shapes: &[Vec<i64>]) -> Res<PersistentMembers> {
            Python::attach(|py| {
                let m = call(py, &self.ns, "members", (shapes.to_vec(),))?;
                Ok(PersistentMembers {
                    ns: self.ns.clone_ref(py),
                    m: Some(m.unbind()),
                })
            })
        }
    }

    /// One list's arrays and persistent requests (freed on drop).
    pub struct PersistentMembers {
        ns: Py<PyDict>,
        m: Option<Py<PyAny>>,
    }

    impl PersistentMembers {
        fn with<T>(&self, f: impl FnOnce(Python<'_>, &Bound<'_, PyAny>) -> Res<T>) -> Res<T> {
            Python::attach(|py| match &self.m {
                Some(m) => f(py, m.bind(py)),
                None => Err(py_error(
                    "mpi4py-persistent".into(),
                    pyo3::exceptions::PyRuntimeError::new_err("the arrays were freed"),
                )),
            })
        }

        /// `iters` iterations after a barrier: seconds on this rank, timed in Python.
        pub fn elapsed(&self, iters: u64) -> Res<f64> {
            self.with(|py, m| {
                let v = call(py, &self.ns, "persistent", (m, iters))?;
                v.extract::<f64>()
                    .map_err(|e| py_error("persistent() of mpi4py-persistent".into(), e))
            })
        }

        /// Every element: rank `rank`'s values (`Some`), or zeros.
        pub fn fill(&self, rank: Option<i32>) -> Res<()> {
            self.with(|py, m| call(py, &self.ns, "fill", (m, rank)).map(drop))
        }

        /// The first element (index in the list, value) that is not the sum over `ranks`.
        pub fn check(&self, ranks: i32) -> Res<Option<(usize, f32)>> {
            self.with(|py, m| {
                let v = call(py, &self.ns, "check", (m, ranks))?;
                v.extract::<Option<(usize, f32)>>()
                    .map_err(|e| py_error("check() of mpi4py-persistent".into(), e))
            })
        }
    }

    impl Drop for PersistentMembers {
        fn drop(&mut self) {
            if let Some(m) = self.m.take() {
                Python::attach(|py| {
                    // MPI_Request_free of inactive persistent requests: local, no peer waits.
                    let _ = call(py, &self.ns, "free", (m.bind(py),));
                    drop(m);
                });
            }
        }
    }
}

#[cfg(not(feature = "python"))]
mod imp {
    type Res<T> = dlpack_mpi::Result<T>;

    /// Never made: this build has no Python.
    pub struct Persistent(std::convert::Infallible);

    impl Persistent {
        /// Always `Err`: no feature `python`.
        pub fn load() -> Result<Self, String> {
            Err("this build has no Python support (feature `python`)".into())
        }

        pub fn members(&self, _shapes: &[Vec<i64>]) -> Res<PersistentMembers> {
            match self.0 {}
        }
    }

    /// Never made.
    pub struct PersistentMembers(std::convert::Infallible);

    impl PersistentMembers {
        pub fn elapsed(&self, _iters: u64) -> Res<f64> {
            match self.0 {}
        }

        pub fn fill(&self, _rank: Option<i32>) -> Res<()> {
            match self.0 {}
        }

        pub fn check(&self, _ranks: i32) -> Res<Option<(usize, f32)>> {
            match self.0 {}
        }
    }
}

pub use imp::{Persistent, PersistentMembers};
