//! Which producer makes a case's tensors (`--producer`, [`producer_for`]) and the JAX and
//! Paddle tensors themselves ([`foreign`]).
//!
//! `auto` takes each dtype from the first installed producer that makes it, in the order
//! NumPy, JAX, Paddle, and Rust's `Owned` for the rest. JAX arrays are immutable (the
//! library refuses them as receive buffers, `Error::Immutable`), so a JAX case's receive
//! buffers come from the first of NumPy and Paddle that makes the dtype, else Rust.

use std::sync::OnceLock;

use dlpack_mpi::dtype::{code, DType};

use super::args::Producer;
use super::matrix::Layout;
use super::placement::{Form, Offset};
use crate::launch::Dev;

/// The installed Python producers (bit `i` = `Producer::PYTHON[i]`), as rank 0 found them.
static INSTALLED: OnceLock<i32> = OnceLock::new();

/// The run's producer (resolved), as rank 0 chose it.
static RUN: OnceLock<Producer> = OnceLock::new();

/// Records the run's producer and the installed ones (once per run, after rank 0's
/// broadcast).
pub(super) fn set_installed(run: Producer, mask: i32) {
    let _ = RUN.set(run);
    let _ = INSTALLED.set(mask);
    if mask != 0 {
        // Every rank starts the interpreter and imports the producers (JAX's 64-bit mode
        // on), as rank 0 did when it probed them; what rank 0 found is what counts.
        let _ = probe(Producer::Rust);
    }
}

/// The run's producer (resolved: `Auto` when a Python producer is installed), as rank 0
/// chose it.
pub(super) fn run_producer() -> Producer {
    RUN.get().copied().unwrap_or(Producer::Rust)
}

/// Who makes the send tensors of a `cpu` case of `dtype` in this run.
pub(super) fn send_producer(dtype: DType) -> Producer {
    producer_for(run_producer(), dtype, false)
}

fn installed(p: Producer) -> bool {
    let mask = INSTALLED.get().copied().unwrap_or(0);
    Producer::PYTHON
        .iter()
        .position(|(q, _)| *q == p)
        .is_some_and(|i| mask & (1 << i) != 0)
}

/// Whether `p` makes (and exports through DLPack) tensors of `dtype`.
pub(super) fn makes(p: Producer, dtype: DType) -> bool {
    if dtype.lanes != 1 {
        return matches!(p, Producer::Rust);
    }
    let numpy = dlpack_mpi_numpy_dtype(dtype);
    match p {
        Producer::Rust | Producer::Auto => true,
        Producer::Numpy => numpy,
        // NumPy's dtypes, bfloat16 and the eight float8 formats (codes 7-14).
        Producer::Jax => {
            numpy
                || (dtype.code, dtype.bits) == (code::BFLOAT, 16)
                || matches!((dtype.code, dtype.bits), (7..=14, 8))
        }
        // Paddle has no uint16/32/64 (its "uint16" is bfloat16) and two float8 formats.
        Producer::Paddle => {
            (numpy && !matches!((dtype.code, dtype.bits), (code::UINT, 16 | 32 | 64)))
                || (dtype.code, dtype.bits) == (code::BFLOAT, 16)
                || matches!((dtype.code, dtype.bits), (10 | 12, 8))
        }
    }
}

#[cfg(feature = "python")]
fn dlpack_mpi_numpy_dtype(dtype: DType) -> bool {
    dlpack_mpi::python::numpy_dtype_name(dtype).is_some()
}

#[cfg(not(feature = "python"))]
fn dlpack_mpi_numpy_dtype(_: DType) -> bool {
    false
}

/// Who makes a `cpu` case's send (`recv == false`) or receive tensors of `dtype` in a run
/// whose producer is `run` (resolved: `Auto` means per dtype). A pinned producer that lacks
/// the dtype is returned all the same (its store skips the case, naming it).
pub(super) fn producer_for(run: Producer, dtype: DType, recv: bool) -> Producer {
    let writable = |p: Producer| !(recv && p == Producer::Jax);
    match run {
        Producer::Auto => {}
        Producer::Jax if recv => {}
        pinned => return pinned,
    }
    Producer::PYTHON
        .iter()
        .map(|(p, _)| *p)
        .filter(|&p| installed(p) && writable(p) && (run == Producer::Auto || p != Producer::Jax))
        .find(|&p| makes(p, dtype))
        .unwrap_or(Producer::Rust)
}

/// Who makes a case's send (`recv == false`) or receive tensor of `dtype` on `dev` in
/// `layout` at `offset` in a run whose producer is `run`: [`producer_for`]'s on `cpu`,
/// except where that producer cannot make the tensor and Rust (`Owned`) makes it: every
/// other memory; a negative-stride view, which Paddle lacks, unless Paddle is pinned (its
/// store then skips the case); at an offset, every producer but NumPy, which makes the
/// shifted-pointer form only (its `__dlpack__` exports `byte_offset` 0, `data` at the
/// first element: JAX and Paddle make no misaligned arrays).
pub(super) fn maker(
    run: Producer,
    dtype: DType,
    (recv, dev): (bool, Dev),
    layout: Layout,
    offset: Offset,
) -> Producer {
    if dev != Dev::Cpu {
        return Producer::Rust;
    }
    match producer_for(run, dtype, recv) {
        Producer::Paddle if run != Producer::Paddle && layout == Layout::Negative => Producer::Rust,
        Producer::Numpy if offset.is_some() && offset.form == Form::ByteOffset => Producer::Rust,
        Producer::Jax | Producer::Paddle if offset.is_some() => Producer::Rust,
        p => p,
    }
}

/// The installed producers' mask and, when `requested` is pinned to a Python producer that
/// does not import, why not.
#[cfg(feature = "python")]
pub(super) fn probe(requested: Producer) -> Result<i32, String> {
    use pyo3::types::PyAnyMethods;
    pyo3::Python::initialize();
    pyo3::Python::attach(|py| {
        // Quiet imports: check's JAX arrays live on the CPU (no accelerator probing and its
        // log lines), and import-time warnings (Paddle's "No ccache found") stay unprinted.
        let _ = py.run(
            c"import os, warnings\nos.environ.setdefault('JAX_PLATFORMS', 'cpu')\nwarnings.filterwarnings('ignore', module='paddle')",
            None,
            None,
        );
        let mut mask = 0;
        for (i, (p, module)) in Producer::PYTHON.iter().enumerate() {
            match py.import(*module) {
                Ok(m) => {
                    if *p == Producer::Jax {
                        // float64/int64/complex128 arrays, as the dtype table has them.
                        let _ = m
                            .getattr("config")
                            .and_then(|c| c.call_method1("update", ("jax_enable_x64", true)));
                    }
                    mask |= 1 << i;
                }
                Err(err) if *p == requested => {
                    return Err(format!("producer `{}`: import {module}: {err}", p.name()));
                }
                Err(_) => {}
            }
        }
        Ok(mask)
    })
}

#[cfg(not(feature = "python"))]
pub(super) fn probe(requested: Producer) -> Result<i32, String> {
    match requested {
        Producer::Auto | Producer::Rust => Ok(0),
        p => Err(format!(
            "producer `{}` needs Python support, which this build does not have \
             (feature `python`)",
            p.name()
        )),
    }
}

/// JAX and Paddle tensors of a case: `(base, view)`, both Python objects; `base` is the
/// storage (1-d), `view` what is exported.
#[cfg(feature = "python")]
pub(super) mod foreign {
    use dlpack_mpi::dtype::DType;
    use pyo3::prelude::*;
    use pyo3::types::{PyBytes, PyDict};

    use super::super::args::Producer;
    use super::super::context::SKIP_MARK;

    const MAKE: &std::ffi::CStr = c"
import numpy as np
if producer == 'jax':
    import jax.numpy as jnp
    import ml_dtypes
    ml = name == 'bfloat16' or name.startswith('float8')
    npdt = getattr(ml_dtypes, name) if ml else name
    # as_strided cannot take some ml_dtypes (float8_e5m2): stride the bits, then view.
    flat = np.frombuffer(data, dtype=np.uint8).view(f'u{esize}' if ml else npdt)
    view = np.lib.stride_tricks.as_strided(flat[first:], shape, [s * esize for s in strides])
    base = jnp.asarray(flat.view(npdt))
    view = jnp.asarray(np.ascontiguousarray(view).view(npdt))
else:
    import paddle
    base = paddle.to_tensor(np.frombuffer(data, dtype=np.uint8).copy())
    base = base.view(name) if esize > 1 or name != 'uint8' else base
    view = paddle.as_strided(base, shape, strides, first * esize)
";

    /// Makes the `producer`'s tensor of `storage_bytes` (native order) as `dtype`, viewed
    /// with `shape`, `strides` (elements) from storage element `first`.
    pub(in super::super) fn make(
        producer: Producer,
        dtype: DType,
        storage_bytes: &[u8],
        shape: &[i64],
        strides: &[i64],
        first: usize,
    ) -> Result<(Py<PyAny>, Py<PyAny>), String> {
        let pname = producer.name();
        if !super::makes(producer, dtype) {
            return Err(format!("{SKIP_MARK}{pname} has no dtype {dtype}"));
        }
        if producer == Producer::Paddle && strides.iter().any(|&s| s < 0) {
            return Err(format!("{SKIP_MARK}Paddle has no negative-stride views"));
        }
        let esize = dtype.size_bytes().unwrap_or(0);
        // complex64 cannot be viewed from bytes in Paddle when the byte count is not a
        // multiple of 8; pad the storage (the view never reaches the padding).
        let mut data = storage_bytes.to_vec();
        data.resize(data.len().div_ceil(16).max(1) * 16, 0);
        Python::attach(|py| {
            let err = |e: PyErr| format!("{pname}: {e}");
            let locals = PyDict::new(py);
            locals.set_item("producer", pname).map_err(err)?;
            locals.set_item("name", dtype.to_string()).map_err(err)?;
            locals
                .set_item("data", PyBytes::new(py, &data))
                .map_err(err)?;
            locals.set_item("shape", shape.to_vec()).map_err(err)?;
            locals.set_item("strides", strides.to_vec()).map_err(err)?;
            locals.set_item("first", first).map_err(err)?;
            locals.set_item("esize", esize).map_err(err)?;
            py.run(MAKE, Some(&locals), None).map_err(err)?;
            let get = |k: &str| -> Result<Py<PyAny>, String> {
                Ok(locals
                    .get_item(k)
                    .map_err(err)?
                    .ok_or_else(|| format!("{pname}: no {k}"))?
                    .unbind())
            };
            Ok((get("base")?, get("view")?))
        })
    }

    /// The storage bytes of a Paddle `base` (its `numpy()`, bfloat16/float8 as bits).
    pub(in super::super) fn bytes(base: &Py<PyAny>) -> Result<Vec<u8>, String> {
        Python::attach(|py| {
            base.bind(py)
                .call_method0("numpy")
                .and_then(|a| a.call_method0("tobytes"))
                .and_then(|b| b.extract::<Vec<u8>>())
                .map_err(|e| format!("reading a Paddle tensor: {e}"))
        })
    }
}
