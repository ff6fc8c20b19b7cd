//! The parted point-to-point message: how [`super::DeviceComm`] sends a large staged tensor
//! in parts, so that the device → host copy of one part overlaps the transfer of the last.
//!
//! **When.** [`DeviceComm::send_tensor`](super::DeviceComm::send_tensor) parts a tensor
//! that takes the [staged route](super::Route::Staged), is contiguous, and spans more than
//! `P` bytes, where `P` is [`DeviceComm::pipeline_chunk_bytes`](super::DeviceComm::pipeline_chunk_bytes)
//! ([`DEFAULT_PIPELINE_CHUNK_BYTES`] = 4 MiB unless set; at most
//! [`MAX_PIPELINE_CHUNK_BYTES`]; 0 turns parting off). Every other send is one ordinary
//! message, as [`TensorComm::send_tensor`](crate::comm::TensorComm::send_tensor) sends it.
//!
//! **Wire format.** For a tensor of `n` elements of `e` bytes each (`u` MPI units per
//! element: the lanes of the dtype's row in [`crate::dtype::TABLE`]), let
//! `m = max(1, ⌊P / e⌋)` elements be one part. The message is `⌈n / m⌉` point-to-point
//! messages, part `k = 0, 1, …` carrying elements `[k·m, min((k+1)·m, n))` in order:
//!
//! - each part is `min(m, n − k·m) × u` units of the element's predefined MPI datatype
//!   (a byte count of `min(m, n − k·m) × e`, at most `P`; only the last part may be
//!   shorter);
//! - all parts go from the same sender, on the same communicator, to the same destination,
//!   with the same tag (the caller's);
//! - there is no header and no trailer: the parts are the elements, nothing else. MPI's
//!   non-overtaking rule (MPI-4.1 §3.5) keeps the parts of one sender and tag in order.
//!
//! The sender keeps at most two parts in flight (`MPI_Isend` from two pinned buffers of
//! `m × e` bytes): it copies part `k + 1` to the host while part `k` is sent.
//!
//! **Receiving.** [`DeviceComm::recv_tensor`](super::DeviceComm::recv_tensor) probes the
//! first message (`MPI_Probe`, source and tag as given) when its tensor is contiguous and
//! larger than `P` bytes: a first message of exactly `m × u` units is read as part 0 of a
//! parted message, anything else as one ordinary message. The remaining parts are received
//! from the source of the first (so that, with `MPI_ANY_SOURCE`, parts of two senders never
//! interleave), each posted (`MPI_Irecv`) before the previous one is copied to the device,
//! straight into the tensor for host memory or through two pinned buffers for device memory.
//! The returned status is part 0's. So any `DeviceComm` receives from any `DeviceComm`
//! whatever their devices and transports, as long as both use the same `P`.
//!
//! **Errors.** A part of another size than expected is [`Error::CountMismatch`] naming the
//! part (nothing more is copied to the device, and no further part is posted); a part
//! longer than expected is MPI's truncation error. A plain `TensorComm::recv_tensor` sees a parted message as a
//! `CountMismatch` (nothing is received). One ambiguity remains: a single message exactly
//! one part long, sent to a receive tensor larger than one part, is taken for part 0 of a
//! parted message — sizes must agree, as for any MPI receive. A device copy that fails after
//! some parts went out returns the error to the sender, and the receiver keeps waiting for
//! the missing parts (a CUDA failure in the middle of a message cannot be announced to the
//! peer without a protocol of its own).

use std::ffi::c_void;

use mpi::point_to_point::Status;
use mpi::raw::AsRaw;
use mpi::topology::{Communicator, Rank};
use mpi::traits::*;
use mpi::Tag;

use super::pool::{PinnedBuf, PinnedPool};
use super::route::{no_runtime_error, Route};
use super::stage::Placement;
use crate::dtype::ElementType;
use crate::error::{Error, Result};
use crate::raw;
use crate::runtime::DeviceRuntime;

/// Default part size of pipelined staged point-to-point messages, in bytes.
pub const DEFAULT_PIPELINE_CHUNK_BYTES: usize = 4 << 20;
/// Largest part size accepted (so that a part's count always fits MPI's `int`).
pub const MAX_PIPELINE_CHUNK_BYTES: usize = 1 << 30;

/// What the parted protocol works with: the communicator, the runtime and pool of the
/// staging copies, and the part size `P` in bytes (0: off).
pub(super) struct Pipe<'a, 'r, C: Communicator + ?Sized> {
    pub(super) comm: &'a C,
    pub(super) runtime: Option<&'r dyn DeviceRuntime>,
    pub(super) pool: &'a PinnedPool<'r>,
    pub(super) part_bytes: usize,
}

/// The two pinned part buffers of a staged parted transfer.
pub(super) type PartBuffers<'p, 'r> = [PinnedBuf<'p, 'r>; 2];

impl<'a, 'r, C: Communicator + ?Sized> Pipe<'a, 'r, C> {
    /// Whether a send of this placement goes out in parts.
    pub(super) fn parts_send(&self, p: &Placement) -> bool {
        p.route == Route::Staged
            && p.extent.contiguous
            && self.part_bytes > 0
            && p.extent.span_bytes > self.part_bytes
    }

    /// `m`, the elements of one part.
    fn part_elems(&self, elem_bytes: usize) -> usize {
        (self.part_bytes / elem_bytes.max(1)).max(1)
    }

    /// The two pinned buffers of one part each.
    ///
    /// # Errors
    /// As the runtime's pinned allocation.
    pub(super) fn part_buffers(&self, element: ElementType) -> Result<PartBuffers<'a, 'r>> {
        let bytes = self.part_elems(element.size_bytes()) * element.size_bytes();
        Ok([self.pool.take(bytes)?, self.pool.take(bytes)?])
    }

    /// For a receive of `bytes` contiguous bytes of `element`: probes the first message and
    /// returns its status when it is part 0 of a parted message.
    pub(super) fn probe_parted(
        &self,
        source: Rank,
        tag: Tag,
        bytes: usize,
        element: ElementType,
    ) -> Option<Status> {
        if self.part_bytes == 0 || bytes <= self.part_bytes {
            return None;
        }
        let status = self.comm.process_at_rank(source).probe_with_tag(tag);
        let part_units = self.part_elems(element.size_bytes()) * element.units_per_element();
        // A negative count (MPI_UNDEFINED) is no part 0.
        usize::try_from(status.count(element.row.unit.datatype()))
            .is_ok_and(|units| units == part_units)
            .then_some(status)
    }

    /// Sends the staged tensor placed at `p` in parts: part k + 1 is copied to the host
    /// while part k is in flight.
    pub(super) fn send_parts(&self, p: &Placement, dest: Rank, tag: Tag) -> Result<()> {
        let runtime = self.runtime.ok_or_else(no_runtime_error)?;
        let x = &p.extent;
        let elem = x.element.size_bytes();
        let part = self.part_elems(elem);
        let bufs = self.part_buffers(x.element)?;
        let datatype = x.element.row.unit.datatype().as_raw();
        let upe = x.element.units_per_element();
        // The elements of a contiguous extent (`parts_send`): its span is len_elems × elem
        // bytes, checked to fit usize when the extent was made.
        let total = x.span_bytes / elem;
        let mut reqs: [Option<raw::Request>; 2] = [None, None];
        let mut result = Ok(());
        let mut k = 0;
        while k * part < total {
            let i = k % 2;
            raw::wait(&mut reqs[i]);
            let n = part.min(total - k * part);
            // SAFETY: part k of the contiguous device span; the buffer holds part × elem
            // bytes and no request uses it (waited above).
            let sent = unsafe {
                runtime.copy_to_host(
                    p.device,
                    bufs[i].ptr(),
                    (x.first + k * part * elem) as *const c_void,
                    n * elem,
                )
            }
            // SAFETY: the buffer holds n elements (n × upe units) and stays untouched until
            // the request is waited for (next use of buffer i, or below).
            .and_then(|()| unsafe {
                raw::isend(
                    bufs[i].ptr(),
                    n * upe,
                    datatype,
                    dest,
                    tag,
                    self.comm.as_raw(),
                )
            });
            match sent {
                Ok(req) => reqs[i] = Some(req),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
            k += 1;
        }
        for r in &mut reqs {
            raw::wait(r);
        }
        result
    }

    /// Receives a parted message whose part 0 was probed as `first_status`: `total`
    /// elements of `element` into the contiguous tensor whose first element is at `base`
    /// (host memory when `staged` is `None`; else device memory of the placement, landing
    /// through the two pinned buffers). Part k + 1 is posted before part k is copied.
    pub(super) fn recv_parts(
        &self,
        staged: Option<(&Placement, PartBuffers<'_, '_>)>,
        base: usize,
        total: usize,
        element: ElementType,
        tag: Tag,
        first_status: Status,
    ) -> Result<Status> {
        // Fix the sender: parts from another source must not interleave.
        let source = first_status.source_rank();
        let elem = element.size_bytes();
        let part = self.part_elems(elem);
        let upe = element.units_per_element();
        let upe_i64 = element.units_per_element_i64();
        let datatype = element.row.unit.datatype().as_raw();
        let parts = total.div_ceil(part);
        let len = |k: usize| part.min(total - k * part);
        // Where part k lands: straight into the tensor, or into pinned buffer k % 2.
        let target = |k: usize| -> *mut u8 {
            match &staged {
                Some((_, b)) => b[k % 2].ptr(),
                None => (base + k * part * elem) as *mut u8,
            }
        };
        // SAFETY: the target holds len(k) elements (pinned part buffer, or part k of the
        // contiguous receive tensor, checked writable by the caller); it is not read until
        // the request completes.
        let post = |k: usize| unsafe {
            raw::irecv(
                target(k),
                len(k) * upe,
                datatype,
                source,
                tag,
                self.comm.as_raw(),
            )
        };
        let mut reqs: [Option<raw::Request>; 2] = [None, None];
        let mut result = post(0).map(|r| reqs[0] = Some(r));
        for k in 0..parts {
            if result.is_err() {
                break;
            }
            let i = k % 2;
            let arrived = raw::wait_count(&mut reqs[i], datatype);
            // A negative count (MPI_UNDEFINED) matches no part.
            if arrived.and_then(|u| usize::try_from(u).ok()) != Some(len(k) * upe) {
                // A part of another size: the sender's tensor differs from this one.
                result = Err(Error::CountMismatch {
                    what: format!("pipelined receive, part {k} of {parts}"),
                    // len(k) ≤ total, the receive tensor's i64 element count: never saturates.
                    expected: i64::try_from(len(k)).unwrap_or(i64::MAX),
                    actual: arrived.map_or(-1, |u| u / upe_i64),
                });
                break;
            }
            if k + 1 < parts {
                result = post(k + 1).map(|r| reqs[(k + 1) % 2] = Some(r));
            }
            if let (Some((p, b)), Some(rt), true) = (&staged, self.runtime, result.is_ok()) {
                // SAFETY: part k of the contiguous device span; buffer i holds it and no
                // request writes buffer i now (part k+1 went to the other one).
                result = unsafe {
                    rt.copy_to_device(
                        p.device,
                        (p.extent.first + k * part * elem) as *mut c_void,
                        b[i].ptr(),
                        len(k) * elem,
                    )
                };
            }
        }
        for r in &mut reqs {
            raw::wait(r);
        }
        result.map(|()| first_status)
    }
}
