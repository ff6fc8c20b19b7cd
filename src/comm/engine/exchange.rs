//! Exchanges (issue 32): point-to-point messages between the same tensors, matched and
//! checked once and then run step after step at MPI's speed ([`Exchange`]): halo exchanges,
//! pipeline stages.
//!
//! **Build.** An exchange is built collectively, by every rank of the communicator (with
//! empty lists on a rank that exchanges nothing), in `ops/exchange.rs`: each member's facts
//! and its peer and tag are checked locally, the ranks agree on the build with the full
//! agreement of an unplanned collective ([`super::agree`]: a local refusal is
//! [`Error::PeerRefused`] on the peers, a rank that calls another collective meanwhile gets
//! [`Error::CollectiveMismatch`], nobody hangs), the exchange takes the plans' communicator
//! (the duplicate of the caller's communicator that its plans share, [`super::ledger`]),
//! and every rank tells each peer what it sends it and what it receives from it ([`share`]:
//! `MPI_Ialltoall` of the counts, `MPI_Ialltoallv` of fixed records, MPI-4.1 §6.12.6), so
//! that each end of every message checks the other's tag, dtype and element count; any
//! difference is [`Error::CollectiveMismatch`] on every rank ([`verdict`]), in words on the
//! ranks concerned.
//!
//! **Wire.** A member's elements travel in logical row-major order, as one message or, when
//! either end is strided, in chunks of [`CHUNK_BYTES`] (rounded down to whole elements;
//! both ends know it from the records): chunk `k` is elements `[k·C, (k+1)·C)`. A message
//! between two contiguous members is at most [`MAX_MESSAGE_BYTES`]. The messages go on the
//! plans' communicator with the caller's tags, so they never pair with an unplanned
//! receive on the caller's communicator (nor with a collective: MPI-4.1 §6.1).
//!
//! **Steps.** [`Exchange::run`] (blocking) and [`Exchange::start`] (nonblocking, an
//! [`ExchangeRequest`]) post every receive, then every send, and complete them all: no
//! agreement, no check of the members' facts, no allocation. A contiguous member's
//! messages are persistent requests made at the build (`MPI_Send_init`/`MPI_Recv_init`,
//! MPI-4.1 §3.9), started one by one in list order (`MPI_Startall` starts its requests "in
//! some arbitrary order", §3.9, which would break the order of two messages with the same
//! peer and tag); a strided member goes through [`DEPTH`] staging buffers of its own:
//! chunk `k+1` is packed while chunk `k` is on the wire (`MPI_Isend`), and a received chunk
//! is unpacked while the next arrives (`MPI_Irecv`). Messages with the same peer, tag and
//! direction form one ordered lane (MPI's non-overtaking order, §3.5, matches them in
//! order); each lane posts its next message as soon as the staging buffer it needs is free,
//! and a step completes its requests as they come (`MPI_Waitsome`; while nonblocking
//! collectives of this crate wait for their agreements on this thread, `MPI_Testsome` and
//! their progress in turn). Between [`Exchange::start`] and the request's `wait`, a strided
//! member's later chunks are packed and unpacked only in [`ExchangeRequest::test`] and
//! `wait`: this crate has no progress thread.
//!
//! **What a step detects.** Every received message's length is compared with the planned
//! one: a shorter one (a peer whose step is refused sends empty messages; or the message of
//! another exchange with the same peer and tag) is [`Error::PlanMismatch`] naming the rank,
//! member, tag and lengths, and a strided member is not written from it. What a step does
//! not detect: a message of another exchange with the same length — two exchanges with the
//! same (peer, tag) stepped in different orders on two ranks (or both in flight at once)
//! **cross-match**: each receives the other's data, silently. A longer message is MPI's
//! truncation error (fatal under MPI's default error handler). Give concurrent exchanges
//! distinct tags.
//!
//! **Lifetimes.** The exchange borrows its endpoint and both lists for `'a`; the members
//! are reached between steps through [`Exchange::sends_mut`] and [`Exchange::recvs_mut`],
//! after which the next step compares each member with what it was built from (pointer,
//! dtype, shape, strides, device) and refuses the step, for good, if one changed
//! ([`Error::PlanChanged`]): the step still takes part, sending empty messages and
//! receiving into the exchange's own buffers, so that no peer waits. A step in flight is
//! completed before the members are lent again, before the next step, and when the
//! exchange is dropped (which frees its persistent requests, `MPI_Request_free`, §3.7.3);
//! so MPI never uses a member after the borrow ends, even if an [`ExchangeRequest`] is
//! forgotten.

use std::ffi::{c_int, c_void};
use std::fmt;
use std::marker::PhantomData;

use mpi::ffi::{MPI_Comm, MPI_Datatype, MPI_Request, MPI_Status};
use mpi::request::Scope;
use mpi::topology::Rank;
use mpi::Tag;

use super::progress;
use crate::dlpack::{Tensor, TensorListMut};
use crate::error::{Error, Result};
use crate::spec::kernels::Prepared;

mod records;

use super::snapshot::{changed, Snapshot};
pub(in crate::comm) use records::{share, verdict};

/// The chunk of a message with a strided end (bytes, rounded down to whole elements, at
/// least one): chosen by measurement (the numbers are in `ops/exchange.rs`'s docs).
pub(in crate::comm) const CHUNK_BYTES: usize = 1 << 20;

/// The most bytes of one message between two contiguous members (a larger member goes in
/// messages of this size: its counts stay in `int`).
pub(in crate::comm) const MAX_MESSAGE_BYTES: usize = 1 << 30;

/// Staging buffers per strided member: chunks in flight at once per member.
pub(in crate::comm) const DEPTH: usize = 2;

/// One member's messages: one end of the messages the build matched.
pub(in crate::comm) struct Stream {
    /// A receive member (else a send member).
    pub(in crate::comm) recv: bool,
    /// The member's index in its list.
    pub(in crate::comm) index: usize,
    /// The peer (a rank of the caller's communicator, the same in the plans' duplicate).
    pub(in crate::comm) peer: Rank,
    /// The caller's tag.
    pub(in crate::comm) tag: Tag,
    /// The member's first element.
    pub(in crate::comm) first: *mut u8,
    /// The member's bytes (elements × element size).
    pub(in crate::comm) bytes: usize,
    /// Bytes per message (whole elements, > 0): the last message takes the rest.
    pub(in crate::comm) chunk: usize,
    /// The MPI unit of the elements, and its size in bytes.
    pub(in crate::comm) unit: MPI_Datatype,
    pub(in crate::comm) unit_bytes: usize,
    /// A strided member's copies, chunk by chunk, and its staging buffers (at most
    /// [`DEPTH`], of `min(chunk, bytes)` each); `None` for a contiguous member.
    pub(in crate::comm) staged: Option<(Copies, Vec<Box<[u8]>>)>,
}

/// The copies of a strided member's chunks, prepared at the build.
pub(in crate::comm) struct Copies {
    /// Chunk `k`'s pieces are `pieces[starts[k]..starts[k + 1]]`.
    pub(in crate::comm) starts: Vec<usize>,
    /// Every chunk's pieces, in order.
    pub(in crate::comm) pieces: Vec<Piece>,
    /// The distinct copies the pieces run (a pack for a send, an unpack for a receive).
    pub(in crate::comm) prepared: Vec<Prepared>,
}

/// A box of a strided member's elements, consecutive in logical order within a chunk.
pub(in crate::comm) struct Piece {
    /// Bytes from the member's first element to the box's.
    pub(in crate::comm) offset: isize,
    /// Bytes from the chunk's start to the box's packed bytes.
    pub(in crate::comm) at: usize,
    /// Its copy in [`Copies::prepared`].
    pub(in crate::comm) copy: usize,
}

impl Stream {
    /// The messages of a step (one for an empty member).
    fn messages(&self) -> usize {
        self.bytes.div_ceil(self.chunk).max(1)
    }

    /// Message `k`'s bytes of the member: `lo..hi`.
    fn range(&self, k: usize) -> (usize, usize) {
        let lo = (k * self.chunk).min(self.bytes);
        (lo, (lo + self.chunk).min(self.bytes))
    }

    /// Message `k`'s count in MPI units.
    fn units(&self, k: usize) -> c_int {
        let (lo, hi) = self.range(k);
        // A message is at most MAX_MESSAGE_BYTES (2^30), so its units fit `int`.
        c_int::try_from((hi - lo) / self.unit_bytes.max(1)).unwrap_or(c_int::MAX)
    }
}

/// A stream and how it runs: its request slots, persistent (one per message, on the
/// member) or staged (one per staging buffer).
struct Flow {
    s: Stream,
    first_slot: usize,
    persistent: bool,
    /// Staging buffers in rotation (the slots a staged flow uses).
    depth: usize,
    buffers: Vec<Box<[u8]>>,
}

/// Planned point-to-point messages between the same tensors, run step after step (see the
/// module docs): built by [`crate::comm::TensorComm::plan_exchange`].
///
/// `S` is the list of tensors this rank sends, `R` the list it receives into (any
/// [`TensorListMut`]: `Vec<ManagedTensor>`, `[&mut dyn Tensor]`, …). Write the values to
/// send between steps through [`Exchange::sends_mut`]; read what arrived through
/// [`Exchange::recvs`].
///
/// ```no_run
/// use dlpack_mpi::comm::TensorComm;
/// use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned, Tensor};
/// use mpi::traits::Communicator;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let universe = mpi::initialize().unwrap();
/// let world = universe.world();
/// let (r, n) = (world.rank(), world.size());
/// let (edge, ghost) = (Owned::new(vec![0.0f64; 512]), Owned::new(vec![0.0f64; 512]));
/// let opts = AcquireOptions::default();
/// let (mut sends, mut recvs) = (vec![acquire(&edge, &opts)?], vec![acquire(&ghost, &opts)?]);
/// // A ring: send the edge to the next rank, receive the ghost from the previous one (tag 7).
/// let mut halo = world.plan_exchange(&mut sends, &[((r + 1) % n, 7)], &mut recvs, &[((r + n - 1) % n, 7)])?;
/// for step in 0..100 {
///     halo.sends_mut()[0].as_mut_slice::<f64>()?.fill(step as f64); // compute
///     halo.run()?;
///     assert_eq!(halo.recvs()[0].as_slice::<f64>()?[0], step as f64);
/// }
/// # Ok(()) }
/// ```
pub struct Exchange<'a, S: ?Sized, R: ?Sized> {
    sends: &'a mut S,
    recvs: &'a mut R,
    /// The plans' communicator the messages go on.
    comm: MPI_Comm,
    flows: Vec<Flow>,
    /// The flows of one direction, peer and tag, in list order (receives first).
    lanes: Vec<Vec<usize>>,
    /// Each lane's next message: (flow within the lane, message).
    cursor: Vec<(usize, usize)>,
    requests: Vec<MPI_Request>,
    /// Per slot: whether its request is in flight, its flow and message.
    busy: Vec<bool>,
    slot_flow: Vec<usize>,
    owner: Vec<usize>,
    /// `MPI_Waitsome`'s outputs.
    indices: Vec<c_int>,
    statuses: Vec<MPI_Status>,
    /// Messages of a step, and completed in this one.
    messages: usize,
    completed: usize,
    snapshot: (Vec<Snapshot>, Vec<Snapshot>),
    /// Whether the send and receive lists were lent since the last step.
    lent: (bool, bool),
    /// The refusal of every step, once a member changed; then the flows are the exchange's
    /// own ([`Exchange::refuse`]).
    changed: Option<Error>,
    /// The first short message of this step, in words.
    seen: Option<String>,
    in_flight: bool,
    _endpoint: PhantomData<&'a ()>,
}

impl<S: ?Sized, R: ?Sized> fmt::Debug for Exchange<'_, S, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Exchange")
            .field("sends", &self.snapshot.0.len())
            .field("recvs", &self.snapshot.1.len())
            .field("messages", &self.messages)
            .field("in_flight", &self.in_flight)
            .field("changed", &self.changed)
            .finish_non_exhaustive()
    }
}

/// A constant handle of the MPI library: the null request.
fn null_request() -> MPI_Request {
    // SAFETY: a constant handle of the MPI library.
    unsafe { mpi::ffi::RSMPI_REQUEST_NULL }
}

/// The exchange over `sends` and `recvs` whose messages are `streams` (the build matched
/// every one with its peer's) on `comm`, the plans' communicator: the persistent requests
/// of the contiguous members made here (`MPI_Send_init`/`MPI_Recv_init`).
///
/// # Safety
/// Every stream's memory (its member's elements, or its own buffers) stays alive and
/// untouched by others while the exchange lives, except between steps through its
/// accessors; every peer built the matching streams on `comm`.
pub(in crate::comm) unsafe fn assemble<'a, S, R>(
    sends: &'a mut S,
    recvs: &'a mut R,
    comm: MPI_Comm,
    streams: Vec<Stream>,
) -> Exchange<'a, S, R>
where
    S: TensorListMut + ?Sized,
    R: TensorListMut + ?Sized,
{
    let snap = |l: Vec<&mut dyn Tensor>| l.iter().map(|t| Snapshot::of(&**t)).collect();
    let snapshot = (snap(sends.tensors_mut()), snap(recvs.tensors_mut()));
    let (flows, slots) = flows(streams);
    let lanes = lanes(&flows);
    let mut slot_flow = vec![0; slots];
    for (f, flow) in flows.iter().enumerate() {
        let n = if flow.persistent {
            flow.s.messages()
        } else {
            flow.depth
        };
        slot_flow[flow.first_slot..flow.first_slot + n].fill(f);
    }
    let mut x = Exchange {
        sends,
        recvs,
        comm,
        messages: flows.iter().map(|f| f.s.messages()).sum(),
        cursor: vec![(0, 0); lanes.len()],
        lanes,
        flows,
        requests: vec![null_request(); slots],
        busy: vec![false; slots],
        slot_flow,
        owner: vec![0; slots],
        indices: vec![0; slots],
        // SAFETY: MPI_Status is plain integers; zero is a valid (empty) value.
        statuses: vec![unsafe { std::mem::zeroed::<MPI_Status>() }; slots],
        completed: 0,
        snapshot,
        lent: (false, false),
        changed: None,
        seen: None,
        in_flight: false,
        _endpoint: PhantomData,
    };
    // SAFETY: the caller's contract.
    unsafe { x.init_persistent() };
    x
}

/// The flows of `streams` with their first slots, and the number of slots.
fn flows(streams: Vec<Stream>) -> (Vec<Flow>, usize) {
    let mut slots = 0;
    let flows = streams
        .into_iter()
        .map(|mut s| {
            let (persistent, depth, buffers) = match s.staged.take() {
                None => (true, 0, Vec::new()),
                Some((copies, buffers)) => {
                    s.staged = Some((copies, Vec::new()));
                    (false, buffers.len().max(1), buffers)
                }
            };
            let flow = Flow {
                first_slot: slots,
                persistent,
                depth,
                buffers,
                s,
            };
            slots += if persistent { flow.s.messages() } else { depth };
            flow
        })
        .collect();
    (flows, slots)
}

/// The lanes of `flows`: the flows of each (direction, peer, tag), in order, receives first.
fn lanes(flows: &[Flow]) -> Vec<Vec<usize>> {
    let mut keys: Vec<(bool, Rank, Tag)> = Vec::new();
    let mut lanes: Vec<Vec<usize>> = Vec::new();
    for (f, flow) in flows.iter().enumerate() {
        let key = (!flow.s.recv, flow.s.peer, flow.s.tag);
        match keys.iter().position(|k| *k == key) {
            Some(l) => lanes[l].push(f),
            None => {
                keys.push(key);
                lanes.push(vec![f]);
            }
        }
    }
    let mut order: Vec<usize> = (0..lanes.len()).collect();
    order.sort_by_key(|&l| keys[l]);
    order
        .into_iter()
        .map(|l| std::mem::take(&mut lanes[l]))
        .collect()
}

impl<S: ?Sized, R: ?Sized> Exchange<'_, S, R> {
    /// Makes the persistent requests of the contiguous flows.
    ///
    /// # Safety
    /// As [`assemble`].
    unsafe fn init_persistent(&mut self) {
        for flow in self.flows.iter().filter(|f| f.persistent) {
            let s = &flow.s;
            for k in 0..s.messages() {
                let at = s.first.wrapping_add(s.range(k).0).cast::<c_void>();
                let req = &mut self.requests[flow.first_slot + k];
                // SAFETY: message k's bytes lie in the member's elements (the caller's
                // contract on their life); `comm` is live; the request is ours.
                unsafe {
                    if s.recv {
                        mpi::ffi::MPI_Recv_init(
                            at,
                            s.units(k),
                            s.unit,
                            s.peer,
                            s.tag,
                            self.comm,
                            req,
                        )
                    } else {
                        mpi::ffi::MPI_Send_init(
                            at,
                            s.units(k),
                            s.unit,
                            s.peer,
                            s.tag,
                            self.comm,
                            req,
                        )
                    }
                };
            }
        }
    }

    /// Frees the persistent requests (inactive: no step is in flight), unless MPI was
    /// finalized first.
    fn free_persistent(&mut self) {
        let mut finalized: c_int = 0;
        // SAFETY: callable at any time (MPI-4.1 §11.2.1).
        unsafe { mpi::ffi::MPI_Finalized(&mut finalized) };
        for flow in self.flows.iter_mut().filter(|f| f.persistent) {
            for k in 0..flow.s.messages() {
                let req = &mut self.requests[flow.first_slot + k];
                if finalized == 0 {
                    // SAFETY: an inactive persistent request of ours, freed once.
                    unsafe { mpi::ffi::MPI_Request_free(req) };
                }
                *req = null_request();
            }
            flow.persistent = false;
        }
    }

    /// Refuses every later step (a member changed): the flows become the exchange's own,
    /// sending empty messages and receiving into buffers of their own (allocated once,
    /// here, on this error path), so that the peers' steps complete.
    fn refuse(&mut self) {
        self.free_persistent();
        for flow in &mut self.flows {
            let len = flow.s.chunk.min(flow.s.bytes);
            let depth = if flow.depth == 0 {
                flow.s.messages().min(DEPTH)
            } else {
                flow.depth
            };
            let size = if flow.s.recv { len } else { 0 };
            flow.buffers = (0..depth)
                .map(|_| vec![0u8; size].into_boxed_slice())
                .collect();
            flow.depth = depth;
        }
    }

    /// Completes the step in flight (if any), waiting.
    fn complete(&mut self) {
        if self.in_flight {
            self.drive(true);
        }
    }

    /// Posts what every lane can post, then completes what arrives, until every message of
    /// the step completed (`true`) or, unless `block`, nothing more completed now.
    fn drive(&mut self, block: bool) -> bool {
        loop {
            self.post_ready();
            if self.completed == self.messages {
                self.in_flight = false;
                return true;
            }
            let n = self.some(block);
            if n == 0 {
                if block {
                    // Nothing active yet messages left: cannot happen (every lane waits
                    // on a request of its own); never spin.
                    self.seen
                        .get_or_insert_with(|| "an exchange step had nothing to wait for".into());
                    self.in_flight = false;
                    return true;
                }
                return false;
            }
            for i in 0..n {
                let slot = usize::try_from(self.indices[i]).unwrap_or(0);
                let status = self.statuses[i];
                self.landed(slot, &status);
            }
        }
    }

    /// Completes some requests (`MPI_Waitsome`; `MPI_Testsome` unless `block`, or while
    /// this thread's nonblocking collectives wait for their agreements, which are
    /// progressed between tests); returns how many, their slots in `indices`.
    fn some(&mut self, block: bool) -> usize {
        let Ok(n) = c_int::try_from(self.requests.len()) else {
            return 0;
        };
        loop {
            let wait = block && !progress::active();
            let mut out: c_int = 0;
            let (req, idx, st) = (
                self.requests.as_mut_ptr(),
                self.indices.as_mut_ptr(),
                self.statuses.as_mut_ptr(),
            );
            // SAFETY: `n` requests of ours (null, inactive or active), and output arrays
            // of `n` entries each.
            unsafe {
                if wait {
                    mpi::ffi::MPI_Waitsome(n, req, &mut out, idx, st);
                } else {
                    mpi::ffi::MPI_Testsome(n, req, &mut out, idx, st);
                }
            }
            // MPI_UNDEFINED (negative) when no request is active.
            let done = usize::try_from(out).unwrap_or(0);
            if done > 0 || !block || out < 0 {
                return done;
            }
            progress::progress_all();
            std::thread::yield_now();
        }
    }

    /// Posts, lane by lane, every message whose turn has come and whose buffer is free.
    fn post_ready(&mut self) {
        for l in 0..self.lanes.len() {
            loop {
                let (pos, k) = self.cursor[l];
                let Some(&f) = self.lanes[l].get(pos) else {
                    break;
                };
                if k == self.flows[f].s.messages() {
                    self.cursor[l] = (pos + 1, 0);
                    continue;
                }
                if !self.post(f, k) {
                    break;
                }
                self.cursor[l] = (pos, k + 1);
            }
        }
    }

    /// Posts message `k` of flow `f`: starts its persistent request, or packs it into its
    /// staging buffer (a send) and posts it; `false` when that buffer is still in use.
    fn post(&mut self, f: usize, k: usize) -> bool {
        let refused = self.changed.is_some();
        let flow = &mut self.flows[f];
        if flow.persistent {
            let slot = flow.first_slot + k;
            (self.busy[slot], self.owner[slot]) = (true, k);
            // SAFETY: an inactive persistent request of ours (its previous step completed).
            unsafe { mpi::ffi::MPI_Start(&mut self.requests[slot]) };
            return true;
        }
        let slot = flow.first_slot + k % flow.depth;
        if self.busy[slot] {
            return false;
        }
        let s = &flow.s;
        let buf = &mut flow.buffers[k % flow.depth];
        if !s.recv && !refused {
            if let Some((copies, _)) = &s.staged {
                // SAFETY: the member's elements (the build's contract) and our buffer of
                // at least this chunk's bytes.
                unsafe { pack(copies, k, s.first, buf.as_mut_ptr()) };
            }
        }
        let units = if refused && !s.recv { 0 } else { s.units(k) };
        let (at, req) = (buf.as_mut_ptr().cast::<c_void>(), &mut self.requests[slot]);
        // SAFETY: our staging buffer, untouched until the request completes (`busy`);
        // `comm` is live.
        unsafe {
            if s.recv {
                mpi::ffi::MPI_Irecv(at, units, s.unit, s.peer, s.tag, self.comm, req);
            } else {
                mpi::ffi::MPI_Isend(at, units, s.unit, s.peer, s.tag, self.comm, req);
            }
        }
        (self.busy[slot], self.owner[slot]) = (true, k);
        true
    }

    /// The request of `slot` completed with `status`: a received message's length is
    /// checked, and a staged one unpacked into its member.
    fn landed(&mut self, slot: usize, status: &MPI_Status) {
        self.busy[slot] = false;
        self.completed += 1;
        let (f, k) = (self.slot_flow[slot], self.owner[slot]);
        let flow = &self.flows[f];
        let s = &flow.s;
        if !s.recv {
            return;
        }
        let mut got: c_int = 0;
        // SAFETY: the status MPI wrote for this receive.
        unsafe { mpi::ffi::MPI_Get_count(status, s.unit, &mut got) };
        if got != s.units(k) {
            if self.seen.is_none() {
                self.seen = Some(short(s, k, got));
            }
            return;
        }
        if let (Some((copies, _)), false) = (&s.staged, self.changed.is_some()) {
            let buf = &flow.buffers[k % flow.depth];
            // SAFETY: the member's elements (the build's contract, written by nothing
            // else during the step) and our buffer holding this chunk.
            unsafe { unpack(copies, k, buf.as_ptr(), s.first) };
        }
    }

    /// The outcome of the completed step after this rank's `refused`.
    fn outcome(&mut self, refused: Result<()>) -> Result<()> {
        refused?;
        match self.seen.take() {
            Some(seen) => Err(Error::PlanMismatch { seen }),
            None => Ok(()),
        }
    }
}

/// The words of a short message: message `k` of `s` held `got` units.
#[cold]
fn short(s: &Stream, k: usize, got: c_int) -> String {
    format!(
        "rank {} sent {got} units (MPI_Get_count) as message {k} of receive member {} (tag \
         {}), {} expected: a peer whose exchange refused its step (a member of its changed) \
         sends empty messages; otherwise another exchange's message with the same rank and \
         tag met this one",
        s.peer,
        s.index,
        s.tag,
        s.units(k)
    )
}

/// Packs chunk `k` of a strided member from `first` into `buf`.
///
/// # Safety
/// `first` is the member's first element with the layout `copies` was prepared from;
/// `buf` holds at least the chunk's bytes.
unsafe fn pack(copies: &Copies, k: usize, first: *mut u8, buf: *mut u8) {
    for p in &copies.pieces[copies.starts[k]..copies.starts[k + 1]] {
        // SAFETY: the caller's contract; the piece lies in the member and in the chunk.
        unsafe { copies.prepared[p.copy].run(buf.add(p.at), first.offset(p.offset)) };
    }
}

/// Unpacks chunk `k` of a strided member from `buf` into its elements at `first`.
///
/// # Safety
/// As [`pack`], with the elements writable.
unsafe fn unpack(copies: &Copies, k: usize, buf: *const u8, first: *mut u8) {
    for p in &copies.pieces[copies.starts[k]..copies.starts[k + 1]] {
        // SAFETY: the caller's contract; the piece lies in the member and in the chunk.
        unsafe { copies.prepared[p.copy].run(first.offset(p.offset), buf.add(p.at)) };
    }
}

impl<'a, S: TensorListMut + ?Sized, R: TensorListMut + ?Sized> Exchange<'a, S, R> {
    /// The common start of a step: a step in flight completed, the lent members compared
    /// (the first difference refuses every later step: [`Exchange::refuse`]), the counters
    /// reset. Returns this rank's refusal, which the step still takes part with.
    fn begin(&mut self) -> Result<()> {
        self.complete();
        let (sends, recvs) = std::mem::take(&mut self.lent);
        if self.changed.is_none() {
            let base = self.snapshot.0.len();
            self.changed = match (sends, recvs) {
                (true, _) => changed(&self.snapshot.0, self.sends, (0, false)),
                _ => None,
            }
            .or_else(|| {
                recvs
                    .then(|| changed(&self.snapshot.1, self.recvs, (base, false)))
                    .flatten()
            });
            if self.changed.is_some() {
                self.refuse();
            }
        }
        self.cursor.fill((0, 0));
        (self.completed, self.seen, self.in_flight) = (0, None, true);
        self.changed.clone().map_or(Ok(()), Err)
    }

    /// Runs one step, blocking: every receive posted, every send, all completed; the
    /// receive members hold what the peers' send members held when their steps started.
    ///
    /// # Errors
    /// [`Error::PlanChanged`] once a member of this rank changed (the step still takes
    /// part, on the exchange's own buffers); [`Error::PlanMismatch`] when a message
    /// arrived shorter than planned (a peer's refused step, or another exchange's message
    /// with the same peer and tag), naming the rank, member and tag.
    pub fn run(&mut self) -> Result<()> {
        let refused = self.begin();
        self.drive(true);
        self.outcome(refused)
    }

    /// Starts one step, nonblocking, inside the rsmpi scope `scope` (as
    /// [`crate::comm::Plan::start`]: registered with it until the step completes, so that a
    /// request and an exchange both forgotten abort at the scope's end instead of leaving
    /// MPI writing into freed members): the receives and the first chunks posted;
    /// [`ExchangeRequest::wait`] completes it (and the exchange stays borrowed until then).
    ///
    /// # Errors
    /// None yet: the step's errors come from [`ExchangeRequest::wait`].
    pub fn start<'s, Sc: Scope<'s> + Copy>(
        &'s mut self,
        scope: Sc,
    ) -> Result<ExchangeRequest<'s, 'a, Sc, S, R>> {
        let refused = self.begin();
        self.post_ready();
        scope.register();
        Ok(ExchangeRequest {
            exchange: self,
            refused: Some(refused),
            scope,
        })
    }

    /// The send members, for writing the values of the next step (a step in flight is
    /// completed first). The next step compares each member with what the exchange was
    /// built from: one replaced, reshaped or moved makes every later step
    /// [`Error::PlanChanged`].
    pub fn sends_mut(&mut self) -> &mut S {
        self.complete();
        self.lent.0 = true;
        self.sends
    }

    /// The receive members, for reading what the last step received (a step in flight is
    /// completed first).
    pub fn recvs(&mut self) -> &R {
        self.complete();
        self.recvs
    }

    /// The receive members, for writing (a step in flight is completed first); compared
    /// at the next step as [`Exchange::sends_mut`]'s.
    pub fn recvs_mut(&mut self) -> &mut R {
        self.complete();
        self.lent.1 = true;
        self.recvs
    }
}

impl<S: ?Sized, R: ?Sized> Drop for Exchange<'_, S, R> {
    fn drop(&mut self) {
        // A step in flight (a forgotten request) completes before the members' borrow ends.
        self.complete();
        self.free_persistent();
    }
}

/// One step of an [`Exchange`] in flight ([`Exchange::start`]), registered with its rsmpi
/// scope `Sc` until it completes; dropped uncompleted, it waits.
#[must_use = "a started step is complete only after wait (or drop, which waits)"]
pub struct ExchangeRequest<'e, 'a, Sc, S, R>
where
    Sc: Scope<'e> + Copy,
    S: TensorListMut + ?Sized,
    R: TensorListMut + ?Sized,
{
    exchange: &'e mut Exchange<'a, S, R>,
    /// This rank's refusal of the step (taken by `wait`; `None` once completed).
    refused: Option<Result<()>>,
    scope: Sc,
}

impl<'e, Sc, S, R> fmt::Debug for ExchangeRequest<'e, '_, Sc, S, R>
where
    Sc: Scope<'e> + Copy,
    S: TensorListMut + ?Sized,
    R: TensorListMut + ?Sized,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExchangeRequest")
            .field("exchange", &self.exchange)
            .finish_non_exhaustive()
    }
}

impl<'e, Sc, S, R> ExchangeRequest<'e, '_, Sc, S, R>
where
    Sc: Scope<'e> + Copy,
    S: TensorListMut + ?Sized,
    R: TensorListMut + ?Sized,
{
    /// Waits for the step: the receive members hold what arrived.
    ///
    /// # Errors
    /// As [`Exchange::run`].
    pub fn wait(mut self) -> Result<()> {
        let refused = self.refused.take().unwrap_or(Ok(()));
        self.exchange.drive(true);
        let out = self.exchange.outcome(refused);
        // SAFETY: registered by `Exchange::start`; the step has completed.
        unsafe { self.scope.unregister() };
        out
    }

    /// Whether the step has completed (then [`ExchangeRequest::wait`] returns at once):
    /// posts the chunks whose turn has come, unpacks those that arrived, and progresses
    /// this thread's pending nonblocking collectives.
    ///
    /// # Errors
    /// None yet: the step's errors come from [`ExchangeRequest::wait`].
    pub fn test(&mut self) -> Result<bool> {
        progress::progress_all();
        Ok(self.exchange.drive(false))
    }
}

impl<'e, Sc, S, R> Drop for ExchangeRequest<'e, '_, Sc, S, R>
where
    Sc: Scope<'e> + Copy,
    S: TensorListMut + ?Sized,
    R: TensorListMut + ?Sized,
{
    fn drop(&mut self) {
        if self.refused.take().is_some() {
            self.exchange.complete();
            // SAFETY: registered by `Exchange::start`; the step has completed.
            unsafe { self.scope.unregister() };
        }
    }
}
