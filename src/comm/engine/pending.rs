//! Nonblocking collectives that still never leave a rank waiting: the agreement is posted
//! with the collective (`MPI_Iallreduce` of the three votes of [`super::agree`], MPI-4.1
//! §6.12), and the data operation is posted when the agreement has completed, inside
//! `test` or `wait` of the request that owns it (or the request's `Drop`). This file is one
//! collective's driver: it returns the collective's state ([`State`]), which the public
//! request type wraps (one layer up); the queues and the progress of every blocking path
//! are [`super::progress`].
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
//! until it returns. Test or wait the collective first, or use [`crate::comm::Agreement::Local`]
//! (MPI's own progress, no agreement).
//!
//! **A rank that refuses its own arguments** takes part in the agreement (its vote names
//! it), resolves it at once and returns its error from the posting call; its peers' posts
//! return requests, whose `wait` returns [`Error::PeerRefused`]. The refusing rank's post
//! therefore returns once its peers have posted the same collective (never later).
//!
//! Under [`crate::comm::Agreement::Local`], and on a communicator of one rank, the data operation

use std::cell::RefCell;
use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::mem::ManuallyDrop;
use std::rc::Rc;

use mpi::ffi::MPI_Comm;
use mpi::point_to_point::Status;
use mpi::raw::{AsRaw, FromRaw};
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::Equivalence;

use super::agree::{decide, post_votes, votes};
use super::call::Operation;
use super::progress::{empty_status, enqueue, progress, progress_all, shadow_of, Resolve, Shadow};
use super::signature::Signature;
use super::stager::Held;
use super::{Request, Scope};
use crate::error::{Error, Result};
use crate::settings::{agreement, Agreement};

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
pub(in crate::comm) struct Collective<'a, Sc: Scope<'a>> {
    /// The rsmpi scope its requests are registered with.
    scope: Sc,
    phase: Phase<'a, Sc>,
    /// The prepared data operation (`None` once finished, or for a rank that refused).
    operation: Option<Operation<'a>>,
    /// The device stand-ins the operation's sides borrow: dropped after it.
    held: Option<Held<'a>>,
    signature: Signature<'a>,
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
        // SAFETY: `votes` is a heap box this collective owns until the request completes
        // (it does not move with its owner); the request is live, nonpersistent and used
        // only through this value.
        let request = unsafe { Request::from_raw(post_votes(comm, &mut votes), &(), self.scope) };
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
    // every request completes (the request waits in its `Drop`), and `complete` tells it of
    // each completion in order; its body checked them; every rank posts the same operation
    // in the same order on `comm` (see the module docs).
    unsafe { op.post(comm, &mut raw) };
    raw.into_iter()
        // SAFETY: a live, nonpersistent request just posted, used only through this value.
        .map(|r| unsafe { Request::from_raw(r, &(), scope) })
        .collect()
}

/// The state of one posted collective, shared by its request and its queue entry.
pub(in crate::comm) type State<'a, Sc> = Rc<RefCell<Collective<'a, Sc>>>;

/// Posts a prepared collective (see the module docs): under agreement, its votes and, once
/// agreed, its data operation; else its data operation at once. `prepared` is the
/// preparation's outcome (a refusal found before any operand was declared, too), `held` the
/// device stand-ins its sides borrow.
///
/// # Errors
/// This rank's own refusal (`prepared`'s error, or the setting's), after the agreement has
/// told the peers.
pub(in crate::comm) fn start<'a, C, Sc>(
    comm: &C,
    scope: Sc,
    signature: Signature<'a>,
    prepared: Result<Operation<'a>>,
    held: Option<Held<'a>>,
) -> Result<State<'a, Sc>>
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
        return Ok(Rc::new(RefCell::new(Collective {
            scope,
            phase: Phase::Posted(requests),
            operation: Some(op),
            held,
            signature,
        })));
    }
    let shadow = shadow_of(comm);
    let (operation, local) = match prepared {
        Ok(op) => (Some(op), None),
        Err(e) => (None, Some(e)),
    };
    let fp = signature.fingerprint();
    let mine = votes(local.is_some(), (comm.rank(), comm.size()), fp, false);
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
    let erased: Rc<RefCell<dyn Resolve + '_>> = state.clone();
    // SAFETY: only the lifetime changes. The queue holds this entry only while its agreement
    // is pending: the entry is removed when resolved, and its request resolves it before it
    // is dropped (the request's `Drop` waits). A request leaked with `mem::forget`
    // leaves its agreement uncompleted, registered with the rsmpi scope, which aborts the
    // process at its end, before 'a ends.
    let erased: Rc<RefCell<dyn Resolve + 'static>> = unsafe { std::mem::transmute(erased) };
    enqueue(erased, shadow);
    if state.borrow().refused_here() {
        // This rank refused: learn the outcome now and return it from the post.
        progress_all();
        return Err(match complete(&state, true) {
            Some(Err(e)) => e,
            _ => Error::PeerRefused {
                rank: comm.rank(),
                reason: "refused".into(),
            },
        });
    }
    Ok(state)
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

impl<'a, Sc: Scope<'a>> Collective<'a, Sc> {
    /// Whether this rank refused (its agreement carries its own error).
    pub(in crate::comm) fn refused_here(&self) -> bool {
        matches!(
            &self.phase,
            Phase::Agreeing { local: Some(_), .. } | Phase::Waiting { local: Some(_), .. }
        )
    }

    /// Whether it is done (completed and reported).
    pub(in crate::comm) fn is_finished(&self) -> bool {
        matches!(self.phase, Phase::Finished)
    }

    /// Whether a side of its operation is a packed copy.
    pub(in crate::comm) fn is_packed(&self) -> bool {
        self.operation.as_ref().is_some_and(Operation::is_packed)
    }
}

/// Completes `state` (waiting when `block`): `None` while pending, else the outcome and
/// the last request's status (MPI's empty status of a collective; `None` for a request
/// completed before).
pub(in crate::comm) fn complete<'a, Sc: Scope<'a>>(
    state: &State<'a, Sc>,
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
