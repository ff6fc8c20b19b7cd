//! `dlpack-mpi bench`: ping-pong and all-reduce through dlpack-mpi next to raw rsmpi, on the
//! same 4096-byte-aligned buffers, interleaved in one run.
//!
//! Four paths are timed for every size, on the very same memory:
//!
//! - **raw**: rsmpi on a plain `&[f32]` / `&mut [f32]` slice of the storage.
//! - **dlpack**: the tensor is acquired once per round (untimed); every message builds its
//!   [`SendSpec`] / [`RecvSpec`] (the per-message cost a user of the specs pays: device,
//!   dtype, contiguity, overlap and count checks) and hands it to rsmpi
//!   (`send`, `receive_into`, `all_reduce_into`).
//! - **reused**: the specs are built once per round (untimed) and reused for every message:
//!   what an MPI call through a spec costs by itself.
//! - **checked**: [`TensorComm`] (`send_tensor` / `recv_tensor`, `all_reduce_tensor`), which
//!   adds argument checks and, for receives, an `MPI_Probe` before the receive.
//!
//! Each size is warmed up, then measured for `--rounds` rounds; within a round the paths run
//! one after the other, in an order rotated from round to round, with a barrier before
//! each. Reported: median and best round, in µs per message (ping-pong: half the
//! round-trip time; all-reduce: the slowest rank's time per call), p50 and p99 over samples
//! of batches of iterations (each iteration alone where it lasts ≥ 10 µs), the ratios to
//! raw, and for the collectives nccl-tests' algbw and busbw. `--check` checks every
//! iteration (nccl-tests' `-c`); `--json` writes one object per (operation, case, size,
//! path) for every operation.
//!
//! `--op strided` sends strided views of one f32 storage (64 MiB, `--strided-storage`) from
//! rank 0 to rank 1 (one-way; rank 1 answers every message with a 1-byte ack, which ends the
//! message's time): step 2; blocks of 1, 2, 4 … 4096 elements with a gap of one block; the
//! 4096 × 4096 transpose; a 3-D permutation; the storage reversed. Four paths, scheduled as
//! above:
//!
//! - **contiguous**: the same number of bytes sent from a contiguous slice (the lower bound).
//! - **derived** / **pack** / **auto**: [`TensorComm::send_tensor`] under
//!   `Packing::DerivedDatatype` (a cached derived datatype: MPI reads the elements in place),
//!   `Packing::Copy` (the library's pack kernels into a pooled buffer, then a contiguous
//!   send) and `Packing::Auto` (the default: one or the other by the inner block).
//!
//! Rank 1 receives every message with `receive_into(&mut [f32])` of the logical size, and
//! checks element by element the first message of every (case, path) and the last message
//! of every timed loop (untimed). `--json` writes one object per (case, path).
//!
//! `--op overlap` posts a nonblocking all-reduce of 16 MiB
//! ([`TensorComm::immediate_all_reduce_tensor`]) and runs a fixed computation in slices,
//! testing the request between slices, then waits; timed next to the blocking all-reduce of
//! the same tensor, the computation alone, and rsmpi's own nonblocking all-reduce overlapped
//! the same way. It also times the posting call alone at 8 B, ours next to rsmpi's
//! `immediate_all_reduce_into` on the same buffers. `--json` writes one object per (case,
//! path).
//!
//! `--op fused` all-reduces lists of tensors (the gradients of ResNet-50 and BERT-base from
//! benches/data, built in, and 256 tensors of 1 KiB): one `all_reduce_tensor_in_place` per
//! member, one fused `all_reduce_tensors_in_place` over the list, and one tensor of the same total
//! elements (the limit); next to them, with feature `python`, mpi4py's two ways on NumPy arrays of the
//! same shapes (`mpi4py-loop`: one `Allreduce` per member; `mpi4py-concat`: `np.concatenate`,
//! one `Allreduce`, copied back), timed in Python. `--json` writes one object per (case,
//! path).
//!
//! `--op plan` all-reduces the same lists (and one tensor of 8 bytes) through a plan
//! ([`TensorComm::plan_all_reduce_tensors_in_place`], built once per list; `planned`:
//! `plan.run()`, `planned-start`: `plan.start()?.wait()`) next to the unplanned fused
//! all-reduce of the same members, one tensor of the same total elements, mpi4py's ways on
//! the model lists (`--op fused`'s two and the persistent `Allreduce_init` with
//! `Startall`/`Waitall` where mpi4py's MPI is MPI-4), and at 8 bytes rsmpi's
//! `MPI_Allreduce` on the same buffer (`raw`) and the checked single-tensor all-reduce.
//! `--json` writes one object per (case, path).
//!
//! `--device cuda` runs [`gpu`] instead: GPU tensors through `DeviceComm` next to a pinned
//! copy of the same bytes and to host-memory MPI.
//!
//! # Files, in dependency order
//!
//! Each file uses only the files before it (and `crate::common`, which `check` and `info`
//! share, and `crate::launch`), so there is no cycle:
//!
//! 1. `common`: the element type, aligned buffers, the values sent, samples and
//!    percentiles, the per-batch timer, the timing driver (warm-up, rotated rounds),
//!    ping-pong legs, bus-bandwidth factors, size formatting;
//! 2. `sampled`: the sweeps' driver (batches, `--check`); `json`: the `--json` object
//!    (`crate::common::write_json` writes the array);
//! 3. `args`: the options, sizes and iteration counts;
//! 4. `strided_report`, `overlap_report`: the strided and overlap rows, tables, summaries
//!    and `--json` objects;
//! 5. `report`: the result rows and their text tables, `--json` objects, `--csv` and
//!    `--plot`;
//! 6. `host`, `strided`, `overlap`, `gpu`: the measurements (they print through the
//!    reports); `fused_mpi4py`, the mpi4py paths of `fused` (uses `common` only), and
//!    `fused`, which uses only `common`, `json`, `args` and `fused_mpi4py` and prints its
//!    own table; `plan_mpi4py`, mpi4py's persistent path of `plan` (uses nothing of
//!    `bench/`), and `plan`, which uses only `common`, `json`, `args`, `fused_mpi4py` and
//!    `plan_mpi4py` and prints its own table;
//! 7. this file: [`run`], which refuses what cannot be done (among it an `--iters` that
//!    cannot end within `--timeout`), tries the output files, watches `--timeout` and
//!    dispatches.
//!
//! [`SendSpec`]: dlpack_mpi::spec::SendSpec
//! [`RecvSpec`]: dlpack_mpi::spec::RecvSpec
//! [`TensorComm`]: dlpack_mpi::comm::TensorComm
//! [`TensorComm::send_tensor`]: dlpack_mpi::comm::TensorComm::send_tensor
//! [`TensorComm::immediate_all_reduce_tensor`]:
//!     dlpack_mpi::comm::TensorComm::immediate_all_reduce_tensor
//! [`TensorComm::plan_all_reduce_tensors_in_place`]:
//!     dlpack_mpi::comm::TensorComm::plan_all_reduce_tensors_in_place

mod args;
mod common;
mod fused;
mod fused_mpi4py;
mod gpu;
mod host;
mod json;
mod overlap;
mod overlap_report;
mod plan;
mod plan_mpi4py;
mod report;
mod sampled;
mod strided;
mod strided_report;

use std::process::ExitCode;

use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use crate::common::library_line;
use args::DEFAULT_MAX_SIZE;
pub use args::{BenchArgs, BenchLayout, Op};

/// Refuses options this build or this job cannot honour, in one line; `None` = go on.
fn refuse(world: &SimpleCommunicator, args: &BenchArgs) -> Option<String> {
    if !matches!(
        args.device,
        crate::launch::DeviceArg::Cpu | crate::launch::DeviceArg::Cuda
    ) {
        return Some(format!(
            "bench runs on device `cpu` or `cuda`, not `{}`",
            args.device.name()
        ));
    }
    if args.device == crate::launch::DeviceArg::Cuda {
        if let Some(why) = gpu::refuse(args) {
            return Some(why);
        }
    } else if let Some(n) = args.gpu.ordinal {
        return Some(format!("--gpu {n} applies to --device cuda"));
    }
    if args.op.point_to_point() && world.size() < 2 {
        return Some(if crate::launch::under_launcher() {
            format!(
                "--op {} needs at least 2 ranks; this job has 1 (mpirun -n 2 …)",
                args.op.name()
            )
        } else {
            format!(
                "--op {} needs at least 2 ranks, and this process was not started by mpirun: \
                 run `mpirun -n 2 dlpack-mpi bench --op {}`",
                args.op.name(),
                args.op.name()
            )
        });
    }
    if args.op == Op::Strided && (args.layout != BenchLayout::Contiguous || args.sizes.is_some()) {
        return Some(
            "--op strided has fixed views of one storage (--strided-storage): --layout and \
             --sizes do not apply"
                .into(),
        );
    }
    if matches!(args.op, Op::Fused | Op::Plan)
        && (args.layout != BenchLayout::Contiguous
            || args.sizes.is_some()
            || args.csv.is_some()
            || args.plot.is_some())
    {
        return Some(format!(
            "--op {} has fixed lists of contiguous tensors and writes --json only: --layout, \
             --sizes, --csv and --plot do not apply",
            args.op.name()
        ));
    }
    if args.op == Op::Overlap && args.layout != BenchLayout::Contiguous {
        return Some("--op overlap all-reduces contiguous tensors only (no --layout step)".into());
    }
    if args.op == Op::Overlap && (args.csv.is_some() || args.plot.is_some()) {
        return Some("--op overlap writes --json, not --csv or --plot".into());
    }
    if args.check && matches!(args.op, Op::Strided | Op::Overlap | Op::Fused | Op::Plan) {
        return Some(format!(
            "--check checks every iteration of latency, bandwidth, allreduce, allgatherv and \
             alltoall (and of those in --op all), not --op {}",
            args.op.name()
        ));
    }
    iterations_refused(args)
}

/// The least time one iteration of any path takes, in nanoseconds: a floor below anything
/// measured here (the fastest, an 8-byte ping-pong round trip through shared memory, takes
/// about 0.34 µs on the project's 2-core machine; an all-reduce call at one rank 0.3 µs;
/// docs/PERFORMANCE.md).
const MIN_ITERATION_NS: u128 = 50;

/// The fewest iterations a run with `--iters` = `iters` makes: for each operation `--op`
/// runs (`all`: the sweeps; strided is left out, as `all` may skip it), one path, `--rounds`
/// rounds of the iterations of its smallest message ([`args::iters_for`]: the most
/// iterations; strided at its storage's size, fused at its list of 256 × 1 KiB, overlap at
/// its 8-byte post, plan at its 8-byte tensor). A lower bound: every operation has more
/// paths, and sizes, than this.
fn least_iterations(args: &BenchArgs, iters: u64) -> u128 {
    use args::iters_for;
    let max = args.max_size.unwrap_or(DEFAULT_MAX_SIZE) as usize;
    let smallest = |default: Vec<usize>| args.sizes_or(default).into_iter().min().unwrap_or(0);
    let per_round: u128 = if args.device == crate::launch::DeviceArg::Cuda {
        let max = args.max_size.map_or(gpu::DEFAULT_MAX, |m| m as usize);
        u128::from(iters_for(iters, smallest(args::sizes(gpu::MIN_SIZE, max))))
    } else {
        let ops: &[Op] = match args.op {
            Op::All => &[
                Op::Latency,
                Op::Bandwidth,
                Op::Allreduce,
                Op::Allgatherv,
                Op::Alltoall,
            ],
            _ => std::slice::from_ref(&args.op),
        };
        ops.iter()
            .map(|&op| {
                u128::from(match op {
                    Op::Strided => iters_for(iters, args.strided_storage),
                    Op::Overlap | Op::Plan => iters,
                    Op::Fused => iters_for(iters, 256 << 10),
                    _ => iters_for(iters, smallest(op.default_sizes(max))),
                })
            })
            .sum()
    };
    per_round * u128::from(args.rounds)
}

/// Why `--iters` cannot end within `--timeout` (none at `--timeout 0`): at least
/// [`least_iterations`] × [`MIN_ITERATION_NS`], with the largest `--iters` that can.
fn iterations_refused(args: &BenchArgs) -> Option<String> {
    if args.timeout <= 0.0 {
        return None;
    }
    let budget_ns = (args.timeout * 1e9) as u128;
    let fits = |iters: u64| least_iterations(args, iters) * MIN_ITERATION_NS <= budget_ns;
    if fits(args.iters) {
        return None;
    }
    // The largest count that fits (the bound grows with the count): bisection.
    let (mut lo, mut hi) = (0u64, args.iters);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let least = least_iterations(args, args.iters);
    let seconds = least * MIN_ITERATION_NS / 1_000_000_000;
    Some(format!(
        "--iters {} cannot end within --timeout {} s: with --rounds {} the run makes at least \
         {least} iterations (--op {}: each operation's smallest message, one path), at least \
         {MIN_ITERATION_NS} ns each, {seconds} s; the most that fits is --iters {lo} (or give \
         a longer --timeout; 0 for none)",
        args.iters,
        args.timeout,
        args.rounds,
        args.op.name()
    ))
}

/// Runs the benchmark; prints the tables on rank 0. Exit status 0, 1 when a path delivered
/// wrong values, 2 when the options were refused (among them an `--iters` that cannot end
/// within `--timeout`) or an output file could not be written (each is tried before any
/// measurement), 3 when the run went past `--timeout`.
pub fn run(world: &SimpleCommunicator, args: &BenchArgs) -> ExitCode {
    let root = world.rank() == 0;
    if let Some(why) = refuse(world, args) {
        if root {
            eprintln!("dlpack-mpi bench: {why}");
        }
        return ExitCode::from(2);
    }
    // Before any measurement: an output file that cannot be written is found now.
    let reports = [
        ("--csv", args.csv.as_deref()),
        ("--json", args.json.as_deref()),
        ("--plot", args.plot.as_deref()),
    ];
    if let Err(why) = crate::common::try_reports(world, &reports) {
        if root {
            eprintln!("dlpack-mpi bench: {why}");
        }
        return ExitCode::from(2);
    }
    let _watch = Watch::start(world.rank(), args.timeout);
    if args.device == crate::launch::DeviceArg::Cuda {
        use crate::launch::NoGpu;
        let why = match crate::launch::select_gpu(world, args.simulate_device, args.gpu) {
            Ok(gpu) => return gpu::run(world, args, gpu),
            Err(NoGpu::NoRuntime(why)) => format!("device `cuda` needs a GPU runtime: {why}"),
            Err(NoGpu::Refused(why)) => why,
        };
        if root {
            eprintln!("dlpack-mpi bench: {why}");
        }
        return ExitCode::from(2);
    }
    if root {
        report::print_host_intro(world.size(), &library_line(), args);
    }
    let (measured, ok) = run_ops(world, args);
    let mut status = i32::from(!ok);
    if root {
        if let Err(why) = write_files(world.size(), args, &measured) {
            eprintln!("dlpack-mpi bench: cannot write: {why}");
            status = 2;
        }
    }
    crate::common::agreed_exit(world, status)
}

/// The exit status of a run that ran past `--timeout` (as `check`'s).
const TIMED_OUT_STATUS: u8 = 3;

/// How much longer than `--timeout` the ranks other than 0 wait before they end themselves:
/// rank 0 ends first and says so, and the launcher ends the others (had every rank ended at
/// once, the launcher could end rank 0 before its line was out: seen under Open MPI 5).
const OTHERS_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// `--timeout`: a thread that ends the process with [`TIMED_OUT_STATUS`] when the run is
/// still going `--timeout` seconds after it started (rank 0, which says so; the others
/// [`OTHERS_GRACE`] later, each with its own line); dropping the watch (the run returned)
/// disarms it. The thread makes no MPI call (MPI_THREAD_SINGLE); the launcher ends the
/// other ranks when one exits.
struct Watch {
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Watch {
    /// Watches this run (`timeout` seconds; 0: no watch).
    fn start(rank: i32, timeout: f64) -> Option<Watch> {
        use std::sync::atomic::Ordering;
        if timeout <= 0.0 {
            return None;
        }
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = std::sync::Arc::clone(&done);
        let watch = move || {
            let budget = std::time::Duration::from_secs_f64(timeout);
            let grace = if rank == 0 {
                std::time::Duration::ZERO
            } else {
                OTHERS_GRACE
            };
            std::thread::sleep(budget + grace);
            if seen.load(Ordering::SeqCst) {
                return;
            }
            use std::io::Write as _;
            let _ = std::io::stdout().flush();
            let line = if rank == 0 {
                format!(
                    "dlpack-mpi bench: still running after --timeout {timeout} s: ending the \
                     run (exit status {TIMED_OUT_STATUS}); what was printed before stands, \
                     --csv, --json and --plot are not written\n"
                )
            } else {
                format!(
                    "dlpack-mpi bench: rank {rank}: still running {} s after --timeout \
                     {timeout} s: ending (exit status {TIMED_OUT_STATUS})\n",
                    OTHERS_GRACE.as_secs()
                )
            };
            let _ = std::io::stderr().write_all(line.as_bytes());
            std::process::exit(i32::from(TIMED_OUT_STATUS));
        };
        std::thread::Builder::new()
            .name("bench-timeout".into())
            .spawn(watch)
            .ok()
            .map(|_| Watch { done })
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.done.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Whether `--op all` skips the strided bench: it needs the default sizes up to at least its
/// 64 MiB storage and the contiguous layout.
fn all_skips_strided(args: &BenchArgs) -> bool {
    args.max_size.unwrap_or(DEFAULT_MAX_SIZE) < args.strided_storage as u64
        || args.sizes.is_some()
        || args.layout != BenchLayout::Contiguous
}

/// The rows of a host run, by the bench that measured them.
#[derive(Default)]
struct Measured {
    /// The sweeps'.
    rows: Vec<report::Row>,
    /// The strided bench's.
    strided: Vec<strided_report::StridedRow>,
    /// `--op overlap`'s.
    overlap: Vec<overlap_report::OverlapRow>,
    /// `--op fused`'s.
    fused: Vec<fused::FusedRow>,
    /// `--op plan`'s.
    plan: Vec<plan::PlanRow>,
}

/// Runs every operation `--op` names on the host: the rows, and whether every path
/// delivered the expected values. A failure to measure aborts the job.
fn run_ops(world: &SimpleCommunicator, args: &BenchArgs) -> (Measured, bool) {
    let ops: &[Op] = match args.op {
        Op::All => &[
            Op::Latency,
            Op::Bandwidth,
            Op::Allreduce,
            Op::Allgatherv,
            Op::Alltoall,
            Op::Strided,
        ],
        _ => std::slice::from_ref(&args.op),
    };
    let mut m = Measured::default();
    let mut ok = true;
    for &op in ops {
        let result = match op {
            Op::Strided => {
                if args.op == Op::All && all_skips_strided(args) {
                    if world.rank() == 0 {
                        println!("strided: skipped (it needs --max-size ≥ --strided-storage, no --sizes, contiguous --layout)\n");
                    }
                    continue;
                }
                strided::strided(world, args).map(|(r, good)| {
                    m.strided = r;
                    good
                })
            }
            Op::Overlap => overlap::overlap(world, args).map(|(r, good)| {
                m.overlap = r;
                good
            }),
            Op::Fused => fused::fused(world, args).map(|(r, good)| {
                m.fused = r;
                good
            }),
            Op::Plan => plan::plan(world, args).map(|(r, good)| {
                m.plan = r;
                good
            }),
            _ => host::sweep(world, args, op).map(|(mut r, good)| {
                m.rows.append(&mut r);
                good
            }),
        };
        match result {
            Ok(good) => ok &= good,
            Err(e) => {
                eprintln!("dlpack-mpi bench: rank {}: {e}", world.rank());
                world.abort(1)
            }
        }
    }
    (m, ok)
}

/// Writes `--csv`, `--json` and `--plot` (rank 0), stopping at the first that fails.
fn write_files(ranks: i32, args: &BenchArgs, m: &Measured) -> Result<(), String> {
    let rows = &m.rows;
    if let Some(path) = &args.csv {
        report::write_csv(path, args, ranks, rows, &m.strided)?;
    }
    if let Some(path) = &args.json {
        let mut objects = report::json_rows(rows);
        objects.extend(strided_report::json_rows(&m.strided, ranks));
        objects.extend(overlap_report::json_rows(&m.overlap, ranks));
        objects.extend(fused::json_rows(&m.fused, ranks));
        objects.extend(plan::json_rows(&m.plan, ranks));
        crate::common::write_json(path, &objects)?;
    }
    if let Some(path) = &args.plot {
        let library = library_line();
        let title = format!(
            "dlpack-mpi bench: {ranks} rank(s), {}, f32, {} layout",
            library.split(',').next().unwrap_or(""),
            args.layout.name()
        );
        report::write_plot(path, rows, &title)?;
    }
    Ok(())
}
