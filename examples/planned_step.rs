//! Many data-parallel training steps with a plan, as README.md shows it: the fused
//! all-reduce of the gradients is planned once (every check and the agreement, the buckets
//! and their buffers), then each step writes this rank's gradients, starts the planned sum
//! during the rest of the backward pass, waits for it before the update, and asserts the
//! result. Planned steps make no agreement and allocate nothing (`docs/PERFORMANCE.md`,
//! "Plans").
//!
//! Values: at step `s`, rank `r` of `n` has gradients `r + s`, whose sum is
//! `n(n − 1)/2 + n·s`; the parameters move by an eighth of the average each step, exact in
//! `f32` for these small numbers.
//!
//! ```text
//! cargo build --examples && mpirun -n 4 target/debug/examples/planned_step
//! ```
use dlpack_mpi::prelude::{ReduceOp::Sum, *};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let universe = mpi::initialize().ok_or("MPI was already initialized")?;
    let world = universe.world();
    let (rank, n) = (world.rank() as f32, world.size() as f32);
    // A model of four parameters (a 512 × 1000 weight, three biases), equal on every rank.
    let sizes = [512 * 1000, 1000, 4096, 4096];
    let mut params = sizes.map(|k| vec![0.5f32; k]);
    let grads = sizes.map(|k| Owned::new(vec![0.0f32; k]));
    let mut guards = acquire_all(&grads, &Default::default())?;
    // The gradients' sum over the ranks, planned once: checked and agreed here, not per step.
    let mut plan = world.plan_all_reduce_tensors_in_place(&mut guards, Sum)?;
    for step in 0..10 {
        // This rank's backward pass writes its gradients (rank + step everywhere) ...
        for g in plan.tensors_mut().iter_mut() {
            g.as_mut_slice::<f32>()?.fill(rank + step as f32);
        }
        // ... and the sum starts at once, while the rest of the step computes:
        mpi::request::scope(|scope| {
            let sum = plan.start(scope)?;
            // ... computation that does not touch the gradients ...
            sum.wait()
        })?;
        // The averaged gradients' SGD update (learning rate 1/8), the same on every rank.
        for (p, g) in params.iter_mut().zip(plan.tensors().iter()) {
            let g = g.as_slice::<f32>()?;
            p.iter_mut().zip(g).for_each(|(x, y)| *x -= 0.125 * y / n);
        }
        let moved: f32 = (0..=step)
            .map(|s| 0.125 * ((n - 1.0) / 2.0 + s as f32))
            .sum();
        assert!(params.iter().flatten().all(|&x| x == 0.5 - moved));
    }
    if rank == 0.0 {
        println!("planned_step: OK on {n} ranks, 10 steps");
    }
    Ok(())
}
