//! `check`'s command line: [`CheckArgs`] and [`Producer`] (clap), and the library's
//! [`Transport`] as a `--transport` value.

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use dlpack_mpi::transport::Transport;

use crate::launch::{Dev, DeviceArg, GpuArgs, DEVS};

/// Options of `check`.
#[derive(Debug, Clone, clap::Args)]
pub struct CheckArgs {
    /// Only cases whose name matches PATTERN (repeatable; a case runs if it matches any).
    /// Names read `op/dtype/layout/device/transport/len`; a PATTERN with `*`, `?` or `[`
    /// is a glob over the whole name, any other is a substring (`-k allreduce/float`).
    #[arg(short = 'k', long = "include", value_name = "PATTERN")]
    pub include: Vec<String>,
    /// Leave out cases whose name matches PATTERN (repeatable; same rules as `-k`).
    #[arg(short = 'e', long = "exclude", value_name = "PATTERN")]
    pub exclude: Vec<String>,
    /// Only these operations (repeatable or comma separated); see `--list`.
    #[arg(long, value_delimiter = ',')]
    pub op: Vec<String>,
    /// Only these dtypes (repeatable or comma separated), e.g. `float32,int8`.
    #[arg(long, value_delimiter = ',')]
    pub dtype: Vec<String>,
    /// Only these layouts (repeatable or comma separated): contiguous, fortran, transposed,
    /// step, negative, broadcast (send side), scalar (0-d, length 1).
    #[arg(long, value_delimiter = ',')]
    pub layout: Vec<String>,
    /// Tensor lengths in elements. With the default, the nonblocking collectives (`ibcast`,
    /// `iallreduce`, …) run lengths 0, 1, 7 and 1000 only, the fused ones (`fused-allreduce`,
    /// …) 0 and 1000, to keep the matrix's time; any other list applies to every operation
    /// (`--len 65536 --op iallreduce`).
    #[arg(long, value_delimiter = ',', default_values_t = DEFAULT_LENS)]
    pub len: Vec<i64>,
    /// Where the tensors live: `cpu`; `cuda-host` (pinned host memory, `kDLCUDAHost`: host
    /// memory, no device path); `cuda` (device memory through cudarc: feature `cuda` and a
    /// CUDA driver); `cuda-managed` (needs --simulate-device for now); `all` = every device
    /// available here. `SEND:RECV` (e.g. `cpu:cuda`, `cuda:cuda-host`, `all:all`): send
    /// tensors on one, receive tensors on the other (an in-place case's one buffer is a
    /// receive tensor); `mpich-all`: MPICH's `-memtype=all`, a case per memory with the
    /// even ranks' tensors on it and the odd ranks' on `cuda`. Device names appear in case
    /// names (`-k /cuda/`, `-k /cpu:cuda/`, `-k /even-cpu+odd-cuda/`).
    #[arg(long, value_name = "DEVICE|SEND:RECV|mpich-all", default_value = "cpu",
          value_parser = parse_device)]
    pub device: DeviceChoice,
    /// Start every send and receive tensor this many bytes past a 4096-byte aligned address
    /// (comma separated; `all` = 1 to 7, 4095 and 4097; at most 65536): each offset in two
    /// cases, through DLPack's `byte_offset` (`data` aligned; name part `off3b`) and through
    /// a shifted `data` pointer (`off3p`), with guard bytes around every tensor. `0` (the
    /// default): tensors aligned for their element type, names without the part.
    #[arg(long, value_delimiter = ',', default_value = "0", allow_hyphen_values = true,
          value_parser = parse_offset)]
    pub offset: Vec<OffsetArg>,
    /// Testing without a GPU: CUDA tensors are host memory labelled `kDLCUDA` /
    /// `kDLCUDAManaged` and the GPU runtime is simulated, so staging, routing and stream
    /// synchronization run as on a GPU.
    #[arg(long, hide = true)]
    pub simulate_device: bool,
    /// `--gpu N`: which CUDA device each rank uses.
    #[command(flatten)]
    pub gpu: GpuArgs,
    /// Who makes the tensors: `numpy`, `jax` or `paddle` = that package's arrays through
    /// `__dlpack__` (feature `python`; a dtype the package lacks is skipped); `rust` =
    /// dlpack-mpi's own `Owned` exporter; `auto` = each dtype from the first installed
    /// producer that makes it, in the order NumPy, JAX, Paddle, and Rust for the rest. JAX
    /// arrays are immutable, so receive buffers of a JAX case come from NumPy or Paddle when
    /// one makes the dtype, else Rust. Applies to `cpu` cases; other devices' tensors are
    /// always made by Rust (`Owned`, or cudarc for `cuda`). Case lines end with the producer.
    #[arg(long, value_enum, default_value_t = Producer::Auto)]
    pub producer: Producer,
    /// How CUDA device memory reaches MPI: `auto` = direct when the MPI library is
    /// CUDA-aware, else staged; `direct` = device pointers to a CUDA-aware MPI (refused when
    /// it is not); `staged` = through pinned host memory. Host tensors (`cpu`, `cuda-host`)
    /// always go directly (transport `host` in case names), managed memory as `managed`;
    /// `direct`/`staged` are refused when no CUDA device is selected. Strided or
    /// float16/bfloat16-reduced tensors are staged even under `direct` (the line's `[…]`
    /// says the route taken).
    #[arg(long, value_parser = transport_parser(), default_value = "auto")]
    pub transport: Transport,
    /// Stop at the first failure.
    #[arg(short = 'x', long)]
    pub failfast: bool,
    /// Print only failures, the known MPI-library bugs and the closing counts (no table
    /// per operation, no matrix).
    #[arg(short, long, conflicts_with = "verbose")]
    pub quiet: bool,
    /// `-v`: also print every case as it finishes (`PASS`, `SKIP`, `N/A`, `KNOWN-BUG`,
    /// `FAIL`, with the producer); `-vv`: also the full MPI library version and each case's
    /// time. Without it: failures as they happen, then a line per operation, the operation
    /// × dtype matrix, the known MPI-library bugs and the closing counts.
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// List the case names and exit.
    #[arg(long)]
    pub list: bool,
    /// Write a JUnit XML report to FILE (rank 0).
    #[arg(long, value_name = "FILE")]
    pub junit: Option<std::path::PathBuf>,
    /// Write a JSON report to FILE (rank 0).
    #[arg(long, value_name = "FILE")]
    pub json: Option<std::path::PathBuf>,
    /// Per-case time limit in seconds (decimals allowed); `0` turns it off. A case (or the
    /// mismatch probes before the cases) still running after it ends the run: rank 0 prints
    /// `TIMEOUT` with the case and the ranks still inside it, the counts of the cases before
    /// it and writes `--json`/`--junit`; exit status 3.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_TIMEOUT_S,
          allow_hyphen_values = true, value_parser = parse_timeout)]
    pub timeout: f64,
    /// Testing the runner itself: corrupt what the last rank received in cases matching
    /// PATTERN (operations that receive into a fresh tensor), so that they fail.
    #[arg(long, value_name = "PATTERN", hide = true)]
    pub inject_fault: Option<String>,
    /// Testing `--timeout`: rank RANK (default: the last) sleeps for ever at the start of
    /// the cases matching PATTERN (same rules as `-k`; `probes`: the mismatch probes;
    /// `finalize`: where it would call `MPI_Finalize`, after the cases).
    #[arg(long, value_name = "PATTERN[:RANK]", hide = true)]
    pub inject_hang: Option<String>,
}

/// The `--device` value: one memory (or `all` of them), a send and a receive memory, or
/// MPICH's pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceChoice {
    /// Every tensor on one memory, or with `all` on each memory in turn.
    One(DeviceArg),
    /// `SEND:RECV`: send tensors on the first, receive tensors on the second; `None` (`all`)
    /// each memory in turn.
    Pair(Option<Dev>, Option<Dev>),
    /// `mpich-all`: MPICH's `-memtype=all`, even ranks on each memory in turn, odd ranks
    /// on `cuda`.
    MpichAll,
}

impl DeviceChoice {
    /// The name as given on the command line.
    pub fn name(self) -> String {
        let side = |d: Option<Dev>| d.map_or("all", Dev::name);
        match self {
            DeviceChoice::One(arg) => arg.name().to_string(),
            DeviceChoice::Pair(s, r) => format!("{}:{}", side(s), side(r)),
            DeviceChoice::MpichAll => "mpich-all".to_string(),
        }
    }

    /// Whether it goes through several memories (`all`, a side `all`, `mpich-all`): then a
    /// memory this build or machine lacks is left out, where a choice naming it is refused.
    pub fn is_sweep(self) -> bool {
        matches!(
            self,
            DeviceChoice::One(DeviceArg::All)
                | DeviceChoice::Pair(None, _)
                | DeviceChoice::Pair(_, None)
                | DeviceChoice::MpichAll
        )
    }
}

/// `--device`: `cpu`, `cuda`, `cuda-host`, `cuda-managed`, `all`, `SEND:RECV` of those, or
/// `mpich-all`.
fn parse_device(value: &str) -> Result<DeviceChoice, String> {
    let one = |name: &str| DEVS.into_iter().find(|d| d.name() == name);
    let side = |name: &str| match name {
        "all" => Ok(None),
        other => one(other).map(Some).ok_or(()),
    };
    let refused = || {
        format!(
            "`{value}` is not a device: cpu, cuda-host, cuda, cuda-managed, all, SEND:RECV of              those (e.g. cpu:cuda), or mpich-all"
        )
    };
    if value == "mpich-all" {
        return Ok(DeviceChoice::MpichAll);
    }
    if let Some((s, r)) = value.split_once(':') {
        return match (side(s), side(r)) {
            (Ok(s), Ok(r)) => Ok(DeviceChoice::Pair(s, r)),
            _ => Err(refused()),
        };
    }
    match value {
        "all" => Ok(DeviceChoice::One(DeviceArg::All)),
        name => match one(name) {
            Some(Dev::Cpu) => Ok(DeviceChoice::One(DeviceArg::Cpu)),
            Some(Dev::CudaHost) => Ok(DeviceChoice::One(DeviceArg::CudaHost)),
            Some(Dev::Cuda) => Ok(DeviceChoice::One(DeviceArg::Cuda)),
            Some(Dev::CudaManaged) => Ok(DeviceChoice::One(DeviceArg::CudaManaged)),
            None => Err(refused()),
        },
    }
}

/// One `--offset` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetArg {
    /// This many bytes (0: none).
    Bytes(u64),
    /// `all`: 1 to 7, and a page (4096 bytes) ± 1.
    All,
}

/// The largest `--offset` (bytes).
pub(super) const MAX_OFFSET: u64 = 1 << 16;

/// `--offset`: a number of bytes from 0 to [`MAX_OFFSET`], or `all`.
fn parse_offset(value: &str) -> Result<OffsetArg, String> {
    match value.trim() {
        "all" => Ok(OffsetArg::All),
        v => match v.parse::<u64>() {
            Ok(b) if b <= MAX_OFFSET => Ok(OffsetArg::Bytes(b)),
            _ => Err(format!(
                "`{value}` is not a number of bytes from 0 to {}, or `all`",
                MAX_OFFSET
            )),
        },
    }
}

/// The default `--timeout`, in seconds: about a hundred times the slowest case measured on
/// the project's loaded 2-core machine (0.66 s at 4 oversubscribed ranks; docs/CLI.md).
pub(super) const DEFAULT_TIMEOUT_S: f64 = 60.0;

/// `--timeout SECONDS`: a finite number, 0 or more (0: no limit), at most a day (a
/// `Duration` of any such value exists).
pub(super) fn parse_timeout(value: &str) -> Result<f64, String> {
    match value.trim().parse::<f64>() {
        Ok(s) if (0.0..=86_400.0).contains(&s) => Ok(s),
        _ => Err(format!(
            "`{value}` is not a number of seconds from 0 (no limit) to 86400"
        )),
    }
}

/// The default `--len`.
pub(super) const DEFAULT_LENS: [i64; 5] = [0, 1, 7, 1000, 65_536];

/// The lengths of the nonblocking collectives under the default `--len`: every one but the
/// largest, whose cases take most of a blocking operation's time (the nonblocking ones run
/// the same bodies, so every dtype × layout is still checked).
pub(super) const NONBLOCKING_DEFAULT_LENS: [i64; 4] = [0, 1, 7, 1000];

/// Who makes the tensors of a check run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Producer {
    /// Each dtype from the first installed producer that makes it (NumPy, JAX, Paddle),
    /// Rust for the rest.
    Auto,
    /// dlpack-mpi's own `Owned` exporter (a Rust `Vec` with a DLPack view).
    Rust,
    /// NumPy arrays through `__dlpack__` (needs the `python` feature).
    Numpy,
    /// JAX arrays (CPU) through `__dlpack__`: send buffers; receive buffers as for `auto`.
    Jax,
    /// PaddlePaddle tensors (CPU) through `__dlpack__`, strided views by `paddle.as_strided`.
    Paddle,
}

impl Producer {
    /// The name in case lines, the JSON report and `--producer`.
    pub(super) fn name(self) -> &'static str {
        match self {
            Producer::Auto => "auto",
            Producer::Rust => "rust",
            Producer::Numpy => "numpy",
            Producer::Jax => "jax",
            Producer::Paddle => "paddle",
        }
    }

    /// The Python producers, in the order `auto` tries them, with the module to import.
    pub(super) const PYTHON: [(Producer, &'static str); 3] = [
        (Producer::Numpy, "numpy"),
        (Producer::Jax, "jax"),
        (Producer::Paddle, "paddle"),
    ];
}

/// The `--transport` values: the library's [`Transport`] with its command-line name and
/// help, in the order rank 0 broadcasts them by index.
pub(super) const TRANSPORTS: [(Transport, &str, &str); 3] = [
    (
        Transport::Auto,
        "auto",
        "Direct when the MPI library is CUDA-aware, else staged",
    ),
    (
        Transport::Direct,
        "direct",
        "Device pointers passed to a CUDA-aware MPI",
    ),
    (
        Transport::Staged,
        "staged",
        "Copies through pinned host buffers around each MPI call",
    ),
];

/// Parses `--transport` into the library's [`Transport`] (the one conversion from its name).
fn transport_parser() -> impl TypedValueParser<Value = Transport> {
    PossibleValuesParser::new(TRANSPORTS.map(|(_, name, help)| PossibleValue::new(name).help(help)))
        .map(|given: String| {
            TRANSPORTS
                .iter()
                .find(|(_, name, _)| *name == given)
                .map_or(Transport::Auto, |(t, _, _)| *t)
        })
}
