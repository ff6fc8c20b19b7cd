//! Agreement before collectives (issue 14, item 1): for every rooted and vector collective,
//! only rank `r` refuses its arguments (`r` = the root and `r` ≠ the root; for collectives
//! without a root, the last rank and rank 0), and every rank must return an error without
//! entering the data operation — `r` its own diagnosis, every other rank
//! `Error::PeerRefused { rank: r, reason }` with `r`'s error text. Then the reduce of the
//! issue (f32 send, f64 receive) at 8 B and 4 MiB, and the opt-out `Agreement::Local` on a
//! refusal every rank makes alike.
//!
//! The suite `agreement` of tests/mpi (main.rs): `cargo test` runs it at 1 rank
//! (only the root can refuse there), scripts/test.sh under `mpirun -n 2`, `-n 3` and `-n 4`
//! within `timeout`. If agreement broke, the ranks that did not refuse would wait inside the
//! data operation while the refusing rank went on to the harness's verdict all-reduce: the
//! job hangs and the timeout fails the stage.

use crate::common::RawTensor;
use crate::harness;
use dlpack_mpi::comm::{Blocks, TensorComm, AGREEMENT_REASON_BYTES};
use dlpack_mpi::dlpack::{acquire, AcquireOptions, ManagedTensor, Owned, Tensor};
use dlpack_mpi::dtype::ReduceOp;
use dlpack_mpi::settings::{set_agreement, Agreement};
use dlpack_mpi::Error;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

type Outcome = Result<(), String>;

/// Elements per rank's block.
const M: usize = 3;

fn opts() -> AcquireOptions {
    AcquireOptions::default()
}

fn f32s(n: usize) -> Owned<f32> {
    Owned::new((0..n).map(|i| i as f32).collect::<Vec<_>>())
}

fn f64s(n: usize) -> Owned<f64> {
    Owned::new(vec![0.0; n])
}

fn t<T: dlpack_mpi::dtype::AnyBits>(o: &Owned<T>) -> Result<ManagedTensor<'_>, String> {
    acquire(o, &opts()).map_err(|e| e.to_string())
}

/// A tensor of 64-bit opaque handles (DLPack code 3): imported, refused by every spec.
fn opaque() -> Result<ManagedTensor<'static>, String> {
    RawTensor::new(&[0u64; M], (3, 64, 1))
        .import_v1()
        .0
        .map_err(|e| e.to_string())
}

/// Checks one case's outcome `got` on every rank: the refusing rank `refuser` must see its
/// own error (`own` says which), the others `PeerRefused` naming `refuser` with its text,
/// which the test sends itself (rsmpi's broadcast) to compare with.
fn verdict(
    w: &SimpleCommunicator,
    refuser: i32,
    got: dlpack_mpi::Result<()>,
    own: impl Fn(&Error) -> bool,
) -> Outcome {
    let mut text = [0u8; AGREEMENT_REASON_BYTES];
    if w.rank() == refuser {
        if let Err(e) = &got {
            let s = e.to_string();
            let n = s.len().min(text.len());
            text[..n].copy_from_slice(&s.as_bytes()[..n]);
        }
    }
    w.process_at_rank(refuser).broadcast_into(&mut text[..]);
    let end = text.iter().position(|&b| b == 0).unwrap_or(text.len());
    let expected = String::from_utf8_lossy(&text[..end]).into_owned();
    ensure!(!expected.is_empty(), "rank {refuser} did not refuse");
    if w.rank() == refuser {
        match &got {
            Err(e) if own(e) => Ok(()),
            other => Err(format!(
                "the refusing rank expected its own error, got {other:?}"
            )),
        }
    } else {
        match got {
            Err(Error::PeerRefused { rank, reason }) if rank == refuser && reason == expected => {
                Ok(())
            }
            other => Err(format!(
                "expected PeerRefused {{ rank: {refuser}, reason: {expected:?} }}, got {other:?}"
            )),
        }
    }
}

fn broadcast(w: &SimpleCommunicator, root: i32, refuser: i32) -> Outcome {
    let me = w.rank();
    let (good, ro) = (f32s(M), f32s(M).read_only());
    let got = if me == refuser && me == root {
        let mut bad = opaque()?;
        w.broadcast_tensor(&mut bad, root)
    } else if me == refuser {
        w.broadcast_tensor(&mut t(&ro)?, root)
    } else {
        w.broadcast_tensor(&mut t(&good)?, root)
    };
    verdict(w, refuser, got, |e| {
        matches!(e, Error::UnsupportedDtype { .. } | Error::ReadOnly)
    })
}

fn gather(w: &SimpleCommunicator, root: i32, refuser: i32) -> Outcome {
    let (me, p) = (w.rank(), w.size() as usize);
    let send = f32s(M);
    // The refuser's receive buffer is one element short (a non-root's is checked too).
    let recv = f32s(if me == refuser { p * M - 1 } else { p * M });
    let s = t(&send)?;
    let mut r = t(&recv)?;
    let recv_arg = (me == root || me == refuser).then_some(&mut r as &mut dyn Tensor);
    let got = w.gather_tensor(&s, recv_arg, root);
    verdict(w, refuser, got, |e| {
        matches!(e, Error::CountMismatch { .. })
    })
}

fn gatherv(w: &SimpleCommunicator, root: i32, refuser: i32) -> Outcome {
    let (me, p) = (w.rank(), w.size() as usize);
    let send = f32s(M);
    let recv = f32s(p * M);
    let mut counts = vec![M as i64; p];
    let displs: Vec<i64> = (0..p).map(|i| (i * M) as i64).collect();
    if me == refuser && me == root {
        counts.pop(); // one count short
    } else if me == refuser {
        counts[me as usize] = M as i64 - 1; // its own block is not its send
    }
    let s = t(&send)?;
    let mut r = t(&recv)?;
    let recv_arg = (me == root || me == refuser)
        .then_some((&mut r as &mut dyn Tensor, Blocks::new(&counts, &displs)));
    let got = w.gatherv_tensor(&s, recv_arg, root);
    verdict(w, refuser, got, |e| {
        matches!(
            e,
            Error::LengthMismatch { .. } | Error::CountMismatch { .. }
        )
    })
}

fn scatter(w: &SimpleCommunicator, root: i32, refuser: i32) -> Outcome {
    let (me, p) = (w.rank(), w.size() as usize);
    let (send, wrong) = (f32s(p * M), f64s(p * M));
    let recv = f32s(M);
    let (s, x) = (t(&send)?, t(&wrong)?);
    let mut r = t(&recv)?;
    // A refusing root gives no send buffer at all; a refusing non-root gives a float64 send
    // buffer it need not give (root-only arguments are checked wherever given).
    let send_arg = if me == refuser && me != root {
        Some(&x as &dyn Tensor)
    } else {
        (me == root && me != refuser).then_some(&s as &dyn Tensor)
    };
    let got = w.scatter_tensor(send_arg, &mut r, root);
    verdict(w, refuser, got, |e| {
        matches!(
            e,
            Error::MissingBuffer {
                what: "scatter send buffer"
            } | Error::DtypeMismatch { .. }
        )
    })
}

fn scatterv(w: &SimpleCommunicator, root: i32, refuser: i32) -> Outcome {
    let (me, p) = (w.rank(), w.size() as usize);
    let send = f32s(p * M);
    let recv = f32s(M);
    let mut counts = vec![M as i64; p];
    let mut displs: Vec<i64> = (0..p).map(|i| (i * M) as i64).collect();
    if me == refuser && me == root {
        displs[0] = (p * M) as i64; // the first block lies past the tensor
    } else if me == refuser {
        counts.pop(); // a non-root's unneeded send arguments: one count short
    }
    let s = t(&send)?;
    let mut r = t(&recv)?;
    let send_arg =
        (me == root || me == refuser).then_some((&s as &dyn Tensor, Blocks::new(&counts, &displs)));
    let got = w.scatterv_tensor(send_arg, &mut r, root);
    verdict(w, refuser, got, |e| {
        matches!(e, Error::OutOfBounds { .. } | Error::LengthMismatch { .. })
    })
}

/// Reduce of `n` f32 elements whose refuser gives an f64 receive buffer (at a non-root
/// rank too: root-only arguments are checked wherever given).
fn reduce_n(w: &SimpleCommunicator, root: i32, refuser: i32, n: usize) -> Outcome {
    let me = w.rank();
    let (send, good, bad) = (f32s(n), f32s(n), f64s(n));
    let s = t(&send)?;
    let (mut g, mut b) = (t(&good)?, t(&bad)?);
    let recv_arg: Option<&mut dyn Tensor> = if me == refuser {
        Some(&mut b)
    } else if me == root {
        Some(&mut g)
    } else {
        None
    };
    let got = w.reduce_tensor(&s, recv_arg, ReduceOp::Sum, root);
    verdict(w, refuser, got, |e| {
        matches!(e, Error::DtypeMismatch { .. })
    })
}

fn reduce(w: &SimpleCommunicator, root: i32, refuser: i32) -> Outcome {
    reduce_n(w, root, refuser, M)
}

fn all_reduce(w: &SimpleCommunicator, _root: i32, refuser: i32) -> Outcome {
    let me = w.rank();
    let send = f32s(M);
    let recv = f32s(if me == refuser { M + 1 } else { M });
    let got = w.all_reduce_tensor(&t(&send)?, &mut t(&recv)?, ReduceOp::Sum);
    verdict(w, refuser, got, |e| {
        matches!(e, Error::CountMismatch { .. })
    })
}

fn all_reduce_in_place(w: &SimpleCommunicator, _root: i32, refuser: i32) -> Outcome {
    let me = w.rank();
    let x = if me == refuser {
        f32s(M).read_only()
    } else {
        f32s(M)
    };
    let got = w.all_reduce_tensor_in_place(&mut t(&x)?, ReduceOp::Max);
    verdict(w, refuser, got, |e| matches!(e, Error::ReadOnly))
}

fn all_gather(w: &SimpleCommunicator, _root: i32, refuser: i32) -> Outcome {
    let (me, p) = (w.rank(), w.size() as usize);
    let send = f32s(M);
    let recv = f32s(if me == refuser { p * M + 1 } else { p * M });
    let got = w.all_gather_tensor(&t(&send)?, &mut t(&recv)?);
    verdict(w, refuser, got, |e| {
        matches!(e, Error::CountMismatch { .. })
    })
}

fn all_gatherv(w: &SimpleCommunicator, _root: i32, refuser: i32) -> Outcome {
    let (me, p) = (w.rank(), w.size() as usize);
    let send = f32s(M);
    let recv = f32s(p * M);
    let mut counts = vec![M as i64; p];
    let displs: Vec<i64> = (0..p).map(|i| (i * M) as i64).collect();
    if me == refuser {
        counts[me as usize] = M as i64 + 1;
    }
    let got = w.all_gatherv_tensor(&t(&send)?, &mut t(&recv)?, Blocks::new(&counts, &displs));
    verdict(w, refuser, got, |e| {
        // The longer block overlaps the next one, or runs past the tensor at the last rank.
        matches!(e, Error::BlocksOverlap { .. } | Error::OutOfBounds { .. })
    })
}

fn all_to_all(w: &SimpleCommunicator, _root: i32, refuser: i32) -> Outcome {
    let (me, p) = (w.rank(), w.size() as usize);
    let send = f32s(p * M);
    let (good, bad) = (f32s(p * M), f64s(p * M));
    let got = if me == refuser {
        w.all_to_all_tensor(&t(&send)?, &mut t(&bad)?)
    } else {
        w.all_to_all_tensor(&t(&send)?, &mut t(&good)?)
    };
    verdict(w, refuser, got, |e| {
        matches!(e, Error::DtypeMismatch { .. })
    })
}

fn all_to_allv(w: &SimpleCommunicator, _root: i32, refuser: i32) -> Outcome {
    let (me, p) = (w.rank(), w.size() as usize);
    let send = f32s(p * M);
    let recv = f32s(p * M);
    let counts = vec![M as i64; p];
    let displs: Vec<i64> = (0..p).map(|i| (i * M) as i64).collect();
    let mut recv_displs = displs.clone();
    if me == refuser {
        recv_displs[p - 1] = (p * M) as i64 - 1; // the last block runs past the tensor
    }
    let got = w.all_to_allv_tensor(
        &t(&send)?,
        Blocks::new(&counts, &displs),
        &mut t(&recv)?,
        Blocks::new(&counts, &recv_displs),
    );
    verdict(w, refuser, got, |e| matches!(e, Error::OutOfBounds { .. }))
}

fn reduce_scatter_block(w: &SimpleCommunicator, _root: i32, refuser: i32) -> Outcome {
    let (me, p) = (w.rank(), w.size() as usize);
    let send = f32s(p * M);
    let recv = f32s(M);
    // Bitwise AND is not defined on floats: refused by the refuser's local check.
    let op = if me == refuser {
        ReduceOp::BitwiseAnd
    } else {
        ReduceOp::Sum
    };
    let got = w.reduce_scatter_block_tensor(&t(&send)?, &mut t(&recv)?, op);
    verdict(w, refuser, got, |e| {
        matches!(e, Error::UnsupportedReduction { .. })
    })
}

/// The case: f32 send, f64 receive at the root only, 4 MiB of f32 (where Open MPI
/// leaves the eager protocol and rank 1 used to hang inside `MPI_Reduce`).
fn reduce_4mib(w: &SimpleCommunicator, root: i32, refuser: i32) -> Outcome {
    reduce_n(w, root, refuser, (4 << 20) / 4)
}

/// The case exactly: every rank passes `Some(f64 recv)`, so every rank refuses
/// (root-only arguments are checked wherever given) and returns its own diagnosis.
fn every_rank_refuses(w: &SimpleCommunicator, bytes: usize) -> Outcome {
    let n = bytes / 4;
    let (send, recv) = (f32s(n), f64s(n));
    let got = w.reduce_tensor(&t(&send)?, Some(&mut t(&recv)?), ReduceOp::Sum, 0);
    match got {
        Err(Error::DtypeMismatch { .. }) => Ok(()),
        other => Err(format!("expected this rank's DtypeMismatch, got {other:?}")),
    }
}

/// Every rank passes `None` for the root-only buffer of each rooted collective: only the
/// root refuses, with `MissingBuffer` naming the buffer; the others get `PeerRefused`. All
/// five cases run on every rank before any verdict is returned (each verdict is collective).
fn missing_root_buffers(w: &SimpleCommunicator, root: i32) -> Outcome {
    let (send, recv) = (f32s(M), f32s(M));
    let s = t(&send)?;
    let mut r = t(&recv)?;
    let missing = |what: &'static str| move |e: &Error| *e == Error::MissingBuffer { what };
    let outcomes = [
        verdict(
            w,
            root,
            w.reduce_tensor(&s, None, ReduceOp::Sum, root),
            missing("reduce receive buffer"),
        ),
        verdict(
            w,
            root,
            w.gather_tensor(&s, None, root),
            missing("gather receive buffer"),
        ),
        verdict(
            w,
            root,
            w.gatherv_tensor(&s, None, root),
            missing("gatherv receive buffer"),
        ),
        verdict(
            w,
            root,
            w.scatter_tensor(None, &mut r, root),
            missing("scatter send buffer"),
        ),
        verdict(
            w,
            root,
            w.scatterv_tensor(None, &mut r, root),
            missing("scatterv send buffer"),
        ),
    ];
    outcomes.into_iter().collect()
}

/// `Agreement::Local`: a refusal every rank makes alike still returns each rank's own error
/// (nobody enters MPI, so nothing hangs); then the default is restored.
fn local_opt_out(w: &SimpleCommunicator) -> Outcome {
    set_agreement(Agreement::Local);
    let out = every_rank_refuses(w, 8);
    set_agreement(Agreement::Collective);
    out?;
    // And the default agrees again: an all-reduce after the refusals delivers.
    let (send, recv) = (f32s(M), f32s(M));
    w.all_reduce_tensor(&t(&send)?, &mut t(&recv)?, ReduceOp::Sum)
        .map_err(|e| e.to_string())?;
    let p = w.size() as f32;
    ensure_eq!(recv.into_vec(), vec![0.0, p, 2.0 * p]);
    Ok(())
}

type Case = fn(&SimpleCommunicator, i32, i32) -> Outcome;

/// `(name, rooted, case)`.
const COLLECTIVES: &[(&str, bool, Case)] = &[
    ("broadcast", true, broadcast),
    ("gather", true, gather),
    ("gatherv", true, gatherv),
    ("scatter", true, scatter),
    ("scatterv", true, scatterv),
    ("reduce_8B", true, reduce),
    ("reduce_4MiB", true, reduce_4mib),
    ("all_reduce", false, all_reduce),
    ("all_reduce_in_place", false, all_reduce_in_place),
    ("all_gather", false, all_gather),
    ("all_gatherv", false, all_gatherv),
    ("all_to_all", false, all_to_all),
    ("all_to_allv", false, all_to_allv),
    ("reduce_scatter_block", false, reduce_scatter_block),
];

/// The suite `agreement` (see the binary's `main`).
pub fn run(w: &SimpleCommunicator, filter: &[String]) -> harness::End {
    let p = w.size();
    if w.rank() == 0 {
        println!("running agreement cases at {p} rank(s)");
    }
    // The root is the last rank; the other refuser is rank 0 (a non-root when p > 1).
    let root = p - 1;
    let mut cases: Vec<(String, Box<dyn Fn() -> Outcome + '_>)> = Vec::new();
    for &(name, rooted, case) in COLLECTIVES {
        let (last, first) = if rooted {
            ("the root", "a non-root")
        } else {
            ("the last rank", "rank 0")
        };
        let mut refusers = vec![(root, last)];
        if p > 1 {
            refusers.push((0, first));
        }
        for (refuser, who) in refusers {
            cases.push((
                format!("{name}: only rank {refuser} ({who}) refuses"),
                Box::new(move || case(w, root, refuser)),
            ));
        }
    }
    for bytes in [8usize, 4 << 20] {
        cases.push((
            format!("reduce f32 send, f64 recv on every rank, {bytes} B: each rank's own error"),
            Box::new(move || every_rank_refuses(w, bytes)),
        ));
    }
    cases.push((
        format!("no root-only buffer at the root (rank {root}): MissingBuffer naming it"),
        Box::new(|| missing_root_buffers(w, root)),
    ));
    cases.push((
        "Agreement::Local: each rank's own error".into(),
        Box::new(|| local_opt_out(w)),
    ));
    let (passed, failed) =
        harness::run_cases(w, cases.iter().map(|(n, c)| (n, c)), filter, |c| c());
    harness::report(w, passed, failed);
    harness::End::Ran { passed, failed }
}
