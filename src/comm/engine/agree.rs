//! Agreement before a collective: no rank is left waiting in MPI for a rank that refused its
//! arguments.
//!
//! A collective of [`crate::comm`] first runs every local check (and builds its
//! buffers: specs, packed copies, scratch), then — under [`Agreement::Collective`], the
//! default — the ranks agree on whether every one of them can proceed, and only then enter
//! the data operation. The local checks can differ between ranks (a root-only buffer that
//! is `READ_ONLY` or too small, a count above `int` on one rank, one rank's bad
//! displacements, a root outside the communicator on one rank), and MPI has no way to leave
//! a collective that some ranks entered: without agreement those ranks wait forever
//! (every rank calling `reduce_tensor(f32 send, Some(f64 recv))` hangs rank 1 inside
//! `MPI_Reduce` at 4 MiB once the root refuses).
//!
//! **Mechanism.** One all-reduce (MPI-4.1 §6.9.6) of three `int64_t` with `MPI_MIN`,
//! `[status, fp, !fp]`: `MPI_Allreduce`, or on a communicator whose nonblocking collectives
//! have a shadow (see `pending`) `MPI_Iallreduce` waited for by polling, on every rank alike
//! whichever form the collective is (a blocking and a nonblocking collective never match,
//! §6.12, so both forms agree with the same MPI call, and a rank with nonblocking
//! collectives pending must resolve them while it waits): `status` is twice the rank's own
//! number when its local checks failed, else twice the communicator size, plus one unless
//! the rank has nonblocking collectives whose agreements are unresolved (then every rank
//! runs the data operation's nonblocking form and polls, [`Form`]); `fp` is the fingerprint
//! of the call ([`Turn::voted`]: the collective's signature, what MPI-4.1 §6.1 requires to
//! match, see `signature`; its form, blocking or nonblocking; and its number in the
//! communicator's collective order, kept in the communicator's `ledger`), and since
//! `min(!fp) = !max(fp)` the ranks agree on it exactly when `min(fp) == !min(!fp)`. The
//! minimum status is the communicator size when every rank can proceed (the success path
//! costs this one small all-reduce and nothing more), else the lowest rank that refused.
//! The agreement's MPI calls run with `MPI_ERRORS_RETURN` on the caller's communicator (its
//! handler restored after): a peer that is not in the agreement (an mpi4py collective, a
//! rank under [`Agreement::Local`]) makes MPI report a conflict, or sends votes no
//! dlpack-mpi rank sends, and this rank returns [`Error::OutOfStep`] naming the likely
//! cause and the fix, instead of the job aborting.
//!
//! **Refusal.** Only on failure do the ranks send more: the lowest refusing rank's error
//! text (UTF-8, at most [`AGREEMENT_REASON_BYTES`] bytes) reaches the other ranks, which
//! return [`Error::PeerRefused`] naming it and its diagnosis; each rank that refused returns
//! its own error. Without a shadow the text is broadcast after the agreement (`MPI_Bcast`,
//! §6.4); on a shadow each refusing rank sends it to every peer point to point before it
//! votes ([`tell`]), so that a refusing rank's nonblocking post returns at once, with
//! nothing left for it to do but what MPI's progress does. The check cannot be folded into
//! the data operation's own messages: a rank that has entered a collective cannot leave
//! it, and MPI's collectives have no header a library could add a word to — only a
//! separate step before the operation decides in time. At one rank no peer can wait, so
//! nothing is sent.
//!
//! **Opt-out.** [`Agreement::Local`] skips the all-reduce: a rank whose checks fail returns
//! its error at once and enters nothing, while its peers enter the collective and **hang**
//! (or, for small eager messages, may return as if it had succeeded). Use it only where
//! every rank is known to pass identical, valid arguments (the caller validates itself).
//! The setting is per process, and **every rank of a communicator must use the same one**:
//! a rank that agrees and a rank that does not make different sequences of collective
//! calls (MPI-4.1 §6.13 requires the same order on every rank), which is itself a hang.
//! For the same reason a collective shared with ranks that do not use dlpack-mpi (mpi4py,
//! C or Fortran MPI code in an MPMD job) needs [`Agreement::Local`] on the dlpack-mpi ranks:
//! the others would not join the agreement all-reduce.
//!
//! **Mismatch.** When every rank can proceed but the fingerprints differ (or the last
//! collective on the communicator ended in a mismatch), the ranks gather every rank's
//! report and each reaches the same verdict (`diagnosis`): a mismatch in words
//! ([`Error::CollectiveMismatch`]: which rank used which form, the first list member that
//! differs, each rank's arguments), or ranks out of step ([`Error::OutOfStep`]: a rank
//! that skipped or added a collective; the communicator then refuses every collective of
//! this crate at once until [`crate::comm::reset_out_of_step`]), or, after a mismatch, a
//! call that matches everywhere (it goes on). Extra messages on that path only. What a
//! fingerprint cannot see is listed in `signature`'s docs.

use std::cell::RefCell;
use std::ffi::c_int;
use std::rc::Rc;

use mpi::collective::SystemOperation;
use mpi::raw::FromRaw;
use mpi::topology::{Communicator, Rank, SimpleCommunicator};
use mpi::traits::*;

use mpi::ffi::{MPI_Comm, MPI_Request};

use super::call::Form;
use super::diagnosis::{explain, gather, Report, Verdict};
use super::ledger::{self, Ledger};
use super::progress::{self, Shadow};
use super::signature::Signature;
use crate::error::{Error, Result};
// The setting (`DLPACK_MPI_AGREEMENT`, `set_agreement`) is in `crate::settings`.
use crate::settings::{agreement, Agreement};

/// The most bytes of a refusing rank's error text that reach the other ranks in
/// [`Error::PeerRefused`] (the fixed size of the broadcast that carries it).
pub const AGREEMENT_REASON_BYTES: usize = 512;

/// This rank's turn in a communicator's collective order: the collective's number, the
/// fingerprint of the call (its signature and form), and what the last collective left.
pub(in crate::comm) struct Turn {
    pub(in crate::comm) count: u64,
    pub(in crate::comm) call: i64,
    pub(in crate::comm) nonblocking: bool,
    /// The communicator's shadow when its nonblocking collectives have one.
    pub(in crate::comm) shadow: Option<Shadow>,
    ledger: Rc<RefCell<Ledger>>,
}

/// Takes the next turn on `comm` for a collective with `signature` in the `nonblocking`
/// form or the blocking one (counts it).
///
/// # Errors
/// [`Error::OutOfStep`] when the ranks of `comm` were found out of step (nothing counted,
/// no MPI call).
pub(in crate::comm) fn turn<C: Communicator + ?Sized>(
    comm: &C,
    signature: &Signature<'_>,
    nonblocking: bool,
) -> Result<Turn> {
    let ledger = ledger::of(comm);
    let (count, shadow) = {
        let mut l = ledger.borrow_mut();
        if let Some(first) = &l.out_of_step {
            return Err(Error::OutOfStep {
                first: first.clone(),
            });
        }
        l.count += 1;
        (l.count, l.shadow)
    };
    Ok(Turn {
        count,
        call: mix(signature.fingerprint(), u64::from(nonblocking)),
        nonblocking,
        shadow,
        ledger,
    })
}

impl Turn {
    /// The fingerprint the agreement votes on: the call's and its number.
    pub(in crate::comm) fn voted(&self) -> i64 {
        mix(self.call, self.count)
    }

    /// This rank's report for the error path ([`super::diagnosis`]), with the
    /// communicator's last collective when that one ended in a mismatch (read when the
    /// agreement is decided: every rank decides its collectives on a communicator in their
    /// order, so every rank has noted the same ones by then).
    pub(in crate::comm) fn report(&self, signature: &Signature<'_>) -> Report {
        let words = signature.describe();
        Report {
            count: self.count,
            nonblocking: self.nonblocking,
            call: self.call,
            words: if self.nonblocking {
                format!("immediate_{words}")
            } else {
                words
            },
            members: signature.member_list(),
            last: self.ledger.borrow().suspect.clone(),
        }
    }

    /// Notes this call (in `words`) as the communicator's last collective to compare the
    /// next one with, when the last one ended in a mismatch (a refusal keeps the watch).
    pub(in crate::comm) fn note_last_if_watching(&self, words: impl FnOnce() -> String) {
        if self.ledger.borrow().suspect.is_none() {
            return;
        }
        // The words read the ledger: made before it is borrowed to be written.
        let words = words();
        self.ledger.borrow_mut().suspect = Some((self.call, words));
    }

    /// Whether the outcome `min` of the votes lets every rank go on without another word:
    /// nobody refused and the fingerprints agree (then the watch for a rank out of step,
    /// if any, ends: every rank makes the same call).
    fn settled(&self, min: [i64; 3], size: Rank) -> bool {
        min[0] >> 1 >= i64::from(size) && min[1] == !min[2]
    }
}

/// The fingerprint `fp` mixed with `word` (SplitMix64's finalizer over both).
fn mix(fp: i64, word: u64) -> i64 {
    let mut x = u64::from_ne_bytes(fp.to_ne_bytes()) ^ word.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    i64::from_ne_bytes((x ^ (x >> 31)).to_ne_bytes())
}

/// Agrees on `local` (this rank's checks and buffers) and on `signature` (what MPI
/// requires to match, [`Signature`]) across the ranks of `comm`, an intra-communicator,
/// before a blocking collective; every rank calls it exactly once per collective. Returns
/// `local` when every rank succeeded with the same signature (or under
/// [`Agreement::Local`]); this rank's own error when it failed; [`Error::PeerRefused`]
/// naming the lowest rank that failed and its error text; [`Error::CollectiveMismatch`] on
/// every rank when all succeeded but their calls differ; [`Error::OutOfStep`] when the
/// ranks are out of step (then on every later collective on `comm` too).
///
/// One all-reduce of three `int64_t` with `MPI_MIN` (its form the same on every rank, see the
/// module docs) decides
/// both: `[status, fp, !fp]` ([`votes`]), `fp` the fingerprint of the call and its place in
/// the communicator's order ([`Turn::voted`]); the minimum of `!fp` is `!max(fp)`, so every
/// rank agrees exactly when `min(fp) == !min(!fp)`. Only on an error do the ranks send more
/// (the refusing rank's text; or every rank's report). With the value, the [`Form`] of the
/// data operation every rank uses: [`Form::Polled`] when any rank has nonblocking
/// collectives waiting for their agreements.
pub(crate) fn agree<C: Communicator + ?Sized, T>(
    comm: &C,
    signature: &Signature<'_>,
    local: Result<T>,
) -> Result<(T, Form)> {
    agree_now(comm, signature, local, false)
}

/// [`agree`] for a call of the `nonblocking` form or the blocking one, waiting for the
/// outcome: the blocking collectives' agreement, and the first nonblocking collective's on
/// a communicator without a shadow (whose agreement must be the same MPI call as a
/// blocking one's there, so that a rank calling the other form meets it).
pub(in crate::comm) fn agree_now<C: Communicator + ?Sized, T>(
    comm: &C,
    signature: &Signature<'_>,
    local: Result<T>,
    nonblocking: bool,
) -> Result<(T, Form)> {
    // Without an agreement no rank learns the others' state: this rank's own is all there is.
    let own = || {
        if progress::active() {
            Form::Polled
        } else {
            Form::Blocking
        }
    };
    let local = match agreement() {
        Ok(Agreement::Local) => return local.map(|t| (t, own())),
        Ok(Agreement::Collective) => local,
        Err(e) => local.and(Err(e)),
    };
    let size = comm.size();
    if size == 1 {
        return local.map(|t| (t, own()));
    }
    let turn = turn(comm, signature, nonblocking)?;
    let pending = progress::active();
    let mine = votes(local.is_err(), (comm.rank(), size), turn.voted(), pending);
    let outcome = if let Some(shadow) = turn.shadow {
        let text = local.as_ref().err().map(ToString::to_string);
        let min = vote_polled(comm, shadow, &turn, mine, text)?;
        (min, decide(&*on(shadow), min, &turn, signature, local))
    } else {
        let min = vote_blocking(comm, &turn, mine)?;
        (min, decide(comm, min, &turn, signature, local))
    };
    let (min, outcome) = outcome;
    outcome.map(|t| {
        let form = if min[0] & 1 == 0 {
            Form::Polled
        } else {
            Form::Blocking
        };
        (t, form)
    })
}

/// The votes on a communicator with a shadow: on every rank of it the nonblocking form (a
/// blocking and a nonblocking collective never match, MPI-4.1 §6.12, and a rank with
/// collectives pending must resolve them while it waits, `progress::wait_raw`), after this
/// rank's refusal `text` (if any) went to the peers ([`tell`]). When the outcome needs the
/// error path, which goes on the shadow as the nonblocking collectives' does (a peer may
/// have called this collective's nonblocking form), every collective queued on it before
/// this one is resolved first. Returns the minimum of the votes.
fn vote_polled<C: Communicator + ?Sized>(
    comm: &C,
    shadow: Shadow,
    turn: &Turn,
    mine: [i64; 3],
    text: Option<String>,
) -> Result<[i64; 3]> {
    let told = text.map(|t| tell(shadow, turn.count, &t));
    let mut both = [mine[0], mine[1], mine[2], 0, 0, 0];
    let rc = returning(comm, || {
        // SAFETY: `both` is alive and untouched until the request completes in `wait_raw`
        // below; every rank posts this agreement here.
        let req = unsafe { post_votes(comm.as_raw(), &mut both) };
        progress::wait_raw(&mut [req])
    });
    if let Some(told) = told {
        told.wait();
    }
    let min = [both[3], both[4], both[5]];
    let size = comm.size();
    foreign(turn, rc, min, size)?;
    if !turn.settled(min, size) {
        progress::progress(shadow, std::ptr::null(), true);
    }
    Ok(min)
}

/// The votes on a communicator without a shadow (the same on every rank): the blocking
/// form, MPI's fastest. A rank whose pending collectives are on other communicators waits
/// here in MPI, as in any blocking MPI call of its program. Returns the minimum.
fn vote_blocking<C: Communicator + ?Sized>(
    comm: &C,
    turn: &Turn,
    mine: [i64; 3],
) -> Result<[i64; 3]> {
    let mut min = [0i64; 3];
    let rc = returning(comm, || {
        // SAFETY: both arrays are three int64 alive for the call; every rank calls this
        // agreement here.
        unsafe {
            mpi::ffi::MPI_Allreduce(
                mine.as_ptr().cast(),
                min.as_mut_ptr().cast(),
                3,
                i64::equivalent_datatype().as_raw(),
                SystemOperation::min().as_raw(),
                comm.as_raw(),
            )
        }
    });
    foreign(turn, rc, min, comm.size())?;
    Ok(min)
}

/// Runs `f`, MPI calls on `comm` that return their error code, with `MPI_ERRORS_RETURN`
/// on `comm` (the caller's error handler restored after, MPI-4.1 §9.3.1), so that a
/// conflict inside the agreement (a peer that is not in it) is returned, not fatal.
fn returning<C: Communicator + ?Sized>(comm: &C, f: impl FnOnce() -> c_int) -> c_int {
    let raw = comm.as_raw();
    let mut old = std::mem::MaybeUninit::<mpi::ffi::MPI_Errhandler>::uninit();
    // SAFETY: `comm` is live; MPI writes the handle (a reference it counts).
    unsafe { mpi::ffi::MPI_Comm_get_errhandler(raw, old.as_mut_ptr()) };
    // SAFETY: written above.
    let mut old = unsafe { old.assume_init() };
    // SAFETY: a predefined handler on a live communicator.
    unsafe { mpi::ffi::MPI_Comm_set_errhandler(raw, mpi::ffi::RSMPI_ERRORS_RETURN) };
    let rc = f();
    // SAFETY: the handler read above, set back, then its reference released.
    unsafe {
        mpi::ffi::MPI_Comm_set_errhandler(raw, old);
        mpi::ffi::MPI_Errhandler_free(&mut old);
    }
    rc
}

/// [`Error::OutOfStep`] (and the communicator marked so) when the agreement's own MPI call
/// failed (`rc`) or gave votes no dlpack-mpi rank sends (`min`): a peer that is not in the
/// agreement answered it.
fn foreign(turn: &Turn, rc: c_int, min: [i64; 3], size: Rank) -> Result<()> {
    let valid = (0..=2 * i64::from(size) + 1).contains(&min[0]);
    if rc == 0 && valid {
        return Ok(());
    }
    let what = if rc == 0 {
        format!("it gave votes no dlpack-mpi rank sends (status {})", min[0])
    } else {
        format!("MPI returned {}", error_string(rc))
    };
    let first = format!(
        "a rank of this communicator is not taking part in dlpack-mpi's agreement: the \
         agreement's all-reduce before this collective failed ({what}). Most likely another \
         rank runs a plain MPI or mpi4py collective where this rank runs a dlpack-mpi one, \
         or runs with another DLPACK_MPI_AGREEMENT; for a collective that some ranks call \
         through dlpack-mpi and others through mpi4py or plain MPI, set \
         DLPACK_MPI_AGREEMENT=local (settings::set_agreement(Agreement::Local)) on every \
         dlpack-mpi rank"
    );
    turn.ledger.borrow_mut().out_of_step = Some(first.clone());
    Err(Error::OutOfStep { first })
}

/// MPI's text for the error code `rc` (`MPI_Error_string`, MPI-4.1 §9.4).
fn error_string(rc: c_int) -> String {
    let mut buf = vec![0u8; 1024];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds more than MPI_MAX_ERROR_STRING characters (256 in Open MPI,
    // 512 in MPICH); MPI writes `len`.
    unsafe { mpi::ffi::MPI_Error_string(rc, buf.as_mut_ptr().cast(), &mut len) };
    buf.truncate(usize::try_from(len).unwrap_or(0).min(1024));
    format!("{} ({rc})", String::from_utf8_lossy(&buf))
}

/// The shadow as a communicator this crate never frees through the wrapper.
pub(in crate::comm) fn on(shadow: Shadow) -> std::mem::ManuallyDrop<SimpleCommunicator> {
    // SAFETY: the shadow is a live intra-communicator this crate made (freed only with the
    // caller's communicator); the wrapper is never dropped, so it does not free it.
    std::mem::ManuallyDrop::new(unsafe { SimpleCommunicator::from_raw(shadow.comm) })
}

/// Posts the votes `votes[0..3]` (`MPI_Iallreduce` of three `int64_t` with `MPI_MIN`,
/// MPI-4.1 §6.12.8) on `comm`, their minimum over the ranks going to `votes[3..6]`; returns
/// the request.
///
/// # Safety
/// `comm` is a live intra-communicator on which every rank posts its agreement at this
/// point, and `votes` stays alive and untouched until the request completes.
pub(in crate::comm) unsafe fn post_votes(comm: MPI_Comm, votes: &mut [i64; 6]) -> MPI_Request {
    let (mine, min) = votes.split_at_mut(3);
    // SAFETY: a constant handle of the MPI library.
    let mut req = unsafe { mpi::ffi::RSMPI_REQUEST_NULL };
    // SAFETY: both halves are three int64 (the caller's contract on their life and `comm`).
    unsafe {
        mpi::ffi::MPI_Iallreduce(
            mine.as_ptr().cast(),
            min.as_mut_ptr().cast(),
            3,
            i64::equivalent_datatype().as_raw(),
            SystemOperation::min().as_raw(),
            comm,
            &mut req,
        )
    };
    req
}

/// This rank's three votes of an agreement: `[status, fp, !fp]`, `status` twice this rank
/// when its local checks `failed`, else twice the communicator `size`, plus one unless this
/// rank has nonblocking collectives `pending` (their agreements unresolved): the minimum
/// tells every rank the lowest refusing rank (`status / 2`) and whether any rank has such
/// collectives (an even minimum), which decides the data operation's [`Form`].
pub(in crate::comm) fn votes(
    failed: bool,
    (rank, size): (Rank, Rank),
    fp: i64,
    pending: bool,
) -> [i64; 3] {
    let status = i64::from(if failed { rank } else { size });
    [2 * status + i64::from(!pending), fp, !fp]
}

/// The outcome of an agreement whose all-reduce gave `min` (the element-wise minimum of
/// every rank's [`votes`]) for this rank's `turn` with `signature`: `local` when every rank
/// succeeded with the same call; else the error path's messages on `comm` (every rank takes
/// the same path) and its error. Writes what the outcome leaves in the communicator's
/// ledger.
pub(in crate::comm) fn decide<C: Communicator + ?Sized, T>(
    comm: &C,
    min: [i64; 3],
    turn: &Turn,
    signature: &Signature<'_>,
    local: Result<T>,
) -> Result<T> {
    let size = comm.size();
    if turn.settled(min, size) {
        let mut l = turn.ledger.borrow_mut();
        if l.suspect.is_some() {
            l.suspect = None;
        }
        return local;
    }
    if min[0] >> 1 < i64::from(size) {
        // A rank number: below `size`, so it fits a Rank.
        let lowest = Rank::try_from(min[0] >> 1).unwrap_or(0);
        // Still watching for a rank out of step: compare with this call next time.
        turn.note_last_if_watching(|| turn.report(signature).words);
        let reason = match (turn.shadow, &local) {
            // On a shadow the refusing rank sent its text before it voted ([`tell`]).
            (Some(_), Ok(_)) => hear(comm, lowest, turn.count),
            (Some(_), Err(_)) => String::new(),
            (None, _) => refused(comm, lowest, local.as_ref().err().map(ToString::to_string)),
        };
        return match local {
            Err(e) => Err(e),
            Ok(_) => Err(Error::PeerRefused {
                rank: lowest,
                reason,
            }),
        };
    }
    let mine = turn.report(signature);
    let reports = gather(comm, &mine);
    let mut l = turn.ledger.borrow_mut();
    match explain(&reports) {
        Verdict::Agreed => {
            l.suspect = None;
            local
        }
        Verdict::Mismatch {
            arguments,
            other_rank,
            other_arguments,
            difference,
        } => {
            l.suspect = Some((turn.call, mine.words));
            Err(Error::CollectiveMismatch {
                rank: 0,
                arguments,
                other_rank,
                other_arguments,
                difference,
            })
        }
        Verdict::OutOfStep(first) => {
            l.out_of_step = Some(first.clone());
            Err(Error::OutOfStep { first })
        }
    }
}

/// The refusal path on a communicator without a shadow: the `lowest` refusing rank
/// broadcasts its error text (`own`, this rank's when it refused); returns that rank's text.
fn refused<C: Communicator + ?Sized>(comm: &C, lowest: Rank, own: Option<String>) -> String {
    let mut text = [0u8; AGREEMENT_REASON_BYTES];
    if let (Some(e), true) = (&own, comm.rank() == lowest) {
        encode_reason(e, &mut text);
    }
    comm.process_at_rank(lowest).broadcast_into(&mut text[..]);
    decode_reason(&text)
}

/// The tag of a refusal's text on a shadow (the shadow carries nothing else point to
/// point).
const REFUSAL_TAG: i32 = 32_000;

/// A refusal's text on its way to the peers (see [`tell`]): its sends and their buffer.
pub(in crate::comm) struct Told {
    requests: Vec<MPI_Request>,
    /// The collective's number, then the text (the sends read it until they complete).
    _buf: Box<[u8]>,
}

impl Told {
    /// Completes the sends (polled while collectives of this rank are pending).
    pub(in crate::comm) fn wait(mut self) {
        progress::wait_raw(&mut self.requests);
    }

    /// Whether the sends have completed (then nothing is left to wait for).
    pub(in crate::comm) fn test(&mut self) -> bool {
        let Ok(n) = std::ffi::c_int::try_from(self.requests.len()) else {
            return true;
        };
        let mut flag = 0;
        // SAFETY: live send requests of this value (completed ones become NULL).
        unsafe {
            mpi::ffi::MPI_Testall(
                n,
                self.requests.as_mut_ptr(),
                &mut flag,
                mpi::ffi::RSMPI_STATUSES_IGNORE,
            )
        };
        flag != 0
    }
}

/// On a communicator whose collectives have a shadow, a refusing rank sends its `text`
/// (for the collective numbered `count`) to every peer on the shadow before it votes
/// (`MPI_Isend`, at most [`AGREEMENT_REASON_BYTES`] bytes: eager in every MPI), so that
/// the peers that learn from the agreement that it is the lowest refusing rank receive it
/// ([`hear`]) without this rank taking another step: its nonblocking post returns at once.
pub(in crate::comm) fn tell(shadow: Shadow, count: u64, text: &str) -> Told {
    let mut buf = vec![0u8; 8 + AGREEMENT_REASON_BYTES].into_boxed_slice();
    buf[..8].copy_from_slice(&count.to_le_bytes());
    encode_reason(text, &mut buf[8..]);
    let comm = on(shadow);
    let (me, size) = (comm.rank(), comm.size());
    let len = std::ffi::c_int::try_from(buf.len()).unwrap_or(0);
    let requests = (0..size)
        .filter(|&r| r != me)
        .map(|r| {
            // SAFETY: a constant handle of the MPI library.
            let mut req = unsafe { mpi::ffi::RSMPI_REQUEST_NULL };
            // SAFETY: `buf` is a heap box this value keeps until the sends complete; the
            // shadow is live; several sends may read one buffer (MPI-4.1 §3.7.2).
            unsafe {
                mpi::ffi::MPI_Isend(
                    buf.as_ptr().cast(),
                    len,
                    u8::equivalent_datatype().as_raw(),
                    r,
                    REFUSAL_TAG,
                    shadow.comm,
                    &mut req,
                )
            };
            req
        })
        .collect();
    Told {
        requests,
        _buf: buf,
    }
}

/// The text the `lowest` refusing rank sent for the collective numbered `count` ([`tell`]),
/// received on the shadow `comm`; older texts of that rank (refusals of collectives whose
/// text another rank's gave) are passed over.
fn hear<C: Communicator + ?Sized>(comm: &C, lowest: Rank, count: u64) -> String {
    let mut buf = vec![0u8; 8 + AGREEMENT_REASON_BYTES];
    loop {
        comm.process_at_rank(lowest)
            .receive_into_with_tag(&mut buf[..], REFUSAL_TAG);
        let said = u64::from_le_bytes(buf[..8].try_into().unwrap_or([0; 8]));
        if said >= count {
            return decode_reason(&buf[8..]);
        }
    }
}

/// Writes `reason` into `buf`: cut at a character boundary to fit, the rest NUL.
fn encode_reason(reason: &str, buf: &mut [u8]) {
    let mut end = reason.len().min(buf.len());
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    buf[..end].copy_from_slice(&reason.as_bytes()[..end]);
    buf[end..].fill(0);
}

/// The text of a buffer [`encode_reason`] wrote (up to the first NUL; invalid UTF-8, which
/// only a foreign peer could send, is replaced).
fn decode_reason(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The element-wise minimum of the ranks' votes gives the lowest refusing rank and
    /// whether any rank has collectives pending, each independently of the other.
    #[test]
    fn votes_carry_the_lowest_refusal_and_any_pending() {
        let min = |vs: &[[i64; 3]]| {
            let mut m = [i64::MAX; 3];
            for v in vs {
                for (a, b) in m.iter_mut().zip(v) {
                    *a = (*a).min(*b);
                }
            }
            m
        };
        let size = 4;
        let all = |failed: &[bool], pending: &[bool]| {
            (0..4)
                .map(|r: Rank| {
                    let i = usize::try_from(r).unwrap_or(0);
                    votes(failed[i], (r, size), 7, pending[i])
                })
                .collect::<Vec<_>>()
        };
        // Nobody refuses, nobody pending: status 2·size + 1, odd.
        let m = min(&all(&[false; 4], &[false; 4]));
        assert_eq!((m[0] >> 1, m[0] & 1), (4, 1));
        // Rank 3 pending only: even, still size.
        let m = min(&all(&[false; 4], &[false, false, false, true]));
        assert_eq!((m[0] >> 1, m[0] & 1), (4, 0));
        // Ranks 2 and 1 refuse (rank 1 the lowest), rank 0 pending.
        let m = min(&all(
            &[false, true, true, false],
            &[true, false, false, false],
        ));
        assert_eq!(m[0] >> 1, 1);
        assert_eq!((m[1], !m[2]), (7, 7));
    }

    #[test]
    fn reason_round_trip_and_cut() {
        let mut buf = [0xffu8; 16];
        encode_reason("dtype mismatch", &mut buf);
        assert_eq!(decode_reason(&buf), "dtype mismatch");
        assert_eq!(&buf[14..], &[0, 0]);
        // 15 ASCII bytes then a 2-byte character: cut before it, not inside.
        encode_reason("aaaaaaaaaaaaaaaé", &mut buf);
        assert_eq!(decode_reason(&buf), "aaaaaaaaaaaaaaa");
        // Exactly full: no NUL needed.
        encode_reason("0123456789abcdef", &mut buf);
        assert_eq!(decode_reason(&buf), "0123456789abcdef");
        encode_reason("", &mut buf);
        assert_eq!(decode_reason(&buf), "");
        assert_eq!(decode_reason(&[0x66, 0xff, 0]), "f\u{fffd}");
    }
}
