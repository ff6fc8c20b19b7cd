//! `dlpack-mpi check` (placeholder, being written).

use std::process::ExitCode;

use mpi::topology::SimpleCommunicator;

/// Options of `check`.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {}

/// Runs the check matrix.
pub fn run(_world: &SimpleCommunicator, _args: &CheckArgs) -> ExitCode {
    ExitCode::FAILURE
}
