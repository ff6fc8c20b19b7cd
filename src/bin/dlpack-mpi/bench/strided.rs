//! `--op strided`: strided views of one 64 MiB f32 storage sent from rank 0 to rank 1
//! through a derived datatype, by packing by hand, and (the lower bound) contiguously.
//! Uses `common`, `args` and `report`.

use dlpack_mpi::dlpack::{acquire, AcquireOptions};
use dlpack_mpi::spec::SendSpec;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use super::args::{iters_for, BenchArgs};
use super::common::{all_ranks, measure_rounds, timed, Aligned, Elem, ELEM};
use super::report::{
    print_strided_header, print_strided_row, print_strided_summary, StridedPath, StridedRow,
    STRIDED_PATHS,
};

type Res<T> = dlpack_mpi::Result<T>;

/// Elements of the sender's storage in `--op strided` (64 MiB of f32), which both cases view.
/// Element `k` holds `k`, exact in f32 (`k < 2^24`), so the receiver can tell which storage
/// element it got.
pub const STRIDED_STORAGE: usize = (64 << 20) / ELEM;
/// Rows and columns of the transposed matrix.
const TRANSPOSE_DIM: usize = 4096;

/// A strided view of the sender's storage (one or two axes, strides in elements).
#[derive(Debug, Clone, Copy)]
struct Case {
    name: &'static str,
    shape: &'static [i64],
    strides: &'static [i64],
    /// Target for derived / contiguous, if any.
    contig_target: Option<f64>,
}

const CASES: [Case; 2] = [
    Case {
        name: "step 2",
        shape: &[(STRIDED_STORAGE / 2) as i64],
        strides: &[2],
        contig_target: Some(1.5),
    },
    Case {
        name: "transpose",
        shape: &[TRANSPOSE_DIM as i64, TRANSPOSE_DIM as i64],
        strides: &[1, TRANSPOSE_DIM as i64],
        contig_target: None,
    },
];

impl Case {
    /// `(rows, row stride, columns, column stride)`; a 1-d view is one row.
    fn dims(&self) -> (usize, usize, usize, usize) {
        match (self.shape, self.strides) {
            (&[n], &[s]) => (1, 0, n as usize, s as usize),
            (&[r, c], &[rs, cs]) => (r as usize, rs as usize, c as usize, cs as usize),
            _ => unreachable!("strided cases have one or two axes"),
        }
    }

    /// Number of logical elements.
    fn len(&self) -> usize {
        let (rows, _, cols, _) = self.dims();
        rows * cols
    }

    /// Storage index of logical element `l` (row-major).
    fn source_index(&self, l: usize) -> usize {
        let (_, row_stride, cols, col_stride) = self.dims();
        l / cols * row_stride + l % cols * col_stride
    }
}

/// The copy of the pack-and-send path: the logical elements of `case` in row-major order,
/// from `src` (first element at index 0) into `dst`.
fn pack(case: &Case, src: &[Elem], dst: &mut [Elem]) {
    let (_, row_stride, cols, col_stride) = case.dims();
    for (i, row) in dst.chunks_exact_mut(cols).enumerate() {
        let from = src[i * row_stride..].iter().step_by(col_stride);
        for (d, s) in row.iter_mut().zip(from) {
            *d = *s;
        }
    }
}

/// The buffers of `--op strided`, each allocated at full size only on the rank that uses it.
struct StridedBuffers {
    /// Rank 0: the storage the strided tensors view and the contiguous path sends from.
    src: Aligned,
    /// Rank 0: the pack path's contiguous buffer (allocated once, reused).
    packed: Aligned,
    /// Rank 1: the receive buffer (logical size of the largest case).
    recv: Aligned,
}

/// One timed run of `iters` messages of `case` through `path`, rank 0 to rank 1, each
/// acknowledged by a 1-byte message back; seconds per message on rank 0, 0 elsewhere.
fn strided_once(
    world: &SimpleCommunicator,
    path: StridedPath,
    case: &Case,
    bufs: &mut StridedBuffers,
    iters: u64,
) -> Res<f64> {
    let rank = world.rank();
    let n = case.len();
    let mut ack = 0u8;
    if rank > 1 {
        world.barrier();
        return Ok(0.0);
    }
    if rank == 1 {
        // The same receive on every path: the logical elements into a contiguous buffer.
        let peer = world.process_at_rank(0);
        let r = bufs.recv.raw(n);
        world.barrier();
        for _ in 0..iters {
            peer.receive_into(&mut *r);
            peer.send(&ack);
        }
        return Ok(0.0);
    }
    let peer = world.process_at_rank(1);
    let elapsed = match path {
        StridedPath::Derived => {
            let t = acquire(&bufs.src.owned, &AcquireOptions::default())?;
            timed(world, || {
                for _ in 0..iters {
                    peer.send(&SendSpec::new(&t)?);
                    peer.receive_into(&mut ack);
                }
                Ok(())
            })?
        }
        StridedPath::Pack => {
            let src = bufs.src.raw(STRIDED_STORAGE);
            let dst = bufs.packed.raw(n);
            timed(world, || {
                for _ in 0..iters {
                    pack(case, src, dst);
                    peer.send(&*dst);
                    peer.receive_into(&mut ack);
                }
                Ok::<(), dlpack_mpi::Error>(())
            })?
        }
        StridedPath::Contiguous => {
            let s = bufs.src.raw(n);
            timed(world, || {
                for _ in 0..iters {
                    peer.send(&*s);
                    peer.receive_into(&mut ack);
                }
                Ok::<(), dlpack_mpi::Error>(())
            })?
        }
    };
    Ok(elapsed / iters as f64)
}

/// Sends one message of `case` through every path; rank 1 checks that it received the
/// logical elements (derived, pack) or the first storage elements (contiguous). Returns, on
/// every rank, whether all arrived intact.
fn strided_verify(world: &SimpleCommunicator, case: &Case, bufs: &mut StridedBuffers) -> Res<bool> {
    let n = case.len();
    let mut ok = true;
    for p in STRIDED_PATHS {
        if world.rank() == 1 {
            bufs.recv.raw(n).fill(-1.0);
        }
        strided_once(world, p, case, bufs, 1)?;
        if world.rank() == 1 {
            let expected = |l: usize| match p {
                StridedPath::Contiguous => l as Elem,
                _ => case.source_index(l) as Elem,
            };
            let got = bufs.recv.raw(n);
            if let Some((l, &x)) = got.iter().enumerate().find(|&(l, &x)| x != expected(l)) {
                eprintln!(
                    "dlpack-mpi bench: rank 1: strided {} via {}: element {l} is {x}, expected {}",
                    case.name,
                    p.name(),
                    expected(l)
                );
                ok = false;
            }
        }
    }
    Ok(all_ranks(world, ok))
}

/// Lays rank 0's storage out as `case` and checks that it goes as one derived datatype.
fn set_case(bufs: &mut StridedBuffers, case: &Case) -> Res<()> {
    let src = std::mem::replace(&mut bufs.src, Aligned::new(0, 0.0));
    bufs.src = src.set_layout(case.shape, Some(case.strides))?;
    let t = acquire(&bufs.src.owned, &AcquireOptions::default())?;
    let spec = SendSpec::new(&t)?;
    assert!(
        spec.is_derived() && spec.mpi_count() == 1,
        "{}: not sent as one derived datatype",
        case.name
    );
    Ok(())
}

/// Runs `--op strided`; returns its rows and whether every path delivered the expected
/// elements.
pub fn strided(world: &SimpleCommunicator, args: &BenchArgs) -> Res<(Vec<StridedRow>, bool)> {
    let rank = world.rank();
    let root = rank == 0;
    if world.size() < 2 {
        if root {
            println!("strided: skipped (needs at least 2 ranks)\n");
        }
        return Ok((Vec::new(), true));
    }
    if root {
        print_strided_header(world.size(), args.rounds);
    }
    let largest = CASES.iter().map(Case::len).max().unwrap_or(0);
    let mut bufs = StridedBuffers {
        src: Aligned::new(if root { STRIDED_STORAGE } else { 0 }, 0.0),
        packed: Aligned::new(if root { largest } else { 0 }, 0.0),
        recv: Aligned::new(if rank == 1 { largest } else { 0 }, -1.0),
    };
    if root {
        for (k, x) in bufs.src.raw(STRIDED_STORAGE).iter_mut().enumerate() {
            *x = k as Elem;
        }
    }
    let mut verified = true;
    let mut rows = Vec::new();
    for case in CASES {
        if root {
            set_case(&mut bufs, &case)?;
        }
        verified &= strided_verify(world, &case, &mut bufs)?;
        let iters = iters_for(args.iters, case.len() * ELEM);
        let samples = measure_rounds(world, args.rounds, iters, &STRIDED_PATHS, |p, it| {
            strided_once(world, p, &case, &mut bufs, it)
        })?;
        let mut samples = samples.into_iter();
        let row = StridedRow {
            name: case.name,
            bytes: case.len() * ELEM,
            contig_target: case.contig_target,
            iters,
            paths: std::array::from_fn(|_| samples.next().unwrap_or_default()),
        };
        if root {
            print_strided_row(&row);
        }
        rows.push(row);
    }
    if root {
        print_strided_summary(&rows, verified);
    }
    Ok((rows, verified))
}
