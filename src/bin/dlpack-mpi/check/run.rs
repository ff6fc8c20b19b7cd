//! Running the cases: each in its own [`CaseContext`], its verdict combined across ranks at
//! rank 0, which prints its line and decides whether `-x` stops the run for everyone; each
//! rank's [`Watch`] knows which case it is in, for `--timeout`.

use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use super::args::CheckArgs;
use super::context::{CaseContext, RunContext, Verdict};
use super::kind::Runner;
use super::matrix::{Comm, Op, LAYOUTS};
use super::placement::{Here, Offset, Placement};
use super::select::{Case, CaseIndex, Pattern};
use super::watchdog::{hang_rule, Watch};

/// The cases of `indices` (as [`super::select::agree_on_cases`] gives them) on the run's
/// `placements` (with the transport part of their names).
pub(super) fn cases<'k>(
    kinds: &'k [Box<dyn Runner>],
    indices: &[CaseIndex],
    placements: &[(Placement, String)],
) -> Vec<Case<'k>> {
    indices
        .iter()
        .map(|&[o, k, l, len, d, ob, of]| {
            let (place, transport) = placements[d as usize].clone();
            Case {
                op: Op::ALL[o as usize],
                kind: kinds[k as usize].as_ref(),
                layout: LAYOUTS[l as usize],
                len,
                place,
                transport,
                offset: Offset::decode([ob, of]),
            }
        })
        .collect()
}

/// The hidden faults that test the runner itself.
pub(super) struct Faults {
    /// `--inject-fault`: the last rank corrupts what it received in these cases.
    corrupt: Option<Pattern>,
    /// `--inject-hang`: this rank sleeps for ever at the start of these cases (or of the
    /// mismatch probes, `report::PROBES`, which the pattern `probes` matches).
    hang: Option<(Pattern, i32)>,
}

impl Faults {
    /// The faults of `args` at `size` ranks, or why they are refused.
    pub(super) fn new(args: &CheckArgs, size: i32) -> Result<Faults, String> {
        let corrupt = args.inject_fault.as_deref().map(Pattern::new).transpose();
        let hang = args.inject_hang.as_deref().map(|h| hang_rule(h, size));
        Ok(Faults {
            corrupt: corrupt.map_err(|why| format!("--inject-fault: {why}"))?,
            hang: hang
                .transpose()
                .map_err(|why| format!("--inject-hang: {why}"))?,
        })
    }

    /// Whether rank `rank` of `size` corrupts `case`; never returns if it hangs in it.
    fn of(&self, case: &Case<'_>, (rank, size): (i32, i32)) -> bool {
        if self.corrupt.is_none() && self.hang.is_none() {
            return false;
        }
        let name = case.name();
        self.hang_in(&name, rank);
        rank == size - 1 && self.corrupt.as_ref().is_some_and(|p| p.matches(&name))
    }

    /// Never returns if rank `rank` hangs in the stage named `name`.
    pub(super) fn hang_in(&self, name: &str, rank: i32) {
        if self
            .hang
            .as_ref()
            .is_some_and(|(p, r)| *r == rank && p.matches(name))
        {
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
    }
}

/// Runs `cases` in order (every rank), rank 0 printing a line per case and counting them in
/// `watch`'s tally; stops after the first failure with `-x`.
pub(super) fn run_cases(
    w: &SimpleCommunicator,
    args: &CheckArgs,
    (run, dc): (&RunContext, &Comm<'_>),
    cases: &[Case<'_>],
    (faults, watch): (&Faults, &Watch),
) {
    // On a terminal, a progress bar on standard error; elsewhere (pipes, files, mpirun's
    // forwarding) indicatif hides it and only the lines are printed.
    let bar = if w.rank() == 0 {
        let bar = indicatif::ProgressBar::new(cases.len() as u64);
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} {elapsed_precise} {wide_msg}",
        ) {
            bar.set_style(style);
        }
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    for (i, case) in cases.iter().enumerate() {
        let t0 = std::time::Instant::now();
        watch.enter_case(i, case);
        let corrupt = faults.of(case, (w.rank(), w.size()));
        let here = Here::of(case.place, case.offset, w.rank());
        let cx = CaseContext::new(run, here, case.layout, corrupt);
        let verdict = case.kind.run(&cx, dc, case.op, case.len);
        watch.verdicts();
        let agreed = agree(w, verdict);
        let seconds = t0.elapsed().as_secs_f64();
        let mut stop = false;
        if let Some(v) = agreed {
            let (line, failfast) = watch.with_tally(|t| t.add(args, case, cx.route(), v, seconds));
            stop = failfast;
            if let Some(line) = line {
                bar.suspend(|| println!("{line}"));
            }
            bar.inc(1);
        }
        // Rank 0 decides whether to stop; everyone follows.
        let mut stop_flag = i32::from(stop);
        w.process_at_rank(0).broadcast_into(&mut stop_flag);
        if stop_flag != 0 {
            break;
        }
    }
    watch.leave();
    bar.finish_and_clear();
}

/// Combines the verdicts of all ranks at rank 0: fail if any rank failed (with every failing
/// rank's message), else a known bug if any saw one, else skip if any skipped, else not
/// checkable if any found it so (a reduce's root), else not applicable if any found it so,
/// else pass.
fn agree(w: &SimpleCommunicator, v: Verdict) -> Option<Verdict> {
    let (level, msg) = match v {
        Verdict::Pass => (0i32, String::new()),
        Verdict::NotApplicable(m) => (1, m),
        Verdict::NotCheckable(m) => (2, m),
        Verdict::Skip(m) => (3, m),
        Verdict::KnownBug(m) => (4, m),
        Verdict::Fail(m) => (5, m),
    };
    let mut worst = 0i32;
    w.all_reduce_into(&level, &mut worst, SystemOperation::max());
    let mine = if level == worst { msg } else { String::new() };
    let messages = crate::common::gather_text(w, &mine)?;
    let text = grouped(messages.into_iter());
    Some(match worst {
        0 => Verdict::Pass,
        1 => Verdict::NotApplicable(text),
        2 => Verdict::NotCheckable(text),
        3 => Verdict::Skip(text),
        4 => Verdict::KnownBug(text),
        _ => Verdict::Fail(text),
    })
}

/// The ranks' messages as one: identical diagnoses grouped ("rank 2: x" and "rank 3: x"
/// become "ranks 2, 3: x"), empty ones left out, joined with `; `.
fn grouped(messages: impl Iterator<Item = String>) -> String {
    let mut groups: Vec<(Vec<String>, String)> = Vec::new();
    for s in messages {
        if s.is_empty() {
            continue;
        }
        // A message without a "rank N: " prefix is the same on every rank: keep it once.
        let (who, what) = match s.strip_prefix("rank ").and_then(|t| t.split_once(": ")) {
            Some((r, rest)) => (Some(r.to_string()), rest.to_string()),
            None => (None, s),
        };
        match groups.iter_mut().find(|(_, m)| *m == what) {
            Some((ranks, _)) => ranks.extend(who),
            None => groups.push((who.into_iter().collect(), what)),
        }
    }
    let groups: Vec<String> = groups
        .into_iter()
        .map(|(ranks, what)| match ranks.as_slice() {
            [] => what,
            [r] => format!("rank {r}: {what}"),
            _ => format!("ranks {}: {what}", ranks.join(", ")),
        })
        .collect();
    groups.join("; ")
}
