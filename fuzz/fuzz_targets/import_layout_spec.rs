//! Fuzz target: managed tensors (legacy and versioned) built field by field from arbitrary
//! bytes, run through import, validation, layout planning, dtype lookup and spec building.
//! No MPI call is made: MPI is never initialized, so strided and large-count specs stop at
//! `Error::MpiNotInitialized` after their pure checks (the derived-datatype builder only asks
//! `MPI_Initialized`, which the standard allows before `MPI_Init`).
//!
//! The harness owns every array the `DLTensor` points to (shape and strides have exactly
//! `ndim` entries whenever they are non-NULL), so the library can only read out of bounds
//! through its own fault. `data` may be NULL, a real buffer, or an address nothing owns;
//! such an address is never dereferenced by the pure layers, and the harness reads through
//! the library's slices and offsets only when they lie inside the real buffer.
//!
//! Checked on every input, beyond "no panic, no sanitizer report":
//! - the deleter runs exactly once (0 times when NULL), on success and on every error path;
//! - a legacy and a versioned import of the same fields agree, and so does `TensorView`;
//! - `layout::plan` visits exactly the offsets of the naive nested loops, in order, and its
//!   lowest/highest offsets are the true extremes; no-overlap implies distinct offsets;
//! - contiguity from `check_c_contiguous` agrees with the plan;
//! - a spec's byte range and count match the tensor; a receive spec is never granted for a
//!   read-only, copied or overlapping tensor; ranges and vector blocks stay inside;
//! - `as_slice` returns exactly `num_elements` elements at the first element;
//! - `Owned::with_layout` accepts only layouts whose every element lies in its storage (the
//!   harness reads each element's bytes through the library's plan).
#![no_main]

use std::collections::HashSet;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};

use arbitrary::Arbitrary;
use dlpack_mpi::dlpack::{
    acquire, AcquireOptions, DLDataType, DLDevice, DLManagedTensor, DLManagedTensorVersioned,
    DLPackVersion, DLTensor, ManagedTensor, Owned, Tensor, TensorView,
};
use dlpack_mpi::dtype::{self, DType};
use dlpack_mpi::layout;
use dlpack_mpi::spec::{RecvSpec, SendSpec};
// Deprecated, still fuzzed while they exist.
#[allow(deprecated)]
use dlpack_mpi::spec::{VectorRecvSpec, VectorSendSpec};
use dlpack_mpi::Error;
use libfuzzer_sys::fuzz_target;
use mpi::datatype::{Collection, Pointer};

/// Largest `ndim` for which the harness allocates real shape/strides arrays.
const MAX_ARRAY_NDIM: i64 = 4096;
/// Largest element count for which offsets are enumerated.
const MAX_ENUMERATED: i64 = 4096;

#[derive(Arbitrary, Debug)]
enum Ndim {
    /// `ndim = shape.len()`.
    FromShape,
    /// Any value, including negative and huge.
    Value(i32),
}

#[derive(Arbitrary, Debug)]
enum Data {
    Null,
    /// The harness's buffer.
    Buffer,
    /// An address nobody owns (never dereferenced).
    Address(u64),
    /// `usize::MAX - k`.
    NearTop(u16),
}

#[derive(Arbitrary, Debug)]
enum Version {
    Current(u32),
    Any(u32, u32),
}

#[derive(Arbitrary, Debug)]
enum Dtype {
    /// One of the dtypes the table knows, with 1..=4 lanes.
    Known(u8, u8),
    Any(u8, u8, u16),
}

#[derive(Arbitrary, Debug)]
struct OwnedInput {
    storage_bytes: u16,
    dtype: Option<(u8, u8, u16)>,
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
    byte_offset: u64,
    read_only: bool,
    copied: bool,
}

#[derive(Arbitrary, Debug)]
struct Input {
    version: Version,
    ndim: Ndim,
    shape: Vec<i64>,
    null_shape: bool,
    /// `None` = NULL strides.
    strides: Option<Vec<i64>>,
    byte_offset: u64,
    dtype: Dtype,
    device: (u8, i32),
    flags: u64,
    data: Data,
    buffer_bytes: u16,
    null_deleter: bool,
    range: (i64, i64),
    blocks: Vec<(i64, i64)>,
    owned: Option<OwnedInput>,
}

const KNOWN: &[(u8, u8)] = &[
    (0, 8),
    (0, 16),
    (0, 32),
    (0, 64),
    (1, 8),
    (1, 16),
    (1, 32),
    (1, 64),
    (2, 16),
    (2, 32),
    (2, 64),
    (4, 16),
    (5, 32),
    (5, 64),
    (5, 128),
    (6, 8),
    (7, 8),
    (18, 32),
];

/// Everything the `DLTensor` points to, owned here.
struct Arrays {
    buffer: Vec<u64>,
    shape: Vec<i64>,
    strides: Vec<i64>,
}

/// Fills `n` entries from `values` (cycled), or with `fill` when `values` is empty.
fn cycled(values: &[i64], n: usize, fill: i64) -> Vec<i64> {
    (0..n)
        .map(|i| {
            if values.is_empty() {
                fill
            } else {
                values[i % values.len()]
            }
        })
        .collect()
}

fn build(input: &Input, arrays: &mut Arrays) -> DLTensor {
    let ndim: i32 = match input.ndim {
        Ndim::FromShape => input.shape.len().min(i32::MAX as usize) as i32,
        Ndim::Value(n) => n,
    };
    let n = i64::from(ndim).clamp(0, MAX_ARRAY_NDIM) as usize;
    arrays.shape = cycled(&input.shape, n, 1);
    arrays.strides = match &input.strides {
        Some(s) => cycled(s, n, 1),
        None => Vec::new(),
    };
    // A non-NULL array always has `ndim` entries: beyond what the harness allocates, the
    // arrays are NULL (still a valid test of "huge ndim").
    let arrays_fit = i64::from(ndim) <= MAX_ARRAY_NDIM;
    let data = match input.data {
        Data::Null => std::ptr::null_mut(),
        Data::Buffer => arrays.buffer.as_mut_ptr().cast::<c_void>(),
        Data::Address(a) => std::ptr::without_provenance_mut(a as usize),
        Data::NearTop(k) => std::ptr::without_provenance_mut(usize::MAX - usize::from(k)),
    };
    let (code, bits, lanes) = match input.dtype {
        Dtype::Known(i, l) => {
            let (c, b) = KNOWN[usize::from(i) % KNOWN.len()];
            (c, b, u16::from(l % 4) + 1)
        }
        Dtype::Any(c, b, l) => (c, b, l),
    };
    DLTensor {
        data,
        device: DLDevice {
            device_type: u32::from(input.device.0 % 16),
            device_id: input.device.1,
        },
        ndim,
        dtype: DLDataType { code, bits, lanes },
        shape: if input.null_shape || !arrays_fit {
            std::ptr::null_mut()
        } else {
            arrays.shape.as_mut_ptr()
        },
        strides: if input.strides.is_none() || !arrays_fit {
            std::ptr::null_mut()
        } else {
            arrays.strides.as_mut_ptr()
        },
        byte_offset: input.byte_offset,
    }
}

unsafe extern "C" fn count_versioned(p: *mut DLManagedTensorVersioned) {
    // SAFETY: manager_ctx is the harness's counter, alive until after the guard is gone.
    let c = unsafe { &*(*p).manager_ctx.cast::<AtomicUsize>() };
    c.fetch_add(1, Ordering::SeqCst);
}

unsafe extern "C" fn count_legacy(p: *mut DLManagedTensor) {
    // SAFETY: as above.
    let c = unsafe { &*(*p).manager_ctx.cast::<AtomicUsize>() };
    c.fetch_add(1, Ordering::SeqCst);
}

/// Whether `[ptr, ptr + bytes)` lies inside the harness buffer.
fn inside(arrays: &Arrays, ptr: usize, bytes: usize) -> bool {
    let start = arrays.buffer.as_ptr() as usize;
    let end = start + arrays.buffer.len() * 8;
    ptr >= start && ptr.checked_add(bytes).is_some_and(|e| e <= end)
}

/// Offsets of the naive nested loops over `shape`/`strides` (row-major), or `None` when
/// there are too many elements or the arithmetic overflows.
fn naive_offsets(shape: &[i64], strides: &[i64]) -> Option<Vec<i64>> {
    let n = shape.iter().try_fold(1i64, |a, &e| a.checked_mul(e))?;
    if !(0..=MAX_ENUMERATED).contains(&n) {
        return None;
    }
    let mut out = Vec::with_capacity(n as usize);
    let mut index = vec![0i64; shape.len()];
    for _ in 0..n {
        let mut off = 0i64;
        for (i, &s) in index.iter().zip(strides) {
            off = off.checked_add(i.checked_mul(s)?)?;
        }
        out.push(off);
        for axis in (0..shape.len()).rev() {
            index[axis] += 1;
            if index[axis] < shape[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
    Some(out)
}

fn check_layout(shape: &[i64], strides: Option<&[i64]>) {
    let plan = layout::plan(shape, strides);
    let contiguous = layout::check_c_contiguous(shape, strides);
    let no_overlap = layout::check_no_overlap(shape, strides);
    let Ok(plan) = plan else {
        return;
    };
    assert_eq!(Ok(plan.len_elems), layout::num_elements(shape));
    if contiguous.is_ok() && plan.len_elems > 0 {
        assert!(plan.is_contiguous(), "C-contiguous but plan {plan:?}");
    }
    if let Err(Error::NonContiguous { .. }) = contiguous {
        assert!(!plan.is_contiguous(), "non-contiguous but plan {plan:?}");
    }
    let compact;
    let strides = match strides {
        Some(s) => s,
        None => {
            compact = layout::compact_strides(shape).expect("plan succeeded");
            &compact
        }
    };
    let Some(naive) = naive_offsets(shape, strides) else {
        return;
    };
    let offsets: Vec<i64> = plan.offsets().collect();
    assert_eq!(offsets, naive, "plan {plan:?} visits other offsets");
    if let (Some(&lo), Some(&hi)) = (naive.iter().min(), naive.iter().max()) {
        if plan.len_elems > 1 {
            assert_eq!(
                (plan.lowest_elem, plan.highest_elem),
                (lo.min(0), hi.max(0))
            );
        }
    }
    if no_overlap.is_ok() {
        let distinct: HashSet<i64> = naive.iter().copied().collect();
        assert_eq!(distinct.len(), naive.len(), "overlapping layout accepted");
    }
}

/// Reads a contiguous tensor through `as_slice` with the Rust type of its dtype.
fn check_slices(t: &ManagedTensor<'_>, arrays: &Arrays) {
    macro_rules! try_type {
        ($t:ty) => {
            if let Ok(s) = t.as_slice::<$t>() {
                assert_eq!(s.len() as i64, t.num_elements());
                if !s.is_empty() {
                    assert_eq!(s.as_ptr() as usize, t.first_element_ptr() as usize);
                    if inside(arrays, s.as_ptr() as usize, std::mem::size_of_val(s)) {
                        std::hint::black_box(
                            s.iter()
                                .fold(0u8, |a, x| a ^ x.to_le_bytes().iter().fold(0, |b, y| b ^ y)),
                        );
                    }
                }
            }
        };
    }
    try_type!(u8);
    try_type!(i8);
    try_type!(u16);
    try_type!(i32);
    try_type!(u32);
    try_type!(i64);
    try_type!(u64);
    try_type!(f32);
    try_type!(f64);
}

#[allow(deprecated)] // VectorSendSpec, VectorRecvSpec
fn check_specs(t: &mut ManagedTensor<'_>, input: &Input) {
    let n = t.num_elements();
    let lookup = dtype::lookup(t.dtype());
    if let Ok(e) = &lookup {
        assert_eq!(Some(e.size_bytes()), t.dtype().size_bytes());
    }
    match SendSpec::new(&*t) {
        Ok(s) => {
            let e = lookup.expect("a spec needs a known dtype");
            assert!(t.device().check_host_accessible().is_ok());
            assert_eq!(s.len_elems(), n);
            let (lo, hi) = s.byte_range();
            assert!(lo <= hi);
            if n == 0 {
                assert!(s.pointer().is_null(), "empty spec must be NULL");
                assert_eq!(s.count(), 0);
            } else {
                assert_eq!(s.pointer() as usize, t.first_element_ptr() as usize);
            }
            if s.is_contiguous() {
                assert_eq!(hi - lo, n as usize * e.size_bytes());
                if !s.is_derived() {
                    assert_eq!(
                        i64::from(s.count()),
                        n * e.units_per_element() as i64,
                        "contiguous count"
                    );
                }
            }
            let (d, c) = input.range;
            if let Ok(r) = SendSpec::range(&*t, d, c) {
                assert!(d >= 0 && c >= 0 && i128::from(d) + i128::from(c) <= i128::from(n));
                assert_eq!(r.len_elems(), c);
            }
            if let Ok(r) = s.range_of(d, c) {
                assert!(d >= 0 && c >= 0 && i128::from(d) + i128::from(c) <= i128::from(n));
                assert_eq!(r.len_elems(), c);
            }
            let counts: Vec<i64> = input.blocks.iter().map(|b| b.0).collect();
            let displs: Vec<i64> = input.blocks.iter().map(|b| b.1).collect();
            if VectorSendSpec::new(s, &counts, &displs).is_ok() {
                for (&c, &d) in counts.iter().zip(&displs) {
                    assert!(
                        c >= 0 && d >= 0 && i128::from(c) + i128::from(d) <= i128::from(n),
                        "block ({c}, {d}) of {n}"
                    );
                }
            }
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
    let read_only = t.is_read_only();
    let copied = t.is_copied();
    let overlap = layout::check_no_overlap(t.shape(), t.strides_elems());
    match RecvSpec::new(&mut *t) {
        Ok(r) => {
            assert!(
                !read_only && !copied,
                "receive spec for a read-only/copied tensor"
            );
            assert!(overlap.is_ok(), "receive spec for an overlapping layout");
            assert_eq!(r.len_elems(), n);
            let counts: Vec<i64> = input.blocks.iter().map(|b| b.0).collect();
            let displs: Vec<i64> = input.blocks.iter().map(|b| b.1).collect();
            if let Ok(v) = VectorRecvSpec::new(r, &counts, &displs) {
                let mut blocks: Vec<(i64, i64)> = counts
                    .iter()
                    .zip(&displs)
                    .filter(|(&c, _)| c > 0)
                    .map(|(&c, &d)| (d, d + c))
                    .collect();
                blocks.sort_unstable();
                for w in blocks.windows(2) {
                    assert!(w[0].1 <= w[1].0, "receive blocks overlap: {blocks:?}");
                }
                assert!(blocks.iter().all(|&(_, end)| end <= n));
                let _ = v.spec().len_elems();
            }
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
    if let Ok(r) = RecvSpec::range(&mut *t, input.range.0, input.range.1) {
        assert_eq!(r.len_elems(), input.range.1);
    }
}

/// Every accessor and check on an imported tensor.
fn exercise(t: &mut ManagedTensor<'_>, input: &Input, arrays: &Arrays) {
    let _ = format!("{t:?}");
    assert!(t.ndim() <= MAX_ARRAY_NDIM as usize || t.shape().is_empty());
    check_layout(t.shape(), t.strides_elems());
    check_slices(t, arrays);
    check_specs(t, input);
}

fn run_versioned(input: &Input) -> Result<(), Error> {
    let mut arrays = Arrays {
        buffer: vec![0x5a5a_5a5a_5a5a_5a5a; usize::from(input.buffer_bytes) / 8 + 1],
        shape: Vec::new(),
        strides: Vec::new(),
    };
    let counter = AtomicUsize::new(0);
    let dl_tensor = build(input, &mut arrays);
    let version = match input.version {
        Version::Current(minor) => DLPackVersion { major: 1, minor },
        Version::Any(major, minor) => DLPackVersion { major, minor },
    };
    let managed = Box::into_raw(Box::new(DLManagedTensorVersioned {
        version,
        manager_ctx: std::ptr::from_ref(&counter).cast_mut().cast(),
        deleter: if input.null_deleter {
            None
        } else {
            Some(count_versioned)
        },
        flags: input.flags,
        dl_tensor,
    }));
    let expected = usize::from(!input.null_deleter);
    // SAFETY: a struct built just now whose arrays have `ndim` entries when non-NULL and
    // live until the end of this function; the harness frees it after the guard is gone.
    let result = unsafe { ManagedTensor::from_raw_versioned(managed) };
    let outcome = match result {
        Ok(mut t) => {
            assert_eq!(version.major, 1);
            assert_eq!(t.version(), Some((1, version.minor)));
            exercise(&mut t, input, &arrays);
            assert_eq!(counter.load(Ordering::SeqCst), 0, "deleter ran early");
            drop(t);
            Ok(())
        }
        Err(e) => Err(e),
    };
    assert_eq!(counter.load(Ordering::SeqCst), expected, "deleter count");
    // SAFETY: the guard is gone and never frees the struct (the deleter only counts).
    drop(unsafe { Box::from_raw(managed) });
    outcome
}

fn run_legacy(input: &Input) -> Result<(), Error> {
    let mut arrays = Arrays {
        buffer: vec![0x5a5a_5a5a_5a5a_5a5a; usize::from(input.buffer_bytes) / 8 + 1],
        shape: Vec::new(),
        strides: Vec::new(),
    };
    let counter = AtomicUsize::new(0);
    let dl_tensor = build(input, &mut arrays);
    let managed = Box::into_raw(Box::new(DLManagedTensor {
        dl_tensor,
        manager_ctx: std::ptr::from_ref(&counter).cast_mut().cast(),
        deleter: if input.null_deleter {
            None
        } else {
            Some(count_legacy)
        },
    }));
    // SAFETY: as in run_versioned.
    let result = unsafe { ManagedTensor::from_raw_legacy(managed) };
    let outcome = match result {
        Ok(mut t) => {
            assert_eq!(t.flags(), 0);
            exercise(&mut t, input, &arrays);
            drop(t);
            Ok(())
        }
        Err(e) => Err(e),
    };
    assert_eq!(
        counter.load(Ordering::SeqCst),
        usize::from(!input.null_deleter),
        "legacy deleter count"
    );
    // SAFETY: as in run_versioned.
    drop(unsafe { Box::from_raw(managed) });
    outcome
}

fn run_view(input: &Input) -> Result<(), Error> {
    let mut arrays = Arrays {
        buffer: vec![0; usize::from(input.buffer_bytes) / 8 + 1],
        shape: Vec::new(),
        strides: Vec::new(),
    };
    let mut dl_tensor = build(input, &mut arrays);
    // SAFETY: the struct and its arrays outlive the view, which is dropped in this scope.
    let view = unsafe { TensorView::from_raw(&mut dl_tensor) }?;
    let _ = format!("{view:?}");
    let _ = SendSpec::new(&view);
    Ok(())
}

/// The built-in writable exporter with a fuzzed layout: every element it exports must lie
/// inside its storage.
fn run_owned(o: &OwnedInput) {
    let mut owned = Owned::new(vec![0xa5u8; usize::from(o.storage_bytes)]);
    if let Some((code, bits, lanes)) = o.dtype {
        match owned.with_dtype(DType { code, bits, lanes }) {
            Ok(x) => owned = x,
            Err(_) => return,
        }
    }
    let Ok(mut owned) = owned.with_layout(&o.shape, o.strides.as_deref(), o.byte_offset) else {
        return;
    };
    if o.read_only {
        owned = owned.read_only();
    }
    if o.copied {
        owned = owned.copied();
    }
    let (start, end) = {
        let s = owned.as_slice();
        (s.as_ptr() as usize, s.as_ptr() as usize + s.len())
    };
    {
        let Ok(mut t) = acquire(&owned, &AcquireOptions::default()) else {
            return;
        };
        let elem = t.dtype().size_bytes().expect("with_dtype checked the size");
        if let Ok(plan) = layout::plan(t.shape(), t.strides_elems()) {
            if plan.len_elems > 0 {
                let first = t.first_element_ptr() as usize;
                let lo = first as i128 + i128::from(plan.lowest_elem) * elem as i128;
                let hi = first as i128 + (i128::from(plan.highest_elem) + 1) * elem as i128;
                assert!(
                    lo >= start as i128 && hi <= end as i128,
                    "exported elements [{lo}, {hi}) leave the storage [{start}, {end})"
                );
                if plan.len_elems <= MAX_ENUMERATED {
                    let base = t.first_element_ptr().cast::<u8>();
                    for off in plan.offsets() {
                        let p = base.wrapping_offset(off as isize * elem as isize);
                        // SAFETY: inside the storage (asserted above for the extremes).
                        std::hint::black_box(unsafe { p.read() });
                    }
                }
            }
        }
        let _ = SendSpec::new(&t);
        if let Ok(r) = RecvSpec::new(&mut t) {
            assert!(!o.read_only && !o.copied);
            let _ = r.byte_range();
        }
        if let Ok(s) = t.as_slice::<u8>() {
            std::hint::black_box(s.iter().fold(0u8, |a, &b| a ^ b));
        }
    }
    let _ = owned.into_vec();
}

fuzz_target!(|input: Input| {
    let v1 = run_versioned(&input);
    let v0 = run_legacy(&input);
    // The struct kind is never guessed: the same fields give the same verdict, unless the
    // versioned struct was refused for its version.
    let current =
        matches!(input.version, Version::Current(_)) || matches!(input.version, Version::Any(1, _));
    if current {
        // Each run has its own buffer, so compare the kind of outcome (addresses differ).
        assert_eq!(
            v1.as_ref().map_err(std::mem::discriminant),
            v0.as_ref().map_err(std::mem::discriminant),
            "legacy and versioned imports disagree: {v1:?} vs {v0:?}"
        );
        let view = run_view(&input);
        if v0.is_ok() {
            assert!(
                view.is_ok(),
                "view refused what the guard accepted: {view:?}"
            );
        }
    } else {
        assert!(
            matches!(v1, Err(Error::UnsupportedVersion { .. })),
            "{v1:?}"
        );
    }
    if let Some(o) = &input.owned {
        run_owned(o);
    }
});
