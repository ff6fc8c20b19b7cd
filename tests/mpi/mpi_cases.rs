//! Multi-rank behaviour cases (shared/design/CASES.md) and operation tests.
//!
//! The suite `mpi_cases` of tests/mpi (main.rs): MPI is initialized once, each test runs on
//! every rank in the same order, and the verdicts are combined across ranks so that rank 0
//! prints one line per test. `cargo test` runs it at 1 rank; scripts/test.sh runs the same suite under
//! `mpirun -n 2`, `-n 3` and `-n 4`. Every test works at any number of ranks.

use crate::common::RawTensor;
use crate::harness;
use dlpack_mpi::comm::{Blocks, TensorComm};
use dlpack_mpi::dlpack::{acquire, AcquireOptions, ManagedTensor, Owned, Tensor};
use dlpack_mpi::dtype::{self, AnyBits, DType, ReduceOp};
use dlpack_mpi::spec::{RecvSpec, SendSpec};
use dlpack_mpi::Error;
use mpi::collective::SystemOperation;
use mpi::datatype::AsDatatype;
use mpi::raw::AsRaw;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use num_complex::Complex32;

type Outcome = Result<(), String>;

fn opts() -> AcquireOptions {
    AcquireOptions::default()
}

fn ring(w: &SimpleCommunicator) -> (i32, i32) {
    let (r, p) = (w.rank(), w.size());
    ((r + 1) % p, (r + p - 1) % p)
}

/// Sends `send` around the ring and returns what arrived in a tensor like `like`.
fn ring_exchange<T: AnyBits + PartialEq + std::fmt::Debug>(
    w: &SimpleCommunicator,
    send: &ManagedTensor<'_>,
    zero: Vec<T>,
) -> Result<Vec<T>, String> {
    let (next, prev) = ring(w);
    let out = Owned::new(zero);
    {
        let mut r = acquire(&out, &opts()).map_err(|e| e.to_string())?;
        w.sendrecv_tensor(send, next, 7, &mut r, prev, 7)
            .map_err(|e| e.to_string())?;
    }
    Ok(out.into_vec())
}

fn c02_v0_and_v1_deliver(w: &SimpleCommunicator) -> Outcome {
    let raw = RawTensor::new(&[1i64, 2, 3, 4], (0, 64, 1));
    let (v0, c0) = raw.import_v0();
    let (v1, c1) = raw.import_v1();
    let (v0, v1) = (
        v0.map_err(|e| e.to_string())?,
        v1.map_err(|e| e.to_string())?,
    );
    ensure_eq!(ring_exchange(w, &v0, vec![0i64; 4])?, vec![1, 2, 3, 4]);
    ensure_eq!(ring_exchange(w, &v1, vec![0i64; 4])?, vec![1, 2, 3, 4]);
    drop((v0, v1));
    ensure_eq!((c0.get(), c1.get()), (1, 1));
    Ok(())
}

fn c06_zero_d(w: &SimpleCommunicator) -> Outcome {
    let mut raw = RawTensor::new(&[3.5f64], (2, 64, 1));
    raw.shape = None;
    raw.strides = None;
    let (t, c) = raw.import_v1();
    let t = t.map_err(|e| e.to_string())?;
    ensure_eq!(ring_exchange(w, &t, vec![0f64])?, vec![3.5]);
    let out = Owned::new(vec![0f64])
        .with_shape(&[])
        .map_err(|e| e.to_string())?;
    {
        let mut o = acquire(&out, &opts()).map_err(|e| e.to_string())?;
        w.all_reduce_tensor(&t, &mut o, ReduceOp::Sum)
            .map_err(|e| e.to_string())?;
    }
    ensure_eq!(out.into_vec(), vec![3.5 * f64::from(w.size())]);
    drop(t);
    ensure_eq!(c.get(), 1);
    Ok(())
}

fn c07_zero_size_everywhere(w: &SimpleCommunicator) -> Outcome {
    let mut raw = RawTensor::new::<i32>(&[], (0, 32, 1)).shape(&[0, 3], Some(&[3, 1]));
    raw.null_data = true;
    let (s, cs) = raw.import_v1();
    let (r, cr) = raw.import_v1();
    let (s, mut r) = (s.map_err(|e| e.to_string())?, r.map_err(|e| e.to_string())?);
    let (next, prev) = ring(w);
    let e = |e: Error| e.to_string();
    w.sendrecv_tensor(&s, next, 1, &mut r, prev, 1).map_err(e)?;
    w.all_reduce_tensor(&s, &mut r, ReduceOp::Sum).map_err(e)?;
    w.all_reduce_tensor_in_place(&mut r, ReduceOp::Max)
        .map_err(e)?;
    w.broadcast_tensor(&mut r, 0).map_err(e)?;
    w.all_gather_tensor(&s, &mut r).map_err(e)?;
    w.all_to_all_tensor(&s, &mut r).map_err(e)?;
    drop((s, r));
    ensure_eq!((cs.get(), cr.get()), (1, 1));
    Ok(())
}

fn c27_byte_offset_delivers_from_offset(w: &SimpleCommunicator) -> Outcome {
    let vals: Vec<i32> = (0..9).collect();
    let mut raw = RawTensor::new(&vals, (0, 32, 1)).shape(&[8], Some(&[1]));
    raw.byte_offset = 4;
    let (t, _) = raw.import_v1();
    let t = t.map_err(|e| e.to_string())?;
    ensure_eq!(
        ring_exchange(w, &t, vec![0i32; 8])?,
        (1..9).collect::<Vec<_>>()
    );
    Ok(())
}

fn c30_bool_transfer_and_logical_reductions(w: &SimpleCommunicator) -> Outcome {
    let bool_dtype = DType::new(6, 8);
    let src = Owned::new(vec![1u8, 0, 1])
        .with_dtype(bool_dtype)
        .map_err(|e| e.to_string())?;
    let s = acquire(&src, &opts()).map_err(|e| e.to_string())?;
    ensure_eq!(ring_exchange(w, &s, vec![7u8; 3])?, vec![1u8, 0, 1]);
    // Element 0: true everywhere; element 1: true on rank 0 only; element 2: false.
    let mine = Owned::new(vec![1u8, u8::from(w.rank() == 0), 0])
        .with_dtype(bool_dtype)
        .map_err(|e| e.to_string())?;
    let m = acquire(&mine, &opts()).map_err(|e| e.to_string())?;
    let p = w.size();
    for (op, expect) in [
        (ReduceOp::LogicalAnd, vec![1u8, u8::from(p == 1), 0]),
        (ReduceOp::LogicalOr, vec![1u8, 1, 0]),
    ] {
        let out = Owned::new(vec![9u8; 3])
            .with_dtype(bool_dtype)
            .map_err(|e| e.to_string())?;
        {
            let mut o = acquire(&out, &opts()).map_err(|e| e.to_string())?;
            w.all_reduce_tensor(&m, &mut o, op)
                .map_err(|e| e.to_string())?;
        }
        ensure_eq!(out.into_vec(), expect);
    }
    let out = Owned::new(vec![0u8; 3])
        .with_dtype(bool_dtype)
        .map_err(|e| e.to_string())?;
    let mut o = acquire(&out, &opts()).map_err(|e| e.to_string())?;
    let err = w.all_reduce_tensor(&m, &mut o, ReduceOp::Sum);
    ensure!(
        matches!(
            err,
            Err(Error::UnsupportedReduction {
                op: ReduceOp::Sum,
                ..
            })
        ),
        "bool sum must be refused, got {err:?}"
    );
    Ok(())
}

fn c31_half_bits_identical(w: &SimpleCommunicator) -> Outcome {
    let f16s: Vec<half::f16> = [1.0f32, -2.5, 65504.0, f32::NAN]
        .iter()
        .map(|&x| half::f16::from_f32(x))
        .collect();
    let bf16s: Vec<half::bf16> = [1.0f32, -2.5, 3.0e38, f32::INFINITY]
        .iter()
        .map(|&x| half::bf16::from_f32(x))
        .collect();
    let a = Owned::new(f16s.clone()).read_only();
    let t = acquire(&a, &opts()).map_err(|e| e.to_string())?;
    let got = ring_exchange(w, &t, vec![half::f16::ZERO; 4])?;
    ensure_eq!(
        got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        f16s.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
    let b = Owned::new(bf16s.clone()).read_only();
    let t = acquire(&b, &opts()).map_err(|e| e.to_string())?;
    let got = ring_exchange(w, &t, vec![half::bf16::ZERO; 4])?;
    ensure_eq!(
        got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        bf16s.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
    // Half reductions through user-defined ops: each rank contributes rank + 0.5 (and the
    // product 2 per rank); results are exact in both formats.
    let p = w.size();
    let r = w.rank() as f32;
    for bfloat in [false, true] {
        let mk = |x: f32| {
            if bfloat {
                half::bf16::from_f32(x).to_bits()
            } else {
                half::f16::from_f32(x).to_bits()
            }
        };
        let val = |bits: u16| {
            if bfloat {
                half::bf16::from_bits(bits).to_f32()
            } else {
                half::f16::from_bits(bits).to_f32()
            }
        };
        let dtype = DType::new(if bfloat { 4 } else { 2 }, 16);
        let src = Owned::new(vec![mk(r + 0.5), mk(2.0), mk(-r), mk(r)])
            .with_dtype(dtype)
            .map_err(|e| e.to_string())?
            .read_only();
        let s = acquire(&src, &opts()).map_err(|e| e.to_string())?;
        for (op, lane, expect) in [
            (
                ReduceOp::Sum,
                0,
                (0..p).map(|k| k as f32 + 0.5).sum::<f32>(),
            ),
            (ReduceOp::Product, 1, 2f32.powi(p)),
            (ReduceOp::Min, 2, -(p as f32 - 1.0)),
            (ReduceOp::Max, 3, p as f32 - 1.0),
        ] {
            let out = Owned::new(vec![0u16; 4])
                .with_dtype(dtype)
                .map_err(|e| e.to_string())?;
            {
                let mut o = acquire(&out, &opts()).map_err(|e| e.to_string())?;
                w.all_reduce_tensor(&s, &mut o, op)
                    .map_err(|e| e.to_string())?;
            }
            let got = val(out.into_vec()[lane]);
            ensure!(got == expect, "{dtype} {op}: expected {expect}, got {got}");
        }
        let out = Owned::new(vec![0u16; 4])
            .with_dtype(dtype)
            .map_err(|e| e.to_string())?;
        let mut o = acquire(&out, &opts()).map_err(|e| e.to_string())?;
        let refused = w.all_reduce_tensor(&s, &mut o, ReduceOp::BitwiseOr);
        ensure!(
            matches!(refused, Err(Error::UnsupportedReduction { .. })),
            "{refused:?}"
        );
    }
    Ok(())
}

/// One half format for [`c31_half_sums_round_ties_to_even`]: its DLPack dtype and the
/// `half` crate's conversions.
#[derive(Clone, Copy)]
struct HalfFormat {
    name: &'static str,
    dtype: DType,
    /// Significand bits, the implicit one included (11 for float16, 8 for bfloat16).
    precision: i32,
    /// The largest finite value's bits.
    max_bits: u16,
    from_f64: fn(f64) -> u16,
    to_f64: fn(u16) -> f64,
}

const FLOAT16: HalfFormat = HalfFormat {
    name: "float16",
    dtype: DType::new(2, 16),
    precision: 11,
    max_bits: 0x7bff,
    from_f64: |x| half::f16::from_f64(x).to_bits(),
    to_f64: |b| half::f16::from_bits(b).to_f64(),
};

const BFLOAT16: HalfFormat = HalfFormat {
    name: "bfloat16",
    dtype: DType::new(4, 16),
    precision: 8,
    max_bits: 0x7f7f,
    from_f64: |x| half::bf16::from_f64(x).to_bits(),
    to_f64: |b| half::bf16::from_bits(b).to_f64(),
};

/// The number of elements of each operand of [`c31_half_sums_round_ties_to_even`].
const TIES: usize = 64;

/// Two operands of `TIES` elements whose exact sums all lie halfway between two neighbouring
/// values of `f` (ties), the first 62 as `a = ±(1 + k·u)·2^e` and `b = ±(2j + 1)·(u/2)·2^e`
/// (`u`, the unit in the last place at 1; `k` both even and odd, so that round to nearest
/// even goes down for half of them and up for the others), the last two the largest finite
/// value plus half its unit in the last place (a tie that rounds to ±infinity). Checked to
/// be ties here, so that the test cannot pass for want of them.
fn tie_operands(f: HalfFormat) -> Result<(Vec<u16>, Vec<u16>), String> {
    let u = 2f64.powi(1 - f.precision);
    let mut ab: Vec<(f64, f64)> = (0..TIES - 2)
        .map(|i| {
            let k = ((i * 37) % 120) as f64;
            let j = (i % 3) as f64;
            let scale = 2f64.powi((i % 7) as i32 - 3) * if i % 4 == 3 { -1.0 } else { 1.0 };
            ((1.0 + k * u) * scale, (2.0 * j + 1.0) * (u / 2.0) * scale)
        })
        .collect();
    let max = (f.to_f64)(f.max_bits);
    let half_ulp_of_max = 2f64.powi(max.log2().floor() as i32 - f.precision);
    ab.push((max, half_ulp_of_max));
    ab.push((-max, -half_ulp_of_max));
    let mut a = Vec::with_capacity(TIES);
    let mut b = Vec::with_capacity(TIES);
    for (x, y) in ab {
        let (xb, yb) = ((f.from_f64)(x), (f.from_f64)(y));
        ensure!(
            (f.to_f64)(xb) == x && (f.to_f64)(yb) == y,
            "{}: {x} or {y} is not representable",
            f.name
        );
        // A tie: the exact sum is no value of the format, and its two neighbours (the
        // rounded value and the one next to it, infinity beyond the largest) are equally far.
        let exact = x + y;
        let rounded = (f.from_f64)(exact);
        let r = (f.to_f64)(rounded);
        let other = if r.is_infinite() {
            x
        } else if r.abs() < exact.abs() {
            (f.to_f64)(rounded + 1)
        } else {
            (f.to_f64)(rounded - 1)
        };
        ensure!(
            r != exact && (r.is_infinite() || (exact - r).abs() == (other - exact).abs()),
            "{}: {x} + {y} = {exact} is no tie (rounded {r}, other neighbour {other})",
            f.name
        );
        a.push(xb);
        b.push(yb);
    }
    Ok((a, b))
}

/// `bits` as a tensor of the half format `f`.
fn half_tensor(bits: &[u16], f: HalfFormat) -> Result<Owned<u16>, String> {
    Owned::new(bits.to_vec())
        .with_dtype(f.dtype)
        .map_err(|e| e.to_string())
}

/// The failures of [`c31_half_sums_round_ties_to_even`]'s forms, reported together at the end.
#[derive(Default)]
struct TieFailures(Vec<String>);

impl TieFailures {
    /// Notes the elements of `got` that are not `want`.
    fn check(&mut self, form: &str, f: HalfFormat, got: &[u16], want: &[u16]) {
        let off: Vec<String> = (0..TIES)
            .filter(|&i| got[i] != want[i])
            .map(|i| format!("[{i}] {:#06x} (want {:#06x})", got[i], want[i]))
            .collect();
        if !off.is_empty() {
            self.0.push(format!(
                "{form} {} sum: {} of {TIES} elements are not the exact sum rounded to \
                 nearest even: {}{}",
                f.name,
                off.len(),
                off[..off.len().min(4)].join(", "),
                if off.len() > 4 { ", …" } else { "" }
            ));
        }
    }
}

/// Half-precision sums are the correctly rounded ones under every MPI (issue 34): ranks 0 and
/// 1 hold operands whose exact sums are ties (the other ranks hold +0, which adds exactly),
/// and every all-reduce form (one tensor into another, in place, and the fused lists, in
/// place and into) must give, bit for bit, the exact sum rounded to nearest even by the
/// `half` crate on the host. MPICH 5.0's own `MPIX_BFLOAT16` sum rounds such ties away from
/// zero, one unit in the last place off (`HalfOps::Auto` must not use it).
fn c31_half_sums_round_ties_to_even(w: &SimpleCommunicator) -> Outcome {
    let (me, p) = (w.rank(), w.size());
    let formats = [FLOAT16, BFLOAT16];
    let mut wanted = Vec::new();
    let mut mine = Vec::new();
    for f in formats {
        let (a, b) = tie_operands(f)?;
        let want: Vec<u16> = (0..TIES)
            .map(|i| {
                let exact = (f.to_f64)(a[i]) + if p > 1 { (f.to_f64)(b[i]) } else { 0.0 };
                (f.from_f64)(exact)
            })
            .collect();
        wanted.push(want);
        mine.push(match me {
            0 => a,
            1 => b,
            _ => vec![0u16; TIES],
        });
    }
    let mut failures = TieFailures::default();
    // One tensor at a time: into a receive tensor, then in place.
    for (k, &f) in formats.iter().enumerate() {
        let send = half_tensor(&mine[k], f)?.read_only();
        let recv = half_tensor(&[0u16; TIES], f)?;
        {
            let s = acquire(&send, &opts()).map_err(|e| e.to_string())?;
            let mut r = acquire(&recv, &opts()).map_err(|e| e.to_string())?;
            w.all_reduce_tensor(&s, &mut r, ReduceOp::Sum)
                .map_err(|e| e.to_string())?;
        }
        failures.check("all_reduce_tensor", f, &recv.into_vec(), &wanted[k]);
        let both = half_tensor(&mine[k], f)?;
        {
            let mut t = acquire(&both, &opts()).map_err(|e| e.to_string())?;
            w.all_reduce_tensor_in_place(&mut t, ReduceOp::Sum)
                .map_err(|e| e.to_string())?;
        }
        failures.check(
            "all_reduce_tensor_in_place",
            f,
            &both.into_vec(),
            &wanted[k],
        );
    }
    fused_tie_sums(w, &formats, &mine, &wanted, &mut failures)?;
    ensure!(failures.0.is_empty(), "{}", failures.0.join("; "));
    Ok(())
}

/// The fused forms of [`c31_half_sums_round_ties_to_even`] (a float16 and a bfloat16
/// member, one bucket of each dtype): in place, then into a list of receive tensors.
fn fused_tie_sums(
    w: &SimpleCommunicator,
    formats: &[HalfFormat],
    mine: &[Vec<u16>],
    wanted: &[Vec<u16>],
    failures: &mut TieFailures,
) -> Outcome {
    let members: Vec<_> = formats
        .iter()
        .zip(mine)
        .map(|(&f, bits)| half_tensor(bits, f))
        .collect::<Result<_, _>>()?;
    {
        let mut ts: Vec<ManagedTensor<'_>> = members
            .iter()
            .map(|m| acquire(m, &opts()).map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?;
        w.all_reduce_tensors_in_place(&mut ts, ReduceOp::Sum)
            .map_err(|e| e.to_string())?;
    }
    for (k, m) in members.into_iter().enumerate() {
        let got = m.into_vec();
        failures.check("all_reduce_tensors_in_place", formats[k], &got, &wanted[k]);
    }
    let sends: Vec<_> = formats
        .iter()
        .zip(mine)
        .map(|(&f, bits)| half_tensor(bits, f).map(Owned::read_only))
        .collect::<Result<_, _>>()?;
    let recvs: Vec<_> = formats
        .iter()
        .map(|&f| half_tensor(&[0u16; TIES], f))
        .collect::<Result<_, _>>()?;
    {
        let ss: Vec<ManagedTensor<'_>> = sends
            .iter()
            .map(|m| acquire(m, &opts()).map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?;
        let mut rs: Vec<ManagedTensor<'_>> = recvs
            .iter()
            .map(|m| acquire(m, &opts()).map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?;
        w.all_reduce_tensors(&ss, &mut rs, ReduceOp::Sum)
            .map_err(|e| e.to_string())?;
    }
    for (k, r) in recvs.into_iter().enumerate() {
        failures.check("all_reduce_tensors", formats[k], &r.into_vec(), &wanted[k]);
    }
    Ok(())
}

fn c32_complex64(w: &SimpleCommunicator) -> Outcome {
    let r = w.rank() as f32;
    let vals: Vec<Complex32> = (0..4)
        .map(|i| Complex32::new(i as f32 + r, -(i as f32)))
        .collect();
    let src = Owned::new(vals);
    let s = acquire(&src, &opts()).map_err(|e| e.to_string())?;
    let (_, prev) = ring(w);
    let got = ring_exchange(w, &s, vec![Complex32::new(0.0, 0.0); 4])?;
    let expect: Vec<Complex32> = (0..4)
        .map(|i| Complex32::new(i as f32 + prev as f32, -(i as f32)))
        .collect();
    ensure_eq!(got, expect);
    let p = w.size() as f32;
    let out = Owned::new(vec![Complex32::new(0.0, 0.0); 4]);
    {
        let mut o = acquire(&out, &opts()).map_err(|e| e.to_string())?;
        w.all_reduce_tensor(&s, &mut o, ReduceOp::Sum)
            .map_err(|e| e.to_string())?;
    }
    let ranks_sum = p * (p - 1.0) / 2.0;
    let expect: Vec<Complex32> = (0..4)
        .map(|i| Complex32::new(i as f32 * p + ranks_sum, -(i as f32) * p))
        .collect();
    ensure_eq!(out.into_vec(), expect);
    let out = Owned::new(vec![Complex32::new(0.0, 0.0); 4]);
    let mut o = acquire(&out, &opts()).map_err(|e| e.to_string())?;
    ensure!(
        w.all_reduce_tensor(&s, &mut o, ReduceOp::Max).is_err(),
        "complex max must be refused"
    );
    Ok(())
}

fn c33_lanes_transfer_and_reduce_lane_wise(w: &SimpleCommunicator) -> Outcome {
    let f32x4 = DType::new(2, 32).with_lanes(4);
    let vals: Vec<f32> = (0..12).map(|i| (i * 10 + w.rank()) as f32).collect();
    let src = Owned::new(vals)
        .with_dtype(f32x4)
        .map_err(|e| e.to_string())?;
    let s = acquire(&src, &opts()).map_err(|e| e.to_string())?;
    ensure_eq!(s.num_elements(), 3);
    let out = Owned::new(vec![0f32; 12])
        .with_dtype(f32x4)
        .map_err(|e| e.to_string())?;
    {
        let mut o = acquire(&out, &opts()).map_err(|e| e.to_string())?;
        let (next, prev) = ring(w);
        w.sendrecv_tensor(&s, next, 3, &mut o, prev, 3)
            .map_err(|e| e.to_string())?;
    }
    let (_, prev) = ring(w);
    ensure_eq!(
        out.into_vec(),
        (0..12).map(|i| (i * 10 + prev) as f32).collect::<Vec<_>>()
    );
    let out = Owned::new(vec![0f32; 12])
        .with_dtype(f32x4)
        .map_err(|e| e.to_string())?;
    {
        let mut o = acquire(&out, &opts()).map_err(|e| e.to_string())?;
        w.all_reduce_tensor(&s, &mut o, ReduceOp::Sum)
            .map_err(|e| e.to_string())?;
    }
    let p = w.size();
    ensure_eq!(
        out.into_vec(),
        (0..12)
            .map(|i| (i * 10 * p + p * (p - 1) / 2) as f32)
            .collect::<Vec<_>>()
    );
    Ok(())
}

fn c35_mpi_type_size_equals_element_size(_w: &SimpleCommunicator) -> Outcome {
    for row in dtype::TABLE {
        let mut size = 0;
        // SAFETY: MPI is initialized; the handle is a predefined datatype.
        unsafe { mpi::ffi::MPI_Type_size(row.unit.datatype().as_raw(), &mut size) };
        let d = DType::new(row.code, row.bits);
        ensure!(
            usize::try_from(size).ok() == d.size_bytes(),
            "{d} maps to {} of {size} bytes",
            row.unit.name()
        );
    }
    Ok(())
}

fn c40_read_only_send_is_untouched(w: &SimpleCommunicator) -> Outcome {
    let vals: Vec<i64> = (0..10).collect();
    let mut raw = RawTensor::new(&vals, (0, 64, 1));
    raw.flags = 1;
    let (t, _) = raw.import_v1();
    let t = t.map_err(|e| e.to_string())?;
    ensure_eq!(ring_exchange(w, &t, vec![0i64; 10])?, vals);
    ensure_eq!(t.as_slice::<i64>().map_err(|e| e.to_string())?, &vals[..]);
    Ok(())
}

fn c41_read_only_output_refused_before_mpi(w: &SimpleCommunicator) -> Outcome {
    let ro = Owned::new(vec![5i64; 4]).read_only();
    let src = Owned::new(vec![1i64; 4]);
    let mut t = acquire(&ro, &opts()).map_err(|e| e.to_string())?;
    let s = acquire(&src, &opts()).map_err(|e| e.to_string())?;
    let (_, prev) = ring(w);
    ensure_eq!(
        w.recv_tensor(&mut t, prev, 41).unwrap_err(),
        Error::ReadOnly
    );
    ensure_eq!(
        w.all_reduce_tensor(&s, &mut t, ReduceOp::Sum).unwrap_err(),
        Error::ReadOnly
    );
    ensure_eq!(
        w.all_reduce_tensor_in_place(&mut t, ReduceOp::Sum)
            .unwrap_err(),
        Error::ReadOnly
    );
    // A read-only tensor may be the root of a broadcast: it is only read there.
    if w.rank() == 0 {
        w.broadcast_tensor(&mut t, 0).map_err(|e| e.to_string())?;
    } else {
        let out = Owned::new(vec![0i64; 4]);
        {
            let mut o = acquire(&out, &opts()).map_err(|e| e.to_string())?;
            w.broadcast_tensor(&mut o, 0).map_err(|e| e.to_string())?;
        }
        ensure_eq!(out.into_vec(), vec![5i64; 4]);
    }
    ensure_eq!(t.as_slice::<i64>().map_err(|e| e.to_string())?, &[5i64; 4]);
    Ok(())
}

fn c42_is_copied(w: &SimpleCommunicator) -> Outcome {
    let copied = Owned::new(vec![3i32, 4]).copied();
    let mut t = acquire(&copied, &opts()).map_err(|e| e.to_string())?;
    let (_, prev) = ring(w);
    ensure_eq!(
        w.recv_tensor(&mut t, prev, 42).unwrap_err(),
        Error::IsCopied
    );
    ensure_eq!(ring_exchange(w, &t, vec![0i32; 2])?, vec![3, 4]);
    Ok(())
}

/// C43 through `sendrecv_tensor`: every rank sends 6 elements around the ring into a
/// 4-element receive; each gets `Unfit` around `CountMismatch { 4, 6 }` holding its
/// incoming message (eager-sized, so every send completes), which a 6-element tensor then
/// receives through the error.
fn c43_sendrecv_holds_a_message_that_does_not_fit(w: &SimpleCommunicator) -> Outcome {
    let e = |e: Error| e.to_string();
    let (next, prev) = ring(w);
    let six = Owned::new((0..6).map(|i| i + 100 * w.rank()).collect::<Vec<i32>>());
    let four = Owned::new(vec![0i32; 4]);
    let err = {
        let s = acquire(&six, &opts()).map_err(e)?;
        let mut r = acquire(&four, &opts()).map_err(e)?;
        w.sendrecv_tensor(&s, next, 44, &mut r, prev, 44)
            .unwrap_err()
    };
    match err.mismatch() {
        Error::CountMismatch {
            expected: 4,
            actual: 6,
            ..
        } => {}
        other => return Err(format!("expected CountMismatch 4 vs 6, got {other:?}")),
    }
    let held = err.unreceived().ok_or("no held message")?;
    ensure_eq!(
        (held.source_rank(), held.tag(), held.len_bytes()),
        (prev, 44, 24)
    );
    let mut fit = Owned::new(vec![0i32; 6]);
    held.recv_into(&mut acquire(&fit, &opts()).map_err(e)?)
        .map_err(e)?;
    ensure_eq!(
        fit.as_slice().to_vec(),
        (0..6).map(|i| i + 100 * prev).collect::<Vec<_>>()
    );
    ensure_eq!(four.into_vec(), vec![0; 4]);
    Ok(())
}

fn c43_receive_size_mismatch_is_an_error_and_loses_nothing(w: &SimpleCommunicator) -> Outcome {
    let (next, prev) = ring(w);
    let six = Owned::new((0..6).map(|i| i + 100 * w.rank()).collect::<Vec<i32>>());
    let s = acquire(&six, &opts()).map_err(|e| e.to_string())?;
    let spec = SendSpec::new(&s).map_err(|e| e.to_string())?;
    let four = Owned::new(vec![0i32; 4]);
    let fit = Owned::new(vec![0i32; 6]);
    let result: Outcome = mpi::request::scope(|scope| {
        let req = w
            .immediate_send_spec(scope, &spec, next, 43)
            .map_err(|e| e.to_string())?;
        let mut small = acquire(&four, &opts()).map_err(|e| e.to_string())?;
        let err = w.recv_tensor(&mut small, prev, 43).unwrap_err();
        // The matched message is held by the error: a right-sized tensor receives it.
        let mut right = acquire(&fit, &opts()).map_err(|e| e.to_string())?;
        let ok = match err.unreceived() {
            Some(held) => held.recv_into(&mut right),
            None => Err(err.clone()),
        };
        req.wait();
        match err.mismatch() {
            Error::CountMismatch {
                expected: 4,
                actual: 6,
                ..
            } => {}
            other => return Err(format!("expected CountMismatch 4 vs 6, got {other:?}")),
        }
        ok.map_err(|e| e.to_string())?;
        Ok(())
    });
    result?;
    let mut fit = fit;
    ensure_eq!(
        fit.as_slice().to_vec(),
        (0..6).map(|i| i + 100 * prev).collect::<Vec<_>>()
    );
    Ok(())
}

fn c44_allgatherv_with_a_zero_count(w: &SimpleCommunicator) -> Outcome {
    let (r, p) = (i64::from(w.rank()), i64::from(w.size()));
    let counts: Vec<i64> = (0..p).collect();
    let displs: Vec<i64> = (0..p).map(|i| i * (i - 1) / 2).collect();
    let total: i64 = counts.iter().sum();
    let mine = Owned::new(vec![r as f64 + 0.5; r as usize]);
    let s = acquire(&mine, &opts()).map_err(|e| e.to_string())?;
    let out = Owned::new(vec![-1f64; total as usize]);
    {
        let mut o = acquire(&out, &opts()).map_err(|e| e.to_string())?;
        w.all_gatherv_tensor(&s, &mut o, Blocks::new(&counts, &displs))
            .map_err(|e| e.to_string())?;
    }
    let expect: Vec<f64> = (0..p)
        .flat_map(|i| std::iter::repeat(i as f64 + 0.5).take(i as usize))
        .collect();
    ensure_eq!(out.into_vec(), expect);
    Ok(())
}

fn empty_byte_tensors_are_not_mpi_in_place(w: &SimpleCommunicator) -> Outcome {
    // An empty Vec<u8> has the dangling address 0x1, which is MPI_IN_PLACE in Open MPI; as a
    // non-root gatherv send buffer that is an MPI error (abort) unless specs pass NULL.
    let p = w.size() as usize;
    let counts: Vec<i64> = (0..p).map(|i| i64::from(i == 0)).collect();
    let displs = vec![0i64; p];
    let mine = Owned::new(if w.rank() == 0 {
        vec![42u8]
    } else {
        Vec::new()
    });
    let s = acquire(&mine, &opts()).map_err(|e| e.to_string())?;
    let out = Owned::new(vec![0u8; 1]);
    {
        let mut o = acquire(&out, &opts()).map_err(|e| e.to_string())?;
        let recv = if w.rank() == 0 {
            Some((&mut o as &mut dyn Tensor, Blocks::new(&counts, &displs)))
        } else {
            None
        };
        w.gatherv_tensor(&s, recv, 0).map_err(|e| e.to_string())?;
    }
    if w.rank() == 0 {
        ensure_eq!(out.into_vec(), vec![42u8]);
    }
    Ok(())
}

fn c45_vector_counts_past_the_tensor_fail_before_mpi(w: &SimpleCommunicator) -> Outcome {
    let p = w.size() as usize;
    let mine = Owned::new(vec![1i32; 2]);
    let s = acquire(&mine, &opts()).map_err(|e| e.to_string())?;
    let out = Owned::new(vec![0i32; 2 * p]);
    let mut o = acquire(&out, &opts()).map_err(|e| e.to_string())?;
    let counts = vec![2i64; p];
    let displs: Vec<i64> = (0..p as i64).map(|i| 2 * i + 1).collect(); // last block reaches past
    let r = w.all_gatherv_tensor(&s, &mut o, Blocks::new(&counts, &displs));
    ensure!(matches!(r, Err(Error::OutOfBounds { .. })), "got {r:?}");
    let r = w.all_gatherv_tensor(&s, &mut o, Blocks::new(&counts[1..], &displs));
    ensure!(matches!(r, Err(Error::LengthMismatch { .. })), "got {r:?}");
    Ok(())
}

fn op_broadcast_from_every_root(w: &SimpleCommunicator) -> Outcome {
    for root in 0..w.size() {
        let init = if w.rank() == root {
            vec![root as u16 + 1; 5]
        } else {
            vec![0u16; 5]
        };
        let buf = Owned::new(init);
        {
            let mut t = acquire(&buf, &opts()).map_err(|e| e.to_string())?;
            w.broadcast_tensor(&mut t, root)
                .map_err(|e| e.to_string())?;
        }
        ensure_eq!(buf.into_vec(), vec![root as u16 + 1; 5]);
    }
    Ok(())
}

fn op_reduce_gather_scatter(w: &SimpleCommunicator) -> Outcome {
    let (r, p) = (w.rank(), w.size());
    let root = p - 1;
    let e = |e: Error| e.to_string();
    // reduce (max) to the last rank
    let mine = Owned::new(vec![r, -r, 7]);
    let s = acquire(&mine, &opts()).map_err(e)?;
    let out = Owned::new(vec![0i32; 3]);
    {
        let mut o = acquire(&out, &opts()).map_err(e)?;
        let recv: Option<&mut dyn Tensor> = if r == root { Some(&mut o) } else { None };
        w.reduce_tensor(&s, recv, ReduceOp::Max, root).map_err(e)?;
    }
    if r == root {
        ensure_eq!(out.into_vec(), vec![p - 1, 0, 7]);
    }
    // gather to rank 0
    let out = Owned::new(vec![0i32; 3 * p as usize]);
    {
        let mut o = acquire(&out, &opts()).map_err(e)?;
        let recv: Option<&mut dyn Tensor> = if r == 0 { Some(&mut o) } else { None };
        w.gather_tensor(&s, recv, 0).map_err(e)?;
    }
    if r == 0 {
        let expect: Vec<i32> = (0..p).flat_map(|i| [i, -i, 7]).collect();
        ensure_eq!(out.into_vec(), expect);
    }
    // scatter from rank 0: rank i gets [10 i, 10 i + 1]
    let all = Owned::new(
        (0..2 * p)
            .map(|i| 10 * (i / 2) + i % 2)
            .collect::<Vec<i32>>(),
    );
    let a = acquire(&all, &opts()).map_err(e)?;
    let out = Owned::new(vec![0i32; 2]);
    {
        let mut o = acquire(&out, &opts()).map_err(e)?;
        let send: Option<&dyn Tensor> = if r == 0 { Some(&a) } else { None };
        w.scatter_tensor(send, &mut o, 0).map_err(e)?;
    }
    ensure_eq!(out.into_vec(), vec![10 * r, 10 * r + 1]);
    // scatterv from rank 0: rank i gets i + 1 elements of value i
    let counts: Vec<i64> = (0..i64::from(p)).map(|i| i + 1).collect();
    let displs: Vec<i64> = (0..i64::from(p)).map(|i| i * (i + 1) / 2).collect();
    let flat: Vec<i32> = (0..p)
        .flat_map(|i| std::iter::repeat(i).take(i as usize + 1))
        .collect();
    let all = Owned::new(flat.clone());
    let a = acquire(&all, &opts()).map_err(e)?;
    let out = Owned::new(vec![-1i32; r as usize + 1]);
    {
        let mut o = acquire(&out, &opts()).map_err(e)?;
        let send = if r == 0 {
            Some((&a as &dyn Tensor, Blocks::new(&counts, &displs)))
        } else {
            None
        };
        w.scatterv_tensor(send, &mut o, 0).map_err(e)?;
    }
    ensure_eq!(out.into_vec(), vec![r; r as usize + 1]);
    // gatherv back to rank 0
    let mine = Owned::new(vec![r; r as usize + 1]);
    let m = acquire(&mine, &opts()).map_err(e)?;
    let out = Owned::new(vec![-1i32; flat.len()]);
    {
        let mut o = acquire(&out, &opts()).map_err(e)?;
        let recv = if r == 0 {
            Some((&mut o as &mut dyn Tensor, Blocks::new(&counts, &displs)))
        } else {
            None
        };
        w.gatherv_tensor(&m, recv, 0).map_err(e)?;
    }
    if r == 0 {
        ensure_eq!(out.into_vec(), flat);
    }
    Ok(())
}

fn op_all_gather_all_to_all_reduce_scatter(w: &SimpleCommunicator) -> Outcome {
    let (r, p) = (i64::from(w.rank()), i64::from(w.size()));
    let e = |e: Error| e.to_string();
    // all-gather
    let mine = Owned::new(vec![r, r * r]);
    let s = acquire(&mine, &opts()).map_err(e)?;
    let out = Owned::new(vec![0i64; 2 * p as usize]);
    {
        let mut o = acquire(&out, &opts()).map_err(e)?;
        w.all_gather_tensor(&s, &mut o).map_err(e)?;
    }
    ensure_eq!(
        out.into_vec(),
        (0..p).flat_map(|i| [i, i * i]).collect::<Vec<_>>()
    );
    // all-to-all: block j sent by rank i holds 100 i + j
    let send = Owned::new((0..p).map(|j| 100 * r + j).collect::<Vec<i64>>());
    let s = acquire(&send, &opts()).map_err(e)?;
    let out = Owned::new(vec![0i64; p as usize]);
    {
        let mut o = acquire(&out, &opts()).map_err(e)?;
        w.all_to_all_tensor(&s, &mut o).map_err(e)?;
    }
    ensure_eq!(
        out.into_vec(),
        (0..p).map(|i| 100 * i + r).collect::<Vec<_>>()
    );
    // all-to-allv: rank i sends j + 1 copies of (100 i + j) to rank j
    let scounts: Vec<i64> = (0..p).map(|j| j + 1).collect();
    let sdispls: Vec<i64> = (0..p).map(|j| j * (j + 1) / 2).collect();
    let sflat: Vec<i64> = (0..p)
        .flat_map(|j| std::iter::repeat(100 * r + j).take(j as usize + 1))
        .collect();
    let rcounts = vec![r + 1; p as usize];
    let rdispls: Vec<i64> = (0..p).map(|i| i * (r + 1)).collect();
    let send = Owned::new(sflat);
    let s = acquire(&send, &opts()).map_err(e)?;
    let out = Owned::new(vec![0i64; (p * (r + 1)) as usize]);
    {
        let mut o = acquire(&out, &opts()).map_err(e)?;
        w.all_to_allv_tensor(
            &s,
            Blocks::new(&scounts, &sdispls),
            &mut o,
            Blocks::new(&rcounts, &rdispls),
        )
        .map_err(e)?;
    }
    let expect: Vec<i64> = (0..p)
        .flat_map(|i| std::iter::repeat(100 * i + r).take(r as usize + 1))
        .collect();
    ensure_eq!(out.into_vec(), expect);
    // reduce-scatter-block (sum): element k of rank i's send is k + i
    let send = Owned::new((0..2 * p).map(|k| (k + r) as f64).collect::<Vec<f64>>());
    let s = acquire(&send, &opts()).map_err(e)?;
    let out = Owned::new(vec![0f64; 2]);
    {
        let mut o = acquire(&out, &opts()).map_err(e)?;
        w.reduce_scatter_block_tensor(&s, &mut o, ReduceOp::Sum)
            .map_err(e)?;
    }
    let ranks = (p * (p - 1) / 2) as f64;
    ensure_eq!(
        out.into_vec(),
        vec![(2 * r * p) as f64 + ranks, ((2 * r + 1) * p) as f64 + ranks]
    );
    Ok(())
}

fn op_in_place_all_reduce(w: &SimpleCommunicator) -> Outcome {
    let (r, p) = (u64::from(w.rank() as u32), u64::from(w.size() as u32));
    let buf = Owned::new(vec![r, 1, 1 << r]);
    {
        let mut t = acquire(&buf, &opts()).map_err(|e| e.to_string())?;
        w.all_reduce_tensor_in_place(&mut t, ReduceOp::Sum)
            .map_err(|e| e.to_string())?;
    }
    ensure_eq!(buf.into_vec(), vec![p * (p - 1) / 2, p, (1 << p) - 1]);
    Ok(())
}

fn op_nonblocking_scope(w: &SimpleCommunicator) -> Outcome {
    let (next, prev) = ring(w);
    let src = Owned::new(vec![w.rank() as u8; 16]);
    let dst = Owned::new(vec![0u8; 16]);
    {
        let s = acquire(&src, &opts()).map_err(|e| e.to_string())?;
        let mut d = acquire(&dst, &opts()).map_err(|e| e.to_string())?;
        let send = SendSpec::new(&s).map_err(|e| e.to_string())?;
        let mut recv = RecvSpec::new(&mut d).map_err(|e| e.to_string())?;
        mpi::request::scope(|scope| -> Outcome {
            let rr = w
                .immediate_recv_spec(scope, &mut recv, prev, 9)
                .map_err(|e| e.to_string())?;
            let sr = w
                .immediate_send_spec(scope, &send, next, 9)
                .map_err(|e| e.to_string())?;
            sr.wait();
            rr.wait();
            Ok(())
        })?;
    }
    ensure_eq!(dst.into_vec(), vec![prev as u8; 16]);
    Ok(())
}

fn op_specs_plug_into_plain_rsmpi(w: &SimpleCommunicator) -> Outcome {
    let src = Owned::new(vec![w.rank() as f32 + 0.25; 3]);
    let dst = Owned::new(vec![0f32; 3]);
    {
        let s = acquire(&src, &opts()).map_err(|e| e.to_string())?;
        let mut d = acquire(&dst, &opts()).map_err(|e| e.to_string())?;
        let send = SendSpec::new(&s).map_err(|e| e.to_string())?;
        let mut recv = RecvSpec::new(&mut d).map_err(|e| e.to_string())?;
        w.all_reduce_into(&send, &mut recv, SystemOperation::sum());
    }
    let p = w.size() as f32;
    ensure_eq!(dst.into_vec(), vec![p * (p - 1.0) / 2.0 + 0.25 * p; 3]);
    Ok(())
}

fn local_mismatches_are_errors(w: &SimpleCommunicator) -> Outcome {
    let p = w.size();
    let a = Owned::new(vec![1i32; 4]);
    let b = Owned::new(vec![1i64; 4]);
    let c = Owned::new(vec![1i32; 3]);
    let s = acquire(&a, &opts()).map_err(|e| e.to_string())?;
    let mut wrong_type = acquire(&b, &opts()).map_err(|e| e.to_string())?;
    let mut wrong_len = acquire(&c, &opts()).map_err(|e| e.to_string())?;
    let r = w.all_reduce_tensor(&s, &mut wrong_type, ReduceOp::Sum);
    ensure!(matches!(r, Err(Error::DtypeMismatch { .. })), "{r:?}");
    let r = w.all_reduce_tensor(&s, &mut wrong_len, ReduceOp::Sum);
    ensure!(
        matches!(
            r,
            Err(Error::CountMismatch {
                expected: 4,
                actual: 3,
                ..
            })
        ),
        "{r:?}"
    );
    let r = w.send_tensor(&s, p, 0);
    ensure_eq!(r.unwrap_err(), Error::InvalidRank { rank: p, size: p });
    let r = w.send_tensor(&s, 0, -5);
    let Err(Error::InvalidTag { tag: -5, tag_ub }) = r else {
        return Err(format!("negative tag: {r:?}"));
    };
    ensure!(tag_ub >= 32767, "MPI_TAG_UB {tag_ub} below the MPI minimum");
    if let Some(above) = tag_ub.checked_add(1) {
        let r = w.recv_tensor(&mut wrong_len, 0, above);
        ensure!(
            matches!(r, Err(Error::InvalidTag { .. })),
            "tag above MPI_TAG_UB: {r:?}"
        );
    }
    // Two overlapping windows of one buffer as send and receive of one collective.
    let both = Owned::new(vec![1i32; 8]);
    let whole = acquire(&both, &opts()).map_err(|e| e.to_string())?;
    ensure!(
        overlapping_windows_are_refused(&whole, w)?,
        "overlapping send/receive must be refused"
    );
    let r = w.broadcast_tensor(&mut wrong_len, -1);
    ensure!(
        matches!(r, Err(Error::InvalidRank { rank: -1, .. })),
        "{r:?}"
    );
    Ok(())
}

/// All-reduce between two overlapping windows of one buffer (as two DLPack exports of one
/// producer buffer would be): refused as `BuffersAlias` before MPI sees it.
fn overlapping_windows_are_refused(
    t: &ManagedTensor<'_>,
    w: &SimpleCommunicator,
) -> Result<bool, String> {
    let mut shape = [4i64];
    let window = |offset_elems: u64, shape: &mut [i64; 1]| {
        let mut dl = *t.dl_tensor();
        dl.shape = shape.as_mut_ptr();
        dl.strides = std::ptr::null_mut();
        dl.byte_offset += offset_elems * 4;
        dl
    };
    let mut shape_b = [4i64];
    let mut a = window(0, &mut shape);
    let mut b = window(2, &mut shape_b); // elements 2..6 overlap elements 0..4
                                         // SAFETY: both describe 4 of the 8 live int32 elements of `t`, which outlives the views;
                                         // the call is refused before anything is written.
    let (va, mut vb) = unsafe {
        (
            dlpack_mpi::dlpack::TensorView::from_raw(&mut a).map_err(|e| e.to_string())?,
            dlpack_mpi::dlpack::TensorView::from_raw(&mut b).map_err(|e| e.to_string())?,
        )
    };
    let r = w.all_reduce_tensor(&va, &mut vb, ReduceOp::Sum);
    Ok(matches!(r, Err(Error::BuffersAlias { .. })))
}

fn f32_raw(storage: &[f32], shape: &[i64], strides: &[i64], byte_offset: u64) -> RawTensor {
    let mut raw = RawTensor::new(storage, (2, 32, 1)).shape(shape, Some(strides));
    raw.byte_offset = byte_offset;
    raw
}

/// Sends a strided f32 tensor around the ring; returns what a contiguous receiver got.
fn strided_delivery(w: &SimpleCommunicator, raw: &RawTensor, n: usize) -> Result<Vec<f32>, String> {
    let (t, c) = raw.import_v1();
    let t = t.map_err(|e| e.to_string())?;
    let got = ring_exchange(w, &t, vec![-1f32; n])?;
    drop(t);
    ensure_eq!(c.get(), 1);
    Ok(got)
}

fn c21_fortran_order_delivered_in_logical_order(w: &SimpleCommunicator) -> Outcome {
    let storage: Vec<f32> = (0..8).map(|i| i as f32).collect();
    let f = f32_raw(&storage, &[2, 2, 2], &[1, 2, 4], 0);
    ensure_eq!(
        strided_delivery(w, &f, 8)?,
        vec![0., 4., 2., 6., 1., 5., 3., 7.]
    );
    let c = f32_raw(&storage, &[2, 2, 2], &[4, 2, 1], 0);
    ensure_eq!(strided_delivery(w, &c, 8)?, storage);
    Ok(())
}

fn c22_permuted_strides_delivered(w: &SimpleCommunicator) -> Outcome {
    let storage: Vec<f32> = (0..8).map(|i| i as f32).collect();
    let a = f32_raw(&storage, &[2, 2, 2], &[4, 1, 2], 0);
    ensure_eq!(
        strided_delivery(w, &a, 8)?,
        vec![0., 2., 1., 3., 4., 6., 5., 7.]
    );
    let b = f32_raw(&storage, &[2, 2, 2], &[2, 4, 1], 0);
    ensure_eq!(
        strided_delivery(w, &b, 8)?,
        vec![0., 1., 4., 5., 2., 3., 6., 7.]
    );
    Ok(())
}

fn c23_step_slice_delivered(w: &SimpleCommunicator) -> Outcome {
    let raw = f32_raw(&[0., 1., 2., 3., 4.], &[3], &[2], 0);
    ensure_eq!(strided_delivery(w, &raw, 3)?, vec![0., 2., 4.]);
    Ok(())
}

fn c24_negative_stride_delivered_reversed(w: &SimpleCommunicator) -> Outcome {
    let raw = f32_raw(&[0., 1., 2.], &[3], &[-1], 8); // data at the last element
    ensure_eq!(strided_delivery(w, &raw, 3)?, vec![2., 1., 0.]);
    Ok(())
}

fn c25_broadcast_send_delivered(w: &SimpleCommunicator) -> Outcome {
    let raw = f32_raw(&[2.], &[6], &[0], 0);
    ensure_eq!(strided_delivery(w, &raw, 6)?, vec![2.; 6]);
    Ok(())
}

fn strided_receive_lands_in_logical_order(w: &SimpleCommunicator) -> Outcome {
    // Receive 6 values into a transposed 2x3 view (strides [1, 2]) of 6 floats, and into
    // every other element of 12 floats: the gaps must stay untouched.
    let (next, prev) = ring(w);
    let src = Owned::new((0..6).map(|i| (i + 10 * prev) as f32).collect::<Vec<_>>()).read_only();
    let mine = Owned::new(
        (0..6)
            .map(|i| (i + 10 * w.rank()) as f32)
            .collect::<Vec<_>>(),
    )
    .read_only();
    let dst = Owned::new(vec![-1f32; 6])
        .with_layout(&[2, 3], Some(&[1, 2]), 0)
        .map_err(|e| e.to_string())?;
    let gaps = Owned::new(vec![-7f32; 12])
        .with_layout(&[6], Some(&[2]), 4)
        .map_err(|e| e.to_string())?;
    {
        let s = acquire(&mine, &opts()).map_err(|e| e.to_string())?;
        let mut d = acquire(&dst, &opts()).map_err(|e| e.to_string())?;
        w.sendrecv_tensor(&s, next, 21, &mut d, prev, 21)
            .map_err(|e| e.to_string())?;
        let mut g = acquire(&gaps, &opts()).map_err(|e| e.to_string())?;
        w.sendrecv_tensor(&s, next, 22, &mut g, prev, 22)
            .map_err(|e| e.to_string())?;
    }
    let want: Vec<f32> = {
        let mut s = src;
        s.as_slice().to_vec()
    };
    // logical (i, j) = want[3i + j] sits at storage i + 2j.
    let mut expect = vec![0f32; 6];
    for i in 0..2 {
        for j in 0..3 {
            expect[i + 2 * j] = want[3 * i + j];
        }
    }
    ensure_eq!(dst.into_vec(), expect);
    let g = gaps.into_vec();
    ensure_eq!(
        g.iter().step_by(2).copied().collect::<Vec<_>>(),
        vec![-7f32; 6]
    );
    ensure_eq!(
        g.iter().skip(1).step_by(2).copied().collect::<Vec<_>>(),
        want
    );
    Ok(())
}

fn strided_reductions_and_broadcast(w: &SimpleCommunicator) -> Outcome {
    let (r, p) = (w.rank(), w.size());
    let e = |e: Error| e.to_string();
    // F-order 2x3 send (storage value = storage index + rank), reversed-stride receive.
    let send = Owned::new((0..6).map(|k| (k + r) as f64).collect::<Vec<_>>())
        .with_layout(&[2, 3], Some(&[1, 2]), 0)
        .map_err(e)?
        .read_only();
    let out = Owned::new(vec![0f64; 6])
        .with_layout(&[6], Some(&[-1]), 40)
        .map_err(e)?;
    {
        let s = acquire(&send, &opts()).map_err(e)?;
        let mut o = acquire(&out, &opts()).map_err(e)?;
        w.all_reduce_tensor(&s, &mut o, ReduceOp::Sum).map_err(e)?;
    }
    // logical element l = (i, j) -> storage i + 2j; sum over ranks of (k + rank).
    let ranks = f64::from(p * (p - 1) / 2);
    let logical: Vec<f64> = (0..2)
        .flat_map(|i| (0..3).map(move |j| f64::from(i + 2 * j) * f64::from(p) + ranks))
        .collect();
    let mut expect = logical.clone();
    expect.reverse(); // stored through stride -1 from the last element
    ensure_eq!(out.into_vec(), expect);
    // In-place max over every other element; the gaps keep their values.
    let buf = Owned::new(
        (0..8)
            .map(|k| {
                if k % 2 == 0 {
                    (k * 10 + r) as f64
                } else {
                    -3.0
                }
            })
            .collect::<Vec<_>>(),
    )
    .with_layout(&[4], Some(&[2]), 0)
    .map_err(e)?;
    {
        let mut t = acquire(&buf, &opts()).map_err(e)?;
        w.all_reduce_tensor_in_place(&mut t, ReduceOp::Max)
            .map_err(e)?;
    }
    let expect: Vec<f64> = (0..8)
        .map(|k| {
            if k % 2 == 0 {
                f64::from(k * 10 + p - 1)
            } else {
                -3.0
            }
        })
        .collect();
    ensure_eq!(buf.into_vec(), expect);
    // Broadcast into a step-2 view from a transposed root.
    let root = p - 1;
    let init: Vec<f64> = if r == root {
        (0..6).map(f64::from).collect()
    } else {
        vec![-1.0; 6]
    };
    let b = Owned::new(init)
        .with_layout(&[3, 2], Some(&[1, 3]), 0)
        .map_err(e)?;
    {
        let mut t = acquire(&b, &opts()).map_err(e)?;
        w.broadcast_tensor(&mut t, root).map_err(e)?;
    }
    ensure_eq!(b.into_vec(), (0..6).map(f64::from).collect::<Vec<_>>());
    Ok(())
}

fn strided_blocks_are_packed(w: &SimpleCommunicator) -> Outcome {
    // The gathered side of an all-gather into every other element of a 4P buffer: MPI
    // receives into a packed copy that is unpacked in logical order; the gaps stay.
    let p = w.size() as usize;
    let src = Owned::new(vec![w.rank() + 1; 2]);
    let out = Owned::new(vec![-9i32; 4 * p])
        .with_layout(&[2 * p as i64], Some(&[2]), 0)
        .map_err(|e| e.to_string())?;
    {
        let s = acquire(&src, &opts()).map_err(|e| e.to_string())?;
        let mut o = acquire(&out, &opts()).map_err(|e| e.to_string())?;
        w.all_gather_tensor(&s, &mut o).map_err(|e| e.to_string())?;
    }
    let expect: Vec<i32> = (0..2 * p as i32).flat_map(|k| [k / 2 + 1, -9]).collect();
    ensure_eq!(out.into_vec(), expect);
    Ok(())
}

fn derived_datatypes_are_cached(w: &SimpleCommunicator) -> Outcome {
    let raw = f32_raw(&[0., 1., 2., 3., 4.], &[3], &[2], 0);
    strided_delivery(w, &raw, 3)?;
    let before = dlpack_mpi::spec::datatype::cached_count();
    for _ in 0..20 {
        strided_delivery(w, &raw, 3)?;
    }
    ensure_eq!(dlpack_mpi::spec::datatype::cached_count(), before);
    Ok(())
}

fn large_count_spec_is_one_exact_derived_type(_w: &SimpleCommunicator) -> Outcome {
    // 3e9 bytes (claimed; nothing is transferred): one datatype of exactly that size.
    for (units, lanes) in [
        (3_000_000_000i64, 1u16),
        ((1i64 << 31) + 5, 1),
        (1 << 30, 4),
    ] {
        let raw = RawTensor::new(&[0u8; 8], (1, 8, lanes)).shape(&[units], Some(&[1]));
        let (t, _) = raw.import_v1();
        let t = t.map_err(|e| e.to_string())?;
        let s = SendSpec::new(&t).map_err(|e| e.to_string())?;
        ensure!(s.is_derived() && s.count() == 1, "count {}", s.count());
        let mut size: mpi::ffi::MPI_Count = 0;
        // SAFETY: MPI is initialized; the handle is a committed datatype.
        unsafe { mpi::ffi::MPI_Type_size_x(s.as_datatype().as_raw(), &mut size) };
        ensure_eq!(size as i128, i128::from(units) * i128::from(lanes));
    }
    Ok(())
}

/// Open MPI 4.1 turns hvector(n, 1, -1 byte, <1-byte type>) into a forward run, reading
/// and writing past the buffer; 1-byte reversed axes are built another way. Both directions,
/// short and longer than one 2^16 block (with remainder), with canaries around the receive.
fn one_byte_reversed_axis_is_really_reversed(w: &SimpleCommunicator) -> Outcome {
    let (next, prev) = ring(w);
    for n in [7usize, 65536, 70_001] {
        let src = Owned::new(
            (0..n)
                .map(|i| (i % 251) as u8 + w.rank() as u8)
                .collect::<Vec<u8>>(),
        )
        .with_layout(&[n as i64], Some(&[-1]), (n - 1) as u64)
        .map_err(|e| e.to_string())?
        .read_only();
        let dst = Owned::new(vec![0xEEu8; n + 32])
            .with_layout(&[n as i64], Some(&[-1]), (n - 1 + 16) as u64)
            .map_err(|e| e.to_string())?;
        {
            let s = acquire(&src, &opts()).map_err(|e| e.to_string())?;
            let mut d = acquire(&dst, &opts()).map_err(|e| e.to_string())?;
            w.sendrecv_tensor(&s, next, 31, &mut d, prev, 31)
                .map_err(|e| e.to_string())?;
        }
        let got = dst.into_vec();
        ensure_eq!(&got[..16], &[0xEEu8; 16][..]);
        ensure_eq!(&got[n + 16..], &[0xEEu8; 16][..]);
        // Sender's logical element l is storage n-1-l: (n-1-l) % 251 + prev; the receiver
        // stores logical l at storage 16 + n-1-l, so storage 16 + j holds (j % 251) + prev.
        let expect: Vec<u8> = (0..n).map(|j| (j % 251) as u8 + prev as u8).collect();
        ensure!(
            got[16..n + 16] == expect[..],
            "n = {n}: reversed bytes not delivered in order"
        );
    }
    Ok(())
}

/// One random layout: per axis (extent, step, reversed, memory-order key).
type AxisSpec = (i64, i64, bool, u32);

/// Shape, strides (elements), first-element offset (elements) and storage length
/// (elements) of a layout that puts axes in memory in the order of their keys, each axis
/// `step` apart and optionally reversed. Built independently of the crate's layout code.
fn random_layout(axes: &[AxisSpec]) -> (Vec<i64>, Vec<i64>, i64, i64) {
    let shape: Vec<i64> = axes.iter().map(|a| a.0).collect();
    let mut order: Vec<usize> = (0..axes.len()).collect();
    order.sort_by_key(|&k| (axes[k].3, k));
    let mut strides = vec![0i64; axes.len()];
    let mut span = 1i64;
    for &k in order.iter().rev() {
        let (n, step, _, _) = axes[k];
        strides[k] = span * step;
        span *= (n * step).max(1);
    }
    let mut first = 0;
    for (k, a) in axes.iter().enumerate() {
        if a.2 {
            first += (a.0 - 1).max(0) * strides[k];
            strides[k] = -strides[k];
        }
    }
    (shape, strides, first, span)
}

/// The elements (bytes of `esize` each) of `storage` in logical row-major order.
fn reference_gather(
    storage: &[u8],
    shape: &[i64],
    strides: &[i64],
    first: i64,
    esize: usize,
) -> Vec<u8> {
    let total: i64 = shape.iter().product();
    let mut out = Vec::with_capacity(total.max(0) as usize * esize);
    let mut index = vec![0i64; shape.len()];
    for _ in 0..total.max(0) {
        let off = first + index.iter().zip(strides).map(|(i, s)| i * s).sum::<i64>();
        let at = off as usize * esize;
        out.extend_from_slice(&storage[at..at + esize]);
        for k in (0..shape.len()).rev() {
            index[k] += 1;
            if index[k] < shape[k] {
                break;
            }
            index[k] = 0;
        }
    }
    out
}

/// Property (issue: strided layouts): for random shapes (0 included), memory orders, steps
/// and reversed axes, and every dtype, a receiver holds exactly the reference gather of the
/// sender's elements in logical order; and a strided receiver gets each logical element at
/// its place, with every other byte of its storage untouched.
fn prop_strided_delivery_equals_reference_gather(w: &SimpleCommunicator) -> Outcome {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};

    let mut dtypes: Vec<DType> = dtype::TABLE
        .iter()
        .map(|r| DType::new(r.code, r.bits))
        .collect();
    dtypes.push(DType::new(2, 32).with_lanes(4));
    let n_dtypes = dtypes.len();
    let (next, prev) = ring(w);
    let config = Config {
        cases: 48,
        max_shrink_iters: 0,
        failure_persistence: None,
        ..Config::default()
    };
    // Every rank draws the same cases (same seed), so the exchanges pair up.
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    let strategy = (
        0..n_dtypes,
        prop::collection::vec((0i64..5, 1i64..4, any::<bool>(), any::<u32>()), 0..4),
    );
    let result = runner.run(&strategy, |(d, axes)| {
        let dtype = dtypes[d];
        let esize = dtype.size_bytes().unwrap();
        let (shape, strides, first, span) = random_layout(&axes);
        let n: i64 = shape.iter().product();
        let fill = |rank: i32| -> Vec<u8> {
            (0..span as usize * esize)
                .map(|j| (j * 31 + rank as usize * 7 + 1) as u8)
                .collect()
        };
        let mut local = Ok(());
        // 1. strided sender -> contiguous receiver
        let src = Owned::new(fill(w.rank()))
            .with_dtype(dtype)
            .and_then(|o| o.with_layout(&shape, Some(&strides), first as u64 * esize as u64))
            .map(Owned::read_only);
        let dst = Owned::new(vec![0u8; n as usize * esize]).with_dtype(dtype);
        let (src, dst) = match (src, dst) {
            (Ok(s), Ok(d)) => (s, d),
            (s, d) => {
                return Err(TestCaseError::fail(format!(
                    "building: {:?} {:?}",
                    s.err(),
                    d.err()
                )))
            }
        };
        {
            let s = acquire(&src, &opts()).unwrap();
            let mut d = acquire(&dst, &opts()).unwrap();
            if let Err(e) = w.sendrecv_tensor(&s, next, 51, &mut d, prev, 51) {
                local = Err(format!("send: {e}"));
            }
        }
        let expect = reference_gather(&fill(prev), &shape, &strides, first, esize);
        if local.is_ok() && dst.into_vec() != expect {
            local = Err(format!(
                "{dtype} {shape:?} {strides:?}: strided send delivered wrong bytes"
            ));
        }
        // 2. contiguous sender -> strided receiver (storage pre-filled with 0xEE)
        let mine = reference_gather(&fill(w.rank()), &shape, &strides, first, esize);
        let src = Owned::new(mine).with_dtype(dtype).unwrap().read_only();
        let dst = Owned::new(vec![0xEEu8; span as usize * esize])
            .with_dtype(dtype)
            .and_then(|o| o.with_layout(&shape, Some(&strides), first as u64 * esize as u64))
            .unwrap();
        {
            let s = acquire(&src, &opts()).unwrap();
            let mut d = acquire(&dst, &opts()).unwrap();
            if let Err(e) = w.sendrecv_tensor(&s, next, 52, &mut d, prev, 52) {
                local = local.and(Err(format!("receive: {e}")));
            }
        }
        let got = dst.into_vec();
        let landed = reference_gather(&got, &shape, &strides, first, esize);
        if local.is_ok() && landed != expect {
            local = Err(format!(
                "{dtype} {shape:?} {strides:?}: strided receive misplaced bytes"
            ));
        }
        // Bytes outside the elements keep the canary.
        let mut touched = vec![false; got.len()];
        let mut index = vec![0i64; shape.len()];
        for _ in 0..n.max(0) {
            let off = first + index.iter().zip(&strides).map(|(i, s)| i * s).sum::<i64>();
            for b in 0..esize {
                touched[off as usize * esize + b] = true;
            }
            for k in (0..shape.len()).rev() {
                index[k] += 1;
                if index[k] < shape[k] {
                    break;
                }
                index[k] = 0;
            }
        }
        if local.is_ok() && got.iter().zip(&touched).any(|(&b, &t)| !t && b != 0xEE) {
            local = Err(format!(
                "{dtype} {shape:?} {strides:?}: a byte outside the elements changed"
            ));
        }
        // Every rank fails together, so that all draw the same next case.
        let mine = i32::from(local.is_err());
        let mut any = 0;
        w.all_reduce_into(&mine, &mut any, SystemOperation::max());
        match (local, any) {
            (Err(m), _) => Err(TestCaseError::fail(m)),
            (Ok(()), 0) => Ok(()),
            (Ok(()), _) => Err(TestCaseError::fail("failed on another rank")),
        }
    });
    result.map_err(|e| e.to_string())
}

/// `Packing::Copy` (issue: explicit packing): the same deliveries as the derived-datatype
/// path, through packed copies, for send/receive, sendrecv and broadcast.
fn packing_copy_delivers_the_same(w: &SimpleCommunicator) -> Outcome {
    use dlpack_mpi::settings::{packing, set_packing, Packing};
    let before = packing().map_err(|e| e.to_string())?;
    set_packing(Packing::Copy);
    let result = (|| -> Outcome {
        let storage: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let f = f32_raw(&storage, &[2, 2, 2], &[1, 2, 4], 0);
        ensure_eq!(
            strided_delivery(w, &f, 8)?,
            vec![0., 4., 2., 6., 1., 5., 3., 7.]
        );
        strided_receive_lands_in_logical_order(w)?;
        let root = w.size() - 1;
        let init: Vec<f64> = if w.rank() == root {
            (0..6).map(f64::from).collect()
        } else {
            vec![-1.0; 6]
        };
        let b = Owned::new(init)
            .with_layout(&[3, 2], Some(&[1, 3]), 0)
            .map_err(|e| e.to_string())?;
        {
            let mut t = acquire(&b, &opts()).map_err(|e| e.to_string())?;
            w.broadcast_tensor(&mut t, root)
                .map_err(|e| e.to_string())?;
        }
        ensure_eq!(b.into_vec(), (0..6).map(f64::from).collect::<Vec<_>>());
        if w.size() >= 2 {
            let src = Owned::new((0..10).map(|i| i as f32).collect::<Vec<_>>())
                .with_layout(&[5], Some(&[2]), 0)
                .map_err(|e| e.to_string())?
                .read_only();
            let dst = Owned::new(vec![0f32; 5]);
            {
                if w.rank() == 0 {
                    let s = acquire(&src, &opts()).map_err(|e| e.to_string())?;
                    w.send_tensor(&s, 1, 61).map_err(|e| e.to_string())?;
                } else if w.rank() == 1 {
                    let mut d = acquire(&dst, &opts()).map_err(|e| e.to_string())?;
                    w.recv_tensor(&mut d, 0, 61).map_err(|e| e.to_string())?;
                }
            }
            if w.rank() == 1 {
                ensure_eq!(dst.into_vec(), vec![0., 2., 4., 6., 8.]);
            }
        }
        Ok(())
    })();
    set_packing(before);
    result
}

type Case = (&'static str, fn(&SimpleCommunicator) -> Outcome);

const CASES: &[Case] = &[
    (
        "packing_copy_delivers_the_same",
        packing_copy_delivers_the_same,
    ),
    (
        "prop_strided_delivery_equals_reference_gather",
        prop_strided_delivery_equals_reference_gather,
    ),
    (
        "one_byte_reversed_axis_is_really_reversed",
        one_byte_reversed_axis_is_really_reversed,
    ),
    (
        "c21_fortran_order_delivered_in_logical_order",
        c21_fortran_order_delivered_in_logical_order,
    ),
    (
        "c22_permuted_strides_delivered",
        c22_permuted_strides_delivered,
    ),
    ("c23_step_slice_delivered", c23_step_slice_delivered),
    (
        "c24_negative_stride_delivered_reversed",
        c24_negative_stride_delivered_reversed,
    ),
    ("c25_broadcast_send_delivered", c25_broadcast_send_delivered),
    (
        "strided_receive_lands_in_logical_order",
        strided_receive_lands_in_logical_order,
    ),
    (
        "strided_reductions_and_broadcast",
        strided_reductions_and_broadcast,
    ),
    ("strided_blocks_are_packed", strided_blocks_are_packed),
    ("derived_datatypes_are_cached", derived_datatypes_are_cached),
    (
        "large_count_spec_is_one_exact_derived_type",
        large_count_spec_is_one_exact_derived_type,
    ),
    ("c02_v0_and_v1_deliver", c02_v0_and_v1_deliver),
    ("c06_zero_d", c06_zero_d),
    ("c07_zero_size_everywhere", c07_zero_size_everywhere),
    (
        "c27_byte_offset_delivers_from_offset",
        c27_byte_offset_delivers_from_offset,
    ),
    (
        "c30_bool_transfer_and_logical_reductions",
        c30_bool_transfer_and_logical_reductions,
    ),
    (
        "c31_half_bits_identical_and_reductions",
        c31_half_bits_identical,
    ),
    (
        "c31_half_sums_round_ties_to_even",
        c31_half_sums_round_ties_to_even,
    ),
    ("c32_complex64", c32_complex64),
    (
        "c33_lanes_transfer_and_reduce_lane_wise",
        c33_lanes_transfer_and_reduce_lane_wise,
    ),
    (
        "c35_mpi_type_size_equals_element_size",
        c35_mpi_type_size_equals_element_size,
    ),
    (
        "c40_read_only_send_is_untouched",
        c40_read_only_send_is_untouched,
    ),
    (
        "c41_read_only_output_refused_before_mpi",
        c41_read_only_output_refused_before_mpi,
    ),
    ("c42_is_copied", c42_is_copied),
    (
        "c43_receive_size_mismatch_is_an_error_and_loses_nothing",
        c43_receive_size_mismatch_is_an_error_and_loses_nothing,
    ),
    (
        "c43_sendrecv_holds_a_message_that_does_not_fit",
        c43_sendrecv_holds_a_message_that_does_not_fit,
    ),
    (
        "c44_allgatherv_with_a_zero_count",
        c44_allgatherv_with_a_zero_count,
    ),
    (
        "empty_byte_tensors_are_not_mpi_in_place",
        empty_byte_tensors_are_not_mpi_in_place,
    ),
    (
        "c45_vector_counts_past_the_tensor_fail_before_mpi",
        c45_vector_counts_past_the_tensor_fail_before_mpi,
    ),
    ("op_broadcast_from_every_root", op_broadcast_from_every_root),
    ("op_reduce_gather_scatter", op_reduce_gather_scatter),
    (
        "op_all_gather_all_to_all_reduce_scatter",
        op_all_gather_all_to_all_reduce_scatter,
    ),
    ("op_in_place_all_reduce", op_in_place_all_reduce),
    ("op_nonblocking_scope", op_nonblocking_scope),
    (
        "op_specs_plug_into_plain_rsmpi",
        op_specs_plug_into_plain_rsmpi,
    ),
    ("local_mismatches_are_errors", local_mismatches_are_errors),
];

/// The suite `mpi_cases` (see the binary's `main`).
pub fn run(w: &SimpleCommunicator, filter: &[String]) -> harness::End {
    if w.rank() == 0 {
        println!("running multi-rank cases at {} rank(s)", w.size());
    }
    let (passed, failed) = harness::run_cases(w, CASES.iter().copied(), filter, |case| case(w));
    harness::report(w, passed, failed);
    harness::End::Ran { passed, failed }
}
