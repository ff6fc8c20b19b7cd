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
//! **The first nonblocking collective on a communicator** agrees at the call, with the MPI
//! call a blocking collective's agreement makes on a communicator without a shadow
//! (`MPI_Allreduce`), so that a rank calling the blocking form there meets it and the
//! mismatch of forms is an error, not a hang; once agreed, every rank makes the shadow
//! (`MPI_Comm_dup`, kept in the communicator's `ledger`) and posts the data operation on it.
//! So that one post returns once every rank has posted it. (An `MPI_Comm_idup` started
//! without an agreement would meet a peer's blocking collective; and Open MPI 4.1
//! mismatches nonblocking collectives posted beside a pending `MPI_Comm_idup`,
//! open-mpi/ompi#2025.)
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
//! it) and returns its error from the posting call at once: it first sends its error text
//! to every peer on the shadow ([`super::agree::tell`]), so that nothing after its vote
//! needs its code; its agreement stays queued (owning nothing of the caller's) and
//! completes in MPI's progress of its later MPI calls, in this crate's queue, or at
//! `MPI_Finalize` (drained there). Its peers' posts return requests, whose `wait` returns
//! [`Error::PeerRefused`] with that text.
//!
//! Under [`crate::comm::Agreement::Local`], and on a communicator of one rank, the data operation

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

use mpi::ffi::{MPI_Comm, MPI_Request};
use mpi::point_to_point::Status;
use mpi::topology::Communicator;

use super::agree::{agree_now, decide, on, post_votes, tell, turn, votes, Told, Turn};
use super::call::Operation;
use super::ledger;
use super::progress::{self, empty_status, enqueue, make_shadow, progress, Resolve, Shadow};
use super::signature::Signature;
use super::stager::Held;
use super::{Request, Scope};
use crate::error::{Error, Result};
use crate::settings::{agreement, Agreement};

/// Where a posted collective is.
enum Phase<'a, Sc: Scope<'a>> {
    /// The agreement is posted on the caller's communicator; the data operation is not.
    Agreeing {
        request: Request<'a, (), Sc>,
        /// This rank's votes (0..3) and their minimum over the ranks (3..6), written by MPI
        /// until the agreement completes.
        votes: Box<[i64; 6]>,
        /// This rank's turn in the communicator's order.
        turn: Turn,
        /// The shadow the data operation and the error path go on.
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
    /// The prepared data operation (`None` once finished).
    operation: Option<Operation<'a>>,
    /// The device stand-ins the operation's sides borrow: dropped after it.
    held: Option<Held<'a>>,
    signature: Signature<'a>,
}

impl<'a, Sc: Scope<'a> + Copy> Resolve for Collective<'a, Sc> {
    fn resolve(&mut self, block: bool) -> bool {
        let phase = std::mem::replace(&mut self.phase, Phase::Finished);
        let Phase::Agreeing {
            request,
            votes,
            turn,
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
                        turn,
                        shadow,
                    };
                    return false;
                }
            }
        }
        let min = [votes[3], votes[4], votes[5]];
        self.phase = match decide(&*on(shadow), min, &turn, &self.signature, Ok(())) {
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

/// The agreement a refusing rank leaves behind when its post returns (it owns nothing of
/// the caller's), with the sends of its text ([`tell`]): completed by MPI's progress in
/// this rank's later MPI calls and by this crate's (or at `MPI_Finalize`).
struct Refusal {
    request: MPI_Request,
    /// Read by MPI until the request completes.
    _votes: Box<[i64; 6]>,
    told: Option<Told>,
    turn: Turn,
    /// Its words, for the ledger when the last collective ended in a mismatch.
    words: String,
}

impl Resolve for Refusal {
    fn resolve(&mut self, block: bool) -> bool {
        let mut flag = 0;
        // SAFETY: the live agreement request this value owns (then MPI_REQUEST_NULL).
        unsafe {
            if block {
                mpi::ffi::MPI_Wait(&mut self.request, mpi::ffi::RSMPI_STATUS_IGNORE);
                flag = 1;
            } else {
                mpi::ffi::MPI_Test(&mut self.request, &mut flag, mpi::ffi::RSMPI_STATUS_IGNORE);
            }
        }
        if flag == 0 {
            return false;
        }
        // Not `Told::wait`: its polling would resolve this queue, whose head this is.
        if block {
            while self.told.as_mut().is_some_and(|t| !t.test()) {
                std::thread::yield_now();
            }
        } else if self.told.as_mut().is_some_and(|t| !t.test()) {
            return false;
        }
        let words = std::mem::take(&mut self.words);
        self.turn.note_last_if_watching(|| words);
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
/// This rank's own refusal (`prepared`'s error, or the setting's), at once (its part of
/// the agreement completes in this rank's later calls, see the module docs);
/// [`Error::OutOfStep`] when the communicator's ranks were found out of step.
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
    let agreeing = !matches!(agreement(), Ok(Agreement::Local)) && comm.size() > 1;
    if !agreeing {
        let mut op = agreement().and(prepared)?;
        let requests = post_data(&mut op, comm.as_raw(), scope);
        return Ok(new_state(
            scope,
            Phase::Posted(requests),
            Some(op),
            held,
            signature,
        ));
    }
    let Some(shadow) = ledger::shadow(comm) else {
        return start_first(comm, scope, signature, prepared, held);
    };
    let turn = turn(comm, &signature, true)?;
    let fp = turn.voted();
    let (operation, local) = match agreement().and(prepared) {
        Ok(op) => (Some(op), None),
        Err(e) => (None, Some(e)),
    };
    let mine = votes(local.is_some(), (comm.rank(), comm.size()), fp, false);
    // A refusing rank's text goes to the peers first (they receive it once the agreement
    // names this rank), so that nothing is left for this rank to do after its post.
    let told = local
        .as_ref()
        .map(|e| tell(shadow, turn.count, &e.to_string()));
    let mut boxed = Box::new([mine[0], mine[1], mine[2], 0, 0, 0]);
    // SAFETY: `boxed` is a heap box owned, until the request completes, by the value the
    // queue holds (it does not move with its owner); every rank posts this agreement here,
    // in posting order.
    let raw = unsafe { post_votes(comm.as_raw(), &mut boxed) };
    if let Some(e) = local {
        // This rank refused: its post returns now; the agreement stays queued (owning
        // nothing of the caller's) until MPI's progress, this crate's queue or
        // `MPI_Finalize` completes it.
        let words = turn.report(&signature).words;
        let refusal = Refusal {
            request: raw,
            _votes: boxed,
            told,
            turn,
            words,
        };
        enqueue(Rc::new(RefCell::new(refusal)), shadow);
        return Err(e);
    }
    // SAFETY: a live, nonpersistent request just posted, used only through this value.
    let request = unsafe { Request::from_raw(raw, &(), scope) };
    let phase = Phase::Agreeing {
        request,
        votes: boxed,
        turn,
        shadow,
    };
    let state = new_state(scope, phase, operation, held, signature);
    let erased: Rc<RefCell<dyn Resolve + '_>> = state.clone();
    // SAFETY: only the lifetime changes. The queue holds this entry only while its agreement
    // is pending: the entry is removed when resolved, and its request resolves it before it
    // is dropped (the request's `Drop` waits). A request leaked with `mem::forget`
    // leaves its agreement uncompleted, registered with the rsmpi scope, which aborts the
    // process at its end, before 'a ends.
    let erased: Rc<RefCell<dyn Resolve + 'static>> = unsafe { std::mem::transmute(erased) };
    enqueue(erased, shadow);
    Ok(state)
}

/// A collective's shared state.
fn new_state<'a, Sc: Scope<'a>>(
    scope: Sc,
    phase: Phase<'a, Sc>,
    operation: Option<Operation<'a>>,
    held: Option<Held<'a>>,
    signature: Signature<'a>,
) -> State<'a, Sc> {
    Rc::new(RefCell::new(Collective {
        scope,
        phase,
        operation,
        held,
        signature,
    }))
}

/// The first nonblocking collective on `comm` (it has no shadow yet): agreed now, with the
/// blocking collectives' MPI call there (so a rank that calls the blocking form meets it);
/// once agreed, every rank duplicates `comm` here and posts the data operation on the
/// duplicate.
fn start_first<'a, C, Sc>(
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
    let refuses = prepared.is_err();
    match agree_now(comm, &signature, prepared, true) {
        Ok((mut op, _)) => {
            let shadow = make_shadow(comm);
            ledger::of(comm).borrow_mut().shadow = Some(shadow);
            let requests = post_data(&mut op, shadow.comm, scope);
            Ok(new_state(
                scope,
                Phase::Posted(requests),
                Some(op),
                held,
                signature,
            ))
        }
        Err(e) if refuses => Err(e),
        Err(e @ Error::OutOfStep { .. }) => Err(e),
        Err(e) => Ok(new_state(scope, Phase::Failed(e), None, None, signature)),
    }
}

impl<'a, Sc: Scope<'a>> Collective<'a, Sc> {
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
        Phase::Agreeing { shadow, .. } => Some(*shadow),
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
                let status = if block && !progress::active() {
                    r.wait()
                } else if block {
                    // Other collectives of this rank wait for their data operations (on other
                    // communicators too): post them while this one completes.
                    let mut r = r;
                    loop {
                        match r.test() {
                            Ok(s) => break s,
                            Err(pending) => r = pending,
                        }
                        progress::progress_all();
                        std::thread::yield_now();
                    }
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
        agreeing @ Phase::Agreeing { .. } => {
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
