//! What `check`, `bench` and `info` share: the MPI library's name, the one JSON writer,
//! the reports' files tried before any work, whether every rank agrees, per-rank counts to displacements, every rank's text gathered
//! to rank 0, and the exit status rank 0 decides. Uses nothing of `check/` or `bench/`.

use std::process::ExitCode;

use mpi::collective::SystemOperation;
use mpi::datatype::PartitionMut;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use mpi::Count;

/// The MPI library's version string (`MPI_Get_library_version`), trimmed: `check -vv` and
/// the reports show it whole (MPICH's goes on for lines of configure options);
/// `(unreadable: …)` when it cannot be read.
pub fn library_version() -> String {
    match mpi::environment::library_version() {
        Ok(s) => s.trim_end_matches(['\0', '\n']).trim().to_string(),
        Err(e) => format!("(unreadable: {e})"),
    }
}

/// The first line of [`library_version`], which names the library and its version.
pub fn library_line() -> String {
    library_version()
        .lines()
        .next()
        .unwrap_or("")
        .trim()
        .to_string()
}

/// Writes `value` to `path` as pretty-printed JSON with a newline at the end; `Err` names
/// the file and what went wrong.
pub fn write_json<T: serde::Serialize + ?Sized>(
    path: &std::path::Path,
    value: &T,
) -> Result<(), String> {
    use std::io::Write as _;
    let fail = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let file = std::fs::File::create(path).map_err(|e| fail(&e))?;
    let mut w = std::io::BufWriter::new(file);
    serde_json::to_writer_pretty(&mut w, value).map_err(|e| fail(&e))?;
    writeln!(w).and_then(|()| w.flush()).map_err(|e| fail(&e))
}

/// Rank 0 opens each report file of `reports` (`(flag, path)`: `("--json", path)`) for
/// writing, creating it when it does not exist (an existing file is left as it is until the
/// report is written), so that a path that cannot be written is found before any work, not
/// after it; `Err` on every rank names the first such flag, path and the system's error.
/// Collective (rank 0's outcome broadcast; only rank 0 writes reports).
pub fn try_reports(
    world: &SimpleCommunicator,
    reports: &[(&str, Option<&std::path::Path>)],
) -> Result<(), String> {
    let mine = if world.rank() == 0 {
        reports
            .iter()
            .filter_map(|(flag, path)| path.map(|p| (flag, p)))
            .try_for_each(|(flag, path)| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(path)
                    .map(drop)
                    .map_err(|e| format!("cannot write {flag} {}: {e}", path.display()))
            })
    } else {
        Ok(())
    };
    crate::launch::agreed(world, mine)
}

/// Whether `ok` holds on every rank (collective).
pub fn all_ranks(world: &SimpleCommunicator, ok: bool) -> bool {
    let mut all = 0i32;
    world.all_reduce_into(&i32::from(ok), &mut all, SystemOperation::min());
    all == 1
}

/// The displacement of each block of `counts` laid end to end: 0, then the running sums.
pub fn displacements<T>(counts: &[T]) -> Vec<T>
where
    T: Copy + Default + std::ops::Add<Output = T>,
{
    counts
        .iter()
        .scan(T::default(), |at, &n| {
            let here = *at;
            *at = here + n;
            Some(here)
        })
        .collect()
}

/// Every rank's `text`, in rank order, on rank 0; `None` on the others. Collective.
pub fn gather_text(world: &SimpleCommunicator, text: &str) -> Option<Vec<String>> {
    // Every contribution is at least one byte (a trailing newline): an empty Rust slice has
    // the dangling address 0x1, which Open MPI reads as MPI_IN_PLACE.
    let keep = text.len().min(Count::MAX as usize - 1);
    let mut mine = text.as_bytes()[..keep].to_vec();
    mine.push(b'\n');
    let len = mine.len() as Count;
    let root = world.process_at_rank(0);
    if world.rank() != 0 {
        root.gather_into(&len);
        root.gather_varcount_into(&mine[..]);
        return None;
    }
    let mut lens: Vec<Count> = vec![0; world.size() as usize];
    root.gather_into_root(&len, &mut lens[..]);
    let displs = displacements(&lens);
    let mut all = vec![0u8; lens.iter().map(|&n| n as usize).sum()];
    {
        let mut part = PartitionMut::new(&mut all[..], &lens[..], &displs[..]);
        root.gather_varcount_into_root(&mine[..], &mut part);
    }
    let texts = displs.iter().zip(&lens).map(|(&at, &n)| {
        String::from_utf8_lossy(&all[at as usize..(at + n - 1) as usize]).into_owned()
    });
    Some(texts.collect())
}

/// Rank 0's `status` on every rank, as the exit status: 0 success, 1 failure, anything
/// else 2. Collective.
pub fn agreed_exit(world: &SimpleCommunicator, status: i32) -> ExitCode {
    let mut status = status;
    world.process_at_rank(0).broadcast_into(&mut status);
    match status {
        0 => ExitCode::SUCCESS,
        1 => ExitCode::FAILURE,
        _ => ExitCode::from(2),
    }
}

/// The half-precision operations of one dtype grouped by how they reduce, in the order sum,
/// prod, min, max.
type HalfGroups = Vec<(
    dlpack_mpi::comm::halfops::Choice,
    Vec<dlpack_mpi::dtype::ReduceOp>,
)>;

/// The operations of the half dtype `dtype` grouped by `halfops::choice`.
fn half_groups(dtype: dlpack_mpi::dtype::DType) -> Result<HalfGroups, String> {
    use dlpack_mpi::dtype::ReduceOp;
    let mut groups: HalfGroups = Vec::new();
    for op in [
        ReduceOp::Sum,
        ReduceOp::Product,
        ReduceOp::Min,
        ReduceOp::Max,
    ] {
        let choice = dlpack_mpi::comm::halfops::choice(dtype, op).map_err(|e| e.to_string())?;
        match groups.iter_mut().find(|(c, _)| *c == choice) {
            Some((_, members)) => members.push(op),
            None => groups.push((choice, vec![op])),
        }
    }
    Ok(groups)
}

/// How float16 and bfloat16 reduce in this process (`dlpack_mpi::comm::halfops::choice`),
/// in words: the operations of each dtype grouped by form and reason, both dtypes in one
/// group where they agree (`float16 and bfloat16 sum, prod, min, max by dlpack-mpi's (…)`).
/// With `detail`, a group that the rounding probe sent to dlpack-mpi's operations also says
/// what it found (`MPIX_BFLOAT16 with MPI_SUM: 95 of 1032 results differ …`). Rank-local:
/// the probe needs MPI initialized. `Err`: the setting is invalid.
pub fn half_reductions(detail: bool) -> Result<String, String> {
    use dlpack_mpi::comm::halfops::{self, Choice};
    use dlpack_mpi::dtype::{code, DType, ReduceOp};
    let (f16, bf16) = (DType::new(code::FLOAT, 16), DType::new(code::BFLOAT, 16));
    let per_dtype = [(f16, half_groups(f16)?), (bf16, half_groups(bf16)?)];
    let names = |ops: &[ReduceOp]| ops.iter().map(|o| o.name()).collect::<Vec<_>>().join(", ");
    let outcomes = halfops::probe().unwrap_or(&[]);
    // One group's words: `dtypes` (their name), its operations, the choice and, with
    // `detail`, what the probe found where it decided against MPI's own.
    let group = |dtypes: &[DType], name: &str, choice: Choice, members: &[ReduceOp]| {
        let w = format!("{name} {} by {choice}", names(members));
        if !(detail && choice == Choice::ProbeDiffers) {
            return w;
        }
        let found: Vec<String> = outcomes
            .iter()
            .filter(|o| dtypes.contains(&o.dtype) && members.contains(&o.op))
            .map(|o| o.to_string())
            .collect();
        format!("{w}: {}", found.join("; "))
    };
    let words: Vec<String> = if per_dtype[0].1 == per_dtype[1].1 {
        per_dtype[0]
            .1
            .iter()
            .map(|(c, o)| group(&[f16, bf16], "float16 and bfloat16", *c, o))
            .collect()
    } else {
        per_dtype
            .iter()
            .flat_map(|(d, groups)| {
                groups
                    .iter()
                    .map(|(c, o)| group(&[*d], &d.to_string(), *c, o))
            })
            .collect()
    };
    Ok(words.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn displacements_are_the_running_sums_before_each_block() {
        assert_eq!(displacements(&[3i64, 0, 2, 5]), [0, 3, 3, 5]);
        assert_eq!(displacements::<i32>(&[]), Vec::<i32>::new());
    }
}
