//! The parted point-to-point message: how [`super::DeviceComm`] sends a large staged tensor
//! in parts, so that the device → host copy of one part overlaps the transfer of the last.
//!
//! **When.** [`DeviceComm::send_tensor`](crate::comm::TensorComm::send_tensor) parts a tensor
//! that takes the [staged route](super::Route::Staged), is contiguous, and spans more than
//! `P` bytes, where `P` is [`DeviceComm::pipeline_chunk_bytes`](super::DeviceComm::pipeline_chunk_bytes)
//! ([`DEFAULT_PIPELINE_CHUNK_BYTES`] = 4 MiB unless set; between
//! [`MIN_PIPELINE_CHUNK_BYTES`] and [`MAX_PIPELINE_CHUNK_BYTES`]; 0 turns parting off).
//! Every other send is one ordinary message, as
//! [`TensorComm::send_tensor`](crate::comm::TensorComm::send_tensor) sends it, unchanged.
//!
//! **Wire format (parted-message version [`PIPELINE_VERSION`] = 1).** For a tensor of `n`
//! elements of `e` bytes each (`u` MPI units per element: the lanes of the dtype's row in
//! [`crate::dtype::TABLE`]), let `m = max(1, ⌊P / e⌋)` elements be one part. All messages
//! below go from the same sender, on the same communicator, to the same destination, with
//! the same tag (the caller's); MPI's non-overtaking rule (MPI-4.1 §3.5) keeps them in order.
//!
//! 1. The **part header**: [`PART_HEADER_WORDS`] = 5 words of `MPI_UINT64_T` (40 bytes):
//!    [`PART_HEADER_MAGIC`] (`0x444C_504B_4D50_4950`, "DLPKMPIP"), [`PIPELINE_VERSION`],
//!    `e` (bytes per element), `m` (elements per part), `n` (elements in all).
//! 2. `⌈n / m⌉` **data parts**, part `k = 0, 1, …` carrying elements
//!    `[k·m, min((k+1)·m, n))` in order: `min(m, n − k·m) × u` units of the element's
//!    predefined MPI datatype (a byte count of `min(m, n − k·m) × e` ≥ 1, at most `P`; only
//!    the last part may be shorter). No data part is ever empty.
//! 3. Only when the sender fails partway (its device → host copy of part `k` fails), in place
//!    of part `k` and instead of every later part: the **abort**, two messages — an empty
//!    message (0 units of the element's datatype), then an abort record of
//!    [`ABORT_WORDS`] = 4 words of `MPI_UINT64_T`: [`PART_ABORT_MAGIC`]
//!    (`0x444C_504B_4D50_4941`, "DLPKMPIA"), `k`, `⌈n / m⌉`, a cause code (1: device → host
//!    copy failed; 2: any other sender error).
//!
//! Why these markers. The header is what makes the rest unambiguous: its length (40 bytes)
//! is below every parted message's size (> `P` ≥ [`MIN_PIPELINE_CHUNK_BYTES`]), so a
//! receiver expecting more than [`MIN_PIPELINE_CHUNK_BYTES`] bytes can tell it from the one
//! ordinary message it may get instead (of its own size, or a size that is an error either
//! way), and its magic and version tell it from an ordinary 40-byte message sent by mistake.
//! It carries `m`, so a receiver never has to assume the sender's part size: the two ends
//! may set different `P` (the receiver follows the sender's). The abort is an empty message
//! because only an empty message fits every posted part receive (a longer one would be
//! MPI's truncation error on a short last part) and no data part is empty; an empty
//! message alone is not enough (it says neither which part nor why, and an empty message is
//! also what a peer that does not follow this protocol may send), so the receiver reads it
//! as an abort only inside a parted message whose header it has read, and believes it only
//! when the record with its own magic follows. A separate tag is not used: it would not be
//! ordered with the parts (non-overtaking holds per tag) and could collide with user tags.
//!
//! The sender keeps at most two parts in flight (`MPI_Isend` from two pinned buffers of
//! `m × e` bytes): it copies part `k + 1` to the host while part `k` is sent.
//!
//! **Receiving.** [`DeviceComm::recv_tensor`](crate::comm::TensorComm::recv_tensor) probes the
//! first message (`MPI_Probe`, source and tag as given) when its tensor's elements span
//! more than [`MIN_PIPELINE_CHUNK_BYTES`] bytes in all (`len × e`, any layout, whatever its
//! own `P`): a first message of exactly 40 bytes is received and read as a part header;
//! anything else is received as one ordinary message. The parts are received from the
//! source of the header (so that, with several senders on one tag, parts of two senders
//! never interleave), each posted (`MPI_Irecv`) before the previous one is landed. A
//! contiguous tensor takes them straight into its memory (host memory) or through two
//! pinned buffers of the header's `m × e` bytes (device memory). A strided tensor (any
//! layout `TensorComm` receives: Fortran order, gaps, negative strides) takes them packed,
//! in logical row-major order, then unpacked into its layout by the staging code: into its
//! packed staging buffer when [`DeviceComm`](super::DeviceComm)'s staging packs it (pinned,
//! or device scratch on the direct route; then unpacked on the device), else into a host
//! scratch buffer of `len × e` bytes that the pack kernels (`spec/kernels.rs`)
//! unpack into its host memory or staged span. A strided tensor is left unchanged unless
//! every part arrived (no overlap of copies with parts on that path). The returned status
//! is the header's. So any `DeviceComm` receives from any `DeviceComm` whatever their
//! devices, transports, part sizes and the two tensors' layouts (same dtype and count).
//!
//! **Errors** (receiver). A 40-byte first message without the magic is
//! [`Error::CountMismatch`] (it was an ordinary message of the wrong size; it is consumed,
//! as an ordinary short receive would consume it). A version other than 1, or an `m` of 0,
//! above the header's `n`, or of more than [`MAX_PIPELINE_CHUNK_BYTES`] bytes (`m × e`),
//! is [`Error::BadPartHeader`] naming the field and the sender; the parts that may follow
//! are left unreceived (how many is unknown: the header is not self-consistent). A
//! self-consistent version-1 header that this receive refuses — another `e`
//! ([`Error::BadPartHeader`], field `"element bytes"`) or another `n` than the tensor's
//! ([`Error::CountMismatch`]), or a staging refusal after it (a pinned or scratch
//! allocation) — is **drained** before the error returns: its `⌈n / m⌉` parts are received
//! one at a time into a scratch buffer of at most one part (`m × e` ≤
//! [`MAX_PIPELINE_CHUNK_BYTES`] bytes, grown only to the largest part that arrived) and
//! discarded, as the tensor's datatype when `e` is the tensor's, else as `MPI_BYTE`; an
//! abort among them (empty part, then its record) ends the drain, and a message longer than
//! `m × e` bytes ends it too and is left queued. So the sender's `send_tensor` completes
//! and the next receive on the tag starts at the next message. A lying header (more parts
//! than the peer sends) leaves the receive waiting, as any receive of a message that never
//! comes. Nothing is allocated from a header before these checks, and then at most two
//! parts of at most the tensor's size (or one part, draining). An abort is [`Error::SenderAborted`] naming the sender, the part and the
//! cause: the parts before it were received, the tensor holds them and nothing later. A
//! part of another size than expected is [`Error::CountMismatch`] naming the part (nothing
//! more is copied to the device, and no further part is posted); a part longer than
//! expected is MPI's truncation error. A plain `TensorComm::recv_tensor` sees a parted
//! message as a `CountMismatch` (it receives the 40-byte header, nothing more).
//!
//! **Raw MPI peers.** A raw MPI receiver of a parted message receives the 5-word header,
//! then the parts as above, and must check each part's count for the empty abort part; a
//! raw MPI sender that wants a `DeviceComm` to receive in parts sends the header first (an
//! ordinary message of the tensor's size is received as one message, always). A
//! `DeviceComm` of an earlier release (parts without header) does not interoperate with
//! this one for messages above `P`.
//!
//! **Sender errors.** A device copy that fails after the header went out sends the abort,
//! then returns the copy's error to the sender; the receiver returns
//! [`Error::SenderAborted`]. Neither waits for a part that will never come. A receiver whose
//! host → device copy fails keeps receiving the remaining parts (into its pinned buffers,
//! copying no more), so the sender completes, and then returns the copy's error.

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
/// Smallest part size (64 KiB; a smaller non-zero setting is raised to it): every parted
/// message is larger, so a receive tensor of at most this many bytes is never parted, and
/// the 40-byte part header is never the size of a message a probing receiver expects.
pub const MIN_PIPELINE_CHUNK_BYTES: usize = 64 << 10;
/// Part header word 0: ASCII "DLPKMPIP" as a big-endian `u64`.
pub const PART_HEADER_MAGIC: u64 = 0x444C_504B_4D50_4950;
/// Abort record word 0: ASCII "DLPKMPIA" as a big-endian `u64`.
pub const PART_ABORT_MAGIC: u64 = 0x444C_504B_4D50_4941;
/// Part header word 1: the parted-message version this module writes and reads.
pub const PIPELINE_VERSION: u64 = 1;
/// Words (`MPI_UINT64_T`) of a part header: magic, version, `e`, `m`, `n`.
pub const PART_HEADER_WORDS: usize = 5;
/// Words (`MPI_UINT64_T`) of an abort record: magic, part, parts, cause code.
pub const ABORT_WORDS: usize = 4;
/// Abort cause code: the sender's device → host copy failed.
const CAUSE_COPY: u64 = 1;
/// Abort cause code: any other sender error.
const CAUSE_OTHER: u64 = 2;

/// The abort cause code's meaning.
fn cause_text(code: u64) -> &'static str {
    match code {
        CAUSE_COPY => "its device -> host copy failed",
        CAUSE_OTHER => "a sender error",
        _ => "an unknown cause code",
    }
}

/// `usize` → `u64` for wire words (lossless on every supported target).
fn word(x: usize) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

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
            && p.facts.is_contiguous()
            && self.part_bytes > 0
            && p.facts.span_bytes() > self.part_bytes
    }

    /// `m`, the elements of one part.
    fn part_elems(&self, elem_bytes: usize) -> usize {
        (self.part_bytes / elem_bytes.max(1)).max(1)
    }

    /// The two pinned buffers of one part of `part` elements each.
    ///
    /// # Errors
    /// As the runtime's pinned allocation.
    pub(super) fn part_buffers(
        &self,
        element: ElementType,
        part: usize,
    ) -> Result<PartBuffers<'a, 'r>> {
        // part × e ≤ MAX_PIPELINE_CHUNK_BYTES (sender: P ≤ MAX; receiver: header checked).
        let bytes = part * element.size_bytes();
        Ok([self.pool.take(bytes)?, self.pool.take(bytes)?])
    }

    /// For a receive of `total` contiguous elements of `element` (more than
    /// [`MIN_PIPELINE_CHUNK_BYTES`]): probes the first message; when it is 40 bytes long,
    /// receives it as a part header and returns its status and the sender's `m`.
    /// `Ok(None)`: the first message is one ordinary message (left unreceived).
    ///
    /// # Errors
    /// See the module docs: [`Error::CountMismatch`] (no magic, or another `n`),
    /// [`Error::BadPartHeader`]; after a self-consistent header, the parts are drained
    /// ([`Pipe::drain`]) before either returns.
    pub(super) fn recv_part_header(
        &self,
        source: Rank,
        tag: Tag,
        total: usize,
        element: ElementType,
    ) -> Result<Option<(Status, usize)>> {
        let status = self.comm.process_at_rank(source).probe_with_tag(tag);
        let header_bytes = PART_HEADER_WORDS * 8;
        if usize::try_from(status.count(u8::equivalent_datatype())).ok() != Some(header_bytes) {
            return Ok(None);
        }
        let sender = status.source_rank();
        let mut w = [0u64; PART_HEADER_WORDS];
        self.comm
            .process_at_rank(sender)
            .receive_into_with_tag(&mut w[..], tag);
        let e = element.size_bytes();
        let as_elems = |x: u64| i64::try_from(x).unwrap_or(i64::MAX);
        if w[0] != PART_HEADER_MAGIC {
            return Err(Error::CountMismatch {
                what: format!(
                    "pipelined receive from rank {sender}: a {header_bytes}-byte message \
                     that is not a part header (magic {:#x})",
                    w[0]
                ),
                expected: as_elems(word(total)),
                actual: as_elems(word(header_bytes / e)),
            });
        }
        let bad = |field, value, reason| Error::BadPartHeader {
            rank: sender,
            field,
            value,
            reason,
        };
        if w[1] != PIPELINE_VERSION {
            return Err(bad("version", w[1], "this library reads version 1"));
        }
        // Self-consistency first (the parts that follow are known only from a consistent
        // header): 1 ≤ m ≤ n, m × e ≤ MAX_PIPELINE_CHUNK_BYTES, e ≥ 1.
        let consistent = usize::try_from(w[3]).ok().filter(|&m| {
            m >= 1
                && w[3] <= w[4]
                && w[2] >= 1
                && usize::try_from(w[2])
                    .ok()
                    .and_then(|he| m.checked_mul(he))
                    .is_some_and(|b| b <= MAX_PIPELINE_CHUNK_BYTES)
        });
        let Some(part) = consistent else {
            return Err(bad(
                "part elements",
                w[3],
                "0, above the message's elements, or parts above MAX_PIPELINE_CHUNK_BYTES",
            ));
        };
        // Consistent: a refusal from here on receives the parts first (module docs).
        let refused = if w[2] != word(e) {
            bad(
                "element bytes",
                w[2],
                "differs from the receive tensor's element size",
            )
        } else if w[4] != word(total) {
            Error::CountMismatch {
                what: format!("pipelined receive: part header from rank {sender}"),
                expected: as_elems(word(total)),
                actual: as_elems(w[4]),
            }
        } else {
            return Ok(Some((status, part)));
        };
        // Both fit usize: m × e does (checked above), so e does; n's parts are counted in u64.
        let he = usize::try_from(w[2]).unwrap_or(usize::MAX);
        let known = (w[2] == word(e)).then_some(element);
        self.drain(sender, tag, (part, w[4], he), known);
        Err(refused)
    }

    /// Receives and discards the `⌈n / m⌉` parts of a parted message whose consistent
    /// header (`m` elements per part, `n` in all, `e` bytes each) this receive refused, one
    /// part at a time into a scratch buffer of at most one part (`m × e` ≤
    /// [`MAX_PIPELINE_CHUNK_BYTES`] bytes, grown to the largest part that arrived), so that
    /// the sender completes and the tag's queue holds nothing of the message. Each part is
    /// received as `element`'s datatype when the header's `e` is the receive tensor's, else
    /// as `MPI_BYTE` (its bytes are discarded). Stops early at the sender's abort (the empty
    /// part and its record are received) and at a message longer than a part (not a part of
    /// this message: left queued).
    pub(super) fn drain(
        &self,
        source: Rank,
        tag: Tag,
        (part, n, e): (usize, u64, usize),
        element: Option<ElementType>,
    ) {
        let from = self.comm.process_at_rank(source);
        let part_bytes = part * e; // ≤ MAX_PIPELINE_CHUNK_BYTES (checked by the caller).
        let (datatype, unit_bytes) = match element {
            Some(el) => (
                el.row.unit.datatype().as_raw(),
                el.size_bytes() / el.units_per_element(),
            ),
            None => (u8::equivalent_datatype().as_raw(), 1),
        };
        let parts = n.div_ceil(word(part));
        let mut scratch: Vec<u8> = Vec::new();
        let mut k = 0u64;
        while k < parts {
            let status = from.probe_with_tag(tag);
            let bytes = usize::try_from(status.count(u8::equivalent_datatype())).unwrap_or(0);
            if bytes > part_bytes {
                return;
            }
            if bytes == 0 {
                // The sender's abort: the empty part, then (if it follows) its record.
                let mut empty: [u8; 0] = [];
                from.receive_into_with_tag(&mut empty[..], tag);
                let k = usize::try_from(k).unwrap_or(usize::MAX);
                let _ = self.read_abort(source, tag, k, k.saturating_add(1), 0);
                return;
            }
            if scratch.len() < bytes {
                scratch.resize(bytes, 0);
            }
            // SAFETY: the scratch holds `bytes` bytes = bytes / unit_bytes units of the
            // datatype, and is not touched until the request is waited for (next line).
            let posted = unsafe {
                raw::irecv(
                    scratch.as_mut_ptr(),
                    bytes / unit_bytes.max(1),
                    datatype,
                    source,
                    tag,
                    self.comm.as_raw(),
                )
            };
            let Ok(req) = posted else {
                return;
            };
            raw::wait(&mut Some(req));
            k += 1;
        }
    }

    /// Sends the staged tensor placed at `p` in parts: the part header, then the parts,
    /// part k + 1 copied to the host while part k is in flight; on a failure after the
    /// header, the abort (module docs) and then the failure.
    pub(super) fn send_parts(&self, p: &Placement, dest: Rank, tag: Tag) -> Result<()> {
        let runtime = self.runtime.ok_or_else(no_runtime_error)?;
        let x = &p.facts;
        let elem = x.element.size_bytes();
        let part = self.part_elems(elem);
        let bufs = self.part_buffers(x.element, part)?;
        // The elements of a contiguous tensor (`parts_send`): its span is len_elems × elem
        // bytes, checked to fit usize when the facts were made.
        let total = x.span_bytes() / elem;
        let header = [
            PART_HEADER_MAGIC,
            PIPELINE_VERSION,
            word(elem),
            word(part),
            word(total),
        ];
        let to = self.comm.process_at_rank(dest);
        to.send_with_tag(&header[..], tag);
        let mut reqs: [Option<raw::Request>; 2] = [None, None];
        let mut failed = None;
        let mut k = 0;
        while k * part < total {
            let i = k % 2;
            raw::wait(&mut reqs[i]);
            let n = part.min(total - k * part);
            // SAFETY: part k of the contiguous device span; the buffer holds part × elem
            // bytes and no request uses it (waited above).
            let copied = unsafe {
                runtime.copy_to_host(
                    p.device,
                    bufs[i].ptr(),
                    (x.first as usize + k * part * elem) as *const c_void,
                    n * elem,
                )
            };
            let sent = copied.map_err(|e| (CAUSE_COPY, e)).and_then(|()| {
                // SAFETY: the buffer holds n elements and stays untouched until the request
                // is waited for (next use of buffer i, or below).
                unsafe { self.isend_part(bufs[i].ptr(), n, x.element, dest, tag) }
                    .map_err(|e| (CAUSE_OTHER, e))
            });
            match sent {
                Ok(req) => reqs[i] = Some(req),
                Err(f) => {
                    failed = Some((k, f));
                    break;
                }
            }
            k += 1;
        }
        for r in &mut reqs {
            raw::wait(r);
        }
        let Some((k, (cause, error))) = failed else {
            return Ok(());
        };
        // The abort: an empty part, then the record (module docs).
        let empty: [u8; 0] = [];
        to.send_with_tag(&empty[..], tag);
        let record = [PART_ABORT_MAGIC, word(k), word(total.div_ceil(part)), cause];
        to.send_with_tag(&record[..], tag);
        Err(error)
    }

    /// `MPI_Isend` of `n` elements of `element` from `buf`.
    ///
    /// # Safety
    /// As [`raw::isend`]: `buf` holds `n` elements and is untouched until the request is
    /// waited for.
    unsafe fn isend_part(
        &self,
        buf: *const u8,
        n: usize,
        element: ElementType,
        dest: Rank,
        tag: Tag,
    ) -> Result<raw::Request> {
        let datatype = element.row.unit.datatype().as_raw();
        // SAFETY: the caller's contract.
        unsafe {
            raw::isend(
                buf,
                n * element.units_per_element(),
                datatype,
                dest,
                tag,
                self.comm.as_raw(),
            )
        }
    }

    /// Whether part `k` of `parts` (of `len` elements) arrived whole: `arrived` units of
    /// `element`'s datatype (`None`: nothing posted; negative: MPI_UNDEFINED).
    ///
    /// # Errors
    /// [`Error::SenderAborted`] for an empty part (no data part is empty: the sender's
    /// abort, module docs); [`Error::CountMismatch`] naming the part for another size (the
    /// sender's tensor differs from this one).
    fn check_part(
        &self,
        arrived: Option<i64>,
        (k, parts, len): (usize, usize, usize),
        element: ElementType,
        source: Rank,
        tag: Tag,
    ) -> Result<()> {
        if arrived == Some(0) {
            return Err(self.read_abort(source, tag, k, parts, len));
        }
        if arrived.and_then(|u| usize::try_from(u).ok()) == Some(len * element.units_per_element())
        {
            return Ok(());
        }
        Err(Error::CountMismatch {
            what: format!("pipelined receive, part {k} of {parts}"),
            // len ≤ total, the receive tensor's i64 element count: never saturates.
            expected: i64::try_from(len).unwrap_or(i64::MAX),
            actual: arrived.map_or(-1, |u| u / element.units_per_element_i64()),
        })
    }

    /// After an empty part `k` of `parts` from `source`: receives the abort record and
    /// returns [`Error::SenderAborted`]; without a record, the empty part's
    /// [`Error::CountMismatch`] (the next message is left unreceived).
    fn read_abort(&self, source: Rank, tag: Tag, k: usize, parts: usize, expected: usize) -> Error {
        let from = self.comm.process_at_rank(source);
        let status = from.probe_with_tag(tag);
        if usize::try_from(status.count(u64::equivalent_datatype())).ok() == Some(ABORT_WORDS) {
            let mut w = [0u64; ABORT_WORDS];
            from.receive_into_with_tag(&mut w[..], tag);
            if w[0] == PART_ABORT_MAGIC {
                return Error::SenderAborted {
                    rank: source,
                    part: w[1],
                    parts: w[2],
                    cause: cause_text(w[3]),
                };
            }
        }
        Error::CountMismatch {
            what: format!("pipelined receive, part {k} of {parts} (empty, and no abort record)"),
            expected: i64::try_from(expected).unwrap_or(i64::MAX),
            actual: 0,
        }
    }

    /// Receives the parts of a parted message whose header was received as `header` (its
    /// status) and gave `part` elements per part: `total` elements of `element` into the
    /// contiguous tensor whose first element is at `base` (host memory when `staged` is
    /// `None`; else device memory of the placement, landing through the two pinned buffers
    /// of `part` elements). Part k + 1 is posted before part k is copied.
    #[allow(clippy::too_many_arguments)] // the receive's parts, each needed once
    pub(super) fn recv_parts(
        &self,
        staged: Option<(&Placement, PartBuffers<'_, '_>)>,
        base: usize,
        total: usize,
        element: ElementType,
        tag: Tag,
        (header, part): (Status, usize),
    ) -> Result<Status> {
        // Fix the sender: parts from another source must not interleave.
        let source = header.source_rank();
        let elem = element.size_bytes();
        let upe = element.units_per_element();
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
        let mut copy_failed = None;
        for k in 0..parts {
            if result.is_err() {
                break;
            }
            let i = k % 2;
            let arrived = raw::wait_count(&mut reqs[i], datatype);
            result = self.check_part(arrived, (k, parts, len(k)), element, source, tag);
            if result.is_err() {
                break;
            }
            if k + 1 < parts {
                result = post(k + 1).map(|r| reqs[(k + 1) % 2] = Some(r));
            }
            let copying = copy_failed.is_none() && result.is_ok();
            if let (Some((p, b)), Some(rt), true) = (&staged, self.runtime, copying) {
                // SAFETY: part k of the contiguous device span; buffer i holds it and no
                // request writes buffer i now (part k+1 went to the other one).
                copy_failed = unsafe {
                    rt.copy_to_device(
                        p.device,
                        (p.facts.first as usize + k * part * elem) as *mut c_void,
                        b[i].ptr(),
                        len(k) * elem,
                    )
                }
                .err();
            }
        }
        for r in &mut reqs {
            raw::wait(r);
        }
        // A failed copy to the device ends the copies, not the receives: the remaining
        // parts are received (into the pinned buffers) so that the sender is not left
        // waiting on them, then the copy's error is returned.
        result.and(copy_failed.map_or(Ok(header), Err))
    }
}
