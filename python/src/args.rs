//! Arguments from Python: arrays acquired through `__dlpack__`, lists of them, reductions
//! and block lists.

use dlpack_mpi::device::device_type;
use dlpack_mpi::dlpack::{AcquireOptions, ManagedTensor, Tensor};
use dlpack_mpi::dtype::ReduceOp;
use dlpack_mpi::Error;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple};

use crate::errors::to_py;

/// A tensor acquired from a Python array (the array API's `__dlpack__` protocol,
/// [`dlpack_mpi::python::acquire`]); released (its deleter called once) when dropped.
pub(crate) type Array = ManagedTensor<'static>;

/// Acquires `obj` (any object with `__dlpack__`).
pub(crate) fn acquire(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<Array> {
    dlpack_mpi::python::acquire(obj, &AcquireOptions::default()).map_err(|e| to_py(py, e))
}

/// Acquires `obj` unless it is `None`.
pub(crate) fn acquire_optional(
    py: Python<'_>,
    obj: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<Array>> {
    obj.filter(|o| !o.is_none())
        .map(|o| acquire(py, o))
        .transpose()
}

/// Whether `obj` is a list or tuple: the fused (list) form of an operation.
pub(crate) fn is_list(obj: &Bound<'_, PyAny>) -> bool {
    obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>()
}

/// Acquires every member of a list or tuple, in order; a member that cannot be acquired is
/// `Member` naming its index (the members acquired before it are released).
pub(crate) fn acquire_list(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<Vec<Array>> {
    let mut out = Vec::new();
    for (index, member) in obj.try_iter()?.enumerate() {
        let member = member?;
        match dlpack_mpi::python::acquire(&member, &AcquireOptions::default()) {
            Ok(t) => out.push(t),
            Err(e) => {
                let e = Error::Member {
                    index,
                    source: Box::new(e),
                };
                return Err(to_py(py, e));
            }
        }
    }
    Ok(out)
}

/// One array, or a list of them (the fused forms).
pub(crate) enum Operand {
    One(Array),
    List(Vec<Array>),
}

impl Operand {
    /// Its arrays.
    pub(crate) fn arrays(&self) -> &[Array] {
        match self {
            Operand::One(t) => std::slice::from_ref(t),
            Operand::List(l) => l,
        }
    }
}

/// `obj` acquired: a list or tuple as a list, anything else as one array.
pub(crate) fn operand(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<Operand> {
    if is_list(obj) {
        acquire_list(py, obj).map(Operand::List)
    } else {
        acquire(py, obj).map(Operand::One)
    }
}

/// `TypeError` for a list beside a single array.
pub(crate) fn list_and_array(names: &str) -> PyErr {
    PyTypeError::new_err(format!(
        "{names}: both lists (the fused form) or both single arrays, not one of each"
    ))
}

/// The tensor's element count.
pub(crate) fn elements(tensor: &dyn Tensor) -> i64 {
    tensor.num_elements()
}

/// Whether every tensor is in host memory that plain MPI reads (`kDLCPU`): the others go
/// through the device transport (`DeviceComm`: CUDA memory direct or staged, pinned and
/// managed memory).
pub(crate) fn on_cpu<'t>(tensors: impl IntoIterator<Item = &'t Array>) -> bool {
    tensors
        .into_iter()
        .all(|t| t.device().device_type == device_type::CPU)
}

/// A send and a receive array.
pub(crate) fn pair(
    py: Python<'_>,
    send: &Bound<'_, PyAny>,
    recv: &Bound<'_, PyAny>,
) -> PyResult<(Array, Array)> {
    Ok((acquire(py, send)?, acquire(py, recv)?))
}

/// The reduction and operands of a reduction with a send and an optional receive operand:
/// both single arrays or both lists (`op` `None` is the sum).
pub(crate) fn reduce_operands(
    py: Python<'_>,
    send: &Bound<'_, PyAny>,
    recv: Option<&Bound<'_, PyAny>>,
    op: Option<&Bound<'_, PyAny>>,
) -> PyResult<(ReduceOp, Operand, Option<Operand>)> {
    let op = reduce_op(py, op)?;
    let recv = recv.filter(|r| !r.is_none());
    if let Some(r) = recv {
        if is_list(send) != is_list(r) {
            return Err(list_and_array("sendbuf and recvbuf"));
        }
    }
    let send = operand(py, send)?;
    let recv = recv.map(|r| operand(py, r)).transpose()?;
    Ok((op, send, recv))
}

/// A reduction: a name (`"sum"`, `"prod"`, `"min"`, `"max"`, `"land"`, `"lor"`, `"lxor"`,
/// `"band"`, `"bor"`, `"bxor"`, any case) or mpi4py's predefined `MPI.Op` of that name
/// (`MPI.SUM`, …); `None` is the sum.
pub(crate) fn reduce_op(py: Python<'_>, op: Option<&Bound<'_, PyAny>>) -> PyResult<ReduceOp> {
    let Some(op) = op.filter(|o| !o.is_none()) else {
        return Ok(ReduceOp::Sum);
    };
    let names = || {
        ReduceOp::ALL
            .iter()
            .map(|o| o.name())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Ok(name) = op.cast::<PyString>() {
        let name = name.to_str()?.to_ascii_lowercase();
        let name = if name == "product" {
            "prod".into()
        } else {
            name
        };
        return ReduceOp::ALL
            .into_iter()
            .find(|o| o.name() == name)
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "op = {name:?} is not a reduction of MPI's: one of {}",
                    names()
                ))
            });
    }
    let mpi = py.import("mpi4py.MPI")?;
    for candidate in ReduceOp::ALL {
        let theirs = mpi.getattr(candidate.name().to_ascii_uppercase().as_str())?;
        if op.eq(theirs)? {
            return Ok(candidate);
        }
    }
    Err(PyTypeError::new_err(format!(
        "op = {} is not a predefined reduction: a name ({}) or mpi4py's MPI.SUM, MPI.PROD, …",
        op.repr()?,
        names()
    )))
}

/// A block list (`counts` or `displs`): elements per rank, one entry per rank.
pub(crate) fn blocks(name: &str, obj: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    obj.extract::<Vec<i64>>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{name} must be a sequence of ints (elements per rank), not {}",
            obj.get_type()
                .name()
                .map_or_else(|_| "?".into(), |n| n.to_string())
        ))
    })
}

/// Displacements of blocks laid end to end: `counts`' running sums, starting at 0.
pub(crate) fn packed_displs(counts: &[i64]) -> Vec<i64> {
    counts
        .iter()
        .scan(0i64, |at, &c| {
            let here = *at;
            *at = at.saturating_add(c);
            Some(here)
        })
        .collect()
}
