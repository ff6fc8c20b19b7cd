//! Multi-rank tests of the checked protocol (`dlpack_mpi::checked`): self-describing
//! messages, a header then the payload.
//!
//! The suite `checked` of tests/mpi (main.rs), like `mpi_cases`: every case runs on every rank,
//! rank 0 sends and rank 1 receives (further ranks only agree on the verdicts), and the
//! verdicts are combined across ranks. The cases need 2 ranks: at 1 rank the sender would
//! be its own receiver, and a blocking standard-mode send to oneself may wait for the
//! receive forever (MPICH's does, even for 48 bytes; MPI-4.1 §3.5 calls such programs
//! unsafe). So `cargo test` (1 rank) prints that they are skipped; scripts/test.sh runs them
//! at 2 ranks, on one host and across two.

use crate::harness;
use dlpack_mpi::checked::{self, Header, MAGIC};
use dlpack_mpi::comm::TensorComm;
use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned, Tensor};
use dlpack_mpi::dtype::{code, DType};
use dlpack_mpi::Error;
use half::{bf16, f16};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use num_complex::{Complex32, Complex64};

type Outcome = Result<(), String>;

fn opts() -> AcquireOptions {
    AcquireOptions::default()
}

fn s(e: Error) -> String {
    e.to_string()
}

/// (sender, receiver): ranks 0 and 1.
fn pair(_w: &SimpleCommunicator) -> (i32, i32) {
    (0, 1)
}

/// Sends `data` with `shape` under the checked protocol.
fn send_checked<T: dlpack_mpi::dtype::AnyBits>(
    w: &SimpleCommunicator,
    dest: i32,
    tag: i32,
    data: Vec<T>,
    shape: &[i64],
) -> Outcome {
    let x = Owned::new(data).with_shape(shape).map_err(s)?;
    let t = acquire(&x, &opts()).map_err(s)?;
    checked::send(w, dest, tag, &t).map_err(s)
}

fn matching_header_delivers(w: &SimpleCommunicator) -> Outcome {
    let (src, dst) = pair(w);
    if w.rank() == src {
        // A transposed (Fortran-order) sender: the payload goes in logical row-major order.
        let x = Owned::new(vec![0f32, 3., 1., 4., 2., 5.])
            .with_layout(&[2, 3], Some(&[1, 2]), 0)
            .map_err(s)?;
        let t = acquire(&x, &opts()).map_err(s)?;
        checked::send(w, dst, 11, &t).map_err(s)?;
    }
    if w.rank() == dst {
        let out = Owned::new(vec![-1f32; 6]).with_shape(&[2, 3]).map_err(s)?;
        let status = {
            let mut r = acquire(&out, &opts()).map_err(s)?;
            checked::recv_into(w, src, 11, &mut r).map_err(s)?
        };
        ensure_eq!(status.source_rank(), src);
        ensure_eq!(out.into_vec(), vec![0f32, 1., 2., 3., 4., 5.]);
    }
    Ok(())
}

/// Three mismatches in a row (dtype, element count, shape), each holding its payload in
/// `Error::Unfit`: the first received through `Unreceived::recv_new` (sent dtype and shape),
/// the second discarded by dropping the error, the third received through
/// `Unreceived::recv_into` a right-shaped tensor; then an ordinary message and a matching
/// checked one on the same tag arrive intact.
fn mismatches_are_errors_and_held(w: &SimpleCommunicator) -> Outcome {
    let (src, dst) = pair(w);
    let tag = 12;
    if w.rank() == src {
        send_checked(w, dst, tag, vec![1f32, 2., 3., 4.], &[4])?;
        send_checked(w, dst, tag, (0..6).collect::<Vec<i32>>(), &[6])?;
        send_checked(w, dst, tag, (0..6).collect::<Vec<i32>>(), &[2, 3])?;
        let plain = Owned::new(vec![7i64, 8, 9]);
        w.send_tensor(&acquire(&plain, &opts()).map_err(s)?, dst, tag)
            .map_err(s)?;
        send_checked(w, dst, tag, vec![10i32, 20, 30, 40], &[4])?;
    }
    if w.rank() == dst {
        // dtype: float32 sent, int32 tensor.
        let mut target = Owned::new(vec![-5i32; 4]);
        let err = {
            let mut r = acquire(&target, &opts()).map_err(s)?;
            checked::recv_into(w, src, tag, &mut r).unwrap_err()
        };
        match err.mismatch() {
            Error::DtypeMismatch { left, right, .. }
                if *left == DType::new(code::FLOAT, 32) && *right == DType::new(code::INT, 32) => {}
            other => {
                return Err(format!(
                    "expected DtypeMismatch float32 vs int32, got {other:?}"
                ))
            }
        }
        ensure_eq!(target.as_slice().to_vec(), vec![-5; 4]);
        let held = err.unreceived().ok_or("no held payload")?;
        ensure_eq!(held.sent_dtype(), Some(DType::new(code::FLOAT, 32)));
        ensure_eq!(held.sent_shape(), Some(&[4i64][..]));
        ensure_eq!(held.len_bytes(), 16);
        let mut got = held.recv_new().map_err(s)?;
        ensure_eq!(got.to_vec::<f32>().map_err(s)?, vec![1., 2., 3., 4.]);
        ensure!(!held.is_held(), "received, yet still held");
        ensure!(
            matches!(held.recv_new(), Err(Error::AlreadyReceived { .. })),
            "a second receive of one held message"
        );
        // Element count: 6 sent, 4 here.
        let err = {
            let mut r = acquire(&target, &opts()).map_err(s)?;
            checked::recv_into(w, src, tag, &mut r).unwrap_err()
        };
        match err.mismatch() {
            Error::CountMismatch {
                expected: 4,
                actual: 6,
                what,
            } if what.contains("[6]") && what.contains("[4]") => {}
            other => return Err(format!("expected CountMismatch 4 vs 6, got {other:?}")),
        }
        ensure_eq!(target.as_slice().to_vec(), vec![-5; 4]);
        // Dropped: the payload is received and discarded.
        drop(err);
        // Shape: [2, 3] sent, [3, 2] here (same dtype and count).
        let t32 = Owned::new(vec![-5i32; 6]).with_shape(&[3, 2]).map_err(s)?;
        let err = {
            let mut r = acquire(&t32, &opts()).map_err(s)?;
            checked::recv_into(w, src, tag, &mut r).unwrap_err()
        };
        ensure_eq!(
            err.mismatch(),
            &Error::ShapesDiffer {
                what: "checked message: sent vs receive tensor",
                sent: vec![2, 3],
                local: vec![3, 2],
            }
        );
        ensure_eq!(t32.into_vec(), vec![-5; 6]);
        let t23 = Owned::new(vec![-5i32; 6]).with_shape(&[2, 3]).map_err(s)?;
        {
            let mut r = acquire(&t23, &opts()).map_err(s)?;
            let held = err.unreceived().ok_or("no held payload")?;
            held.recv_into(&mut r).map_err(s)?;
        }
        ensure_eq!(t23.into_vec(), (0..6).collect::<Vec<i32>>());
        // The ordinary message that follows is intact.
        let plain = Owned::new(vec![0i64; 3]);
        {
            let mut r = acquire(&plain, &opts()).map_err(s)?;
            w.recv_tensor(&mut r, src, tag).map_err(s)?;
        }
        ensure_eq!(plain.into_vec(), vec![7, 8, 9]);
        // And so is the next checked one.
        {
            let mut r = acquire(&target, &opts()).map_err(s)?;
            checked::recv_into(w, src, tag, &mut r).map_err(s)?;
        }
        ensure_eq!(target.as_slice().to_vec(), vec![10, 20, 30, 40]);
    }
    Ok(())
}

/// Local errors come before anything is received: the message waits for a usable tensor.
fn local_errors_receive_nothing(w: &SimpleCommunicator) -> Outcome {
    let (src, dst) = pair(w);
    if w.rank() == src {
        send_checked(w, dst, 13, vec![1u16, 2, 3], &[3])?;
    }
    if w.rank() == dst {
        let ro = Owned::new(vec![0u16; 3]).read_only();
        let err = {
            let mut r = acquire(&ro, &opts()).map_err(s)?;
            checked::recv_into(w, src, 13, &mut r).unwrap_err()
        };
        ensure_eq!(err, Error::ReadOnly);
        let out = Owned::new(vec![0u16; 3]);
        let err = {
            let mut r = acquire(&out, &opts()).map_err(s)?;
            checked::recv_into(w, w.size(), 13, &mut r).unwrap_err()
        };
        ensure_eq!(
            err,
            Error::InvalidRank {
                rank: w.size(),
                size: w.size()
            }
        );
        match checked::recv_new(w, src, -3) {
            Err(Error::InvalidTag { tag: -3, .. }) => {}
            other => return Err(format!("expected InvalidTag -3, got {other:?}")),
        }
        {
            let mut r = acquire(&out, &opts()).map_err(s)?;
            checked::recv_into(w, src, 13, &mut r).map_err(s)?;
        }
        ensure_eq!(out.into_vec(), vec![1, 2, 3]);
    }
    Ok(())
}

/// Messages that are not headers: too short (held in the error, received through it) and a
/// wrong magic (consumed).
fn non_headers_are_bad_header(w: &SimpleCommunicator) -> Outcome {
    let (src, dst) = pair(w);
    let tag = 14;
    if w.rank() == src {
        let short = Owned::new(vec![1.5f64, 2.5, 3.5]);
        w.send_tensor(&acquire(&short, &opts()).map_err(s)?, dst, tag)
            .map_err(s)?;
        let fake = Owned::new(vec![0x1234u64, 1, 2 | 32 << 8 | 1 << 16, 1, 2]);
        w.send_tensor(&acquire(&fake, &opts()).map_err(s)?, dst, tag)
            .map_err(s)?;
        send_checked(w, dst, tag, vec![6u8, 7], &[2])?;
    }
    if w.rank() == dst {
        let err = checked::recv_new(w, src, tag).unwrap_err();
        match err.mismatch() {
            Error::BadHeader {
                field: "length",
                value: 24,
                ..
            } => {}
            other => return Err(format!("expected BadHeader length 24, got {other:?}")),
        }
        // Held by the error: received through it (no header: recv_new refuses).
        let held = err.unreceived().ok_or("no held message")?;
        ensure_eq!((held.sent_dtype(), held.len_bytes()), (None, 24));
        ensure!(
            matches!(held.recv_new(), Err(Error::BadHeader { value: 0, .. })),
            "recv_new of a message without a header"
        );
        let short = Owned::new(vec![0f64; 3]);
        {
            let mut r = acquire(&short, &opts()).map_err(s)?;
            held.recv_into(&mut r).map_err(s)?;
        }
        ensure_eq!(short.into_vec(), vec![1.5, 2.5, 3.5]);
        match checked::recv_new(w, src, tag) {
            Err(Error::BadHeader {
                field: "magic",
                value: 0x1234,
                ..
            }) => {}
            other => return Err(format!("expected BadHeader magic 0x1234, got {other:?}")),
        }
        let mut r = checked::recv_new(w, src, tag).map_err(s)?;
        ensure_eq!(r.to_vec::<u8>().map_err(s)?, vec![6, 7]);
    }
    Ok(())
}

/// recv_new allocates each dtype with the sent shape and delivers the values.
fn recv_new_every_dtype(w: &SimpleCommunicator) -> Outcome {
    let (src, dst) = pair(w);
    let tag = 15;
    let c32 = vec![Complex32::new(1.0, -1.0), Complex32::new(0.5, 2.0)];
    let c64 = vec![Complex64::new(-3.0, 4.0)];
    let halves: Vec<f16> = [1.0f32, -2.5, 65504.0].map(f16::from_f32).to_vec();
    let bhalves: Vec<bf16> = [1.0f32, 3.0e38].map(bf16::from_f32).to_vec();
    if w.rank() == src {
        send_checked(w, dst, tag, vec![-128i8, 0, 127], &[3])?;
        send_checked(w, dst, tag, vec![65535u16, 1], &[2, 1])?;
        send_checked(w, dst, tag, vec![i64::MIN, i64::MAX], &[2])?;
        send_checked(w, dst, tag, vec![0.25f32; 6], &[1, 2, 3])?;
        send_checked(w, dst, tag, c32.clone(), &[2])?;
        send_checked(w, dst, tag, c64.clone(), &[1])?;
        send_checked(w, dst, tag, halves.clone(), &[3])?;
        send_checked(w, dst, tag, bhalves.clone(), &[2])?;
        // bool: bytes in u8 storage with the bool dtype.
        let b = Owned::new(vec![1u8, 0, 1])
            .with_dtype(DType::new(code::BOOL, 8))
            .map_err(s)?;
        checked::send(w, dst, tag, &acquire(&b, &opts()).map_err(s)?).map_err(s)?;
        // uint8 × 4 lanes, 2 elements.
        let l = Owned::new(vec![1u8, 2, 3, 4, 5, 6, 7, 8])
            .with_dtype(DType::new(code::UINT, 8).with_lanes(4))
            .map_err(s)?;
        checked::send(w, dst, tag, &acquire(&l, &opts()).map_err(s)?).map_err(s)?;
        // 0-d float64 and a zero-size int32 [0, 3] with NULL-free empty storage.
        send_checked(w, dst, tag, vec![3.5f64], &[])?;
        send_checked(w, dst, tag, Vec::<i32>::new(), &[0, 3])?;
    }
    if w.rank() == dst {
        let next = |dtype: DType, shape: &[i64]| -> Result<checked::Received, String> {
            let r = checked::recv_new(w, src, tag).map_err(s)?;
            if r.dtype() != dtype || r.shape() != shape {
                return Err(format!(
                    "expected {dtype} {shape:?}, got {} {:?}",
                    r.dtype(),
                    r.shape()
                ));
            }
            Ok(r)
        };
        ensure_eq!(
            next(DType::new(code::INT, 8), &[3])?
                .to_vec::<i8>()
                .map_err(s)?,
            vec![-128, 0, 127]
        );
        ensure_eq!(
            next(DType::new(code::UINT, 16), &[2, 1])?
                .to_vec::<u16>()
                .map_err(s)?,
            vec![65535, 1]
        );
        ensure_eq!(
            next(DType::new(code::INT, 64), &[2])?
                .to_vec::<i64>()
                .map_err(s)?,
            vec![i64::MIN, i64::MAX]
        );
        ensure_eq!(
            next(DType::new(code::FLOAT, 32), &[1, 2, 3])?
                .to_vec::<f32>()
                .map_err(s)?,
            vec![0.25; 6]
        );
        ensure_eq!(
            next(DType::new(code::COMPLEX, 64), &[2])?
                .to_vec::<Complex32>()
                .map_err(s)?,
            c32
        );
        ensure_eq!(
            next(DType::new(code::COMPLEX, 128), &[1])?
                .to_vec::<Complex64>()
                .map_err(s)?,
            c64
        );
        let got = next(DType::new(code::FLOAT, 16), &[3])?
            .to_vec::<f16>()
            .map_err(s)?;
        ensure_eq!(
            got.iter().map(|h| h.to_bits()).collect::<Vec<_>>(),
            halves.iter().map(|h| h.to_bits()).collect::<Vec<_>>()
        );
        let got = next(DType::new(code::BFLOAT, 16), &[2])?
            .to_vec::<bf16>()
            .map_err(s)?;
        ensure_eq!(
            got.iter().map(|h| h.to_bits()).collect::<Vec<_>>(),
            bhalves.iter().map(|h| h.to_bits()).collect::<Vec<_>>()
        );
        ensure_eq!(
            next(DType::new(code::BOOL, 8), &[3])?.bytes().to_vec(),
            vec![1u8, 0, 1]
        );
        let mut lanes = next(DType::new(code::UINT, 8).with_lanes(4), &[2])?;
        ensure_eq!(lanes.bytes().to_vec(), vec![1u8, 2, 3, 4, 5, 6, 7, 8]);
        ensure_eq!(
            lanes.to_vec::<u8>().map_err(s)?,
            vec![1, 2, 3, 4, 5, 6, 7, 8]
        );
        let mut zero_d = next(DType::new(code::FLOAT, 64), &[])?;
        ensure_eq!(zero_d.len_elems(), 1);
        ensure_eq!(zero_d.to_vec::<f64>().map_err(s)?, vec![3.5]);
        // The received tensor is a DLPack producer: acquire it and look.
        {
            let t = acquire(&zero_d, &opts()).map_err(s)?;
            ensure_eq!((t.ndim(), t.num_elements()), (0, 1));
        }
        let mut empty = next(DType::new(code::INT, 32), &[0, 3])?;
        ensure_eq!(empty.len_elems(), 0);
        ensure_eq!(empty.to_vec::<i32>().map_err(s)?, Vec::<i32>::new());
    }
    Ok(())
}

/// The header's words are what the module docs say (a raw receive reads them).
fn header_on_the_wire(w: &SimpleCommunicator) -> Outcome {
    let (src, dst) = pair(w);
    if w.rank() == src {
        send_checked(w, dst, 16, vec![1i16, 2, 3, 4, 5, 6], &[3, 2])?;
    }
    if w.rank() == dst {
        let words = Owned::new(vec![0u64; 6]);
        {
            let mut r = acquire(&words, &opts()).map_err(s)?;
            w.recv_tensor(&mut r, src, 16).map_err(s)?;
        }
        let words = words.into_vec();
        ensure_eq!(words, vec![MAGIC, 1, 16 << 8 | 1 << 16, 2, 3, 2]);
        ensure_eq!(
            Header::decode(&words).map_err(s)?,
            Header {
                dtype: DType::new(code::INT, 16),
                shape: vec![3, 2]
            }
        );
        let payload = Owned::new(vec![0i16; 6]);
        {
            let mut r = acquire(&payload, &opts()).map_err(s)?;
            w.recv_tensor(&mut r, src, 16).map_err(s)?;
        }
        ensure_eq!(payload.into_vec(), vec![1, 2, 3, 4, 5, 6]);
    }
    Ok(())
}

/// Regression: a header that promises far more than its payload (2^40 float64, 2^41
/// float32) while 8 or 16 bytes follow. `recv_new` skipped its size check when the promised
/// count did not fit an MPI `int` and `recv_into`'s drain never checked, so both allocated
/// the promised 8 TiB and the process aborted ("memory allocation ... failed"). Now the
/// payload is compared with the header before any allocation: a typed CountMismatch, the
/// payload held in the error (received through it here), and the job goes on.
fn regression_huge_header_claims_allocate_nothing(w: &SimpleCommunicator) -> Outcome {
    let (src, dst) = pair(w);
    let tag = 17;
    let f64_word = u64::from(code::FLOAT) | 64 << 8 | 1 << 16;
    let f32_word = u64::from(code::FLOAT) | 32 << 8 | 1 << 16;
    if w.rank() == src {
        for (header, payload) in [
            (vec![MAGIC, 1, f64_word, 1, 1 << 40], vec![1.5f32, 0.0]),
            (
                vec![MAGIC, 1, f32_word, 1, 1 << 41],
                vec![1.0f32, 2.0, 3.0, 4.0],
            ),
        ] {
            let h = Owned::new(header);
            w.send_tensor(&acquire(&h, &opts()).map_err(s)?, dst, tag)
                .map_err(s)?;
            let p = Owned::new(payload);
            w.send_tensor(&acquire(&p, &opts()).map_err(s)?, dst, tag)
                .map_err(s)?;
        }
        send_checked(w, dst, tag, vec![5i32, 6], &[2])?;
    }
    if w.rank() == dst {
        let err = checked::recv_new(w, src, tag).unwrap_err();
        match err.mismatch() {
            Error::CountMismatch {
                expected,
                actual: 1,
                ..
            } if *expected == 1 << 40 => {}
            other => return Err(format!("expected CountMismatch 2^40 vs 1, got {other:?}")),
        }
        let left = Owned::new(vec![0f32; 2]);
        {
            let mut r = acquire(&left, &opts()).map_err(s)?;
            let held = err.unreceived().ok_or("no held payload")?;
            held.recv_into(&mut r).map_err(s)?;
        }
        ensure_eq!(left.into_vec(), vec![1.5, 0.0]);
        let mut target = Owned::new(vec![-5f32; 4]);
        let err = {
            let mut r = acquire(&target, &opts()).map_err(s)?;
            checked::recv_into(w, src, tag, &mut r).unwrap_err()
        };
        match err.mismatch() {
            Error::CountMismatch {
                expected,
                actual: 4,
                ..
            } if *expected == 1 << 41 => {}
            other => return Err(format!("expected CountMismatch 2^41 vs 4, got {other:?}")),
        }
        ensure_eq!(target.as_slice().to_vec(), vec![-5.0; 4]);
        let left = Owned::new(vec![0f32; 4]);
        {
            let mut r = acquire(&left, &opts()).map_err(s)?;
            let held = err.unreceived().ok_or("no held payload")?;
            held.recv_into(&mut r).map_err(s)?;
        }
        ensure_eq!(left.into_vec(), vec![1.0, 2.0, 3.0, 4.0]);
        let mut r = checked::recv_new(w, src, tag).map_err(s)?;
        ensure_eq!(r.to_vec::<i32>().map_err(s)?, vec![5, 6]);
    }
    Ok(())
}

type Case = (&'static str, fn(&SimpleCommunicator) -> Outcome);

const CASES: &[Case] = &[
    ("matching_header_delivers", matching_header_delivers),
    (
        "mismatches_are_errors_and_held",
        mismatches_are_errors_and_held,
    ),
    ("local_errors_receive_nothing", local_errors_receive_nothing),
    ("non_headers_are_bad_header", non_headers_are_bad_header),
    ("recv_new_every_dtype", recv_new_every_dtype),
    ("header_on_the_wire", header_on_the_wire),
    (
        "regression_huge_header_claims_allocate_nothing",
        regression_huge_header_claims_allocate_nothing,
    ),
];

/// The suite `checked` (see the binary's `main`).
pub fn run(w: &SimpleCommunicator, filter: &[String]) -> harness::End {
    if w.size() < 2 {
        println!(
            "checked-protocol cases: skipped at 1 rank (they need a sender and a receiver; \
             scripts/test.sh runs them at 2 ranks)"
        );
        return harness::End::Skipped { status: 0 };
    }
    if w.rank() == 0 {
        println!("running checked-protocol cases at {} rank(s)", w.size());
    }
    let (passed, failed) = harness::run_cases(w, CASES.iter().copied(), filter, |case| case(w));
    harness::report(w, passed, failed);
    harness::End::Ran { passed, failed }
}
