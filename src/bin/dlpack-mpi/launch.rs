//! What `check`, `bench` and `info` share about the launch: the `--device` argument and the
//! devices it names, the GPU runtime and each rank's device (`--gpu`), the launcher's rank,
//! and errors agreed by every rank.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dlpack_mpi::device::{device_type, Device};
use dlpack_mpi::runtime::{default_runtime, DeviceRuntime, SimulatedRuntime};
use dlpack_mpi::settings::{parse_device_override, DEVICE_ENV};
use dlpack_mpi::transport::{select_device_at, DeviceSelection, NodeLocal};
use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

/// One kind of memory a run's tensors can live in (the `device` part of check's case names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dev {
    /// Host memory (`kDLCPU`).
    Cpu,
    /// Pinned host memory (`kDLCUDAHost`): host memory for MPI.
    CudaHost,
    /// CUDA device memory (`kDLCUDA`, ordinal 0).
    Cuda,
    /// CUDA managed memory (`kDLCUDAManaged`).
    CudaManaged,
}

/// Every [`Dev`], in the order `--device all` runs them.
pub const DEVS: [Dev; 4] = [Dev::Cpu, Dev::CudaHost, Dev::Cuda, Dev::CudaManaged];

impl Dev {
    /// The name as given on the command line and in case names.
    pub fn name(self) -> &'static str {
        match self {
            Dev::Cpu => "cpu",
            Dev::CudaHost => "cuda-host",
            Dev::Cuda => "cuda",
            Dev::CudaManaged => "cuda-managed",
        }
    }

    /// The DLPack device the tensors are labelled with (dlpack.h `DLDevice`) on a rank whose
    /// CUDA device is `ordinal` ([`Gpu::ordinal`]; 0 without a GPU): only `kDLCUDA` names
    /// an ordinal, pinned and managed memory are labelled 0.
    pub fn label(self, ordinal: i32) -> Device {
        match self {
            Dev::Cpu => Device::CPU,
            Dev::CudaHost => Device::new(device_type::CUDA_HOST, 0),
            Dev::Cuda => Device::new(device_type::CUDA, ordinal),
            Dev::CudaManaged => Device::new(device_type::CUDA_MANAGED, 0),
        }
    }

    /// Whether the tensors need a GPU runtime (streams, copies).
    pub fn needs_runtime(self) -> bool {
        matches!(self, Dev::Cuda | Dev::CudaManaged)
    }

    /// `cuda:0`-style: the name and the device ordinal (as [`Dev::label`]).
    pub fn short(self, ordinal: i32) -> String {
        format!("{}:{}", self.name(), self.label(ordinal).device_id)
    }
}

/// Where tensors live (`--device` of `check` and `bench`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceArg {
    /// Host memory (`kDLCPU`).
    Cpu,
    /// CUDA device memory (`kDLCUDA`).
    Cuda,
    /// CUDA pinned host memory (`kDLCUDAHost`).
    CudaHost,
    /// CUDA managed memory (`kDLCUDAManaged`).
    CudaManaged,
    /// Every device this build and machine support.
    All,
}

impl DeviceArg {
    /// The one device it names; `None` for `all`.
    pub fn one(self) -> Option<Dev> {
        match self {
            DeviceArg::Cpu => Some(Dev::Cpu),
            DeviceArg::Cuda => Some(Dev::Cuda),
            DeviceArg::CudaHost => Some(Dev::CudaHost),
            DeviceArg::CudaManaged => Some(Dev::CudaManaged),
            DeviceArg::All => None,
        }
    }

    /// The devices it names, in [`DEVS`] order.
    pub fn devices(self) -> Vec<Dev> {
        self.one().map_or_else(|| DEVS.to_vec(), |d| vec![d])
    }

    /// The name as given on the command line.
    pub fn name(self) -> &'static str {
        self.one().map_or("all", Dev::name)
    }
}

/// The GPU options of `check`, `bench` and `info`.
#[derive(Debug, Clone, Copy, Default, clap::Args)]
pub struct GpuArgs {
    /// The CUDA device (ordinal) every rank started with this flag uses; overrides
    /// DLPACK_MPI_DEVICE=N, which overrides the default: the rank among the node's ranks
    /// modulo the number of devices, so that the ranks of a multi-GPU node each get their own.
    #[arg(long = "gpu", value_name = "N", allow_hyphen_values = true,
          value_parser = parse_gpu_flag)]
    pub ordinal: Option<i32>,
    /// Testing: how many devices `--simulate-device` simulates (default 1).
    #[arg(long, hide = true, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=64))]
    pub simulated_devices: u16,
}

/// `--gpu N`: read like `DLPACK_MPI_DEVICE` (`settings::parse_device_override`: decimal
/// digits only), so the flag and the variable take the same forms.
fn parse_gpu_flag(value: &str) -> Result<i32, String> {
    match dlpack_mpi::settings::parse_device_override(Some(value)) {
        Ok(Some(ordinal)) => Ok(ordinal),
        _ => Err(format!("`{value}` is not a device ordinal (0, 1, 2, ...)")),
    }
}

/// The GPU runtime of `check`, `bench` and `info`, and this rank's device.
#[derive(Clone, Copy)]
pub struct Gpu {
    /// The runtime: the CUDA driver, or a simulated device.
    pub runtime: &'static dyn DeviceRuntime,
    /// `--simulate-device`: CUDA tensors are labelled host memory.
    pub simulated: bool,
    /// This rank's device, already made the runtime's device.
    pub selection: DeviceSelection,
}

impl Gpu {
    /// This rank's CUDA device ordinal (cudarc's `CudaContext::new` takes it).
    pub fn ordinal(&self) -> i32 {
        self.selection.ordinal
    }

    /// This rank's CUDA device as a DLPack device (`kDLCUDA`, the selected ordinal).
    pub fn device(&self) -> Device {
        Dev::Cuda.label(self.ordinal())
    }
}

/// Why a rank has no [`Gpu`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoGpu {
    /// There is no GPU runtime (the build, or no driver loads): why, in words.
    NoRuntime(String),
    /// There is one, and the device was refused (`--gpu`, `DLPACK_MPI_DEVICE`) or could not
    /// be made current: why, in words.
    Refused(String),
}

impl NoGpu {
    /// The reason, in words.
    pub fn text(&self) -> &str {
        match self {
            NoGpu::NoRuntime(why) | NoGpu::Refused(why) => why,
        }
    }
}

/// The GPU runtime without a device chosen: a [`SimulatedRuntime`] with `simulated` devices
/// when that is `Some`, else the CUDA driver ([`default_runtime`]), else why there is none.
pub fn gpu_runtime(simulated: Option<u16>) -> Result<&'static dyn DeviceRuntime, String> {
    if let Some(count) = simulated {
        let sim = SimulatedRuntime::with_devices(usize::from(count));
        let sim: &'static SimulatedRuntime = Box::leak(Box::new(sim));
        return Ok(sim);
    }
    default_runtime().ok_or_else(no_runtime_reason)
}

/// This rank's GPU, its own outcome (not agreed: see [`select_gpu`]). Collective over
/// `world` (the node-local split runs first, on every rank, whatever comes after): then an
/// unreadable `DLPACK_MPI_DEVICE` is refused, the runtime is found (`simulate`: simulated,
/// with `opts.simulated_devices` devices), and the device chosen by `--gpu`, the variable or
/// the node-local rank is made the runtime's device, before any other use of the runtime.
pub fn rank_gpu(world: &SimpleCommunicator, simulate: bool, opts: GpuArgs) -> Result<Gpu, NoGpu> {
    let local = NodeLocal::of(world);
    // A value that is not UTF-8 is refused by name too (lossily shown), never read as unset.
    let env = std::env::var_os(DEVICE_ENV).map(|v| v.to_string_lossy().into_owned());
    let refused = |err: dlpack_mpi::Error| NoGpu::Refused(format!("cannot select a GPU: {err}"));
    parse_device_override(env.as_deref()).map_err(refused)?;
    let runtime =
        gpu_runtime(simulate.then_some(opts.simulated_devices)).map_err(NoGpu::NoRuntime)?;
    let selection =
        select_device_at(local, runtime, opts.ordinal, env.as_deref()).map_err(|err| {
            let by = match (opts.ordinal, env.as_deref()) {
                (Some(o), _) => format!("--gpu {o}"),
                (None, Some(v)) => format!("{DEVICE_ENV}={}", v.trim()),
                (None, None) => format!("node-local rank {} of {}", local.rank, local.size),
            };
            NoGpu::Refused(format!(
                "cannot use the GPU chosen by {by}: {err} (the runtime sees {} device(s))",
                runtime.device_count()
            ))
        })?;
    Ok(Gpu {
        runtime,
        simulated: simulate,
        selection,
    })
}

/// [`rank_gpu`] agreed by every rank: the GPU on every rank when every rank has one; else
/// on every rank the lowest rank's reason among those without a runtime, or when every rank
/// has one, among those whose device was refused ([`agreed`] words it). Collective.
pub fn select_gpu(world: &SimpleCommunicator, simulate: bool, opts: GpuArgs) -> Result<Gpu, NoGpu> {
    let mine = rank_gpu(world, simulate, opts);
    let missing = match &mine {
        Err(NoGpu::NoRuntime(why)) => Err(why.clone()),
        _ => Ok(()),
    };
    agreed(world, missing).map_err(NoGpu::NoRuntime)?;
    agreed(world, mine.map_err(|no| no.text().to_string())).map_err(NoGpu::Refused)
}

/// Why [`default_runtime`] is `None`: the build lacks feature `cuda`, no driver library
/// loads, it sees no device, or a driver call failed.
pub fn no_runtime_reason() -> String {
    #[cfg(feature = "cuda")]
    {
        use dlpack_mpi::Error;
        match dlpack_mpi::runtime::cuda::CudaRuntime::global() {
            // cuInit, cuDeviceGetCount or cuDeviceGet returned an error.
            Err(err @ Error::Cuda { .. }) => {
                format!("the CUDA driver loaded, but a driver call failed ({err})")
            }
            // The driver answered, and counted no device.
            Err(err @ Error::UnsupportedDevice { reason, .. }) if reason.contains("no device") => {
                format!("the CUDA driver loaded, and sees no device ({err})")
            }
            Err(err) => format!("no CUDA driver found ({err})"),
            Ok(_) => "the CUDA runtime is not available".into(),
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        "this build lacks feature `cuda` (build with `--features cuda`)".into()
    }
}

/// `result` on every rank when it is `Ok` on every rank; else the lowest failing rank's
/// error on every rank (prefixed `rank N: ` when that is not rank 0). Collective.
pub fn agreed<T>(world: &SimpleCommunicator, result: Result<T, String>) -> Result<T, String> {
    let mine = if result.is_err() {
        world.rank()
    } else {
        world.size()
    };
    let mut first = 0;
    world.all_reduce_into(&mine, &mut first, SystemOperation::min());
    if first == world.size() {
        return result;
    }
    let mut text = match &result {
        Err(m) if world.rank() == first => m.clone().into_bytes(),
        _ => Vec::new(),
    };
    let from = world.process_at_rank(first);
    let mut len = text.len() as u64;
    from.broadcast_into(&mut len);
    text.resize(len as usize, 0);
    if len > 0 {
        from.broadcast_into(&mut text[..]);
    }
    let text = String::from_utf8_lossy(&text).into_owned();
    Err(if first == 0 {
        text
    } else {
        format!("rank {first}: {text}")
    })
}

/// This process's rank in `MPI_COMM_WORLD` as the launcher announces it, before `MPI_Init`;
/// `None` when no launcher we know started it (Open MPI, MPICH/Hydra, PMIx, Slurm).
pub fn launcher_rank() -> Option<u32> {
    [
        "OMPI_COMM_WORLD_RANK",
        "PMIX_RANK",
        "PMI_RANK",
        "SLURM_PROCID",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok()?.parse().ok())
}

/// Whether a launcher started this process, read once before `MPI_Init` (a singleton
/// Open MPI process sets the launcher's variables itself during `MPI_Init`).
static UNDER_LAUNCHER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// Whether an MPI launcher (`mpirun`, `mpiexec`, `srun`) started this process.
pub fn under_launcher() -> bool {
    *UNDER_LAUNCHER.get_or_init(|| launcher_rank().is_some())
}

/// The exit status of a process whose `MPI_Finalize` did not return in time
/// ([`guard_finalize`]); the same as `check`'s for a case that ran past `--timeout`.
pub const FINALIZE_HUNG_STATUS: u8 = 3;

/// How long `MPI_Finalize` may take after `info` and `bench` (`check`: its `--timeout`, at
/// least [`FINALIZE_FLOOR`]).
pub const FINALIZE_LIMIT: Duration = Duration::from_secs(60);

/// The least time `MPI_Finalize` is given after `check`, whatever its `--timeout` (a
/// finalize takes 50–80 ms at 2 ranks here, longer at scale).
pub const FINALIZE_FLOOR: Duration = Duration::from_secs(5);

/// How much longer than the limit a rank that is inside `MPI_Finalize` waits before it
/// ends itself: a rank held up before its finalize ends first, and the launcher ends the
/// others. (Open MPI 4.1.4's `mpirun` crashed in `PMIx_server_finalize`, or hung there for
/// good, in 7 of 35 runs here when ranks inside `MPI_Finalize` ended themselves; never in
/// 32 when only the rank outside MPI did.)
const INSIDE_GRACE: Duration = Duration::from_secs(10);

/// The guard of [`guard_finalize`]: say [`FinalizeGuard::entering`] right before
/// `MPI_Finalize`.
pub struct FinalizeGuard {
    inside: Arc<AtomicBool>,
}

impl FinalizeGuard {
    /// The rank calls `MPI_Finalize` now.
    pub fn entering(&self) {
        self.inside.store(true, Ordering::SeqCst);
    }
}

/// Starts a thread that ends this process with [`FINALIZE_HUNG_STATUS`] if it is still
/// running `limit` after now (a rank not yet inside `MPI_Finalize`; [`INSIDE_GRACE`]
/// later for one inside it), saying so on standard error; the caller then calls
/// [`FinalizeGuard::entering`] and `MPI_Finalize` (drops the `Universe`), and a process
/// whose finalize returns exits as usual. A hang at the end of a job (a rank held up before
/// its finalize, which the others' finalize waits for; an MPI library's hang in it) so ends
/// with a line naming it instead of a job that never ends; what the command printed before
/// stands. The thread makes no MPI call (MPI_THREAD_SINGLE).
pub fn guard_finalize(rank: i32, limit: Duration) -> FinalizeGuard {
    use std::io::Write as _;
    let inside = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&inside);
    let watch = move || {
        std::thread::sleep(limit);
        let line = if seen.load(Ordering::SeqCst) {
            std::thread::sleep(INSIDE_GRACE);
            format!(
                "MPI_Finalize has not returned after {} s",
                seconds(limit + INSIDE_GRACE)
            )
        } else {
            format!(
                "not at MPI_Finalize {} s after the command ended",
                seconds(limit)
            )
        };
        let line = format!(
            "dlpack-mpi: rank {rank}: {line}: ending the process (exit status \
             {FINALIZE_HUNG_STATUS}); what was printed before stands\n"
        );
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().write_all(line.as_bytes());
        std::process::exit(i32::from(FINALIZE_HUNG_STATUS));
    };
    if let Err(err) = std::thread::Builder::new()
        .name("finalize-watch".into())
        .spawn(watch)
    {
        eprintln!("dlpack-mpi: rank {rank}: no thread to watch MPI_Finalize: {err}");
    }
    FinalizeGuard { inside }
}

/// `d` in seconds as people write them: `2`, `0.5`, `12.25`.
fn seconds(d: Duration) -> String {
    format!("{}", d.as_secs_f64())
}
