//! Several threads sending and receiving tensors at once under `MPI_THREAD_MULTIPLE`.
//!
//! Each of `THREADS` threads owns its tensors (guards are `Send`, specs are not: every
//! thread acquires its own), uses its own tag, and exchanges `ROUNDS` messages around the
//! ring with `sendrecv_tensor` (probe, then receive: safe with distinct tags, see
//! `TensorComm::recv_tensor`), a blocking send/receive pair and a nonblocking pair. Odd
//! threads use strided tensors, so the derived-datatype cache is built from several threads
//! at once. Every received value is checked, and every tensor is released exactly once
//! (the exporters' leases come back).
//!
//! Then two threads receive on one `(source, tag)` while a third sends them two messages,
//! one that fits their tensors and one that does not, plain (`recv_tensor`) and under the
//! checked protocol (`checked::recv_into`): each thread gets exactly one outcome, the
//! fitting message whole or an `Error::Unfit` holding the other one, which it then
//! receives through the error (`Unreceived::recv_into` / `recv_new`); nothing is lost and
//! neither thread takes the other's message (`MPI_Mprobe`/`MPI_Mrecv`).
//!
//! A plain `main` (harness = false): `cargo test` runs it at 1 rank, scripts/test.sh at 2.
//! If the MPI library does not grant `MPI_THREAD_MULTIPLE`, it says so and exits 0.

use dlpack_mpi::checked;
use dlpack_mpi::comm::TensorComm;
use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned};
use dlpack_mpi::spec::{RecvSpec, SendSpec};
use dlpack_mpi::Error;
use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use mpi::Threading;

const THREADS: i32 = 4;
const ROUNDS: i32 = 40;

/// What rank `rank`'s thread `thread` sends in round `round` as element `i`.
fn value(rank: i32, thread: i32, round: i32, i: usize) -> f64 {
    f64::from(rank) * 1e6 + f64::from(thread) * 1e4 + f64::from(round) * 100.0 + i as f64
}

/// A tensor of `n` elements (every other element of `2n` storage for strided threads).
fn tensor_of(thread: i32, n: usize, f: impl Fn(usize) -> f64) -> Owned<f64> {
    if thread % 2 == 1 {
        let mut storage = vec![-1.0; 2 * n];
        for i in 0..n {
            storage[2 * i] = f(i);
        }
        Owned::new(storage)
            .with_layout(&[n as i64], Some(&[2]), 0)
            .expect("a stride-2 layout inside the storage")
    } else {
        Owned::new((0..n).map(f).collect::<Vec<_>>())
    }
}

fn worker(thread: i32) -> Result<(), String> {
    let w = SimpleCommunicator::world();
    let (rank, size) = (w.rank(), w.size());
    let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
    let tag = 100 + thread;
    let step = if thread % 2 == 1 { 2 } else { 1 };
    let opts = AcquireOptions::default();
    let e = |e: dlpack_mpi::Error| e.to_string();
    for round in 0..ROUNDS {
        let n = 16 + (thread as usize) * 8 + (round as usize % 5);
        // 1. sendrecv around the ring.
        let send = tensor_of(thread, n, |i| value(rank, thread, round, i));
        let recv = tensor_of(thread, n, |_| f64::NAN);
        {
            let s = acquire(&send, &opts).map_err(e)?;
            let mut r = acquire(&recv, &opts).map_err(e)?;
            w.sendrecv_tensor(&s, next, tag, &mut r, prev, tag)
                .map_err(e)?;
        }
        let got = recv.into_vec();
        for i in 0..n {
            let want = value(prev, thread, round, i);
            if got[i * step] != want {
                return Err(format!(
                    "thread {thread} round {round}: element {i} is {}, expected {want}",
                    got[i * step]
                ));
            }
        }
        // 2. nonblocking exchange in a scope (specs built and used on this thread).
        let send = tensor_of(thread, n, |i| -value(rank, thread, round, i));
        let recv = tensor_of(thread, n, |_| f64::NAN);
        {
            let s = acquire(&send, &opts).map_err(e)?;
            let mut r = acquire(&recv, &opts).map_err(e)?;
            let ss = SendSpec::new(&s).map_err(e)?;
            let mut rs = RecvSpec::new(&mut r).map_err(e)?;
            mpi::request::scope(|scope| -> Result<(), String> {
                let rq = w
                    .immediate_recv_spec(scope, &mut rs, prev, tag + THREADS)
                    .map_err(e)?;
                let sq = w
                    .immediate_send_spec(scope, &ss, next, tag + THREADS)
                    .map_err(e)?;
                rq.wait();
                sq.wait();
                Ok(())
            })?;
        }
        let got = recv.into_vec();
        for i in 0..n {
            if got[i * step] != -value(prev, thread, round, i) {
                return Err(format!(
                    "thread {thread} round {round}: nonblocking element {i}"
                ));
            }
        }
    }
    Ok(())
}

/// Elements of the fitting message in [`two_receivers_one_tag`]; the other has `FIT + 3`.
const FIT: usize = 8;

/// What the message of `len` elements carries.
fn message(len: usize) -> Vec<f64> {
    (0..len).map(|i| len as f64 * 1000.0 + i as f64).collect()
}

/// One receiving thread: a `FIT`-element receive on `(source, tag)`. Returns the values it
/// got: the fitting message directly, or the other one through the error that holds it.
fn receive_one(checked: bool, source: i32, tag: i32) -> Result<Vec<f64>, String> {
    let w = SimpleCommunicator::world();
    let opts = AcquireOptions::default();
    let e = |e: Error| e.to_string();
    let recv = Owned::new(vec![f64::NAN; FIT]);
    let result = {
        let mut r = acquire(&recv, &opts).map_err(e)?;
        if checked {
            checked::recv_into(&w, source, tag, &mut r)
        } else {
            w.recv_tensor(&mut r, source, tag)
        }
    };
    let err = match result {
        Ok(_) => return Ok(recv.into_vec()),
        Err(err) => err,
    };
    let want = (FIT as i64, FIT as i64 + 3);
    match err.mismatch() {
        Error::CountMismatch {
            expected, actual, ..
        } if (*expected, *actual) == want => {}
        other => return Err(format!("expected CountMismatch {want:?}, got {other:?}")),
    }
    let held = err.unreceived().ok_or("the error holds no message")?;
    if held.len_bytes() != 8 * (FIT as u64 + 3) {
        return Err(format!("held message of {} bytes", held.len_bytes()));
    }
    if checked {
        if held.sent_shape() != Some(&[FIT as i64 + 3][..]) {
            return Err(format!("sent shape {:?}", held.sent_shape()));
        }
        return held.recv_new().map_err(e)?.to_vec::<f64>().map_err(e);
    }
    let big = Owned::new(vec![f64::NAN; FIT + 3]);
    held.recv_into(&mut acquire(&big, &opts).map_err(e)?)
        .map_err(e)?;
    Ok(big.into_vec())
}

/// Two threads receive on one `(source, tag)` while a third sends them a message that fits
/// and one that does not: each gets exactly one of them, nothing is lost.
fn two_receivers_one_tag(checked: bool) -> Result<(), String> {
    let w = SimpleCommunicator::world();
    let (rank, size) = (w.rank(), w.size());
    let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
    let tag = if checked { 301 } else { 300 };
    let (sent, got) = std::thread::scope(|s| {
        let sender = s.spawn(move || -> Result<(), String> {
            let w = SimpleCommunicator::world();
            for len in [FIT, FIT + 3] {
                let data = Owned::new(message(len));
                let t = acquire(&data, &AcquireOptions::default()).map_err(|e| e.to_string())?;
                let sent = if checked {
                    checked::send(&w, next, tag, &t)
                } else {
                    w.send_tensor(&t, next, tag)
                };
                sent.map_err(|e| e.to_string())?;
            }
            Ok(())
        });
        let receivers: Vec<_> = (0..2)
            .map(|_| s.spawn(move || receive_one(checked, prev, tag)))
            .collect();
        let got: Vec<_> = receivers
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into())))
            .collect();
        let sent = sender
            .join()
            .unwrap_or_else(|_| Err("sender panicked".into()));
        (sent, got)
    });
    sent?;
    let mut got = got.into_iter().collect::<Result<Vec<_>, String>>()?;
    got.sort_by_key(Vec::len);
    if got != [message(FIT), message(FIT + 3)] {
        return Err(format!("the two receivers got {got:?}"));
    }
    Ok(())
}

fn main() {
    let (universe, granted) =
        mpi::initialize_with_threading(Threading::Multiple).expect("MPI initializes once");
    let w = universe.world();
    if granted != Threading::Multiple {
        if w.rank() == 0 {
            println!("SKIP threads: the MPI library granted {granted:?}, not Multiple");
        }
        return;
    }
    if w.rank() == 0 {
        println!(
            "running {THREADS} threads × {ROUNDS} rounds at {} rank(s) under MPI_THREAD_MULTIPLE",
            w.size()
        );
    }
    let results: Vec<Result<(), String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS).map(|t| s.spawn(move || worker(t))).collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into())))
            .collect()
    });
    let mut mine = 0i32;
    for (t, r) in results.iter().enumerate() {
        if let Err(msg) = r {
            eprintln!("rank {}: thread {t}: {msg}", w.rank());
            mine = 1;
        }
    }
    for checked in [false, true] {
        if let Err(msg) = two_receivers_one_tag(checked) {
            eprintln!(
                "rank {}: two receivers (checked {checked}): {msg}",
                w.rank()
            );
            mine = 1;
        }
    }
    let mut any = 0i32;
    w.all_reduce_into(&mine, &mut any, SystemOperation::max());
    if w.rank() == 0 {
        println!(
            "test threads_multiple (ring; two receivers on one tag) ... {}",
            if any == 0 { "ok" } else { "FAILED" }
        );
    }
    drop(universe);
    if any != 0 {
        std::process::exit(1);
    }
}
