//! The progress service every blocking path of this crate polls, and the posting-order
//! queues of the nonblocking collectives' agreements (the ground floor of [`crate::comm`]):
//! the *shadows* (the duplicate of a caller's communicator its nonblocking collectives' data
//! operations go on, see [`super::pending`]; made by [`make_shadow`], kept in the caller's
//! [`super::ledger`]), which agreements wait on each, in posting order, and the calls that
//! resolve them in between: [`active`], [`wait_raw`] and [`progress_all`]; what is still
//! queued at `MPI_Finalize` is resolved there. It knows a pending agreement only as a
//! [`Resolve`]: nothing here names a request, an operation or a mode.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::ffi::c_int;
use std::rc::Rc;

use mpi::ffi::{MPI_Comm, MPI_Request};
use mpi::point_to_point::Status;
use mpi::topology::Communicator;

use crate::lifecycle::Registry;

/// Something a queue resolves in order: a pending agreement (a nonblocking collective of
/// [`super::pending`], or the agreement a refusing rank left behind when it returned). An
/// entry stays in its queue only while its agreement is pending: it is removed when
/// resolved, and its owner resolves it before it is dropped.
pub(in crate::comm) trait Resolve {
    /// Completes the agreement (waiting when `block`) and posts the data operation, or
    /// takes the error path; `false` when `block` is not set and the agreement is pending.
    fn resolve(&mut self, block: bool) -> bool;
}

/// The shadow of a caller's communicator: where the data operations and error paths of its
/// nonblocking collectives are posted. Kept in the caller's communicator's ledger
/// ([`super::ledger`]) and freed with it ([`free_shadow`]).
#[derive(Clone, Copy)]
pub(in crate::comm) struct Shadow {
    /// The duplicate communicator.
    pub(in crate::comm) comm: MPI_Comm,
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

/// The collectives of one shadow waiting for their agreements, in posting order.
#[derive(Default)]
struct Queue {
    entries: VecDeque<Rc<RefCell<dyn Resolve>>>,
}

thread_local! {
    static QUEUES: RefCell<HashMap<usize, Queue>> = RefCell::new(HashMap::new());
    /// How many collectives of this thread wait in a queue for their agreements.
    static ENTRIES: Cell<usize> = const { Cell::new(0) };
}

/// Queued agreements at `MPI_Finalize` (a refusing rank's, left behind when its post
/// returned): resolved there, so that the peers waiting for them return.
static QUEUED_AT_FINALIZE: Registry = Registry::new(drain_all);

/// Makes the shadow of `comm` (`MPI_Comm_dup`, MPI-4.1 §7.4.2): called by every rank at the
/// same point of `comm`'s collective order (when the first nonblocking collective on it
/// has agreed), so the duplication is matched there.
pub(in crate::comm) fn make_shadow<C: Communicator + ?Sized>(comm: &C) -> Shadow {
    // SAFETY: a constant handle of the MPI library.
    let mut dup = unsafe { mpi::ffi::RSMPI_COMM_NULL };
    // SAFETY: `comm` is a live intra-communicator; MPI writes the handle.
    unsafe { mpi::ffi::MPI_Comm_dup(comm.as_raw(), &mut dup) };
    let id = NEXT_SHADOW.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    QUEUED_AT_FINALIZE.enlist();
    Shadow { comm: dup, id }
}

/// Resolves what is still queued on `shadow` (waiting) and frees it: its caller's
/// communicator is being freed.
pub(in crate::comm) fn free_shadow(shadow: Shadow) {
    // The thread's queues may be gone already (a communicator freed at exit).
    let _ = QUEUES.try_with(|_| progress_key(shadow.key(), std::ptr::null(), true));
    let _ = QUEUES.try_with(|q| q.borrow_mut().remove(&shadow.key()));
    let mut comm = shadow.comm;
    // Refusals' texts that no rank received (a rank hears only the lowest refusing rank's,
    // and a refusing rank none) are received here: MPICH refuses to free a communicator with
    // unmatched messages. Any left in flight make the free return an error, not abort.
    // SAFETY: our duplicate (live until freed below) and a predefined handler.
    unsafe { mpi::ffi::MPI_Comm_set_errhandler(comm, mpi::ffi::RSMPI_ERRORS_RETURN) };
    loop {
        let mut flag = 0;
        let mut status = std::mem::MaybeUninit::<mpi::ffi::MPI_Status>::uninit();
        // SAFETY: as above; MPI writes the flag and, when set, the status.
        unsafe {
            mpi::ffi::MPI_Iprobe(
                mpi::ffi::RSMPI_ANY_SOURCE,
                mpi::ffi::RSMPI_ANY_TAG,
                comm,
                &mut flag,
                status.as_mut_ptr(),
            )
        };
        if flag == 0 {
            break;
        }
        // SAFETY: set by MPI_Iprobe when the flag is.
        let status = unsafe { status.assume_init() };
        let mut count: c_int = 0;
        // SAFETY: a constant handle of the MPI library.
        let byte = unsafe { mpi::ffi::RSMPI_UINT8_T };
        let mut buf = Vec::new();
        // SAFETY: the probed message is received into a buffer of its size, with its
        // source and tag.
        unsafe {
            mpi::ffi::MPI_Get_count(&status, byte, &mut count);
            buf.resize(usize::try_from(count).unwrap_or(0), 0u8);
            mpi::ffi::MPI_Recv(
                buf.as_mut_ptr().cast(),
                count,
                byte,
                status.MPI_SOURCE,
                status.MPI_TAG,
                comm,
                mpi::ffi::RSMPI_STATUS_IGNORE,
            );
        }
    }
    // SAFETY: our duplicate, freed once, here.
    unsafe { mpi::ffi::MPI_Comm_free(&mut comm) };
}

/// Resolves every queued agreement of this thread, waiting (run by `MPI_Finalize`).
fn drain_all() {
    let keys: Vec<usize> = QUEUES
        .try_with(|q| q.borrow().keys().copied().collect())
        .unwrap_or_default();
    for key in keys {
        progress_key(key, std::ptr::null(), true);
    }
}

/// Whether this thread has nonblocking collectives whose agreements only this crate's
/// code progresses (queued): then its blocking calls poll
/// ([`wait_raw`], and the matched probe of a receive) instead of blocking inside MPI.
pub(crate) fn active() -> bool {
    ENTRIES.with(Cell::get) > 0
}

/// Waits for `requests` (`MPI_Waitall`); while this thread has queued nonblocking
/// collectives ([`active`]), by testing them (`MPI_Testall`) and resolving those
/// collectives' agreements in between, so that a peer waiting for one of their data
/// operations is never left waiting on this rank's blocking call. Returns MPI's error code
/// (`MPI_SUCCESS` unless the requests' communicator returns errors, `MPI_ERRORS_RETURN`).
pub(crate) fn wait_raw(requests: &mut [MPI_Request]) -> c_int {
    let Ok(n) = c_int::try_from(requests.len()) else {
        return 0;
    };
    loop {
        if !active() {
            // SAFETY: live requests of the caller's, completed here (set to NULL).
            return unsafe {
                mpi::ffi::MPI_Waitall(n, requests.as_mut_ptr(), mpi::ffi::RSMPI_STATUSES_IGNORE)
            };
        }
        let mut flag = 0;
        // SAFETY: as above; completed ones become MPI_REQUEST_NULL, which Testall accepts.
        let rc = unsafe {
            mpi::ffi::MPI_Testall(
                n,
                requests.as_mut_ptr(),
                &mut flag,
                mpi::ffi::RSMPI_STATUSES_IGNORE,
            )
        };
        if flag != 0 || rc != 0 {
            return rc;
        }
        progress_all();
        std::thread::yield_now();
    }
}

/// MPI's empty status (`MPI_Wait` on `MPI_REQUEST_NULL`, MPI-4.1 §3.7.3): what a
/// collective that posted no request completes with (an empty fused list).
pub(in crate::comm) fn empty_status() -> Status {
    // SAFETY: a constant handle of the MPI library.
    let mut null = unsafe { mpi::ffi::RSMPI_REQUEST_NULL };
    let mut status = std::mem::MaybeUninit::<mpi::ffi::MPI_Status>::uninit();
    // SAFETY: waiting on MPI_REQUEST_NULL returns at once with the empty status written.
    unsafe {
        mpi::ffi::MPI_Wait(&mut null, status.as_mut_ptr());
        Status::from_raw(status.assume_init())
    }
}

/// Resolves the queue of `shadow` in order until `target` is resolved (waiting when
/// `block`); `false` when an agreement before or at `target` is still pending.
pub(in crate::comm) fn progress(shadow: Shadow, target: *const (), block: bool) -> bool {
    progress_key(shadow.key(), target, block)
}

/// [`progress`] on the queue of `key`; a NULL `target`: as far as the agreements allow.
fn progress_key(key: usize, target: *const (), block: bool) -> bool {
    /// What the queue holds next.
    enum Next {
        /// Nothing before the target is pending any more.
        Done,
        Head(Rc<RefCell<dyn Resolve>>),
    }
    loop {
        let next = QUEUES.with(|q| {
            let mut q = q.borrow_mut();
            let Some(queue) = q.get_mut(&key) else {
                return Next::Done;
            };
            match queue.entries.front() {
                Some(h) => Next::Head(Rc::clone(h)),
                None => Next::Done,
            }
        });
        let head = match next {
            Next::Done => return true,
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
pub(in crate::comm) fn progress_all() {
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

/// Puts `entry` (whose agreement is posted) in the queue of `shadow`, in posting order.
/// The queue holds the entry until it is resolved (see [`Resolve`]).
pub(in crate::comm) fn enqueue(entry: Rc<RefCell<dyn Resolve>>, shadow: Shadow) {
    QUEUES.with(|q| {
        let mut q = q.borrow_mut();
        q.entry(shadow.key()).or_default().entries.push_back(entry);
        ENTRIES.with(|n| n.set(n.get() + 1));
    });
}
