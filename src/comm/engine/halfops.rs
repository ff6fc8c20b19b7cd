//! Sum, product, min and max for float16 and bfloat16: user-defined MPI operations, or the
//! MPI library's own where it has them and they round as these do.
//!
//! MPI-4.1 has no predefined half-precision types, so these dtypes travel as `MPI_UINT16_T`
//! units and reduce through `MPI_Op_create` operations (MPI-4.1 §6.9.5) that reinterpret
//! the bits. MPICH ≥ 5 defines `MPIX_C_FLOAT16` and `MPIX_BFLOAT16`, which its predefined
//! `MPI_SUM`, `MPI_PROD`, `MPI_MIN` and `MPI_MAX` reduce — but not necessarily as these do:
//! MPICH 5.0.2's `MPIX_BFLOAT16` sum rounds ties away from zero (`1 + (1 + 2^-7)` gives
//! `2 + 2^-6`, not `2`), one unit in the last place off the correctly rounded sum for about
//! half of the ties (issue 34), and its `MPIX_C_FLOAT16` min and max return a NaN operand
//! where these return the other one. So which reduces is decided per dtype and operation
//! ([`choice`]):
//!
//! - [`HalfOps::Auto`](crate::settings::HalfOps::Auto), the default: MPI's own datatype
//!   and predefined operation only where this build's `mpi.h` has the datatype and the
//!   **rounding probe** ([`probe`]) found them to give, bit for bit, what this crate's
//!   operation gives, else this crate's operations (under MPICH 5.0.2: float16 sums and
//!   products by MPICH's; float16 min and max, and every bfloat16 operation, by this
//!   crate's). The probe runs once per process (the first time a half reduction asks,
//!   after `MPI_Init`; cached), purely locally: `MPI_Reduce_local` with MPI's datatype and
//!   operation over 700 to 1100 operand pairs per operation — ties (rounding down and up to
//!   even, at overflow, in the subnormal range), near ties, signed zeros, subnormals,
//!   infinities, NaNs and pseudo-random pairs — compared with this crate's operation on the
//!   same pairs (two NaNs count as the same whatever their payloads; for min and max, `+0`
//!   against `-0` is left out, its order being open). Every rank of a job loads the same MPI
//!   library, so the probe answers the same on every rank, and the ranks choose the same
//!   form; the agreement's signature carries the form all the same, so ranks that differ
//!   (another setting, another library) get [`Error::CollectiveMismatch`] rather than a
//!   reduction of mismatched datatypes.
//! - [`HalfOps::Mpi`](crate::settings::HalfOps::Mpi): MPI's own wherever its `mpi.h` has
//!   the datatype, probe or not: not guaranteed correctly rounded (under MPICH 5.0.2 the
//!   bfloat16 sums are not); for interoperating with ranks that reduce with those
//!   datatypes (mpi4py's `FLOAT16_T`/`BFLOAT16_T`).
//! - [`HalfOps::Library`](crate::settings::HalfOps::Library): this crate's throughout.
//!
//! MPICH 5.0.2 aborts the job on `MPI_PROD`, `MPI_MIN` and `MPI_MAX` of `MPIX_BFLOAT16`
//! ([`native_takes`]): those are never probed nor used, whatever the setting.
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
use std::fmt;
use std::sync::OnceLock;

use half::{bf16, f16};
use mpi::ffi::{MPI_Datatype, MPI_Op};
use mpi::raw::AsRaw;

use crate::dtype::{code, DType, ReduceOp};
use crate::error::{Error, Result};
use crate::settings::HalfOps;

mod probe;
use probe::outcome;
pub use probe::{probe, ProbeOutcome};

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

/// An MPI user function (MPI-4.1 §6.9.5, `MPI_User_function`).
type UserFn = unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_int, *mut MPI_Datatype);

/// This crate's operations, in the order of [`op_index`].
const FUNCTIONS: [UserFn; 8] = [
    f16_sum, f16_prod, f16_min, f16_max, bf16_sum, bf16_prod, bf16_min, bf16_max,
];

#[derive(Clone, Copy)]
struct Ops([MPI_Op; 8]);

// SAFETY: MPI_Op handles are opaque values, valid on every thread.
unsafe impl Send for Ops {}
// SAFETY: as above; never mutated after creation.
unsafe impl Sync for Ops {}

/// Whether MPI is initialized and not finalized, else [`Error::MpiNotInitialized`].
fn mpi_running() -> Result<()> {
    if !mpi::environment::is_initialized() || mpi::environment::is_finalized() {
        return Err(Error::MpiNotInitialized);
    }
    Ok(())
}

fn ops() -> Result<&'static Ops> {
    mpi_running()?;
    static OPS: OnceLock<Ops> = OnceLock::new();
    Ok(OPS.get_or_init(|| {
        // SAFETY: MPI_Op is a handle (a pointer in Open MPI, an int in MPICH): all-zero is a
        // valid placeholder, overwritten below.
        let mut handles: [MPI_Op; 8] = unsafe { std::mem::zeroed() };
        for (h, f) in handles.iter_mut().zip(FUNCTIONS) {
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
    native_handle(DType::new(code::FLOAT, 16)).is_some()
}

/// MPI's own datatype for the half dtype `dtype`, where this build's `mpi.h` defines it.
fn native_handle(dtype: DType) -> Option<MPI_Datatype> {
    if !is_half(dtype) {
        return None;
    }
    // SAFETY: returns a predefined handle (a constant of mpi.h), or MPI_DATATYPE_NULL.
    let native = unsafe { dlpack_mpi_native_half(c_int::from(dtype.code == code::BFLOAT)) };
    // SAFETY: a predefined handle constant, read without MPI calls.
    let null = unsafe { mpi::ffi::RSMPI_DATATYPE_NULL };
    (native != null).then_some(native)
}

/// The MPI library's own datatype for the half dtype `dtype` (`MPIX_C_FLOAT16`,
/// `MPIX_BFLOAT16`), when this build's `mpi.h` defines it and [`crate::settings::half_ops`]
/// is not [`HalfOps::Library`]; `None` otherwise. Whether a reduction uses it depends on
/// the operation and, under [`HalfOps::Auto`], on the rounding probe: [`choice`] says.
///
/// # Errors
/// [`Error::InvalidSetting`] from [`crate::settings::half_ops`].
pub fn native_datatype(dtype: DType) -> Result<Option<MPI_Datatype>> {
    if !is_half(dtype) || crate::settings::half_ops()? == HalfOps::Library {
        return Ok(None);
    }
    Ok(native_handle(dtype))
}

/// How [`reduction`] reduces one half dtype with one operation, and why ([`choice`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Choice {
    /// MPI's own datatype and predefined operation: [`HalfOps::Auto`], and the rounding
    /// probe found them to give this crate's results bit for bit ([`probe`]).
    MpiProbed,
    /// MPI's own datatype and predefined operation, because [`HalfOps::Mpi`] asks for them
    /// (not checked: MPI's rounding).
    MpiAsked,
    /// This crate's operations: [`HalfOps::Library`] asks for them.
    LibraryAsked,
    /// This crate's operations: this build's `mpi.h` has no half datatypes (every MPI but
    /// MPICH ≥ 5).
    NoMpiDatatype,
    /// This crate's operations: MPI's own aborts the job on this operation (MPICH 5.0.2 on
    /// `MPI_PROD`, `MPI_MIN` and `MPI_MAX` of `MPIX_BFLOAT16`, [`native_takes`]).
    MpiAborts,
    /// This crate's operations: [`HalfOps::Auto`], and the rounding probe found MPI's own
    /// to give other bits than this crate's ([`probe`]): a sum or product not correctly
    /// rounded (MPICH 5.0.2's bfloat16 sum), or a min or max that returns a NaN operand
    /// where this crate returns the other one (MPICH 5.0.2's float16 min and max).
    ProbeDiffers,
}

impl Choice {
    /// Whether the reduction goes through MPI's own datatype and predefined operation.
    pub fn is_mpi(self) -> bool {
        matches!(self, Choice::MpiProbed | Choice::MpiAsked)
    }
}

impl fmt::Display for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Choice::MpiProbed => "MPI's own (the rounding probe matched dlpack-mpi's)",
            Choice::MpiAsked => "MPI's own (DLPACK_MPI_HALF_OPS=mpi: not checked for rounding)",
            Choice::LibraryAsked => "dlpack-mpi's (DLPACK_MPI_HALF_OPS=library)",
            Choice::NoMpiDatatype => {
                "dlpack-mpi's (this MPI's mpi.h has no MPIX_C_FLOAT16/MPIX_BFLOAT16)"
            }
            Choice::MpiAborts => "dlpack-mpi's (MPICH 5.0.2 aborts on MPI's own)",
            Choice::ProbeDiffers => "dlpack-mpi's (MPI's own gave other results in the probe)",
        })
    }
}

/// How [`reduction`] reduces the half dtype `dtype` with `op`, and why: the setting
/// ([`crate::settings::half_ops`]), whether this build's `mpi.h` has the datatype, whether
/// MPI's own takes the operation ([`native_takes`]), and under [`HalfOps::Auto`] the
/// rounding probe ([`probe`], run here the first time it is needed). The same on every
/// rank that loads the same MPI library with the same setting. For a dtype that is not half,
/// [`Choice::NoMpiDatatype`], whatever the setting.
///
/// # Errors
/// [`Error::InvalidSetting`] from the setting; [`Error::UnsupportedReduction`] for an
/// operation other than sum, product, min and max on a half dtype;
/// [`Error::MpiNotInitialized`] when the probe must run and MPI is not running.
pub fn choice(dtype: DType, op: ReduceOp) -> Result<Choice> {
    if !is_half(dtype) {
        return Ok(Choice::NoMpiDatatype);
    }
    op_index(dtype, op)?;
    decide(
        crate::settings::half_ops()?,
        native_handle(dtype).is_some(),
        native_takes(dtype, op),
        || Ok(outcome(probe()?, dtype, op).is_some_and(ProbeOutcome::matches)),
    )
}

/// The decision of [`choice`] from its facts: the setting, whether `mpi.h` has the
/// datatype (`declared`), whether MPI's own takes the operation (`takes`), and the probe's
/// verdict, asked only under [`HalfOps::Auto`] where the other two allow MPI's own.
fn decide(
    setting: HalfOps,
    declared: bool,
    takes: bool,
    probe_matches: impl FnOnce() -> Result<bool>,
) -> Result<Choice> {
    Ok(match setting {
        HalfOps::Library => Choice::LibraryAsked,
        _ if !declared => Choice::NoMpiDatatype,
        _ if !takes => Choice::MpiAborts,
        HalfOps::Mpi => Choice::MpiAsked,
        HalfOps::Auto if probe_matches()? => Choice::MpiProbed,
        HalfOps::Auto => Choice::ProbeDiffers,
    })
}

/// The datatype and operation that reduce `dtype` with `op` when its units travel as
/// `unit` (the element's own datatype): MPI's own half-precision datatype and predefined
/// operation where [`choice`] says so, or `unit` and the user-defined operation ([`op`]).
///
/// # Errors
/// As [`op`] and [`choice`].
pub fn reduction(dtype: DType, op: ReduceOp, unit: MPI_Datatype) -> Result<(MPI_Datatype, MPI_Op)> {
    let index = op_index(dtype, op)?;
    match (choice(dtype, op)?.is_mpi(), native_handle(dtype)) {
        (true, Some(native)) => Ok((native, op.system_operation().as_raw())),
        _ => Ok((unit, ops()?.0[index])),
    }
}

/// Whether MPI's own half datatype of `dtype` may be used for `op`: every operation on
/// float16; on bfloat16 only the sum. MPICH 5.0.2 implements `MPI_PROD`, `MPI_MIN` and
/// `MPI_MAX` on `MPIX_C_FLOAT16` but aborts the job on them for `MPIX_BFLOAT16`
/// (`Assertion failed in file src/mpi/coll/op/op_fns.c`, lines 88, 268 and 286): those stay
/// on this crate's operations, and the probe does not try them.
pub fn native_takes(dtype: DType, op: ReduceOp) -> bool {
    dtype.code != code::BFLOAT || op == ReduceOp::Sum
}

/// Whether [`reduction`] reduces the half dtype `dtype` with `op` through MPI's own
/// datatype (`false` also for a dtype that is not half, and when [`choice`] fails:
/// [`check`] refuses that). Ranks that answer differently put different datatypes into one
/// reduction, so the agreement's signature carries the answer ([`super::signature`]).
pub(crate) fn reduces_natively(dtype: DType, op: ReduceOp) -> bool {
    is_half(dtype) && matches!(choice(dtype, op), Ok(c) if c.is_mpi())
}

/// The refusals of [`reduction`] for `dtype` and `op`, without a datatype.
///
/// # Errors
/// As [`reduction`].
pub fn check(dtype: DType, op: ReduceOp) -> Result<()> {
    op_index(dtype, op)?;
    if !choice(dtype, op)?.is_mpi() {
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

    /// The decision of [`choice`]: the setting first, then the datatype, then the operation,
    /// and only under `Auto` with both allowed the probe, which is asked nowhere else.
    #[test]
    fn the_probe_decides_only_auto() {
        use std::cell::Cell;
        let asked = Cell::new(0);
        let probe = |verdict: bool| {
            let asked = &asked;
            move || {
                asked.set(asked.get() + 1);
                Ok(verdict)
            }
        };
        let cases = [
            (HalfOps::Library, true, true, true, Choice::LibraryAsked, 0),
            (
                HalfOps::Library,
                false,
                false,
                false,
                Choice::LibraryAsked,
                0,
            ),
            (HalfOps::Auto, false, true, true, Choice::NoMpiDatatype, 0),
            (HalfOps::Mpi, false, true, true, Choice::NoMpiDatatype, 0),
            (HalfOps::Auto, true, false, true, Choice::MpiAborts, 0),
            (HalfOps::Mpi, true, false, true, Choice::MpiAborts, 0),
            (HalfOps::Mpi, true, true, false, Choice::MpiAsked, 0),
            (HalfOps::Auto, true, true, true, Choice::MpiProbed, 1),
            (HalfOps::Auto, true, true, false, Choice::ProbeDiffers, 1),
        ];
        for (setting, declared, takes, verdict, want, probes) in cases {
            asked.set(0);
            let got = decide(setting, declared, takes, probe(verdict)).unwrap();
            assert_eq!(
                (got, asked.get()),
                (want, probes),
                "{setting:?} declared {declared} takes {takes} probe {verdict}"
            );
            assert_eq!(
                got.is_mpi(),
                matches!(want, Choice::MpiProbed | Choice::MpiAsked)
            );
        }
        // A probe that cannot run (MPI not initialized) is the decision's error.
        let failed = decide(HalfOps::Auto, true, true, || Err(Error::MpiNotInitialized));
        assert!(matches!(failed, Err(Error::MpiNotInitialized)));
    }

    /// Without MPI (a unit test), no half datatype is probed: the choice is the setting's
    /// where it needs no probe, and the probe itself is refused.
    #[test]
    fn without_mpi_the_probe_is_refused() {
        assert!(matches!(probe(), Err(Error::MpiNotInitialized)));
        let f16 = DType::new(code::FLOAT, 16);
        assert!(matches!(
            choice(f16, ReduceOp::BitwiseOr),
            Err(Error::UnsupportedReduction { .. })
        ));
        assert_eq!(
            choice(DType::new(code::FLOAT, 32), ReduceOp::Sum).unwrap(),
            Choice::NoMpiDatatype
        );
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
