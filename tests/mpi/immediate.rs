//! Multi-rank tests of the tensor-taking nonblocking operations (`immediate_send_tensor`,
//! `immediate_recv_tensor`: packing per policy, the pack buffer owned by the request, unpack
//! at completion, pool memory flat), windowed transfers (`*_tensor_range`), the broadcast
//! whose root passes a shared tensor (`broadcast_tensor_from`) and read-only `TensorView`s.
//!
//! The suite `immediate` of tests/mpi (main.rs): `cargo test` runs it at 1 rank;
//! scripts/test.sh runs it under `mpirun -n 2`. Every test works at any number of
//! ranks (a ring: send to `rank + 1`, receive from `rank - 1`).

use crate::harness;
use dlpack_mpi::comm::{BroadcastBuffer, TensorComm};
use dlpack_mpi::dlpack::{acquire, AcquireOptions, ManagedTensor, Owned, Tensor, TensorView};
use dlpack_mpi::settings::{set_packing, Packing};
use dlpack_mpi::spec::scratch::pooled_bytes;
use dlpack_mpi::Error;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

type Outcome = Result<(), String>;

const POLICIES: [Packing; 3] = [Packing::Copy, Packing::DerivedDatatype, Packing::Auto];

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

fn opts() -> AcquireOptions {
    AcquireOptions::default()
}

fn ring(w: &SimpleCommunicator) -> (i32, i32) {
    let (r, p) = (w.rank(), w.size());
    ((r + 1) % p, (r + p - 1) % p)
}

/// A strided f32 layout: name, shape, strides (elements), storage length (elements), and
/// whether `Packing::Auto` packs it (inner block under 4 KiB).
struct Layout {
    name: &'static str,
    shape: &'static [i64],
    strides: &'static [i64],
    storage: usize,
    auto_packs: bool,
}

const LAYOUTS: [Layout; 4] = [
    Layout {
        name: "Fortran order 4x6",
        shape: &[4, 6],
        strides: &[1, 4],
        storage: 24,
        auto_packs: true,
    },
    Layout {
        name: "step 2",
        shape: &[12],
        strides: &[2],
        storage: 24,
        auto_packs: true,
    },
    Layout {
        name: "3-D permutation",
        shape: &[2, 3, 4],
        strides: &[1, 2, 6],
        storage: 24,
        auto_packs: true,
    },
    Layout {
        name: "rows of 1024 with gaps",
        shape: &[3, 1024],
        strides: &[2048, 1],
        storage: 3 * 2048,
        auto_packs: false,
    },
];

/// Storage offsets of the elements of `shape`/`strides`, in logical row-major order.
fn offsets(shape: &[i64], strides: &[i64]) -> Vec<usize> {
    let mut out = vec![0i64];
    for (&n, &st) in shape.iter().zip(strides) {
        out = out
            .iter()
            .flat_map(|&o| (0..n).map(move |i| o + i * st))
            .collect();
    }
    out.into_iter().map(|o| o as usize).collect()
}

fn storage_values(rank: i32, n: usize) -> Vec<f32> {
    (0..n).map(|i| (rank * 100_000) as f32 + i as f32).collect()
}

fn strided(values: Vec<f32>, l: &Layout) -> Result<Owned<f32>, String> {
    Owned::new(values)
        .with_layout(l.shape, Some(l.strides), 0)
        .map_err(s)
}

/// Strided send → contiguous receive, then contiguous send → strided receive, both
/// nonblocking, under one policy and layout; values checked on both legs.
fn round_trip(w: &SimpleCommunicator, policy: Packing, l: &Layout) -> Outcome {
    let (next, prev) = ring(w);
    let offs = offsets(l.shape, l.strides);
    let n = offs.len();
    let packs = match policy {
        Packing::Copy => true,
        Packing::DerivedDatatype => false,
        Packing::Auto => l.auto_packs,
    };
    let src = strided(storage_values(w.rank(), l.storage), l)?;
    let dst = Owned::new(vec![f32::NAN; n]);
    {
        let st = acquire(&src, &opts()).map_err(s)?;
        let mut dt = acquire(&dst, &opts()).map_err(s)?;
        mpi::request::scope(|scope| -> Outcome {
            let rr = w
                .immediate_recv_tensor(scope, &mut dt, prev, 21)
                .map_err(s)?;
            let mut sr = w.immediate_send_tensor(scope, &st, next, 21).map_err(s)?;
            ensure_eq!((sr.is_packed(), rr.is_packed()), (packs, false));
            // Complete the send by polling with test() (no timing: until it reports done).
            // (A send's status carries nothing to check.)
            let _sent = loop {
                match sr.test() {
                    Ok(done) => break done.map_err(s)?,
                    Err(pending) => sr = pending,
                }
            };
            let status = rr.wait().map_err(s)?;
            ensure_eq!(status.source_rank(), prev);
            Ok(())
        })?;
    }
    let prev_storage = storage_values(prev, l.storage);
    let expected: Vec<f32> = offs.iter().map(|&o| prev_storage[o]).collect();
    let got = dst.into_vec();
    ensure!(
        got == expected,
        "{} {policy:?}: strided → contiguous: {got:?}",
        l.name
    );

    // And back: contiguous → strided.
    let back_src = Owned::new(got);
    let back = strided(vec![-1.0; l.storage], l)?;
    {
        let st = acquire(&back_src, &opts()).map_err(s)?;
        let mut bt = acquire(&back, &opts()).map_err(s)?;
        mpi::request::scope(|scope| -> Outcome {
            let rr = w
                .immediate_recv_tensor(scope, &mut bt, prev, 22)
                .map_err(s)?;
            let sr = w.immediate_send_tensor(scope, &st, next, 22).map_err(s)?;
            ensure_eq!((sr.is_packed(), rr.is_packed()), (false, packs));
            rr.wait().map_err(s)?;
            sr.wait().map_err(s)?;
            Ok(())
        })?;
    }
    // What arrived is what `prev` received from `prev - 1`, in logical order.
    let pp = (prev + w.size() - 1) % w.size();
    let pp_storage = storage_values(pp, l.storage);
    let mut want = vec![-1.0f32; l.storage];
    for &o in &offs {
        want[o] = pp_storage[o];
    }
    let got = back.into_vec();
    ensure!(got == want, "{} {policy:?}: contiguous → strided", l.name);
    Ok(())
}

fn nonblocking_strided_round_trip_every_packing(w: &SimpleCommunicator) -> Outcome {
    let mut result = Ok(());
    'all: for policy in POLICIES {
        set_packing(policy);
        for l in &LAYOUTS {
            result = round_trip(w, policy, l);
            if result.is_err() {
                break 'all;
            }
        }
    }
    set_packing(Packing::Auto);
    result
}

/// Four strided sends and four strided receives outstanding at once (all packed), waited
/// in reverse order.
fn several_outstanding_requests(w: &SimpleCommunicator) -> Outcome {
    set_packing(Packing::Copy);
    let result = several(w);
    set_packing(Packing::Auto);
    result
}

fn several(w: &SimpleCommunicator) -> Outcome {
    let (next, prev) = ring(w);
    let l = &LAYOUTS[0];
    let offs = offsets(l.shape, l.strides);
    let k = 4usize;
    let srcs: Vec<Owned<f32>> = (0..k)
        .map(|j| strided(storage_values(w.rank() * 10 + j as i32, l.storage), l))
        .collect::<Result<_, _>>()?;
    let dsts: Vec<Owned<f32>> = (0..k)
        .map(|_| strided(vec![-1.0; l.storage], l))
        .collect::<Result<_, _>>()?;
    {
        let sts: Vec<ManagedTensor<'_>> = srcs
            .iter()
            .map(|o| acquire(o, &opts()))
            .collect::<Result<_, _>>()
            .map_err(s)?;
        let mut dts: Vec<ManagedTensor<'_>> = dsts
            .iter()
            .map(|o| acquire(o, &opts()))
            .collect::<Result<_, _>>()
            .map_err(s)?;
        mpi::request::scope(|scope| -> Outcome {
            let mut reqs = Vec::new();
            for (j, d) in dts.iter_mut().enumerate() {
                reqs.push(
                    w.immediate_recv_tensor(scope, d, prev, 30 + j as i32)
                        .map_err(s)?,
                );
            }
            for (j, t) in sts.iter().enumerate() {
                reqs.push(
                    w.immediate_send_tensor(scope, t, next, 30 + j as i32)
                        .map_err(s)?,
                );
            }
            ensure!(reqs.iter().all(|r| r.is_packed()), "every request packs");
            while let Some(r) = reqs.pop() {
                r.wait().map_err(s)?;
            }
            Ok(())
        })?;
    }
    for (j, d) in dsts.into_iter().enumerate() {
        let from = storage_values(prev * 10 + j as i32, l.storage);
        let got = d.into_vec();
        for &o in &offs {
            ensure_eq!(got[o], from[o]);
        }
    }
    Ok(())
}

/// 2000 strided nonblocking messages each way under `Packing::Copy`: the pool's idle
/// bytes after the first ten equal those at the end (buffers are reused, not piled up).
fn pool_memory_flat_over_many_messages(w: &SimpleCommunicator) -> Outcome {
    set_packing(Packing::Copy);
    let result = many(w);
    set_packing(Packing::Auto);
    result
}

fn many(w: &SimpleCommunicator) -> Outcome {
    let (next, prev) = ring(w);
    let l = &LAYOUTS[2];
    let src = strided(storage_values(w.rank(), l.storage), l)?;
    let dst = strided(vec![-1.0; l.storage], l)?;
    let st = acquire(&src, &opts()).map_err(s)?;
    let mut dt = acquire(&dst, &opts()).map_err(s)?;
    let mut after_warmup = 0;
    for i in 0..2000 {
        mpi::request::scope(|scope| -> Outcome {
            let rr = w
                .immediate_recv_tensor(scope, &mut dt, prev, 40)
                .map_err(s)?;
            let sr = w.immediate_send_tensor(scope, &st, next, 40).map_err(s)?;
            sr.wait().map_err(s)?;
            rr.wait().map_err(s)?;
            Ok(())
        })?;
        if i == 9 {
            after_warmup = pooled_bytes();
        }
    }
    ensure!(after_warmup > 0, "packed copies go through the pool");
    ensure_eq!(pooled_bytes(), after_warmup);
    drop((st, dt));
    let got = dst.into_vec();
    let from = storage_values(prev, l.storage);
    for o in offsets(l.shape, l.strides) {
        ensure_eq!(got[o], from[o]);
    }
    Ok(())
}

/// Requests dropped without `wait` complete in their `Drop`: no panic, and the packed
/// receive is unpacked into the tensor.
fn dropped_requests_wait_and_unpack(w: &SimpleCommunicator) -> Outcome {
    set_packing(Packing::Copy);
    let result = dropped(w);
    set_packing(Packing::Auto);
    result
}

fn dropped(w: &SimpleCommunicator) -> Outcome {
    let (next, prev) = ring(w);
    let l = &LAYOUTS[1];
    let src = strided(storage_values(w.rank(), l.storage), l)?;
    let dst = strided(vec![-1.0; l.storage], l)?;
    {
        let st = acquire(&src, &opts()).map_err(s)?;
        let mut dt = acquire(&dst, &opts()).map_err(s)?;
        mpi::request::scope(|scope| -> Outcome {
            let rr = w
                .immediate_recv_tensor(scope, &mut dt, prev, 50)
                .map_err(s)?;
            let sr = w.immediate_send_tensor(scope, &st, next, 50).map_err(s)?;
            drop(rr);
            drop(sr);
            Ok(())
        })?;
    }
    let got = dst.into_vec();
    let from = storage_values(prev, l.storage);
    for o in offsets(l.shape, l.strides) {
        ensure_eq!(got[o], from[o]);
    }
    Ok(())
}

/// A message shorter than the nonblocking receive is `CountMismatch` from `wait`; a packed
/// receive leaves the tensor unchanged.
fn short_message_is_count_mismatch(w: &SimpleCommunicator) -> Outcome {
    set_packing(Packing::Copy);
    let result = short(w);
    set_packing(Packing::Auto);
    result
}

fn short(w: &SimpleCommunicator) -> Outcome {
    let (next, prev) = ring(w);
    let four = Owned::new(vec![7.0f32; 4]);
    let six_strided = Owned::new(vec![-1.0f32; 12])
        .with_layout(&[6], Some(&[2]), 0)
        .map_err(s)?;
    {
        let st = acquire(&four, &opts()).map_err(s)?;
        let mut dt = acquire(&six_strided, &opts()).map_err(s)?;
        mpi::request::scope(|scope| -> Outcome {
            let rr = w
                .immediate_recv_tensor(scope, &mut dt, prev, 51)
                .map_err(s)?;
            let sr = w.immediate_send_tensor(scope, &st, next, 51).map_err(s)?;
            sr.wait().map_err(s)?;
            match rr.wait() {
                Err(Error::CountMismatch {
                    expected, actual, ..
                }) => ensure_eq!((expected, actual), (6, 4)),
                other => return Err(format!("expected CountMismatch, got {other:?}")),
            }
            Ok(())
        })?;
    }
    ensure_eq!(six_strided.into_vec(), vec![-1.0f32; 12]);
    Ok(())
}

/// Elements `[2, 5)` of an 8-element tensor into elements `[4, 7)` of another, blocking
/// and nonblocking; a window past the end is refused with a typed error.
fn windowed_transfers(w: &SimpleCommunicator) -> Outcome {
    let (next, prev) = ring(w);
    let base = |r: i32| (0..8).map(|i| r * 10 + i).collect::<Vec<i32>>();
    let src = Owned::new(base(w.rank()));
    let dst = Owned::new(vec![-1i32; 8]);
    let dst2 = Owned::new(vec![-1i32; 8]);
    {
        let st = acquire(&src, &opts()).map_err(s)?;
        let mut dt = acquire(&dst, &opts()).map_err(s)?;
        let mut dt2 = acquire(&dst2, &opts()).map_err(s)?;
        mpi::request::scope(|scope| -> Outcome {
            let sr = w
                .immediate_send_tensor_range(scope, &st, 2..5, next, 60)
                .map_err(s)?;
            let status = w.recv_tensor_range(&mut dt, 4..7, prev, 60).map_err(s)?;
            ensure_eq!(status.source_rank(), prev);
            sr.wait().map_err(s)?;
            let rr = w
                .immediate_recv_tensor_range(scope, &mut dt2, 0..3, prev, 61)
                .map_err(s)?;
            w.send_tensor_range(&st, 5..8, next, 61).map_err(s)?;
            rr.wait().map_err(s)?;
            Ok(())
        })?;
        match w.send_tensor_range(&st, 6..10, next, 62) {
            Err(Error::OutOfBounds {
                displacement,
                count,
                len,
                ..
            }) => ensure_eq!((displacement, count, len), (6, 4, 8)),
            other => return Err(format!("expected OutOfBounds, got {other:?}")),
        }
        let reversed = std::ops::Range { start: 5, end: 3 };
        match w.recv_tensor_range(&mut dt, reversed, prev, 62) {
            Err(Error::OutOfBounds { count, .. }) => ensure_eq!(count, -2),
            other => return Err(format!("expected OutOfBounds, got {other:?}")),
        }
    }
    let p = base(prev);
    ensure_eq!(dst.into_vec(), vec![-1, -1, -1, -1, p[2], p[3], p[4], -1]);
    ensure_eq!(dst2.into_vec(), vec![p[5], p[6], p[7], -1, -1, -1, -1, -1]);
    Ok(())
}

/// Windows of strided tensors, in logical order: elements `[1, 4)` of a step-2 view go into
/// elements `[2, 5)` of a transposed 3 × 2 tensor (blocking) and into `[0, 3)` of another
/// (nonblocking); the elements outside the windows keep their values.
fn strided_windows(w: &SimpleCommunicator) -> Outcome {
    let (next, prev) = ring(w);
    let base = |r: i32| (0..8).map(|i| r * 10 + i).collect::<Vec<i32>>();
    // Logical elements of the step-2 view of rank r: [r0, r2, r4, r6].
    let src = Owned::new(base(w.rank()))
        .with_layout(&[4], Some(&[2]), 0)
        .map_err(s)?;
    // Transposed 3 × 2 (strides [1, 3]): logical index k = 2i + j lives at storage i + 3j.
    let transposed = || {
        Owned::new(vec![-1i32; 6])
            .with_layout(&[3, 2], Some(&[1, 3]), 0)
            .map_err(s)
    };
    let (dst, dst2) = (transposed()?, transposed()?);
    {
        let st = acquire(&src, &opts()).map_err(s)?;
        let mut dt = acquire(&dst, &opts()).map_err(s)?;
        let mut dt2 = acquire(&dst2, &opts()).map_err(s)?;
        mpi::request::scope(|scope| -> Outcome {
            let sr = w
                .immediate_send_tensor_range(scope, &st, 1..4, next, 64)
                .map_err(s)?;
            ensure!(
                sr.is_packed(),
                "a strided window goes through a packed copy"
            );
            w.recv_tensor_range(&mut dt, 2..5, prev, 64).map_err(s)?;
            sr.wait().map_err(s)?;
            let rr = w
                .immediate_recv_tensor_range(scope, &mut dt2, 0..3, prev, 65)
                .map_err(s)?;
            w.send_tensor_range(&st, 1..4, next, 65).map_err(s)?;
            rr.wait().map_err(s)?;
            Ok(())
        })?;
        match w.send_tensor_range(&st, 2..5, next, 66) {
            Err(Error::OutOfBounds {
                displacement,
                count,
                len,
                ..
            }) => ensure_eq!((displacement, count, len), (2, 3, 4)),
            other => return Err(format!("expected OutOfBounds, got {other:?}")),
        }
    }
    let p = base(prev);
    let window = [p[2], p[4], p[6]];
    // Logical k → storage: 0→0, 1→3, 2→1, 3→4, 4→2, 5→5.
    let storage_of = [0usize, 3, 1, 4, 2, 5];
    let mut want = vec![-1i32; 6];
    for (k, v) in (2..5).zip(window) {
        want[storage_of[k]] = v;
    }
    ensure_eq!(dst.into_vec(), want);
    let mut want2 = vec![-1i32; 6];
    for (k, v) in (0..3).zip(window) {
        want2[storage_of[k]] = v;
    }
    ensure_eq!(dst2.into_vec(), want2);
    Ok(())
}

/// The root broadcasts a READ_ONLY tensor it holds only shared; a non-root passing a
/// send-only buffer is refused before any MPI call.
fn broadcast_from_a_shared_root_tensor(w: &SimpleCommunicator) -> Outcome {
    let size = w.size();
    for root in 0..size {
        let data = Owned::new(vec![root as i64 * 3 + 1; 5]).read_only();
        let out = Owned::new(vec![0i64; 5]);
        {
            let shared = acquire(&data, &opts()).map_err(s)?;
            ensure!(shared.is_read_only(), "the root's tensor is READ_ONLY");
            let mut o = acquire(&out, &opts()).map_err(s)?;
            let buffer = if w.rank() == root {
                BroadcastBuffer::Send(&shared)
            } else {
                BroadcastBuffer::Recv(&mut o)
            };
            w.broadcast_tensor_from(buffer, root).map_err(s)?;
        }
        let want = if w.rank() == root {
            0
        } else {
            root as i64 * 3 + 1
        };
        ensure_eq!(out.into_vec(), vec![want; 5]);
    }
    // Every non-root passes the root's form: each refuses with BroadcastNotRoot, and through
    // the agreement the root (which passed a valid buffer) gets PeerRefused naming rank 1;
    // nobody enters MPI_Bcast. At 1 rank there is no non-root.
    if w.size() > 1 {
        let data = Owned::new(vec![1i64; 5]);
        let t = acquire(&data, &opts()).map_err(s)?;
        match (
            w.rank(),
            w.broadcast_tensor_from(BroadcastBuffer::Send(&t), 0),
        ) {
            (0, Err(Error::PeerRefused { rank, .. })) => ensure_eq!(rank, 1),
            (0, other) => return Err(format!("root: expected PeerRefused, got {other:?}")),
            (_, Err(Error::BroadcastNotRoot { rank, root })) => {
                ensure_eq!((rank, root), (w.rank(), 0))
            }
            (_, other) => return Err(format!("expected BroadcastNotRoot, got {other:?}")),
        }
    }
    Ok(())
}

/// A borrowed `DLTensor*` view marked read-only is refused as a receive buffer (blocking
/// and nonblocking) with `ReadOnly`, or `Immutable` naming the producer; it still sends.
fn read_only_views_refuse_receives(w: &SimpleCommunicator) -> Outcome {
    let (next, prev) = ring(w);
    let data = Owned::new(vec![w.rank() as f64; 3]);
    let out = Owned::new(vec![0f64; 3]);
    let t = acquire(&data, &opts()).map_err(s)?;
    {
        // SAFETY: `t`'s DLTensor, shape and data outlive the views (this block); nothing
        // writes them meanwhile.
        let mut v = unsafe { TensorView::from_raw_read_only(t.dl_tensor()) }.map_err(s)?;
        ensure!(v.is_read_only(), "from_raw_read_only reports READ_ONLY");
        ensure!(
            matches!(w.recv_tensor(&mut v, prev, 70), Err(Error::ReadOnly)),
            "blocking receive into a read-only view"
        );
        let immediate =
            mpi::request::scope(|scope| w.immediate_recv_tensor(scope, &mut v, prev, 70).err());
        ensure!(
            matches!(immediate, Some(Error::ReadOnly)),
            "nonblocking receive into a read-only view: {immediate:?}"
        );
        // SAFETY: as above.
        let mut jv = unsafe { TensorView::from_raw_read_only(t.dl_tensor()) }
            .map_err(s)?
            .immutable("jax.Array");
        match w.recv_tensor(&mut jv, prev, 70) {
            Err(Error::Immutable { producer }) => ensure_eq!(producer, "jax.Array"),
            other => return Err(format!("expected Immutable, got {other:?}")),
        }
        // A read-only view still sends.
        let mut o = acquire(&out, &opts()).map_err(s)?;
        w.sendrecv_tensor(&v, next, 71, &mut o, prev, 71)
            .map_err(s)?;
    }
    ensure_eq!(out.into_vec(), vec![prev as f64; 3]);
    Ok(())
}

type Case = fn(&SimpleCommunicator) -> Outcome;

/// Receives from `comm::any_source()` with `comm::any_tag()`: blocking (rank 0 takes one
/// message from every rank, in whatever order they come, each status naming its sender and
/// tag), in a send-receive ring and nonblocking; other negative sources and tags stay
/// refused.
fn wildcard_receives(w: &SimpleCommunicator) -> Outcome {
    use dlpack_mpi::comm::{any_source, any_tag};
    let (r, p) = (w.rank(), w.size());
    let mine = Owned::new(vec![r as f32; 3]);
    let mt = acquire(&mine, &opts()).map_err(s)?;
    mpi::request::scope(|scope| -> Outcome {
        let sent = w.immediate_send_tensor(scope, &mt, 0, 70 + r).map_err(s)?;
        if r == 0 {
            let mut seen = vec![false; usize::try_from(p).map_err(s)?];
            for _ in 0..p {
                let into = Owned::new(vec![-1.0f32; 3]);
                let mut t = acquire(&into, &opts()).map_err(s)?;
                let st = w.recv_tensor(&mut t, any_source(), any_tag()).map_err(s)?;
                drop(t);
                let from = st.source_rank();
                ensure_eq!(st.tag(), 70 + from);
                ensure_eq!(into.into_vec(), vec![from as f32; 3]);
                seen[usize::try_from(from).map_err(s)?] = true;
            }
            ensure!(
                seen.iter().all(|&b| b),
                "every rank's message taken once: {seen:?}"
            );
        }
        sent.wait().map_err(s)?;
        Ok(())
    })?;
    w.barrier();
    let (next, prev) = ring(w);
    let into = Owned::new(vec![-1.0f32; 3]);
    {
        let mut t = acquire(&into, &opts()).map_err(s)?;
        let st = w
            .sendrecv_tensor(&mt, next, 80, &mut t, any_source(), any_tag())
            .map_err(s)?;
        ensure_eq!((st.source_rank(), st.tag()), (prev, 80));
    }
    ensure_eq!(into.into_vec(), vec![prev as f32; 3]);
    w.barrier();
    let into = Owned::new(vec![-1.0f32; 3]);
    {
        let mut t = acquire(&into, &opts()).map_err(s)?;
        mpi::request::scope(|scope| -> Outcome {
            let rr = w
                .immediate_recv_tensor(scope, &mut t, any_source(), any_tag())
                .map_err(s)?;
            let sr = w.immediate_send_tensor(scope, &mt, next, 90).map_err(s)?;
            sr.wait().map_err(s)?;
            let st = rr.wait().map_err(s)?;
            ensure_eq!((st.source_rank(), st.tag()), (prev, 90));
            Ok(())
        })?;
    }
    ensure_eq!(into.into_vec(), vec![prev as f32; 3]);
    let other = Owned::new(vec![0.0f32; 3]);
    let mut t = acquire(&other, &opts()).map_err(s)?;
    // -5 is neither library's MPI_ANY_SOURCE (-1 Open MPI, -2 MPICH) nor MPI_PROC_NULL.
    match w.recv_tensor(&mut t, -5, 0) {
        Err(Error::InvalidRank { rank: -5, .. }) => {}
        other => return Err(format!("source -5 must be InvalidRank: {other:?}")),
    }
    match w.recv_tensor(&mut t, 0, -7) {
        Err(Error::InvalidTag { tag: -7, .. }) => Ok(()),
        other => Err(format!("tag -7 must be InvalidTag: {other:?}")),
    }
}

const CASES: &[(&str, Case)] = &[
    (
        "nonblocking_strided_round_trip_every_packing",
        nonblocking_strided_round_trip_every_packing,
    ),
    ("several_outstanding_requests", several_outstanding_requests),
    (
        "pool_memory_flat_over_many_messages",
        pool_memory_flat_over_many_messages,
    ),
    (
        "dropped_requests_wait_and_unpack",
        dropped_requests_wait_and_unpack,
    ),
    (
        "short_message_is_count_mismatch",
        short_message_is_count_mismatch,
    ),
    ("windowed_transfers", windowed_transfers),
    ("wildcard_receives", wildcard_receives),
    ("strided_windows", strided_windows),
    (
        "broadcast_from_a_shared_root_tensor",
        broadcast_from_a_shared_root_tensor,
    ),
    (
        "read_only_views_refuse_receives",
        read_only_views_refuse_receives,
    ),
];

/// The suite `immediate` (see the binary's `main`).
pub fn run(w: &SimpleCommunicator, filter: &[String]) -> harness::End {
    if w.rank() == 0 {
        println!(
            "running nonblocking/window/broadcast cases at {} rank(s)",
            w.size()
        );
    }
    let (passed, failed) = harness::run_cases(w, CASES.iter().copied(), filter, |case| case(w));
    harness::report(w, passed, failed);
    harness::End::Ran { passed, failed }
}
