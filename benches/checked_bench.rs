//! What the checked protocol's header costs: ping-pong between ranks 0 and 1, plain
//! (`TensorComm::send_tensor` / `recv_tensor`) vs checked (`checked::send` /
//! `checked::recv_into`, and `checked::recv_new`, which also allocates), for an 8-byte and a
//! 1 MiB float64 tensor, in one run.
//!
//! ```text
//! source scripts/mpi-env.sh; source scripts/test-binary.sh
//! "$MPIRUN" "${MPIRUN_FLAGS[@]}" -n 2 "$(bench_binary checked_bench)" [rounds]
//! ```
//!
//! (`bench_binary` builds it with `cargo bench --no-run` and prints its path; see
//! benches/README.md.)
//!
//! Each (size, mode) is timed in `rounds` rounds (default 7), the modes interleaved round by
//! round so that machine noise hits them alike; the table gives the median round. Latency is
//! half a round trip, in microseconds; bandwidth is bytes of payload per second one way.
//! Ranks beyond 1 only join the barriers. This is a measurement, not a test: it asserts only
//! that every round trip delivered the values sent.

use dlpack_mpi::checked;
use dlpack_mpi::comm::TensorComm;
use dlpack_mpi::dlpack::{acquire, AcquireOptions, ManagedTensor, Owned};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Plain,
    Checked,
    CheckedNew,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Plain => "plain (send_tensor/recv_tensor)",
            Mode::Checked => "checked (send/recv_into)",
            Mode::CheckedNew => "checked (send/recv_new)",
        }
    }
}

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// One round of `iters` round trips; returns seconds per round trip (rank 0's clock).
fn round(
    w: &SimpleCommunicator,
    mode: Mode,
    iters: usize,
    x: &ManagedTensor<'_>,
    y: &mut ManagedTensor<'_>,
) -> Res<f64> {
    let rank = w.rank();
    let peer = 1 - rank;
    let tag = 3;
    let send = |x: &ManagedTensor<'_>| -> Res<()> {
        match mode {
            Mode::Plain => w.send_tensor(x, peer, tag)?,
            Mode::Checked | Mode::CheckedNew => checked::send(w, peer, tag, x)?,
        }
        Ok(())
    };
    let recv = |y: &mut ManagedTensor<'_>| -> Res<()> {
        match mode {
            Mode::Plain => {
                w.recv_tensor(y, peer, tag)?;
            }
            Mode::Checked => {
                checked::recv_into(w, peer, tag, y)?;
            }
            Mode::CheckedNew => {
                // Look at the first element only: a full copy would be timed too.
                let mut r = checked::recv_new(w, peer, tag)?;
                if r.bytes()[..8] != 1.0f64.to_ne_bytes() {
                    return Err("recv_new delivered the wrong values".into());
                }
            }
        }
        Ok(())
    };
    w.barrier();
    let t0 = mpi::time();
    if rank < 2 {
        for _ in 0..iters {
            if rank == 0 {
                send(x)?;
                recv(y)?;
            } else {
                recv(y)?;
                send(x)?;
            }
        }
    }
    let dt = mpi::time() - t0;
    w.barrier();
    Ok(dt / iters as f64)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Res<()> {
    let universe = mpi::initialize().ok_or("MPI was already initialized")?;
    let w = universe.world();
    if w.size() < 2 {
        return Err("checked_bench needs at least 2 ranks".into());
    }
    // `cargo bench` passes `--bench`: only a bare number is the rounds.
    let rounds: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with("--"))
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(7);
    let opts = AcquireOptions::default();
    if w.rank() == 0 {
        println!(
            "checked_bench: ping-pong rank 0 <-> 1 of {}, {} rounds per row, median round",
            w.size(),
            rounds
        );
        println!(
            "{:>9}  {:<34} {:>12} {:>12} {:>10}",
            "payload", "mode", "latency µs", "MB/s", "vs plain"
        );
    }
    for (elems, iters) in [(1usize, 4000usize), (131_072, 100)] {
        let xs = Owned::new(vec![1.0f64; elems]);
        let ys = Owned::new(vec![0.0f64; elems]);
        let x = acquire(&xs, &opts)?;
        let mut y = acquire(&ys, &opts)?;
        let modes = [Mode::Plain, Mode::Checked, Mode::CheckedNew];
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
        // One untimed warm-up round each (connections, caches, the derived-type cache).
        for &m in &modes {
            round(&w, m, iters / 10 + 1, &x, &mut y)?;
        }
        for _ in 0..rounds {
            for (i, &m) in modes.iter().enumerate() {
                times[i].push(round(&w, m, iters, &x, &mut y)?);
            }
        }
        drop(y);
        if w.rank() < 2 {
            let mut ys = ys;
            if ys.as_slice().iter().any(|&v| v != 1.0) {
                return Err("ping-pong delivered the wrong values".into());
            }
        }
        if w.rank() == 0 {
            let bytes = elems * 8;
            let plain = median(times[0].clone()) / 2.0;
            for (i, &m) in modes.iter().enumerate() {
                let one_way = median(times[i].clone()) / 2.0;
                println!(
                    "{:>9}  {:<34} {:>12.2} {:>12.1} {:>9.2}x",
                    if bytes >= 1 << 20 {
                        format!("{} MiB", bytes >> 20)
                    } else {
                        format!("{bytes} B")
                    },
                    m.name(),
                    one_way * 1e6,
                    bytes as f64 / one_way / 1e6,
                    one_way / plain
                );
            }
        }
    }
    Ok(())
}
