//! One dtype of the matrix ([`Kind`]): its values, computed independently of MPI, its
//! tensors in a case's layout, the comparison of what arrived, and [`Runner`], which runs a
//! case whatever the storage type.

use std::fmt::Debug;

use dlpack_mpi::dlpack::{Owned, Tensor};
use dlpack_mpi::dtype::{AnyBits, DType, ReduceOp};
use dlpack_mpi::Error;

use super::args::Producer;
use super::context::{e, CaseContext, Res, Verdict, SKIP_MARK};
use super::exact::{Exact, Grid};
use super::matrix::{Comm, Layout, Op};
use super::producers::maker;
use super::store::Store;
#[cfg(feature = "cuda")]
use crate::launch::Dev;

/// A binary fold of two elements.
pub(super) type Fold<S> = fn(S, S) -> S;

/// A test on one element.
pub(super) type Test<S> = fn(&S) -> bool;

/// One dtype: how to make its values and, if it reduces, how to fold them.
pub(super) struct Kind<S> {
    pub(super) name: &'static str,
    pub(super) dtype: DType,
    /// Storage elements per DLPack element (lanes).
    pub(super) per_elem: usize,
    /// Rank `r`'s value at storage index `i`: what every case but a sum sends (and, at
    /// `(-1, -1)`, what a receive buffer starts as).
    pub(super) value: fn(i64, i32) -> S,
    pub(super) reduce: Option<(ReduceOp, Fold<S>)>,
    /// The inputs of a float dtype's sums, exact in any order at any rank count
    /// ([`super::exact`]); `None`: [`Kind::value`]'s are (wrapping integer sums, logical
    /// or), or the dtype does not reduce.
    pub(super) exact: Option<Exact<S>>,
    /// The saturating form of the reduction and a test for the type's bounds, to recognise
    /// [`SATURATING_SUM_BUG`]: an element whose saturating fold reaches a bound overflowed
    /// on the way, and there the library's answer depends on where it saturated.
    pub(super) saturating: Option<(Fold<S>, Test<S>)>,
}

/// Runs cases for one dtype, whatever its storage type.
pub(super) trait Runner {
    /// The dtype's name (case names' `dtype` part).
    fn name(&self) -> &'static str;
    /// The DLPack dtype.
    fn dtype(&self) -> DType;
    /// Runs `op` on tensors of `len` elements as `cx` says; this rank's verdict.
    fn run(&self, cx: &CaseContext<'_>, dc: &Comm<'_>, op: Op, len: i64) -> Verdict;
}

impl<S: AnyBits + PartialEq + Debug> Kind<S> {
    /// Values of rank `r`, `n` DLPack elements, element index offset `from`.
    pub(super) fn values(&self, cx: &CaseContext<'_>, r: i32, n: i64, from: i64) -> Vec<S> {
        self.indices(cx.layout, n, from)
            .map(|i| (self.value)(i, r))
            .collect()
    }

    /// The storage indices of `n` DLPack elements from element index `from` in `layout`.
    fn indices(&self, layout: Layout, n: i64, from: i64) -> impl Iterator<Item = i64> {
        let k = self.per_elem as i64;
        // A broadcast (stride-0) send repeats one element: every logical element is
        // element 0's value.
        let bcast = layout == Layout::Broadcast;
        (from * k..(from + n) * k).map(move |i| if bcast { i % k } else { i })
    }

    /// Rank `r`'s inputs of a reduction over `p` ranks (as [`Kind::values`], in
    /// `layout`): a float sum's are exact in any order ([`super::exact`]).
    pub(super) fn summands(&self, layout: Layout, (p, r): (i32, i32), n: i64, from: i64) -> Vec<S> {
        let indices = self.indices(layout, n, from);
        match &self.exact {
            Some(exact) => {
                let grid = Grid::new(exact.format, p);
                indices.map(|i| (exact.value)(&grid, i, r)).collect()
            }
            None => indices.map(|i| (self.value)(i, r)).collect(),
        }
    }

    /// Why a reduction over `p` ranks of `n` elements in `layout` cannot carry every rank's
    /// input exactly (`None`: it can): the reason of [`Verdict::NotCheckable`].
    pub(super) fn uncovered(&self, layout: Layout, p: i32, n: i64) -> Option<String> {
        let exact = self.exact.as_ref()?;
        let repeated = layout == Layout::Broadcast;
        Grid::new(exact.format, p).uncovered(self.name, n, self.per_elem as i64, repeated)
    }

    /// A tensor holding the logical vector `data` in the current layout (receive side).
    pub(super) fn owned(&self, cx: &CaseContext<'_>, data: Vec<S>) -> Res<Store<S>> {
        self.placed(cx, data, true)
    }

    /// The send-side tensor of `data` (a broadcast layout stores one element).
    pub(super) fn owned_send(&self, cx: &CaseContext<'_>, data: Vec<S>) -> Res<Store<S>> {
        self.placed(cx, data, false)
    }

    fn placed(&self, cx: &CaseContext<'_>, data: Vec<S>, recv: bool) -> Res<Store<S>> {
        let k = self.per_elem;
        let n = (data.len() / k) as i64;
        let (shape, strides, storage, pos) = cx.layout.place(n, recv);
        let fill = (self.value)(-1, -1);
        let mut store = vec![fill; storage * k];
        for (l, &p) in pos.iter().enumerate() {
            store[p * k..(p + 1) * k].copy_from_slice(&data[l * k..(l + 1) * k]);
        }
        let first = pos.first().copied().unwrap_or(0);
        let (dtype, dev, offset) = (self.dtype, cx.here.dev(recv), cx.here.offset);
        let at = (offset, cx.here.rank);
        match maker(cx.run.producer, dtype, (recv, dev), cx.layout, offset) {
            Producer::Numpy if offset.is_some() => {
                return Store::numpy_framed((dtype, store), (&shape, &strides, first), at)
            }
            Producer::Numpy => return Store::numpy(dtype, store, &shape, &strides, first),
            p @ (Producer::Jax | Producer::Paddle) => {
                return Store::foreign(p, dtype, store, &shape, &strides, first)
            }
            Producer::Rust | Producer::Auto => {}
        }
        let esize = dtype.size_bytes().unwrap_or(0) as u64;
        #[cfg(feature = "cuda")]
        if dev == Dev::Cuda && cx.run.real_cuda {
            if offset.is_some() {
                return Store::cuda_framed(cx.run, (dtype, store), (&shape, &strides, first), at);
            }
            return Store::cuda(cx.run, dtype, store, &shape, &strides, first as u64 * esize);
        }
        let label = dev.label(cx.run.ordinal);
        if offset.is_some() {
            return Store::framed((dtype, store), (&shape, &strides, first), at, label);
        }
        Owned::new(store)
            .with_dtype(dtype)
            .and_then(|o| o.with_layout(&shape, Some(&strides), first as u64 * esize))
            .map(|o| o.labelled(label))
            .map(Store::Rust)
            .map_err(e)
    }

    /// The logical vector of `n_storage` storage items held by `owned` (receive side).
    pub(super) fn read(
        &self,
        cx: &CaseContext<'_>,
        owned: Store<S>,
        n_storage: usize,
    ) -> Res<Vec<S>> {
        let k = self.per_elem;
        let (_, _, _, pos) = cx.layout.place((n_storage / k) as i64, true);
        let store = owned.into_vec(cx.run)?;
        Ok(pos
            .iter()
            .flat_map(|&p| store[p * k..(p + 1) * k].iter().copied())
            .collect())
    }

    pub(super) fn fold(&self, cx: &CaseContext<'_>, n: i64, p: i32) -> Option<(ReduceOp, Vec<S>)> {
        let (op, f) = self.reduce?;
        Some((op, self.fold_with(cx, f, n, p)))
    }

    /// `f` folded over the `p` ranks' [`Kind::summands`] of `n` elements, rank after rank.
    pub(super) fn fold_with(&self, cx: &CaseContext<'_>, f: Fold<S>, n: i64, p: i32) -> Vec<S> {
        let mut acc = self.summands(cx.layout, (p, 0), n, 0);
        for r in 1..p {
            for (a, b) in acc.iter_mut().zip(self.summands(cx.layout, (p, r), n, 0)) {
                *a = f(*a, b);
            }
        }
        acc
    }

    pub(super) fn compare(&self, rank: i32, what: &str, expected: &[S], got: &[S]) -> Res<()> {
        if expected.len() != got.len() {
            return Err(format!(
                "rank {rank}: {what}: expected {} values, got {}",
                expected.len(),
                got.len()
            ));
        }
        match expected.iter().zip(got).position(|(a, b)| a != b) {
            None => Ok(()),
            Some(i) => Err(format!(
                "rank {rank}: {what}: first difference at index {i}: expected {:?}, got {:?}",
                expected[i], got[i]
            )),
        }
    }

    /// Runs `f` with a send tensor of `send` and a receive tensor of `recv_len` storage
    /// elements, returning the received values.
    pub(super) fn with_pair(
        &self,
        cx: &CaseContext<'_>,
        dc: &Comm<'_>,
        send: Vec<S>,
        recv_len: usize,
        f: impl FnOnce(&dyn Tensor, &mut dyn Tensor) -> Result<(), Error>,
    ) -> Res<Vec<S>> {
        let fill = (self.value)(-1, -1);
        let src = self.owned_send(cx, send)?;
        let dst = self.owned(cx, vec![fill; recv_len])?;
        src.with_tensor(cx.run, |s| {
            dst.with_tensor(cx.run, |d| {
                let done = f(&*s, d).map_err(|err| match err {
                    // A documented limitation (per-rank blocks need contiguous tensors), not
                    // a wrong result: reported as a skip.
                    Error::StridedNotSupported { .. } => format!("{SKIP_MARK}{err}"),
                    other => e(other),
                });
                cx.note_route(dc);
                done
            })
        })?;
        let mut got = self.read(cx, dst, recv_len)?;
        if cx.inject && !got.is_empty() {
            let at = 3.min(got.len() - 1);
            got[at] = fill;
        }
        Ok(got)
    }
}
