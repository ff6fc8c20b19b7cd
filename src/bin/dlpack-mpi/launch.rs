//! What `check` and `bench` share about the launch: the `--device` argument and the devices
//! it names, the GPU runtime, the launcher's rank, and errors agreed by every rank.
#![forbid(unsafe_code)]

use dlpack_mpi::device::{device_type, Device};
use dlpack_mpi::transport::{default_runtime, DeviceRuntime, SimulatedDevice};
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

    /// The DLPack device the tensors are labelled with (dlpack.h `DLDevice`).
    pub fn label(self) -> Device {
        match self {
            Dev::Cpu => Device::CPU,
            Dev::CudaHost => Device::new(device_type::CUDA_HOST, 0),
            Dev::Cuda => Device::new(device_type::CUDA, 0),
            Dev::CudaManaged => Device::new(device_type::CUDA_MANAGED, 0),
        }
    }

    /// Whether the tensors need a GPU runtime (streams, copies).
    pub fn needs_runtime(self) -> bool {
        matches!(self, Dev::Cuda | Dev::CudaManaged)
    }

    /// `cuda:0`-style: the name and the device ordinal.
    pub fn short(self) -> String {
        format!("{}:{}", self.name(), self.label().device_id)
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

/// The GPU runtime of `check` and `bench`.
#[derive(Clone, Copy)]
pub struct Gpu {
    /// The runtime: the CUDA driver, or a simulated device.
    pub runtime: &'static dyn DeviceRuntime,
    /// `--simulate-device`: CUDA tensors are labelled host memory.
    pub simulated: bool,
}

/// The GPU runtime: a [`SimulatedDevice`] with `--simulate-device`, else the CUDA driver
/// ([`default_runtime`]), else why there is none, in words.
pub fn gpu_runtime(simulate: bool) -> Result<Gpu, String> {
    if simulate {
        let sim: &'static SimulatedDevice = Box::leak(Box::new(SimulatedDevice::new()));
        return Ok(Gpu {
            runtime: sim,
            simulated: true,
        });
    }
    default_runtime()
        .map(|runtime| Gpu {
            runtime,
            simulated: false,
        })
        .ok_or_else(no_runtime_reason)
}

/// Why [`default_runtime`] is `None`: the build lacks feature `cuda`, or no driver loads.
pub fn no_runtime_reason() -> String {
    #[cfg(feature = "cuda")]
    {
        match dlpack_mpi::cuda::CudaRuntime::global() {
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
