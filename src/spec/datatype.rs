//! Committed MPI derived datatypes for strided layouts and for counts beyond MPI's `int`.
//!
//! Part of [`crate::spec`]: a strided tensor is described
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
//! An axis of more than `i32::MAX` elements (alone or merged, e.g. a stride-0 broadcast
//! `[65536, 32768]`) is split into nested blocks of 2^30 elements:
//!
//! ```text
//! axis k  = struct{ hvector(q, 1, 2^30 × stride bytes, <axis of 2^30>) at 0,
//!                   <axis of r> at q × 2^30 × stride bytes }     (extent = q·2^30 + r)
//! ```
//!
//! A contiguous message of more than `i32::MAX` units is described as
//! `contiguous(q, contiguous(2^30, unit))` plus, when `r ≠ 0`, `r` units after it (one
//! `MPI_Type_create_struct`), sent with count 1: never a truncated or negative count.
//!
//! Datatypes are committed once per `(unit, lanes, axes)` or `(unit, units)` and cached
//! until `MPI_Finalize`, which frees them (the cache is a registry of `lifecycle`,
//! whose hook is a delete callback on an `MPI_COMM_SELF` attribute, MPI-4.1 §9.5.1);
//! building one needs MPI to be initialized.

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::{Mutex, OnceLock};

use mpi::ffi::{MPI_Aint, MPI_Datatype};
use mpi::raw::AsRaw;

use crate::dtype::MpiUnit;
use crate::error::{Error, Result};
use crate::layout::Axis;
use crate::lifecycle::Registry;

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

/// The cache as a registry of [`crate::lifecycle`]: `MPI_Finalize` frees its types.
static CACHE_REGISTRY: Registry = Registry::new(free_cache);

/// Frees every cached datatype; run by `MPI_Finalize` ([`crate::lifecycle`]), so that no
/// committed type outlives MPI (MPICH's yaksa engine reports the ones that do as leaked
/// handle-pool objects).
fn free_cache() {
    let mut map = cache()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    for (_, mut h) in map.drain() {
        // SAFETY: a committed type this cache created; MPI still works while the
        // attributes of MPI_COMM_SELF are deleted; no spec can use it after finalize.
        unsafe { mpi::ffi::MPI_Type_free(&mut h.0) };
    }
}

fn cached(key: Key, build: impl FnOnce() -> Result<MPI_Datatype>) -> Result<MPI_Datatype> {
    if !mpi::environment::is_initialized() || mpi::environment::is_finalized() {
        return Err(Error::MpiNotInitialized);
    }
    CACHE_REGISTRY.enlist();
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

/// How one axis is described: in one level (`Whole`: its extent fits MPI's `int`), or,
/// beyond `int`, split into nested blocks of [`LARGE_BLOCK_UNITS`] elements:
/// `hvector(blocks, 1, block_stride_bytes, <2^30 elements of the axis>)` plus, when
/// `rest ≠ 0`, the last `rest` elements at `rest_at_bytes` (one `MPI_Type_create_struct`).
/// `blocks × 2^30 + rest` is the extent, so the type map visits exactly the same elements
/// in the same order as one level would.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AxisForm {
    /// `extent` elements in one level.
    Whole(c_int),
    /// `blocks` blocks of 2^30 elements, then `rest` elements.
    Split {
        /// Number of whole blocks (≥ 1).
        blocks: c_int,
        /// Elements after them (< 2^30).
        rest: c_int,
        /// Bytes from one block's first element to the next's (`2^30 × stride`).
        block_stride_bytes: MPI_Aint,
        /// Bytes from the axis's first element to the rest's first (`blocks × 2^30 ×
        /// stride`).
        rest_at_bytes: MPI_Aint,
    },
}

/// The [`AxisForm`] of an axis of `extent` elements (≥ 0), `stride_bytes` apart (any
/// sign; the caller has checked that it fits `MPI_Aint`).
///
/// # Errors
/// [`Error::CountTooLarge`] when even the number of 2^30-element blocks exceeds `int`
/// (an extent of 2^61 or more); [`Error::Overflow`] when the blocks' byte distances
/// exceed `MPI_Aint`.
pub(crate) fn axis_form(extent: i64, stride_bytes: i128) -> Result<AxisForm> {
    if let Ok(n) = c_int::try_from(extent) {
        return Ok(AxisForm::Whole(n));
    }
    let block = i64::from(LARGE_BLOCK_INT);
    let count = u64::try_from(extent).unwrap_or(0);
    let blocks = int(extent / block, count)?;
    // The remainder is below 2^30, so it fits an int.
    let rest = int(extent % block, count)?;
    let bytes = |elems: i128| {
        MPI_Aint::try_from(elems * stride_bytes).map_err(|_| Error::Overflow {
            quantity: "byte distance of a split axis (elements × stride in bytes)",
            lhs: elems,
            operator: "*",
            rhs: stride_bytes,
        })
    };
    Ok(AxisForm::Split {
        blocks,
        rest,
        block_stride_bytes: bytes(i128::from(block))?,
        rest_at_bytes: bytes(i128::from(blocks) * i128::from(block))?,
    })
}

/// The committed datatype of one strided tensor: `axes` outermost first (from a
/// [`crate::layout::Plan`]), elements of `lanes` units of `unit`. An axis longer than
/// MPI's `int` (a single long axis, or axes the plan merged, e.g. a broadcast
/// `[65536, 32768]` with strides `[0, 0]`) is split into nested blocks of 2^30 elements
/// (see the module docs).
///
/// # Errors
/// [`Error::MpiNotInitialized`]; [`Error::CountTooLarge`] when an extent is 2^61 elements
/// or more; [`Error::Overflow`] when a stride in bytes exceeds `MPI_Aint`.
pub fn strided(unit: MpiUnit, lanes: u16, axes: &[Axis]) -> Result<MPI_Datatype> {
    let elem_bytes = unit.size_bytes() as i128 * i128::from(lanes);
    let elem_bytes_is_one = elem_bytes == 1;
    // Validate before taking the lock or calling MPI.
    let mut levels = Vec::with_capacity(axes.len());
    let innermost = axes.len().saturating_sub(1);
    for (i, a) in axes.iter().enumerate() {
        let stride_bytes = i128::from(a.stride_elems) * elem_bytes;
        let stride = MPI_Aint::try_from(stride_bytes).map_err(|_| Error::Overflow {
            quantity: "stride in bytes",
            lhs: a.stride_elems.into(),
            operator: "*",
            rhs: elem_bytes,
        })?;
        let kind = if i == innermost && a.stride_elems == 1 {
            Level::Run
        } else if i == innermost && stride == -1 && elem_bytes_is_one {
            Level::ReversedBytes
        } else {
            Level::Strided(stride)
        };
        levels.push((axis_form(a.extent, stride_bytes)?, kind));
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
        for &(form, kind) in levels.iter().rev() {
            current = Temp(axis_type(form, kind, current.0)?, true);
        }
        // SAFETY: `current` is a type built above.
        unsafe { mpi::ffi::MPI_Type_commit(&mut current.0) };
        current.1 = false; // kept: the cache owns it now
        Ok(current.0)
    })
}

/// How the elements of one level follow each other.
#[derive(Debug, Clone, Copy)]
enum Level {
    /// One run (the innermost axis, stride 1 element): `MPI_Type_contiguous`.
    Run,
    /// One-byte elements going downwards (the innermost axis, stride −1 byte).
    ReversedBytes,
    /// `MPI_Type_create_hvector` with this stride in bytes (any sign, or 0).
    Strided(MPI_Aint),
}

/// `n` elements of type `inner` in the form `kind` gives.
fn level(n: c_int, kind: Level, inner: MPI_Datatype) -> Result<MPI_Datatype> {
    let mut t: MPI_Datatype = inner;
    match kind {
        // SAFETY: valid old type; `t` receives the new handle.
        Level::Run => unsafe { mpi::ffi::MPI_Type_contiguous(n, inner, &mut t) },
        // Open MPI 4.1 builds hvector(n, 1, -1 byte, <1-byte type>) as a *forward*
        // contiguous run (it reads and writes past the buffer); found by
        // `dlpack-mpi check --layout negative`. Spell the reversed run out instead
        // (MPICH 4.0 builds the hvector correctly; the spelled-out type is right in
        // both, so it is used whatever the library).
        Level::ReversedBytes => return reversed_bytes(n, inner),
        // SAFETY: valid old type; any stride is allowed (MPI-4.1 §5.1.2).
        Level::Strided(stride) => unsafe {
            mpi::ffi::MPI_Type_create_hvector(n, 1, stride, inner, &mut t)
        },
    };
    Ok(t)
}

/// The type of one axis of elements of type `inner`: one [`level`], or for a split axis
/// (MPI-4.1 §5.1.2, §5.1.7) `hvector(blocks, 1, block_stride, level(2^30))` and the rest
/// at its displacement, in one struct.
fn axis_type(form: AxisForm, kind: Level, inner: MPI_Datatype) -> Result<MPI_Datatype> {
    let (blocks, rest, block_stride, rest_at) = match form {
        AxisForm::Whole(n) => return level(n, kind, inner),
        AxisForm::Split {
            blocks,
            rest,
            block_stride_bytes,
            rest_at_bytes,
        } => (blocks, rest, block_stride_bytes, rest_at_bytes),
    };
    let block = Temp(level(LARGE_BLOCK_INT, kind, inner)?, true);
    blocks_then_rest(blocks, &block, block_stride, rest, rest_at, |n| {
        level(n, kind, inner)
    })
}

/// `blocks` copies of `block`, `block_stride` bytes apart (one hvector, MPI-4.1 §5.1.2),
/// then, when `rest ≠ 0`, `tail(rest)` at `rest_at` bytes (one struct): a run too long for
/// one level, as blocks and a remainder.
fn blocks_then_rest(
    blocks: c_int,
    block: &Temp,
    block_stride: MPI_Aint,
    rest: c_int,
    rest_at: MPI_Aint,
    tail: impl FnOnce(c_int) -> Result<MPI_Datatype>,
) -> Result<MPI_Datatype> {
    let mut body: MPI_Datatype = block.0;
    // SAFETY: valid old type; any stride is allowed (MPI-4.1 §5.1.2; `reversed_bytes`
    // passes -2^16 bytes, not the -1 that trips Open MPI).
    unsafe { mpi::ffi::MPI_Type_create_hvector(blocks, 1, block_stride, block.0, &mut body) };
    if rest == 0 {
        return Ok(body);
    }
    let body = Temp(body, true);
    let tail = Temp(tail(rest)?, true);
    Ok(first_then(body.0, 1, tail.0, rest_at))
}

/// `struct{ first at 0, count × second at second_at bytes }` (MPI-4.1 §5.1.2): how a long
/// run puts its remainder after its blocks.
fn first_then(
    first: MPI_Datatype,
    count: c_int,
    second: MPI_Datatype,
    second_at: MPI_Aint,
) -> MPI_Datatype {
    let lengths: [c_int; 2] = [1, count];
    let displacements: [MPI_Aint; 2] = [0, second_at];
    let types: [MPI_Datatype; 2] = [first, second];
    let mut t: MPI_Datatype = first;
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
    t
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
    let rest_at = -((q as MPI_Aint) * (B as MPI_Aint));
    blocks_then_rest(q, &full, -(B as MPI_Aint), r, rest_at, |n| Ok(block(n)))
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
            let tail_bytes = blocks as i128 * LARGE_BLOCK_UNITS as i128 * unit.size_bytes() as i128;
            let tail_at = MPI_Aint::try_from(tail_bytes)
                .map_err(|_| Error::CountTooLarge { count: units })?;
            let s = first_then(result.0, rest as c_int, unit_type, tail_at);
            result = Temp(s, true);
        }
        // SAFETY: a type built above.
        unsafe { mpi::ffi::MPI_Type_commit(&mut result.0) };
        result.1 = false;
        Ok(result.0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout;

    const B: i64 = 1 << 30;

    /// The elements a form describes, in order of its levels: `blocks × 2^30 + rest`.
    fn elems(form: AxisForm) -> i64 {
        match form {
            AxisForm::Whole(n) => i64::from(n),
            AxisForm::Split { blocks, rest, .. } => i64::from(blocks) * B + i64::from(rest),
        }
    }

    #[test]
    fn axes_up_to_int_stay_whole() {
        for extent in [0, 1, 2, i32::MAX] {
            assert_eq!(
                axis_form(i64::from(extent), 2).unwrap(),
                AxisForm::Whole(extent)
            );
        }
    }

    #[test]
    fn long_axes_split_into_blocks_and_rest() {
        // uint8 [2^31] stride 2: two blocks of 2^30, 2^31 bytes apart, no rest.
        assert_eq!(
            axis_form(1 << 31, 2).unwrap(),
            AxisForm::Split {
                blocks: 2,
                rest: 0,
                block_stride_bytes: 1 << 31,
                rest_at_bytes: 1 << 32,
            }
        );
        // A stride-0 broadcast of 2^31 + 2^15 elements: every distance is 0.
        assert_eq!(
            axis_form((1 << 31) + (1 << 15), 0).unwrap(),
            AxisForm::Split {
                blocks: 2,
                rest: 1 << 15,
                block_stride_bytes: 0,
                rest_at_bytes: 0,
            }
        );
        // i32::MAX + 1 elements of 8 bytes going backwards.
        assert_eq!(
            axis_form(1 << 31, -8).unwrap(),
            AxisForm::Split {
                blocks: 2,
                rest: 0,
                block_stride_bytes: -(8 << 30),
                rest_at_bytes: -(16 << 30),
            }
        );
        // The last extent that splits: (2^31 - 1) blocks and a rest of 2^30 - 1.
        let max = i64::from(i32::MAX) * B + (B - 1);
        let form = axis_form(max, 1).unwrap();
        assert_eq!(elems(form), max);
        for extent in [(1i64 << 31) + 1, 3 << 31, (1 << 40) + 12345, max] {
            let form = axis_form(extent, 3).unwrap();
            assert_eq!(elems(form), extent, "{form:?}");
            let AxisForm::Split {
                blocks,
                rest,
                block_stride_bytes,
                rest_at_bytes,
            } = form
            else {
                panic!("{extent} stays whole");
            };
            assert!((0..B).contains(&i64::from(rest)));
            assert_eq!(block_stride_bytes as i128, i128::from(B) * 3);
            assert_eq!(
                rest_at_bytes as i128,
                i128::from(blocks) * i128::from(B) * 3
            );
        }
    }

    #[test]
    fn splits_beyond_reach_are_typed_errors() {
        let max = i64::from(i32::MAX) * B + (B - 1);
        assert_eq!(
            axis_form(max + 1, 1),
            Err(Error::CountTooLarge {
                count: u64::try_from(max + 1).unwrap()
            })
        );
        assert!(matches!(
            axis_form(1 << 40, i128::from(i64::MAX)),
            Err(Error::Overflow { .. })
        ));
    }

    #[test]
    fn merged_broadcast_axes_make_one_long_axis() {
        // [65536, 32768] with strides [0, 0]: the plan merges them into 2^31 elements, 0 apart.
        let plan = layout::plan(&[65536, 32768], Some(&[0, 0])).unwrap();
        assert_eq!(
            plan.axes,
            vec![Axis {
                extent: 1 << 31,
                stride_elems: 0
            }]
        );
        assert!(matches!(
            axis_form(plan.axes[0].extent, 0).unwrap(),
            AxisForm::Split {
                blocks: 2,
                rest: 0,
                ..
            }
        ));
    }
}
