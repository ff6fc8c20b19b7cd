//! The float sums' inputs of the check's own dtypes (float16, bfloat16, float32, float64,
//! complex64, complex128) at 2 to 1024 simulated ranks, and at float16's sparse boundary
//! beyond: every rank's inputs folded in several orders in the dtype's own arithmetic (a
//! half-precision add rounded to the format, as the library's operations do) end at the
//! exact sum, computed in integers; each rank's data is in the inputs exactly when the
//! generator says the case is checkable; the bound that proves every order exact holds.

use std::fmt::Debug;

use dlpack_mpi::dtype::AnyBits;
use num_complex::{Complex32, Complex64};

use super::super::dtypes;
use super::super::kind::Kind;
use super::super::matrix::Layout;
use super::*;

/// A storage value's components as `f64` (exact: every input and sum is).
trait Parts: Copy {
    fn parts(self) -> Vec<f64>;
}

impl Parts for half::f16 {
    fn parts(self) -> Vec<f64> {
        vec![self.to_f64()]
    }
}

impl Parts for half::bf16 {
    fn parts(self) -> Vec<f64> {
        vec![self.to_f64()]
    }
}

impl Parts for f32 {
    fn parts(self) -> Vec<f64> {
        vec![f64::from(self)]
    }
}

impl Parts for f64 {
    fn parts(self) -> Vec<f64> {
        vec![self]
    }
}

impl Parts for Complex32 {
    fn parts(self) -> Vec<f64> {
        vec![f64::from(self.re), f64::from(self.im)]
    }
}

impl Parts for Complex64 {
    fn parts(self) -> Vec<f64> {
        vec![self.re, self.im]
    }
}

/// The rank counts tested: every one from 2 to 64, then each power of two to 1024 with
/// its neighbours, and a few between.
fn rank_counts() -> Vec<i32> {
    let mut ps: Vec<i32> = (2..=64).collect();
    for k in 7..=10 {
        ps.extend([(1 << k) - 1, 1 << k, (1 << k) + 1]);
    }
    ps.extend([65, 96, 100, 200, 300, 384, 700, 1000]);
    ps.retain(|&p| p <= 1024);
    ps.sort_unstable();
    ps.dedup();
    ps
}

/// The orders in which `p` ranks' inputs are folded: left to right, right to left, and
/// three seeded shuffles (the pairwise tree is [`tree`]).
fn orders(p: usize) -> Vec<Vec<usize>> {
    let forward: Vec<usize> = (0..p).collect();
    let mut all = vec![forward.clone(), forward.iter().rev().copied().collect()];
    for seed in [1u64, 2, 3] {
        // xorshift64*, a Fisher-Yates shuffle.
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut order = forward.clone();
        for i in (1..p).rev() {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            let j = (x.wrapping_mul(0x2545_F491_4F6C_DD1D) % (i as u64 + 1)) as usize;
            order.swap(i, j);
        }
        all.push(order);
    }
    all
}

/// `f` folded over `inputs[order[..]]`, element by element, in that order.
fn fold_in<S: Copy>(inputs: &[Vec<S>], order: &[usize], f: fn(S, S) -> S) -> Vec<S> {
    let mut acc = inputs[order[0]].clone();
    for &r in &order[1..] {
        for (a, &b) in acc.iter_mut().zip(&inputs[r]) {
            *a = f(*a, b);
        }
    }
    acc
}

/// `f` folded over `inputs` as a pairwise tree (each half folded, then the halves).
fn tree<S: Copy>(inputs: &[Vec<S>], f: fn(S, S) -> S) -> Vec<S> {
    if inputs.len() == 1 {
        return inputs[0].clone();
    }
    let (left, right) = inputs.split_at(inputs.len() / 2);
    let (l, r) = (tree(left, f), tree(right, f));
    l.into_iter().zip(r).map(|(a, b)| f(a, b)).collect()
}

/// Every rank's inputs of `n` elements from `from` at `p` ranks, in `layout`.
fn inputs<S: AnyBits + PartialEq + Debug>(
    kind: &Kind<S>,
    layout: Layout,
    (p, n, from): (i32, i64, i64),
) -> Vec<Vec<S>> {
    (0..p)
        .map(|r| kind.summands(layout, (p, r), n, from))
        .collect()
}

/// The checks of one dtype's inputs at `p` ranks, `n` elements from `from`, in `layout`;
/// whether the generator called the case checkable.
fn check_case<S: AnyBits + PartialEq + Debug + Parts>(
    kind: &Kind<S>,
    layout: Layout,
    (p, n, from): (i32, i64, i64),
) -> bool {
    let Some(exact) = &kind.exact else {
        panic!("{} has no exact inputs", kind.name)
    };
    let (format, f) = (exact.format, kind.reduce.expect("a sum").1);
    let unit = 2f64.powi(format.unit_log2);
    let bound = 1i128 << format.bits;
    let at = format!(
        "{} at {p} ranks, {n} elements from {from}, {layout:?}",
        kind.name
    );
    let all = inputs(kind, layout, (p, n, from));
    // The exact sums, in units, and the bound that makes every order exact.
    let width = all[0].len();
    let mut exact_units = vec![Vec::new(); width];
    for (e, sums) in exact_units.iter_mut().enumerate() {
        let parts: Vec<Vec<f64>> = all.iter().map(|v| v[e].parts()).collect();
        for c in 0..parts[0].len() {
            let units: Vec<i128> = parts.iter().map(|q| (q[c] / unit) as i128).collect();
            for (q, k) in parts.iter().zip(&units) {
                assert_eq!(*k as f64 * unit, q[c], "{at}: {} is off the grid", q[c]);
            }
            let magnitude: i128 = units.iter().map(|k| k.abs()).sum();
            assert!(
                magnitude <= bound,
                "{at}: element {e}: sum of |k| {magnitude} > {bound}"
            );
            sums.push(units.iter().sum::<i128>());
        }
    }
    // Every order ends at the exact sum.
    let mut results: Vec<(String, Vec<S>)> = orders(p as usize)
        .into_iter()
        .enumerate()
        .map(|(i, o)| (format!("order {i}"), fold_in(&all, &o, f)))
        .collect();
    results.push(("pairwise tree".into(), tree(&all, f)));
    for (how, got) in &results {
        for (e, (g, sums)) in got.iter().zip(&exact_units).enumerate() {
            let want: Vec<f64> = sums.iter().map(|&k| k as f64 * unit).collect();
            assert_eq!(g.parts(), want, "{at}: {how}: element {e}");
        }
    }
    // Checkable exactly when every rank's data is in the inputs.
    let represented = all
        .iter()
        .all(|v| v.iter().any(|x| x.parts().iter().any(|&c| c != 0.0)));
    let uncovered = kind.uncovered(layout, p, n);
    if n > 0 {
        assert_eq!(uncovered.is_none(), represented, "{at}: {uncovered:?}");
    } else {
        assert!(uncovered.is_none(), "{at}");
    }
    uncovered.is_none()
}

/// One dtype at every rank count of [`rank_counts`] and at `extra` ones, a few lengths.
fn check_kind<S: AnyBits + PartialEq + Debug + Parts>(kind: &Kind<S>, extra: &[i32]) {
    let mut ps = rank_counts();
    ps.extend(extra);
    for p in ps {
        for n in [0, 1, 2, 3, 7] {
            check_case(kind, Layout::Contiguous, (p, n, 0));
        }
        check_case(kind, Layout::Contiguous, (p, 5, 148));
        check_case(kind, Layout::Broadcast, (p, 3, 0));
    }
}

#[test]
fn half_sums_exact_in_every_order_at_2_to_1024_ranks() {
    check_kind(&dtypes::float16(), &[2047, 2048, 2049, 4097]);
    check_kind(&dtypes::bfloat16(), &[]);
}

#[test]
fn float_sums_exact_in_every_order_at_2_to_1024_ranks() {
    check_kind(&dtypes::float32(), &[]);
    check_kind(&dtypes::float64(), &[]);
    check_kind(&dtypes::float32x4(), &[]);
}

#[test]
fn complex_sums_exact_in_every_order_at_2_to_1024_ranks() {
    check_kind(&dtypes::complex64(), &[]);
    check_kind(&dtypes::complex128(), &[]);
}

/// Dense up to `2^m` ranks, every rank's input nonzero at every element (so one element
/// carries them all); sparse beyond, `ceil(p / 2^m)` elements needed; the first lengths
/// and rank counts that are not checkable, and the reason's words.
#[test]
fn not_checkable_exactly_where_elements_cannot_carry_every_rank() {
    let (bf16, f16) = (dtypes::bfloat16(), dtypes::float16());
    let c = Layout::Contiguous;
    for p in [2, 255, 256] {
        assert!(check_case(&bf16, c, (p, 1, 0)), "{p}");
        assert!(check_case(&bf16, Layout::Broadcast, (p, 7, 0)), "{p}");
    }
    assert!(!check_case(&bf16, c, (257, 1, 0)));
    assert!(check_case(&bf16, c, (257, 2, 0)));
    assert!(!check_case(&bf16, Layout::Broadcast, (257, 7, 0)));
    assert!(!check_case(&bf16, c, (512, 1, 0)));
    assert!(check_case(&bf16, c, (512, 2, 37)));
    assert!(!check_case(&bf16, c, (513, 2, 0)));
    assert!(check_case(&bf16, c, (513, 3, 0)));
    assert!(!check_case(&bf16, c, (1024, 3, 0)));
    assert!(check_case(&bf16, c, (1024, 4, 0)));
    assert!(check_case(&f16, c, (2048, 1, 0)));
    assert!(!check_case(&f16, c, (2049, 1, 0)));
    assert!(check_case(&f16, c, (2049, 2, 0)));
    // Lanes count as elements: float32x4 needs a quarter of the elements float32 does.
    let lanes = Grid::new(FLOAT32, (1 << 24) * 4 + 1);
    assert!(lanes.uncovered("float32x4", 1, 4, false).is_some());
    assert!(lanes.uncovered("float32x4", 2, 4, false).is_none());
    assert_eq!(
        bf16.uncovered(c, 512, 1).as_deref(),
        Some(
            "bfloat16 sums of 512 ranks are exact only with <= 256 nonzero contributions per \
             element (8 significand bits); 1 element cannot carry every rank's data (it takes \
             2 distinct elements)"
        )
    );
    let why = bf16
        .uncovered(Layout::Broadcast, 300, 1000)
        .unwrap_or_default();
    assert!(why.contains("a broadcast-layout send repeats 1 element, which cannot carry"));
}

/// At few ranks the inputs span today's ranges (float16, float32 and float64 halves up to
/// ±64, bfloat16 integers up to ±8), shrinking with the rank count only where they must;
/// they differ between ranks and between elements, and their sums are not all zero.
#[test]
fn ranges_at_few_ranks_and_inputs_that_differ() {
    for (format, up_to) in [(FLOAT16, 16), (BFLOAT16, 32), (FLOAT32, 1 << 17)] {
        for p in [1, 2, 3, 4, up_to] {
            assert_eq!(Grid::new(format, p).magnitude, format.cap, "{format:?} {p}");
        }
        let next = Grid::new(format, up_to + 1);
        assert!(next.magnitude < format.cap, "{format:?}");
        assert!(next.magnitude * i64::from(up_to + 1) <= 1 << format.bits);
    }
    // The formula at every rank count to 1024 (the folds above take a sample of them).
    for format in [FLOAT16, BFLOAT16, FLOAT32, FLOAT64] {
        let bound = 1i64 << format.bits;
        for p in 1..=1024 {
            let g = Grid::new(format, p);
            assert!(g.width * g.magnitude <= bound, "{format:?} {p}");
            assert!(
                g.magnitude >= 1 && g.magnitude <= format.cap,
                "{format:?} {p}"
            );
            assert_eq!(g.width, i64::from(p).min(bound), "{format:?} {p}");
        }
    }
    let bf16 = dtypes::bfloat16();
    for p in [2, 4, 300, 1024] {
        let all = inputs(&bf16, Layout::Contiguous, (p, 64, 0));
        assert!(all[0] != all[1], "{p}: ranks 0 and 1 alike");
        assert!(all[0][..32] != all[0][32..], "{p}: elements repeat");
        let sums = tree(&all, bf16.reduce.expect("a sum").1);
        assert!(sums.iter().any(|s| s.to_f64() != 0.0), "{p}: every sum 0");
    }
}
