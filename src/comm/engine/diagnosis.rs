//! What the ranks say to each other when an agreement fails, and the words every rank
//! returns (the error path of [`super::agree`]: the success path costs nothing here).
//!
//! Each rank describes its call in a [`Report`] (its collective in words, the form,
//! blocking or nonblocking, its place in the communicator's collective order, a fused
//! list's members with dtype and shape, and the last collective when that one ended in a
//! mismatch); the ranks gather every report (`MPI_Allgather` of the lengths, then
//! `MPI_Allgatherv` of the bytes, MPI-4.1 §6.7) and each computes the same [`Verdict`]
//! with [`explain`]:
//!
//! - **out of step**: a rank whose last collective is the one the others make now skipped
//!   one (or the others made one it did not), a rank whose current collective is the
//!   others' last made one more: `rank 2 is at collective 7, ranks 0, 1 at 6`;
//! - **a mismatch**, in words: which rank used which form; for lists, the first member that
//!   differs with its index, dtype and shape on each rank, and which rank has which length;
//!   else each rank's collective and arguments;
//! - **agreed**: the call after a mismatch matches on every rank and no rank is out of
//!   step (the mismatch was the arguments of one call).

use std::fmt::Write as _;

use mpi::collective::CommunicatorCollectives;
use mpi::datatype::PartitionMut;
use mpi::topology::Communicator;

use crate::dtype::DType;

/// One rank's account of its call (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(in crate::comm) struct Report {
    /// The collective's number on this communicator (1 for the first).
    pub(in crate::comm) count: u64,
    /// Whether it is the nonblocking form (`immediate_*`).
    pub(in crate::comm) nonblocking: bool,
    /// The fingerprint of the call (signature and form).
    pub(in crate::comm) call: i64,
    /// The collective and its arguments in words.
    pub(in crate::comm) words: String,
    /// A fused list's members, dtype and shape each, in order.
    pub(in crate::comm) members: Option<Vec<(DType, Vec<i64>)>>,
    /// The last collective, when it ended in a mismatch: its fingerprint and words.
    pub(in crate::comm) last: Option<(i64, String)>,
}

/// What every rank concludes from the reports.
#[derive(Debug, PartialEq, Eq)]
pub(in crate::comm) enum Verdict {
    /// Every rank makes the same call, in step.
    Agreed,
    /// The calls differ: rank 0's words, the lowest differing rank and its words, and what
    /// differs.
    Mismatch {
        arguments: String,
        other_rank: i32,
        other_arguments: String,
        difference: String,
    },
    /// The ranks are out of step (the communicator's collective order is broken).
    OutOfStep(String),
}

impl Report {
    /// The report as bytes (see [`Report::decode`]).
    pub(in crate::comm) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(64 + self.words.len());
        b.extend_from_slice(&self.count.to_le_bytes());
        b.push(u8::from(self.nonblocking));
        b.extend_from_slice(&self.call.to_le_bytes());
        put_str(&mut b, &self.words);
        match &self.last {
            Some((fp, words)) => {
                b.push(1);
                b.extend_from_slice(&fp.to_le_bytes());
                put_str(&mut b, words);
            }
            None => b.push(0),
        }
        match &self.members {
            Some(list) => {
                b.push(1);
                b.extend_from_slice(&(list.len() as u64).to_le_bytes());
                for (d, shape) in list {
                    b.push(d.code);
                    b.push(d.bits);
                    b.extend_from_slice(&d.lanes.to_le_bytes());
                    b.extend_from_slice(&(shape.len() as u64).to_le_bytes());
                    for x in shape {
                        b.extend_from_slice(&x.to_le_bytes());
                    }
                }
            }
            None => b.push(0),
        }
        b
    }

    /// The report [`Report::encode`] wrote; `None` for bytes it did not write (a peer that
    /// is not dlpack-mpi).
    pub(in crate::comm) fn decode(bytes: &[u8]) -> Option<Report> {
        let mut r = Reader(bytes);
        let count = r.u64()?;
        let nonblocking = r.u8()? != 0;
        let call = r.i64()?;
        let words = r.string()?;
        let last = match r.u8()? {
            0 => None,
            _ => Some((r.i64()?, r.string()?)),
        };
        let members = match r.u8()? {
            0 => None,
            _ => {
                let n = r.len()?;
                let mut list = Vec::with_capacity(n.min(1 << 16));
                for _ in 0..n {
                    let (code, bits) = (r.u8()?, r.u8()?);
                    let lanes = u16::from_le_bytes(r.take(2)?.try_into().ok()?);
                    let ndim = r.len()?;
                    let shape = (0..ndim).map(|_| r.i64()).collect::<Option<Vec<_>>>()?;
                    list.push((DType { code, bits, lanes }, shape));
                }
                Some(list)
            }
        };
        r.0.is_empty().then_some(Report {
            count,
            nonblocking,
            call,
            words,
            members,
            last,
        })
    }
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

/// Reads what [`Report::encode`] wrote.
struct Reader<'b>(&'b [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn i64(&mut self) -> Option<i64> {
        Some(i64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    /// A length: no more than the bytes left (each counted thing takes at least one).
    fn len(&mut self) -> Option<usize> {
        usize::try_from(self.u64()?)
            .ok()
            .filter(|&n| n <= self.0.len())
    }
    fn string(&mut self) -> Option<String> {
        let n = self.len()?;
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }
}

/// Gathers every rank's report on `comm` (every rank calls it, at the same point of
/// `comm`'s collective order): the lengths, then the bytes. A report that does not decode
/// (a peer that is not dlpack-mpi) is `None`.
pub(in crate::comm) fn gather<C: Communicator + ?Sized>(
    comm: &C,
    mine: &Report,
) -> Vec<Option<Report>> {
    let bytes = mine.encode();
    let size = usize::try_from(comm.size()).unwrap_or(1);
    let mut lens = vec![0i32; size];
    let own = i32::try_from(bytes.len()).unwrap_or(i32::MAX);
    comm.all_gather_into(&own, &mut lens[..]);
    let displs: Vec<i32> = lens
        .iter()
        .scan(0i32, |at, &n| {
            let d = *at;
            *at = at.saturating_add(n);
            Some(d)
        })
        .collect();
    let total = lens.iter().map(|&n| usize::try_from(n).unwrap_or(0)).sum();
    let mut all = vec![0u8; total];
    {
        let mut part = PartitionMut::new(&mut all[..], &lens[..], &displs[..]);
        comm.all_gather_varcount_into(&bytes[..], &mut part);
    }
    lens.iter()
        .zip(&displs)
        .map(|(&n, &d)| {
            let (d, n) = (usize::try_from(d).ok()?, usize::try_from(n).ok()?);
            Report::decode(all.get(d..d + n)?)
        })
        .collect()
}

/// `rank 2`, `ranks 0, 1`, `ranks 0–3, 5`.
pub(in crate::comm) fn ranks(list: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < list.len() {
        let mut j = i;
        while j + 1 < list.len() && list[j + 1] == list[j] + 1 {
            j += 1;
        }
        parts.push(match j - i {
            0 => list[i].to_string(),
            1 => format!("{}, {}", list[i], list[j]),
            _ => format!("{}–{}", list[i], list[j]),
        });
        i = j + 1;
    }
    let word = if list.len() == 1 { "rank" } else { "ranks" };
    format!("{word} {}", parts.join(", "))
}

/// The ranks grouped by `key`, in order of each group's lowest rank.
fn groups<K: PartialEq + Clone>(keys: &[K]) -> Vec<(K, Vec<usize>)> {
    let mut out: Vec<(K, Vec<usize>)> = Vec::new();
    for (r, k) in keys.iter().enumerate() {
        match out.iter_mut().find(|(g, _)| g == k) {
            Some((_, list)) => list.push(r),
            None => out.push((k.clone(), vec![r])),
        }
    }
    out
}

/// The most common value of `keys` (ties: the one whose group has the lowest rank).
fn majority<K: PartialEq + Clone>(keys: &[K]) -> Option<K> {
    let g = groups(keys);
    let most = g.iter().map(|(_, l)| l.len()).max()?;
    g.into_iter().find(|(_, l)| l.len() == most).map(|(k, _)| k)
}

/// One member in words: `float32 [2048]`.
fn member_words(m: Option<&(DType, Vec<i64>)>) -> String {
    match m {
        Some((d, shape)) => {
            let dims: Vec<String> = shape.iter().map(i64::to_string).collect();
            format!("{d} [{}]", dims.join(", "))
        }
        None => "no member".into(),
    }
}

/// The verdict every rank reaches from the same `reports` (rank order); a missing report
/// (a peer that is not dlpack-mpi) is named as such.
pub(in crate::comm) fn explain(reports: &[Option<Report>]) -> Verdict {
    let foreign: Vec<usize> = (0..reports.len())
        .filter(|&r| reports[r].is_none())
        .collect();
    if !foreign.is_empty() {
        return Verdict::OutOfStep(format!(
            "{} sent no dlpack-mpi report in the agreement's exchange: a rank running a plain \
             MPI or mpi4py collective on this communicator, or another DLPACK_MPI_AGREEMENT",
            ranks(&foreign)
        ));
    }
    let reports: Vec<&Report> = reports.iter().flatten().collect();
    if let Some(v) = sequence(&reports) {
        return v;
    }
    let first = reports[0];
    let Some(other) = reports.iter().position(|r| r.call != first.call) else {
        return Verdict::Agreed;
    };
    let theirs = reports[other];
    let difference = if first.nonblocking != theirs.nonblocking {
        let forms: Vec<bool> = reports.iter().map(|r| r.nonblocking).collect();
        let said: Vec<String> = groups(&forms)
            .into_iter()
            .map(|(nb, list)| {
                let form = if nb {
                    "the nonblocking form (immediate_*)"
                } else {
                    "the blocking form"
                };
                format!("{} called {form}", ranks(&list))
            })
            .collect();
        format!(
            "{}; a blocking and a nonblocking collective never match (MPI-4.1 §6.12)",
            said.join(", ")
        )
    } else if let (Some(_), Some(_)) = (&first.members, &theirs.members) {
        lists(&reports)
    } else {
        let words: Vec<&str> = reports.iter().map(|r| r.words.as_str()).collect();
        groups(&words)
            .into_iter()
            .map(|(w, list)| format!("{}: {w}", ranks(&list)))
            .collect::<Vec<_>>()
            .join("; ")
    };
    let hint = if reports.iter().all(|r| r.last.is_none()) {
        " (if a rank skipped or added a collective on this communicator, the next collective \
         on it names that rank)"
    } else {
        ""
    };
    Verdict::Mismatch {
        arguments: first.words.clone(),
        other_rank: i32::try_from(other).unwrap_or(i32::MAX),
        other_arguments: theirs.words.clone(),
        difference: format!("{difference}{hint}"),
    }
}

/// The words for fused lists that differ: lengths, then the first member that differs.
fn lists(reports: &[&Report]) -> String {
    let lists: Vec<&[(DType, Vec<i64>)]> = reports
        .iter()
        .map(|r| r.members.as_deref().unwrap_or(&[]))
        .collect();
    let lens: Vec<usize> = lists.iter().map(|l| l.len()).collect();
    let mut s = String::new();
    let by_len = groups(&lens);
    if by_len.len() > 1 {
        let said: Vec<String> = by_len
            .iter()
            .map(|(n, list)| {
                let verb = if list.len() == 1 { "has" } else { "have" };
                let noun = if *n == 1 { "member" } else { "members" };
                format!("{} {verb} {n} {noun}", ranks(list))
            })
            .collect();
        s.push_str(&said.join(", "));
        s.push_str("; ");
    }
    let longest = lens.iter().copied().max().unwrap_or(0);
    let at = (0..longest).find(|&i| lists.iter().any(|l| l.get(i) != lists[0].get(i)));
    match at {
        Some(i) => {
            let keys: Vec<String> = lists.iter().map(|l| member_words(l.get(i))).collect();
            let said: Vec<String> = groups(&keys)
                .into_iter()
                .map(|(w, list)| format!("{} {w}", ranks(&list)))
                .collect();
            let lead = if by_len.len() > 1 {
                "first difference at member"
            } else {
                "member"
            };
            let _ = write!(s, "{lead} {i}: {}", said.join(", "));
        }
        None => {
            // Same members: the rest of the signature (bucket sizes, reduction) differs.
            let words: Vec<&str> = reports.iter().map(|r| r.words.as_str()).collect();
            let said: Vec<String> = groups(&words)
                .into_iter()
                .map(|(w, list)| format!("{}: {w}", ranks(&list)))
                .collect();
            s.push_str(&said.join("; "));
        }
    }
    s
}

/// The sequence verdict: out of step when the ranks' counts differ, or when after a
/// mismatch a rank's last collective is the others' current one (it skipped one) or its
/// current one is the others' last (it made one more); `None` when in step.
fn sequence(reports: &[&Report]) -> Option<Verdict> {
    let counts: Vec<u64> = reports.iter().map(|r| r.count).collect();
    let by_count = groups(&counts);
    if by_count.len() > 1 {
        let said: Vec<String> = by_count
            .iter()
            .map(|(c, list)| format!("{} at collective {c}", ranks(list)))
            .collect();
        return Some(Verdict::OutOfStep(format!(
            "the ranks are out of step on this communicator: {}",
            said.join(", ")
        )));
    }
    if reports.iter().any(|r| r.last.is_none()) {
        return None;
    }
    let current: Vec<i64> = reports.iter().map(|r| r.call).collect();
    let last: Vec<i64> = reports
        .iter()
        .map(|r| r.last.as_ref().map_or(0, |l| l.0))
        .collect();
    let now = majority(&current)?;
    let in_step: Vec<usize> = (0..reports.len()).filter(|&r| current[r] == now).collect();
    let before = majority(&in_step.iter().map(|&r| last[r]).collect::<Vec<_>>())?;
    if before == now {
        // The same collective twice: a shift cannot be seen.
        return None;
    }
    // A rank whose last collective is the one the others make now, and which now makes
    // another. (One whose current call matches too only repeated it: a retry with the
    // right arguments after a mismatch looks the same as a skip between two equal calls,
    // and is taken as the retry.)
    let ahead: Vec<usize> = (0..reports.len())
        .filter(|&r| last[r] == now && current[r] != now)
        .collect();
    let behind: Vec<usize> = (0..reports.len())
        .filter(|&r| current[r] == before && current[r] != now)
        .collect();
    if ahead.is_empty() && behind.is_empty() {
        return None;
    }
    let others: Vec<usize> = (0..reports.len())
        .filter(|r| !ahead.contains(r) && !behind.contains(r))
        .collect();
    let n = reports[0].count;
    let words_now = &reports[others.first().copied().unwrap_or(0)].words;
    let words_before = reports
        .iter()
        .zip(&last)
        .find(|(_, &l)| l == before)
        .and_then(|(r, _)| r.last.as_ref().map(|l| l.1.clone()))
        .unwrap_or_default();
    let mut said = Vec::new();
    if !ahead.is_empty() {
        said.push(format!(
            "{} at collective {}, {} at {n}: the collective {} made last ({}) is the one {} \
             make now, so {} skipped one they made ({words_before}) or they made one it did not",
            ranks(&ahead),
            n + 1,
            ranks(&others),
            ranks(&ahead),
            words_now,
            ranks(&others),
            ranks(&ahead),
        ));
    }
    if !behind.is_empty() {
        said.push(format!(
            "{} at collective {}, {} at {n}: {} now makes the collective the others made last \
             ({words_before}), so it made one more than they did (or they skipped one)",
            ranks(&behind),
            n - 1,
            ranks(&others),
            ranks(&behind),
        ));
    }
    Some(Verdict::OutOfStep(format!(
        "the ranks are out of step on this communicator: {} (collectives counted on this \
         communicator from its first dlpack-mpi collective)",
        said.join("; ")
    )))
}
