//! The buffers and MPI calls of the fused collectives' buckets ([`super::Fused`]): packed
//! buckets in pooled host buffers, direct buckets on a member's own memory, device buckets
//! made by the stager, and the copies into and out of packed buckets.

use std::ffi::c_void;

use mpi::raw::AsRaw;
use mpi::Count;

use super::{FusedKind, Member, OnDevice};
use crate::comm::call::{Buf, Call, Reduced, REDUCE_CHUNK_UNITS};
use crate::comm::reduce::handles;
use crate::comm::stager::{BucketMember, StagedBucket};
use crate::error::{Error, Result};
use crate::raw;
use crate::spec::facts::Facts;
use crate::spec::kernels;
use crate::spec::scratch::Scratch;

/// The calls of `kind` on a bucket of `bytes` bytes of `element`s: `send` (a
/// reduce-scatter's send, all ranks' blocks; an all-reduce's send or `MPI_IN_PLACE`; unused
/// by a broadcast) into `recv` (the bucket; a reduce-scatter's: this rank's block).
/// Broadcasts go in chunks of at most 2^30 units (`Call::Reduce` chunks itself); an empty
/// bucket is one call with count 0 and NULL buffers.
///
/// # Errors
/// [`Error::CountTooLarge`] for a reduce-scatter block beyond `int` units; the reduction's
/// errors ([`handles`]).
pub(super) fn calls_for(
    kind: FusedKind,
    element: crate::dtype::ElementType,
    send: *const c_void,
    recv: *mut u8,
    bytes: usize,
) -> Result<Vec<Call>> {
    let unit = element.row.unit;
    let unit_bytes = unit.size_bytes().max(1);
    let units = bytes / unit_bytes;
    let unit_type = unit.datatype().as_raw();
    let (send, recv) = if units == 0 {
        let null = std::ptr::null_mut::<c_void>();
        let send = if send == raw::in_place().cast_const() {
            send
        } else {
            null.cast_const()
        };
        (send, null.cast::<u8>())
    } else {
        (send, recv)
    };
    match kind {
        FusedKind::AllReduce(op) => {
            let (datatype, op) = handles(op, element.dtype, unit_type)?;
            Ok(vec![Call::Reduce {
                buffers: Reduced {
                    send,
                    recv: recv.cast(),
                    units,
                    unit_bytes,
                    datatype,
                    op,
                },
                root: None,
            }])
        }
        FusedKind::ReduceScatter(op, _) => {
            let count = Count::try_from(units).map_err(|_| Error::CountTooLarge {
                count: units as u64,
            })?;
            let (datatype, op) = handles(op, element.dtype, unit_type)?;
            Ok(vec![Call::ReduceScatterBlock {
                send,
                recv: Buf::raw(recv.cast(), count, datatype),
                op,
            }])
        }
        FusedKind::Broadcast(root) => {
            let mut calls = Vec::new();
            let mut done = 0usize;
            loop {
                let n = (units - done).min(REDUCE_CHUNK_UNITS);
                // n ≤ 2^30 < i32::MAX.
                #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
                let count = n as Count;
                let at = if n == 0 {
                    recv
                } else {
                    recv.wrapping_add(done * unit_bytes)
                };
                calls.push(Call::Bcast {
                    buf: Buf::raw(at.cast(), count, unit_type),
                    root,
                });
                done += n;
                if done >= units {
                    break;
                }
            }
            Ok(calls)
        }
    }
}

/// A device list's bucket of `list` (`bytes` bytes), made by its stager, and the calls on
/// it (an all-reduce in place on the bucket, a broadcast of it, a reduce-scatter from the
/// stager's send buffer of every rank's blocks into it).
///
/// # Errors
/// The stager's refusals and copy errors ([`Stager::stage_bucket`]); [`calls_for`]'s.
pub(super) fn device_bucket(
    kind: FusedKind,
    members: &[Member],
    list: &[usize],
    bytes: usize,
    on: Option<&OnDevice<'_, '_>>,
) -> Result<(Box<dyn StagedBucket + 'static>, Vec<Call>)> {
    let on = on.ok_or_else(|| crate::comm::checks::missing("fused device list"))?;
    let element = members[list[0]]
        .facts()
        .map(|f| f.element)
        .ok_or_else(|| crate::comm::checks::missing("fused member facts"))?;
    let of: Vec<BucketMember<'_>> = list
        .iter()
        .map(|&i| BucketMember {
            index: i,
            pack: on.tensors[i].0,
            unpack: on.tensors[i].1,
            at: members[i].at,
        })
        .collect();
    // The bucket's own dtype: a list's buckets differ in dtype (a float16 bucket is staged).
    let reduce = on.reduces.then_some(element.dtype);
    let blocks = match kind {
        FusedKind::ReduceScatter(_, ranks) => usize::try_from(ranks).unwrap_or(1).max(1),
        FusedKind::AllReduce(_) | FusedKind::Broadcast(_) => 1,
    };
    let staged = on.stager.stage_bucket(&of, (bytes, blocks), reduce)?;
    let (ptr, _) = staged.buffer();
    let send = staged
        .send_buffer()
        .unwrap_or_else(|| raw::in_place().cast_const().cast());
    let calls = calls_for(kind, element, send.cast(), ptr, bytes)?;
    // SAFETY: only the lifetime changes. The bucket borrows the stager, which the
    // fused constructors hold for the `'t` of the `Operation<'t>` they return this
    // `Fused` in; the bucket is dropped with that operation (or in this call's error
    // path), so it never outlives the borrow. The member tensors it copies from and to
    // are borrowed for the same `'t`.
    let staged: Box<dyn StagedBucket + 'static> = unsafe { std::mem::transmute(staged) };
    Ok((staged, calls))
}

/// A packed bucket's buffers and calls: `bytes` of `element`s (a reduce-scatter's: per
/// rank, and the send buffer `ranks` times that, with a receive buffer of `bytes`).
pub(super) fn bucket_buffers(
    kind: FusedKind,
    element: crate::dtype::ElementType,
    bytes: usize,
    ranks: usize,
) -> Result<(Scratch, Option<Scratch>, Vec<Call>)> {
    let start = |s: &mut Scratch| {
        if s.is_empty() {
            std::ptr::null_mut()
        } else {
            s.as_mut_ptr()
        }
    };
    match kind {
        FusedKind::ReduceScatter(..) => {
            let total = bytes.checked_mul(ranks).ok_or(Error::Overflow {
                quantity: "fused reduce-scatter bucket bytes",
                lhs: bytes as i128,
                operator: "*",
                rhs: ranks as i128,
            })?;
            let mut buf = Scratch::take(total)?;
            let mut recv = Scratch::take(bytes)?;
            let send = start(&mut buf).cast_const().cast();
            let calls = calls_for(kind, element, send, start(&mut recv), bytes)?;
            Ok((buf, Some(recv), calls))
        }
        FusedKind::AllReduce(_) | FusedKind::Broadcast(_) => {
            let mut buf = Scratch::take(bytes)?;
            let send = raw::in_place().cast_const();
            let calls = calls_for(kind, element, send, start(&mut buf), bytes)?;
            Ok((buf, None, calls))
        }
    }
}

/// The calls of a direct bucket: member `m` alone, on its own memory (its sides are
/// contiguous: [`Member::is_direct`]).
pub(super) fn direct_calls(kind: FusedKind, m: &Member) -> Result<Vec<Call>> {
    let f = m
        .facts()
        .ok_or_else(|| crate::comm::checks::missing("fused member facts"))?;
    let first = |side: &Option<Facts>| side.as_ref().map(|f| f.first.cast::<u8>());
    let null = std::ptr::null_mut::<u8>();
    let (send, recv) = match kind {
        // The root's member is only read: MPI_Bcast does not write the root's buffer.
        FusedKind::Broadcast(_) => (null, first(&m.unpack).or(first(&m.pack)).unwrap_or(null)),
        _ if m.in_place => (raw::in_place().cast(), first(&m.unpack).unwrap_or(null)),
        _ => (
            first(&m.pack).unwrap_or(null),
            first(&m.unpack).unwrap_or(null),
        ),
    };
    calls_for(kind, f.element, send.cast_const().cast(), recv, m.bytes)
}

/// Copies the elements `f` describes into `out` in logical order (`out` holds exactly
/// them).
pub(super) fn copy_in(f: &Facts, out: &mut [u8]) {
    if out.is_empty() {
        return;
    }
    let base = f.first.cast::<u8>().cast_const();
    match &f.plan {
        // SAFETY: the member's facts checked its elements in range and host-readable; `out`
        // is a buffer of ours of exactly the member's bytes.
        None => unsafe { std::ptr::copy_nonoverlapping(base, out.as_mut_ptr(), out.len()) },
        Some(plan) => {
            // SAFETY: as above; the kernels accept the layout (checked when the facts were
            // taken), so this copies every element.
            let done = unsafe { kernels::pack(base, &plan.axes, f.element.size_bytes(), out) };
            debug_assert!(done);
        }
    }
}

/// Copies `data` (logical order, exactly the elements) into the elements `f` describes.
pub(super) fn copy_out(f: &Facts, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    let base = f.first.cast::<u8>();
    match &f.plan {
        // SAFETY: the member's facts checked its elements in range, host-writable and free
        // of overlap (`Access::Write`/`Update`), and no written member overlaps another
        // (`check_disjoint`); `data` is a buffer of ours.
        None => unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), base, data.len()) },
        Some(plan) => {
            // SAFETY: as above.
            let done = unsafe { kernels::unpack(data, base, &plan.axes, f.element.size_bytes()) };
            debug_assert!(done);
        }
    }
}
