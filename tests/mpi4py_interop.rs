//! Wire interoperability with mpi4py: the dlpack-mpi side of one MPMD job whose rank 0 is
//! `tests/python/mpi4py_peer.py` (mpi4py, built against the same Open MPI):
//!
//! ```text
//! mpirun -n 1 python3 tests/python/mpi4py_peer.py : -n 1 target/debug/deps/mpi4py_interop-*
//! ```
//!
//! For every dtype NumPy exports, in the peer's order: point-to-point both ways (and from
//! mpi4py's DLPack path), broadcast from either side, all-reduce and all-gatherv. Both sides
//! compute the expected values with the same formula (`make` in
//! `tests/python/producers.py`, mirrored by [`values`]) and check exactly what they
//! received. Plain `main` (harness = false); run alone (no peer, `cargo test`), it says so
//! and passes without doing anything. The collectives run under `Agreement::Local`: the peer
//! does not join dlpack-mpi's agreement all-reduce.

use dlpack_mpi::comm::{Blocks, TensorComm};
use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned};
use dlpack_mpi::dtype::{DType, ReduceOp};
use dlpack_mpi::settings::{set_agreement, set_packing, Agreement, Packing};
use half::f16;
use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

/// The dtypes of `DTYPES` in producers.py, as DLPack dtypes.
const DTYPES: [(&str, DType); 14] = [
    ("bool", DType::new(6, 8)),
    ("int8", DType::new(0, 8)),
    ("int16", DType::new(0, 16)),
    ("int32", DType::new(0, 32)),
    ("int64", DType::new(0, 64)),
    ("uint8", DType::new(1, 8)),
    ("uint16", DType::new(1, 16)),
    ("uint32", DType::new(1, 32)),
    ("uint64", DType::new(1, 64)),
    ("float16", DType::new(2, 16)),
    ("float32", DType::new(2, 32)),
    ("float64", DType::new(2, 64)),
    ("complex64", DType::new(5, 64)),
    ("complex128", DType::new(5, 128)),
];

/// The dtypes the peer also sends through mpi4py's DLPack path.
fn dlpack_path(name: &str) -> bool {
    name != "float16"
}

/// `make(dtype, (n,), rank)` of producers.py, as native-endian bytes.
fn values(name: &str, n: usize, rank: i32) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..n as i64 {
        let base = (i * 3 + i64::from(rank) * 5) % 29;
        match name {
            "bool" => out.push(((base + i64::from(rank)) % 2) as u8),
            "int8" | "uint8" => out.push(base as u8),
            "int16" | "uint16" => out.extend((base as u16).to_ne_bytes()),
            "int32" | "uint32" => out.extend((base as u32).to_ne_bytes()),
            "int64" | "uint64" => out.extend((base as u64).to_ne_bytes()),
            "float16" => out.extend(f16::from_f64(base as f64).to_ne_bytes()),
            "float32" => out.extend((base as f32).to_ne_bytes()),
            "float64" => out.extend((base as f64).to_ne_bytes()),
            "complex64" => {
                out.extend((base as f32).to_ne_bytes());
                out.extend(((base + 1) as f32).to_ne_bytes());
            }
            "complex128" => {
                out.extend((base as f64).to_ne_bytes());
                out.extend(((base + 1) as f64).to_ne_bytes());
            }
            _ => unreachable!("{name}"),
        }
    }
    out
}

/// Element-wise sum (logical or for bool) of `values(name, n, r)` over all ranks.
fn expected_reduction(name: &str, n: usize, size: i32) -> Vec<u8> {
    let per_rank: Vec<Vec<u8>> = (0..size).map(|r| values(name, n, r)).collect();
    if name == "bool" {
        return (0..n)
            .map(|i| u8::from(per_rank.iter().any(|v| v[i] != 0)))
            .collect();
    }
    // Every value is a small integer (sum ≤ 28 × ranks) in every dtype, so summing the
    // integers and converting back is exact; complex parts are summed separately.
    let parts = if name.starts_with("complex") { 2 } else { 1 };
    let sums: Vec<i64> = (0..n * parts)
        .map(|k| {
            (0..size)
                .map(|r| {
                    let i = (k / parts) as i64;
                    let base = (i * 3 + i64::from(r) * 5) % 29;
                    base + (k % parts) as i64
                })
                .sum()
        })
        .collect();
    let mut out = Vec::new();
    for s in sums {
        match name {
            "int8" | "uint8" => out.push(s as u8),
            "int16" | "uint16" => out.extend((s as u16).to_ne_bytes()),
            "int32" | "uint32" => out.extend((s as u32).to_ne_bytes()),
            "int64" | "uint64" => out.extend((s as u64).to_ne_bytes()),
            "float16" => out.extend(f16::from_f64(s as f64).to_ne_bytes()),
            "float32" | "complex64" => out.extend((s as f32).to_ne_bytes()),
            _ => out.extend((s as f64).to_ne_bytes()),
        }
    }
    out
}

struct Checker {
    checks: usize,
    failures: usize,
    rank: i32,
}

impl Checker {
    fn check(&mut self, what: &str, got: &[u8], want: &[u8]) {
        self.checks += 1;
        if got != want {
            self.failures += 1;
            eprintln!(
                "rank {}: FAIL {what}: got {got:?}, want {want:?}",
                self.rank
            );
        }
    }
}

fn tensor(bytes: Vec<u8>, dtype: DType) -> Owned<u8> {
    Owned::new(bytes).with_dtype(dtype).expect("whole elements")
}

fn run(w: &SimpleCommunicator, c: &mut Checker) -> dlpack_mpi::Result<()> {
    let (rank, size) = (w.rank(), w.size());
    let o = AcquireOptions::default();
    for (name, dtype) in DTYPES {
        let elem = dtype.size_bytes().expect("whole bytes");
        let n = 5;
        // point-to-point from mpi4py, then to it
        let got = tensor(vec![0; n * elem], dtype);
        w.recv_tensor(&mut acquire(&got, &o)?, 0, 1)?;
        c.check(
            &format!("recv {name} from mpi4py"),
            &got.into_vec(),
            &values(name, n, 0),
        );
        let mine = tensor(values(name, n, rank), dtype);
        w.send_tensor(&acquire(&mine, &o)?, 0, 2)?;
        if dlpack_path(name) {
            let got = tensor(vec![0; n * elem], dtype);
            w.recv_tensor(&mut acquire(&got, &o)?, 0, 3)?;
            c.check(
                &format!("recv {name} from mpi4py's DLPack path"),
                &got.into_vec(),
                &values(name, n, 0),
            );
        }
        // broadcast from mpi4py, then from the last rank
        let b = tensor(vec![0; 6 * elem], dtype);
        w.broadcast_tensor(&mut acquire(&b, &o)?, 0)?;
        c.check(
            &format!("bcast {name} from mpi4py"),
            &b.into_vec(),
            &values(name, 6, 0),
        );
        let root = size - 1;
        let init = if rank == root {
            values(name, 6, root)
        } else {
            vec![0; 6 * elem]
        };
        let b = tensor(init, dtype);
        w.broadcast_tensor(&mut acquire(&b, &o)?, root)?;
        c.check(
            &format!("bcast {name} from rank {root}"),
            &b.into_vec(),
            &values(name, 6, root),
        );
        // all-reduce
        let op = if name == "bool" {
            ReduceOp::LogicalOr
        } else {
            ReduceOp::Sum
        };
        let m = tensor(values(name, 7, rank), dtype);
        let out = tensor(vec![0; 7 * elem], dtype);
        w.all_reduce_tensor(&acquire(&m, &o)?, &mut acquire(&out, &o)?, op)?;
        c.check(
            &format!("allreduce {name}"),
            &out.into_vec(),
            &expected_reduction(name, 7, size),
        );
        // all-gatherv with counts 1..P
        let counts: Vec<i64> = (1..=i64::from(size)).collect();
        let displs: Vec<i64> = (0..size as usize)
            .map(|r| counts[..r].iter().sum())
            .collect();
        let total: i64 = counts.iter().sum();
        let g = tensor(values(name, rank as usize + 1, rank), dtype);
        let all = tensor(vec![0; total as usize * elem], dtype);
        w.all_gatherv_tensor(
            &acquire(&g, &o)?,
            &mut acquire(&all, &o)?,
            Blocks::new(&counts, &displs),
        )?;
        let want: Vec<u8> = (0..size)
            .flat_map(|r| values(name, r as usize + 1, r))
            .collect();
        c.check(&format!("allgatherv {name}"), &all.into_vec(), &want);
    }
    for policy in [Packing::Auto, Packing::Copy, Packing::DerivedDatatype] {
        set_packing(policy);
        strided(w, c, &format!("{policy:?}, blocking"), false)?;
        strided(w, c, &format!("{policy:?}, nonblocking"), true)?;
    }
    Ok(())
}

/// Strided float32 tensors to and from the mpi4py peer (tags 10–13): a Fortran-order 3 × 4
/// and a transposed 4 × 5 tensor go out as elements in logical row-major order, and the
/// peer's contiguous messages land in such tensors. `nonblocking`: through
/// `immediate_send_tensor`/`immediate_recv_tensor` (both messages of a direction posted at
/// once), else the blocking operations.
fn strided(
    w: &SimpleCommunicator,
    c: &mut Checker,
    policy: &str,
    nonblocking: bool,
) -> dlpack_mpi::Result<()> {
    let o = AcquireOptions::default();
    let offset = 100.0 * w.rank() as f32;
    // (shape, strides, storage elements): Fortran-order 3 × 4, then the transpose of 4 × 5.
    let layouts: [(&[i64], &[i64], usize); 2] = [(&[3, 4], &[1, 3], 12), (&[5, 4], &[1, 5], 20)];
    let mut sends = Vec::new();
    for (shape, strides, n) in layouts {
        let storage: Vec<f32> = (0..n).map(|k| k as f32 + offset).collect();
        sends.push(Owned::new(storage).with_layout(shape, Some(strides), 0)?);
    }
    let sends: Vec<_> = sends
        .iter()
        .map(|t| acquire(t, &o))
        .collect::<Result<_, _>>()?;
    let recvs = layouts
        .iter()
        .map(|&(shape, strides, n)| Owned::new(vec![0f32; n]).with_layout(shape, Some(strides), 0))
        .collect::<Result<Vec<_>, _>>()?;
    {
        let mut rts: Vec<_> = recvs
            .iter()
            .map(|t| acquire(t, &o))
            .collect::<Result<_, _>>()?;
        if nonblocking {
            mpi::request::scope(|scope| -> dlpack_mpi::Result<()> {
                let s0 = w.immediate_send_tensor(scope, &sends[0], 0, 10)?;
                let s1 = w.immediate_send_tensor(scope, &sends[1], 0, 11)?;
                let (r0, r1) = rts.split_at_mut(1);
                let q0 = w.immediate_recv_tensor(scope, &mut r0[0], 0, 12)?;
                let q1 = w.immediate_recv_tensor(scope, &mut r1[0], 0, 13)?;
                for request in [s0, s1, q0, q1] {
                    request.wait()?;
                }
                Ok(())
            })?;
        } else {
            w.send_tensor(&sends[0], 0, 10)?;
            w.send_tensor(&sends[1], 0, 11)?;
            w.recv_tensor(&mut rts[0], 0, 12)?;
            w.recv_tensor(&mut rts[1], 0, 13)?;
        }
    }
    for ((shape, _, n), t) in layouts.into_iter().zip(recvs) {
        let got = t.into_vec();
        // Logical (i, j) is storage i + rows × j and holds the peer's row-major i × cols + j.
        let (rows, cols) = (shape[0] as usize, shape[1] as usize);
        let want: Vec<f32> = (0..n)
            .map(|k| ((k % rows) * cols + k / rows) as f32)
            .collect();
        let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
        c.check(
            &format!("recv strided {rows}x{cols} from mpi4py ({policy})"),
            &bytes(&got),
            &bytes(&want),
        );
    }
    Ok(())
}

fn main() {
    let universe = mpi::initialize().expect("MPI initializes once");
    let w = universe.world();
    if w.size() < 2 {
        println!(
            "mpi4py_interop: needs the mpi4py peer as rank 0 (scripts/test.sh starts it); \
             nothing to do at 1 rank"
        );
        return;
    }
    // The mpi4py peer calls MPI's collectives directly and does not take part in
    // dlpack-mpi's agreement (one extra all-reduce before each collective): every rank of a
    // communicator must make the same collective calls, so the dlpack-mpi ranks opt out here.
    set_agreement(Agreement::Local);
    let mut c = Checker {
        checks: 0,
        failures: 0,
        rank: w.rank(),
    };
    if let Err(e) = run(&w, &mut c) {
        eprintln!("rank {}: error: {e}", w.rank());
        w.abort(3);
    }
    let mut total = 0u64;
    w.all_reduce_into(&(c.failures as u64), &mut total, SystemOperation::sum());
    println!(
        "dlpack-mpi rank {}: {} checks passed, {} failed; {total} failed on all ranks",
        w.rank(),
        c.checks - c.failures,
        c.failures
    );
    drop(universe);
    if total > 0 {
        std::process::exit(1);
    }
}
