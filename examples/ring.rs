//! A ring of `sendrecv`: every rank sends five `f64` values to `rank + 1` and receives five
//! from `rank - 1` (modulo the size) with [`TensorComm::sendrecv_tensor`], which probes the
//! incoming size before receiving. Works at any number of ranks, including 1 (a rank sends
//! to itself).
//!
//! ```text
//! cargo build --examples
//! mpirun -n 4 target/debug/examples/ring
//! ```

use dlpack_mpi::comm::TensorComm;
use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned, Tensor};
use mpi::traits::*;

const N: usize = 5;

/// The values rank `r` sends: `100 r + i`.
fn payload(r: i32) -> Vec<f64> {
    (0..N).map(|i| f64::from(100 * r) + i as f64).collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let universe = mpi::initialize().ok_or("MPI was already initialized")?;
    let world = universe.world();
    let (rank, size) = (world.rank(), world.size());
    let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);

    let outgoing = Owned::new(payload(rank));
    let incoming = Owned::new(vec![f64::NAN; N]);
    {
        let opts = AcquireOptions::default();
        let send = acquire(&outgoing, &opts)?;
        let mut recv = acquire(&incoming, &opts)?;
        let status = world.sendrecv_tensor(&send, next, 7, &mut recv, prev, 7)?;
        assert_eq!(status.source_rank(), prev);
        // The guard still views the producer's memory: read it before releasing.
        assert_eq!(recv.as_slice::<f64>()?, payload(prev).as_slice());
    } // Both tensors are released here (the deleters run), before `into_vec`.

    let got = incoming.into_vec();
    assert_eq!(
        got,
        payload(prev),
        "rank {rank}: wrong values from rank {prev}"
    );
    assert_eq!(
        outgoing.into_vec(),
        payload(rank),
        "the send buffer was changed"
    );

    world.barrier();
    if rank == 0 {
        println!("ring: OK on {size} ranks");
    }
    Ok(())
}
