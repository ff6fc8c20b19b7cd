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
    /// The device-to-device copies from `packed` into the members this rank unpacks.
    unpack: Vec<Copy2d>,
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
    /// ([`bucket_route`]).
    ///
    /// # Errors
    /// As [`copies_of`] (before any allocation or copy); allocation and copy errors.
    pub(super) fn new(
        members: &[PlacedMember],
        (bytes, device, route): (usize, Device, Route),
        pool: &'p PinnedPool<'r>,
        runtime: Option<&'r dyn DeviceRuntime>,
    ) -> Result<Self> {
        let runtime = runtime.ok_or_else(no_runtime_error)?;
        let packed = match bytes {
            0 => None,
            _ => Some(pool.take_device(device, bytes)?),
        };
        let base = packed.as_ref().map_or(std::ptr::null_mut(), PinnedBuf::ptr);
        let (mut pack, mut unpack) = (Vec::new(), Vec::new());
        for m in members.iter().filter(|_| bytes > 0) {
            let at = base.wrapping_add(m.at);
            if let Some(p) = &m.pack {
                pack.extend(copies_of(p, m.index, at, Direction::Pack)?);
            }
            if let Some(p) = &m.unpack {
                unpack.extend(copies_of(p, m.index, at, Direction::Unpack)?);
            }
        }
        pack.retain(|c| c.bytes() > 0);
        unpack.retain(|c| c.bytes() > 0);
        if !pack.is_empty() {
            // SAFETY: each copy reads a member's elements (device memory of `device`: the
            // placement checked the pointer, the layout arithmetic the span) and writes its
            // own bytes of the fresh device bucket; members packed do not overlap the bucket.
            unsafe { runtime.copy_2d(device, CopyKind::DeviceToDevice, &pack) }?;
        }
        let host = match (route, &packed) {
            (Route::Staged, Some(dev)) => {
                let host = pool.take(bytes)?;
                if !pack.is_empty() {
                    // SAFETY: `dev` holds `bytes` device bytes, `host` at least `bytes`.
                    unsafe { runtime.copy_to_host(device, host.ptr(), dev.ptr().cast(), bytes) }?;
                }
                Some(host)
            }
            _ => None,
        };
        Ok(DeviceBucket {
            runtime,
            device,
            bytes,
            packed,
            host,
            unpack,
        })
    }
}

impl StagedBucket for DeviceBucket<'_, '_> {
    fn buffer(&self) -> (*mut u8, Reach) {
        match (&self.host, &self.packed) {
            (Some(h), _) => (h.ptr(), Reach::Host),
            (None, Some(d)) => (d.ptr(), Reach::MpiOnly),
            (None, None) => (std::ptr::null_mut(), Reach::Host),
        }
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
