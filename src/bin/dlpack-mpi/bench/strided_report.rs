//! What `--op strided` measured and how it is shown: its paths, result rows, text table,
//! summary against the targets, and its `--json` objects. Uses `common` and `json`; measures
//! nothing.

use std::io::Write;

use super::common::{fmt_size, met, Samples};
use super::json::JsonRow;

/// Target: `auto` within this factor of the faster of `derived` and `pack` (medians).
const TARGET_AUTO_VS_BEST: f64 = 1.05;
/// Target: step 2's `auto` within this factor of `contiguous` (medians).
pub const TARGET_STEP2_VS_CONTIG: f64 = 1.7;
/// Target: the transpose's `auto` within this factor of `contiguous` (medians).
pub const TARGET_TRANSPOSE_VS_CONTIG: f64 = 2.5;

/// A path through which a strided view is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StridedPath {
    /// The same number of bytes from a contiguous slice (the lower bound).
    Contiguous,
    /// `send_tensor` under `Packing::DerivedDatatype`: one derived datatype, in place.
    Derived,
    /// `send_tensor` under `Packing::Copy`: the library's pack kernels into a pooled
    /// buffer, then a contiguous send.
    Pack,
    /// `send_tensor` under `Packing::Auto` (the default): `pack` or `derived` by the
    /// layout's inner block.
    Auto,
}

/// Every strided path, in measuring and column order.
pub const STRIDED_PATHS: [StridedPath; 4] = [
    StridedPath::Contiguous,
    StridedPath::Derived,
    StridedPath::Pack,
    StridedPath::Auto,
];

impl StridedPath {
    /// The name in tables, CSV and JSON.
    pub fn name(self) -> &'static str {
        match self {
            StridedPath::Contiguous => "contiguous",
            StridedPath::Derived => "derived",
            StridedPath::Pack => "pack",
            StridedPath::Auto => "auto",
        }
    }
}

/// Results of one strided case: samples of every path, in `STRIDED_PATHS` order.
#[derive(Debug)]
pub struct StridedRow {
    /// The case's name (`step 2`, `block 64`, `transpose`, ...).
    pub name: String,
    /// The layout's contiguous inner block, in elements (1 when the innermost axis is not
    /// contiguous).
    pub block_elems: usize,
    /// Whether `auto` packed this case (else it sent a derived datatype).
    pub auto_packs: bool,
    /// Logical bytes of the view.
    pub bytes: usize,
    /// Iterations per round.
    pub iters: u64,
    /// µs per message of every round, per path.
    pub paths: [Samples; 4],
}

impl StridedRow {
    /// The samples of `p`.
    pub fn get(&self, p: StridedPath) -> &Samples {
        &self.paths[p as usize]
    }

    /// `a / b` of the medians and of the best rounds.
    pub fn ratios(&self, a: StridedPath, b: StridedPath) -> (f64, f64) {
        (
            self.get(a).median() / self.get(b).median(),
            self.get(a).best() / self.get(b).best(),
        )
    }

    /// `auto`'s median over the faster median of `derived` and `pack`.
    pub fn auto_vs_best(&self) -> f64 {
        let best = self
            .get(StridedPath::Derived)
            .median()
            .min(self.get(StridedPath::Pack).median());
        self.get(StridedPath::Auto).median() / best
    }

    /// The target of `auto / contiguous` (medians) for this case, if any.
    fn contig_target(&self) -> Option<f64> {
        match self.name.as_str() {
            "step 2" => Some(TARGET_STEP2_VS_CONTIG),
            "transpose" => Some(TARGET_TRANSPOSE_VS_CONTIG),
            _ => None,
        }
    }
}

/// What `--op strided` measures and its column headers. `threshold`: `Packing::Auto`'s
/// pack threshold in bytes.
pub fn print_strided_header(ranks: i32, rounds: u32, storage_bytes: usize, threshold: usize) {
    println!(
        "# strided send, rank 0 -> rank 1 (ranks: {ranks}, others idle), f32 views of a {} \
         storage; one-way: µs per message from the start of the send (or pack) to the receipt \
         of rank 1's 1-byte ack; rounds: {rounds}",
        fmt_size(storage_bytes)
    );
    println!(
        "paths: contiguous = send of the same bytes from a contiguous slice; derived / pack / \
         auto = send_tensor under Packing::DerivedDatatype / Copy (library pack kernels, then a \
         contiguous send) / Auto (packs inner blocks < {threshold} B); rank 1 receives into \
         &mut [f32] of the logical size on every path and checks the first message of every \
         (case, path) and the last of every timed loop, element by element"
    );
    let mut line = format!(
        "{:>12} {:>6} {:>8} {:>5} {:>7}",
        "case", "block", "logical", "iters", "auto"
    );
    for p in STRIDED_PATHS {
        line += &format!(" | {:>14} {:>10}", format!("{} med", p.name()), "best");
    }
    line += &format!(" | {:>10} {:>11}", "auto/best", "auto/contig");
    println!("{line}");
}

/// One line of the strided table, flushed at once.
pub fn print_strided_row(r: &StridedRow) {
    let mut line = format!(
        "{:>12} {:>6} {:>8} {:>5} {:>7}",
        r.name,
        r.block_elems,
        fmt_size(r.bytes),
        r.iters,
        if r.auto_packs { "pack" } else { "derived" }
    );
    for p in STRIDED_PATHS {
        let x = r.get(p);
        line += &format!(" | {:>14.1} {:>10.1}", x.median(), x.best());
    }
    let (contig, _) = r.ratios(StridedPath::Auto, StridedPath::Contiguous);
    line += &format!(" | {:>10.3} {contig:>11.3}", r.auto_vs_best());
    println!("{line}");
    let _ = std::io::stdout().flush();
}

/// The verdict of the checks (`checked` deliveries compared, `bad` of them wrong) and every
/// case's ratios against the targets.
pub fn print_strided_summary(rows: &[StridedRow], checked: u64, bad: u64) {
    println!(
        "verification (every element of {checked} deliveries checked on rank 1): {}",
        if bad == 0 {
            "passed".to_string()
        } else {
            format!("FAILED ({bad} wrong)")
        }
    );
    let missed: Vec<String> = rows
        .iter()
        .filter(|r| r.auto_vs_best() > TARGET_AUTO_VS_BEST)
        .map(|r| format!("{} {:.3}", r.name, r.auto_vs_best()))
        .collect();
    println!(
        "auto within {TARGET_AUTO_VS_BEST:.2}x of the faster of derived and pack (medians) in \
         every case: {}{}",
        met(missed.is_empty()),
        if missed.is_empty() {
            String::new()
        } else {
            format!(" ({})", missed.join(", "))
        }
    );
    for r in rows {
        if let Some(t) = r.contig_target() {
            let (m, b) = r.ratios(StridedPath::Auto, StridedPath::Contiguous);
            println!(
                "{}: auto/contiguous {m:.3} median, {b:.3} best (target ≤ {t:.2}, median: {})",
                r.name,
                met(m <= t)
            );
        }
    }
    println!();
}

/// The `--json` objects of `rows` over `ranks` ranks: one per (case, path), with the view's
/// inner block; p50 and p99 over the rounds' means (one sample per round), no bandwidth
/// (one-way messages, each ended by the receiver's 1-byte answer).
pub fn json_rows(rows: &[StridedRow], ranks: i32) -> Vec<JsonRow> {
    rows.iter()
        .flat_map(|r| {
            STRIDED_PATHS.iter().map(move |&p| {
                let mut j = JsonRow::new("strided", &r.name, p.name(), r.bytes).times(
                    ranks,
                    r.iters,
                    r.get(p),
                    r.get(p),
                    r.iters,
                );
                j.block_elems = Some(r.block_elems);
                j
            })
        })
        .collect()
}
