//! The harness of the multi-rank test binary `tests/mpi` (`harness = false`: a plain `main`
//! that initializes MPI once): every case runs on every rank, a case fails when it failed on
//! any rank, and rank 0 prints libtest-style lines (`test NAME ... ok`, `test result: …`).

/// `return Err(format!(…))` unless `cond` holds.
#[allow(unused_macros)]
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)*) => {
        if !$cond {
            return Err(format!($($fmt)*));
        }
    };
}

/// `return Err(…)` naming both expressions, their values and the line, unless they are equal.
#[allow(unused_macros)]
macro_rules! ensure_eq {
    ($left:expr, $right:expr) => {{
        let (l, r) = (&$left, &$right);
        if l != r {
            return Err(format!(
                "{} != {}: {:?} vs {:?} (line {})",
                stringify!($left),
                stringify!($right),
                l,
                r,
                line!()
            ));
        }
    }};
}

use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

/// What the command line selects (the binary's doc comment shows it in use).
#[derive(Default)]
pub struct Selection {
    /// `--suite NAME` (repeated, or `--suite A,B`): the suites to run; empty: every suite.
    pub suites: Vec<String>,
    /// Name filters: the arguments that are not flags. A case runs when its name contains
    /// one of them (every case when there are none).
    pub filters: Vec<String>,
    /// `--list`: print the names of the selected suites, run nothing.
    pub list: bool,
}

/// Reads the command line; other flags (`-…`) are ignored, as before `--suite` existed.
pub fn selection() -> Result<Selection, String> {
    let mut sel = Selection::default();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let names = if arg == "--suite" {
            args.next().ok_or("--suite needs a suite name")?
        } else if let Some(names) = arg.strip_prefix("--suite=") {
            names.to_string()
        } else {
            if arg == "--list" {
                sel.list = true;
            } else if !arg.starts_with('-') {
                sel.filters.push(arg);
            }
            continue;
        };
        sel.suites
            .extend(names.split(',').filter(|n| !n.is_empty()).map(String::from));
    }
    Ok(sel)
}

/// How a suite ended.
pub enum End {
    /// Its cases ran (those the filters selected): how many passed and failed.
    Ran { passed: usize, failed: usize },
    /// It ran no case and said why; `status` is the binary's exit status for that skip (0,
    /// or non-zero where a skip is a failure).
    Skipped { status: i32 },
}

/// Runs the `cases` that pass `filter` through `run`, agreeing on each verdict across the
/// ranks of `w`; a failure's message is printed by the rank that saw it. Returns `(passed,
/// failed)`.
pub fn run_cases<N: AsRef<str>, C>(
    w: &SimpleCommunicator,
    cases: impl IntoIterator<Item = (N, C)>,
    filter: &[String],
    mut run: impl FnMut(&C) -> Result<(), String>,
) -> (usize, usize) {
    let (mut passed, mut failed) = (0, 0);
    for (name, case) in cases {
        let name = name.as_ref();
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        let outcome = run(&case);
        if let Err(msg) = &outcome {
            // One write per line (stderr is unbuffered): the ranks' lines interleave.
            let line = format!("rank {}: {name}: {msg}\n", w.rank());
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        }
        let mine = i32::from(outcome.is_err());
        let mut any = 0i32;
        w.all_reduce_into(&mine, &mut any, SystemOperation::max());
        if w.rank() == 0 {
            println!("test {name} ... {}", if any == 0 { "ok" } else { "FAILED" });
        }
        if any == 0 {
            passed += 1;
        } else {
            failed += 1;
        }
    }
    (passed, failed)
}

/// Prints the result line on rank 0.
pub fn report(w: &SimpleCommunicator, passed: usize, failed: usize) {
    if w.rank() == 0 {
        println!();
        println!(
            "test result: {}. {passed} passed; {failed} failed; 0 ignored; 0 measured; 0 filtered out",
            if failed == 0 { "ok" } else { "FAILED" }
        );
    }
}
