//! What agreement before collectives costs (issue 14): every collective of `TensorComm`
//! under `Agreement::Collective` (the default: one `MPI_Allreduce` of three `int64_t` before the
//! data operation) next to `Agreement::Local` (no agreement), for a per-rank block of 8 bytes
//! and of 1 MiB of float32, plus the bare all-reduce of three `int64_t` itself (one `int` before issue 23).
//!
//! ```text
//! source scripts/mpi-env.sh; source scripts/test-binary.sh
//! "$MPIRUN" "${MPIRUN_FLAGS[@]}" -n 2 "$(bench_binary agreement_bench)" [rounds]
//! ```
//!
//! Each (collective, size, mode) is timed in `rounds` rounds (default 7), the two modes
//! interleaved round by round so that machine noise hits them alike; the table gives the
//! median round's time per call on rank 0, in microseconds, the difference (collective −
//! local) and the ratio, and the difference of the best rounds (less sensitive to a loaded
//! host). Rooted collectives use root 0. This is a measurement, not a test:
//! it asserts only that every call returned `Ok` and that the last all-reduce summed right.

use dlpack_mpi::comm::{Blocks, TensorComm};
use dlpack_mpi::dlpack::{acquire, AcquireOptions, ManagedTensor, Owned, Tensor};
use dlpack_mpi::dtype::ReduceOp;
use dlpack_mpi::settings::{set_agreement, Agreement};
use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

#[derive(Clone, Copy)]
enum Op {
    Broadcast,
    Gather,
    Gatherv,
    Scatter,
    Scatterv,
    Reduce,
    AllReduce,
    AllReduceInPlace,
    AllGather,
    AllGatherv,
    AllToAll,
    AllToAllv,
    ReduceScatterBlock,
}

const OPS: [(Op, &str); 13] = [
    (Op::Broadcast, "broadcast"),
    (Op::Gather, "gather"),
    (Op::Gatherv, "gatherv"),
    (Op::Scatter, "scatter"),
    (Op::Scatterv, "scatterv"),
    (Op::Reduce, "reduce"),
    (Op::AllReduce, "all-reduce"),
    (Op::AllReduceInPlace, "all-reduce in place"),
    (Op::AllGather, "all-gather"),
    (Op::AllGatherv, "all-gatherv"),
    (Op::AllToAll, "all-to-all"),
    (Op::AllToAllv, "all-to-allv"),
    (Op::ReduceScatterBlock, "reduce-scatter-block"),
];

/// The tensors of one size: `n` elements per rank's block, `p` ranks.
struct Bufs<'a> {
    block: ManagedTensor<'a>,
    block_out: ManagedTensor<'a>,
    all: ManagedTensor<'a>,
    all_out: ManagedTensor<'a>,
    counts: Vec<i64>,
    displs: Vec<i64>,
}

/// One call of `op` on the tensors of `b` (root 0).
fn call(w: &SimpleCommunicator, op: Op, b: &mut Bufs<'_>) -> dlpack_mpi::Result<()> {
    let root = w.rank() == 0;
    let (c, d) = (&b.counts[..], &b.displs[..]);
    match op {
        Op::Broadcast => w.broadcast_tensor(&mut b.block_out, 0),
        Op::Gather => {
            let recv = root.then_some(&mut b.all_out as &mut dyn Tensor);
            w.gather_tensor(&b.block, recv, 0)
        }
        Op::Gatherv => {
            let recv = root.then_some((&mut b.all_out as &mut dyn Tensor, Blocks::new(c, d)));
            w.gatherv_tensor(&b.block, recv, 0)
        }
        Op::Scatter => {
            let send = root.then_some(&b.all as &dyn Tensor);
            w.scatter_tensor(send, &mut b.block_out, 0)
        }
        Op::Scatterv => {
            let send = root.then_some((&b.all as &dyn Tensor, Blocks::new(c, d)));
            w.scatterv_tensor(send, &mut b.block_out, 0)
        }
        Op::Reduce => {
            let recv = root.then_some(&mut b.block_out as &mut dyn Tensor);
            w.reduce_tensor(&b.block, recv, ReduceOp::Sum, 0)
        }
        Op::AllReduce => w.all_reduce_tensor(&b.block, &mut b.block_out, ReduceOp::Sum),
        Op::AllReduceInPlace => w.all_reduce_tensor_in_place(&mut b.block_out, ReduceOp::Max),
        Op::AllGather => w.all_gather_tensor(&b.block, &mut b.all_out),
        Op::AllGatherv => w.all_gatherv_tensor(&b.block, &mut b.all_out, Blocks::new(c, d)),
        Op::AllToAll => w.all_to_all_tensor(&b.all, &mut b.all_out),
        Op::AllToAllv => {
            w.all_to_allv_tensor(&b.all, Blocks::new(c, d), &mut b.all_out, Blocks::new(c, d))
        }
        Op::ReduceScatterBlock => {
            w.reduce_scatter_block_tensor(&b.all, &mut b.block_out, ReduceOp::Sum)
        }
    }
}

/// Seconds per call of one round of `iters` calls under `mode` (rank 0's clock).
fn round(
    w: &SimpleCommunicator,
    op: Op,
    mode: Agreement,
    iters: usize,
    b: &mut Bufs<'_>,
) -> Res<f64> {
    set_agreement(mode);
    w.barrier();
    let t0 = mpi::time();
    for _ in 0..iters {
        call(w, op, b)?;
    }
    let dt = mpi::time() - t0;
    w.barrier();
    Ok(dt / iters as f64)
}

/// Seconds per bare `MPI_Allreduce` of three `int64_t` with `MPI_MIN` (the agreement itself).
fn bare_allreduce(w: &SimpleCommunicator, iters: usize) -> f64 {
    w.barrier();
    let t0 = mpi::time();
    let (mine, mut out) = ([i64::from(w.size()), 7, !7], [0i64; 3]);
    for _ in 0..iters {
        w.all_reduce_into(&mine[..], &mut out[..], SystemOperation::min());
    }
    let dt = mpi::time() - t0;
    w.barrier();
    dt / iters as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn size_name(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{bytes} B")
    }
}

/// Times every collective at blocks of `n` float32 elements, `iters` calls per round.
fn bench_size(w: &SimpleCommunicator, n: usize, iters: usize, rounds: usize) -> Res<()> {
    let p = w.size() as usize;
    let opts = AcquireOptions::default();
    let owned = [
        Owned::new(vec![1.0f32; n]),
        Owned::new(vec![0.0f32; n]),
        Owned::new(vec![1.0f32; p * n]),
        Owned::new(vec![0.0f32; p * n]),
    ];
    let mut b = Bufs {
        block: acquire(&owned[0], &opts)?,
        block_out: acquire(&owned[1], &opts)?,
        all: acquire(&owned[2], &opts)?,
        all_out: acquire(&owned[3], &opts)?,
        counts: vec![n as i64; p],
        displs: (0..p).map(|i| (i * n) as i64).collect(),
    };
    let modes = [Agreement::Collective, Agreement::Local];
    for (op, name) in OPS {
        let mut times = [Vec::new(), Vec::new()];
        for &m in &modes {
            round(w, op, m, iters / 10 + 1, &mut b)?; // warm-up
        }
        for _ in 0..rounds {
            for (i, &m) in modes.iter().enumerate() {
                times[i].push(round(w, op, m, iters, &mut b)?);
            }
        }
        if w.rank() == 0 {
            let (agreed, local) = (median(times[0].clone()), median(times[1].clone()));
            let best = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
            println!(
                "{:>7}  {:<22} {:>11.2} {:>11.2} {:>+11.2} {:>7.3}x {:>+12.2}",
                size_name(n * 4),
                name,
                agreed * 1e6,
                local * 1e6,
                (agreed - local) * 1e6,
                agreed / local,
                (best(&times[0]) - best(&times[1])) * 1e6
            );
        }
    }
    set_agreement(Agreement::Collective);
    Ok(())
}

fn main() -> Res<()> {
    let universe = mpi::initialize().ok_or("MPI was already initialized")?;
    let w = universe.world();
    if w.size() < 2 {
        return Err("agreement_bench needs at least 2 ranks".into());
    }
    // `cargo bench` passes `--bench`: only a bare number is the rounds.
    let rounds: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with("--"))
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(7);
    let bare = (0..rounds)
        .map(|_| bare_allreduce(&w, 2000))
        .collect::<Vec<_>>();
    if w.rank() == 0 {
        println!(
            "agreement_bench: {} ranks, {rounds} rounds per row, median round; per-rank block \
             of float32; bare MPI_Allreduce(3 int64_t, MIN) = {:.2} µs",
            w.size(),
            median(bare) * 1e6
        );
        println!(
            "{:>7}  {:<22} {:>11} {:>11} {:>11} {:>8} {:>12}",
            "block", "collective", "agreed µs", "local µs", "cost µs", "ratio", "best-round"
        );
    }
    bench_size(&w, 2, 2000, rounds)?;
    bench_size(&w, 1 << 18, 20, rounds)?;
    // The values of the last calls: an all-reduce of ones sums to the size.
    let (ones, out) = (Owned::new(vec![1.0f32; 4]), Owned::new(vec![0.0f32; 4]));
    {
        let opts = AcquireOptions::default();
        let mut o = acquire(&out, &opts)?;
        w.all_reduce_tensor(&acquire(&ones, &opts)?, &mut o, ReduceOp::Sum)?;
    }
    if out.into_vec() != vec![w.size() as f32; 4] {
        return Err("the all-reduce delivered the wrong values".into());
    }
    Ok(())
}
