//! Exchanges (issue 32, item 3): `plan_exchange`, planned point-to-point messages built
//! once and run for several steps, blocking (`run`) and nonblocking (`start`/`test`/`wait`),
//! with the values changed between steps and every element checked every step: a ring halo
//! (each rank sends to the next, receives from the previous: a self-exchange at 1 rank); a
//! 1-D halo with both neighbours over the columns of one grid (strided members that
//! interleave; empty lists at 1 rank); contiguous and strided members in all four
//! combinations, a transposed 300 × 200 view, a zero-size member and members of several
//! chunks, guard elements around each member untouched; several members with one peer and
//! tag, paired in list order; a step allocates nothing (counted by the binary's allocator);
//! a dropped or tested step completes; a step beside a pending nonblocking collective; mismatches at
//! the build (dtype, count, a tag nobody receives, a receive nobody sends) and local
//! refusals (`any_source`, `any_tag`, a read-only receive) are errors on every rank; an
//! unplanned collective against the build is an error, not a hang; a member changed
//! through `sends_mut`/`recvs_mut` is `PlanChanged` there and `PlanMismatch` on its
//! receiver, with nothing written; each member's deleter once.
//!
//! The suite `exchanges` of tests/mpi (main.rs): `cargo test` runs it at 1 rank;
//! scripts/test.sh under `mpirun -n 2`, `-n 3` and `-n 4` within a timeout.

use crate::common::RawTensor;
use crate::harness;
use dlpack_mpi::comm::{any_source, any_tag, reset_out_of_step, Exchange, TensorComm};
use dlpack_mpi::dlpack::{acquire, AcquireOptions, DLTensor, ManagedTensor, Owned, Tensor};
use dlpack_mpi::dlpack::{TensorListMut, TensorView};
use dlpack_mpi::dtype::ReduceOp;
use dlpack_mpi::Error;
use mpi::topology::{Rank, SimpleCommunicator};
use mpi::traits::*;

type Outcome = Result<(), String>;

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Guard elements before and after every member.
const G: usize = 3;
/// The guard value.
const GUARD: f32 = -77.0;

/// Rank `r`'s value of member `m`, element `i`, at step `k` (exact in float32: below 2^24,
/// and `i` told apart within any 99 991 elements).
fn value(r: Rank, k: i64, m: usize, i: usize) -> f32 {
    ((i64::from(r) * 7 + k * 3 + m as i64) % 50 * 100_000 + (i % 99_991) as i64) as f32
}

/// The element offsets of a layout, in logical row-major order.
fn offsets(shape: &[i64], strides: Option<&[i64]>) -> Vec<isize> {
    let n: i64 = shape.iter().product();
    let compact: Vec<i64> = (0..shape.len())
        .map(|a| shape[a + 1..].iter().product())
        .collect();
    let st = strides.unwrap_or(&compact);
    let mut idx = vec![0i64; shape.len()];
    let mut out = Vec::with_capacity(n.max(0) as usize);
    for _ in 0..n.max(0) {
        out.push(idx.iter().zip(st).map(|(i, s)| i * s).sum::<i64>() as isize);
        for a in (0..shape.len()).rev() {
            idx[a] += 1;
            if idx[a] < shape[a] {
                break;
            }
            idx[a] = 0;
        }
    }
    out
}

/// Writes `f(i)` into logical element `i` of the float32 host tensor `t`.
fn write(t: &mut dyn Tensor, f: impl Fn(usize) -> f32) {
    let first = t.first_element_ptr().cast::<f32>();
    for (i, o) in offsets(t.shape(), t.strides_elems())
        .into_iter()
        .enumerate()
    {
        // SAFETY: a logical element of a float32 host tensor whose storage the test owns;
        // no step is in flight (the exchange's accessors completed it).
        unsafe { first.offset(o).write(f(i)) };
    }
}

/// The logical elements of the float32 host tensor `t`.
fn read(t: &dyn Tensor) -> Vec<f32> {
    let first = t.first_element_ptr().cast::<f32>();
    let offs = offsets(t.shape(), t.strides_elems());
    // SAFETY: as in `write`.
    offs.into_iter()
        .map(|o| unsafe { first.offset(o).read() })
        .collect()
}

/// Checks every logical element of `t` against `want(i)`.
fn check(t: &dyn Tensor, want: impl Fn(usize) -> f32, at: &str) -> Outcome {
    for (i, x) in read(t).into_iter().enumerate() {
        ensure!(
            x == want(i),
            "{at}: element {i} is {x}, expected {}",
            want(i)
        );
    }
    Ok(())
}

/// A member's layout.
#[derive(Clone, Copy, Debug)]
enum L {
    /// `n` contiguous elements.
    Flat(i64),
    /// `n` elements `step` apart.
    Step(i64, i64),
    /// A contiguous `rows × cols` matrix.
    Grid(i64, i64),
    /// The transpose of a `rows × cols` row-major matrix (shape `[cols, rows]`).
    T(i64, i64),
}

impl L {
    fn shape(self) -> Vec<i64> {
        match self {
            L::Flat(n) | L::Step(n, _) => vec![n],
            L::Grid(r, c) => vec![r, c],
            L::T(r, c) => vec![c, r],
        }
    }

    fn strides(self) -> Option<Vec<i64>> {
        match self {
            L::Flat(_) | L::Grid(..) => None,
            L::Step(_, step) => Some(vec![step]),
            L::T(_, c) => Some(vec![1, c]),
        }
    }

    /// Elements the storage spans (past the guards).
    fn span(self) -> usize {
        match self {
            L::Flat(n) => n as usize,
            L::Step(n, step) => (n.max(1) * step) as usize,
            L::Grid(r, c) | L::T(r, c) => (r * c) as usize,
        }
    }

    /// Its storage: the guard value everywhere, the member `G` elements in.
    fn storage(self) -> Result<Owned<f32>, String> {
        Owned::new(vec![GUARD; 2 * G + self.span()])
            .with_layout(&self.shape(), self.strides().as_deref(), (G * 4) as u64)
            .map_err(s)
    }

    /// Every storage element outside the member is still the guard.
    fn guards(self, o: &mut Owned<f32>) -> Outcome {
        let offs = offsets(&self.shape(), self.strides().as_deref());
        let mut logical = vec![false; 2 * G + self.span()];
        for o in offs {
            logical[G + o as usize] = true;
        }
        for (j, &x) in o.as_slice().iter().enumerate() {
            ensure!(
                logical[j] || x == GUARD,
                "{self:?}: guard element {j} is {x}"
            );
        }
        Ok(())
    }
}

/// The storages of `layouts`.
fn storages(layouts: &[L]) -> Result<Vec<Owned<f32>>, String> {
    layouts.iter().map(|l| l.storage()).collect()
}

/// Guards over every storage.
fn guarded(st: &[Owned<f32>]) -> Result<Vec<ManagedTensor<'_>>, String> {
    let o = AcquireOptions::default();
    st.iter().map(|x| acquire(x, &o).map_err(s)).collect()
}

/// Every storage's guards intact.
fn guards_all(layouts: &[L], st: &mut [Owned<f32>]) -> Outcome {
    layouts.iter().zip(st).try_for_each(|(l, o)| l.guards(o))
}

/// The next and the previous rank of a ring.
fn ring(w: &SimpleCommunicator) -> (Rank, Rank, Rank) {
    let (r, n) = (w.rank(), w.size());
    (r, (r + 1) % n, (r + n - 1) % n)
}

/// Step `k` of `x`: blocking for even `k`, else started, tested and waited for.
fn step<S, R>(x: &mut Exchange<'_, S, R>, k: i64) -> Result<(), Error>
where
    S: TensorListMut + ?Sized,
    R: TensorListMut + ?Sized,
{
    if k % 2 == 0 {
        x.run()
    } else {
        mpi::request::scope(|scope| {
            let mut request = x.start(scope)?;
            let _ = request.test()?;
            request.wait()
        })
    }
}

/// Sends member `m` of each step of a ring exchange of `(send, recv)` layouts (tag
/// `tag0 + m`, or `tag0` for every member when `one_tag`): values changed every step,
/// every element checked every step, guards intact at the end.
fn ring_steps(w: &SimpleCommunicator, pairs: &[(L, L)], tag0: i32, one_tag: bool) -> Outcome {
    let (r, next, prev) = ring(w);
    let (sl, rl): (Vec<L>, Vec<L>) = pairs.iter().copied().unzip();
    let (mut ss, mut rs) = (storages(&sl)?, storages(&rl)?);
    {
        let (mut sends, mut recvs) = (guarded(&ss)?, guarded(&rs)?);
        let tag = |m: usize| if one_tag { tag0 } else { tag0 + m as i32 };
        let to: Vec<(Rank, i32)> = (0..pairs.len()).map(|m| (next, tag(m))).collect();
        let from: Vec<(Rank, i32)> = (0..pairs.len()).map(|m| (prev, tag(m))).collect();
        let mut x = w
            .plan_exchange(&mut sends, &to, &mut recvs, &from)
            .map_err(s)?;
        for k in 0..5 {
            for (m, t) in x.sends_mut().iter_mut().enumerate() {
                write(t, |i| value(r, k, m, i));
            }
            step(&mut x, k).map_err(s)?;
            for (m, t) in x.recvs().iter().enumerate() {
                check(t, |i| value(prev, k, m, i), &format!("step {k} member {m}"))?;
            }
        }
    }
    guards_all(&sl, &mut ss)?;
    guards_all(&rl, &mut rs)
}

/// A ring halo: one contiguous member to the next rank, from the previous one.
fn ring_halo_steps_are_exact(w: &SimpleCommunicator) -> Outcome {
    ring_steps(w, &[(L::Flat(1000), L::Flat(1000))], 3, false)
}

/// Contiguous and strided at both ends, in all four combinations: a transposed 300 × 200
/// view at either end, a zero-size member, members of several chunks both ways (1-D
/// strided, and transposed at both ends with different shapes: chunks of partial rows).
const FOUR: [(L, L); 9] = [
    (L::Flat(60_000), L::Grid(300, 200)),
    (L::Flat(60_000), L::T(300, 200)),
    (L::T(300, 200), L::Flat(60_000)),
    (L::T(300, 200), L::Step(60_000, 2)),
    (L::Flat(0), L::Step(0, 2)),
    (L::Step(400_000, 2), L::Flat(400_000)),
    (L::Flat(400_000), L::Step(400_000, 3)),
    (L::Step(5, 3), L::T(1, 5)),
    (L::T(600, 500), L::T(500, 600)),
];

fn layouts_in_all_four_combinations(w: &SimpleCommunicator) -> Outcome {
    ring_steps(w, &FOUR, 10, false)
}

/// Several members with the same peer and tag pair in list order (chunked and whole
/// messages in one lane: 3 chunks of a strided send, then whole messages, then 2 chunks
/// into a transposed receive).
fn one_peer_and_tag_pair_in_order(w: &SimpleCommunicator) -> Outcome {
    let pairs = [
        (L::Step(600_000, 2), L::Flat(600_000)),
        (L::Flat(10), L::Step(10, 3)),
        (L::T(30, 20), L::Flat(600)),
        (L::Flat(0), L::Flat(0)),
        (L::Flat(350_000), L::T(700, 500)),
    ];
    ring_steps(w, &pairs, 9, true)
}

/// A column of a row-major `rows × cols` float32 grid, as a borrowed DLTensor.
struct Column {
    dl: DLTensor,
    shape: [i64; 1],
    strides: [i64; 1],
}

impl Column {
    /// Column `c` of the grid at `data` (`template` gives the dtype and device).
    fn new(template: &DLTensor, data: *mut f32, (rows, cols): (i64, i64), c: i64) -> Box<Self> {
        let mut col = Box::new(Column {
            dl: *template,
            shape: [rows],
            strides: [cols],
        });
        col.dl.data = data.cast();
        col.dl.ndim = 1;
        col.dl.byte_offset = (c * 4) as u64;
        col.dl.shape = col.shape.as_mut_ptr();
        col.dl.strides = col.strides.as_mut_ptr();
        col
    }

    fn view(&mut self) -> Result<TensorView<'static>, String> {
        // SAFETY: the struct is boxed (its arrays do not move) and outlives the view in
        // the case below; the grid's storage outlives both.
        unsafe { TensorView::from_raw(&mut self.dl) }.map_err(s)
    }
}

/// A 1-D halo with both neighbours (not periodic) over the columns of one grid per rank:
/// the first and last interior columns go to the left and right neighbours, the ghost
/// columns receive theirs; the members are strided and interleave. At 1 rank the lists
/// are empty.
fn halo_columns_with_both_neighbours(w: &SimpleCommunicator) -> Outcome {
    let (r, n) = (w.rank(), w.size());
    let (rows, cols) = (64i64, 12i64);
    let mut grid = vec![GUARD; (rows * cols) as usize];
    for (j, x) in grid.iter_mut().enumerate() {
        let c = j as i64 % cols;
        if (2..cols - 2).contains(&c) {
            *x = 1000.0 + j as f32;
        }
    }
    let one = Owned::new(vec![0f32; 1]);
    let template = *acquire(&one, &AcquireOptions::default())
        .map_err(s)?
        .dl_tensor();
    let data = grid.as_mut_ptr();
    let col = |c| Column::new(&template, data, (rows, cols), c);
    let (mut to, mut from, mut sc, mut rc) = (vec![], vec![], vec![], vec![]);
    if r > 0 {
        to.push((r - 1, 1));
        sc.push(col(1));
        from.push((r - 1, 2));
        rc.push(col(0));
    }
    if r < n - 1 {
        to.push((r + 1, 2));
        sc.push(col(cols - 2));
        from.push((r + 1, 1));
        rc.push(col(cols - 1));
    }
    {
        let mut sends = sc
            .iter_mut()
            .map(|c| c.view())
            .collect::<Result<Vec<_>, _>>()?;
        let mut recvs = rc
            .iter_mut()
            .map(|c| c.view())
            .collect::<Result<Vec<_>, _>>()?;
        let mut x = w
            .plan_exchange(&mut sends, &to, &mut recvs, &from)
            .map_err(s)?;
        // Column c's value at step k on rank q, row i.
        let v = |q: Rank, k: i64, c: i64, i: usize| value(q, k, c as usize, i);
        for k in 0..4 {
            for (t, &(peer, _)) in x.sends_mut().iter_mut().zip(&to) {
                let c = if peer < r { 1 } else { cols - 2 };
                write(t, |i| v(r, k, c, i));
            }
            step(&mut x, k).map_err(s)?;
            for (t, &(peer, _)) in x.recvs().iter().zip(&from) {
                let c = if peer < r { cols - 2 } else { 1 };
                check(t, |i| v(peer, k, c, i), &format!("step {k} from {peer}"))?;
            }
        }
    }
    for (j, &x) in grid.iter().enumerate() {
        let c = j as i64 % cols;
        let ghost = (c == 0 && r > 0) || (c == cols - 1 && r < n - 1);
        let sent = (c == 1 && r > 0) || (c == cols - 2 && r < n - 1);
        let want = if (2..cols - 2).contains(&c) {
            Some(1000.0 + j as f32)
        } else if ghost || sent {
            None
        } else {
            Some(GUARD)
        };
        ensure!(
            want.map_or(true, |y| y == x),
            "grid element {j} (column {c}) is {x}"
        );
    }
    Ok(())
}

/// A step allocates nothing, blocking or nonblocking (the build does).
fn a_step_allocates_nothing(w: &SimpleCommunicator) -> Outcome {
    let (_, next, prev) = ring(w);
    let (sl, rl): (Vec<L>, Vec<L>) = FOUR.iter().copied().unzip();
    let (ss, rs) = (storages(&sl)?, storages(&rl)?);
    let (mut sends, mut recvs) = (guarded(&ss)?, guarded(&rs)?);
    let to: Vec<(Rank, i32)> = (0..FOUR.len()).map(|m| (next, m as i32)).collect();
    let from: Vec<(Rank, i32)> = (0..FOUR.len()).map(|m| (prev, m as i32)).collect();
    let mut x = w
        .plan_exchange(&mut sends, &to, &mut recvs, &from)
        .map_err(s)?;
    x.run().map_err(s)?;
    let (out, count) = crate::faults::allocations(|| -> Result<(), Error> {
        for _ in 0..5 {
            x.run()?;
            mpi::request::scope(|scope| {
                let mut request = x.start(scope)?;
                let _ = request.test()?;
                request.wait()
            })?;
        }
        Ok(())
    });
    out.map_err(s)?;
    ensure!(count == 0, "ten steps allocated {count} times");
    Ok(())
}

/// A step whose request was dropped uncompleted is waited for by the drop, and one tested
/// to completion is finished by the next use of the exchange: their results are there.
fn a_dropped_step_completes(w: &SimpleCommunicator) -> Outcome {
    let (r, next, prev) = ring(w);
    let layouts = [L::Step(100_000, 2), L::Flat(100_000)];
    let mut st = storages(&layouts)?;
    {
        let mut all = guarded(&st)?;
        let (sends, recvs) = all.split_at_mut(1);
        let mut x = w
            .plan_exchange(sends, &[(next, 4)], recvs, &[(prev, 4)])
            .map_err(s)?;
        write(&mut x.sends_mut()[0], |i| value(r, 1, 0, i));
        mpi::request::scope(|scope| x.start(scope).map(drop)).map_err(s)?;
        check(&x.recvs()[0], |i| value(prev, 1, 0, i), "dropped step")?;
        write(&mut x.sends_mut()[0], |i| value(r, 2, 0, i));
        mpi::request::scope(|scope| -> Result<(), Error> {
            let mut request = x.start(scope)?;
            while !request.test()? {}
            Ok(())
        })
        .map_err(s)?;
        drop(x);
        check(&recvs[0], |i| value(prev, 2, 0, i), "after the drop")?;
    }
    guards_all(&layouts, &mut st)
}

/// A step runs while a nonblocking collective of this crate waits for its agreement (on
/// the same communicator): the step polls, and both results are exact.
fn steps_beside_pending_collectives(w: &SimpleCommunicator) -> Outcome {
    let (r, next, prev) = ring(w);
    let n = w.size();
    let layouts = [L::T(300, 200), L::Flat(60_000)];
    let st = storages(&layouts)?;
    let mut all = guarded(&st)?;
    let (sends, recvs) = all.split_at_mut(1);
    let mut x = w
        .plan_exchange(sends, &[(next, 5)], recvs, &[(prev, 5)])
        .map_err(s)?;
    let mut other = Owned::new(vec![r as f32 + 1.0; 9]);
    let mut g = acquire(&other, &AcquireOptions::default()).map_err(s)?;
    mpi::request::scope(|scope| -> Outcome {
        let request = w
            .immediate_all_reduce_tensor_in_place(scope, &mut g, ReduceOp::Sum)
            .map_err(s)?;
        write(&mut x.sends_mut()[0], |i| value(r, 7, 0, i));
        x.run().map_err(s)?;
        request.wait().map_err(s)?;
        Ok(())
    })?;
    drop(g);
    check(&x.recvs()[0], |i| value(prev, 7, 0, i), "exchange step")?;
    let want = (n * (n + 1) / 2) as f32;
    ensure!(
        other.as_slice().iter().all(|&x| x == want),
        "pending all-reduce: {:?}",
        other.as_slice()
    );
    Ok(())
}

/// Builds a ring exchange of one float32 × 10 member, where rank `odd` sends or receives
/// `odd_send`/`odd_recv` instead (dtype from a storage, tag, extra receive from `extra`):
/// returns the build's outcome.
fn build_ring(
    w: &SimpleCommunicator,
    recv: (&Owned<f32>, &Owned<f64>, bool),
    (tag_to, tag_from): (i32, i32),
    extra: Option<(Rank, i32)>,
) -> Result<(), Error> {
    let (_, next, prev) = ring(w);
    let o = AcquireOptions::default();
    let a = Owned::new(vec![1f32; 10]);
    let spare = Owned::new(vec![0f32; 10]);
    let mut sends = vec![acquire(&a, &o)?];
    let mut recvs = vec![if recv.2 {
        acquire(recv.1, &o)?
    } else {
        acquire(recv.0, &o)?
    }];
    let mut from = vec![(prev, tag_from)];
    if let Some(e) = extra {
        recvs.push(acquire(&spare, &o)?);
        from.push(e);
    }
    w.plan_exchange(&mut sends, &[(next, tag_to)], &mut recvs, &from)
        .map(drop)
}

/// Expects `CollectiveMismatch` whose words contain `word` (on the ranks concerned, whose
/// words are their own: every rank's contain `plan_exchange`).
fn mismatch(out: Result<(), Error>, word: &str, concerned: bool, what: &str) -> Outcome {
    match out {
        Err(Error::CollectiveMismatch { difference, .. }) => {
            ensure!(
                difference.contains("plan_exchange") && (!concerned || difference.contains(word)),
                "{what}: {difference}"
            );
            Ok(())
        }
        other => Err(format!(
            "{what}: expected CollectiveMismatch, got {other:?}"
        )),
    }
}

/// Mismatches at the build are `CollectiveMismatch` on every rank, in words on the ranks
/// of the pair: rank 0 receives float64, or 11 elements, or with another tag; the last
/// rank also receives from rank 0 with a tag nobody sends. Then a matching build works.
fn build_mismatches_are_errors_everywhere(w: &SimpleCommunicator) -> Outcome {
    let r = w.rank();
    let last = w.size() - 1;
    let (f32s, f64s, f11) = (
        Owned::new(vec![0f32; 10]),
        Owned::new(vec![0f64; 10]),
        Owned::new(vec![0f32; 11]),
    );
    let pair = r == 0 || r == prev_of(w, 0);
    let out = build_ring(w, (&f32s, &f64s, r == 0), (1, 1), None);
    mismatch(out, "dtype", pair, "float64 receive")?;
    let out = build_ring(
        w,
        (if r == 0 { &f11 } else { &f32s }, &f64s, false),
        (1, 1),
        None,
    );
    mismatch(out, "element count", pair, "11 elements")?;
    let tag = if r == 0 { 2 } else { 1 };
    let out = build_ring(w, (&f32s, &f64s, false), (1, tag), None);
    mismatch(out, "tag", pair, "another tag")?;
    let extra = (r == last).then_some((0, 77));
    let out = build_ring(w, (&f32s, &f64s, false), (1, 1), extra);
    mismatch(
        out,
        "does not send",
        r == last || r == 0,
        "a receive nobody sends",
    )?;
    build_ring(w, (&f32s, &f64s, false), (1, 1), None).map_err(s)
}

/// The rank before `r` in the ring.
fn prev_of(w: &SimpleCommunicator, r: Rank) -> Rank {
    (r + w.size() - 1) % w.size()
}

/// Local refusals: `any_source` on the last rank (`Member { index: 1, InvalidRank }`
/// there, `PeerRefused` elsewhere), `any_tag` on rank 0's send, a read-only receive
/// member, a `to` list of the wrong length.
fn local_refusals_are_errors_everywhere(w: &SimpleCommunicator) -> Outcome {
    let (r, next, prev) = ring(w);
    let last = w.size() - 1;
    let o = AcquireOptions::default();
    let (a, b, ro) = (
        Owned::new(vec![1f32; 4]),
        Owned::new(vec![0f32; 4]),
        Owned::new(vec![0f32; 4]).read_only(),
    );
    let mut sends = vec![acquire(&a, &o).map_err(s)?];
    let mut recvs = vec![acquire(&b, &o).map_err(s)?];
    let src = if r == last { any_source() } else { prev };
    let out = w.plan_exchange(&mut sends, &[(next, 1)], &mut recvs, &[(src, 1)]);
    match out.map(drop) {
        Err(Error::Member { index: 1, source }) if r == last => {
            ensure!(matches!(*source, Error::InvalidRank { .. }), "{source:?}")
        }
        Err(Error::PeerRefused { rank, .. }) if r != last => ensure_eq!(rank, last),
        other => return Err(format!("any_source: {other:?}")),
    }
    let tag = if r == 0 { any_tag() } else { 1 };
    let out = w.plan_exchange(&mut sends, &[(next, tag)], &mut recvs, &[(prev, 1)]);
    match out.map(drop) {
        Err(Error::Member { index: 0, source }) if r == 0 => {
            ensure!(matches!(*source, Error::InvalidTag { .. }), "{source:?}")
        }
        Err(Error::PeerRefused { rank: 0, .. }) if r != 0 => {}
        other => return Err(format!("any_tag: {other:?}")),
    }
    let mut rov = vec![acquire(&ro, &o).map_err(s)?];
    let out = if r == last {
        w.plan_exchange(&mut sends, &[(next, 1)], &mut rov, &[(prev, 1)])
    } else {
        w.plan_exchange(&mut sends, &[(next, 1)], &mut recvs, &[(prev, 1)])
    };
    match out.map(drop) {
        Err(Error::Member { index: 1, .. }) if r == last => {}
        Err(Error::PeerRefused { .. }) if r != last => {}
        other => return Err(format!("read-only receive: {other:?}")),
    }
    match w
        .plan_exchange(&mut sends, &[], &mut recvs, &[(prev, 1)])
        .map(drop)
    {
        Err(Error::ListLengthMismatch { .. }) => Ok(()),
        other => Err(format!("short `to`: {other:?}")),
    }
}

/// Rank 0 calls an unplanned fused all-reduce while the others build an exchange: an
/// error on every rank, not a hang; then (after the reset) a build works.
fn an_unplanned_collective_meets_the_build(w: &SimpleCommunicator) -> Outcome {
    let comm = w.duplicate();
    let (r, n) = (comm.rank(), comm.size());
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let o = AcquireOptions::default();
    let (a, b) = (Owned::new(vec![1f32; 10]), Owned::new(vec![0f32; 10]));
    let mut sends = vec![acquire(&a, &o).map_err(s)?];
    let mut recvs = vec![acquire(&b, &o).map_err(s)?];
    if n >= 2 {
        let out = if r == 0 {
            comm.all_reduce_tensors_in_place(&mut sends, ReduceOp::Sum)
        } else {
            comm.plan_exchange(&mut sends, &[(next, 1)], &mut recvs, &[(prev, 1)])
                .map(drop)
        };
        match out {
            Err(Error::CollectiveMismatch { .. } | Error::OutOfStep { .. }) => {}
            other => return Err(format!("expected a mismatch, got {other:?}")),
        }
        reset_out_of_step(&comm);
    }
    let mut x = comm
        .plan_exchange(&mut sends, &[(next, 1)], &mut recvs, &[(prev, 1)])
        .map_err(s)?;
    x.run().map_err(s)?;
    check(&x.recvs()[0], |_| 1.0, "after the reset")
}

/// A send member replaced on the last rank: `PlanChanged` (member 0, its data pointer)
/// there at this step and the next, `PlanMismatch` on its receiver (rank 0), whose member
/// keeps its values; a receive member replaced on rank 0: `PlanChanged` (member 1) there,
/// `PlanMismatch` on rank 0's receiver (rank 1).
fn a_changed_member_refuses_the_step(w: &SimpleCommunicator) -> Outcome {
    let (r, next, prev) = ring(w);
    let last = w.size() - 1;
    let o = AcquireOptions::default();
    for (changer, list) in [(last, 0usize), (0, 1)] {
        let (a, b, z) = (
            Owned::new(vec![r as f32 + 1.0; 10]),
            Owned::new(vec![-1f32; 10]),
            Owned::new(vec![9f32; 10]),
        );
        let mut sends = vec![acquire(&a, &o).map_err(s)?];
        let mut recvs = vec![acquire(&b, &o).map_err(s)?];
        let mut x = w
            .plan_exchange(&mut sends, &[(next, 6)], &mut recvs, &[(prev, 6)])
            .map_err(s)?;
        if r == changer {
            let z = acquire(&z, &o).map_err(s)?;
            match list {
                0 => x.sends_mut()[0] = z,
                _ => x.recvs_mut()[0] = z,
            }
        }
        let receiver = (changer + 1) % w.size();
        for k in 0..2 {
            let at = format!("changer {changer}, list {list}, step {k}");
            match x.run() {
                Err(Error::PlanChanged {
                    index,
                    field: "data pointer",
                    ..
                }) if r == changer => {
                    ensure_eq!(index, list)
                }
                Err(Error::PlanMismatch { seen }) if r == receiver && r != changer => {
                    ensure!(seen.contains("empty"), "{at}: {seen}")
                }
                Ok(()) if r != changer && r != receiver => {}
                other => return Err(format!("rank {r} {at}: got {other:?}")),
            }
        }
        if r == receiver && r != changer {
            check(&x.recvs()[0], |_| -1.0, "a refused step's receiver")?;
        }
    }
    Ok(())
}

/// Each member's deleter runs once, after the exchange and the lists are gone.
fn deleters_run_once(w: &SimpleCommunicator) -> Outcome {
    let (_, next, prev) = ring(w);
    let raws: Vec<RawTensor> = (0..4)
        .map(|m| RawTensor::new(&[m as f32; 8], (2, 32, 1)))
        .collect();
    let mut counters = Vec::new();
    let mut list = Vec::new();
    for raw in &raws {
        let (t, c) = raw.import_v1();
        list.push(t.map_err(s)?);
        counters.push(c);
    }
    {
        let (sends, recvs) = list.split_at_mut(2);
        let to = [(next, 1), (next, 2)];
        let from = [(prev, 1), (prev, 2)];
        let mut x = w.plan_exchange(sends, &to, recvs, &from).map_err(s)?;
        for k in 0..3 {
            step(&mut x, k).map_err(s)?;
        }
        ensure!(
            counters.iter().all(|c| c.get() == 0),
            "a deleter ran during the exchange"
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
    ("ring_halo_steps_are_exact", ring_halo_steps_are_exact),
    (
        "halo_columns_with_both_neighbours",
        halo_columns_with_both_neighbours,
    ),
    (
        "layouts_in_all_four_combinations",
        layouts_in_all_four_combinations,
    ),
    (
        "one_peer_and_tag_pair_in_order",
        one_peer_and_tag_pair_in_order,
    ),
    ("a_step_allocates_nothing", a_step_allocates_nothing),
    ("a_dropped_step_completes", a_dropped_step_completes),
    (
        "steps_beside_pending_collectives",
        steps_beside_pending_collectives,
    ),
    (
        "build_mismatches_are_errors_everywhere",
        build_mismatches_are_errors_everywhere,
    ),
    (
        "local_refusals_are_errors_everywhere",
        local_refusals_are_errors_everywhere,
    ),
    (
        "an_unplanned_collective_meets_the_build",
        an_unplanned_collective_meets_the_build,
    ),
    (
        "a_changed_member_refuses_the_step",
        a_changed_member_refuses_the_step,
    ),
    ("deleters_run_once", deleters_run_once),
];

/// The suite `exchanges` (see the binary's `main`).
pub fn run(w: &SimpleCommunicator, filter: &[String]) -> harness::End {
    if w.rank() == 0 {
        println!("running exchange cases at {} rank(s)", w.size());
    }
    let (passed, failed) = harness::run_cases(w, CASES.iter().copied(), filter, |case| case(w));
    harness::report(w, passed, failed);
    harness::End::Ran { passed, failed }
}
