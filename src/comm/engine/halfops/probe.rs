//! The rounding probe of [`super`]: whether MPI's own half-precision datatype and predefined
//! operation give, bit for bit, what this crate's user-defined operation gives, on operand
//! pairs chosen to expose a rounding that is not to nearest even (issue 34: MPICH 5.0.2's
//! `MPIX_BFLOAT16` sum rounds ties away from zero).
//!
//! One `MPI_Reduce_local` (MPI-4.1 §6.9.7) per half dtype and operation that MPI's own may
//! take ([`super::native_takes`]), on 700 to 1100 pairs, once per process: local, no
//! communication, microseconds. Its answer depends only on the MPI library loaded, which is
//! the same on every rank of a job, so every rank decides alike.

use std::ffi::c_int;
use std::fmt;
use std::sync::OnceLock;

use half::{bf16, f16};
use mpi::raw::AsRaw;

use super::{mpi_running, native_handle, native_takes, op_index, FUNCTIONS};
use crate::dtype::{code, DType, ReduceOp};
use crate::error::Result;

/// What the rounding probe found for MPI's own datatype with one operation ([`probe`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeOutcome {
    /// The half dtype (float16: `MPIX_C_FLOAT16`; bfloat16: `MPIX_BFLOAT16`).
    pub dtype: DType,
    /// The operation (MPI's predefined one of the same name).
    pub op: ReduceOp,
    /// How many operand pairs MPI's own reduced.
    pub cases: usize,
    /// How many of its results differ from this crate's operation's (two NaNs are the same
    /// whatever their payloads); every case when `MPI_Reduce_local` failed.
    pub differing: usize,
    /// The first pair whose results differ, as element bits: `[a, b, MPI's result, this
    /// crate's result]` (`a` the input operand, `b` the in-out one).
    pub first_difference: Option<[u16; 4]>,
    /// The error code `MPI_Reduce_local` returned, when it failed.
    pub mpi_error: Option<i32>,
}

impl ProbeOutcome {
    /// Whether MPI's own gave this crate's results for every pair.
    pub fn matches(&self) -> bool {
        self.differing == 0 && self.mpi_error.is_none()
    }
}

impl fmt::Display for ProbeOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let datatype = if self.dtype.code == code::BFLOAT {
            "MPIX_BFLOAT16"
        } else {
            "MPIX_C_FLOAT16"
        };
        let (op, _) = spelled(self.op, 0, 0);
        match (self.mpi_error, self.first_difference) {
            (Some(rc), _) => write!(f, "{datatype} with {op}: MPI_Reduce_local returned {rc}"),
            (None, Some([a, b, theirs, ours])) => write!(
                f,
                "{datatype} with {op}: {} of {} results differ from dlpack-mpi's, which {} \
                 (first {} = {theirs:#06x}, not {ours:#06x})",
                self.differing,
                self.cases,
                if matches!(self.op, ReduceOp::Min | ReduceOp::Max) {
                    "return the other operand where one is NaN (IEEE minNum, maxNum)"
                } else {
                    "are correctly rounded"
                },
                spelled(self.op, a, b).1
            ),
            (None, None) => write!(
                f,
                "{datatype} with {op}: all {} results as dlpack-mpi's",
                self.cases
            ),
        }
    }
}

/// The rounding probe's outcomes, one per half dtype and operation MPI's own datatype may
/// reduce ([`super::native_takes`]: float16 sum, product, min and max; bfloat16 sum); empty
/// where this build's `mpi.h` has no half datatypes. Run on the first call (after
/// `MPI_Init`), whatever the setting, and kept for the life of the process.
///
/// # Errors
/// [`crate::Error::MpiNotInitialized`] before `MPI_Init` or after `MPI_Finalize`.
pub fn probe() -> Result<&'static [ProbeOutcome]> {
    mpi_running()?;
    static PROBE: OnceLock<Vec<ProbeOutcome>> = OnceLock::new();
    Ok(PROBE.get_or_init(|| {
        let mut outcomes = Vec::new();
        for dtype in [DType::new(code::FLOAT, 16), DType::new(code::BFLOAT, 16)] {
            let Some(native) = native_handle(dtype) else {
                continue;
            };
            for op in [
                ReduceOp::Sum,
                ReduceOp::Product,
                ReduceOp::Min,
                ReduceOp::Max,
            ] {
                if native_takes(dtype, op) {
                    outcomes.push(run(dtype, op, native));
                }
            }
        }
        outcomes
    }))
}

/// The outcome of `dtype` with `op` among `outcomes`, if it was probed.
pub(super) fn outcome(
    outcomes: &[ProbeOutcome],
    dtype: DType,
    op: ReduceOp,
) -> Option<&ProbeOutcome> {
    outcomes.iter().find(|o| o.dtype == dtype && o.op == op)
}

/// Reduces the probe's pairs for `dtype` and `op` with MPI's own `native` datatype and
/// with this crate's operation, and compares.
fn run(dtype: DType, op: ReduceOp, native: mpi::ffi::MPI_Datatype) -> ProbeOutcome {
    let pairs = pairs(Format::of(dtype), op);
    let a: Vec<u16> = pairs.iter().map(|p| p.0).collect();
    let mut theirs: Vec<u16> = pairs.iter().map(|p| p.1).collect();
    let ours = library(dtype, op, &a, &theirs);
    // At most a few thousand pairs: an int (0, nothing reduced, could not happen).
    let count = c_int::try_from(a.len()).unwrap_or(0);
    // SAFETY: two buffers of `count` 2-byte elements (MPI's half datatypes are 2 bytes),
    // the first read, the second read and written; a predefined datatype and operation
    // that MPI's own takes (native_takes), so MPICH does not abort on it.
    let rc = unsafe {
        mpi::ffi::MPI_Reduce_local(
            a.as_ptr().cast(),
            theirs.as_mut_ptr().cast(),
            count,
            native,
            op.system_operation().as_raw(),
        )
    };
    let mut outcome = compare(dtype, op, &pairs, &theirs, &ours);
    if rc != 0 {
        outcome.mpi_error = Some(rc);
        outcome.differing = outcome.cases;
    }
    outcome
}

/// This crate's results for the pairs `(a[i], b[i])`: its user-defined operation applied
/// as MPI would (`b` the in-out operand).
pub(super) fn library(dtype: DType, op: ReduceOp, a: &[u16], b: &[u16]) -> Vec<u16> {
    let mut out = b.to_vec();
    let Ok(index) = op_index(dtype, op) else {
        return out;
    };
    let mut n = c_int::try_from(a.len().min(out.len())).unwrap_or(0);
    // SAFETY: `n` elements of u16 in each buffer (the shorter length); the functions read
    // `*len` units of both and write only the second (the first is `*mut` in MPI's
    // signature, never written); the datatype argument is not read.
    unsafe {
        FUNCTIONS[index](
            a.as_ptr().cast_mut().cast(),
            out.as_mut_ptr().cast(),
            &mut n,
            std::ptr::null_mut(),
        )
    };
    out
}

/// The outcome of the probe from MPI's results (`theirs`) and this crate's (`ours`) for
/// `pairs` (all three of one length).
pub(super) fn compare(
    dtype: DType,
    op: ReduceOp,
    pairs: &[(u16, u16)],
    theirs: &[u16],
    ours: &[u16],
) -> ProbeOutcome {
    let f = Format::of(dtype);
    let mut differing = 0;
    let mut first_difference = None;
    for ((&(a, b), &t), &o) in pairs.iter().zip(theirs).zip(ours) {
        if t != o && !(f.is_nan(t) && f.is_nan(o)) {
            differing += 1;
            first_difference.get_or_insert([a, b, t, o]);
        }
    }
    ProbeOutcome {
        dtype,
        op,
        cases: pairs.len(),
        differing,
        first_difference,
        mpi_error: None,
    }
}

/// One half format's facts, for building operands.
#[derive(Clone, Copy)]
pub(super) struct Format {
    bfloat: bool,
}

impl Format {
    pub(super) fn of(dtype: DType) -> Self {
        Format {
            bfloat: dtype.code == code::BFLOAT,
        }
    }

    /// Significand bits, the implicit one included.
    fn precision(self) -> i32 {
        if self.bfloat {
            8
        } else {
            11
        }
    }

    /// The exponent bias, also the largest finite value's exponent (15, 127).
    fn bias(self) -> i32 {
        (1 << (15 - self.precision())) - 1
    }

    /// The bits of +infinity.
    fn inf(self) -> u16 {
        if self.bfloat {
            0x7f80
        } else {
            0x7c00
        }
    }

    fn is_nan(self, bits: u16) -> bool {
        bits & 0x7fff > self.inf()
    }

    /// The bits of `x`, rounded to nearest even (exact for the values built here).
    pub(super) fn bits(self, x: f32) -> u16 {
        if self.bfloat {
            bf16::from_f32(x).to_bits()
        } else {
            f16::from_f32(x).to_bits()
        }
    }

    pub(super) fn value(self, bits: u16) -> f32 {
        if self.bfloat {
            bf16::from_bits(bits).to_f32()
        } else {
            f16::from_bits(bits).to_f32()
        }
    }

    /// Zeros, the smallest and largest subnormals, the smallest normal, 1 and its
    /// neighbours, the largest finite value, infinity and a NaN, of both signs.
    fn specials(self) -> Vec<u16> {
        let inf = self.inf();
        let one = self.bits(1.0);
        let min_normal = 1u16 << (self.precision() - 1);
        let positive = [
            0,
            1,
            min_normal - 1,
            min_normal,
            one - 1,
            one,
            one + 1,
            self.bits(2.0) - 1,
            inf - 1,
            inf,
            inf | (1 << (self.precision() - 2)),
        ];
        positive.iter().flat_map(|&b| [b, b | 0x8000]).collect()
    }
}

/// The operand pairs of the probe for `op` in format `f`: every pair of [`Format::specials`]
/// (for min and max, not `+0` against `-0`, whose order IEEE 754 leaves open), the
/// operation's hard cases ([`sum_cases`], [`product_cases`]) and pseudo-random pairs.
pub(super) fn pairs(f: Format, op: ReduceOp) -> Vec<(u16, u16)> {
    let specials = f.specials();
    let mut pairs = Vec::new();
    for &a in &specials {
        for &b in &specials {
            let zeros_of_two_signs = (a | b) & 0x7fff == 0 && a != b;
            if !(zeros_of_two_signs && matches!(op, ReduceOp::Min | ReduceOp::Max)) {
                pairs.push((a, b));
            }
        }
    }
    match op {
        ReduceOp::Sum => sum_cases(f, &mut pairs),
        ReduceOp::Product => product_cases(f, &mut pairs),
        _ => {}
    }
    random_cases(f, op, &mut pairs);
    pairs
}

/// Sums whose exact values are ties, `a = ±(1 + k·u)·2^e` and `b = ±(2j + 1)·(u/2)·2^e`
/// (`u` the unit in the last place at 1; `k` even and odd, so that half round down to even
/// and half up), next to near ties (`b` a hair above and below `u/2`), the largest finite
/// value plus half its unit in the last place (a tie that rounds to infinity) and `x + -x`
/// (`+0`).
fn sum_cases(f: Format, pairs: &mut Vec<(u16, u16)>) {
    let p = f.precision();
    let u = 2f32.powi(1 - p);
    let top = 2f32.powi(p - 1);
    for sign in [1.0f32, -1.0] {
        for e in [-3, 0, 5] {
            let scale = sign * 2f32.powi(e);
            for k in [
                0.0,
                1.0,
                2.0,
                3.0,
                top / 2.0 - 1.0,
                top / 2.0,
                top - 2.0,
                top - 1.0,
            ] {
                let a = f.bits((1.0 + k * u) * scale);
                for halves in [0.5, 1.5, 2.5, 0.5 * (1.0 + u), 0.5 * (1.0 - u / 2.0)] {
                    pairs.push((a, f.bits(halves * u * scale)));
                }
                pairs.push((a, a ^ 0x8000));
            }
        }
    }
    let max = f.value(f.inf() - 1);
    // The largest finite value is in [2^emax, 2^(emax + 1)): its unit in the last place is
    // 2^(emax + 1 - p); emax is the bias (15, 127).
    let half_ulp = 2f32.powi(f.bias() - p);
    for sign in [1.0f32, -1.0] {
        for b in [half_ulp, half_ulp * (1.0 - u / 2.0)] {
            pairs.push((f.bits(sign * max), f.bits(sign * b)));
        }
    }
}

/// Products whose exact values are ties: odd `m1 · m2` of exactly `p + 1` bits scaled into
/// [1, 4) (both signs), and odd `m1 · m2` at half the smallest subnormal (ties in the
/// subnormal range, the smallest rounding to zero).
fn product_cases(f: Format, pairs: &mut Vec<(u16, u16)>) {
    let p = f.precision();
    let (lo, hi) = (1u32 << p, 1u32 << (p + 1));
    let unit = |m: u32| m as f32 / (1u32 << m.ilog2()) as f32;
    let mut ties = 0;
    'outer: for m1 in (3u32..64).step_by(2) {
        for m2 in (m1..lo).step_by(2) {
            let m = m1 * m2;
            if (lo..hi).contains(&m) {
                let (a, b) = (f.bits(unit(m1)), f.bits(unit(m2)));
                pairs.push((a, b));
                pairs.push((a ^ 0x8000, b));
                ties += 1;
                if ties == 96 {
                    break 'outer;
                }
            }
        }
    }
    // The smallest subnormal is 2^s; m1·2^ea · m2·2^eb with ea + eb = s - 1.
    let s = 1 - f.bias() - (p - 1);
    let ea = (s - 1).div_euclid(2);
    let eb = s - 1 - ea;
    for m1 in (1u32..16).step_by(2) {
        for m2 in (m1..16).step_by(2) {
            let a = f.bits(m1 as f32 * 2f32.powi(ea));
            let b = f.bits(m2 as f32 * 2f32.powi(eb));
            pairs.push((a, b));
            pairs.push((a, b ^ 0x8000));
        }
    }
}

/// A linear congruential generator (Knuth's MMIX constants): the probe's pairs are the
/// same in every run.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) as u32
    }
}

/// 256 pseudo-random pairs of finite values ([`Lcg`]), the second's exponent within 3 of
/// the first's (sums, min, max) or of its reciprocal's (products), so that the results are
/// neither all exact nor all overflowing.
fn random_cases(f: Format, op: ReduceOp, pairs: &mut Vec<(u16, u16)>) {
    let mantissa_bits = f.precision() - 1;
    let exp_max = u32::from(f.inf() >> mantissa_bits);
    let bias = exp_max / 2;
    let mut rng = Lcg(0x9e37_79b9_7f4a_7c15);
    let element = |rng: &mut Lcg, exp: u32| {
        let sign = (rng.next() & 1) << 15;
        let mantissa = rng.next() & ((1 << mantissa_bits) - 1);
        u16::try_from(sign | (exp.clamp(1, exp_max - 1) << mantissa_bits) | mantissa).unwrap_or(0)
    };
    for _ in 0..256 {
        let e1 = 1 + rng.next() % (exp_max - 1);
        let shift = rng.next() % 7;
        let e2 = if op == ReduceOp::Product {
            (2 * bias + shift).saturating_sub(e1 + 3)
        } else {
            (e1 + shift).saturating_sub(3)
        };
        let a = element(&mut rng, e1);
        let b = element(&mut rng, e2);
        pairs.push((a, b));
    }
}

/// MPI's name of `op` and how a result of it is written (`a + b`, `min(a, b)`).
fn spelled(op: ReduceOp, a: u16, b: u16) -> (&'static str, String) {
    match op {
        ReduceOp::Sum => ("MPI_SUM", format!("{a:#06x} + {b:#06x}")),
        ReduceOp::Product => ("MPI_PROD", format!("{a:#06x} × {b:#06x}")),
        ReduceOp::Min => ("MPI_MIN", format!("min({a:#06x}, {b:#06x})")),
        ReduceOp::Max => ("MPI_MAX", format!("max({a:#06x}, {b:#06x})")),
        _ => ("another operation", format!("{a:#06x} {op} {b:#06x}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F16: DType = DType::new(code::FLOAT, 16);
    const BF16: DType = DType::new(code::BFLOAT, 16);
    const OPS: [ReduceOp; 4] = [
        ReduceOp::Sum,
        ReduceOp::Product,
        ReduceOp::Min,
        ReduceOp::Max,
    ];

    /// The probe's outcome for `dtype` and `op` against a simulated MPI whose operation
    /// gives `mpi(a, b)`.
    fn against(dtype: DType, op: ReduceOp, mpi: impl Fn(u16, u16) -> u16) -> ProbeOutcome {
        let pairs = pairs(Format::of(dtype), op);
        let a: Vec<u16> = pairs.iter().map(|p| p.0).collect();
        let b: Vec<u16> = pairs.iter().map(|p| p.1).collect();
        let theirs: Vec<u16> = pairs.iter().map(|&(x, y)| mpi(x, y)).collect();
        compare(dtype, op, &pairs, &theirs, &library(dtype, op, &a, &b))
    }

    /// `x` in the half format of `dtype`, rounded to nearest even by the `half` crate.
    fn from_f64(dtype: DType, x: f64) -> u16 {
        if dtype.code == code::BFLOAT {
            bf16::from_f64(x).to_bits()
        } else {
            f16::from_f64(x).to_bits()
        }
    }

    /// The exact result of `op` (exact in `f64` for two half values, but for sums of
    /// bfloat16 values too far apart to matter) rounded once: an MPI that is correct.
    fn correctly_rounded(dtype: DType, op: ReduceOp) -> impl Fn(u16, u16) -> u16 {
        let f = Format::of(dtype);
        move |a, b| {
            let (x, y) = (f64::from(f.value(a)), f64::from(f.value(b)));
            let r = match op {
                ReduceOp::Sum => x + y,
                ReduceOp::Product => x * y,
                ReduceOp::Min => x.min(y),
                _ => x.max(y),
            };
            from_f64(dtype, r)
        }
    }

    /// This crate's operations are the correctly rounded ones on every pair of the probe,
    /// so a correct MPI passes it.
    #[test]
    fn a_correct_mpi_passes_the_probe() {
        for dtype in [F16, BF16] {
            for op in OPS {
                let o = against(dtype, op, correctly_rounded(dtype, op));
                assert!(o.matches(), "{o}");
                assert!(o.cases > 500, "{dtype} {op}: only {} pairs", o.cases);
            }
        }
    }

    /// Ties rounded away from zero (MPICH 5.0.2's bfloat16 sum: the f32 sum's bits plus
    /// 0x8000, shifted), and truncation, fail it.
    #[test]
    fn ties_away_from_zero_and_truncation_fail_the_probe() {
        let mpich_bf16_sum = |a: u16, b: u16| {
            let s = bf16::from_bits(a).to_f32() + bf16::from_bits(b).to_f32();
            if s.is_nan() {
                0x7fc0
            } else {
                ((s.to_bits() + 0x8000) >> 16) as u16
            }
        };
        let o = against(BF16, ReduceOp::Sum, mpich_bf16_sum);
        assert!(!o.matches() && o.differing > 20, "{o}");
        // The first difference is a tie that went up, not to even.
        let [a, b, theirs, ours] = o.first_difference.expect("a difference");
        let exact = bf16::from_bits(a).to_f64() + bf16::from_bits(b).to_f64();
        assert_eq!(ours, bf16::from_f64(exact).to_bits());
        assert_eq!(theirs, ours + 1, "{o}");
        for dtype in [F16, BF16] {
            for op in [ReduceOp::Sum, ReduceOp::Product] {
                let right = correctly_rounded(dtype, op);
                let f = Format::of(dtype);
                let exact = |a: u16, b: u16| {
                    let (x, y) = (f64::from(f.value(a)), f64::from(f.value(b)));
                    if op == ReduceOp::Sum {
                        x + y
                    } else {
                        x * y
                    }
                };
                let away = |a, b| away_from_zero(f, right(a, b), exact(a, b));
                let o = against(dtype, op, away);
                assert!(!o.matches(), "{dtype} {op} ties away: {o}");
                let truncated = |a, b| {
                    let r = right(a, b);
                    let bigger = f64::from(f.value(r)).abs() > exact(a, b).abs();
                    if bigger && r & 0x7fff != 0 && !f.is_nan(r) {
                        r - 1
                    } else {
                        r
                    }
                };
                let o = against(dtype, op, truncated);
                assert!(!o.matches(), "{dtype} {op} truncated: {o}");
            }
        }
    }

    /// `r`, the value nearest `exact` (to even on a tie), or where `exact` lies halfway
    /// between `r` and its neighbour, the one of them larger in magnitude.
    fn away_from_zero(f: Format, r: u16, exact: f64) -> u16 {
        let magnitude = r & 0x7fff;
        if f.is_nan(r) || magnitude == f.inf() || magnitude == 0 {
            return r;
        }
        let other = if f64::from(f.value(r)).abs() < exact.abs() {
            r + 1
        } else {
            r - 1
        };
        let distance = |bits: u16| (f64::from(f.value(bits)).abs() - exact.abs()).abs();
        if distance(r) == distance(other) && other & 0x7fff > magnitude {
            other
        } else {
            r
        }
    }

    /// Two NaNs are the same whatever their payloads; a min that returns the NaN where
    /// this crate returns the number (IEEE minNum) is not.
    #[test]
    fn nan_payloads_do_not_count_but_nan_semantics_do() {
        let f = Format::of(F16);
        let canonical = |dtype, op| {
            let right = correctly_rounded(dtype, op);
            move |a, b| {
                let r = right(a, b);
                if f.is_nan(r) {
                    0xfe01
                } else {
                    r
                }
            }
        };
        assert!(against(F16, ReduceOp::Sum, canonical(F16, ReduceOp::Sum)).matches());
        let c_min = |a: u16, b: u16| {
            // C's `a < b ? a : b`.
            if f16::from_bits(a) < f16::from_bits(b) {
                a
            } else {
                b
            }
        };
        let o = against(F16, ReduceOp::Min, c_min);
        assert!(!o.matches(), "{o}");
    }

    #[test]
    fn the_outcome_says_what_differs() {
        let o = ProbeOutcome {
            dtype: BF16,
            op: ReduceOp::Sum,
            cases: 1000,
            differing: 37,
            first_difference: Some([0x3f80, 0x3b80, 0x3f81, 0x3f80]),
            mpi_error: None,
        };
        assert_eq!(
            o.to_string(),
            "MPIX_BFLOAT16 with MPI_SUM: 37 of 1000 results differ from dlpack-mpi's, which \
             are correctly rounded (first 0x3f80 + 0x3b80 = 0x3f81, not 0x3f80)"
        );
        let ok = ProbeOutcome {
            dtype: F16,
            op: ReduceOp::Max,
            differing: 0,
            first_difference: None,
            ..o
        };
        assert!(ok.matches());
        assert_eq!(
            ok.to_string(),
            "MPIX_C_FLOAT16 with MPI_MAX: all 1000 results as dlpack-mpi's"
        );
        let failed = ProbeOutcome {
            mpi_error: Some(13),
            ..ok
        };
        assert!(!failed.matches());
    }
}
