//! `dlpack-mpi`: tells whether an MPI stack moves DLPack tensors correctly (`check`), how fast
//! next to raw MPI (`bench`), and what it is (`info`). Start it under `mpirun`.
// `unsafe` only in bench's GPU copy baseline (raw device ↔ pinned copies through the runtime).
#![deny(unsafe_code)]

mod agree;
mod bench;
mod check;
mod common;
mod info;
mod launch;

use std::process::ExitCode;

use agree::{Agreed, Mine, Parsed};
use clap::{CommandFactory, Parser, Subcommand};
use launch::under_launcher;

/// Command line of `dlpack-mpi`.
#[derive(Debug, Parser)]
#[command(
    name = "dlpack-mpi",
    version,
    about = "DLPack tensors over MPI: check, bench, info",
    after_help = "Start it under mpirun, e.g. `mpirun -n 4 dlpack-mpi check`. Every rank \
                  must be given the same subcommand and options (`--gpu` excepted)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the MPI library, its version, the thread level, CUDA awareness and why, the GPU
    /// runtime and each rank's GPU device, the devices seen and the features built.
    Info(info::InfoArgs),
    /// Run every operation × dtype × layout × length through dlpack-mpi and compare with
    /// values computed independently. Prints a line per case and `N passed, N failed, N
    /// skipped`.
    Check(check::CheckArgs),
    /// OSU-style latency, bandwidth and collectives through dlpack-mpi next to raw rsmpi on
    /// the same buffers, with the ratio; CSV and plot output.
    Bench(bench::BenchArgs),
}

/// A command-line error as one line: clap's first line without its `error: ` prefix, and a
/// pointer to the help of the subcommand given (`dlpack-mpi check --help`), else to
/// `dlpack-mpi --help`.
fn one_line(err: &clap::Error) -> String {
    let text = err.to_string();
    let first = text.lines().next().unwrap_or("invalid arguments");
    let first = first.strip_prefix("error: ").unwrap_or(first);
    let command = std::env::args()
        .nth(1)
        .filter(|a| ["check", "bench", "info"].contains(&a.as_str()))
        .map_or(String::new(), |a| format!(" {a}"));
    format!("dlpack-mpi: {first} (see `dlpack-mpi{command} --help`)")
}

fn main() -> ExitCode {
    under_launcher();
    // Before any setting is read: the CLI names unknown `DLPACK_MPI_*` variables itself
    // (refuse_at_start), so the library's own warning is not given.
    let unknown = dlpack_mpi::settings::unknown_env_names();
    let mine: Mine<Cli> = Mine::parse(Cli::command(), std::env::args_os().collect(), one_line);
    // A process no launcher started has no peer waiting for it: clap's word and exit, as
    // any program's. Under a launcher every rank goes on to the agreement, whatever clap
    // made of its line, so that no peer waits for a rank that left.
    if !under_launcher() {
        match &mine.parsed {
            Parsed::Show(err) => err.exit(),
            Parsed::Refused(err) => {
                say(&one_line(err));
                return ExitCode::from(2);
            }
            Parsed::Run(_) => {}
        }
    }
    let Some(universe) = mpi::initialize() else {
        eprintln!("dlpack-mpi: MPI was already initialized");
        return ExitCode::from(2);
    };
    let world = universe.world();
    let start_refused = match &mine.parsed {
        // `info` reports with bad settings too (it names each where it matters).
        Parsed::Run(cli) => {
            let strict = !matches!(cli.command, Command::Info(_));
            refuse_at_start(&world, strict, &unknown)
        }
        Parsed::Show(_) | Parsed::Refused(_) => false,
    };
    // The first collective of every subcommand.
    let cli = match agree::agree(&world, mine, start_refused) {
        Agreed::Run(cli) => cli,
        Agreed::Exit(code) => return code,
    };
    let rank = mpi::topology::Communicator::rank(&world);
    let (code, guard) = match cli.command {
        Command::Info(args) => {
            let code = info::run(&world, &args);
            (
                code,
                Some(launch::guard_finalize(rank, launch::FINALIZE_LIMIT)),
            )
        }
        Command::Check(args) => {
            let code = check::run(&world, &args);
            (code, check::before_finalize(&world, &args))
        }
        Command::Bench(args) => {
            let code = bench::run(&world, &args);
            (
                code,
                Some(launch::guard_finalize(rank, launch::FINALIZE_LIMIT)),
            )
        }
    };
    if let Some(guard) = &guard {
        guard.entering();
    }
    drop(universe); // MPI_Finalize
    code
}

/// Whether this rank refuses to start, saying why on standard error (each line prefixed
/// with the rank; the agreement, [`agree::agree`], then stops every rank with exit status
/// 2), because it
/// - loaded another MPI release than the one this binary was built against
///   ([`dlpack_mpi::mpi_library::MpiLibrary::check`]), unless
///   `DLPACK_MPI_ALLOW_MPI_MISMATCH=1` ([`dlpack_mpi::settings::allow_mpi_mismatch`]);
/// - or, with `strict` (`check` and `bench`), holds a `DLPACK_MPI_*` setting that is not one
///   of its values ([`dlpack_mpi::settings::check_all`]: a typo would otherwise fail every
///   case that reads it), or a `DLPACK_MPI_*` variable that is no setting (`unknown`,
///   [`dlpack_mpi::settings::unknown_env_names`]: a misspelt name would otherwise be
///   ignored), unless `DLPACK_MPI_UNKNOWN_NAMES=ignore`; without `strict` they are said and
///   the command goes on.
fn refuse_at_start(
    world: &mpi::topology::SimpleCommunicator,
    strict: bool,
    unknown: &[dlpack_mpi::settings::UnknownName],
) -> bool {
    use dlpack_mpi::mpi_library::MpiLibrary;
    use dlpack_mpi::settings::UNKNOWN_NAMES_ENV;
    use mpi::topology::Communicator;
    let rank = world.rank();
    // The library's own setting (its operations refuse a mismatch unless it is set); an
    // invalid value is reported with the other settings below.
    let allowed = dlpack_mpi::settings::allow_mpi_mismatch().unwrap_or(false);
    let library = MpiLibrary::current().check();
    if let Err(err) = &library {
        // The error names the override itself.
        let action = if allowed {
            " (it is set: running anyway)"
        } else {
            ""
        };
        say(&format!("dlpack-mpi: rank {rank}: {err}{action}"));
    }
    let settings = dlpack_mpi::settings::check_all();
    for err in &settings {
        say(&format!("dlpack-mpi: rank {rank}: {err}"));
    }
    let action = if strict {
        format!("{UNKNOWN_NAMES_ENV}=ignore runs it anyway")
    } else {
        "ignored".to_string()
    };
    for name in unknown {
        say(&format!("dlpack-mpi: rank {rank}: {name}; {action}"));
    }
    (library.is_err() && !allowed) || (strict && !(settings.is_empty() && unknown.is_empty()))
}

/// `line` and a newline on standard error in one write, so that the lines of ranks that
/// say something at the same moment do not interleave (`eprintln!` writes its pieces
/// one by one).
fn say(line: &str) {
    use std::io::Write as _;
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch::DeviceArg;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("dlpack-mpi").chain(args.iter().copied()))
    }

    /// The command `subcommand args` parsed.
    fn command(subcommand: &str, args: &[&str]) -> Command {
        let all: Vec<&str> = std::iter::once(subcommand)
            .chain(args.iter().copied())
            .collect();
        parse(&all).expect("parses").command
    }

    fn check(args: &[&str]) -> check::CheckArgs {
        match command("check", args) {
            Command::Check(a) => a,
            other => panic!("not check: {other:?}"),
        }
    }

    fn bench(args: &[&str]) -> bench::BenchArgs {
        match command("bench", args) {
            Command::Bench(a) => a,
            other => panic!("not bench: {other:?}"),
        }
    }

    #[test]
    fn check_defaults() {
        let a = check(&[]);
        assert!(a.include.is_empty() && a.exclude.is_empty());
        assert_eq!(a.len, vec![0, 1, 7, 1000, 65_536]);
        assert_eq!(a.device, check::DeviceChoice::One(DeviceArg::Cpu));
        assert_eq!(a.offset, [check::OffsetArg::Bytes(0)]);
        assert_eq!(a.producer, check::Producer::Auto);
        assert_eq!(a.transport, dlpack_mpi::transport::Transport::Auto);
        assert!(!a.failfast && !a.quiet && a.verbose == 0 && !a.list);
        assert!(a.junit.is_none() && a.json.is_none());
    }

    #[test]
    fn check_flags() {
        let a = check(&[
            "-k",
            "allreduce/",
            "--include",
            "*/float32/*",
            "-e",
            "scalar",
            "--exclude",
            "x",
            "-x",
            "-v",
            "--list",
            "--device",
            "cuda-managed",
            "--producer",
            "numpy",
            "--transport",
            "staged",
            "--dtype",
            "int8,float32",
            "--dtype",
            "bool",
            "--op",
            "bcast",
            "--layout",
            "step,negative",
            "--len",
            "3,5",
            "--junit",
            "out.xml",
            "--json",
            "out.json",
        ]);
        assert_eq!(a.include, ["allreduce/", "*/float32/*"]);
        assert_eq!(a.exclude, ["scalar", "x"]);
        assert!(a.failfast && a.verbose == 1 && a.list && !a.quiet);
        assert_eq!(a.device, check::DeviceChoice::One(DeviceArg::CudaManaged));
        assert_eq!(a.producer, check::Producer::Numpy);
        assert_eq!(a.transport, dlpack_mpi::transport::Transport::Staged);
        assert_eq!(a.dtype, ["int8", "float32", "bool"]);
        assert_eq!(a.op, ["bcast"]);
        assert_eq!(a.layout, ["step", "negative"]);
        assert_eq!(a.len, [3, 5]);
        assert_eq!(a.junit.as_deref(), Some(std::path::Path::new("out.xml")));
        assert_eq!(a.json.as_deref(), Some(std::path::Path::new("out.json")));
        assert!(check(&["-q"]).quiet);
    }

    /// `--device SEND:RECV` (either side `all`), `mpich-all`, and `--offset` lists with
    /// `all`; a side or an offset that is no such value is refused, naming it.
    #[test]
    fn check_placement_flags() {
        use crate::launch::Dev;
        use check::{DeviceChoice as C, OffsetArg as O};
        let device = |v: &str| check(&["--device", v]).device;
        assert_eq!(
            device("cpu:cuda-host"),
            C::Pair(Some(Dev::Cpu), Some(Dev::CudaHost))
        );
        assert_eq!(device("cuda:cpu"), C::Pair(Some(Dev::Cuda), Some(Dev::Cpu)));
        assert_eq!(device("all:cuda"), C::Pair(None, Some(Dev::Cuda)));
        assert_eq!(device("mpich-all"), C::MpichAll);
        assert_eq!(device("all"), C::One(DeviceArg::All));
        assert!(C::Pair(None, Some(Dev::Cuda)).is_sweep() && C::MpichAll.is_sweep());
        assert!(!C::Pair(Some(Dev::Cuda), Some(Dev::Cpu)).is_sweep());
        assert_eq!(C::Pair(None, Some(Dev::Cuda)).name(), "all:cuda");
        let offsets = check(&["--offset", "0,3", "--offset", "all"]).offset;
        assert_eq!(offsets, [O::Bytes(0), O::Bytes(3), O::All]);
        for bad in [
            &["check", "--device", "cpu:tpu"][..],
            &["check", "--device", "cpu:"],
            &["check", "--device", "mpich"],
            &["check", "--offset", "65537"],
            &["check", "--offset", "-1"],
            &["check", "--offset", "three"],
        ] {
            let err = parse(bad).expect_err("refused");
            let line = one_line(&err);
            assert!(line.contains(&format!("`{}`", bad[2])), "{bad:?}: {line}");
            assert!(!line.contains('\n'), "{bad:?}: {line}");
        }
    }

    #[test]
    fn check_refuses_bad_flags_in_one_line() {
        for bad in [
            &["check", "--frobnicate"][..],
            &["check", "-q", "-v"],
            &["check", "--device", "tpu"],
            &["check", "--len", "seven"],
            &["check", "--transport"],
            &["bench", "--op", "pingpang"],
            &["bench", "--sizes", "12Q"],
            &["bench", "--iters", "0"],
        ] {
            let err = parse(bad).expect_err("refused");
            let line = one_line(&err);
            assert!(!line.contains('\n'), "{bad:?}: {line}");
            assert!(line.starts_with("dlpack-mpi: "), "{bad:?}: {line}");
            assert!(!line.contains("error: "), "{bad:?}: {line}");
        }
        let err = parse(&["check", "--device", "tpu"]).unwrap_err();
        assert!(one_line(&err).contains("tpu"), "{}", one_line(&err));
        // A negative ordinal is a refused value, not an unknown flag.
        let err = parse(&["check", "--gpu", "-1"]).unwrap_err();
        assert!(
            one_line(&err).contains("'-1' for '--gpu <N>'"),
            "{}",
            one_line(&err)
        );
    }

    #[test]
    fn gpu_flag_on_check_bench_and_info() {
        assert_eq!(check(&[]).gpu.ordinal, None);
        assert_eq!(check(&["--gpu", "1"]).gpu.ordinal, Some(1));
        assert_eq!(check(&[]).gpu.simulated_devices, 1);
        assert_eq!(bench(&["--gpu", "3"]).gpu.ordinal, Some(3));
        match parse(&["info", "--gpu", "2", "--simulate-device"])
            .expect("parses")
            .command
        {
            Command::Info(a) => assert!(a.gpu.ordinal == Some(2) && a.simulate_device),
            other => panic!("not info: {other:?}"),
        }
        assert!(parse(&["check", "--gpu", "x"]).is_err());
        assert!(parse(&["check", "--simulate-device", "--simulated-devices", "0"]).is_err());
    }

    #[test]
    fn bench_flags() {
        let a = bench(&[]);
        assert_eq!(a.op, bench::Op::All);
        assert_eq!(a.device, DeviceArg::Cpu);
        assert_eq!(a.layout, bench::BenchLayout::Contiguous);
        assert!(a.sizes.is_none() && a.csv.is_none() && a.plot.is_none());
        let a = bench(&[
            "--op",
            "bandwidth",
            "--sizes",
            "8,1K,64KiB,2M",
            "--iters",
            "7",
            "--rounds",
            "3",
            "--layout",
            "step",
            "--csv",
            "b.csv",
            "--plot",
            "b.svg",
        ]);
        assert_eq!(a.op, bench::Op::Bandwidth);
        assert_eq!(
            a.sizes.as_ref().map(|s| s.0.as_slice()),
            Some(&[8u64, 1024, 64 << 10, 2 << 20][..])
        );
        assert_eq!((a.iters, a.rounds), (7, 3));
        assert_eq!(a.layout, bench::BenchLayout::Step);
        assert_eq!(a.csv.as_deref(), Some(std::path::Path::new("b.csv")));
        assert_eq!(a.plot.as_deref(), Some(std::path::Path::new("b.svg")));
        // --max-size takes the units of --sizes (it took plain bytes only).
        assert_eq!(bench(&["--max-size", "1M"]).max_size, Some(1 << 20));
        assert_eq!(bench(&["--max-size", "1048576"]).max_size, Some(1 << 20));
        for bad in ["4", "6", "2G", "1X"] {
            assert!(parse(&["bench", "--max-size", bad]).is_err(), "{bad}");
        }
        // The OSU name and the older one.
        assert_eq!(bench(&["--op", "pingpong"]).op, bench::Op::Latency);
        for op in ["latency", "allreduce", "allgatherv", "alltoall", "strided"] {
            bench(&["--op", op]);
        }
    }
}
