//! Committed MPI derived datatypes for strided layouts and for counts beyond MPI's `int`.
//!
//! Part of [`crate::spec`] (public as `dlpack_mpi::derived`): a strided tensor is described
//! by one derived datatype whose type map visits its elements in logical row-major order
//! (MPI-4.1 §5.1), so MPI reads or writes them in place, with no packing copy:
//!
//! ```text
//! element = unit                      (lanes = 1)   | contiguous(lanes, unit)
//! axis k  = contiguous(extent, inner) (stride = 1 element, innermost only)
//!         | hvector(extent, 1, stride_elems × element bytes, inner)
//! ```
//!
//! nested from the innermost axis out ([`crate::layout::Plan`] has already dropped extent-1
//! axes and merged axes that are contiguous with each other, so a tensor costs as few levels
//! as possible). Strides may be negative or zero (`MPI_Type_create_hvector` takes any
//! stride); displacements are relative to the first element, which is the buffer address.
//!
//! A contiguous message of more than `i32::MAX` units is described as
//! `contiguous(q, contiguous(2^30, unit))` plus, when `r ≠ 0`, `r` units after it (one
//! `MPI_Type_create_struct`), sent with count 1: never a truncated or negative count.
//!
//! Datatypes are committed once per `(unit, lanes, axes)` or `(unit, units)` and cached
//! until `MPI_Finalize`, which frees them through a delete callback on an `MPI_COMM_SELF`
//! attribute (MPI-4.1 §9.5.1); building one needs MPI to be initialized.

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::{Mutex, OnceLock};

use mpi::ffi::{MPI_Aint, MPI_Datatype};
use mpi::raw::AsRaw;

use crate::dtype::MpiUnit;
use crate::error::{Error, Result};
use crate::layout::Axis;

/// Units per block in the large-count form: 2^30.
pub const LARGE_BLOCK_UNITS: u64 = 1 << 30;
/// [`LARGE_BLOCK_UNITS`] as the C `int` count `MPI_Type_contiguous` takes.
const LARGE_BLOCK_INT: c_int = 1 << 30;
const _: () = assert!(LARGE_BLOCK_INT as u64 == LARGE_BLOCK_UNITS);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Strided {
        unit: MpiUnit,
        lanes: u16,
        axes: Vec<Axis>,
    },
    Large {
        unit: MpiUnit,
        units: u64,
    },
}

#[derive(Clone, Copy)]
struct Handle(MPI_Datatype);

// SAFETY: an MPI datatype handle is an opaque value; committed types are immutable and may
// be used from any thread the MPI threading level allows.
unsafe impl Send for Handle {}

fn cache() -> &'static Mutex<HashMap<Key, Handle>> {
    static CACHE: OnceLock<Mutex<HashMap<Key, Handle>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

extern "C" {
    fn dlpack_mpi_on_finalize(hook: extern "C" fn()) -> c_int;
}

/// Frees every cached datatype; run by `MPI_Finalize` (through an `MPI_COMM_SELF` attribute,
/// MPI-4.1 §9.5.1), so that no committed type outlives MPI (MPICH's yaksa engine reports
/// the ones that do as leaked handle-pool objects).
/// The same callback empties the pack scratch pool (`scratch`).
extern "C" fn free_cache_at_finalize() {
    super::scratch::release_all();
    let mut map = cache()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    for (_, mut h) in map.drain() {
        // SAFETY: a committed type this cache created; MPI still works while the
        // attributes of MPI_COMM_SELF are deleted; no spec can use it after finalize.
        unsafe { mpi::ffi::MPI_Type_free(&mut h.0) };
    }
}

/// Registers [`free_cache_at_finalize`] with `MPI_Finalize` once, when MPI is initialized
/// (else nothing: a later call registers it).
pub(crate) fn hook_finalize() {
    static HOOKED: std::sync::Once = std::sync::Once::new();
    if !mpi::environment::is_initialized() || mpi::environment::is_finalized() {
        return;
    }
    HOOKED.call_once(|| {
        // SAFETY: MPI is initialized; the hook is a plain function that lives forever.
        // Failure only means the types stay until the process exits, as before.
        let _ = unsafe { dlpack_mpi_on_finalize(free_cache_at_finalize) };
    });
}

fn cached(key: Key, build: impl FnOnce() -> Result<MPI_Datatype>) -> Result<MPI_Datatype> {
    if !mpi::environment::is_initialized() || mpi::environment::is_finalized() {
        return Err(Error::MpiNotInitialized);
    }
    hook_finalize();
    let mut map = cache()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(h) = map.get(&key) {
        return Ok(h.0);
    }
    let t = build()?;
    map.insert(key, Handle(t));
    Ok(t)
}

/// Number of derived datatypes built so far (for tests of the cache).
pub fn cached_count() -> usize {
    cache()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .len()
}

fn int(value: i64, what: u64) -> Result<c_int> {
    c_int::try_from(value).map_err(|_| Error::CountTooLarge { count: what })
}

/// A type built here, freed on drop unless it is the result.
struct Temp(MPI_Datatype, bool);

impl Drop for Temp {
    fn drop(&mut self) {
        if self.1 {
            // SAFETY: a type this module created and nobody else holds; a type used to build
            // another may be freed (MPI-4.1 §5.1.9).
            unsafe { mpi::ffi::MPI_Type_free(&mut self.0) };
        }
    }
}

/// The committed datatype of one strided tensor: `axes` outermost first (from a
/// [`crate::layout::Plan`]), elements of `lanes` units of `unit`.
///
/// # Errors
/// [`Error::MpiNotInitialized`]; [`Error::CountTooLarge`] when an extent exceeds MPI's
/// `int`; [`Error::Overflow`] when a stride in bytes exceeds `MPI_Aint`.
pub fn strided(unit: MpiUnit, lanes: u16, axes: &[Axis]) -> Result<MPI_Datatype> {
    let elem_bytes = unit.size_bytes() as i128 * i128::from(lanes);
    let elem_bytes_is_one = elem_bytes == 1;
    // Validate before taking the lock or calling MPI.
    let mut sizes = Vec::with_capacity(axes.len());
    for a in axes {
        // Plan extents are ≥ 0 (layout::num_elements); the u64 is only the error's report.
        let extent = int(a.extent, u64::try_from(a.extent).unwrap_or(0))?;
        let stride = i128::from(a.stride_elems) * elem_bytes;
        let stride = MPI_Aint::try_from(stride).map_err(|_| Error::Overflow {
            quantity: "stride in bytes",
            lhs: a.stride_elems.into(),
            operator: "*",
            rhs: elem_bytes,
        })?;
        sizes.push((extent, stride, a.stride_elems == 1));
    }
    let key = Key::Strided {
        unit,
        lanes,
        axes: axes.to_vec(),
    };
    cached(key, || {
        let unit_type = unit.datatype().as_raw();
        let mut current = Temp(unit_type, false);
        if lanes > 1 {
            let mut t: MPI_Datatype = unit_type;
            // SAFETY: valid predefined old type; `t` receives the new handle.
            unsafe { mpi::ffi::MPI_Type_contiguous(c_int::from(lanes), unit_type, &mut t) };
            current = Temp(t, true);
        }
        let innermost = sizes.len().saturating_sub(1);
        for (i, &(extent, stride, unit_stride)) in sizes.iter().enumerate().rev() {
            let mut t: MPI_Datatype = unit_type;
            if i == innermost && unit_stride {
                // SAFETY: valid old type; `t` receives the new handle.
                unsafe { mpi::ffi::MPI_Type_contiguous(extent, current.0, &mut t) };
            } else if i == innermost && stride == -1 && elem_bytes_is_one {
                // Open MPI 4.1 builds hvector(n, 1, -1 byte, <1-byte type>) as a *forward*
                // contiguous run (it reads and writes past the buffer); found by
                // `dlpack-mpi check --layout negative`. Spell the reversed run out instead
                // (MPICH 4.0 builds the hvector correctly; the spelled-out type is right in
                // both, so it is used whatever the library).
                t = reversed_bytes(extent, current.0)?;
            } else {
                // SAFETY: valid old type; any stride is allowed (MPI-4.1 §5.1.2).
                unsafe { mpi::ffi::MPI_Type_create_hvector(extent, 1, stride, current.0, &mut t) };
            }
            current = Temp(t, true);
        }
        // SAFETY: `current` is a type built above.
        unsafe { mpi::ffi::MPI_Type_commit(&mut current.0) };
        current.1 = false; // kept: the cache owns it now
        Ok(current.0)
    })
}

/// `n` one-byte elements going downwards from the first (displacements 0, −1, …), without
/// an hvector of stride −1: hindexed blocks of 2^16 displacements, repeated by an hvector of
/// stride −2^16 bytes, plus the remainder (one struct).
fn reversed_bytes(n: c_int, byte: MPI_Datatype) -> Result<MPI_Datatype> {
    const B: c_int = 1 << 16;
    let block = |len: c_int| -> MPI_Datatype {
        let displacements: Vec<MPI_Aint> = (0..len).map(|k| -(k as MPI_Aint)).collect();
        let mut t = byte;
        // SAFETY: `len` displacements as the count says; valid old type.
        unsafe {
            mpi::ffi::MPI_Type_create_hindexed_block(len, 1, displacements.as_ptr(), byte, &mut t)
        };
        t
    };
    if n <= B {
        return Ok(block(n));
    }
    let (q, r) = (n / B, n % B);
    let full = Temp(block(B), true);
    let mut body = byte;
    // SAFETY: valid old type; the stride is -2^16 bytes (not the -1 that trips Open MPI).
    unsafe { mpi::ffi::MPI_Type_create_hvector(q, 1, -(B as MPI_Aint), full.0, &mut body) };
    if r == 0 {
        return Ok(body);
    }
    let body = Temp(body, true);
    let tail = Temp(block(r), true);
    let lengths: [c_int; 2] = [1, 1];
    let displacements: [MPI_Aint; 2] = [0, -((q as MPI_Aint) * (B as MPI_Aint))];
    let types: [MPI_Datatype; 2] = [body.0, tail.0];
    let mut t = byte;
    // SAFETY: arrays of length 2 as the count says; valid old types.
    unsafe {
        mpi::ffi::MPI_Type_create_struct(
            2,
            lengths.as_ptr(),
            displacements.as_ptr(),
            types.as_ptr(),
            &mut t,
        )
    };
    Ok(t)
}

/// The committed datatype of `units` consecutive units (for `units > i32::MAX`), sent with
/// count 1.
///
/// # Errors
/// [`Error::MpiNotInitialized`]; [`Error::CountTooLarge`] beyond `2^30 × i32::MAX` units.
pub fn large_contiguous(unit: MpiUnit, units: u64) -> Result<MPI_Datatype> {
    let blocks = units / LARGE_BLOCK_UNITS;
    let rest = units % LARGE_BLOCK_UNITS;
    let blocks_int = c_int::try_from(blocks).map_err(|_| Error::CountTooLarge { count: units })?;
    cached(Key::Large { unit, units }, || {
        let unit_type = unit.datatype().as_raw();
        let mut block: MPI_Datatype = unit_type;
        // SAFETY: valid predefined old type.
        unsafe { mpi::ffi::MPI_Type_contiguous(LARGE_BLOCK_INT, unit_type, &mut block) };
        let block = Temp(block, true);
        let mut all: MPI_Datatype = unit_type;
        // SAFETY: valid old type.
        unsafe { mpi::ffi::MPI_Type_contiguous(blocks_int, block.0, &mut all) };
        let mut result = Temp(all, true);
        if rest > 0 {
            let lengths: [c_int; 2] = [1, rest as c_int];
            let tail_bytes = blocks as i128 * LARGE_BLOCK_UNITS as i128 * unit.size_bytes() as i128;
            let displacements: [MPI_Aint; 2] = [
                0,
                MPI_Aint::try_from(tail_bytes)
                    .map_err(|_| Error::CountTooLarge { count: units })?,
            ];
            let types: [MPI_Datatype; 2] = [result.0, unit_type];
            let mut s: MPI_Datatype = unit_type;
            // SAFETY: arrays of length 2 as the count says; valid old types.
            unsafe {
                mpi::ffi::MPI_Type_create_struct(
                    2,
                    lengths.as_ptr(),
                    displacements.as_ptr(),
                    types.as_ptr(),
                    &mut s,
                )
            };
            result = Temp(s, true);
        }
        // SAFETY: a type built above.
        unsafe { mpi::ffi::MPI_Type_commit(&mut result.0) };
        result.1 = false;
        Ok(result.0)
    })
}
