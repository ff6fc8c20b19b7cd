//! Faults a peer can cause (issue 14, items 4 and 5b), at 2 ranks:
//!
//! - pipelined device messages ([`dlpack_mpi::transport::pipeline`]) on a
//!   [`SimulatedRuntime`] with an injected device → host copy failure: the sender sends the
//!   abort and returns the copy's error, the receiver returns `SenderAborted` naming the
//!   sender, and the next message on the same tag arrives intact; sender and receiver with
//!   different part sizes; an ordinary message exactly one part long (the old one-part
//!   ambiguity); forged part headers (typed errors naming the field and the sender); a
//!   parted message into Fortran-order receive tensors (device and host); refused parted
//!   messages (another count, another element size) drained, the sender completing;
//! - the checked protocol ([`dlpack_mpi::checked`]) against truncated and lying headers: a
//!   typed error, and no allocation beyond a small bound while receiving (a header claiming
//!   2^60 elements allocates nothing for them). The bound is measured by the global
//!   allocator defined here (the binary's), which records the largest single allocation
//!   while armed.
//!
//! The suite `faults` of tests/mpi (main.rs): rank 0 sends, rank 1 receives. At 1 rank the
//! cases are skipped (a blocking send to oneself may wait forever); scripts/test.sh runs
//! them at 2 ranks under a timeout that fails the stage if any case hangs.

use dlpack_mpi::comm::TensorComm;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::harness;
use dlpack_mpi::checked::{self, MAGIC};
use dlpack_mpi::device::{device_type, Device};
use dlpack_mpi::dlpack::{
    acquire, acquire_with_runtime, AcquireOptions, Exporter, ManagedTensor, Owned,
};
use dlpack_mpi::dtype::code;
use dlpack_mpi::runtime::{DeviceRuntime, SimulatedRuntime};
use dlpack_mpi::transport::pipeline::{PART_HEADER_MAGIC, PIPELINE_VERSION};
use dlpack_mpi::transport::{DeviceComm, Transport};
use dlpack_mpi::Error;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

type Outcome = Result<(), String>;

/// The system allocator, recording the largest single request and the number of requests
/// while [`ARMED`].
struct Recording;

static ARMED: AtomicBool = AtomicBool::new(false);
static LARGEST: AtomicUsize = AtomicUsize::new(0);
/// Allocations (and reallocations) made while armed.
static COUNT: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; the recording only
// touches atomics.
unsafe impl GlobalAlloc for Recording {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if ARMED.load(Ordering::Relaxed) {
            LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
            COUNT.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if ARMED.load(Ordering::Relaxed) {
            LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
            COUNT.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if ARMED.load(Ordering::Relaxed) {
            LARGEST.fetch_max(new_size, Ordering::Relaxed);
            COUNT.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Recording = Recording;

/// Runs `f` with the allocator armed; returns its result and the number of allocations
/// (and reallocations) made meanwhile, by any thread of the process (the plans suite: a
/// step allocates nothing).
pub(crate) fn allocations<R>(f: impl FnOnce() -> R) -> (R, usize) {
    COUNT.store(0, Ordering::Relaxed);
    ARMED.store(true, Ordering::Relaxed);
    let r = f();
    ARMED.store(false, Ordering::Relaxed);
    (r, COUNT.load(Ordering::Relaxed))
}

/// Runs `f` with the allocator armed; returns its result and the largest single
/// allocation (bytes) made meanwhile.
fn largest_allocation<R>(f: impl FnOnce() -> R) -> (R, usize) {
    LARGEST.store(0, Ordering::Relaxed);
    ARMED.store(true, Ordering::Relaxed);
    let r = f();
    ARMED.store(false, Ordering::Relaxed);
    (r, LARGEST.load(Ordering::Relaxed))
}

const CUDA0: Device = Device::new(device_type::CUDA, 0);
/// Elements of the pipelined tensors: 10 MiB of f32.
const N: usize = 10 << 18;
/// Sender part size: 1 MiB, so ten parts.
const PART: usize = 1 << 20;

macro_rules! call {
    ($e:expr) => {
        $e.map_err(|e| format!("{} failed: {e}", stringify!($e)))?
    };
}

fn s(e: Error) -> String {
    e.to_string()
}

fn take<'e, E: Exporter>(e: &'e E, rt: &dyn DeviceRuntime) -> Result<ManagedTensor<'e>, String> {
    acquire_with_runtime(e, &AcquireOptions::default(), Some(rt)).map_err(s)
}

fn host<'e, E: Exporter>(e: &'e E) -> Result<ManagedTensor<'e>, String> {
    acquire(e, &AcquireOptions::default()).map_err(s)
}

fn staged<'c>(
    w: &'c SimpleCommunicator,
    rt: &'c SimulatedRuntime,
    part: Option<usize>,
) -> DeviceComm<'c, SimpleCommunicator> {
    DeviceComm::new(w, Some(rt as &dyn DeviceRuntime), Transport::Staged)
        .expect("staged always works")
        .with_pipeline_chunk(part)
}

fn ramp() -> Owned<f32> {
    Owned::new((0..N).map(|i| i as f32).collect::<Vec<_>>()).labelled(CUDA0)
}

fn is_ramp(v: &[f32]) -> bool {
    v.iter().enumerate().all(|(i, x)| *x == i as f32)
}

/// The sender's fourth device → host copy fails: it returns that error after sending the
/// abort; the receiver returns SenderAborted naming rank 0, part 3 of 10, with parts 0..3
/// in its tensor and nothing later; then a whole message on the same tag arrives intact,
/// into device memory and into host memory.
fn abort_part_ends_the_receive(w: &SimpleCommunicator) -> Outcome {
    let rt = SimulatedRuntime::new();
    let dc = staged(w, &rt, Some(PART));
    let tag = 21;
    if w.rank() == 0 {
        let src = ramp();
        let t = take(&src, &rt)?;
        rt.fail_copies_to_host_after(Some(3));
        match dc.send_tensor(&t, 1, tag) {
            Err(Error::Cuda { code: 700, .. }) => {}
            other => {
                return Err(format!(
                    "sender: expected the injected Cuda error, got {other:?}"
                ))
            }
        }
        rt.fail_copies_to_host_after(None);
        call!(dc.send_tensor(&t, 1, tag));
        call!(dc.send_tensor(&t, 1, tag));
    } else if w.rank() == 1 {
        let mut dst = Owned::new(vec![-1.0f32; N]).labelled(CUDA0);
        {
            let mut d = take(&dst, &rt)?;
            match dc.recv_tensor(&mut d, 0, tag) {
                Err(Error::SenderAborted {
                    rank: 0,
                    part: 3,
                    parts: 10,
                    cause,
                }) => ensure!(cause.contains("copy"), "cause {cause:?}"),
                other => return Err(format!("receiver: expected SenderAborted, got {other:?}")),
            }
        }
        let m = PART / 4;
        let v = dst.as_slice();
        ensure!(is_ramp(&v[..3 * m]), "parts 0..3 differ");
        ensure!(
            v[3 * m..].iter().all(|x| *x == -1.0),
            "a part after the abort landed"
        );
        let mut again = Owned::new(vec![0.0f32; N]).labelled(CUDA0);
        {
            let mut d = take(&again, &rt)?;
            let status = call!(dc.recv_tensor(&mut d, 0, tag));
            ensure_eq!(status.source_rank(), 0);
        }
        ensure!(
            is_ramp(again.as_slice()),
            "the message after the abort differs"
        );
        let mut on_host = Owned::new(vec![0.0f32; N]);
        {
            let mut d = host(&on_host)?;
            call!(dc.recv_tensor(&mut d, 0, tag));
        }
        ensure!(
            is_ramp(on_host.as_slice()),
            "host receive after the abort differs"
        );
    }
    Ok(())
}

/// The receiver's fourth host → device copy fails: it still receives every part (so the
/// sender's send completes), copies no more, and returns the copy's error; the next message
/// on the tag arrives intact.
fn receiver_copy_failure_drains_the_parts(w: &SimpleCommunicator) -> Outcome {
    let rt = SimulatedRuntime::new();
    let dc = staged(w, &rt, Some(PART));
    let tag = 27;
    if w.rank() == 0 {
        let src = ramp();
        let t = take(&src, &rt)?;
        call!(dc.send_tensor(&t, 1, tag));
        call!(dc.send_tensor(&t, 1, tag));
    } else if w.rank() == 1 {
        let mut dst = Owned::new(vec![-1.0f32; N]).labelled(CUDA0);
        {
            let mut d = take(&dst, &rt)?;
            rt.fail_copies_to_device_after(Some(3));
            match dc.recv_tensor(&mut d, 0, tag) {
                Err(Error::Cuda { code: 700, .. }) => {}
                other => return Err(format!("expected the injected Cuda error, got {other:?}")),
            }
            rt.fail_copies_to_device_after(None);
        }
        let m = PART / 4;
        ensure!(is_ramp(&dst.as_slice()[..3 * m]), "parts 0..3 differ");
        ensure!(
            dst.as_slice()[3 * m..].iter().all(|x| *x == -1.0),
            "a part after the failed copy landed"
        );
        {
            let mut d = take(&dst, &rt)?;
            call!(dc.recv_tensor(&mut d, 0, tag));
        }
        ensure!(
            is_ramp(dst.as_slice()),
            "the message after the failure differs"
        );
    }
    Ok(())
}

/// A failure on the very first copy: only the header went out, then the abort (part 0).
fn abort_before_any_part(w: &SimpleCommunicator) -> Outcome {
    let rt = SimulatedRuntime::new();
    let dc = staged(w, &rt, Some(PART));
    let tag = 22;
    if w.rank() == 0 {
        let src = ramp();
        let t = take(&src, &rt)?;
        rt.fail_copies_to_host_after(Some(0));
        ensure!(dc.send_tensor(&t, 1, tag).is_err(), "the send did not fail");
    } else if w.rank() == 1 {
        let dst = Owned::new(vec![-1.0f32; N]);
        let mut d = host(&dst)?;
        match dc.recv_tensor(&mut d, 0, tag) {
            Err(Error::SenderAborted {
                rank: 0,
                part: 0,
                parts: 10,
                ..
            }) => {}
            other => return Err(format!("expected SenderAborted at part 0, got {other:?}")),
        }
    }
    Ok(())
}

/// Different part sizes on the two ends: the receiver follows the sender's header, whether
/// its own part size is larger (4 MiB, the default), smaller (64 KiB) or off, and even
/// when its tensor is no larger than its own part size.
fn part_sizes_may_differ(w: &SimpleCommunicator) -> Outcome {
    let rt = SimulatedRuntime::new();
    let tag = 23;
    let receivers = [Some(4 << 20), Some(64 << 10), None, Some(16 << 20)];
    if w.rank() == 0 {
        let src = ramp();
        let t = take(&src, &rt)?;
        for _ in receivers {
            call!(staged(w, &rt, Some(PART)).send_tensor(&t, 1, tag));
        }
    } else if w.rank() == 1 {
        for part in receivers {
            let mut dst = Owned::new(vec![0.0f32; N]).labelled(CUDA0);
            {
                let mut d = take(&dst, &rt)?;
                call!(staged(w, &rt, part).recv_tensor(&mut d, 0, tag));
            }
            ensure!(
                is_ramp(dst.as_slice()),
                "receiver part size {part:?}: values differ"
            );
        }
    }
    Ok(())
}

/// An ordinary message exactly one 1 MiB part long, for a 10 MiB receive tensor: once taken
/// for part 0 of a parted message (and the receiver waited for nine more parts); now an
/// ordinary short message: CountMismatch, the message stays queued for a fitting receive,
/// and the parted message after it arrives intact.
fn one_part_long_message_is_not_a_part(w: &SimpleCommunicator) -> Outcome {
    let rt = SimulatedRuntime::new();
    let tag = 24;
    if w.rank() == 0 {
        let one = Owned::new(vec![7.0f32; PART / 4]).labelled(CUDA0);
        call!(staged(w, &rt, None).send_tensor(&take(&one, &rt)?, 1, tag));
        let src = ramp();
        call!(staged(w, &rt, Some(PART)).send_tensor(&take(&src, &rt)?, 1, tag));
    } else if w.rank() == 1 {
        let dc = staged(w, &rt, Some(PART));
        let mut dst = Owned::new(vec![0.0f32; N]).labelled(CUDA0);
        {
            let mut d = take(&dst, &rt)?;
            let held = match dc.recv_tensor(&mut d, 0, tag) {
                Err(e) => e,
                Ok(status) => return Err(format!("expected CountMismatch, got Ok({status:?})")),
            };
            match held.mismatch() {
                Error::CountMismatch {
                    expected, actual, ..
                } if *expected == N as i64 && *actual == (PART / 4) as i64 => {}
                other => return Err(format!("expected CountMismatch, got {other:?}")),
            }
            // Not dropped (as for any receive that does not fit): the error holds it, and a
            // fitting tensor receives it through the error.
            let message = held
                .unreceived()
                .ok_or_else(|| format!("the message is not held: {held:?}"))?;
            let mut one = Owned::new(vec![0.0f32; PART / 4]);
            call!(message.recv_into(&mut host(&one)?));
            ensure!(
                one.as_slice().iter().all(|x| *x == 7.0),
                "the short message differs"
            );
            call!(dc.recv_tensor(&mut d, 0, tag));
        }
        ensure!(
            is_ramp(dst.as_slice()),
            "the parted message after it differs"
        );
    }
    Ok(())
}

/// Forged part headers from a raw sender: another version, element size, part size 0,
/// a part above MAX_PIPELINE_CHUNK_BYTES, another element count, a 40-byte non-header.
/// Each is a typed error naming the field (and rank 0). The two consistent headers (another
/// element size, another count) are followed by their parts, which the receiver drains
/// (allocating at most one 32 KiB part); the others promise nothing it waits for. A parted
/// message after them arrives intact (the tag's queue is clean).
fn forged_part_headers(w: &SimpleCommunicator) -> Outcome {
    let tag = 25;
    let n = N as u64;
    let forged: [[u64; 5]; 6] = [
        [PART_HEADER_MAGIC, PIPELINE_VERSION + 1, 4, 1 << 18, n],
        [PART_HEADER_MAGIC, PIPELINE_VERSION, 8, 4096, 8192],
        [PART_HEADER_MAGIC, PIPELINE_VERSION, 4, 0, n],
        [PART_HEADER_MAGIC, PIPELINE_VERSION, 4, n + 1, n],
        [PART_HEADER_MAGIC, PIPELINE_VERSION, 4, 4096, 8193],
        [0x1234, PIPELINE_VERSION, 4, 1 << 18, n],
    ];
    let rt = SimulatedRuntime::new();
    if w.rank() == 0 {
        let to = w.process_at_rank(1);
        for h in &forged {
            to.send_with_tag(&h[..], tag);
            if h[0] == PART_HEADER_MAGIC && h[1] == PIPELINE_VERSION && h[3] == 4096 {
                // The parts of a consistent header: ⌈n / m⌉ of m elements of e bytes.
                let mut left = h[4] as usize;
                while left > 0 {
                    let len = left.min(4096);
                    if h[2] == 8 {
                        to.send_with_tag(&vec![1.0f64; len][..], tag);
                    } else {
                        to.send_with_tag(&vec![1.0f32; len][..], tag);
                    }
                    left -= len;
                }
            }
        }
        call!(staged(w, &rt, Some(PART)).send_tensor(&take(&ramp(), &rt)?, 1, tag));
    } else if w.rank() == 1 {
        let dc = staged(w, &rt, Some(PART));
        let dst = Owned::new(vec![0.0f32; N]).labelled(CUDA0);
        let mut d = take(&dst, &rt)?;
        let mut got = Vec::new();
        for _ in &forged {
            let (r, largest) = largest_allocation(|| dc.recv_tensor(&mut d, 0, tag));
            ensure!(
                largest < 64 << 10,
                "a forged header allocated {largest} bytes"
            );
            got.push(match r {
                Err(Error::BadPartHeader {
                    rank: 0,
                    field,
                    value,
                    ..
                }) => format!("{field}={value}"),
                Err(Error::CountMismatch { actual, .. }) => format!("count actual={actual}"),
                other => format!("{other:?}"),
            });
        }
        ensure_eq!(
            got,
            vec![
                "version=2".to_string(),
                "element bytes=8".into(),
                "part elements=0".into(),
                format!("part elements={}", n + 1),
                "count actual=8193".into(),
                "count actual=10".into(),
            ]
        );
        drop(d);
        let mut dst = Owned::new(vec![0.0f32; N]).labelled(CUDA0);
        {
            let mut d = take(&dst, &rt)?;
            call!(dc.recv_tensor(&mut d, 0, tag));
        }
        ensure!(
            is_ramp(dst.as_slice()),
            "the parted message after the forged headers differs"
        );
    }
    Ok(())
}

/// Elements of the strided-receive case: 2^20 f32 (4 MiB), sent in four 1 MiB parts.
const SQUARE: usize = 1 << 20;

/// A contiguous parted device send into Fortran-order receive tensors [1024, 1024], strides
/// [1, 1024] (same dtype and count), on the device and on the host: the parts are received
/// packed and unpacked into the layout; element (r, c) holds r · 1024 + c; then into a
/// reversed 1-d device tensor (stride -1). Once the
/// receiver refused the parted header of a strided tensor, and the sender waited forever.
fn strided_receive_of_parted_message(w: &SimpleCommunicator) -> Outcome {
    let rt = SimulatedRuntime::new();
    let tag = 28;
    if w.rank() == 0 {
        let src = Owned::new((0..SQUARE).map(|i| i as f32).collect::<Vec<_>>()).labelled(CUDA0);
        let t = take(&src, &rt)?;
        for _ in 0..3 {
            call!(staged(w, &rt, Some(PART)).send_tensor(&t, 1, tag));
        }
    } else if w.rank() == 1 {
        let fortran = |o: Owned<f32>| o.with_layout(&[1024, 1024], Some(&[1, 1024]), 0).map_err(s);
        let on_device = fortran(Owned::new(vec![-1.0f32; SQUARE]).labelled(CUDA0))?;
        let on_host = fortran(Owned::new(vec![-1.0f32; SQUARE]))?;
        for (mut dst, place) in [(on_device, "device"), (on_host, "host")] {
            {
                let mut d = take(&dst, &rt)?;
                let status = call!(staged(w, &rt, Some(PART)).recv_tensor(&mut d, 0, tag));
                ensure_eq!(status.source_rank(), 0);
            }
            let v = dst.as_slice();
            let wrong = (0..SQUARE).find(|&k| {
                let (r, c) = (k % 1024, k / 1024);
                v[k] != (r * 1024 + c) as f32
            });
            ensure!(
                wrong.is_none(),
                "{place}: storage element {wrong:?} differs"
            );
        }
        // A reversed device axis (too many 2-D copies to pack: staged by its span, the
        // parts unpacked by the host kernels into the pinned span): storage k holds n-1-k.
        let last = ((SQUARE - 1) * 4) as u64;
        let mut reversed = Owned::new(vec![-1.0f32; SQUARE])
            .labelled(CUDA0)
            .with_layout(&[SQUARE as i64], Some(&[-1]), last)
            .map_err(s)?;
        call!(staged(w, &rt, Some(PART)).recv_tensor(&mut take(&reversed, &rt)?, 0, tag));
        let v = reversed.as_slice();
        let wrong = (0..SQUARE).find(|&k| v[k] != (SQUARE - 1 - k) as f32);
        ensure!(
            wrong.is_none(),
            "reversed: storage element {wrong:?} differs"
        );
    }
    Ok(())
}

/// A parted send into a tensor of another element count (half), then into one of another
/// element size (f64, same bytes): the receiver returns CountMismatch and BadPartHeader,
/// having drained the parts, so the sender's sends return Ok; a third parted message on
/// the same tag arrives intact. Once the parts were left queued and the sender hung.
fn refused_parted_message_is_drained(w: &SimpleCommunicator) -> Outcome {
    let rt = SimulatedRuntime::new();
    let tag = 29;
    if w.rank() == 0 {
        let src = ramp();
        let t = take(&src, &rt)?;
        for _ in 0..3 {
            call!(staged(w, &rt, Some(PART)).send_tensor(&t, 1, tag));
        }
    } else if w.rank() == 1 {
        let dc = staged(w, &rt, Some(PART));
        let half = Owned::new(vec![0.0f32; N / 2]).labelled(CUDA0);
        match dc.recv_tensor(&mut take(&half, &rt)?, 0, tag) {
            Err(Error::CountMismatch {
                expected, actual, ..
            }) if expected == (N / 2) as i64 && actual == N as i64 => {}
            other => return Err(format!("expected CountMismatch, got {other:?}")),
        }
        let wide = Owned::new(vec![0.0f64; N / 2]).labelled(CUDA0);
        match dc.recv_tensor(&mut take(&wide, &rt)?, 0, tag) {
            Err(Error::BadPartHeader {
                rank: 0,
                field: "element bytes",
                value: 4,
                ..
            }) => {}
            other => return Err(format!("expected BadPartHeader, got {other:?}")),
        }
        let mut dst = Owned::new(vec![0.0f32; N]).labelled(CUDA0);
        {
            let mut d = take(&dst, &rt)?;
            call!(dc.recv_tensor(&mut d, 0, tag));
        }
        ensure!(
            is_ramp(dst.as_slice()),
            "the message after the refusals differs"
        );
    }
    Ok(())
}

/// Truncated and lying checked-protocol headers: each a typed error, and while receiving,
/// no single allocation above 64 KiB (the largest legal header is 8 KiB; the tensors a
/// header claims here are 2^60 elements and more). A claim above isize::MAX bytes (2^60
/// f64) is refused before any MPI call (MPICH asserted in MPI_Get_count on it). The sizes
/// are compared in bytes: no lying header adds a derived datatype to the cache.
fn lying_checked_headers(w: &SimpleCommunicator) -> Outcome {
    let tag = 26;
    let u8_word = u64::from(code::UINT) | 8 << 8 | 1 << 16;
    let f64_word = u64::from(code::FLOAT) | 64 << 8 | 1 << 16;
    // (header words, payload bytes sent after it; None: no payload).
    let cases: Vec<(Vec<u64>, Option<Vec<u8>>)> = vec![
        (vec![MAGIC, 1, u8_word, 1, 1 << 60], Some(vec![1, 2, 3])),
        (
            vec![MAGIC, 1, f64_word, 2, 1 << 30, 1 << 30],
            Some(vec![0; 16]),
        ),
        (vec![MAGIC, 1, u8_word, 2, 1 << 62, 4], Some(vec![9])),
        (vec![MAGIC, 1, u8_word, 1, u64::MAX], None),
        (vec![MAGIC, 1, u8_word, 1024, 1, 2], None),
        (vec![MAGIC, 1, u8_word], None),
        (vec![MAGIC], None),
    ];
    if w.rank() == 0 {
        for (h, payload) in &cases {
            w.process_at_rank(1).send_with_tag(&h[..], tag);
            if let Some(p) = payload {
                w.process_at_rank(1).send_with_tag(&p[..], tag);
            }
        }
    } else if w.rank() == 1 {
        // The size check compares bytes: no lying size builds (and caches) a datatype.
        let types_before = dlpack_mpi::spec::datatype::cached_count();
        let mut got = Vec::new();
        for (header, payload) in &cases {
            let (r, largest) = largest_allocation(|| checked::recv_new(w, 0, tag));
            ensure!(
                largest <= 64 << 10,
                "a lying header allocated {largest} bytes"
            );
            let (text, held) = match &r {
                Err(e) => (
                    match e.mismatch() {
                        Error::CountMismatch {
                            expected, actual, ..
                        } => format!("count {expected} vs {actual}"),
                        Error::BadHeader { field, value, .. } => format!("{field}={value}"),
                        Error::Overflow { quantity, .. } => format!("overflow {quantity}"),
                        other => format!("{other:?}"),
                    },
                    e.unreceived().map(|m| m.len_bytes()),
                ),
                Ok(received) => (format!("Ok({received:?})"), None),
            };
            // What the error holds (Error::Unfit): the payload, or a too-short header; it
            // is received into exactly its own length when the error is dropped.
            let expect_held = match payload {
                Some(p) => Some(p.len() as u64),
                None if text.starts_with("length=") => Some(8 * header.len() as u64),
                None => None,
            };
            ensure_eq!(held, expect_held);
            got.push(text);
            drop(r);
        }
        ensure_eq!(got.len(), 7);
        ensure_eq!(dlpack_mpi::spec::datatype::cached_count(), types_before);
        let want_prefix = [
            format!("count {} vs 3", 1i64 << 60),
            "overflow checked message payload bytes".to_string(),
            "overflow".to_string(),
            format!("shape={}", u64::MAX),
            "ndim=1024".to_string(),
            "length=24".to_string(),
            "length=8".to_string(),
        ];
        for (g, want) in got.iter().zip(&want_prefix) {
            ensure!(
                g.starts_with(want.as_str()),
                "got {g:?}, expected {want:?}…"
            );
        }
    }
    Ok(())
}

type Case = (&'static str, fn(&SimpleCommunicator) -> Outcome);

const CASES: &[Case] = &[
    ("abort_part_ends_the_receive", abort_part_ends_the_receive),
    ("abort_before_any_part", abort_before_any_part),
    (
        "receiver_copy_failure_drains_the_parts",
        receiver_copy_failure_drains_the_parts,
    ),
    ("part_sizes_may_differ", part_sizes_may_differ),
    (
        "one_part_long_message_is_not_a_part",
        one_part_long_message_is_not_a_part,
    ),
    ("forged_part_headers", forged_part_headers),
    (
        "strided_receive_of_parted_message",
        strided_receive_of_parted_message,
    ),
    (
        "refused_parted_message_is_drained",
        refused_parted_message_is_drained,
    ),
    ("lying_checked_headers", lying_checked_headers),
];

/// The suite `faults` (see the binary's `main`).
pub fn run(w: &SimpleCommunicator, filter: &[String]) -> harness::End {
    if w.size() < 2 {
        println!("fault cases: skipped at 1 rank (scripts/test.sh runs them at 2 ranks)");
        return harness::End::Skipped { status: 0 };
    }
    if w.rank() == 0 {
        println!("running fault cases at {} rank(s)", w.size());
    }
    let (passed, failed) = harness::run_cases(w, CASES.iter().copied(), filter, |case| case(w));
    harness::report(w, passed, failed);
    harness::End::Ran { passed, failed }
}
