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
            "{} sent no dlpack-mpi report in the agreement's exchange: a rank of this \
             communicator is not taking part in dlpack-mpi's agreement (a plain MPI or mpi4py \
             collective, or another DLPACK_MPI_AGREEMENT)",
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
    let watching = reports.iter().any(|r| r.last.is_some());
    let hint = if watching {
        ""
    } else {
        " (if a rank skipped or added a collective on this communicator, the next collective \
         on it names that rank)"
    };
    let difference = if first.nonblocking != theirs.nonblocking {
        let forms: Vec<(bool, &str)> = reports
            .iter()
            .map(|r| (r.nonblocking, r.words.as_str()))
            .collect();
        let said: Vec<String> = groups(&forms)
            .into_iter()
            .map(|((nb, words), list)| {
                let form = if nb { "nonblocking" } else { "blocking" };
                format!("{} called the {form} form ({words})", ranks(&list))
            })
            .collect();
        format!(
            "{}; a blocking and a nonblocking collective never match (MPI-4.1 §6.12): call the \
             same form on every rank",
            said.join(", ")
        )
    } else if let (Some(_), Some(_)) = (&first.members, &theirs.members) {
        let op = first.words.split(" members").next().unwrap_or(&first.words);
        let op = op.rsplit_once(' ').map_or(op, |(head, _)| head);
        format!("{op}: {}{hint}", lists(&reports))
    } else {
        let words: Vec<&str> = reports.iter().map(|r| r.words.as_str()).collect();
        let said = groups(&words)
            .into_iter()
            .map(|(w, list)| format!("{}: {w}", ranks(&list)))
            .collect::<Vec<_>>()
            .join("; ");
        format!("{said}{hint}")
    };
    Verdict::Mismatch {
        arguments: first.words.clone(),
        other_rank: i32::try_from(other).unwrap_or(i32::MAX),
        other_arguments: theirs.words.clone(),
        difference,
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
    let before = last[in_step[0]];
    if before == now || in_step.iter().any(|&r| last[r] != before) {
        // The same collective twice, or ranks in step now that differed last time: a shift
        // cannot be told from arguments that differed.
        return None;
    }
    // A rank whose last collective is the one the others make now, and which now makes
    // another. (One whose current call matches too only repeated it: a retry with the
    // right arguments after a mismatch looks the same as a skip between two equal calls,
    // and is taken as the retry.)
    let ahead: Vec<usize> = (0..reports.len())
        .filter(|&r| last[r] == now && current[r] != now)
        .collect();
    // A rank that now makes the others' last collective, after another one of its own.
    let behind: Vec<usize> = (0..reports.len())
        .filter(|&r| current[r] == before && last[r] != before)
        .collect();
    if ahead.is_empty() && behind.is_empty() {
        return None;
    }
    let said = shifted(reports, &ahead, &behind, (&last, before));
    Some(Verdict::OutOfStep(format!(
        "the ranks are out of step on this communicator: {} (collectives numbered in the \
         order of the ranks that agree, from the communicator's first dlpack-mpi collective)",
        said.join("; ")
    )))
}

/// The words for ranks `ahead` (skipped one) and `behind` (made one more) of the others;
/// `last` every rank's last fingerprint, `before` the others'.
fn shifted(
    reports: &[&Report],
    ahead: &[usize],
    behind: &[usize],
    (last, before): (&[i64], i64),
) -> Vec<String> {
    let others: Vec<usize> = (0..reports.len())
        .filter(|r| !ahead.contains(r) && !behind.contains(r))
        .collect();
    let n = reports[0].count;
    let words_now = &reports[others.first().copied().unwrap_or(0)].words;
    let words_before = reports
        .iter()
        .zip(last)
        .find(|(_, &l)| l == before)
        .and_then(|(r, _)| r.last.as_ref().map(|l| l.1.clone()))
        .unwrap_or_default();
    let (o, verb) = (
        ranks(&others),
        if others.len() == 1 { "makes" } else { "make" },
    );
    let mut said = Vec::new();
    if !ahead.is_empty() {
        let a = ranks(ahead);
        said.push(format!(
            "{a} at collective {}, {o} at {n}: the collective {a} made last ({words_now}) is \
             the one {o} {verb} now, so {a} skipped one that {o} made ({words_before}), or {o} \
             made one that {a} did not",
            n + 1,
        ));
    }
    if !behind.is_empty() {
        let b = ranks(behind);
        said.push(format!(
            "{b} at collective {}, {o} at {n}: {b} now makes the collective {o} made last \
             ({words_before}), so {b} made one more than {o} (or {o} skipped one)",
            n - 1,
        ));
    }
    said
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::code;

    fn report(count: u64, call: i64, words: &str) -> Report {
        Report {
            count,
            nonblocking: false,
            call,
            words: words.into(),
            members: None,
            last: None,
        }
    }

    fn list(n: usize, odd: Option<(usize, DType)>) -> Option<Vec<(DType, Vec<i64>)>> {
        let f32 = DType::new(code::FLOAT, 32);
        Some(
            (0..n)
                .map(|i| match odd {
                    Some((j, d)) if i == j => (d, vec![2048]),
                    _ => (f32, vec![2048]),
                })
                .collect(),
        )
    }

    #[test]
    fn reports_round_trip_and_foreign_bytes_do_not_decode() {
        let mut r = report(7, -3, "all_reduce_tensors 2 members");
        r.nonblocking = true;
        r.members = list(2, Some((1, DType::new(code::FLOAT, 64))));
        r.last = Some((42, "broadcast float32 × 4 root 0".into()));
        assert_eq!(Report::decode(&r.encode()), Some(r.clone()));
        let bytes = r.encode();
        assert_eq!(Report::decode(&bytes[..bytes.len() - 1]), None);
        assert_eq!(Report::decode(&[1, 2, 3]), None);
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(Report::decode(&long), None);
    }

    #[test]
    fn ranks_are_grouped_in_ranges() {
        assert_eq!(ranks(&[2]), "rank 2");
        assert_eq!(ranks(&[0, 1]), "ranks 0, 1");
        assert_eq!(ranks(&[0, 1, 2, 3, 5]), "ranks 0–3, 5");
    }

    #[test]
    fn a_list_member_is_named_with_index_dtype_and_shape() {
        let words = "all_reduce_tensors 161 members sum";
        let mut rs: Vec<Option<Report>> = (0..3)
            .map(|_| {
                let mut r = report(1, 5, words);
                r.members = list(161, None);
                Some(r)
            })
            .collect();
        if let Some(r) = rs[2].as_mut() {
            r.call = 6;
            r.members = list(161, Some((57, DType::new(code::FLOAT, 64))));
        }
        let Verdict::Mismatch {
            other_rank,
            difference,
            ..
        } = explain(&rs)
        else {
            panic!("{:?}", explain(&rs))
        };
        assert_eq!(other_rank, 2);
        assert!(
            difference.starts_with(
                "all_reduce_tensors: member 57: ranks 0, 1 float32 [2048], rank 2 float64 [2048]"
            ),
            "{difference}"
        );
    }

    #[test]
    fn lists_of_different_lengths_say_who_has_which() {
        let mut rs: Vec<Option<Report>> = (0..3)
            .map(|_| {
                let mut r = report(1, 5, "w");
                r.members = list(161, None);
                Some(r)
            })
            .collect();
        if let Some(r) = rs[1].as_mut() {
            r.call = 6;
            r.members = list(160, None);
        }
        let Verdict::Mismatch { difference, .. } = explain(&rs) else {
            panic!()
        };
        assert!(
            difference.starts_with(
                "w: ranks 0, 2 have 161 members, rank 1 has 160 members; first difference at \
                 member 160: ranks 0, 2 float32 [2048], rank 1 no member"
            ),
            "{difference}"
        );
    }

    #[test]
    fn forms_are_named() {
        let mut rs: Vec<Option<Report>> = (0..2).map(|_| Some(report(3, 5, "w"))).collect();
        if let Some(r) = rs[1].as_mut() {
            r.call = 6;
            r.nonblocking = true;
        }
        let Verdict::Mismatch { difference, .. } = explain(&rs) else {
            panic!()
        };
        assert!(
            difference.starts_with(
                "rank 0 called the blocking form (w), rank 1 called the nonblocking form (w)"
            ),
            "{difference}"
        );
    }

    /// After a mismatch: a rank whose last call is the others' current one skipped one; a
    /// rank whose current call is the others' last made one more; a retry with the right
    /// arguments is agreed; counts that differ are out of step.
    #[test]
    fn the_sequence_after_a_mismatch() {
        let at = |count, call, last: i64| {
            let mut r = report(count, call, &format!("call {call}"));
            r.last = Some((last, format!("call {last}")));
            Some(r)
        };
        // Ranks 0, 1 made B (2) then C (3); rank 2 skipped B: C then D (4).
        let v = explain(&[at(3, 3, 2), at(3, 3, 2), at(3, 4, 3)]);
        let Verdict::OutOfStep(text) = v else {
            panic!("{v:?}")
        };
        assert!(
            text.contains("rank 2 at collective 4, ranks 0, 1 at 3")
                && text.contains("skipped one that ranks 0, 1 made (call 2)"),
            "{text}"
        );
        // Rank 2 repeated B: its current is the others' last.
        let v = explain(&[at(3, 3, 2), at(3, 3, 2), at(3, 2, 9)]);
        let Verdict::OutOfStep(text) = v else {
            panic!("{v:?}")
        };
        assert!(
            text.contains("rank 2 at collective 2, ranks 0, 1 at 3"),
            "{text}"
        );
        // A retry: every rank makes the call rank 2 made wrongly before.
        assert_eq!(
            explain(&[at(3, 3, 2), at(3, 3, 2), at(3, 3, 3)]),
            Verdict::Agreed
        );
        // Ranks in step now that differed last time: no sequence verdict, a mismatch.
        let v = explain(&[at(3, 1, 2), at(3, 3, 1), at(3, 3, 2)]);
        assert!(matches!(v, Verdict::Mismatch { .. }), "{v:?}");
        // Counts that differ.
        let v = explain(&[Some(report(6, 1, "a")), Some(report(7, 1, "a"))]);
        assert_eq!(
            v,
            Verdict::OutOfStep(
                "the ranks are out of step on this communicator: rank 0 at collective 6, \
                 rank 1 at collective 7"
                    .into()
            )
        );
        // A peer that sent no report.
        let v = explain(&[Some(report(1, 1, "a")), None]);
        assert!(matches!(v, Verdict::OutOfStep(t) if t.starts_with("rank 1 sent no")));
    }
}
