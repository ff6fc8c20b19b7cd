//! The ranks agree on their arguments before any work: each rank's command line, parsed or
//! refused by clap, becomes one fingerprint of the subcommand, its options and the
//! `DLPACK_MPI_*` settings every rank must share, and the first collective of every
//! subcommand (`check`, `bench` and `info` alike, and a line clap refused or a `--help`)
//! compares them: one `MPI_Allreduce` of four `int64` with `MPI_MIN` (the fingerprint and
//! its complement, so that the minimum and the maximum come back; the lowest rank whose
//! arguments clap refused; the lowest rank that refused to start). Only when they differ
//! are the ranks' argument lines gathered, so that every rank can say which rank runs what
//! and where the lines differ, in words:
//!
//! ```text
//! dlpack-mpi: the ranks were started with different arguments, so none runs: rank 1 runs "bench --op latency", rank 0 runs "check"; the subcommand: bench on rank 1, check on rank 0 (every rank must run the same subcommand with the same options)
//! ```
//!
//! Excluded from the fingerprint: `--gpu N`, which is each rank's own (a rank of a
//! multi-GPU node picks its device), and the settings a rank may choose alone (packing, the
//! pool, CUDA-awareness, the device, the exchange API: they change no message).

use std::ffi::OsString;
use std::process::ExitCode;

use dlpack_mpi::settings;
use mpi::collective::SystemOperation;
use mpi::datatype::PartitionMut;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use mpi::Count;

/// What clap made of this rank's command line.
pub enum Parsed<C> {
    /// Parsed: the command.
    Run(C),
    /// Help or version asked for (or no subcommand given): clap's text, printed by rank 0
    /// when every rank asked the same, with clap's exit status.
    Show(clap::Error),
    /// Refused: clap's error.
    Refused(clap::Error),
}

/// This rank's side of the agreement.
pub struct Mine<C> {
    /// What clap made of the line.
    pub parsed: Parsed<C>,
    /// The arguments as given (after the program's name), quoted where a shell would need it.
    given: String,
    /// The canonical lines (`KEY\tVALUE`): the subcommand, every option of it with its
    /// value (defaults included), the settings every rank must share. For a line clap did
    /// not parse: the status and the line as given.
    canonical: Vec<String>,
    /// A refused line's message: [`crate::one_line`] of clap's error.
    refusal: String,
}

/// The settings that every rank must share: each changes what goes on the wire or how the
/// ranks meet (`settings` says "every rank must use the same" of each).
const SHARED_SETTINGS: [&str; 4] = [
    settings::AGREEMENT_ENV,
    settings::HALF_OPS_ENV,
    settings::BUCKET_ENV,
    settings::FIRST_BUCKET_ENV,
];

/// `name`'s value as the library reads it, lower case (`invalid: VALUE` when refused).
fn shared_setting(name: &str) -> String {
    let refused = |e: dlpack_mpi::Error| match e {
        dlpack_mpi::Error::InvalidSetting { value, .. } => format!("invalid: {value:?}"),
        other => format!("invalid: {other}"),
    };
    let value = match name {
        settings::AGREEMENT_ENV => settings::agreement().map(|v| format!("{v:?}")),
        settings::HALF_OPS_ENV => settings::half_ops().map(|v| format!("{v:?}")),
        settings::BUCKET_ENV => settings::bucket_bytes().map(|v| v.to_string()),
        _ => settings::first_bucket_bytes().map(|v| v.to_string()),
    };
    value.map_or_else(refused, |v| v.to_ascii_lowercase())
}

/// `arg` as a shell would need it written (single quotes around anything but plain words).
fn quoted(arg: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./,:=@%+".contains(c);
    if !arg.is_empty() && arg.chars().all(plain) {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

impl<C: clap::FromArgMatches> Mine<C> {
    /// Parses `argv` (the program's name first) with `command` into a `C` and reads the
    /// shared settings. `one_line` words a refusal.
    pub fn parse(
        mut command: clap::Command,
        argv: Vec<OsString>,
        one_line: fn(&clap::Error) -> String,
    ) -> Mine<C> {
        let given = argv
            .iter()
            .skip(1)
            .map(|a| quoted(&a.to_string_lossy()))
            .collect::<Vec<_>>()
            .join(" ");
        let parsed = command
            .try_get_matches_from_mut(argv)
            .and_then(|m| C::from_arg_matches(&m).map(|c| (c, m)));
        match parsed {
            Ok((run, matches)) => {
                let canonical = canonical(&command, &matches);
                Mine {
                    parsed: Parsed::Run(run),
                    given,
                    canonical,
                    refusal: String::new(),
                }
            }
            Err(err) => {
                use clap::error::ErrorKind;
                let show = matches!(
                    err.kind(),
                    ErrorKind::DisplayHelp
                        | ErrorKind::DisplayVersion
                        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
                );
                let status = if show { "show" } else { "refused" };
                let canonical = vec![format!("status\t{status}"), format!("line\t{given}")];
                let (parsed, refusal) = if show {
                    (Parsed::Show(err), String::new())
                } else {
                    let line = one_line(&err);
                    (Parsed::Refused(err), line)
                };
                Mine {
                    parsed,
                    given,
                    canonical,
                    refusal,
                }
            }
        }
    }
}

impl<C> Mine<C> {
    /// The fingerprint of the canonical lines (FNV-1a, 64 bits: the same on every rank).
    fn fingerprint(&self) -> i64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for line in &self.canonical {
            for b in line.bytes().chain([b'\n']) {
                h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
        }
        h as i64
    }
}

/// The canonical lines of a parsed command line: `command\tNAME`, then each option of the
/// subcommand (`--long\tVALUES`, values joined by `,`; `-` when absent), then the shared
/// settings.
fn canonical(command: &clap::Command, matches: &clap::ArgMatches) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some((name, sub)) = matches.subcommand() {
        lines.push(format!("command\t{name}"));
        if let Some(cmd) = command.find_subcommand(name) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                // `--gpu N` is each rank's own; help is no option.
                if ["help", "version", "ordinal"].contains(&id) {
                    continue;
                }
                let key = arg
                    .get_long()
                    .map(|l| format!("--{l}"))
                    .or_else(|| arg.get_short().map(|s| format!("-{s}")))
                    .unwrap_or_else(|| id.to_string());
                let value = match sub.try_get_raw(id) {
                    Ok(Some(raw)) => raw
                        .map(|v| v.to_string_lossy().into_owned())
                        .collect::<Vec<_>>()
                        .join(","),
                    _ => "-".to_string(),
                };
                lines.push(format!("{key}\t{value}"));
            }
        }
    }
    for name in SHARED_SETTINGS {
        lines.push(format!("{name}\t{}", shared_setting(name)));
    }
    lines
}

/// What the agreement decided, the same on every rank.
pub enum Agreed<C> {
    /// Every rank runs the same command: go on.
    Run(C),
    /// Stop with this status; what to say has been said.
    Exit(ExitCode),
}

/// The first collective of every subcommand: compares `mine` with every rank's, and
/// whether each rank refused to start (`start_refused`: it said why on standard error).
/// Collective over `world`; at one rank it decides alone.
///
/// The ranks stop with exit status 2 when clap refused a rank's line (that rank says clap's
/// message, the lowest other rank which rank was refused), when a rank refused to start, or
/// when the fingerprints differ (rank 0 says which rank runs what, and the difference). When
/// every rank asked for help or the version, rank 0 prints it.
pub fn agree<C>(world: &SimpleCommunicator, mine: Mine<C>, start_refused: bool) -> Agreed<C> {
    let (rank, size) = (world.rank(), world.size());
    let fp = mine.fingerprint();
    let refused = matches!(mine.parsed, Parsed::Refused(_));
    let votes: [i64; 4] = [
        fp,
        !fp,
        i64::from(if refused { rank } else { size }),
        i64::from(if start_refused { rank } else { size }),
    ];
    let mut agreed = [0i64; 4];
    world.all_reduce_into(&votes[..], &mut agreed[..], SystemOperation::min());
    let (same, first_refused, first_start) = (
        agreed[0] == !agreed[1],
        agreed[2] < i64::from(size),
        agreed[3] < i64::from(size),
    );
    if first_refused {
        let all = every_rank(world, &mine);
        say_refusals(rank, &all);
        return Agreed::Exit(ExitCode::from(2));
    }
    if first_start {
        return Agreed::Exit(ExitCode::from(2));
    }
    if !same {
        let all = every_rank(world, &mine);
        if rank == 0 {
            crate::say(&difference(&all));
        }
        return Agreed::Exit(ExitCode::from(2));
    }
    match mine.parsed {
        Parsed::Run(run) => Agreed::Run(run),
        Parsed::Show(err) => {
            if rank == 0 {
                let _ = err.print();
            }
            Agreed::Exit(ExitCode::from(u8::try_from(err.exit_code()).unwrap_or(2)))
        }
        // Counted above.
        Parsed::Refused(_) => Agreed::Exit(ExitCode::from(2)),
    }
}

/// One rank's side, as every rank learns it on the error path.
struct Theirs {
    /// Its line as given.
    given: String,
    /// Its canonical lines.
    canonical: Vec<String>,
    /// Its refusal (empty when clap parsed its line).
    refusal: String,
}

/// Separates the fields of a rank's side in [`every_rank`]'s message.
const FIELD: char = '\u{1e}';
/// Separates its canonical lines.
const LINE: char = '\u{1f}';

/// Every rank's [`Theirs`], in rank order, on every rank (collective: an all-gather of the
/// lengths, then of the texts).
fn every_rank<C>(world: &SimpleCommunicator, mine: &Mine<C>) -> Vec<Theirs> {
    let clean = |s: &str| s.replace([FIELD, LINE], " ");
    let canonical: Vec<String> = mine.canonical.iter().map(|l| clean(l)).collect();
    let text = format!(
        "{}{FIELD}{}{FIELD}{}",
        clean(&mine.given),
        clean(&mine.refusal),
        canonical.join(&LINE.to_string())
    );
    // At least one byte each (an empty slice's dangling address reads as MPI_IN_PLACE).
    let mut bytes = text.into_bytes();
    bytes.truncate(Count::MAX as usize - 1);
    bytes.push(b'\n');
    let len = bytes.len() as Count;
    let mut lens = vec![0 as Count; world.size() as usize];
    world.all_gather_into(&len, &mut lens[..]);
    let displs = crate::common::displacements(&lens);
    let mut all = vec![0u8; lens.iter().map(|&n| n as usize).sum()];
    {
        let mut part = PartitionMut::new(&mut all[..], &lens[..], &displs[..]);
        world.all_gather_varcount_into(&bytes[..], &mut part);
    }
    displs
        .iter()
        .zip(&lens)
        .map(|(&at, &n)| {
            let text = String::from_utf8_lossy(&all[at as usize..(at + n - 1) as usize]);
            let mut fields = text.split(FIELD);
            let given = fields.next().unwrap_or("").to_string();
            let refusal = fields.next().unwrap_or("").to_string();
            let canonical = fields
                .next()
                .unwrap_or("")
                .split(LINE)
                .map(str::to_string)
                .collect();
            Theirs {
                given,
                canonical,
                refusal,
            }
        })
        .collect()
}

/// `rank 3`, `ranks 0, 2`.
fn ranks(list: &[usize]) -> String {
    let each: Vec<String> = list.iter().map(usize::to_string).collect();
    match list {
        [one] => format!("rank {one}"),
        _ => format!("ranks {}", each.join(", ")),
    }
}

/// The ranks of `all` grouped by `key`, each group in rank order, groups in the order of
/// their first rank.
fn groups<K: PartialEq>(all: &[Theirs], key: impl Fn(&Theirs) -> K) -> Vec<Vec<usize>> {
    let mut out: Vec<(K, Vec<usize>)> = Vec::new();
    for (r, t) in all.iter().enumerate() {
        let k = key(t);
        match out.iter_mut().find(|(g, _)| *g == k) {
            Some((_, list)) => list.push(r),
            None => out.push((k, vec![r])),
        }
    }
    out.into_iter().map(|(_, list)| list).collect()
}

/// The lines of a stop because clap refused some rank's line: the lowest rank of each group
/// of ranks refused alike says clap's message (without a rank when every rank was refused
/// alike), and the lowest rank clap did not refuse says which ranks were.
fn say_refusals(rank: i32, all: &[Theirs]) {
    let me = rank as usize;
    let refused: Vec<usize> = (0..all.len())
        .filter(|&r| !all[r].refusal.is_empty())
        .collect();
    for group in groups(all, |t| (t.refusal.clone(), t.given.clone())) {
        if group[0] != me || all[me].refusal.is_empty() {
            continue;
        }
        let message = &all[me].refusal;
        if group.len() == all.len() {
            crate::say(message);
        } else {
            let text = message.strip_prefix("dlpack-mpi: ").unwrap_or(message);
            crate::say(&format!("dlpack-mpi: {}: {text}", ranks(&group)));
        }
    }
    let others: Vec<usize> = (0..all.len()).filter(|r| !refused.contains(r)).collect();
    if others.first() == Some(&me) {
        let lines: Vec<String> = refused
            .iter()
            .map(|&r| format!("rank {r}: \"{}\"", all[r].given))
            .collect();
        let (whose, stop) = match (refused.len(), others.len()) {
            (1, 1) => ("its own line says", "stops"),
            (1, _) => ("its own line says", "stop"),
            (_, 1) => ("their own lines say", "stops"),
            _ => ("their own lines say", "stop"),
        };
        crate::say(&format!(
            "dlpack-mpi: {} {stop}: the arguments of {} were refused ({}; {whose} why)",
            ranks(&others),
            ranks(&refused),
            lines.join(", ")
        ));
    }
}

/// The line that says how the ranks' arguments differ: which ranks run what (the odd ones
/// out first), then each difference from the largest group's lines (rank 0's on a tie),
/// in words.
fn difference(all: &[Theirs]) -> String {
    let mut groups = groups(all, |t| t.canonical.clone());
    // The reference: the largest group, the first on a tie (rank 0's).
    let reference = groups
        .iter()
        .enumerate()
        .max_by_key(|(i, g)| (g.len(), std::cmp::Reverse(*i)))
        .map_or(0, |(i, _)| i);
    let reference = groups.remove(reference);
    // The odd ones out first, the smallest groups before.
    groups.sort_by_key(|g| (g.len(), g[0]));
    let lead = |g: &[usize]| format!("{} {}", ranks(g), if g.len() == 1 { "runs" } else { "run" });
    let same_lines = all.iter().all(|t| t.given == all[0].given);
    let runs = if same_lines {
        format!("every rank runs \"{}\"", all[0].given)
    } else {
        groups
            .iter()
            .chain([&reference])
            .map(|g| format!("{} \"{}\"", lead(g), all[g[0]].given))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let theirs = &all[reference[0]];
    let mut differences = Vec::new();
    for g in &groups {
        let ours = &all[g[0]];
        for (key, here, there) in differing(&ours.canonical, &theirs.canonical) {
            differences.push(format!(
                "{}: {} on {}, {} on {}",
                words(&key),
                value(&key, &here),
                ranks(g),
                value(&key, &there),
                ranks(&reference)
            ));
        }
    }
    differences.dedup();
    format!(
        "dlpack-mpi: the ranks were started with different arguments, so none runs: {runs}; {} \
         (every rank must run the same subcommand with the same options and the same {})",
        differences.join("; "),
        SHARED_SETTINGS.join(", ")
    )
}

/// The key of a canonical line in words.
fn words(key: &str) -> String {
    match key {
        "command" => "the subcommand".into(),
        "status" | "line" => "the command line".into(),
        other => other.to_string(),
    }
}

/// A canonical value in words.
fn value(key: &str, value: &str) -> String {
    match (key, value) {
        ("status", "show") => "help or the version asked for".into(),
        ("status", "refused") => "refused".into(),
        ("status", _) => "a subcommand to run".into(),
        ("line", v) => format!("\"{v}\""),
        (_, "-") => "not given".into(),
        (k, v) if k.starts_with('-') => format!("\"{v}\""),
        (_, v) => v.to_string(),
    }
}

/// The keys whose values differ between two sets of canonical lines, with the values (`-`
/// where one lacks the key): the subcommand alone when it differs (then the options are
/// another command's).
fn differing(ours: &[String], theirs: &[String]) -> Vec<(String, String, String)> {
    let split = |l: &String| {
        let (k, v) = l.split_once('\t').unwrap_or((l.as_str(), ""));
        (k.to_string(), v.to_string())
    };
    let ours: Vec<(String, String)> = ours.iter().map(split).collect();
    let theirs: Vec<(String, String)> = theirs.iter().map(split).collect();
    let find = |lines: &[(String, String)], key: &str| {
        lines
            .iter()
            .find(|(k, _)| k == key)
            .map_or("-".to_string(), |(_, v)| v.clone())
    };
    // A line clap did not parse (help asked for) against one it did, or against another.
    let (sa, sb) = (find(&ours, "status"), find(&theirs, "status"));
    if sa != "-" || sb != "-" {
        let key = if sa == sb { "line" } else { "status" };
        let (a, b) = (find(&ours, key), find(&theirs, key));
        return vec![(key.into(), a, b)];
    }
    let (a, b) = (find(&ours, "command"), find(&theirs, "command"));
    if a != b {
        let no_command = |v: String| if v == "-" { "no subcommand".into() } else { v };
        return vec![("command".into(), no_command(a), no_command(b))];
    }
    let mut keys: Vec<&String> = ours.iter().map(|(k, _)| k).collect();
    for (k, _) in &theirs {
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys.into_iter()
        .filter_map(|k| {
            let (a, b) = (find(&ours, k), find(&theirs, k));
            (a != b).then(|| (k.clone(), a, b))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn theirs(given: &str, canonical: &[&str]) -> Theirs {
        Theirs {
            given: given.into(),
            canonical: canonical.iter().map(|s| s.to_string()).collect(),
            refusal: String::new(),
        }
    }

    #[test]
    fn the_difference_in_words() {
        let check = theirs("check", &["command\tcheck", "--dtype\t-"]);
        let bench = theirs("bench --op latency", &["command\tbench", "--op\tlatency"]);
        assert_eq!(
            difference(&[check, bench]),
            "dlpack-mpi: the ranks were started with different arguments, so none runs: rank 1 \
             runs \"bench --op latency\", rank 0 runs \"check\"; the subcommand: bench on rank \
             1, check on rank 0 (every rank must run the same subcommand with the same options \
             and the same DLPACK_MPI_AGREEMENT, DLPACK_MPI_HALF_OPS, DLPACK_MPI_BUCKET_BYTES, \
             DLPACK_MPI_FIRST_BUCKET_BYTES)"
        );
        let a = || theirs("check --dtype int8", &["command\tcheck", "--dtype\tint8"]);
        let b = theirs("check --dtype=int16", &["command\tcheck", "--dtype\tint16"]);
        let text = difference(&[a(), a(), b, a()]);
        assert!(
            text.contains(
                ": rank 2 runs \"check --dtype=int16\", ranks 0, 1, 3 run \"check --dtype \
                 int8\"; --dtype: \"int16\" on rank 2, \"int8\" on ranks 0, 1, 3 ("
            ),
            "{text}"
        );
        // Settings only: the same line everywhere.
        let c = |v: &str| {
            theirs(
                "check",
                &["command\tcheck", &format!("DLPACK_MPI_HALF_OPS\t{v}")],
            )
        };
        let text = difference(&[c("auto"), c("library")]);
        assert!(
            text.contains(
                ": every rank runs \"check\"; DLPACK_MPI_HALF_OPS: library on rank 1, auto on \
                 rank 0 ("
            ),
            "{text}"
        );
    }

    /// The fingerprint of `args` as the CLI parses them.
    fn fingerprint(args: &[&str]) -> i64 {
        let argv = std::iter::once("dlpack-mpi")
            .chain(args.iter().copied())
            .map(OsString::from)
            .collect();
        let command = <crate::Cli as clap::CommandFactory>::command();
        let mine: Mine<crate::Cli> = Mine::parse(command, argv, crate::one_line);
        mine.fingerprint()
    }

    /// The same options written differently are the same; `--gpu` is left out; any other
    /// option, its value or the subcommand differs.
    #[test]
    fn fingerprints_of_options() {
        let fp = fingerprint;
        assert_eq!(
            fp(&["check", "--len", "3,4"]),
            fp(&["check", "--len", "3", "--len", "4"])
        );
        assert_eq!(
            fp(&["check", "--op=bcast"]),
            fp(&["check", "--op", "bcast"])
        );
        assert_eq!(fp(&["check", "-q"]), fp(&["check", "--quiet"]));
        assert_eq!(fp(&["check", "--device", "cpu"]), fp(&["check"]));
        assert_eq!(fp(&["check"]), fp(&["check", "--gpu", "1"]));
        assert_ne!(fp(&["check"]), fp(&["check", "-v"]));
        assert_ne!(fp(&["check", "-v"]), fp(&["check", "-vv"]));
        assert_ne!(
            fp(&["check", "--len", "3,4"]),
            fp(&["check", "--len", "4,3"])
        );
        assert_ne!(fp(&["check"]), fp(&["bench"]));
        assert_ne!(fp(&["check"]), fp(&["check", "--help"]));
        assert_ne!(fp(&["check", "--frobnicate"]), fp(&["check"]));
    }

    #[test]
    fn lines_are_quoted_as_a_shell_needs() {
        assert_eq!(quoted("--dtype"), "--dtype");
        assert_eq!(quoted("*/float32/*"), "'*/float32/*'");
        assert_eq!(quoted("it's"), r"'it'\''s'");
        assert_eq!(quoted(""), "''");
    }
}
