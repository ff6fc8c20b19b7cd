//! The exceptions: `dlpack_mpi.Error` (a subclass of `Exception`) and one subclass of it per
//! kind of [`dlpack_mpi::Error`] ([`Error::KINDS`]: `CollectiveMismatch`, `PeerRefused`,
//! `Unfit`, `ReadOnly`, `UnsupportedDtype`, …), each raised with the Rust error's text. An
//! `Unfit` carries the message it matched and did not receive as its `message` attribute
//! ([`Unreceived`]).

use std::collections::HashMap;
use std::ffi::CString;

use dlpack_mpi::dlpack::{AcquireOptions, Tensor};
use dlpack_mpi::error::Unreceived as HeldMessage;
use dlpack_mpi::Error;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

use crate::detached;
use crate::status::Status;

/// The base class and the class of each kind, made once per interpreter.
struct Classes {
    base: Py<PyType>,
    kinds: HashMap<&'static str, Py<PyType>>,
}

static CLASSES: PyOnceLock<Classes> = PyOnceLock::new();

fn classes(py: Python<'_>) -> PyResult<&Classes> {
    CLASSES.get_or_try_init(py, || {
        let base = PyErr::new_type(
            py,
            c"dlpack_mpi.Error",
            Some(c"Base class of dlpack_mpi's exceptions: one subclass per kind of error, with the Rust library's text."),
            Some(&py.get_type::<PyException>()),
            None,
        )?;
        let mut kinds = HashMap::new();
        for &kind in Error::KINDS {
            let name = CString::new(format!("dlpack_mpi.{kind}"))?;
            let doc = CString::new(format!(
                "dlpack_mpi's error kind {kind} (dlpack_mpi::Error::{kind} in the Rust \
                 library, whose documentation says when it is raised)."
            ))?;
            let class = PyErr::new_type(py, &name, Some(&doc), Some(base.bind(py)), None)?;
            kinds.insert(kind, class);
        }
        Ok(Classes { base, kinds })
    })
}

/// Adds `Error` and every kind's class to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let classes = classes(py)?;
    m.add("Error", classes.base.bind(py))?;
    for (kind, class) in &classes.kinds {
        m.add(*kind, class.bind(py))?;
    }
    Ok(())
}

/// `err` as the exception of its kind, with its text; an `Unfit`'s held message is its
/// `message` attribute.
pub(crate) fn to_py(py: Python<'_>, err: Error) -> PyErr {
    let classes = match classes(py) {
        Ok(c) => c,
        Err(e) => return e,
    };
    let class = classes.kinds.get(err.kind()).unwrap_or(&classes.base);
    // The Rust text names the Rust method that receives a held message.
    let text = err
        .to_string()
        .replace("Unreceived::recv_into", "e.message.recv_into(array)");
    let exception = PyErr::from_type(class.bind(py).clone(), (text,));
    if let Some(held) = err.unreceived() {
        let message = Unreceived { held: held.clone() };
        let set = Py::new(py, message).and_then(|m| exception.value(py).setattr("message", m));
        if let Err(e) = set {
            return e;
        }
    }
    exception
}

/// A message a receive matched but did not receive because it does not fit: the `message`
/// of an `Unfit` exception. No other receive can take it; receive it with `recv_into` into
/// an array of `nbytes` bytes, or `discard()` it (dropping the last reference discards it).
#[pyclass(module = "dlpack_mpi", frozen)]
pub(crate) struct Unreceived {
    held: HeldMessage,
}

#[pymethods]
impl Unreceived {
    /// The message's size in bytes.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.held.len_bytes()
    }

    /// The rank that sent it (in the receiving communicator).
    #[getter]
    fn source(&self) -> i32 {
        self.held.source_rank()
    }

    /// Its tag.
    #[getter]
    fn tag(&self) -> i32 {
        self.held.tag()
    }

    /// Whether it is still held (not received nor discarded).
    #[getter]
    fn held(&self) -> bool {
        self.held.is_held()
    }

    /// Receives the message into `buf` (any writable array with `__dlpack__` of exactly
    /// `nbytes` bytes); returns its `Status`. Raises `Unfit` again (the message still held)
    /// when `buf` does not fit, `AlreadyReceived` when it was received or discarded.
    fn recv_into(&self, py: Python<'_>, buf: &Bound<'_, PyAny>) -> PyResult<Status> {
        let mut tensor = dlpack_mpi::python::acquire(buf, &AcquireOptions::default())
            .map_err(|e| to_py(py, e))?;
        let count = tensor.num_elements();
        let status = detached(py, || self.held.recv_into(&mut tensor));
        let status = status.map_err(|e| to_py(py, e))?;
        drop(tensor);
        Ok(Status::of(&status, count))
    }

    /// Receives the message and drops its bytes.
    fn discard(&self) {
        self.held.discard();
    }

    fn __repr__(&self) -> String {
        format!(
            "<dlpack_mpi.Unreceived {} bytes from rank {} tag {}{}>",
            self.held.len_bytes(),
            self.held.source_rank(),
            self.held.tag(),
            if self.held.is_held() {
                ""
            } else {
                ", received"
            }
        )
    }
}
