//! Nonblocking collectives that still never leave a rank waiting: the agreement is posted
//! with the collective (`MPI_Iallreduce` of the three votes of [`super::agree`], MPI-4.1
//! §6.12), and the data operation is posted when the agreement has completed, inside
//! [`TensorRequest::test`] or [`TensorRequest::wait`] (or the request's `Drop`).
//!
//! **Posting order.** MPI matches nonblocking collectives in the order each rank posts them
//! on a communicator (MPI-4.1 §6.12: "all processes must call collective operations
//! (including nonblocking ones) in the same order per communicator"). Agreements are posted
//! at the call, on the caller's communicator, so they follow the program's order as its
//! blocking collectives do. Data operations are posted later, when each rank sees its
//! agreement complete, which differs between ranks; they go on a *shadow* communicator,
//! a duplicate of the caller's made once (`MPI_Comm_idup` at the first nonblocking
//! collective, cached as an attribute, §7.7, and freed with the caller's communicator),
//! and each rank posts them there in the order the collectives were posted: completing a
//! request first resolves every earlier pending agreement on the same communicator (a
//! queue per shadow). The error path's messages (the refusing rank's text, the
//! mismatched signatures) go on the shadow in the same order. So a rank may wait for, or
//! test, its collectives in any order, and a blocking collective (or an rsmpi call) may
//! come between posting and completion.
//!
//! **The first posts on a communicator** start its duplication (`MPI_Comm_idup`) and do not
//! wait for it: their agreements are held (an rsmpi-registered generalized request stands
//! in) and posted in posting order as soon as the duplication completes, in any later post,
//! `test` or `wait`, or before the next blocking collective of this crate on it. Open MPI
//! 4.1 mismatches nonblocking collectives posted beside a pending `MPI_Comm_idup` of their
//! communicator (a hang or `MPI_ERR_TRUNCATE`; open-mpi/ompi#2025), so nothing of ours is
//! posted on it meanwhile; collectives the caller posts with rsmpi directly on the same
//! communicator during that window are still exposed to that bug (it ends at the first
//! completion of one of ours).
//!
//! **Progress.** A data operation is posted by this crate's code on each rank (MPI cannot
//! chain it to the agreement): in `test`, `wait` or `Drop` of any request, in any later
//! post, and inside every blocking call of this crate while such collectives are pending
//! (a blocking send, the matched probe of a receive, a blocking collective's agreement and
//! data operation then poll instead of blocking inside MPI, resolving agreements between
//! polls). So a rank whose peers wait for its part of a collective must be inside
//! dlpack-mpi, or come back to it: a rank that blocks in MPI outside this crate (rsmpi,
//! mpi4py, C) while its own collective's agreement is pending can leave its peers waiting
//! until it returns. Test or wait the collective first, or use [`super::Agreement::Local`]
//! (MPI's own progress, no agreement).
//!
//! **A rank that refuses its own arguments** takes part in the agreement (its vote names
//! it), resolves it at once and returns its error from the posting call; its peers' posts
//! return requests, whose `wait` returns [`Error::PeerRefused`]. The refusing rank's post
//! therefore returns once its peers have posted the same collective (never later).
//!
//! Under [`super::Agreement::Local`], and on a communicator of one rank, the data operation
//! is posted at the call on the caller's communicator, as mpi4py's `Iallreduce` is.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_void};
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::rc::Rc;

use mpi::attribute::{AttributeKey, CommAttribute};
use mpi::collective::SystemOperation;
use mpi::ffi::{MPI_Comm, MPI_Request};
use mpi::point_to_point::Status;
use mpi::raw::{AsRaw, FromRaw};
use mpi::request::{Request, Scope};
use mpi::topology::{AnyCommunicator, Communicator, SimpleCommunicator};
use mpi::traits::Equivalence;

use super::agree::{agreement, decide, votes, Agreement};
use super::call::Operation;
use super::immediate::TensorRequest;
use super::mode::Declared;
use super::signature::Signature;
use super::stager::{ReadIn, Stager, Staging, Unused, WriteIn};
use super::{Operand, TensorComm};
use crate::dlpack::{Tensor, TensorView};
use crate::error::{Error, Result};
use crate::spec::{Access, Reach};

/// The stand-ins a device stager made for one nonblocking operation, owned by its request
/// until MPI completes: the staged copies and the views over them that the operation's
/// sides borrow.
pub(super) struct Held<'a> {
    /// The views (send, receive) over the stand-ins, boxed so that the sides' borrows
    /// point to memory that does not move with this value; freed in `Drop`, before the
    /// staging they view.
    views: [Option<NonNull<TensorView<'a>>>; 2],
    staging: Staging<'a>,
}

impl Held<'_> {
    /// After MPI completed: copies a staged receive back to the device.
    ///
    /// # Errors
    /// The runtime's copy errors.
    pub(super) fn finish(&self) -> Result<()> {
        match &self.staging.recv {
            Some(r) => r.finish(),
            None => Ok(()),
        }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        for v in self.views.iter_mut().filter_map(Option::take) {
            // SAFETY: made by `Box::into_raw` in `stand_ins` and freed only here; the
            // operation whose sides borrowed it was dropped before (field order of the
            // owners: operation first).
            drop(unsafe { Box::from_raw(v.as_ptr()) });
        }
    }
}

/// The view of one staged operand, boxed and given the request's lifetime (`None`,
/// `None`: not staged).
///
/// # Errors
/// The stand-in's [`super::StagedTensor::view`] errors.
fn boxed_view<'a>(
    staged: Option<&(dyn super::StagedTensor + 'a)>,
) -> Result<(Option<NonNull<TensorView<'a>>>, Option<Reach>)> {
    let Some(st) = staged else {
        return Ok((None, None));
    };
    let reach = Some(st.reach());
    let Some(view) = st.view()? else {
        return Ok((None, reach));
    };
    // SAFETY: the view borrows the stand-in, a heap object owned by the `Held` this view
    // goes into; the `Held` frees the view before the stand-in (its `Drop`, then its
    // fields), and the stand-in does not move when the `Held` moves. Only the lifetime
    // changes.
    let view = unsafe { std::mem::transmute::<TensorView<'_>, TensorView<'a>>(view) };
    Ok((Some(NonNull::from(Box::leak(Box::new(view)))), reach))
}

/// The stand-ins of an operation's send and receive operands (the caller's tensors where
/// nothing is staged).
pub(super) type StandIns<'a> = (Option<ReadIn<'a>>, Option<WriteIn<'a>>);

/// Stages `declared` with `stager` for an operation that outlives the call. The staging
/// comes back with the outcome, as the request must own it even when a later step fails
/// after the stager copied.
pub(super) fn stand_ins<'a>(
    stager: Option<&'a dyn Stager>,
    declared: Declared<'a>,
) -> (Option<Held<'a>>, Result<StandIns<'a>>) {
    let Declared {
        send,
        recv,
        reduce,
        unused,
    } = declared;
    let Some(stager) = stager else {
        return (
            None,
            Ok((send.map(|t| (t, None)), recv.map(|(t, _)| (t, None)))),
        );
    };
    let operand = |tensor, access| Operand {
        tensor,
        access,
        reduce,
    };
    let s_op = send
        .filter(|_| unused != Unused::Send)
        .map(|t| operand(t, Access::Read));
    let r_op = recv
        .as_ref()
        .filter(|_| unused != Unused::Recv)
        .map(|(t, a)| operand(&**t, *a));
    let staging = match stager.stage(s_op, r_op) {
        Ok(s) => s,
        Err(e) => return (None, Err(e)),
    };
    let mut held = Held {
        views: [None, None],
        staging,
    };
    let (s_view, mut s_reach) = match boxed_view(held.staging.send.as_deref()) {
        Ok(v) => v,
        Err(e) => return (Some(held), Err(e)),
    };
    held.views[0] = s_view;
    let (r_view, mut r_reach) = match boxed_view(held.staging.recv.as_deref()) {
        Ok(v) => v,
        Err(e) => return (Some(held), Err(e)),
    };
    held.views[1] = r_view;
    match unused {
        Unused::Send => s_reach = Some(Reach::MpiOnly),
        Unused::Recv => r_reach = Some(Reach::MpiOnly),
        Unused::Neither => {}
    }
    let s = send.map(|t| match s_view {
        // SAFETY: the view lives as long as `held`, which the request keeps after the
        // operation's sides (see `Held`).
        Some(v) => (unsafe { &*v.as_ptr() } as &dyn Tensor, s_reach),
        None => (t, s_reach),
    });
    let r = recv.map(|(t, _)| match r_view {
        // SAFETY: as above; the receive view is used only through this reference.
        Some(v) => (unsafe { &mut *v.as_ptr() } as &mut dyn Tensor, r_reach),
        None => (t, r_reach),
    });
    (Some(held), Ok((s, r)))
}

/// Where a posted collective is.
enum Phase<'a, Sc: Scope<'a>> {
    /// The caller's communicator is still being duplicated (its first nonblocking
    /// collectives): the agreement is held, to be posted in posting order once the
    /// duplication completes. Open MPI 4.1 mismatches nonblocking collectives posted while
    /// an `MPI_Comm_idup` of their communicator is pending (open-mpi/ompi#2025). `guard`, a
    /// generalized request (`MPI_Grequest_start`, MPI-4.1 §13.2), holds the rsmpi scope
    /// meanwhile, as the agreement's request does later.
    Waiting {
        guard: Request<'a, (), Sc>,
        votes: Box<[i64; 6]>,
        local: Option<Error>,
        shadow: Shadow,
        /// The caller's communicator, which the agreement goes on.
        comm: MPI_Comm,
    },
    /// The agreement is posted on the caller's communicator; the data operation is not.
    Agreeing {
        request: Request<'a, (), Sc>,
        /// This rank's votes (0..3) and their minimum over the ranks (3..6), written by MPI
        /// until the agreement completes.
        votes: Box<[i64; 6]>,
        /// This rank's own refusal.
        local: Option<Error>,
        /// The key of the shadow's queue.
        shadow: Shadow,
    },
    /// The data operation is posted (one request per chunk of a chunked reduction, per
    /// bucket of a fused list), in posting order.
    Posted(VecDeque<Request<'a, (), Sc>>),
    /// Resolved to an error that completion returns.
    Failed(Error),
    /// Completed and reported.
    Finished,
}

/// One posted nonblocking collective.
pub(super) struct Collective<'a, Sc: Scope<'a>> {
    /// The rsmpi scope its requests are registered with.
    scope: Sc,
    phase: Phase<'a, Sc>,
    /// The prepared data operation (`None` once finished, or for a rank that refused).
    operation: Option<Operation<'a>>,
    /// The device stand-ins the operation's sides borrow: dropped after it.
    held: Option<Held<'a>>,
    signature: Signature<'a>,
}

/// Something a queue resolves in order: a pending agreement.
trait Resolve {
    /// Posts a held agreement (the shadow is ready); nothing otherwise.
    fn release(&mut self);

    /// Completes the agreement (waiting when `block`) and posts the data operation, or
    /// takes the error path; `false` when `block` is not set and the agreement is pending.
    fn resolve(&mut self, block: bool) -> bool;
}

impl<'a, Sc: Scope<'a> + Copy> Resolve for Collective<'a, Sc> {
    fn release(&mut self) {
        let phase = std::mem::replace(&mut self.phase, Phase::Finished);
        let Phase::Waiting {
            guard,
            mut votes,
            local,
            shadow,
            comm,
        } = phase
        else {
            self.phase = phase;
            return;
        };
        // SAFETY: the guard's own generalized request, completed once, here.
        unsafe { mpi::ffi::MPI_Grequest_complete(guard.as_raw()) };
        guard.wait();
        let request = post_votes(comm, &mut votes, self.scope);
        self.phase = Phase::Agreeing {
            request,
            votes,
            local,
            shadow,
        };
    }

    fn resolve(&mut self, block: bool) -> bool {
        self.release();
        let phase = std::mem::replace(&mut self.phase, Phase::Finished);
        let Phase::Agreeing {
            request,
            votes,
            local,
            shadow,
        } = phase
        else {
            self.phase = phase;
            return true;
        };
        if block {
            request.wait();
        } else {
            match request.test() {
                Ok(_) => {}
                Err(request) => {
                    self.phase = Phase::Agreeing {
                        request,
                        votes,
                        local,
                        shadow,
                    };
                    return false;
                }
            }
        }
        let min = [votes[3], votes[4], votes[5]];
        let local = match local {
            Some(e) => Err(e),
            None => Ok(()),
        };
        // SAFETY: the shadow is a live intra-communicator this crate made (freed only with
        // the caller's communicator, which outlives the request); the wrapper is never
        // dropped, so it does not free it.
        let comm = ManuallyDrop::new(unsafe { SimpleCommunicator::from_raw(shadow.comm) });
        self.phase = match decide(&*comm, min, &self.signature, local) {
            Err(e) => {
                self.operation = None;
                Phase::Failed(e)
            }
            Ok(()) => match &mut self.operation {
                Some(op) => Phase::Posted(post_data(op, shadow.comm, self.scope)),
                None => Phase::Finished,
            },
        };
        true
    }
}

/// Posts `op` on `comm` and registers its requests with `scope`.
fn post_data<'a, Sc: Scope<'a> + Copy>(
    op: &mut Operation<'a>,
    comm: MPI_Comm,
    scope: Sc,
) -> VecDeque<Request<'a, (), Sc>> {
    let mut raw = Vec::with_capacity(1);
    // SAFETY: the operation's sides are owned by the collective this request keeps until
    // every request completes (`TensorRequest` waits in `Drop`), and `complete` tells it of
    // each completion in order; its body checked them; every rank posts the same operation
    // in the same order on `comm` (see the module docs).
    unsafe { op.post(comm, &mut raw) };
    raw.into_iter()
        // SAFETY: a live, nonpersistent request just posted, used only through this value.
        .map(|r| unsafe { Request::from_raw(r, &(), scope) })
        .collect()
}

/// The shadow of a caller's communicator: where the data operations and error paths of its
/// nonblocking collectives are posted. Cached as an attribute of the caller's communicator
/// and freed with it.
#[derive(Clone, Copy)]
pub(super) struct Shadow {
    comm: MPI_Comm,
    /// The key of its queue: a number of this process, unique among its shadows.
    id: usize,
}

impl Shadow {
    /// The key of this shadow's queue.
    fn key(self) -> usize {
        self.id
    }
}

/// The number of the next shadow made.
static NEXT_SHADOW: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl CommAttribute for Shadow {
    unsafe extern "C" fn comm_delete_attr_fn(
        _comm: MPI_Comm,
        _key: std::os::raw::c_int,
        val: *mut c_void,
        _extra: *mut c_void,
    ) -> std::os::raw::c_int {
        // SAFETY: the attribute was set from a `Box<Shadow>` (`shadow_of`) and MPI calls
        // this once, when the caller's communicator is freed.
        let shadow = unsafe { Box::from_raw(val.cast::<Shadow>()) };
        let mut comm = shadow.comm;
        // The thread's queues may be gone already (a communicator freed at exit).
        let _ = QUEUES.try_with(|q| q.borrow_mut().remove(&shadow.key()));
        // SAFETY: our duplicate, freed once, here.
        unsafe { mpi::ffi::MPI_Comm_free(&mut comm) };
        // MPI_SUCCESS is 0.
        std::os::raw::c_int::try_from(mpi::ffi::MPI_SUCCESS).unwrap_or(0)
    }
}

/// The collectives of one shadow waiting for their agreements, in posting order, and the
/// shadow's `MPI_Comm_idup` request until it completes.
#[derive(Default)]
struct Queue {
    ready: Option<MPI_Request>,
    entries: VecDeque<Rc<RefCell<dyn Resolve>>>,
}

thread_local! {
    static QUEUES: RefCell<HashMap<usize, Queue>> = RefCell::new(HashMap::new());
    /// How many shadows of this thread are still being duplicated.
    static UNREADY: Cell<usize> = const { Cell::new(0) };
    /// How many collectives of this thread wait in a queue for their agreements.
    static ENTRIES: Cell<usize> = const { Cell::new(0) };
}

/// The shadow of `comm`, made with `MPI_Comm_idup` the first time (every rank makes its
/// first nonblocking collective on `comm` at the same point of the posting order, so the
/// duplication is matched there; it completes before the first data operation is posted).
fn shadow_of<C: Communicator + ?Sized>(comm: &C) -> Shadow {
    if let Some(s) = comm.get_attr::<Shadow>() {
        return *s;
    }
    // SAFETY: a constant handle of the MPI library.
    let mut dup = unsafe { mpi::ffi::RSMPI_COMM_NULL };
    // SAFETY: as above.
    let mut req = unsafe { mpi::ffi::RSMPI_REQUEST_NULL };
    // SAFETY: `comm` is a live intra-communicator; MPI writes both handles.
    unsafe { mpi::ffi::MPI_Comm_idup(comm.as_raw(), &mut dup, &mut req) };
    let id = NEXT_SHADOW.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let shadow = Shadow { comm: dup, id };
    let key: AttributeKey = Shadow::get_key();
    // SAFETY: the attribute is a `Box<Shadow>`, freed by `comm_delete_attr_fn`.
    unsafe {
        mpi::ffi::MPI_Comm_set_attr(
            comm.as_raw(),
            key.as_raw(),
            Box::into_raw(Box::new(shadow)).cast(),
        )
    };
    QUEUES.with(|q| {
        q.borrow_mut().entry(shadow.key()).or_default().ready = Some(req);
    });
    UNREADY.with(|n| n.set(n.get() + 1));
    shadow
}

/// Completes the shadow's duplication (waiting when `block`); whether it is usable. When it
/// becomes usable, the held agreements are posted, in posting order.
fn shadow_ready(queue: &mut Queue, block: bool) -> bool {
    let Some(mut req) = queue.ready else {
        return true;
    };
    let mut flag = 0;
    // SAFETY: the live request of MPI_Comm_idup, completed once (then forgotten).
    unsafe {
        if block {
            mpi::ffi::MPI_Wait(&mut req, mpi::ffi::RSMPI_STATUS_IGNORE);
            flag = 1;
        } else {
            mpi::ffi::MPI_Test(&mut req, &mut flag, mpi::ffi::RSMPI_STATUS_IGNORE);
        }
    }
    if flag == 0 {
        queue.ready = Some(req);
        return false;
    }
    queue.ready = None;
    UNREADY.with(|n| n.set(n.get().saturating_sub(1)));
    for e in &queue.entries {
        e.borrow_mut().release();
    }
    true
}

/// Whether this thread has nonblocking collectives whose agreements only this crate's
/// code progresses (queued, or held behind a duplication): then its blocking calls poll
/// ([`wait_raw`], and the matched probe of a receive) instead of blocking inside MPI.
pub(crate) fn active() -> bool {
    ENTRIES.with(Cell::get) > 0 || UNREADY.with(Cell::get) > 0
}

/// Waits for `requests` (`MPI_Waitall`); while this thread has queued nonblocking
/// collectives ([`active`]), by testing them (`MPI_Testall`) and resolving those
/// collectives' agreements in between, so that a peer waiting for one of their data
/// operations is never left waiting on this rank's blocking call.
pub(crate) fn wait_raw(requests: &mut [MPI_Request]) {
    let Ok(n) = c_int::try_from(requests.len()) else {
        return;
    };
    loop {
        if !active() {
            // SAFETY: live requests of the caller's, completed here (set to NULL).
            unsafe {
                mpi::ffi::MPI_Waitall(n, requests.as_mut_ptr(), mpi::ffi::RSMPI_STATUSES_IGNORE)
            };
            return;
        }
        let mut flag = 0;
        // SAFETY: as above; completed ones become MPI_REQUEST_NULL, which Testall accepts.
        unsafe {
            mpi::ffi::MPI_Testall(
                n,
                requests.as_mut_ptr(),
                &mut flag,
                mpi::ffi::RSMPI_STATUSES_IGNORE,
            )
        };
        if flag != 0 {
            return;
        }
        progress_all();
        std::thread::yield_now();
    }
}

/// MPI's empty status (`MPI_Wait` on `MPI_REQUEST_NULL`, MPI-4.1 §3.7.3): what a
/// collective that posted no request completes with (an empty fused list).
pub(super) fn empty_status() -> Status {
    // SAFETY: a constant handle of the MPI library.
    let mut null = unsafe { mpi::ffi::RSMPI_REQUEST_NULL };
    let mut status = std::mem::MaybeUninit::<mpi::ffi::MPI_Status>::uninit();
    // SAFETY: waiting on MPI_REQUEST_NULL returns at once with the empty status written.
    unsafe {
        mpi::ffi::MPI_Wait(&mut null, status.as_mut_ptr());
        Status::from_raw(status.assume_init())
    }
}

/// Before a blocking collective on `comm`: a duplication of it still pending is completed
/// and the agreements held for it are posted, so that the caller's communicator sees them
/// before the blocking one on every rank (and no collective runs beside the duplication).
pub(super) fn before_blocking<C: Communicator + ?Sized>(comm: &C) {
    if UNREADY.with(Cell::get) == 0 {
        return;
    }
    if let Some(shadow) = comm.get_attr::<Shadow>().copied() {
        QUEUES.with(|q| {
            if let Some(queue) = q.borrow_mut().get_mut(&shadow.key()) {
                shadow_ready(queue, true);
            }
        });
    }
}

/// Resolves the queue of `shadow` in order until `target` is resolved (waiting when
/// `block`); `false` when an agreement before or at `target` is still pending.
fn progress(shadow: Shadow, target: *const (), block: bool) -> bool {
    progress_key(shadow.key(), target, block)
}

/// [`progress`] on the queue of `key`; a NULL `target`: as far as the agreements allow.
fn progress_key(key: usize, target: *const (), block: bool) -> bool {
    /// What the queue holds next.
    enum Next {
        /// Nothing before the target is pending any more.
        Done,
        /// The shadow is not usable yet.
        Pending,
        Head(Rc<RefCell<dyn Resolve>>),
    }
    loop {
        let next = QUEUES.with(|q| {
            let mut q = q.borrow_mut();
            let Some(queue) = q.get_mut(&key) else {
                return Next::Done;
            };
            if !shadow_ready(queue, block) {
                return Next::Pending;
            }
            match queue.entries.front() {
                Some(h) => Next::Head(Rc::clone(h)),
                None => Next::Done,
            }
        });
        let head = match next {
            Next::Done => return true,
            Next::Pending => return false,
            Next::Head(h) => h,
        };
        if !head.borrow_mut().resolve(block) {
            return false;
        }
        QUEUES.with(|q| {
            if let Some(queue) = q.borrow_mut().get_mut(&key) {
                if queue.entries.pop_front().is_some() {
                    ENTRIES.with(|n| n.set(n.get().saturating_sub(1)));
                }
            }
        });
        if Rc::as_ptr(&head).cast::<()>() == target {
            return true;
        }
    }
}

/// Resolves, without waiting, every agreement that has completed at the head of any queue
/// of this thread (posting those data operations), so that testing any request progresses
/// the collectives posted before it.
pub(super) fn progress_all() {
    // Every request's `test` comes here: nothing queued is the common case.
    if !active() {
        return;
    }
    let shadows: Vec<usize> = QUEUES
        .try_with(|q| {
            q.borrow()
                .iter()
                .filter(|(_, queue)| !queue.entries.is_empty())
                .map(|(k, _)| *k)
                .collect()
        })
        .unwrap_or_default();
    for key in shadows {
        progress_key(key, std::ptr::null(), false);
    }
}

/// Posts a prepared collective (see the module docs): under agreement, its votes and, once
/// agreed, its data operation; else its data operation at once.
///
/// # Errors
/// This rank's own refusal (`prepared`'s error, or the staging's), after the agreement has
/// told the peers.
pub(super) fn post<'a, T, Sc, P>(
    tc: &'a T,
    scope: Sc,
    sig: Signature<'a>,
    declared: Declared<'a>,
    prepare: P,
) -> Result<TensorRequest<'a, Sc>>
where
    T: TensorComm + ?Sized,
    Sc: Scope<'a> + Copy,
    P: for<'x> FnOnce(Option<ReadIn<'x>>, Option<WriteIn<'x>>) -> Result<Operation<'x>>,
{
    let (held, ins) = stand_ins(tc.stager(), declared);
    let prepared = ins.and_then(|(s, r)| prepare(s, r));
    start(tc.communicator(), scope, sig, prepared, held)
}

/// A refusal found before the operands were declared (see [`super::mode::Mode::refuse`]).
///
/// # Errors
/// `e`, after the agreement has told the peers.
pub(super) fn refuse<'a, C, Sc>(
    comm: &C,
    scope: Sc,
    sig: Signature<'a>,
    e: Error,
) -> Result<TensorRequest<'a, Sc>>
where
    C: Communicator + ?Sized,
    Sc: Scope<'a> + Copy,
{
    start(comm, scope, sig, Err(e), None)
}

/// [`post`] after preparation.
pub(super) fn start<'a, C, Sc>(
    comm: &C,
    scope: Sc,
    signature: Signature<'a>,
    prepared: Result<Operation<'a>>,
    held: Option<Held<'a>>,
) -> Result<TensorRequest<'a, Sc>>
where
    C: Communicator + ?Sized,
    Sc: Scope<'a> + Copy,
{
    let (prepared, agreeing) = match agreement() {
        Ok(Agreement::Collective) => (prepared, comm.size() > 1),
        Ok(Agreement::Local) => (prepared, false),
        Err(e) => (prepared.and(Err(e)), comm.size() > 1),
    };
    if !agreeing {
        let mut op = prepared?;
        let requests = post_data(&mut op, comm.as_raw(), scope);
        return Ok(TensorRequest::collective(Rc::new(RefCell::new(
            Collective {
                scope,
                phase: Phase::Posted(requests),
                operation: Some(op),
                held,
                signature,
            },
        ))));
    }
    let shadow = shadow_of(comm);
    let (operation, local) = match prepared {
        Ok(op) => (Some(op), None),
        Err(e) => (None, Some(e)),
    };
    let fp = signature.fingerprint();
    let mine = votes(local.is_some(), comm.rank(), comm.size(), fp);
    let boxed = Box::new([mine[0], mine[1], mine[2], 0, 0, 0]);
    // Held until the shadow is ready (`Phase::Waiting`), then posted by `release`, below or
    // in the progress of any request.
    let phase = Phase::Waiting {
        guard: guard(scope),
        votes: boxed,
        local,
        shadow,
        comm: comm.as_raw(),
    };
    let state = Rc::new(RefCell::new(Collective {
        scope,
        phase,
        operation,
        held,
        signature,
    }));
    enqueue(&state, shadow);
    let request = TensorRequest::collective(state);
    if request.refused_here() {
        // This rank refused: learn the outcome now and return it from the post.
        return match request.wait() {
            Ok(_) => Err(Error::PeerRefused {
                rank: comm.rank(),
                reason: "refused".into(),
            }),
            Err(e) => Err(e),
        };
    }
    Ok(request)
}

/// Puts `state` in the queue of `shadow`, in posting order, and posts its agreement (and
/// every other held one) when the shadow is ready.
fn enqueue<'a, Sc: Scope<'a> + Copy>(state: &Rc<RefCell<Collective<'a, Sc>>>, shadow: Shadow) {
    let erased: Rc<RefCell<dyn Resolve + '_>> = state.clone();
    // SAFETY: only the lifetime changes. The queue holds this entry only while its agreement
    // is pending: the entry is removed when resolved, and its request resolves it before it
    // is dropped (`TensorRequest`'s `Drop` waits). A request leaked with `mem::forget`
    // leaves its agreement uncompleted, registered with the rsmpi scope, which aborts the
    // process at its end, before 'a ends.
    let erased: Rc<RefCell<dyn Resolve + 'static>> = unsafe { std::mem::transmute(erased) };
    let ready = QUEUES.with(|q| {
        let mut q = q.borrow_mut();
        let queue = q.entry(shadow.key()).or_default();
        queue.entries.push_back(erased);
        ENTRIES.with(|n| n.set(n.get() + 1));
        queue.ready.is_none()
    });
    if ready {
        state.borrow_mut().release();
    } else {
        // Posts every held agreement (this one too) if the duplication has completed.
        QUEUES.with(|q| {
            if let Some(queue) = q.borrow_mut().get_mut(&shadow.key()) {
                shadow_ready(queue, false);
            }
        });
    }
}

/// A generalized request registered with `scope`, completed by [`Resolve::release`].
fn guard<'a, Sc: Scope<'a>>(scope: Sc) -> Request<'a, (), Sc> {
    unsafe extern "C" fn query(_: *mut c_void, status: *mut mpi::ffi::MPI_Status) -> c_int {
        // SAFETY: MPI hands a status to fill (MPI-4.1 §13.2): no elements, not cancelled.
        unsafe {
            mpi::ffi::MPI_Status_set_elements(status, u8::equivalent_datatype().as_raw(), 0);
            mpi::ffi::MPI_Status_set_cancelled(status, 0);
        }
        0
    }
    unsafe extern "C" fn free(_: *mut c_void) -> c_int {
        0
    }
    unsafe extern "C" fn cancel(_: *mut c_void, _: c_int) -> c_int {
        0
    }
    // SAFETY: a constant handle of the MPI library.
    let mut req = unsafe { mpi::ffi::RSMPI_REQUEST_NULL };
    // SAFETY: the callbacks touch nothing but the status MPI hands them; MPI writes `req`.
    unsafe {
        mpi::ffi::MPI_Grequest_start(
            Some(query),
            Some(free),
            Some(cancel),
            std::ptr::null_mut(),
            &mut req,
        );
        Request::from_raw(req, &(), scope)
    }
}

/// Posts this rank's votes (`MPI_Iallreduce` of three `int64_t` with `MPI_MIN`, into the
/// second half of `votes`) on `comm`.
fn post_votes<'a, Sc: Scope<'a>>(
    comm: MPI_Comm,
    votes: &mut [i64; 6],
    scope: Sc,
) -> Request<'a, (), Sc> {
    let (mine, min) = votes.split_at_mut(3);
    // SAFETY: a constant handle of the MPI library.
    let mut req = unsafe { mpi::ffi::RSMPI_REQUEST_NULL };
    // SAFETY: both halves are three int64 in a heap box the collective owns until the
    // request completes (the box does not move with its owner).
    unsafe {
        mpi::ffi::MPI_Iallreduce(
            mine.as_ptr().cast(),
            min.as_mut_ptr().cast(),
            3,
            i64::equivalent_datatype().as_raw(),
            SystemOperation::min().as_raw(),
            comm,
            &mut req,
        );
        Request::from_raw(req, &(), scope)
    }
}

impl<'a, Sc: Scope<'a>> Collective<'a, Sc> {
    /// Whether this rank refused (its agreement carries its own error).
    pub(super) fn refused_here(&self) -> bool {
        matches!(
            &self.phase,
            Phase::Agreeing { local: Some(_), .. } | Phase::Waiting { local: Some(_), .. }
        )
    }

    /// Whether it is done (completed and reported).
    pub(super) fn is_finished(&self) -> bool {
        matches!(self.phase, Phase::Finished)
    }

    /// Whether a side of its operation is a packed copy.
    pub(super) fn is_packed(&self) -> bool {
        self.operation.as_ref().is_some_and(Operation::is_packed)
    }
}

/// Completes `state` (waiting when `block`): `None` while pending, else the outcome and
/// the last request's status (MPI's empty status of a collective; `None` for a request
/// completed before).
pub(super) fn complete<'a, Sc: Scope<'a>>(
    state: &Rc<RefCell<Collective<'a, Sc>>>,
    block: bool,
) -> Option<Result<Option<Status>>> {
    let shadow = match &state.borrow().phase {
        Phase::Agreeing { shadow, .. } | Phase::Waiting { shadow, .. } => Some(*shadow),
        _ => None,
    };
    if let Some(shadow) = shadow {
        if !progress(shadow, Rc::as_ptr(state).cast(), block) {
            return None;
        }
    }
    let mut guard = state.borrow_mut();
    let st = &mut *guard;
    let phase = std::mem::replace(&mut st.phase, Phase::Finished);
    let status = match phase {
        Phase::Posted(mut requests) => {
            let mut last = None;
            // In posting order: a fused list unpacks each bucket as it lands.
            while let Some(r) = requests.pop_front() {
                let status = if block {
                    r.wait()
                } else {
                    match r.test() {
                        Ok(s) => s,
                        Err(r) => {
                            requests.push_front(r);
                            st.phase = Phase::Posted(requests);
                            return None;
                        }
                    }
                };
                last = Some(status);
                if let Some(op) = st.operation.as_mut() {
                    op.completed_one();
                }
            }
            last.or_else(|| Some(empty_status()))
        }
        Phase::Failed(e) => return Some(Err(e)),
        Phase::Finished => None,
        agreeing @ (Phase::Agreeing { .. } | Phase::Waiting { .. }) => {
            // Not reached: `progress` resolved it.
            st.phase = agreeing;
            return None;
        }
    };
    let finished = match st.operation.take() {
        Some(op) => op.finish(),
        None => Ok(()),
    };
    let copied = match &st.held {
        Some(h) if finished.is_ok() => h.finish(),
        _ => Ok(()),
    };
    st.held = None;
    Some(finished.and(copied).map(|()| status))
}
