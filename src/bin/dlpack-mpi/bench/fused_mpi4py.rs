//! The mpi4py paths of `--op fused` (feature `python`): the same lists, as NumPy float32
//! arrays of the members' shapes in the embedded interpreter, all-reduced (sum, in place) by
//! mpi4py the two ways a Python user writes it:
//!
//! - **`mpi4py-loop`**: `comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)` for every member `a`,
//!   in a Python loop;
//! - **`mpi4py-concat`**: `flat = np.concatenate([a.ravel() for a in xs])`, one
//!   `comm.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)`, then every member copied back from
//!   its slice of `flat` (`np.copyto`); the concatenation allocates `flat` at every call.
//!
//! One timed run is one Python call: `comm.Barrier()`, then `time.perf_counter()` around all
//! its iterations, so the cost of entering the interpreter from Rust stays outside the time
//! (the Rust paths time `mpi::time()` after a barrier the same way).
//!
//! mpi4py attaches to the MPI library and the `MPI_COMM_WORLD` this binary initialized:
//! `mpi4py.rc.initialize = False` (Rust called `MPI_Init_thread`), `rc.finalize = False`
//! (Rust calls `MPI_Finalize`), and `rc.errors = "default"` (mpi4py's default, `exception`,
//! would set `MPI_ERRORS_RETURN` on `MPI_COMM_WORLD`, which the Rust side uses too). Its
//! MPI must then be initialized, report this binary's library version and the same world
//! size and rank; when that fails, or NumPy or mpi4py cannot be imported, [`Mpi4py::load`]
//! says why and `--op fused` skips the two paths. `OPENBLAS_NUM_THREADS` is set to 1 (unless
//! set) before NumPy is imported: its BLAS threads are not used here and would otherwise
//! compete for the cores. `NUMPY_MADVISE_HUGEPAGE` is set to 0 (unless set): NumPy asks for
//! transparent huge pages for arrays of 4 MiB and more, the bench's own buffers live on 4 KiB
//! pages, and the huge pages alone made mpi4py-loop up to 2× faster than the same
//! `MPI_Allreduce` calls on the bench's buffers (docs/PERFORMANCE.md, "Fused collectives"):
//! every path runs on the same kind of memory; `NUMPY_MADVISE_HUGEPAGE=1` gives NumPy's
//! default. Uses nothing of `bench/`.

/// The values' period and per-rank step; [`super::common::value`] is
/// `(k % PERIOD + PERIOD * rank)` as f32, and the Python code writes and checks the same.
#[cfg(feature = "python")]
const PERIOD: usize = 4096;

/// One of mpi4py's two ways.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// One `Allreduce` per member, in a Python loop.
    Loop,
    /// `np.concatenate`, one `Allreduce`, copied back into the members.
    Concat,
}

#[cfg(feature = "python")]
mod imp {
    use dlpack_mpi::python::pyo3;
    use mpi::topology::SimpleCommunicator;
    use mpi::traits::*;
    use pyo3::prelude::*;
    use pyo3::types::PyDict;

    use super::{Way, PERIOD};

    /// The functions of the mpi4py paths, run in their own namespace.
    const SETUP: &std::ffi::CStr = c"
import os
os.environ.setdefault('OPENBLAS_NUM_THREADS', '1')
os.environ.setdefault('NUMPY_MADVISE_HUGEPAGE', '0')
from time import perf_counter
why = None
try:
    import numpy as np
except Exception as e:
    why = f'NumPy cannot be imported: {type(e).__name__}: {e}'
if why is None and os.environ['NUMPY_MADVISE_HUGEPAGE'] == '0':
    # NumPy imported earlier read the variable already: turn its huge pages off directly.
    for name in ('numpy._core.multiarray', 'numpy.core.multiarray'):
        try:
            __import__(name, fromlist=['_set_madvise_hugepage'])._set_madvise_hugepage(False)
            break
        except Exception:
            pass
if why is None:
    try:
        import mpi4py
        mpi4py.rc.initialize = False   # Rust initialized MPI: attach to it
        mpi4py.rc.finalize = False     # and leave MPI_Finalize to Rust
        mpi4py.rc.errors = 'default'   # keep MPI_COMM_WORLD's error handler
        from mpi4py import MPI
    except Exception as e:
        why = f'mpi4py cannot be imported: {type(e).__name__}: {e}'
if why is None:
    theirs = MPI.Get_library_version().strip(' \\0\\n').splitlines()[0].strip()
    if not MPI.Is_initialized() or MPI.Is_finalized():
        why = f'mpi4py {mpi4py.__version__} runs on another MPI library ({theirs!r}) than this binary ({library!r})'
    elif theirs != library:
        why = f'mpi4py {mpi4py.__version__} reports the MPI library {theirs!r}, this binary {library!r}'
    elif (MPI.COMM_WORLD.Get_size(), MPI.COMM_WORLD.Get_rank()) != (size, rank):
        why = f'mpi4py sees rank {MPI.COMM_WORLD.Get_rank()} of {MPI.COMM_WORLD.Get_size()}, this binary rank {rank} of {size}'
    else:
        about = f'mpi4py {mpi4py.__version__}, NumPy {np.__version__}'
        comm = MPI.COMM_WORLD

def members(shapes):
    return [np.zeros(s, dtype=np.float32) for s in shapes]

def loop(xs, iters):
    Allreduce, IN_PLACE, SUM = comm.Allreduce, MPI.IN_PLACE, MPI.SUM
    comm.Barrier()
    t = perf_counter()
    for _ in range(iters):
        for a in xs:
            Allreduce(IN_PLACE, a, op=SUM)
    return perf_counter() - t

def concat(xs, iters):
    Allreduce, IN_PLACE, SUM = comm.Allreduce, MPI.IN_PLACE, MPI.SUM
    comm.Barrier()
    t = perf_counter()
    for _ in range(iters):
        flat = np.concatenate([a.ravel() for a in xs])
        Allreduce(IN_PLACE, flat, op=SUM)
        off = 0
        for a in xs:
            np.copyto(a, flat[off:off + a.size].reshape(a.shape))
            off += a.size
    return perf_counter() - t

def fill(xs, rank):
    base = 0
    for a in xs:
        n = a.size
        if rank is None:
            a.fill(0)
        else:
            a.reshape(-1)[:] = np.arange(base, base + n) % period + period * rank
        base += n

def check(xs, ranks):
    base = 0
    for a in xs:
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

    /// NumPy and mpi4py, loaded and attached to this binary's MPI.
    pub struct Mpi4py {
        ns: Py<PyDict>,
        about: String,
    }

    impl Mpi4py {
        /// Imports NumPy and mpi4py and checks that mpi4py runs on this binary's MPI and
        /// world (this rank only, no MPI call); `Err` says why not.
        pub fn load(world: &SimpleCommunicator) -> Result<Self, String> {
            Python::initialize();
            Python::attach(|py| {
                dlpack_mpi::python::check_libpython(py).map_err(|e| e.to_string())?;
                let err = |e: PyErr| format!("the embedded Python: {e}");
                let ns = PyDict::new(py);
                ns.set_item("library", crate::common::library_line())
                    .map_err(err)?;
                ns.set_item("size", world.size()).map_err(err)?;
                ns.set_item("rank", world.rank()).map_err(err)?;
                ns.set_item("period", PERIOD).map_err(err)?;
                py.run(SETUP, Some(&ns), None).map_err(err)?;
                let get = |k: &str| ns.get_item(k).ok().flatten().filter(|v| !v.is_none());
                if let Some(why) = get("why") {
                    return Err(why.to_string());
                }
                let about = get("about").map(|v| v.to_string()).unwrap_or_default();
                Ok(Mpi4py {
                    ns: ns.unbind(),
                    about,
                })
            })
        }

        /// `mpi4py 4.1.2, NumPy 2.4.6`.
        pub fn about(&self) -> &str {
            &self.about
        }

        /// Zero-filled NumPy float32 arrays of `shapes`.
        pub fn members(&self, shapes: &[Vec<i64>]) -> Res<Members> {
            Python::attach(|py| {
                let xs = call(py, &self.ns, "members", (shapes.to_vec(),))?;
                Ok(Members {
                    ns: self.ns.clone_ref(py),
                    xs: Some(xs.unbind()),
                })
            })
        }
    }

    /// `ns[name](*args)`.
    fn call<'py>(
        py: Python<'py>,
        ns: &Py<PyDict>,
        name: &str,
        args: impl pyo3::call::PyCallArgs<'py>,
    ) -> Res<Bound<'py, PyAny>> {
        let fail = |e: PyErr| py_error(format!("{name}() of the mpi4py paths"), e);
        let f = ns
            .bind(py)
            .get_item(name)
            .map_err(fail)?
            .ok_or_else(|| fail(pyo3::exceptions::PyKeyError::new_err(name.to_owned())))?;
        f.call1(args).map_err(fail)
    }

    /// One list's NumPy arrays (freed on drop).
    pub struct Members {
        ns: Py<PyDict>,
        xs: Option<Py<PyAny>>,
    }

    impl Members {
        fn with<T>(&self, f: impl FnOnce(Python<'_>, &Bound<'_, PyAny>) -> Res<T>) -> Res<T> {
            Python::attach(|py| match &self.xs {
                Some(xs) => f(py, xs.bind(py)),
                None => Err(py_error(
                    "the mpi4py paths".into(),
                    pyo3::exceptions::PyRuntimeError::new_err("the arrays were freed"),
                )),
            })
        }

        /// `iters` iterations of `way` after a barrier: seconds on this rank, timed in Python.
        pub fn elapsed(&self, way: Way, iters: u64) -> Res<f64> {
            let name = match way {
                Way::Loop => "loop",
                Way::Concat => "concat",
            };
            self.with(|py, xs| {
                let v = call(py, &self.ns, name, (xs, iters))?;
                v.extract::<f64>()
                    .map_err(|e| py_error(format!("{name}() of the mpi4py paths"), e))
            })
        }

        /// Every element: rank `rank`'s values (`Some`), or zeros.
        pub fn fill(&self, rank: Option<i32>) -> Res<()> {
            self.with(|py, xs| call(py, &self.ns, "fill", (xs, rank)).map(drop))
        }

        /// The first element (index in the list, value) that is not the sum over `ranks`.
        pub fn check(&self, ranks: i32) -> Res<Option<(usize, f32)>> {
            self.with(|py, xs| {
                let v = call(py, &self.ns, "check", (xs, ranks))?;
                v.extract::<Option<(usize, f32)>>()
                    .map_err(|e| py_error("check() of the mpi4py paths".into(), e))
            })
        }
    }

    impl Drop for Members {
        fn drop(&mut self) {
            if let Some(xs) = self.xs.take() {
                Python::attach(|_| drop(xs));
            }
        }
    }
}

#[cfg(not(feature = "python"))]
mod imp {
    use mpi::topology::SimpleCommunicator;

    use super::Way;

    type Res<T> = dlpack_mpi::Result<T>;

    /// Never made: this build has no Python.
    pub struct Mpi4py(std::convert::Infallible);

    impl Mpi4py {
        /// Always `Err`: no feature `python`.
        pub fn load(_world: &SimpleCommunicator) -> Result<Self, String> {
            Err("this build has no Python support (feature `python`)".into())
        }

        pub fn about(&self) -> &str {
            match self.0 {}
        }

        pub fn members(&self, _shapes: &[Vec<i64>]) -> Res<Members> {
            match self.0 {}
        }
    }

    /// Never made.
    pub struct Members(std::convert::Infallible);

    impl Members {
        pub fn elapsed(&self, _way: Way, _iters: u64) -> Res<f64> {
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

pub use imp::{Members, Mpi4py};
