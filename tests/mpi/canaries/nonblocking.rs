//! Canaries around the nonblocking collectives (issue 22): the same guard bytes, dtypes and
//! layouts as their blocking forms, posted in an rsmpi scope and completed by `wait` (the
//! receive side is unpacked there) or by dropping the request.

use super::*;
use dlpack_mpi::dlpack::Tensor;

/// Posts with `post` in a scope and completes the request with `wait`, or by dropping it
/// when `drop_it`.
macro_rules! posted {
    ($drop_it:expr, |$scope:ident| $post:expr) => {{
        let done: dlpack_mpi::Result<()> = mpi::request::scope(|$scope| {
            let req = $post?;
            if $drop_it {
                drop(req);
                Ok(())
            } else {
                req.wait().map(drop)
            }
        });
        call!(done);
    }};
}

pub(super) fn all_reduce(w: &SimpleCommunicator, dt: Dt, kind: Kind, drop_it: bool) -> Outcome {
    let n = kind.block();
    let me = w.rank();
    let mut s = Canary::new(dt, kind, n, |i| value(me, i));
    let mut r = Canary::new(dt, kind, n, |_| STALE);
    {
        let st = s.tensor(FLAG_READ_ONLY);
        let mut rt = r.tensor(0);
        posted!(drop_it, |scope| w.immediate_all_reduce_tensor(
            scope,
            &st,
            &mut rt,
            ReduceOp::Sum
        ));
    }
    s.untouched()?;
    r.received(|i| sum_over_ranks(w, i))
}

pub(super) fn all_reduce_in_place(w: &SimpleCommunicator, dt: Dt, kind: Kind) -> Outcome {
    let n = kind.block();
    let me = w.rank();
    let mut c = Canary::new(dt, kind, n, |i| value(me, i));
    {
        let mut t = c.tensor(0);
        posted!(false, |scope| w.immediate_all_reduce_tensor_in_place(
            scope,
            &mut t,
            ReduceOp::Sum
        ));
    }
    c.received(|i| sum_over_ranks(w, i))
}

pub(super) fn broadcast(w: &SimpleCommunicator, dt: Dt, kind: Kind) -> Outcome {
    let n = kind.block();
    let root = w.size() - 1;
    let me = w.rank();
    let mut c = Canary::new(
        dt,
        kind,
        n,
        |i| if me == root { value(root, i) } else { STALE },
    );
    {
        let flags = if me == root { FLAG_READ_ONLY } else { 0 };
        let mut t = c.tensor(flags);
        posted!(false, |scope| w
            .immediate_broadcast_tensor(scope, &mut t, root));
    }
    if me == root {
        c.untouched()
    } else {
        c.received(|i| value(root, i))
    }
}

pub(super) fn gatherv(w: &SimpleCommunicator, kind: Kind) -> Outcome {
    let (me, p) = (w.rank(), w.size() as usize);
    let b = kind.block();
    let (counts, displs, total) = gapped(p, b);
    let mut s = Canary::new(I32, kind, counts[me as usize] as usize, |i| value(me, i));
    let mut r = Canary::new(I32, kind, total, |_| STALE);
    {
        let st = s.tensor(FLAG_READ_ONLY);
        let mut rt = r.tensor(0);
        let at_root =
            (me == 0).then(|| (&mut rt as &mut dyn Tensor, Blocks::new(&counts, &displs)));
        posted!(false, |scope| w
            .immediate_gatherv_tensor(scope, &st, at_root, 0));
    }
    s.untouched()?;
    if me == 0 {
        r.received(|i| match in_block(&counts, &displs, i) {
            Some((j, k)) => value(j as i32, k),
            None => STALE,
        })
    } else {
        r.untouched_bytes()
    }
}

pub(super) fn all_gather(w: &SimpleCommunicator, kind: Kind) -> Outcome {
    let (me, p) = (w.rank(), w.size() as usize);
    let b = kind.block();
    let mut s = Canary::new(I32, kind, b, |i| value(me, i));
    let mut r = Canary::new(I32, kind, b * p, |_| STALE);
    {
        let st = s.tensor(FLAG_READ_ONLY);
        let mut rt = r.tensor(0);
        posted!(true, |scope| w
            .immediate_all_gather_tensor(scope, &st, &mut rt));
    }
    s.untouched()?;
    r.received(|i| value((i / b.max(1)) as i32, i % b.max(1)))
}

/// The nonblocking canary cases of one layout.
pub(super) fn cases(kind: Kind) -> Vec<(String, Case)> {
    let mut v: Vec<(String, Case)> = Vec::new();
    for dt in [I32, F64] {
        v.push((
            format!("nonblocking all_reduce {dt:?} {kind:?}"),
            Box::new(move |w| all_reduce(w, dt, kind, false)),
        ));
        v.push((
            format!("nonblocking all_reduce_in_place {dt:?} {kind:?}"),
            Box::new(move |w| all_reduce_in_place(w, dt, kind)),
        ));
    }
    v.push((
        format!("nonblocking all_reduce dropped I32 {kind:?}"),
        Box::new(move |w| all_reduce(w, I32, kind, true)),
    ));
    for dt in [U8, F64] {
        v.push((
            format!("nonblocking broadcast {dt:?} {kind:?}"),
            Box::new(move |w| broadcast(w, dt, kind)),
        ));
    }
    v.push((
        format!("nonblocking gatherv {kind:?}"),
        Box::new(move |w| gatherv(w, kind)),
    ));
    v.push((
        format!("nonblocking all_gather dropped {kind:?}"),
        Box::new(move |w| all_gather(w, kind)),
    ));
    v
}
