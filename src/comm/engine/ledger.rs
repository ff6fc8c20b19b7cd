//! What each rank knows of a communicator's collectives so far (its *ledger*): how many it
//! has agreed on, whether its nonblocking collectives have a shadow yet, what the last
//! mismatch was (so that the next collective can tell a skipped collective from arguments
//! that differed once), and whether the ranks are out of step.
//!
//! The ledger is an attribute of the caller's communicator (MPI-4.1 §7.7), made at its first
//! collective under agreement and freed with it (its delete callback frees the shadow too,
//! after resolving what is still queued on it). Every field changes only at points every
//! rank passes alike (an agreement's outcome, which every rank learns the same), so the
//! ranks' ledgers of one communicator are equal at each collective unless the ranks are out
//! of step, which is what the agreement then names ([`super::diagnosis`]).
//!
//! **Out of step.** Once the agreement has found the ranks out of step (a rank skipped or
//! added a collective), the communicator's collective order is broken: every later
//! collective of this crate on it returns [`Error::OutOfStep`] at once, naming the first
//! finding, without entering MPI (as NCCL's aborted communicator), so no rank hangs in this
//! crate's calls and the program can end. [`reset`] (every rank, collectively) clears it.

use std::cell::RefCell;
use std::ffi::c_void;
use std::rc::Rc;

use mpi::attribute::{AttributeKey, CommAttribute};
use mpi::ffi::MPI_Comm;
use mpi::raw::AsRaw;
use mpi::topology::Communicator;
use mpi::traits::*;

use super::progress::{self, Shadow};

/// A communicator's ledger (see the module docs).
#[derive(Default)]
pub(in crate::comm) struct Ledger {
    /// Collectives agreed on (or found to differ) so far: the number of the next is one more.
    pub(in crate::comm) count: u64,
    /// The duplicate its nonblocking collectives' data operations go on, once the first
    /// nonblocking collective has agreed.
    pub(in crate::comm) shadow: Option<Shadow>,
    /// The last collective's fingerprint and words, when it ended in a mismatch: the next
    /// collective compares every rank's (a rank whose last collective is the others'
    /// current one skipped one).
    pub(in crate::comm) suspect: Option<(i64, String)>,
    /// The first finding that the ranks are out of step (then every collective fails).
    pub(in crate::comm) out_of_step: Option<String>,
    /// The duplicate the steps of its plans go on (made at the first plan's build), and
    /// the plans built so far.
    plans: Option<MPI_Comm>,
    plans_built: u64,
}

/// The attribute: the ledger, shared with the nonblocking collectives still pending on the
/// communicator (a communicator is used by one thread at a time in this crate's calls).
#[derive(Clone)]
struct Attr(Rc<RefCell<Ledger>>);

impl CommAttribute for Attr {
    unsafe extern "C" fn comm_delete_attr_fn(
        _comm: MPI_Comm,
        _key: std::os::raw::c_int,
        val: *mut c_void,
        _extra: *mut c_void,
    ) -> std::os::raw::c_int {
        // SAFETY: the attribute was set from a `Box<Attr>` (`with`) and MPI calls this once,
        // when the caller's communicator is freed.
        let attr = unsafe { Box::from_raw(val.cast::<Attr>()) };
        // The borrow ends before the shadow is freed: freeing it completes the agreements
        // still pending on it, which write this ledger (a borrow held across it panicked,
        // and a panic here aborts: `Free()` of an mpi4py communicator with a request
        // pending).
        let (shadow, plans) = {
            let mut l = attr.0.borrow_mut();
            (l.shadow.take(), l.plans.take())
        };
        if let Some(shadow) = shadow {
            progress::free_shadow(shadow);
        }
        if let Some(mut plans) = plans {
            // SAFETY: our own duplicate; every plan borrows the communicator it was made
            // from, so none is left.
            unsafe { mpi::ffi::MPI_Comm_free(&mut plans) };
        }
        // MPI_SUCCESS is 0.
        std::os::raw::c_int::try_from(mpi::ffi::MPI_SUCCESS).unwrap_or(0)
    }
}

/// The ledger of `comm` (made empty the first time).
pub(in crate::comm) fn of<C: Communicator + ?Sized>(comm: &C) -> Rc<RefCell<Ledger>> {
    if let Some(attr) = comm.get_attr::<Attr>() {
        return Rc::clone(&attr.0);
    }
    let ledger = Rc::new(RefCell::new(Ledger::default()));
    let attr = Box::into_raw(Box::new(Attr(Rc::clone(&ledger))));
    let key: AttributeKey = Attr::get_key();
    // SAFETY: the attribute is a `Box<Attr>`, freed by `comm_delete_attr_fn`; `comm` is live.
    unsafe { mpi::ffi::MPI_Comm_set_attr(comm.as_raw(), key.as_raw(), attr.cast()) };
    ledger
}

/// The shadow of `comm` if its first nonblocking collective has agreed.
pub(in crate::comm) fn shadow<C: Communicator + ?Sized>(comm: &C) -> Option<Shadow> {
    comm.get_attr::<Attr>().and_then(|a| a.0.borrow().shadow)
}

/// The communicator the steps of `comm`'s plans go on, made at the first plan's build (a
/// duplicate: `MPI_Comm_dup`, collective; every rank calls this at the same build, after
/// its agreement), and the ordinal of the plan being built (0 for the first).
pub(in crate::comm) fn plans<C: Communicator + ?Sized>(comm: &C) -> (MPI_Comm, u64) {
    let ledger = of(comm);
    let made = ledger.borrow().plans;
    let plans = made.unwrap_or_else(|| {
        // SAFETY: a constant handle of the MPI library.
        let mut dup = unsafe { mpi::ffi::RSMPI_COMM_NULL };
        // SAFETY: our own duplicate of a live intra-communicator, freed with it (the delete
        // callback above).
        unsafe { mpi::ffi::MPI_Comm_dup(comm.as_raw(), &mut dup) };
        dup
    });
    let mut l = ledger.borrow_mut();
    l.plans = Some(plans);
    l.plans_built += 1;
    (plans, l.plans_built - 1)
}

/// Clears the out-of-step state of `comm` and what the last mismatch left, after a
/// barrier on it (`MPI_Ibarrier`, waited for as every blocking path of this crate): every rank of `comm` calls it (collectively), with no collective of
/// this crate pending on `comm`. Returns whether it was out of step.
pub(in crate::comm) fn reset<C: Communicator + ?Sized>(comm: &C) -> bool {
    // SAFETY: a constant handle of the MPI library.
    let mut req = unsafe { mpi::ffi::RSMPI_REQUEST_NULL };
    // SAFETY: `comm` is a live intra-communicator; every rank calls this here.
    unsafe { mpi::ffi::MPI_Ibarrier(comm.as_raw(), &mut req) };
    // Polled while nonblocking collectives of this rank are pending (their peers may need
    // this rank's progress), as every blocking path of this crate.
    progress::wait_raw(&mut [req]);
    let ledger = of(comm);
    let mut l = ledger.borrow_mut();
    l.suspect = None;
    l.out_of_step.take().is_some()
}
