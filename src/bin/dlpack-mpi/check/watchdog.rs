//! `--timeout`: a watchdog thread on every rank that knows where its rank is (the mismatch
//! probes or a case; running it, or done with it and waiting for the other ranks' verdicts;
//! since when) and ends the run when the rank has been there longer than the limit, with
//! the report of the cases before it and exit status [`TIMED_OUT_STATUS`].
//!
//! # How rank 0 learns where the others are
//!
//! The CLI initializes MPI at `MPI_THREAD_SINGLE` (`mpi::initialize`; `dlpack-mpi info`
//! prints the level), so the watchdog makes no MPI call; and the main thread of a waiting
//! rank is inside an MPI call that it cannot leave. So when a rank's limit passes, its
//! watchdog writes where it is (a [`Seen`]) to a file of its own in a directory rank 0
//! named at the start (under rank 0's temporary directory; nothing is written unless a
//! limit passes) and says it on its own standard error. Rank 0's watchdog waits up to
//! [`GRACE`] for every rank's file (the others' limits pass within milliseconds of rank
//! 0's: a rank starts a case after rank 0's go-ahead), prints the `TIMEOUT` verdict, writes
//! `--json`/`--junit`, and exits with [`TIMED_OUT_STATUS`], which makes the launcher end
//! the job (Open MPI 4.1's `mpirun` then exits with that status). A rank whose file does
//! not come in time (stopped, or on a host that does not see rank 0's temporary directory)
//! is named as "no word"; its own line on standard error, which the launcher forwards,
//! still says where it was. The other ranks wait for rank 0 to end the job and exit with
//! the same status themselves only if it does not ([`FALLBACK`]).

use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use super::args::CheckArgs;
use super::report::{ranks_text, seconds_text, Tally, TimedOut, PROBES, TIMED_OUT_STATUS};
use super::select::{Case, Pattern};

/// How often a watchdog looks at its rank.
const TICK: Duration = Duration::from_millis(100);

/// How long rank 0 waits for the other ranks' files after its own limit passed.
const GRACE: Duration = Duration::from_secs(2);

/// How long past its limit and [`GRACE`] a rank other than 0 waits for rank 0 to end the
/// job before it exits itself.
const FALLBACK: Duration = Duration::from_secs(10);

/// What a rank is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// The mismatch probes, before the cases.
    Probes,
    /// The case of this index in the run's list.
    Case(usize),
}

/// How far a rank is in its [`Stage`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Making tensors, calling MPI, comparing.
    Running,
    /// Done here: combining the verdicts across ranks (waiting for the others).
    Verdicts,
}

impl Phase {
    fn words(self) -> &'static str {
        match self {
            Phase::Running => "running it",
            Phase::Verdicts => "done with it, waiting for the other ranks' verdicts",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Phase::Running => "running",
            Phase::Verdicts => "verdicts",
        }
    }
}

/// Where a rank was when its limit passed, as its watchdog writes it for rank 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Seen {
    pub stage: Stage,
    pub phase: Phase,
    /// The case's name (or [`PROBES`]).
    pub name: String,
}

impl Seen {
    /// The file's text: `case 3 running` (or `probes verdicts`), then the name.
    fn text(&self) -> String {
        let stage = match self.stage {
            Stage::Probes => "probes".to_string(),
            Stage::Case(i) => format!("case {i}"),
        };
        format!("{stage} {}\n{}\n", self.phase.tag(), self.name)
    }

    /// The [`Seen`] of a file's text (`None`: not one).
    fn parse(text: &str) -> Option<Seen> {
        let (first, name) = text.split_once('\n')?;
        let words: Vec<&str> = first.split(' ').collect();
        let (stage, phase) = match words[..] {
            ["probes", p] => (Stage::Probes, p),
            ["case", i, p] => (Stage::Case(i.parse().ok()?), p),
            _ => return None,
        };
        let phase = [Phase::Running, Phase::Verdicts]
            .into_iter()
            .find(|x| x.tag() == phase)?;
        let name = name.strip_suffix('\n').unwrap_or(name).to_string();
        Some(Seen { stage, phase, name })
    }
}

/// The ranks inside `stage` (every rank whose [`Seen`] names it) and where each rank was,
/// in words: `still inside it: rank 1 (running it), rank 0 (done with it, …)`, then the
/// ranks elsewhere and those without word. `seen[r]` is rank `r`'s (`None`: no word).
pub(super) fn describe(stage: Stage, seen: &[Option<Seen>]) -> (Vec<i32>, String) {
    let mut groups: Vec<(Phase, Vec<i32>)> = Vec::new();
    let mut elsewhere = Vec::new();
    let mut silent = Vec::new();
    for (r, s) in seen.iter().enumerate() {
        let r = i32::try_from(r).unwrap_or(i32::MAX);
        match s {
            Some(s) if s.stage == stage => match groups.iter_mut().find(|(p, _)| *p == s.phase) {
                Some((_, ranks)) => ranks.push(r),
                None => groups.push((s.phase, vec![r])),
            },
            Some(s) => elsewhere.push(format!("rank {r} in {} ({})", s.name, s.phase.words())),
            None => silent.push(r),
        }
    }
    let mut inside: Vec<i32> = groups.iter().flat_map(|(_, r)| r.iter().copied()).collect();
    inside.sort_unstable();
    let listed: Vec<String> = groups
        .iter()
        .map(|(p, ranks)| format!("{} ({})", ranks_text(ranks), p.words()))
        .collect();
    let mut text = format!("still inside it: {}", listed.join(", "));
    for e in elsewhere {
        text.push_str("; ");
        text.push_str(&e);
    }
    if !silent.is_empty() {
        text.push_str(&format!(
            "; no word from {} within {} s (stopped, or on a host that does not see rank 0's \
             temporary directory: its own line on standard error says where it was)",
            ranks_text(&silent),
            GRACE.as_secs()
        ));
    }
    (inside, text)
}

/// `--inject-hang PATTERN[:RANK]`: the pattern, and the rank (default: the last of `size`).
pub(super) fn hang_rule(text: &str, size: i32) -> Result<(Pattern, i32), String> {
    let (pattern, rank) = match text.rsplit_once(':') {
        Some((p, r)) => match r.parse::<i32>() {
            Ok(r) if (0..size).contains(&r) => (p, r),
            _ => return Err(format!("`{r}` is not a rank of 0..{size}")),
        },
        None => (text, size - 1),
    };
    Ok((Pattern::new(pattern)?, rank))
}

/// Where the rank is now.
#[derive(Debug, Clone, Copy)]
struct At {
    stage: Stage,
    phase: Phase,
    since: Instant,
}

/// What the main thread and the watchdog share (one lock, never held across an MPI call).
struct Shared {
    at: Option<At>,
    tally: Tally,
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What rank 0's watchdog needs to report the run.
pub(super) struct Reports {
    pub args: CheckArgs,
    pub library: String,
    pub started: Instant,
    /// How many cases the run has.
    pub cases: usize,
}

/// One rank's watchdog.
struct Dog {
    rank: i32,
    size: i32,
    limit: Duration,
    /// Where the ranks' files go (rank 0's choice).
    dir: PathBuf,
    reports: Reports,
}

/// The running watchdog: its stop channel and thread.
type Running = (mpsc::Sender<()>, thread::JoinHandle<()>);

/// This rank's place in the run, watched against `--timeout` (rank 0's) by a thread.
pub(super) struct Watch {
    shared: Arc<Mutex<Shared>>,
    running: Option<Running>,
}

impl Watch {
    /// Starts the watchdog (every rank: rank 0's `--timeout` and directory are broadcast;
    /// none at `--timeout 0`), holding `tally`, the results so far.
    pub(super) fn start(w: &SimpleCommunicator, tally: Tally, reports: Reports) -> Watch {
        let mut limit = reports.args.timeout;
        w.process_at_rank(0).broadcast_into(&mut limit);
        let shared = Arc::new(Mutex::new(Shared { at: None, tally }));
        if !(limit > 0.0 && limit.is_finite()) {
            return Watch {
                shared,
                running: None,
            };
        }
        let dog = Dog {
            rank: w.rank(),
            size: w.size(),
            limit: Duration::from_secs_f64(limit),
            dir: agree_on_dir(w),
            reports,
        };
        let (stop, stopped) = mpsc::channel();
        let theirs = Arc::clone(&shared);
        let running = thread::Builder::new()
            .name("check-watchdog".into())
            .spawn(move || watch(&dog, &theirs, &stopped));
        let running = match running {
            Ok(thread) => Some((stop, thread)),
            Err(err) => {
                eprintln!(
                    "dlpack-mpi check: rank {}: --timeout: no thread: {err}",
                    w.rank()
                );
                None
            }
        };
        Watch { shared, running }
    }

    /// The rank enters `stage` (running it).
    pub(super) fn enter(&self, stage: Stage) {
        lock(&self.shared).at = Some(At {
            stage,
            phase: Phase::Running,
            since: Instant::now(),
        });
    }

    /// The rank enters case `index`, `case` (running it).
    pub(super) fn enter_case(&self, index: usize, case: &Case<'_>) {
        let mut shared = lock(&self.shared);
        shared.tally.begin(case);
        shared.at = Some(At {
            stage: Stage::Case(index),
            phase: Phase::Running,
            since: Instant::now(),
        });
    }

    /// The rank is done with its stage and combines the verdicts across ranks.
    pub(super) fn verdicts(&self) {
        if let Some(at) = &mut lock(&self.shared).at {
            at.phase = Phase::Verdicts;
        }
    }

    /// The rank leaves its stage.
    pub(super) fn leave(&self) {
        lock(&self.shared).at = None;
    }

    /// `f` on the results so far.
    pub(super) fn with_tally<R>(&self, f: impl FnOnce(&mut Tally) -> R) -> R {
        f(&mut lock(&self.shared).tally)
    }

    /// Stops the watchdog; the results.
    pub(super) fn finish(self) -> Tally {
        if let Some((stop, thread)) = self.running {
            drop(stop);
            let _ = thread.join();
        }
        match Arc::try_unwrap(self.shared) {
            Ok(m) => m.into_inner().unwrap_or_else(PoisonError::into_inner).tally,
            Err(shared) => std::mem::replace(&mut lock(&shared).tally, Tally::new(0, &[])),
        }
    }
}

/// Rank 0's directory for the ranks' files, on every rank (made only when a limit passes).
fn agree_on_dir(w: &SimpleCommunicator) -> PathBuf {
    let root = w.process_at_rank(0);
    let mut bytes = if w.rank() == 0 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name = format!("dlpack-mpi-check-{}-{nanos}", std::process::id());
        std::env::temp_dir()
            .join(name)
            .to_string_lossy()
            .into_owned()
            .into_bytes()
    } else {
        Vec::new()
    };
    let mut len = i32::try_from(bytes.len()).unwrap_or(0);
    root.broadcast_into(&mut len);
    bytes.resize(usize::try_from(len).unwrap_or(0), 0);
    if len > 0 {
        root.broadcast_into(&mut bytes[..]);
    }
    PathBuf::from(String::from_utf8_lossy(&bytes).into_owned())
}

/// The watchdog's loop: every [`TICK`], until stopped, whether the rank's limit passed.
fn watch(dog: &Dog, shared: &Mutex<Shared>, stopped: &mpsc::Receiver<()>) {
    while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(TICK) {
        let guard = lock(shared);
        let Some(at) = guard.at else { continue };
        // Rank 0 has counted the case (every rank's verdict is in): only the go-ahead for
        // the next one is left, which rank 0 sends without waiting.
        let counted = dog.rank == 0 && guard.tally.current().is_none();
        let elapsed = at.since.elapsed();
        if elapsed >= dog.limit && !(counted && matches!(at.stage, Stage::Case(_))) {
            fire(dog, guard, at, elapsed);
        }
    }
}

/// The limit passed: rank 0 reports and ends the run; another rank tells rank 0 (and its
/// standard error) where it is and waits (holding the lock, so its main thread goes no
/// further).
fn fire(dog: &Dog, mut shared: MutexGuard<'_, Shared>, at: At, elapsed: Duration) -> ! {
    let name = match at.stage {
        Stage::Probes => PROBES.to_string(),
        Stage::Case(_) => shared.tally.current().unwrap_or("?").to_string(),
    };
    let mine = Seen {
        stage: at.stage,
        phase: at.phase,
        name,
    };
    let limit = dog.limit.as_secs_f64();
    if dog.rank != 0 {
        let sent = write_seen(&dog.dir, dog.rank, &mine).map_or_else(
            |err| format!(" (could not tell rank 0: {err})"),
            |()| String::new(),
        );
        eprintln!(
            "dlpack-mpi check: rank {}: TIMEOUT {}: not done after {} (--timeout {limit}), \
             {}{sent}",
            dog.rank,
            mine.name,
            seconds_text(elapsed.as_secs_f64()),
            mine.phase.words()
        );
        thread::sleep(dog.limit + GRACE + FALLBACK);
        std::process::exit(i32::from(TIMED_OUT_STATUS));
    }
    let (ranks_inside, message) = describe(at.stage, &gather(dog, mine.clone()));
    let timed_out = TimedOut {
        case: mine.name,
        number: match at.stage {
            Stage::Case(i) => Some(i + 1),
            Stage::Probes => None,
        },
        cases: dog.reports.cases,
        limit_seconds: limit,
        elapsed_seconds: elapsed.as_secs_f64(),
        ranks_inside,
        message,
    };
    let r = &dog.reports;
    let seconds = r.started.elapsed().as_secs_f64();
    let finished = shared.tally.finish(
        (dog.size, &r.args),
        r.library.clone(),
        seconds,
        Some(&timed_out),
    );
    if let Err(why) = finished {
        eprintln!("dlpack-mpi check: cannot write the report: {why}");
    }
    let _ = std::fs::remove_dir_all(&dog.dir);
    std::process::exit(i32::from(TIMED_OUT_STATUS));
}

fn seen_path(dir: &Path, rank: i32) -> PathBuf {
    dir.join(format!("rank-{rank}"))
}

/// Writes `seen` as rank `rank`'s file (whole: written aside, then renamed).
fn write_seen(dir: &Path, rank: i32, seen: &Seen) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let part = dir.join(format!("rank-{rank}.part"));
    std::fs::write(&part, seen.text())?;
    std::fs::rename(&part, seen_path(dir, rank))
}

/// Every rank's [`Seen`] (rank 0's is `mine`), waiting up to [`GRACE`] for the files.
fn gather(dog: &Dog, mine: Seen) -> Vec<Option<Seen>> {
    let deadline = Instant::now() + GRACE;
    let mut seen: Vec<Option<Seen>> = vec![None; usize::try_from(dog.size).unwrap_or(1)];
    seen[0] = Some(mine);
    loop {
        for (r, s) in seen.iter_mut().enumerate().skip(1) {
            if s.is_none() {
                let path = seen_path(&dog.dir, i32::try_from(r).unwrap_or(i32::MAX));
                *s = std::fs::read_to_string(path)
                    .ok()
                    .and_then(|t| Seen::parse(&t));
            }
        }
        if seen.iter().all(Option::is_some) || Instant::now() >= deadline {
            return seen;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(stage: Stage, phase: Phase, name: &str) -> Option<Seen> {
        Some(Seen {
            stage,
            phase,
            name: name.into(),
        })
    }

    #[test]
    fn seen_round_trips_through_its_file_text() {
        for s in [
            seen(
                Stage::Case(12),
                Phase::Running,
                "allreduce/float32/step/cpu/host/7",
            ),
            seen(Stage::Probes, Phase::Verdicts, PROBES),
        ] {
            let s = s.unwrap();
            assert_eq!(Seen::parse(&s.text()), Some(s.clone()), "{}", s.text());
        }
        for bad in [
            "",
            "case x running\nn\n",
            "case 1 sleeping\nn\n",
            "probes\nn\n",
        ] {
            assert_eq!(Seen::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn describe_groups_ranks_by_where_they_are() {
        let c = Stage::Case(2);
        let (inside, text) = describe(
            c,
            &[
                seen(c, Phase::Verdicts, "x"),
                seen(c, Phase::Running, "x"),
                seen(c, Phase::Verdicts, "x"),
            ],
        );
        assert_eq!(inside, [0, 1, 2]);
        assert_eq!(
            text,
            "still inside it: ranks 0, 2 (done with it, waiting for the other ranks' \
             verdicts), rank 1 (running it)"
        );
        let (inside, text) = describe(
            c,
            &[
                seen(c, Phase::Running, "x"),
                seen(Stage::Case(1), Phase::Verdicts, "w"),
                None,
            ],
        );
        assert_eq!(inside, [0]);
        assert!(
            text.starts_with(
                "still inside it: rank 0 (running it); rank 1 in w (done with it, waiting for \
                 the other ranks' verdicts); no word from rank 2 within 2 s ("
            ),
            "{text}"
        );
    }

    #[test]
    fn timed_out_first_and_last_lines() {
        let mut t = TimedOut {
            case: "bcast/int8/contiguous/cpu/host/7".into(),
            number: Some(3),
            cases: 20,
            limit_seconds: 3.0,
            elapsed_seconds: 3.04,
            ranks_inside: vec![0, 1],
            message: "still inside it: ranks 0, 1 (running it)".into(),
        };
        assert_eq!(
            t.line(),
            "TIMEOUT bcast/int8/contiguous/cpu/host/7: not done after 3.0 s (--timeout 3); \
             still inside it: ranks 0, 1 (running it)"
        );
        assert_eq!(
            t.closing(),
            "TIMEOUT: the run stopped in case 3 of 20, bcast/int8/contiguous/cpu/host/7 \
             (ranks 0, 1 still inside after 3.0 s); the counts above are the 2 cases before \
             it; 17 cases not run; exit status 3"
        );
        t.case = PROBES.into();
        t.number = None;
        t.cases = 1;
        t.limit_seconds = 0.25;
        t.elapsed_seconds = 0.25;
        t.ranks_inside = vec![1];
        assert_eq!(
            t.closing(),
            "TIMEOUT: the run stopped in the mismatched-argument probes, before the first case \
             (rank 1 still inside after 0.250 s); the counts above are the 0 cases before it; \
             1 case not run; exit status 3"
        );
    }

    #[test]
    fn hang_rule_takes_a_rank_or_the_last() {
        let (p, r) = hang_rule("allreduce/float32:0", 2).unwrap();
        assert!(p.matches("allreduce/float32/step/cpu/host/7") && r == 0);
        let (p, r) = hang_rule("*/transposed/*", 4).unwrap();
        assert!(p.matches("bcast/int8/transposed/cpu/host/7") && r == 3);
        assert!(hang_rule("bcast:2", 2).is_err());
        assert!(hang_rule("bcast:x", 2).is_err());
    }

    #[test]
    fn timeout_values() {
        use super::super::args::parse_timeout;
        assert_eq!(parse_timeout("0"), Ok(0.0));
        assert_eq!(parse_timeout("2.5"), Ok(2.5));
        assert_eq!(parse_timeout("60"), Ok(60.0));
        for bad in ["-1", "nan", "inf", "1e9", "", "ten"] {
            assert!(parse_timeout(bad).is_err(), "{bad}");
        }
    }
}
