//! The fused collectives over lists of tensors as cases (`TensorComm::all_reduce_tensors_in_place`
//! and the others, README "Fused collectives"): `fused-allreduce` (in place),
//! `fused-allreduce-into`, `fused-bcast`, `fused-reduce-scatter`, and the nonblocking
//! `ifused-allreduce` (posted and completed as [`Call::Nonblocking`] says).
//!
//! A case's list is made from its dtype, layout and length ([`plan`]): members of the
//! case's dtype in the case's layout (of 7 elements, of the case's length, of 1), a
//! contiguous one of 0 elements and a 0-d one; in the `step` cases, float32 and int32
//! members between them (a mixed list, whose buckets split by dtype; under bool's logical
//! or, int32 alone). The cases of length 0 first run the empty list. The cases of
//! [`SMALL_BUCKETS_FROM`] elements or more run with buckets of [`SMALL_BUCKETS`] bytes (the
//! same on every rank: the case decides), so that a list is many buckets and members larger
//! than a bucket go alone; the others with the run's bucket sizes. Every member's values
//! are the dtype's closed forms ([`Kind::values`], a reduction's [`Kind::summands`]) from
//! an index of its own, so a member given another's elements fails, and every element of
//! every member is compared with values computed here, a reduction folded in the element
//! type's own arithmetic as in the single-tensor cases (the same exactness, half precision
//! included, the same recognition of the saturating-sum bug, and a member whose exact
//! inputs cannot carry every rank's data makes the case not checkable, `super::exact`);
//! every storage element between a received member's elements (a gap of a strided layout)
//! must be found as it was written before the call ([`read_checking_gaps`]), which the
//! single-tensor cases do not check. With a Python producer the case's own member (its
//! dtype, layout and length) is the producer's, the others are Rust-made. A member layout
//! the library refuses (`StridedNotSupported`) is a skip.

use std::fmt::Debug;

use dlpack_mpi::comm::TensorComm;
use dlpack_mpi::dlpack::Tensor;
use dlpack_mpi::dtype::{AnyBits, ReduceOp};
use dlpack_mpi::{settings, Error};
use mpi::traits::Communicator;

use super::args::Producer;
use super::context::{e, CaseContext, Res, RunContext, Verdict, SKIP_MARK};
use super::dtypes;
use super::kind::{Fold, Kind};
use super::matrix::{Comm, Layout, Op};
use super::nonblocking::Call;
use super::store::Store;
use crate::launch::Dev;

/// The cases of at least this many elements run with small buckets.
const SMALL_BUCKETS_FROM: i64 = 1000;

/// The small buckets: the first of each dtype, the others (bytes).
const SMALL_BUCKETS: (usize, usize) = (16, 64);

/// The fused collective of a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fused {
    /// `all_reduce_tensors_in_place`.
    AllReduce,
    /// `all_reduce_tensors`.
    AllReduceInto,
    /// `broadcast_tensors` from the last rank.
    Bcast,
    /// `reduce_scatter_block_tensors`.
    ReduceScatter,
}

impl Fused {
    fn of(op: Op) -> Option<Fused> {
        Some(match op {
            Op::FusedAllreduce => Fused::AllReduce,
            Op::FusedAllreduceInto => Fused::AllReduceInto,
            Op::FusedBcast => Fused::Bcast,
            Op::FusedReduceScatter => Fused::ReduceScatter,
            _ => return None,
        })
    }
}

/// A member's dtype: the case's (`Own`: the case's own member, of its dtype, layout and
/// length), or one of a mixed list's others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Of {
    Own,
    Case,
    Float32,
    Int32,
}

/// The members of the list of a case in `layout` with `n` elements: dtype, layout and
/// length of each, in list order; `mixed` puts float32 and int32 members between the
/// case's dtype's. The other lengths are those of the single-tensor cases (7, 0, 1, in the
/// same layouts), so that JAX, which compiles a conversion for each new shape and dtype
/// (25–35 ms each here), has made every member's shape before the fused cases.
fn plan(layout: Layout, n: i64, mixed: bool) -> Vec<(Of, Layout, i64)> {
    let mut list = vec![
        (Of::Case, layout, 7),
        (Of::Case, Layout::Contiguous, 0),
        (Of::Own, layout, n),
        (Of::Case, Layout::Scalar, 1),
        (Of::Case, layout, 1),
    ];
    if mixed {
        list.insert(1, (Of::Float32, Layout::Contiguous, 7));
        list.insert(3, (Of::Int32, layout, 7));
        list.insert(5, (Of::Float32, layout, 1));
        list.push((Of::Int32, Layout::Contiguous, 1));
    }
    list
}

/// What every member of a case shares: the collective, this rank `r` of `p`.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    fused: Fused,
    r: i32,
    p: i32,
}

impl Geometry {
    /// The broadcast's root.
    fn root(self) -> i32 {
        self.p - 1
    }
}

/// A tensor's storage, whatever its element type.
trait Held {
    /// Runs `f` on the tensor, acquired through its producer's path ([`Store::with_tensor`]).
    fn with(&self, run: &RunContext, f: &mut dyn FnMut(&mut dyn Tensor) -> Res<()>) -> Res<()>;
}

impl<S: AnyBits> Held for Store<S> {
    fn with(&self, run: &RunContext, f: &mut dyn FnMut(&mut dyn Tensor) -> Res<()>) -> Res<()> {
        self.with_tensor(run, |t| f(t))
    }
}

/// Runs `f` on the tensors of `stores`, all acquired at once, in order.
fn with_all(
    run: &RunContext,
    stores: &[&dyn Held],
    f: &mut dyn FnMut(&mut [&mut dyn Tensor]) -> Res<()>,
) -> Res<()> {
    fn nest<'t>(
        run: &RunContext,
        stores: &[&dyn Held],
        acquired: Vec<&'t mut (dyn Tensor + 't)>,
        f: &mut dyn FnMut(&mut [&mut dyn Tensor]) -> Res<()>,
    ) -> Res<()> {
        let Some((first, rest)) = stores.split_first() else {
            let mut acquired = acquired;
            return f(&mut acquired);
        };
        let mut acquired = Some(acquired);
        first.with(run, &mut |t| {
            let mut list: Vec<&mut dyn Tensor> = acquired
                .take()
                .unwrap_or_default()
                .into_iter()
                .map(|a| a as &mut dyn Tensor)
                .collect();
            list.push(t);
            nest(run, rest, list, f)
        })
    }
    nest(run, stores, Vec::with_capacity(stores.len()), f)
}

/// A member of a case's list, whatever its element type.
trait Member {
    /// The storage of its send tensor (the forms with a send list) and of the tensor the
    /// collective writes (or reduces in place).
    fn stores(&self) -> (Option<&dyn Held>, &dyn Held);
    /// What its tensor holds after the collective against the expected values; `corrupt`
    /// (`--inject-fault`) changes one element first.
    fn verify(self: Box<Self>, corrupt: bool) -> Res<Verdict>;
}

/// One member: its dtype, its context (the case's, in the member's layout), its index in
/// the list, its length and its tensors.
struct Part<'k, S: AnyBits> {
    kind: &'k Kind<S>,
    cx: CaseContext<'k>,
    index: usize,
    n: i64,
    g: Geometry,
    send: Option<Store<S>>,
    recv: Store<S>,
}

impl<'k, S: AnyBits + PartialEq + Debug> Part<'k, S> {
    /// Member `index` of `n` elements, its tensors made as `cx` says.
    fn new(
        kind: &'k Kind<S>,
        cx: CaseContext<'k>,
        (index, n): (usize, i64),
        g: Geometry,
    ) -> Res<Part<'k, S>> {
        let from = first_index(index);
        let values = |r, len| match g.fused {
            Fused::Bcast => kind.values(&cx, r, len, from),
            _ => kind.summands(cx.layout, (g.p, r), len, from),
        };
        let fill = vec![(kind.value)(-1, -1); n as usize * kind.per_elem];
        let (send, recv) = match g.fused {
            Fused::AllReduce => (None, values(g.r, n)),
            Fused::AllReduceInto => (Some(values(g.r, n)), fill),
            Fused::Bcast if g.r == g.root() => (None, values(g.r, n)),
            Fused::Bcast => (None, fill),
            Fused::ReduceScatter => (Some(values(g.r, i64::from(g.p) * n)), fill),
        };
        let send = send.map(|v| kind.owned_send(&cx, v)).transpose()?;
        let recv = kind.owned(&cx, recv)?;
        Ok(Part {
            kind,
            cx,
            index,
            n,
            g,
            send,
            recv,
        })
    }
}

/// The first element index of the values of member `index`.
fn first_index(index: usize) -> i64 {
    37 * index as i64
}

/// `f` folded over the `p` ranks' `len` inputs of `kind` ([`Kind::summands`]) from element
/// index `from` (in `cx`'s layout).
fn fold<S: AnyBits + PartialEq + Debug>(
    kind: &Kind<S>,
    cx: &CaseContext<'_>,
    (p, from): (i32, i64),
    f: Fold<S>,
    len: i64,
) -> Vec<S> {
    let mut acc = kind.summands(cx.layout, (p, 0), len, from);
    for q in 1..p {
        for (a, b) in acc
            .iter_mut()
            .zip(kind.summands(cx.layout, (p, q), len, from))
        {
            *a = f(*a, b);
        }
    }
    acc
}

/// The logical vector of `n` elements that `recv` holds (in `cx`'s layout, receive side),
/// once every storage element between them (a gap of a strided layout) is found as it was
/// made: a collective writes a member's elements only.
fn read_checking_gaps<S: AnyBits + PartialEq + Debug>(
    kind: &Kind<S>,
    cx: &CaseContext<'_>,
    recv: Store<S>,
    (n, r): (i64, i32),
    what: &str,
) -> Res<Vec<S>> {
    let k = kind.per_elem;
    let (_, _, elems, pos) = cx.layout.place(n, true);
    let storage = recv.into_vec(cx.run)?;
    if storage.len() < elems * k {
        return Err(format!(
            "rank {r}: {what}: read back {} storage items, expected {}",
            storage.len(),
            elems * k
        ));
    }
    let mut gap = vec![true; elems];
    for &p in &pos {
        gap[p] = false;
    }
    let fill = (kind.value)(-1, -1);
    let written =
        (0..elems).find(|&i| gap[i] && storage[i * k..(i + 1) * k].iter().any(|v| *v != fill));
    if let Some(i) = written {
        return Err(format!(
            "rank {r}: {what}: storage element {i}, a gap between its elements, was written: \
             expected {fill:?}, got {:?}",
            &storage[i * k..(i + 1) * k]
        ));
    }
    Ok(pos
        .iter()
        .flat_map(|&p| storage[p * k..(p + 1) * k].iter().copied())
        .collect())
}

impl<S: AnyBits + PartialEq + Debug> Member for Part<'_, S> {
    fn stores(&self) -> (Option<&dyn Held>, &dyn Held) {
        (self.send.as_ref().map(|s| s as &dyn Held), &self.recv)
    }

    fn verify(self: Box<Self>, corrupt: bool) -> Res<Verdict> {
        let Part {
            kind,
            cx,
            index,
            n,
            g,
            recv,
            ..
        } = *self;
        let from = first_index(index);
        let nk = n as usize * kind.per_elem;
        let what = format!(
            "member {index} ({} {}, {n} elements)",
            kind.name,
            cx.layout.name()
        );
        let mut got = read_checking_gaps(kind, &cx, recv, (n, g.r), &what)?;
        if corrupt && !got.is_empty() {
            let at = 3.min(got.len() - 1);
            got[at] = (kind.value)(-1, -1);
        }
        let reduce = kind.reduce.filter(|_| g.fused != Fused::Bcast);
        let Some((rop, f)) = reduce else {
            let expect = kind.values(&cx, g.root(), n, from);
            kind.compare(g.r, &format!("{what}: broadcast"), &expect, &got)?;
            return Ok(Verdict::Pass);
        };
        let (full, part) = match g.fused {
            Fused::ReduceScatter => {
                let mine = g.r as usize * nk;
                (i64::from(g.p) * n, mine..mine + nk)
            }
            _ => (n, 0..nk),
        };
        let expect = fold(kind, &cx, (g.p, from), f, full);
        let sum = format!("{what}: {}", rop.name());
        let Err(msg) = kind.compare(g.r, &sum, &expect[part.clone()], &got) else {
            // Exact, but the member's inputs may not carry every rank's data.
            let unchecked = kind.uncovered(cx.layout, g.p, full);
            return Ok(unchecked.map_or(Verdict::Pass, |why| {
                Verdict::NotCheckable(format!("{what}: {why}"))
            }));
        };
        // As the single-tensor reductions' `compare_reduced`: elements wrong only where
        // their saturating fold reached a bound are Open MPI's op/avx bug.
        if let Some((sat, at_bound)) = kind.saturating {
            let saturated = fold(kind, &cx, (g.p, from), sat, full);
            let explained = got.len() == part.len()
                && got
                    .iter()
                    .zip(&expect[part.clone()])
                    .zip(&saturated[part])
                    .all(|((g, e), s)| g == e || at_bound(s));
            if explained {
                return Ok(Verdict::KnownBug(msg));
            }
        }
        Err(msg)
    }
}

/// The other dtypes of a mixed list, for a case reducing with `rop` (`None`: a
/// broadcast): float32 and int32, or under bool's logical or int32 alone, or-ed (MPI-4.1
/// §6.9.2: no logical reduction on floating point).
struct Others {
    float32: Option<Kind<f32>>,
    int32: Kind<i32>,
}

impl Others {
    fn new(rop: Option<ReduceOp>) -> Others {
        match rop {
            Some(ReduceOp::LogicalOr) => Others {
                float32: None,
                int32: Kind {
                    reduce: Some((ReduceOp::LogicalOr, |a, b| i32::from(a != 0 || b != 0))),
                    saturating: None,
                    ..dtypes::int32()
                },
            },
            _ => Others {
                float32: Some(dtypes::float32()),
                int32: dtypes::int32(),
            },
        }
    }
}

/// The bucket sizes of a case: [`SMALL_BUCKETS`] while it lives when `small`, then the
/// sizes before it again (the same on every rank, as the buckets are the messages).
struct Buckets(Option<(usize, usize)>);

impl Buckets {
    fn set(small: bool) -> Buckets {
        if !small {
            return Buckets(None);
        }
        // An unreadable setting stays as it is: the call then refuses it, on every rank.
        let (Ok(first), Ok(others)) = (settings::first_bucket_bytes(), settings::bucket_bytes())
        else {
            return Buckets(None);
        };
        settings::set_first_bucket_bytes(SMALL_BUCKETS.0);
        settings::set_bucket_bytes(SMALL_BUCKETS.1);
        Buckets(Some((first, others)))
    }
}

impl Drop for Buckets {
    fn drop(&mut self) {
        if let Some((first, others)) = self.0 {
            settings::set_first_bucket_bytes(first);
            settings::set_bucket_bytes(others);
        }
    }
}

/// A library error of the collective as the case's verdict: a documented limitation (a
/// member's layout the pack kernels refuse; a send list on another memory than the receive
/// list, `--device SEND:RECV`, which a fused collective refuses: `MixedDevices`) is a skip,
/// anything else a failure.
fn refusal(cx: &CaseContext<'_>, err: Error) -> String {
    let strided = |err: &Error| matches!(err, Error::StridedNotSupported { .. });
    let limitation = match &err {
        Error::Member { source, .. } => strided(source),
        Error::MixedDevices { .. } => cx.here.send != cx.here.recv,
        other => strided(other),
    };
    if limitation {
        format!("{SKIP_MARK}{err}")
    } else {
        e(err)
    }
}

/// Runs the case's collective over `members` (all acquired at once), with `rop` (ignored
/// by a broadcast).
fn call_list(
    (cx, dc): (&CaseContext<'_>, &Comm<'_>),
    (fused, call): (Fused, Call),
    rop: ReduceOp,
    members: &[Box<dyn Member + '_>],
) -> Res<()> {
    let mut stores: Vec<&dyn Held> = members.iter().filter_map(|m| m.stores().0).collect();
    stores.extend(members.iter().map(|m| m.stores().1));
    let root = dc.comm().size() - 1;
    with_all(cx.run, &stores, &mut |tensors| {
        let (send, recv) = tensors.split_at_mut(tensors.len() - members.len());
        let send: Vec<&dyn Tensor> = send.iter().map(|t| &**t as &dyn Tensor).collect();
        let done = match (fused, call) {
            (Fused::AllReduce, Call::Blocking) => dc.all_reduce_tensors_in_place(recv, rop),
            (Fused::AllReduce, Call::Nonblocking(c)) => {
                c.post(|sc| dc.immediate_all_reduce_tensors_in_place(sc, recv, rop))
            }
            (Fused::AllReduceInto, Call::Blocking) => dc.all_reduce_tensors(&send, recv, rop),
            (Fused::Bcast, Call::Blocking) => dc.broadcast_tensors(recv, root),
            (Fused::ReduceScatter, Call::Blocking) => {
                dc.reduce_scatter_block_tensors(&send, recv, rop)
            }
            (_, Call::Nonblocking(_)) => return Err(format!("no nonblocking case of {fused:?}")),
        };
        cx.note_route(dc);
        done.map_err(|err| refusal(cx, err))
    })
}

/// The case of the fused collective `op` (called as `call`) over the list that `cx`'s
/// layout and `n` elements of `kind` make ([`plan`]).
pub(super) fn case<S: AnyBits + PartialEq + Debug>(
    (kind, cx, dc): (&Kind<S>, &CaseContext<'_>, &Comm<'_>),
    (op, call): (Op, Call),
    n: i64,
) -> Res<Verdict> {
    let Some(fused) = Fused::of(op) else {
        return Err(format!("{} is not a fused collective", op.name()));
    };
    let rop = match (fused, kind.reduce) {
        (Fused::Bcast, _) => None,
        (_, Some((rop, _))) => Some(rop),
        (_, None) => {
            return Ok(Verdict::NotApplicable(format!(
                "{} is transfer-only: MPI has no reduction for it",
                kind.name
            )))
        }
    };
    let w = dc.comm();
    let g = Geometry {
        fused,
        r: w.rank(),
        p: w.size(),
    };
    let how = (fused, call);
    let op_of = rop.unwrap_or(ReduceOp::Sum);
    if n == 0 {
        // The empty list: nothing moves, and every rank returns.
        call_list((cx, dc), how, op_of, &[])?;
    }
    let others = Others::new(rop);
    // With a Python producer, the members but the case's own are Rust-made: a JAX or
    // Paddle tensor takes 0.2-0.5 ms to make, and a list has 5 to 9 members (twice as
    // many tensors with a send list), which would have added 10-15 % to such a run.
    let on_cpu = cx.here.send == Dev::Cpu || cx.here.recv == Dev::Cpu;
    let rust_made = (on_cpu && cx.run.producer != Producer::Rust)
        .then(|| RunContext::new(None, Producer::Rust));
    let mut members: Vec<Box<dyn Member + '_>> = Vec::new();
    for (of, layout, len) in plan(cx.layout, n, cx.layout == Layout::Step) {
        let run = match &rust_made {
            Some(rust) if of != Of::Own => rust,
            _ => cx.run,
        };
        // Every member where the case's tensors are, at the case's offset.
        let mcx = CaseContext::new(run, cx.here, layout, false);
        let at = (members.len(), len);
        members.push(match (of, &others.float32) {
            (Of::Own | Of::Case, _) => Box::new(Part::new(kind, mcx, at, g)?),
            (Of::Float32, Some(f32s)) => Box::new(Part::new(f32s, mcx, at, g)?),
            (Of::Float32, None) => continue,
            (Of::Int32, _) => Box::new(Part::new(&others.int32, mcx, at, g)?),
        });
    }
    {
        let _buckets = Buckets::set(n >= SMALL_BUCKETS_FROM);
        call_list((cx, dc), how, op_of, &members)?;
    }
    let (mut failed, mut known, mut unchecked) = (None, None, None);
    for (i, m) in members.into_iter().enumerate() {
        match m.verify(cx.inject && i == 0) {
            Ok(Verdict::KnownBug(msg)) => known = known.or(Some(msg)),
            Ok(Verdict::NotCheckable(why)) => unchecked = unchecked.or(Some(why)),
            Ok(_) => {}
            Err(msg) => failed = failed.or(Some(msg)),
        }
    }
    match (failed, known, unchecked) {
        (Some(msg), _, _) => Err(msg),
        (None, Some(msg), _) => Ok(Verdict::KnownBug(msg)),
        (None, None, Some(why)) => Ok(Verdict::NotCheckable(why)),
        (None, None, None) => Ok(Verdict::Pass),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A list has the case's own member once, members of 0, 1 and 7 elements, a 0-d one;
    /// a mixed list interleaves float32 and int32 members with the case dtype's.
    #[test]
    fn lists_of_every_size_and_mixed_dtypes() {
        let plain = plan(Layout::Fortran, 1000, false);
        let lens: Vec<i64> = plain.iter().map(|m| m.2).collect();
        assert_eq!(lens, [7, 0, 1000, 1, 1]);
        assert_eq!(plain.iter().filter(|m| m.0 == Of::Own).count(), 1);
        assert!(plain.contains(&(Of::Case, Layout::Scalar, 1)));
        assert!(plain.contains(&(Of::Case, Layout::Contiguous, 0)));
        let mixed = plan(Layout::Step, 0, true);
        let dtypes: Vec<Of> = mixed.iter().map(|m| m.0).collect();
        use Of::{Case, Float32, Int32, Own};
        assert_eq!(
            dtypes,
            [Case, Float32, Case, Int32, Own, Float32, Case, Case, Int32]
        );
        assert!(mixed.iter().any(|m| m.0 == Int32 && m.1 == Layout::Step));
    }
}
