//! Adversarial arguments for the agreement (refusals and fingerprint mismatches together,
//! the odd rank out at rank 0, two ranks that differ in different ways, in-place against
//! out-of-place, a root that differs, zero against 1000 elements, counts arrays of
//! different lengths, a device staging failure) and for the operand core (stride-0 views in
//! every kind of operation, windows that are out of range, reversed or empty on strided
//! tensors, receives into `READ_ONLY` or overlapping views, claimed shapes near 2^62).
//!
//! Every case ends with every rank holding an exact error (or exact values), and then a
//! matching collective that delivers exact values: nothing was left behind on the
//! communicator. A case that lets one rank into MPI while another returned hangs, which
//! the `timeout` around the job turns into a failure. At 1 rank each case checks what a
//! lone rank must return (its own error, or success where no peer can differ).

use crate::harness;
use crate::mismatch::then_all_reduce_works;
use dlpack_mpi::comm::{Blocks, TensorComm, AGREEMENT_REASON_BYTES};
use dlpack_mpi::device::{device_type, Device};
use dlpack_mpi::dlpack::{acquire, acquire_with_runtime, AcquireOptions, Owned};
use dlpack_mpi::dtype::ReduceOp;
use dlpack_mpi::runtime::{DeviceRuntime, SimulatedRuntime};
use dlpack_mpi::settings::{packing, set_packing, Packing};
use dlpack_mpi::transport::{DeviceComm, Transport};
use dlpack_mpi::Error;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

type Outcome = Result<(), String>;

fn opts() -> AcquireOptions {
    AcquireOptions::default()
}

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

fn last(w: &SimpleCommunicator) -> i32 {
    w.size() - 1
}

/// `got` must be the mismatch every rank returns: rank 0's arguments exactly `ours`,
/// `other`'s exactly `theirs`. At 1 rank the call must succeed.
fn expect_mismatch(
    w: &SimpleCommunicator,
    got: dlpack_mpi::Result<()>,
    other: i32,
    ours: &str,
    theirs: &str,
) -> Outcome {
    if w.size() == 1 {
        return got.map_err(|e| format!("at 1 rank the call must succeed: {e}"));
    }
    match got {
        Err(Error::CollectiveMismatch {
            rank,
            arguments,
            other_rank,
            other_arguments,
            ..
        }) => {
            ensure_eq!((rank, other_rank), (0, other));
            ensure_eq!(arguments.as_str(), ours);
            ensure_eq!(other_arguments.as_str(), theirs);
            Ok(())
        }
        other => Err(format!("expected CollectiveMismatch, got {other:?}")),
    }
}

/// The refuser must see its own error (`own`), every other rank `PeerRefused` naming it
/// with its error text exactly (sent here by the test itself to compare).
fn expect_refused(
    w: &SimpleCommunicator,
    refuser: i32,
    got: dlpack_mpi::Result<()>,
    own: impl Fn(&Error) -> bool,
) -> Outcome {
    let mut text = [0u8; AGREEMENT_REASON_BYTES];
    if w.rank() == refuser {
        if let Err(e) = &got {
            let t = e.to_string();
            let n = t.len().min(text.len());
            text[..n].copy_from_slice(&t.as_bytes()[..n]);
        }
    }
    w.process_at_rank(refuser).broadcast_into(&mut text[..]);
    let end = text.iter().position(|&b| b == 0).unwrap_or(text.len());
    let expected = String::from_utf8_lossy(&text[..end]).into_owned();
    if w.rank() == refuser {
        return match &got {
            Err(e) if own(e) => Ok(()),
            other => Err(format!(
                "the refusing rank expected its own error, got {other:?}"
            )),
        };
    }
    match got {
        Err(Error::PeerRefused { rank, reason }) if rank == refuser && reason == expected => Ok(()),
        other => Err(format!(
            "expected PeerRefused {{ rank: {refuser}, reason: {expected:?} }}, got {other:?}"
        )),
    }
}

/// An all-reduce of `n` f32 elements with `op` (`read_only`: the receive is `READ_ONLY`).
fn all_reduce_f32(
    w: &SimpleCommunicator,
    n: usize,
    op: ReduceOp,
    read_only: bool,
) -> dlpack_mpi::Result<()> {
    let send = Owned::new(vec![1.0f32; n]);
    let recv = if read_only {
        Owned::new(vec![-1.0f32; n]).read_only()
    } else {
        Owned::new(vec![-1.0f32; n])
    };
    let st = acquire(&send, &opts())?;
    let mut rt = acquire(&recv, &opts())?;
    w.all_reduce_tensor(&st, &mut rt, op)
}

// ---------------------------------------------------------------------------------------
// Agreement: refusals and mismatches together
// ---------------------------------------------------------------------------------------

/// The last rank refuses (a `READ_ONLY` receive) while rank 0 passes `Max` against the
/// others' `Sum`: the refusal wins on every rank (the mismatching rank 0 included), and no
/// rank waits.
fn refusal_beats_mismatch(w: &SimpleCommunicator) -> Outcome {
    let refuser = last(w);
    let op = if w.size() > 1 && w.rank() == 0 {
        ReduceOp::Max
    } else {
        ReduceOp::Sum
    };
    let got = all_reduce_f32(w, 1000, op, w.rank() == refuser);
    expect_refused(w, refuser, got, |e| matches!(e, Error::ReadOnly))?;
    then_all_reduce_works(w)
}

/// Rank 0 refuses (its root is -1) and the last rank passes a different count: every rank
/// but 0 returns `PeerRefused { rank: 0 }` naming the bad root, rank 0 its own
/// `InvalidRank`.
fn refusal_at_rank0_beats_mismatch_elsewhere(w: &SimpleCommunicator) -> Outcome {
    let n = if w.size() > 1 && w.rank() == last(w) {
        999
    } else {
        1000
    };
    let root = if w.rank() == 0 { -1 } else { 0 };
    let data = Owned::new(vec![3.0f32; n]);
    let got = {
        let mut t = acquire(&data, &opts()).map_err(s)?;
        w.broadcast_tensor(&mut t, root)
    };
    expect_refused(w, 0, got, |e| {
        *e == Error::InvalidRank {
            rank: -1,
            size: w.size(),
        }
    })?;
    then_all_reduce_works(w)
}

/// Rank 0 is the odd one out: every rank names rank 0 and rank 1 (the lowest that differs
/// from rank 0), with both signatures in words.
fn mismatch_rank0_odd_one_out(w: &SimpleCommunicator) -> Outcome {
    let op = if w.rank() == 0 {
        ReduceOp::Max
    } else {
        ReduceOp::Sum
    };
    let got = all_reduce_f32(w, 1000, op, false);
    expect_mismatch(
        w,
        got,
        1,
        "all_reduce float32 × 1000 max",
        "all_reduce float32 × 1000 sum",
    )?;
    then_all_reduce_works(w)
}

/// Ranks 1, 2 and 3 differ from rank 0 in different ways (count, dtype, operator): every
/// rank names rank 1, the lowest.
fn two_ranks_differ_differently(w: &SimpleCommunicator) -> Outcome {
    let got = match w.rank() {
        1 => all_reduce_f32(w, 1001, ReduceOp::Sum, false),
        2 => {
            let (send, recv) = (
                Owned::new(vec![1.0f64; 1000]),
                Owned::new(vec![0.0f64; 1000]),
            );
            let st = acquire(&send, &opts()).map_err(s)?;
            let mut rt = acquire(&recv, &opts()).map_err(s)?;
            w.all_reduce_tensor(&st, &mut rt, ReduceOp::Sum)
        }
        3 => all_reduce_f32(w, 1000, ReduceOp::Max, false),
        _ => all_reduce_f32(w, 1000, ReduceOp::Sum, false),
    };
    expect_mismatch(
        w,
        got,
        1,
        "all_reduce float32 × 1000 sum",
        "all_reduce float32 × 1001 sum",
    )?;
    then_all_reduce_works(w)
}

/// The last rank reduces in place while the others pass a send and a receive (MPI-4.1
/// §6.9.6: `MPI_IN_PLACE` must be given at every rank): a mismatch, and no buffer is
/// written on any rank.
fn in_place_against_all_reduce(w: &SimpleCommunicator) -> Outcome {
    let send = Owned::new(vec![1.0f32; 1000]);
    let mut recv = Owned::new(vec![-1.0f32; 1000]);
    let got = {
        let st = acquire(&send, &opts()).map_err(s)?;
        let mut rt = acquire(&recv, &opts()).map_err(s)?;
        if w.size() > 1 && w.rank() == last(w) {
            w.all_reduce_tensor_in_place(&mut rt, ReduceOp::Sum)
        } else {
            w.all_reduce_tensor(&st, &mut rt, ReduceOp::Sum)
        }
    };
    expect_mismatch(
        w,
        got,
        last(w),
        "all_reduce float32 × 1000 sum",
        "all_reduce_in_place float32 × 1000 sum",
    )?;
    if w.size() > 1 {
        ensure!(
            recv.as_slice().iter().all(|&v| v == -1.0),
            "a buffer was written"
        );
    }
    then_all_reduce_works(w)
}

/// The last rank names itself the root of a reduce (and passes a receive, as a root must)
/// while the others name rank 0: a mismatch, no receive written; then the reduce at root 0
/// delivers the sum.
fn reduce_root_differs(w: &SimpleCommunicator) -> Outcome {
    let odd = w.size() > 1 && w.rank() == last(w);
    let root = if odd { last(w) } else { 0 };
    let send = Owned::new(vec![w.rank() as f32 + 1.0; 1000]);
    let mut recv = Owned::new(vec![-1.0f32; 1000]);
    let got = {
        let st = acquire(&send, &opts()).map_err(s)?;
        let mut rt = acquire(&recv, &opts()).map_err(s)?;
        let r = (w.rank() == root).then_some(&mut rt as &mut dyn dlpack_mpi::dlpack::Tensor);
        w.reduce_tensor(&st, r, ReduceOp::Sum, root)
    };
    let theirs = format!("reduce float32 × 1000 sum root {}", last(w));
    expect_mismatch(w, got, last(w), "reduce float32 × 1000 sum root 0", &theirs)?;
    if w.size() > 1 {
        ensure!(
            recv.as_slice().iter().all(|&v| v == -1.0),
            "a receive was written"
        );
    }
    {
        let st = acquire(&send, &opts()).map_err(s)?;
        let mut rt = acquire(&recv, &opts()).map_err(s)?;
        let r = (w.rank() == 0).then_some(&mut rt as &mut dyn dlpack_mpi::dlpack::Tensor);
        w.reduce_tensor(&st, r, ReduceOp::Sum, 0).map_err(s)?;
    }
    if w.rank() == 0 {
        let p = w.size() as f32;
        let want = p * (p + 1.0) / 2.0;
        ensure!(recv.as_slice().iter().all(|&v| v == want), "reduce result");
    }
    then_all_reduce_works(w)
}

/// An empty tensor on the last rank against 1000 elements on the others, in an all-reduce
/// and a broadcast: mismatches; then empty tensors on every rank go through both.
fn zero_against_thousand(w: &SimpleCommunicator) -> Outcome {
    let odd = w.size() > 1 && w.rank() == last(w);
    let n = if odd { 0 } else { 1000 };
    let got = all_reduce_f32(w, n, ReduceOp::Sum, false);
    expect_mismatch(
        w,
        got,
        last(w),
        "all_reduce float32 × 1000 sum",
        "all_reduce float32 × 0 sum",
    )?;
    let data = Owned::new(vec![2.0f32; n]);
    let got = {
        let mut t = acquire(&data, &opts()).map_err(s)?;
        w.broadcast_tensor(&mut t, 0)
    };
    expect_mismatch(
        w,
        got,
        last(w),
        "broadcast float32 × 1000 root 0",
        "broadcast float32 × 0 root 0",
    )?;
    all_reduce_f32(w, 0, ReduceOp::Sum, false).map_err(|e| format!("empty all-reduce: {e}"))?;
    let empty = Owned::new(Vec::<f32>::new());
    {
        let mut t = acquire(&empty, &opts()).map_err(s)?;
        w.broadcast_tensor(&mut t, 0)
            .map_err(|e| format!("empty broadcast: {e}"))?;
    }
    then_all_reduce_works(w)
}

/// All-gatherv where the last rank's counts and displacements have one entry too many
/// (`LengthMismatch`, its own refusal) while rank 0 (at 3 ranks and more) passes its counts
/// rotated (a mismatch): the refusal wins on every rank.
fn all_gatherv_counts_of_different_lengths(w: &SimpleCommunicator) -> Outcome {
    let size = w.size() as usize;
    let refuser = last(w);
    let mut counts: Vec<i64> = (1..=size as i64).collect();
    if w.rank() == refuser {
        counts.push(1);
    } else if size > 2 && w.rank() == 0 {
        counts.rotate_left(1);
    }
    let displs: Vec<i64> = counts
        .iter()
        .scan(0, |at, &c| {
            let d = *at;
            *at += c;
            Some(d)
        })
        .collect();
    let total: i64 = counts.iter().sum();
    let mine = counts[w.rank() as usize] as usize;
    let send = Owned::new(vec![w.rank() as f32; mine]);
    let mut recv = Owned::new(vec![-1.0f32; total as usize]);
    let got = {
        let st = acquire(&send, &opts()).map_err(s)?;
        let mut rt = acquire(&recv, &opts()).map_err(s)?;
        w.all_gatherv_tensor(&st, &mut rt, Blocks::new(&counts, &displs))
    };
    expect_refused(w, refuser, got, |e| {
        *e == Error::LengthMismatch {
            what: "counts",
            expected: size,
            actual: size + 1,
        }
    })?;
    ensure!(
        recv.as_slice().iter().all(|&v| v == -1.0),
        "a receive was written"
    );
    then_all_reduce_works(w)
}

/// On `DeviceComm` (simulated CUDA memory, staged): the last rank's staging copy fails
/// (an injected `CUDA_ERROR_ILLEGAL_ADDRESS`) while rank 0 passes `Max` against `Sum`:
/// the staging refusal wins on every rank; then, the fault cleared, the device all-reduce
/// delivers the sum.
fn device_staging_refusal_and_mismatch(w: &SimpleCommunicator) -> Outcome {
    let rt = SimulatedRuntime::new();
    let dc = DeviceComm::new(w, Some(&rt as &dyn DeviceRuntime), Transport::Staged).map_err(s)?;
    let cuda = Device::new(device_type::CUDA, 0);
    let send = Owned::new(vec![w.rank() as f32 + 1.0; 64]).labelled(cuda);
    let mut recv = Owned::new(vec![-1.0f32; 64]).labelled(cuda);
    let refuser = last(w);
    let op = if w.size() > 1 && w.rank() == 0 {
        ReduceOp::Max
    } else {
        ReduceOp::Sum
    };
    if w.rank() == refuser {
        rt.fail_copies_to_host_after(Some(0));
    }
    let got = device_all_reduce(&dc, &rt, (&send, &recv), op)?;
    rt.fail_copies_to_host_after(None);
    expect_refused(w, refuser, got, |e| {
        matches!(e, Error::Cuda { code: 700, .. })
    })?;
    ensure!(
        recv.as_slice().iter().all(|&v| v == -1.0),
        "a receive was written"
    );
    device_all_reduce(&dc, &rt, (&send, &recv), ReduceOp::Sum)?
        .map_err(|e| format!("the device all-reduce after it: {e}"))?;
    let p = w.size() as f32;
    let want = p * (p + 1.0) / 2.0;
    ensure!(
        recv.as_slice().iter().all(|&v| v == want),
        "device sum: {:?}",
        &recv.as_slice()[..4]
    );
    then_all_reduce_works(w)
}

fn device_all_reduce(
    dc: &DeviceComm<'_, SimpleCommunicator>,
    rt: &SimulatedRuntime,
    (send, recv): (&Owned<f32>, &Owned<f32>),
    op: ReduceOp,
) -> Result<dlpack_mpi::Result<()>, String> {
    let r: &dyn DeviceRuntime = rt;
    let st = acquire_with_runtime(send, &opts(), Some(r)).map_err(s)?;
    let mut rv = acquire_with_runtime(recv, &opts(), Some(r)).map_err(s)?;
    Ok(dc.all_reduce_tensor(&st, &mut rv, op))
}

// ---------------------------------------------------------------------------------------
// The operand core
// ---------------------------------------------------------------------------------------

const POLICIES: [Packing; 3] = [Packing::Copy, Packing::DerivedDatatype, Packing::Auto];

/// A stride-0 view of one value: `n` logical elements, every one the storage's one value.
fn broadcast_view(v: f32, n: i64) -> Result<Owned<f32>, String> {
    Owned::new(vec![v])
        .with_layout(&[n], Some(&[0]), 0)
        .map_err(s)
}

/// Stride-0 (broadcast) views as the send side of a point-to-point exchange, a broadcast,
/// an all-gather, an all-reduce and a reduce-scatter-block, under every packing policy:
/// each logical element is the one stored value.
fn stride0_sends_every_operation(w: &SimpleCommunicator) -> Outcome {
    let before = packing().map_err(s)?;
    let out = POLICIES.iter().try_for_each(|&p| {
        set_packing(p);
        stride0_sends(w).map_err(|e| format!("{p:?}: {e}"))
    });
    set_packing(before);
    out
}

fn stride0_sends(w: &SimpleCommunicator) -> Outcome {
    let (me, size) = (w.rank(), w.size());
    let (next, prev) = ((me + 1) % size, (me + size - 1) % size);
    let mine = broadcast_view(me as f32 + 1.0, 5)?;
    // point to point, receive posted first (safe at 1 rank)
    let mut got = Owned::new(vec![0.0f32; 5]);
    {
        let st = acquire(&mine, &opts()).map_err(s)?;
        let mut rt = acquire(&got, &opts()).map_err(s)?;
        mpi::request::scope(|scope| -> Outcome {
            let rr = w
                .immediate_recv_tensor(scope, &mut rt, prev, 71)
                .map_err(s)?;
            w.send_tensor(&st, next, 71).map_err(s)?;
            rr.wait().map_err(s)?;
            Ok(())
        })?;
    }
    ensure_eq!(got.as_slice(), &[prev as f32 + 1.0; 5][..]);
    // broadcast from root 0: the root passes its stride-0 view
    let mut into = Owned::new(vec![0.0f32; 5]);
    {
        let root_view = broadcast_view(42.0, 5)?;
        let shared = acquire(&root_view, &opts()).map_err(s)?;
        let mut r = acquire(&into, &opts()).map_err(s)?;
        let buffer = if me == 0 {
            dlpack_mpi::comm::BroadcastBuffer::Send(&shared)
        } else {
            dlpack_mpi::comm::BroadcastBuffer::Recv(&mut r)
        };
        w.broadcast_tensor_from(buffer, 0).map_err(s)?;
    }
    if me != 0 {
        ensure_eq!(into.as_slice(), &[42.0f32; 5][..]);
    }
    // all-gather of 3 copies of each rank's value
    let three = broadcast_view(me as f32, 3)?;
    let mut all = Owned::new(vec![-1.0f32; 3 * size as usize]);
    {
        let st = acquire(&three, &opts()).map_err(s)?;
        let mut rt = acquire(&all, &opts()).map_err(s)?;
        w.all_gather_tensor(&st, &mut rt).map_err(s)?;
    }
    let want: Vec<f32> = (0..size).flat_map(|r| [r as f32; 3]).collect();
    ensure_eq!(all.as_slice(), &want[..]);
    // all-reduce of 4 copies of rank + 1
    let four = broadcast_view(me as f32 + 1.0, 4)?;
    let mut sum = Owned::new(vec![0.0f32; 4]);
    {
        let st = acquire(&four, &opts()).map_err(s)?;
        let mut rt = acquire(&sum, &opts()).map_err(s)?;
        w.all_reduce_tensor(&st, &mut rt, ReduceOp::Sum)
            .map_err(s)?;
    }
    let p = size as f32;
    ensure_eq!(sum.as_slice(), &[p * (p + 1.0) / 2.0; 4][..]);
    // reduce-scatter-block: 2 per rank, every send element is rank + 1
    let many = broadcast_view(me as f32 + 1.0, 2 * i64::from(size))?;
    let mut block = Owned::new(vec![0.0f32; 2]);
    {
        let st = acquire(&many, &opts()).map_err(s)?;
        let mut rt = acquire(&block, &opts()).map_err(s)?;
        w.reduce_scatter_block_tensor(&st, &mut rt, ReduceOp::Sum)
            .map_err(s)?;
    }
    ensure_eq!(block.as_slice(), &[p * (p + 1.0) / 2.0; 2][..]);
    Ok(())
}

/// A stride-0 view as a receive (all-reduce receive, in-place all-reduce, broadcast
/// receive, window receive): `Overlap` naming the axis on every rank, before MPI.
fn stride0_receives_are_overlap(w: &SimpleCommunicator) -> Outcome {
    let overlap = Error::Overlap {
        axis: 0,
        extent: 5,
        stride_elems: 0,
    };
    let send = Owned::new(vec![1.0f32; 5]);
    let view = broadcast_view(-1.0, 5)?;
    {
        let st = acquire(&send, &opts()).map_err(s)?;
        let mut v = acquire(&view, &opts()).map_err(s)?;
        let e = w.all_reduce_tensor(&st, &mut v, ReduceOp::Sum);
        ensure_eq!(e, Err(overlap.clone()));
        let e = w.all_reduce_tensor_in_place(&mut v, ReduceOp::Sum);
        ensure_eq!(e, Err(overlap.clone()));
    }
    // Broadcast: the non-roots' receive views overlap; the root's (only read) does not.
    let got = {
        let mut v = acquire(&view, &opts()).map_err(s)?;
        w.broadcast_tensor(&mut v, 0)
    };
    // Every non-root refuses with its own Overlap; the root is told of rank 1's.
    match (w.rank(), got) {
        (0, got) if w.size() == 1 => {
            got.map_err(|e| format!("a lone root reads its view: {e}"))?;
        }
        (0, Err(Error::PeerRefused { rank: 1, reason })) => {
            ensure_eq!(reason, overlap.to_string());
        }
        (r, got) if r != 0 => ensure_eq!(got, Err(overlap.clone())),
        (_, other) => {
            return Err(format!(
                "root: expected PeerRefused from rank 1, got {other:?}"
            ))
        }
    }
    // A window receive into the view, blocking and nonblocking: refused before matching.
    {
        let mut v = acquire(&view, &opts()).map_err(s)?;
        let e = w.recv_tensor_range(&mut v, 1..3, 0, 72).map(|_| ());
        ensure_eq!(e, Err(overlap.clone()));
        let e = mpi::request::scope(|scope| {
            w.immediate_recv_tensor_range(scope, &mut v, 1..3, 0, 72)
                .map(|_| ())
        });
        ensure_eq!(e, Err(overlap.clone()));
    }
    ensure_eq!(view.into_vec(), vec![-1.0f32]);
    then_all_reduce_works(w)
}

/// Claimed element counts near 2^62 (stride-0 views over one stored element): typed
/// errors on every rank, never a panic or an allocation abort, and the communicator works
/// after them.
fn huge_claimed_shapes_are_typed_errors(w: &SimpleCommunicator) -> Outcome {
    let before = packing().map_err(s)?;
    set_packing(Packing::Copy);
    let out = huge(w);
    set_packing(before);
    out?;
    then_all_reduce_works(w)
}

fn huge(w: &SimpleCommunicator) -> Outcome {
    const N: i64 = 1 << 62;
    let bytes = Owned::new(vec![7u8])
        .with_layout(&[N], Some(&[0]), 0)
        .map_err(s)?;
    let floats = broadcast_view(1.0, N)?;
    let alloc = Error::Allocation {
        bytes: 1 << 62,
        purpose: "the packed copy of a strided tensor",
    };
    let b = acquire(&bytes, &opts()).map_err(s)?;
    let f = acquire(&floats, &opts()).map_err(s)?;
    // A point-to-point send packs (policy Copy): the packed copy of 2^62 bytes is refused
    // by the allocator, the one of 2^64 bytes does not fit usize. Nothing is sent.
    ensure_eq!(w.send_tensor(&b, 0, 73), Err(alloc.clone()));
    match w.send_tensor(&f, 0, 73) {
        Err(Error::Overflow { quantity, .. }) => {
            ensure_eq!(quantity, "packed bytes of the strided elements")
        }
        other => {
            return Err(format!(
                "f32 view of 2^62: expected Overflow, got {other:?}"
            ))
        }
    }
    // A window of four elements of the view still packs the whole view (window.rs).
    ensure_eq!(w.send_tensor_range(&b, 0..4, 0, 73), Err(alloc.clone()));
    // Nonblocking: counted in int, refused before posting.
    let e = mpi::request::scope(|scope| w.immediate_send_tensor(scope, &b, 0, 73).map(|_| ()));
    ensure_eq!(e, Err(alloc.clone()));
    // Collectives: every rank refuses alike, each with its own error.
    let mut small = Owned::new(vec![0u8; 4]);
    {
        let mut r = acquire(&small, &opts()).map_err(s)?;
        let e = w.all_gather_tensor(&b, &mut r);
        ensure_eq!(
            e,
            Err(Error::CountMismatch {
                what: format!("all-gather receive (= send count × {} ranks)", w.size()),
                expected: N.saturating_mul(i64::from(w.size())),
                actual: 4,
            })
        );
        let e = w.all_reduce_tensor(&b, &mut r, ReduceOp::Sum);
        ensure_eq!(
            e,
            Err(Error::CountMismatch {
                what: "all-reduce receive".into(),
                expected: N,
                actual: 4,
            })
        );
    }
    // A broadcast whose root (rank 0) sends the view to ranks that pass 4 elements: the
    // root's packed copy is refused, and that refusal wins over the count mismatch.
    {
        let mut r = acquire(&small, &opts()).map_err(s)?;
        let buffer = if w.rank() == 0 {
            dlpack_mpi::comm::BroadcastBuffer::Send(&b)
        } else {
            dlpack_mpi::comm::BroadcastBuffer::Recv(&mut r)
        };
        let got = w.broadcast_tensor_from(buffer, 0);
        expect_refused(w, 0, got, |e| *e == alloc)?;
    }
    ensure_eq!(small.as_slice(), &[0u8; 4][..]);
    Ok(())
}

/// Windows on strided tensors (step 2) and contiguous ones: out of range, reversed,
/// negative and extreme ranges are `OutOfBounds` with the exact numbers in all four forms
/// (blocking and nonblocking, send and receive), before any message is matched or posted;
/// an empty window goes through and leaves the receive as it was; then a real window
/// arrives exactly (nothing stray was posted).
fn hostile_windows(w: &SimpleCommunicator) -> Outcome {
    let (me, size) = (w.rank(), w.size());
    let (next, prev) = ((me + 1) % size, (me + size - 1) % size);
    let src_strided = Owned::new((0..8).map(|i| me * 10 + i).collect::<Vec<i32>>())
        .with_layout(&[4], Some(&[2]), 0)
        .map_err(s)?;
    let src_run = Owned::new((0..4).map(|i| me * 10 + 2 * i).collect::<Vec<i32>>());
    let dst_strided = Owned::new(vec![-1i32; 8])
        .with_layout(&[4], Some(&[-2]), 24)
        .map_err(s)?;
    let dst_run = Owned::new(vec![-1i32; 4]);
    #[allow(clippy::reversed_empty_ranges)]
    let bad: [std::ops::Range<i64>; 6] = [3..1, 0..5, -1..2, 4..5, 3..i64::MAX, i64::MIN..0];
    for r in &bad {
        let want = Error::OutOfBounds {
            what: "range".into(),
            displacement: r.start,
            count: r.end.saturating_sub(r.start),
            len: 4,
        };
        for (name, src, dst) in [
            ("strided", &src_strided, &dst_strided),
            ("contiguous", &src_run, &dst_run),
        ] {
            let st = acquire(src, &opts()).map_err(s)?;
            let mut dt = acquire(dst, &opts()).map_err(s)?;
            let ctx = |what: &str| format!("{name} {what} {r:?}");
            let e = w.send_tensor_range(&st, r.clone(), next, 74);
            ensure!(e == Err(want.clone()), "{}: {e:?}", ctx("send"));
            let e = w
                .recv_tensor_range(&mut dt, r.clone(), prev, 74)
                .map(|_| ());
            ensure!(e == Err(want.clone()), "{}: {e:?}", ctx("recv"));
            let e = mpi::request::scope(|scope| {
                w.immediate_send_tensor_range(scope, &st, r.clone(), next, 74)
                    .map(|_| ())
            });
            ensure!(e == Err(want.clone()), "{}: {e:?}", ctx("isend"));
            let e = mpi::request::scope(|scope| {
                w.immediate_recv_tensor_range(scope, &mut dt, r.clone(), prev, 74)
                    .map(|_| ())
            });
            ensure!(e == Err(want.clone()), "{}: {e:?}", ctx("irecv"));
        }
    }
    // Empty windows (at the start, inside, at the end) on both layouts, then a real one.
    for (name, src, dst) in [
        ("strided", &src_strided, &dst_strided),
        ("contiguous", &src_run, &dst_run),
    ] {
        let st = acquire(src, &opts()).map_err(s)?;
        let mut dt = acquire(dst, &opts()).map_err(s)?;
        for at in [0i64, 2, 4] {
            mpi::request::scope(|scope| -> Outcome {
                let rr = w
                    .immediate_recv_tensor_range(scope, &mut dt, at..at, prev, 75)
                    .map_err(|e| format!("{name} empty irecv {at}: {e}"))?;
                w.send_tensor_range(&st, at..at, next, 75)
                    .map_err(|e| format!("{name} empty send {at}: {e}"))?;
                rr.wait()
                    .map_err(|e| format!("{name} empty wait {at}: {e}"))?;
                Ok(())
            })?;
            mpi::request::scope(|scope| -> Outcome {
                let sr = w
                    .immediate_send_tensor_range(scope, &st, at..at, next, 76)
                    .map_err(|e| format!("{name} empty isend {at}: {e}"))?;
                w.recv_tensor_range(&mut dt, at..at, prev, 76)
                    .map_err(|e| format!("{name} empty recv {at}: {e}"))?;
                sr.wait().map_err(s)?;
                Ok(())
            })?;
        }
        // A real window [1, 3) into [2, 4).
        mpi::request::scope(|scope| -> Outcome {
            let rr = w
                .immediate_recv_tensor_range(scope, &mut dt, 2..4, prev, 77)
                .map_err(s)?;
            w.send_tensor_range(&st, 1..3, next, 77).map_err(s)?;
            rr.wait().map_err(s)?;
            Ok(())
        })?;
    }
    // Logical elements of rank r's sources: r*10 + [0, 2, 4, 6]; the window [1, 3) is
    // [r*10 + 2, r*10 + 4] into logical [2, 4) of the receive.
    let p = prev * 10;
    // dst_strided: logical k at storage 6 - 2k (stride -2 from element 6): logical 2 at
    // storage 2, logical 3 at storage 0.
    ensure_eq!(
        dst_strided.into_vec(),
        vec![p + 4, -1, p + 2, -1, -1, -1, -1, -1]
    );
    ensure_eq!(dst_run.into_vec(), vec![-1, -1, p + 2, p + 4]);
    Ok(())
}

/// Window receives into `READ_ONLY` tensors (strided and contiguous, blocking and
/// nonblocking): `ReadOnly` before any message is matched; the tensor is untouched; then a
/// message on the same tag goes to a writable tensor exactly.
fn read_only_window_receives(w: &SimpleCommunicator) -> Outcome {
    let (me, size) = (w.rank(), w.size());
    let (next, prev) = ((me + 1) % size, (me + size - 1) % size);
    let strided = Owned::new(vec![-1i32; 8])
        .with_layout(&[4], Some(&[2]), 0)
        .map_err(s)?
        .read_only();
    let run = Owned::new(vec![-1i32; 4]).read_only();
    for t in [&strided, &run] {
        let mut v = acquire(t, &opts()).map_err(s)?;
        let e = w.recv_tensor_range(&mut v, 0..2, prev, 78).map(|_| ());
        ensure_eq!(e, Err(Error::ReadOnly));
        let e = mpi::request::scope(|scope| {
            w.immediate_recv_tensor_range(scope, &mut v, 0..2, prev, 78)
                .map(|_| ())
        });
        ensure_eq!(e, Err(Error::ReadOnly));
        let e = w.recv_tensor(&mut v, prev, 78).map(|_| ());
        ensure_eq!(e, Err(Error::ReadOnly));
    }
    let src = Owned::new(vec![me, me + 100]);
    let mut ok = Owned::new(vec![-1i32; 2]);
    {
        let st = acquire(&src, &opts()).map_err(s)?;
        let mut rt = acquire(&ok, &opts()).map_err(s)?;
        mpi::request::scope(|scope| -> Outcome {
            let rr = w
                .immediate_recv_tensor(scope, &mut rt, prev, 78)
                .map_err(s)?;
            w.send_tensor(&st, next, 78).map_err(s)?;
            rr.wait().map_err(s)?;
            Ok(())
        })?;
    }
    ensure_eq!(ok.as_slice(), &[prev, prev + 100][..]);
    ensure_eq!(strided.into_vec(), vec![-1i32; 8]);
    ensure_eq!(run.into_vec(), vec![-1i32; 4]);
    Ok(())
}

/// A nonblocking window receive of a strided tensor dropped without `wait`: `Drop` waits
/// and unpacks (the window's elements arrive, the others keep their values).
fn dropped_window_request_unpacks(w: &SimpleCommunicator) -> Outcome {
    let (me, size) = (w.rank(), w.size());
    let (next, prev) = ((me + 1) % size, (me + size - 1) % size);
    let src = Owned::new(vec![me * 10, me * 10 + 1, me * 10 + 2]);
    let dst = Owned::new(vec![-1i32; 10])
        .with_layout(&[5], Some(&[2]), 0)
        .map_err(s)?;
    {
        let st = acquire(&src, &opts()).map_err(s)?;
        let mut dt = acquire(&dst, &opts()).map_err(s)?;
        mpi::request::scope(|scope| -> Outcome {
            let rr = w
                .immediate_recv_tensor_range(scope, &mut dt, 1..4, prev, 79)
                .map_err(s)?;
            ensure!(
                rr.is_packed(),
                "a strided window goes through a packed copy"
            );
            w.send_tensor(&st, next, 79).map_err(s)?;
            drop(rr);
            Ok(())
        })?;
    }
    let p = prev * 10;
    ensure_eq!(
        dst.into_vec(),
        vec![-1, -1, p, -1, p + 1, -1, p + 2, -1, -1, -1]
    );
    Ok(())
}

type Case = fn(&SimpleCommunicator) -> Outcome;

/// A scatterv whose root sends fewer elements than a strided receive holds (the root's
/// counts are not fingerprinted: erroneous under MPI-4.1 §6.6, not caught): the receive's
/// other elements keep their values. Its packed copy starts as the tensor's values (an
/// update), never a pooled buffer still holding an earlier message's bytes (here 777s from
/// a broadcast into a strided view just before).
fn short_scatterv_keeps_the_rest(w: &SimpleCommunicator) -> Outcome {
    if w.size() < 2 {
        return Ok(());
    }
    let before = packing().map_err(s)?;
    set_packing(Packing::Copy);
    let out = short_scatterv(w);
    set_packing(before);
    out?;
    then_all_reduce_works(w)
}

fn short_scatterv(w: &SimpleCommunicator) -> Outcome {
    let (rank, size) = (w.rank(), w.size());
    let strided = |v: i32| {
        Owned::new(vec![v; 6])
            .with_layout(&[3], Some(&[2]), 0)
            .map_err(s)
    };
    // An earlier message through a pooled packed copy: 777s into a strided view.
    let stale = strided(-1)?;
    let src = Owned::new(vec![777i32; 3]);
    {
        if rank == 0 {
            let t = acquire(&src, &opts()).map_err(s)?;
            w.broadcast_tensor_from(dlpack_mpi::comm::BroadcastBuffer::Send(&t), 0)
        } else {
            let mut t = acquire(&stale, &opts()).map_err(s)?;
            w.broadcast_tensor(&mut t, 0)
        }
        .map_err(s)?;
    }
    // The root scatters its own 3 elements and 1 to every other rank, whose receive holds 3.
    let counts: Vec<i64> = (0..size).map(|r| if r == 0 { 3 } else { 1 }).collect();
    let displs: Vec<i64> = (0..size)
        .map(|r| if r == 0 { 0 } else { 2 + i64::from(r) })
        .collect();
    let all = Owned::new((0..3 + size - 1).map(|i| 100 + i).collect::<Vec<i32>>());
    let mut mine = strided(-2)?;
    {
        let a = acquire(&all, &opts()).map_err(s)?;
        let mut r = acquire(&mine, &opts()).map_err(s)?;
        let send = (rank == 0).then_some((
            &a as &dyn dlpack_mpi::dlpack::Tensor,
            Blocks::new(&counts, &displs),
        ));
        w.scatterv_tensor(send, &mut r, 0).map_err(s)?;
    }
    let want: Vec<i32> = if rank == 0 {
        vec![100, -2, 101, -2, 102, -2]
    } else {
        vec![100 + 2 + rank, -2, -2, -2, -2, -2]
    };
    ensure_eq!(mine.as_slice(), &want[..]);
    Ok(())
}

const CASES: &[(&str, Case)] = &[
    ("refusal_beats_mismatch", refusal_beats_mismatch),
    (
        "refusal_at_rank0_beats_mismatch_elsewhere",
        refusal_at_rank0_beats_mismatch_elsewhere,
    ),
    ("mismatch_rank0_odd_one_out", mismatch_rank0_odd_one_out),
    ("two_ranks_differ_differently", two_ranks_differ_differently),
    ("in_place_against_all_reduce", in_place_against_all_reduce),
    ("reduce_root_differs", reduce_root_differs),
    ("zero_against_thousand", zero_against_thousand),
    (
        "all_gatherv_counts_of_different_lengths",
        all_gatherv_counts_of_different_lengths,
    ),
    (
        "device_staging_refusal_and_mismatch",
        device_staging_refusal_and_mismatch,
    ),
    (
        "stride0_sends_every_operation",
        stride0_sends_every_operation,
    ),
    ("stride0_receives_are_overlap", stride0_receives_are_overlap),
    (
        "huge_claimed_shapes_are_typed_errors",
        huge_claimed_shapes_are_typed_errors,
    ),
    ("hostile_windows", hostile_windows),
    ("read_only_window_receives", read_only_window_receives),
    (
        "dropped_window_request_unpacks",
        dropped_window_request_unpacks,
    ),
    (
        "short_scatterv_keeps_the_rest",
        short_scatterv_keeps_the_rest,
    ),
];

pub fn run(w: &SimpleCommunicator, filter: &[String]) -> harness::End {
    if w.rank() == 0 {
        println!("running adversarial cases at {} rank(s)", w.size());
    }
    let (passed, failed) = harness::run_cases(w, CASES.iter().copied(), filter, |case| case(w));
    harness::report(w, passed, failed);
    harness::End::Ran { passed, failed }
}
