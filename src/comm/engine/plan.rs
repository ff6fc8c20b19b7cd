//! Plans (issue 32): a collective over the same tensors, agreed once and then run step after
//! step at MPI's speed ([`Plan`]).
//!
//! **Build.** A plan is built collectively, once: its operation prepares a batch of calls
//! (a fused list's buckets, [`Batch`]) after every check, the ranks agree on it with the full
//! agreement of an unplanned collective (the lists compared member by member, named in words
//! on failure, [`super::agree`]), and the plan takes the communicator its steps go on: one
//! duplicate per caller's communicator, shared by its plans (`MPI_Comm_dup` at the first
//! plan's build, kept in the [`super::ledger`] and freed with the caller's communicator), so
//! that a step never meets an unplanned collective, whose messages go on the caller's
//! communicator or its shadow.
//!
//! **Steps.** [`Plan::run`] (blocking) and [`Plan::start`] (nonblocking, a [`PlanRequest`])
//! run the batch again: no agreement, no per-member check, no allocation; each step packs
//! the members' current values and unpacks the results into them. Both post the same MPI
//! calls, the nonblocking collectives (`MPI_Iallreduce`, …) or the persistent ones, and
//! `run` waits at once: a blocking collective never matches a nonblocking one (MPI-4.1
//! §6.12), so a rank that runs a step meets a rank that starts it, and neither depends on
//! which nonblocking collectives of this crate each has pending (they progress while a
//! step is waited for, [`progress::wait_raw`]).
//!
//! **Identity.** A plan's identity (its signature's fingerprint and its ordinal among the
//! caller's communicator's plans) travels in spare elements of its first packed bucket,
//! where that bucket's operation can carry it ([`Batch::marked`]; the table is in the fused
//! collectives' `mark.rs`): a step that met another plan's step, a plan built in another
//! order, or a refused step returns [`Error::PlanMismatch`] on every rank that can see it.
//! What a step cannot see — a plan whose first bucket cannot carry the mark, steps of
//! different sizes (MPI's own error or a wait), a step against an unplanned collective (it
//! waits: they are on different communicators) — `DLPACK_MPI_PLAN_CHECK=each`
//! ([`PlanCheck::Each`]) names in words, with a full agreement before each step.
//!
//! **Lifetimes.** The plan borrows its endpoint and its list for `'a`; the members are
//! reached between steps through [`Plan::tensors_mut`], after which the next step compares
//! each member with what the plan was built from (pointer, dtype, shape, strides, device)
//! and refuses the step, for good, if one changed ([`Error::PlanChanged`]): the step still
//! takes part, on the plan's own buffers, so that no peer waits. A step in flight is
//! completed before the members are lent again, before the next step, and when the plan is
//! dropped; so MPI never uses a member after the plan's borrow ends, even if a
//! [`PlanRequest`] is forgotten.

use std::fmt;
use std::marker::PhantomData;

use mpi::ffi::{MPI_Comm, MPI_Request};
use mpi::raw::AsRaw;
use mpi::request::Scope;
use mpi::topology::SimpleCommunicator;
use mpi::traits::FromRaw;

use super::agree::agree;
use super::call::{Batch, Form};
use super::ledger;
use super::progress;
use super::signature::Signature;
use super::snapshot::{changed, Snapshot};
use super::stager::Endpoint;
use crate::dlpack::{Tensor, TensorListMut};
use crate::error::{Error, Result};
use crate::settings::{plan_check, plan_mechanism, PlanCheck, PlanMechanism};

/// A collective planned once over the same tensors, run step after step (see the module
/// docs): built by the `plan_*` methods of [`crate::comm::TensorComm`].
///
/// `L` is the list the plan writes (`Vec<ManagedTensor>`, `[&mut dyn Tensor]`, `[T; 1]` for
/// one tensor, …) and `S` the list it only reads, for plans with a send list
/// (`plan_all_reduce_tensors`, `plan_reduce_scatter_block_tensors`, `plan_all_gather_tensor`):
/// write the members' values between steps through [`Plan::tensors_mut`] and
/// [`Plan::send_tensors_mut`].
///
/// ```no_run
/// use dlpack_mpi::comm::TensorComm;
/// use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned, Tensor};
/// use dlpack_mpi::dtype::ReduceOp;
/// use mpi::traits::*;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let universe = mpi::initialize().unwrap();
/// let world = universe.world();
/// let (a, b) = (Owned::new(vec![0.0f32; 1000]), Owned::new(vec![0i64; 10]));
/// let opts = AcquireOptions::default();
/// let mut grads = vec![acquire(&a, &opts)?, acquire(&b, &opts)?];
/// let mut plan = world.plan_all_reduce_tensors_in_place(&mut grads, ReduceOp::Sum)?;
/// for step in 0..100 {
///     plan.tensors_mut()[0].as_mut_slice::<f32>()?.fill(step as f32); // compute
///     mpi::request::scope(|scope| {
///         let request = plan.start(scope)?; // the sums, while …
///         // … other work …
///         request.wait()
///     })?;
///     assert_eq!(plan.tensors()[0].as_slice::<f32>()?[0], step as f32 * world.size() as f32);
/// }
/// # Ok(()) }
/// ```
pub struct Plan<'a, L: ?Sized, S: ?Sized = L> {
    list: &'a mut L,
    send: Option<&'a mut S>,
    batch: Box<dyn Batch>,
    /// The communicator the steps go on (see the module docs).
    steps: MPI_Comm,
    /// The caller's communicator, for [`PlanCheck::Each`]'s agreement.
    caller: MPI_Comm,
    /// The signature of each step, for [`PlanCheck::Each`].
    step: Signature<'static>,
    id: u64,
    /// What the members were at the build: the written list's, then the send list's.
    snapshot: (Vec<Snapshot>, Vec<Snapshot>),
    /// Whether the members were lent since the last step.
    lent: bool,
    /// The refusal of every step, once a member changed.
    changed: Option<Error>,
    /// What each step checks (read at the build, the same on every rank).
    check: PlanCheck,
    /// Whether the steps start MPI-4 persistent collectives.
    persistent: bool,
    /// Whether `run` makes the blocking collectives ([`PlanMechanism::Blocking`]).
    blocking: bool,
    /// The requests of the step in flight, and how many have completed.
    requests: Vec<MPI_Request>,
    done: usize,
    /// Whether a step is in flight (posted, not completed).
    in_flight: bool,
    _endpoint: PhantomData<&'a ()>,
}

impl<L: ?Sized, S: ?Sized> fmt::Debug for Plan<'_, L, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plan")
            .field("id", &format_args!("{:#018x}", self.id))
            .field("members", &(self.snapshot.0.len(), self.snapshot.1.len()))
            .field("batch", &self.batch)
            .field("in_flight", &self.in_flight)
            .field("changed", &self.changed)
            .finish_non_exhaustive()
    }
}

/// The plan settings every rank must share, in words for a plan's signature (empty for the
/// defaults; an unreadable setting as its default here: the build refuses it).
pub(in crate::comm) fn settings_words() -> &'static str {
    let m = plan_mechanism().unwrap_or_default();
    let c = plan_check().unwrap_or_default();
    match (m, c) {
        (PlanMechanism::Auto, PlanCheck::Identity) => "",
        (PlanMechanism::Blocking, PlanCheck::Identity) => "mechanism blocking",
        (PlanMechanism::Persistent, PlanCheck::Identity) => "mechanism persistent",
        (PlanMechanism::Auto, PlanCheck::Each) => "checked at each step",
        (PlanMechanism::Blocking, PlanCheck::Each) => "mechanism blocking, checked at each step",
        (PlanMechanism::Persistent, PlanCheck::Each) => {
            "mechanism persistent, checked at each step"
        }
    }
}

/// The caller's communicator `raw` as rsmpi's, never freed here: `MPI_COMM_WORLD` and
/// `MPI_COMM_SELF` by their own constructors (rsmpi's `from_raw` refuses them).
fn caller(raw: MPI_Comm) -> std::mem::ManuallyDrop<SimpleCommunicator> {
    // SAFETY: constant handles of the MPI library.
    let (world, this) = unsafe { (mpi::ffi::RSMPI_COMM_WORLD, mpi::ffi::RSMPI_COMM_SELF) };
    std::mem::ManuallyDrop::new(if raw == world {
        SimpleCommunicator::world()
    } else if raw == this {
        SimpleCommunicator::self_comm()
    } else {
        // SAFETY: the caller's communicator, borrowed by the plan for 'a (never freed
        // while it lives), neither world nor self.
        unsafe { SimpleCommunicator::from_raw(raw) }
    })
}

/// One 64-bit mix of `a` and `b` (splitmix64's finalizer over their sum).
fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The members of a list, read (their facts, the snapshot).
fn members<L: TensorListMut + ?Sized>(list: &mut L) -> Vec<&dyn Tensor> {
    list.tensors_mut()
        .into_iter()
        .map(|t| &*t as &dyn Tensor)
        .collect()
}

/// Builds a plan over `list` (written) and `send` (read, where the operation has a send
/// list) on `tc`'s communicator: `prepare` makes its batch from the members (every check),
/// the ranks agree on `build` (its signature; refusals and mismatches are errors on every
/// rank), and every rank takes the plans' communicator. `step` is each step's signature,
/// for [`PlanCheck::Each`].
///
/// # Errors
/// `prepare`'s and the agreement's ([`Error::PeerRefused`], [`Error::CollectiveMismatch`],
/// [`Error::OutOfStep`]).
pub(in crate::comm) fn build<'a, E, L, S>(
    tc: &'a E,
    (list, mut send): (&'a mut L, Option<&'a mut S>),
    (build, step): (Signature<'static>, Signature<'static>),
    prepare: impl FnOnce(&[&dyn Tensor], Option<&[&dyn Tensor]>) -> Result<Box<dyn Batch>>,
) -> Result<Plan<'a, L, S>>
where
    E: Endpoint + ?Sized,
    L: TensorListMut + ?Sized,
    S: TensorListMut + ?Sized,
{
    let comm = tc.communicator();
    let (prepared, snapshot) = {
        let written = members(list);
        let read = send.as_deref_mut().map(members);
        let snap = |m: &[&dyn Tensor]| m.iter().map(|t| Snapshot::of(*t)).collect();
        let snapshot = (snap(&written), read.as_deref().map_or_else(Vec::new, snap));
        (prepare(&written, read.as_deref()), snapshot)
    };
    // The settings as the signature said them (agreed), read once for the plan's life.
    let prepared = prepared.and_then(|b| Ok((b, plan_mechanism()?, plan_check()?)));
    let ((mut batch, mechanism, check), _) = agree(comm, &build, prepared)?;
    let (steps, ordinal) = ledger::plans(comm);
    let step = step.plan_ordinal(ordinal);
    // Every rank decides alike: the same setting (agreed), batch and MPI library.
    let persistent = mechanism == PlanMechanism::Persistent
        // SAFETY: the batch's buffers live as long as the plan, which completes every step
        // before it drops the batch (which frees the requests while inactive).
        && unsafe { batch.persist(steps) };
    let blocking = mechanism == PlanMechanism::Blocking;
    #[allow(clippy::cast_sign_loss)]
    let id = mix(build.fingerprint() as u64, ordinal) | 1;
    let requests = Vec::with_capacity(batch.requests());
    Ok(Plan {
        list,
        send,
        batch,
        steps,
        caller: comm.as_raw(),
        step,
        id,
        snapshot,
        lent: false,
        changed: None,
        check,
        persistent,
        blocking,
        requests,
        done: 0,
        in_flight: false,
        _endpoint: PhantomData,
    })
}

impl<'a, L: TensorListMut + ?Sized, S: TensorListMut + ?Sized> Plan<'a, L, S> {
    /// Runs one step, blocking: the members' current values, reduced or broadcast as the
    /// plan says, written back into them.
    ///
    /// # Errors
    /// [`Error::PlanMismatch`] when the step met another plan's (see [`Plan::checks`]);
    /// [`Error::PlanChanged`] once a member changed; under [`PlanCheck::Each`] the
    /// agreement's errors; a device copy's.
    pub fn run(&mut self) -> Result<()> {
        let refused = self.begin()?;
        if self.blocking {
            // `PlanMechanism::Blocking`: the caller's contract (every rank runs its steps,
            // none starts them, with no nonblocking collective of this crate pending).
            self.in_flight = true;
            // SAFETY: the batch's buffers are its own or the members', which the plan
            // borrows for 'a and compared with the build's (`begin`); every rank agreed on
            // this plan and its mechanism at its build, and steps it in the same order.
            unsafe { self.batch.run(self.steps, Form::Blocking) };
            self.in_flight = false;
            return refused.and(self.batch.step_outcome());
        }
        // The nonblocking calls (or the persistent ones), waited for: every rank's step is
        // then the same MPI call whether it runs or starts it and whatever nonblocking
        // collectives it has pending (which it progresses while it waits), as MPI-4.1
        // §6.12 needs (a blocking and a nonblocking collective never match).
        self.post();
        self.finish(refused)
    }

    /// Starts one step, nonblocking, inside the rsmpi scope `scope` (as the nonblocking
    /// collectives are: `mpi::request::scope(|scope| …)`); [`PlanRequest::wait`] completes
    /// it (and the plan stays borrowed until then). The step is registered with the scope
    /// until it completes, so that a request and a plan both forgotten (`mem::forget`)
    /// abort at the scope's end, as rsmpi's own requests do, before the members' storage
    /// can be freed under MPI (the plan, borrowed for the scope's lifetime, outlives it).
    ///
    /// # Errors
    /// Under [`PlanCheck::Each`], the agreement's (before anything is posted). The step's
    /// own errors come from [`PlanRequest::wait`].
    pub fn start<'s, Sc: Scope<'s> + Copy>(
        &'s mut self,
        scope: Sc,
    ) -> Result<PlanRequest<'s, 'a, Sc, L, S>> {
        let refused = self.begin()?;
        self.post();
        scope.register();
        Ok(PlanRequest {
            plan: self,
            refused: Some(refused),
            scope,
        })
    }

    /// The members, for reading between steps (a step in flight is completed first).
    pub fn tensors(&mut self) -> &L {
        let _ = self.complete();
        self.list
    }

    /// The members, for writing their values between steps (a step in flight is completed
    /// first). The next step compares each member with what the plan was built from: a
    /// member replaced, reshaped or moved makes every later step [`Error::PlanChanged`].
    pub fn tensors_mut(&mut self) -> &mut L {
        let _ = self.complete();
        self.lent = true;
        self.list
    }

    /// The send list's members, for writing their values between steps, as
    /// [`Plan::tensors_mut`]; `None` for a plan without a send list (in place, broadcast).
    pub fn send_tensors_mut(&mut self) -> Option<&mut S> {
        let _ = self.complete();
        self.lent = true;
        self.send.as_deref_mut()
    }

    /// Whether the steps start MPI-4 persistent collectives made at the build
    /// ([`PlanMechanism::Persistent`] where this MPI has them and every bucket is a buffer
    /// of the plan's own), rather than the blocking or nonblocking calls.
    pub fn is_persistent(&self) -> bool {
        self.persistent
    }

    /// What a step of this plan checks across the ranks, in words: where its identity
    /// travels and which mismatch it shows; `None` when its batch cannot carry it (then
    /// only [`PlanCheck::Each`] finds a mismatched step).
    pub fn checks(&self) -> Option<&'static str> {
        self.batch.marked()
    }

    /// The common start of a step: a step in flight completed, the members compared if
    /// they were lent, the full agreement under [`PlanCheck::Each`], the batch rearmed.
    /// Returns this rank's refusal, which the step still takes part with.
    fn begin(&mut self) -> Result<Result<()>> {
        let _ = self.complete();
        if self.lent {
            self.lent = false;
            self.compare();
        }
        let refused = self.changed.clone().map_or(Ok(()), Err);
        let refused = match self.check {
            PlanCheck::Identity => refused,
            PlanCheck::Each => {
                let caller = caller(self.caller);
                agree(&*caller, &self.step, refused)?;
                Ok(())
            }
        };
        self.batch.rearm(self.id, refused.is_err());
        Ok(refused)
    }

    /// Compares the members with what the plan was built from; the first difference
    /// refuses every later step.
    fn compare(&mut self) {
        if self.changed.is_some() {
            return;
        }
        self.changed = changed(&self.snapshot.0, self.list, (0, false));
        if let (None, Some(send)) = (&self.changed, self.send.as_deref_mut()) {
            self.changed = changed(&self.snapshot.1, send, (0, true));
        }
    }

    /// Posts the step's calls on the plans' communicator.
    fn post(&mut self) {
        self.requests.clear();
        self.done = 0;
        self.in_flight = true;
        // SAFETY: as in `run`; the batch and its buffers stay untouched until every request
        // completed (`complete`, called before the members are lent, before the next step
        // and on drop).
        unsafe { self.batch.post(self.steps, &mut self.requests) };
    }

    /// Completes the step in flight (if any), in posting order, telling the batch of each.
    fn complete(&mut self) -> Result<()> {
        if !self.in_flight {
            return Ok(());
        }
        while self.done < self.requests.len() {
            progress::wait_raw(&mut self.requests[self.done..=self.done]);
            self.done += 1;
            self.batch.completed_one();
        }
        self.in_flight = false;
        self.batch.step_outcome()
    }

    /// Completes the step in flight and returns its outcome after `refused`.
    fn finish(&mut self, refused: Result<()>) -> Result<()> {
        let out = self.complete();
        refused.and(out)
    }

    /// Tests the step in flight: whether every request has completed (then it is
    /// finished).
    fn test(&mut self) -> Result<bool> {
        progress::progress_all();
        while self.done < self.requests.len() {
            let mut flag = 0;
            // SAFETY: a request this plan posted and has not completed; MPI sets it to
            // MPI_REQUEST_NULL when it completes.
            unsafe {
                mpi::ffi::MPI_Test(
                    &mut self.requests[self.done],
                    &mut flag,
                    mpi::ffi::RSMPI_STATUS_IGNORE,
                );
            }
            if flag == 0 {
                return Ok(false);
            }
            self.done += 1;
            self.batch.completed_one();
        }
        Ok(true)
    }
}

impl<L: ?Sized, S: ?Sized> Drop for Plan<'_, L, S> {
    fn drop(&mut self) {
        // A step in flight (a forgotten request) completes before the members' borrow ends.
        if self.in_flight {
            while self.done < self.requests.len() {
                progress::wait_raw(&mut self.requests[self.done..=self.done]);
                self.done += 1;
                self.batch.completed_one();
            }
        }
    }
}

/// One step of a [`Plan`] in flight ([`Plan::start`]), registered with its rsmpi scope
/// `Sc` until it completes; dropped uncompleted, it waits.
#[must_use = "a started step is complete only after wait (or drop, which waits)"]
pub struct PlanRequest<'p, 'a, Sc, L, S = L>
where
    Sc: Scope<'p> + Copy,
    L: TensorListMut + ?Sized,
    S: TensorListMut + ?Sized,
{
    plan: &'p mut Plan<'a, L, S>,
    /// This rank's refusal of the step (taken by `wait`; `None` once completed).
    refused: Option<Result<()>>,
    scope: Sc,
}

impl<'p, Sc, L, S> fmt::Debug for PlanRequest<'p, '_, Sc, L, S>
where
    Sc: Scope<'p> + Copy,
    L: TensorListMut + ?Sized,
    S: TensorListMut + ?Sized,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlanRequest")
            .field("plan", &self.plan)
            .finish_non_exhaustive()
    }
}

impl<'p, Sc, L, S> PlanRequest<'p, '_, Sc, L, S>
where
    Sc: Scope<'p> + Copy,
    L: TensorListMut + ?Sized,
    S: TensorListMut + ?Sized,
{
    /// Waits for the step: the members hold its results.
    ///
    /// # Errors
    /// As [`Plan::run`].
    pub fn wait(mut self) -> Result<()> {
        let refused = self.refused.take().unwrap_or(Ok(()));
        let out = self.plan.finish(refused);
        // SAFETY: registered by `Plan::start`; the step has completed.
        unsafe { self.scope.unregister() };
        out
    }

    /// Whether the step has completed (then [`PlanRequest::wait`] returns at once);
    /// progresses it and this thread's pending nonblocking collectives.
    ///
    /// # Errors
    /// None yet: the step's errors come from [`PlanRequest::wait`].
    pub fn test(&mut self) -> Result<bool> {
        self.plan.test()
    }
}

impl<'p, Sc, L, S> Drop for PlanRequest<'p, '_, Sc, L, S>
where
    Sc: Scope<'p> + Copy,
    L: TensorListMut + ?Sized,
    S: TensorListMut + ?Sized,
{
    fn drop(&mut self) {
        if self.refused.take().is_some() {
            let _ = self.plan.complete();
            // SAFETY: registered by `Plan::start`; the step has completed.
            unsafe { self.scope.unregister() };
        }
    }
}
