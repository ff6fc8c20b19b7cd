//! `dlpack-mpi info`.

use std::process::ExitCode;

use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

/// Prints the MPI library version string, the MPI standard version, the thread level and the
/// number of ranks (rank 0 only).
pub fn run(world: &SimpleCommunicator) -> ExitCode {
    if world.rank() == 0 {
        let (major, minor) = mpi::environment::version();
        let library =
            mpi::environment::library_version().unwrap_or_else(|e| format!("(unreadable: {e})"));
        println!("dlpack-mpi {}", env!("CARGO_PKG_VERSION"));
        println!(
            "MPI library: {}",
            library.trim_end_matches(['\0', '\n']).trim()
        );
        println!("MPI standard: {major}.{minor}");
        println!("thread level: {:?}", mpi::environment::threading_support());
        println!("ranks: {}", world.size());
        println!(
            "processor: {}",
            mpi::environment::processor_name().unwrap_or_default()
        );
        println!(
            "DLPack: reads major version {}, header minor {}",
            dlpack_mpi::dlpack::MAJOR_VERSION,
            dlpack_mpi::dlpack::MINOR_VERSION
        );
        println!("features: host memory (GPU and Python support not built)");
    }
    ExitCode::SUCCESS
}
