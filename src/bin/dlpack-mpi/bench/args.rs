//! The options of `bench`: which operation, the sizes (parsed from `8,1K,64KiB` and `A:B`
//! ranges), rounds and iterations, device, layout and output files. Uses `common`.

use clap::ValueEnum;

use super::common::ELEM;

/// Sizes up to this many bytes run `--iters` iterations per round; larger ones run
/// `iters × SCALE_REF / size` (at least `MIN_ITERS`), so every round moves about the same
/// number of bytes.
pub const SCALE_REF: usize = 16 << 10;
const MIN_ITERS: u64 = 4;
/// `--max-size` when not given (host memory).
pub const DEFAULT_MAX_SIZE: u64 = 64 << 20;

/// `--overlap-work` when not given: units of the computation of `--op overlap` per f32
/// element of the all-reduced tensor. Chosen so that at 16 MiB (4 Mi elements) the
/// computation alone takes about as long as the blocking all-reduce of 16 MiB at 2 ranks on
/// the 2-core test machine (docs/PERFORMANCE.md).
pub const OVERLAP_UNITS_PER_ELEM: u64 = 1;

/// Which benchmark to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Op {
    /// Ping-pong between rank 0 and rank 1 (other ranks wait at barriers): µs per message
    /// (half a round trip), as osu_latency.
    #[value(alias = "pingpong")]
    Latency,
    /// Rank 0 streams a window of nonblocking sends to rank 1, which acknowledges each
    /// window: µs per message and MB/s, as osu_bw.
    Bandwidth,
    /// All-reduce (sum of f32) over all ranks: µs per call of the slowest rank.
    Allreduce,
    /// All-gatherv, every rank contributing one block of the size: µs per call of the
    /// slowest rank.
    Allgatherv,
    /// All-to-all, one block of the size to every rank: µs per call of the slowest rank.
    Alltoall,
    /// Strided views of one storage (step 2; blocks of 1 … 4096 f32 with a gap of one
    /// block; a transpose; a 3-D permutation; a reversed axis) from rank 0 to rank 1:
    /// contiguous send of the same bytes vs derived datatype vs pack kernels vs Auto.
    Strided,
    /// A nonblocking all-reduce (sum of f32, 16 MiB unless --sizes) posted, then a
    /// computation testing it between slices (--overlap-slices), then its wait; against the
    /// blocking all-reduce and the computation alone. Also the cost of posting an 8-byte
    /// nonblocking all-reduce, next to raw rsmpi's post. Not part of `all`.
    Overlap,
    /// The all-reduce (sum of f32, in place) of a list of tensors: the gradients of
    /// ResNet-50 and BERT-base (benches/data, built in; divided by --fused-scale) and 256
    /// tensors of 1 KiB; one all_reduce_tensor_in_place per member vs one fused
    /// all_reduce_tensors_in_place vs one tensor of the same total elements, and mpi4py on NumPy arrays of the same shapes
    /// (feature `python`; skipped with a line when NumPy or mpi4py cannot be used):
    /// mpi4py-loop = one Allreduce(MPI.IN_PLACE) per member, mpi4py-concat = np.concatenate,
    /// one Allreduce, copied back. Not part of `all`.
    Fused,
    /// Plans: the planned fused all-reduce (sum of f32, in place; built once per list by
    /// plan_all_reduce_tensors_in_place, one plan.run() per iteration, and plan.start() then
    /// wait) of --op fused's lists (divided by --fused-scale) and of one tensor of 8 bytes,
    /// next to the unplanned fused all-reduce of the same members, one tensor of the same
    /// total elements, mpi4py on the model lists (feature `python`: --op fused's two ways
    /// and the persistent Allreduce_init + Startall/Waitall where mpi4py's MPI is MPI-4;
    /// each skipped with a line otherwise) and, at 8 bytes, rsmpi's MPI_Allreduce on the
    /// same buffer and the checked all_reduce_tensor_in_place. Not part of `all`.
    Plan,
    /// latency, bandwidth, allreduce, allgatherv, alltoall, then strided (skipped when
    /// --max-size is below 64 MiB).
    All,
}

impl Op {
    /// The name as given to `--op`.
    pub fn name(self) -> &'static str {
        match self {
            Op::Latency => "latency",
            Op::Bandwidth => "bandwidth",
            Op::Allreduce => "allreduce",
            Op::Allgatherv => "allgatherv",
            Op::Alltoall => "alltoall",
            Op::Strided => "strided",
            Op::Overlap => "overlap",
            Op::Fused => "fused",
            Op::Plan => "plan",
            Op::All => "all",
        }
    }

    /// Whether the operation is between rank 0 and rank 1 only.
    pub fn point_to_point(self) -> bool {
        matches!(self, Op::Latency | Op::Bandwidth | Op::Strided)
    }

    /// Default sizes, bytes (per rank's block for all-gatherv and all-to-all), for a
    /// largest size of `max`.
    pub fn default_sizes(self, max: usize) -> Vec<usize> {
        match self {
            Op::Latency => sizes(8, max),
            Op::Bandwidth => sizes(8, max.min(16 << 20)),
            Op::Allreduce => sizes(1 << 10, max.min(16 << 20)),
            Op::Overlap => vec![max.min(16 << 20) / ELEM * ELEM],
            _ => sizes(8, max.min(4 << 20)),
        }
    }
}

/// How the dlpack-mpi side lays out its tensors (`--layout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BenchLayout {
    /// Dense, C order.
    Contiguous,
    /// Every other element of a storage twice the size (stride 2): point-to-point goes
    /// through a derived datatype, collectives through packing. The raw path sends the same
    /// number of bytes from a contiguous slice: the lower bound.
    Step,
}

impl BenchLayout {
    /// The name as given to `--layout`.
    pub fn name(self) -> &'static str {
        match self {
            BenchLayout::Contiguous => "contiguous",
            BenchLayout::Step => "step",
        }
    }
}

/// Message sizes in bytes: a comma-separated list of sizes (`8,1K,64KiB,4M`; K/M/G are
/// powers of 1024) or ranges `A:B` (every power of two from A to B).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sizes(pub Vec<u64>);

fn parse_one_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("size `{t}` is not a number of bytes"))?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        other => {
            return Err(format!(
                "size `{t}` has an unknown unit `{other}` (use K, M or G)"
            ))
        }
    };
    let bytes = n
        .checked_mul(scale)
        .filter(|b| (4..=1 << 30).contains(b))
        .ok_or_else(|| format!("size `{t}` is outside 4 B ..= 1 GiB"))?;
    if bytes % ELEM as u64 != 0 {
        return Err(format!(
            "size `{t}` is not a whole number of f32 elements (4 bytes)"
        ));
    }
    Ok(bytes)
}

/// `--max-size`: one size as in `--sizes`, at least 8 bytes (the smallest latency size).
fn parse_max_size(text: &str) -> Result<u64, String> {
    let bytes = parse_one_size(text)?;
    if bytes < 8 {
        return Err(format!(
            "--max-size `{text}` is below 8 B, the smallest size measured"
        ));
    }
    Ok(bytes)
}

fn parse_sizes(text: &str) -> Result<Sizes, String> {
    let mut out = Vec::new();
    for part in text.split(',').filter(|p| !p.trim().is_empty()) {
        match part.split_once(':') {
            Some((lo, hi)) => {
                let (lo, hi) = (parse_one_size(lo)?, parse_one_size(hi)?);
                if lo > hi {
                    return Err(format!("size range `{part}` runs backwards"));
                }
                let mut s = lo;
                while s <= hi {
                    out.push(s);
                    s *= 2;
                }
            }
            None => out.push(parse_one_size(part)?),
        }
    }
    if out.is_empty() {
        return Err("no sizes given".into());
    }
    out.sort_unstable();
    out.dedup();
    Ok(Sizes(out))
}

/// Options of `bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Which benchmark to run.
    #[arg(long, value_enum, default_value_t = Op::All)]
    pub op: Op,
    /// Message sizes in bytes (per rank's block for allgatherv and alltoall), e.g.
    /// `8,1K,1M` or `8:64M` (powers of two); default: powers of two up to --max-size.
    #[arg(long, value_parser = parse_sizes)]
    pub sizes: Option<Sizes>,
    /// Timed rounds per size and path (the median and best of the rounds' means are
    /// reported; p50 and p99 are taken over samples of each round's iterations).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub rounds: u32,
    /// Iterations per round for messages up to 16 KiB; larger messages run proportionally
    /// fewer (iters × 16 KiB / size, at least 4).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub iters: u64,
    /// Largest message in bytes when --sizes is not given, default 64 MiB (latency from 8 B;
    /// bandwidth and all-reduce up to at most 16 MiB, all-gatherv and all-to-all 4 MiB).
    /// Strided sizes are fixed (a 64 MiB storage); `all` skips them below 64 MiB. With
    /// `--device cuda` the default sizes are 4 KiB … 256 MiB.
    /// Bytes, with the units of --sizes (`1048576`, `1M`), 8 B ..= 1 GiB.
    #[arg(long, value_parser = parse_max_size)]
    pub max_size: Option<u64>,
    /// Where the tensors live; bench accepts `cpu` and `cuda` only (the other values are
    /// `check`'s). `cuda` (device memory through cudarc: feature `cuda` and a CUDA driver)
    /// runs ping-pong and allreduce only (`--op all` = both) through DeviceComm
    /// (staged, and direct when MPI is CUDA-aware) next to a device → pinned → device copy
    /// of the same bytes and to host-memory MPI, with the staged/copy bandwidth ratio.
    #[arg(long, value_enum, default_value_t = crate::launch::DeviceArg::Cpu)]
    pub device: crate::launch::DeviceArg,
    /// Testing without a GPU: `--device cuda` on host memory labelled `kDLCUDA`, with a
    /// simulated runtime.
    #[arg(long, hide = true)]
    pub simulate_device: bool,
    /// `--gpu N`: which CUDA device each rank uses.
    #[command(flatten)]
    pub gpu: crate::launch::GpuArgs,
    /// Layout of the dlpack-mpi side's tensors.
    #[arg(long, value_enum, default_value_t = BenchLayout::Contiguous)]
    pub layout: BenchLayout,
    /// Write every measurement to FILE as CSV (rank 0): one row per operation, size and path.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<std::path::PathBuf>,
    /// Draw latency and bandwidth against size, one curve per path, to FILE (SVG).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<std::path::PathBuf>,
    /// Write every measurement to FILE (rank 0) as one JSON array of objects, one per
    /// (operation, case, size, path): {"op", "case", "path", "size_bytes", "median_us",
    /// "best_us", "p50_us", "p99_us", "algbw_gbs", "busbw_gbs", …} (docs/CLI.md has the
    /// schema).
    #[arg(long, value_name = "FILE")]
    pub json: Option<std::path::PathBuf>,
    /// Check every iteration (latency, bandwidth, allreduce, allgatherv, alltoall), as
    /// nccl-tests' `-c`: each iteration runs alone into poisoned receive buffers, timed, and
    /// every received element is checked after it (untimed); a wrong one is printed with
    /// the operation, size, path, round, iteration and element, and the exit status is 1.
    #[arg(long)]
    pub check: bool,
    /// Testing `--check`: report iteration ITER of the first round's raw path as wrong (its
    /// first received element overwritten after the call), on every rank that checks.
    #[arg(long, hide = true, value_name = "ITER", requires = "check")]
    pub inject_wrong: Option<u64>,
    /// `--op strided`: bytes of the storage the views come from, a power of two from 32 KiB
    /// to 64 MiB (default 64 MiB; smaller for quick runs: every case shrinks with it).
    #[arg(long, value_parser = parse_strided_storage, default_value = "64M")]
    pub strided_storage: usize,
    /// `--op overlap`: slices of the computation, with a test() of the pending all-reduce
    /// after each (more slices: more MPI progress, more test calls).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub overlap_slices: u32,
    /// `--op overlap`: units of arithmetic per element of the tensor (a unit: 8 independent
    /// f64 multiply-adds in registers); the default makes the computation about as long as
    /// the blocking all-reduce of 16 MiB at 2 ranks on the 2-core test machine.
    #[arg(long, default_value_t = OVERLAP_UNITS_PER_ELEM, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub overlap_work: u64,
    /// The run's time budget in seconds (decimals allowed; 0: none, at most 86400): an
    /// `--iters` that cannot end within it is refused before any measurement (exit status
    /// 2, with the largest `--iters` that can), and a run still going after it ends with
    /// exit status 3 (what was printed stands; `--csv`, `--json` and `--plot` are not
    /// written).
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_TIMEOUT_S,
          allow_hyphen_values = true, value_parser = parse_timeout)]
    pub timeout: f64,
    /// `--op fused` and `--op plan`: divide the element count of every member of the model
    /// lists (ResNet-50, BERT-base) by this (rounded up; members become 1-D), for quick runs
    /// or small machines; 1 = full size.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub fused_scale: u64,
}

/// The default `--timeout`, in seconds: an hour, far beyond a default run on the project's
/// 2-core machine (the first ping-pong and all-reduce bench took 49–134 s of wall time,
/// docs/PERFORMANCE.md), far below "for ever".
pub const DEFAULT_TIMEOUT_S: f64 = 3600.0;

/// `--timeout SECONDS`: a finite number, 0 or more (0: no limit), at most a day.
fn parse_timeout(value: &str) -> Result<f64, String> {
    match value.trim().parse::<f64>() {
        Ok(s) if (0.0..=86_400.0).contains(&s) => Ok(s),
        _ => Err(format!(
            "`{value}` is not a number of seconds from 0 (no limit) to 86400"
        )),
    }
}

/// Reads `--strided-storage`: a size (as `--sizes`) that is a power of two in
/// 32 KiB ..= 64 MiB (f32 values up to 2^24 stay exact, and a block of 4096 elements with
/// its gap fits).
fn parse_strided_storage(text: &str) -> Result<usize, String> {
    let bytes = parse_one_size(text)?;
    if bytes.is_power_of_two() && ((32 << 10)..=(64 << 20)).contains(&bytes) {
        Ok(bytes as usize)
    } else {
        Err(format!(
            "--strided-storage `{text}` is not a power of two from 32 KiB to 64 MiB"
        ))
    }
}

impl BenchArgs {
    /// `--sizes` in bytes when given, else `default`.
    pub fn sizes_or(&self, default: Vec<usize>) -> Vec<usize> {
        match &self.sizes {
            Some(s) => s.0.iter().map(|&b| b as usize).collect(),
            None => default,
        }
    }
}

/// Iterations per round for messages of `bytes`, from `--iters` = `base` (see [`SCALE_REF`]).
pub fn iters_for(base: u64, bytes: usize) -> u64 {
    if bytes <= SCALE_REF {
        base
    } else {
        (base.saturating_mul(SCALE_REF as u64) / bytes as u64).max(MIN_ITERS)
    }
}

/// Every power of two times `min` from `min` up to `max`, bytes.
pub fn sizes(min: usize, max: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut s = min;
    while s <= max {
        v.push(s);
        s *= 2;
    }
    v
}
