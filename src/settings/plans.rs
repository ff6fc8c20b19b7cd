//! `DLPACK_MPI_PLAN_CHECK`: what each step of a plan ([`crate::comm::Plan`]) checks.

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
/// # Errors
/// [`Error::InvalidSetting`] when `DLPACK_MPI_PLAN_CHECK` holds another value; a step then
/// agrees in full (the safe choice) and returns this error on the rank that read it.
pub fn plan_check() -> Result<PlanCheck> {
    PLAN_CHECK.get_or(PlanCheck::default)
}

/// Sets what each plan step checks (see [`plan_check`]).
pub fn set_plan_check(check: PlanCheck) {
    PLAN_CHECK.set(check);
}
