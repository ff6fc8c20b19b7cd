//! `DLPACK_MPI_PLAN_CHECK` (what each step of a plan, [`crate::comm::Plan`], checks) and
//! `DLPACK_MPI_PLAN_MECHANISM` (which MPI calls its steps make).

use super::{choice, Setting};
#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;

/// What each step of a plan checks across the ranks (the build always runs the full
/// agreement).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PlanCheck {
    /// No message of its own: the plan's identity travels in spare elements of its first
    /// packed bucket where the bucket's reduction can carry it ([`crate::comm::Plan::checks`]
    /// says where it does), and a step that met another plan's step returns
    /// [`Error::PlanMismatch`]. The default.
    #[default]
    Identity,
    /// A full agreement before every step (one small all-reduce on the plan's communicator
    /// of origin, as an unplanned collective's): any difference between the ranks' steps,
    /// also a plan's step against an unplanned collective, is named in words on every rank
    /// before data moves. For debugging: it costs what plans save.
    Each,
}

/// The environment variable that sets [`plan_check`] when [`set_plan_check`] was not called.
pub const PLAN_CHECK_ENV: &str = "DLPACK_MPI_PLAN_CHECK";

pub(super) static PLAN_CHECK: Setting<PlanCheck> =
    Setting::new(PLAN_CHECK_ENV, "identity or each", |v| {
        choice(
            &[("identity", PlanCheck::Identity), ("each", PlanCheck::Each)],
            v,
        )
    });

/// What each plan step checks: [`set_plan_check`], else `DLPACK_MPI_PLAN_CHECK=identity|each`
/// in the environment (read once), else [`PlanCheck::Identity`]. Every rank must use the
/// same.
///
/// Read at a plan's build, for the plan's life; the build's signature carries it, so ranks
/// that differ get [`Error::CollectiveMismatch`] at the build.
///
/// # Errors
/// [`Error::InvalidSetting`] when `DLPACK_MPI_PLAN_CHECK` holds another value: the build
/// refuses it (on every rank, through its agreement).
pub fn plan_check() -> Result<PlanCheck> {
    PLAN_CHECK.get_or(PlanCheck::default)
}

/// Sets what each plan step checks (see [`plan_check`]).
pub fn set_plan_check(check: PlanCheck) {
    PLAN_CHECK.set(check);
}

/// Which MPI calls a plan's steps make (chosen at its build; every rank must use the same:
/// the build's signature carries it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PlanMechanism {
    /// The nonblocking collectives (`MPI_Iallreduce`, …), waited for by `run`: one kind of
    /// MPI call for `run` and `start` on every rank, whatever each rank has pending, and two
    /// plans' steps crossed between ranks meet (and their identity names it). The default
    /// (`docs/PERFORMANCE.md`, "Plans", has what it costs per MPI).
    #[default]
    Auto,
    /// `run` makes the blocking collectives (`MPI_Allreduce`, …; the fastest under Open MPI
    /// 4.1, whose nonblocking collectives are slower), `start` the nonblocking ones. The
    /// caller's contract: every rank steps the plan the same way (all `run` or all
    /// `start`), and no nonblocking collective of this crate is pending on any rank while
    /// a step runs; otherwise ranks wait for each other (a blocking and a nonblocking
    /// collective never match, MPI-4.1 §6.12).
    Blocking,
    /// The MPI-4 persistent collectives (`MPI_Allreduce_init` at the build, `MPI_Startall`
    /// at each step, MPI-4.1 §6.13) where this MPI has them (MPICH ≥ 4, Open MPI ≥ 5:
    /// declared by its `mpi.h` and found in the library loaded) and every bucket is a
    /// buffer of the plan's own; else as [`PlanMechanism::Auto`]
    /// ([`crate::comm::Plan::is_persistent`] says which). A persistent collective matches
    /// only its own initialization on the other ranks: two plans' steps crossed between
    /// ranks then wait for each other instead of being named.
    Persistent,
}

/// The environment variable that sets [`plan_mechanism`] when [`set_plan_mechanism`] was
/// not called.
pub const PLAN_MECHANISM_ENV: &str = "DLPACK_MPI_PLAN_MECHANISM";

pub(super) static PLAN_MECHANISM: Setting<PlanMechanism> =
    Setting::new(PLAN_MECHANISM_ENV, "auto, blocking or persistent", |v| {
        choice(
            &[
                ("auto", PlanMechanism::Auto),
                ("blocking", PlanMechanism::Blocking),
                ("persistent", PlanMechanism::Persistent),
            ],
            v,
        )
    });

/// Which MPI calls a plan's steps make: [`set_plan_mechanism`], else
/// `DLPACK_MPI_PLAN_MECHANISM=auto|blocking|persistent` (read once), else
/// [`PlanMechanism::Auto`]. Every rank must use the same: the build's signature carries it
/// (ranks that differ get [`Error::CollectiveMismatch`] at the build).
///
/// # Errors
/// [`Error::InvalidSetting`] for another value: a plan's build then refuses (on every
/// rank, through its agreement).
pub fn plan_mechanism() -> Result<PlanMechanism> {
    PLAN_MECHANISM.get_or(PlanMechanism::default)
}

/// Sets which MPI calls plans built from now on make (see [`plan_mechanism`]).
pub fn set_plan_mechanism(mechanism: PlanMechanism) {
    PLAN_MECHANISM.set(mechanism);
}
