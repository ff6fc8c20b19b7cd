//! Self-describing messages: an optional checked protocol on top of point-to-point.
//!
//! A plain message carries only bytes; the receiver has to know the dtype and shape. Under
//! this protocol the sender first sends a small **header** describing the tensor and then the
//! **payload** (the tensor's elements, in logical row-major order, exactly as
//! [`TensorComm::send_tensor`] sends them). The receiver either checks its own tensor against
//! the header ([`recv_into`]) or allocates a tensor of the described dtype and shape
//! ([`recv_new`]). Both sides work on every rsmpi [`Communicator`].
//!
//! # Wire format (protocol version 1)
//!
//! Two messages from the sender to the receiver, on the **same communicator and tag**; MPI's
//! non-overtaking rule (MPI-4.1 §3.5) keeps them in order.
//!
//! 1. The header: `4 + ndim` words of `MPI_UINT64_T` (so `32 + 8·ndim` bytes; the length is
//!    the MPI message length, read with `MPI_Probe`/`MPI_Get_count`):
//!
//!    | word | contents |
//!    | --- | --- |
//!    | 0 | [`MAGIC`] (`0x444C_504B_4D50_4943`, "DLPKMPIC") |
//!    | 1 | [`PROTOCOL_VERSION`] (`1`) |
//!    | 2 | dtype: `code | bits << 8 | lanes << 16` (DLPack `DLDataType`) |
//!    | 3 | `ndim` |
//!    | 4.. | `shape[0]`, …, `shape[ndim-1]`, in elements (each ≥ 0) |
//!
//!    At most [`MAX_NDIM`] axes. A 0-d tensor has `ndim = 0` and one element.
//! 2. The payload: `Π shape × lanes` units of the dtype's MPI type (see [`crate::dtype`]),
//!    sent by [`TensorComm::send_tensor`] — any layout the sender has (strided included)
//!    arrives in logical row-major order.
//!
//! The header costs one extra small message per tensor: about one small-message latency
//! (figures in `docs/PERFORMANCE.md`, section "Checked protocol").
//!
//! # Mismatches
//!
//! [`recv_into`] compares the header with its tensor: dtype first
//! ([`Error::DtypeMismatch`]), then the element count ([`Error::CountMismatch`]), then the
//! shape ([`Error::ShapesDiffer`]; e.g. `[2, 3]` vs `[3, 2]`). On a mismatch the payload is
//! matched (`MPI_Mprobe`, MPI-4.1 §3.8.2) and returned **held** in [`Error::Unfit`], with
//! that diagnosis inside and the dtype and shape as sent ([`Unreceived::sent_dtype`],
//! [`Unreceived::sent_shape`]): [`Unreceived::recv_new`] receives it into a new tensor of
//! that dtype and shape, [`Unreceived::recv_into`] into a right-sized one; dropping the
//! error receives and discards it. Either way the next message on that tag is the sender's
//! next message and the job goes on; the receive tensor is left untouched. A payload whose
//! size is not the header's is held the same way, with [`Error::CountMismatch`] (payload
//! vs header) inside and no sent dtype or shape; nothing is allocated for it.
//!
//! A message that is not a header's length is held in [`Error::Unfit`] with
//! [`Error::BadHeader`] (field `"length"`) inside; one of a header's length with a wrong
//! magic, version or word is received and refused ([`Error::BadHeader`]); what follows it
//! is not touched, because its size is unknown.
//!
//! # Threads
//!
//! Under `MPI_THREAD_MULTIPLE`, threads of one process may send, or receive, checked
//! messages on the same `(peer, tag)` at once: a lock per (communicator, peer, tag,
//! direction) keeps each header and its payload together, and each part is matched by
//! `MPI_Mprobe`, so every thread gets one whole message, never another thread's payload.
//! A plain [`TensorComm::recv_tensor`] on the same `(source, tag)` at the same time takes
//! no such lock and may take a header or a payload.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use mpi::datatype::Equivalence;
use mpi::point_to_point::Status;
use mpi::topology::{Communicator, Rank};
use mpi::traits::*;
use mpi::Tag;

use crate::comm::{check_peer, recv_matched, unfit, TensorComm};
use crate::device::Device;
use crate::dlpack::{ExportRequest, Exporter, ManagedTensor, Owned, Tensor};
use crate::dtype::{self, AnyBits, DType};
use crate::error::{Error, Matched, Result, Unreceived};
use crate::layout;
use crate::spec::{RecvSpec, SendSpec};

/// Header word 0: ASCII "DLPKMPIC" as a big-endian `u64`.
pub const MAGIC: u64 = 0x444C_504B_4D50_4943;
/// Header word 1: the protocol version this module reads and writes.
pub const PROTOCOL_VERSION: u64 = 1;
/// The most axes a header may describe (a longer message is not a header).
pub const MAX_NDIM: usize = 1024;
/// Header words before the shape.
const FIXED_WORDS: usize = 4;

/// What a header describes: the payload's dtype and logical shape (in elements).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// DLPack dtype of the payload's elements.
    pub dtype: DType,
    /// Extents, outermost first, in elements; empty for a 0-d tensor.
    pub shape: Vec<i64>,
}

impl Header {
    /// The header of `tensor` (its dtype and logical shape).
    pub fn of(tensor: &dyn Tensor) -> Self {
        Header {
            dtype: tensor.dtype(),
            shape: tensor.shape().to_vec(),
        }
    }

    /// The number of elements described (`Π shape`; 1 for a 0-d tensor).
    ///
    /// # Errors
    /// [`Error::InvalidTensor`] for a negative extent; [`Error::Overflow`] when the product
    /// overflows `i64`.
    pub fn len_elems(&self) -> Result<i64> {
        layout::num_elements(&self.shape)
    }

    /// The wire form: `4 + ndim` words (see the module docs).
    ///
    /// # Errors
    /// [`Error::InvalidTensor`] for more than [`MAX_NDIM`] axes or a negative extent.
    pub fn encode(&self) -> Result<Vec<u64>> {
        if self.shape.len() > MAX_NDIM {
            return Err(Error::InvalidTensor {
                field: "ndim".into(),
                value: self.shape.len() as i128,
                reason: "the checked protocol's header describes at most MAX_NDIM (1024) axes",
            });
        }
        let mut words = Vec::with_capacity(FIXED_WORDS + self.shape.len());
        words.extend([
            MAGIC,
            PROTOCOL_VERSION,
            u64::from(self.dtype.code)
                | u64::from(self.dtype.bits) << 8
                | u64::from(self.dtype.lanes) << 16,
            self.shape.len() as u64,
        ]);
        for (axis, &extent) in self.shape.iter().enumerate() {
            let word = u64::try_from(extent).map_err(|_| Error::InvalidTensor {
                field: format!("shape[{axis}]"),
                value: i128::from(extent),
                reason: "extents must be non-negative",
            })?;
            words.push(word);
        }
        Ok(words)
    }

    /// Reads a header from its wire form.
    ///
    /// # Errors
    /// [`Error::BadHeader`] naming the field: fewer than 4 words (`"length"`), wrong
    /// `"magic"`, unknown `"version"`, a `"dtype"` word with bits above 32, an `"ndim"` that
    /// does not match the length, an extent above `i64::MAX` (`"shape"`).
    pub fn decode(words: &[u64]) -> Result<Self> {
        let bad = |field, value: u64, reason| Error::BadHeader {
            field,
            value,
            reason,
        };
        if words.len() < FIXED_WORDS {
            return Err(bad(
                "length",
                words.len() as u64,
                "a header has at least 4 words",
            ));
        }
        if words[0] != MAGIC {
            return Err(bad(
                "magic",
                words[0],
                "not a checked-protocol header (magic 0x444c504b4d504943 expected)",
            ));
        }
        if words[1] != PROTOCOL_VERSION {
            return Err(bad("version", words[1], "this library reads version 1"));
        }
        let d = words[2];
        if d >> 32 != 0 {
            return Err(bad(
                "dtype",
                d,
                "code, bits and lanes take 32 bits (code | bits << 8 | lanes << 16)",
            ));
        }
        // `d < 2^32` (checked above): its four low bytes are code, bits and lanes.
        let [code, bits, lanes_lo, lanes_hi, ..] = d.to_le_bytes();
        let dtype = DType {
            code,
            bits,
            lanes: u16::from_le_bytes([lanes_lo, lanes_hi]),
        };
        let ndim = words[3];
        if ndim != (words.len() - FIXED_WORDS) as u64 {
            return Err(bad(
                "ndim",
                ndim,
                "does not match the header length (4 + ndim words)",
            ));
        }
        let shape = words[FIXED_WORDS..]
            .iter()
            .map(|&w| i64::try_from(w).map_err(|_| bad("shape", w, "extent above i64::MAX")))
            .collect::<Result<Vec<i64>>>()?;
        Ok(Header { dtype, shape })
    }
}

/// Sends `tensor` to `dest` with `tag` under the checked protocol: the header, then the
/// payload (all of `tensor`'s elements in logical row-major order; any layout).
///
/// Every check is made before the header leaves, so a refused tensor sends nothing. Both
/// messages are blocking standard-mode sends (`MPI_Send`, MPI-4.1 §3.4): like any such send
/// they may wait for the matching receive, so a rank must not send to itself this way
/// (MPICH blocks even on the small header).
///
/// # Errors
/// [`Error::InvalidRank`], [`Error::InvalidTag`], the errors of [`SendSpec::new`] and of
/// [`Header::encode`].
pub fn send<C: Communicator + ?Sized>(
    comm: &C,
    dest: Rank,
    tag: Tag,
    tensor: &dyn Tensor,
) -> Result<()> {
    check_peer(comm, dest, tag)?;
    SendSpec::new(tensor)?;
    let words = Header::of(tensor).encode()?;
    let lock = pair_lock(comm, dest, tag, true);
    let _both = lock.lock();
    comm.process_at_rank(dest).send_with_tag(&words[..], tag);
    comm.send_tensor(tensor, dest, tag)
}

/// The lock that keeps one checked message's two parts together in this process: one per
/// (communicator, peer, tag, direction). Two threads sending (or receiving) on one
/// `(peer, tag)` under `MPI_THREAD_MULTIPLE` take turns for the header and payload pair, so
/// that neither takes the other's payload. Other pairs never wait on it (a lock shared
/// between pairs could deadlock, one receive waiting for a message that only another
/// pair's progress makes the peer send). The map entry is removed when the last user drops
/// its [`PairLock`], so the map holds only the pairs in use.
fn pair_lock<C: Communicator + ?Sized>(comm: &C, peer: Rank, tag: Tag, sending: bool) -> PairLock {
    // The communicator by its Fortran handle (`MPI_Comm_c2f`, MPI-4.1 §19.3.4): an
    // integer, unique among live communicators, whatever the C handle's type.
    // SAFETY: converts a valid communicator handle; no memory is touched.
    let fortran = unsafe { mpi::ffi::RSMPI_Comm_c2f(comm.as_raw()) };
    let key = (fortran, peer, tag, sending);
    let lock = Arc::clone(pair_locks().entry(key).or_default());
    PairLock { key, lock }
}

type PairKey = (mpi::ffi::RSMPI_Fint, Rank, Tag, bool);

/// The map of [`pair_lock`]s in use, locked.
fn pair_locks() -> MutexGuard<'static, HashMap<PairKey, Arc<Mutex<()>>>> {
    static LOCKS: OnceLock<Mutex<HashMap<PairKey, Arc<Mutex<()>>>>> = OnceLock::new();
    LOCKS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One user's share of a [`pair_lock`]; dropping the last share removes the map entry.
struct PairLock {
    key: PairKey,
    lock: Arc<Mutex<()>>,
}

impl PairLock {
    fn lock(&self) -> MutexGuard<'_, ()> {
        self.lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for PairLock {
    fn drop(&mut self) {
        // Shares are only cloned under the map lock, so with it held a count of 2 (the
        // map's and this one) means no other user: the entry can go.
        let mut map = pair_locks();
        if Arc::strong_count(&self.lock) == 2 {
            map.remove(&self.key);
        }
    }
}

/// Receives the next header from `source` with `tag` (matched by `MPI_Mprobe`). A message
/// that is not a header's length is returned held in [`Error::Unfit`] (with
/// [`Error::BadHeader`] inside).
fn recv_header<C: Communicator + ?Sized>(comm: &C, source: Rank, tag: Tag) -> Result<Header> {
    let matched = Matched::probe(&comm.process_at_rank(source), tag);
    let status = matched.status();
    let words = usize::try_from(status.count(u64::equivalent_datatype()))
        .ok()
        .filter(|w| (FIXED_WORDS..=FIXED_WORDS + MAX_NDIM).contains(w));
    let Some(words) = words else {
        let bad = Error::BadHeader {
            field: "length",
            value: matched.len_bytes(),
            reason: "the next message (length in bytes) is not a checked-protocol header \
                     (32 + 8·ndim bytes, ndim ≤ 1024); it is held unreceived by the error",
        };
        return Err(unfit(bad, matched, None));
    };
    let mut buf = vec![0u64; words];
    matched.receive_into(&mut buf[..]);
    Header::decode(&buf)
}

/// Receives a checked message from `source` with `tag` into `tensor`, which must match the
/// header: same dtype, same number of elements, same shape (any strides; a strided tensor
/// receives in logical row-major order).
///
/// `tensor` is checked as a receive buffer before anything is received (those errors leave
/// both messages unreceived). On a mismatch with the header the payload is held in the
/// error (see the module docs) and `tensor` is untouched.
///
/// # Errors
/// - [`Error::InvalidRank`], [`Error::InvalidTag`], the errors of [`RecvSpec::new`]:
///   nothing received.
/// - [`Error::BadHeader`]: the next message is a header's length but not a header (it was
///   received); [`Error::Unfit`] with [`Error::BadHeader`] inside: it is not a header's
///   length (it is held).
/// - [`Error::Unfit`], holding the payload with the sent dtype and shape, around
///   [`Error::DtypeMismatch`] (`left` = sent, `right` = `tensor`'s),
///   [`Error::CountMismatch`] (`expected` = `tensor`'s elements, `actual` = sent) or
///   [`Error::ShapesDiffer`] (both shapes).
/// - [`Error::Unfit`] around [`Error::UnsupportedDtype`] (a dtype this build cannot
///   receive) or [`Error::CountMismatch`] (`expected` = the header's elements, `actual` =
///   the payload's: the payload is not the size the header gives; nothing is allocated).
pub fn recv_into<C: Communicator + ?Sized>(
    comm: &C,
    source: Rank,
    tag: Tag,
    tensor: &mut dyn Tensor,
) -> Result<Status> {
    check_peer(comm, source, tag)?;
    RecvSpec::new(&mut *tensor)?;
    let lock = pair_lock(comm, source, tag, false);
    let _both = lock.lock();
    let header = recv_header(comm, source, tag)?;
    let payload = matched_payload(comm, source, tag, &header)?;
    if let Err(mismatch) = compare(&header, &*tensor) {
        return Err(unfit(mismatch, payload, Some(sent(&header))));
    }
    recv_matched(tensor, payload, Some(sent(&header)))
}

/// The dtype and shape a header gives, as [`Unreceived`] keeps them.
fn sent(header: &Header) -> (DType, Vec<i64>) {
    (header.dtype, header.shape.clone())
}

/// Matches the payload that follows `header` (`MPI_Mprobe`) and compares its size with the
/// header ([`check_payload`]); one that is not the header's size is returned held in
/// [`Error::Unfit`], with no sent dtype and shape (the header did not describe it).
fn matched_payload<C: Communicator + ?Sized>(
    comm: &C,
    source: Rank,
    tag: Tag,
    header: &Header,
) -> Result<Matched> {
    let matched = Matched::probe(&comm.process_at_rank(source), tag);
    match check_payload(header, &matched) {
        Ok(()) => Ok(matched),
        Err(e) => Err(unfit(e, matched, None)),
    }
}

/// Compares a header with the local tensor: dtype, element count, shape.
fn compare(header: &Header, tensor: &dyn Tensor) -> Result<()> {
    if header.dtype != tensor.dtype() {
        return Err(Error::DtypeMismatch {
            what: "checked message: sent vs receive tensor",
            left: header.dtype,
            right: tensor.dtype(),
        });
    }
    let sent = header.len_elems()?;
    if sent != tensor.num_elements() {
        return Err(Error::CountMismatch {
            what: format!(
                "checked message: sent shape {:?} vs receive tensor shape {:?}",
                header.shape,
                tensor.shape()
            ),
            expected: tensor.num_elements(),
            actual: sent,
        });
    }
    if header.shape != tensor.shape() {
        return Err(Error::ShapesDiffer {
            what: "checked message: sent vs receive tensor",
            sent: header.shape.clone(),
            local: tensor.shape().to_vec(),
        });
    }
    Ok(())
}

/// Compares the size of the matched payload with what `header` describes, before any
/// memory is allocated for it: a header that promises more (or less) than arrives
/// allocates nothing, whatever the promised size. The comparison is in bytes: the
/// payload's exact length (`MPI_Get_elements_x` on bytes, MPI-4.1 §4.1.11, exact above
/// `int`) against the header's elements × element bytes (computed in `u128`, so no
/// header overflows it); no derived datatype is built, so a lying header costs one status
/// query and nothing is cached for it. The payload is not received.
///
/// # Errors
/// [`Error::UnsupportedDtype`], [`Error::Overflow`] (an element count that overflows
/// `i64`, or a payload above `isize::MAX` bytes) for headers this build cannot receive;
/// [`Error::CountMismatch`] (the header's elements vs the payload's whole elements) when
/// the sizes differ.
fn check_payload(header: &Header, payload: &Matched) -> Result<()> {
    let element = dtype::lookup(header.dtype)?;
    let elems = header.len_elems()?;
    let size = element.size_bytes();
    let element_bytes = size as u128;
    // A payload above isize::MAX bytes fits no allocation and no MPI_Aint: refused before
    // any MPI call. `elems` is ≥ 0 (layout::num_elements refuses negative extents) and
    // both factors are below 2^64, so the product fits u128.
    let bytes = u128::from(elems.unsigned_abs()) * element_bytes;
    if bytes > isize::MAX as u128 {
        return Err(Error::Overflow {
            quantity: "checked message payload bytes (above isize::MAX)",
            lhs: i128::from(elems),
            operator: "*",
            rhs: size as i128,
        });
    }
    let sent = payload.len_bytes();
    if u128::from(sent) == bytes {
        return Ok(());
    }
    Err(Error::CountMismatch {
        what: format!(
            "checked message: payload ({sent} bytes) vs its header (dtype {}, shape {:?})",
            header.dtype, header.shape
        ),
        expected: elems,
        actual: i64::try_from(u128::from(sent) / element_bytes.max(1)).unwrap_or(i64::MAX),
    })
}

/// Receives a checked message from `source` with `tag` into a new tensor of the dtype and
/// shape its header describes.
///
/// The payload is matched (`MPI_Mprobe`) and its size compared with the header before any
/// memory is allocated, so a header that promises more than arrives allocates nothing.
///
/// # Errors
/// [`Error::MpiLibraryMismatch`] ([`crate::mpi_library::ensure_matching`]);
/// [`Error::InvalidRank`], [`Error::InvalidTag`]; [`Error::BadHeader`] (next message is not a
/// header; held in [`Error::Unfit`] when not a header's length); [`Error::Unfit`] holding
/// the payload around [`Error::UnsupportedDtype`] (a dtype this build cannot receive, e.g.
/// sub-byte), [`Error::CountMismatch`] (the payload is not the size the header gives) or
/// [`Error::Overflow`] (a shape whose byte size overflows or exceeds `isize::MAX`).
///
/// # Examples
/// ```no_run
/// use dlpack_mpi::checked;
/// use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned};
/// let universe = mpi::initialize().unwrap();
/// let world = universe.world();
/// use mpi::traits::*;
/// if world.rank() == 0 {
///     let x = Owned::new(vec![1.0f32; 6]).with_shape(&[2, 3])?;
///     checked::send(&world, 1, 0, &acquire(&x, &AcquireOptions::default())?)?;
/// } else if world.rank() == 1 {
///     let mut r = checked::recv_new(&world, 0, 0)?;
///     assert_eq!(r.shape(), &[2, 3]);
///     assert_eq!(r.to_vec::<f32>()?, vec![1.0; 6]);
/// }
/// # Ok::<(), dlpack_mpi::Error>(())
/// ```
pub fn recv_new<C: Communicator + ?Sized>(comm: &C, source: Rank, tag: Tag) -> Result<Received> {
    // No tensor of the caller's, whose facts would check the MPI library before the header.
    crate::mpi_library::ensure_matching()?;
    check_peer(comm, source, tag)?;
    let lock = pair_lock(comm, source, tag, false);
    let _both = lock.lock();
    let header = recv_header(comm, source, tag)?;
    let payload = matched_payload(comm, source, tag, &header)?;
    into_new(&header, payload)
}

/// Allocates the tensor `header` describes and receives the matched `payload` (whose size
/// [`check_payload`] compared) into it; on an error the payload is held in
/// [`Error::Unfit`].
fn into_new(header: &Header, payload: Matched) -> Result<Received> {
    let held = |e, m| unfit(e, m, Some(sent(header)));
    let received = match Received::allocate(header) {
        Ok(r) => r,
        Err(e) => return Err(held(e, payload)),
    };
    {
        let mut t = match received.export() {
            Ok(t) => t,
            Err(e) => return Err(held(e, payload)),
        };
        recv_matched(&mut t, payload, Some(sent(header)))?;
    }
    Ok(received)
}

impl Unreceived {
    /// Receives a held payload of the checked protocol into a new tensor of the dtype and
    /// shape its header gave ([`Unreceived::sent_dtype`], [`Unreceived::sent_shape`]), as
    /// [`recv_new`] would have.
    ///
    /// # Errors
    /// [`Error::BadHeader`] (field `"length"`, value 0) when the held message is not a
    /// payload with a header (a plain message, or a header or payload the protocol
    /// refused): use [`Unreceived::recv_into`]; [`Error::AlreadyReceived`]; the errors of
    /// [`recv_new`]'s allocation, with the message held again in [`Error::Unfit`].
    pub fn recv_new(&self) -> Result<Received> {
        let (Some(dtype), Some(shape)) = (self.sent_dtype(), self.sent_shape()) else {
            return Err(Error::BadHeader {
                field: "length",
                value: 0,
                reason: "the held message has no checked-protocol header: receive it with \
                         Unreceived::recv_into",
            });
        };
        let header = Header {
            dtype,
            shape: shape.to_vec(),
        };
        let payload = self.take()?;
        into_new(&header, payload).map_err(|e| self.hold_again(e))
    }
}

/// A tensor allocated by [`recv_new`]: owned, host memory, C-contiguous, of the dtype and
/// shape the sender's header gave. It is a DLPack producer ([`Exporter`]), so it can be
/// acquired and sent on, and its elements can be read with [`Received::to_vec`] or
/// [`Received::bytes`].
pub struct Received {
    /// 8-byte aligned storage, a whole number of elements long (with padding at the end).
    storage: Owned<u64>,
    dtype: DType,
    shape: Vec<i64>,
    len_elems: i64,
    elem_bytes: usize,
    /// `len_elems × elem_bytes`, the payload in bytes (checked to fit `usize` by
    /// [`layout::byte_span`] when the storage was allocated).
    payload_bytes: usize,
}

impl std::fmt::Debug for Received {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Received")
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .finish_non_exhaustive()
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl Received {
    /// Zeroed storage for `header`'s tensor, exported with its dtype and shape.
    fn allocate(header: &Header) -> Result<Self> {
        let element = dtype::lookup(header.dtype)?;
        let elem_bytes = element.size_bytes();
        let len_elems = header.len_elems()?;
        let payload = layout::byte_span(len_elems, elem_bytes)?;
        // The storage is u64 words (aligned for every dtype) and a whole number of elements:
        // a multiple of lcm(8, element bytes).
        let lcm = 8 / gcd(8, elem_bytes) * elem_bytes;
        let storage_bytes = payload
            .div_ceil(lcm)
            .checked_mul(lcm)
            .ok_or(Error::Overflow {
                quantity: "checked receive storage bytes",
                lhs: payload as i128,
                operator: "round up to",
                rhs: lcm as i128,
            })?;
        let storage = Owned::new(vec![0u64; storage_bytes / 8])
            .with_dtype(header.dtype)?
            .with_shape(&header.shape)?;
        Ok(Received {
            storage,
            dtype: header.dtype,
            shape: header.shape.clone(),
            len_elems,
            elem_bytes,
            payload_bytes: payload,
        })
    }

    fn export(&self) -> Result<ManagedTensor<'_>> {
        self.storage.dlpack(&ExportRequest::default())
    }

    /// The dtype the sender's header gave.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape the sender's header gave, in elements (empty for 0-d).
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }

    /// Number of elements (`Π shape`; 1 for 0-d).
    pub fn len_elems(&self) -> i64 {
        self.len_elems
    }

    /// The payload bytes in row-major order: `len_elems × element bytes` bytes. Takes
    /// `&mut self` so that no exported tensor is alive.
    pub fn bytes(&mut self) -> &[u8] {
        let n = self.payload_bytes;
        let words = self.storage.as_slice();
        // SAFETY: u64 storage viewed as bytes (u8 has alignment 1 and accepts any bits);
        // `n` ≤ the storage's byte length (allocate rounds it up to whole elements).
        unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), n) }
    }

    /// The elements as `T` (`len_elems × lanes` values, row-major).
    ///
    /// # Errors
    /// [`Error::DtypeMismatch`] when `T`'s dtype is not the received dtype (lanes aside).
    pub fn to_vec<T: AnyBits>(&mut self) -> Result<Vec<T>> {
        let lanes = self.dtype.lanes;
        if T::DTYPE != self.dtype.with_lanes(1) {
            return Err(Error::DtypeMismatch {
                what: "Received::to_vec: received vs asked for",
                left: self.dtype,
                right: T::DTYPE,
            });
        }
        // len_elems × lanes, from the payload size checked at allocation (the division is
        // exact: payload = len_elems × elem_bytes, and an element is never 0 bytes).
        let n = self.payload_bytes / self.elem_bytes * usize::from(lanes);
        let bytes = self.bytes();
        let mut out = Vec::<T>::with_capacity(n);
        // SAFETY: `bytes` holds n × size_of::<T>() bytes (T's size is bits/8 of the received
        // dtype); `out` has capacity for n values; T accepts any bit pattern (AnyBits), and
        // the copy is bytewise, so alignment of the source does not matter.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                out.as_mut_ptr().cast::<u8>(),
                n * std::mem::size_of::<T>(),
            );
            out.set_len(n);
        }
        Ok(out)
    }

    /// The underlying storage exporter (u64 words, exported with the received dtype and
    /// shape; the last word may hold padding).
    pub fn into_owned(self) -> Owned<u64> {
        self.storage
    }
}

impl Exporter for Received {
    fn dlpack_device(&self) -> Option<Device> {
        self.storage.dlpack_device()
    }

    /// Exports the received tensor (writable; see [`Owned`]'s exporter for the rules).
    fn dlpack(&self, request: &ExportRequest) -> Result<ManagedTensor<'_>> {
        self.storage.dlpack(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        for (dtype, shape) in [
            (DType::new(2, 32), vec![2, 3]),
            (DType::new(0, 8).with_lanes(4), vec![]),
            (DType::new(5, 128), vec![0, 7, 1]),
        ] {
            let h = Header { dtype, shape };
            let w = h.encode().unwrap();
            assert_eq!(w.len(), 4 + h.shape.len());
            assert_eq!(w[0], MAGIC);
            assert_eq!(Header::decode(&w).unwrap(), h);
        }
    }

    #[test]
    fn header_wire_words() {
        let h = Header {
            dtype: DType::new(2, 64).with_lanes(2),
            shape: vec![5, 1],
        };
        assert_eq!(
            h.encode().unwrap(),
            vec![MAGIC, 1, 2 | 64 << 8 | 2 << 16, 2, 5, 1]
        );
    }

    #[test]
    fn bad_headers_name_the_field() {
        let good = Header {
            dtype: DType::new(2, 32),
            shape: vec![4],
        }
        .encode()
        .unwrap();
        let field = |w: &[u64]| match Header::decode(w) {
            Err(Error::BadHeader { field, value, .. }) => (field, value),
            other => panic!("{other:?}"),
        };
        assert_eq!(field(&good[..3]), ("length", 3));
        let mut w = good.clone();
        w[0] = 7;
        assert_eq!(field(&w), ("magic", 7));
        let mut w = good.clone();
        w[1] = 2;
        assert_eq!(field(&w), ("version", 2));
        let mut w = good.clone();
        w[2] = 1 << 40;
        assert_eq!(field(&w), ("dtype", 1 << 40));
        let mut w = good.clone();
        w[3] = 3;
        assert_eq!(field(&w), ("ndim", 3));
        let mut w = good;
        w[4] = u64::MAX;
        assert_eq!(field(&w), ("shape", u64::MAX));
    }

    #[test]
    fn encode_refuses_negative_extent_and_too_many_axes() {
        let h = Header {
            dtype: DType::new(2, 32),
            shape: vec![2, -1],
        };
        assert!(matches!(
            h.encode(),
            Err(Error::InvalidTensor { ref field, value: -1, .. }) if field == "shape[1]"
        ));
        let h = Header {
            dtype: DType::new(2, 32),
            shape: vec![1; MAX_NDIM + 1],
        };
        assert!(matches!(
            h.encode(),
            Err(Error::InvalidTensor { ref field, value: 1025, .. }) if field == "ndim"
        ));
    }

    #[test]
    fn allocate_rounds_storage_to_whole_elements() {
        // 3-byte elements (uint8 × 3 lanes), 0-d, zero-size, and complex128.
        for (dtype, shape, bytes) in [
            (DType::new(1, 8).with_lanes(3), vec![5], 15),
            (DType::new(2, 64), vec![], 8),
            (DType::new(0, 32), vec![3, 0], 0),
            (DType::new(5, 128), vec![2], 32),
        ] {
            let mut r = Received::allocate(&Header {
                dtype,
                shape: shape.clone(),
            })
            .unwrap();
            assert_eq!((r.dtype(), r.shape()), (dtype, &shape[..]));
            assert_eq!(r.bytes().len(), bytes);
            let t = r.export().unwrap();
            assert_eq!((t.dtype(), t.shape()), (dtype, &shape[..]));
        }
    }

    #[test]
    fn to_vec_checks_the_type() {
        let mut r = Received::allocate(&Header {
            dtype: DType::new(2, 32),
            shape: vec![2],
        })
        .unwrap();
        assert_eq!(r.to_vec::<f32>().unwrap(), vec![0.0, 0.0]);
        assert!(matches!(
            r.to_vec::<i32>(),
            Err(Error::DtypeMismatch { left, right, .. })
                if left == DType::new(2, 32) && right == DType::new(0, 32)
        ));
    }
}
