//! The inputs of the float sums (float16, bfloat16, float32, float64, the complex dtypes'
//! components, float32x4's lanes): exact in any order at any rank count, as nccl-tests'
//! verifiable inputs are, so that the expected sum, folded here rank after rank, is what any
//! correct MPI library returns whatever order and grouping it adds in.
//!
//! A binary format of `m` significand bits (the implicit one included: 11 for float16, 8
//! bfloat16, 24 float32, 53 float64) holds every integer multiple of a power-of-two grid
//! unit up to `2^m` units exactly. Every input is `k` units with an integer `k`, and the
//! `|k|` of all ranks' inputs at one element add up to at most `2^m`.
//! Whatever the order, each partial sum is the exact sum of some of the inputs (by
//! induction: two exact partial sums of disjoint sets add to at most `2^m` units, which the
//! format holds), so every order ends at the exact sum; a half-precision sum that converts
//! to `float` and rounds back after each add (the library's operations) too.
//!
//! At `p` ranks, with `B = 2^m` ([`Grid::new`]):
//!
//! - **dense**, `p <= B`: every rank's input at every element is nonzero, `1 <= |k| <=
//!   A(p) = min(cap, floor(B / p))`, where `cap` keeps the range of the matrix at few
//!   ranks (float16 and float32/64: halves up to ±64, `cap` 128 units of 0.5; bfloat16:
//!   integers up to ±8);
//! - **sparse**, `p > B` (bfloat16 above 256 ranks, float16 above 2048): at each element
//!   `B` ranks, a window of consecutive ranks (modulo `p`) that moves on by `B` ranks from
//!   one element to the next, give ±1 unit and the others 0. `ceil(p / B)` consecutive
//!   elements carry every rank's input; fewer cannot, and the case is not checkable
//!   ([`Grid::uncovered`]): its collective still runs, and what it returns is still
//!   compared (exactly), but a lost rank's contribution could go unseen.
//!
//! Magnitudes and signs come from a hash of the element index, the rank and the component,
//! so that inputs differ between ranks and between elements (a lost, duplicated or
//! misplaced contribution changes the sum) and the sums are not all zero.

/// A binary floating-point format's exactness, and the range of its inputs at few ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Format {
    /// Significand bits, the implicit one included (11 for float16).
    pub bits: u32,
    /// log2 of the grid unit: every input is a multiple of `2^unit_log2`.
    pub unit_log2: i32,
    /// The largest `|k|` at few ranks.
    pub cap: i64,
}

/// IEEE binary16: halves up to ±64 at few ranks.
pub(super) const FLOAT16: Format = Format {
    bits: 11,
    unit_log2: -1,
    cap: 128,
};

/// bfloat16: integers up to ±8 at few ranks.
pub(super) const BFLOAT16: Format = Format {
    bits: 8,
    unit_log2: 0,
    cap: 8,
};

/// IEEE binary32 (float32, complex64's components, float32x4's lanes).
pub(super) const FLOAT32: Format = Format {
    bits: 24,
    unit_log2: -1,
    cap: 128,
};

/// IEEE binary64 (float64, complex128's components).
pub(super) const FLOAT64: Format = Format {
    bits: 53,
    unit_log2: -1,
    cap: 128,
};

/// A float dtype's inputs of sums: its format and how a storage value is made from a
/// [`Grid`] point.
pub(super) struct Exact<S> {
    pub format: Format,
    /// Rank `r`'s input at storage index `i` (a lane of a multi-lane dtype is one).
    pub value: fn(&Grid, i64, i32) -> S,
}

/// The inputs of one format's sums over `ranks` ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Grid {
    format: Format,
    ranks: i64,
    /// Ranks with a nonzero input at each element: `p` (dense) or `B` (sparse).
    width: i64,
    /// The largest `|k|`: `A(p)`.
    magnitude: i64,
}

impl Grid {
    /// The inputs of sums over `ranks` ranks (at least 1) in `format`.
    pub(super) fn new(format: Format, ranks: i32) -> Grid {
        let bound = 1i64 << format.bits;
        let ranks = i64::from(ranks.max(1));
        let width = ranks.min(bound);
        Grid {
            format,
            ranks,
            width,
            magnitude: format.cap.min(bound / width).max(1),
        }
    }

    /// Rank `r`'s input at storage index `i`, component `part` (a complex dtype's real
    /// part 0, imaginary part 1), in units: 0 outside the element's window of ranks.
    pub(super) fn units(&self, i: i64, r: i32, part: u64) -> i64 {
        let p = i128::from(self.ranks);
        // The window of storage index i starts at rank i * width (mod p), so consecutive
        // indices' windows tile the ranks.
        let start = (i128::from(i) * i128::from(self.width)).rem_euclid(p);
        let at = (i128::from(r) - start).rem_euclid(p);
        if at >= i128::from(self.width) {
            return 0;
        }
        let h = mix(i, r, part);
        let k = 1 + ((h >> 1) % self.magnitude as u64) as i64;
        if h & 1 == 1 {
            -k
        } else {
            k
        }
    }

    /// Rank `r`'s input at storage index `i`, component `part`, as a value (exact in the
    /// format, and in `f64`).
    pub(super) fn value(&self, i: i64, r: i32, part: u64) -> f64 {
        self.units(i, r, part) as f64 * 2f64.powi(self.format.unit_log2)
    }

    /// Why a sum of `dtype` over `n` elements of `lanes` storage values each (`repeated`:
    /// a broadcast-layout send, every element element 0) cannot carry every rank's input,
    /// or `None` when it can (or carries nothing: `n` is 0).
    pub(super) fn uncovered(
        &self,
        dtype: &str,
        n: i64,
        lanes: i64,
        repeated: bool,
    ) -> Option<String> {
        let elements = if repeated { n.min(1) } else { n };
        let per_element = self.width * lanes;
        if elements == 0 || elements * per_element >= self.ranks {
            return None;
        }
        let needed = (self.ranks + per_element - 1) / per_element;
        let carried = if repeated {
            "a broadcast-layout send repeats 1 element, which cannot".to_string()
        } else {
            format!(
                "{elements} element{} cannot",
                if elements == 1 { "" } else { "s" }
            )
        };
        Some(format!(
            "{dtype} sums of {} ranks are exact only with <= {} nonzero contributions per {} \
             ({} significand bits); {carried} carry every rank's data (it takes {needed} \
             distinct elements)",
            self.ranks,
            self.width,
            if lanes > 1 { "lane" } else { "element" },
            self.format.bits
        ))
    }
}

/// A hash of an input's coordinates (splitmix64's finalizer over a mix of them).
fn mix(i: i64, r: i32, part: u64) -> u64 {
    let mut x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (i64::from(r) as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F)
        ^ part.wrapping_mul(0x1656_67B1_9E37_79F9);
    x ^= x >> 30;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[cfg(test)]
#[path = "exact_tests.rs"]
mod tests;
