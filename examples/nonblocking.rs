//! Nonblocking halo exchange inside an rsmpi scope: every rank sends a tensor to both
//! neighbours and receives one from each with [`TensorComm::immediate_send_tensor`] and
//! [`TensorComm::immediate_recv_tensor`].
//!
//! The order of declarations is the point: exporters, then DLPack guards, then the scope. A
//! request borrows its guard, which borrows its exporter; so the borrow checker proves that
//! the producer's memory outlives every request (moving `acquire` inside the scope, or
//! dropping a guard before `wait`, does not compile). The operations take tensors, as the
//! blocking ones do: a strided tensor would be packed per the packing policy, its pack
//! buffer owned by the request until `wait`.
//! Tags tell the directions apart, so 1 and 2 ranks (where both neighbours coincide) work.
//!
//! ```text
//! cargo build --examples
//! mpirun -n 4 target/debug/examples/nonblocking
//! ```

use dlpack_mpi::comm::TensorComm;
use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned};
use mpi::traits::*;

const N: usize = 4;
/// Tag of messages travelling to the right (to `rank + 1`).
const RIGHTWARD: i32 = 1;
/// Tag of messages travelling to the left (to `rank - 1`).
const LEFTWARD: i32 = 2;

/// What rank `r` sends in direction `tag`.
fn payload(r: i32, tag: i32) -> Vec<f32> {
    (0..N)
        .map(|i| (10 * r + tag) as f32 + i as f32 / 8.0)
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let universe = mpi::initialize().ok_or("MPI was already initialized")?;
    let world = universe.world();
    let (rank, size) = (world.rank(), world.size());
    let (right, left) = ((rank + 1) % size, (rank + size - 1) % size);

    // Producers: own the memory.
    let to_right = Owned::new(payload(rank, RIGHTWARD));
    let to_left = Owned::new(payload(rank, LEFTWARD));
    let from_left = Owned::new(vec![f32::NAN; N]);
    let from_right = Owned::new(vec![f32::NAN; N]);
    {
        // DLPack guards: keep the producers' memory exported until they drop.
        let opts = AcquireOptions::default();
        let t_right = acquire(&to_right, &opts)?;
        let t_left = acquire(&to_left, &opts)?;
        let mut t_from_left = acquire(&from_left, &opts)?;
        let mut t_from_right = acquire(&from_right, &opts)?;
        mpi::request::scope(|scope| -> dlpack_mpi::Result<()> {
            // Post the receives first, then the sends; the requests borrow the guards. All
            // checks happen before each post, and `left`/`right` are valid, so no `?` below
            // fails after a post (a request dropped by one would wait for its message in
            // its `Drop`: no panic and no buffer freed under MPI, but a message that never
            // comes would block there).
            let recvs = [
                world.immediate_recv_tensor(scope, &mut t_from_left, left, RIGHTWARD)?,
                world.immediate_recv_tensor(scope, &mut t_from_right, right, LEFTWARD)?,
            ];
            let sends = [
                world.immediate_send_tensor(scope, &t_right, right, RIGHTWARD)?,
                world.immediate_send_tensor(scope, &t_left, left, LEFTWARD)?,
            ];
            for request in recvs {
                request.wait()?;
            }
            for request in sends {
                request.wait()?;
            }
            Ok(())
        })?;
    } // The guards are dropped here: the deleters run after every request is done.

    assert_eq!(
        from_left.into_vec(),
        payload(left, RIGHTWARD),
        "rank {rank}: from the left"
    );
    assert_eq!(
        from_right.into_vec(),
        payload(right, LEFTWARD),
        "rank {rank}: from the right"
    );
    assert_eq!(
        to_right.into_vec(),
        payload(rank, RIGHTWARD),
        "a send buffer was changed"
    );

    world.barrier();
    if rank == 0 {
        println!("nonblocking: OK on {size} ranks");
    }
    Ok(())
}
