//! Adversarial inputs for the pure (no-MPI) layers: import, validation, dtype table, layout
//! arithmetic, specs, vector specs and the built-in exporters' builders.
//!
//! The crate promises that bad input never panics, aborts, or reads or writes out of
//! bounds: it is a typed [`Error`] naming the field and value, and an imported tensor's
//! deleter still runs exactly once. Every test asserts the specific outcome.
//!
//! Tests named `regression_...` reproduce defects an adversarial review found (and that are
//! fixed): misaligned or oversized slices, aliasing writable exports, unchecked layout
//! arithmetic, strides of the wrong length. Inputs whose failure mode was an abort (an
//! unsafe precondition violated inside the library) run in a child process (see
//! [`isolated`]) so that a regression fails its own test without taking the harness down.

mod common;

use std::cell::{Cell, RefCell};
use std::ffi::c_void;

use common::{Counter, RawTensor};
use dlpack_mpi::device::{device_type, Device};
use dlpack_mpi::dlpack::{
    acquire, AcquireOptions, DLTensor, DeviceQuery, ExportRequest, Exporter, ManagedTensor, Owned,
    SliceMut, StreamPolicy, Tensor, TensorView,
};
use dlpack_mpi::dtype::{self, DType};
use dlpack_mpi::layout;
use dlpack_mpi::spec::{RecvSpec, SendSpec};
// Deprecated, still tested while they exist.
#[allow(deprecated)]
use dlpack_mpi::spec::{VectorRecvSpec, VectorSendSpec};
use dlpack_mpi::Error;
use mpi::datatype::{Collection, Pointer};

const I32: (u8, u8, u16) = (0, 32, 1);
const U8: (u8, u8, u16) = (1, 8, 1);
const F32: (u8, u8, u16) = (2, 32, 1);
const BOOL: (u8, u8, u16) = (6, 8, 1);

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// Imports `raw` as versioned and as legacy; both must fail with the same error and each
/// must release the tensor exactly once.
fn refused_both(raw: &RawTensor) -> Error {
    let (v1, c1) = raw.import_v1();
    let e1 = v1.expect_err("versioned import must fail");
    assert_eq!(c1.get(), 1, "versioned deleter count after {e1:?}");
    let (v0, c0) = raw.import_v0();
    let e0 = v0.expect_err("legacy import must fail");
    assert_eq!(c0.get(), 1, "legacy deleter count after {e0:?}");
    assert_eq!(e0, e1, "legacy and versioned imports disagree");
    e1
}

/// Imports `raw` as versioned (must succeed), runs `f` on it, drops it and checks that the
/// deleter ran exactly once (and not before the drop).
fn with_tensor<R>(raw: &RawTensor, f: impl FnOnce(&mut ManagedTensor<'static>) -> R) -> R {
    let (t, c) = raw.import_v1();
    let mut t = t.expect("import must succeed");
    let out = f(&mut t);
    assert_eq!(c.get(), 0, "deleter ran while the tensor was alive");
    drop(t);
    assert_eq!(c.get(), 1, "deleter must run exactly once");
    out
}

/// The error `SendSpec::new` gives for `raw` (imported as versioned, released once).
fn send_err(raw: &RawTensor) -> Error {
    with_tensor(raw, |t| {
        SendSpec::new(&*t).expect_err("send spec must be refused")
    })
}

/// The error `RecvSpec::new` gives for `raw` (imported as versioned, released once).
fn recv_err(raw: &RawTensor) -> Error {
    with_tensor(raw, |t| {
        RecvSpec::new(t).expect_err("recv spec must be refused")
    })
}

const CHILD_ENV: &str = "DLPACK_MPI_HOSTILE_CHILD";

/// Runs `body` in a child process: this test binary, filtered to exactly the test `name`,
/// with an environment variable telling that test to run `body` itself. The parent asserts
/// that the child passed. Used for inputs that make the library violate an unsafe
/// precondition, which aborts the process (no unwinding) in a debug build.
fn isolated(name: &str, body: impl FnOnce()) {
    if std::env::var(CHILD_ENV).as_deref() == Ok(name) {
        body();
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().expect("test binary path"))
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, name)
        .output()
        .expect("spawn the test binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail: String = stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .take(12)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        out.status.success(),
        "child process running `{name}` failed ({}):\n{tail}",
        out.status
    );
    assert!(
        stdout.contains("1 passed"),
        "the child did not run `{name}`:\n{stdout}"
    );
}

/// A hand-built `DLTensor` with its own shape array, for [`TensorView`] tests.
struct RawView {
    shape: Vec<i64>,
    t: DLTensor,
}

impl RawView {
    fn new(data: usize, dtype: (u8, u8, u16), shape: &[i64], byte_offset: u64) -> Box<Self> {
        let mut v = Box::new(RawView {
            shape: shape.to_vec(),
            t: DLTensor {
                data: data as *mut c_void,
                device: Device::CPU.into(),
                ndim: shape.len() as i32,
                dtype: DType::new(dtype.0, dtype.1).with_lanes(dtype.2).into(),
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset,
            },
        });
        v.t.shape = v.shape.as_mut_ptr();
        v
    }

    /// Validates the view. Nothing in these tests reads `data`: validation and specs only
    /// do arithmetic on the pointer.
    fn view(&mut self) -> dlpack_mpi::Result<TensorView<'_>> {
        // SAFETY: `t` and its shape array live in `self`, borrowed for the view's lifetime;
        // strides are NULL. The data pointer is never dereferenced by the calls the tests
        // make on the view (validation and specs only do arithmetic on it).
        unsafe { TensorView::from_raw(&mut self.t) }
    }
}

// ---------------------------------------------------------------------------------------
// Import: NULL pointers, versions, ndim
// ---------------------------------------------------------------------------------------

#[test]
fn null_managed_pointers_are_refused() {
    // SAFETY: NULL is refused before any read.
    let v1 = unsafe { ManagedTensor::from_raw_versioned(std::ptr::null_mut()) };
    assert_eq!(
        v1.unwrap_err(),
        Error::NullPointer {
            field: "DLManagedTensorVersioned*"
        }
    );
    // SAFETY: as above.
    let v0 = unsafe { ManagedTensor::from_raw_legacy(std::ptr::null_mut()) };
    assert_eq!(
        v0.unwrap_err(),
        Error::NullPointer {
            field: "DLManagedTensor*"
        }
    );
}

#[test]
fn foreign_majors_release_once_and_read_nothing_else() {
    for major in [0, 2, 3, 0x8000_0000, u32::MAX] {
        for minor in [0, 7, u32::MAX] {
            // Garbage in every other field: only version and deleter may be read.
            let mut raw = RawTensor::new(&[1i32, 2], I32);
            raw.version = (major, minor);
            raw.ndim = Some(-5);
            raw.shape = None;
            raw.null_data = true;
            raw.dtype = (255, 0, 0);
            raw.byte_offset = u64::MAX;
            let (r, c) = raw.import_v1();
            assert_eq!(r.unwrap_err(), Error::UnsupportedVersion { major, minor });
            assert_eq!(c.get(), 1, "major {major}.{minor}");
        }
    }
}

#[test]
fn foreign_majors_with_null_deleter_are_refused_without_a_call() {
    for major in [0, 2, u32::MAX] {
        let mut raw = RawTensor::new(&[1i32], I32);
        raw.version = (major, 0);
        raw.null_deleter = true;
        let (r, c) = raw.import_v1();
        assert_eq!(
            r.unwrap_err(),
            Error::UnsupportedVersion { major, minor: 0 }
        );
        assert_eq!(c.get(), 0, "a NULL deleter must never be called");
    }
}

#[test]
fn invalid_tensor_with_null_deleter_is_refused_without_a_call() {
    let mut raw = RawTensor::new(&[1i32], I32);
    raw.ndim = Some(-1);
    raw.null_deleter = true;
    for (r, c) in [raw.import_v1(), raw.import_v0()] {
        assert!(
            matches!(r, Err(Error::InvalidTensor { ref field, value: -1, .. }) if field == "ndim"),
            "{r:?}"
        );
        assert_eq!(c.get(), 0);
    }
}

#[test]
fn any_minor_of_major_one_is_accepted() {
    let mut raw = RawTensor::new(&[5i32, 6], I32);
    raw.version = (1, u32::MAX);
    with_tensor(&raw, |t| {
        assert_eq!(t.version(), Some((1, u32::MAX)));
        assert_eq!(t.as_slice::<i32>().unwrap(), &[5, 6]);
    });
}

#[test]
fn negative_ndim_every_magnitude() {
    for ndim in [-1, -2, -1000, i32::MIN] {
        let mut raw = RawTensor::new(&[1i32], I32);
        raw.ndim = Some(ndim);
        let e = refused_both(&raw);
        assert!(
            matches!(e, Error::InvalidTensor { ref field, value, .. }
                if field == "ndim" && value == i128::from(ndim)),
            "{e:?}"
        );
    }
}

#[test]
fn huge_ndim_with_null_shape_is_refused_before_reading_shape() {
    for ndim in [1, 64, i32::MAX] {
        let mut raw = RawTensor::new(&[1i32], I32);
        raw.shape = None;
        raw.strides = None;
        raw.ndim = Some(ndim);
        let e = refused_both(&raw);
        assert!(
            matches!(e, Error::InvalidTensor { ref field, value: 0, .. } if field == "shape"),
            "{e:?}"
        );
    }
}

#[test]
fn zero_ndim_ignores_shape_and_strides_arrays() {
    // ndim = 0 with (garbage) non-NULL arrays: a scalar, arrays never read.
    let mut raw = RawTensor::new(&[9i32], I32).shape(&[-7, -7], Some(&[-7, -7]));
    raw.ndim = Some(0);
    with_tensor(&raw, |t| {
        assert_eq!((t.ndim(), t.shape(), t.num_elements()), (0, &[][..], 1));
        assert_eq!(t.strides_elems(), None);
        assert_eq!(SendSpec::new(&*t).unwrap().count(), 1);
        assert_eq!(t.as_slice::<i32>().unwrap(), &[9]);
    });
}

// ---------------------------------------------------------------------------------------
// Import: extents
// ---------------------------------------------------------------------------------------

#[test]
fn negative_extent_in_every_position() {
    for pos in 0..4 {
        for bad in [-1, i64::MIN] {
            let mut shape = vec![2i64, 3, 4, 5];
            shape[pos] = bad;
            let raw = RawTensor::new(&[0u8; 120], U8).shape(&shape, None);
            let e = refused_both(&raw);
            assert!(
                matches!(e, Error::InvalidTensor { ref field, value, .. }
                    if *field == format!("shape[{pos}]") && value == i128::from(bad)),
                "pos {pos}: {e:?}"
            );
        }
    }
}

#[test]
fn negative_extent_wins_over_an_earlier_overflow_and_a_zero() {
    let raw = RawTensor::new(&[0u8; 8], U8).shape(&[i64::MAX, i64::MAX, 0, -1], None);
    let e = refused_both(&raw);
    assert!(
        matches!(e, Error::InvalidTensor { ref field, value: -1, .. } if field == "shape[3]"),
        "{e:?}"
    );
}

#[test]
fn element_count_overflow_in_every_position() {
    const M: i64 = i64::MAX;
    let cases: [([i64; 4], i128, i128); 4] = [
        ([M, 3, 3, 3], M.into(), 3),
        ([3, M, 3, 3], 3, M.into()),
        ([3, 3, M, 3], 9, M.into()),
        ([3, 3, 3, M], 27, M.into()),
    ];
    for (shape, lhs, rhs) in cases {
        let raw = RawTensor::new(&[0u8; 8], U8).shape(&shape, None);
        let e = refused_both(&raw);
        assert_eq!(
            e,
            Error::Overflow {
                quantity: "element count",
                lhs,
                operator: "*",
                rhs
            },
            "{shape:?}"
        );
    }
    // Just past i64::MAX with small factors: 2^62 * 2 overflows.
    let raw = RawTensor::new(&[0u8; 8], U8).shape(&[1 << 62, 2], None);
    assert_eq!(
        refused_both(&raw),
        Error::Overflow {
            quantity: "element count",
            lhs: 1 << 62,
            operator: "*",
            rhs: 2
        }
    );
}

#[test]
fn zero_extent_with_huge_others_is_an_empty_tensor() {
    for shape in [
        [0, i64::MAX, i64::MAX],
        [i64::MAX, 0, i64::MAX],
        [i64::MAX, i64::MAX, 0],
    ] {
        let mut raw = RawTensor::new::<u8>(&[], U8).shape(&shape, Some(&[i64::MIN, 0, 1]));
        raw.null_data = true;
        with_tensor(&raw, |t| {
            assert_eq!(t.num_elements(), 0);
            let s = SendSpec::new(&*t).unwrap();
            assert_eq!((s.count(), s.pointer().is_null()), (0, true));
            let r = RecvSpec::new(t).unwrap();
            assert_eq!((r.count(), r.pointer().is_null()), (0, true));
        });
        with_tensor(&raw, |t| {
            assert_eq!(t.as_slice::<u8>().unwrap(), &[] as &[u8])
        });
    }
}

#[test]
fn largest_element_count_is_refused_as_too_large_for_mpi() {
    // i64::MAX one-byte elements: fits i64 and the address space arithmetic, not MPI's int.
    let raw = RawTensor::new(&[0u8; 8], U8).shape(&[i64::MAX], None);
    assert_eq!(
        send_err(&raw),
        Error::CountTooLarge {
            count: i64::MAX as u64
        }
    );
}

// ---------------------------------------------------------------------------------------
// Import: data, byte_offset, address space
// ---------------------------------------------------------------------------------------

#[test]
fn null_data_with_elements_is_refused() {
    for shape in [vec![], vec![1], vec![3, 1], vec![1, 1, 1, 1]] {
        let mut raw = RawTensor::new(&[1i32, 2, 3], I32);
        raw.shape = if shape.is_empty() {
            None
        } else {
            Some(shape.clone())
        };
        raw.strides = None;
        raw.null_data = true;
        let e = refused_both(&raw);
        assert!(
            matches!(e, Error::InvalidTensor { ref field, value: 0, .. } if field == "data"),
            "shape {shape:?}: {e:?}"
        );
    }
}

#[test]
fn null_data_empty_tensor_ignores_byte_offset() {
    let mut raw = RawTensor::new::<i32>(&[], I32).shape(&[0], Some(&[1]));
    raw.null_data = true;
    raw.byte_offset = u64::MAX;
    with_tensor(&raw, |t| {
        assert!(t.first_element_ptr().is_null());
        assert_eq!(SendSpec::new(&*t).unwrap().count(), 0);
    });
}

#[test]
fn byte_offset_past_the_address_space_is_an_overflow() {
    for off in [u64::MAX, u64::MAX - 7, u64::MAX - 0xffff] {
        let mut raw = RawTensor::new(&[1i32, 2], I32);
        raw.byte_offset = off;
        let (r, c) = raw.import_v1();
        assert!(
            matches!(r, Err(Error::Overflow { quantity: "data + byte_offset", operator: "+", rhs, .. })
                if rhs == i128::from(off)),
            "offset {off}: {r:?}"
        );
        assert_eq!(c.get(), 1);
    }
}

#[test]
fn data_near_the_end_of_the_address_space() {
    // data + byte_offset itself overflows.
    let mut v = RawView::new(usize::MAX - 3, I32, &[1], 4);
    assert_eq!(
        v.view().unwrap_err(),
        Error::Overflow {
            quantity: "data + byte_offset",
            lhs: (usize::MAX - 3) as i128,
            operator: "+",
            rhs: 4
        }
    );
    // The first element fits, its bytes do not.
    for (data, off) in [(usize::MAX - 3, 0), (usize::MAX - 7, 4), (usize::MAX, 0)] {
        let mut v = RawView::new(data, I32, &[1], off);
        let view = v.view().unwrap();
        assert_eq!(
            SendSpec::new(&view).unwrap_err(),
            Error::Overflow {
                quantity: "first element + byte span",
                lhs: (data + off as usize) as i128,
                operator: "+",
                rhs: 4
            }
        );
    }
    // Exactly reaching the last address is fine for the spec arithmetic.
    let mut v = RawView::new(usize::MAX - 4, I32, &[1], 0);
    assert_eq!(SendSpec::new(&v.view().unwrap()).unwrap().count(), 1);
}

#[test]
fn byte_span_past_the_address_space_is_an_overflow() {
    // Count fits i64 and its 2^64 - 8 bytes fit usize, but not after the first element.
    let raw = RawTensor::new(&[0u64], (1, 64, 1)).shape(&[i64::MAX / 4], None);
    let e = send_err(&raw);
    assert!(
        matches!(e, Error::Overflow { quantity: "first element + byte span", operator: "+", rhs, .. }
            if rhs == i128::from(i64::MAX / 4) * 8),
        "{e:?}"
    );
    // Bytes that do not fit usize at all.
    let raw = RawTensor::new(&[0u64], (1, 64, 1)).shape(&[i64::MAX / 2], None);
    assert_eq!(
        send_err(&raw),
        Error::Overflow {
            quantity: "byte span",
            lhs: (i64::MAX / 2).into(),
            operator: "*",
            rhs: 8
        }
    );
}

// ---------------------------------------------------------------------------------------
// Strides
// ---------------------------------------------------------------------------------------

/// Negative strides reach below `data + byte_offset` (legitimately: DLPack producers such
/// as NumPy point `data` at the first logical element). Whether that stays inside the
/// producer's allocation is the producer's promise; the crate checks that the address range
/// does not wrap, exposes it (`byte_range`), and never turns such a layout into a slice.
#[test]
fn strides_pointing_backwards_are_strided_never_slices() {
    for stride in [-1, -2, i64::MIN + 1] {
        let raw = RawTensor::new(&[0f32, 1., 2.], F32).shape(&[3], Some(&[stride]));
        let s = send_err(&raw);
        assert!(
            matches!(s, Error::MpiNotInitialized | Error::Overflow { .. }),
            "stride {stride}: {s:?}"
        );
        let r = recv_err(&raw);
        assert!(
            matches!(r, Error::MpiNotInitialized | Error::Overflow { .. }),
            "stride {stride}: {r:?}"
        );
        with_tensor(&raw, |t| {
            assert!(matches!(
                t.as_slice::<f32>(),
                Err(Error::NonContiguous { axis: 0, .. })
            ));
            assert!(matches!(
                t.as_mut_slice::<f32>(),
                Err(Error::NonContiguous { axis: 0, .. })
            ));
        });
    }
}

#[test]
fn extreme_strides_in_receive_overlap_check_are_typed_errors() {
    let raw = RawTensor::new(&[0f32, 1., 2.], F32).shape(&[3], Some(&[i64::MIN]));
    assert_eq!(
        recv_err(&raw),
        Error::Overflow {
            quantity: "|stride|",
            lhs: i64::MIN.into(),
            operator: "*",
            rhs: -1
        }
    );
    let raw = RawTensor::new(&[0f32, 1., 2.], F32).shape(&[3], Some(&[i64::MAX]));
    assert_eq!(
        recv_err(&raw),
        Error::Overflow {
            quantity: "stride reach",
            lhs: i64::MAX.into(),
            operator: "*",
            rhs: 2
        }
    );
    // Reach overflows on the addition of two axes: 2^62 + (2^62 + 1).
    let raw = RawTensor::new(&[0f32; 4], F32).shape(&[2, 2], Some(&[(1 << 62) + 1, 1 << 62]));
    assert_eq!(
        recv_err(&raw),
        Error::Overflow {
            quantity: "stride reach",
            lhs: 1 << 62,
            operator: "+",
            rhs: (1 << 62) + 1
        }
    );
    // Aliasing strides of different magnitudes.
    let raw = RawTensor::new(&[0f32; 8], F32).shape(&[2, 3], Some(&[2, 1]));
    assert_eq!(
        recv_err(&raw),
        Error::Overlap {
            axis: 0,
            extent: 2,
            stride_elems: 2
        }
    );
}

#[test]
fn hostile_strides_on_unit_axes_do_not_move_the_pointer() {
    let raw =
        RawTensor::new(&[1i32, 2, 3, 4], I32).shape(&[1, 4, 1], Some(&[i64::MIN, 1, i64::MAX]));
    with_tensor(&raw, |t| {
        let s = SendSpec::new(&*t).unwrap();
        assert_eq!(s.count(), 4);
        assert_eq!(s.pointer(), t.data_ptr().cast_const());
        assert_eq!(t.as_slice::<i32>().unwrap(), &[1, 2, 3, 4]);
        assert_eq!(RecvSpec::new(t).unwrap().count(), 4);
    });
}

// ---------------------------------------------------------------------------------------
// dtype
// ---------------------------------------------------------------------------------------

#[test]
fn lanes_zero_is_refused_at_import() {
    for (code, bits) in [(0u8, 32u8), (2, 32), (255, 0)] {
        let raw = RawTensor::new(&[0u32], (code, bits, 0));
        let e = refused_both(&raw);
        assert!(
            matches!(e, Error::InvalidTensor { ref field, value: 0, .. } if field == "dtype.lanes"),
            "{e:?}"
        );
    }
}

#[test]
fn every_code_bits_lanes_combination_resolves_or_is_refused_by_name() {
    for code in 0..=255u8 {
        for bits in 0..=255u8 {
            for lanes in [0u16, 1, 2, 3, 65535] {
                let d = DType::new(code, bits).with_lanes(lanes);
                let row = dtype::TABLE
                    .iter()
                    .find(|r| r.code == code && r.bits == bits);
                match (dtype::lookup(d), row) {
                    (Ok(e), Some(row)) if lanes > 0 => {
                        assert_eq!(*e.row, *row);
                        assert_eq!(e.size_bytes(), row.unit.size_bytes() * usize::from(lanes));
                        assert_eq!(d.size_bytes(), Some(e.size_bytes()), "{d}");
                        assert_eq!(e.units_per_element(), usize::from(lanes));
                    }
                    (Err(Error::UnsupportedDtype { dtype, reason }), _) => {
                        assert_eq!(dtype, d);
                        assert!(!reason.is_empty());
                        assert!(lanes == 0 || row.is_none(), "{d} refused: {reason}");
                    }
                    (other, _) => panic!("{d}: unexpected {other:?}"),
                }
            }
        }
    }
}

#[test]
fn every_type_code_through_import_and_spec() {
    for code in 0..=255u8 {
        for bits in [0u8, 4, 8, 12, 16, 32, 64, 128, 248] {
            let raw = RawTensor::new(&[0u8; 32], (code, bits, 1)).shape(&[1], None);
            let known = dtype::TABLE
                .iter()
                .any(|r| r.code == code && r.bits == bits);
            with_tensor(&raw, |t| match SendSpec::new(&*t) {
                Ok(s) => {
                    assert!(known, "code {code} bits {bits} accepted");
                    assert_eq!(s.count(), 1);
                }
                Err(Error::UnsupportedDtype { dtype, .. }) => {
                    assert!(!known, "code {code} bits {bits} refused");
                    assert_eq!((dtype.code, dtype.bits, dtype.lanes), (code, bits, 1));
                }
                Err(e) => panic!("code {code} bits {bits}: {e:?}"),
            });
        }
    }
}

#[test]
fn max_lanes_multiply_the_mpi_count() {
    // float32 x 65535: one element is 65535 MPI_FLOAT units.
    let raw = RawTensor::new(&vec![0u8; 4 * 65535], (2, 32, 65535)).shape(&[1], None);
    with_tensor(&raw, |t| {
        let s = SendSpec::new(&*t).unwrap();
        assert_eq!((s.len_elems(), s.count()), (1, 65535));
        assert!(matches!(
            t.as_slice::<f32>(),
            Err(Error::DtypeMismatch { .. })
        ));
    });
    // 32768 x 65535 = 2_147_450_880 units: the largest that fits an int.
    let raw = RawTensor::new(&[0u8; 8], (2, 32, 65535)).shape(&[32768], None);
    with_tensor(&raw, |t| {
        assert_eq!(SendSpec::new(&*t).unwrap().count(), 2_147_450_880);
    });
    // 32769 x 65535 = 2_147_516_415 units: one element more does not fit an int; it needs
    // a large-count derived datatype (never a wrapped count), which needs MPI.
    let raw = RawTensor::new(&[0u8; 8], (2, 32, 65535)).shape(&[32769], None);
    assert_eq!(send_err(&raw), Error::MpiNotInitialized);
}

#[test]
fn sub_byte_and_zero_width_dtypes_are_refused_by_specs() {
    for (code, bits) in [
        (0u8, 0u8),
        (0, 1),
        (0, 12),
        (2, 4),
        (15, 6),
        (17, 4),
        (1, 7),
    ] {
        let raw = RawTensor::new(&[0u8; 8], (code, bits, 1));
        let e = send_err(&raw);
        assert!(
            matches!(e, Error::UnsupportedDtype { dtype, .. } if dtype.code == code && dtype.bits == bits),
            "{e:?}"
        );
        let e = recv_err(&raw);
        assert!(matches!(e, Error::UnsupportedDtype { .. }), "{e:?}");
    }
}

// ---------------------------------------------------------------------------------------
// Devices and flags
// ---------------------------------------------------------------------------------------

#[test]
fn unknown_and_device_memory_types_are_refused_before_mpi() {
    for dev in [
        0u32,
        2,
        4,
        5,
        6,
        7,
        8,
        9,
        10,
        12,
        13,
        14,
        15,
        16,
        255,
        u32::MAX,
    ] {
        for id in [0, -1, i32::MIN, i32::MAX] {
            let mut raw = RawTensor::new(&[1i32, 2], I32);
            raw.device = (dev, id);
            let want = |e: &Error| {
                matches!(e, Error::UnsupportedDevice { device_type, device_id, .. }
                    if *device_type == dev && *device_id == id)
            };
            assert!(want(&send_err(&raw)), "device ({dev}, {id})");
            assert!(want(&recv_err(&raw)), "device ({dev}, {id})");
            with_tensor(&raw, |t| {
                assert!(want(&t.as_slice::<i32>().unwrap_err()));
                assert!(want(&t.as_mut_slice::<i32>().unwrap_err()));
            });
        }
    }
}

#[test]
fn pinned_host_with_odd_device_id_is_host_memory() {
    for dev in [device_type::CUDA_HOST, device_type::ROCM_HOST] {
        let mut raw = RawTensor::new(&[1i32, 2], I32);
        raw.device = (dev, -1);
        with_tensor(&raw, |t| {
            assert_eq!(SendSpec::new(&*t).unwrap().count(), 2);
            assert_eq!(t.as_slice::<i32>().unwrap(), &[1, 2]);
        });
    }
}

#[test]
fn unknown_flag_bits_do_not_hide_read_only_or_is_copied() {
    let mut raw = RawTensor::new(&[1i32, 2], I32);
    raw.flags = u64::MAX;
    with_tensor(&raw, |t| {
        assert!(t.is_read_only() && t.is_copied());
        assert_eq!(SendSpec::new(&*t).unwrap().count(), 2);
        assert_eq!(RecvSpec::new(t).unwrap_err(), Error::ReadOnly);
        assert_eq!(t.as_mut_slice::<i32>().unwrap_err(), Error::ReadOnly);
        assert_eq!(
            RecvSpec::range(t, 0, 1).unwrap_err(),
            Error::ReadOnly,
            "range must refuse too"
        );
    });
    raw.flags = !1;
    assert_eq!(recv_err(&raw), Error::IsCopied);
    // Only unknown bits: neither flag.
    raw.flags = !3;
    with_tensor(&raw, |t| {
        assert!(!t.is_read_only() && !t.is_copied());
        assert_eq!(RecvSpec::new(t).unwrap().count(), 2);
    });
}

#[test]
fn legacy_tensors_have_no_flags() {
    let mut raw = RawTensor::new(&[1i32, 2], I32);
    raw.flags = u64::MAX; // not part of the legacy struct: ignored
    let (t, c) = raw.import_v0();
    let mut t = t.unwrap();
    assert_eq!(t.flags(), 0);
    assert_eq!(RecvSpec::new(&mut t).unwrap().count(), 2);
    drop(t);
    assert_eq!(c.get(), 1);
}

// ---------------------------------------------------------------------------------------
// Ranges
// ---------------------------------------------------------------------------------------

const BAD_RANGES: [(i64, i64); 12] = [
    (i64::MIN, 1),
    (i64::MIN, 0),
    (0, i64::MIN),
    (0, -1),
    (-1, 0),
    (-1, 2),
    (i64::MAX, 1),
    (i64::MAX, 0),
    (1, i64::MAX),
    (i64::MAX, i64::MAX),
    (11, 0),
    (5, 6),
];

#[test]
fn send_ranges_outside_the_tensor_are_refused() {
    let raw = RawTensor::new(&(0..10).collect::<Vec<i32>>(), I32);
    with_tensor(&raw, |t| {
        for (d, n) in BAD_RANGES {
            let want = Error::OutOfBounds {
                what: "range".into(),
                displacement: d,
                count: n,
                len: 10,
            };
            assert_eq!(SendSpec::range(&*t, d, n).unwrap_err(), want);
            let s = SendSpec::new(&*t).unwrap();
            assert_eq!(s.range_of(d, n).unwrap_err(), want);
        }
        // Nested ranges are relative to the outer range.
        let s = SendSpec::range(&*t, 4, 4).unwrap();
        assert!(s.range_of(1, 3).is_ok());
        assert_eq!(
            s.range_of(1, 4).unwrap_err(),
            Error::OutOfBounds {
                what: "range".into(),
                displacement: 1,
                count: 4,
                len: 4
            }
        );
        assert_eq!(
            s.range_of(1, 3).unwrap().pointer(),
            t.data_ptr()
                .cast::<u8>()
                .wrapping_add(20)
                .cast_const()
                .cast()
        );
    });
}

#[test]
fn recv_ranges_outside_the_tensor_are_refused() {
    let raw = RawTensor::new(&(0..10).collect::<Vec<i32>>(), I32);
    with_tensor(&raw, |t| {
        for (d, n) in BAD_RANGES {
            assert_eq!(
                RecvSpec::range(t, d, n).unwrap_err(),
                Error::OutOfBounds {
                    what: "range".into(),
                    displacement: d,
                    count: n,
                    len: 10,
                }
            );
        }
        assert_eq!(RecvSpec::range(t, 10, 0).unwrap().count(), 0);
        assert!(RecvSpec::range(t, 10, 0).unwrap().pointer().is_null());
    });
}

#[test]
fn ranges_of_empty_and_null_tensors() {
    let mut raw = RawTensor::new::<i32>(&[], I32).shape(&[0], Some(&[1]));
    raw.null_data = true;
    with_tensor(&raw, |t| {
        assert_eq!(SendSpec::range(&*t, 0, 0).unwrap().count(), 0);
        assert_eq!(
            SendSpec::range(&*t, 0, 1).unwrap_err(),
            Error::OutOfBounds {
                what: "range".into(),
                displacement: 0,
                count: 1,
                len: 0
            }
        );
    });
}

#[test]
fn range_unit_counts_beyond_mpi_int_are_refused() {
    // A (claimed) 2^31-element byte tensor: the whole is too large, sub-ranges are not.
    let raw = RawTensor::new(&[0u8; 8], U8).shape(&[1 << 31], None);
    with_tensor(&raw, |t| {
        assert_eq!(SendSpec::new(&*t).unwrap_err(), Error::MpiNotInitialized);
        assert_eq!(
            SendSpec::range(&*t, 0, i64::from(i32::MAX))
                .unwrap()
                .count(),
            i32::MAX
        );
        assert_eq!(
            SendSpec::range(&*t, 0, 1 << 31).unwrap_err(),
            Error::MpiNotInitialized
        );
        assert_eq!(
            RecvSpec::range(t, 1, 1 << 31).unwrap_err(),
            Error::OutOfBounds {
                what: "range".into(),
                displacement: 1,
                count: 1 << 31,
                len: 1 << 31
            }
        );
    });
    // With lanes: 2^30 float32x2 elements are 2^31 units.
    let raw = RawTensor::new(&[0u8; 8], (2, 32, 2)).shape(&[1 << 31], None);
    with_tensor(&raw, |t| {
        assert_eq!(
            SendSpec::range(&*t, 5, 1 << 30).unwrap_err(),
            Error::MpiNotInitialized
        );
        assert_eq!(
            SendSpec::range(&*t, 5, (1 << 30) - 1).unwrap().count(),
            i32::MAX - 1
        );
    });
}

// ---------------------------------------------------------------------------------------
// Vector specs
// ---------------------------------------------------------------------------------------

fn six() -> Owned<i32> {
    Owned::new((0..6).collect::<Vec<i32>>())
}

#[test]
#[allow(deprecated)]
fn vector_send_hostile_counts_and_displacements() {
    let o = six();
    let t = acquire(&o, &AcquireOptions::default()).unwrap();
    let s = SendSpec::new(&t).unwrap();
    let oob = |i: usize, d: i64, c: i64| Error::OutOfBounds {
        what: format!("block {i}"),
        displacement: d,
        count: c,
        len: 6,
    };
    let cases: Vec<(Vec<i64>, Vec<i64>, Error)> = vec![
        (vec![1, i64::MIN], vec![0, 0], oob(1, 0, i64::MIN)),
        (vec![1, -1], vec![0, 1], oob(1, 1, -1)),
        (vec![1, 1], vec![0, i64::MIN], oob(1, i64::MIN, 1)),
        (vec![1, 1], vec![0, i64::MAX], oob(1, i64::MAX, 1)),
        (vec![i64::MAX, 1], vec![1, 0], oob(0, 1, i64::MAX)),
        (vec![2, 1], vec![i64::MAX - 1, 0], oob(0, i64::MAX - 1, 2)),
        (vec![0, 0], vec![0, 7], oob(1, 7, 0)),
        (vec![7], vec![0], oob(0, 0, 7)),
    ];
    for (counts, displs, want) in cases {
        assert_eq!(
            VectorSendSpec::new(s, &counts, &displs).unwrap_err(),
            want,
            "{counts:?} {displs:?}"
        );
    }
    assert_eq!(
        VectorSendSpec::new(s, &[1, 1, 1], &[0, 1]).unwrap_err(),
        Error::LengthMismatch {
            what: "displacements",
            expected: 3,
            actual: 2
        }
    );
    // Sends may overlap (MPI only forbids it for receives), and empty lists are fine.
    assert!(VectorSendSpec::new(s, &[6, 6], &[0, 0]).is_ok());
    assert!(VectorSendSpec::new(s, &[], &[]).is_ok());
}

#[test]
#[allow(deprecated)]
fn vector_recv_hostile_counts_displacements_and_overlaps() {
    let o = six();
    let mut t = acquire(&o, &AcquireOptions::default()).unwrap();
    let mk = |t: &mut ManagedTensor<'_>, c: &[i64], d: &[i64]| {
        let r = RecvSpec::new(t).unwrap();
        VectorRecvSpec::new(r, c, d).map(|_| ())
    };
    assert_eq!(
        mk(&mut t, &[1, 1], &[0, i64::MIN]).unwrap_err(),
        Error::OutOfBounds {
            what: "block 1".into(),
            displacement: i64::MIN,
            count: 1,
            len: 6
        }
    );
    assert_eq!(
        mk(&mut t, &[i64::MIN, 1], &[i64::MAX, 0]).unwrap_err(),
        Error::OutOfBounds {
            what: "block 0".into(),
            displacement: i64::MAX,
            count: i64::MIN,
            len: 6
        }
    );
    // Overlap between non-adjacent ranks, an empty block in between.
    assert_eq!(
        mk(&mut t, &[3, 0, 2], &[0, 1, 1]).unwrap_err(),
        Error::BlocksOverlap {
            first: 0,
            first_start: 0,
            first_end: 3,
            second: 2,
            second_start: 1
        }
    );
    // Same start.
    assert!(matches!(
        mk(&mut t, &[1, 2], &[4, 4]).unwrap_err(),
        Error::BlocksOverlap {
            first_start: 4,
            second_start: 4,
            ..
        }
    ));
    // A block contained in a bigger one listed later.
    assert!(matches!(
        mk(&mut t, &[1, 6], &[3, 0]).unwrap_err(),
        Error::BlocksOverlap { .. }
    ));
    // Empty blocks may sit anywhere inside (or at the end of) the tensor, even on others.
    assert!(mk(&mut t, &[0, 6, 0], &[3, 0, 6]).is_ok());
    assert_eq!(
        mk(&mut t, &[1], &[]).unwrap_err(),
        Error::LengthMismatch {
            what: "displacements",
            expected: 1,
            actual: 0
        }
    );
}

// ---------------------------------------------------------------------------------------
// Slices
// ---------------------------------------------------------------------------------------

#[test]
fn as_slice_on_odd_tensors() {
    // Wrong element type, lanes, and a right-size-wrong-code type.
    let raw = RawTensor::new(&[1i32, 2], I32);
    with_tensor(&raw, |t| {
        assert!(matches!(
            t.as_slice::<u32>(),
            Err(Error::DtypeMismatch { .. })
        ));
        assert!(matches!(
            t.as_slice::<f32>(),
            Err(Error::DtypeMismatch { .. })
        ));
        assert!(matches!(
            t.as_mut_slice::<i64>(),
            Err(Error::DtypeMismatch { .. })
        ));
    });
    let raw = RawTensor::new(&[1i32, 2], (0, 32, 2)).shape(&[1], None);
    with_tensor(&raw, |t| {
        assert!(matches!(
            t.as_slice::<i32>(),
            Err(Error::DtypeMismatch { .. })
        ))
    });
    // 0-d and byte-offset tensors.
    let mut raw = RawTensor::new(&[1i32, 2, 3], I32).shape(&[2], None);
    raw.byte_offset = 4;
    with_tensor(&raw, |t| {
        assert_eq!(t.as_mut_slice::<i32>().unwrap(), &mut [2, 3]);
    });
    // Broadcast receive through a slice: refused as non-contiguous.
    let raw = RawTensor::new(&[7i32], I32).shape(&[4], Some(&[0]));
    with_tensor(&raw, |t| {
        assert_eq!(
            t.as_mut_slice::<i32>().unwrap_err(),
            Error::NonContiguous {
                axis: 0,
                stride_elems: 0,
                expected_elems: 1
            }
        );
    });
}

/// A misaligned first element (`byte_offset = 1`) of an `int32` tensor: `as_slice` builds a
/// `&[i32]` from a pointer that is not 4-aligned, which is undefined behaviour and aborts a
/// debug build ("unsafe precondition(s) violated: slice::from_raw_parts requires the
/// pointer to be aligned"). It should be an error (DLPack does not promise aligned
/// `data + byte_offset`; dlpack.h even says not to rely on `data` alignment).
#[test]
fn regression_as_slice_accepts_misaligned_first_element() {
    isolated(
        "regression_as_slice_accepts_misaligned_first_element",
        || {
            let mut raw = RawTensor::new(&[0u8; 12], I32).shape(&[2], None);
            raw.byte_offset = 1;
            with_tensor(&raw, |t| {
                let r = t.as_slice::<i32>().map(|s| s.len());
                assert!(r.is_err(), "misaligned slice handed out: {r:?}");
            });
        },
    );
}

/// Same through the crate's own safe exporter: `Owned::with_layout` accepts byte offset 1
/// for `f32` storage, and `as_mut_slice` then builds a misaligned `&mut [f32]`. Entirely
/// safe code reaches undefined behaviour.
#[test]
fn regression_owned_with_unaligned_byte_offset_gives_misaligned_slice() {
    isolated(
        "regression_owned_with_unaligned_byte_offset_gives_misaligned_slice",
        || {
            let o = Owned::new(vec![0f32; 2]).with_layout(&[1], None, 1);
            if let Ok(o) = o {
                let mut t = acquire(&o, &AcquireOptions::default()).unwrap();
                let r = t.as_mut_slice::<f32>().map(|s| s.len());
                assert!(r.is_err(), "misaligned &mut [f32] handed out: {r:?}");
            }
        },
    );
}

/// `as_slice` skips the byte-span check `SendSpec::new` makes: for `2^61 - 1` int64
/// elements (the `byte_span_past_the_address_space_is_an_overflow` tensor) it calls
/// `slice::from_raw_parts` with a size of `2^64 - 8` bytes, above `isize::MAX` (undefined
/// behaviour; a debug build aborts). It should be the spec's `Error::Overflow`.
#[test]
fn regression_as_slice_skips_byte_span_check() {
    isolated("regression_as_slice_skips_byte_span_check", || {
        let raw = RawTensor::new(&[0u64], (0, 64, 1)).shape(&[i64::MAX / 4], None);
        with_tensor(&raw, |t| {
            let r = t.as_slice::<i64>().map(|s| s.len());
            assert!(
                matches!(r, Err(Error::Overflow { .. })),
                "slice of {r:?} elements handed out"
            );
        });
    });
}

/// `as_slice` hands out a slice whose end wraps past the end of the address space, where
/// `SendSpec::new` refuses the very same view with `Error::Overflow` ("first element + byte
/// span"). Reading the slice would fault; it should be refused like the spec.
#[test]
fn regression_as_slice_accepts_span_wrapping_the_address_space() {
    let mut v = RawView::new(usize::MAX - 3, I32, &[1], 0);
    let view = v.view().unwrap();
    assert!(matches!(
        SendSpec::new(&view),
        Err(Error::Overflow {
            quantity: "first element + byte span",
            ..
        })
    ));
    let r = view.as_slice::<i32>().map(|s| s.as_ptr() as usize);
    assert!(
        matches!(r, Err(Error::Overflow { .. })),
        "slice at {r:x?} whose end wraps the address space handed out"
    );
}

/// A producer's `bool` tensor holding the bytes 2 and 255 (any byte can arrive, from a
/// peer or a producer whose bool is a reinterpreted uint8). `as_slice` only hands out types
/// that accept every bit pattern (`bool` does not compile there), so the bytes are read as
/// `u8`, as they are.
#[test]
fn bool_tensors_read_as_bytes_never_as_bool() {
    let raw = RawTensor::new(&[0u8, 1, 2, 255], BOOL);
    with_tensor(&raw, |t| {
        assert_eq!(t.as_slice::<u8>().unwrap(), &[0, 1, 2, 255]);
    });
    let o = Owned::new(vec![7u8, 0])
        .with_dtype(DType::new(6, 8))
        .unwrap();
    let t = acquire(&o, &AcquireOptions::default()).unwrap();
    assert_eq!(t.as_slice::<u8>().unwrap(), &[7, 0]);
}

/// `Owned::dlpack` takes `&self` and exports *writable* tensors, so one `Owned` yields any
/// number of live guards over the same storage; `as_mut_slice` on each gives two `&mut [T]`
/// to the same memory in safe code (and two `RecvSpec`s MPI may write concurrently). Only
/// the pointers are compared here, never two live `&mut`. Expected: the second writable
/// export (or the second `as_mut_slice`) is refused while the first guard lives, or
/// `Owned` exports writable tensors only through `&mut self`.
#[test]
fn owned_never_hands_out_aliasing_writable_tensors() {
    let o = Owned::new(vec![0u32; 4]);
    let opts = AcquireOptions::default();
    let a = acquire(&o, &opts).unwrap();
    assert_eq!(
        acquire(&o, &opts).err(),
        Some(Error::StorageBusy {
            dtype: DType::new(dtype::code::UINT, 32),
            shape: vec![4],
            writable: true,
            readers: 0
        })
    );
    drop(a);
    let mut b = acquire(&o, &opts).unwrap();
    assert_eq!(b.as_mut_slice::<u32>().unwrap(), &[0; 4]);
    drop(b);
    // Read-only exports may coexist.
    let ro = Owned::new(vec![1u8; 2]).read_only();
    let (x, y) = (acquire(&ro, &opts).unwrap(), acquire(&ro, &opts).unwrap());
    assert_eq!(
        (x.as_slice::<u8>().unwrap(), y.as_slice::<u8>().unwrap()),
        (&[1u8, 1][..], &[1u8, 1][..])
    );
    let mut buf = [0i16; 3];
    let sm = SliceMut::new(&mut buf);
    let first = acquire(&sm, &opts).unwrap();
    assert_eq!(
        acquire(&sm, &opts).err(),
        Some(Error::StorageBusy {
            dtype: DType::new(dtype::code::INT, 16),
            shape: vec![3],
            writable: true,
            readers: 0
        })
    );
    drop(first);
    assert!(acquire(&sm, &opts).is_ok());
}

// ---------------------------------------------------------------------------------------
// Owned / SliceMut builders
// ---------------------------------------------------------------------------------------

#[test]
fn owned_with_shape_refuses_bad_shapes() {
    let o = || Owned::new(vec![0f32; 6]);
    assert!(matches!(
        o().with_shape(&[2, -3]),
        Err(Error::InvalidTensor { ref field, value: -3, .. }) if field == "shape[1]"
    ));
    assert!(matches!(
        o().with_shape(&[i64::MAX, 2]),
        Err(Error::Overflow {
            quantity: "element count",
            ..
        })
    ));
    assert_eq!(
        o().with_shape(&[7]).err(),
        Some(Error::LayoutOutsideStorage {
            first_byte: 0,
            end_byte: 28,
            storage_bytes: 24
        })
    );
    assert!(matches!(
        o().with_shape(&[i64::MAX]).err(),
        Some(Error::Overflow { .. })
            | Some(Error::LayoutOutsideStorage {
                storage_bytes: 24,
                ..
            })
    ));
    assert!(o().with_shape(&[3, 2]).is_ok());
    assert!(o().with_shape(&[]).is_ok()); // a scalar: the first element
    assert!(o().with_shape(&[0, i64::MAX]).is_ok());
}

#[test]
fn owned_with_layout_refuses_everything_outside_the_storage() {
    let o = || Owned::new(vec![0f32; 6]); // 24 bytes
    let outside = |r: dlpack_mpi::Result<Owned<f32>>| {
        assert!(
            matches!(
                r,
                Err(Error::LayoutOutsideStorage { .. } | Error::Overflow { .. })
            ),
            "{:?}",
            r.err()
        );
    };
    // Negative strides reaching before the start.
    outside(o().with_layout(&[3], Some(&[-1]), 4));
    outside(o().with_layout(&[2, 3], Some(&[3, -1]), 0));
    outside(o().with_layout(&[2], Some(&[i64::MIN / 8]), 20));
    // Positive reach past the end.
    outside(o().with_layout(&[3], Some(&[3]), 0));
    outside(o().with_layout(&[1], None, 21));
    outside(o().with_layout(&[1], None, u64::MAX));
    outside(o().with_layout(&[2], Some(&[i64::MAX / 8]), 0));
    // Strides of the wrong length.
    assert_eq!(
        o().with_layout(&[2, 3], Some(&[1]), 0).err(),
        Some(Error::LengthMismatch {
            what: "strides",
            expected: 2,
            actual: 1
        })
    );
    // Exactly fitting layouts, including negative strides from the end.
    assert!(o().with_layout(&[6], Some(&[-1]), 20).is_ok());
    assert!(o().with_layout(&[2, 3], Some(&[-3, -1]), 20).is_ok());
    assert!(o().with_layout(&[1], None, 20).is_ok());
    assert!(o().with_layout(&[3], Some(&[0]), 20).is_ok());
}

#[test]
fn owned_with_dtype_refuses_sub_byte_and_ragged() {
    let o = || Owned::new(vec![0u8; 6]);
    for d in [
        DType::new(2, 16).with_lanes(0),
        DType::new(17, 4),
        DType::new(0, 0),
        DType::new(0, 12),
    ] {
        assert!(
            matches!(o().with_dtype(d), Err(Error::UnsupportedDtype { dtype, .. }) if dtype == d),
            "{d}"
        );
    }
    assert_eq!(
        o().with_dtype(DType::new(2, 32)).err(),
        Some(Error::ShapeMismatch {
            what: "Owned::with_dtype",
            expected: 8,
            actual: 6
        })
    );
    // The widest element (31 bytes x 65535 lanes) over empty storage: 0 elements.
    let wide = DType::new(0, 248).with_lanes(65535);
    let e = Owned::new(Vec::<u8>::new()).with_dtype(wide).unwrap();
    let t = acquire(&e, &AcquireOptions::default()).unwrap();
    assert_eq!(t.num_elements(), 0);
    assert!(matches!(
        SendSpec::new(&t),
        Err(Error::UnsupportedDtype { .. })
    ));
}

#[test]
fn owned_empty_layout_with_huge_offset_fails_at_export_with_a_typed_error() {
    let o = Owned::new(vec![0u8; 4])
        .with_layout(&[0], None, u64::MAX)
        .unwrap();
    let r = acquire(&o, &AcquireOptions::default());
    assert!(
        matches!(
            r,
            Err(Error::Overflow {
                quantity: "data + byte_offset",
                ..
            })
        ),
        "{r:?}"
    );
}

/// `ExportLayout::check_within` multiplies reaches in `i128` without checking: shape
/// `[i64::MAX]` with stride `i64::MAX` (or `i64::MIN`) of `f32` makes `(hi + 1) * 4` (or
/// `lo * 4`) exceed `i128`: a panic ("attempt to multiply with overflow") in a debug
/// build; in release it wraps and the out-of-storage layout is *accepted*
/// (src/dlpack/export.rs, `check_within`, the `lo_byte`/`end_byte` lines). Expected:
/// `Error::ShapeMismatch` (or `Error::Overflow`).
#[test]
fn owned_with_layout_extreme_strides_are_overflow_errors() {
    for stride in [i64::MAX, i64::MIN] {
        let r = std::panic::catch_unwind(|| {
            Owned::new(vec![0f32; 1])
                .with_layout(&[i64::MAX], Some(&[stride]), 0)
                .map(|_| ())
        });
        assert!(
            matches!(
                r,
                Ok(Err(
                    Error::LayoutOutsideStorage { .. } | Error::Overflow { .. }
                ))
            ),
            "stride {stride}: {}",
            match &r {
                Ok(v) => format!("returned {v:?}"),
                Err(_) => "panicked".to_string(),
            }
        );
    }
}

/// `check_within` returns early for an empty shape *before* checking that `strides` has one
/// entry per axis, so `with_layout(&[0, 3], Some(&[1]), 0)` is accepted; the exported
/// `DLTensor` then says `ndim = 2` with a 1-entry strides array, and
/// `Tensor::strides_elems()` (also used by `Debug`) reads past it. Expected:
/// `Error::LengthMismatch { what: "strides", expected: 2, actual: 1 }`.
#[test]
fn regression_owned_empty_layout_skips_strides_length_check() {
    for (shape, strides) in [(&[0i64, 3][..], &[1i64][..]), (&[0][..], &[][..])] {
        let r = Owned::new(vec![0f32; 4]).with_layout(shape, Some(strides), 0);
        assert_eq!(
            r.err(),
            Some(Error::LengthMismatch {
                what: "strides",
                expected: shape.len(),
                actual: strides.len()
            }),
            "shape {shape:?} strides {strides:?}"
        );
    }
}

/// `ShapeMismatch::expected` is `end_byte.max(0) as u64`: an `i128` above `u64::MAX` is
/// truncated, so a byte offset of `u64::MAX` on 12 bytes of storage reports "shape needs 3
/// bytes, data has 12" (src/dlpack/export.rs, `check_within`). It should saturate (or report
/// the overflow), never claim to need less than is available.
#[test]
fn owned_with_layout_error_reports_exact_bytes() {
    let r = Owned::new(vec![0f32; 3]).with_layout(&[1], None, u64::MAX);
    assert_eq!(
        r.err(),
        Some(Error::LayoutOutsideStorage {
            first_byte: i128::from(u64::MAX),
            end_byte: i128::from(u64::MAX) + 4,
            storage_bytes: 12
        })
    );
}

/// A layout refused because a negative stride reaches *before* the storage reports
/// `ShapeMismatch { expected: end_byte, actual }` with `end_byte <= actual`: "shape needs 8
/// bytes, data has 12", which contradicts itself and names neither the stride nor the
/// offset. Expected: an error that says the layout starts before the storage.
#[test]
fn owned_negative_reach_error_says_before_the_storage() {
    let r = Owned::new(vec![0f32; 3]).with_layout(&[3], Some(&[-1]), 4);
    assert_eq!(
        r.err(),
        Some(Error::LayoutOutsideStorage {
            first_byte: -4,
            end_byte: 8,
            storage_bytes: 12
        })
    );
}

#[test]
fn slice_mut_with_shape_refuses_bad_shapes() {
    let mut buf = [0u16; 4];
    assert_eq!(
        SliceMut::new(&mut buf).with_shape(&[5]).err(),
        Some(Error::LayoutOutsideStorage {
            first_byte: 0,
            end_byte: 10,
            storage_bytes: 8
        })
    );
    assert!(matches!(
        SliceMut::new(&mut buf).with_shape(&[-1]).err(),
        Some(Error::InvalidTensor { .. })
    ));
    let s = SliceMut::new(&mut buf).with_shape(&[2, 2]).unwrap();
    let t = acquire(&s, &AcquireOptions::default()).unwrap();
    assert_eq!(t.shape(), &[2, 2]);
}

/// `SliceMut::with_shape` measures the slice as `self.layout.shape[0]` — the *current*
/// shape's first extent, not the slice length. After `with_shape(&[1000, 0])` (an empty,
/// accepted shape) the "slice" is 1000 elements long, so `with_shape(&[1000])` is accepted
/// over 4 bytes, and `as_slice` would read 996 bytes past the borrow
/// (src/dlpack/export.rs, `SliceMut::with_shape`). Expected: `ShapeMismatch`.
#[test]
fn slice_mut_reshape_is_measured_against_the_slice() {
    let mut buf = [0u8; 4];
    let s = SliceMut::new(&mut buf).with_shape(&[1000, 0]).unwrap();
    let r = s.with_shape(&[1000]).map(|_| ());
    assert_eq!(
        r,
        Err(Error::LayoutOutsideStorage {
            first_byte: 0,
            end_byte: 1000,
            storage_bytes: 4
        })
    );
}

/// Same root cause: after `with_shape(&[])` (a scalar) the next `with_shape` indexes
/// `shape[0]` of an empty shape and panics (index out of bounds). Expected: `[1]` fits the
/// 4-byte slice and is accepted.
#[test]
fn slice_mut_reshape_after_scalar() {
    let mut buf = [0u8; 4];
    let r = std::panic::catch_unwind(move || {
        let s = SliceMut::new(&mut buf).with_shape(&[]).unwrap();
        s.with_shape(&[1]).is_ok()
    });
    assert_eq!(r.ok(), Some(true), "reshape of a scalar SliceMut panicked");
}

/// Same root cause, the other way: after `with_shape(&[2, 2])` the slice is measured as 2
/// elements, so reshaping the same 4 elements to `[4]` is wrongly refused.
#[test]
fn slice_mut_reshape_accepts_a_fitting_shape() {
    let mut buf = [0u8; 4];
    let s = SliceMut::new(&mut buf).with_shape(&[2, 2]).unwrap();
    assert!(s.with_shape(&[4]).is_ok());
}

// ---------------------------------------------------------------------------------------
// Public layout arithmetic
// ---------------------------------------------------------------------------------------

#[test]
fn layout_functions_on_extremes() {
    assert_eq!(layout::num_elements(&[i64::MAX]), Ok(i64::MAX));
    assert_eq!(layout::num_elements(&[1; 64]), Ok(1));
    assert!(matches!(
        layout::compact_strides(&[i64::MAX, 2]),
        Err(Error::Overflow { .. })
    ));
    assert!(layout::byte_span(i64::MIN, 1).is_err());
    assert_eq!(layout::byte_span(0, usize::MAX), Ok(0));
    assert!(layout::byte_span(2, usize::MAX).is_err());
    assert!(layout::check_range(|| "r".into(), i64::MAX, i64::MAX, i64::MAX).is_err());
    assert!(layout::check_range(|| "r".into(), 0, 0, -1).is_err());
    assert!(layout::check_blocks(&[1], &[0], 1, i64::MIN, false).is_err());
    assert!(matches!(
        layout::check_no_overlap(&[2, 2], Some(&[i64::MIN, i64::MIN])),
        Err(Error::Overflow { .. })
    ));
    assert!(matches!(
        layout::check_c_contiguous(&[3, 3], Some(&[i64::MIN, 1])),
        Err(Error::NonContiguous { axis: 0, .. })
    ));
}

/// The public `layout::check_c_contiguous` indexes `strides[axis]` for every axis of
/// `shape`: strides shorter than the shape panic (index out of bounds), although the module
/// promises "an overflow is Error::Overflow, never a wrap or a panic" and returns
/// `LengthMismatch` elsewhere. Expected: `Error::LengthMismatch { what: "strides", .. }`.
#[test]
fn regression_layout_contiguity_panics_on_short_strides() {
    let r = std::panic::catch_unwind(|| layout::check_c_contiguous(&[2, 3], Some(&[1])));
    assert!(
        matches!(r, Ok(Err(Error::LengthMismatch { .. }))),
        "{}",
        if r.is_err() { "panicked" } else { "no error" }
    );
}

/// The public `layout::check_no_overlap` zips shape with strides, silently dropping axes
/// without a stride: `[2, 2]` with strides `[1]` passes as non-overlapping. Expected:
/// `Error::LengthMismatch`.
#[test]
fn regression_layout_overlap_check_ignores_missing_strides() {
    assert!(matches!(
        layout::check_no_overlap(&[2, 2], Some(&[1])),
        Err(Error::LengthMismatch { .. })
    ));
}

// ---------------------------------------------------------------------------------------
// Producer protocol
// ---------------------------------------------------------------------------------------

/// A producer handing out a raw tensor, remembering its deleter counter.
struct Hostile {
    reports: Option<Device>,
    raw: RawTensor,
    calls: Cell<usize>,
    counters: RefCell<Vec<Counter>>,
}

impl Hostile {
    fn new(reports: Option<Device>, actual: (u32, i32)) -> Self {
        let mut raw = RawTensor::new(&[1f32, 2.], F32);
        raw.device = actual;
        Hostile {
            reports,
            raw,
            calls: Cell::new(0),
            counters: RefCell::new(Vec::new()),
        }
    }

    fn released_once(&self) -> bool {
        self.counters.borrow().iter().all(|c| c.get() == 1)
    }
}

impl Exporter for Hostile {
    fn dlpack_device(&self) -> Option<Device> {
        self.reports
    }
    fn dlpack(&self, _request: &ExportRequest) -> dlpack_mpi::Result<ManagedTensor<'_>> {
        self.calls.set(self.calls.get() + 1);
        let (t, c) = self.raw.import_v1();
        self.counters.borrow_mut().push(c);
        t
    }
}

#[test]
fn exporter_lying_about_its_device_is_released_once() {
    for (reports, actual) in [
        (Device::CPU, (device_type::CUDA, 0)),
        (Device::CPU, (1, 1)),
        (Device::new(device_type::CUDA_HOST, 0), (1, 0)),
        (Device::new(u32::MAX, -1), (u32::MAX, 0)),
    ] {
        let e = Hostile::new(Some(reports), actual);
        let r = acquire(&e, &AcquireOptions::default());
        assert_eq!(
            r.unwrap_err(),
            Error::DeviceMismatch {
                reported_type: reports.device_type,
                reported_id: reports.device_id,
                actual_type: actual.0,
                actual_id: actual.1
            }
        );
        assert_eq!(e.calls.get(), 1);
        assert!(e.released_once());
    }
}

#[test]
fn exporter_without_device_query_returning_gpu_memory_is_released_once() {
    for dev in [
        device_type::CUDA,
        device_type::ROCM,
        device_type::CUDA_MANAGED,
    ] {
        let e = Hostile::new(None, (dev, 0));
        let r = acquire(&e, &AcquireOptions::default());
        assert!(
            matches!(r, Err(Error::UnsupportedDevice { device_type, .. }) if device_type == dev),
            "{r:?}"
        );
        assert!(e.released_once());
        // Unsynchronized: acquired, but no host path for specs.
        let unsync = AcquireOptions {
            stream: StreamPolicy::Unsynchronized,
            ..Default::default()
        };
        let t = acquire(&e, &unsync).unwrap();
        assert!(matches!(
            SendSpec::new(&t),
            Err(Error::UnsupportedDevice { .. })
        ));
        drop(t);
        assert!(e.released_once());
    }
}

#[test]
fn refusals_before_the_export_never_call_the_producer() {
    let e = Hostile::new(None, (1, 0));
    let strict = AcquireOptions {
        device_query: DeviceQuery::Required,
        ..Default::default()
    };
    assert_eq!(acquire(&e, &strict).unwrap_err(), Error::MissingDeviceQuery);
    let e2 = Hostile::new(Some(Device::new(device_type::CUDA, 3)), (2, 3));
    let zero = AcquireOptions {
        stream: StreamPolicy::Synchronize { stream: Some(0) },
        ..Default::default()
    };
    assert!(matches!(
        acquire(&e2, &zero),
        Err(Error::UnsupportedDevice {
            device_type: 2,
            device_id: 3,
            ..
        })
    ));
    assert_eq!((e.calls.get(), e2.calls.get()), (0, 0));
}

#[test]
fn exporter_handing_out_an_invalid_tensor_is_released_once() {
    let mut e = Hostile::new(Some(Device::CPU), (1, 0));
    e.raw.ndim = Some(-3);
    let r = acquire(&e, &AcquireOptions::default());
    assert!(
        matches!(r, Err(Error::InvalidTensor { ref field, value: -3, .. }) if field == "ndim"),
        "{r:?}"
    );
    assert_eq!(e.calls.get(), 1);
    assert!(e.released_once());
}

/// Found by fuzzing (fuzz/, target import_layout_spec): the offsets iterator stepped one
/// stride past an axis's last index before wrapping, which overflowed `i64` (a panic in
/// debug builds) for a valid layout whose reach fits but whose extent × stride does not.
/// The packing path of strided tensors walks these offsets.
#[test]
fn regression_offsets_of_a_stride_near_the_limit_do_not_overflow() {
    let stride = 288_230_376_151_711_502i64; // 32 × stride fits i64, 33 × stride does not
    let p = layout::plan(&[33], Some(&[stride])).unwrap();
    assert_eq!((p.lowest_elem, p.highest_elem), (0, 32 * stride));
    let offsets: Vec<i64> = p.offsets().collect();
    assert_eq!(offsets.len(), 33);
    assert_eq!(offsets[32], 32 * stride);
    assert!(offsets.windows(2).all(|w| w[1] - w[0] == stride));
    // Two axes, both at their limit, negative outer stride: wrap of the inner axis and the
    // last step of the outer one.
    let inner = i64::MAX / 4;
    let p = layout::plan(&[2, 3], Some(&[-(i64::MAX / 2), inner / 2])).unwrap();
    let offsets: Vec<i64> = p.offsets().collect();
    assert_eq!(
        offsets,
        vec![
            0,
            inner / 2,
            2 * (inner / 2),
            -(i64::MAX / 2),
            -(i64::MAX / 2) + inner / 2,
            -(i64::MAX / 2) + 2 * (inner / 2),
        ]
    );
    // The same layout through an imported tensor's plan: no panic, every offset visited.
    let raw = RawTensor::new(&[0u8], U8).shape(&[33], Some(&[stride]));
    with_tensor(&raw, |t| {
        let p = layout::plan(t.shape(), t.strides_elems()).unwrap();
        assert_eq!(p.offsets().last(), Some(32 * stride));
    });
}
