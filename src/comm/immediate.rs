//! Nonblocking point-to-point operations on tensors (`MPI_Isend`/`MPI_Irecv`, MPI-4.1
//! §3.7.2) that follow the packing policy ([`super::Packing`]) as the blocking ones do, and
//! the request type they return, [`TensorRequest`].
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

use super::checks::{check_rank, check_tag};
use super::operands::{read_side, write_side};
use super::stager::Operand;
use super::TensorComm;
use crate::dlpack::Tensor;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::raw;
use crate::spec::encoding::Need;
use crate::spec::side::{In, Out, Side};
use crate::spec::{Access, Reach};

/// A posted nonblocking send or receive of a tensor, registered with an rsmpi scope `Sc`;
/// made by [`super::TensorComm::immediate_send_tensor`],
/// [`super::TensorComm::immediate_recv_tensor`] and their windowed forms.
///
/// It borrows the tensor for `'a` and, when the packing policy ([`super::Packing`]) packs
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
/// use dlpack_mpi::comm::TensorComm;
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
#[must_use = "a request is completed by wait() or test(); dropping it blocks until it completes"]
pub struct TensorRequest<'a, Sc: Scope<'a>> {
    /// The MPI request; `None` once completed.
    request: Option<Request<'a, (), Sc>>,
    /// What completion does; `None` once completed.
    side: Option<Posted<'a>>,
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

impl<'a, Sc: Scope<'a>> TensorRequest<'a, Sc> {
    /// Waits for the operation (`MPI_Wait`, MPI-4.1 §3.7.3); for a packed receive, unpacks
    /// the arrived elements into the tensor; hands the pack buffer back to the pool.
    ///
    /// # Errors
    /// For a receive: [`Error::CountMismatch`] when the message was shorter than the
    /// receive buffer (elements; a longer one is MPI's truncation error, fatal under the
    /// default error handler). The elements are then unspecified where nothing arrived
    /// (a contiguous or derived receive holds the arrived prefix; a packed one is left
    /// unchanged).
    pub fn wait(mut self) -> Result<Status> {
        match self.request.take() {
            Some(r) => {
                let status = r.wait();
                self.complete(&status).map(|()| status)
            }
            // Not reached: only completion empties `request`, and completion consumes `self`
            // (`test` puts a pending request back).
            None => Err(Error::CountMismatch {
                what: "completions of one nonblocking request".to_string(),
                expected: 1,
                actual: 2,
            }),
        }
    }

    /// Tests for completion (`MPI_Test`, MPI-4.1 §3.7.3) without blocking: `Ok` with what
    /// [`TensorRequest::wait`] returns when the operation has completed (unpacked and
    /// checked as there), `Err(self)` with the request still pending otherwise.
    #[allow(clippy::result_large_err)]
    pub fn test(mut self) -> std::result::Result<Result<Status>, Self> {
        let Some(r) = self.request.take() else {
            return Ok(self.wait());
        };
        match r.test() {
            Ok(status) => Ok(self.complete(&status).map(|()| status)),
            Err(pending) => {
                self.request = Some(pending);
                Err(self)
            }
        }
    }

    /// Whether this request packed its tensor (the policy chose a packed copy).
    pub fn is_packed(&self) -> bool {
        match &self.side {
            Some(Posted::Send(side)) => side.is_packed(),
            Some(Posted::Recv { side, .. }) => side.is_packed(),
            None => false,
        }
    }

    /// After MPI completed the request: check a receive's size and unpack it.
    fn complete(&mut self, status: &Status) -> Result<()> {
        let Some(Posted::Recv { side, expected }) = self.side.take() else {
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
}

impl<'a, Sc: Scope<'a>> Drop for TensorRequest<'a, Sc> {
    fn drop(&mut self) {
        if let Some(r) = self.request.take() {
            let status = r.wait();
            // Errors cannot be returned from Drop; `wait` reports them.
            let _ = self.complete(&status);
        }
    }
}

impl<'a, Sc: Scope<'a>> fmt::Debug for TensorRequest<'a, Sc> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorRequest")
            .field("pending", &self.request.is_some())
            .field("send", &matches!(self.side, Some(Posted::Send(_))))
            .field("packed", &self.is_packed())
            .finish()
    }
}

/// A count MPI was given as a `usize` (counts of specs and flats are never negative).
fn units(count: Count) -> usize {
    usize::try_from(count).unwrap_or(0)
}

/// `(first byte, count, datatype)` of a posted buffer.
pub(super) type Posting<P> = (P, Count, DatatypeRef<'static>);

/// How a nonblocking operation's operand reaches MPI: `None` when no stager sees it (its
/// device label is checked as host memory), else the stager's word (a staged copy cannot
/// outlive the call yet: the stager refuses it).
///
/// # Errors
/// The stager's refusal.
pub(super) fn immediate_reach<T: TensorComm + ?Sized>(
    tc: &T,
    tensor: &dyn Tensor,
    access: Access,
    reduce: Option<DType>,
) -> Result<Option<Reach>> {
    match tc.stager() {
        None => Ok(None),
        Some(stager) => stager.reach_immediate(Operand {
            tensor,
            access,
            reduce,
        }),
    }
}

/// Posts `side` to `dest` (the whole of it, or the part `window` of its packed copy) and
/// returns the request that owns it.
pub(super) fn post_send<'a, C: Communicator + ?Sized, Sc: Scope<'a>>(
    comm: &C,
    scope: Sc,
    side: Side<'a, In>,
    window: Option<Posting<*const u8>>,
    dest: Rank,
    tag: Tag,
) -> Result<TensorRequest<'a, Sc>> {
    let (ptr, count, datatype) =
        window.unwrap_or_else(|| (side.pointer().cast(), side.count(), side.as_datatype()));
    // SAFETY: `ptr` holds `count` readable units of `datatype`: the tensor's validated
    // elements (borrowed for 'a by `side`) or (a window of) the packed copy `side` owns,
    // whose heap buffer does not move when `side` moves into the request; neither is
    // written or freed before the request completes (wait, test or Drop) or is leaked
    // with it.
    let posted = unsafe {
        raw::isend(
            ptr,
            units(count),
            datatype.as_raw(),
            dest,
            tag,
            comm.as_raw(),
        )
    }?;
    // SAFETY: a live, nonpersistent request just posted and used only through this value;
    // its buffers outlive 'a or are owned by the request (see above).
    let request = unsafe { Request::from_raw(posted.into_raw(), &(), scope) };
    Ok(TensorRequest {
        request: Some(request),
        side: Some(Posted::Send(side)),
    })
}

/// Posts a receive into `posting` (the side's whole buffer, or a window of its packed
/// copy); completion unpacks a packed side into its tensor. `expected_elems`: (elements
/// posted, bytes each).
pub(super) fn post_recv<'a, C: Communicator + ?Sized, Sc: Scope<'a>>(
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
    Ok(TensorRequest {
        request: Some(request),
        side: Some(Posted::Recv {
            side,
            expected: Expected {
                count,
                datatype,
                len_elems: expected_elems.0,
                elem_bytes: expected_elems.1,
            },
        }),
    })
}

/// [`super::TensorComm::immediate_send_tensor`].
pub(super) fn send<'a, T: TensorComm + ?Sized, Sc: Scope<'a>>(
    tc: &T,
    scope: Sc,
    tensor: &'a dyn Tensor,
    dest: Rank,
    tag: Tag,
) -> Result<TensorRequest<'a, Sc>> {
    let comm = tc.communicator();
    check_rank(dest, comm.target_size())?;
    check_tag(tag)?;
    let reach = immediate_reach(tc, tensor, Access::Read, None)?;
    let side = read_side(tensor, reach, Need::Counted)?;
    post_send(comm, scope, side, None, dest, tag)
}

/// [`super::TensorComm::immediate_recv_tensor`].
pub(super) fn recv<'a, T: TensorComm + ?Sized, Sc: Scope<'a>>(
    tc: &T,
    scope: Sc,
    tensor: &'a mut dyn Tensor,
    source: Rank,
    tag: Tag,
) -> Result<TensorRequest<'a, Sc>> {
    let comm = tc.communicator();
    check_rank(source, comm.target_size())?;
    check_tag(tag)?;
    let reach = immediate_reach(tc, &*tensor, Access::Write, None)?;
    let side = write_side(tensor, Access::Write, reach, Need::Counted)?;
    let expected = (side.len_elems(), side.element().size_bytes_i64());
    let posting = (side.ptr().cast::<u8>(), side.count(), side.as_datatype());
    post_recv(comm, scope, side, posting, expected, (source, tag))
}
