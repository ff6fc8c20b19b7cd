//! The dtypes of the matrix: every transferable DLPack type, its values (chosen so that
//! every reduction is exact in the type's own arithmetic, in any order: wrapping integer
//! sums, logical or, and the float sums' inputs of [`super::exact`]), and its reduction.

use dlpack_mpi::dtype::{code, DType, ReduceOp};
use num_complex::{Complex32, Complex64};

use super::exact::{self, Exact};
use super::kind::{Kind, Runner};

/// `v` as `S`, or zero where it does not fit.
fn wrap_int<S>(v: i64) -> S
where
    S: TryFrom<i64> + Default,
{
    S::try_from(v).unwrap_or_default()
}

/// A [`Kind`] of an integer type: wrapping sums, recognising saturated ones.
macro_rules! int_kind {
    ($name:literal, $t:ty, $code:expr, $bits:expr) => {
        Box::new(int_kind!(@kind $name, $t, $code, $bits)) as Box<dyn Runner>
    };
    (@kind $name:literal, $t:ty, $code:expr, $bits:expr) => {
        Kind::<$t> {
            name: $name,
            dtype: DType::new($code, $bits),
            per_elem: 1,
            value: |i, r| wrap_int::<$t>((i * 7 + i64::from(r) * 3).rem_euclid(101)),
            reduce: Some((ReduceOp::Sum, |a, b| a.wrapping_add(b))),
            saturating: Some((
                |a, b| a.saturating_add(b),
                |v| *v == <$t>::MAX || *v == <$t>::MIN,
            )),
            exact: None,
        }
    };
}

/// int32: also a member of the fused cases' mixed lists (`super::fused`).
pub(super) fn int32() -> Kind<i32> {
    int_kind!(@kind "int32", i32, code::INT, 32)
}

/// float32: also a member of the fused cases' mixed lists (`super::fused`).
pub(super) fn float32() -> Kind<f32> {
    Kind {
        name: "float32",
        dtype: DType::new(code::FLOAT, 32),
        per_elem: 1,
        value: |i, r| float_value(i, r) as f32,
        reduce: Some((ReduceOp::Sum, |a, b| a + b)),
        saturating: None,
        exact: Some(Exact {
            format: exact::FLOAT32,
            value: |g, i, r| g.value(i, r, 0) as f32,
        }),
    }
}

/// A float dtype's value at index `i` of rank `r` (sums take [`super::exact`]'s).
fn float_value(i: i64, r: i32) -> f64 {
    // Small integers and halves: exact in every float width.
    ((i * 5 + i64::from(r) * 11).rem_euclid(257) - 128) as f64 * 0.5
}

/// A transferred 8-bit dtype's value at index `i` of rank `r`: any byte.
fn byte_value(i: i64, r: i32) -> u8 {
    (i * 31 + i64::from(r) * 17 + 3).rem_euclid(256) as u8
}

/// Every dtype, in the order of the matrix (and of `--list`).
pub(super) fn kinds() -> Vec<Box<dyn Runner>> {
    let mut all = integers();
    all.extend(floats());
    all.extend(complexes_and_bytes());
    all
}

/// `bool` and the integers.
fn integers() -> Vec<Box<dyn Runner>> {
    vec![
        Box::new(Kind::<u8> {
            name: "bool",
            dtype: DType::new(code::BOOL, 8),
            per_elem: 1,
            value: |i, r| u8::from((i + i64::from(r)) % 3 == 0),
            reduce: Some((ReduceOp::LogicalOr, |a, b| u8::from(a != 0 || b != 0))),
            saturating: None,
            exact: None,
        }),
        int_kind!("int8", i8, code::INT, 8),
        int_kind!("int16", i16, code::INT, 16),
        Box::new(int32()),
        int_kind!("int64", i64, code::INT, 64),
        int_kind!("uint8", u8, code::UINT, 8),
        int_kind!("uint16", u16, code::UINT, 16),
        int_kind!("uint32", u32, code::UINT, 32),
        int_kind!("uint64", u64, code::UINT, 64),
    ]
}

/// The real floating-point types.
fn floats() -> Vec<Box<dyn Runner>> {
    vec![
        Box::new(float16()),
        Box::new(bfloat16()),
        Box::new(float32()),
        Box::new(float64()),
        Box::new(float32x4()),
    ]
}

// Half sums go through dlpack-mpi's user-defined operations (each add rounded to the
// format); their inputs keep every partial sum exact in the format at any rank count
// (super::exact), so the expected fold does not depend on MPI's order.

/// float16.
pub(super) fn float16() -> Kind<half::f16> {
    Kind {
        name: "float16",
        dtype: DType::new(code::FLOAT, 16),
        per_elem: 1,
        value: |i, r| half::f16::from_f64(float_value(i, r)),
        reduce: Some((ReduceOp::Sum, |a, b| {
            half::f16::from_f32(a.to_f32() + b.to_f32())
        })),
        saturating: None,
        exact: Some(Exact {
            format: exact::FLOAT16,
            value: |g, i, r| half::f16::from_f64(g.value(i, r, 0)),
        }),
    }
}

/// bfloat16.
pub(super) fn bfloat16() -> Kind<half::bf16> {
    Kind {
        name: "bfloat16",
        dtype: DType::new(code::BFLOAT, 16),
        per_elem: 1,
        value: |i, r| half::bf16::from_f64(((i * 5 + i64::from(r) * 11).rem_euclid(17) - 8) as f64),
        reduce: Some((ReduceOp::Sum, |a, b| {
            half::bf16::from_f32(a.to_f32() + b.to_f32())
        })),
        saturating: None,
        exact: Some(Exact {
            format: exact::BFLOAT16,
            value: |g, i, r| half::bf16::from_f64(g.value(i, r, 0)),
        }),
    }
}

/// float64.
pub(super) fn float64() -> Kind<f64> {
    Kind {
        name: "float64",
        dtype: DType::new(code::FLOAT, 64),
        per_elem: 1,
        value: float_value,
        reduce: Some((ReduceOp::Sum, |a, b| a + b)),
        saturating: None,
        exact: Some(Exact {
            format: exact::FLOAT64,
            value: |g, i, r| g.value(i, r, 0),
        }),
    }
}

/// float32x4: each lane a sum of its own.
pub(super) fn float32x4() -> Kind<f32> {
    Kind {
        name: "float32x4",
        dtype: DType::new(code::FLOAT, 32).with_lanes(4),
        per_elem: 4,
        exact: Some(Exact {
            format: exact::FLOAT32,
            value: |g, i, r| g.value(i, r, 0) as f32,
        }),
        ..float32()
    }
}

/// complex64: each component a sum of its own.
pub(super) fn complex64() -> Kind<Complex32> {
    Kind {
        name: "complex64",
        dtype: DType::new(code::COMPLEX, 64),
        per_elem: 1,
        value: |i, r| Complex32::new(float_value(i, r) as f32, float_value(i + 3, -r) as f32),
        reduce: Some((ReduceOp::Sum, |a, b| a + b)),
        saturating: None,
        exact: Some(Exact {
            format: exact::FLOAT32,
            value: |g, i, r| Complex32::new(g.value(i, r, 0) as f32, g.value(i, r, 1) as f32),
        }),
    }
}

/// complex128: each component a sum of its own.
pub(super) fn complex128() -> Kind<Complex64> {
    Kind {
        name: "complex128",
        dtype: DType::new(code::COMPLEX, 128),
        per_elem: 1,
        value: |i, r| Complex64::new(float_value(i, r), float_value(i + 3, -r)),
        reduce: Some((ReduceOp::Sum, |a, b| a + b)),
        saturating: None,
        exact: Some(Exact {
            format: exact::FLOAT64,
            value: |g, i, r| Complex64::new(g.value(i, r, 0), g.value(i, r, 1)),
        }),
    }
}

/// The complex types, and the 8-bit floats (transferred, not reduced).
fn complexes_and_bytes() -> Vec<Box<dyn Runner>> {
    let transfer_u8 = |name: &'static str, c: u8| -> Box<dyn Runner> {
        Box::new(Kind::<u8> {
            name,
            dtype: DType::new(c, 8),
            per_elem: 1,
            value: byte_value,
            reduce: None,
            saturating: None,
            exact: None,
        })
    };
    let transfer_u32 = |name: &'static str, c: u8| -> Box<dyn Runner> {
        Box::new(Kind::<u32> {
            name,
            dtype: DType::new(c, 32),
            per_elem: 1,
            value: |i, r| (i as u32).wrapping_mul(2_654_435_761) ^ (r as u32).wrapping_mul(40_503),
            reduce: None,
            saturating: None,
            exact: None,
        })
    };
    vec![
        transfer_u32("complex32", code::COMPLEX),
        Box::new(complex64()),
        Box::new(complex128()),
        transfer_u8("float8_e3m4", 7),
        transfer_u8("float8_e4m3", 8),
        transfer_u8("float8_e4m3b11fnuz", 9),
        transfer_u8("float8_e4m3fn", 10),
        transfer_u8("float8_e4m3fnuz", 11),
        transfer_u8("float8_e5m2", 12),
        transfer_u8("float8_e5m2fnuz", 13),
        transfer_u8("float8_e8m0fnu", 14),
        transfer_u32("bcomplex32", code::BCOMPLEX),
    ]
}
