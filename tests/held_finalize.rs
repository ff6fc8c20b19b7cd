//! Held messages ([`Error::Unfit`]) at the edges of MPI: one dropped on a thread that may
//! not call MPI, and one still held when `MPI_Finalize` runs (the usual
//! `fn main() -> Result<(), Error>` with `?`). A plain `main` (harness = false), run by
//! scripts/test.sh at 2 ranks under a timeout: a message left unreceived would keep rank 0
//! blocked in its send of 1 MiB (above the eager limit) and the job would never end.
//! At 1 rank it only says it skipped.

use dlpack_mpi::comm::TensorComm;
use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned};
use dlpack_mpi::error::Unreceived;
use dlpack_mpi::Error;
use mpi::traits::*;
use mpi::Threading;

/// Bytes of each message: far above every transport's eager limit.
const BIG: usize = 1 << 20;

/// Receives the message with `tag` from rank 0 into a 4-byte tensor: an `Error::Unfit`.
fn recv_unfit(w: &mpi::topology::SimpleCommunicator, tag: i32) -> Result<Error, String> {
    let small = Owned::new(vec![0u8; 4]);
    let mut t = acquire(&small, &AcquireOptions::default()).map_err(|e| e.to_string())?;
    let err = match w.recv_tensor(&mut t, 0, tag) {
        Ok(_) => return Err(format!("tag {tag}: a {BIG}-byte message fit 4 bytes")),
        Err(e) => e,
    };
    let held = err
        .unreceived()
        .ok_or(format!("tag {tag}: no held message: {err}"))?;
    if held.len_bytes() != BIG as u64 || !held.is_held() {
        return Err(format!(
            "tag {tag}: held {held:?}, expected {BIG} bytes held"
        ));
    }
    Ok(err)
}

/// Rank 1: a message dropped on another thread (queued below MPI_THREAD_MULTIPLE, then
/// discarded by the main thread's next discard); returns a third one, still held.
fn receiver(w: &mpi::topology::SimpleCommunicator) -> Result<Error, String> {
    let multiple = mpi::environment::threading_support() == Threading::Multiple;
    let first = recv_unfit(w, 1)?;
    std::thread::spawn(move || drop(first))
        .join()
        .map_err(|_| "the dropping thread panicked")?;
    let queued = Unreceived::deferred_discards();
    if queued != usize::from(!multiple) {
        return Err(format!(
            "{queued} deferred discards after a drop on another thread"
        ));
    }
    drop(recv_unfit(w, 2)?);
    if Unreceived::deferred_discards() != 0 {
        return Err("the main thread's discard left the queue non-empty".into());
    }
    recv_unfit(w, 3)
}

fn main() {
    let mut kept: Option<Error> = None;
    let mut verdict: Result<(), String> = Ok(());
    let (rank, threading);
    {
        let universe = mpi::initialize().expect("MPI initializes once");
        let w = universe.world();
        rank = w.rank();
        threading = mpi::environment::threading_support();
        if w.size() < 2 {
            println!("held_finalize: skipped at 1 rank (scripts/test.sh runs it at 2 ranks)");
            return;
        }
        if rank == 0 {
            // Nonblocking: tag 1's message is received only after tag 2's (its discard
            // waits for the main thread), and tag 3's only inside rank 1's MPI_Finalize.
            let payload = vec![7u8; BIG];
            let peer = w.process_at_rank(1);
            mpi::request::scope(|scope| {
                let sends: Vec<_> = (1..=3)
                    .map(|tag| peer.immediate_send_with_tag(scope, &payload[..], tag))
                    .collect();
                for send in sends {
                    send.wait();
                }
            });
        } else if rank == 1 {
            match receiver(&w) {
                Ok(err) => kept = Some(err),
                Err(e) => verdict = Err(e),
            }
        }
        // `universe` drops here: MPI_Finalize, with tag 3's message still held by `kept`.
    }
    if let Some(err) = &kept {
        if err.unreceived().is_some_and(Unreceived::is_held) {
            verdict = Err("MPI_Finalize left the held message held".into());
        }
    }
    drop(kept);
    match verdict {
        Ok(()) => println!("held_finalize: rank {rank} ok (MPI threading level {threading:?})"),
        Err(e) => {
            println!("held_finalize: rank {rank} FAILED: {e}");
            std::process::exit(1);
        }
    }
}
