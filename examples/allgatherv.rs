//! All-gatherv with uneven blocks through [`TensorComm::all_gatherv_tensor`]: rank `r`
//! contributes `r` values (so rank 0 contributes none), placed at the prefix sum of the
//! smaller ranks' counts. Every rank checks that each block holds its owner's values.
//!
//! ```text
//! cargo build --examples
//! mpirun -n 4 target/debug/examples/allgatherv
//! ```

use dlpack_mpi::comm::{Blocks, TensorComm};
use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned};
use mpi::traits::*;

/// The block rank `r` sends: `r` values `1000 r + j`.
fn block(r: i64) -> Vec<i32> {
    (0..r).map(|j| (1000 * r + j) as i32).collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let universe = mpi::initialize().ok_or("MPI was already initialized")?;
    let world = universe.world();
    let (rank, size) = (i64::from(world.rank()), i64::from(world.size()));

    let counts: Vec<i64> = (0..size).collect();
    let displacements: Vec<i64> = (0..size).map(|r| r * (r - 1) / 2).collect();
    let total: i64 = counts.iter().sum();

    let send = Owned::new(block(rank));
    let recv = Owned::new(vec![-1i32; total as usize]);
    {
        let opts = AcquireOptions::default();
        let s = acquire(&send, &opts)?;
        let mut r = acquire(&recv, &opts)?;
        world.all_gatherv_tensor(&s, &mut r, Blocks::new(&counts, &displacements))?;
    }

    let got = recv.into_vec();
    for r in 0..size {
        let at = displacements[r as usize] as usize;
        let n = counts[r as usize] as usize;
        assert_eq!(
            got[at..at + n],
            block(r)[..],
            "rank {rank}: block of rank {r}"
        );
    }
    let want: Vec<i32> = (0..size).flat_map(block).collect();
    assert_eq!(got, want, "rank {rank}: whole receive buffer");

    world.barrier();
    if rank == 0 {
        println!("allgatherv: OK on {size} ranks ({total} elements)");
    }
    Ok(())
}
