//! `dlpack-mpi info`.

use std::process::ExitCode;

use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

/// Prints, on rank 0: the MPI library version string, the MPI standard version, the thread
/// level, the number of ranks and their hosts, whether the MPI library is CUDA-aware and
/// which source said so, the GPU runtime (or why there is none), the devices this build can
/// use, and the features built.
pub fn run(world: &SimpleCommunicator) -> ExitCode {
    // Every rank's processor name, gathered so that rank 0 can say how many hosts there are.
    let name = mpi::environment::processor_name().unwrap_or_default();
    let mut mine = [0u8; 256];
    let n = name.len().min(mine.len());
    mine[..n].copy_from_slice(&name.as_bytes()[..n]);
    let root = world.process_at_rank(0);
    let awareness = dlpack_mpi::transport::cuda_awareness();
    if world.rank() != 0 {
        root.gather_into(&mine[..]);
        return ExitCode::SUCCESS;
    }
    let mut all = vec![0u8; 256 * world.size() as usize];
    root.gather_into_root(&mine[..], &mut all[..]);
    let mut hosts: Vec<String> = all
        .chunks_exact(256)
        .map(|c| {
            String::from_utf8_lossy(c)
                .trim_end_matches('\0')
                .to_string()
        })
        .collect();
    hosts.sort();
    hosts.dedup();

    let (major, minor) = mpi::environment::version();
    let library =
        mpi::environment::library_version().unwrap_or_else(|e| format!("(unreadable: {e})"));
    println!("dlpack-mpi {}", env!("CARGO_PKG_VERSION"));
    // MPICH's version string goes on for lines of configure options: the first line names
    // the library and its version.
    println!(
        "MPI library: {}",
        library
            .trim_end_matches(['\0', '\n'])
            .trim()
            .lines()
            .next()
            .unwrap_or("")
    );
    println!("MPI standard: {major}.{minor}");
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
    match awareness {
        Ok(a) => println!("CUDA-aware MPI: {a}"),
        Err(e) => println!("CUDA-aware MPI: unknown: {e}"),
    }
    let runtime = dlpack_mpi::transport::default_runtime();
    match runtime {
        Some(r) => println!("GPU runtime: {}", r.describe()),
        None => println!("GPU runtime: none: {}", crate::launch::no_runtime_reason()),
    }
    println!(
        "devices: cpu (host memory), cuda-host (pinned host memory){}",
        if runtime.is_some() {
            ", cuda (device memory: staged, or direct with a CUDA-aware MPI)"
        } else {
            "; cuda needs a GPU runtime"
        }
    );
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
    let packing = match dlpack_mpi::comm::packing() {
        Ok(p) => format!("{p:?}"),
        Err(e) => format!("refused: {e}"),
    };
    println!("features: cli; {python}; {cuda}; packing: {packing} (DLPACK_MPI_PACKING)");
    ExitCode::SUCCESS
}
