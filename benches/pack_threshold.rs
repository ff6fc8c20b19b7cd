//! Measures where `Packing::Auto` should switch from packing to a derived datatype: rank 0
//! sends a `[N / block, block]` f32 view with a gap of one block (strides `[2 × block, 1]`)
//! to rank 1 under `Packing::DerivedDatatype` and under `Packing::Copy`, for blocks of 1 …
//! 4096 elements, and prints the median time of each (rank 1 receives contiguously).
//!
//! `"$MPIRUN" "${MPIRUN_FLAGS[@]}" -n 2 "$(bench_binary pack_threshold)" [packed MiB, default 32]
//! [rounds, 7]` (benches/README.md); an argument that is not a number (`--bench`, which
//! `cargo bench` passes) leaves the default.

use std::time::Instant;

use dlpack_mpi::comm::TensorComm;
use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned};
use dlpack_mpi::settings::{set_packing, Packing};
use mpi::traits::*;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> dlpack_mpi::Result<()> {
    let universe = mpi::initialize().expect("MPI initializes once");
    let world = universe.world();
    let mut args = std::env::args().skip(1);
    let mib: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(32);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(7);
    let n = mib << 18; // f32 elements packed
    let n_i64 = i64::try_from(n).expect("fits");
    if world.rank() == 0 {
        println!("block_elems derived_us pack_us pack/derived");
    }
    for shift in 0..=12 {
        let block = 1i64 << shift;
        let mut times = [0.0f64; 2];
        for (i, policy) in [Packing::DerivedDatatype, Packing::Copy]
            .into_iter()
            .enumerate()
        {
            set_packing(policy);
            let mut samples = Vec::with_capacity(rounds);
            if world.rank() == 0 {
                let data: Vec<f32> = (0..2 * n).map(|k| k as f32).collect();
                let owned = Owned::new(data).with_layout(
                    &[n_i64 / block, block],
                    Some(&[2 * block, 1]),
                    0,
                )?;
                let t = acquire(&owned, &AcquireOptions::default())?;
                for _ in 0..rounds {
                    world.barrier();
                    let start = Instant::now();
                    world.send_tensor(&t, 1, 0)?;
                    world.process_at_rank(1).receive::<u8>();
                    samples.push(start.elapsed().as_secs_f64() * 1e6);
                }
            } else if world.rank() == 1 {
                let owned = Owned::new(vec![0f32; n]);
                let mut t = acquire(&owned, &AcquireOptions::default())?;
                for _ in 0..rounds {
                    world.barrier();
                    world.recv_tensor(&mut t, 0, 0)?;
                    world.process_at_rank(0).send(&0u8);
                }
            } else {
                for _ in 0..rounds {
                    world.barrier();
                }
            }
            times[i] = if samples.is_empty() {
                0.0
            } else {
                median(samples)
            };
        }
        if world.rank() == 0 {
            let ratio = times[1] / times[0];
            println!("{block} {:.0} {:.0} {ratio:.2}", times[0], times[1]);
        }
    }
    Ok(())
}
