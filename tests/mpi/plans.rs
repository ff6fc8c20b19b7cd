//! Plans (issue 32): `plan_all_reduce_tensors_in_place` and `plan_broadcast_tensors`, built
//! once and run for several steps, blocking (`run`) and nonblocking (`start`/`wait`), with
//! the members' values changed between steps and every element checked every step (mixed
//! dtypes, a strided member, a zero-size member, a member large enough for a bucket of its
//! own, guard elements around each member untouched); a step allocates nothing (counted by
//! the binary's allocator); a dropped or tested step is completed before the members are lent;
//! nonblocking collectives pending while a step runs; plans that meet other plans' steps
//! (`PlanMismatch` on every rank), a member replaced (`PlanChanged` there, `PlanMismatch` on
//! the peers, no member written); refusals and lists that differ at the build (errors on
//! every rank); `DLPACK_MPI_PLAN_CHECK=each` naming a plan step against an unplanned
//! collective in words; each member's deleter once.
//!
//! The suite `plans` of tests/mpi (main.rs): `cargo test` runs it at 1 rank;
//! scripts/test.sh under `mpirun -n 2`, `-n 3` and `-n 4` within a timeout.

use crate::common::RawTensor;
use crate::harness;
use dlpack_mpi::comm::{reset_out_of_step, TensorComm};
use dlpack_mpi::dlpack::{acquire, AcquireOptions, ManagedTensor, Owned, Tensor};
use dlpack_mpi::dtype::{AnyBits, ReduceOp};
use dlpack_mpi::settings::{set_plan_check, set_plan_mechanism, PlanCheck, PlanMechanism};
use dlpack_mpi::Error;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

type Outcome = Result<(), String>;

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Guard elements on each side of every member.
const G: usize = 2;
/// The guard value.
const GUARD: i64 = -77;

/// A value type of the members: converts small integers exactly.
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
impl Val for i64 {
    fn of(x: i64) -> Self {
        x
    }
}

/// One member's storage: `n` elements `step` apart between guards.
fn storage<T: Val>(n: usize, step: usize) -> Result<Owned<T>, String> {
    let v = vec![T::of(GUARD); 2 * G + step * n.max(1)];
    Owned::new(v)
        .with_layout(
            &[n as i64],
            Some(&[step as i64]),
            (G * std::mem::size_of::<T>()) as u64,
        )
        .map_err(s)
}

/// Writes `f(i)` into logical element `i` of the 1-D host tensor `t` (any stride).
fn write<T: Val>(t: &mut dyn Tensor, f: impl Fn(usize) -> i64) {
    let (n, stride) = (t.shape()[0] as usize, t.strides_elems().map_or(1, |s| s[0]));
    let first = t.first_element_ptr().cast::<T>();
    for i in 0..n {
        // SAFETY: element i of a 1-D host tensor of dtype T whose storage the test owns
        // (checked in range by the guards afterwards); no step is in flight.
        unsafe {
            first
                .offset(i as isize * stride as isize)
                .write(T::of(f(i)))
        };
    }
}

/// The logical elements of the 1-D host tensor `t`.
fn read<T: Val>(t: &dyn Tensor) -> Vec<T> {
    let (n, stride) = (t.shape()[0] as usize, t.strides_elems().map_or(1, |s| s[0]));
    let first = t.first_element_ptr().cast::<T>();
    // SAFETY: as in `write`.
    (0..n)
        .map(|i| unsafe { first.offset(i as isize * stride as isize).read() })
        .collect()
}

/// Every element outside the logical ones is still the guard.
fn guards_intact<T: Val>(o: &mut Owned<T>, n: usize, step: usize) -> Outcome {
    for (j, &x) in o.as_slice().iter().enumerate() {
        let logical = j >= G && (j - G) % step == 0 && (j - G) / step < n;
        ensure!(logical || x == T::of(GUARD), "guard element {j} is {x:?}");
    }
    Ok(())
}

/// Rank `r`'s value of member `m`, element `i`, at step `k`.
fn value(r: i64, k: i64, m: i64, i: usize) -> i64 {
    (r + 1) * (k + 1) + 7 * m + (i % 13) as i64
}

/// The storages of the mixed list: f32 × 5, f64 × 300 strided, i32 × 17, f32 × 70 000
/// (a bucket of its own: 280 KB), i64 × 0.
struct Storages {
    a: Owned<f32>,
    b: Owned<f64>,
    c: Owned<i32>,
    d: Owned<f32>,
    e: Owned<i64>,
}

/// (elements, step) of each member of [`Storages`].
const SHAPES: [(usize, usize); 5] = [(5, 1), (300, 2), (17, 1), (70_000, 1), (0, 1)];

impl Storages {
    fn new() -> Result<Self, String> {
        Ok(Storages {
            a: storage(SHAPES[0].0, SHAPES[0].1)?,
            b: storage(SHAPES[1].0, SHAPES[1].1)?,
            c: storage(SHAPES[2].0, SHAPES[2].1)?,
            d: storage(SHAPES[3].0, SHAPES[3].1)?,
            e: storage(SHAPES[4].0, SHAPES[4].1)?,
        })
    }

    fn guards(&mut self) -> Outcome {
        guards_intact(&mut self.a, SHAPES[0].0, SHAPES[0].1)?;
        guards_intact(&mut self.b, SHAPES[1].0, SHAPES[1].1)?;
        guards_intact(&mut self.c, SHAPES[2].0, SHAPES[2].1)?;
        guards_intact(&mut self.d, SHAPES[3].0, SHAPES[3].1)?;
        guards_intact(&mut self.e, SHAPES[4].0, SHAPES[4].1)
    }
}

fn guards_of(st: &Storages) -> Result<Vec<ManagedTensor<'_>>, String> {
    let o = AcquireOptions::default();
    Ok(vec![
        acquire(&st.a, &o).map_err(s)?,
        acquire(&st.b, &o).map_err(s)?,
        acquire(&st.c, &o).map_err(s)?,
        acquire(&st.d, &o).map_err(s)?,
        acquire(&st.e, &o).map_err(s)?,
    ])
}

/// Writes step `k`'s values of rank `r` into every member.
fn fill(list: &mut [ManagedTensor<'_>], r: i64, k: i64) {
    write::<f32>(&mut list[0], |i| value(r, k, 0, i));
    write::<f64>(&mut list[1], |i| value(r, k, 1, i));
    write::<i32>(&mut list[2], |i| value(r, k, 2, i));
    write::<f32>(&mut list[3], |i| value(r, k, 3, i));
    write::<i64>(&mut list[4], |i| value(r, k, 4, i));
}

/// Checks every member against `want(m, i)`.
fn check(list: &[ManagedTensor<'_>], want: impl Fn(i64, usize) -> i64, at: &str) -> Outcome {
    fn one<T: Val>(t: &dyn Tensor, want: impl Fn(usize) -> i64, at: &str, m: usize) -> Outcome {
        for (i, x) in read::<T>(t).into_iter().enumerate() {
            ensure!(
                x == T::of(want(i)),
                "{at}: member {m} element {i} is {x:?}, expected {}",
                want(i)
            );
        }
        Ok(())
    }
    one::<f32>(&list[0], |i| want(0, i), at, 0)?;
    one::<f64>(&list[1], |i| want(1, i), at, 1)?;
    one::<i32>(&list[2], |i| want(2, i), at, 2)?;
    one::<f32>(&list[3], |i| want(3, i), at, 3)?;
    one::<i64>(&list[4], |i| want(4, i), at, 4)
}

/// A sum plan and a max plan over the mixed list, six steps each (blocking and
/// nonblocking in turn), values changed between steps, every element checked each step.
fn all_reduce_steps_are_exact(w: &SimpleCommunicator) -> Outcome {
    let (r, n) = (i64::from(w.rank()), i64::from(w.size()));
    let mut st = Storages::new()?;
    {
        let mut list = guards_of(&st)?;
        for op in [ReduceOp::Sum, ReduceOp::Max] {
            let mut plan = w
                .plan_all_reduce_tensors_in_place(&mut list, op)
                .map_err(s)?;
            ensure!(
                plan.checks().is_some(),
                "the {op:?} plan's first bucket carries no identity"
            );
            for k in 0..6 {
                fill(plan.tensors_mut(), r, k);
                if k % 2 == 0 {
                    plan.run().map_err(s)?;
                } else {
                    mpi::request::scope(|scope| -> Outcome {
                        let mut request = plan.start(scope).map_err(s)?;
                        let _ = request.test().map_err(s)?;
                        request.wait().map_err(s)
                    })?;
                }
                let want = |m: i64, i: usize| match op {
                    ReduceOp::Sum => (0..n).map(|q| value(q, k, m, i)).sum(),
                    _ => value(n - 1, k, m, i),
                };
                check(plan.tensors(), want, &format!("{op:?} step {k}"))?;
            }
        }
    }
    st.guards()
}

/// Broadcast plans from the first and the last rank, steps in turn, the root's values
/// changed between steps.
fn broadcast_steps_are_exact(w: &SimpleCommunicator) -> Outcome {
    let (r, n) = (i64::from(w.rank()), w.size());
    let (mut s0, mut s1) = (Storages::new()?, Storages::new()?);
    {
        let (mut l0, mut l1) = (guards_of(&s0)?, guards_of(&s1)?);
        let mut p0 = w.plan_broadcast_tensors(&mut l0, 0).map_err(s)?;
        let mut p1 = w.plan_broadcast_tensors(&mut l1, n - 1).map_err(s)?;
        for k in 0..4 {
            fill(p0.tensors_mut(), r, k);
            fill(p1.tensors_mut(), r, 10 + k);
            mpi::request::scope(|scope| -> Outcome {
                let request = p0.start(scope).map_err(s)?;
                p1.run().map_err(s)?;
                request.wait().map_err(s)
            })?;
            check(
                p0.tensors(),
                |m, i| value(0, k, m, i),
                &format!("root 0 step {k}"),
            )?;
            let last = i64::from(n - 1);
            check(
                p1.tensors(),
                |m, i| value(last, 10 + k, m, i),
                &format!("last root step {k}"),
            )?;
        }
    }
    s0.guards()?;
    s1.guards()
}

/// `plan_all_reduce_tensors` (send list → receive list, a strided member each side) and
/// the single-tensor forms (`plan_all_reduce_tensor_in_place` of two float32,
/// `plan_all_reduce_tensor`, `plan_broadcast_tensor`): exact at every step, the send
/// members unchanged.
fn all_reduce_into_and_single_forms(w: &SimpleCommunicator) -> Outcome {
    let (r, n) = (i64::from(w.rank()), i64::from(w.size()));
    let sum = |k: i64, m: i64, i: usize| (0..n).map(|q| value(q, k, m, i)).sum::<i64>();
    let o = AcquireOptions::default();
    let (sa, sb) = (storage::<f64>(40, 3)?, storage::<f32>(9, 1)?);
    let (ra, rb) = (storage::<f64>(40, 1)?, storage::<f32>(9, 2)?);
    let mut send = vec![acquire(&sa, &o).map_err(s)?, acquire(&sb, &o).map_err(s)?];
    let mut recv = vec![acquire(&ra, &o).map_err(s)?, acquire(&rb, &o).map_err(s)?];
    let mut plan = w
        .plan_all_reduce_tensors(&mut send, &mut recv, ReduceOp::Sum)
        .map_err(s)?;
    ensure!(plan.checks().is_some(), "the plan into carries no identity");
    for k in 0..4 {
        let sends = plan.send_tensors_mut().ok_or("no send list")?;
        write::<f64>(&mut sends[0], |i| value(r, k, 0, i));
        write::<f32>(&mut sends[1], |i| value(r, k, 1, i));
        if k % 2 == 0 {
            plan.run()
        } else {
            mpi::request::scope(|scope| plan.start(scope).and_then(|q| q.wait()))
        }
        .map_err(s)?;
        let got = (
            read::<f64>(&plan.tensors()[0]),
            read::<f32>(&plan.tensors()[1]),
        );
        for i in 0..40 {
            ensure!(
                got.0[i] == sum(k, 0, i) as f64,
                "step {k}: f64 element {i} is {}",
                got.0[i]
            );
        }
        for i in 0..9 {
            ensure!(
                got.1[i] == sum(k, 1, i) as f32,
                "step {k}: f32 element {i} is {}",
                got.1[i]
            );
        }
        let sent = read::<f32>(&plan.send_tensors_mut().ok_or("no send list")?[1]);
        ensure!(
            sent == (0..9).map(|i| value(r, k, 1, i) as f32).collect::<Vec<_>>(),
            "send changed"
        );
    }
    drop(plan);
    let (x, y, z) = (
        Owned::new(vec![0.0f32; 2]),
        Owned::new(vec![0.0f32; 2]),
        storage::<i32>(7, 2)?,
    );
    let (mut gx, mut gy, mut gz) = (
        acquire(&x, &o).map_err(s)?,
        acquire(&y, &o).map_err(s)?,
        acquire(&z, &o).map_err(s)?,
    );
    {
        let mut single = w
            .plan_all_reduce_tensor_in_place(&mut gx, ReduceOp::Sum)
            .map_err(s)?;
        for k in 0..3 {
            write::<f32>(&mut single.tensors_mut()[0], |i| value(r, k, 5, i));
            single.run().map_err(s)?;
            let v = read::<f32>(&single.tensors()[0]);
            ensure!(
                v == [sum(k, 5, 0) as f32, sum(k, 5, 1) as f32],
                "8 B step {k}: {v:?}"
            );
        }
    }
    {
        let mut into = w
            .plan_all_reduce_tensor(&mut gx, &mut gy, ReduceOp::Max)
            .map_err(s)?;
        into.run().map_err(s)?;
        let v = read::<f32>(&into.tensors()[0]);
        ensure!(
            v == [sum(2, 5, 0) as f32, sum(2, 5, 1) as f32],
            "max into: {v:?}"
        );
    }
    let mut bcast = w.plan_broadcast_tensor(&mut gz, 0).map_err(s)?;
    for k in 0..3 {
        write::<i32>(&mut bcast.tensors_mut()[0], |i| value(r, k, 6, i));
        bcast.run().map_err(s)?;
        let v = read::<i32>(&bcast.tensors()[0]);
        ensure!(
            v == (0..7).map(|i| value(0, k, 6, i) as i32).collect::<Vec<_>>(),
            "bcast step {k}: {v:?}"
        );
    }
    Ok(())
}

/// `plan_reduce_scatter_block_tensors` (a contiguous and a strided send member) and
/// `plan_reduce_scatter_block_tensor`: rank q's block of every member, summed, at every step.
fn reduce_scatter_steps_are_exact(w: &SimpleCommunicator) -> Outcome {
    let (r, n) = (i64::from(w.rank()), w.size() as usize);
    let o = AcquireOptions::default();
    let (b0, b1) = (6usize, 11usize);
    let (sa, sb) = (storage::<i64>(b0 * n, 1)?, storage::<f32>(b1 * n, 2)?);
    let (ra, rb) = (storage::<i64>(b0, 1)?, storage::<f32>(b1, 3)?);
    let mut send = vec![acquire(&sa, &o).map_err(s)?, acquire(&sb, &o).map_err(s)?];
    let mut recv = vec![acquire(&ra, &o).map_err(s)?, acquire(&rb, &o).map_err(s)?];
    let want = |k: i64, m: i64, block: usize, i: usize| -> i64 {
        (0..n as i64).map(|q| value(q, k, m, block + i)).sum()
    };
    let me = w.rank() as usize;
    {
        let mut plan = w
            .plan_reduce_scatter_block_tensors(&mut send, &mut recv, ReduceOp::Sum)
            .map_err(s)?;
        for k in 0..4 {
            let sends = plan.send_tensors_mut().ok_or("no send list")?;
            write::<i64>(&mut sends[0], |i| value(r, k, 0, i));
            write::<f32>(&mut sends[1], |i| value(r, k, 1, i));
            if k % 2 == 0 {
                plan.run()
            } else {
                mpi::request::scope(|scope| plan.start(scope).and_then(|q| q.wait()))
            }
            .map_err(s)?;
            let got = (
                read::<i64>(&plan.tensors()[0]),
                read::<f32>(&plan.tensors()[1]),
            );
            for i in 0..b0 {
                ensure!(
                    got.0[i] == want(k, 0, me * b0, i),
                    "step {k}: member 0 element {i}: {}",
                    got.0[i]
                );
            }
            for i in 0..b1 {
                ensure!(
                    got.1[i] == want(k, 1, me * b1, i) as f32,
                    "step {k}: member 1 element {i}: {}",
                    got.1[i]
                );
            }
        }
    }
    let (s0, r0) = (&mut send[0], &mut recv[0]);
    let mut one = w
        .plan_reduce_scatter_block_tensor(s0, r0, ReduceOp::Sum)
        .map_err(s)?;
    write::<i64>(&mut one.send_tensors_mut().ok_or("no send")?[0], |i| {
        value(r, 9, 0, i)
    });
    one.run().map_err(s)?;
    let got = read::<i64>(&one.tensors()[0]);
    ensure!(
        got == (0..b0).map(|i| want(9, 0, me * b0, i)).collect::<Vec<_>>(),
        "single: {got:?}"
    );
    Ok(())
}

/// `plan_all_gather_tensor`: a small contiguous pair, a strided pair (identity after each
/// block) and a large contiguous pair (in place, no identity), exact at every step; a
/// strided step allocates nothing; two all-gather plans run crosswise are `PlanMismatch`
/// on every rank, with no element written.
fn all_gather_steps_are_exact(w: &SimpleCommunicator) -> Outcome {
    let (r, n) = (i64::from(w.rank()), w.size() as usize);
    let o = AcquireOptions::default();
    for (len, s_step, r_step, marked) in [(5, 1, 1, true), (9, 2, 3, true), (70_000, 1, 1, false)] {
        let (so, ro) = (
            storage::<f32>(len, s_step)?,
            storage::<f32>(len * n, r_step)?,
        );
        let (mut sg, mut rg) = (acquire(&so, &o).map_err(s)?, acquire(&ro, &o).map_err(s)?);
        let mut plan = w.plan_all_gather_tensor(&mut sg, &mut rg).map_err(s)?;
        ensure!(
            plan.checks().is_some() == marked,
            "{len} elements: checks {:?}",
            plan.checks()
        );
        for k in 0..3 {
            write::<f32>(&mut plan.send_tensors_mut().ok_or("no send")?[0], |i| {
                value(r, k, 0, i)
            });
            if k == 1 {
                mpi::request::scope(|scope| plan.start(scope).and_then(|q| q.wait()))
            } else {
                plan.run()
            }
            .map_err(s)?;
            let got = read::<f32>(&plan.tensors()[0]);
            for q in 0..n {
                for i in 0..len {
                    let want = value(q as i64, k, 0, i) as f32;
                    ensure!(
                        got[q * len + i] == want,
                        "{len}: step {k} block {q} element {i}: {}",
                        got[q * len + i]
                    );
                }
            }
        }
        if len == 9 {
            let (out, count) = crate::faults::allocations(|| -> Result<(), Error> {
                plan.run()?;
                mpi::request::scope(|scope| plan.start(scope)?.wait())
            });
            out.map_err(s)?;
            ensure!(
                count == 0,
                "strided all-gather steps allocated {count} times"
            );
        }
    }
    if n >= 2 {
        let (a, b) = (storage::<i32>(4, 1)?, storage::<i32>(4, 1)?);
        let (ra, rb) = (storage::<i32>(4 * n, 1)?, storage::<i32>(4 * n, 1)?);
        let (mut ga, mut gb) = (acquire(&a, &o).map_err(s)?, acquire(&b, &o).map_err(s)?);
        let (mut gra, mut grb) = (acquire(&ra, &o).map_err(s)?, acquire(&rb, &o).map_err(s)?);
        let mut pa = w.plan_all_gather_tensor(&mut ga, &mut gra).map_err(s)?;
        let mut pb = w.plan_all_gather_tensor(&mut gb, &mut grb).map_err(s)?;
        match if r == 0 { pa.run() } else { pb.run() } {
            Err(Error::PlanMismatch { seen }) => ensure!(seen.contains("identity"), "{seen}"),
            other => return Err(format!("rank {r}: crosswise all-gathers: {other:?}")),
        }
        let untouched = |v: Vec<i32>| v.iter().all(|&x| x == GUARD as i32);
        ensure!(
            untouched(read(&pa.tensors()[0])) && untouched(read(&pb.tensors()[0])),
            "a mismatched step wrote"
        );
    }
    Ok(())
}

/// Puts the plan mechanism back to the default when dropped.
struct AutoAgain;
impl Drop for AutoAgain {
    fn drop(&mut self) {
        set_plan_mechanism(PlanMechanism::Auto);
    }
}

/// Whether this MPI has the MPI-4 persistent collectives (MPICH ≥ 4, Open MPI ≥ 5).
fn mpi_has_persistent() -> bool {
    let v = mpi::environment::library_version().unwrap_or_default();
    let major = |prefix: &str| {
        v.split(prefix).nth(1).and_then(|rest| {
            rest.trim_start()
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<u32>()
                .ok()
        })
    };
    major("MPICH Version:").is_some_and(|m| m >= 4) || major("Open MPI v").is_some_and(|m| m >= 5)
}

/// `PlanMechanism::Persistent`: plans whose buckets are all the plan's own buffers start
/// MPI-4 persistent collectives where the MPI has them (every kind: all-reduce, broadcast,
/// reduce-scatter, all-gather), exact at every step, no allocation per step; a plan with a
/// member large enough to be reduced in place stays blocking.
fn persistent_steps_are_exact(w: &SimpleCommunicator) -> Outcome {
    let (r, n) = (i64::from(w.rank()), w.size() as usize);
    let _back = AutoAgain;
    set_plan_mechanism(PlanMechanism::Persistent);
    let has = mpi_has_persistent();
    let o = AcquireOptions::default();
    let sum = |k: i64, m: i64, i: usize| (0..n as i64).map(|q| value(q, k, m, i)).sum::<i64>();
    let (a, b) = (storage::<f32>(5, 1)?, storage::<f64>(30, 2)?);
    let mut list = vec![acquire(&a, &o).map_err(s)?, acquire(&b, &o).map_err(s)?];
    {
        let mut plan = w
            .plan_all_reduce_tensors_in_place(&mut list, ReduceOp::Sum)
            .map_err(s)?;
        ensure!(
            plan.is_persistent() == has,
            "persistent: {} (MPI has them: {has})",
            plan.is_persistent()
        );
        for k in 0..4 {
            write::<f32>(&mut plan.tensors_mut()[0], |i| value(r, k, 0, i));
            write::<f64>(&mut plan.tensors_mut()[1], |i| value(r, k, 1, i));
            if k % 2 == 0 {
                plan.run()
            } else {
                mpi::request::scope(|scope| plan.start(scope).and_then(|q| q.wait()))
            }
            .map_err(s)?;
            let (x, y) = (
                read::<f32>(&plan.tensors()[0]),
                read::<f64>(&plan.tensors()[1]),
            );
            ensure!(
                x == (0..5).map(|i| sum(k, 0, i) as f32).collect::<Vec<_>>(),
                "step {k}: {x:?}"
            );
            ensure!(
                y == (0..30).map(|i| sum(k, 1, i) as f64).collect::<Vec<_>>(),
                "step {k}: {y:?}"
            );
        }
        let (out, count) = crate::faults::allocations(|| {
            plan.run()
                .and_then(|()| mpi::request::scope(|scope| plan.start(scope)?.wait()))
        });
        out.map_err(s)?;
        ensure!(count == 0, "persistent steps allocated {count} times");
    }
    {
        let mut bcast = w.plan_broadcast_tensors(&mut list, 0).map_err(s)?;
        ensure!(
            bcast.is_persistent() == has,
            "broadcast persistent: {}",
            bcast.is_persistent()
        );
        write::<f32>(&mut bcast.tensors_mut()[0], |i| value(r, 7, 0, i));
        bcast.run().map_err(s)?;
        let x = read::<f32>(&bcast.tensors()[0]);
        ensure!(
            x == (0..5).map(|i| value(0, 7, 0, i) as f32).collect::<Vec<_>>(),
            "broadcast: {x:?}"
        );
    }
    let (so, ro) = (storage::<i32>(3, 2)?, storage::<i32>(3 * n, 1)?);
    let (mut sg, mut rg) = (acquire(&so, &o).map_err(s)?, acquire(&ro, &o).map_err(s)?);
    {
        let mut gather = w.plan_all_gather_tensor(&mut sg, &mut rg).map_err(s)?;
        ensure!(
            gather.is_persistent() == has,
            "all-gather persistent: {}",
            gather.is_persistent()
        );
        write::<i32>(&mut gather.send_tensors_mut().ok_or("no send")?[0], |i| {
            value(r, 2, 0, i)
        });
        mpi::request::scope(|scope| gather.start(scope).and_then(|q| q.wait())).map_err(s)?;
        let got = read::<i32>(&gather.tensors()[0]);
        let want: Vec<i32> = (0..n)
            .flat_map(|q| (0..3).map(move |i| value(q as i64, 2, 0, i) as i32))
            .collect();
        ensure!(got == want, "all-gather: {got:?}");
    }
    let (ss, rs) = (storage::<f32>(4 * n, 1)?, storage::<f32>(4, 1)?);
    let (mut sg, mut rg) = (acquire(&ss, &o).map_err(s)?, acquire(&rs, &o).map_err(s)?);
    {
        let mut rsp = w
            .plan_reduce_scatter_block_tensor(&mut sg, &mut rg, ReduceOp::Sum)
            .map_err(s)?;
        ensure!(
            rsp.is_persistent() == has,
            "reduce-scatter persistent: {}",
            rsp.is_persistent()
        );
        write::<f32>(&mut rsp.send_tensors_mut().ok_or("no send")?[0], |i| {
            value(r, 4, 0, i)
        });
        rsp.run().map_err(s)?;
        let me = w.rank() as usize;
        let got = read::<f32>(&rsp.tensors()[0]);
        ensure!(
            got == (0..4)
                .map(|i| sum(4, 0, me * 4 + i) as f32)
                .collect::<Vec<_>>(),
            "reduce-scatter: {got:?}"
        );
    }
    let big = Owned::new(vec![1.0f32; 70_000]);
    let mut one = vec![acquire(&big, &o).map_err(s)?];
    let plan = w
        .plan_all_reduce_tensors_in_place(&mut one, ReduceOp::Sum)
        .map_err(s)?;
    ensure!(
        !plan.is_persistent(),
        "a plan reducing a member in place was made persistent"
    );
    drop(plan);
    // PlanMechanism::Blocking on every rank: `run` makes the blocking collectives.
    set_plan_mechanism(PlanMechanism::Blocking);
    let mut plan = w
        .plan_all_reduce_tensors_in_place(&mut list, ReduceOp::Sum)
        .map_err(s)?;
    ensure!(!plan.is_persistent(), "a blocking plan is persistent");
    for k in 0..3 {
        write::<f32>(&mut plan.tensors_mut()[0], |i| value(r, k, 0, i));
        plan.run().map_err(s)?;
        let x = read::<f32>(&plan.tensors()[0]);
        let want: Vec<f32> = (0..5).map(|i| sum(k, 0, i) as f32).collect();
        ensure!(x == want, "blocking step {k}: {x:?}");
    }
    Ok(())
}

/// A step allocates nothing, blocking or nonblocking (the build does).
fn a_step_allocates_nothing(w: &SimpleCommunicator) -> Outcome {
    let st = Storages::new()?;
    let mut list = guards_of(&st)?;
    let mut plan = w
        .plan_all_reduce_tensors_in_place(&mut list, ReduceOp::Sum)
        .map_err(s)?;
    plan.run().map_err(s)?;
    let (out, count) = crate::faults::allocations(|| -> Result<(), Error> {
        for k in 0..5 {
            plan.run()?;
            // The members lent and written between steps: compared at the next step.
            fill(plan.tensors_mut(), 0, k);
            mpi::request::scope(|scope| plan.start(scope)?.wait())?;
        }
        Ok(())
    });
    out.map_err(s)?;
    ensure!(count == 0, "ten all-reduce steps allocated {count} times");
    drop(plan);
    // A reduce-scatter with a strided send member packs it whole first: not per step.
    let n = w.size() as usize;
    let (sa, ra) = (storage::<f32>(5 * n, 2)?, storage::<f32>(5, 1)?);
    let o = AcquireOptions::default();
    let (mut sg, mut rg) = (acquire(&sa, &o).map_err(s)?, acquire(&ra, &o).map_err(s)?);
    let mut rs = w
        .plan_reduce_scatter_block_tensor(&mut sg, &mut rg, ReduceOp::Sum)
        .map_err(s)?;
    let (out, count) = crate::faults::allocations(|| -> Result<(), Error> {
        for _ in 0..5 {
            rs.run()?;
            mpi::request::scope(|scope| rs.start(scope)?.wait())?;
        }
        Ok(())
    });
    out.map_err(s)?;
    ensure!(
        count == 0,
        "ten reduce-scatter steps allocated {count} times"
    );
    Ok(())
}

/// A step whose request was dropped uncompleted is waited for by the drop, and one tested
/// to completion is finished by the next use of the plan: their results are there. (A
/// request and its plan both forgotten abort at the scope's end, as rsmpi's requests do:
/// not testable in-process.)
fn a_dropped_step_completes(w: &SimpleCommunicator) -> Outcome {
    let (r, n) = (i64::from(w.rank()), i64::from(w.size()));
    let st = Storages::new()?;
    let mut list = guards_of(&st)?;
    let mut plan = w
        .plan_all_reduce_tensors_in_place(&mut list, ReduceOp::Sum)
        .map_err(s)?;
    fill(plan.tensors_mut(), r, 3);
    mpi::request::scope(|scope| -> Outcome {
        drop(plan.start(scope).map_err(s)?);
        Ok(())
    })?;
    check(
        plan.tensors(),
        |m, i| (0..n).map(|q| value(q, 3, m, i)).sum(),
        "dropped step",
    )?;
    fill(plan.tensors_mut(), r, 4);
    mpi::request::scope(|scope| -> Outcome {
        let mut request = plan.start(scope).map_err(s)?;
        while !request.test().map_err(s)? {}
        Ok(())
    })?;
    drop(plan);
    check(
        &list,
        |m, i| (0..n).map(|q| value(q, 4, m, i)).sum(),
        "after the drop",
    )
}

/// A step runs while a nonblocking collective of this crate waits for its agreement (on
/// the same communicator): the step polls, and both results are exact.
fn steps_beside_pending_collectives(w: &SimpleCommunicator) -> Outcome {
    let (r, n) = (i64::from(w.rank()), i64::from(w.size()));
    let st = Storages::new()?;
    let mut list = guards_of(&st)?;
    let mut plan = w
        .plan_all_reduce_tensors_in_place(&mut list, ReduceOp::Sum)
        .map_err(s)?;
    let mut other = Owned::new(vec![r as f32 + 1.0; 9]);
    let mut g = acquire(&other, &AcquireOptions::default()).map_err(s)?;
    mpi::request::scope(|scope| -> Outcome {
        let request = w
            .immediate_all_reduce_tensor_in_place(scope, &mut g, ReduceOp::Sum)
            .map_err(s)?;
        fill(plan.tensors_mut(), r, 1);
        plan.run().map_err(s)?;
        request.wait().map_err(s)?;
        Ok(())
    })?;
    drop(g);
    check(
        plan.tensors(),
        |m, i| (0..n).map(|q| value(q, 1, m, i)).sum(),
        "plan step",
    )?;
    let want = (n * (n + 1) / 2) as f32;
    ensure!(
        other.as_slice().iter().all(|&x| x == want),
        "pending all-reduce: {:?}",
        other.as_slice()
    );
    Ok(())
}

/// One list of ten float32 of value `v`.
fn ten(v: f32) -> Owned<f32> {
    Owned::new(vec![v; 10])
}

/// Two plans of the same shape, built in the same order: rank 0 runs the first while the
/// others run the second → `PlanMismatch` on every rank, and no member written; in
/// order, both are exact again. Plans built in another order on rank 0 also differ.
fn mismatched_steps_are_errors(w: &SimpleCommunicator) -> Outcome {
    let (r, n) = (w.rank(), w.size());
    let (x, y) = (ten(1.0), ten(2.0));
    let o = AcquireOptions::default();
    let (mut lx, mut ly) = (
        vec![acquire(&x, &o).map_err(s)?],
        vec![acquire(&y, &o).map_err(s)?],
    );
    let mut px = w
        .plan_all_reduce_tensors_in_place(&mut lx, ReduceOp::Sum)
        .map_err(s)?;
    let mut py = w
        .plan_all_reduce_tensors_in_place(&mut ly, ReduceOp::Sum)
        .map_err(s)?;
    if n >= 2 {
        let out = if r == 0 { px.run() } else { py.run() };
        match out {
            Err(Error::PlanMismatch { seen }) => ensure!(seen.contains("identity"), "{seen}"),
            other => return Err(format!("rank {r}: expected PlanMismatch, got {other:?}")),
        }
        let (vx, vy) = (read::<f32>(&px.tensors()[0]), read::<f32>(&py.tensors()[0]));
        ensure!(
            vx == [1.0; 10] && vy == [2.0; 10],
            "a mismatched step wrote {vx:?} {vy:?}"
        );
    }
    px.run().map_err(s)?;
    py.run().map_err(s)?;
    let (vx, vy) = (read::<f32>(&px.tensors()[0]), read::<f32>(&py.tensors()[0]));
    ensure!(
        vx == vec![n as f32; 10] && vy == vec![2.0 * n as f32; 10],
        "in order: {vx:?} {vy:?}"
    );
    drop((px, py));
    if n >= 2 {
        // Rank 0 builds them the other way round: its plan over x is the second built.
        let (p, q) = if r == 0 {
            let q = w
                .plan_all_reduce_tensors_in_place(&mut ly, ReduceOp::Max)
                .map_err(s)?;
            (
                w.plan_all_reduce_tensors_in_place(&mut lx, ReduceOp::Max)
                    .map_err(s)?,
                q,
            )
        } else {
            let p = w
                .plan_all_reduce_tensors_in_place(&mut lx, ReduceOp::Max)
                .map_err(s)?;
            (
                p,
                w.plan_all_reduce_tensors_in_place(&mut ly, ReduceOp::Max)
                    .map_err(s)?,
            )
        };
        let (mut p, _q) = (p, q);
        ensure!(
            matches!(p.run(), Err(Error::PlanMismatch { .. })),
            "rank {r}: plans built in another order met"
        );
    }
    Ok(())
}

/// A member replaced through `tensors_mut` on the last rank: `PlanChanged` there (naming
/// the member and the field) at this step and the next, `PlanMismatch` on the peers, whose
/// members keep their values.
fn a_changed_member_refuses_the_step(w: &SimpleCommunicator) -> Outcome {
    let (r, last) = (w.rank(), w.size() - 1);
    let (x, y, z) = (ten(1.0), ten(5.0), ten(9.0));
    let o = AcquireOptions::default();
    let mut list = vec![acquire(&x, &o).map_err(s)?, acquire(&y, &o).map_err(s)?];
    let mut plan = w
        .plan_all_reduce_tensors_in_place(&mut list, ReduceOp::Sum)
        .map_err(s)?;
    if r == last {
        plan.tensors_mut()[1] = acquire(&z, &o).map_err(s)?;
    }
    for step in 0..2 {
        match plan.run() {
            Err(Error::PlanChanged {
                index: 1,
                field: "data pointer",
                ..
            }) if r == last => {}
            Err(Error::PlanMismatch { .. }) if r != last => {}
            other => return Err(format!("rank {r} step {step}: got {other:?}")),
        }
    }
    if r != last {
        let v = read::<f32>(&plan.tensors()[0]);
        ensure!(v == [1.0; 10], "a refused step wrote {v:?}");
    }
    drop(plan);
    // An all-gather in place (large contiguous blocks, no identity): the changed rank's
    // step takes part on buffers of its own, so its peers complete; it says PlanChanged.
    let n = w.size() as usize;
    let (ro, other) = (
        Owned::new(vec![0f32; 70_000 * n]),
        Owned::new(vec![0f32; 70_000 * n]),
    );
    let so = Owned::new(vec![r as f32; 70_000]);
    let (mut sg, mut rg) = (acquire(&so, &o).map_err(s)?, acquire(&ro, &o).map_err(s)?);
    let mut gather = w.plan_all_gather_tensor(&mut sg, &mut rg).map_err(s)?;
    ensure!(
        gather.checks().is_none(),
        "a large in-place all-gather carries an identity"
    );
    if r == last {
        gather.tensors_mut()[0] = acquire(&other, &o).map_err(s)?;
    }
    match gather.run() {
        Err(Error::PlanChanged {
            index: 0,
            field: "data pointer",
            ..
        }) if r == last => {}
        Ok(()) if r != last => {}
        out => {
            return Err(format!(
                "rank {r}: all-gather with a changed member: {out:?}"
            ))
        }
    }
    Ok(())
}

/// At the build: lists that differ → `CollectiveMismatch` on every rank; a read-only
/// member on the last rank → its `Member` error there, `PeerRefused` elsewhere; a root out
/// of range → `InvalidRank` on every rank.
fn build_refusals_are_errors_everywhere(w: &SimpleCommunicator) -> Outcome {
    let (r, n) = (w.rank(), w.size());
    let o = AcquireOptions::default();
    let (x, y) = (ten(1.0), Owned::new(vec![1i32; 4]));
    if n >= 2 {
        let mut list = vec![acquire(&x, &o).map_err(s)?];
        if r == 0 {
            list.push(acquire(&y, &o).map_err(s)?);
        }
        match w
            .plan_all_reduce_tensors_in_place(&mut list, ReduceOp::Sum)
            .map(drop)
        {
            Err(Error::CollectiveMismatch { difference, .. }) => {
                ensure!(difference.contains("member"), "{difference}")
            }
            other => return Err(format!("rank {r}: lists that differ: {other:?}")),
        }
        drop(list);
    }
    let ro = ten(1.0).read_only();
    let mut list = vec![acquire(if r == n - 1 { &ro } else { &x }, &o).map_err(s)?];
    match w
        .plan_all_reduce_tensors_in_place(&mut list, ReduceOp::Sum)
        .map(drop)
    {
        Err(Error::Member { index: 0, .. }) if r == n - 1 => {}
        Err(Error::PeerRefused { .. }) if r != n - 1 => {}
        other => return Err(format!("rank {r}: read-only member: {other:?}")),
    }
    drop(list);
    let mut list = vec![acquire(&x, &o).map_err(s)?];
    match w.plan_broadcast_tensors(&mut list, n).map(drop) {
        Err(Error::InvalidRank { .. }) => Ok(()),
        other => Err(format!("rank {r}: root {n}: {other:?}")),
    }
}

/// Puts the plan check back to the default when dropped.
struct IdentityAgain;
impl Drop for IdentityAgain {
    fn drop(&mut self) {
        set_plan_check(PlanCheck::Identity);
    }
}

/// Under `PlanCheck::Each`, a step on rank 0 against an unplanned fused all-reduce on the
/// others is a `CollectiveMismatch` in words on every rank, before data moves; then, on
/// every rank, steps are exact.
fn each_check_names_an_unplanned_call(w: &SimpleCommunicator) -> Outcome {
    let (r, n) = (w.rank(), w.size());
    let comm = w.duplicate();
    let _back = IdentityAgain;
    set_plan_check(PlanCheck::Each);
    let x = ten(3.0);
    let mut list = vec![acquire(&x, &AcquireOptions::default()).map_err(s)?];
    let mut plan = comm
        .plan_all_reduce_tensors_in_place(&mut list, ReduceOp::Sum)
        .map_err(s)?;
    if n >= 2 {
        let out = if r == 0 {
            plan.run()
        } else {
            comm.all_reduce_tensors_in_place(plan.tensors_mut(), ReduceOp::Sum)
        };
        match out {
            Err(Error::CollectiveMismatch { difference, .. }) => {
                ensure!(difference.contains("plan"), "{difference}")
            }
            other => {
                return Err(format!(
                    "rank {r}: expected CollectiveMismatch, got {other:?}"
                ))
            }
        }
        ensure!(
            read::<f32>(&plan.tensors()[0]) == [3.0; 10],
            "a mismatched step moved data"
        );
        reset_out_of_step(&comm);
    }
    plan.run().map_err(s)?;
    let v = read::<f32>(&plan.tensors()[0]);
    ensure!(v == vec![3.0 * n as f32; 10], "checked step: {v:?}");
    Ok(())
}

/// Rank 0 starts each step while the others run it (and a nonblocking collective of this
/// crate is pending on rank 0 only, waited after the step): every step is the same MPI
/// call on every rank, so they meet and are exact.
fn started_and_run_steps_meet(w: &SimpleCommunicator) -> Outcome {
    let (r, n) = (i64::from(w.rank()), i64::from(w.size()));
    let x = ten(1.0);
    let mut list = vec![acquire(&x, &AcquireOptions::default()).map_err(s)?];
    let mut plan = w
        .plan_all_reduce_tensors_in_place(&mut list, ReduceOp::Sum)
        .map_err(s)?;
    let mut other = Owned::new(vec![1.0f32; 3]);
    let mut g = acquire(&other, &AcquireOptions::default()).map_err(s)?;
    for k in 0..3 {
        write::<f32>(&mut plan.tensors_mut()[0], |i| value(r, k, 0, i));
        mpi::request::scope(|scope| -> Outcome {
            let pending = w
                .immediate_all_reduce_tensor_in_place(scope, &mut g, ReduceOp::Sum)
                .map_err(s)?;
            if r == 0 {
                plan.start(scope).and_then(|q| q.wait()).map_err(s)?;
                pending.wait().map_err(s)?;
            } else {
                pending.wait().map_err(s)?;
                plan.run().map_err(s)?;
            }
            Ok(())
        })?;
        let got = read::<f32>(&plan.tensors()[0]);
        let want: Vec<f32> = (0..10)
            .map(|i| (0..n).map(|q| value(q, k, 0, i)).sum::<i64>() as f32)
            .collect();
        ensure!(got == want, "step {k}: {got:?}");
    }
    drop(g);
    let want = (n as f32).powi(3);
    ensure!(
        other.as_slice().iter().all(|&v| v == want),
        "pending sums: {:?}",
        other.as_slice()
    );
    Ok(())
}

/// A plan setting that differs across ranks (the mechanism on rank 0 only) is a
/// `CollectiveMismatch` naming it at the build, on every rank; under `PlanCheck::Each` on
/// the world communicator, two plans of the same lists stepped crosswise are a
/// `CollectiveMismatch` naming the plans' numbers, before data moves.
fn plan_settings_and_plans_differ_in_words(w: &SimpleCommunicator) -> Outcome {
    let (r, n) = (w.rank(), w.size());
    let _back = (AutoAgain, IdentityAgain);
    let (x, y) = (ten(1.0), ten(2.0));
    let o = AcquireOptions::default();
    let (mut lx, mut ly) = (
        vec![acquire(&x, &o).map_err(s)?],
        vec![acquire(&y, &o).map_err(s)?],
    );
    if n >= 2 {
        if r == 0 {
            set_plan_mechanism(PlanMechanism::Blocking);
        }
        match w
            .plan_all_reduce_tensors_in_place(&mut lx, ReduceOp::Product)
            .map(drop)
        {
            Err(Error::CollectiveMismatch {
                arguments,
                other_arguments,
                ..
            }) => {
                let words = format!("{arguments} | {other_arguments}");
                ensure!(words.contains("mechanism blocking"), "{words}");
            }
            other => return Err(format!("rank {r}: mechanisms that differ: {other:?}")),
        }
        set_plan_mechanism(PlanMechanism::Auto);
    }
    set_plan_check(PlanCheck::Each);
    let mut px = w
        .plan_all_reduce_tensors_in_place(&mut lx, ReduceOp::Product)
        .map_err(s)?;
    let mut py = w
        .plan_all_reduce_tensors_in_place(&mut ly, ReduceOp::Product)
        .map_err(s)?;
    ensure!(px.checks().is_none(), "a product plan carries an identity");
    if n >= 2 {
        match if r == 0 { px.run() } else { py.run() } {
            Err(Error::CollectiveMismatch { difference, .. }) => {
                ensure!(difference.contains("plan number"), "{difference}")
            }
            other => return Err(format!("rank {r}: crossed same-signature plans: {other:?}")),
        }
        ensure!(
            read::<f32>(&px.tensors()[0]) == [1.0; 10],
            "a mismatched step moved data"
        );
        reset_out_of_step(w);
    }
    px.run().map_err(s)?;
    py.run().map_err(s)?;
    let (a, b) = (read::<f32>(&px.tensors()[0]), read::<f32>(&py.tensors()[0]));
    ensure!(
        a == [1.0; 10] && b == vec![2f32.powi(n); 10],
        "in order: {a:?} {b:?}"
    );
    Ok(())
}

/// Each member's deleter runs once, after the plan and the list are gone.
fn deleters_run_once(w: &SimpleCommunicator) -> Outcome {
    let raws: Vec<RawTensor> = (0..3)
        .map(|m| RawTensor::new(&vec![m as f32; 8 + m], (2, 32, 1)))
        .collect();
    let mut counters = Vec::new();
    let mut list = Vec::new();
    for raw in &raws {
        let (t, c) = raw.import_v1();
        list.push(t.map_err(s)?);
        counters.push(c);
    }
    {
        let mut plan = w
            .plan_all_reduce_tensors_in_place(&mut list, ReduceOp::Sum)
            .map_err(s)?;
        for _ in 0..3 {
            plan.run().map_err(s)?;
        }
        ensure!(
            counters.iter().all(|c| c.get() == 0),
            "a deleter ran during the plan"
        );
    }
    drop(list);
    ensure!(
        counters.iter().all(|c| c.get() == 1),
        "deleters: {:?}",
        counters.iter().map(|c| c.get()).collect::<Vec<_>>()
    );
    Ok(())
}

type Case = (&'static str, fn(&SimpleCommunicator) -> Outcome);

const CASES: &[Case] = &[
    ("all_reduce_steps_are_exact", all_reduce_steps_are_exact),
    ("broadcast_steps_are_exact", broadcast_steps_are_exact),
    (
        "all_reduce_into_and_single_forms",
        all_reduce_into_and_single_forms,
    ),
    (
        "reduce_scatter_steps_are_exact",
        reduce_scatter_steps_are_exact,
    ),
    ("all_gather_steps_are_exact", all_gather_steps_are_exact),
    ("persistent_steps_are_exact", persistent_steps_are_exact),
    ("a_step_allocates_nothing", a_step_allocates_nothing),
    ("a_dropped_step_completes", a_dropped_step_completes),
    (
        "steps_beside_pending_collectives",
        steps_beside_pending_collectives,
    ),
    ("mismatched_steps_are_errors", mismatched_steps_are_errors),
    (
        "a_changed_member_refuses_the_step",
        a_changed_member_refuses_the_step,
    ),
    (
        "build_refusals_are_errors_everywhere",
        build_refusals_are_errors_everywhere,
    ),
    (
        "each_check_names_an_unplanned_call",
        each_check_names_an_unplanned_call,
    ),
    ("started_and_run_steps_meet", started_and_run_steps_meet),
    (
        "plan_settings_and_plans_differ_in_words",
        plan_settings_and_plans_differ_in_words,
    ),
    ("deleters_run_once", deleters_run_once),
];

/// The suite `plans` (see the binary's `main`).
pub fn run(w: &SimpleCommunicator, filter: &[String]) -> harness::End {
    if w.rank() == 0 {
        println!("running plan cases at {} rank(s)", w.size());
    }
    let (passed, failed) = harness::run_cases(w, CASES.iter().copied(), filter, |case| case(w));
    harness::report(w, passed, failed);
    harness::End::Ran { passed, failed }
}
