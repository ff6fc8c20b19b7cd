//! The build's collectives on the plans' communicator (the records each rank sends each
//! peer, [`share`], and the verdict on what they found, [`verdict`]): the MPI calls of
//! `ops/exchange.rs`'s cross-check.

use std::ffi::c_int;

use mpi::ffi::MPI_Comm;
use mpi::topology::Rank;

use super::null_request;
use crate::comm::engine::progress;

/// Sends each peer `p` the words `out[p]` and returns the words each peer sent this rank
/// (`MPI_Ialltoall` of the counts, then `MPI_Ialltoallv` of the words as `int64_t`, on
/// `comm`, waited as every blocking path of this crate: [`progress::wait_raw`]). Every rank
/// of `comm` calls it at the same point. The build's records are a few words per member,
/// far below `int` per peer.
pub(in crate::comm) fn share(comm: MPI_Comm, out: &[Vec<i64>]) -> Vec<Vec<i64>> {
    let counts: Vec<c_int> = out
        .iter()
        .map(|w| c_int::try_from(w.len()).unwrap_or(c_int::MAX))
        .collect();
    let mut incoming = vec![0 as c_int; out.len()];
    // SAFETY: a constant handle of the MPI library.
    let int = unsafe { mpi::ffi::RSMPI_INT32_T };
    // SAFETY: a constant handle of the MPI library.
    let word = unsafe { mpi::ffi::RSMPI_INT64_T };
    let mut req = null_request();
    // SAFETY: one int per rank each way, alive until the wait below; every rank calls this.
    unsafe {
        mpi::ffi::MPI_Ialltoall(
            counts.as_ptr().cast(),
            1,
            int,
            incoming.as_mut_ptr().cast(),
            1,
            int,
            comm,
            &mut req,
        );
    }
    progress::wait_raw(&mut [req]);
    let displs = |c: &[c_int]| -> Vec<c_int> {
        c.iter()
            .scan(0 as c_int, |at, &n| {
                let d = *at;
                *at = at.saturating_add(n);
                Some(d)
            })
            .collect()
    };
    let (sd, rd) = (displs(&counts), displs(&incoming));
    let flat: Vec<i64> = out.iter().flatten().copied().collect();
    let total = incoming
        .iter()
        .map(|&n| usize::try_from(n).unwrap_or(0))
        .sum();
    let mut got = vec![0i64; total];
    let mut req = null_request();
    // SAFETY: the arrays describe `flat` and `got` exactly and stay alive until the wait.
    unsafe {
        mpi::ffi::MPI_Ialltoallv(
            flat.as_ptr().cast(),
            counts.as_ptr(),
            sd.as_ptr(),
            word,
            got.as_mut_ptr().cast(),
            incoming.as_ptr(),
            rd.as_ptr(),
            word,
            comm,
            &mut req,
        );
    }
    progress::wait_raw(&mut [req]);
    let mut rest = got.as_slice();
    incoming
        .iter()
        .map(|&n| {
            let (a, b) = rest.split_at(usize::try_from(n).unwrap_or(0).min(rest.len()));
            rest = b;
            a.to_vec()
        })
        .collect()
}

/// The most bytes of the build's findings that reach every rank ([`verdict`]).
const FINDINGS_BYTES: usize = 1024;

/// Agrees across `comm` on the build's cross-check: `mine` is this rank's first finding
/// (the peer it concerns, and every finding in words) or `None`. Returns `None` when no
/// rank found anything; else `(lowest, peer, words)`: the lowest rank with a finding, the
/// peer of its first one, and its words (`MPI_Iallreduce` of one int with `MPI_MIN`, then,
/// only then, `MPI_Ibcast` of [`FINDINGS_BYTES`] from that rank). Every rank calls it.
pub(in crate::comm) fn verdict(
    comm: MPI_Comm,
    me: Rank,
    size: Rank,
    mine: Option<(Rank, &str)>,
) -> Option<(Rank, Rank, String)> {
    let flag: c_int = if mine.is_some() { me } else { size };
    let mut lowest: c_int = size;
    // SAFETY: constant handles of the MPI library.
    let (int, min, byte) = unsafe {
        (
            mpi::ffi::RSMPI_INT32_T,
            mpi::ffi::RSMPI_MIN,
            mpi::ffi::RSMPI_UINT8_T,
        )
    };
    let mut req = null_request();
    // SAFETY: one int each way, alive until the wait; every rank calls this here.
    unsafe {
        mpi::ffi::MPI_Iallreduce(
            std::ptr::from_ref(&flag).cast(),
            std::ptr::from_mut(&mut lowest).cast(),
            1,
            int,
            min,
            comm,
            &mut req,
        );
    }
    progress::wait_raw(&mut [req]);
    if lowest >= size {
        return None;
    }
    let mut buf = [0u8; 4 + FINDINGS_BYTES];
    if let (Some((peer, words)), true) = (mine, lowest == me) {
        buf[..4].copy_from_slice(&peer.to_le_bytes());
        let mut end = words.len().min(FINDINGS_BYTES);
        while !words.is_char_boundary(end) {
            end -= 1;
        }
        buf[4..4 + end].copy_from_slice(&words.as_bytes()[..end]);
    }
    let mut req = null_request();
    let len = c_int::try_from(buf.len()).unwrap_or(0);
    // SAFETY: our buffer, alive until the wait; every rank calls this here (the minimum is
    // the same on every rank).
    unsafe { mpi::ffi::MPI_Ibcast(buf.as_mut_ptr().cast(), len, byte, lowest, comm, &mut req) };
    progress::wait_raw(&mut [req]);
    let peer = Rank::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
    let text = &buf[4..];
    let end = text.iter().position(|&b| b == 0).unwrap_or(text.len());
    Some((
        lowest,
        peer,
        String::from_utf8_lossy(&text[..end]).into_owned(),
    ))
}
