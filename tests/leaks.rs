//! Resident memory stays flat over 100 000 acquire → send/receive → release cycles.
//!
//! Each cycle imports a C-style versioned tensor (a counting deleter that frees the struct,
//! its arrays and its storage), exports a receive tensor from an [`Owned`], exchanges them
//! around the ring with `sendrecv_tensor`, checks the values, and drops both; every odd cycle
//! the tensors are strided (step-2 views), under the packing policies auto, copy and derived
//! in turn (pooled pack buffers, cached derived datatypes), every 4th goes through the
//! nonblocking `immediate_send_tensor`/`immediate_recv_tensor` instead (requests that own
//! their pack buffers), and every 16th goes through an all-reduce. After a warm-up (MPI's and the allocator's own pools), the resident set size
//! is read before and after the measured cycles; the growth must stay below
//! `MAX_GROWTH_BYTES`, 256 KiB (one leaked 8-byte allocation per cycle would be 800 KB over
//! 100 000 cycles; one leaked tensor struct per cycle, several MB).
//!
//! A plain `main` (harness = false): scripts/test.sh runs it at 2 ranks with 100 000 cycles
//! (`DLPACK_MPI_LEAK_CYCLES` overrides the count; `cargo test` runs 10 000 cycles at 1 rank).

mod common;

use common::{rss_bytes, RawTensor};
use dlpack_mpi::comm::TensorComm;
use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned};
use dlpack_mpi::dtype::ReduceOp;
use dlpack_mpi::settings::Packing;
use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

const WARMUP: usize = 5_000;
const MAX_GROWTH_BYTES: u64 = 256 << 10;
const N: usize = 64;
const POLICIES: [Packing; 3] = [Packing::Auto, Packing::Copy, Packing::DerivedDatatype];

fn cycle(w: &SimpleCommunicator, c: usize) -> Result<(), String> {
    let (rank, size) = (w.rank(), w.size());
    let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
    // Every odd cycle sends and receives step-2 views (a strided send and a strided
    // receive), under the three packing policies in turn: the pack pool must stay bounded.
    let strided = c % 2 == 1;
    dlpack_mpi::settings::set_packing(POLICIES[(c / 2) % POLICIES.len()]);
    let vals: Vec<f64> = (0..2 * N)
        .map(|i| (rank as usize * 1000 + i + c) as f64)
        .collect();
    let raw = if strided {
        RawTensor::new(&vals, (2, 64, 1)).shape(&[N as i64], Some(&[2]))
    } else {
        RawTensor::new(&vals[..N], (2, 64, 1))
    };
    let (t, deletes) = raw.import_v1();
    let t = t.map_err(|e| e.to_string())?;
    let out = if strided {
        Owned::new(vec![0.0f64; 2 * N])
            .with_layout(&[N as i64], Some(&[2]), 0)
            .map_err(|e| e.to_string())?
    } else {
        Owned::new(vec![0.0f64; N])
    };
    {
        let mut r = acquire(&out, &AcquireOptions::default()).map_err(|e| e.to_string())?;
        if c % 4 == 3 {
            // Strided, through the nonblocking tensor forms: each request owns its pack
            // buffer until `wait`, which hands it back to the pool.
            mpi::request::scope(|scope| -> Result<(), String> {
                let e = |e: dlpack_mpi::Error| e.to_string();
                let rr = w.immediate_recv_tensor(scope, &mut r, prev, 6).map_err(e)?;
                let sr = w.immediate_send_tensor(scope, &t, next, 6).map_err(e)?;
                sr.wait().map_err(e)?;
                rr.wait().map_err(e)?;
                Ok(())
            })?;
        } else {
            w.sendrecv_tensor(&t, next, 5, &mut r, prev, 5)
                .map_err(|e| e.to_string())?;
        }
        if c % 16 == 15 {
            w.all_reduce_tensor(&t, &mut r, ReduceOp::Max)
                .map_err(|e| e.to_string())?;
        }
    }
    drop(t);
    if deletes.get() != 1 {
        return Err(format!("cycle {c}: deleter ran {} times", deletes.get()));
    }
    let got = out.into_vec();
    let step = if strided { 2 } else { 1 };
    let want = |i: usize| {
        if c % 16 == 15 {
            ((size as usize - 1) * 1000 + step * i + c) as f64
        } else {
            (prev as usize * 1000 + step * i + c) as f64
        }
    };
    for i in [0, N / 2, N - 1] {
        if got[i * step] != want(i) {
            return Err(format!(
                "cycle {c}: element {i} is {}, expected {}",
                got[i * step],
                want(i)
            ));
        }
    }
    Ok(())
}

fn main() {
    let cycles: usize = std::env::var("DLPACK_MPI_LEAK_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let universe = mpi::initialize().expect("MPI initializes once");
    let w = universe.world();
    let mut result = Ok(());
    for c in 0..WARMUP {
        result = result.and_then(|()| cycle(&w, c));
    }
    let before = rss_bytes();
    for c in WARMUP..WARMUP + cycles {
        if result.is_err() {
            break;
        }
        result = cycle(&w, c);
    }
    let after = rss_bytes();
    let growth = after.saturating_sub(before);
    if result.is_ok() && growth > MAX_GROWTH_BYTES {
        result = Err(format!(
            "resident memory grew {growth} bytes over {cycles} cycles (bound {MAX_GROWTH_BYTES})"
        ));
    }
    println!(
        "rank {}: {cycles} cycles: RSS {} -> {} KiB, growth {growth} bytes ({:.3} bytes/cycle)",
        w.rank(),
        before / 1024,
        after / 1024,
        growth as f64 / cycles.max(1) as f64
    );
    if let Err(msg) = &result {
        eprintln!("rank {}: {msg}", w.rank());
    }
    let mine = i32::from(result.is_err());
    let mut any = 0;
    w.all_reduce_into(&mine, &mut any, SystemOperation::max());
    if w.rank() == 0 {
        println!(
            "test leaks_flat_rss ... {}",
            if any == 0 { "ok" } else { "FAILED" }
        );
    }
    drop(universe);
    if any != 0 {
        std::process::exit(1);
    }
}
