//! Fused collectives over lists of tensors (issue 25): `all_reduce_tensors_in_place` (in place),
//! `all_reduce_tensors` and `broadcast_tensors`, blocking and nonblocking, over lists
//! of mixed sizes, dtypes (float32, float64, float16, bfloat16, int32) and layouts (strided
//! members, zero-size members, the empty list), with tiny buckets (many buckets, members
//! larger than a bucket) and the default ones; every member's values exact and the guard
//! elements around every member untouched; a member refused on one rank only (every rank
//! returns an error, no member changes); lists that differ across ranks
//! (`CollectiveMismatch` on every rank); mixed devices refused; each member's deleter once.
//!
//! The suite `fused` of tests/mpi (main.rs): `cargo test` runs it at 1 rank;
//! scripts/test.sh under `mpirun -n 2`, `-n 3` and `-n 4` within a timeout.

use crate::common::RawTensor;
use crate::harness;
use dlpack_mpi::comm::TensorComm;
use dlpack_mpi::device::{device_type, Device};
use dlpack_mpi::dlpack::{
    acquire, acquire_with_runtime, AcquireOptions, ManagedTensor, Owned, Tensor, TensorView,
};
use dlpack_mpi::dtype::{AnyBits, ReduceOp};
use dlpack_mpi::runtime::SimulatedRuntime;
use dlpack_mpi::settings::{
    bucket_bytes, first_bucket_bytes, set_bucket_bytes, set_first_bucket_bytes,
};
use dlpack_mpi::Error;
use half::{bf16, f16};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

type Outcome = Result<(), String>;

/// Guard elements on each side of every member.
const G: usize = 3;

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// A value type of the lists: converts small integers exactly.
trait Val: AnyBits + Copy + PartialEq + std::fmt::Debug + 'static {
    fn of(x: i64) -> Self;
}

impl Val for f32 {
    fn of(x: i64) -> Self {
        x as f32
    }
}
impl Val for f64 {
    fn of(x: i64) -> Self {
        x as f64
    }
}
impl Val for i32 {
    fn of(x: i64) -> Self {
        x as i32
    }
}
impl Val for f16 {
    fn of(x: i64) -> Self {
        f16::from_f32(x as f32)
    }
}
impl Val for bf16 {
    fn of(x: i64) -> Self {
        bf16::from_f32(x as f32)
    }
}

/// Rank `r`'s value of element `i` of member `m`: small, so sums are exact in float16.
fn value(r: i32, m: usize, i: usize) -> i64 {
    (i64::from(r) + 1) * ((m as i64 + i as i64) % 7 + 1)
}

/// The guard value.
fn guard<T: Val>() -> T {
    T::of(-5)
}

/// One member: storage with guards, its logical length and whether it is strided (step 2).
struct Member<T: Val> {
    owned: Owned<T>,
    n: usize,
    strided: bool,
}

impl<T: Val> Member<T> {
    /// Member `m` of `n` elements at rank `r` holding `fill(i)`.
    fn new(n: usize, strided: bool, fill: impl Fn(usize) -> i64) -> Result<Self, String> {
        let step = if strided { 2 } else { 1 };
        let len = 2 * G + step * n.max(1);
        let mut v = vec![guard::<T>(); len];
        for i in 0..n {
            v[G + step * i] = T::of(fill(i));
        }
        let owned = Owned::new(v)
            .with_layout(
                &[n as i64],
                Some(&[step as i64]),
                (G * std::mem::size_of::<T>()) as u64,
            )
            .map_err(s)?;
        Ok(Member { owned, n, strided })
    }

    /// The logical values, after checking every guard and gap.
    fn values(&mut self) -> Result<Vec<T>, String> {
        let step = if self.strided { 2 } else { 1 };
        let all = self.owned.as_slice().to_vec();
        let mut out = Vec::with_capacity(self.n);
        for (j, &x) in all.iter().enumerate() {
            let logical = j >= G && (j - G) % step == 0 && (j - G) / step < self.n;
            if logical {
                out.push(x);
            } else if x != guard::<T>() {
                return Err(format!("guard or gap element {j} changed: {x:?}"));
            }
        }
        Ok(out)
    }
}

/// The shapes of a list: (elements, strided) per member, with zero-size members and one
/// larger than the tiny buckets.
const SHAPES: &[(usize, bool)] = &[
    (5, false),
    (0, false),
    (300, true),
    (17, false),
    (1, false),
    (2048, false),
    (64, true),
    (0, true),
    (9, false),
];

/// The sum over the ranks of member `m`'s element `i`.
fn summed(p: i32, m: usize, i: usize) -> i64 {
    (0..p).map(|r| value(r, m, i)).sum()
}

fn acquired<T: Val>(ms: &[Member<T>]) -> Result<Vec<ManagedTensor<'_>>, String> {
    ms.iter()
        .map(|m| acquire(&m.owned, &AcquireOptions::default()).map_err(s))
        .collect()
}

/// How a case runs its fused call.
#[derive(Clone, Copy, Debug)]
enum Form {
    Blocking,
    Nonblocking,
}

/// The in-place fused all-reduce of a list of `T` members of [`SHAPES`], checked member by
/// member.
fn in_place<T: Val>(w: &SimpleCommunicator, form: Form, offset: usize) -> Outcome {
    in_place_of::<T>(w, form, offset, SHAPES)
}

/// Members of at least `OWN_BUCKET_BYTES` (256 KiB) in float32 among small ones: each has a
/// bucket of its own, reduced on its own memory when contiguous (nothing copied), packed
/// alone when strided.
const LARGE: &[(usize, bool)] = &[
    (3, false),
    (65_536, false),
    (7, true),
    (70_001, true),
    (65_535, false),
    (100_000, false),
    (0, false),
    (11, false),
];

/// The in-place fused all-reduce of a list of `T` members of `shapes`.
fn in_place_of<T: Val>(
    w: &SimpleCommunicator,
    form: Form,
    offset: usize,
    shapes: &[(usize, bool)],
) -> Outcome {
    let (me, p) = (w.rank(), w.size());
    let mut ms: Vec<Member<T>> = shapes
        .iter()
        .enumerate()
        .map(|(m, &(n, st))| Member::new(n, st, |i| value(me, m + offset, i)))
        .collect::<Result<_, _>>()?;
    {
        let mut ts = acquired(&ms)?;
        let mut refs: Vec<&mut dyn Tensor> = ts.iter_mut().map(|t| t as &mut dyn Tensor).collect();
        match form {
            Form::Blocking => w
                .all_reduce_tensors_in_place(&mut refs, ReduceOp::Sum)
                .map_err(s)?,
            Form::Nonblocking => {
                let done: dlpack_mpi::Result<()> = mpi::request::scope(|scope| {
                    let req =
                        w.immediate_all_reduce_tensors_in_place(scope, &mut refs, ReduceOp::Sum)?;
                    let mut req = req;
                    loop {
                        match req.test() {
                            Ok(r) => break r.map(drop),
                            Err(pending) => req = pending,
                        }
                    }
                });
                done.map_err(s)?;
            }
        }
    }
    for (m, member) in ms.iter_mut().enumerate() {
        let want: Vec<T> = (0..member.n)
            .map(|i| T::of(summed(p, m + offset, i)))
            .collect();
        ensure_eq!(member.values()?, want);
    }
    Ok(())
}

/// A list of mixed dtypes (f32, f64, i32, f16 interleaved): split by dtype into buckets,
/// reduced into a receive list, blocking and nonblocking.
fn mixed_into(w: &SimpleCommunicator, form: Form) -> Outcome {
    let (me, p) = (w.rank(), w.size());
    let a: Vec<Member<f32>> = (0..3)
        .map(|m| Member::new(10 + 40 * m, m == 1, |i| value(me, m, i)))
        .collect::<Result<_, _>>()?;
    let b: Vec<Member<f64>> = (0..2)
        .map(|m| Member::new(7 + m, false, |i| value(me, 10 + m, i)))
        .collect::<Result<_, _>>()?;
    let c: Vec<Member<i32>> = vec![Member::new(33, true, |i| value(me, 20, i))?];
    let d: Vec<Member<f16>> = vec![Member::new(129, false, |i| value(me, 30, i))?];
    let mut ra: Vec<Member<f32>> = (0..3)
        .map(|m| Member::new(10 + 40 * m, m != 1, |_| -1))
        .collect::<Result<_, _>>()?;
    let mut rb: Vec<Member<f64>> = (0..2)
        .map(|m| Member::new(7 + m, true, |_| -1))
        .collect::<Result<_, _>>()?;
    let mut rc: Vec<Member<i32>> = vec![Member::new(33, false, |_| -1)?];
    let mut rd: Vec<Member<f16>> = vec![Member::new(129, true, |_| -1)?];
    {
        let (sa, sb, sc, sd) = (acquired(&a)?, acquired(&b)?, acquired(&c)?, acquired(&d)?);
        let (mut ta, mut tb, mut tc, mut td) = (
            acquired(&ra)?,
            acquired(&rb)?,
            acquired(&rc)?,
            acquired(&rd)?,
        );
        // Interleaved: f32, f64, f32, i32, f16, f64, f32.
        let send: Vec<&dyn Tensor> = vec![&sa[0], &sb[0], &sa[1], &sc[0], &sd[0], &sb[1], &sa[2]];
        let (ta0, rest) = ta.split_at_mut(1);
        let (ta1, ta2) = rest.split_at_mut(1);
        let (tb0, tb1) = tb.split_at_mut(1);
        let mut recv: Vec<&mut dyn Tensor> = vec![
            &mut ta0[0],
            &mut tb0[0],
            &mut ta1[0],
            &mut tc[0],
            &mut td[0],
            &mut tb1[0],
            &mut ta2[0],
        ];
        match form {
            Form::Blocking => w
                .all_reduce_tensors(&send, &mut recv, ReduceOp::Sum)
                .map_err(s)?,
            Form::Nonblocking => {
                let done: dlpack_mpi::Result<()> = mpi::request::scope(|scope| {
                    w.immediate_all_reduce_tensors(scope, &send, &mut recv, ReduceOp::Sum)?
                        .wait()
                        .map(drop)
                });
                done.map_err(s)?;
            }
        }
    }
    for (m, r) in ra.iter_mut().enumerate() {
        let want: Vec<f32> = (0..r.n).map(|i| summed(p, m, i) as f32).collect();
        ensure_eq!(r.values()?, want);
    }
    for (m, r) in rb.iter_mut().enumerate() {
        let want: Vec<f64> = (0..r.n).map(|i| summed(p, 10 + m, i) as f64).collect();
        ensure_eq!(r.values()?, want);
    }
    let want: Vec<i32> = (0..33).map(|i| summed(p, 20, i) as i32).collect();
    ensure_eq!(rc[0].values()?, want);
    let want: Vec<f16> = (0..129)
        .map(|i| f16::from_f32(summed(p, 30, i) as f32))
        .collect();
    ensure_eq!(rd[0].values()?, want);
    Ok(())
}

/// `all_reduce_tensors` with members alone (≥ 256 KiB): contiguous to contiguous (on
/// the members' own memory), strided to contiguous and contiguous to strided (packed alone),
/// among small members.
fn into_alone(w: &SimpleCommunicator, form: Form) -> Outcome {
    let (me, p) = (w.rank(), w.size());
    let shapes: &[(usize, bool, bool)] = &[
        (70_000, false, false),
        (5, false, true),
        (66_000, true, false),
        (65_537, false, true),
        (2, true, true),
    ];
    let mut send: Vec<Member<f32>> = shapes
        .iter()
        .enumerate()
        .map(|(m, &(n, st, _))| Member::new(n, st, |i| value(me, 40 + m, i)))
        .collect::<Result<_, _>>()?;
    let mut recv: Vec<Member<f32>> = shapes
        .iter()
        .map(|&(n, _, rt)| Member::new(n, rt, |_| -1))
        .collect::<Result<_, _>>()?;
    {
        let st = acquired(&send)?;
        let mut rt = acquired(&recv)?;
        let sends: Vec<&dyn Tensor> = st.iter().map(|t| t as &dyn Tensor).collect();
        let mut recvs: Vec<&mut dyn Tensor> = rt.iter_mut().map(|t| t as &mut dyn Tensor).collect();
        match form {
            Form::Blocking => w
                .all_reduce_tensors(&sends, &mut recvs, ReduceOp::Sum)
                .map_err(s)?,
            Form::Nonblocking => {
                let done: dlpack_mpi::Result<()> = mpi::request::scope(|scope| {
                    w.immediate_all_reduce_tensors(scope, &sends, &mut recvs, ReduceOp::Sum)?
                        .wait()
                        .map(drop)
                });
                done.map_err(s)?;
            }
        }
    }
    for (m, r) in recv.iter_mut().enumerate() {
        let want: Vec<f32> = (0..r.n).map(|i| summed(p, 40 + m, i) as f32).collect();
        ensure_eq!(r.values()?, want);
    }
    for (m, sm) in send.iter_mut().enumerate() {
        let want: Vec<f32> = (0..sm.n).map(|i| value(me, 40 + m, i) as f32).collect();
        ensure_eq!(sm.values()?, want);
    }
    Ok(())
}

/// `reduce_scatter_block_tensors`: member `m` sends `p` × `n_m` elements (strided for some),
/// rank `r` receives the sum of every rank's block `r`, into strided and contiguous
/// receivers.
fn reduce_scatter(w: &SimpleCommunicator, form: Form) -> Outcome {
    let shapes: &[(usize, bool)] = &[(3, false), (0, false), (50, true), (1, true), (700, false)];
    reduce_scatter_of(w, form, shapes)
}

/// As [`reduce_scatter`] over members of `shapes` (receivers strided where senders are not).
fn reduce_scatter_of(w: &SimpleCommunicator, form: Form, shapes: &[(usize, bool)]) -> Outcome {
    let (me, p) = (w.rank(), w.size());
    let pu = p as usize;
    let sends: Vec<Member<f32>> = shapes
        .iter()
        .enumerate()
        .map(|(m, &(n, st))| Member::new(n * pu, st, |i| value(me, m, i)))
        .collect::<Result<_, _>>()?;
    let mut recv32: Vec<Member<f32>> = shapes
        .iter()
        .map(|&(n, st)| Member::new(n, !st, |_| -1))
        .collect::<Result<_, _>>()?;
    {
        let st = acquired(&sends)?;
        let mut rt = acquired(&recv32)?;
        let send: Vec<&dyn Tensor> = st.iter().map(|t| t as &dyn Tensor).collect();
        let mut recv: Vec<&mut dyn Tensor> = rt.iter_mut().map(|t| t as &mut dyn Tensor).collect();
        match form {
            Form::Blocking => w
                .reduce_scatter_block_tensors(&send, &mut recv, ReduceOp::Sum)
                .map_err(s)?,
            Form::Nonblocking => {
                let done: dlpack_mpi::Result<()> = mpi::request::scope(|scope| {
                    w.immediate_reduce_scatter_block_tensors(
                        scope,
                        &send,
                        &mut recv,
                        ReduceOp::Sum,
                    )?
                    .wait()
                    .map(drop)
                });
                done.map_err(s)?;
            }
        }
    }
    for (m, r) in recv32.iter_mut().enumerate() {
        let n = shapes[m].0;
        let want: Vec<f32> = (0..n)
            .map(|i| summed(p, m, me as usize * n + i) as f32)
            .collect();
        ensure_eq!(r.values()?, want);
    }
    Ok(())
}

/// `broadcast_tensors` from the last rank, whose members are `READ_ONLY`.
fn broadcast(w: &SimpleCommunicator, form: Form) -> Outcome {
    broadcast_of(w, form, SHAPES)
}

/// As [`broadcast`] over members of `shapes`.
fn broadcast_of(w: &SimpleCommunicator, form: Form, shapes: &[(usize, bool)]) -> Outcome {
    let (me, p) = (w.rank(), w.size());
    let root = p - 1;
    let mut ms: Vec<Member<f32>> = shapes
        .iter()
        .enumerate()
        .map(|(m, &(n, st))| {
            Member::new(n, st, |i| if me == root { value(root, m, i) } else { -1 })
        })
        .collect::<Result<_, _>>()?;
    if me == root {
        for m in &mut ms {
            let o = std::mem::replace(&mut m.owned, Owned::new(vec![0.0f32]));
            m.owned = o.read_only();
        }
    }
    {
        let mut ts = acquired(&ms)?;
        let mut refs: Vec<&mut dyn Tensor> = ts.iter_mut().map(|t| t as &mut dyn Tensor).collect();
        match form {
            Form::Blocking => w.broadcast_tensors(&mut refs, root).map_err(s)?,
            Form::Nonblocking => {
                let done: dlpack_mpi::Result<()> = mpi::request::scope(|scope| {
                    w.immediate_broadcast_tensors(scope, &mut refs, root)?
                        .wait()
                        .map(drop)
                });
                done.map_err(s)?;
            }
        }
    }
    for (m, member) in ms.iter_mut().enumerate() {
        let want: Vec<f32> = (0..member.n).map(|i| value(root, m, i) as f32).collect();
        ensure_eq!(member.values()?, want);
    }
    Ok(())
}

/// The empty list: every rank returns `Ok` (an agreement, no bucket).
fn empty_list(w: &SimpleCommunicator) -> Outcome {
    let mut none: Vec<&mut dyn Tensor> = Vec::new();
    w.all_reduce_tensors_in_place(&mut none, ReduceOp::Sum)
        .map_err(s)?;
    w.broadcast_tensors(&mut none, 0).map_err(s)
}

/// The last rank's member 2 is `READ_ONLY`: that rank returns `Member { index: 2, ReadOnly }`,
/// every other `PeerRefused`, and no member of any rank changed.
fn one_member_refused(w: &SimpleCommunicator, form: Form) -> Outcome {
    let (me, p) = (w.rank(), w.size());
    if p < 2 {
        return Ok(());
    }
    let mut ms: Vec<Member<f32>> = SHAPES
        .iter()
        .enumerate()
        .map(|(m, &(n, st))| Member::new(n, st, |i| value(me, m, i)))
        .collect::<Result<_, _>>()?;
    if me == p - 1 {
        let o = std::mem::replace(&mut ms[2].owned, Owned::new(vec![0.0f32]));
        ms[2].owned = o.read_only();
    }
    let got: Result<dlpack_mpi::Result<()>, Error> = {
        let mut ts = acquired(&ms)?;
        let mut refs: Vec<&mut dyn Tensor> = ts.iter_mut().map(|t| t as &mut dyn Tensor).collect();
        match form {
            Form::Blocking => w
                .all_reduce_tensors_in_place(&mut refs, ReduceOp::Sum)
                .map(Ok),
            Form::Nonblocking => mpi::request::scope(|scope| {
                let req =
                    w.immediate_all_reduce_tensors_in_place(scope, &mut refs, ReduceOp::Sum)?;
                Ok(req.wait().map(drop))
            }),
        }
    };
    // Blocking: the error comes from the call; nonblocking: the refusing rank's from the
    // post, the others' from wait.
    let outcome = match got {
        Ok(inner) => inner,
        Err(e) => Err(e),
    };
    if me == p - 1 {
        match &outcome {
            Err(Error::Member { index: 2, source }) if matches!(**source, Error::ReadOnly) => {}
            other => {
                return Err(format!(
                    "expected Member {{ index: 2, ReadOnly }}, got {other:?}"
                ))
            }
        }
    } else {
        match &outcome {
            Err(Error::PeerRefused { rank, .. }) if *rank == p - 1 => {}
            other => {
                return Err(format!(
                    "expected PeerRefused from the last rank, got {other:?}"
                ))
            }
        }
    }
    for (m, member) in ms.iter_mut().enumerate() {
        let want: Vec<f32> = (0..member.n).map(|i| value(me, m, i) as f32).collect();
        ensure_eq!(member.values()?, want);
    }
    Ok(())
}

/// Rank 0's list has one member more: every rank returns `CollectiveMismatch`.
fn lists_differ(w: &SimpleCommunicator) -> Outcome {
    let (me, p) = (w.rank(), w.size());
    if p < 2 {
        return Ok(());
    }
    let count = if me == 0 { 4 } else { 3 };
    let ms: Vec<Member<f32>> = (0..count)
        .map(|m| Member::new(8, false, |i| value(me, m, i)))
        .collect::<Result<_, _>>()?;
    let mut ts = acquired(&ms)?;
    let mut refs: Vec<&mut dyn Tensor> = ts.iter_mut().map(|t| t as &mut dyn Tensor).collect();
    match w.all_reduce_tensors_in_place(&mut refs, ReduceOp::Sum) {
        Err(Error::CollectiveMismatch { .. }) => Ok(()),
        other => Err(format!("expected CollectiveMismatch, got {other:?}")),
    }
}

/// A member labelled CUDA among host members: `MixedDevices` naming it, on every rank.
fn mixed_devices(w: &SimpleCommunicator) -> Outcome {
    let host = Owned::new(vec![1.0f32; 4]);
    let cuda = Owned::new(vec![1.0f32; 4]).labelled(Device::new(device_type::CUDA, 0));
    let mut a = acquire(&host, &AcquireOptions::default()).map_err(s)?;
    let rt = SimulatedRuntime::new();
    let mut b = acquire_with_runtime(&cuda, &AcquireOptions::default(), Some(&rt)).map_err(s)?;
    let mut refs: Vec<&mut dyn Tensor> = vec![&mut a, &mut b];
    match w.all_reduce_tensors_in_place(&mut refs, ReduceOp::Sum) {
        Err(Error::MixedDevices { index: 1, .. }) => Ok(()),
        Err(Error::PeerRefused { .. }) if w.rank() != 0 => Ok(()),
        other => Err(format!(
            "expected MixedDevices {{ index: 1 }}, got {other:?}"
        )),
    }
}

/// Every member's deleter runs once, after the fused call, nonblocking and dropped
/// uncompleted (the drop waits and unpacks).
fn deleters_once(w: &SimpleCommunicator) -> Outcome {
    let me = w.rank();
    let mut counters = Vec::new();
    {
        let mut ts = Vec::new();
        for m in 0..5usize {
            let vals: Vec<f32> = (0..(3 + m)).map(|i| value(me, m, i) as f32).collect();
            let (t, c) = RawTensor::new(&vals, (2, 32, 1)).import_v1();
            ts.push(t.map_err(s)?);
            counters.push(c);
        }
        let mut refs: Vec<&mut dyn Tensor> = ts.iter_mut().map(|t| t as &mut dyn Tensor).collect();
        let done: dlpack_mpi::Result<()> = mpi::request::scope(|scope| {
            let req = w.immediate_all_reduce_tensors_in_place(scope, &mut refs, ReduceOp::Max)?;
            drop(req);
            Ok(())
        });
        done.map_err(s)?;
        ensure!(counters.iter().all(|c| c.get() == 0), "a deleter ran early");
    }
    ensure!(
        counters.iter().all(|c| c.get() == 1),
        "deleters: {:?}",
        counters.iter().map(|c| c.get()).collect::<Vec<_>>()
    );
    Ok(())
}

/// The empty list, nonblocking: `Ok` from `wait` and from `test`.
fn empty_list_nonblocking(w: &SimpleCommunicator) -> Outcome {
    let mut none: Vec<&mut dyn Tensor> = Vec::new();
    let done: dlpack_mpi::Result<()> = mpi::request::scope(|scope| {
        w.immediate_all_reduce_tensors_in_place(scope, &mut none, ReduceOp::Sum)?
            .wait()
            .map(drop)
    });
    done.map_err(s)?;
    let mut none: Vec<&mut dyn Tensor> = Vec::new();
    let done: dlpack_mpi::Result<()> = mpi::request::scope(|scope| {
        let mut req = w.immediate_broadcast_tensors(scope, &mut none, 0)?;
        loop {
            match req.test() {
                Ok(d) => break d.map(drop),
                Err(pending) => req = pending,
            }
        }
    });
    done.map_err(s)
}

/// Rank 0 buckets differently from the others: every rank returns `CollectiveMismatch`
/// (the buckets are the messages), not an aborted job.
fn bucket_sizes_differ(w: &SimpleCommunicator) -> Outcome {
    let (me, p) = (w.rank(), w.size());
    if p < 2 {
        return Ok(());
    }
    let (first, rest) = if me == 0 { (16, 16) } else { (4096, 4096) };
    with_buckets(first, rest, || {
        let ms: Vec<Member<f32>> = (0..6)
            .map(|m| Member::new(20, false, |i| value(me, m, i)))
            .collect::<Result<_, _>>()?;
        let mut ts = acquired(&ms)?;
        let mut refs: Vec<&mut dyn Tensor> = ts.iter_mut().map(|t| t as &mut dyn Tensor).collect();
        match w.all_reduce_tensors_in_place(&mut refs, ReduceOp::Sum) {
            Err(Error::CollectiveMismatch { .. }) => Ok(()),
            other => Err(format!("expected CollectiveMismatch, got {other:?}")),
        }
    })
}

/// The same tensor twice in a list: `Member { index: 1, BuffersAlias }` on every rank.
fn same_tensor_twice(w: &SimpleCommunicator) -> Outcome {
    let me = w.rank();
    let m = Member::<f32>::new(8, false, |i| value(me, 0, i))?;
    let mut a = acquire(&m.owned, &AcquireOptions::default()).map_err(s)?;
    // A second view of the same DLTensor (a producer handing out one array twice).
    let mut dl = *a.dl_tensor();
    // SAFETY: `dl` describes `a`'s memory, alive for this function; the call under test
    // must refuse to write it through two members.
    let mut b = unsafe { TensorView::from_raw(&mut dl) }.map_err(s)?;
    let mut refs: Vec<&mut dyn Tensor> = vec![&mut a, &mut b];
    match w.all_reduce_tensors_in_place(&mut refs, ReduceOp::Sum) {
        Err(Error::Member { index: 1, source })
            if matches!(*source, Error::BuffersAlias { .. }) =>
        {
            Ok(())
        }
        Err(Error::PeerRefused { .. }) => Ok(()),
        other => Err(format!(
            "expected Member {{ index: 1, BuffersAlias }}, got {other:?}"
        )),
    }
}

/// Runs `f` with buckets of `bytes` (first bucket `first`), then puts the settings back.
fn with_buckets(first: usize, bytes: usize, f: impl FnOnce() -> Outcome) -> Outcome {
    let before = (first_bucket_bytes().map_err(s)?, bucket_bytes().map_err(s)?);
    set_first_bucket_bytes(first);
    set_bucket_bytes(bytes);
    let out = f();
    set_first_bucket_bytes(before.0);
    set_bucket_bytes(before.1);
    out
}

type Whole = fn(&SimpleCommunicator) -> Outcome;

const CASES: &[(&str, Whole)] = &[
    ("in place f32, default buckets", |w| {
        in_place::<f32>(w, Form::Blocking, 0)
    }),
    (
        "in place f32, members alone (>= 256 KiB), default buckets",
        |w| in_place_of::<f32>(w, Form::Blocking, 6, LARGE),
    ),
    ("in place f64, members alone, nonblocking", |w| {
        in_place_of::<f64>(w, Form::Nonblocking, 7, LARGE)
    }),
    ("in place bf16, large members, small first bucket", |w| {
        with_buckets(100, 1 << 20, || {
            in_place_of::<bf16>(w, Form::Blocking, 8, LARGE)
        })
    }),
    ("in place f32, tiny buckets", |w| {
        with_buckets(64, 256, || in_place::<f32>(w, Form::Blocking, 1))
    }),
    ("in place f64, tiny buckets, nonblocking", |w| {
        with_buckets(64, 512, || in_place::<f64>(w, Form::Nonblocking, 2))
    }),
    ("in place f16, tiny buckets", |w| {
        with_buckets(32, 128, || in_place::<f16>(w, Form::Blocking, 3))
    }),
    ("in place bf16, nonblocking", |w| {
        in_place::<bf16>(w, Form::Nonblocking, 4)
    }),
    ("in place i32, tiny buckets, nonblocking", |w| {
        with_buckets(16, 100, || in_place::<i32>(w, Form::Nonblocking, 5))
    }),
    ("mixed dtypes into, default buckets", |w| {
        mixed_into(w, Form::Blocking)
    }),
    ("mixed dtypes into, tiny buckets, nonblocking", |w| {
        with_buckets(40, 200, || mixed_into(w, Form::Nonblocking))
    }),
    ("reduce-scatter, default buckets", |w| {
        reduce_scatter(w, Form::Blocking)
    }),
    ("reduce-scatter, members alone", |w| {
        reduce_scatter_of(
            w,
            Form::Blocking,
            &[(70_000, false), (9, false), (65_536, true)],
        )
    }),
    ("broadcast, members alone, nonblocking", |w| {
        broadcast_of(w, Form::Nonblocking, LARGE)
    }),
    ("broadcast, members alone", |w| {
        broadcast_of(w, Form::Blocking, LARGE)
    }),
    (
        "into, members alone: contiguous, strided send, strided receive",
        |w| into_alone(w, Form::Blocking),
    ),
    ("into, members alone, nonblocking", |w| {
        into_alone(w, Form::Nonblocking)
    }),
    ("reduce-scatter, tiny buckets, nonblocking", |w| {
        with_buckets(64, 512, || reduce_scatter(w, Form::Nonblocking))
    }),
    ("broadcast, tiny buckets", |w| {
        with_buckets(64, 256, || broadcast(w, Form::Blocking))
    }),
    ("broadcast, nonblocking", |w| {
        broadcast(w, Form::Nonblocking)
    }),
    ("the empty list", empty_list),
    ("the empty list, nonblocking", empty_list_nonblocking),
    ("bucket sizes that differ across ranks", bucket_sizes_differ),
    ("the same tensor twice", same_tensor_twice),
    ("one member refused on one rank", |w| {
        one_member_refused(w, Form::Blocking)
    }),
    ("one member refused on one rank, nonblocking", |w| {
        with_buckets(64, 256, || one_member_refused(w, Form::Nonblocking))
    }),
    ("lists that differ across ranks", lists_differ),
    ("mixed devices refused", mixed_devices),
    ("deleters once, request dropped", deleters_once),
];

pub fn run(w: &SimpleCommunicator, filter: &[String]) -> harness::End {
    if w.rank() == 0 {
        println!("running fused collective cases at {} rank(s)", w.size());
    }
    let (passed, failed) = harness::run_cases(w, CASES.iter().copied(), filter, |case| case(w));
    harness::report(w, passed, failed);
    harness::End::Ran { passed, failed }
}
