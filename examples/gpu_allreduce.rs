//! All-reduce of a CUDA tensor made by cudarc (feature `cuda`): direct when MPI is
//! CUDA-aware, staged through pinned host memory otherwise. Every rank contributes
//! `rank + 1` in each of 2^20 float32 elements; every rank checks the sum.
//!
//! ```text
//! cargo build --release --features cuda --example gpu_allreduce
//! mpirun -n 2 target/release/examples/gpu_allreduce
//! ```

use dlpack_mpi::comm::TensorComm;
use dlpack_mpi::dlpack::{acquire, AcquireOptions, CudaExport};
use dlpack_mpi::dtype::ReduceOp;
use dlpack_mpi::runtime::default_runtime;
use dlpack_mpi::transport::{DeviceComm, Transport};
use mpi::traits::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let universe = mpi::initialize().ok_or("MPI was already initialized")?;
    let world = universe.world();
    if default_runtime().is_none() {
        println!("no CUDA driver or device: nothing to do");
        return Ok(());
    }
    let n = 1 << 20;
    let stream = cudarc::driver::CudaContext::new(0)?.default_stream();
    let grads = stream.clone_htod(&vec![world.rank() as f32 + 1.0; n])?;
    let mut sum = stream.alloc_zeros::<f32>(n)?;
    {
        // acquire hands each exporter our stream and synchronizes it before MPI reads.
        let send = CudaExport::new(&grads);
        let out = CudaExport::new_mut(&mut sum);
        let s = acquire(&send, &AcquireOptions::default())?;
        let mut r = acquire(&out, &AcquireOptions::default())?;
        let comm = DeviceComm::new(&world, default_runtime(), Transport::Auto)?;
        comm.all_reduce_tensor(&s, &mut r, ReduceOp::Sum)?;
        println!("rank {}: route {:?}", world.rank(), comm.last_route());
    }
    let host = stream.clone_dtoh(&sum)?;
    let size = world.size() as f32;
    let want = size * (size + 1.0) / 2.0;
    if host.iter().any(|v| *v != want) {
        return Err(format!("expected {want} everywhere").into());
    }
    println!("rank {}: all {n} elements are {want}", world.rank());
    Ok(())
}
