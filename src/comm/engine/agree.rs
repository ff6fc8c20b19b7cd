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
//! `[status, fp, !fp]`: `MPI_Allreduce`, or on a communicator that has had nonblocking
//! collectives `MPI_Iallreduce` waited for by polling, on every rank alike (a blocking and a
//! nonblocking collective never match, §6.12, and a rank with nonblocking collectives pending
//! must resolve them while it waits): `status` is twice the rank's own number
//! when its local checks failed, else twice the communicator size, plus one unless the rank
//! has nonblocking collectives whose agreements are unresolved (then every rank runs the data
//! operation's nonblocking form and polls, [`Form`]); `fp` is the fingerprint of the collective's signature (what
//! MPI-4.1 §6.1 requires to match, see `signature`), and since `min(!fp) = !max(fp)` the
//! ranks agree on it exactly when `min(fp) == !min(!fp)`. The minimum status is the
//! communicator size when every rank can proceed (the success path costs this one small
//! all-reduce and nothing more), else the lowest rank that refused. Only on failure does
//! that rank broadcast its error text (`MPI_Bcast`, §6.4) in a fixed buffer of
//! [`AGREEMENT_REASON_BYTES`] bytes (UTF-8, cut at a character boundary, NUL-padded), so
//! that the other ranks return [`Error::PeerRefused`] naming it and its diagnosis; each
//! rank that refused returns its own error. The check cannot be folded into the data
//! operation's own messages: a rank that has entered a collective cannot leave it, and
//! MPI's collectives have no header a library could add a word to — only a separate step
//! before the operation decides in time. At one rank no peer can wait, so nothing is sent.
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
//! **Mismatch.** When every rank can proceed but the fingerprints differ, the ranks gather
//! the fingerprints and rank 0 and the lowest rank that differs from it broadcast their
//! signatures in words: every rank returns [`Error::CollectiveMismatch`] naming both (extra
//! messages on that error path only). What a fingerprint cannot see is listed in
//! `signature`'s docs.

use mpi::collective::SystemOperation;
use mpi::topology::{Communicator, Rank};
use mpi::traits::*;

use mpi::ffi::{MPI_Comm, MPI_Request};

use super::call::Form;
use super::progress;
use super::signature::Signature;
use crate::error::{Error, Result};
// The setting (`DLPACK_MPI_AGREEMENT`, `set_agreement`) is in `crate::settings`.
use crate::settings::{agreement, Agreement};

/// The most bytes of a refusing rank's error text that reach the other ranks in
/// [`Error::PeerRefused`] (the fixed size of the broadcast that carries it).
pub const AGREEMENT_REASON_BYTES: usize = 512;

/// Agrees on `local` (this rank's checks and buffers) and on `signature` (what MPI
/// requires to match, [`Signature`]) across the ranks of `comm`, an intra-communicator,
/// before a collective; every rank calls it exactly once per collective. Returns `local`
/// when every rank succeeded with the same signature (or under [`Agreement::Local`]); this
/// rank's own error when it failed; [`Error::PeerRefused`] naming the lowest rank that
/// failed and its error text; [`Error::CollectiveMismatch`] on every rank when all
/// succeeded but their signatures differ.
///
/// One all-reduce of three `int64_t` with `MPI_MIN` (its form the same on every rank, see the
/// module docs) decides
/// both: `[status, fp, !fp]` ([`votes`]), `fp` the signature's fingerprint; the minimum of
/// `!fp` is `!max(fp)`, so every rank agrees exactly when `min(fp) == !min(!fp)`. Only on an
/// error do the ranks send more (the refusing rank's text; or the fingerprints and two
/// ranks' signatures). With the value, the [`Form`] of the data operation every rank uses:
/// [`Form::Polled`] when any rank has nonblocking collectives waiting for their agreements.
pub(crate) fn agree<C: Communicator + ?Sized, T>(
    comm: &C,
    signature: &Signature<'_>,
    local: Result<T>,
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
    // Held agreements of nonblocking collectives come first (see `pending`).
    progress::before_blocking(comm);
    let fp = signature.fingerprint();
    let pending = progress::active();
    let mine = votes(local.is_err(), (comm.rank(), size), fp, pending);
    let mut min = [0i64; 3];
    if progress::has_shadow(comm) {
        // A communicator with nonblocking collectives: on every rank of it the nonblocking
        // form (a blocking and a nonblocking collective never match, MPI-4.1 §6.12, and a
        // rank with collectives pending must resolve them while it waits,
        // `progress::wait_raw`); the others wait in MPI.
        let mut both = [mine[0], mine[1], mine[2], 0, 0, 0];
        // SAFETY: `both` is alive and untouched until the request completes in `wait_raw`
        // below; every rank posts this agreement here.
        let req = unsafe { post_votes(comm.as_raw(), &mut both) };
        progress::wait_raw(&mut [req]);
        min.copy_from_slice(&both[3..]);
    } else {
        // One without (the same on every rank): the blocking form, MPI's fastest. A rank
        // whose pending collectives are on other communicators waits here in MPI, as in any
        // blocking MPI call of its program.
        comm.all_reduce_into(&mine[..], &mut min[..], SystemOperation::min());
    }
    let form = if min[0] & 1 == 0 {
        Form::Polled
    } else {
        Form::Blocking
    };
    decide(comm, min, signature, local).map(|t| (t, form))
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
/// every rank's [`votes`]): `local` when every rank succeeded with the same signature; else
/// the error path's messages on `comm` (every rank takes the same path) and its error.
pub(in crate::comm) fn decide<C: Communicator + ?Sized, T>(
    comm: &C,
    min: [i64; 3],
    signature: &Signature<'_>,
    local: Result<T>,
) -> Result<T> {
    let size = comm.size();
    if min[0] >> 1 < i64::from(size) {
        // A rank number: below `size`, so it fits a Rank.
        let lowest = Rank::try_from(min[0] >> 1).unwrap_or(0);
        return refused(comm, lowest, local);
    }
    if min[1] == !min[2] {
        return local;
    }
    Err(mismatch(comm, signature, signature.fingerprint()))
}

/// The refusal path: the lowest refusing rank broadcasts its error text.
fn refused<C: Communicator + ?Sized, T>(comm: &C, lowest: Rank, local: Result<T>) -> Result<T> {
    let mut text = [0u8; AGREEMENT_REASON_BYTES];
    if let (Err(e), true) = (&local, comm.rank() == lowest) {
        encode_reason(&e.to_string(), &mut text);
    }
    comm.process_at_rank(lowest).broadcast_into(&mut text[..]);
    match local {
        Err(e) => Err(e),
        Ok(_) => Err(Error::PeerRefused {
            rank: lowest,
            reason: decode_reason(&text),
        }),
    }
}

/// The mismatch path (every rank took it): the ranks gather the fingerprints, and rank 0
/// and the lowest rank whose fingerprint differs from rank 0's broadcast their signatures
/// in words.
fn mismatch<C: Communicator + ?Sized>(comm: &C, signature: &Signature<'_>, fp: i64) -> Error {
    let size = usize::try_from(comm.size()).unwrap_or(1);
    let mut fps = vec![0i64; size];
    comm.all_gather_into(&fp, &mut fps[..]);
    let other = fps.iter().position(|&f| f != fps[0]).unwrap_or(0);
    let other = Rank::try_from(other).unwrap_or(0);
    let said = |who: Rank| {
        let mut text = [0u8; AGREEMENT_REASON_BYTES];
        if comm.rank() == who {
            encode_reason(&signature.describe(), &mut text);
        }
        comm.process_at_rank(who).broadcast_into(&mut text[..]);
        decode_reason(&text)
    };
    let (arguments, other_arguments) = (said(0), said(other));
    Error::CollectiveMismatch {
        rank: 0,
        arguments,
        other_rank: other,
        other_arguments,
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
