//! The request every nonblocking operation returns ([`TensorRequest`]): a point-to-point
//! send or receive (`MPI_Isend`/`MPI_Irecv`, MPI-4.1 §3.7.2, posted by [`post_send`] and
//! [`post_recv`]) or a collective (its state driven by [`super::pending`], posted in the
//! nonblocking [`Mode`], [`Immediate`]); and `wait_all`, `wait_any`, `test_any`.
//!
//! **The pack buffer lives in the request.** When the policy packs a strided tensor, the
//! packed copy (a buffer of the bounded scratch pool, see [`crate::spec::scratch::pool_cap_bytes`])
//! is owned by the [`TensorRequest`]: MPI reads it (send) or writes it (receive) until the
//! request completes. At completion ([`TensorRequest::wait`], [`TensorRequest::test`]) a
//! receive's copy is unpacked into the strided tensor, and the buffer goes back to the pool.
//! Contiguous tensors, and strided ones the policy hands MPI as one derived datatype, go
//! without a copy. The wire format is the blocking operations': one message of the elements
//! in logical row-major order.
//!
//! **Dropping a request waits.** A [`TensorRequest`] dropped before completion waits for
//! the operation in its `Drop` (`MPI_Wait`), unpacks a receive as `wait` would (errors are
//! dropped with it: use `wait` to see them), and only then frees its buffer, so a buffer
//! MPI still uses is never freed and nothing panics in this crate. (Chosen over cancelling:
//! a dropped matched pair completes on both sides whatever the timing; the price is that a
//! dropped receive whose message never comes blocks, see [`TensorRequest`].) The rsmpi scope the
//! request is registered with guards the one case `Drop` cannot: a request leaked with
//! `std::mem::forget` is never completed, its buffer is leaked with it (never freed), and
//! the scope aborts the process at its end (rsmpi's rule for uncompleted requests), before
//! the tensors' borrows end.

use std::fmt;

use mpi::datatype::{AsDatatype, Collection, DatatypeRef, Pointer};
use mpi::point_to_point::Status;
use mpi::raw::AsRaw;
use mpi::request::{Request, Scope};
use mpi::topology::{Communicator, Rank};
use mpi::traits::Equivalence;
use mpi::{Count, Tag};

use super::call::Operation;
use super::mode::Mode;
use super::pending::{self, State};
use super::progress::progress_all;
use super::signature::Signature;
use super::stager::{stand_ins, Declared, Endpoint, Held, ReadIn, WriteIn};
use crate::error::{Error, Result};
use crate::raw;
use crate::spec::side::{In, Out, Side};

/// A posted nonblocking send or receive of a tensor, registered with an rsmpi scope `Sc`;
/// made by `immediate_send_tensor`,
/// `immediate_recv_tensor` and their windowed forms.
///
/// It borrows the tensor for `'a` and, when the packing policy ([`crate::comm::Packing`]) packs
/// the tensor, owns the packed copy: a buffer of the bounded scratch pool
/// ([`crate::spec::scratch::pool_cap_bytes`]) that MPI reads (send) or writes (receive)
/// until the request completes. Completion ([`TensorRequest::wait`],
/// [`TensorRequest::test`]) unpacks a receive's copy into the strided tensor and hands the
/// buffer back to the pool. Contiguous tensors and derived-datatype layouts go without a
/// copy.
///
/// **Dropping a request waits**: a request dropped before completion waits for the
/// operation in its `Drop` (`MPI_Wait`, MPI-4.1 §3.7.3), unpacks a receive as `wait` would
/// (errors are dropped: use `wait` to see them), and only then frees its buffer; nothing
/// panics. So a dropped request completes exactly as a waited one would, and a dropped
/// receive whose message is never sent (or a send whose receive is never posted, beyond
/// MPI's eager size) blocks in `Drop`, as `MPI_Wait` would: when a `?` between posts can
/// leave the scope early on every rank, make the fallible calls (all these operations'
/// errors come before posting) before posting the first request. A request leaked with `std::mem::forget` is never completed: its buffer is
/// leaked with it (never freed under MPI) and the rsmpi scope aborts the process at its
/// end, before the tensors' borrows end (rsmpi's rule for uncompleted requests).
///
/// ```no_run
/// use dlpack_mpi::prelude::*;
/// use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned};
/// use mpi::traits::*;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let universe = mpi::initialize().ok_or("MPI was already initialized")?;
/// let world = universe.world();
/// let (next, prev) = ((world.rank() + 1) % world.size(), (world.rank() + world.size() - 1) % world.size());
/// // A 4 × 6 f32 tensor in Fortran order: strided, packed under the default policy.
/// let send = Owned::new(vec![1.0f32; 24]).with_layout(&[4, 6], Some(&[1, 4]), 0)?;
/// let recv = Owned::new(vec![0.0f32; 24]);
/// {
///     let s = acquire(&send, &AcquireOptions::default())?;
///     let mut r = acquire(&recv, &AcquireOptions::default())?;
///     // A posting error (bad rank or tag, a READ_ONLY receive tensor) comes back before
///     // that request is posted; but a request already posted and then dropped waits for
///     // its peer, so in real code rule such errors out before posting the first request.
///     mpi::request::scope(|scope| -> dlpack_mpi::Result<()> {
///         let rr = world.immediate_recv_tensor(scope, &mut r, prev, 0)?;
///         let sr = world.immediate_send_tensor(scope, &s, next, 0)?;
///         sr.wait()?;
///         rr.wait()?; // the elements in logical row-major order
///         Ok(())
///     })?;
/// }
/// # Ok(())
/// # }
/// ```
///
/// The same holds for the nonblocking collectives
/// (`immediate_all_reduce_tensor` and the others): the request
/// borrows every tensor it was posted with until it completes, so the borrow checker
/// refuses to release a tensor, read a receive tensor or let the request leave its scope
/// before then.
///
/// ```compile_fail,E0505
/// use dlpack_mpi::prelude::*;
/// use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned};
/// use dlpack_mpi::dtype::ReduceOp;
/// let universe = mpi::initialize().unwrap();
/// let world = universe.world();
/// let (a, b) = (Owned::new(vec![1.0f32; 4]), Owned::new(vec![0.0f32; 4]));
/// let s = acquire(&a, &AcquireOptions::default()).unwrap();
/// let mut r = acquire(&b, &AcquireOptions::default()).unwrap();
/// mpi::request::scope(|scope| {
///     let req = world.immediate_all_reduce_tensor(scope, &s, &mut r, ReduceOp::Sum).unwrap();
///     std::mem::drop(s); // refused: the request still borrows the send tensor
///     req.wait().unwrap();
/// });
/// ```
///
/// ```compile_fail,E0502
/// use dlpack_mpi::prelude::*;
/// use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned, Tensor};
/// use dlpack_mpi::dtype::ReduceOp;
/// let universe = mpi::initialize().unwrap();
/// let world = universe.world();
/// let (a, b) = (Owned::new(vec![1.0f32; 4]), Owned::new(vec![0.0f32; 4]));
/// let s = acquire(&a, &AcquireOptions::default()).unwrap();
/// let mut r = acquire(&b, &AcquireOptions::default()).unwrap();
/// mpi::request::scope(|scope| {
///     let req = world.immediate_all_reduce_tensor(scope, &s, &mut r, ReduceOp::Sum).unwrap();
///     let _ = r.num_elements(); // refused: MPI may still be writing the receive tensor
///     req.wait().unwrap();
/// });
/// ```
///
/// ```compile_fail,E0521
/// use dlpack_mpi::prelude::*;
/// use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned};
/// use dlpack_mpi::dtype::ReduceOp;
/// let universe = mpi::initialize().unwrap();
/// let world = universe.world();
/// let a = Owned::new(vec![1.0f32; 4]);
/// let mut t = acquire(&a, &AcquireOptions::default()).unwrap();
/// let mut kept = None;
/// mpi::request::scope(|scope| {
///     // refused: a request cannot outlive the rsmpi scope it was posted in
///     kept = Some(world.immediate_all_reduce_tensor_in_place(scope, &mut t, ReduceOp::Sum).unwrap());
/// });
/// ```
#[must_use = "a request is completed by wait() or test(); dropping it blocks until it completes"]
pub struct TensorRequest<'a, Sc: Scope<'a>> {
    inner: Inner<'a, Sc>,
    /// The outcome [`TensorRequest::is_complete`] found, kept for `wait`, `test` and the
    /// `*_any` functions.
    finished: Option<Result<Status>>,
}

/// What a request completes.
enum Inner<'a, Sc: Scope<'a>> {
    /// A send or receive.
    PointToPoint {
        /// The MPI request; `None` once completed.
        request: Option<Request<'a, (), Sc>>,
        /// What completion does; `None` once completed.
        side: Option<Posted<'a>>,
        /// A device stager's stand-ins the side borrows (dropped after it).
        held: Option<Box<Held<'a>>>,
    },
    /// A collective: its agreement, then its data operation ([`super::pending`]).
    Collective(State<'a, Sc>),
}

/// The side of a posted request and what its completion does with it.
enum Posted<'a> {
    /// A send: the tensor's run or derived datatype (borrowing it for `'a`), or a packed
    /// copy owned here until completion.
    Send(Side<'a, In>),
    /// A receive: straight into the tensor's memory, or into a packed copy that completion
    /// unpacks into it ([`Side::finish`]).
    Recv {
        side: Side<'a, Out>,
        expected: Expected,
    },
}

/// What a receive was posted for, to check the arrived size at completion.
#[derive(Clone, Copy)]
struct Expected {
    /// Posted count, in units of `datatype`.
    count: Count,
    /// Posted datatype.
    datatype: DatatypeRef<'static>,
    /// The receive buffer's elements.
    len_elems: i64,
    /// Bytes per element.
    elem_bytes: i64,
}

/// The error of a request completed twice (not reached: completion consumes the request).
fn completed_twice() -> Error {
    Error::CountMismatch {
        what: "completions of one nonblocking request".to_string(),
        expected: 1,
        actual: 2,
    }
}

impl<'a, Sc: Scope<'a>> TensorRequest<'a, Sc> {
    /// A posted collective's request.
    pub(in crate::comm) fn collective(state: State<'a, Sc>) -> Self {
        TensorRequest {
            inner: Inner::Collective(state),
            finished: None,
        }
    }

    /// A posted point-to-point request, owning the stand-ins `held` its side borrows.
    fn point_to_point(request: Request<'a, (), Sc>, side: Posted<'a>) -> Self {
        TensorRequest {
            inner: Inner::PointToPoint {
                request: Some(request),
                side: Some(side),
                held: None,
            },
            finished: None,
        }
    }

    /// This request with the device stand-ins its side borrows.
    pub(in crate::comm) fn holding(mut self, stand_ins: Option<Held<'a>>) -> Self {
        if let Inner::PointToPoint { held, .. } = &mut self.inner {
            *held = stand_ins.map(Box::new);
        }
        self
    }

    /// Waits for the operation (`MPI_Wait`, MPI-4.1 §3.7.3) and finishes it: a packed
    /// receive is unpacked into its tensor, a staged one copied back to the device, and the
    /// buffers go back to their pools. For a collective, first the agreement (and, in
    /// posting order, every earlier collective's on the same communicator, see
    /// `immediate_all_reduce_tensor`), then the data operation; the
    /// status is MPI's empty status of a collective.
    ///
    /// # Errors
    /// For a receive: [`Error::CountMismatch`] when the message was shorter than the
    /// receive buffer (elements; a longer one is MPI's truncation error, fatal under the
    /// default error handler). The elements are then unspecified where nothing arrived
    /// (a contiguous or derived receive holds the arrived prefix; a packed one is left
    /// unchanged). For a collective: [`Error::PeerRefused`] when another rank refused its
    /// arguments, [`Error::CollectiveMismatch`] when the ranks' signatures differ (the
    /// data operation was then posted nowhere), and the device copy-back errors.
    pub fn wait(mut self) -> Result<Status> {
        self.poll(true).unwrap_or_else(|| Err(completed_twice()))
    }

    /// Tests for completion (`MPI_Test`, MPI-4.1 §3.7.3) without blocking: `Ok` with what
    /// [`TensorRequest::wait`] returns when the operation has completed (finished as
    /// there), `Err(self)` with the request still pending otherwise. For a collective, a
    /// test also posts the data operation once the agreement has completed (only on the
    /// error path does it wait: for the refusing rank's text, which every rank reads at
    /// the same point).
    #[allow(clippy::result_large_err)]
    pub fn test(mut self) -> std::result::Result<Result<Status>, Self> {
        match self.poll(false) {
            Some(done) => Ok(done),
            None => Err(self),
        }
    }

    /// Tests for completion without consuming the request, as mpi4py's `Request.Test()`
    /// (`MPI_Test`, MPI-4.1 §3.7.3; progress as in [`TensorRequest::test`]): `Ok(false)`
    /// while it is pending; once the operation has completed, it is finished as
    /// [`TensorRequest::wait`] finishes it (unpacked, copied back, its buffers returned) and
    /// the outcome is kept: `Ok(true)`, or the error `wait` returns. The request then still
    /// gives that outcome, with its [`Status`], to [`TensorRequest::wait`] (at once),
    /// [`TensorRequest::test`], [`wait_all`], [`wait_any`] and [`test_any`]; dropping it does
    /// nothing more.
    ///
    /// ```no_run
    /// # use dlpack_mpi::prelude::*;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let universe = mpi::initialize().ok_or("MPI was already initialized")?;
    /// # let world = universe.world();
    /// # let grad = Owned::new(vec![1.0f32; 1024]);
    /// let mut g = acquire(&grad, &AcquireOptions::default())?;
    /// mpi::request::scope(|scope| -> dlpack_mpi::Result<()> {
    ///     let mut sum = world.immediate_all_reduce_tensor_in_place(scope, &mut g, ReduceOp::Sum)?;
    ///     while !sum.is_complete()? {
    ///         // ... computation that does not touch `g` ...
    ///     }
    ///     Ok(())
    /// })?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// What [`TensorRequest::wait`] returns, from every call once the operation has
    /// completed.
    pub fn is_complete(&mut self) -> Result<bool> {
        if self.finished.is_none() {
            self.finished = self.poll(false);
        }
        match &self.finished {
            None => Ok(false),
            Some(outcome) => outcome.clone().map(|_| true),
        }
    }

    /// Whether this request packed its tensor (the policy chose a packed copy).
    pub fn is_packed(&self) -> bool {
        match &self.inner {
            Inner::PointToPoint {
                side: Some(Posted::Send(side)),
                ..
            } => side.is_packed(),
            Inner::PointToPoint {
                side: Some(Posted::Recv { side, .. }),
                ..
            } => side.is_packed(),
            Inner::PointToPoint { side: None, .. } => false,
            Inner::Collective(c) => c.borrow().is_packed(),
        }
    }

    /// Whether the request has completed and been finished.
    fn is_done(&self) -> bool {
        if self.finished.is_some() {
            return true;
        }
        match &self.inner {
            Inner::PointToPoint { request, .. } => request.is_none(),
            Inner::Collective(c) => c.borrow().is_finished(),
        }
    }

    /// Completes the request (waiting when `block`): `None` while it is pending.
    fn poll(&mut self, block: bool) -> Option<Result<Status>> {
        if let Some(outcome) = self.finished.take() {
            return Some(outcome);
        }
        progress_all();
        match &mut self.inner {
            Inner::Collective(c) => {
                pending::complete(c, block).map(|r| r.and_then(|s| s.ok_or_else(completed_twice)))
            }
            Inner::PointToPoint {
                request,
                side,
                held,
            } => {
                let r = request.take()?;
                let status = if block {
                    r.wait()
                } else {
                    match r.test() {
                        Ok(status) => status,
                        Err(pending) => {
                            *request = Some(pending);
                            return None;
                        }
                    }
                };
                let done = complete(side.take(), &status);
                let copied = match held.take() {
                    Some(h) if done.is_ok() => h.finish(),
                    _ => Ok(()),
                };
                Some(done.and(copied).map(|()| status))
            }
        }
    }
}

/// After MPI completed a point-to-point request: check a receive's size and unpack it.
fn complete(side: Option<Posted<'_>>, status: &Status) -> Result<()> {
    let Some(Posted::Recv { side, expected }) = side else {
        return Ok(());
    };
    let e = expected;
    if status.count(e.datatype) != e.count {
        side.discard(); // back to the pool; the tensor keeps its values
        let bytes = i64::from(status.count(u8::equivalent_datatype()));
        return Err(Error::CountMismatch {
            what: format!(
                "message from rank {} tag {} completing a nonblocking receive ({} bytes of \
                 {}-byte elements)",
                status.source_rank(),
                status.tag(),
                bytes,
                e.elem_bytes
            ),
            expected: e.len_elems,
            actual: if bytes >= 0 { bytes / e.elem_bytes } else { -1 },
        });
    }
    side.finish()
}

impl<'a, Sc: Scope<'a>> Drop for TensorRequest<'a, Sc> {
    fn drop(&mut self) {
        if !self.is_done() {
            // Errors cannot be returned from Drop; `wait` reports them.
            let _ = self.poll(true);
        }
    }
}

impl<'a, Sc: Scope<'a>> fmt::Debug for TensorRequest<'a, Sc> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.inner {
            Inner::PointToPoint {
                side: Some(Posted::Send(_)),
                ..
            } => "send",
            Inner::PointToPoint { .. } => "receive",
            Inner::Collective(_) => "collective",
        };
        f.debug_struct("TensorRequest")
            .field("pending", &!self.is_done())
            .field("kind", &kind)
            .field("packed", &self.is_packed())
            .finish()
    }
}

/// Waits for every request of `requests` (`MPI_Waitall`, MPI-4.1 §3.7.5: completing them in
/// the order given is equivalent, as MPI progresses all of them while it waits) and
/// returns each outcome, in the order given. Host and device requests, point-to-point and
/// collectives may be mixed.
pub fn wait_all<'a, Sc: Scope<'a>>(
    requests: impl IntoIterator<Item = TensorRequest<'a, Sc>>,
) -> Vec<Result<Status>> {
    requests.into_iter().map(TensorRequest::wait).collect()
}

/// Tests the requests of `requests` in order (`MPI_Testany`, MPI-4.1 §3.7.5) and removes
/// the first one that has completed: `Some((index, outcome))`, its index in `requests`
/// before the removal; `None` when none has completed (or the list is empty).
pub fn test_any<'a, Sc: Scope<'a>>(
    requests: &mut Vec<TensorRequest<'a, Sc>>,
) -> Option<(usize, Result<Status>)> {
    for i in 0..requests.len() {
        if let Some(done) = requests[i].poll(false) {
            drop(requests.remove(i));
            return Some((i, done));
        }
    }
    None
}

/// Waits until one of `requests` has completed (`MPI_Waitany`, MPI-4.1 §3.7.5), removes it
/// and returns `(index, outcome)` as [`test_any`] does; `None` for an empty list. It tests
/// the requests in turn until one completes.
pub fn wait_any<'a, Sc: Scope<'a>>(
    requests: &mut Vec<TensorRequest<'a, Sc>>,
) -> Option<(usize, Result<Status>)> {
    if requests.is_empty() {
        return None;
    }
    loop {
        if let Some(done) = test_any(requests) {
            return Some(done);
        }
        std::thread::yield_now();
    }
}

/// A count MPI was given as a `usize` (counts of specs and flats are never negative).
fn units(count: Count) -> usize {
    usize::try_from(count).unwrap_or(0)
}

/// `(first byte, count, datatype)` of a posted buffer.
pub(in crate::comm) type Posting<P> = (P, Count, DatatypeRef<'static>);

/// Posts `side` to `dest` (the whole of it, or the part `window` of its packed copy) and
/// returns the request that owns it.
pub(in crate::comm) fn post_send<'a, C: Communicator + ?Sized, Sc: Scope<'a>>(
    comm: &C,
    scope: Sc,
    side: Side<'a, In>,
    window: Option<Posting<*const u8>>,
    dest: Rank,
    tag: Tag,
) -> Result<TensorRequest<'a, Sc>> {
    let posting =
        window.unwrap_or_else(|| (side.pointer().cast(), side.count(), side.as_datatype()));
    // SAFETY: the posting holds its readable units: the tensor's validated elements
    // (borrowed for 'a by `side`) or (a window of) the packed copy `side` owns, whose heap
    // buffer does not move when `side` moves into the request; neither is written or freed
    // before the request completes (wait, test or Drop) or is leaked with it.
    let posted = unsafe { isend(comm, posting, (dest, tag)) }?;
    // SAFETY: a live, nonpersistent request just posted and used only through this value;
    // its buffers outlive 'a or are owned by the request (see above).
    let request = unsafe { Request::from_raw(posted.into_raw(), &(), scope) };
    Ok(TensorRequest::point_to_point(request, Posted::Send(side)))
}

/// `MPI_Isend` (MPI-4.1 §3.7.2) of `posting`'s units to `dest` with `tag` on `comm`.
///
/// # Safety
/// `posting`'s pointer holds its count of readable units of its datatype, which nothing
/// writes or frees until the returned request has completed.
///
/// # Errors
/// As `raw::isend` (a count beyond MPI's `int`).
pub(in crate::comm) unsafe fn isend<C: Communicator + ?Sized>(
    comm: &C,
    (ptr, count, datatype): Posting<*const u8>,
    (dest, tag): (Rank, Tag),
) -> Result<raw::Request> {
    // SAFETY: the caller's contract.
    unsafe {
        raw::isend(
            ptr,
            units(count),
            datatype.as_raw(),
            dest,
            tag,
            comm.as_raw(),
        )
    }
}

/// Posts a receive into `posting` (the side's whole buffer, or a window of its packed
/// copy); completion unpacks a packed side into its tensor. `expected_elems`: (elements
/// posted, bytes each).
pub(in crate::comm) fn post_recv<'a, C: Communicator + ?Sized, Sc: Scope<'a>>(
    comm: &C,
    scope: Sc,
    side: Side<'a, Out>,
    posting: Posting<*mut u8>,
    expected_elems: (i64, i64),
    (source, tag): (Rank, Tag),
) -> Result<TensorRequest<'a, Sc>> {
    let (ptr, count, datatype) = posting;
    // SAFETY: `ptr` has room for `count` units of `datatype`: the tensor's validated,
    // writable, disjoint elements (borrowed exclusively for 'a by the side the request
    // owns) or (a window of) the side's packed copy (its heap buffer does not move when
    // the side moves into the request); nothing else touches either before the request
    // completes or is leaked with it.
    let posted = unsafe {
        raw::irecv(
            ptr,
            units(count),
            datatype.as_raw(),
            source,
            tag,
            comm.as_raw(),
        )
    }?;
    // SAFETY: as in `post_send`.
    let request = unsafe { Request::from_raw(posted.into_raw(), &(), scope) };
    let expected = Expected {
        count,
        datatype,
        len_elems: expected_elems.0,
        elem_bytes: expected_elems.1,
    };
    Ok(TensorRequest::point_to_point(
        request,
        Posted::Recv { side, expected },
    ))
}

/// The nonblocking form of a collective ([`Mode`]), inside the rsmpi scope `Sc`: returns a
/// [`TensorRequest`] that owns the prepared operation (and any staged copies) until MPI
/// completes it ([`super::pending`] drives it).
#[derive(Debug, Clone, Copy)]
pub(in crate::comm) struct Immediate<Sc>(pub(in crate::comm) Sc);

impl<'a, Sc: Scope<'a> + Copy> Mode<'a> for Immediate<Sc> {
    type Out = TensorRequest<'a, Sc>;

    #[inline]
    fn collective<E, P>(
        self,
        tc: &'a E,
        sig: Signature<'a>,
        declared: Declared<'a>,
        prepare: P,
    ) -> Result<TensorRequest<'a, Sc>>
    where
        E: Endpoint + ?Sized,
        P: for<'x> FnOnce(Option<ReadIn<'x>>, Option<WriteIn<'x>>) -> Result<Operation<'x>>,
    {
        let (held, ins) = stand_ins(tc.stager(), declared);
        let prepared = ins.and_then(|(s, r)| prepare(s, r));
        pending::start(tc.communicator(), self.0, sig, prepared, held)
            .map(TensorRequest::collective)
    }

    fn prepared<E: Endpoint + ?Sized>(
        self,
        tc: &'a E,
        sig: Signature<'a>,
        prepared: Result<Operation<'a>>,
    ) -> Result<TensorRequest<'a, Sc>> {
        pending::start(tc.communicator(), self.0, sig, prepared, None)
            .map(TensorRequest::collective)
    }

    fn refuse<E: Endpoint + ?Sized>(
        self,
        tc: &'a E,
        sig: Signature<'a>,
        e: Error,
    ) -> Result<TensorRequest<'a, Sc>> {
        pending::start(tc.communicator(), self.0, sig, Err(e), None).map(TensorRequest::collective)
    }
}
