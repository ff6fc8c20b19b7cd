//! The verdict as people read it (rank 0, without `-v`): a line per operation with its
//! counts, the operation × dtype matrix (one character a cell, the tensors' producer at the
//! end of each dtype's row), the skips and the not-checkable cases grouped by reason, and
//! the known MPI-library bugs, each in full with the cells it hit.
//!
//! A cell shows the worst of its cases: `F` failed, `K` a known MPI-library bug, `s`
//! skipped, `?` not checkable (a float sum whose exact inputs cannot carry every rank's
//! data, `super::exact`), `.` passed, `-` not applicable (every case of the cell is a
//! combination MPI or DLPack rules out), blank when no case of the cell ran. The
//! not-checkable counts, cell and legend appear only in a run that had such a case (none
//! does below 257 ranks).

use super::matrix::Op;

/// What a case came to, in the order a cell shows the worst of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Outcome {
    NotApplicable,
    Pass,
    NotCheckable,
    Skip,
    KnownBug,
    Fail,
}

impl Outcome {
    /// The matrix cell of a cell whose worst case is this.
    fn cell(self) -> char {
        match self {
            Outcome::NotApplicable => '-',
            Outcome::Pass => '.',
            Outcome::NotCheckable => '?',
            Outcome::Skip => 's',
            Outcome::KnownBug => 'K',
            Outcome::Fail => 'F',
        }
    }
}

/// The legend of the matrix's cells.
pub(super) const LEGEND: &str = ". passed   F failed   K known MPI-library bug   s skipped   \
     - not applicable (MPI or DLPack rules it out)   blank: not run";

/// The legend of the `?` cell, after [`LEGEND`]'s in a run with a not-checkable case.
pub(super) const LEGEND_NOT_CHECKABLE: &str =
    "? not checkable (too many ranks for exact inputs in too few elements)";

/// The producer label of a `cpu` case whose tensors Rust made because no installed Python
/// producer makes the dtype (`--producer auto`).
pub(super) const STAND_IN: &str = "rust*";

/// The counts of a set of cases.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Counts {
    pub passed: u32,
    pub failed: u32,
    pub skipped: u32,
    pub known: u32,
    pub not_applicable: u32,
    pub not_checkable: u32,
    /// The worst outcome so far (`None`: no case).
    worst: Option<Outcome>,
}

impl Counts {
    /// Counts one more case that came to `o`.
    pub(super) fn add(&mut self, o: Outcome) {
        match o {
            Outcome::NotApplicable => self.not_applicable += 1,
            Outcome::Pass => self.passed += 1,
            Outcome::NotCheckable => self.not_checkable += 1,
            Outcome::Skip => self.skipped += 1,
            Outcome::KnownBug => self.known += 1,
            Outcome::Fail => self.failed += 1,
        }
        self.worst = self.worst.max(Some(o));
    }
}

/// Cases that share a message (a skip's reason, a known bug), by matrix cell.
#[derive(Debug)]
struct Group {
    what: String,
    total: u32,
    /// `op/dtype`, how many cases of the cell, the first one's name and message.
    cells: Vec<(String, u32, String)>,
}

/// Adds a case of `cell` (`op/dtype`) to the group of `what` in `groups`.
fn group(groups: &mut Vec<Group>, what: &str, cell: String, first: impl FnOnce() -> String) {
    let g = match groups.iter().position(|g| g.what == what) {
        Some(i) => &mut groups[i],
        None => {
            groups.push(Group {
                what: what.to_string(),
                total: 0,
                cells: Vec::new(),
            });
            groups.last_mut().expect("just pushed")
        }
    };
    g.total += 1;
    match g.cells.iter_mut().find(|(c, _, _)| *c == cell) {
        Some((_, n, _)) => *n += 1,
        None => g.cells.push((cell, 1, first())),
    }
}

/// Everything the verdict shows, gathered case by case.
#[derive(Debug, Default)]
pub(super) struct Summary {
    /// The operations and dtypes of the run, in matrix order.
    ops: Vec<Op>,
    dtypes: Vec<&'static str>,
    /// `cells[o * dtypes.len() + d]`.
    cells: Vec<Counts>,
    /// Who made each dtype's (send) tensors, in order of first use.
    producers: Vec<Vec<&'static str>>,
    skips: Vec<Group>,
    /// The not-checkable cases, by reason.
    unchecked: Vec<Group>,
    known: Vec<Group>,
}

/// The most skip reasons listed (the rest are counted; `-v` and `--json` have every case).
const MAX_SKIP_REASONS: usize = 12;

impl Summary {
    /// A summary of cases of `ops` × `dtypes` (each in the order the run meets them).
    pub(super) fn new(ops: Vec<Op>, dtypes: Vec<&'static str>) -> Summary {
        Summary {
            cells: vec![Counts::default(); ops.len() * dtypes.len()],
            producers: vec![Vec::new(); dtypes.len()],
            ops,
            dtypes,
            ..Summary::default()
        }
    }

    /// Counts a case of `op` and `dtype` whose tensors `producer` made.
    pub(super) fn add(&mut self, op: Op, dtype: &'static str, producer: &'static str, o: Outcome) {
        let (Some(i), Some(d)) = (
            self.ops.iter().position(|x| *x == op),
            self.dtypes.iter().position(|x| *x == dtype),
        ) else {
            return;
        };
        self.cells[i * self.dtypes.len() + d].add(o);
        if !self.producers[d].contains(&producer) {
            self.producers[d].push(producer);
        }
    }

    /// Records a skipped case: its reason, cell (`op/dtype`) and name.
    pub(super) fn skip(&mut self, why: &str, cell: String, name: &str) {
        group(&mut self.skips, why, cell, || name.to_string());
    }

    /// Records a not-checkable case: its reason, cell (`op/dtype`) and name.
    pub(super) fn not_checkable(&mut self, why: &str, cell: String, name: &str) {
        group(&mut self.unchecked, why, cell, || name.to_string());
    }

    /// Records a case that hit the known MPI-library bug `bug`, with what the ranks saw.
    pub(super) fn known_bug(&mut self, bug: &str, cell: String, name: &str, saw: &str) {
        group(&mut self.known, bug, cell, || format!("{name}: {saw}"));
    }

    /// The counts of operation `i` (an index into the run's operations).
    fn op_counts(&self, i: usize) -> Counts {
        let n = self.dtypes.len();
        let mut c = Counts::default();
        for cell in &self.cells[i * n..(i + 1) * n] {
            c.passed += cell.passed;
            c.failed += cell.failed;
            c.skipped += cell.skipped;
            c.known += cell.known;
            c.not_applicable += cell.not_applicable;
            c.not_checkable += cell.not_checkable;
        }
        c
    }

    /// Whether a case was not checkable: the counts, the matrix's legend and the closing
    /// line then say how many.
    pub(super) fn any_not_checkable(&self) -> bool {
        !self.unchecked.is_empty()
    }

    /// A line per operation, with the letter that names its column in the matrix.
    pub(super) fn per_operation(&self) -> Vec<String> {
        let mut out = vec!["by operation (the letter is its column in the matrix below):".into()];
        for (i, op) in self.ops.iter().enumerate() {
            let c = self.op_counts(i);
            let mut line = format!(
                "  {} {:<21} {:>6} passed {:>4} failed {:>4} skipped {:>3} known bugs {:>4} not applicable",
                column(i),
                op.name(),
                c.passed,
                c.failed,
                c.skipped,
                c.known,
                c.not_applicable
            );
            if self.any_not_checkable() {
                line.push_str(&format!(" {:>4} not checkable", c.not_checkable));
            }
            out.push(line);
        }
        out
    }

    /// The operation × dtype matrix: a row per dtype, a column per operation, the tensors'
    /// producers at the end of the row, and the legend.
    pub(super) fn matrix(&self) -> Vec<String> {
        let letters: String = (0..self.ops.len()).map(column).collect();
        let legend = if self.any_not_checkable() {
            format!("  {LEGEND}   {LEGEND_NOT_CHECKABLE}")
        } else {
            format!("  {LEGEND}")
        };
        let mut out = vec![
            "dtype × operation (a cell shows the worst of its cases):".to_string(),
            legend,
            format!("  {:<20} {letters}  tensors made by", ""),
        ];
        let n = self.dtypes.len();
        let mut stand_in = false;
        for (d, dtype) in self.dtypes.iter().enumerate() {
            let cells: String = (0..self.ops.len())
                .map(|i| self.cells[i * n + d].worst.map_or(' ', Outcome::cell))
                .collect();
            stand_in |= self.producers[d].contains(&STAND_IN);
            out.push(format!(
                "  {dtype:<20} {cells}  {}",
                self.producers[d].join(", ")
            ));
        }
        if stand_in {
            out.push(format!(
                "  {STAND_IN}: Rust-made tensors (dlpack-mpi's `Owned`), as no installed Python \
                 producer makes the dtype (--producer auto)"
            ));
        }
        out
    }

    /// The skips, one line per reason (the first [`MAX_SKIP_REASONS`]), then the
    /// not-checkable cases the same way.
    pub(super) fn skip_reasons(&self) -> Vec<String> {
        let mut out = reasons("SKIP", &self.skips);
        out.extend(reasons("NOT-CHECKABLE", &self.unchecked));
        out
    }

    /// Each known MPI-library bug in full, then a line per matrix cell it hit with the first
    /// case's name and what the ranks saw.
    pub(super) fn known_bugs(&self) -> Vec<String> {
        let mut out = Vec::new();
        for g in &self.known {
            out.push(String::new());
            out.push(format!(
                "KNOWN-BUG in {} case{}: {}",
                g.total,
                plural(g.total),
                g.what
            ));
            for (cell, count, first) in &g.cells {
                out.push(format!(
                    "  {cell}: {count} case{}, first {first}",
                    plural(*count)
                ));
            }
        }
        out
    }
}

/// The cases of `groups`, one line per reason (the first [`MAX_SKIP_REASONS`]), each
/// starting with `label`.
fn reasons(label: &str, groups: &[Group]) -> Vec<String> {
    let mut out: Vec<String> = groups
        .iter()
        .take(MAX_SKIP_REASONS)
        .map(|g| {
            let (_, _, first) = &g.cells[0];
            let cells: Vec<&str> = g.cells.iter().map(|(c, _, _)| c.as_str()).collect();
            format!(
                "{label} {} case{} ({}; first {first}): {}",
                g.total,
                plural(g.total),
                abbreviated(&cells),
                g.what
            )
        })
        .collect();
    if groups.len() > MAX_SKIP_REASONS {
        let more: u32 = groups[MAX_SKIP_REASONS..].iter().map(|g| g.total).sum();
        out.push(format!(
            "{label} {more} more case{} for {} other reasons (-v prints every case)",
            plural(more),
            groups.len() - MAX_SKIP_REASONS
        ));
    }
    out
}

/// The matrix column of the `i`th operation: `a`, `b`, …, then `A`, `B`, ….
fn column(i: usize) -> char {
    let letters = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    letters.get(i).map_or('?', |&b| char::from(b))
}

fn plural(n: u32) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// `cells` joined, at most four of them and a count of the rest.
fn abbreviated(cells: &[&str]) -> String {
    match cells.len() {
        0..=4 => cells.join(", "),
        n => format!("{}, and {} more cells", cells[..3].join(", "), n - 3),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Summary {
        let mut s = Summary::new(vec![Op::Bcast, Op::Allreduce], vec!["int8", "float8_e5m2"]);
        s.add(Op::Bcast, "int8", "numpy", Outcome::Pass);
        s.add(Op::Bcast, "float8_e5m2", STAND_IN, Outcome::Pass);
        s.add(Op::Allreduce, "int8", "numpy", Outcome::Pass);
        s.add(Op::Allreduce, "int8", "numpy", Outcome::KnownBug);
        s.known_bug(
            "bug",
            "allreduce/int8".into(),
            "allreduce/int8/x/1000",
            "saw",
        );
        s.add(
            Op::Allreduce,
            "float8_e5m2",
            STAND_IN,
            Outcome::NotApplicable,
        );
        s
    }

    #[test]
    fn cells_show_the_worst_case_and_rows_their_producer() {
        let m = sample().matrix();
        assert_eq!(m[1], format!("  {LEGEND}"));
        assert_eq!(m[2], format!("  {:<20} ab  tensors made by", ""));
        assert_eq!(m[3], format!("  {:<20} .K  numpy", "int8"));
        assert_eq!(m[4], format!("  {:<20} .-  rust*", "float8_e5m2"));
        assert!(m[5].starts_with("  rust*: Rust-made tensors"), "{m:?}");
        assert_eq!(m.len(), 6);
    }

    #[test]
    fn per_operation_counts_and_known_bugs() {
        let s = sample();
        let ops = s.per_operation();
        assert_eq!(ops.len(), 3);
        assert!(ops[1].starts_with("  a bcast "), "{}", ops[1]);
        assert!(
            ops[2]
                .ends_with("1 passed    0 failed    0 skipped   1 known bugs    1 not applicable"),
            "{}",
            ops[2]
        );
        assert_eq!(
            s.known_bugs(),
            [
                "",
                "KNOWN-BUG in 1 case: bug",
                "  allreduce/int8: 1 case, first allreduce/int8/x/1000: saw"
            ]
        );
    }

    /// A run with a not-checkable case counts it in a column of its own, shows `?` and its
    /// legend, and lists it by reason after the skips; a run without one shows none of it.
    #[test]
    fn not_checkable_counted_apart_only_when_present() {
        let mut s = sample();
        assert!(!s.per_operation()[2].contains("checkable"));
        s.add(Op::Bcast, "float8_e5m2", STAND_IN, Outcome::NotCheckable);
        s.not_checkable("too many ranks", "bcast/float8_e5m2".into(), "bcast/x/1");
        let ops = s.per_operation();
        assert!(
            ops[1].ends_with("   0 not applicable    1 not checkable"),
            "{}",
            ops[1]
        );
        assert!(
            ops[2].ends_with("   1 not applicable    0 not checkable"),
            "{}",
            ops[2]
        );
        let m = s.matrix();
        assert_eq!(m[1], format!("  {LEGEND}   {LEGEND_NOT_CHECKABLE}"));
        assert_eq!(m[4], format!("  {:<20} ?-  rust*", "float8_e5m2"));
        assert_eq!(
            s.skip_reasons(),
            ["NOT-CHECKABLE 1 case (bcast/float8_e5m2; first bcast/x/1): too many ranks"]
        );
    }

    #[test]
    fn skips_grouped_by_reason() {
        let mut s = sample();
        for i in 0..6 {
            s.skip(
                "NumPy has no dtype x",
                format!("op{i}/x"),
                &format!("op{i}/x/c/7"),
            );
        }
        s.skip("NumPy has no dtype x", "op0/x".into(), "op0/x/c/8");
        assert_eq!(
            s.skip_reasons(),
            ["SKIP 7 cases (op0/x, op1/x, op2/x, and 3 more cells; first op0/x/c/7): NumPy has no dtype x"]
        );
    }
}
