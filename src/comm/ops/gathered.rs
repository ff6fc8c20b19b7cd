//! The plan of an all-gather (issue 32): `plan_all_gather_tensor`, one send tensor and one
//! receive tensor of `size` × its elements, as a [`Batch`] that a [`Plan`] runs step after
//! step (`MPI_Allgather`, MPI-4.1 §6.7, on the plans' communicator).
//!
//! **Buffers.** A send or receive tensor that is strided, or a block under
//! [`OWN_BUCKET_BYTES`], goes through a buffer of the plan's own (taken at the build): the
//! send block packed into it before each step, the receive buffer unpacked into the tensor
//! after it (the strided copies prepared once). A contiguous pair of at least that size is
//! gathered in place, nothing copied.
//!
//! **Identity.** Where the blocks go through the plan's buffers, each rank's block carries
//! the plan's identity in 8 spare bytes (rounded up to whole elements) after its elements,
//! so every rank sees every other rank's identity: a step that met another plan's, or a
//! refused step, is [`Error::PlanMismatch`] on every rank, and no element is unpacked.

use std::ffi::c_void;

use mpi::raw::AsRaw;
use mpi::topology::Communicator;
use mpi::Count;

use crate::comm::engine::call::{free_persistent, start_persistent, Batch, Buf, Call, Form};
use crate::comm::engine::checks::{check_count, check_intra, check_pair};
use crate::comm::engine::plan::{build, settings_words, Plan};
use crate::comm::engine::progress;
use crate::comm::engine::signature::Signature;
use crate::comm::engine::stager::Endpoint;
use crate::comm::ops::fused::OWN_BUCKET_BYTES;
use crate::dlpack::{Tensor, TensorListMut};
use crate::error::{Error, Result};
use crate::spec::facts::Facts;
use crate::spec::kernels::Prepared;
use crate::spec::scratch::Scratch;
use crate::spec::Access;

/// Spare bytes of a block that carries the identity: 8, rounded up to whole elements.
fn spare_bytes(elem: usize) -> usize {
    8usize.div_ceil(elem.max(1)) * elem.max(1)
}

/// One side of the all-gather: its facts, its prepared strided copy (pack for the send,
/// unpack for the receive) and the plan's buffer for it (`None`: gathered in place).
#[derive(Debug)]
struct End {
    facts: Facts,
    copy: Option<Prepared>,
    buf: Option<Scratch>,
}

/// A planned all-gather's data operation.
#[derive(Debug)]
pub(in crate::comm) struct Gathered {
    send: End,
    recv: End,
    /// Bytes of one rank's elements, and of its spare bytes after them (0: no identity).
    block: usize,
    spare: usize,
    ranks: usize,
    call: Call,
    id: u64,
    refused: bool,
    seen: Option<String>,
    /// Requests completed in the step in flight (one call: 0 or 1).
    completed: usize,
    /// A strided receive's blocks without their spare bytes, before the unpack (taken at
    /// the build).
    whole: Option<Scratch>,
    /// The MPI-4 persistent request, where the plan made it ([`Batch::persist`]).
    persistent: Vec<mpi::ffi::MPI_Request>,
}

/// The start of `s` (NULL when empty).
fn start(s: &mut Scratch) -> *mut u8 {
    if s.is_empty() {
        std::ptr::null_mut()
    } else {
        s.as_mut_ptr()
    }
}

impl Gathered {
    /// The plan's all-gather of `send` into `recv` among `ranks` ranks.
    ///
    /// # Errors
    /// The facts' refusals (device, layout, `READ_ONLY` receive, overlap),
    /// [`Error::DtypeMismatch`], [`Error::CountMismatch`] (receive ≠ `ranks` × send),
    /// [`Error::CountTooLarge`] beyond `int` units, the pool's errors.
    fn new(send: &dyn Tensor, recv: &dyn Tensor, ranks: usize) -> Result<Gathered> {
        let sf = Facts::of(send, Access::Read, None)?;
        let rf = Facts::of(recv, Access::Write, None)?;
        check_pair("all-gather send vs receive", &sf, &rf)?;
        check_count(
            || format!("all-gather receive (= send count × {ranks} ranks)"),
            sf.len_elems
                .saturating_mul(i64::try_from(ranks).unwrap_or(i64::MAX)),
            rf.len_elems,
        )?;
        let elem = sf.element.size_bytes();
        let block = sf.packed_bytes()?;
        let direct = sf.is_contiguous() && rf.is_contiguous() && block >= OWN_BUCKET_BYTES;
        let spare = if direct { 0 } else { spare_bytes(elem) };
        let unit = sf.element.row.unit;
        let units = (block + spare) / unit.size_bytes().max(1);
        let count = Count::try_from(units).map_err(|_| Error::CountTooLarge {
            count: units as u64,
        })?;
        let copy = |f: &Facts, pack: bool| {
            let plan = f.plan.as_ref()?;
            let bytes = f.packed_bytes().ok()?;
            let e = f.element.size_bytes();
            if pack {
                Prepared::pack(&plan.axes, e, bytes)
            } else {
                Prepared::unpack(&plan.axes, e, bytes)
            }
        };
        let (sc, rc) = (copy(&sf, true), copy(&rf, false));
        let (mut sbuf, mut rbuf) = (None, None);
        let (sp, rp): (*mut u8, *mut u8) = if direct {
            (sf.first.cast(), rf.first.cast())
        } else {
            let s = sbuf.insert(Scratch::take(block + spare)?);
            let r = rbuf.insert(Scratch::take((block + spare) * ranks)?);
            (start(s), start(r))
        };
        let whole = match (&rc, direct) {
            (Some(_), false) => Some(Scratch::take(block * ranks)?),
            _ => None,
        };
        let t = unit.datatype().as_raw();
        let call = Call::AllGather {
            send: Buf::raw(sp.cast::<c_void>(), count, t),
            recv: Buf::raw(rp.cast::<c_void>(), count, t),
        };
        Ok(Gathered {
            send: End {
                facts: sf,
                copy: sc,
                buf: sbuf,
            },
            recv: End {
                facts: rf,
                copy: rc,
                buf: rbuf,
            },
            block,
            spare,
            ranks,
            call,
            id: 0,
            refused: false,
            seen: None,
            completed: 0,
            whole,
            persistent: Vec::new(),
        })
    }

    /// Packs the send block into the plan's buffer (not for a refused step).
    fn pack(&mut self) {
        let (Some(buf), false) = (self.send.buf.as_mut(), self.refused) else {
            return;
        };
        let out = &mut buf[..self.block];
        if out.is_empty() {
            return;
        }
        let base = self.send.facts.first.cast::<u8>().cast_const();
        match &self.send.copy {
            // SAFETY: prepared from these facts (host-readable, every element in range)
            // for exactly `block` bytes; `out` is our own buffer.
            Some(p) => unsafe { p.run(out.as_mut_ptr(), base) },
            // SAFETY: a contiguous tensor's `block` bytes from its first element.
            None => unsafe { std::ptr::copy_nonoverlapping(base, out.as_mut_ptr(), out.len()) },
        }
    }

    /// After the call completed: every block's identity compared, then the receive
    /// buffer unpacked into the tensor (not for a refused or mismatched step).
    fn land(&mut self) {
        let Some(buf) = self.recv.buf.as_ref() else {
            return; // gathered in place
        };
        let stride = self.block + self.spare;
        for r in (0..self.ranks).filter(|_| self.spare > 0) {
            let at = r * stride + self.block;
            let mut got = [0u8; 8];
            got.copy_from_slice(&buf[at..at + 8]);
            let got = u64::from_ne_bytes(got);
            if got != self.id && self.seen.is_none() {
                self.seen = Some(format!(
                    "rank {r}'s block carried plan identity {got:#018x}, this rank's is \
                     {:#018x} (0: that rank's step was refused)",
                    self.id
                ));
            }
        }
        if self.refused || self.seen.is_some() || self.block == 0 {
            return;
        }
        let base = self.recv.facts.first.cast::<u8>();
        match &self.recv.copy {
            Some(p) => {
                // The blocks are `stride` apart: compacted into the buffer taken for this
                // at the build, then unpacked whole.
                let Some(packed) = self.whole.as_mut() else {
                    return;
                };
                for r in 0..self.ranks {
                    packed[r * self.block..(r + 1) * self.block]
                        .copy_from_slice(&buf[r * stride..r * stride + self.block]);
                }
                // SAFETY: prepared from these facts (host-writable, disjoint elements) for
                // exactly `ranks × block` bytes, which `packed` holds; it is ours.
                unsafe { p.run(base, packed.as_ptr()) };
            }
            None => {
                for r in 0..self.ranks {
                    let from = &buf[r * stride..r * stride + self.block];
                    // SAFETY: a contiguous tensor of `ranks × block` bytes from its first
                    // element, writable; block r is its r-th `block` bytes.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            from.as_ptr(),
                            base.add(r * self.block),
                            self.block,
                        );
                    }
                }
            }
        }
    }
}

impl Batch for Gathered {
    unsafe fn run(&mut self, comm: mpi::ffi::MPI_Comm, form: Form) {
        self.pack();
        if !self.persistent.is_empty() {
            // SAFETY: our inactive persistent request over the plan's own buffers.
            unsafe { start_persistent(&mut self.persistent) };
            progress::wait_raw(&mut self.persistent);
        } else if form == Form::Polled {
            let mut requests = Vec::with_capacity(1);
            // SAFETY: the caller's contract; the buffers outlive the wait below.
            unsafe { self.call.post(comm, &mut requests) };
            progress::wait_raw(&mut requests);
        } else {
            // SAFETY: the buffers are the plan's own or the tensors' (checked at the
            // build, borrowed by the plan); every rank runs the same plan's step.
            unsafe { self.call.run(comm) };
        }
        self.land();
    }

    unsafe fn post(&mut self, comm: mpi::ffi::MPI_Comm, requests: &mut Vec<mpi::ffi::MPI_Request>) {
        self.pack();
        if !self.persistent.is_empty() {
            // SAFETY: as in `run`; the plan completes it before the next step.
            unsafe { start_persistent(&mut self.persistent) };
            requests.extend_from_slice(&self.persistent);
            return;
        }
        // SAFETY: the caller's contract.
        unsafe { self.call.post(comm, requests) };
    }

    unsafe fn persist(&mut self, comm: mpi::ffi::MPI_Comm) -> bool {
        // Only over the plan's own buffers (see the fused lists' `persist`).
        if self.send.buf.is_none() || !self.persistent.is_empty() {
            return false;
        }
        // SAFETY: the caller's contract; the call is over the plan's own buffers.
        unsafe { self.call.persist(comm, &mut self.persistent) }
    }

    fn completed_one(&mut self) {
        self.completed += 1;
        if self.completed == self.call.requests() {
            self.land();
        }
    }

    fn is_packed(&self) -> bool {
        self.send.buf.is_some()
    }

    fn outcome(mut self: Box<Self>) -> Result<()> {
        self.step_outcome()
    }

    fn rearm(&mut self, mark: u64, refused: bool) {
        (self.id, self.completed, self.seen) = (mark, 0, None);
        if refused && !self.refused {
            self.refused = true;
            self.own_buffers();
        }
        let block = self.block;
        if let (Some(buf), true) = (self.send.buf.as_mut(), self.spare > 0) {
            let spare = &mut buf[block..];
            spare.fill(0);
            if !refused {
                spare[..8].copy_from_slice(&mark.to_ne_bytes());
            }
        }
    }

    fn step_outcome(&mut self) -> Result<()> {
        self.seen
            .take()
            .map_or(Ok(()), |seen| Err(Error::PlanMismatch { seen }))
    }

    fn requests(&self) -> usize {
        self.call.requests()
    }

    fn marked(&self) -> Option<&'static str> {
        (self.spare > 0).then_some(
            "the identity after each rank's block (every rank sees every other rank's plan)",
        )
    }
}

impl Drop for Gathered {
    fn drop(&mut self) {
        // Inactive: a plan completes its step in flight before its batch drops.
        free_persistent(&mut self.persistent);
    }
}

impl Gathered {
    /// A refused plan's buffers of its own, for an all-gather in place (an allocation
    /// once, on the error path): the step then takes part without touching the tensors.
    fn own_buffers(&mut self) {
        if self.send.buf.is_some() {
            return;
        }
        let bytes = self.block;
        let (Ok(mut s), Ok(mut r)) = (Scratch::take(bytes), Scratch::take(bytes * self.ranks))
        else {
            return;
        };
        if let Call::AllGather { send, recv } = &mut self.call {
            *send = send.with_ptr(start(&mut s).cast());
            *recv = recv.with_ptr(start(&mut r).cast());
        }
        (self.send.buf, self.recv.buf) = (Some(s), Some(r));
    }
}

/// `plan_all_gather_tensor`: the plan of an all-gather of `send` into `recv`.
pub(in crate::comm) fn plan_all_gather<'a, E, L, S>(
    tc: &'a E,
    send: &'a mut S,
    recv: &'a mut L,
) -> Result<Plan<'a, L, S>>
where
    E: Endpoint + ?Sized,
    L: TensorListMut + ?Sized,
    S: TensorListMut + ?Sized,
{
    let comm = tc.communicator();
    check_intra(comm)?;
    let ranks = usize::try_from(comm.size()).unwrap_or(1);
    let sigs = {
        let first = send.tensors_mut();
        let words = settings_words();
        let of = |name| {
            match first.first() {
                Some(t) => Signature::of_tensor(name, &**t),
                None => Signature::of(name),
            }
            .plan_settings(words)
        };
        (
            of("plan_all_gather_tensor"),
            of("a step of plan_all_gather_tensor"),
        )
    };
    build(tc, (recv, Some(send)), sigs, |recv, send| {
        let (Some(s), Some(r)) = (send.and_then(|s| s.first()), recv.first()) else {
            return Err(crate::comm::engine::checks::missing(
                "all-gather send and receive",
            ));
        };
        Ok(Box::new(Gathered::new(*s, *r, ranks)?) as Box<dyn Batch>)
    })
}
