//! `import dlpack_mpi`: the Python extension module (pyo3, built by maturin).
//!
//! [`comm::Comm`] wraps an mpi4py communicator (the same `MPI_Comm`, not a duplicate) and
//! runs the crate's operations on any object with `__dlpack__`: the array is acquired
//! ([`dlpack_mpi::python::acquire`]), MPI runs with the GIL released, and the tensor is
//! released (its producer's deleter, once) when MPI is done with it: at the end of a
//! blocking call, at the completion of a request for the nonblocking ones
//! ([`request::Request`]). Errors are exceptions, one class per [`dlpack_mpi::Error`] kind
//! under `dlpack_mpi.Error` ([`errors`]). The module's text for users is `python/README.md`
//! and the stubs `python/dlpack_mpi.pyi`.
//!
//! The module is built against one MPI library and must run on the one mpi4py loaded:
//! [`import_check`] compares them when the module is imported (an `ImportError` naming
//! both otherwise).

use pyo3::exceptions::PyImportError;
use pyo3::prelude::*;

mod args;
mod comm;
mod errors;
mod request;
mod settings;
mod status;

use dlpack_mpi::mpi_library::MpiLibrary;

/// Runs `f` with the GIL released (`Python::detach`): MPI's waits let the program's other
/// Python threads run. `f` runs on this thread; it touches no Python object (the tensors it
/// uses were acquired before, and a producer's deleter takes the GIL itself).
pub(crate) fn detached<R>(py: Python<'_>, f: impl FnOnce() -> R) -> R {
    /// `detach` asks for `Send` because the closure could run without the GIL; it runs on
    /// the calling thread (pyo3's documentation of `Python::detach`), so nothing it holds
    /// crosses threads.
    struct OnThisThread<T>(T);
    // SAFETY: the value is created, used and dropped on the thread that calls `detached`
    // (detach runs its closure on the calling thread); `Send` is asked only so that no
    // GIL-bound reference is used without the GIL, and the closures of this module hold
    // none (tensors and MPI handles only).
    unsafe impl<T> Send for OnThisThread<T> {}
    let job = OnThisThread(f);
    let OnThisThread(result) = py.detach(move || {
        let job = job;
        OnThisThread((job.0)())
    });
    result
}

/// The first clause of a library version line (`Open MPI v5.0.11, package: …` → `Open MPI
/// v5.0.11`).
fn short(version: &str) -> &str {
    version.split(',').next().unwrap_or(version).trim()
}

/// The MPI library of mpi4py (`MPI.Get_library_version()`'s first line) against this
/// build's: another implementation, or another major or minor version, is an `ImportError`
/// naming both and the file loaded. The same soname of another release (Open MPI 4.1 and 5
/// are both `libmpi.so.40`) is refused unless `DLPACK_MPI_ALLOW_MPI_MISMATCH=1`; two
/// libraries in the process (this module's and mpi4py's) always.
fn import_check(py: Python<'_>) -> PyResult<()> {
    let mpi = py.import("mpi4py.MPI")?;
    let theirs: String = mpi.call_method0("Get_library_version")?.extract()?;
    let theirs = theirs.trim_matches(|c: char| c == '\0' || c.is_whitespace());
    let theirs = theirs.lines().next().unwrap_or("").trim().to_string();
    let ours = MpiLibrary::current();
    let file = ours.file.as_ref().map_or_else(
        || "a file the loader does not name".into(),
        |f| f.display().to_string(),
    );
    let dirs: Vec<_> = ours
        .built_dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect();
    let rebuild = "rebuild it against mpi4py's MPI: `MPICC=<that MPI's mpicc> pip install \
                   --no-build-isolation --force-reinstall ./python` (python/README.md)";
    if ours.loaded != theirs {
        return Err(PyImportError::new_err(format!(
            "dlpack_mpi runs on {} ({file}; built against {}), mpi4py on {}: two MPI \
             libraries in one process; {rebuild}",
            short(&ours.loaded),
            ours.built,
            short(&theirs)
        )));
    }
    let allowed = dlpack_mpi::settings::allow_mpi_mismatch().unwrap_or(false);
    if ours.check().is_err() && !allowed {
        return Err(PyImportError::new_err(format!(
            "dlpack_mpi was built against {} ({}), but mpi4py loaded {} from {file}; {rebuild}, \
             or set DLPACK_MPI_ALLOW_MPI_MISMATCH=1 to run anyway",
            ours.built,
            dirs.join(", "),
            short(&theirs)
        )));
    }
    Ok(())
}

/// Any DLPack array sent, received and reduced over MPI on an mpi4py communicator.
///
/// `dlpack_mpi.Comm(comm)` wraps an mpi4py communicator (`MPI.COMM_WORLD` by default); its
/// methods take any object with `__dlpack__` (NumPy, JAX, Paddle, CuPy, PyTorch), strided
/// views included, and a list of them for the fused collectives. Errors are subclasses of
/// `dlpack_mpi.Error`, one per kind. See `help(dlpack_mpi.Comm)` and python/README.md.
#[pymodule]
#[pyo3(name = "dlpack_mpi")]
fn dlpack_mpi_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    import_check(py)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("ANY_SOURCE", dlpack_mpi::comm::any_source())?;
    m.add("ANY_TAG", dlpack_mpi::comm::any_tag())?;
    m.add_class::<comm::Comm>()?;
    m.add_class::<request::Request>()?;
    m.add_class::<status::Status>()?;
    m.add_class::<errors::Unreceived>()?;
    m.add_function(wrap_pyfunction!(request::waitall, m)?)?;
    m.add_function(wrap_pyfunction!(settings::configure, m)?)?;
    m.add_function(wrap_pyfunction!(settings::settings, m)?)?;
    errors::register(m)?;
    Ok(())
}
