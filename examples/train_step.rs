//! One data-parallel training step, as README.md shows it: every rank computes its
//! gradients, sums them over the ranks in one fused nonblocking all-reduce overlapped with
//! computation, and applies the averaged SGD update, so the parameters stay equal on every
//! rank; the result is asserted. `examples/train_step_mpi4py.py` is the same step in mpi4py
//! and NumPy, and docs/GUIDE.md compares the two programs' lengths.
//! (`examples/training_step.rs` is the full program: ResNet-50's parameter list, started
//! equal by a fused broadcast, its gradients posted in groups during the backward pass.)
//!
//! Values: rank `r` of `n` has gradients `r + 1`, whose sum is `n(n + 1)/2` and average
//! `(n + 1)/2`; with a learning rate of 1/8 every value is exact in `f32`.
//!
//! ```text
//! cargo build --examples && mpirun -n 4 target/debug/examples/train_step
//! ```
use dlpack_mpi::prelude::{ReduceOp::Sum, *};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let universe = mpi::initialize().ok_or("MPI was already initialized")?;
    let world = universe.world();
    let (rank, n) = (world.rank(), world.size() as f32);
    // A model of four parameters (a 512 × 1000 weight, three biases), equal on every rank.
    let sizes = [512 * 1000, 1000, 4096, 4096];
    let mut params = sizes.map(|k| vec![0.5f32; k]);
    // This rank's backward pass: its gradients (rank + 1 everywhere), exported as a list.
    let grads = sizes.map(|k| Owned::new(vec![rank as f32 + 1.0; k]));
    let mut guards = acquire_all(&grads, &Default::default())?;
    mpi::request::scope(|scope| -> dlpack_mpi::Result<()> {
        // Every gradient summed over the ranks in place, as few messages, while computing:
        let mut sum = world.immediate_all_reduce_tensors_in_place(scope, &mut guards, Sum)?;
        // ... computation that does not touch the gradients, until the sum is complete ...
        while !sum.is_complete()? {}
        Ok(())
    })?;
    // The averaged gradients' SGD update (learning rate 1/8), the same on every rank.
    for (p, g) in params.iter_mut().zip(&guards) {
        let g = g.as_slice::<f32>()?;
        p.iter_mut().zip(g).for_each(|(x, y)| *x -= 0.125 * y / n);
    }
    let expected = 0.5 - 0.125 * (n + 1.0) / 2.0;
    assert!(params.iter().flatten().all(|&x| x == expected));
    if rank == 0 {
        println!("train_step: OK on {n} ranks");
    }
    Ok(())
}
