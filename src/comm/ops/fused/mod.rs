//! Many tensors as few messages (issue 25): the fused all-reduce (also in place) and
//! broadcast over a list of tensors, blocking and nonblocking ([`crate::comm::engine::mode`]).
//!
//! **Buckets.** The members are grouped by dtype, in the order each dtype first appears;
//! each group's members, in list order, fill buckets of at most
//! [`crate::settings::first_bucket_bytes`] (the group's first bucket, 1 MiB by default) or
//! [`crate::settings::bucket_bytes`] (the others, 25 MiB: PyTorch DDP's sizes); a member
//! larger than that has a bucket of its own. A bucket is one pooled buffer
//! ([`crate::spec::scratch`]) holding its members' elements in list order, each in logical
//! row-major order (the pack kernels copy a strided member; a contiguous one is one
//! `memcpy`), and one collective on it: `MPI_Allreduce` with `MPI_IN_PLACE` (in chunks of
//! at most 2^30 units; half precision with the user-defined operations of
//! [`crate::comm::halfops`]) or `MPI_Bcast` (in chunks of at most 2^30 units). The buckets of one
//! call are its messages, so every rank must use the same bucket settings and the same
//! list.
//!
//! **One agreement per list.** Every member is checked (its facts for its access; dtype and
//! count against its pair in the form with a send list; no written member overlapping
//! another member) and every bucket's buffer taken before the agreement, whose signature
//! carries the list (member count, each member's dtype and element count:
//! `Signature::members`); so a refusal or a mismatch anywhere in the list stops every rank
//! before the first bucket, and nothing after the agreement can fail on one rank only.
//!
//! **Overlap.** After the agreement the buckets are packed and posted one after another
//! (nonblocking: `MPI_Iallreduce`, `MPI_Ibcast`): bucket k+1 is packed while bucket k is on
//! the wire. They complete in order, and each bucket is unpacked into its members as soon
//! as it has landed, while later ones are still in flight. The blocking form does all of
//! this in the call, on the caller's communicator; the nonblocking form posts every bucket
//! when its agreement completes (in `test`/`wait`, on the shadow communicator of
//! `pending`, all in one go so that no other collective comes between them) and unpacks
//! each one as `test`/`wait` sees it land.
//!
//! **Members alone.** A member of at least [`OWN_BUCKET_BYTES`] (256 KiB) has a bucket of its
//! own; when its sides are contiguous the collective runs on the member's own memory (in
//! place, or from its send tensor into its receive tensor) and nothing is copied. Copying a
//! large member into a bucket and back costs more than one more collective's latency.
//!
//! **The blocking form** runs each bucket's blocking collective in turn (pack, collective,
//! unpack); only while nonblocking collectives of `pending` wait does it post and poll.
//!
//! **Device lists** (`kDLCUDA` or `kDLCUDAManaged` members on a `DeviceComm`): the stager
//! packs each bucket's members on the device into one device buffer and hands MPI that
//! buffer (direct) or one pinned host copy of it (staged): one crossing per bucket, not per
//! member ([`crate::comm::Stager::stage_bucket`]); this happens before the agreement, so that a
//! placement refusal or a copy error joins it. After MPI, each bucket is copied back once
//! and unpacked on the device. A reduce-scatter's bucket is packed on the device into a
//! send buffer of every rank's blocks (rank by rank), which crosses once (staged), and the
//! bucket MPI writes (this rank's block of every member) crosses back once.
//!
//! Memory: the packed buckets hold their members' bytes once (as DDP's buckets do), taken
//! from the scratch pool (or the `DeviceComm`'s pinned and device pools) and handed back at
//! completion.

use mpi::topology::{Communicator, Rank};

use crate::comm::engine::call::{Call, Operation};
use crate::comm::engine::checks::{check_count, check_intra, check_pair, check_rank};
use crate::comm::engine::mode::Mode;
use crate::comm::engine::stager::Endpoint;
mod buckets;
mod mark;
mod plans;

use crate::comm::engine::signature::Signature;
use crate::comm::engine::stager::{StagedBucket, Stager};
use crate::device::MemoryKind;
use crate::dlpack::{Tensor, TensorListMut};
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};
use crate::mpi_library::ensure_matching;
use crate::settings::{bucket_bytes, first_bucket_bytes};
use crate::spec::facts::Facts;
use crate::spec::kernels;
use crate::spec::scratch::Scratch;
use crate::spec::{Access, Reach};
use buckets::{bucket_buffers, device_bucket, direct_calls};
use mark::Mark;
pub(in crate::comm) use plans::{plan_all_reduce, plan_broadcast, plan_reduce_scatter_block};

/// What a fused collective does with each bucket.
#[derive(Debug, Clone, Copy)]
pub(in crate::comm) enum FusedKind {
    /// An element-wise reduction over every rank into every rank (`MPI_Allreduce`, in place
    /// on the bucket).
    AllReduce(ReduceOp),
    /// The root's values to every rank (`MPI_Bcast`).
    Broadcast(Rank),
    /// An element-wise reduction over the ranks whose block `r` of every member goes to
    /// rank `r` (`MPI_Reduce_scatter_block`), among this many ranks.
    ReduceScatter(ReduceOp, Rank),
}

/// One member: the facts its elements are packed from and unpacked into (`None` where this
/// rank does not do that; both the same for an in-place member), and its place in its
/// bucket.
#[derive(Debug)]
struct Member {
    pack: Option<Facts>,
    unpack: Option<Facts>,
    /// Whether `pack` and `unpack` are the same tensor (an in-place all-reduce).
    in_place: bool,
    /// First byte in its bucket.
    at: usize,
    bytes: usize,
    /// The strided copies into and out of its bucket, prepared once ([`Fused::build`]).
    copies: (Option<kernels::Prepared>, Option<kernels::Prepared>),
}

impl Member {
    /// The facts that describe the member's elements.
    fn facts(&self) -> Option<&Facts> {
        self.pack.as_ref().or(self.unpack.as_ref())
    }

    /// Whether every side this rank touches is one run in logical order (then a bucket of
    /// this member alone is its own memory: nothing is copied).
    fn is_direct(&self) -> bool {
        self.pack
            .iter()
            .chain(&self.unpack)
            .all(Facts::is_contiguous)
    }
}

/// One bucket: a buffer of its members' elements and the calls on it.
struct Bucket {
    /// Its members' indices, in list order.
    members: Vec<usize>,
    /// Its members' elements (a reduce-scatter's: every rank's blocks, rank by rank);
    /// `None` for a direct bucket (one member whose sides are contiguous: the calls are on
    /// the member's own memory, nothing is packed or unpacked).
    buf: Option<Scratch>,
    /// A reduce-scatter's receive buffer: this rank's block of every member.
    recv: Option<Scratch>,
    /// A device list's bucket, packed and staged by the stager before the agreement.
    /// Its lifetime is erased: it borrows the stager (the `DeviceComm`) for the `'t` of
    /// the [`Operation<'t>`] this `Fused` is made in and never leaves (see
    /// [`Fused::build`]).
    staged: Option<Box<dyn StagedBucket + 'static>>,
    calls: Vec<Call>,
    /// How many requests its calls posted.
    posted: usize,
}

impl std::fmt::Debug for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bucket")
            .field("members", &self.members)
            .field("packed_bytes", &self.buf.as_ref().map(|b| b.len()))
            .field("staged", &self.staged.is_some())
            .field("calls", &self.calls)
            .field("posted", &self.posted)
            .finish_non_exhaustive()
    }
}

/// A fused collective's data operation: the members, the buckets and what is done with
/// them. The constructors return it as an [`Operation<'t>`], which borrows the list's
/// tensors for `'t`.
#[derive(Debug)]
pub(in crate::comm) struct Fused {
    kind: FusedKind,
    members: Vec<Member>,
    buckets: Vec<Bucket>,
    /// Buckets unpacked so far, and requests that completed so far.
    landed: usize,
    completed: usize,
    /// The first error of unpacking a device bucket (returned at completion).
    failed: Option<Error>,
    /// A plan's identity, carried by its first packed bucket where it can be.
    mark: Option<Mark>,
    /// What this step's mark found, when it differed (then no member is unpacked).
    seen: Option<String>,
    /// Whether this plan's steps are refused on this rank (its tensors changed): the
    /// members are neither packed nor unpacked, and every bucket is the plan's own buffer.
    refused: bool,
    /// Each bucket's MPI-4 persistent requests, where a plan made them ([`Batch::persist`]:
    /// every bucket packed in a buffer of the plan's own); empty otherwise.
    persistent: Vec<Vec<mpi::ffi::MPI_Request>>,
    /// Whether this is a plan's batch, run again at each step (a device bucket is then
    /// packed again before each step: [`StagedBucket::repack`]).
    planned: bool,
    /// A reduce-scatter's strided member, packed whole before its blocks go to their
    /// ranks' segments: the largest one's bytes, taken at the build (so a plan's step does
    /// not allocate).
    whole: Vec<u8>,
}

/// The signature of the fused collective `name` over `tensors` (in list order).
pub(in crate::comm) fn signature<'l>(
    name: &'static str,
    tensors: impl Iterator<Item = &'l dyn Tensor>,
) -> Signature<'static> {
    // An unreadable setting is this rank's error in the preparation; 0 stands in here.
    let caps = (
        first_bucket_bytes().unwrap_or(0),
        bucket_bytes().unwrap_or(0),
    );
    Signature::of(name)
        .members(tensors.map(|t| (t.dtype(), t.shape())))
        .buckets(caps.0, caps.1)
}

/// Wraps member `index`'s error with its index.
fn member(index: usize) -> impl Fn(Error) -> Error {
    move |e| Error::Member {
        index,
        source: Box::new(e),
    }
}

/// The facts of member `index` for `access`: in host memory, in a layout the pack kernels
/// take; or (`on_device`) in device memory a stager places and copies.
fn facts_of(index: usize, t: &dyn Tensor, access: Access, on_device: bool) -> Result<Facts> {
    if on_device {
        return Facts::of(t, access, Some(Reach::MpiOnly)).map_err(member(index));
    }
    let f = Facts::of(t, access, None).map_err(member(index))?;
    if let Some(plan) = &f.plan {
        let bytes = f.packed_bytes().map_err(member(index))?;
        if !kernels::accepts(&plan.axes, f.element.size_bytes(), bytes) {
            return Err(member(index)(Error::StridedNotSupported {
                operation: "fused members whose layout the pack kernels refuse",
            }));
        }
    }
    Ok(f)
}

/// Refuses a list whose members are not all one kind of memory ([`Error::MixedDevices`]);
/// whether the list is in CUDA device or managed memory on a communicator with a stager
/// (`staged`), which then packs and stages its buckets. Device members without a stager
/// are refused by their facts ([`Error::UnsupportedDevice`]).
pub(in crate::comm) fn check_devices<'l>(
    mut tensors: impl Iterator<Item = &'l dyn Tensor>,
    staged: bool,
) -> Result<bool> {
    let Some(first) = tensors.next() else {
        return Ok(false);
    };
    let kind = first.device().memory_kind();
    for (i, t) in tensors.enumerate() {
        if t.device().memory_kind() != kind {
            return Err(Error::MixedDevices {
                index: i + 1,
                device: t.device().to_string(),
                first: first.device().to_string(),
            });
        }
    }
    Ok(staged && matches!(kind, MemoryKind::Cuda | MemoryKind::CudaManaged))
}

/// [`check_devices`] over a send and a receive list, which must also be one kind of memory
/// with each other ([`Error::MixedDevices`] names the send list's first member otherwise).
fn same_devices(send: &[&dyn Tensor], recv: &[&dyn Tensor], staged: bool) -> Result<bool> {
    let on = check_devices(recv.iter().copied(), staged)?;
    if let (Some(a), Some(b)) = (send.first(), recv.first()) {
        let (a, b) = (a.device(), b.device());
        if a.memory_kind() != b.memory_kind() {
            return Err(Error::MixedDevices {
                index: 0,
                device: format!("{a} (the send list's)"),
                first: format!("{b} (the receive list's)"),
            });
        }
    }
    check_devices(send.iter().copied(), staged)?;
    Ok(on)
}

/// The tensors this rank packs a member from and unpacks it into (`None`: not here).
type Sides<'l> = (Option<&'l dyn Tensor>, Option<&'l dyn Tensor>);

/// A device list's stager and, per member, its [`Sides`] ([`Fused::build`] stages each
/// bucket with it).
struct OnDevice<'l, 't> {
    stager: &'t dyn Stager,
    tensors: Vec<Sides<'l>>,
    /// Whether the collective reduces (then each bucket is staged for its own dtype's
    /// reduction: half precision is reduced on the host).
    reduces: bool,
}

/// Refuses a member written through memory another member also uses
/// ([`Error::BuffersAlias`]); members only read may overlap.
fn check_disjoint(members: &[Member]) -> Result<()> {
    let mut spans: Vec<(usize, usize, bool, usize)> = Vec::new();
    for (i, m) in members.iter().enumerate() {
        match (&m.pack, &m.unpack) {
            (Some(p), Some(u)) if (p.start, p.end) == (u.start, u.end) => {
                spans.push((u.start, u.end, true, i));
            }
            (p, u) => {
                spans.extend(p.iter().map(|f| (f.start, f.end, false, i)));
                spans.extend(u.iter().map(|f| (f.start, f.end, true, i)));
            }
        }
    }
    spans.retain(|&(s, e, _, _)| s < e);
    spans.sort_unstable();
    let mut reach: Option<(usize, usize, bool, usize)> = None;
    for &(s, e, w, i) in &spans {
        if let Some((rs, re, rw, ri)) = reach {
            if s < re && (w || rw) {
                // Named by the later member of the two; the message gives both spans.
                return Err(member(i.max(ri))(Error::BuffersAlias {
                    send_address: rs,
                    send_bytes: re - rs,
                    recv_address: s,
                    recv_bytes: e - s,
                }));
            }
            if e <= re {
                continue;
            }
        }
        reach = Some((s, e, w, i));
    }
    Ok(())
}

/// The strided copies of member `m` (pack from its send side, unpack into its receive
/// side), checked and simplified once; `None` for a contiguous side (one `memcpy`).
fn prepared_copies(m: &Member) -> (Option<kernels::Prepared>, Option<kernels::Prepared>) {
    let copy = |f: &Option<Facts>, pack: bool| {
        let f = f.as_ref()?;
        let plan = f.plan.as_ref()?;
        let (elem, bytes) = (f.element.size_bytes(), f.packed_bytes().ok()?);
        if pack {
            kernels::Prepared::pack(&plan.axes, elem, bytes)
        } else {
            kernels::Prepared::unpack(&plan.axes, elem, bytes)
        }
    };
    (copy(&m.pack, true), copy(&m.unpack, false))
}

/// A packed bucket's buffer, a reduce-scatter's receive buffer, its calls, and the mark it
/// carries.
type PackedBucket = (Scratch, Option<Scratch>, Vec<Call>, Option<Mark>);

/// A packed bucket of `kind`, bucket number `index` of `bytes` bytes whose first member
/// is `first` (`ranks`: a reduce-scatter's), its buffers and calls, with spare elements
/// for a plan's mark where `marked` (the plan's ranks) and its operation can carry one.
fn packed_bucket(
    kind: FusedKind,
    first: &Member,
    (index, bytes, ranks): (usize, usize, usize),
    marked: Option<Rank>,
) -> Result<PackedBucket> {
    let element = first
        .facts()
        .map(|f| f.element)
        .ok_or_else(|| crate::comm::engine::checks::missing("fused member facts"))?;
    let typed = (element.dtype, element.size_bytes());
    let (mark, spare) = marked
        .and_then(|n| Mark::new(kind, typed, (index, bytes), (n, first.pack.is_some())))
        .map_or((None, 0), |(m, b)| (Some(m), b));
    let (buf, recv, calls) = bucket_buffers(kind, element, bytes + spare, ranks)?;
    Ok((buf, recv, calls, mark))
}

/// A member of at least this many bytes (256 KiB) has a bucket of its own, reduced or
/// broadcast on its own memory when it is contiguous: copying it into a bucket and back
/// costs more than the latency of one more collective (measured: `docs/PERFORMANCE.md`,
/// "Fused collectives"). A constant, so that every rank buckets a list alike. (Named
/// `ALONE_BYTES` before.)
pub const OWN_BUCKET_BYTES: usize = 256 << 10;

/// The buckets of `members`: lists of member indices, by dtype in order of first
/// appearance, each at most `first` bytes (a dtype's first bucket) or `rest` bytes; a
/// member larger than that, or of at least [`OWN_BUCKET_BYTES`], alone.
fn buckets_of(members: &[Member], (first, rest): (usize, usize)) -> Vec<Vec<usize>> {
    let dtype = |m: &Member| m.facts().map(|f| f.element.dtype);
    let mut order: Vec<DType> = Vec::new();
    for d in members.iter().filter_map(dtype) {
        if !order.contains(&d) {
            order.push(d);
        }
    }
    let mut out = Vec::new();
    for d in order {
        let (mut current, mut bytes, mut cap) = (Vec::new(), 0usize, first);
        for (i, m) in members.iter().enumerate() {
            if dtype(m) != Some(d) {
                continue;
            }
            let alone = m.bytes >= OWN_BUCKET_BYTES;
            if !current.is_empty() && (alone || bytes.saturating_add(m.bytes) > cap) {
                out.push(std::mem::take(&mut current));
                (bytes, cap) = (0, rest);
            }
            current.push(i);
            bytes = bytes.saturating_add(m.bytes);
            if alone {
                out.push(std::mem::take(&mut current));
                (bytes, cap) = (0, rest);
            }
        }
        if !current.is_empty() {
            out.push(current);
        }
    }
    out
}

impl Fused {
    /// A fused all-reduce of `recv`'s members, from `send`'s (`None`: in place).
    ///
    /// # Errors
    /// [`Error::Member`] around a member's refusal (its facts for its access, its dtype or
    /// count against its pair, the reduction for its dtype); [`Error::ListLengthMismatch`]
    /// for lists of different lengths; [`Error::Member`] around [`Error::BuffersAlias`] for
    /// members sharing memory; the pool's errors.
    pub(in crate::comm) fn all_reduce<'t>(
        send: Option<&[&'t dyn Tensor]>,
        recv: &[&'t dyn Tensor],
        op: ReduceOp,
        stager: Option<&'t dyn Stager>,
        marked: Option<Rank>,
    ) -> Result<Operation<'t>> {
        if let Some(s) = send {
            if s.len() != recv.len() {
                return Err(Error::ListLengthMismatch {
                    what: "fused all-reduce send list",
                    expected: recv.len(),
                    actual: s.len(),
                });
            }
        }
        let mut members = Vec::with_capacity(recv.len());
        for (i, r) in recv.iter().enumerate() {
            let access = if send.is_some() {
                Access::Write
            } else {
                Access::Update
            };
            let wf = facts_of(i, *r, access, stager.is_some())?;
            wf.element.check_reduction(op).map_err(member(i))?;
            let pf = match send {
                Some(s) => {
                    let sf = facts_of(i, s[i], Access::Read, stager.is_some())?;
                    check_pair("fused all-reduce send vs receive", &sf, &wf).map_err(member(i))?;
                    check_count(
                        || "fused all-reduce receive".into(),
                        sf.len_elems,
                        wf.len_elems,
                    )
                    .map_err(member(i))?;
                    sf
                }
                None => wf.clone(),
            };
            let bytes = pf.packed_bytes().map_err(member(i))?;
            members.push(Member {
                pack: Some(pf),
                unpack: Some(wf),
                in_place: send.is_none(),
                at: 0,
                bytes,
                copies: (None, None),
            });
        }
        let on_device = stager.map(|stager| OnDevice {
            stager,
            tensors: (0..recv.len())
                .map(|i| (Some(send.map_or(recv[i], |s| s[i])), Some(recv[i])))
                .collect(),
            reduces: true,
        });
        Fused::build(FusedKind::AllReduce(op), members, on_device, marked)
            .map(|f| Operation::batch(Box::new(f)))
    }

    /// A fused reduce-scatter: member `i` of `send` (`ranks` × its receive's elements)
    /// reduced over the ranks, block `r` into rank `r`'s member `i` of `recv`.
    ///
    /// # Errors
    /// As [`Fused::all_reduce`], and [`Error::Member`] around [`Error::CountMismatch`] when
    /// a send member does not hold `ranks` × its receive's elements; [`Error::CountTooLarge`]
    /// for a bucket beyond `int` units per rank.
    pub(in crate::comm) fn reduce_scatter<'t>(
        send: &[&'t dyn Tensor],
        recv: &[&'t dyn Tensor],
        op: ReduceOp,
        ranks: Rank,
        stager: Option<&'t dyn Stager>,
        marked: Option<Rank>,
    ) -> Result<Operation<'t>> {
        if send.len() != recv.len() {
            return Err(Error::ListLengthMismatch {
                what: "fused reduce-scatter send list",
                expected: recv.len(),
                actual: send.len(),
            });
        }
        let mut members = Vec::with_capacity(recv.len());
        for (i, (s, r)) in send.iter().zip(recv.iter()).enumerate() {
            let sf = facts_of(i, *s, Access::Read, stager.is_some())?;
            sf.element.check_reduction(op).map_err(member(i))?;
            let rf = facts_of(i, *r, Access::Write, stager.is_some())?;
            check_pair("fused reduce-scatter send vs receive", &sf, &rf).map_err(member(i))?;
            check_count(
                || format!("fused reduce-scatter send (= receive count × {ranks} ranks)"),
                rf.len_elems.saturating_mul(i64::from(ranks)),
                sf.len_elems,
            )
            .map_err(member(i))?;
            let bytes = rf.packed_bytes().map_err(member(i))?;
            members.push(Member {
                pack: Some(sf),
                unpack: Some(rf),
                in_place: false,
                at: 0,
                bytes,
                copies: (None, None),
            });
        }
        let on_device = stager.map(|stager| OnDevice {
            stager,
            tensors: (0..recv.len())
                .map(|i| (Some(send[i]), Some(recv[i])))
                .collect(),
            reduces: true,
        });
        let kind = FusedKind::ReduceScatter(op, ranks);
        Fused::build(kind, members, on_device, marked).map(|f| Operation::batch(Box::new(f)))
    }

    /// A fused broadcast of `tensors` from `root` (read there, written elsewhere).
    ///
    /// # Errors
    /// [`Error::Member`] around a member's refusal; [`Error::BuffersAlias`]; the pool's
    /// errors.
    pub(in crate::comm) fn broadcast<'t>(
        tensors: &[&'t dyn Tensor],
        root: Rank,
        is_root: bool,
        stager: Option<&'t dyn Stager>,
        marked: Option<Rank>,
    ) -> Result<Operation<'t>> {
        let mut members = Vec::with_capacity(tensors.len());
        for (i, t) in tensors.iter().enumerate() {
            let access = if is_root { Access::Read } else { Access::Write };
            let f = facts_of(i, *t, access, stager.is_some())?;
            let bytes = f.packed_bytes().map_err(member(i))?;
            let (pack, unpack) = if is_root {
                (Some(f), None)
            } else {
                (None, Some(f))
            };
            members.push(Member {
                pack,
                unpack,
                in_place: false,
                at: 0,
                bytes,
                copies: (None, None),
            });
        }
        let on_device = stager.map(|stager| OnDevice {
            stager,
            tensors: tensors
                .iter()
                .map(|&t| {
                    if is_root {
                        (Some(t), None)
                    } else {
                        (None, Some(t))
                    }
                })
                .collect(),
            reduces: false,
        });
        Fused::build(FusedKind::Broadcast(root), members, on_device, marked)
            .map(|f| Operation::batch(Box::new(f)))
    }

    /// Places the members in buckets and takes the buckets' buffers; for a device list,
    /// has the stager pack and stage each bucket (before the agreement, so that its
    /// refusals and copy errors join it). `marked`: a plan's batch among this many ranks,
    /// whose first packed bucket carries the plan's identity where it can ([`mark`]).
    fn build(
        kind: FusedKind,
        mut members: Vec<Member>,
        on_device: Option<OnDevice<'_, '_>>,
        marked: Option<Rank>,
    ) -> Result<Fused> {
        check_disjoint(&members)?;
        for m in &mut members {
            m.copies = prepared_copies(m);
        }
        // A reduce-scatter's bucket holds every rank's block of each member.
        let ranks = match kind {
            FusedKind::ReduceScatter(_, ranks) => usize::try_from(ranks).unwrap_or(1).max(1),
            _ => 1,
        };
        let caps = (first_bucket_bytes()? / ranks, bucket_bytes()? / ranks);
        let mut buckets = Vec::new();
        let mut mark: Option<Mark> = None;
        let whole = match kind {
            FusedKind::ReduceScatter(..) => {
                let strided = members.iter().filter(|m| m.copies.0.is_some());
                vec![0u8; strided.map(|m| m.bytes * ranks).max().unwrap_or(0)]
            }
            _ => Vec::new(),
        };
        for list in buckets_of(&members, caps) {
            let mut bytes = 0usize;
            for &i in &list {
                members[i].at = bytes;
                bytes += members[i].bytes;
            }
            let (mut staged, on) = (None, on_device.as_ref());
            let bucket = match list[..] {
                _ if on.is_some() => {
                    let (b, calls) = device_bucket(kind, &members, &list, bytes, on)?;
                    staged = Some(b);
                    (None, None, calls)
                }
                // A plan packs a small member too: its bucket can then carry the mark.
                [i] if members[i].is_direct()
                    && (marked.is_none() || members[i].bytes >= OWN_BUCKET_BYTES) =>
                {
                    (None, None, direct_calls(kind, &members[i])?)
                }
                _ => {
                    let first = &members[list[0]];
                    let marking = marked.filter(|_| mark.is_none());
                    let at = (buckets.len(), bytes, ranks);
                    let (buf, recv, calls, m) = packed_bucket(kind, first, at, marking)?;
                    mark = mark.or(m);
                    (Some(buf), recv, calls)
                }
            };
            let (buf, recv, calls) = bucket;
            buckets.push(Bucket {
                members: list,
                buf,
                recv,
                staged,
                calls,
                posted: 0,
            });
        }
        Ok(Fused {
            kind,
            members,
            buckets,
            landed: 0,
            completed: 0,
            failed: None,
            mark,
            seen: None,
            refused: false,
            persistent: Vec::new(),
            planned: marked.is_some(),
            whole,
        })
    }
}

/// `all_reduce_tensors_in_place`, `all_reduce_tensors` and their nonblocking forms: `send`
/// `None` reduces `recv`'s members in place. The lists hold the members for `'a`, which the
/// public methods tie to the caller's lists (a request borrows them until it completes);
/// the slices themselves are only read during the call (the operation keeps the members'
/// facts and, for a device list, the member references, never the slices).
pub(in crate::comm) fn all_reduce_tensors<'a, E: Endpoint + ?Sized, M: Mode<'a>>(
    tc: &'a E,
    mode: M,
    send: Option<&[&'a dyn Tensor]>,
    recv: &[&'a dyn Tensor],
    op: ReduceOp,
) -> Result<M::Out> {
    let comm = tc.communicator();
    check_intra(comm)?;
    let name = if send.is_some() {
        "all_reduce_tensors"
    } else {
        "all_reduce_tensors_in_place"
    };
    let sig = signature(name, recv.iter().copied()).reduce(op);
    let staged = tc.stager().is_some();
    let devices = match send {
        Some(s) => same_devices(s, recv, staged),
        None => check_devices(recv.iter().copied(), staged),
    };
    // The MPI library first: each member's facts check it too, but their errors are
    // wrapped in `Error::Member`, and an empty list has no member.
    let prepared = ensure_matching()
        .and(devices)
        .and_then(|on| Fused::all_reduce(send, recv, op, tc.stager().filter(|_| on), None));
    mode.prepared(tc, sig, prepared)
}

/// `broadcast_tensors` and its nonblocking form (lists as in [`all_reduce_tensors`]).
pub(in crate::comm) fn broadcast_tensors<'a, E: Endpoint + ?Sized, M: Mode<'a>>(
    tc: &'a E,
    mode: M,
    tensors: &[&'a dyn Tensor],
    root: Rank,
) -> Result<M::Out> {
    let comm = tc.communicator();
    check_intra(comm)?;
    let sig = signature("broadcast_tensors", tensors.iter().copied()).root(root);
    let staged = tc.stager().is_some();
    let is_root = comm.rank() == root;
    let prepared = ensure_matching()
        .and_then(|()| check_rank(root, comm.size()))
        .and_then(|()| check_devices(tensors.iter().copied(), staged))
        .and_then(|on| Fused::broadcast(tensors, root, is_root, tc.stager().filter(|_| on), None));
    mode.prepared(tc, sig, prepared)
}

/// `reduce_scatter_block_tensors` and its nonblocking form (lists as in
/// [`all_reduce_tensors`]).
pub(in crate::comm) fn reduce_scatter_block_tensors<'a, E: Endpoint + ?Sized, M: Mode<'a>>(
    tc: &'a E,
    mode: M,
    send: &[&'a dyn Tensor],
    recv: &[&'a dyn Tensor],
    op: ReduceOp,
) -> Result<M::Out> {
    let comm = tc.communicator();
    check_intra(comm)?;
    let sig = signature("reduce_scatter_block_tensors", recv.iter().copied()).reduce(op);
    let staged = tc.stager().is_some();
    let prepared = ensure_matching()
        .and_then(|()| same_devices(send, recv, staged))
        .and_then(|on| {
            Fused::reduce_scatter(
                send,
                recv,
                op,
                comm.size(),
                tc.stager().filter(|_| on),
                None,
            )
        });
    mode.prepared(tc, sig, prepared)
}

/// The members of a list MPI writes, as the fused collectives take them: read through
/// shared references (their facts, a device stager's copies), while the caller's list
/// stays borrowed exclusively for the call, or for the life of a request.
pub(in crate::comm) fn written<L: TensorListMut + ?Sized>(list: &mut L) -> Vec<&dyn Tensor> {
    list.tensors_mut()
        .into_iter()
        .map(|t| t as &dyn Tensor)
        .collect()
}
