//! All-reduce (sum) of an `i64` and an `f64` tensor with [`TensorComm::all_reduce_tensor`],
//! and of an `i64` tensor in place with [`TensorComm::all_reduce_tensor_in_place`]
//! (`MPI_IN_PLACE`). Results are checked against closed-form sums over the ranks.
//!
//! ```text
//! cargo build --examples
//! mpirun -n 4 target/debug/examples/allreduce
//! ```

use dlpack_mpi::comm::TensorComm;
use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned};
use dlpack_mpi::dtype::ReduceOp;
use mpi::traits::*;

const N: usize = 6;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let universe = mpi::initialize().ok_or("MPI was already initialized")?;
    let world = universe.world();
    let (rank, size) = (i64::from(world.rank()), i64::from(world.size()));
    let opts = AcquireOptions::default();
    // Σ_{r<size} r and Σ_{r<size} r².
    let sum_r = size * (size - 1) / 2;
    let sum_r2 = (size - 1) * size * (2 * size - 1) / 6;

    // i64: element i on rank r is r * (i + 1) + r².
    let ints_in = Owned::new(
        (0..N as i64)
            .map(|i| rank * (i + 1) + rank * rank)
            .collect::<Vec<_>>(),
    );
    let ints_out = Owned::new(vec![-1i64; N]);
    // f64: element i on rank r is r + i / 4 (exact in binary, so the sum is exact).
    let floats_in = Owned::new(
        (0..N)
            .map(|i| rank as f64 + i as f64 / 4.0)
            .collect::<Vec<_>>(),
    );
    let floats_out = Owned::new(vec![f64::NAN; N]);
    // In place: element i on rank r is 1 + i·r; the sum is size + i·Σr.
    let in_place = Owned::new((0..N as i64).map(|i| 1 + i * rank).collect::<Vec<_>>());
    {
        let (si, mut ri) = (acquire(&ints_in, &opts)?, acquire(&ints_out, &opts)?);
        world.all_reduce_tensor(&si, &mut ri, ReduceOp::Sum)?;
        let (sf, mut rf) = (acquire(&floats_in, &opts)?, acquire(&floats_out, &opts)?);
        world.all_reduce_tensor(&sf, &mut rf, ReduceOp::Sum)?;
        let mut t = acquire(&in_place, &opts)?;
        world.all_reduce_tensor_in_place(&mut t, ReduceOp::Sum)?;
    }

    let want_ints: Vec<i64> = (0..N as i64).map(|i| sum_r * (i + 1) + sum_r2).collect();
    let want_floats: Vec<f64> = (0..N)
        .map(|i| sum_r as f64 + size as f64 * i as f64 / 4.0)
        .collect();
    let want_in_place: Vec<i64> = (0..N as i64).map(|i| size + i * sum_r).collect();
    assert_eq!(ints_out.into_vec(), want_ints, "i64 all-reduce");
    assert_eq!(floats_out.into_vec(), want_floats, "f64 all-reduce");
    assert_eq!(in_place.into_vec(), want_in_place, "in-place all-reduce");

    world.barrier();
    if rank == 0 {
        println!("allreduce: OK on {size} ranks");
    }
    Ok(())
}
