//! Sum, product, min and max for float16 and bfloat16: user-defined MPI operations, or the
//! MPI library's own where it has them.
//!
//! MPI-4.1 has no predefined half-precision types, so these dtypes travel as `MPI_UINT16_T`
//! units and reduce through `MPI_Op_create` operations (MPI-4.1 §6.9.5) that reinterpret
//! the bits. MPICH ≥ 5 defines `MPIX_C_FLOAT16` and `MPIX_BFLOAT16`, which its predefined
//! `MPI_SUM`, `MPI_PROD`, `MPI_MIN` and `MPI_MAX` reduce (correctly rounded, round to
//! nearest even, as here); where this build's `mpi.h` has both, [`reduction`] uses them
//! unless [`crate::settings::HalfOps::Library`] is set ([`native_datatype`] says which).
//!
//! **Numerics.** MPI reductions are element-wise: each application of the operation combines
//! two values. Here each application widens both operands to `f32`, computes there, and
//! rounds the result to the half format once. Because `f32` carries at least `2p + 2`
//! significand bits for both half formats (p = 11 for float16, 8 for bfloat16), this double
//! rounding equals a correctly rounded half-precision operation (Figueroa, "When is double
//! rounding innocuous?", SIGNUM 1995): every step is exactly the IEEE result in the half
//! format, round-to-nearest-even. As for any floating-point reduction, the order in which
//! MPI combines ranks can change the last bit of a sum over more than two ranks.
//! `min`/`max` return the smaller/larger operand; if one operand is NaN the other is
//! returned (IEEE `minNum`/`maxNum`), like `f32::min`.

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use half::{bf16, f16};
use mpi::ffi::{MPI_Datatype, MPI_Op};
use mpi::raw::AsRaw;

use crate::dtype::{code, DType, ReduceOp};
use crate::error::{Error, Result};

macro_rules! half_op {
    ($name:ident, $t:ty, |$a:ident, $b:ident| $body:expr) => {
        unsafe extern "C" fn $name(
            invec: *mut c_void,
            inoutvec: *mut c_void,
            len: *mut c_int,
            _datatype: *mut MPI_Datatype,
        ) {
            // SAFETY: MPI passes `*len` units of MPI_UINT16_T in both vectors (the datatype
            // every caller in this crate uses with these operations); reads and writes are
            // unaligned-safe.
            unsafe {
                let n = usize::try_from(*len).unwrap_or(0);
                let x = invec.cast::<u16>().cast_const();
                let y = inoutvec.cast::<u16>();
                for i in 0..n {
                    let $a = <$t>::from_bits(x.add(i).read_unaligned()).to_f32();
                    let $b = <$t>::from_bits(y.add(i).read_unaligned()).to_f32();
                    y.add(i).write_unaligned(<$t>::from_f32($body).to_bits());
                }
            }
        }
    };
}

half_op!(f16_sum, f16, |a, b| a + b);
half_op!(f16_prod, f16, |a, b| a * b);
half_op!(f16_min, f16, |a, b| a.min(b));
half_op!(f16_max, f16, |a, b| a.max(b));
half_op!(bf16_sum, bf16, |a, b| a + b);
half_op!(bf16_prod, bf16, |a, b| a * b);
half_op!(bf16_min, bf16, |a, b| a.min(b));
half_op!(bf16_max, bf16, |a, b| a.max(b));

#[derive(Clone, Copy)]
struct Ops([MPI_Op; 8]);

// SAFETY: MPI_Op handles are opaque values, valid on every thread.
unsafe impl Send for Ops {}
// SAFETY: as above; never mutated after creation.
unsafe impl Sync for Ops {}

fn ops() -> Result<&'static Ops> {
    if !mpi::environment::is_initialized() || mpi::environment::is_finalized() {
        return Err(Error::MpiNotInitialized);
    }
    static OPS: OnceLock<Ops> = OnceLock::new();
    Ok(OPS.get_or_init(|| {
        type UserFn = unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_int, *mut MPI_Datatype);
        let functions: [UserFn; 8] = [
            f16_sum, f16_prod, f16_min, f16_max, bf16_sum, bf16_prod, bf16_min, bf16_max,
        ];
        // SAFETY: MPI_Op is a handle (a pointer in Open MPI, an int in MPICH): all-zero is a
        // valid placeholder, overwritten below.
        let mut handles: [MPI_Op; 8] = unsafe { std::mem::zeroed() };
        for (h, f) in handles.iter_mut().zip(functions) {
            // SAFETY: the functions follow MPI's user-function contract; all four operations
            // are commutative. The handles live until MPI_Finalize.
            unsafe { mpi::ffi::MPI_Op_create(Some(f), 1, h) };
        }
        Ops(handles)
    }))
}

/// Whether `dtype` reduces through these user-defined operations.
pub fn is_half(dtype: DType) -> bool {
    matches!(
        (dtype.code, dtype.bits),
        (code::FLOAT, 16) | (code::BFLOAT, 16)
    )
}

extern "C" {
    /// `MPIX_C_FLOAT16` (0) or `MPIX_BFLOAT16` (1), or `MPI_DATATYPE_NULL`, from
    /// `src/shim.c`.
    fn dlpack_mpi_native_half(which: c_int) -> MPI_Datatype;
}

/// Whether this build's `mpi.h` defines MPI's own half datatypes (`MPIX_C_FLOAT16` and
/// `MPIX_BFLOAT16`: MPICH ≥ 5), whatever [`crate::settings::half_ops`] says.
pub fn native_available() -> bool {
    // SAFETY: returns a predefined handle (a constant of mpi.h), or MPI_DATATYPE_NULL.
    let native = unsafe { dlpack_mpi_native_half(0) };
    // SAFETY: a predefined handle constant, read without MPI calls.
    native != unsafe { mpi::ffi::RSMPI_DATATYPE_NULL }
}

/// The MPI library's own datatype for the half dtype `dtype` (`MPIX_C_FLOAT16`,
/// `MPIX_BFLOAT16`), when this build's `mpi.h` defines it and [`crate::settings::half_ops`]
/// is [`crate::settings::HalfOps::Auto`]; `None`: the user-defined operations reduce it.
///
/// # Errors
/// [`Error::InvalidSetting`] from [`crate::settings::half_ops`].
pub fn native_datatype(dtype: DType) -> Result<Option<MPI_Datatype>> {
    if !is_half(dtype) || crate::settings::half_ops()? == crate::settings::HalfOps::Library {
        return Ok(None);
    }
    // SAFETY: returns a predefined handle (a constant of mpi.h), or MPI_DATATYPE_NULL.
    let native = unsafe { dlpack_mpi_native_half(c_int::from(dtype.code == code::BFLOAT)) };
    // SAFETY: a predefined handle constant, read without MPI calls.
    let null = unsafe { mpi::ffi::RSMPI_DATATYPE_NULL };
    Ok((native != null).then_some(native))
}

/// The datatype and operation that reduce `dtype` with `op` when its units travel as
/// `unit` (the element's own datatype): MPI's own half-precision datatype and predefined
/// operation ([`native_datatype`]), or `unit` and the user-defined operation ([`op`]).
///
/// # Errors
/// As [`op`] and [`native_datatype`].
pub fn reduction(dtype: DType, op: ReduceOp, unit: MPI_Datatype) -> Result<(MPI_Datatype, MPI_Op)> {
    let index = op_index(dtype, op)?;
    match native_datatype(dtype)? {
        Some(native) if native_takes(dtype, op) => Ok((native, op.system_operation().as_raw())),
        _ => Ok((unit, ops()?.0[index])),
    }
}

/// Whether MPI's own half datatype of `dtype` is used for `op`: every operation on
/// float16; on bfloat16 only the sum. MPICH 5.0.2 implements `MPI_PROD`, `MPI_MIN` and
/// `MPI_MAX` on `MPIX_C_FLOAT16` but aborts the job on them for `MPIX_BFLOAT16`
/// (`Assertion failed in file src/mpi/coll/op/op_fns.c`, lines 88, 268 and 286): those stay
/// on this crate's operations.
pub fn native_takes(dtype: DType, op: ReduceOp) -> bool {
    dtype.code != code::BFLOAT || op == ReduceOp::Sum
}

/// Whether [`reduction`] reduces the half dtype `dtype` with `op` through MPI's own
/// datatype (`false` also for a dtype that is not half, and when the setting is invalid:
/// [`check`] refuses that). Ranks that answer differently put different datatypes into one
/// reduction, so the agreement's signature carries the answer ([`super::signature`]).
pub(crate) fn reduces_natively(dtype: DType, op: ReduceOp) -> bool {
    matches!(native_datatype(dtype), Ok(Some(_))) && native_takes(dtype, op)
}

/// The refusals of [`reduction`] for `dtype` and `op`, without a datatype.
///
/// # Errors
/// As [`reduction`].
pub fn check(dtype: DType, op: ReduceOp) -> Result<()> {
    op_index(dtype, op)?;
    if native_datatype(dtype)?.is_none() || !native_takes(dtype, op) {
        ops()?;
    }
    Ok(())
}

/// The index of `op` on `dtype` in [`Ops`].
fn op_index(dtype: DType, op: ReduceOp) -> Result<usize> {
    let base = if dtype.code == code::BFLOAT { 4 } else { 0 };
    let index = match op {
        ReduceOp::Sum => 0,
        ReduceOp::Product => 1,
        ReduceOp::Min => 2,
        ReduceOp::Max => 3,
        _ => {
            return Err(Error::UnsupportedReduction {
                op,
                dtype,
                allowed: "sum, prod, min, max".into(),
            })
        }
    };
    Ok(base + index)
}

/// The user-defined operation for `op` on a half dtype (on `MPI_UINT16_T` units).
///
/// # Errors
/// [`Error::MpiNotInitialized`]; [`Error::UnsupportedReduction`] for operations other than
/// sum, product, min and max.
pub fn op(dtype: DType, op: ReduceOp) -> Result<MPI_Op> {
    let index = op_index(dtype, op)?;
    Ok(ops()?.0[index])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(
        f: unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_int, *mut MPI_Datatype),
        a: &[u16],
        b: &mut [u16],
    ) {
        let mut n = c_int::try_from(a.len()).expect("test slices are short");
        // SAFETY: two buffers of n u16 each; the datatype is not read.
        unsafe {
            f(
                a.as_ptr() as *mut c_void,
                b.as_mut_ptr().cast(),
                &mut n,
                std::ptr::null_mut(),
            )
        };
    }

    /// MPI hands a user-defined operation the user's buffers, which DLPack lets start at
    /// any byte (`byte_offset` 1, a shifted `data`): every operation reads and writes its
    /// 2-byte elements unaligned, at each of the two offsets (a test that Miri, through
    /// scripts/miri.sh, checks for misaligned accesses).
    #[test]
    fn half_ops_at_any_address() {
        let a = [f16::from_f32(1.5), f16::from_f32(-2.0), f16::from_f32(8.0)];
        let b = [f16::from_f32(0.25), f16::from_f32(3.0), f16::from_f32(-1.0)];
        for (x_at, y_at) in [(1usize, 0usize), (0, 1), (1, 3)] {
            let mut x = vec![0u8; 8 + x_at];
            let mut y = vec![0u8; 8 + y_at];
            for i in 0..3 {
                x[x_at + 2 * i..x_at + 2 * i + 2].copy_from_slice(&a[i].to_bits().to_ne_bytes());
                y[y_at + 2 * i..y_at + 2 * i + 2].copy_from_slice(&b[i].to_bits().to_ne_bytes());
            }
            let mut n: c_int = 3;
            // SAFETY: three 2-byte elements from each (unaligned) start; the datatype is not
            // read.
            unsafe {
                f16_sum(
                    x.as_mut_ptr().add(x_at).cast(),
                    y.as_mut_ptr().add(y_at).cast(),
                    &mut n,
                    std::ptr::null_mut(),
                )
            };
            let got: Vec<f32> = (0..3)
                .map(|i| {
                    let bytes = [y[y_at + 2 * i], y[y_at + 2 * i + 1]];
                    f16::from_bits(u16::from_ne_bytes(bytes)).to_f32()
                })
                .collect();
            assert_eq!(got, [1.75, 1.0, 7.0], "x at {x_at}, y at {y_at}");
            assert!(x[..x_at].iter().chain(&y[..y_at]).all(|&v| v == 0));
        }
    }

    #[test]
    fn half_sums_are_correctly_rounded() {
        // 1 + 2^-11 is halfway between 1 and the next float16 (1 + 2^-10): ties to even -> 1.
        let one = f16::ONE.to_bits();
        let tiny = f16::from_f32(2f32.powi(-11)).to_bits();
        let mut out = [tiny];
        apply(f16_sum, &[one], &mut out);
        assert_eq!(f16::from_bits(out[0]), f16::ONE);
        // Exhaustively against f64 reference rounding for a slice of operand pairs.
        for a in (0u16..0x7c00).step_by(97) {
            for b in (0u16..0x7c00).step_by(89) {
                let mut out = [b];
                apply(f16_sum, &[a], &mut out);
                let exact = f16::from_bits(a).to_f64() + f16::from_bits(b).to_f64();
                assert_eq!(out[0], f16::from_f64(exact).to_bits(), "{a:#x} + {b:#x}");
            }
        }
        let mut out = [bf16::from_f32(3.0).to_bits()];
        apply(bf16_prod, &[bf16::from_f32(-2.5).to_bits()], &mut out);
        assert_eq!(bf16::from_bits(out[0]).to_f32(), -7.5);
        let mut out = [f16::from_f32(1.0).to_bits(), f16::NAN.to_bits()];
        apply(
            f16_max,
            &[f16::from_f32(-4.0).to_bits(), f16::from_f32(2.0).to_bits()],
            &mut out,
        );
        assert_eq!(
            (
                f16::from_bits(out[0]).to_f32(),
                f16::from_bits(out[1]).to_f32()
            ),
            (1.0, 2.0)
        );
    }
}
