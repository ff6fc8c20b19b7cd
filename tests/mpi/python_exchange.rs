//! DLPack's C exchange API (`__dlpack_c_exchange_api__`, dlpack.h v1.3) on the consumer side
//! (feature `python`): tables made here in Rust, well-formed and hostile (wrong capsule
//! name, not a capsule, NULL function pointers, versions 0.9 / 1.2 / 2.0, a `prev_api`
//! chain, a cycle), functions that fail, return NULL or hand back bad tensors, and device
//! tensors whose producer stream is queried; then real PaddlePaddle tensors (every dtype it
//! exports, views) through the table against the capsule path, when Paddle is installed.
//!
//! The suite `python_exchange` of tests/mpi (main.rs, feature `python`); `cargo test
//! --features python --test mpi -- --suite python_exchange` runs it at 1 rank (every case is
//! local to a rank).

use std::ffi::{c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::common::{Counter, RawTensor};
use crate::harness;
use dlpack_mpi::dlpack::{
    AcquireOptions, DLManagedTensorVersioned, DLPackVersion, StreamPolicy, Tensor,
};
use dlpack_mpi::python::exchange::{
    DLPackExchangeApi, DLPackExchangeApiHeader, ManagedTensorFromPyObjectNoSync,
};
use dlpack_mpi::python::{self, pyo3};
use dlpack_mpi::settings::ExchangeApi;
use dlpack_mpi::Error;
use mpi::topology::SimpleCommunicator;
use pyo3::prelude::*;
use pyo3::types::PyDict;

type Outcome = Result<(), String>;

// ---- the fake producer: functions a table can point to ----

/// Calls of any fake `managed_tensor_from_py_object_no_sync`.
static FROM_CALLS: AtomicUsize = AtomicUsize::new(0);
/// `(device_type, device_id)` of every `current_work_stream` call.
static STREAM_QUERIES: Mutex<Vec<(c_int, i32)>> = Mutex::new(Vec::new());
/// The deleter counters of the tensors the fake functions handed out.
static MADE: Mutex<Vec<Counter>> = Mutex::new(Vec::new());

fn hand_out(raw: RawTensor, out: *mut *mut DLManagedTensorVersioned) {
    let (p, counter) = raw.versioned();
    MADE.lock().unwrap().push(counter);
    // SAFETY: `out` is the consumer's valid out-parameter.
    unsafe { *out = p };
}

fn values() -> RawTensor {
    RawTensor::new(&[1.0f64, 2.0, 3.0], (2, 64, 1))
}

unsafe extern "C" fn from_good(
    _obj: *mut c_void,
    out: *mut *mut DLManagedTensorVersioned,
) -> c_int {
    FROM_CALLS.fetch_add(1, Ordering::SeqCst);
    hand_out(values(), out);
    0
}

unsafe extern "C" fn from_raises(_: *mut c_void, _: *mut *mut DLManagedTensorVersioned) -> c_int {
    FROM_CALLS.fetch_add(1, Ordering::SeqCst);
    Python::attach(|py| {
        pyo3::exceptions::PyBufferError::new_err("cannot describe this tensor").restore(py)
    });
    -1
}

unsafe extern "C" fn from_fails_silently(
    _: *mut c_void,
    _: *mut *mut DLManagedTensorVersioned,
) -> c_int {
    FROM_CALLS.fetch_add(1, Ordering::SeqCst);
    -1
}

unsafe extern "C" fn from_null_ok(_: *mut c_void, _: *mut *mut DLManagedTensorVersioned) -> c_int {
    FROM_CALLS.fetch_add(1, Ordering::SeqCst);
    0
}

unsafe extern "C" fn from_ok_and_raises(
    _: *mut c_void,
    out: *mut *mut DLManagedTensorVersioned,
) -> c_int {
    FROM_CALLS.fetch_add(1, Ordering::SeqCst);
    hand_out(values(), out);
    Python::attach(|py| pyo3::exceptions::PyRuntimeError::new_err("left set").restore(py));
    0
}

unsafe extern "C" fn from_version_2(
    _: *mut c_void,
    out: *mut *mut DLManagedTensorVersioned,
) -> c_int {
    FROM_CALLS.fetch_add(1, Ordering::SeqCst);
    let mut raw = values();
    raw.version = (2, 0);
    hand_out(raw, out);
    0
}

unsafe extern "C" fn from_bad_ndim(
    _: *mut c_void,
    out: *mut *mut DLManagedTensorVersioned,
) -> c_int {
    FROM_CALLS.fetch_add(1, Ordering::SeqCst);
    let mut raw = values();
    raw.ndim = Some(-1);
    hand_out(raw, out);
    0
}

unsafe extern "C" fn from_cuda(_: *mut c_void, out: *mut *mut DLManagedTensorVersioned) -> c_int {
    FROM_CALLS.fetch_add(1, Ordering::SeqCst);
    let mut raw = values();
    raw.device = (2, 0);
    hand_out(raw, out);
    0
}

unsafe extern "C" fn stream_null(t: c_int, id: i32, out: *mut *mut c_void) -> c_int {
    STREAM_QUERIES.lock().unwrap().push((t, id));
    // SAFETY: the consumer's valid out-parameter.
    unsafe { *out = std::ptr::null_mut() };
    0
}

unsafe extern "C" fn stream_raises(t: c_int, id: i32, _: *mut *mut c_void) -> c_int {
    STREAM_QUERIES.lock().unwrap().push((t, id));
    Python::attach(|py| pyo3::exceptions::PyRuntimeError::new_err("no stream").restore(py));
    -1
}

unsafe extern "C" fn allocator(
    _: *mut dlpack_mpi::dlpack::DLTensor,
    _: *mut *mut DLManagedTensorVersioned,
    _: *mut c_void,
    _: Option<unsafe extern "C" fn(*mut c_void, *const std::ffi::c_char, *const std::ffi::c_char)>,
) -> c_int {
    -1
}

unsafe extern "C" fn to_py_object(_: *mut DLManagedTensorVersioned, _: *mut *mut c_void) -> c_int {
    -1
}

/// A well-formed 1.3 table around `from` (leaked: a table lives for the process).
fn table(from: ManagedTensorFromPyObjectNoSync) -> DLPackExchangeApi {
    DLPackExchangeApi {
        header: DLPackExchangeApiHeader {
            version: DLPackVersion { major: 1, minor: 3 },
            prev_api: std::ptr::null_mut(),
        },
        managed_tensor_allocator: Some(allocator),
        managed_tensor_from_py_object_no_sync: Some(from),
        managed_tensor_to_py_object_no_sync: Some(to_py_object),
        dltensor_from_py_object_no_sync: None,
        current_work_stream: Some(stream_null),
    }
}

fn leak(t: DLPackExchangeApi) -> *mut DLPackExchangeApi {
    Box::into_raw(Box::new(t))
}

/// A capsule named `name` holding `ptr`, bound to `tbl` in the globals.
fn capsule(c: &Ctx, ptr: *mut DLPackExchangeApi, name: &'static CStr) -> Outcome {
    // SAFETY: the GIL is held; `ptr` is non-NULL and leaked (lives for the process); the
    // name is 'static; no destructor.
    let cap = unsafe { pyo3::ffi::PyCapsule_New(ptr.cast(), name.as_ptr(), None) };
    // SAFETY: a new reference or NULL with an exception.
    let cap = unsafe { Bound::from_owned_ptr_or_err(c.py, cap) }.map_err(|e| e.to_string())?;
    c.g.set_item("tbl", cap).map_err(|e| e.to_string())
}

/// A fresh producer type whose `__dlpack_c_exchange_api__` is `attr` (Python), with a
/// NumPy-backed `__dlpack__` holding `[10., 11., 12.]` for the fallback.
fn producer<'py>(c: &Ctx<'py>, attr: &str) -> Result<Bound<'py, PyAny>, String> {
    c.exec(&format!(
        "obj = type('Fake', (Base,), {{'__dlpack_c_exchange_api__': {attr}}})()"
    ))?;
    c.ev("obj")
}

const BASE: &str = r#"
import numpy as np
class Base:
    def __init__(self):
        self.array = np.arange(3.0) + 10
    def __dlpack_device__(self):
        return (1, 0)
    def __dlpack__(self, **kw):
        return self.array.__dlpack__(**kw)
"#;

struct Ctx<'py> {
    py: Python<'py>,
    g: Bound<'py, PyDict>,
}

impl<'py> Ctx<'py> {
    fn ev(&self, expr: &str) -> Result<Bound<'py, PyAny>, String> {
        let code = CString::new(expr).map_err(|e| e.to_string())?;
        self.py
            .eval(&code, Some(&self.g), None)
            .map_err(|e| format!("{expr}: {e}"))
    }

    fn exec(&self, code: &str) -> Outcome {
        let c = CString::new(code).map_err(|e| e.to_string())?;
        self.py
            .run(&c, Some(&self.g), None)
            .map_err(|e| format!("{code}: {e}"))
    }
}

fn opts() -> AcquireOptions {
    AcquireOptions::default()
}

fn values_of(t: &impl Tensor) -> Result<Vec<f64>, String> {
    t.as_slice::<f64>()
        .map(<[f64]>::to_vec)
        .map_err(|e| e.to_string())
}

/// Every deleter ran exactly once; returns how many tensors were made and forgets them.
fn deleted_once() -> Result<usize, String> {
    let made = std::mem::take(&mut *MADE.lock().unwrap());
    for (i, c) in made.iter().enumerate() {
        ensure!(
            c.get() == 1,
            "tensor {i} of {}: deleter ran {} times",
            made.len(),
            c.get()
        );
    }
    Ok(made.len())
}

// ---- cases ----

fn well_formed_table_is_used_and_released_once(_: &SimpleCommunicator, c: &Ctx) -> Outcome {
    capsule(c, leak(table(from_good)), c"dlpack_exchange_api")?;
    let obj = producer(c, "tbl")?;
    let before = FROM_CALLS.load(Ordering::SeqCst);
    for policy in [ExchangeApi::Prefer, ExchangeApi::Require] {
        let t = python::acquire_with(&obj, &opts(), policy).map_err(|e| e.to_string())?;
        ensure_eq!(values_of(&t)?, vec![1.0, 2.0, 3.0]);
        ensure_eq!(t.version(), Some((1, 3)));
    }
    ensure_eq!(FROM_CALLS.load(Ordering::SeqCst) - before, 2);
    ensure_eq!(deleted_once()?, 2);
    // `Never` takes the capsule path: the NumPy array behind `__dlpack__`.
    let t = python::acquire_with(&obj, &opts(), ExchangeApi::Never).map_err(|e| e.to_string())?;
    ensure_eq!(values_of(&t)?, vec![10.0, 11.0, 12.0]);
    ensure_eq!(FROM_CALLS.load(Ordering::SeqCst) - before, 2);
    // The default policy (no DLPACK_MPI_EXCHANGE_API set in the test) is Prefer.
    let t = python::acquire(&obj, &opts()).map_err(|e| e.to_string())?;
    ensure_eq!(values_of(&t)?, vec![1.0, 2.0, 3.0]);
    drop(t);
    ensure_eq!(deleted_once()?, 1);
    Ok(())
}

fn hostile_tables_fall_back_or_are_refused_by_name(_: &SimpleCommunicator, c: &Ctx) -> Outcome {
    let good = leak(table(from_good));
    let with = |f: fn(&mut DLPackExchangeApi)| {
        let mut t = table(from_good);
        f(&mut t);
        leak(t)
    };
    let cycle = with(|t| t.header.version = DLPackVersion { major: 2, minor: 0 });
    // SAFETY: `cycle` was just leaked and is not shared.
    unsafe { (*cycle).header.prev_api = cycle.cast() };
    let chained_bad = with(|t| t.header.version = DLPackVersion { major: 0, minor: 9 });
    let to_bad = with(|t| t.header.version = DLPackVersion { major: 2, minor: 0 });
    // SAFETY: as above.
    unsafe { (*to_bad).header.prev_api = chained_bad.cast() };
    // (table, capsule name, Python attribute, expected reason)
    let cases: Vec<(*mut DLPackExchangeApi, &'static CStr, &str, &str)> = vec![
        (
            good,
            c"dltensor",
            "tbl",
            "capsule is not named dlpack_exchange_api",
        ),
        (
            good,
            c"dlpack_exchange_api_v2",
            "tbl",
            "capsule is not named",
        ),
        (good, c"dlpack_exchange_api", "None", "not a PyCapsule"),
        (good, c"dlpack_exchange_api", "0", "not a PyCapsule"),
        (good, c"dlpack_exchange_api", "id(tbl)", "not a PyCapsule"),
        (
            with(|t| t.managed_tensor_from_py_object_no_sync = None),
            c"dlpack_exchange_api",
            "tbl",
            "managed_tensor_from_py_object_no_sync is NULL",
        ),
        (
            with(|t| t.current_work_stream = None),
            c"dlpack_exchange_api",
            "tbl",
            "current_work_stream is NULL",
        ),
        (
            with(|t| t.managed_tensor_allocator = None),
            c"dlpack_exchange_api",
            "tbl",
            "managed_tensor_allocator is NULL",
        ),
        (
            with(|t| t.managed_tensor_to_py_object_no_sync = None),
            c"dlpack_exchange_api",
            "tbl",
            "managed_tensor_to_py_object_no_sync is NULL",
        ),
        (
            with(|t| t.header.version = DLPackVersion { major: 0, minor: 9 }),
            c"dlpack_exchange_api",
            "tbl",
            "unsupported major version",
        ),
        (
            with(|t| t.header.version = DLPackVersion { major: 2, minor: 0 }),
            c"dlpack_exchange_api",
            "tbl",
            "unsupported major version",
        ),
        (
            with(|t| {
                t.header.version = DLPackVersion {
                    major: u32::MAX,
                    minor: u32::MAX,
                }
            }),
            c"dlpack_exchange_api",
            "tbl",
            "unsupported major version",
        ),
        (
            with(|t| t.header.version = DLPackVersion { major: 1, minor: 2 }),
            c"dlpack_exchange_api",
            "tbl",
            "below 1.3",
        ),
        (cycle, c"dlpack_exchange_api", "tbl", "chain too long"),
        (
            to_bad,
            c"dlpack_exchange_api",
            "tbl",
            "unsupported major version",
        ),
    ];
    let before = FROM_CALLS.load(Ordering::SeqCst);
    for (ptr, name, attr, reason) in cases {
        capsule(c, ptr, name)?;
        let obj = producer(c, attr)?;
        let t = python::acquire_with(&obj, &opts(), ExchangeApi::Prefer)
            .map_err(|e| format!("{name:?} {attr} ({reason}): {e}"))?;
        ensure!(
            values_of(&t)? == vec![10.0, 11.0, 12.0],
            "{reason}: did not fall back to __dlpack__"
        );
        match python::acquire_with(&obj, &opts(), ExchangeApi::Require) {
            Err(Error::InvalidExchangeApi {
                type_name,
                reason: r,
            }) if r.contains(reason) && type_name == "Fake" => {}
            other => {
                return Err(format!(
                    "{reason}: expected InvalidExchangeApi, got {other:?}"
                ))
            }
        }
    }
    ensure_eq!(FROM_CALLS.load(Ordering::SeqCst), before);
    // A 2.0 header whose prev_api is a good 1.3 table: the 1.3 one is used.
    let newer = with(|t| t.header.version = DLPackVersion { major: 2, minor: 0 });
    // SAFETY: leaked just now, not shared.
    unsafe { (*newer).header.prev_api = good.cast() };
    capsule(c, newer, c"dlpack_exchange_api")?;
    let obj = producer(c, "tbl")?;
    let t = python::acquire_with(&obj, &opts(), ExchangeApi::Require).map_err(|e| e.to_string())?;
    ensure_eq!(values_of(&t)?, vec![1.0, 2.0, 3.0]);
    drop(t);
    ensure_eq!(deleted_once()?, 1);
    // No table at all: Require names it; Prefer is the capsule path.
    let obj = c.ev("Base()")?;
    match python::acquire_with(&obj, &opts(), ExchangeApi::Require) {
        Err(Error::InvalidExchangeApi { reason, .. }) if reason.contains("has none") => Ok(()),
        other => Err(format!("no table: {other:?}")),
    }
}

fn failing_functions_are_named_and_deleters_run_once(_: &SimpleCommunicator, c: &Ctx) -> Outcome {
    // (function, expected error text, tensors handed out)
    let cases: [(ManagedTensorFromPyObjectNoSync, &str, usize); 6] = [
        (from_raises, "BufferError: cannot describe this tensor", 0),
        (from_fails_silently, "failed without an exception", 0),
        (from_null_ok, "returned 0 and no tensor", 0),
        (from_ok_and_raises, "RuntimeError: left set", 1),
        (from_version_2, "unsupported DLPack version 2.0", 1),
        (from_bad_ndim, "ndim", 1),
    ];
    for (from, expected, made) in cases {
        capsule(c, leak(table(from)), c"dlpack_exchange_api")?;
        let obj = producer(c, "tbl")?;
        for policy in [ExchangeApi::Prefer, ExchangeApi::Require] {
            match python::acquire_with(&obj, &opts(), policy) {
                Err(e) if e.to_string().contains(expected) => {}
                other => return Err(format!("{expected}: got {other:?}")),
            }
            ensure!(
                PyErr::take(c.py).is_none(),
                "{expected}: a Python exception was left set"
            );
        }
        ensure_eq!(deleted_once()?, 2 * made);
    }
    Ok(())
}

fn device_tensor_uses_the_producer_stream(_: &SimpleCommunicator, c: &Ctx) -> Outcome {
    let runtime = dlpack_mpi::runtime::default_runtime().is_some();
    capsule(c, leak(table(from_cuda)), c"dlpack_exchange_api")?;
    let obj = producer(c, "tbl")?;
    STREAM_QUERIES.lock().unwrap().clear();
    // Synchronize: the producer's current stream of (kDLCUDA, 0) is asked for, then
    // synchronized (or, without a CUDA runtime, the tensor is refused).
    match python::acquire_with(&obj, &opts(), ExchangeApi::Require) {
        Ok(t) if runtime => drop(t),
        Err(Error::UnsupportedDevice { device_type: 2, .. }) if !runtime => {}
        other => return Err(format!("synchronize: {other:?} (runtime: {runtime})")),
    }
    ensure_eq!(*STREAM_QUERIES.lock().unwrap(), vec![(2, 0)]);
    // Unsynchronized: no stream query, the tensor is handed out as it is.
    let unsync = AcquireOptions {
        stream: StreamPolicy::Unsynchronized,
        ..AcquireOptions::default()
    };
    let t = python::acquire_with(&obj, &unsync, ExchangeApi::Require).map_err(|e| e.to_string())?;
    ensure_eq!(t.device().device_type, 2);
    drop(t);
    ensure_eq!(STREAM_QUERIES.lock().unwrap().len(), 1);
    ensure_eq!(deleted_once()?, 2);
    // A stream query that fails is the producer's error, and the tensor is released.
    let mut t = table(from_cuda);
    t.current_work_stream = Some(stream_raises);
    capsule(c, leak(t), c"dlpack_exchange_api")?;
    let obj = producer(c, "tbl")?;
    match python::acquire_with(&obj, &opts(), ExchangeApi::Require) {
        Err(e) if e.to_string().contains("RuntimeError: no stream") => {}
        other => return Err(format!("failing stream query: {other:?}")),
    }
    ensure_eq!(deleted_once()?, 1);
    // Host tensors never ask for a stream.
    STREAM_QUERIES.lock().unwrap().clear();
    capsule(c, leak(table(from_good)), c"dlpack_exchange_api")?;
    let obj = producer(c, "tbl")?;
    drop(python::acquire_with(&obj, &opts(), ExchangeApi::Require).map_err(|e| e.to_string())?);
    ensure!(
        STREAM_QUERIES.lock().unwrap().is_empty(),
        "CPU tensor queried a stream"
    );
    ensure_eq!(deleted_once()?, 1);
    Ok(())
}

// ---- real PaddlePaddle ----

const PADDLE_DTYPES: [&str; 14] = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    "float8_e4m3fn",
    "float8_e5m2",
];

fn paddle(c: &Ctx) -> Result<bool, String> {
    if c.exec("import paddle").is_err() {
        println!("    (PaddlePaddle not installed: Paddle cases skipped)");
        return Ok(false);
    }
    Ok(true)
}

/// What must agree between the two paths.
fn described(t: &impl Tensor) -> String {
    format!(
        "ptr={:?} shape={:?} strides={:?} dtype={:?} device={:?} offset={} read_only={}",
        t.first_element_ptr(),
        t.shape(),
        t.strides_elems(),
        t.dtype(),
        t.device(),
        t.byte_offset_bytes(),
        t.is_read_only()
    )
}

fn paddle_every_dtype_through_the_table_equals_the_capsule(
    _: &SimpleCommunicator,
    c: &Ctx,
) -> Outcome {
    if !paddle(c)? {
        return Ok(());
    }
    let views = [
        "paddle.arange(24).astype(DT).reshape([6, 4])",
        "paddle.arange(24).astype(DT).reshape([6, 4]).t()",
        "paddle.arange(24).astype(DT).reshape([6, 4])[1:5]",
        "paddle.to_tensor(7).astype(DT)",
        "paddle.zeros([0, 3], dtype=DT)",
    ];
    for dt in PADDLE_DTYPES {
        for view in views {
            let expr = view.replace("DT", &format!("'{dt}'"));
            c.exec(&format!("x = {expr}"))?;
            let x = c.ev("x")?;
            let fast = python::acquire_with(&x, &opts(), ExchangeApi::Require)
                .map_err(|e| format!("{expr}: exchange: {e}"))?;
            let capsule = c.ev("x.__dlpack__(max_version=(1, 3), copy=False)")?;
            let slow =
                python::from_capsule(&capsule).map_err(|e| format!("{expr}: capsule: {e}"))?;
            ensure!(
                described(&fast) == described(&slow),
                "{expr}: exchange {} vs capsule {}",
                described(&fast),
                described(&slow)
            );
            ensure!(
                fast.first_element_ptr() as usize
                    == c.ev("x.data_ptr()")?
                        .extract::<usize>()
                        .map_err(|e| e.to_string())?
                    || fast.num_elements() == 0,
                "{expr}: not the tensor's own memory"
            );
        }
    }
    Ok(())
}

fn paddle_exchange_cycles_memory_flat(_: &SimpleCommunicator, c: &Ctx) -> Outcome {
    if !paddle(c)? {
        return Ok(());
    }
    let x = c.ev("paddle.arange(24).astype('float32').reshape([6, 4]).t()")?;
    let cycle = |n: usize| -> Outcome {
        for _ in 0..n {
            let t = python::acquire_with(&x, &opts(), ExchangeApi::Require)
                .map_err(|e| e.to_string())?;
            std::hint::black_box(t.first_element_ptr());
        }
        Ok(())
    };
    cycle(10_000)?;
    let rss0 = rss_bytes();
    let refs0 = c
        .ev("sys.getrefcount(x)")?
        .extract::<i64>()
        .map_err(|e| e.to_string())?;
    let start = std::time::Instant::now();
    cycle(100_000)?;
    let per_us = start.elapsed().as_secs_f64() * 1e6 / 100_000.0;
    let grown = rss_bytes().saturating_sub(rss0);
    let refs1 = c
        .ev("sys.getrefcount(x)")?
        .extract::<i64>()
        .map_err(|e| e.to_string())?;
    println!("    100 000 exchange acquire+release: {per_us:.2} µs each, RSS +{grown} B");
    ensure!(
        grown < 4 << 20,
        "RSS grew by {grown} bytes over 100 000 cycles"
    );
    ensure_eq!(refs0, refs1);
    Ok(())
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

type Case = fn(&SimpleCommunicator, &Ctx) -> Outcome;

const CASES: &[(&str, Case)] = &[
    (
        "well_formed_table_is_used_and_released_once",
        well_formed_table_is_used_and_released_once,
    ),
    (
        "hostile_tables_fall_back_or_are_refused_by_name",
        hostile_tables_fall_back_or_are_refused_by_name,
    ),
    (
        "failing_functions_are_named_and_deleters_run_once",
        failing_functions_are_named_and_deleters_run_once,
    ),
    (
        "device_tensor_uses_the_producer_stream",
        device_tensor_uses_the_producer_stream,
    ),
    (
        "paddle_every_dtype_through_the_table_equals_the_capsule",
        paddle_every_dtype_through_the_table_equals_the_capsule,
    ),
    (
        "paddle_exchange_cycles_memory_flat",
        paddle_exchange_cycles_memory_flat,
    ),
];

/// The suite `python_exchange` (see the binary's `main`).
pub fn run(w: &SimpleCommunicator, filter: &[String]) -> harness::End {
    pyo3::Python::initialize();
    let (passed, failed) = Python::attach(|py| {
        let g = PyDict::new(py);
        let ctx = Ctx { py, g };
        if let Err(e) = ctx.exec(BASE).and_then(|()| ctx.exec("import sys")) {
            eprintln!("cannot set up the embedded interpreter: {e}");
            std::process::exit(2);
        }
        harness::run_cases(w, CASES.iter().copied(), filter, |case| case(w, &ctx))
    });
    harness::report(w, passed, failed);
    harness::End::Ran { passed, failed }
}
