//! The local argument checks of [`crate::comm`], all made before any MPI call: ranks
//! and tags in range, intra-communicators for collectives, send/receive pairs of one dtype
//! and disjoint in memory, counts consistent with each other and with the communicator
//! size, per-rank block lists, and a probed incoming message against its receive buffer.
//!
//! `check_rank` and `check_tag` also serve the self-describing messages (`checked`) and the
//! transport, which sit above this module.

use mpi::datatype::{AsDatatype, Collection, Equivalence};
use mpi::point_to_point::Status;
use mpi::topology::{Communicator, Rank};
use mpi::Count;
use mpi::Tag;

use crate::dtype::ElementType;
use crate::error::{Error, Result};
use crate::spec::facts::Facts;
use crate::spec::side::{Out, Side};
use crate::spec::{self};

extern "C" {
    /// `MPI_TAG_UB` of `MPI_COMM_WORLD`, or -1, from `src/shim.c`.
    fn dlpack_mpi_tag_ub() -> std::ffi::c_int;
}

/// The largest valid tag (MPI guarantees at least 32767), read once.
fn tag_ub() -> Tag {
    static TAG_UB: std::sync::OnceLock<Tag> = std::sync::OnceLock::new();
    *TAG_UB.get_or_init(|| {
        // SAFETY: a plain attribute query; the shim checks MPI is initialized first.
        let ub = unsafe { dlpack_mpi_tag_ub() };
        if ub >= 32767 {
            ub
        } else {
            32767
        }
    })
}

/// A rank of a communicator of `size` ranks (`0..size`).
///
/// # Errors
/// [`Error::InvalidRank`].
pub(crate) fn check_rank(rank: Rank, size: Rank) -> Result<()> {
    if (0..size).contains(&rank) {
        Ok(())
    } else {
        Err(Error::InvalidRank { rank, size })
    }
}

/// A tag in `0..=MPI_TAG_UB` (MPI-4.1 §3.2.3).
///
/// # Errors
/// [`Error::InvalidTag`].
pub(crate) fn check_tag(tag: Tag) -> Result<()> {
    let ub = tag_ub();
    if (0..=ub).contains(&tag) {
        Ok(())
    } else {
        Err(Error::InvalidTag { tag, tag_ub: ub })
    }
}

/// `MPI_ANY_SOURCE`, the source of a receive that takes a message from any rank (MPI-4.1
/// §3.2.4): this MPI library's value (-1 under Open MPI, -2 under MPICH).
pub fn any_source() -> Rank {
    // SAFETY: a constant of the MPI library, defined before `MPI_Init`.
    unsafe { mpi::ffi::RSMPI_ANY_SOURCE }
}

/// `MPI_ANY_TAG`, the tag of a receive that takes a message of any tag (MPI-4.1 §3.2.4).
pub fn any_tag() -> Tag {
    // SAFETY: as in `any_source`.
    unsafe { mpi::ffi::RSMPI_ANY_TAG }
}

/// A receive's source and tag: a rank of `comm` or [`any_source`], a tag in
/// `0..=MPI_TAG_UB` or [`any_tag`] (MPI-4.1 §3.2.4).
///
/// # Errors
/// [`Error::InvalidRank`], [`Error::InvalidTag`].
pub(crate) fn check_source<C: Communicator + ?Sized>(
    comm: &C,
    source: Rank,
    tag: Tag,
) -> Result<()> {
    if source != any_source() {
        check_rank(source, comm.target_size())?;
    }
    if tag != any_tag() {
        check_tag(tag)?;
    }
    Ok(())
}

/// Collectives here are defined for intra-communicators only (an inter-communicator's
/// collectives use `MPI_ROOT`/`MPI_PROC_NULL` roots and remote-group counts).
pub(in crate::comm) fn check_intra<C: Communicator + ?Sized>(comm: &C) -> Result<()> {
    if comm.test_inter() {
        Err(Error::Intercommunicator)
    } else {
        Ok(())
    }
}

/// MPI forbids a send and a receive buffer of one call to overlap (MPI-4.1 §2.3, "buffers
/// ... must not alias"); Open MPI aborts with MPI_ERR_BUFFER. Checked on the byte ranges
/// (conservative for interleaved strided tensors).
pub(in crate::comm) fn check_disjoint(s: &Facts, r: &Facts) -> Result<()> {
    let (s0, s1, r0, r1) = (s.start, s.end, r.start, r.end);
    if s0 < s1 && r0 < r1 && s0 < r1 && r0 < s1 {
        Err(Error::BuffersAlias {
            send_address: s0,
            send_bytes: s1 - s0,
            recv_address: r0,
            recv_bytes: r1 - r0,
        })
    } else {
        Ok(())
    }
}

/// A point-to-point peer and tag: `rank` in `comm`'s target group ([`check_rank`] against
/// `target_size`, the remote group of an inter-communicator) and `tag` in MPI's range
/// ([`check_tag`]).
///
/// # Errors
/// [`Error::InvalidRank`], then [`Error::InvalidTag`].
pub(crate) fn check_peer<C: Communicator + ?Sized>(comm: &C, rank: Rank, tag: Tag) -> Result<()> {
    check_rank(rank, comm.target_size())?;
    check_tag(tag)
}

/// A send and a receive buffer of one collective: same dtype, and disjoint in memory.
pub(in crate::comm) fn check_pair(what: &'static str, s: &Facts, r: &Facts) -> Result<()> {
    let (left, right) = (s.element.dtype, r.element.dtype);
    if left != right {
        return Err(Error::DtypeMismatch { what, left, right });
    }
    check_disjoint(s, r)
}

pub(in crate::comm) fn check_count(
    what: impl FnOnce() -> String,
    expected: i64,
    actual: i64,
) -> Result<()> {
    if expected == actual {
        Ok(())
    } else {
        Err(Error::CountMismatch {
            what: what(),
            expected,
            actual,
        })
    }
}

/// The error for a buffer the root requires and did not get ([`Error::MissingBuffer`]
/// naming it, e.g. `"gather receive buffer"`).
pub(in crate::comm) fn missing(what: &'static str) -> Error {
    Error::MissingBuffer { what }
}

/// A rank or a communicator size as an index into per-rank lists. Only for values that
/// cannot be negative: a size or rank MPI reports (`MPI_Comm_size` ≥ 1, `MPI_Comm_rank` in
/// `0..size`, MPI-4.1 §7.4.1), or a root that passed [`check_rank`].
// A non-negative i32 fits usize on every target with MPI (usize is at least 32 bits), so
// the cast loses no sign and truncates nothing.
#[allow(clippy::cast_sign_loss)]
#[inline]
pub(in crate::comm) fn rank_index(rank: Rank) -> usize {
    rank as usize
}

/// One count and one displacement per rank of `comm`.
fn check_len<C: Communicator + ?Sized>(comm: &C, counts: &[i64], displs: &[i64]) -> Result<()> {
    let size = rank_index(comm.size());
    for (what, list) in [("counts", counts), ("displacements", displs)] {
        if list.len() != size {
            return Err(Error::LengthMismatch {
                what,
                expected: size,
                actual: list.len(),
            });
        }
    }
    Ok(())
}

/// Per-rank blocks (elements, one per rank of `comm`) of a tensor of `len_elems` elements:
/// checked (inside it; pairwise disjoint when `disjoint`) and converted to MPI units of its
/// predefined type ([`spec::blocks_in_units`]).
pub(in crate::comm) fn rank_blocks<C: Communicator + ?Sized>(
    comm: &C,
    len_elems: i64,
    element: &ElementType,
    counts: &[i64],
    displs: &[i64],
    disjoint: bool,
) -> Result<(Vec<Count>, Vec<Count>)> {
    check_len(comm, counts, displs)?;
    spec::blocks_in_units(len_elems, element, counts, displs, disjoint)
}

/// Compares a probed message with a receive side: the message must be exactly `count`
/// items of the side's datatype (so strided, packed and large-count receives compare whole
/// messages); the error reports elements.
pub(in crate::comm) fn check_incoming(side: &Side<'_, Out>, status: &Status) -> Result<()> {
    if status.count(side.as_datatype()) == side.count() {
        return Ok(());
    }
    let bytes = i64::from(status.count(u8::equivalent_datatype()));
    let elem = side.element().size_bytes_i64();
    Err(Error::CountMismatch {
        what: format!(
            "incoming message from rank {} tag {} ({} of {}-byte elements)",
            status.source_rank(),
            status.tag(),
            if bytes >= 0 {
                format!("{bytes} bytes")
            } else {
                "more than 2^31 bytes".to_string()
            },
            elem
        ),
        expected: side.len_elems(),
        actual: if bytes >= 0 { bytes / elem } else { -1 },
    })
}
