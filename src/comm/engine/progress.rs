//! The progress service every blocking path of this crate polls, and the posting-order
//! queues of the nonblocking collectives' agreements (the ground floor of [`crate::comm`]):
//! which communicators have a *shadow* (the duplicate their nonblocking collectives' data
//! operations go on, see [`super::pending`]), which agreements wait on each, in posting
//! order, and the calls that resolve them in between: [`active`], [`wait_raw`],
//! [`before_blocking`] and [`progress_all`]. It knows a pending agreement only as a
//! [`Resolve`]: nothing here names a request, an operation or a mode.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_void};
use std::rc::Rc;

use mpi::attribute::{AttributeKey, CommAttribute};
use mpi::ffi::{MPI_Comm, MPI_Request};
use mpi::point_to_point::Status;
use mpi::raw::AsRaw;
use mpi::topology::Communicator;
use mpi::traits::*;

/// Something a queue resolves in order: a pending agreement (a nonblocking collective of
/// [`super::pending`]). An entry stays in its queue only while its agreement is pending: it
/// is removed when resolved, and its owner resolves it before it is dropped.
pub(in crate::comm) trait Resolve {
    /// Posts a held agreement (the shadow is ready); nothing otherwise.
    fn release(&mut self);

    /// Completes the agreement (waiting when `block`) and posts the data operation, or
    /// takes the error path; `false` when `block` is not set and the agreement is pending.
    fn resolve(&mut self, block: bool) -> bool;
}

/// The shadow of a caller's communicator: where the data operations and error paths of its
/// nonblocking collectives are posted. Cached as an attribute of the caller's communicator
/// and freed with it.
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
pub(in crate::comm) fn shadow_of<C: Communicator + ?Sized>(comm: &C) -> Shadow {
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

/// Whether `comm` has had nonblocking collectives under agreement (it has a shadow). The
/// same on every rank of `comm` at any collective of it: the shadow is made at the first
/// such collective, which every rank posts at the same point of `comm`'s collective order.
pub(in crate::comm) fn has_shadow<C: Communicator + ?Sized>(comm: &C) -> bool {
    NEXT_SHADOW.load(std::sync::atomic::Ordering::Relaxed) > 0
        && comm.get_attr::<Shadow>().is_some()
}

/// Before a blocking collective on `comm`: a duplication of it still pending is completed
/// and the agreements held for it are posted, so that the caller's communicator sees them
/// before the blocking one on every rank (and no collective runs beside the duplication).
pub(in crate::comm) fn before_blocking<C: Communicator + ?Sized>(comm: &C) {
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
pub(in crate::comm) fn progress(shadow: Shadow, target: *const (), block: bool) -> bool {
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

/// Puts `entry` in the queue of `shadow`, in posting order, and posts its agreement (and
/// every other held one) when the shadow is ready. The queue holds the entry until it is
/// resolved (see [`Resolve`]).
pub(in crate::comm) fn enqueue(entry: Rc<RefCell<dyn Resolve>>, shadow: Shadow) {
    let ready = QUEUES.with(|q| {
        let mut q = q.borrow_mut();
        let queue = q.entry(shadow.key()).or_default();
        queue.entries.push_back(Rc::clone(&entry));
        ENTRIES.with(|n| n.set(n.get() + 1));
        queue.ready.is_none()
    });
    if ready {
        entry.borrow_mut().release();
    } else {
        // Posts every held agreement (this one too) if the duplication has completed.
        QUEUES.with(|q| {
            if let Some(queue) = q.borrow_mut().get_mut(&shadow.key()) {
                shadow_ready(queue, false);
            }
        });
    }
}
