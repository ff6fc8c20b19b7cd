//! Which cases run: the matrix filtered by `--op`/`--dtype`/`--layout`/`--len` and the
//! `-k`/`-e` patterns (rank 0's choice, broadcast so that every rank runs the same list).

use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use super::args::{CheckArgs, Producer, DEFAULT_LENS, NONBLOCKING_DEFAULT_LENS};
use super::kind::Runner;
use super::matrix::{case_name, Layout, Op, LAYOUTS};
use super::placement::{Offset, Placement};
use super::store::resolve_producer;

/// How a pattern of `-k`/`-e` matches a case name.
pub(super) enum Pattern {
    /// A plain string: matches names that contain it.
    Substring(String),
    /// A pattern with `*`, `?` or `[`: matches whole names as a glob.
    Glob(glob::Pattern),
}

impl Pattern {
    pub(super) fn new(text: &str) -> Result<Pattern, String> {
        if text.contains(['*', '?', '[']) {
            glob::Pattern::new(text)
                .map(Pattern::Glob)
                .map_err(|err| format!("pattern `{text}` is not a valid glob: {err}"))
        } else {
            Ok(Pattern::Substring(text.to_string()))
        }
    }

    pub(super) fn matches(&self, name: &str) -> bool {
        match self {
            Pattern::Substring(s) => name.contains(s.as_str()),
            Pattern::Glob(g) => g.matches(name),
        }
    }
}

/// One case of the matrix.
pub(super) struct Case<'k> {
    pub op: Op,
    pub kind: &'k dyn Runner,
    pub layout: Layout,
    pub len: i64,
    /// Where its tensors live.
    pub place: Placement,
    /// The transport part of the name (`host`, `managed`, `direct`, `staged`, or several
    /// joined by `+`).
    pub transport: String,
    /// How far past an aligned address its tensors start.
    pub offset: Offset,
}

impl Case<'_> {
    pub(super) fn name(&self) -> String {
        case_name(
            self.op,
            self.kind.name(),
            self.layout,
            (&self.place.name(), &self.transport),
            self.len,
            self.offset,
        )
    }
}

/// A case as indices into [`Op::ALL`], the dtype list, [`LAYOUTS`], its length, an index
/// into the run's placements ([`super::setup::Setup::placements`]) and its offset
/// ([`Offset::encode`]): what rank 0 broadcasts so that every rank runs the same list.
pub(super) type CaseIndex = [i64; CASE_INDEX_LEN];

/// The integers of a [`CaseIndex`].
pub(super) const CASE_INDEX_LEN: usize = 7;

/// The patterns of one flag (`-k` or `-e`), with whether each matched a case.
struct Patterns {
    flag: &'static str,
    patterns: Vec<(String, Pattern)>,
    used: Vec<bool>,
}

impl Patterns {
    fn new(flag: &'static str, texts: &[String]) -> Result<Patterns, String> {
        let patterns = texts
            .iter()
            .map(|t| {
                if t.is_empty() {
                    // A substring of every name: it would select (or exclude) every case.
                    return Err(format!("{flag} `` is empty (give a part of a case name)"));
                }
                Pattern::new(t).map(|p| (t.clone(), p))
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Patterns {
            flag,
            used: vec![false; patterns.len()],
            patterns,
        })
    }

    /// Whether any pattern matches `name` (every one that does is marked used).
    fn any_matches(&mut self, name: &str) -> bool {
        let mut hit = false;
        for ((_, p), used) in self.patterns.iter().zip(&mut self.used) {
            if p.matches(name) {
                *used = true;
                hit = true;
            }
        }
        hit
    }

    /// The refusal of the first pattern that matched no case.
    fn unused(&self) -> Result<(), String> {
        match self.patterns.iter().zip(&self.used).find(|(_, u)| !**u) {
            Some(((text, _), _)) => Err(format!(
                "{} `{text}` matches no case (names read op/dtype/layout/device/transport/len, \
                 with /offNb or /offNp after an offset; see --list)",
                self.flag
            )),
            None => Ok(()),
        }
    }
}

/// Refuses an unknown `--op`, `--dtype` or `--layout` name, or a length out of range.
fn check_names(kinds: &[Box<dyn Runner>], args: &CheckArgs) -> Result<(), String> {
    let op_names: Vec<&str> = Op::ALL.iter().map(|o| o.name()).collect();
    let kind_names: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
    let layout_names: Vec<&str> = LAYOUTS.iter().map(|l| l.name()).collect();
    for (what, given, known) in [
        ("operation", &args.op, &op_names[..]),
        ("dtype", &args.dtype, &kind_names[..]),
        ("layout", &args.layout, &layout_names[..]),
    ] {
        if let Some(bad) = given.iter().find(|g| !known.contains(&g.as_str())) {
            return Err(format!(
                "unknown {what} `{bad}` (known: {})",
                known.join(", ")
            ));
        }
    }
    if let Some(bad) = args.len.iter().find(|&&l| !(0..=1 << 24).contains(&l)) {
        return Err(format!("length {bad} is outside 0..=16777216 elements"));
    }
    Ok(())
}

/// The lengths of the fused collectives' cases and their plans' under the default `--len`:
/// each case is a list with members of 0, 1 and 7 elements beside one of the case's length
/// (`super::fused`, `super::plans`), so length 0 (the empty list too, default buckets) and
/// 1000 (small buckets) cover it.
const FUSED_DEFAULT_LENS: [i64; 2] = [0, 1000];

/// The lengths of `op`'s cases: `--len`, but when `--len` is the default
/// [`FUSED_DEFAULT_LENS`] for a fused collective or its plan and
/// [`NONBLOCKING_DEFAULT_LENS`] for a nonblocking one.
fn lengths(op: Op, args: &CheckArgs) -> &[i64] {
    if args.len != DEFAULT_LENS {
        &args.len
    } else if op.is_fused() || op.is_planned() {
        &FUSED_DEFAULT_LENS
    } else if op.posts().is_some() {
        &NONBLOCKING_DEFAULT_LENS
    } else {
        &args.len
    }
}

/// Every case of the matrix that `--op`, `--dtype`, `--layout`, `--len` and `--offset`
/// name on `placements` (with the transport part of their names), in order, with its name.
fn matrix(
    kinds: &[Box<dyn Runner>],
    args: &CheckArgs,
    placements: &[(Placement, String)],
) -> Vec<(CaseIndex, String)> {
    let wanted = |given: &[String], name: &str| given.is_empty() || given.iter().any(|g| g == name);
    let offsets = Offset::of_args(&args.offset);
    let mut cases = Vec::new();
    for (d, (place, transport)) in placements.iter().enumerate() {
        let device = place.name();
        for (o, op) in Op::ALL.iter().enumerate() {
            for (k, kind) in kinds.iter().enumerate() {
                for (l, layout) in LAYOUTS.iter().enumerate() {
                    for &len in lengths(*op, args) {
                        // A 0-d tensor has exactly one element.
                        if (*layout == Layout::Scalar && len != 1) || !op.runs_layout(*layout) {
                            continue;
                        }
                        if !wanted(&args.op, op.name())
                            || !wanted(&args.dtype, kind.name())
                            || !wanted(&args.layout, layout.name())
                        {
                            continue;
                        }
                        for offset in &offsets {
                            let [ob, of] = offset.encode();
                            let name = case_name(
                                *op,
                                kind.name(),
                                *layout,
                                (&device, transport),
                                len,
                                *offset,
                            );
                            let index = [o as i64, k as i64, l as i64, len, d as i64, ob, of];
                            cases.push((index, name));
                        }
                    }
                }
            }
        }
    }
    cases
}

/// Rank 0's choice of cases from the options and the placements every rank can use (with
/// the transport part of their names), or the one-line reason it refuses them.
fn select(
    kinds: &[Box<dyn Runner>],
    args: &CheckArgs,
    placements: &[(Placement, String)],
) -> Result<Vec<CaseIndex>, String> {
    check_names(kinds, args)?;
    let mut include = Patterns::new("-k", &args.include)?;
    let mut exclude = Patterns::new("-e", &args.exclude)?;
    let mut cases = Vec::new();
    for (index, name) in matrix(kinds, args, placements) {
        if !include.patterns.is_empty() && !include.any_matches(&name) {
            continue;
        }
        if !exclude.any_matches(&name) {
            cases.push(index);
        }
    }
    include.unused()?;
    exclude.unused()?;
    if cases.is_empty() {
        return Err(
            "no case left to run: the options select no case, or -e excludes every \
                    case they select (see --list)"
                .into(),
        );
    }
    Ok(cases)
}

/// The producers by the index rank 0 broadcasts.
const ALL: [Producer; 5] = [
    Producer::Rust,
    Producer::Numpy,
    Producer::Jax,
    Producer::Paddle,
    Producer::Auto,
];

/// Rank 0's [`select`] on every rank: rank 0 decides and broadcasts the case list (or that
/// it refused the options, after printing why), so all ranks run the same cases even when
/// their command lines differ.
pub(super) fn agree_on_cases(
    w: &SimpleCommunicator,
    kinds: &[Box<dyn Runner>],
    args: &CheckArgs,
    placements: &[(Placement, String)],
) -> Option<(Producer, Vec<CaseIndex>)> {
    let root = w.process_at_rank(0);
    let mut chosen = Vec::new();
    let mut count: i64 = -1;
    let mut made_by = 0i32;
    let mut installed = 0i32;
    if w.rank() == 0 {
        // The case selection first: a refused selection then imports no Python producer, so
        // no rank is still loading JAX or Paddle when the others exit with status 2 (Open MPI
        // then kills it and prints its abort notice).
        match select(kinds, args, placements)
            .and_then(|cases| Ok((resolve_producer(args.producer)?, cases)))
        {
            Ok(((p, mask), cases)) => {
                made_by = ALL.iter().position(|q| *q == p).unwrap_or(0) as i32;
                installed = mask;
                count = cases.len() as i64;
                chosen = cases.into_iter().flatten().collect();
            }
            Err(why) => eprintln!("dlpack-mpi check: {why}"),
        }
    }
    root.broadcast_into(&mut count);
    root.broadcast_into(&mut made_by);
    root.broadcast_into(&mut installed);
    if count < 0 {
        return None;
    }
    chosen.resize(count as usize * CASE_INDEX_LEN, 0);
    if count > 0 {
        root.broadcast_into(&mut chosen[..]);
    }
    let producer = ALL[made_by as usize];
    super::producers::set_installed(producer, installed);
    Some((
        producer,
        chosen
            .chunks_exact(CASE_INDEX_LEN)
            .map(|c| std::array::from_fn(|i| c[i]))
            .collect(),
    ))
}
