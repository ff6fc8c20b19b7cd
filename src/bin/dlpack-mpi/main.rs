//! `dlpack-mpi`: tells whether an MPI stack moves DLPack tensors correctly (`check`), how fast
//! next to raw MPI (`bench`), and what it is (`info`). Start it under `mpirun`.
#![forbid(unsafe_code)]

mod bench;
mod check;
mod info;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Command line of `dlpack-mpi`.
#[derive(Debug, Parser)]
#[command(
    name = "dlpack-mpi",
    version,
    about = "DLPack tensors over MPI: check, bench, info"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the MPI library, its version, the thread level and the ranks.
    Info,
    /// Run every operation × dtype × length through dlpack-mpi and compare with values
    /// computed independently. Prints a line per case and `N passed, N failed, N skipped`.
    Check(check::CheckArgs),
    /// Ping-pong, all-reduce and strided sends through dlpack-mpi next to raw rsmpi (and
    /// packing by hand) on the same buffers.
    Bench(bench::BenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let Some(universe) = mpi::initialize() else {
        eprintln!("dlpack-mpi: MPI was already initialized");
        return ExitCode::from(2);
    };
    let world = universe.world();
    match cli.command {
        Command::Info => info::run(&world),
        Command::Check(args) => check::run(&world, &args),
        Command::Bench(args) => bench::run(&world, &args),
    }
}
