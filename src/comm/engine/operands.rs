//! An operand becomes its side in two steps that every operation shares: its [`Facts`]
//! (the checks of its access and device, once), then the [`Encoding`] its operation needs
//! under the packing policy and the [`Side`] that encoding names. Operations check the
//! facts of their operands against each other in between (dtypes, counts, aliasing).

use super::checks::check_pair;
use super::packing::packs_block;
use crate::dlpack::Tensor;
use crate::error::Result;
use crate::spec::encoding::{Encoding, Need};
use crate::spec::facts::Facts;
use crate::spec::side::{In, Out, Side};
use crate::spec::{Access, Reach};

/// The facts of a tensor MPI reads.
///
/// # Errors
/// As [`Facts::of`].
#[inline]
pub(in crate::comm) fn read_facts(t: &dyn Tensor, reach: Option<Reach>) -> Result<Facts> {
    Facts::of(t, Access::Read, reach)
}

/// The facts of a tensor MPI writes (`access` [`Access::Write`] or [`Access::Update`]).
///
/// # Errors
/// As [`Facts::of`].
#[inline]
pub(in crate::comm) fn write_facts(
    t: &dyn Tensor,
    access: Access,
    reach: Option<Reach>,
) -> Result<Facts> {
    Facts::of(t, access, reach)
}

/// The side MPI reads, of `t` with `facts`, encoded for `need`.
///
/// # Errors
/// As [`Encoding::choose`] and [`Side::<In>::new`].
#[inline]
pub(in crate::comm) fn side_in<'t>(
    t: &'t dyn Tensor,
    facts: Facts,
    need: Need,
) -> Result<Side<'t, In>> {
    let encoding = Encoding::choose(&facts, need, packs_block)?;
    Side::<In>::new(t, facts, encoding)
}

/// The side MPI writes (or updates), of `t` with `facts`, encoded for `need`.
///
/// # Errors
/// As [`Encoding::choose`] and [`Side::<Out>::new`].
#[inline]
pub(in crate::comm) fn side_out<'t>(
    t: &'t mut dyn Tensor,
    facts: Facts,
    need: Need,
    access: Access,
) -> Result<Side<'t, Out>> {
    let encoding = Encoding::choose(&facts, need, packs_block)?;
    Side::<Out>::new(t, facts, encoding, access)
}

/// [`read_facts`] then [`side_in`].
///
/// # Errors
/// As both.
#[inline]
pub(in crate::comm) fn read_side<'t>(
    t: &'t dyn Tensor,
    reach: Option<Reach>,
    need: Need,
) -> Result<Side<'t, In>> {
    let facts = read_facts(t, reach)?;
    side_in(t, facts, need)
}

/// [`write_facts`] then [`side_out`].
///
/// # Errors
/// As both.
#[inline]
pub(in crate::comm) fn write_side<'t>(
    t: &'t mut dyn Tensor,
    access: Access,
    reach: Option<Reach>,
    need: Need,
) -> Result<Side<'t, Out>> {
    let facts = write_facts(&*t, access, reach)?;
    side_out(t, facts, need, access)
}

/// The facts of a collective's send (`s`) and receive (`r`, written with `access`)
/// operands, checked as a pair ([`check_pair`]: one dtype, disjoint memory; `what` names
/// them in its errors).
///
/// # Errors
/// As [`read_facts`], [`write_facts`] and [`check_pair`], in that order.
#[inline]
pub(in crate::comm) fn pair_facts(
    what: &'static str,
    (s, s_reach): (&dyn Tensor, Option<Reach>),
    (r, access, r_reach): (&dyn Tensor, Access, Option<Reach>),
) -> Result<(Facts, Facts)> {
    let sf = read_facts(s, s_reach)?;
    let rf = write_facts(r, access, r_reach)?;
    check_pair(what, &sf, &rf)?;
    Ok((sf, rf))
}
