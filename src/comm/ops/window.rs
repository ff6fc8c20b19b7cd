//! Windowed point-to-point transfers: elements `[start, end)` of a tensor, in elements and
//! logical row-major order (mpi4py's `[buf, count, displacement]` buffer form with
//! `displacement = start`, `count = end - start`), blocking and nonblocking. The message is
//! the window's elements in logical order, whatever the layout.
//!
//! The bounds are checked first (a typed [`crate::Error::OutOfBounds`] naming the
//! displacement, count and tensor length, before any MPI call). A contiguous tensor's
//! window is a run of its own elements (no copy). A strided tensor's window
//! goes through a packed copy of the **whole** tensor (the pack kernels work on whole
//! layouts): a send packs it and sends the window's part; a receive packs the current
//! values, receives into the window's part and unpacks the whole, so the elements outside
//! the window keep their values. That costs one pass over the tensor, whatever the policy
//! ([`crate::comm::Packing`]) says (a derived datatype for a window of a strided layout is not
//! built).

use std::ops::Range;

use mpi::datatype::DatatypeRef;
use mpi::point_to_point::{Destination, Status};
use mpi::raw::AsRaw;
use mpi::request::Scope;
use mpi::topology::{Communicator, Rank};
use mpi::traits::Equivalence;
use mpi::Tag;

use super::p2p::unfit;
use crate::comm::engine::checks::{check_incoming, check_peer};
use crate::comm::engine::operands::{read_facts, side_in, side_out, write_facts};
use crate::comm::engine::request::{isend, post_recv, post_send, TensorRequest};
use crate::comm::engine::stager::Endpoint;
use crate::comm::engine::stager::{read_stand_in, write_stand_in};
use crate::comm::engine::stager::{with_read, with_write, Kind};
use crate::dlpack::Tensor;
use crate::error::{Error, Matched, Result};
use crate::layout;
use crate::raw;
use crate::spec::encoding::Need;
use crate::spec::facts::Facts;
use crate::spec::side::{In, Out, Side};
use crate::spec::{Access, Reach};

fn displacement_count(elems: &Range<i64>) -> (i64, i64) {
    (elems.start, elems.end.saturating_sub(elems.start))
}

fn check_window(displacement: i64, count: i64, len: i64) -> Result<()> {
    layout::check_range(|| "range".to_string(), displacement, count, len)
}

/// The send side of a window: a run of the tensor's own elements (contiguous), or its
/// packed copy whole (strided; the caller posts the window's part of it).
fn window_in<'t>(
    tensor: &'t dyn Tensor,
    reach: Option<Reach>,
    (displacement, count): (i64, i64),
) -> Result<(Side<'t, In>, bool)> {
    let facts = read_facts(tensor, reach)?;
    check_window(displacement, count, facts.len_elems)?;
    if facts.is_contiguous() {
        let w = facts.window("range", displacement, count)?;
        return Ok((side_in(tensor, w, Need::Message)?, false));
    }
    Ok((side_in(tensor, facts, Need::Copy)?, true))
}

/// The receive side of a window: a run of the tensor's own elements (contiguous), or its
/// packed copy whole, holding the current values (strided: the elements outside the
/// window keep them when the copy is unpacked).
fn window_out<'t>(
    tensor: &'t mut dyn Tensor,
    reach: Option<Reach>,
    (displacement, count): (i64, i64),
) -> Result<(Side<'t, Out>, bool)> {
    let facts: Facts = write_facts(&*tensor, Access::Update, reach)?;
    check_window(displacement, count, facts.len_elems)?;
    if facts.is_contiguous() {
        let w = facts.window("range", displacement, count)?;
        return Ok((side_out(tensor, w, Need::Message, Access::Write)?, false));
    }
    Ok((side_out(tensor, facts, Need::Copy, Access::Update)?, true))
}

/// `send_tensor_range`.
pub(in crate::comm) fn send<E: Endpoint + ?Sized>(
    tc: &E,
    tensor: &dyn Tensor,
    elems: Range<i64>,
    dest: Rank,
    tag: Tag,
) -> Result<()> {
    let comm = tc.communicator();
    check_peer(comm, dest, tag)?;
    let window = displacement_count(&elems);
    with_read(tc, Kind::PointToPoint, tensor, |(t, reach)| {
        let (side, part) = window_in(t, reach, window)?;
        if !part {
            comm.process_at_rank(dest).send_with_tag(&side, tag);
            return Ok(());
        }
        let posting = side.window(window.0, window.1)?;
        let posting = (posting.0.cast_const(), posting.1, posting.2);
        // SAFETY: the posting holds its units inside the packed copy `side` owns, which
        // lives until the request is waited for just below.
        let mut request = Some(unsafe { isend(comm, posting, (dest, tag)) }?);
        raw::wait(&mut request);
        drop(side);
        Ok(())
    })
}

/// `recv_tensor_range`.
pub(in crate::comm) fn recv<E: Endpoint + ?Sized>(
    tc: &E,
    tensor: &mut dyn Tensor,
    elems: Range<i64>,
    source: Rank,
    tag: Tag,
) -> Result<Status> {
    let comm = tc.communicator();
    check_peer(comm, source, tag)?;
    let window = displacement_count(&elems);
    let recv = (tensor, Access::Update);
    with_write(tc, Kind::PointToPoint, recv, None, |(t, reach)| {
        let (mut side, part) = window_out(t, reach, window)?;
        let process = comm.process_at_rank(source);
        // The message is matched (`MPI_Mprobe`), so a concurrent receiver on the same
        // (source, tag) cannot take it; one that does not fit is held in `Error::Unfit`.
        let matched = Matched::probe(&process, tag);
        if !part {
            if let Err(mismatch) = check_incoming(&side, &matched.status()) {
                return Err(unfit(mismatch, matched, None));
            }
            return Ok(matched.receive_into(&mut side));
        }
        let (ptr, units_posted, datatype) = side.window(window.0, window.1)?;
        let elem_bytes = side.element().size_bytes();
        let arrived = check_arrived(
            &matched.status(),
            (units_posted, datatype),
            window.1,
            elem_bytes,
        );
        if let Err(mismatch) = arrived {
            return Err(unfit(mismatch, matched, None));
        }
        // SAFETY: `ptr` has room for `units_posted` units of `datatype` inside the packed
        // copy `side` owns, which nothing else touches until the receive returns; the size
        // was compared just above.
        let status = unsafe { matched.receive_raw(ptr.cast(), units_posted, datatype.as_raw()) };
        side.finish()?;
        Ok(status)
    })
}

/// Compares a matched message with a window of `count_elems` elements posted as `posted`
/// items of `datatype`.
fn check_arrived(
    status: &Status,
    (posted, datatype): (mpi::Count, DatatypeRef<'static>),
    count_elems: i64,
    elem_bytes: usize,
) -> Result<()> {
    if status.count(datatype) == posted {
        return Ok(());
    }
    let bytes = i64::from(status.count(u8::equivalent_datatype()));
    let elem = i64::try_from(elem_bytes).unwrap_or(i64::MAX);
    Err(Error::CountMismatch {
        what: format!(
            "incoming message from rank {} tag {} ({bytes} bytes of {elem}-byte elements) for \
             a window",
            status.source_rank(),
            status.tag()
        ),
        expected: count_elems,
        actual: if bytes >= 0 { bytes / elem } else { -1 },
    })
}

/// `immediate_send_tensor_range`.
pub(in crate::comm) fn immediate_send<'a, E: Endpoint + ?Sized, Sc: Scope<'a>>(
    tc: &'a E,
    scope: Sc,
    tensor: &'a dyn Tensor,
    elems: Range<i64>,
    dest: Rank,
    tag: Tag,
) -> Result<TensorRequest<'a, Sc>> {
    let comm = tc.communicator();
    check_peer(comm, dest, tag)?;
    let window = displacement_count(&elems);
    let (held, (tensor, reach)) = read_stand_in(tc.stager(), tensor)?;
    let (side, part) = window_in(tensor, reach, window)?;
    let posting = if part {
        let (ptr, units, datatype) = side.window(window.0, window.1)?;
        Some((ptr.cast_const(), units, datatype))
    } else {
        None
    };
    Ok(post_send(comm, scope, side, posting, dest, tag)?.holding(held))
}

/// `immediate_recv_tensor_range`.
pub(in crate::comm) fn immediate_recv<'a, E: Endpoint + ?Sized, Sc: Scope<'a>>(
    tc: &'a E,
    scope: Sc,
    tensor: &'a mut dyn Tensor,
    elems: Range<i64>,
    source: Rank,
    tag: Tag,
) -> Result<TensorRequest<'a, Sc>> {
    let comm = tc.communicator();
    check_peer(comm, source, tag)?;
    let window = displacement_count(&elems);
    let (held, (tensor, reach)) = write_stand_in(tc.stager(), tensor, Access::Update)?;
    let (side, part) = window_out(tensor, reach, window)?;
    let expected = (window.1, side.element().size_bytes_i64());
    let posting = if part {
        side.window(window.0, window.1)?
    } else {
        (
            side.ptr().cast::<u8>(),
            mpi::datatype::Collection::count(&side),
            mpi::datatype::AsDatatype::as_datatype(&side),
        )
    };
    Ok(post_recv(comm, scope, side, posting, expected, (source, tag))?.holding(held))
}
