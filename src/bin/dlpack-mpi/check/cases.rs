//! The case bodies, one per [`Op`]: each makes its tensors, runs the operation through
//! `DeviceComm` (or rsmpi's nonblocking calls for `isend-irecv`), and compares what arrived
//! with the values [`Kind`] computes independently of MPI. A nonblocking collective
//! (`iallreduce`, …) runs its blocking collective's body with [`Call::Nonblocking`]: the
//! same tensors and expected values, the operation posted in an rsmpi scope and completed
//! there ([`super::nonblocking`]). The fused collectives over lists of tensors have their
//! case in [`super::fused`], their plans in [`super::plans`].

use std::fmt::Debug;

use dlpack_mpi::comm::{Blocks, TensorComm};
use dlpack_mpi::dlpack::Tensor;
use dlpack_mpi::dtype::{AnyBits, DType, ReduceOp};
use dlpack_mpi::spec::{RecvSpec, SendSpec};
use dlpack_mpi::Error;
use mpi::traits::*;

use super::context::{e, CaseContext, Res, Verdict, SKIP_MARK};
use super::kind::{Kind, Runner};
use super::matrix::{Comm, Op};
use super::nonblocking::{Call, Completion};

impl<S: AnyBits + PartialEq + Debug> Runner for Kind<S> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn dtype(&self) -> DType {
        self.dtype
    }

    fn run(&self, cx: &CaseContext<'_>, dc: &Comm<'_>, op: Op, len: i64) -> Verdict {
        let w = dc.comm();
        let (op, call) = match op.posts() {
            Some(blocking) => (blocking, Call::Nonblocking(Completion::of(w.rank(), len))),
            None => (op, Call::Blocking),
        };
        let at = At {
            kind: self,
            cx,
            dc,
            call,
            r: w.rank(),
            p: w.size(),
            n: len,
            nk: len as usize * self.per_elem,
        };
        match at.case(op) {
            Ok(v) => v,
            Err(msg) => match msg.strip_prefix(SKIP_MARK) {
                Some(why) => Verdict::Skip(why.to_string()),
                None => Verdict::Fail(msg),
            },
        }
    }
}

/// One case in progress: the dtype, the context, the communicator, how the collective is
/// called, this rank `r` of `p`, and the length: `n` DLPack elements, `nk` storage
/// elements.
struct At<'a, S> {
    kind: &'a Kind<S>,
    cx: &'a CaseContext<'a>,
    dc: &'a Comm<'a>,
    call: Call,
    r: i32,
    p: i32,
    n: i64,
    nk: usize,
}

/// The per-rank blocks of the v-variants: rank `i` has `(i + n) mod (n + 1)` elements, so
/// that the counts differ and one is zero.
struct VBlocks {
    counts: Vec<i64>,
    displs: Vec<i64>,
    total: i64,
}

impl VBlocks {
    fn new(p: i32, n: i64) -> VBlocks {
        let counts: Vec<i64> = (0..i64::from(p)).map(|i| (i + n) % (n + 1)).collect();
        let displs = crate::common::displacements(&counts);
        let total = counts.iter().sum();
        VBlocks {
            counts,
            displs,
            total,
        }
    }
}

impl<S: AnyBits + PartialEq + Debug> At<'_, S> {
    /// Runs the case of `op` (a blocking operation; [`At::call`] says whether its
    /// nonblocking form runs).
    fn case(&self, op: Op) -> Res<Verdict> {
        match op {
            Op::SendRecv => self.send_recv(),
            Op::Sendrecv => self.sendrecv(),
            Op::IsendIrecv => self.isend_irecv(),
            Op::Bcast => self.bcast(),
            Op::Reduce | Op::Allreduce | Op::AllreduceInplace | Op::ReduceScatterBlock => {
                match self.kind.reduce {
                    // MPI-4.1 §6.9.2: the predefined operations are defined on the
                    // predefined datatypes; a transfer-only dtype travels as same-size
                    // units (src/dtype.rs) that MPI cannot sum.
                    None => Ok(Verdict::NotApplicable(format!(
                        "{} is transfer-only: MPI has no reduction for it",
                        self.kind.name
                    ))),
                    Some((rop, _)) => self.reduction(op, rop),
                }
            }
            Op::Gather => self.gather(),
            Op::Gatherv => self.gatherv(),
            Op::Scatter => self.scatter(),
            Op::Scatterv => self.scatterv(),
            Op::Allgather => self.allgather(),
            Op::Allgatherv => self.allgatherv(),
            Op::Alltoall => self.alltoall(),
            Op::Alltoallv => self.alltoallv(),
            Op::FusedAllreduce
            | Op::FusedAllreduceInto
            | Op::FusedBcast
            | Op::FusedReduceScatter => {
                super::fused::case((self.kind, self.cx, self.dc), (op, self.call), self.n)
            }
            Op::PlanAllreduce | Op::PlanAllreduceMax | Op::PlanBcast => {
                super::plans::case((self.kind, self.cx, self.dc), op, self.n)
            }
            // The nonblocking collectives arrive here as their blocking ones (`Runner::run`).
            nonblocking => Err(format!("{} has no case body", nonblocking.name())),
        }
    }

    /// Rank `r`'s values: `n` DLPack elements from element index `from`.
    fn values(&self, r: i32, n: i64, from: i64) -> Vec<S> {
        self.kind.values(self.cx, r, n, from)
    }

    /// Rank `r`'s inputs of a reduction over every rank: `n` DLPack elements.
    fn summands(&self, r: i32, n: i64) -> Vec<S> {
        self.kind.summands(self.cx.layout, (self.p, r), n, 0)
    }

    /// Every rank's `n` values from `from(i)`, concatenated in rank order.
    fn all_ranks(&self, n: impl Fn(i32) -> i64, from: impl Fn(i32) -> i64) -> Vec<S> {
        (0..self.p)
            .flat_map(|i| self.values(i, n(i), from(i)))
            .collect()
    }

    fn compare(&self, what: &str, expected: &[S], got: &[S]) -> Res<Verdict> {
        self.kind.compare(self.r, what, expected, got)?;
        Ok(Verdict::Pass)
    }

    /// [`Kind::with_pair`] in this case's context.
    fn pair(
        &self,
        send: Vec<S>,
        recv_len: usize,
        f: impl FnOnce(&dyn Tensor, &mut dyn Tensor) -> Result<(), Error>,
    ) -> Res<Vec<S>> {
        self.kind.with_pair(self.cx, self.dc, send, recv_len, f)
    }

    /// Runs `f` on one tensor holding `init`, sent and received in place; what it holds after.
    fn in_place(
        &self,
        init: Vec<S>,
        f: impl FnOnce(&mut dyn Tensor) -> Result<(), Error>,
    ) -> Res<Vec<S>> {
        let buf = self.kind.owned(self.cx, init)?;
        buf.with_tensor(self.cx.run, |t| {
            let done = f(t).map_err(e);
            self.cx.note_route(self.dc);
            done
        })?;
        self.kind.read(self.cx, buf, self.nk)
    }

    /// This rank's values, received from the previous rank: what the point-to-point cases
    /// compare.
    fn got_from_previous(&self, got: &[S]) -> Res<Verdict> {
        let prev = (self.r + self.p - 1) % self.p;
        self.compare("from previous rank", &self.values(prev, self.n, 0), got)
    }

    fn send_recv(&self) -> Res<Verdict> {
        let (r, p, dc) = (self.r, self.p, self.dc);
        if p < 2 {
            // A blocking send to itself with no receive posted is unsafe (MPI-4.1 §3.5).
            return Ok(Verdict::NotApplicable("needs 2 ranks".into()));
        }
        let (next, prev) = ((r + 1) % p, (r + p - 1) % p);
        let got = self.pair(self.values(r, self.n, 0), self.nk, |s, d| {
            // Two calls: the route of the first counts too (a send and a receive tensor on
            // different memories, `--device SEND:RECV`).
            if r % 2 == 0 {
                dc.send_tensor(s, next, 11)?;
                self.cx.note_route(dc);
                dc.recv_tensor(d, prev, 11).map(drop)
            } else {
                dc.recv_tensor(d, prev, 11)?;
                self.cx.note_route(dc);
                dc.send_tensor(s, next, 11)
            }
        })?;
        self.got_from_previous(&got)
    }

    fn sendrecv(&self) -> Res<Verdict> {
        let (r, p, dc) = (self.r, self.p, self.dc);
        let (next, prev) = ((r + 1) % p, (r + p - 1) % p);
        let got = self.pair(self.values(r, self.n, 0), self.nk, |s, d| {
            dc.sendrecv_tensor(s, next, 12, d, prev, 12).map(drop)
        })?;
        self.got_from_previous(&got)
    }

    fn isend_irecv(&self) -> Res<Verdict> {
        let (r, p, w) = (self.r, self.p, self.dc.comm());
        if self.cx.here.device_case {
            // Device memory on some rank: the tensor forms on the DeviceComm on every rank
            // (the requests own the staged copies; a receive copies back to the device at
            // wait).
            let (next, prev) = ((r + 1) % p, (r + p - 1) % p);
            let dc = self.dc;
            let got = self.pair(self.values(r, self.n, 0), self.nk, |s, d| {
                mpi::request::scope(|scope| -> Result<(), Error> {
                    let rr = dc.immediate_recv_tensor(scope, d, prev, 13)?;
                    self.cx.note_route(dc);
                    let sr = dc.immediate_send_tensor(scope, s, next, 13)?;
                    sr.wait()?;
                    rr.wait()?;
                    Ok(())
                })
            })?;
            return self.got_from_previous(&got);
        }
        let (next, prev) = ((r + 1) % p, (r + p - 1) % p);
        let got = self.pair(self.values(r, self.n, 0), self.nk, |s, d| {
            let send = SendSpec::new(s)?;
            let mut recv = RecvSpec::new(d)?;
            mpi::request::scope(|scope| -> Result<(), Error> {
                let rr = w.immediate_recv_spec(scope, &mut recv, prev, 13)?;
                let sr = w.immediate_send_spec(scope, &send, next, 13)?;
                sr.wait();
                rr.wait();
                Ok(())
            })
        })?;
        self.got_from_previous(&got)
    }

    fn bcast(&self) -> Res<Verdict> {
        let (r, n, root) = (self.r, self.n, self.p - 1);
        let init = if r == root {
            self.values(root, n, 0)
        } else {
            vec![(self.kind.value)(-1, -1); self.nk]
        };
        let got = self.in_place(init, |t| match self.call {
            Call::Blocking => self.dc.broadcast_tensor(t, root),
            Call::Nonblocking(c) => c.post(|sc| self.dc.immediate_broadcast_tensor(sc, t, root)),
        })?;
        self.compare("broadcast", &self.values(root, n, 0), &got)
    }

    fn gather(&self) -> Res<Verdict> {
        let (r, n, p) = (self.r, self.n, self.p);
        let got = self.pair(self.values(r, n, 0), p as usize * self.nk, |s, d| {
            let recv: Option<&mut dyn Tensor> = if r == 0 { Some(d) } else { None };
            match self.call {
                Call::Blocking => self.dc.gather_tensor(s, recv, 0),
                Call::Nonblocking(c) => {
                    c.post(|sc| self.dc.immediate_gather_tensor(sc, s, recv, 0))
                }
            }
        })?;
        if r != 0 {
            return Ok(Verdict::Pass);
        }
        self.compare("gathered", &self.all_ranks(|_| n, |_| 0), &got)
    }

    fn gatherv(&self) -> Res<Verdict> {
        let r = self.r;
        let v = VBlocks::new(self.p, self.n);
        let mine = v.counts[r as usize];
        let k = self.kind.per_elem;
        let got = self.pair(self.values(r, mine, 0), v.total as usize * k, |s, d| {
            // Annotated: the tensor's trait object may then live shorter than `d`'s.
            let recv: Option<(&mut dyn Tensor, Blocks<'_>)> = if r == 0 {
                Some((d, Blocks::new(&v.counts, &v.displs)))
            } else {
                None
            };
            match self.call {
                Call::Blocking => self.dc.gatherv_tensor(s, recv, 0),
                Call::Nonblocking(c) => {
                    c.post(|sc| self.dc.immediate_gatherv_tensor(sc, s, recv, 0))
                }
            }
        })?;
        if r != 0 {
            return Ok(Verdict::Pass);
        }
        let expect = self.all_ranks(|i| v.counts[i as usize], |_| 0);
        self.compare("gathered", &expect, &got)
    }

    fn scatter(&self) -> Res<Verdict> {
        let (r, n, pn) = (self.r, self.n, i64::from(self.p) * self.n);
        let got = self.pair(self.values(0, pn, 0), self.nk, |s, d| {
            let send: Option<&dyn Tensor> = if r == 0 { Some(s) } else { None };
            match self.call {
                Call::Blocking => self.dc.scatter_tensor(send, d, 0),
                Call::Nonblocking(c) => {
                    c.post(|sc| self.dc.immediate_scatter_tensor(sc, send, d, 0))
                }
            }
        })?;
        self.compare("scattered", &self.values(0, n, i64::from(r) * n), &got)
    }

    fn scatterv(&self) -> Res<Verdict> {
        let r = self.r;
        let v = VBlocks::new(self.p, self.n);
        let mine = v.counts[r as usize];
        let k = self.kind.per_elem;
        let got = self.pair(self.values(0, v.total, 0), mine as usize * k, |s, d| {
            let send = if r == 0 {
                Some((s, Blocks::new(&v.counts, &v.displs)))
            } else {
                None
            };
            match self.call {
                Call::Blocking => self.dc.scatterv_tensor(send, d, 0),
                Call::Nonblocking(c) => {
                    c.post(|sc| self.dc.immediate_scatterv_tensor(sc, send, d, 0))
                }
            }
        })?;
        let expect = self.values(0, mine, v.displs[r as usize]);
        self.compare("scattered", &expect, &got)
    }

    fn allgather(&self) -> Res<Verdict> {
        let (r, n, p) = (self.r, self.n, self.p);
        let got = self.pair(
            self.values(r, n, 0),
            p as usize * self.nk,
            |s, d| match self.call {
                Call::Blocking => self.dc.all_gather_tensor(s, d),
                Call::Nonblocking(c) => c.post(|sc| self.dc.immediate_all_gather_tensor(sc, s, d)),
            },
        )?;
        self.compare("gathered", &self.all_ranks(|_| n, |_| 0), &got)
    }

    fn allgatherv(&self) -> Res<Verdict> {
        let r = self.r;
        let v = VBlocks::new(self.p, self.n);
        let mine = v.counts[r as usize];
        let k = self.kind.per_elem;
        let got = self.pair(self.values(r, mine, 0), v.total as usize * k, |s, d| {
            let blocks = Blocks::new(&v.counts, &v.displs);
            match self.call {
                Call::Blocking => self.dc.all_gatherv_tensor(s, d, blocks),
                Call::Nonblocking(c) => {
                    c.post(|sc| self.dc.immediate_all_gatherv_tensor(sc, s, d, blocks))
                }
            }
        })?;
        let expect = self.all_ranks(|i| v.counts[i as usize], |_| 0);
        self.compare("gathered", &expect, &got)
    }

    fn alltoall(&self) -> Res<Verdict> {
        // Rank r's block j holds values(r, n, j n).
        let (r, n, p) = (self.r, self.n, self.p);
        let pn = i64::from(p) * n;
        let got = self.pair(
            self.values(r, pn, 0),
            p as usize * self.nk,
            |s, d| match self.call {
                Call::Blocking => self.dc.all_to_all_tensor(s, d),
                Call::Nonblocking(c) => c.post(|sc| self.dc.immediate_all_to_all_tensor(sc, s, d)),
            },
        )?;
        let expect = self.all_ranks(|_| n, |_| i64::from(r) * n);
        self.compare("exchanged", &expect, &got)
    }

    fn alltoallv(&self) -> Res<Verdict> {
        // Rank i sends counts[j] elements to rank j, taken from values(i, ·, displs[j]).
        let (r, p) = (self.r, self.p);
        let v = VBlocks::new(p, self.n);
        let mine = v.counts[r as usize];
        let recv_counts = vec![mine; p as usize];
        let recv_displs: Vec<i64> = (0..i64::from(p)).map(|i| i * mine).collect();
        let recv_len = (mine * i64::from(p)) as usize * self.kind.per_elem;
        let got = self.pair(self.values(r, v.total, 0), recv_len, |s, d| {
            let send = (s, Blocks::new(&v.counts, &v.displs));
            let recv: (&mut dyn Tensor, _) = (d, Blocks::new(&recv_counts, &recv_displs));
            match self.call {
                Call::Blocking => self.dc.all_to_allv_tensor(send.0, send.1, recv.0, recv.1),
                Call::Nonblocking(c) => {
                    c.post(|sc| self.dc.immediate_all_to_allv_tensor(sc, send, recv))
                }
            }
        })?;
        let expect = self.all_ranks(|_| mine, |_| v.displs[r as usize]);
        self.compare("exchanged", &expect, &got)
    }

    /// The reductions (`reduce`, `allreduce`, `allreduce-inplace`, `reduce-scatter-block`)
    /// with the dtype's MPI reduction `rop`.
    fn reduction(&self, op: Op, rop: ReduceOp) -> Res<Verdict> {
        let (r, n, p, nk, dc) = (self.r, self.n, self.p, self.nk, self.dc);
        let folded = |len| self.kind.fold(self.cx, len, p).map_or(vec![], |(_, v)| v);
        match op {
            Op::Reduce => {
                let expect = folded(n);
                let got = self.pair(self.summands(r, n), nk, |s, d| {
                    let recv: Option<&mut dyn Tensor> = if r == 0 { Some(d) } else { None };
                    match self.call {
                        Call::Blocking => dc.reduce_tensor(s, recv, rop, 0),
                        Call::Nonblocking(c) => {
                            c.post(|sc| dc.immediate_reduce_tensor(sc, s, recv, rop, 0))
                        }
                    }
                })?;
                if r != 0 {
                    return Ok(Verdict::Pass);
                }
                self.compare_reduced(&expect, &got, n, 0..nk)
            }
            Op::Allreduce => {
                let expect = folded(n);
                let got = self.pair(self.summands(r, n), nk, |s, d| match self.call {
                    Call::Blocking => dc.all_reduce_tensor(s, d, rop),
                    Call::Nonblocking(c) => {
                        c.post(|sc| dc.immediate_all_reduce_tensor(sc, s, d, rop))
                    }
                })?;
                self.compare_reduced(&expect, &got, n, 0..nk)
            }
            Op::AllreduceInplace => {
                let expect = folded(n);
                let got = self.in_place(self.summands(r, n), |t| match self.call {
                    Call::Blocking => dc.all_reduce_tensor_in_place(t, rop),
                    Call::Nonblocking(c) => {
                        c.post(|sc| dc.immediate_all_reduce_tensor_in_place(sc, t, rop))
                    }
                })?;
                self.compare_reduced(&expect, &got, n, 0..nk)
            }
            _ => {
                let pn = i64::from(p) * n;
                let full = folded(pn);
                let got = self.pair(self.summands(r, pn), nk, |s, d| match self.call {
                    Call::Blocking => dc.reduce_scatter_block_tensor(s, d, rop),
                    Call::Nonblocking(c) => {
                        c.post(|sc| dc.immediate_reduce_scatter_block_tensor(sc, s, d, rop))
                    }
                })?;
                let part = r as usize * nk..(r as usize + 1) * nk;
                self.compare_reduced(&full[part.clone()], &got, pn, part)
            }
        }
    }

    /// Compares a reduction result; a mismatch that equals the saturating fold is the known
    /// Open MPI bug, reported as such. `part` selects this rank's slice of the full result
    /// (of `full_len` elements). A match is not checkable when the exact inputs of the
    /// full result cannot carry every rank's data ([`Kind::uncovered`]).
    fn compare_reduced(
        &self,
        expect: &[S],
        got: &[S],
        full_len: i64,
        part: std::ops::Range<usize>,
    ) -> Res<Verdict> {
        let what = self.kind.reduce.map_or("reduced", |(op, _)| op.name());
        let Err(msg) = self.kind.compare(self.r, what, expect, got) else {
            let unchecked = self.kind.uncovered(self.cx.layout, self.p, full_len);
            return Ok(unchecked.map_or(Verdict::Pass, Verdict::NotCheckable));
        };
        if let Some((sat, at_bound)) = self.kind.saturating {
            // A vectorized kernel saturates the SIMD-sized part and wraps the scalar tail,
            // and a collective adds partial sums in its own order, so a wrong element is
            // explained only by its sum having overflowed somewhere.
            let saturated = self.kind.fold_with(self.cx, sat, full_len, self.p);
            let explained = saturated.get(part).is_some_and(|sat| {
                sat.len() == got.len()
                    && got
                        .iter()
                        .zip(expect)
                        .zip(sat)
                        .all(|((g, e), s)| g == e || at_bound(s))
            });
            if explained {
                return Ok(Verdict::KnownBug(msg));
            }
        }
        Err(msg)
    }
}
