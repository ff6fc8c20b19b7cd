//! Nonblocking collectives (issue 22): every nonblocking collective of `TensorComm` with
//! every rank valid, with only the root refusing and with only a non-root refusing (for
//! collectives without a root: the last rank and rank 0), each also with a strided receiver
//! (a step-2 view whose gaps must stay untouched) that holds the logical row-major values
//! after `wait`; two collectives posted before either is waited on and completed in
//! reverse order; a blocking collective between a post and its wait; a post that must not
//! wait for its peers (a rank posts, then sends the message its peer waits for before
//! posting); `wait_all`, `wait_any`, `test_any` over mixed point-to-point and collective
//! requests; requests dropped uncompleted (they wait, the tensors' deleters run once); a
//! mismatch of signatures reported by every rank's `wait`.
//!
//! The suite `nonblocking` of tests/mpi (main.rs): `cargo test` runs it at 1 rank;
//! scripts/test.sh under `mpirun -n 2`, `-n 3` and `-n 4` within a timeout that fails the
//! stage if anything waits.

use crate::common::RawTensor;
use crate::harness;
use dlpack_mpi::comm::{
    test_any, wait_all, wait_any, Blocks, BroadcastBuffer, TensorComm, TensorRequest,
};
use dlpack_mpi::dlpack::{acquire, AcquireOptions, ManagedTensor, Owned, Tensor};
use dlpack_mpi::dtype::ReduceOp;
use dlpack_mpi::Error;
use mpi::request::LocalScope;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

type Outcome = Result<(), String>;

/// Elements of one rank's block.
const M: usize = 6;
/// The value the gaps of a strided receiver hold, and a receiver before it is written.
const GAP: f32 = -7.0;

/// One case of an operation: who refuses, and whether the receiver is strided.
#[derive(Clone, Copy, Debug)]
struct Case {
    refuser: Option<i32>,
    strided: bool,
}

/// What the post returned (`Err`: this rank's refusal) and, when it posted, what `wait`
/// returned.
type Got = Result<dlpack_mpi::Result<()>, Error>;

fn opts() -> AcquireOptions {
    AcquireOptions::default()
}

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

fn t<T: dlpack_mpi::dtype::AnyBits>(o: &Owned<T>) -> Result<ManagedTensor<'_>, String> {
    acquire(o, &opts()).map_err(s)
}

/// A tensor of 64-bit opaque handles (DLPack code 3): imported, refused by every operation.
fn opaque(n: usize) -> Result<ManagedTensor<'static>, String> {
    RawTensor::new(&vec![0u64; n], (3, 64, 1))
        .import_v1()
        .0
        .map_err(s)
}

/// Rank `r`'s values: `100 r + i`, exact in f32 sums of a few ranks.
fn vals(r: i32, n: usize) -> Vec<f32> {
    (0..n).map(|i| (100 * r) as f32 + i as f32).collect()
}

/// A receiver of `n` elements: contiguous, or a step-2 view over `2n` elements.
fn receiver(n: usize, strided: bool) -> Result<Owned<f32>, String> {
    if strided {
        Owned::new(vec![GAP; 2 * n])
            .with_layout(&[n as i64], Some(&[2]), 0)
            .map_err(s)
    } else {
        Ok(Owned::new(vec![GAP; n]))
    }
}

/// The logical values of a [`receiver`], after checking that a strided one's gaps are
/// untouched.
fn logical(o: &mut Owned<f32>, n: usize, strided: bool) -> Result<Vec<f32>, String> {
    let all = o.as_slice();
    if !strided {
        return Ok(all[..n].to_vec());
    }
    ensure!(
        all.iter().skip(1).step_by(2).all(|&g| g == GAP),
        "a gap of the strided receiver was written: {all:?}"
    );
    Ok(all.iter().step_by(2).copied().collect())
}

/// Checks `got` for `case`: the refusing rank's own error from the post, every other rank
/// `PeerRefused` naming it from `wait`, or success everywhere.
fn verdict(w: &SimpleCommunicator, case: Case, got: Got) -> Outcome {
    match case.refuser {
        None => match got {
            Ok(Ok(())) => Ok(()),
            other => Err(format!("expected success, got {other:?}")),
        },
        Some(r) if r == w.rank() => match got {
            Err(e) if !matches!(e, Error::PeerRefused { .. }) => Ok(()),
            other => Err(format!(
                "the refusing rank expected its own error from the post, got {other:?}"
            )),
        },
        Some(r) => match got {
            Ok(Err(Error::PeerRefused { rank, .. })) if rank == r => Ok(()),
            other => Err(format!(
                "expected PeerRefused {{ rank: {r} }} from wait, got {other:?}"
            )),
        },
    }
}

/// Posts with `post` in an rsmpi scope and waits for the request.
fn posted<'a, 's, F>(scope: &'s LocalScope<'a>, post: F) -> Got
where
    F: FnOnce(&'s LocalScope<'a>) -> dlpack_mpi::Result<TensorRequest<'a, &'s LocalScope<'a>>>,
{
    let req = post(scope)?;
    Ok(req.wait().map(drop))
}

fn sum_of_ranks(p: i32, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (0..p).map(|r| (100 * r) as f32 + i as f32).sum())
        .collect()
}

fn all_reduce(w: &SimpleCommunicator, case: Case) -> Outcome {
    let me = w.rank();
    let send = Owned::new(vals(me, M));
    let mut recv = receiver(M, case.strided)?;
    let bad = opaque(M)?;
    let got = {
        let st = t(&send)?;
        let mut rt = t(&recv)?;
        let sref: &dyn Tensor = if case.refuser == Some(me) { &bad } else { &st };
        mpi::request::scope(|scope| {
            posted(scope, |sc| {
                w.immediate_all_reduce_tensor(sc, sref, &mut rt, ReduceOp::Sum)
            })
        })
    };
    verdict(w, case, got)?;
    if case.refuser.is_none() {
        ensure_eq!(
            logical(&mut recv, M, case.strided)?,
            sum_of_ranks(w.size(), M)
        );
    }
    Ok(())
}

fn all_reduce_in_place(w: &SimpleCommunicator, case: Case) -> Outcome {
    let me = w.rank();
    let mut data = if case.strided {
        let mut v = vec![GAP; 2 * M];
        for (i, x) in vals(me, M).into_iter().enumerate() {
            v[2 * i] = x;
        }
        Owned::new(v)
            .with_layout(&[M as i64], Some(&[2]), 0)
            .map_err(s)?
    } else {
        Owned::new(vals(me, M))
    };
    let mut bad = opaque(M)?;
    let got = {
        let mut dt = t(&data)?;
        let target: &mut dyn Tensor = if case.refuser == Some(me) {
            &mut bad
        } else {
            &mut dt
        };
        mpi::request::scope(|scope| {
            posted(scope, |sc| {
                w.immediate_all_reduce_tensor_in_place(sc, target, ReduceOp::Sum)
            })
        })
    };
    verdict(w, case, got)?;
    if case.refuser.is_none() {
        ensure_eq!(
            logical(&mut data, M, case.strided)?,
            sum_of_ranks(w.size(), M)
        );
    }
    Ok(())
}

fn reduce(w: &SimpleCommunicator, case: Case, root: i32) -> Outcome {
    let me = w.rank();
    let send = Owned::new(vals(me, M));
    let mut recv = receiver(M, case.strided)?;
    let bad = opaque(M)?;
    let got = {
        let st = t(&send)?;
        let mut rt = t(&recv)?;
        let sref: &dyn Tensor = if case.refuser == Some(me) { &bad } else { &st };
        let rarg = (me == root).then_some(&mut rt as &mut dyn Tensor);
        mpi::request::scope(|scope| {
            posted(scope, |sc| {
                w.immediate_reduce_tensor(sc, sref, rarg, ReduceOp::Sum, root)
            })
        })
    };
    verdict(w, case, got)?;
    if case.refuser.is_none() && me == root {
        ensure_eq!(
            logical(&mut recv, M, case.strided)?,
            sum_of_ranks(w.size(), M)
        );
    }
    Ok(())
}

fn reduce_scatter_block(w: &SimpleCommunicator, case: Case) -> Outcome {
    let (me, p) = (w.rank(), w.size());
    let send = Owned::new(vals(me, M * p as usize));
    let mut recv = receiver(M, case.strided)?;
    let bad = opaque(M * p as usize)?;
    let got = {
        let st = t(&send)?;
        let mut rt = t(&recv)?;
        let sref: &dyn Tensor = if case.refuser == Some(me) { &bad } else { &st };
        mpi::request::scope(|scope| {
            posted(scope, |sc| {
                w.immediate_reduce_scatter_block_tensor(sc, sref, &mut rt, ReduceOp::Sum)
            })
        })
    };
    verdict(w, case, got)?;
    if case.refuser.is_none() {
        let all = sum_of_ranks(p, M * p as usize);
        let mine = &all[me as usize * M..(me as usize + 1) * M];
        ensure_eq!(logical(&mut recv, M, case.strided)?, mine.to_vec());
    }
    Ok(())
}

fn broadcast(w: &SimpleCommunicator, case: Case, root: i32) -> Outcome {
    let me = w.rank();
    let mut data = if me == root {
        Owned::new(vals(root, M))
    } else {
        receiver(M, case.strided)?
    };
    let mut bad = opaque(M)?;
    let got = {
        let mut dt = t(&data)?;
        let target: &mut dyn Tensor = if case.refuser == Some(me) {
            &mut bad
        } else {
            &mut dt
        };
        mpi::request::scope(|scope| {
            posted(scope, |sc| w.immediate_broadcast_tensor(sc, target, root))
        })
    };
    verdict(w, case, got)?;
    if case.refuser.is_none() && me != root {
        ensure_eq!(logical(&mut data, M, case.strided)?, vals(root, M));
    }
    Ok(())
}

/// `broadcast_tensor_from`: the root's tensor is `READ_ONLY`; a refusing non-root passes the
/// root's form (`BroadcastNotRoot`), a refusing root an opaque tensor.
fn broadcast_from(w: &SimpleCommunicator, case: Case, root: i32) -> Outcome {
    let me = w.rank();
    let shared = Owned::new(vals(root, M)).read_only();
    let mut recv = receiver(M, case.strided)?;
    let bad = opaque(M)?;
    let got = {
        let st = t(&shared)?;
        let mut rt = t(&recv)?;
        let buffer = match (me == root, case.refuser == Some(me)) {
            (true, false) => BroadcastBuffer::Send(&st),
            (true, true) => BroadcastBuffer::Send(&bad),
            (false, true) => BroadcastBuffer::Send(&st),
            (false, false) => BroadcastBuffer::Recv(&mut rt),
        };
        mpi::request::scope(|scope| {
            posted(scope, |sc| {
                w.immediate_broadcast_tensor_from(sc, buffer, root)
            })
        })
    };
    verdict(w, case, got)?;
    if case.refuser.is_none() && me != root {
        ensure_eq!(logical(&mut recv, M, case.strided)?, vals(root, M));
    }
    Ok(())
}

fn gather(w: &SimpleCommunicator, case: Case, root: i32, varying: bool) -> Outcome {
    let (me, p) = (w.rank(), w.size());
    let n = |r: i32| if varying { 1 + r as usize } else { M };
    let total: usize = (0..p).map(n).sum();
    let send = Owned::new(vals(me, n(me)));
    let mut recv = receiver(total, case.strided)?;
    let bad = opaque(n(me))?;
    let counts: Vec<i64> = (0..p).map(|r| n(r) as i64).collect();
    let displs: Vec<i64> = (0..p)
        .map(|r| (0..r).map(n).sum::<usize>() as i64)
        .collect();
    let got = {
        let st = t(&send)?;
        let mut rt = t(&recv)?;
        let sref: &dyn Tensor = if case.refuser == Some(me) { &bad } else { &st };
        let at_root = me == root;
        mpi::request::scope(|scope| {
            posted(scope, |sc| {
                if varying {
                    let r = at_root
                        .then(|| (&mut rt as &mut dyn Tensor, Blocks::new(&counts, &displs)));
                    w.immediate_gatherv_tensor(sc, sref, r, root)
                } else {
                    let r = at_root.then_some(&mut rt as &mut dyn Tensor);
                    w.immediate_gather_tensor(sc, sref, r, root)
                }
            })
        })
    };
    verdict(w, case, got)?;
    if case.refuser.is_none() && me == root {
        let want: Vec<f32> = (0..p).flat_map(|r| vals(r, n(r))).collect();
        ensure_eq!(logical(&mut recv, total, case.strided)?, want);
    }
    Ok(())
}

fn scatter(w: &SimpleCommunicator, case: Case, root: i32, varying: bool) -> Outcome {
    let (me, p) = (w.rank(), w.size());
    let n = |r: i32| if varying { 1 + r as usize } else { M };
    let total: usize = (0..p).map(n).sum();
    let send = Owned::new(vals(root, total));
    let mut recv = receiver(n(me), case.strided)?;
    let mut bad = opaque(n(me))?;
    let counts: Vec<i64> = (0..p).map(|r| n(r) as i64).collect();
    let displs: Vec<i64> = (0..p)
        .map(|r| (0..r).map(n).sum::<usize>() as i64)
        .collect();
    let got = {
        let st = t(&send)?;
        let mut rt = t(&recv)?;
        let target: &mut dyn Tensor = if case.refuser == Some(me) {
            &mut bad
        } else {
            &mut rt
        };
        let at_root = me == root;
        mpi::request::scope(|scope| {
            posted(scope, |sc| {
                if varying {
                    let s = at_root.then(|| (&st as &dyn Tensor, Blocks::new(&counts, &displs)));
                    w.immediate_scatterv_tensor(sc, s, target, root)
                } else {
                    let s = at_root.then_some(&st as &dyn Tensor);
                    w.immediate_scatter_tensor(sc, s, target, root)
                }
            })
        })
    };
    verdict(w, case, got)?;
    if case.refuser.is_none() {
        let start = displs[me as usize] as usize;
        let want = vals(root, total)[start..start + n(me)].to_vec();
        ensure_eq!(logical(&mut recv, n(me), case.strided)?, want);
    }
    Ok(())
}

fn all_gather(w: &SimpleCommunicator, case: Case, varying: bool) -> Outcome {
    let (me, p) = (w.rank(), w.size());
    let n = |r: i32| if varying { 1 + r as usize } else { M };
    let total: usize = (0..p).map(n).sum();
    let send = Owned::new(vals(me, n(me)));
    let mut recv = receiver(total, case.strided)?;
    let bad = opaque(n(me))?;
    let counts: Vec<i64> = (0..p).map(|r| n(r) as i64).collect();
    let displs: Vec<i64> = (0..p)
        .map(|r| (0..r).map(n).sum::<usize>() as i64)
        .collect();
    let got = {
        let st = t(&send)?;
        let mut rt = t(&recv)?;
        let sref: &dyn Tensor = if case.refuser == Some(me) { &bad } else { &st };
        mpi::request::scope(|scope| {
            posted(scope, |sc| {
                if varying {
                    let b = Blocks::new(&counts, &displs);
                    w.immediate_all_gatherv_tensor(sc, sref, &mut rt, b)
                } else {
                    w.immediate_all_gather_tensor(sc, sref, &mut rt)
                }
            })
        })
    };
    verdict(w, case, got)?;
    if case.refuser.is_none() {
        let want: Vec<f32> = (0..p).flat_map(|r| vals(r, n(r))).collect();
        ensure_eq!(logical(&mut recv, total, case.strided)?, want);
    }
    Ok(())
}

fn all_to_all(w: &SimpleCommunicator, case: Case, varying: bool) -> Outcome {
    let (me, p) = (w.rank(), w.size());
    // Block sizes: from rank a to rank b, `m(a, b)` elements (varying: 1 + a + b).
    let m = |a: i32, b: i32| if varying { 1 + (a + b) as usize } else { M };
    let send_total: usize = (0..p).map(|b| m(me, b)).sum();
    let recv_total: usize = (0..p).map(|a| m(a, me)).sum();
    let send = Owned::new(vals(me, send_total));
    let mut recv = receiver(recv_total, case.strided)?;
    let bad = opaque(send_total)?;
    let sc: Vec<i64> = (0..p).map(|b| m(me, b) as i64).collect();
    let sd: Vec<i64> = (0..p)
        .map(|b| (0..b).map(|x| m(me, x)).sum::<usize>() as i64)
        .collect();
    let rc: Vec<i64> = (0..p).map(|a| m(a, me) as i64).collect();
    let rd: Vec<i64> = (0..p)
        .map(|a| (0..a).map(|x| m(x, me)).sum::<usize>() as i64)
        .collect();
    let got = {
        let st = t(&send)?;
        let mut rt = t(&recv)?;
        let sref: &dyn Tensor = if case.refuser == Some(me) { &bad } else { &st };
        mpi::request::scope(|scope| {
            posted(scope, |scx| {
                if varying {
                    let sb = (sref, Blocks::new(&sc, &sd));
                    let rb = (&mut rt as &mut dyn Tensor, Blocks::new(&rc, &rd));
                    w.immediate_all_to_allv_tensor(scx, sb, rb)
                } else {
                    w.immediate_all_to_all_tensor(scx, sref, &mut rt)
                }
            })
        })
    };
    verdict(w, case, got)?;
    if case.refuser.is_none() {
        let want: Vec<f32> = (0..p)
            .flat_map(|a| {
                let start: usize = (0..me).map(|x| m(a, x)).sum();
                vals(a, start + m(a, me))[start..].to_vec()
            })
            .collect();
        ensure_eq!(logical(&mut recv, recv_total, case.strided)?, want);
    }
    Ok(())
}

/// A case of its own.
type Whole = fn(&SimpleCommunicator) -> Outcome;

/// An operation of the table: runs one case (`root` for rooted ones).
type Op = fn(&SimpleCommunicator, Case, i32) -> Outcome;

/// Every nonblocking collective: name, whether it has a root, the case.
const OPS: &[(&str, bool, Op)] = &[
    ("all_reduce", false, |w, c, _| all_reduce(w, c)),
    ("all_reduce_in_place", false, |w, c, _| {
        all_reduce_in_place(w, c)
    }),
    ("reduce", true, reduce),
    ("reduce_scatter_block", false, |w, c, _| {
        reduce_scatter_block(w, c)
    }),
    ("broadcast", true, broadcast),
    ("broadcast_from", true, broadcast_from),
    ("gather", true, |w, c, r| gather(w, c, r, false)),
    ("gatherv", true, |w, c, r| gather(w, c, r, true)),
    ("scatter", true, |w, c, r| scatter(w, c, r, false)),
    ("scatterv", true, |w, c, r| scatter(w, c, r, true)),
    ("all_gather", false, |w, c, _| all_gather(w, c, false)),
    ("all_gatherv", false, |w, c, _| all_gather(w, c, true)),
    ("all_to_all", false, |w, c, _| all_to_all(w, c, false)),
    ("all_to_allv", false, |w, c, _| all_to_all(w, c, true)),
];

/// Every case of every operation at this size: valid (contiguous and strided receivers),
/// only the root refusing and only a non-root refusing (without a root: the last rank and
/// rank 0); the root is the last rank.
fn table(p: i32) -> Vec<(String, Op, Case, i32)> {
    let root = p - 1;
    let mut cases = Vec::new();
    for &(name, rooted, op) in OPS {
        for strided in [false, true] {
            let layout = if strided { "strided" } else { "contiguous" };
            cases.push((
                format!("{name} {layout}: every rank valid"),
                op,
                Case {
                    refuser: None,
                    strided,
                },
                root,
            ));
        }
        let mut refusers = vec![(root, if rooted { "the root" } else { "the last rank" })];
        if p > 1 {
            refusers.push((0, if rooted { "a non-root" } else { "rank 0" }));
        }
        for (r, who) in refusers {
            cases.push((
                format!("{name}: only {who} refuses"),
                op,
                Case {
                    refuser: Some(r),
                    strided: false,
                },
                root,
            ));
        }
    }
    cases
}

/// Two all-reduces posted before either is waited on, completed in reverse order (and
/// a third tested until done), with a blocking all-reduce between the posts and the waits.
fn reverse_order_and_blocking_between(w: &SimpleCommunicator) -> Outcome {
    let (me, p) = (w.rank(), w.size());
    let a_send = Owned::new(vals(me, M));
    let b_send = Owned::new(vals(me + 1, 2 * M));
    let (mut a_recv, mut b_recv) = (Owned::new(vec![GAP; M]), receiver(2 * M, true)?);
    let (between_send, mut between_recv) =
        (Owned::new(vec![1.0f64; 3]), Owned::new(vec![0.0f64; 3]));
    {
        let (sa, sb) = (t(&a_send)?, t(&b_send)?);
        let (mut ra, mut rb) = (t(&a_recv)?, t(&b_recv)?);
        let (bs, mut br) = (t(&between_send)?, t(&between_recv)?);
        let done: dlpack_mpi::Result<()> = mpi::request::scope(|scope| {
            let a = w.immediate_all_reduce_tensor(scope, &sa, &mut ra, ReduceOp::Sum)?;
            let b = w.immediate_all_reduce_tensor(scope, &sb, &mut rb, ReduceOp::Max)?;
            w.all_reduce_tensor(&bs, &mut br, ReduceOp::Sum)?;
            b.wait()?;
            let mut a = a;
            loop {
                match a.test() {
                    Ok(done) => break done.map(drop),
                    Err(pending) => a = pending,
                }
            }
        });
        done.map_err(s)?;
    }
    ensure_eq!(a_recv.as_slice(), &sum_of_ranks(p, M)[..]);
    let want_b: Vec<f32> = vals(p, 2 * M);
    ensure_eq!(logical(&mut b_recv, 2 * M, true)?, want_b);
    ensure_eq!(between_recv.as_slice(), &[f64::from(p); 3][..]);
    Ok(())
}

/// A blocking collective between a nonblocking post and its wait, many times over, with the
/// ranks at different points (issue 34): every MPI call of a collective must have one form
/// on every rank. Whether a rank still had the broadcast's agreement pending when its
/// blocking all-reduce began was its own fact, and it chose `MPI_Allreduce` or
/// `MPI_Iallreduce` by it: Open MPI 5 hung with ranks in both. The stage's time limit fails
/// a hang.
fn blocking_between_post_and_wait_repeated(w: &SimpleCommunicator) -> Outcome {
    let (me, p) = (w.rank(), w.size());
    for round in 0..40u64 {
        let mut bcast = Owned::new(if me == 0 { vals(7, M) } else { vec![GAP; M] });
        let (send, mut recv) = (Owned::new(vals(me, 3)), Owned::new(vec![GAP; 3]));
        {
            let mut bt = t(&bcast)?;
            let (st, mut rt) = (t(&send)?, t(&recv)?);
            let done: dlpack_mpi::Result<()> = mpi::request::scope(|scope| {
                let req = w.immediate_broadcast_tensor(scope, &mut bt, 0)?;
                // The ranks reach the blocking collective at different times.
                spin(round % 4 * 50 * u64::try_from(me).unwrap_or(0));
                w.all_reduce_tensor(&st, &mut rt, ReduceOp::Sum)?;
                req.wait().map(drop)
            });
            done.map_err(s)?;
        }
        ensure_eq!(bcast.as_slice(), &vals(7, M)[..]);
        ensure_eq!(recv.as_slice(), &sum_of_ranks(p, 3)[..]);
    }
    Ok(())
}

/// Posting does not wait for the peers (after the communicator's first nonblocking
/// collective, which agrees at the call): rank 0 posts, then sends the message rank 1
/// waits for before it posts. If the post waited for rank 1, the job would hang (the
/// stage's timeout fails it).
fn post_does_not_wait_for_peers(w: &SimpleCommunicator) -> Outcome {
    let (me, p) = (w.rank(), w.size());
    if p < 2 {
        return Ok(());
    }
    let w = &w.duplicate();
    first_nonblocking(w)?;
    let send = Owned::new(vals(me, M));
    let mut recv = Owned::new(vec![GAP; M]);
    {
        let st = t(&send)?;
        let mut rt = t(&recv)?;
        let done: dlpack_mpi::Result<()> = mpi::request::scope(|scope| {
            if me == 1 {
                let (_go, _) = w.process_at_rank(0).receive::<i32>();
            }
            let req = w.immediate_all_reduce_tensor(scope, &st, &mut rt, ReduceOp::Sum)?;
            if me == 0 {
                w.process_at_rank(1).send(&1i32);
            }
            req.wait().map(drop)
        });
        done.map_err(s)?;
    }
    ensure_eq!(recv.as_slice(), &sum_of_ranks(p, M)[..]);
    Ok(())
}

/// The first nonblocking collective on `w` (an all-reduce, every rank): it agrees at the
/// call and duplicates `w`; later ones agree in the background.
fn first_nonblocking(w: &SimpleCommunicator) -> Outcome {
    let send = Owned::new(vals(w.rank(), 3));
    let mut recv = Owned::new(vec![GAP; 3]);
    {
        let (st, mut rt) = (t(&send)?, t(&recv)?);
        let done: dlpack_mpi::Result<()> = mpi::request::scope(|scope| {
            w.immediate_all_reduce_tensor(scope, &st, &mut rt, ReduceOp::Sum)?
                .wait()
                .map(drop)
        });
        done.map_err(s)?;
    }
    ensure_eq!(recv.as_slice(), &sum_of_ranks(w.size(), 3)[..]);
    Ok(())
}

/// A refusing rank's post returns at once, not when its peers wait (issue 34): the last
/// rank refuses (a `READ_ONLY` receive); the others post, then compute without any MPI call
/// until the refusing rank's post has returned (it creates a file they poll; all ranks run
/// on one host), then wait. On the old code the refusing post waited, polling, until its
/// peers progressed the agreement, which at 3 ranks and more needs their `wait`: the
/// peers gave up after 20 s and the case failed. After its post the refusing rank waits in
/// a plain `MPI_Barrier` (outside dlpack-mpi), whose progress completes its agreement. The
/// peers' `wait` returns `PeerRefused` naming the last rank and its reason, and the next
/// collective is exact.
fn refusing_post_does_not_wait_for_peers(w: &SimpleCommunicator) -> Outcome {
    let (me, p) = (w.rank(), w.size());
    if p < 2 {
        return Ok(());
    }
    let w = &w.duplicate();
    first_nonblocking(w)?;
    let refuser = p - 1;
    // A name for this job's signal, the same on every rank.
    let mut token = [std::process::id(), 0];
    w.process_at_rank(0).broadcast_into(&mut token[..]);
    let signal = std::env::temp_dir().join(format!("dlpack-mpi-refused-post-{}", token[0]));
    let send = Owned::new(vals(me, M));
    let recv = if me == refuser {
        Owned::new(vec![GAP; M]).read_only()
    } else {
        Owned::new(vec![GAP; M])
    };
    let got = {
        let st = t(&send)?;
        let mut rt = t(&recv)?;
        mpi::request::scope(|scope| {
            let req = w.immediate_all_reduce_tensor(scope, &st, &mut rt, ReduceOp::Sum);
            if me == refuser {
                std::fs::write(&signal, b"returned").map_err(|e| Error::PeerRefused {
                    rank: me,
                    reason: e.to_string(),
                })?;
            } else {
                let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
                while !signal.exists() {
                    if std::time::Instant::now() > until {
                        return Err(Error::PeerRefused {
                            rank: refuser,
                            reason: "the refusing rank's post did not return within 20 s \
                                     while this rank computed"
                                .into(),
                        });
                    }
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            req.map(|r| r.wait().map(drop))
        })
    };
    let outcome = match (me == refuser, got) {
        (true, Err(e)) if e.to_string().contains("READ_ONLY") => Ok(()),
        (false, Ok(Err(Error::PeerRefused { rank, reason })))
            if rank == refuser && reason.contains("READ_ONLY") =>
        {
            Ok(())
        }
        (_, other) => Err(format!("rank {me}: got {other:?}")),
    };
    w.barrier();
    if me == refuser {
        let _ = std::fs::remove_file(&signal);
    }
    outcome?;
    first_nonblocking(w)
}

/// A recoverable mismatch that the ranks learn at different times (attack of issue 34):
/// the last rank's all-reduce A has one element more; rank 0 waits A before it posts B,
/// the others post B before they wait A. A is `CollectiveMismatch` on every rank, B (the
/// same on every rank) exact. A first version read "the last collective ended in a
/// mismatch" at the post, which differed between the ranks here: a hang.
fn mismatch_learned_at_different_times(w: &SimpleCommunicator) -> Outcome {
    let (me, p) = (w.rank(), w.size());
    if p < 2 {
        return Ok(());
    }
    let w = &w.duplicate();
    first_nonblocking(w)?;
    let n = if me == p - 1 { M + 1 } else { M };
    let (a_send, mut a_recv) = (Owned::new(vals(me, n)), Owned::new(vec![GAP; n]));
    let (b_send, mut b_recv) = (Owned::new(vals(me, M)), Owned::new(vec![GAP; M]));
    let (a, b) = {
        let (sa, sb) = (t(&a_send)?, t(&b_send)?);
        let (mut ra, mut rb) = (t(&a_recv)?, t(&b_recv)?);
        let got: dlpack_mpi::Result<(Got, Got)> = mpi::request::scope(|scope| {
            let qa = w.immediate_all_reduce_tensor(scope, &sa, &mut ra, ReduceOp::Sum)?;
            if me == 0 {
                let a = qa.wait().map(drop);
                let qb = w.immediate_all_reduce_tensor(scope, &sb, &mut rb, ReduceOp::Sum)?;
                Ok((Ok(a), Ok(qb.wait().map(drop))))
            } else {
                let qb = w.immediate_all_reduce_tensor(scope, &sb, &mut rb, ReduceOp::Sum)?;
                let a = qa.wait().map(drop);
                Ok((Ok(a), Ok(qb.wait().map(drop))))
            }
        });
        got.map_err(s)?
    };
    ensure!(
        matches!(a, Ok(Err(Error::CollectiveMismatch { .. }))),
        "A: expected CollectiveMismatch, got {a:?}"
    );
    ensure!(matches!(b, Ok(Ok(()))), "B: got {b:?}");
    ensure_eq!(b_recv.as_slice(), &sum_of_ranks(p, M)[..]);
    ensure!(a_recv.as_slice().iter().all(|&v| v == GAP), "A was written");
    Ok(())
}

/// Two nonblocking all-reduces on two communicators, waited in one order on rank 0 and the
/// other on the rest (attack of issue 34): a `wait` polls the other communicator's
/// collectives while its data operation completes, or rank 0 would wait for a data
/// operation its peer posts only in the other `wait`.
fn waits_in_different_orders_on_two_communicators(w: &SimpleCommunicator) -> Outcome {
    let (me, p) = (w.rank(), w.size());
    let (x, y) = (w.duplicate(), w.duplicate());
    first_nonblocking(&x)?;
    first_nonblocking(&y)?;
    for _ in 0..20 {
        let (xs, ys) = (Owned::new(vals(me, M)), Owned::new(vals(me, 3)));
        let (mut xr, mut yr) = (Owned::new(vec![GAP; M]), Owned::new(vec![GAP; 3]));
        {
            let (txs, tys) = (t(&xs)?, t(&ys)?);
            let (mut txr, mut tyr) = (t(&xr)?, t(&yr)?);
            let done: dlpack_mpi::Result<()> = mpi::request::scope(|scope| {
                let qx = x.immediate_all_reduce_tensor(scope, &txs, &mut txr, ReduceOp::Sum)?;
                let qy = y.immediate_all_reduce_tensor(scope, &tys, &mut tyr, ReduceOp::Sum)?;
                if me == 0 {
                    qx.wait()?;
                    qy.wait()?;
                } else {
                    qy.wait()?;
                    qx.wait()?;
                }
                Ok(())
            });
            done.map_err(s)?;
        }
        ensure_eq!(xr.as_slice(), &sum_of_ranks(p, M)[..]);
        ensure_eq!(yr.as_slice(), &sum_of_ranks(p, 3)[..]);
    }
    Ok(())
}

/// Spins for `micros` µs (local work the ranks do for different times).
fn spin(micros: u64) {
    let until = std::time::Instant::now() + std::time::Duration::from_micros(micros);
    while std::time::Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// Tests `req` (if still pending) after each of `slices` slices of `micros` µs of work.
fn work_and_test<'a, Sc: mpi::request::Scope<'a>>(
    mut req: Option<TensorRequest<'a, Sc>>,
    slices: usize,
    micros: u64,
) -> dlpack_mpi::Result<Option<TensorRequest<'a, Sc>>> {
    for _ in 0..slices {
        spin(micros);
        if let Some(r) = req.take() {
            match r.test() {
                Ok(done) => {
                    done?;
                }
                Err(pending) => req = Some(pending),
            }
        }
    }
    Ok(req)
}

/// The first nonblocking collectives on a fresh communicator, on 12 fresh duplicates: an
/// all-reduce posted, local work of a different length on each rank with `test` calls, a
/// second all-reduce posted, more work and tests, then `wait_all` (the pattern of
/// examples/overlap.rs). The agreements are held while the shadow communicator is being
/// duplicated: Open MPI 4.1 mismatches nonblocking collectives posted beside a pending
/// `MPI_Comm_idup` of their communicator (open-mpi/ompi#2025; a hang or
/// `MPI_ERR_TRUNCATE`, about one run in five at 3 ranks before the fix).
fn first_posts_on_a_fresh_communicator(w: &SimpleCommunicator) -> Outcome {
    let (me, p) = (w.rank(), w.size());
    for round in 0..12 {
        let fresh = w.duplicate();
        let a_send = Owned::new(vals(me, 4096));
        let b_send = Owned::new(vals(me + round, 3));
        let (mut a_recv, mut b_recv) = (Owned::new(vec![GAP; 4096]), Owned::new(vec![GAP; 3]));
        {
            let (sa, sb) = (t(&a_send)?, t(&b_send)?);
            let (mut ra, mut rb) = (t(&a_recv)?, t(&b_recv)?);
            let micros = 50 * (1 + me as u64);
            let done: dlpack_mpi::Result<()> = mpi::request::scope(|scope| {
                let a = fresh.immediate_all_reduce_tensor(scope, &sa, &mut ra, ReduceOp::Sum)?;
                let a = work_and_test(Some(a), 16, micros)?;
                let b = fresh.immediate_all_reduce_tensor(scope, &sb, &mut rb, ReduceOp::Max)?;
                let b = work_and_test(Some(b), 16, micros)?;
                for r in wait_all(a.into_iter().chain(b)) {
                    r?;
                }
                Ok(())
            });
            done.map_err(s)?;
        }
        ensure_eq!(a_recv.as_slice(), &sum_of_ranks(p, 4096)[..]);
        ensure_eq!(b_recv.as_slice(), &vals(p - 1 + round, 3)[..]);
    }
    Ok(())
}

/// A nonblocking all-reduce whose completion on one rank depends on point-to-point with
/// another: the last rank tests until its all-reduce completes, then sends to the rank
/// before it, which waits for that message in a blocking `recv_tensor` before its own
/// `wait`. The receive resolves the agreement while it waits (it polls), so the last
/// rank's test completes. Also with that rank refusing (a `READ_ONLY` receiver on rank 0)
/// and with mismatched counts; on a fresh communicator each time.
fn progress_while_blocked_in_a_receive(w: &SimpleCommunicator, how: u8) -> Outcome {
    let (me, p) = (w.rank(), w.size());
    if p < 2 {
        return Ok(());
    }
    let fresh = w.duplicate();
    let n = if how == 2 && me == 0 { M + 1 } else { M };
    let send = Owned::new(vals(me, n));
    let mut recv = if how == 1 && me == 0 {
        Owned::new(vec![GAP; n]).read_only()
    } else {
        Owned::new(vec![GAP; n])
    };
    let token = Owned::new(vec![me as f32; 2]);
    let mut got = Owned::new(vec![0.0f32; 2]);
    let outcome: dlpack_mpi::Result<dlpack_mpi::Result<()>> = {
        let st = t(&send)?;
        let mut rt = t(&recv)?;
        let (tk, mut gt) = (t(&token)?, t(&got)?);
        mpi::request::scope(|scope| {
            let req = fresh.immediate_all_reduce_tensor(scope, &st, &mut rt, ReduceOp::Sum);
            let done = if me == p - 1 {
                let mut req = req?;
                let done = loop {
                    match req.test() {
                        Ok(d) => break d.map(drop),
                        Err(pending) => req = pending,
                    }
                };
                fresh.send_tensor(&tk, p - 2, 9)?;
                done
            } else if me == p - 2 {
                // The token comes whether or not this rank's post refused (rank 0 refuses
                // in `how` 1): received first, so that no message is left unmatched on
                // `fresh` when it is freed (MPICH 5 aborts in MPI_Comm_free then).
                fresh.recv_tensor(&mut gt, p - 1, 9)?;
                req?.wait().map(drop)
            } else {
                req?.wait().map(drop)
            };
            Ok(done)
        })
    };
    let done = outcome.and_then(|d| d);
    match how {
        0 => {
            done.map_err(s)?;
            ensure_eq!(recv.as_slice(), &sum_of_ranks(p, M)[..]);
        }
        1 => match (me, &done) {
            (0, Err(Error::ReadOnly)) => {}
            (r, Err(Error::PeerRefused { rank: 0, .. })) if r != 0 => {}
            other => return Err(format!("expected ReadOnly / PeerRefused, got {other:?}")),
        },
        _ => ensure!(
            matches!(done, Err(Error::CollectiveMismatch { .. })),
            "expected CollectiveMismatch, got {done:?}"
        ),
    }
    if me == p - 2 {
        ensure_eq!(got.as_slice(), &[(p - 1) as f32; 2][..]);
    }
    Ok(())
}

/// `wait_all`, `wait_any` and `test_any` over a ring exchange and two collectives.
fn wait_many(w: &SimpleCommunicator) -> Outcome {
    let (me, p) = (w.rank(), w.size());
    let (next, prev) = ((me + 1) % p, (me + p - 1) % p);
    let ring_send = Owned::new(vals(me, M));
    let mut ring_recv = receiver(M, true)?;
    let coll_send = Owned::new(vals(me, M));
    let mut coll_recv = Owned::new(vec![GAP; M]);
    let mut bcast = Owned::new(if me == 0 { vals(7, M) } else { vec![GAP; M] });
    {
        let (rs, cs) = (t(&ring_send)?, t(&coll_send)?);
        let (mut rr, mut cr, mut bt) = (t(&ring_recv)?, t(&coll_recv)?, t(&bcast)?);
        let done: dlpack_mpi::Result<()> = mpi::request::scope(|scope| {
            let mut reqs = vec![
                w.immediate_recv_tensor(scope, &mut rr, prev, 5)?,
                w.immediate_all_reduce_tensor(scope, &cs, &mut cr, ReduceOp::Sum)?,
                w.immediate_send_tensor(scope, &rs, next, 5)?,
                w.immediate_broadcast_tensor(scope, &mut bt, 0)?,
            ];
            let mut seen = 0;
            while let Some((i, r)) = test_any(&mut reqs) {
                r?;
                assert!(i < 4 - seen);
                seen += 1;
                if seen == 1 {
                    break;
                }
            }
            if let Some((_, r)) = wait_any(&mut reqs) {
                r?;
            }
            for r in wait_all(reqs) {
                r?;
            }
            Ok(())
        });
        done.map_err(s)?;
    }
    ensure_eq!(logical(&mut ring_recv, M, true)?, vals(prev, M));
    ensure_eq!(coll_recv.as_slice(), &sum_of_ranks(p, M)[..]);
    ensure_eq!(bcast.as_slice(), &vals(7, M)[..]);
    Ok(())
}

/// `is_complete` polls without consuming the request: a strided ring receive, an in-place
/// fused all-reduce over a `Vec` of guards and a short receive each complete in an
/// `is_complete` loop, with the values (or the error) `wait` would give; afterwards
/// `is_complete` keeps giving that outcome, `wait` returns it with its status, and
/// `wait_any` finds a request completed that way at once.
fn is_complete_polls_without_consuming(w: &SimpleCommunicator) -> Outcome {
    let (me, p) = (w.rank(), w.size());
    let (next, prev) = ((me + 1) % p, (me + p - 1) % p);
    let ring_send = Owned::new(vals(me, M));
    let mut ring_recv = receiver(M, true)?;
    let mut grads = [Owned::new(vals(me, M)), Owned::new(vals(me, 2 * M))];
    let short = Owned::new(vals(me, M - 1));
    let mut long = Owned::new(vec![GAP; M]);
    {
        let (rs, mut rr) = (t(&ring_send)?, t(&ring_recv)?);
        let mut guards: Vec<ManagedTensor> = grads.iter().map(t).collect::<Result<_, _>>()?;
        let (ss, mut lr) = (t(&short)?, t(&long)?);
        let done: Result<(), String> = mpi::request::scope(|scope| {
            let mut recv = w
                .immediate_recv_tensor(scope, &mut rr, prev, 6)
                .map_err(s)?;
            let send = w.immediate_send_tensor(scope, &rs, next, 6).map_err(s)?;
            let op = ReduceOp::Sum;
            let mut sum = w
                .immediate_all_reduce_tensors_in_place(scope, &mut guards, op)
                .map_err(s)?;
            // `&`, not `&&`: both are polled in every round.
            while !(recv.is_complete().map_err(s)? & sum.is_complete().map_err(s)?) {}
            send.wait().map_err(s)?;
            for r in [&mut recv, &mut sum] {
                ensure_eq!(r.is_complete().map_err(s)?, true);
            }
            ensure_eq!(recv.wait().map_err(s)?.source_rank(), prev);
            let mut list = vec![sum];
            let (index, outcome) = dlpack_mpi::comm::wait_any(&mut list).ok_or("no request")?;
            ensure_eq!(index, 0);
            outcome.map_err(s)?;
            // A message shorter than the receive: the error `wait` would give, from the
            // `is_complete` that finds it.
            let mut lreq = w
                .immediate_recv_tensor(scope, &mut lr, prev, 7)
                .map_err(s)?;
            let sreq = w.immediate_send_tensor(scope, &ss, next, 7).map_err(s)?;
            let err = loop {
                match lreq.is_complete() {
                    Ok(false) => {}
                    Ok(true) => return Err("a short message completed".into()),
                    Err(e) => break e,
                }
            };
            ensure!(matches!(err, Error::CountMismatch { .. }), "{err:?}");
            let again = lreq.is_complete();
            ensure!(
                matches!(again, Err(Error::CountMismatch { .. })),
                "{again:?}"
            );
            let waited = lreq.wait();
            ensure!(
                matches!(waited, Err(Error::CountMismatch { .. })),
                "{waited:?}"
            );
            sreq.wait().map_err(s)?;
            Ok(())
        });
        done?;
    }
    ensure_eq!(logical(&mut ring_recv, M, true)?, vals(prev, M));
    ensure_eq!(grads[0].as_slice(), &sum_of_ranks(p, M)[..]);
    ensure_eq!(grads[1].as_slice(), &sum_of_ranks(p, 2 * M)[..]);
    // A contiguous receive holds the prefix that arrived.
    ensure_eq!(long.as_slice()[..M - 1], vals(prev, M - 1)[..]);
    Ok(())
}

/// Requests dropped uncompleted wait in `Drop` and finish (the strided receiver holds the
/// values); the send tensor's deleter runs exactly once, after.
fn dropped_requests_finish_and_release_once(w: &SimpleCommunicator) -> Outcome {
    let (me, p) = (w.rank(), w.size());
    let mut recv = receiver(M, true)?;
    let (imported, deleted) = RawTensor::new(&vals(me, M), (2, 32, 1)).import_v1();
    {
        let st = imported.map_err(s)?;
        let mut rt = t(&recv)?;
        let done: dlpack_mpi::Result<()> = mpi::request::scope(|scope| {
            let req = w.immediate_all_reduce_tensor(scope, &st, &mut rt, ReduceOp::Sum)?;
            drop(req);
            Ok(())
        });
        done.map_err(s)?;
        ensure_eq!(deleted.get(), 0);
    }
    ensure_eq!(deleted.get(), 1);
    ensure_eq!(logical(&mut recv, M, true)?, sum_of_ranks(p, M));
    Ok(())
}

/// Ranks that post all-reduces of different counts: every rank's `wait` returns
/// `CollectiveMismatch`, and no data operation ran (the receivers are untouched).
fn mismatch_is_reported_by_wait(w: &SimpleCommunicator) -> Outcome {
    let (me, p) = (w.rank(), w.size());
    if p < 2 {
        return Ok(());
    }
    let n = if me == 0 { M + 1 } else { M };
    let send = Owned::new(vals(me, n));
    let mut recv = Owned::new(vec![GAP; n]);
    let got = {
        let st = t(&send)?;
        let mut rt = t(&recv)?;
        mpi::request::scope(|scope| {
            posted(scope, |sc| {
                w.immediate_all_reduce_tensor(sc, &st, &mut rt, ReduceOp::Sum)
            })
        })
    };
    match got {
        Ok(Err(Error::CollectiveMismatch { .. })) => {}
        other => {
            return Err(format!(
                "expected CollectiveMismatch from wait, got {other:?}"
            ))
        }
    }
    ensure!(
        recv.as_slice().iter().all(|&x| x == GAP),
        "a receiver was written"
    );
    Ok(())
}

pub fn run(w: &SimpleCommunicator, filter: &[String]) -> harness::End {
    if w.rank() == 0 {
        println!(
            "running nonblocking collective cases at {} rank(s)",
            w.size()
        );
    }
    let mut cases: Vec<(String, Box<dyn Fn() -> Outcome + '_>)> = table(w.size())
        .into_iter()
        .map(|(name, op, case, root)| {
            (
                name,
                Box::new(move || op(w, case, root)) as Box<dyn Fn() -> Outcome>,
            )
        })
        .collect();
    let extra: [(&str, Whole); 14] = [
        (
            "two posted, completed in reverse order, a blocking collective between",
            reverse_order_and_blocking_between,
        ),
        (
            "a post does not wait for its peers",
            post_does_not_wait_for_peers,
        ),
        (
            "a refusing rank's post does not wait for its peers",
            refusing_post_does_not_wait_for_peers,
        ),
        (
            "a mismatch learned at different times, then a matching collective",
            mismatch_learned_at_different_times,
        ),
        (
            "waits in different orders on two communicators",
            waits_in_different_orders_on_two_communicators,
        ),
        (
            "first posts on a fresh communicator, skewed",
            first_posts_on_a_fresh_communicator,
        ),
        ("progress while blocked in a receive", |w| {
            progress_while_blocked_in_a_receive(w, 0)
        }),
        (
            "progress while blocked in a receive, one rank refusing",
            |w| progress_while_blocked_in_a_receive(w, 1),
        ),
        (
            "progress while blocked in a receive, counts mismatched",
            |w| progress_while_blocked_in_a_receive(w, 2),
        ),
        (
            "wait_all, wait_any, test_any over mixed requests",
            wait_many,
        ),
        (
            "is_complete polls without consuming",
            is_complete_polls_without_consuming,
        ),
        (
            "a blocking collective between post and wait, repeated",
            blocking_between_post_and_wait_repeated,
        ),
        (
            "dropped requests finish, deleters once",
            dropped_requests_finish_and_release_once,
        ),
        (
            "a signature mismatch is every rank's wait error",
            mismatch_is_reported_by_wait,
        ),
    ];
    for (name, f) in extra {
        cases.push((name.to_string(), Box::new(move || f(w))));
    }
    let (passed, failed) =
        harness::run_cases(w, cases.iter().map(|(n, c)| (n.clone(), c)), filter, |c| {
            c()
        });
    harness::report(w, passed, failed);
    harness::End::Ran { passed, failed }
}
