//! `dlpack-mpi info`.

use std::process::ExitCode;

use dlpack_mpi::runtime::DeviceRuntime;
use dlpack_mpi::transport::CudaAwareness;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use crate::common::{gather_text, library_line};
use crate::launch::{Gpu, GpuArgs, NoGpu};

/// Options of `info`.
#[derive(Debug, Clone, clap::Args)]
pub struct InfoArgs {
    /// Testing without a GPU: report a simulated GPU runtime and its device selection.
    #[arg(long, hide = true)]
    pub simulate_device: bool,
    /// `--gpu N`: which CUDA device each rank would use.
    #[command(flatten)]
    pub gpu: GpuArgs,
}

/// Prints, on rank 0: the MPI library version string, the MPI standard version, the thread
/// level, the number of ranks and their hosts, whether the MPI library is CUDA-aware and
/// which source said so, the GPU runtime (or why there is none), each rank's GPU device
/// (selected as `check` and `bench` select it, so its context is made) or why there is
/// none, the devices this build can use, and the features built.
pub fn run(world: &SimpleCommunicator, args: &InfoArgs) -> ExitCode {
    // Every rank's processor name, gathered so that rank 0 can say how many hosts there are.
    let name = mpi::environment::processor_name().unwrap_or_default();
    let hosts = gather_text(world, &name);
    let awareness = dlpack_mpi::transport::cuda_awareness();
    // Collective (the node-local split), on every rank.
    let gpu = crate::launch::rank_gpu(world, args.simulate_device, args.gpu);
    let devices = gather_text(world, &device_line(&gpu));
    let (Some(hosts), Some(devices)) = (hosts, devices) else {
        return ExitCode::SUCCESS;
    };
    print_mpi(world, hosts);
    let runtime =
        crate::launch::gpu_runtime(args.simulate_device.then_some(args.gpu.simulated_devices));
    print_gpu(awareness, runtime, &devices);
    print_features();
    ExitCode::SUCCESS
}

/// This rank's line of `GPU device:`: the selection, or why there is none.
fn device_line(gpu: &Result<Gpu, NoGpu>) -> String {
    match gpu {
        Ok(g) => g.selection.to_string(),
        Err(NoGpu::NoRuntime(_)) => "none (no GPU runtime)".into(),
        Err(NoGpu::Refused(why)) => format!("none: {why}"),
    }
}

/// The version, MPI library, standard, thread level, ranks and hosts lines (rank 0).
fn print_mpi(world: &SimpleCommunicator, mut hosts: Vec<String>) {
    hosts.sort();
    hosts.dedup();
    let (major, minor) = mpi::environment::version();
    println!("dlpack-mpi {}", env!("CARGO_PKG_VERSION"));
    println!("MPI library: {}", library_line());
    let built = dlpack_mpi::mpi_library::MpiLibrary::current();
    let dirs: Vec<String> = built
        .built_dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect();
    println!(
        "MPI built against: {} ({}); loaded from {}",
        if built.built.is_empty() {
            "an MPI whose mpi.h names no version"
        } else {
            &built.built
        },
        dirs.join(":"),
        built.file.as_ref().map_or_else(
            || "(the loader cannot say)".into(),
            |f| f.display().to_string()
        )
    );
    println!("MPI standard: {major}.{minor}");
    println!("half-precision reductions: {}", half_ops());
    println!(
        "thread level: {:?} (requested: single)",
        mpi::environment::threading_support()
    );
    println!(
        "ranks: {} on {} host(s): {}{}",
        world.size(),
        hosts.len(),
        hosts.join(", "),
        if crate::launch::under_launcher() {
            ""
        } else {
            " (not started by mpirun: a singleton)"
        }
    );
    println!(
        "DLPack: reads major version {}, header minor {}",
        dlpack_mpi::dlpack::MAJOR_VERSION,
        dlpack_mpi::dlpack::MINOR_VERSION
    );
}

/// How float16 and bfloat16 reduce here, and why ([`crate::common::half_reductions`], with
/// the rounding probe's findings), and what the other values of `DLPACK_MPI_HALF_OPS` do.
fn half_ops() -> String {
    use dlpack_mpi::settings::HalfOps;
    let setting = match dlpack_mpi::settings::half_ops() {
        Ok(HalfOps::Auto) => "auto",
        Ok(HalfOps::Library) => "library",
        Ok(HalfOps::Mpi) => "mpi",
        Err(_) => "?",
    };
    match crate::common::half_reductions(true) {
        Ok(words) if dlpack_mpi::comm::halfops::native_available() => format!(
            "{words}; DLPACK_MPI_HALF_OPS={setting} (auto: MPI's own where the rounding \
             probe matches dlpack-mpi's, which are correctly rounded; library: dlpack-mpi's \
             throughout; mpi: MPI's own wherever it has them, not guaranteed correctly \
             rounded)"
        ),
        Ok(words) => words,
        Err(e) => format!("unknown: {e}"),
    }
}

/// The CUDA-aware MPI, GPU runtime, GPU device and devices lines (rank 0). `devices`: every
/// rank's [`device_line`]; one line when they agree, else one per rank.
fn print_gpu(
    awareness: dlpack_mpi::Result<CudaAwareness>,
    runtime: Result<&'static dyn DeviceRuntime, String>,
    devices: &[String],
) {
    match awareness {
        Ok(a) => println!("CUDA-aware MPI: {a}"),
        Err(e) => println!("CUDA-aware MPI: unknown: {e}"),
    }
    match &runtime {
        Ok(r) => println!("GPU runtime: {}", r.describe()),
        Err(why) => println!("GPU runtime: none: {why}"),
    }
    match devices {
        [one] => println!("GPU device: {one}"),
        [first, rest @ ..] if rest.iter().all(|d| d == first) => {
            println!("GPU device: {first} (every rank)")
        }
        _ => {
            for (rank, d) in devices.iter().enumerate() {
                let lead = if rank == 0 {
                    "GPU device:"
                } else {
                    "           "
                };
                println!("{lead} rank {rank}: {d}");
            }
        }
    }
    println!(
        "devices: cpu (host memory), cuda-host (pinned host memory){}",
        if runtime.is_ok() {
            ", cuda (device memory: staged, or direct with a CUDA-aware MPI)"
        } else {
            "; cuda needs a GPU runtime"
        }
    );
}

/// The features line (rank 0).
fn print_features() {
    let python = if cfg!(feature = "python") {
        "python (Python producers through __dlpack__)"
    } else {
        "python not built"
    };
    let cuda = if cfg!(feature = "cuda") {
        "cuda (cudarc, driver loaded at run time)"
    } else {
        "cuda not built"
    };
    // The variable is named once: after the value, or inside the refusal.
    let packing = match dlpack_mpi::settings::packing() {
        Ok(p) => format!("{p:?} (DLPACK_MPI_PACKING)"),
        Err(e) => format!("refused: {e}"),
    };
    let agreement = match dlpack_mpi::settings::agreement() {
        Ok(a) => format!("{a:?} (DLPACK_MPI_AGREEMENT)"),
        Err(e) => format!("refused: {e}"),
    };
    println!("features: cli; {python}; {cuda}; packing: {packing}; agreement: {agreement}");
}
