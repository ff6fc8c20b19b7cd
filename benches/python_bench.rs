//! Import cost and 8-byte ping-pong of NumPy tensors: dlpack-mpi next to mpi4py's DLPack
//! path, mpi4py's buffer-protocol path and raw MPI, in one run (docs/PERFORMANCE.md,
//! "Python producers"). A benchmark, not a test: it asserts only that the values arrived.
//!
//! ```sh
//! source scripts/mpi-env.sh; source scripts/python-env.sh; source scripts/test-binary.sh
//! bin=$(bench_binary python_bench --features python)   # cargo bench --no-run, its path
//! "$MPIRUN" "${MPIRUN_FLAGS[@]}" -n 2 "$bin" [iterations] [rounds]
//! "$MPIRUN" "${MPIRUN_FLAGS[@]}" -n 1 "$bin"   # import cost only, no busy-polling peer
//! ```
//!
//! - **import**, on rank 0, no MPI: one `dlpack_mpi::python::acquire` of a NumPy array and
//!   its release (device query, `__dlpack__(max_version, copy=False)`, capsule rename,
//!   validation, deleter under the GIL), timed in Rust; next to `mpi4py.MPI.buffer(obj)` of
//!   an object that only has `__dlpack__` (mpi4py's DLPack import) and of the NumPy array
//!   itself (buffer protocol), timed in a Python loop (the empty loop's cost is printed).
//! - **ping-pong** of one float64 (8 bytes) between ranks 0 and 1, µs per message (half a
//!   round trip), for: raw rsmpi on a `Vec<f64>`; dlpack-mpi acquiring the NumPy array for
//!   every message and sending through `send_tensor`/`recv_tensor` (checked: the receive
//!   probes first) or through the specs with plain rsmpi calls; mpi4py `Send`/`Recv` of the
//!   DLPack-only object and of the NumPy array. Median over rounds, paths rotated per round.

use std::ffi::CString;
use std::time::Instant;

use dlpack_mpi::comm::TensorComm;
use dlpack_mpi::dlpack::AcquireOptions;
use dlpack_mpi::python::{self, pyo3};
use dlpack_mpi::spec::{RecvSpec, SendSpec};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use pyo3::prelude::*;
use pyo3::types::PyDict;

const SETUP: &str = r#"
import numpy as np
from mpi4py import MPI

class DLPackOnly:
    """No buffer protocol: mpi4py takes its DLPack path."""
    def __init__(self, array):
        self.array = array
    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)
    def __dlpack_device__(self):
        return self.array.__dlpack_device__()

comm = MPI.COMM_WORLD
a = np.array([rank + 1.0])
b = np.zeros(1)
da, db = DLPackOnly(a), DLPackOnly(b)

def import_loop(obj, n):
    buffer = MPI.buffer
    t = MPI.Wtime()
    for _ in range(n):
        buffer(obj)
    return (MPI.Wtime() - t) / n

def empty_loop(n):
    t = MPI.Wtime()
    for _ in range(n):
        pass
    return (MPI.Wtime() - t) / n

def pingpong(send, recv, n, peer, first):
    Send, Recv = comm.Send, comm.Recv
    comm.Barrier()
    t = MPI.Wtime()
    if first:
        for _ in range(n):
            Send(send, peer)
            Recv(recv, peer)
    else:
        for _ in range(n):
            Recv(recv, peer)
            Send(send, peer)
    return (MPI.Wtime() - t) / (2 * n)
"#;

const PATHS: [&str; 5] = [
    "raw rsmpi",
    "dlpack-mpi checked (acquire+send_tensor/recv_tensor)",
    "dlpack-mpi specs (acquire+SendSpec/RecvSpec)",
    "mpi4py DLPack path (Send/Recv of __dlpack__ object)",
    "mpi4py buffer protocol (Send/Recv of ndarray)",
];

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let iters = args.first().copied().unwrap_or(20_000);
    let rounds = args.get(1).copied().unwrap_or(7);
    let universe = mpi::initialize().ok_or("MPI was already initialized")?;
    let world = universe.world();
    Python::initialize();
    Python::attach(|py| run(py, &world, iters, rounds))
}

fn run(
    py: Python<'_>,
    world: &SimpleCommunicator,
    iters: usize,
    rounds: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let rank = world.rank();
    let g = PyDict::new(py);
    g.set_item("rank", rank)?;
    py.run(&CString::new(SETUP)?, Some(&g), None)?;
    let ev = |e: &str| -> PyResult<Bound<'_, PyAny>> {
        py.eval(&CString::new(e).expect("no NUL"), Some(&g), None)
    };
    let options = AcquireOptions::default();
    let a = ev("a")?;
    let b = ev("b")?;

    // ------------------------------------------------------------------ import cost
    if rank == 0 {
        let n = iters * 10;
        let mut ours = Vec::new();
        let (mut mpi4py_dlpack, mut mpi4py_buffer, mut empty) =
            (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let t = Instant::now();
            for _ in 0..n {
                let tensor = python::acquire(&a, &options)?;
                std::hint::black_box(&tensor);
            }
            ours.push(t.elapsed().as_secs_f64() / n as f64);
            mpi4py_dlpack.push(ev(&format!("import_loop(da, {n})"))?.extract::<f64>()?);
            mpi4py_buffer.push(ev(&format!("import_loop(a, {n})"))?.extract::<f64>()?);
            empty.push(ev(&format!("empty_loop({n})"))?.extract::<f64>()?);
        }
        let (o, d, bu, e) = (
            median(ours) * 1e9,
            median(mpi4py_dlpack) * 1e9,
            median(mpi4py_buffer) * 1e9,
            median(empty) * 1e9,
        );
        let exchange = ev("hasattr(type(a), '__dlpack_c_exchange_api__')")?.is_truthy()?;
        println!(
            "NumPy {}, mpi4py {}, {}",
            ev("np.__version__")?,
            ev("__import__('mpi4py').__version__")?,
            ev("MPI.Get_library_version().splitlines()[0].strip()")?
        );
        println!("numpy.ndarray has __dlpack_c_exchange_api__: {exchange}");
        println!();
        println!("import + release of one NumPy array, ns (median of {rounds} rounds of {n}):");
        println!("  {:<55} {:>9.1}", "dlpack-mpi python::acquire + drop", o);
        println!(
            "  {:<55} {:>9.1}",
            "mpi4py MPI.buffer(__dlpack__ object)", d
        );
        println!(
            "  {:<55} {:>9.1}",
            "mpi4py MPI.buffer(ndarray), buffer protocol", bu
        );
        println!(
            "  {:<55} {:>9.1}",
            "(empty Python loop iteration, included above)", e
        );
        println!("  mpi4py DLPack import / dlpack-mpi import: {:.1}x", d / o);
        println!();
    }
    world.barrier();
    if world.size() < 2 {
        println!("(one rank: import cost only; run with mpirun -n 2 for the ping-pong)");
        return Ok(());
    }

    // ------------------------------------------------------------------ ping-pong
    let peer = 1 - rank.min(1);
    let active = rank < 2;
    let first = rank == 0;
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); PATHS.len()];
    let raw_send = [f64::from(rank) + 1.0];
    let mut raw_recv = [0.0f64];
    for round in 0..rounds {
        for k in 0..PATHS.len() {
            let path = (k + round) % PATHS.len();
            world.barrier();
            if !active {
                if path >= 3 {
                    // the Python paths barrier inside pingpong()
                    world.barrier();
                }
                continue;
            }
            let p = world.process_at_rank(peer);
            let t = Instant::now();
            match path {
                0 => {
                    for _ in 0..iters {
                        if first {
                            p.send(&raw_send[..]);
                            p.receive_into(&mut raw_recv[..]);
                        } else {
                            p.receive_into(&mut raw_recv[..]);
                            p.send(&raw_send[..]);
                        }
                    }
                }
                1 => {
                    for _ in 0..iters {
                        let send = || -> dlpack_mpi::Result<()> {
                            world.send_tensor(&python::acquire(&a, &options)?, peer, 0)
                        };
                        let recv = || -> dlpack_mpi::Result<()> {
                            world
                                .recv_tensor(&mut python::acquire(&b, &options)?, peer, 0)
                                .map(|_| ())
                        };
                        if first {
                            send()?;
                            recv()?;
                        } else {
                            recv()?;
                            send()?;
                        }
                    }
                }
                2 => {
                    for _ in 0..iters {
                        let send = || -> dlpack_mpi::Result<()> {
                            let t = python::acquire(&a, &options)?;
                            p.send(&SendSpec::new(&t)?);
                            Ok(())
                        };
                        let recv = || -> dlpack_mpi::Result<()> {
                            let mut t = python::acquire(&b, &options)?;
                            p.receive_into(&mut RecvSpec::new(&mut t)?);
                            Ok(())
                        };
                        if first {
                            send()?;
                            recv()?;
                        } else {
                            recv()?;
                            send()?;
                        }
                    }
                }
                _ => {
                    let (s, r) = if path == 3 { ("da", "db") } else { ("a", "b") };
                    let py_first = if first { "True" } else { "False" };
                    let per = ev(&format!("pingpong({s}, {r}, {iters}, {peer}, {py_first})"))?
                        .extract::<f64>()?;
                    times[path].push(per);
                    continue;
                }
            }
            times[path].push(t.elapsed().as_secs_f64() / (2 * iters) as f64);
        }
    }
    // Every path delivered the peer's value.
    if active {
        let want = f64::from(peer) + 1.0;
        let got: f64 = ev("b[0]")?.extract()?;
        assert_eq!((raw_recv[0], got), (want, want), "values did not arrive");
    }
    if rank == 0 {
        let med: Vec<f64> = times.iter().map(|t| median(t.clone()) * 1e6).collect();
        println!("8-byte ping-pong, ranks 0-1, us per message (median of {rounds} rounds of {iters} round trips):");
        for (name, m) in PATHS.iter().zip(&med) {
            println!("  {name:<55} {m:>9.3}   (+{:.3} over raw)", m - med[0]);
        }
        let ours = med[1] - med[0];
        let theirs = med[3] - med[0];
        println!(
            "  overhead over raw: mpi4py DLPack path / dlpack-mpi checked = {:.1}x, / dlpack-mpi specs = {:.1}x",
            theirs / ours,
            theirs / (med[2] - med[0])
        );
    }
    Ok(())
}
