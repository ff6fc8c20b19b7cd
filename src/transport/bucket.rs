//! Device buckets of the fused collectives ([`crate::comm::Stager::stage_bucket`]): the
//! members of one bucket, device tensors of one dtype, are packed on the device into one
//! device buffer (one batch of 2-D copies, `cuMemcpy2DAsync` device to device, one
//! synchronization), which MPI takes directly (a CUDA-aware MPI, every member on the
//! direct route) or through one pinned host copy of the whole bucket (staged): one copy to
//! the host per bucket, not per member. After MPI wrote it, the bucket is copied back once
//! (staged) and unpacked into the members by one more batch of device copies.

use std::ffi::c_void;

use super::pool::{PinnedBuf, PinnedPool};
use super::route::{no_runtime_error, Route};
use super::stage::Placement;
use crate::comm::StagedBucket;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::runtime::{Copy2d, CopyKind, DeviceRuntime, Direction, StridedCopy};
use crate::spec::Reach;

/// One member of a bucket as placed: its index in the list, where this rank packs it from
/// and unpacks it into (`None`: not on this rank), and its first byte in the bucket.
pub(super) struct PlacedMember {
    pub(super) index: usize,
    pub(super) pack: Option<Placement>,
    pub(super) unpack: Option<Placement>,
    pub(super) at: usize,
}

/// A bucket of device members: the device buffer they are packed into, the pinned copy MPI
/// works on when staged, and the copies that unpack it.
pub(super) struct DeviceBucket<'p, 'r> {
    runtime: &'r dyn DeviceRuntime,
    device: Device,
    bytes: usize,
    /// The members packed, in device memory (`None` for an empty bucket).
    packed: Option<PinnedBuf<'p, 'r>>,
    /// The pinned host copy of `packed` that MPI works on (staged buckets only).
    host: Option<PinnedBuf<'p, 'r>>,
    /// A reduce-scatter's send buffer: every rank's block of each member, rank by rank, in
    /// device memory, and the pinned host copy MPI reads when staged.
    send: Option<(PinnedBuf<'p, 'r>, Option<PinnedBuf<'p, 'r>>)>,
    /// The device-to-device copies from `packed` into the members this rank unpacks.
    unpack: Vec<Copy2d>,
    /// The device-to-device copies of the members this rank packs into `packed` (empty
    /// for a reduce-scatter, whose members go to the send blocks): a plan's steps run them
    /// again ([`StagedBucket::repack`]).
    pack: Vec<Copy2d>,
}

/// The route of a bucket: direct when every member is on the direct route, else staged.
pub(super) fn bucket_route(members: &[PlacedMember]) -> Route {
    let all_direct = members
        .iter()
        .flat_map(|m| m.pack.iter().chain(&m.unpack))
        .all(|p| p.route == Route::Direct);
    if all_direct {
        Route::Direct
    } else {
        Route::Staged
    }
}

/// The 2-D copies between member `p`'s elements and the bucket bytes at `at`, in
/// `direction`.
///
/// # Errors
/// [`Error::Member`] around [`Error::StridedNotSupported`] for a strided member whose
/// layout the 2-D copies cannot express.
fn copies_of(
    p: &Placement,
    index: usize,
    at: *mut u8,
    direction: Direction,
) -> Result<Vec<Copy2d>> {
    let first = p.facts.first.cast_const();
    if p.facts.is_contiguous() {
        let bytes = p.facts.packed_bytes()?;
        let (src, dst) = match direction {
            Direction::Pack => (first, at.cast::<c_void>()),
            Direction::Unpack => (at.cast_const().cast::<c_void>(), first.cast_mut()),
        };
        return Ok(vec![Copy2d {
            dst,
            dst_pitch: bytes,
            src,
            src_pitch: bytes,
            width_bytes: bytes,
            height: 1,
        }]);
    }
    // A managed member's placement plans no copies (single operations hand managed memory
    // to MPI as it is); a bucket packs it with the device's copies like any other.
    let planned = match (&p.packed, &p.facts.plan) {
        (None, Some(layout)) => StridedCopy::plan(&layout.axes, p.facts.element.size_bytes()),
        _ => None,
    };
    match p.packed.as_ref().or(planned.as_ref()) {
        Some(plan) => Ok(plan.copies_at(first, at.cast_const().cast(), direction)),
        None => Err(Error::Member {
            index,
            source: Box::new(Error::StridedNotSupported {
                operation: "fused device members whose layout the 2-D copies cannot express",
            }),
        }),
    }
}

impl<'p, 'r> DeviceBucket<'p, 'r> {
    /// Packs `members` into a new bucket of `bytes` bytes on `device`, on `route`
    /// ([`bucket_route`]); with `blocks` > 1 (a reduce-scatter among that many ranks), into
    /// a send buffer of `blocks` × `bytes` bytes instead, block `r` of every member (its
    /// elements `r·n .. (r+1)·n` in logical order, `n` its receive's count) at
    /// `r × bytes +` [`PlacedMember::at`], and the bucket of `bytes` is what MPI writes.
    ///
    /// # Errors
    /// As [`copies_of`] (before any copy); [`Error::Overflow`] for `blocks × bytes`;
    /// allocation and copy errors.
    pub(super) fn new(
        members: &[PlacedMember],
        (bytes, blocks, device, route): (usize, usize, Device, Route),
        pool: &'p PinnedPool<'r>,
        runtime: Option<&'r dyn DeviceRuntime>,
    ) -> Result<Self> {
        let runtime = runtime.ok_or_else(no_runtime_error)?;
        let blocks = blocks.max(1);
        let total = bytes.checked_mul(blocks).ok_or(Error::Overflow {
            quantity: "fused reduce-scatter bucket bytes",
            lhs: bytes as i128,
            operator: "*",
            rhs: blocks as i128,
        })?;
        let take = |n: usize| (n > 0).then(|| pool.take_device(device, n)).transpose();
        let packed = take(bytes)?;
        let base = packed.as_ref().map_or(std::ptr::null_mut(), PinnedBuf::ptr);
        let send_dev = if blocks > 1 { take(total)? } else { None };
        let unpack = bucket_copies(members, base, bytes, Direction::Unpack)?;
        // Whether the bucket itself holds packed members (MPI reads it); a reduce-scatter's
        // members go to the send blocks, and MPI only writes the bucket.
        let pack = match &send_dev {
            Some(s) => {
                pack_blocks(members, s.ptr(), (bytes, blocks), device, pool, runtime)?;
                Vec::new()
            }
            None => {
                let pack = bucket_copies(members, base, bytes, Direction::Pack)?;
                if !pack.is_empty() {
                    // SAFETY: each copy reads a member's elements (device memory of
                    // `device`: the placement checked the pointer, the layout arithmetic
                    // the span) and writes its own bytes of the fresh device bucket;
                    // members packed do not overlap the bucket.
                    unsafe { runtime.copy_2d(device, CopyKind::DeviceToDevice, &pack) }?;
                }
                pack
            }
        };
        let packed_in = !pack.is_empty();
        let staged = route == Route::Staged;
        // What MPI reads goes to the host once: the packed bucket, or the send blocks.
        let cross = |dev: &PinnedBuf<'p, 'r>, n: usize, copy: bool| -> Result<PinnedBuf<'p, 'r>> {
            let host = pool.take(n)?;
            if copy {
                // SAFETY: `dev` holds `n` device bytes, `host` at least `n`.
                unsafe { runtime.copy_to_host(device, host.ptr(), dev.ptr().cast(), n) }?;
            }
            Ok(host)
        };
        let host = match &packed {
            Some(dev) if staged => Some(cross(dev, bytes, packed_in)?),
            _ => None,
        };
        let send = match send_dev {
            Some(dev) if staged => {
                let host = cross(&dev, total, true)?;
                Some((dev, Some(host)))
            }
            Some(dev) => Some((dev, None)),
            None => None,
        };
        Ok(DeviceBucket {
            runtime,
            device,
            bytes,
            packed,
            host,
            send,
            unpack,
            pack,
        })
    }
}

/// The device-to-device copies between the bucket at `base` (`bytes` bytes; none for an
/// empty bucket) and the members this rank packs (`Direction::Pack`) or unpacks
/// (`Direction::Unpack`).
fn bucket_copies(
    members: &[PlacedMember],
    base: *mut u8,
    bytes: usize,
    direction: Direction,
) -> Result<Vec<Copy2d>> {
    let mut copies = Vec::new();
    for m in members.iter().filter(|_| bytes > 0) {
        let side = match direction {
            Direction::Pack => &m.pack,
            Direction::Unpack => &m.unpack,
        };
        if let Some(p) = side {
            copies.extend(copies_of(p, m.index, base.wrapping_add(m.at), direction)?);
        }
    }
    copies.retain(|c| c.bytes() > 0);
    Ok(copies)
}

/// Packs a reduce-scatter's send buffer at `send` (`blocks` blocks of `bytes` bytes): each
/// member's `blocks` equal runs of its logical elements, run `r` at `r × bytes + at`. A
/// contiguous member is one 2-D copy (a run per row, the block size as the destination's
/// pitch); a strided one is first packed whole, in logical order, into a device buffer of
/// its own and then copied so.
///
/// # Errors
/// As [`copies_of`]; allocation and copy errors.
fn pack_blocks(
    members: &[PlacedMember],
    send: *mut u8,
    (bytes, blocks): (usize, usize),
    device: Device,
    pool: &PinnedPool<'_>,
    runtime: &dyn DeviceRuntime,
) -> Result<()> {
    let sides: Vec<(&PlacedMember, &Placement)> = members
        .iter()
        .filter_map(|m| m.pack.as_ref().map(|p| (m, p)))
        .collect();
    let strided_bytes = sides
        .iter()
        .filter(|(_, p)| !p.facts.is_contiguous())
        .map(|(_, p)| p.facts.packed_bytes())
        .sum::<Result<usize>>()?;
    let tmp = match strided_bytes {
        0 => None,
        n => Some(pool.take_device(device, n)?),
    };
    let (mut whole, mut runs, mut tmp_at) = (Vec::new(), Vec::new(), 0usize);
    for &(m, p) in &sides {
        let total = p.facts.packed_bytes()?;
        let src = if p.facts.is_contiguous() {
            p.facts.first.cast_const()
        } else {
            let dst = tmp.as_ref().map_or(std::ptr::null_mut(), PinnedBuf::ptr);
            let dst = dst.wrapping_add(tmp_at);
            whole.extend(copies_of(p, m.index, dst, Direction::Pack)?);
            tmp_at += total;
            dst.cast_const().cast::<c_void>()
        };
        let n = total / blocks;
        runs.push(Copy2d {
            dst: send.wrapping_add(m.at).cast(),
            dst_pitch: bytes,
            src,
            src_pitch: n,
            width_bytes: n,
            height: blocks,
        });
    }
    for batch in [whole, runs] {
        let batch: Vec<Copy2d> = batch.into_iter().filter(|c| c.bytes() > 0).collect();
        if !batch.is_empty() {
            // SAFETY: the first batch reads strided members' elements (device memory of
            // `device`, checked by their placements) into `tmp`; the second reads
            // contiguous members or `tmp` and writes `blocks` runs of `n` bytes at pitch
            // `bytes` inside the fresh send buffer of `blocks × bytes` (every member's `at
            // + n ≤ bytes`); copies of one batch are disjoint, and the batches run in
            // order (each call completes before it returns).
            unsafe { runtime.copy_2d(device, CopyKind::DeviceToDevice, &batch) }?;
        }
    }
    drop(tmp);
    Ok(())
}

// SAFETY: `buffer` is the pinned host copy of the bucket (when staged) or its packed device
// buffer (`Reach::MpiOnly`, direct), each allocated by `stage_bucket` for the bucket's
// `bytes` and owned by this value until it drops; `send_buffer` is the device or host send
// buffer of `blocks` × `bytes` bytes allocated there and owned alike.
unsafe impl StagedBucket for DeviceBucket<'_, '_> {
    fn buffer(&self) -> (*mut u8, Reach) {
        match (&self.host, &self.packed) {
            (Some(h), _) => (h.ptr(), Reach::Host),
            (None, Some(d)) => (d.ptr(), Reach::MpiOnly),
            (None, None) => (std::ptr::null_mut(), Reach::Host),
        }
    }

    fn send_buffer(&self) -> Option<*const u8> {
        self.send.as_ref().map(|(dev, host)| match host {
            Some(h) => h.ptr().cast_const(),
            None => dev.ptr().cast_const(),
        })
    }

    fn repack(&self) -> Result<()> {
        if self.send.is_some() {
            return Err(Error::TransportUnavailable {
                transport: "planned",
                reason: "a device reduce-scatter's send blocks are packed once only (its \
                         plan: not yet)"
                    .into(),
            });
        }
        if self.pack.is_empty() {
            return Ok(());
        }
        // SAFETY: as at the making (`new`): the members' elements (device memory, checked
        // by their placements; the plan keeps them borrowed and compared) into the bucket's
        // own device buffer.
        unsafe {
            self.runtime
                .copy_2d(self.device, CopyKind::DeviceToDevice, &self.pack)
        }?;
        if let (Some(h), Some(d)) = (&self.host, &self.packed) {
            // SAFETY: both hold at least `bytes` bytes of their memory.
            unsafe {
                self.runtime
                    .copy_to_host(self.device, h.ptr(), d.ptr().cast(), self.bytes)
            }?;
        }
        Ok(())
    }

    fn unpack(&self) -> Result<()> {
        if self.unpack.is_empty() {
            return Ok(());
        }
        if let (Some(h), Some(d)) = (&self.host, &self.packed) {
            // SAFETY: both hold at least `bytes` bytes of their memory.
            unsafe {
                self.runtime
                    .copy_to_device(self.device, d.ptr().cast(), h.ptr(), self.bytes)
            }?;
        }
        // SAFETY: each copy reads its bytes of the device bucket and writes a member's
        // elements (checked writable and free of overlap by its placement; members written
        // do not overlap each other, checked by the fused operation).
        unsafe {
            self.runtime
                .copy_2d(self.device, CopyKind::DeviceToDevice, &self.unpack)
        }
    }
}
