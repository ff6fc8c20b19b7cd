//! `dlpack_mpi.configure(...)` and `dlpack_mpi.settings()`: the library's process-wide
//! settings ([`dlpack_mpi::settings`]) as keyword arguments. Each also has an environment
//! variable (`DLPACK_MPI_AGREEMENT`, `DLPACK_MPI_PACKING`, …), read when `configure` did not
//! set it.

use dlpack_mpi::settings::{self as lib, Agreement, HalfOps, Packing};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::to_py;

const AGREEMENTS: [(&str, Agreement); 2] = [
    ("collective", Agreement::Collective),
    ("local", Agreement::Local),
];

const PACKINGS: [(&str, Packing); 3] = [
    ("auto", Packing::Auto),
    ("copy", Packing::Copy),
    ("derived", Packing::DerivedDatatype),
];

const HALF_OPS: [(&str, HalfOps); 3] = [
    ("auto", HalfOps::Auto),
    ("library", HalfOps::Library),
    ("mpi", HalfOps::Mpi),
];

/// The value of `table` named `name` (any case), or a `ValueError` naming the keyword, the
/// value and the choices.
fn choose<T: Copy>(keyword: &str, table: &[(&str, T)], name: &str) -> PyResult<T> {
    let lower = name.to_ascii_lowercase();
    table
        .iter()
        .find(|(n, _)| *n == lower)
        .map(|(_, v)| *v)
        .ok_or_else(|| {
            let choices: Vec<_> = table.iter().map(|(n, _)| *n).collect();
            PyValueError::new_err(format!(
                "{keyword} = {name:?}: expected one of {}",
                choices.join(", ")
            ))
        })
}

/// The name of `value` in `table`.
fn name_of<T: PartialEq>(table: &[(&'static str, T)], value: &T) -> &'static str {
    table
        .iter()
        .find(|(_, v)| v == value)
        .map_or("?", |(n, _)| *n)
}

/// Sets the process-wide settings given (the others stay). Every rank of a communicator
/// must use the same `agreement` and `half_ops`.
///
/// - `agreement`: `"collective"` (the default: every collective first checks, with one
///   small all-reduce, that every rank made the same call, and raises on every rank
///   otherwise) or `"local"` (no check: for ranks that are plain mpi4py or C programs, which
///   take no part in it; a mistake then hangs or fails on one rank only).
/// - `packing`: how strided arrays travel: `"auto"` (a packed copy or an MPI derived
///   datatype, whichever is faster for the layout), `"copy"`, `"derived"`.
/// - `pack_threshold_bytes`: under `"auto"`, contiguous runs shorter than this are packed.
/// - `half_ops`: float16/bfloat16 reductions: `"auto"`, `"library"` (dlpack-mpi's,
///   correctly rounded), `"mpi"` (the MPI library's own datatypes, MPICH ≥ 5).
/// - `bucket_bytes`, `first_bucket_bytes`: bucket sizes of the fused list forms, in bytes.
#[pyfunction]
#[pyo3(signature = (*, agreement = None, packing = None, pack_threshold_bytes = None, half_ops = None, bucket_bytes = None, first_bucket_bytes = None))]
pub(crate) fn configure(
    agreement: Option<&str>,
    packing: Option<&str>,
    pack_threshold_bytes: Option<usize>,
    half_ops: Option<&str>,
    bucket_bytes: Option<usize>,
    first_bucket_bytes: Option<usize>,
) -> PyResult<()> {
    // Every value is read before any is set: a bad one changes nothing.
    let agreement = agreement
        .map(|a| choose("agreement", &AGREEMENTS, a))
        .transpose()?;
    let packing = packing
        .map(|p| choose("packing", &PACKINGS, p))
        .transpose()?;
    let half_ops = half_ops
        .map(|h| choose("half_ops", &HALF_OPS, h))
        .transpose()?;
    for (keyword, bytes) in [
        ("bucket_bytes", bucket_bytes),
        ("first_bucket_bytes", first_bucket_bytes),
    ] {
        if bytes == Some(0) {
            return Err(PyValueError::new_err(format!(
                "{keyword} = 0: a bucket holds at least one byte"
            )));
        }
    }
    if let Some(a) = agreement {
        lib::set_agreement(a);
    }
    if let Some(p) = packing {
        lib::set_packing(p);
    }
    if let Some(h) = half_ops {
        lib::set_half_ops(h);
    }
    if let Some(b) = pack_threshold_bytes {
        lib::set_pack_threshold_bytes(b);
    }
    if let Some(b) = bucket_bytes {
        lib::set_bucket_bytes(b);
    }
    if let Some(b) = first_bucket_bytes {
        lib::set_first_bucket_bytes(b);
    }
    Ok(())
}

/// The process-wide settings now, as a dict of `configure`'s keywords (from `configure`,
/// else the environment, else the defaults). Raises `InvalidSetting` for an environment
/// variable with a value the library does not read.
#[pyfunction]
pub(crate) fn settings(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let e = |e| to_py(py, e);
    let d = PyDict::new(py);
    d.set_item(
        "agreement",
        name_of(&AGREEMENTS, &lib::agreement().map_err(e)?),
    )?;
    d.set_item("packing", name_of(&PACKINGS, &lib::packing().map_err(e)?))?;
    d.set_item(
        "pack_threshold_bytes",
        lib::pack_threshold_bytes().map_err(e)?,
    )?;
    d.set_item("half_ops", name_of(&HALF_OPS, &lib::half_ops().map_err(e)?))?;
    d.set_item("bucket_bytes", lib::bucket_bytes().map_err(e)?)?;
    d.set_item("first_bucket_bytes", lib::first_bucket_bytes().map_err(e)?)?;
    Ok(d)
}
