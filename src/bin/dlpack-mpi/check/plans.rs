//! The plans of the fused collectives as cases
//! (`TensorComm::plan_all_reduce_tensors_in_place` and `plan_broadcast_tensors`,
//! docs/GUIDE.md "Plans"): `plan-allreduce` (the dtype's reduction, as `fused-allreduce`: a
//! sum, bool's logical or), `plan-allreduce-max` (`MPI_MAX`, where the dtype has it) and
//! `plan-bcast` (from the last rank).
//!
//! A case's list is made as `fused-allreduce`'s ([`super::fused`]): members of the case's
//! dtype in the case's layout (of 7 elements, of the case's length, of 1), a contiguous one
//! of 0 elements and a 0-d one; in the `step` cases, float32 and int32 members between them
//! (under bool's logical or, int32 alone). The cases of length 0 first plan the empty list.
//! The cases of [`SMALL_BUCKETS_FROM`] elements or more are planned with buckets of
//! [`SMALL_BUCKETS`] bytes (the plan keeps the buckets it was built with), so that a list
//! is many buckets.
//!
//! The plan is built once, then runs [`STEPS`] steps, `Plan::run` and `Plan::start` then
//! `PlanRequest::wait` in turn. Before each step every member gets new values, rank- and
//! step-dependent (the dtype's closed forms from an element index of the member's own that
//! moves on by [`STEP_SHIFT`] each step: a reduction's exact inputs [`Kind::summands`], the
//! maximum's and the broadcast's [`Kind::values`]; the broadcast's other ranks write their
//! own values, which the step must replace), written through `Plan::tensors_mut`; after each
//! step every element of every member is read and compared with values computed here (a
//! reduction folded in the element type's own arithmetic, as `fused-allreduce`: the same
//! exactness, the same recognition of the saturating-sum bug, the same not-checkable
//! verdict). `check` has no `unsafe`, and a member may be strided: the values are written
//! into a member, and read from it, by a message to this rank itself
//! (`TensorComm::sendrecv_tensor` on the case's communicator, from and into a contiguous
//! tensor of the member's elements in logical order), which leaves the other storage
//! elements alone. After the last step, with the plan gone, every storage element between a
//! member's elements (a gap of a strided layout) must be found as it was made, and the
//! elements as the check after the last step read them. Every rank runs every step
//! whatever it found, so that no peer waits.
//!
//! Device lists are planned through `DeviceComm` as the unplanned fused collectives are
//! (the writes and reads go through it too). A list the library refuses to plan on its
//! memory (`UnsupportedDevice` at the build, `PeerRefused` naming it on the other ranks:
//! a planned reduce-scatter of a device list, and every device list before plans of device
//! lists existed) is a skip that says so, as is a member layout the library refuses
//! (`StridedNotSupported`).

use std::any::Any;
use std::cell::RefCell;
use std::fmt::Debug;

use dlpack_mpi::comm::TensorComm;
use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned, Tensor};
use dlpack_mpi::dtype::{lookup, AnyBits, ReduceOp};
use dlpack_mpi::{settings, Error};
use mpi::traits::Communicator;

use super::args::Producer;
use super::context::{e, CaseContext, Res, RunContext, Verdict, SKIP_MARK};
use super::dtypes;
use super::kind::{Fold, Kind};
use super::matrix::{Comm, Layout, Op};
use super::store::Store;
use crate::launch::Dev;

/// Steps each plan runs.
const STEPS: i64 = 3;

/// How far the element index of a member's values moves on from one step to the next.
const STEP_SHIFT: i64 = 1009;

/// The tag of the messages that write and read a member (to this rank itself).
const TAG: i32 = 7311;

/// The cases of at least this many elements are planned with small buckets.
const SMALL_BUCKETS_FROM: i64 = 1000;

/// The small buckets: the first of each dtype, the others (bytes).
const SMALL_BUCKETS: (usize, usize) = (16, 64);

/// The planned collective of a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Planned {
    /// `plan_all_reduce_tensors_in_place` with the dtype's reduction.
    AllReduce,
    /// `plan_all_reduce_tensors_in_place` with `ReduceOp::Max`.
    AllReduceMax,
    /// `plan_broadcast_tensors` from the last rank.
    Bcast,
}

impl Planned {
    fn of(op: Op) -> Option<Planned> {
        Some(match op {
            Op::PlanAllreduce => Planned::AllReduce,
            Op::PlanAllreduceMax => Planned::AllReduceMax,
            Op::PlanBcast => Planned::Bcast,
            _ => return None,
        })
    }
}

/// What a step does to a member's values: fold them across the ranks with `f`, or
/// broadcast the last rank's.
enum How<S> {
    /// A reduction: its fold, over the inputs [`Kind::summands`] (`exact`: the dtype's own
    /// reduction) or [`Kind::values`] (the maximum).
    Reduce { f: Fold<S>, exact: bool },
    /// The broadcast, of [`Kind::values`].
    Bcast,
}

// By hand: a derive would ask `S: Copy`, and a fold is a plain function pointer anyway.
impl<S> Clone for How<S> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<S> Copy for How<S> {}

/// What a step of `planned` does to a member of `kind` (`max`: its maximum, if it has
/// one); `None`: the member does not take part in such a case (a mixed list's float32 under
/// bool's logical or).
fn how_of<T>(planned: Planned, kind: &Kind<T>, max: Option<Fold<T>>) -> Option<How<T>> {
    match (planned, kind.reduce, max) {
        (Planned::Bcast, _, _) => Some(How::Bcast),
        (Planned::AllReduce, Some((_, f)), _) => Some(How::Reduce { f, exact: true }),
        (Planned::AllReduceMax, _, Some(f)) => Some(How::Reduce { f, exact: false }),
        _ => None,
    }
}

/// `max` as a fold of `S`, where `S` is one of the element types whose `MPI_MAX` this check
/// computes (integers, the real floats): the maximum of two inputs with no NaN.
fn max_fold<S: 'static>() -> Option<Fold<S>> {
    fn of<T: PartialOrd + 'static, S: 'static>(f: fn(T, T) -> T) -> Option<Fold<S>> {
        (&f as &dyn Any).downcast_ref::<Fold<S>>().copied()
    }
    fn larger<T: PartialOrd>(a: T, b: T) -> T {
        if b > a {
            b
        } else {
            a
        }
    }
    of::<i8, S>(larger)
        .or_else(|| of::<i16, S>(larger))
        .or_else(|| of::<i32, S>(larger))
        .or_else(|| of::<i64, S>(larger))
        .or_else(|| of::<u8, S>(larger))
        .or_else(|| of::<u16, S>(larger))
        .or_else(|| of::<u32, S>(larger))
        .or_else(|| of::<u64, S>(larger))
        .or_else(|| of::<f32, S>(larger))
        .or_else(|| of::<f64, S>(larger))
        .or_else(|| of::<half::f16, S>(larger))
        .or_else(|| of::<half::bf16, S>(larger))
}

/// The reduction of `planned` on `kind` and its fold; `Err`: why the case does not apply.
fn reduction<S: AnyBits>(
    planned: Planned,
    kind: &Kind<S>,
) -> Result<Option<(ReduceOp, How<S>)>, String> {
    let transfer_only = || {
        format!(
            "{} is transfer-only: MPI has no reduction for it",
            kind.name
        )
    };
    match planned {
        Planned::Bcast => Ok(None),
        Planned::AllReduce => match kind.reduce {
            Some((rop, f)) => Ok(Some((rop, How::Reduce { f, exact: true }))),
            None => Err(transfer_only()),
        },
        Planned::AllReduceMax => {
            kind.reduce.ok_or_else(transfer_only)?;
            let allowed = lookup(kind.dtype).and_then(|t| t.check_reduction(ReduceOp::Max));
            if let Err(why) = allowed {
                return Err(format!("{}: {why}", kind.name));
            }
            let f = max_fold::<S>()
                .ok_or_else(|| format!("{}: this check computes no maximum of it", kind.name))?;
            Ok(Some((ReduceOp::Max, How::Reduce { f, exact: false })))
        }
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

/// The members of the list of a case in `layout` with `n` elements, as `fused-allreduce`'s:
/// dtype, layout and length of each, in list order; `mixed` puts float32 and int32 members
/// between the case's dtype's.
fn members(layout: Layout, n: i64, mixed: bool) -> Vec<(Of, Layout, i64)> {
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
    /// Its storage.
    fn store(&self) -> &dyn Held;
    /// Writes this rank's values of step `k` into `t`, the member's tensor.
    fn write(&self, dc: &Comm<'_>, t: &mut dyn Tensor, k: i64) -> Res<()>;
    /// Compares what `t` holds after step `k` with the expected values; `corrupt`
    /// (`--inject-fault`) changes one element first.
    fn check(&self, dc: &Comm<'_>, t: &dyn Tensor, k: i64, corrupt: bool) -> Res<Verdict>;
    /// After the plan: every gap of the storage as made, and the elements as the check
    /// after the last step read them.
    fn verify(self: Box<Self>) -> Res<Verdict>;
}

/// What every member of a case shares: the step's operation, this rank `r` of `p`.
#[derive(Clone, Copy)]
struct Geometry {
    r: i32,
    p: i32,
}

impl Geometry {
    /// The broadcast's root.
    fn root(self) -> i32 {
        self.p - 1
    }
}

/// One member's values: its dtype, its context (the case's, in the member's layout), its
/// index in the list, its length, what a step does to it.
struct Values<'k, S> {
    kind: &'k Kind<S>,
    cx: CaseContext<'k>,
    index: usize,
    n: i64,
    how: How<S>,
    g: Geometry,
}

/// One member: its values, its storage, and what the check after the last step read.
struct Part<'k, S: AnyBits> {
    v: Values<'k, S>,
    store: Store<S>,
    last: RefCell<Vec<S>>,
}

/// The first element index of the values of member `index` at step `k`.
fn first_index(index: usize, k: i64) -> i64 {
    37 * index as i64 + STEP_SHIFT * k
}

impl<S: AnyBits + PartialEq + Debug> Values<'_, S> {
    /// Rank `r`'s inputs of step `k`: the logical vector, `n × per_elem` storage items.
    fn inputs(&self, r: i32, k: i64) -> Vec<S> {
        let from = first_index(self.index, k);
        match self.how {
            How::Reduce { exact: true, .. } => {
                self.kind
                    .summands(self.cx.layout, (self.g.p, r), self.n, from)
            }
            _ => self.kind.values(&self.cx, r, self.n, from),
        }
    }

    /// The inputs of step `k` folded over the ranks with `f`.
    fn folded(&self, f: Fold<S>, k: i64) -> Vec<S> {
        let mut acc = self.inputs(0, k);
        for q in 1..self.g.p {
            for (a, b) in acc.iter_mut().zip(self.inputs(q, k)) {
                *a = f(*a, b);
            }
        }
        acc
    }

    /// The expected logical vector after step `k`.
    fn expected(&self, k: i64) -> Vec<S> {
        match self.how {
            How::Bcast => self.inputs(self.g.root(), k),
            How::Reduce { f, .. } => self.folded(f, k),
        }
    }

    /// A contiguous tensor's storage of `data` (the member's dtype, one DLPack element per
    /// `per_elem` items), for the messages to and from the member.
    fn contiguous(&self, data: Vec<S>) -> Res<Owned<S>> {
        Owned::new(data).with_dtype(self.kind.dtype).map_err(e)
    }

    fn what(&self) -> String {
        format!(
            "member {} ({} {}, {} elements)",
            self.index,
            self.kind.name,
            self.cx.layout.name(),
            self.n
        )
    }

    /// `got` (after step `k`) against the expected values: a sum's elements wrong only
    /// where their saturating sum reached a bound are the known bug, a sum's inputs that
    /// cannot carry every rank's data make it not checkable (as `fused-allreduce`).
    fn judge(&self, k: i64, got: &[S]) -> Res<Verdict> {
        let what = format!("{}, step {k}", self.what());
        let expect = self.expected(k);
        let exact = match self.how {
            How::Bcast => {
                let label = format!("{what}: broadcast");
                self.kind.compare(self.g.r, &label, &expect, got)?;
                return Ok(Verdict::Pass);
            }
            How::Reduce { exact, .. } => exact,
        };
        let rop = match (exact, self.kind.reduce) {
            (true, Some((rop, _))) => rop,
            _ => ReduceOp::Max,
        };
        let label = format!("{what}: {}", rop.name());
        let Err(msg) = self.kind.compare(self.g.r, &label, &expect, got) else {
            let unchecked = exact
                .then(|| self.kind.uncovered(self.cx.layout, self.g.p, self.n))
                .flatten();
            return Ok(unchecked.map_or(Verdict::Pass, |why| {
                Verdict::NotCheckable(format!("{what}: {why}"))
            }));
        };
        if let (Some((sat, at_bound)), true) = (self.kind.saturating, exact) {
            let saturated = self.folded(sat, k);
            let explained = got.len() == expect.len()
                && got
                    .iter()
                    .zip(&expect)
                    .zip(&saturated)
                    .all(|((g, e), s)| g == e || at_bound(s));
            if explained {
                return Ok(Verdict::KnownBug(msg));
            }
        }
        Err(msg)
    }
}

/// Member `index` of `n` elements of `kind`, made as `cx` says with this rank's values of
/// step 0.
fn member<'k, S: AnyBits + PartialEq + Debug>(
    kind: &'k Kind<S>,
    cx: CaseContext<'k>,
    (index, n): (usize, i64),
    how: How<S>,
    g: Geometry,
) -> Res<Box<dyn Member + 'k>> {
    let v = Values {
        kind,
        cx,
        index,
        n,
        how,
        g,
    };
    let store = kind.owned(&v.cx, v.inputs(g.r, 0))?;
    Ok(Box::new(Part {
        v,
        store,
        last: RefCell::new(Vec::new()),
    }))
}

impl<S: AnyBits + PartialEq + Debug> Member for Part<'_, S> {
    fn store(&self) -> &dyn Held {
        &self.store
    }

    fn write(&self, dc: &Comm<'_>, t: &mut dyn Tensor, k: i64) -> Res<()> {
        let (v, me) = (&self.v, self.v.g.r);
        let src = v.contiguous(v.inputs(me, k))?;
        let s = acquire(&src, &AcquireOptions::default()).map_err(e)?;
        dc.sendrecv_tensor(&s, me, TAG, t, me, TAG)
            .map(drop)
            .map_err(|err| format!("rank {me}: writing {} for step {k}: {}", v.what(), e(err)))
    }

    fn check(&self, dc: &Comm<'_>, t: &dyn Tensor, k: i64, corrupt: bool) -> Res<Verdict> {
        let (v, me) = (&self.v, self.v.g.r);
        let fill = (v.kind.value)(-1, -1);
        let mut dst = v.contiguous(vec![fill; v.n as usize * v.kind.per_elem])?;
        {
            let mut d = acquire(&dst, &AcquireOptions::default()).map_err(e)?;
            dc.sendrecv_tensor(t, me, TAG, &mut d, me, TAG)
                .map_err(|err| {
                    format!("rank {me}: reading {} after step {k}: {}", v.what(), e(err))
                })?;
        }
        let mut got = dst.as_slice().to_vec();
        self.last.replace(got.clone());
        if corrupt && !got.is_empty() {
            let at = 3.min(got.len() - 1);
            got[at] = fill;
        }
        v.judge(k, &got)
    }

    fn verify(self: Box<Self>) -> Res<Verdict> {
        let Part { v, store, last } = *self;
        let what = v.what();
        let got = read_checking_gaps(v.kind, &v.cx, store, (v.n, v.g.r), &what)?;
        let label = format!("{what}: its storage after the plan, against the last step's read");
        v.kind.compare(v.g.r, &label, &last.into_inner(), &got)?;
        Ok(Verdict::Pass)
    }
}

/// The logical vector of `n` elements that `store` holds (in `cx`'s layout, receive side),
/// once every storage element between them (a gap of a strided layout) is found as it was
/// made: a step writes a member's elements only.
fn read_checking_gaps<S: AnyBits + PartialEq + Debug>(
    kind: &Kind<S>,
    cx: &CaseContext<'_>,
    store: Store<S>,
    (n, r): (i64, i32),
    what: &str,
) -> Res<Vec<S>> {
    let k = kind.per_elem;
    let (_, _, elems, pos) = cx.layout.place(n, true);
    let storage = store.into_vec(cx.run)?;
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

/// The other dtypes of a mixed list, for a case reducing with `rop` (`None`: a
/// broadcast): float32 and int32, or under bool's logical or int32 alone, or-ed.
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
        // An unreadable setting stays as it is: the build then refuses it, on every rank.
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

/// A library error of the plan's build as the case's verdict: a documented limitation is a
/// skip (a list on memory the library does not plan, on this rank or — `PeerRefused` — on
/// another; a member's layout the pack kernels refuse; lists in device memory on some ranks
/// and host memory on others, which a plan refuses at its build, `CollectiveMismatch`
/// naming the device memory), anything else a failure.
fn refusal(err: Error) -> String {
    fn limitation(err: &Error) -> bool {
        match err {
            Error::UnsupportedDevice { .. } | Error::StridedNotSupported { .. } => true,
            Error::CollectiveMismatch {
                arguments,
                other_arguments,
                ..
            } => {
                arguments.contains("in device memory")
                    != other_arguments.contains("in device memory")
            }
            Error::Member { source, .. } => limitation(source),
            // The peer's error as text (`Error::UnsupportedDevice`'s reason, as the library
            // words it for a plan: "… take(s) host memory only …";
            // `Error::StridedNotSupported`'s message).
            Error::PeerRefused { reason, .. } => {
                reason.contains("host memory only")
                    || reason.contains("need a contiguous tensor; this one is strided")
            }
            _ => false,
        }
    }
    if limitation(&err) {
        format!("{SKIP_MARK}{err}")
    } else {
        e(err)
    }
}

/// The worse of two verdicts of one rank (a failure, then a known bug, then not
/// checkable, then a pass).
fn worse(a: Res<Verdict>, b: Res<Verdict>) -> Res<Verdict> {
    let level = |v: &Res<Verdict>| match v {
        Err(_) => 3,
        Ok(Verdict::KnownBug(_)) => 2,
        Ok(Verdict::NotCheckable(_)) => 1,
        Ok(_) => 0,
    };
    if level(&b) > level(&a) {
        b
    } else {
        a
    }
}

/// `outcome` made the worse of itself and `v`.
fn note(outcome: &mut Res<Verdict>, v: Res<Verdict>) {
    let before = std::mem::replace(outcome, Ok(Verdict::Pass));
    *outcome = worse(before, v);
}

/// Builds the plan of `planned` over `members` (all acquired at once) and runs its steps,
/// writing every member before a step and checking every member after it; the worst
/// verdict of this rank.
fn run_plan(
    (cx, dc): (&CaseContext<'_>, &Comm<'_>),
    (planned, rop): (Planned, ReduceOp),
    members: &[Box<dyn Member + '_>],
) -> Res<Verdict> {
    let stores: Vec<&dyn Held> = members.iter().map(|m| m.store()).collect();
    let root = dc.comm().size() - 1;
    let mut outcome = Ok(Verdict::Pass);
    with_all(cx.run, &stores, &mut |tensors| {
        let built = match planned {
            Planned::Bcast => dc.plan_broadcast_tensors(tensors, root),
            _ => dc.plan_all_reduce_tensors_in_place(tensors, rop),
        };
        cx.note_route(dc);
        let mut plan = built.map_err(refusal)?;
        for k in 0..STEPS {
            if k > 0 {
                // Members made with step 0's values; later steps' written here. A write
                // that fails leaves old values: the check after the step says so.
                for (m, t) in members.iter().zip(plan.tensors_mut().iter_mut()) {
                    note(
                        &mut outcome,
                        m.write(dc, &mut **t, k).map(|()| Verdict::Pass),
                    );
                }
            }
            let step = if k % 2 == 0 {
                plan.run()
            } else {
                mpi::request::scope(|scope| plan.start(scope).and_then(|request| request.wait()))
            };
            if let Err(err) = step {
                let r = dc.comm().rank();
                note(
                    &mut outcome,
                    Err(format!("rank {r}: step {k} ({}): {}", step_form(k), e(err))),
                );
                continue;
            }
            for (i, (m, t)) in members.iter().zip(plan.tensors().iter()).enumerate() {
                let corrupt = cx.inject && i == 0 && k == 0;
                note(&mut outcome, m.check(dc, &**t, k, corrupt));
            }
        }
        Ok(())
    })?;
    outcome
}

/// `run` or `start` then `wait`, the form of step `k`.
fn step_form(k: i64) -> &'static str {
    if k % 2 == 0 {
        "run"
    } else {
        "start, wait"
    }
}

/// The case of the planned collective `op` over the list that `cx`'s layout and `n`
/// elements of `kind` make ([`members`]).
pub(super) fn case<S: AnyBits + PartialEq + Debug + 'static>(
    (kind, cx, dc): (&Kind<S>, &CaseContext<'_>, &Comm<'_>),
    op: Op,
    n: i64,
) -> Res<Verdict> {
    let Some(planned) = Planned::of(op) else {
        return Err(format!("{} is not a planned collective", op.name()));
    };
    let reduce = match reduction(planned, kind) {
        Ok(r) => r,
        Err(why) => return Ok(Verdict::NotApplicable(why)),
    };
    let w = dc.comm();
    let g = Geometry {
        r: w.rank(),
        p: w.size(),
    };
    let rop = reduce.map(|(rop, _)| rop);
    let mut verdict = Ok(Verdict::Pass);
    if n == 0 {
        // The empty list: nothing moves, and every step returns on every rank.
        verdict = run_plan((cx, dc), (planned, rop.unwrap_or(ReduceOp::Sum)), &[]);
    }
    let others = Others::new(rop);
    let f32_how = others
        .float32
        .as_ref()
        .and_then(|k| how_of(planned, k, max_fold::<f32>()));
    let i32_how = how_of(planned, &others.int32, max_fold::<i32>());
    let own_how = reduce.map_or(How::Bcast, |(_, h)| h);
    // With a Python producer, the members but the case's own are Rust-made (as
    // `fused-allreduce`'s).
    let on_cpu = cx.here.send == Dev::Cpu || cx.here.recv == Dev::Cpu;
    let rust_made = (on_cpu && cx.run.producer != Producer::Rust)
        .then(|| RunContext::new(None, Producer::Rust));
    let mut list: Vec<Box<dyn Member + '_>> = Vec::new();
    for (of, layout, len) in members(cx.layout, n, cx.layout == Layout::Step) {
        let run = match &rust_made {
            Some(rust) if of != Of::Own => rust,
            _ => cx.run,
        };
        let mcx = CaseContext::new(run, cx.here, layout, false);
        let at = (list.len(), len);
        list.push(match (of, &others.float32, f32_how, i32_how) {
            (Of::Own | Of::Case, ..) => member(kind, mcx, at, own_how, g)?,
            (Of::Float32, Some(f32s), Some(how), _) => member(f32s, mcx, at, how, g)?,
            (Of::Int32, _, _, Some(how)) => member(&others.int32, mcx, at, how, g)?,
            (Of::Float32 | Of::Int32, ..) => continue,
        });
    }
    {
        let _buckets = Buckets::set(n >= SMALL_BUCKETS_FROM);
        let op_of = rop.unwrap_or(ReduceOp::Sum);
        verdict = worse(verdict, run_plan((cx, dc), (planned, op_of), &list));
    }
    if let Ok(Verdict::Skip(_)) | Err(_) = &verdict {
        return verdict;
    }
    for m in list {
        verdict = worse(verdict, m.verify());
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The maximum of the element types that have one here, none for the others.
    #[test]
    fn max_folds_by_element_type() {
        assert_eq!(max_fold::<i8>().map(|f| f(-3, 2)), Some(2));
        assert_eq!(max_fold::<u64>().map(|f| f(7, 2)), Some(7));
        assert_eq!(max_fold::<f32>().map(|f| f(-0.5, -1.5)), Some(-0.5));
        let h = half::bf16::from_f32;
        assert_eq!(
            max_fold::<half::bf16>().map(|f| f(h(-8.0), h(3.0))),
            Some(h(3.0))
        );
        assert!(max_fold::<num_complex::Complex32>().is_none());
    }

    /// The lists are `fused-allreduce`'s; the step's values move on between steps.
    #[test]
    fn lists_and_steps() {
        let lens: Vec<i64> = members(Layout::Fortran, 1000, false)
            .iter()
            .map(|m| m.2)
            .collect();
        assert_eq!(lens, [7, 0, 1000, 1, 1]);
        assert_eq!(members(Layout::Step, 7, true).len(), 9);
        assert_ne!(first_index(0, 1), first_index(0, 0));
        assert_ne!(first_index(1, 0), first_index(0, 0));
        assert_eq!(step_form(1), "start, wait");
    }
}
