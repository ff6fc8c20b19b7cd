//! `plan_exchange` (issue 32): the build of an [`Exchange`], planned point-to-point
//! messages run step after step by [`crate::comm::engine::exchange`] (its module docs say
//! what a step does and detects).
//!
//! The build, on every rank of the communicator:
//!
//! 1. **Local checks** (before any MPI call): one `(rank, tag)` per member
//!    ([`Error::ListLengthMismatch`]); each member's facts (`Access::Read` for a send,
//!    `Access::Write` for a receive: read-only, copied or self-overlapping receive members
//!    are refused, as device memory); each rank in the communicator and each tag in
//!    `0..=MPI_TAG_UB` (`any_source` and `any_tag` are refused: [`Error::InvalidRank`],
//!    [`Error::InvalidTag`]; an exchange's messages are matched once, at the build); no
//!    receive member overlapping another member ([`Error::BuffersAlias`]; two members with
//!    the same shape and strides whose elements interleave without touching — the columns
//!    of one array — are accepted: their elements are disjoint, and both go through this
//!    crate's staging, never to MPI directly); and, for each strided member, its chunks'
//!    copies prepared and its staging buffers allocated. Each error is [`Error::Member`]
//!    with the member's index, the receive members numbered after the send members.
//! 2. **Agreement**: the full agreement of an unplanned collective (signature
//!    `plan_exchange`): a local refusal is [`Error::PeerRefused`] on the peers; a rank that
//!    calls another collective is a [`Error::CollectiveMismatch`] on every rank.
//! 3. **The plans' communicator** ([`crate::comm::engine::ledger`]): made at the first
//!    plan or exchange of the caller's communicator, shared by them.
//! 4. **Cross-check**: each rank sends each peer one record per message stream it sends
//!    the peer and per stream it receives from it (direction, tag, dtype, element count,
//!    strided or not, chunk size, member index: seven `int64`), and pairs the records with
//!    its own, tag by tag in list order (MPI-4.1 §3.5: the k-th send to a (rank, tag)
//!    matches the k-th receive posted for it). A receive nobody sends, a send nobody
//!    receives, a dtype, element count or chunk size that differs: in words on both ranks
//!    of the pair, and [`Error::CollectiveMismatch`] on every rank (the lowest such rank's
//!    words reach the others).
//!
//! **Chunk size.** [`CHUNK_BYTES`] is 1 MiB, [`DEPTH`] 2 (at most 2 MiB of staging per
//! strided member), by measurement on the development machine: a 2-core VM shared with
//! other jobs (load 1 to 5 during the runs, so each number is the fastest of 25 steps),
//! Open MPI 4.1.4 over shared memory, 2 ranks, release build; a step exchanges one member
//! each way between the ranks. Transposed 1024 × 1024 float32 view (4 MiB) to a
//! contiguous tensor and back, chunks of 16 KiB: 5.6 ms, 32 KiB 3.8, 64 KiB 2.5, 128 KiB
//! 2.0, 256 KiB 2.3, 512 KiB 2.2, 1 MiB 1.7, 2 MiB 1.7, 4 MiB 1.7, one message 1.7;
//! transposed at both ends: 16 KiB 9.8 ms, 64 KiB 3.1, 256 KiB 2.2, 1 MiB 2.1, 4 MiB 1.7,
//! one message 1.6. Transposed 2048 × 2048 (16 MiB) at both ends, 2 buffers: 64 KiB
//! 57.5 ms, 256 KiB 30.7, 1 MiB 24.6, 4 MiB 25.1, one message 30.2; with 8 buffers, in a
//! quieter window: 21.0, 13.5, 12.0, 11.4 and 19.6. Per-message costs dominate below
//! 256 KiB; from 1 MiB up the chunks are as fast as one message or faster (the wire
//! overlaps the packing), and 1 MiB keeps the staging small. 3, 4 and 8 staging buffers
//! differed from 2 by no more than the machine's noise. To measure again on a quiet
//! many-core machine, vary the two constants and time a step.

use std::collections::{BTreeMap, HashMap};

use mpi::raw::AsRaw;
use mpi::topology::{Communicator, Rank};
use mpi::Tag;

use crate::comm::engine::agree::agree;
use crate::comm::engine::checks::{check_disjoint, check_intra, check_rank, check_tag};
use crate::comm::engine::exchange::{assemble, share, verdict, Exchange};
use crate::comm::engine::exchange::{Copies, Piece, Stream};
use crate::comm::engine::exchange::{CHUNK_BYTES, DEPTH, MAX_MESSAGE_BYTES};
use crate::comm::engine::ledger;
use crate::comm::engine::signature::Signature;
use crate::comm::engine::stager::Endpoint;
use crate::dlpack::{Tensor, TensorListMut};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::{self, Axis};
use crate::spec::facts::{kernel_refusal, Facts};
use crate::spec::kernels::Prepared;
use crate::spec::Access;

/// One member as the build prepared it: its peer, tag, facts and, when strided, its
/// chunks' copies and staging buffers.
struct Side {
    recv: bool,
    index: usize,
    peer: Rank,
    tag: Tag,
    facts: Facts,
    bytes: usize,
    staged: Option<(Copies, Vec<Box<[u8]>>)>,
}

/// Elements per chunk of a message with a strided end, for `elem`-byte elements.
fn chunk_elems(elem: usize) -> usize {
    (CHUNK_BYTES / elem.max(1)).max(1)
}

/// `plan_exchange`: the exchange of `sends` (to `to[i]`) and `recvs` (from `from[j]`) on
/// `tc`'s communicator (see the module docs).
pub(in crate::comm) fn plan_exchange<'a, E, S, R>(
    tc: &'a E,
    sends: &'a mut S,
    to: &[(Rank, Tag)],
    recvs: &'a mut R,
    from: &[(Rank, Tag)],
) -> Result<Exchange<'a, S, R>>
where
    E: Endpoint + ?Sized,
    S: TensorListMut + ?Sized,
    R: TensorListMut + ?Sized,
{
    let comm = tc.communicator();
    check_intra(comm)?;
    let (me, size) = (comm.rank(), comm.size());
    let prepared = {
        let s: Vec<&dyn Tensor> = sends.tensors_mut().into_iter().map(|t| &*t).collect();
        let r: Vec<&dyn Tensor> = recvs.tensors_mut().into_iter().map(|t| &*t).collect();
        prepare((&s, to), (&r, from), size)
    };
    let (sides, _) = agree(comm, &Signature::of("plan_exchange"), prepared)?;
    let (steps, _) = ledger::plans(comm);
    let chunks = cross_check(steps, (me, size), &sides)?;
    let streams = sides
        .into_iter()
        .zip(chunks)
        .map(|(side, chunk)| stream(side, chunk))
        .collect();
    // SAFETY: the streams' memory is the members' (borrowed by the exchange for 'a, checked
    // by their facts) or their own buffers, moved into the exchange; every rank matched
    // its streams with its peers' (the cross-check) on the plans' communicator.
    Ok(unsafe { assemble(sends, recvs, steps, streams) })
}

/// The local checks and preparations of every member (step 1 of the module docs).
fn prepare(
    (sends, to): (&[&dyn Tensor], &[(Rank, Tag)]),
    (recvs, from): (&[&dyn Tensor], &[(Rank, Tag)]),
    size: Rank,
) -> Result<Vec<Side>> {
    crate::mpi_library::ensure_matching()?;
    for (what, list, pairs) in [
        (
            "plan_exchange's `to` (one (rank, tag) per send member)",
            sends,
            to,
        ),
        (
            "plan_exchange's `from` (one (rank, tag) per receive member)",
            recvs,
            from,
        ),
    ] {
        if list.len() != pairs.len() {
            return Err(Error::ListLengthMismatch {
                what,
                expected: list.len(),
                actual: pairs.len(),
            });
        }
    }
    let ns = sends.len();
    let members = sends.iter().zip(to).map(|(t, p)| (false, *t, *p));
    let members = members.chain(recvs.iter().zip(from).map(|(t, p)| (true, *t, *p)));
    let sides = members
        .enumerate()
        .map(|(i, (recv, t, at))| {
            let index = if recv { i - ns } else { i };
            side(recv, index, t, at, size).map_err(|e| Error::Member {
                index: i,
                source: Box::new(e),
            })
        })
        .collect::<Result<Vec<Side>>>()?;
    let all: Vec<&dyn Tensor> = sends.iter().chain(recvs).copied().collect();
    for j in ns..all.len() {
        for k in (0..all.len()).filter(|&k| k != j && (k < ns || k > j)) {
            disjoint((all[j], &sides[j].facts), (all[k], &sides[k].facts)).map_err(|e| {
                Error::Member {
                    index: j,
                    source: Box::new(e),
                }
            })?;
        }
    }
    Ok(sides)
}

/// One member's checks and preparation: its peer and tag, its facts, and its chunks'
/// copies and staging buffers when it is strided.
fn side(
    recv: bool,
    index: usize,
    t: &dyn Tensor,
    (peer, tag): (Rank, Tag),
    size: Rank,
) -> Result<Side> {
    check_rank(peer, size)?;
    check_tag(tag)?;
    let access = if recv { Access::Write } else { Access::Read };
    let facts = Facts::of(t, access, None)?;
    let bytes = facts.packed_bytes()?;
    let staged = match &facts.plan {
        None => None,
        Some(_) => Some(staged(&facts, bytes, recv)?),
    };
    Ok(Side {
        recv,
        index,
        peer,
        tag,
        facts,
        bytes,
        staged,
    })
}

/// A receive member and another member are disjoint: their byte ranges are, or they have
/// the same element size, shape and strides and their elements interleave without
/// touching (the two as one tensor with an outer axis of extent 2 from one to the other
/// have no overlapping elements, `layout::check_no_overlap`).
fn disjoint((a, fa): (&dyn Tensor, &Facts), (b, fb): (&dyn Tensor, &Facts)) -> Result<()> {
    let by_range = check_disjoint(fa, fb);
    if by_range.is_ok() || fa.is_contiguous() || fb.is_contiguous() {
        return by_range;
    }
    let elem = fa.element.size_bytes();
    let (Some(sa), Some(sb)) = (a.strides_elems(), b.strides_elems()) else {
        return by_range;
    };
    let apart = (fb.first as i128) - (fa.first as i128);
    let same = elem == fb.element.size_bytes() && a.shape() == b.shape() && sa == sb;
    if !same || elem == 0 || apart % elem as i128 != 0 {
        return by_range;
    }
    let Ok(apart) = i64::try_from(apart / elem as i128) else {
        return by_range;
    };
    let shape: Vec<i64> = std::iter::once(2)
        .chain(a.shape().iter().copied())
        .collect();
    let strides: Vec<i64> = std::iter::once(apart).chain(sa.iter().copied()).collect();
    match layout::check_no_overlap(&shape, Some(&strides)) {
        Ok(()) => Ok(()),
        Err(_) => by_range,
    }
}

/// A new zeroed buffer of `len` bytes, or [`Error::Allocation`].
fn buffer(len: usize) -> Result<Box<[u8]>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| Error::Allocation {
        bytes: u64::try_from(len).unwrap_or(u64::MAX),
        purpose: "an exchange's staging buffer",
    })?;
    v.resize(len, 0);
    Ok(v.into_boxed_slice())
}

/// A strided member's chunks' copies (a pack for a send, an unpack for a receive; chunk
/// `k` is logical elements `[k·C, (k+1)·C)`, [`chunk_elems`]) and its staging buffers
/// ([`DEPTH`] at most, of one chunk or the whole member when smaller).
fn staged(facts: &Facts, bytes: usize, recv: bool) -> Result<(Copies, Vec<Box<[u8]>>)> {
    let elem = facts.element.size_bytes();
    let plan = facts
        .plan
        .as_deref()
        .ok_or_else(|| crate::comm::engine::checks::missing("a strided member's plan"))?;
    let c = i64::try_from(chunk_elems(elem)).unwrap_or(i64::MAX);
    let n = facts.len_elems;
    let chunks = if n <= 0 { 1 } else { (n - 1) / c + 1 };
    let mut copies = Copies {
        starts: vec![0],
        pieces: Vec::new(),
        prepared: Vec::new(),
    };
    let mut known: HashMap<Vec<Axis>, usize> = HashMap::new();
    let mut boxes_of_chunk = Vec::new();
    for k in 0..chunks {
        let (a, b) = (k * c, ((k + 1) * c).min(n));
        boxes_of_chunk.clear();
        if b > a {
            boxes(&plan.axes, 0, (a, b), &mut boxes_of_chunk);
        }
        let mut at = 0usize;
        for (base, axes) in boxes_of_chunk.drain(..) {
            let elems: i64 = axes.iter().map(|x| x.extent).product();
            let len = usize::try_from(elems).unwrap_or(0) * elem;
            let copy = match known.get(&axes) {
                Some(&i) => i,
                None => {
                    let p = if recv {
                        Prepared::unpack(&axes, elem, len)
                    } else {
                        Prepared::pack(&axes, elem, len)
                    };
                    copies
                        .prepared
                        .push(p.ok_or_else(|| kernel_refusal(plan, elem))?);
                    known.insert(axes, copies.prepared.len() - 1);
                    copies.prepared.len() - 1
                }
            };
            let offset = isize::try_from(base).unwrap_or(0) * isize::try_from(elem).unwrap_or(0);
            copies.pieces.push(Piece { offset, at, copy });
            at += len;
        }
        copies.starts.push(copies.pieces.len());
    }
    let depth = usize::try_from(chunks).unwrap_or(1).min(DEPTH);
    let len = (chunk_elems(elem) * elem).min(bytes);
    let buffers = (0..depth).map(|_| buffer(len)).collect::<Result<_>>()?;
    Ok((copies, buffers))
}

/// The boxes of the logical elements `[a, b)` (`0 ≤ a < b ≤` the element count) of the
/// layout `axes` (outermost first, strides in elements) from the element offset `base`,
/// in logical order: each `(offset of its first element, its axes)`, consecutive in
/// logical order, at most `2·axes − 1` of them (a partial row, whole rows, a partial row,
/// at each depth).
fn boxes(axes: &[Axis], base: i64, (a, b): (i64, i64), out: &mut Vec<(i64, Vec<Axis>)>) {
    let Some((head, rest)) = axes.split_first() else {
        out.push((base, Vec::new()));
        return;
    };
    let inner: i64 = rest.iter().map(|x| x.extent).product();
    let (mut qa, ra, qb, rb) = (a / inner, a % inner, b / inner, b % inner);
    let row = |q: i64| base + q * head.stride_elems;
    if qa == qb {
        return boxes(rest, row(qa), (ra, rb), out);
    }
    if ra != 0 {
        boxes(rest, row(qa), (ra, inner), out);
        qa += 1;
    }
    if qb > qa {
        let mut whole = vec![Axis {
            extent: qb - qa,
            stride_elems: head.stride_elems,
        }];
        whole.extend_from_slice(rest);
        out.push((row(qa), whole));
    }
    if rb != 0 {
        boxes(rest, row(qb), (0, rb), out);
    }
}

/// One end of a stream as the cross-check's records carry it.
#[derive(Debug, Clone, Copy)]
struct Rec {
    recv: bool,
    tag: Tag,
    dtype: DType,
    count: i64,
    strided: bool,
    chunk: i64,
    index: usize,
}

/// Words per record.
const WORDS: usize = 7;

impl Rec {
    fn of(s: &Side) -> Rec {
        let elem = s.facts.element.size_bytes();
        Rec {
            recv: s.recv,
            tag: s.tag,
            dtype: s.facts.element.dtype,
            count: s.facts.len_elems,
            strided: s.staged.is_some(),
            chunk: i64::try_from(chunk_elems(elem) * elem).unwrap_or(i64::MAX),
            index: s.index,
        }
    }

    fn words(&self) -> [i64; WORDS] {
        let d = self.dtype;
        let dtype = i64::from(d.code) | i64::from(d.bits) << 8 | i64::from(d.lanes) << 16;
        [
            i64::from(self.recv),
            i64::from(self.tag),
            dtype,
            self.count,
            i64::from(self.strided),
            self.chunk,
            i64::try_from(self.index).unwrap_or(i64::MAX),
        ]
    }

    fn read(w: &[i64]) -> Rec {
        let byte = |x: i64| u8::try_from(x & 0xff).unwrap_or(0);
        Rec {
            recv: w[0] != 0,
            tag: Tag::try_from(w[1]).unwrap_or(-1),
            dtype: DType {
                code: byte(w[2]),
                bits: byte(w[2] >> 8),
                lanes: u16::try_from(w[2] >> 16 & 0xffff).unwrap_or(0),
            },
            count: w[3],
            strided: w[4] != 0,
            chunk: w[5],
            index: usize::try_from(w[6]).unwrap_or(usize::MAX),
        }
    }
}

/// The cross-check (step 4 of the module docs) on `steps`, the plans' communicator:
/// returns each side's bytes per message.
///
/// # Errors
/// [`Error::CollectiveMismatch`] on every rank when any rank's messages do not pair.
fn cross_check(
    steps: mpi::ffi::MPI_Comm,
    (me, size): (Rank, Rank),
    sides: &[Side],
) -> Result<Vec<usize>> {
    let ranks = usize::try_from(size).unwrap_or(0);
    let mut out = vec![Vec::new(); ranks];
    for s in sides {
        out[usize::try_from(s.peer).unwrap_or(0)].extend(Rec::of(s).words());
    }
    let incoming = share(steps, &out);
    let mut chunks = vec![0usize; sides.len()];
    let mut findings: Vec<(Rank, String)> = Vec::new();
    for (p, words) in (0..size).zip(&incoming) {
        let theirs: Vec<Rec> = words.chunks_exact(WORDS).map(Rec::read).collect();
        for recv in [true, false] {
            let mine = sides
                .iter()
                .enumerate()
                .filter(|(_, s)| s.peer == p && s.recv == recv);
            let peer = theirs.iter().filter(|r| r.recv != recv).copied();
            let ends = if recv { (p, me) } else { (me, p) };
            let found = pair((mine.collect(), recv), peer.collect(), ends, &mut chunks);
            if recv || p != me {
                findings.extend(found.into_iter().map(|f| (p, f)));
            }
        }
    }
    let words: String = findings
        .iter()
        .map(|(_, f)| f.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    let mine = findings.first().map(|(p, _)| (*p, words.as_str()));
    match verdict(steps, me, size, mine) {
        None => Ok(chunks),
        Some((lowest, peer, theirs)) => Err(Error::CollectiveMismatch {
            rank: lowest,
            arguments: format!("plan_exchange on rank {lowest}"),
            other_rank: peer,
            other_arguments: format!("plan_exchange on rank {peer}"),
            difference: format!(
                "plan_exchange's messages do not pair (MPI-4.1 §3.5: each send to a rank and \
                 tag meets that rank's receive from this rank and tag, in order): {}",
                if findings.is_empty() {
                    format!("rank {lowest} found: {theirs}")
                } else {
                    words
                }
            ),
        }),
    }
}

/// Pairs this rank's streams `mine` (`(side index, side)`, all with one peer, receives
/// when `receives`) with the peer's records of the other end, tag by tag in list order; `ends` are
/// the sending and the receiving rank. Writes each paired side's bytes per message into
/// `chunks` and returns what does not pair, in words.
fn pair(
    (mine, receives): (Vec<(usize, &Side)>, bool),
    theirs: Vec<Rec>,
    (sender, receiver): (Rank, Rank),
    chunks: &mut [usize],
) -> Vec<String> {
    type Ends = (Vec<(usize, Rec, usize)>, Vec<Rec>);
    let mut by_tag: BTreeMap<Tag, Ends> = BTreeMap::new();
    for (i, s) in mine {
        let elem = s.facts.element.size_bytes();
        by_tag
            .entry(s.tag)
            .or_default()
            .0
            .push((i, Rec::of(s), elem));
    }
    for r in theirs {
        by_tag.entry(r.tag).or_default().1.push(r);
    }
    let mut found = Vec::new();
    for (mine, theirs) in by_tag.values() {
        for k in 0..mine.len().max(theirs.len()) {
            let (m, t) = (mine.get(k), theirs.get(k).copied());
            let mr = m.map(|m| m.1);
            let (send, recv) = if receives {
                ((sender, t), (receiver, mr))
            } else {
                ((sender, mr), (receiver, t))
            };
            match (m, t) {
                (Some(&(i, a, elem)), Some(b)) => match differs(&a, &b) {
                    Some(field) => found.push(words(send, recv, Some(field))),
                    None => chunks[i] = message_bytes(send.1, recv.1, elem),
                },
                _ => found.push(words(send, recv, None)),
            }
        }
    }
    found
}

/// The first field in which the two ends of a message differ.
fn differs(a: &Rec, b: &Rec) -> Option<&'static str> {
    if a.dtype != b.dtype {
        Some("dtype")
    } else if a.count != b.count {
        Some("element count")
    } else if a.chunk != b.chunk {
        Some("chunk size (another build of dlpack-mpi?)")
    } else {
        None
    }
}

/// The bytes per message of a pair: a chunk when either end is strided, else the largest
/// message (whole elements, at least one).
fn message_bytes(send: Option<Rec>, recv: Option<Rec>, elem: usize) -> usize {
    let strided = send.is_some_and(|r| r.strided) || recv.is_some_and(|r| r.strided);
    let limit = if strided {
        send.map_or(CHUNK_BYTES, |r| {
            usize::try_from(r.chunk).unwrap_or(CHUNK_BYTES)
        })
    } else {
        MAX_MESSAGE_BYTES
    };
    (limit / elem.max(1)).max(1) * elem.max(1)
}

/// A message that does not pair, in words: its sender and receiver (each with its record
/// when it has one) and the `field` that differs when both have one.
fn words(send: (Rank, Option<Rec>), recv: (Rank, Option<Rec>), field: Option<&str>) -> String {
    let what = |r: &Rec| format!("{} × {}", r.dtype, r.count);
    match (send, recv) {
        ((s, Some(a)), (r, Some(b))) => format!(
            "rank {s} sends its send member {} ({}) to rank {r} with tag {}, and rank {r} \
             receives it into its receive member {} ({}): the {} differs",
            a.index,
            what(&a),
            a.tag,
            b.index,
            what(&b),
            field.unwrap_or("record")
        ),
        ((s, Some(a)), (r, None)) => format!(
            "rank {s} sends its send member {} ({}) to rank {r} with tag {}, which no receive \
             of rank {r} takes",
            a.index,
            what(&a),
            a.tag
        ),
        ((s, None), (r, Some(b))) => format!(
            "rank {r} receives its receive member {} ({}) from rank {s} with tag {}, which \
             rank {s} does not send",
            b.index,
            what(&b),
            b.tag
        ),
        _ => String::new(),
    }
}

/// The engine's stream of a prepared side whose messages carry `chunk` bytes each.
fn stream(side: Side, chunk: usize) -> Stream {
    let unit = side.facts.element.row.unit;
    Stream {
        recv: side.recv,
        index: side.index,
        peer: side.peer,
        tag: side.tag,
        first: side.facts.first.cast(),
        bytes: side.bytes,
        chunk: chunk.max(1),
        unit: unit.datatype().as_raw(),
        unit_bytes: unit.size_bytes(),
        staged: side.staged,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The element offsets of `axes` from `base`, in logical order.
    fn offsets(axes: &[Axis], base: i64) -> Vec<i64> {
        let len_elems = axes.iter().map(|a| a.extent).product();
        let plan = layout::Plan {
            axes: axes.to_vec(),
            len_elems,
            lowest_elem: 0,
            highest_elem: 0,
        };
        plan.offsets().map(|o| base + o).collect()
    }

    /// The boxes of every range `[a, b)` of a few layouts (a transpose, three axes with a
    /// negative stride, one axis) hold exactly its elements, in logical order, and are at
    /// most `2·axes − 1`.
    #[test]
    fn boxes_cover_a_range_in_logical_order() {
        let ax = |v: &[(i64, i64)]| -> Vec<Axis> {
            v.iter()
                .map(|&(extent, stride_elems)| Axis {
                    extent,
                    stride_elems,
                })
                .collect()
        };
        let layouts = [
            ax(&[(5, 1), (7, 5)]),
            ax(&[(3, -40), (4, 10), (6, 1)]),
            ax(&[(11, 3)]),
        ];
        for axes in &layouts {
            let all = offsets(axes, 0);
            let n = i64::try_from(all.len()).unwrap_or(0);
            for a in 0..n {
                for b in a + 1..=n {
                    let mut out = Vec::new();
                    boxes(axes, 0, (a, b), &mut out);
                    assert!(out.len() < 2 * axes.len(), "{axes:?} [{a}, {b}): {out:?}");
                    let got: Vec<i64> = out.iter().flat_map(|(o, x)| offsets(x, *o)).collect();
                    let want =
                        &all[usize::try_from(a).unwrap_or(0)..usize::try_from(b).unwrap_or(0)];
                    assert_eq!(got, want, "{axes:?} [{a}, {b})");
                }
            }
        }
    }
}
