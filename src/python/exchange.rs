//! DLPack 1.3's C exchange API (`__dlpack_c_exchange_api__`) on the consumer side.
//!
//! A producer type may carry, as the class attribute `__dlpack_c_exchange_api__`, a
//! `PyCapsule` named `dlpack_exchange_api` that holds a `DLPackExchangeAPI*`: a table of C
//! functions (dlpack.h v1.3, "DLPack `__dlpack_c_exchange_api__` fast exchange protocol
//! definitions"). PaddlePaddle 3.3 and PyTorch ≥ 2.10 expose one. Through it a consumer
//! gets a `DLManagedTensorVersioned*` from the object in one C call
//! (`managed_tensor_from_py_object_no_sync`), with no `__dlpack_device__` call, no
//! `__dlpack__` method call, no capsule, and no keyword tuple: for Paddle that is several
//! times faster than the capsule path (docs/PERFORMANCE.md, "Python producers").
//!
//! # The table, as read here
//!
//! [`DLPackExchangeApi`] follows the layout of `struct DLPackExchangeAPI` in dlpack.h v1.3:
//! the stable header (`DLPackVersion version; DLPackExchangeAPIHeader* prev_api;`), then
//! five function pointers in the order `managed_tensor_allocator`,
//! `managed_tensor_from_py_object_no_sync`, `managed_tensor_to_py_object_no_sync`,
//! `dltensor_from_py_object_no_sync` (the only one dlpack.h lets be NULL),
//! `current_work_stream`. A table is used only when ([`Rejected`] names each failure):
//!
//! - the attribute is found on the object's *type* (dlpack.h: "this must be defined on the
//!   type"; the result is cached per type, as dlpack.h allows) and is an exact capsule named
//!   `dlpack_exchange_api` with a non-NULL pointer;
//! - the header's version is 1.x with x ≥ 3 (the first minor that has the table). A header
//!   of another major version is not read past its header: its `prev_api` chain is walked
//!   (at most [`MAX_CHAIN`] links) for a 1.x table, as dlpack.h describes;
//! - the four function pointers dlpack.h says "must not be NULL" are not NULL (a table with
//!   NULL where none may be is likely not laid out as this module reads it).
//!
//! # Policy ([`settings::ExchangeApi`])
//!
//! By default ([`settings::ExchangeApi::Prefer`]) a usable table is used and an unusable one is
//! ignored: the object is acquired through `__dlpack__` as if it had no table (a producer
//! whose table is broken still has the protocol every producer must have).
//! [`settings::ExchangeApi::Require`] makes an unusable or missing table [`Error::InvalidExchangeApi`]
//! (for tests and for callers who want to know); [`settings::ExchangeApi::Never`] always takes the
//! capsule path. [`super::acquire`] uses the process default, [`settings::ExchangeApi::from_env`]
//! (`DLPACK_MPI_EXCHANGE_API=prefer|never|require`, `prefer` when unset; see
//! [`crate::settings`]).
//!
//! # Ownership, devices and streams
//!
//! The returned tensor goes to [`ManagedTensor`] exactly like a capsule's, with the same
//! GIL-holding deleter (`release_with_gil`, as for capsules): the guard is the only owner that calls
//! the deleter, once, on every path (validation errors included). When the function fails
//! (non-zero return) the consumer owns nothing and calls no deleter.
//!
//! The exchange call replaces both `__dlpack_device__` and `__dlpack__`: the device is the
//! one in the returned tensor (there is no reported device to compare it with, so
//! [`DeviceQuery`](crate::dlpack::DeviceQuery) does not apply), and no stream is passed
//! ("does not perform any stream synchronization"). For a device-memory tensor under
//! [`StreamPolicy::Synchronize`] the producer's own current work stream for that device
//! (`current_work_stream`, what a capsule cannot tell) is synchronized before the tensor is
//! returned, so MPI reads finished data, as on the capsule path (CASES C61); a NULL answer
//! is the device's default stream (CUDA legacy default, ROCm `0`). Under
//! [`StreamPolicy::Unsynchronized`] nothing is synchronized, as on the capsule path. Host
//! tensors never query a stream (dlpack.h: "When device_type is kDLCPU, the consumer do not
//! have to query the stream").

use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr::NonNull;
use std::sync::Mutex;

use pyo3::ffi;
use pyo3::prelude::*;

use crate::device::{MemoryKind, CUDA_LEGACY_DEFAULT_STREAM, ROCM_DEFAULT_STREAM};
use crate::dlpack::{
    check_acquired, AcquireOptions, DLManagedTensorVersioned, DLPackVersion, DLTensor,
    ManagedTensor, StreamPolicy, Tensor as _, MAJOR_VERSION,
};
use crate::error::{Error, Result};
use crate::runtime::default_runtime;
// The policy and its setting (`DLPACK_MPI_EXCHANGE_API`) are in `crate::settings`.
use crate::settings;

old_paths! {
    "use dlpack_mpi::settings::ExchangeApi" => type ExchangeApi = settings::ExchangeApi;
}

/// The capsule name dlpack.h gives the table.
pub const CAPSULE_NAME: &CStr = c"dlpack_exchange_api";

/// The lowest minor version of DLPack 1 that has the exchange table.
pub const MIN_MINOR_VERSION: u32 = 3;

/// The most `prev_api` links followed from a header of another major version (a cycle or a
/// garbage chain ends there).
pub const MAX_CHAIN: usize = 8;

/// `DLPackManagedTensorAllocator` (dlpack.h v1.3); not called by this crate.
pub type ManagedTensorAllocator = unsafe extern "C" fn(
    prototype: *mut DLTensor,
    out: *mut *mut DLManagedTensorVersioned,
    error_ctx: *mut c_void,
    set_error: Option<
        unsafe extern "C" fn(error_ctx: *mut c_void, kind: *const c_char, message: *const c_char),
    >,
) -> c_int;

/// `DLPackManagedTensorFromPyObjectNoSync` (dlpack.h v1.3): 0 and an owning tensor in
/// `*out`, or -1 with a Python exception set.
pub type ManagedTensorFromPyObjectNoSync =
    unsafe extern "C" fn(py_object: *mut c_void, out: *mut *mut DLManagedTensorVersioned) -> c_int;

/// `DLPackManagedTensorToPyObjectNoSync` (dlpack.h v1.3); not called by this crate.
pub type ManagedTensorToPyObjectNoSync = unsafe extern "C" fn(
    tensor: *mut DLManagedTensorVersioned,
    out_py_object: *mut *mut c_void,
) -> c_int;

/// `DLPackDLTensorFromPyObjectNoSync` (dlpack.h v1.3); not called by this crate (its tensor
/// lives only until control returns to Python, too short for an MPI operation).
pub type DLTensorFromPyObjectNoSync =
    unsafe extern "C" fn(py_object: *mut c_void, out: *mut DLTensor) -> c_int;

/// `DLPackCurrentWorkStream` (dlpack.h v1.3): the producer's current stream of a device
/// (`DLDeviceType` is a C enum, passed as an `int`).
pub type CurrentWorkStream = unsafe extern "C" fn(
    device_type: c_int,
    device_id: i32,
    out_current_stream: *mut *mut c_void,
) -> c_int;

/// `DLPackExchangeAPIHeader` (dlpack.h v1.3): stable across versions.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DLPackExchangeApiHeader {
    /// The DLPack version of the table that follows the header.
    pub version: DLPackVersion,
    /// An older table of the same producer, or NULL.
    pub prev_api: *mut DLPackExchangeApiHeader,
}

/// `DLPackExchangeAPI` (dlpack.h v1.3), field for field. The function pointers are
/// `Option`s so that a NULL in a hostile table is read as `None`, never called.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DLPackExchangeApi {
    /// The stable header.
    pub header: DLPackExchangeApiHeader,
    /// Must not be NULL.
    pub managed_tensor_allocator: Option<ManagedTensorAllocator>,
    /// Must not be NULL.
    pub managed_tensor_from_py_object_no_sync: Option<ManagedTensorFromPyObjectNoSync>,
    /// Must not be NULL.
    pub managed_tensor_to_py_object_no_sync: Option<ManagedTensorToPyObjectNoSync>,
    /// May be NULL.
    pub dltensor_from_py_object_no_sync: Option<DLTensorFromPyObjectNoSync>,
    /// Must not be NULL.
    pub current_work_stream: Option<CurrentWorkStream>,
}

/// Why a type's table is not used (the `reason` of [`Error::InvalidExchangeApi`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rejected(pub &'static str);

/// A validated table: immutable, alive for the whole process (dlpack.h: "The
/// DLPackExchangeAPI* must stay alive throughout the lifetime of the process").
#[derive(Debug, Clone, Copy)]
struct Table {
    from_py_object: ManagedTensorFromPyObjectNoSync,
    current_work_stream: CurrentWorkStream,
}

/// What a type answered, cached per type.
#[derive(Debug, Clone, Copy)]
enum Lookup {
    Absent,
    Usable(Table),
    Unusable(Rejected),
}

struct CacheEntry {
    /// The type's address; the type itself is kept alive by `_keep`, so the address cannot
    /// be reused by another type while the entry exists.
    type_addr: usize,
    _keep: Py<PyAny>,
    /// The capsule, kept alive with the table it holds.
    _capsule: Option<Py<PyAny>>,
    lookup: Lookup,
}

/// The per-type cache; bounded (a program that makes types without end looks them up
/// every time past the bound).
static CACHE: Mutex<Vec<CacheEntry>> = Mutex::new(Vec::new());
const CACHE_ENTRIES: usize = 64;

/// The table of `obj`'s type: `Ok(None)` when the type has none, `Err` when its table is
/// unusable.
fn lookup(obj: &Bound<'_, PyAny>) -> std::result::Result<Option<Table>, Rejected> {
    let ty = obj.get_type();
    let type_addr = ty.as_ptr() as usize;
    let cached = |entries: &Vec<CacheEntry>| {
        entries
            .iter()
            .find(|e| e.type_addr == type_addr)
            .map(|e| e.lookup)
    };
    // The lock is never held while Python runs (no GIL/lock-order deadlock).
    let hit = cached(&CACHE.lock().unwrap_or_else(|p| p.into_inner()));
    let lookup = match hit {
        Some(l) => l,
        None => {
            let (lookup, capsule) = read_type(ty.as_any());
            let mut entries = CACHE.lock().unwrap_or_else(|p| p.into_inner());
            if entries.len() < CACHE_ENTRIES && cached(&entries).is_none() {
                entries.push(CacheEntry {
                    type_addr,
                    _keep: ty.clone().into_any().unbind(),
                    _capsule: capsule,
                    lookup,
                });
            }
            lookup
        }
    };
    match lookup {
        Lookup::Absent => Ok(None),
        Lookup::Usable(t) => Ok(Some(t)),
        Lookup::Unusable(r) => Err(r),
    }
}

/// Reads and validates `type.__dlpack_c_exchange_api__`.
fn read_type(ty: &Bound<'_, PyAny>) -> (Lookup, Option<Py<PyAny>>) {
    let name = pyo3::intern!(ty.py(), "__dlpack_c_exchange_api__");
    let capsule = match ty.getattr(name) {
        Ok(c) => c,
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyAttributeError>(ty.py()) => {
            return (Lookup::Absent, None)
        }
        Err(_) => {
            return (
                Lookup::Unusable(Rejected("looking up the attribute raised")),
                None,
            )
        }
    };
    let lookup = match table_of_capsule(&capsule) {
        Ok(t) => Lookup::Usable(t),
        Err(r) => Lookup::Unusable(r),
    };
    (lookup, Some(capsule.unbind()))
}

fn table_of_capsule(capsule: &Bound<'_, PyAny>) -> std::result::Result<Table, Rejected> {
    let p = capsule.as_ptr();
    // SAFETY: the GIL is held (`capsule` is a Bound) and `p` is a live object.
    if unsafe { ffi::PyCapsule_CheckExact(p) } == 0 {
        return Err(Rejected("not a PyCapsule"));
    }
    // SAFETY: `p` is a capsule; GetName does not fail on one (NULL = no name).
    let name = unsafe { ffi::PyCapsule_GetName(p) };
    // SAFETY: a non-NULL capsule name is a NUL-terminated string owned by the capsule.
    if name.is_null() || unsafe { CStr::from_ptr(name) } != CAPSULE_NAME {
        return Err(Rejected("capsule is not named dlpack_exchange_api"));
    }
    // SAFETY: the name just matched, so GetPointer returns the pointer (never NULL for a
    // capsule, which PyCapsule_New refuses to make with NULL).
    let raw = unsafe { ffi::PyCapsule_GetPointer(p, name) };
    let header = NonNull::new(raw.cast::<DLPackExchangeApiHeader>()).ok_or_else(|| {
        // SAFETY: the GIL is held; clears whatever GetPointer set.
        unsafe { ffi::PyErr_Clear() };
        Rejected("capsule pointer is NULL")
    })?;
    // SAFETY: dlpack.h makes the capsule hold a table that lives for the process and starts
    // with the stable header; nothing past the header is read before the version is checked.
    let table = unsafe { find_version_1(header) }?;
    let require = |present: bool, what| if present { Ok(()) } else { Err(Rejected(what)) };
    require(
        table.managed_tensor_allocator.is_some(),
        "managed_tensor_allocator is NULL",
    )?;
    require(
        table.managed_tensor_to_py_object_no_sync.is_some(),
        "managed_tensor_to_py_object_no_sync is NULL",
    )?;
    Ok(Table {
        from_py_object: table
            .managed_tensor_from_py_object_no_sync
            .ok_or(Rejected("managed_tensor_from_py_object_no_sync is NULL"))?,
        current_work_stream: table
            .current_work_stream
            .ok_or(Rejected("current_work_stream is NULL"))?,
    })
}

/// Walks from `header` along `prev_api` to the first 1.x (x ≥ 3) table.
///
/// # Safety
/// `header` and every non-NULL `prev_api` link reached point to readable headers; a header
/// of version 1.x (x ≥ 3) is the start of a readable [`DLPackExchangeApi`].
unsafe fn find_version_1(
    header: NonNull<DLPackExchangeApiHeader>,
) -> std::result::Result<DLPackExchangeApi, Rejected> {
    let mut current = header;
    for _ in 0..=MAX_CHAIN {
        // SAFETY: the caller's contract.
        let h = unsafe { *current.as_ptr() };
        if h.version.major == MAJOR_VERSION {
            if h.version.minor < MIN_MINOR_VERSION {
                return Err(Rejected("version 1.x below 1.3 (the table came with 1.3)"));
            }
            // SAFETY: the caller's contract for a 1.x (x ≥ 3) header.
            return Ok(unsafe { *current.cast::<DLPackExchangeApi>().as_ptr() });
        }
        match NonNull::new(h.prev_api) {
            Some(prev) => current = prev,
            None => {
                return Err(Rejected(
                    "unsupported major version, no 1.x table in prev_api",
                ))
            }
        }
    }
    Err(Rejected("prev_api chain too long (a cycle?)"))
}

/// Acquires through the exchange table when `policy` and the type allow; `Ok(None)` sends
/// the caller to the capsule path.
///
/// # Errors
/// [`Error::InvalidExchangeApi`] under [`settings::ExchangeApi::Require`] for a missing or unusable
/// table, and for a function that breaks its contract; [`Error::Python`] when the producer
/// refuses with an exception; [`Error::InvalidSetting`]; the validation and stream errors of
/// the capsule path.
pub(super) fn try_acquire(
    obj: &Bound<'_, PyAny>,
    options: &AcquireOptions,
    policy: settings::ExchangeApi,
) -> Result<Option<ManagedTensor<'static>>> {
    let invalid = |reason| Error::InvalidExchangeApi {
        type_name: super::type_name(obj),
        reason,
    };
    let table = match (policy, lookup(obj)) {
        (settings::ExchangeApi::Never, _) => return Ok(None),
        (settings::ExchangeApi::Prefer, Ok(None) | Err(_)) => return Ok(None),
        (settings::ExchangeApi::Require, Ok(None)) => return Err(invalid("the type has none")),
        (settings::ExchangeApi::Require, Err(Rejected(reason))) => return Err(invalid(reason)),
        (_, Ok(Some(table))) => table,
    };
    let tensor = from_py_object(obj, table)?;
    let device = tensor.device();
    let stream = if device.memory_kind().uses_streams()
        && matches!(options.stream, StreamPolicy::Synchronize { .. })
    {
        Some(current_stream(obj, table, device)?)
    } else {
        None
    };
    check_acquired(tensor, None, options, stream, default_runtime()).map(Some)
}

/// Calls `managed_tensor_from_py_object_no_sync` and hands its tensor to the guard.
fn from_py_object(obj: &Bound<'_, PyAny>, table: Table) -> Result<ManagedTensor<'static>> {
    let py = obj.py();
    let call = "__dlpack_c_exchange_api__.managed_tensor_from_py_object_no_sync";
    let mut out: *mut DLManagedTensorVersioned = std::ptr::null_mut();
    // SAFETY: the GIL is held; `obj` has the type the table was read from (as dlpack.h
    // requires); `out` is a valid place for the result.
    let rc = unsafe { (table.from_py_object)(obj.as_ptr().cast(), &mut out) };
    let raised = PyErr::take(py);
    if rc != 0 {
        // The producer failed: it owns nothing we could release (a pointer left in `out`
        // is not ours).
        return Err(match raised {
            Some(e) => super::python_error(call.into(), py, e),
            None => Error::InvalidExchangeApi {
                type_name: super::type_name(obj),
                reason: "managed_tensor_from_py_object_no_sync failed without an exception",
            },
        });
    }
    if out.is_null() {
        return Err(Error::InvalidExchangeApi {
            type_name: super::type_name(obj),
            reason: "managed_tensor_from_py_object_no_sync returned 0 and no tensor",
        });
    }
    // SAFETY: on success dlpack.h makes `out` an owning DLManagedTensorVersioned* whose
    // ownership passes to the consumer; the producer keeps the struct and the data alive
    // until its deleter runs and lends the memory to this consumer (as for a capsule).
    let tensor =
        unsafe { ManagedTensor::from_raw_versioned_in(out, Some(super::release_with_gil)) }?;
    if let Some(e) = raised {
        // Success with an exception left set: the tensor is released (drop) and the
        // exception reported.
        drop(tensor);
        return Err(super::python_error(call.into(), py, e));
    }
    Ok(tensor)
}

/// The producer's current work stream of `device`, as a DLPack stream value.
fn current_stream(
    obj: &Bound<'_, PyAny>,
    table: Table,
    device: crate::device::Device,
) -> Result<isize> {
    let py = obj.py();
    let mut stream: *mut c_void = std::ptr::null_mut();
    // DLPack's `DLDeviceType` is a C enum (an `int`); every code the guard accepted fits.
    let device_type =
        c_int::try_from(device.device_type).map_err(|_| Error::UnsupportedDevice {
            device_type: device.device_type,
            device_id: device.device_id,
            reason: "the device type does not fit the exchange API's int",
        })?;
    // SAFETY: the GIL is held; `stream` is a valid place for the result.
    let rc = unsafe { (table.current_work_stream)(device_type, device.device_id, &mut stream) };
    if rc != 0 {
        return Err(match PyErr::take(py) {
            Some(e) => super::python_error(
                "__dlpack_c_exchange_api__.current_work_stream".into(),
                py,
                e,
            ),
            None => Error::InvalidExchangeApi {
                type_name: super::type_name(obj),
                reason: "current_work_stream failed without an exception",
            },
        });
    }
    Ok(match (stream.is_null(), device.memory_kind()) {
        (true, MemoryKind::Rocm) => ROCM_DEFAULT_STREAM,
        (true, _) => CUDA_LEGACY_DEFAULT_STREAM,
        (false, _) => stream as isize,
    })
}
