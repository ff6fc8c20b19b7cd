//! float16 and bfloat16 all-reduce (sum) through `TensorComm::all_reduce_tensor` with the
//! MPI library's own half-precision datatypes (`HalfOps::Mpi`: MPICH ≥ 5's `MPIX_C_FLOAT16`
//! and `MPIX_BFLOAT16` with `MPI_SUM`, whatever the rounding probe of `HalfOps::Auto` finds)
//! next to dlpack-mpi's user-defined operations
//! (`HalfOps::Library`, `MPI_UINT16_T` units), on the same buffers in the same run (issue 24).
//! Under an MPI without those datatypes both modes are the library's (the table says so).
//!
//! ```text
//! DLPACK_MPI_IMPL=mpich5 source scripts/mpi-env.sh; source scripts/test-binary.sh
//! "$MPIRUN" "${MPIRUN_FLAGS[@]}" -n 2 "$(bench_binary half_ops_bench)" [rounds]
//! ```
//!
//! Each (dtype, size, mode) is timed in `rounds` rounds (default 7), the modes interleaved
//! round by round; the table gives the median round's time per call on rank 0 (µs) and the
//! ratio native / library. A measurement, not a test: it checks that the last sum of each
//! mode is exact (every rank contributes 1.0 per element: the sum is the rank count). Which
//! form `HalfOps::Auto`, the default, takes is printed first (the rounding probe's verdict).

use dlpack_mpi::comm::halfops;
use dlpack_mpi::comm::TensorComm;
use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned};
use dlpack_mpi::dtype::{code, DType, ReduceOp};
use dlpack_mpi::settings::{set_half_ops, HalfOps};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The bits of 1.0 in the half format of `dtype`, and of `x` back to `f32`.
fn one(dtype: DType) -> u16 {
    if dtype.code == code::BFLOAT {
        half::bf16::ONE.to_bits()
    } else {
        half::f16::ONE.to_bits()
    }
}

fn value(dtype: DType, bits: u16) -> f32 {
    if dtype.code == code::BFLOAT {
        half::bf16::from_bits(bits).to_f32()
    } else {
        half::f16::from_bits(bits).to_f32()
    }
}

/// Mean µs per all-reduce of `n` elements over `iters` calls, in `ops` mode; the last
/// result's first element.
fn time(
    w: &SimpleCommunicator,
    dtype: DType,
    n: usize,
    iters: usize,
    ops: HalfOps,
) -> Res<(f64, f32)> {
    set_half_ops(ops);
    let send = Owned::new(vec![one(dtype); n]).with_dtype(dtype)?;
    let recv = Owned::new(vec![0u16; n]).with_dtype(dtype)?;
    let s = acquire(&send, &AcquireOptions::default())?;
    let mut r = acquire(&recv, &AcquireOptions::default())?;
    w.all_reduce_tensor(&s, &mut r, ReduceOp::Sum)?;
    w.barrier();
    let t0 = mpi::time();
    for _ in 0..iters {
        w.all_reduce_tensor(&s, &mut r, ReduceOp::Sum)?;
    }
    let us = (mpi::time() - t0) * 1e6 / iters as f64;
    drop(r);
    Ok((us, value(dtype, recv.into_vec()[0])))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Res<()> {
    let universe = mpi::initialize().ok_or("MPI already initialized")?;
    let w = universe.world();
    let rounds: usize = std::env::args().nth(1).map_or(Ok(7), |a| a.parse())?;
    let p = w.size();
    if p < 2 {
        return Err("run under mpirun at 2 or more ranks".into());
    }
    let native = halfops::native_available();
    if w.rank() == 0 {
        println!(
            "# half-precision all-reduce (sum), {p} ranks, µs per call (median of {rounds} rounds); native: {}",
            if native { "the MPI library's MPIX_C_FLOAT16 / MPIX_BFLOAT16 (HalfOps::Mpi)" } else { "none in this MPI (both columns are dlpack-mpi's operations)" }
        );
        for dtype in [DType::new(code::FLOAT, 16), DType::new(code::BFLOAT, 16)] {
            println!(
                "# {dtype} sum with the process's setting ({:?}): {}",
                dlpack_mpi::settings::half_ops()?,
                halfops::choice(dtype, ReduceOp::Sum)?
            );
        }
        println!(
            "{:<9} {:>10} {:>12} {:>12} {:>8}",
            "dtype", "bytes", "native", "library", "ratio"
        );
    }
    for dtype in [DType::new(code::FLOAT, 16), DType::new(code::BFLOAT, 16)] {
        for bytes in [1usize << 10, 64 << 10, 1 << 20, 16 << 20] {
            let n = bytes / 2;
            let iters = ((16 << 20) / bytes).clamp(4, 2000);
            let (mut a, mut b) = (Vec::new(), Vec::new());
            let mut sums = (0.0, 0.0);
            for _ in 0..rounds {
                let (t, s) = time(&w, dtype, n, iters, HalfOps::Mpi)?;
                a.push(t);
                sums.0 = s;
                let (t, s) = time(&w, dtype, n, iters, HalfOps::Library)?;
                b.push(t);
                sums.1 = s;
            }
            if sums != (p as f32, p as f32) {
                return Err(format!("{dtype} sums {sums:?}, expected {p}").into());
            }
            if w.rank() == 0 {
                let (ma, mb) = (median(a), median(b));
                println!(
                    "{:<9} {:>10} {:>12.2} {:>12.2} {:>8.2}",
                    dtype.to_string(),
                    bytes,
                    ma,
                    mb,
                    ma / mb
                );
            }
        }
    }
    Ok(())
}
