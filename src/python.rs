//! Python producers (feature `python`): any object with `__dlpack__` becomes a
//! [`ManagedTensor`].
//!
//! [`acquire`] is the consumer side of the Python array API's data-interchange protocol
//! (array API standard, "Data interchange mechanisms"; `array.__dlpack__` and
//! `array.__dlpack_device__`), with the same [`AcquireOptions`] as
//! [`crate::dlpack::acquire`]:
//!
//! 1. `__dlpack_device__()` is called when the object has it. The answer must be a tuple of
//!    two ints, `(device_type, device_id)`, with a device type dlpack.h (v1.4) defines;
//!    anything else is [`Error::InvalidDeviceQuery`] naming the value (CASES C57). Strict
//!    where a wrong answer would be dangerous, lenient where the meaning is unambiguous:
//!    - int subclasses are ints (JAX and Paddle answer with an `IntEnum` `DLDeviceType`),
//!      but `bool` is not (`(True, 0)` is refused);
//!    - a host device (`kDLCPU`, `kDLCUDAHost`, `kDLROCMHost`) with id `None` is device 0
//!      (Paddle answers `(DLDeviceType.kDLCPU, None)`): host memory has one ordinal;
//!    - any other device with id `None` is refused: which GPU it is would be a guess;
//!    - a list, a tuple of another length, a float, a string, a negative id or an unknown
//!      code stay refused.
//!
//!    Without the method the device is unknown, which
//!    [`DeviceQuery::Required`](crate::dlpack::DeviceQuery::Required) turns into
//!    [`Error::MissingDeviceQuery`].
//! 2. `__dlpack__(max_version=(1, MINOR), copy=False[, stream=s])` is called, with the
//!    stream [`AcquireOptions::stream_for`] picks: none for host memory and for an unknown
//!    device (C50, C53), the consumer's stream or `-1` for CUDA/ROCm (C51, C52).
//! 3. If that raises any `TypeError` (a producer written before DLPack 1.0 does not know
//!    `max_version` or `copy`, and may say so in its own words), it is called once more in
//!    the legacy form, `__dlpack__()` or `__dlpack__(stream=s)` (C55), as NumPy's own
//!    `from_dlpack` does; never more than once. An exception from the retry, or any other
//!    exception from the first call, is [`Error::Python`].
//! 4. The capsule that comes back, `dltensor_versioned` or `dltensor` (whichever the
//!    producer chose), is consumed by [`from_capsule`]: its name is checked, it is renamed
//!    `used_dltensor_versioned` / `used_dltensor` (so that the capsule's own destructor does
//!    nothing and a second consumption is [`Error::CapsuleConsumed`], C56), and ownership
//!    passes to a [`ManagedTensor`], which validates it like any other tensor. A read-only
//!    NumPy array arrives with `READ_ONLY` set and is refused as a receive buffer
//!    ([`Error::ReadOnly`], C58).
//!
//! # Capsules without flags, and immutable producers
//!
//! A legacy `dltensor` capsule has no flags field, so DLPack cannot say whether its memory
//! may be written. The rule: a legacy tensor is writable (NumPy's and Paddle's legacy
//! capsules are, as before DLPack 1.0) **unless the producer's arrays are known to be
//! immutable**. JAX's are: a `jax.Array` is never modified in place, yet JAX answers a
//! versioned request with a legacy capsule. A legacy tensor whose object's type lives in the
//! `jax`/`jaxlib` modules is therefore marked read-only by this consumer: it is a send buffer
//! like any other, and as a receive buffer (or through `as_mut_slice`) it is refused with
//! [`Error::Immutable`] ("jax.Array arrays are immutable"), before any MPI call. Nothing is
//! ever written into a JAX array. (A versioned capsule says for itself, with `READ_ONLY`.)
//!
//! # Deleter and the GIL
//!
//! dlpack.h allows the deleter to be called from any thread, and a Python producer's deleter
//! usually touches Python objects (NumPy's drops its reference to the array). NumPy's own
//! deleter takes the GIL itself (`PyGILState_Ensure`, numpy/_core/src/multiarray/dlpack.c),
//! but not every producer does, so tensors from this module call their deleter with the
//! GIL held: on drop the guard attaches to the interpreter (a counter increment when the
//! thread holds the GIL already; otherwise it waits for the GIL, which a busy interpreter
//! hands over at its next switch interval). If the interpreter has been finalized, the
//! deleter is not called and the tensor is leaked, as NumPy's deleter itself does then:
//! there is no interpreter left to release the object into.
//!
//! The tensors are `ManagedTensor<'static>`: the producer keeps the memory alive until the
//! deleter runs (the capsule holds a reference to the array), independently of the Python
//! object passed in. As with every DLPack consumer, the producer lends the memory: Python
//! code must not write to an array while it is used as a send buffer, nor touch it while it
//! is a receive buffer.
//!
//! # Why not dlpack-rs's pyo3 glue
//!
//! dlpack-rs 0.3 (whose FFI types this crate uses) has a pyo3 importer, `PyTensor`, built on
//! the same pyo3 0.28. It does not fit the consumer protocol here: it calls `__dlpack__()`
//! without `max_version`, `copy` or `stream`, asks no device, has no legacy retry, and calls
//! the deleter from its own `Drop`, outside [`ManagedTensor`], which must stay the only
//! owner that calls a DLPack deleter. So this module implements the consumer itself and
//! hands the pointer to [`ManagedTensor`]; the capsule names and the rename rule are the
//! ones dlpack.h and the array API define, as in dlpack-rs.
//!
//! A producer whose type has `__dlpack_c_exchange_api__` (dlpack.h 1.3's C exchange table:
//! PaddlePaddle ≥ 3.3, PyTorch ≥ 2.10; not NumPy 2.4) is acquired through that table
//! instead of steps 1–4, when the table is usable and the [`settings::ExchangeApi`] policy allows
//! (the default, [`settings::ExchangeApi::Prefer`], does): see [`exchange`].
//!
//! # Making and reading NumPy arrays
//!
//! [`numpy`], [`numpy_array`], [`numpy_dtype_name`] and [`numpy_bytes`] let a Rust program
//! (the `check` runner, tests, examples) make NumPy arrays of any dtype NumPy exports and
//! read them back, without writing Python.
//!
//! # Examples
//! ```no_run
//! use dlpack_mpi::dlpack::{AcquireOptions, Tensor};
//! use dlpack_mpi::dtype::DType;
//! use dlpack_mpi::python::{self, pyo3::Python};
//!
//! Python::initialize();
//! Python::attach(|py| -> dlpack_mpi::Result<()> {
//!     let bytes: Vec<u8> = [1.5f64, 2.5].iter().flat_map(|x| x.to_ne_bytes()).collect();
//!     let array = python::numpy_array(py, DType::new(2, 64), &[2], &bytes)?;
//!     let t = python::acquire(&array, &AcquireOptions::default())?;
//!     assert_eq!(t.as_slice::<f64>()?, &[1.5, 2.5]);
//!     Ok(())
//! })?;
//! # Ok::<(), dlpack_mpi::Error>(())
//! ```

use std::ffi::CStr;

use pyo3::exceptions::{PyAttributeError, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyBytes, PyDict, PyInt, PyString, PyTuple};

/// The pyo3 this crate is built with: use it (`dlpack_mpi::python::pyo3::Python`) so that
/// your `Bound` objects are the ones [`acquire`] takes.
pub use pyo3;

use crate::device::{device_type, Device, MemoryKind};
use crate::dlpack::{
    acquire_from, AcquireOptions, DLManagedTensor, ManagedTensor, MAJOR_VERSION, MINOR_VERSION,
};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::runtime::default_runtime;

pub mod exchange;
use crate::settings;

old_paths! {
    "use dlpack_mpi::settings::ExchangeApi" => type ExchangeApi = settings::ExchangeApi;
}

const VERSIONED: &CStr = c"dltensor_versioned";
const LEGACY: &CStr = c"dltensor";
const USED_VERSIONED: &CStr = c"used_dltensor_versioned";
const USED_LEGACY: &CStr = c"used_dltensor";

/// Acquires the DLPack tensor of any Python object with `__dlpack__`, following the array
/// API protocol (see the [module docs](self)) with the policies of `options`.
///
/// # Errors
/// [`Error::NotAProducer`] without `__dlpack__`; [`Error::InvalidDeviceQuery`] for a bad
/// `__dlpack_device__` answer; [`Error::MissingDeviceQuery`] under
/// [`DeviceQuery::Required`](crate::dlpack::DeviceQuery::Required); [`Error::Python`] when a call raises;
/// [`Error::InvalidCapsule`] / [`Error::CapsuleConsumed`] for what `__dlpack__` returned;
/// the validation errors of [`ManagedTensor`]; [`Error::DeviceMismatch`] and
/// [`Error::UnsupportedDevice`] as in [`crate::dlpack::acquire`]. A tensor that was handed
/// out has been released in every error case.
pub fn acquire(obj: &Bound<'_, PyAny>, options: &AcquireOptions) -> Result<ManagedTensor<'static>> {
    acquire_with(obj, options, settings::ExchangeApi::from_env()?)
}

/// [`acquire`] with an explicit [`settings::ExchangeApi`] policy instead of the process default.
///
/// # Errors
/// As [`acquire`]; [`Error::InvalidExchangeApi`] under [`settings::ExchangeApi::Require`] (see
/// [`exchange`]).
pub fn acquire_with(
    obj: &Bound<'_, PyAny>,
    options: &AcquireOptions,
    exchange_api: settings::ExchangeApi,
) -> Result<ManagedTensor<'static>> {
    // ---- DLPack C exchange API (src/python/exchange.rs): a usable table replaces the
    // device query and `__dlpack__`; otherwise the capsule path below.
    if let Some(tensor) = exchange::try_acquire(obj, options, exchange_api)? {
        return Ok(tensor);
    }
    // ---- capsule path
    // The steps after the device query are `dlpack::acquire`'s own (the stream choice, the
    // device check, the synchronization); only the two calls into Python are this module's.
    // A Python object is not an `Exporter`: its tensors are `'static`, not borrows of it,
    // and its device query can fail.
    let reported = device_query(obj)?;
    let mut tensor = acquire_from(reported, options, default_runtime(), |req| {
        from_capsule(&request(obj, req.stream)?)
    })?;
    // A capsule without flags from a producer whose arrays are immutable (module docs).
    if !tensor.is_versioned() {
        if let Some(producer) = immutable_producer(obj) {
            tensor.mark_immutable(producer);
        }
    }
    Ok(tensor)
}

/// The array type of a producer known to make immutable arrays, by the module of `obj`'s
/// type: `jax.Array` (its concrete type is `jaxlib._jax.ArrayImpl`); `None` for others.
fn immutable_producer(obj: &Bound<'_, PyAny>) -> Option<&'static str> {
    let module = obj.get_type().module().ok()?;
    let module = module.to_str().ok()?;
    let top = module.split('.').next().unwrap_or(module);
    matches!(top, "jax" | "jaxlib").then_some("jax.Array")
}

/// Calls `__dlpack_device__()` if the object has it and validates the answer.
///
/// # Errors
/// [`Error::InvalidDeviceQuery`] naming the value; [`Error::Python`] when the call raises.
pub fn device_query(obj: &Bound<'_, PyAny>) -> Result<Option<Device>> {
    let py = obj.py();
    let name = pyo3::intern!(py, "__dlpack_device__");
    match obj.call_method0(name) {
        Ok(answer) => parse_device(&answer).map(Some),
        Err(e)
            if e.is_instance_of::<PyAttributeError>(py) && !obj.hasattr(name).unwrap_or(true) =>
        {
            Ok(None)
        }
        Err(e) => Err(python_error("__dlpack_device__()".into(), py, e)),
    }
}

/// Whether `device_type` is a `DLDeviceType` of dlpack.h (v1.4: 1–4 and 7–21).
fn known_device_type(t: i64) -> bool {
    u32::try_from(t).is_ok_and(device_type::is_known)
}

/// `t` as a `DLDevice::device_type` when dlpack.h defines it.
fn device_type_of(t: i64) -> Option<u32> {
    u32::try_from(t).ok().filter(|_| known_device_type(t))
}

fn parse_device(answer: &Bound<'_, PyAny>) -> Result<Device> {
    if let Some(device) = parse_device_fast(answer) {
        return Ok(device);
    }
    let bad = |reason| Error::InvalidDeviceQuery {
        value: repr(answer),
        reason,
    };
    let tuple = answer
        .cast::<PyTuple>()
        .map_err(|_| bad("expected a tuple (device_type, device_id)"))?;
    if tuple.len() != 2 {
        return Err(bad(
            "expected a tuple of exactly two ints (device_type, device_id)",
        ));
    }
    let int = |i: usize, what| -> Result<i64> {
        let item = tuple.get_item(i).map_err(|_| bad(what))?;
        if !item.is_instance_of::<PyInt>() || item.is_instance_of::<PyBool>() {
            return Err(bad(what));
        }
        item.extract::<i64>().map_err(|_| bad(what))
    };
    let dev_type = int(0, "device_type is not an int")?;
    let dev_type = device_type_of(dev_type)
        .ok_or_else(|| bad("unknown device_type (not a DLDeviceType of dlpack.h)"))?;
    if tuple.get_item(1).is_ok_and(|id| id.is_none()) {
        // Host memory has one ordinal; a device with several would be a guess.
        let device = Device::new(dev_type, 0);
        return match device.memory_kind() {
            MemoryKind::Host | MemoryKind::PinnedHost => Ok(device),
            _ => Err(bad(
                "device_id is None, allowed only for host memory (kDLCPU, kDLCUDAHost, \
                 kDLROCMHost); this device type has several ordinals",
            )),
        };
    }
    let dev_id = int(1, "device_id is not an int")?;
    let id = i32::try_from(dev_id)
        .ok()
        .filter(|&id| id >= 0)
        .ok_or_else(|| bad("device_id is outside 0..=i32::MAX"))?;
    Ok(Device::new(dev_type, id))
}

/// The common answer, an exact tuple of two exact ints that form a valid device, read
/// without creating any object; `None` sends everything else (int subclasses such as
/// `IntEnum`, errors) through the checked path of [`parse_device`].
fn parse_device_fast(answer: &Bound<'_, PyAny>) -> Option<Device> {
    let p = answer.as_ptr();
    // SAFETY: the GIL is held (`answer` is a Bound) and `p` is a live object; the tuple
    // accessors are used only on an exact tuple of size 2, so both items exist, and the int
    // conversion only on exact ints; an overflow error it sets is cleared.
    unsafe {
        if ffi::PyTuple_CheckExact(p) == 0 || ffi::PyTuple_GET_SIZE(p) != 2 {
            return None;
        }
        let (t, i) = (ffi::PyTuple_GET_ITEM(p, 0), ffi::PyTuple_GET_ITEM(p, 1));
        if ffi::PyLong_CheckExact(t) == 0 || ffi::PyLong_CheckExact(i) == 0 {
            return None;
        }
        let (t, i) = (ffi::PyLong_AsLongLong(t), ffi::PyLong_AsLongLong(i));
        if (t == -1 || i == -1) && !ffi::PyErr_Occurred().is_null() {
            ffi::PyErr_Clear();
            return None;
        }
        let id = i32::try_from(i).ok().filter(|&id| id >= 0)?;
        device_type_of(t).map(|t| Device::new(t, id))
    }
}

/// The interned objects of the `__dlpack__` call, made once per interpreter.
struct CallObjects {
    max_version: Py<PyTuple>,
    kwnames: Py<PyTuple>,
    kwnames_stream: Py<PyTuple>,
}

static CALL_OBJECTS: PyOnceLock<CallObjects> = PyOnceLock::new();

fn call_objects(py: Python<'_>) -> Result<&CallObjects> {
    CALL_OBJECTS
        .get_or_try_init(py, || -> PyResult<CallObjects> {
            let name = |n| PyString::intern(py, n);
            Ok(CallObjects {
                max_version: PyTuple::new(py, [MAJOR_VERSION, MINOR_VERSION])?.unbind(),
                kwnames: PyTuple::new(py, [name("max_version"), name("copy")])?.unbind(),
                kwnames_stream: PyTuple::new(
                    py,
                    [name("max_version"), name("copy"), name("stream")],
                )?
                .unbind(),
            })
        })
        .map_err(|e| python_error("building the __dlpack__ arguments".into(), py, e))
}

/// Calls `__dlpack__` in the DLPack 1.x form, and once in the legacy form when the producer
/// rejects the 1.x keywords with a `TypeError`.
fn request<'py>(obj: &Bound<'py, PyAny>, stream: Option<isize>) -> Result<Bound<'py, PyAny>> {
    let py = obj.py();
    let name = pyo3::intern!(py, "__dlpack__");
    let objects = call_objects(py)?;
    // isize -> Python int cannot fail (Infallible).
    let stream_obj = stream.map(|s| match s.into_pyobject(py) {
        Ok(v) => v,
        Err(never) => match never {},
    });
    let mut args = [
        obj.as_ptr(),
        objects.max_version.as_ptr(),
        PyBool::new(py, false).as_ptr(),
        std::ptr::null_mut(),
    ];
    let kwnames = match &stream_obj {
        Some(s) => {
            args[3] = s.as_ptr();
            objects.kwnames_stream.bind(py)
        }
        None => objects.kwnames.bind(py),
    };
    // SAFETY: the GIL is held (`py`); `args` holds `self` (one positional argument) and one
    // value per keyword name, all borrowed references alive for the call; the count of
    // positionals is 1 and PY_VECTORCALL_ARGUMENTS_OFFSET is not set, so the callee does
    // not write to `args`.
    let result = unsafe {
        ffi::PyObject_VectorcallMethod(name.as_ptr(), args.as_ptr(), 1, kwnames.as_ptr())
    };
    // SAFETY: a new reference or NULL with an exception set, as the C API returns.
    let result = unsafe { Bound::from_owned_ptr_or_err(py, result) };
    let call = || match stream {
        Some(s) => format!(
            "__dlpack__(max_version=({MAJOR_VERSION}, {MINOR_VERSION}), copy=False, stream={s})"
        ),
        None => format!("__dlpack__(max_version=({MAJOR_VERSION}, {MINOR_VERSION}), copy=False)"),
    };
    match result {
        Ok(capsule) => Ok(capsule),
        Err(e)
            if e.is_instance_of::<PyAttributeError>(py) && !obj.hasattr(name).unwrap_or(true) =>
        {
            Err(Error::NotAProducer {
                type_name: type_name(obj),
            })
        }
        // Any TypeError: the producer may not know the 1.x keywords and say so in its own
        // words (NumPy's `from_dlpack` retries the same way). Retried once, never again.
        Err(e) if e.is_instance_of::<PyTypeError>(py) => {
            let first = python_error(call(), py, e);
            legacy_request(obj, stream, &first)
        }
        Err(e) => Err(python_error(call(), py, e)),
    }
}

/// The one legacy retry; its error names the first call's `TypeError` too.
fn legacy_request<'py>(
    obj: &Bound<'py, PyAny>,
    stream: Option<isize>,
    first: &Error,
) -> Result<Bound<'py, PyAny>> {
    let py = obj.py();
    let name = pyo3::intern!(py, "__dlpack__");
    let after = |call: String| format!("{call} (legacy form, the one retry after {first})");
    match stream {
        None => obj
            .call_method0(name)
            .map_err(|e| python_error(after("__dlpack__()".into()), py, e)),
        Some(s) => {
            let kwargs = PyDict::new(py);
            kwargs
                .set_item("stream", s)
                .map_err(|e| python_error("building kwargs".into(), py, e))?;
            obj.call_method(name, (), Some(&kwargs))
                .map_err(|e| python_error(after(format!("__dlpack__(stream={s})")), py, e))
        }
    }
}

/// Consumes a DLPack capsule (`dltensor_versioned` or `dltensor`): checks its name, takes
/// the pointer, renames the capsule `used_…` so that nobody can consume it again, and hands
/// ownership to a [`ManagedTensor`] whose deleter runs under the GIL.
///
/// [`acquire`] calls this on what `__dlpack__` returns; call it directly for a capsule you
/// got otherwise.
///
/// # Errors
/// [`Error::InvalidCapsule`] for a non-capsule or an unknown name;
/// [`Error::CapsuleConsumed`] for a capsule already renamed `used_…` (C56);
/// [`Error::NullPointer`]; [`Error::Python`] when the capsule API fails; the validation
/// errors of [`ManagedTensor`] (after which the deleter has run).
pub fn from_capsule(capsule: &Bound<'_, PyAny>) -> Result<ManagedTensor<'static>> {
    let py = capsule.py();
    let ptr = capsule.as_ptr();
    // SAFETY: the GIL is held and `ptr` is a live object.
    if unsafe { ffi::PyCapsule_CheckExact(ptr) } == 0 {
        return Err(Error::InvalidCapsule {
            what: "type",
            value: type_name(capsule),
        });
    }
    // SAFETY: `ptr` is a capsule; GetName never fails on one (NULL means "no name").
    let name_ptr = unsafe { ffi::PyCapsule_GetName(ptr) };
    if name_ptr.is_null() {
        return Err(Error::InvalidCapsule {
            what: "capsule name",
            value: "NULL".into(),
        });
    }
    // SAFETY: a capsule's name is a NUL-terminated string that lives as long as the capsule.
    let name = unsafe { CStr::from_ptr(name_ptr) };
    let (versioned, used) = if name == VERSIONED {
        (true, USED_VERSIONED)
    } else if name == LEGACY {
        (false, USED_LEGACY)
    } else if name == USED_VERSIONED || name == USED_LEGACY {
        return Err(Error::CapsuleConsumed {
            name: name.to_string_lossy().into_owned(),
        });
    } else {
        return Err(Error::InvalidCapsule {
            what: "capsule name",
            value: name.to_string_lossy().into_owned(),
        });
    };
    // SAFETY: `name_ptr` is this capsule's own name, so the name check passes.
    let raw = unsafe { ffi::PyCapsule_GetPointer(ptr, name_ptr) };
    if raw.is_null() {
        return Err(match PyErr::take(py) {
            Some(e) => python_error("PyCapsule_GetPointer".into(), py, e),
            None => Error::NullPointer {
                field: "capsule pointer",
            },
        });
    }
    // Take ownership before validating (the guard releases on every error path): renaming
    // tells the producer's capsule destructor that a consumer owns the tensor now. The new
    // name is a 'static string, as PyCapsule_SetName requires.
    // SAFETY: `ptr` is a capsule, the GIL is held.
    if unsafe { ffi::PyCapsule_SetName(ptr, used.as_ptr()) } != 0 {
        let e = PyErr::take(py);
        return Err(match e {
            Some(e) => python_error("PyCapsule_SetName".into(), py, e),
            None => Error::PythonCallFailed {
                call: "PyCapsule_SetName",
            },
        });
    }
    if versioned {
        // SAFETY: a `dltensor_versioned` capsule holds a DLManagedTensorVersioned* whose
        // ownership the rename just passed to us (array API `__dlpack__`); the producer keeps
        // the struct, its arrays and the data alive until its deleter runs (hence 'static)
        // and lends the memory to this consumer.
        unsafe { ManagedTensor::from_raw_versioned_in(raw.cast(), Some(release_with_gil)) }
    } else {
        // SAFETY: as above for a legacy `dltensor` capsule, which holds a DLManagedTensor*.
        unsafe {
            ManagedTensor::from_raw_legacy_in(raw.cast::<DLManagedTensor>(), Some(release_with_gil))
        }
    }
}

/// Calls the deleter with the GIL held; leaks when the interpreter is gone (see the module
/// docs).
fn release_with_gil(call: &mut dyn FnMut()) {
    let _ = Python::try_attach(|_py| call());
}

/// The directory of the shared libpython this crate was built against: the `LIBDIR` of
/// PYO3_PYTHON (else `python3`) when build.rs ran, empty when it could not ask.
pub const BUILT_PYTHON_LIBDIR: &str = env!("DLPACK_MPI_PYTHON_LIBDIR");

/// The interpreter build.rs asked for [`BUILT_PYTHON_LIBDIR`] (PYO3_PYTHON, else `python3`).
pub const BUILT_PYTHON: &str = env!("DLPACK_MPI_PYTHON");

/// Checks that the embedded interpreter runs on the libpython this crate was built
/// against: its `sysconfig` `LIBDIR` equals [`BUILT_PYTHON_LIBDIR`] (both canonicalized).
///
/// Why: pyo3 links `libpython3.x.so` by name. This package's own binaries carry a run path
/// to the right directory (build.rs), but a dependent program does not, and the loader then
/// takes the first copy on its search path — on Debian the system's
/// `/usr/lib/x86_64-linux-gnu/libpython3.x.so`, whose interpreter lacks the packages
/// (NumPy, JAX, …) installed for PYO3_PYTHON. [`numpy`] calls this when NumPy cannot be
/// imported. The fixes, named in the error: run with `LD_LIBRARY_PATH=<dir>`, or link the
/// program with `-Wl,-rpath,<dir>` (`RUSTFLAGS`, a `.cargo/config.toml`, or a build script
/// reading `DEP_DLPACK_MPI_PYTHON_LIBDIR`, which this crate exports to dependents).
///
/// # Errors
/// [`Error::PythonLibraryMismatch`] naming both directories, the loaded `sys.prefix` and
/// the fix. `Ok` when they match, when the build recorded no directory, or when the
/// embedded interpreter cannot tell its own.
pub fn check_libpython(py: Python<'_>) -> Result<()> {
    if BUILT_PYTHON_LIBDIR.is_empty() {
        return Ok(());
    }
    let ask = |code: &str| -> Option<String> {
        let value = py
            .eval(&std::ffi::CString::new(code).ok()?, None, None)
            .ok()?;
        value.extract::<String>().ok()
    };
    let Some(loaded) = ask("__import__('sysconfig').get_config_var('LIBDIR') or ''") else {
        return Ok(());
    };
    let canonical = |dir: &str| std::fs::canonicalize(dir).unwrap_or_else(|_| dir.into());
    if loaded.is_empty() || canonical(&loaded) == canonical(BUILT_PYTHON_LIBDIR) {
        return Ok(());
    }
    Err(Error::PythonLibraryMismatch {
        built: BUILT_PYTHON_LIBDIR.to_owned(),
        python: BUILT_PYTHON.to_owned(),
        loaded,
        prefix: ask("__import__('sys').prefix").unwrap_or_default(),
    })
}

/// Imports NumPy in the embedded interpreter.
///
/// # Errors
/// [`Error::PythonLibraryMismatch`] when NumPy cannot be imported because the program
/// loaded another libpython ([`check_libpython`]); otherwise
/// [`Error::Python`] when NumPy cannot be imported; the message names the embedded
/// interpreter (`sys.executable`, `sys.prefix`, version), since a program linked against a
/// different libpython than the one NumPy was installed for is the usual cause.
pub fn numpy(py: Python<'_>) -> Result<Bound<'_, PyModule>> {
    py.import("numpy").map_err(|e| {
        if let Err(mismatch) = check_libpython(py) {
            return mismatch;
        }
        let sys = py.import("sys").ok();
        let get = |attr: &str| {
            sys.as_ref()
                .and_then(|s| s.getattr(attr).ok())
                .map(|v| v.to_string())
                .unwrap_or_default()
        };
        Error::Python {
            call: format!(
                "import numpy (embedded interpreter: executable {}, prefix {}, version {})",
                get("executable"),
                get("prefix"),
                get("version").split_whitespace().next().unwrap_or("?")
            ),
            exception: e.to_string(),
        }
    })
}

/// The NumPy dtype name of a DLPack dtype NumPy can hold and export (`bool`, `int8`–`int64`,
/// `uint8`–`uint64`, `float16`/`32`/`64`, `complex64`/`128`), or `None` (bfloat16, float8,
/// multi-lane and other dtypes plain NumPy has not).
pub fn numpy_dtype_name(dtype: DType) -> Option<&'static str> {
    /// The dtypes NumPy holds and exports, by their DLPack names (which NumPy shares).
    const NUMPY: [&str; 14] = [
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
        "complex64",
        "complex128",
    ];
    if dtype.lanes != 1 {
        return None;
    }
    dtype.base_name().filter(|name| NUMPY.contains(name))
}

/// A new, writable, C-contiguous NumPy array of `dtype` and `shape` (elements, outermost
/// first; `&[]` is 0-d) holding a copy of `bytes` (native byte order, row-major).
///
/// # Errors
/// [`Error::UnsupportedDtype`] when NumPy has no such dtype; [`Error::ShapeMismatch`] when
/// `bytes` is not exactly `shape`'s element count × the element size;
/// [`Error::Python`] (NumPy missing, ...).
pub fn numpy_array<'py>(
    py: Python<'py>,
    dtype: DType,
    shape: &[i64],
    bytes: &[u8],
) -> Result<Bound<'py, PyAny>> {
    let name = numpy_dtype_name(dtype).ok_or(Error::UnsupportedDtype {
        dtype,
        reason: "NumPy has no such dtype",
    })?;
    let elems = crate::layout::num_elements(shape)?;
    let size = dtype.size_bytes().unwrap_or(0) as u64;
    // num_elements refuses negative extents, so elems ≥ 0 and the conversion succeeds.
    let expected = u64::try_from(elems)
        .ok()
        .and_then(|elems| elems.checked_mul(size))
        .ok_or(Error::Overflow {
            quantity: "array bytes",
            lhs: elems.into(),
            operator: "*",
            rhs: size.into(),
        })?;
    if expected != bytes.len() as u64 {
        return Err(Error::ShapeMismatch {
            what: "numpy_array",
            expected,
            actual: bytes.len() as u64,
        });
    }
    let np = numpy(py)?;
    let err = |e: PyErr| python_error(format!("numpy.frombuffer(..., dtype={name})"), py, e);
    let flat = np
        .call_method1("frombuffer", (PyBytes::new(py, bytes), name))
        .map_err(err)?;
    let shape = PyTuple::new(py, shape).map_err(err)?;
    flat.call_method1("reshape", (shape,))
        .and_then(|a| a.call_method0("copy"))
        .map_err(err)
}

/// The elements of any array-like (through `numpy.asarray(obj).tobytes()`): native byte
/// order, logical row-major order whatever the strides.
///
/// # Errors
/// [`Error::Python`] when the object cannot be read as an array.
pub fn numpy_bytes(obj: &Bound<'_, PyAny>) -> Result<Vec<u8>> {
    let py = obj.py();
    let np = numpy(py)?;
    np.call_method1("asarray", (obj,))
        .and_then(|a| a.call_method0("tobytes"))
        .and_then(|b| b.extract::<Vec<u8>>())
        .map_err(|e| python_error("numpy.asarray(obj).tobytes()".into(), py, e))
}

fn python_error(call: String, py: Python<'_>, e: PyErr) -> Error {
    let type_name = e
        .get_type(py)
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "exception".into());
    Error::Python {
        call,
        exception: format!("{type_name}: {}", e.value(py)),
    }
}

fn repr(obj: &Bound<'_, PyAny>) -> String {
    obj.repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| format!("<unrepresentable {}>", type_name(obj)))
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::code;

    #[test]
    fn device_types_known() {
        // dlpack.h 1.4 added kDLAscend (21); 19 and 20 are kDLTPU / kDLTPUHost.
        for t in [1, 2, 3, 4, 7, 13, 19, 20, 21] {
            assert!(known_device_type(t), "{t}");
        }
        for t in [0, 5, 6, 22, -1, i64::from(u32::MAX) + 1] {
            assert!(!known_device_type(t), "{t}");
        }
    }

    #[test]
    fn dtype_names() {
        assert_eq!(numpy_dtype_name(DType::new(code::BOOL, 8)), Some("bool"));
        assert_eq!(
            numpy_dtype_name(DType::new(code::COMPLEX, 128)),
            Some("complex128")
        );
        assert_eq!(numpy_dtype_name(DType::new(code::BFLOAT, 16)), None);
        assert_eq!(
            numpy_dtype_name(DType::new(code::FLOAT, 32).with_lanes(4)),
            None
        );
    }
}
