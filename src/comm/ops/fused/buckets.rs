//! The buffers and MPI calls of the fused collectives' buckets ([`super::Fused`]): packed
//! buckets in pooled host buffers, direct buckets on a member's own memory, device buckets
//! made by the stager, the copies into and out of packed buckets, and how a fused list runs
//! as one [`Batch`] (each bucket packed, reduced or broadcast, and unpacked in turn).

use std::ffi::c_void;

use mpi::raw::AsRaw;
use mpi::Count;

use mpi::ffi::{MPI_Comm, MPI_Request};

use super::{Fused, FusedKind, Mark, Member, OnDevice};
use crate::comm::engine::call::handles;
use crate::comm::engine::call::{free_persistent, start_persistent, Batch, Form};
use crate::comm::engine::call::{Buf, Call, Reduced, REDUCE_CHUNK_UNITS};
use crate::comm::engine::progress;
use crate::comm::engine::stager::{BucketMember, StagedBucket};
use crate::error::{Error, Result};
use crate::raw;
use crate::spec::facts::Facts;
use crate::spec::kernels;
use crate::spec::scratch::Scratch;

/// The calls of `kind` on a bucket of `bytes` bytes of `element`s: `send` (a
/// reduce-scatter's send, all ranks' blocks; an all-reduce's send or `MPI_IN_PLACE`; unused
/// by a broadcast) into `recv` (the bucket; a reduce-scatter's: this rank's block).
/// Broadcasts go in chunks of at most 2^30 units (`Call::Reduce` chunks itself); an empty
/// bucket is one call with count 0 and NULL buffers.
///
/// # Errors
/// [`Error::CountTooLarge`] for a reduce-scatter block beyond `int` units; the reduction's
/// errors ([`handles`]).
pub(super) fn calls_for(
    kind: FusedKind,
    element: crate::dtype::ElementType,
    send: *const c_void,
    recv: *mut u8,
    bytes: usize,
) -> Result<Vec<Call>> {
    let unit = element.row.unit;
    let unit_bytes = unit.size_bytes().max(1);
    let units = bytes / unit_bytes;
    let unit_type = unit.datatype().as_raw();
    let (send, recv) = if units == 0 {
        let null = std::ptr::null_mut::<c_void>();
        let send = if send == raw::in_place().cast_const() {
            send
        } else {
            null.cast_const()
        };
        (send, null.cast::<u8>())
    } else {
        (send, recv)
    };
    match kind {
        FusedKind::AllReduce(op) => {
            let (datatype, op) = handles(op, element.dtype, unit_type)?;
            Ok(vec![Call::Reduce {
                buffers: Reduced {
                    send,
                    recv: recv.cast(),
                    units,
                    unit_bytes,
                    datatype,
                    op,
                },
                root: None,
            }])
        }
        FusedKind::ReduceScatter(op, _) => {
            let count = Count::try_from(units).map_err(|_| Error::CountTooLarge {
                count: units as u64,
            })?;
            let (datatype, op) = handles(op, element.dtype, unit_type)?;
            Ok(vec![Call::ReduceScatterBlock {
                send,
                recv: Buf::raw(recv.cast(), count, datatype),
                op,
            }])
        }
        FusedKind::Broadcast(root) => {
            let mut calls = Vec::new();
            let mut done = 0usize;
            loop {
                let n = (units - done).min(REDUCE_CHUNK_UNITS);
                // n ≤ 2^30 < i32::MAX.
                #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
                let count = n as Count;
                let at = if n == 0 {
                    recv
                } else {
                    recv.wrapping_add(done * unit_bytes)
                };
                calls.push(Call::Bcast {
                    buf: Buf::raw(at.cast(), count, unit_type),
                    root,
                });
                done += n;
                if done >= units {
                    break;
                }
            }
            Ok(calls)
        }
    }
}

/// A device list's bucket of `list` (`bytes` bytes), made by its stager, and the calls on
/// it (an all-reduce in place on the bucket, a broadcast of it, a reduce-scatter from the
/// stager's send buffer of every rank's blocks into it).
///
/// # Errors
/// The stager's refusals and copy errors ([`Stager::stage_bucket`]); [`calls_for`]'s.
pub(super) fn device_bucket(
    kind: FusedKind,
    members: &[Member],
    list: &[usize],
    bytes: usize,
    on: Option<&OnDevice<'_, '_>>,
) -> Result<(Box<dyn StagedBucket + 'static>, Vec<Call>)> {
    let on = on.ok_or_else(|| crate::comm::engine::checks::missing("fused device list"))?;
    let element = members[list[0]]
        .facts()
        .map(|f| f.element)
        .ok_or_else(|| crate::comm::engine::checks::missing("fused member facts"))?;
    let of: Vec<BucketMember<'_>> = list
        .iter()
        .map(|&i| BucketMember {
            index: i,
            pack: on.tensors[i].0,
            unpack: on.tensors[i].1,
            at: members[i].at,
        })
        .collect();
    // The bucket's own dtype: a list's buckets differ in dtype (a float16 bucket is staged).
    let reduce = on.reduces.then_some(element.dtype);
    let blocks = match kind {
        FusedKind::ReduceScatter(_, ranks) => usize::try_from(ranks).unwrap_or(1).max(1),
        FusedKind::AllReduce(_) | FusedKind::Broadcast(_) => 1,
    };
    let staged = on.stager.stage_bucket(&of, (bytes, blocks), reduce)?;
    let (ptr, _) = staged.buffer();
    let send = staged
        .send_buffer()
        .unwrap_or_else(|| raw::in_place().cast_const().cast());
    let calls = calls_for(kind, element, send.cast(), ptr, bytes)?;
    // SAFETY: only the lifetime changes. The bucket borrows the stager, which the
    // fused constructors hold for the `'t` of the `Operation<'t>` they return this
    // `Fused` in; the bucket is dropped with that operation (or in this call's error
    // path), so it never outlives the borrow. The member tensors it copies from and to
    // are borrowed for the same `'t`. A plan's batch (`engine::plan`) outlives the
    // operation but not the plan, which borrows the endpoint (the stager) and the lists
    // for its own `'a`, and repacks only members it compared with the build's.
    let staged: Box<dyn StagedBucket + 'static> = unsafe { std::mem::transmute(staged) };
    Ok((staged, calls))
}

/// A packed bucket's buffers and calls: `bytes` of `element`s (a reduce-scatter's: per
/// rank, and the send buffer `ranks` times that, with a receive buffer of `bytes`).
pub(super) fn bucket_buffers(
    kind: FusedKind,
    element: crate::dtype::ElementType,
    bytes: usize,
    ranks: usize,
) -> Result<(Scratch, Option<Scratch>, Vec<Call>)> {
    let start = |s: &mut Scratch| {
        if s.is_empty() {
            std::ptr::null_mut()
        } else {
            s.as_mut_ptr()
        }
    };
    match kind {
        FusedKind::ReduceScatter(..) => {
            let total = bytes.checked_mul(ranks).ok_or(Error::Overflow {
                quantity: "fused reduce-scatter bucket bytes",
                lhs: bytes as i128,
                operator: "*",
                rhs: ranks as i128,
            })?;
            let mut buf = Scratch::take(total)?;
            let mut recv = Scratch::take(bytes)?;
            let send = start(&mut buf).cast_const().cast();
            let calls = calls_for(kind, element, send, start(&mut recv), bytes)?;
            Ok((buf, Some(recv), calls))
        }
        FusedKind::AllReduce(_) | FusedKind::Broadcast(_) => {
            let mut buf = Scratch::take(bytes)?;
            let send = raw::in_place().cast_const();
            let calls = calls_for(kind, element, send, start(&mut buf), bytes)?;
            Ok((buf, None, calls))
        }
    }
}

/// The calls of a direct bucket: member `m` alone, on its own memory (its sides are
/// contiguous: [`Member::is_direct`]).
pub(super) fn direct_calls(kind: FusedKind, m: &Member) -> Result<Vec<Call>> {
    let f = m
        .facts()
        .ok_or_else(|| crate::comm::engine::checks::missing("fused member facts"))?;
    let first = |side: &Option<Facts>| side.as_ref().map(|f| f.first.cast::<u8>());
    let null = std::ptr::null_mut::<u8>();
    let (send, recv) = match kind {
        // The root's member is only read: MPI_Bcast does not write the root's buffer.
        FusedKind::Broadcast(_) => (null, first(&m.unpack).or(first(&m.pack)).unwrap_or(null)),
        _ if m.in_place => (raw::in_place().cast(), first(&m.unpack).unwrap_or(null)),
        _ => (
            first(&m.pack).unwrap_or(null),
            first(&m.unpack).unwrap_or(null),
        ),
    };
    calls_for(kind, f.element, send.cast_const().cast(), recv, m.bytes)
}

/// Copies the elements `f` describes into `out` in logical order (`out` holds exactly
/// them), with `prepared`, the member's pack copy, where it has one.
pub(super) fn copy_in(f: &Facts, prepared: Option<&kernels::Prepared>, out: &mut [u8]) {
    if out.is_empty() {
        return;
    }
    let base = f.first.cast::<u8>().cast_const();
    if let Some(p) = prepared.filter(|_| out.len() == f.packed_bytes().unwrap_or(0)) {
        // SAFETY: as below; the copy was prepared from these facts for exactly their bytes.
        return unsafe { p.run(out.as_mut_ptr(), base) };
    }
    match &f.plan {
        // SAFETY: the member's facts checked its elements in range and host-readable; `out`
        // is a buffer of ours of exactly the member's bytes.
        None => unsafe { std::ptr::copy_nonoverlapping(base, out.as_mut_ptr(), out.len()) },
        Some(plan) => {
            // SAFETY: as above; the kernels accept the layout (checked when the facts were
            // taken), so this copies every element.
            let done = unsafe { kernels::pack(base, &plan.axes, f.element.size_bytes(), out) };
            debug_assert!(done);
        }
    }
}

/// Copies `data` (logical order, exactly the elements) into the elements `f` describes,
/// with `prepared`, the member's unpack copy, where it has one.
pub(super) fn copy_out(f: &Facts, prepared: Option<&kernels::Prepared>, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    let base = f.first.cast::<u8>();
    if let Some(p) = prepared.filter(|_| data.len() == f.packed_bytes().unwrap_or(0)) {
        // SAFETY: as below; the copy was prepared from these facts for exactly their bytes.
        return unsafe { p.run(base, data.as_ptr()) };
    }
    match &f.plan {
        // SAFETY: the member's facts checked its elements in range, host-writable and free
        // of overlap (`Access::Write`/`Update`), and no written member overlaps another
        // (`check_disjoint`); `data` is a buffer of ours.
        None => unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), base, data.len()) },
        Some(plan) => {
            // SAFETY: as above.
            let done = unsafe { kernels::unpack(data, base, &plan.axes, f.element.size_bytes()) };
            debug_assert!(done);
        }
    }
}

impl Fused {
    /// Gives every direct bucket a buffer of its own, with its calls over it (a refused
    /// plan's steps, which must not touch the members; an allocation once, on the error
    /// path). A bucket that cannot have one keeps its calls: the error is the step's.
    fn own_buffers(&mut self) {
        let ranks = match self.kind {
            FusedKind::ReduceScatter(_, ranks) => usize::try_from(ranks).unwrap_or(1).max(1),
            _ => 1,
        };
        for b in 0..self.buckets.len() {
            let bucket = &self.buckets[b];
            if bucket.buf.is_some() || bucket.staged.is_some() {
                continue;
            }
            let m = &self.members[bucket.members[0]];
            let Some(element) = m.facts().map(|f| f.element) else {
                continue;
            };
            match bucket_buffers(self.kind, element, m.bytes, ranks) {
                Ok((buf, recv, calls)) => {
                    let bucket = &mut self.buckets[b];
                    (bucket.buf, bucket.recv, bucket.calls) = (Some(buf), recv, calls);
                }
                Err(e) => {
                    self.failed.get_or_insert(e);
                }
            }
        }
    }

    /// Copies bucket `b`'s members into its buffer (the members this rank packs; for a
    /// reduce-scatter, block `r` of each member into rank `r`'s segment).
    fn pack(&mut self, b: usize) {
        if self.refused {
            return; // the members are not this plan's any more
        }
        if let (Some(staged), true) = (&self.buckets[b].staged, self.planned) {
            if let Err(e) = staged.repack() {
                self.failed.get_or_insert(e);
            }
            return;
        }
        // A strided reduce-scatter member is packed whole here first (taken at the build).
        let mut whole = std::mem::take(&mut self.whole);
        let bucket = &mut self.buckets[b];
        let Some(buf) = bucket.buf.as_mut() else {
            self.whole = whole;
            return; // direct: the calls are on the member itself
        };
        let seg: usize = bucket.members.iter().map(|&i| self.members[i].bytes).sum();
        for &i in &bucket.members {
            let m = &self.members[i];
            let Some(f) = &m.pack else { continue };
            match self.kind {
                FusedKind::ReduceScatter(..) => {
                    let ranks = buf.len().checked_div(seg).unwrap_or(0);
                    let all = m.bytes * ranks;
                    let from: &[u8] = if f.plan.is_none() && all > 0 {
                        // SAFETY: a contiguous member's `all` bytes from its first element,
                        // host-readable (its facts checked them), not our buffers.
                        unsafe { std::slice::from_raw_parts(f.first.cast::<u8>(), all) }
                    } else {
                        whole.resize(all, 0);
                        copy_in(f, m.copies.0.as_ref(), &mut whole[..all]);
                        &whole[..all]
                    };
                    for r in 0..ranks {
                        let to = r * seg + m.at;
                        buf[to..to + m.bytes]
                            .copy_from_slice(&from[r * m.bytes..(r + 1) * m.bytes]);
                    }
                }
                _ => copy_in(f, m.copies.0.as_ref(), &mut buf[m.at..m.at + m.bytes]),
            }
        }
        self.whole = whole;
    }

    /// Copies bucket `b`'s buffer (a reduce-scatter's receive buffer) into its members
    /// (those this rank unpacks).
    fn unpack(&mut self, b: usize) {
        let bucket = &self.buckets[b];
        if let Some(staged) = &bucket.staged {
            if self.refused {
                return; // the members are not this plan's any more
            }
            if let Err(e) = staged.unpack() {
                self.failed.get_or_insert(e);
            }
            return;
        }
        let Some(data) = bucket.recv.as_ref().or(bucket.buf.as_ref()) else {
            return; // direct: the calls wrote the member itself
        };
        if let Some(m) = self.mark.as_ref().filter(|m| m.bucket == b) {
            if let Some(seen) = m.verify(&data[m.at..]) {
                self.seen.get_or_insert(seen);
            }
        }
        if self.refused || self.seen.is_some() {
            return; // a refused or mismatched step writes no member
        }
        for &i in &bucket.members {
            let m = &self.members[i];
            if let Some(f) = &m.unpack {
                copy_out(f, m.copies.1.as_ref(), &data[m.at..m.at + m.bytes]);
            }
        }
    }
}

impl Batch for Fused {
    /// Packs and posts every bucket in order on `comm`, pushing the requests to `requests`
    /// (bucket k+1 is packed while bucket k is on the wire).
    ///
    /// # Safety
    /// Every rank of `comm` posts the same buckets (the agreement said so); `self` stays
    /// alive and untouched until every pushed request has completed.
    unsafe fn post(&mut self, comm: MPI_Comm, requests: &mut Vec<MPI_Request>) {
        for b in 0..self.buckets.len() {
            self.pack(b);
            if let Some(reqs) = self.persistent.get_mut(b) {
                // SAFETY: the bucket's own persistent requests, inactive (every earlier
                // step completed), over its packed buffer.
                unsafe { start_persistent(reqs) };
                requests.extend_from_slice(reqs);
                self.buckets[b].posted = reqs.len();
                continue;
            }
            let before = requests.len();
            for call in &self.buckets[b].calls {
                // SAFETY: the calls are over the bucket's own buffer, alive as long as
                // `self`; the caller's contract on `comm`.
                unsafe { call.post(comm, requests) };
            }
            self.buckets[b].posted = requests.len() - before;
        }
    }

    /// After the next request (in posting order) completed: unpacks every bucket whose
    /// requests have all completed.
    fn completed_one(&mut self) {
        self.completed += 1;
        let mut done: usize = self.buckets[..self.landed].iter().map(|b| b.posted).sum();
        while self.landed < self.buckets.len() {
            done += self.buckets[self.landed].posted;
            if done > self.completed {
                break;
            }
            self.unpack(self.landed);
            self.landed += 1;
        }
    }

    /// Runs blocking on `comm`: each bucket in turn packed, reduced or broadcast by the
    /// blocking collective, and unpacked. (Posting every bucket's nonblocking collective
    /// and waiting was 1.6–2.5× slower here: Open MPI's nonblocking collectives take other
    /// algorithms than its blocking ones, and without a progress thread nothing moves
    /// between the posts anyway; `docs/PERFORMANCE.md`, "Fused collectives".) While
    /// nonblocking collectives wait for their agreements, the buckets are posted and
    /// polled instead (`progress::wait_raw`), so that this rank resolves those meanwhile.
    ///
    /// # Safety
    /// As [`Fused::post`].
    unsafe fn run(&mut self, comm: MPI_Comm, form: Form) {
        if form == Form::Polled {
            let mut requests = Vec::with_capacity(self.buckets.len());
            // SAFETY: the caller's contract; `self` outlives the waits below.
            unsafe { self.post(comm, &mut requests) };
            for r in requests {
                progress::wait_raw(&mut [r]);
                self.completed_one();
            }
            return;
        }
        for b in 0..self.buckets.len() {
            self.pack(b);
            if let Some(reqs) = self.persistent.get_mut(b) {
                // SAFETY: as in `post`; completed before the unpack.
                unsafe { start_persistent(reqs) };
                progress::wait_raw(reqs);
            } else {
                for call in &self.buckets[b].calls {
                    // SAFETY: the calls are over the bucket's own buffer (or its one
                    // member's memory), alive as long as `self`; the caller's contract.
                    unsafe { call.run(comm) };
                }
            }
            self.unpack(b);
        }
        self.landed = self.buckets.len();
    }

    /// After every bucket landed: the first error of unpacking a device bucket, if any.
    ///
    /// # Errors
    /// The stager's copy errors ([`StagedBucket::unpack`]).
    fn outcome(self: Box<Self>) -> Result<()> {
        let mut this = self;
        this.failed.take().map_or(Ok(()), Err)
    }

    fn rearm(&mut self, mark: u64, refused: bool) {
        (self.landed, self.completed, self.failed, self.seen) = (0, 0, None, None);
        if refused && !self.refused {
            self.refused = true;
            self.own_buffers();
        }
        if let Some(m) = self.mark.as_mut() {
            if let Some(buf) = self.buckets[m.bucket].buf.as_mut() {
                m.write(&mut buf[m.at..], mark, refused);
            }
        }
    }

    fn step_outcome(&mut self) -> Result<()> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        match self.seen.take() {
            Some(seen) => Err(Error::PlanMismatch { seen }),
            None => Ok(()),
        }
    }

    unsafe fn persist(&mut self, comm: MPI_Comm) -> bool {
        // Only over buffers of the plan's own: a refused step (a member changed) must not
        // find MPI still holding a member's address, and a persistent collective cannot be
        // made again on one rank alone.
        if self.buckets.iter().any(|b| b.buf.is_none()) || !self.persistent.is_empty() {
            return false;
        }
        let mut made = Vec::with_capacity(self.buckets.len());
        for bucket in &self.buckets {
            let mut reqs = Vec::with_capacity(bucket.calls.len());
            // SAFETY: the caller's contract; the calls are over the bucket's own buffers.
            let ok = bucket
                .calls
                .iter()
                .all(|c| unsafe { c.persist(comm, &mut reqs) });
            made.push(reqs);
            if !ok {
                made.iter_mut().for_each(|r| free_persistent(r));
                return false;
            }
        }
        self.persistent = made;
        true
    }

    fn requests(&self) -> usize {
        self.buckets
            .iter()
            .flat_map(|b| &b.calls)
            .map(Call::requests)
            .sum()
    }

    fn marked(&self) -> Option<&'static str> {
        self.mark.as_ref().map(Mark::words)
    }

    /// Whether any member is strided (packed by the kernels).
    fn is_packed(&self) -> bool {
        self.members
            .iter()
            .any(|m| m.facts().is_some_and(|f| !f.is_contiguous()))
    }
}

impl Drop for Fused {
    fn drop(&mut self) {
        // Inactive: a plan completes its step in flight before its batch drops.
        for reqs in &mut self.persistent {
            free_persistent(reqs);
        }
    }
}
