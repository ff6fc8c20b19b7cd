//! `dlpack-mpi bench` (placeholder, being written).

use std::process::ExitCode;

use mpi::topology::SimpleCommunicator;

/// Options of `bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {}

/// Runs the benchmark.
pub fn run(_world: &SimpleCommunicator, _args: &BenchArgs) -> ExitCode {
    ExitCode::FAILURE
}
