//! `--op strided`: strided views of one f32 storage (64 MiB by default,
//! `--strided-storage`) sent from rank 0 to rank 1 contiguously (the lower bound), through a
//! derived datatype, through the library's pack kernels, and under `Packing::Auto`.
//! Uses `common`, `args` and `strided_report`.

use dlpack_mpi::comm::{inner_block_bytes, TensorComm};
use dlpack_mpi::dlpack::{acquire, AcquireOptions};
use dlpack_mpi::settings::{pack_threshold_bytes, set_packing, Packing};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use super::args::{iters_for, BenchArgs};
use super::common::{measure_rounds, timed, Aligned, Elem, ELEM};
use super::strided_report::{
    print_strided_header, print_strided_row, print_strided_summary, StridedPath, StridedRow,
    STRIDED_PATHS,
};
use crate::common::all_ranks;

type Res<T> = dlpack_mpi::Result<T>;

/// The largest inner block of the block cases, in elements (blocks 1, 2, 4, … up to it).
const MAX_BLOCK: usize = 4096;

/// A strided view of the sender's storage: `shape` and `strides` in elements, the first
/// element `origin` elements into the storage.
#[derive(Debug, Clone)]
struct Case {
    name: String,
    shape: Vec<i64>,
    strides: Vec<i64>,
    origin: usize,
}

/// `n` as an `i64` (storage sizes are at most 2^24 elements).
fn i(n: usize) -> i64 {
    i64::try_from(n).expect("storage sizes fit i64")
}

/// The cases over a storage of `s` elements (a power of two, at least 2 × [`MAX_BLOCK`]):
/// step 2; blocks of 1 … 4096 elements with a gap of one block; the `d × d` transpose
/// (`d² ≤ s`); a 3-D permutation (axes (2, 0, 1) of a C-order `e × e × e` array,
/// `e³ ≤ s`); the whole storage reversed.
fn cases(s: usize) -> Vec<Case> {
    let k = s.trailing_zeros();
    let (d, e) = (1usize << (k / 2), 1usize << (k / 3));
    let case = |name: String, shape: Vec<usize>, strides: Vec<i64>, origin| Case {
        name,
        shape: shape.into_iter().map(i).collect(),
        strides,
        origin,
    };
    let mut out = vec![case("step 2".into(), vec![s / 2], vec![2], 0)];
    let mut b = 1;
    while b <= MAX_BLOCK {
        out.push(case(
            format!("block {b}"),
            vec![s / (2 * b), b],
            vec![i(2 * b), 1],
            0,
        ));
        b *= 2;
    }
    out.push(case("transpose".into(), vec![d, d], vec![1, i(d)], 0));
    out.push(case(
        "permute 3-D".into(),
        vec![e, e, e],
        vec![1, i(e * e), i(e)],
        0,
    ));
    out.push(case("reversed".into(), vec![s], vec![-1], s - 1));
    out
}

impl Case {
    /// Number of logical elements.
    fn len(&self) -> usize {
        self.shape.iter().map(|&n| n as usize).product()
    }

    /// The contiguous inner block, in elements.
    fn block_elems(&self) -> Res<usize> {
        inner_block_bytes(&self.shape, Some(&self.strides), 1)
    }

    /// Storage index of every logical element, in row-major order (an odometer).
    fn source_indices(&self) -> impl Iterator<Item = usize> + '_ {
        let mut index = vec![0i64; self.shape.len()];
        let mut at = self.origin as i64;
        let mut left = self.len();
        std::iter::from_fn(move || {
            if left == 0 {
                return None;
            }
            left -= 1;
            let here = at as usize;
            for k in (0..index.len()).rev() {
                index[k] += 1;
                at += self.strides[k];
                if index[k] < self.shape[k] {
                    break;
                }
                at -= self.strides[k] * self.shape[k];
                index[k] = 0;
            }
            Some(here)
        })
    }
}

/// The buffers of `--op strided`, each allocated at full size only on the rank that uses it.
struct StridedBuffers {
    /// Rank 0: the storage the strided tensors view and the contiguous path sends from.
    src: Aligned,
    /// Rank 1: the receive buffer (logical size of the largest case).
    recv: Aligned,
}

/// Deliveries rank 1 compared element by element, and how many of them were wrong.
#[derive(Debug, Default, Clone, Copy)]
struct Checks {
    checked: u64,
    bad: u64,
}

/// Rank 1: compares the message in `got` with what `path` should deliver for `case`; prints
/// the first wrong element.
fn check(case: &Case, path: StridedPath, got: &[Elem], checks: &mut Checks) {
    checks.checked += 1;
    let wrong = if path == StridedPath::Contiguous {
        got.iter().enumerate().find(|&(l, &x)| x != l as Elem)
    } else {
        got.iter()
            .zip(case.source_indices())
            .enumerate()
            .find(|&(_, (&x, k))| x != k as Elem)
            .map(|(l, (x, _))| (l, x))
    };
    if let Some((l, &x)) = wrong {
        checks.bad += 1;
        eprintln!(
            "dlpack-mpi bench: rank 1: strided {} via {}: element {l} is {x}, wrong",
            case.name,
            path.name(),
        );
    }
}

/// One timed run of `iters` messages of `case` through `path`, rank 0 to rank 1, each
/// acknowledged by a 1-byte message back; seconds per message on rank 0, 0 elsewhere.
/// Rank 1 fills its buffer with −1 before the loop and checks the last message after it
/// (both untimed: the next loop starts with a barrier).
fn strided_once(
    world: &SimpleCommunicator,
    path: StridedPath,
    case: &Case,
    bufs: &mut StridedBuffers,
    iters: u64,
    checks: &mut Checks,
) -> Res<f64> {
    let rank = world.rank();
    let n = case.len();
    let mut ack = 0u8;
    if super::host::sits_out(world) {
        return Ok(0.0);
    }
    if rank == 1 {
        // The same receive on every path: the logical elements into a contiguous buffer.
        let peer = world.process_at_rank(0);
        let r = bufs.recv.raw(n);
        r.fill(-1.0);
        world.barrier();
        for _ in 0..iters {
            peer.receive_into(&mut *r);
            peer.send(&ack);
        }
        check(case, path, r, checks);
        return Ok(0.0);
    }
    let peer = world.process_at_rank(1);
    let policy = match path {
        StridedPath::Contiguous => {
            let s = bufs.src.raw(n);
            let elapsed = timed(world, || {
                for _ in 0..iters {
                    peer.send(&*s);
                    peer.receive_into(&mut ack);
                }
                Ok::<(), dlpack_mpi::Error>(())
            })?;
            return Ok(elapsed / iters as f64);
        }
        StridedPath::Derived => Packing::DerivedDatatype,
        StridedPath::Pack => Packing::Copy,
        StridedPath::Auto => Packing::Auto,
    };
    set_packing(policy);
    let t = acquire(&bufs.src.owned, &AcquireOptions::default())?;
    let elapsed = timed(world, || {
        for _ in 0..iters {
            world.send_tensor(&t, 1, 0)?;
            peer.receive_into(&mut ack);
        }
        Ok(())
    })?;
    Ok(elapsed / iters as f64)
}

/// Runs `--op strided`; returns its rows and whether every checked delivery was intact.
pub fn strided(world: &SimpleCommunicator, args: &BenchArgs) -> Res<(Vec<StridedRow>, bool)> {
    let rank = world.rank();
    let root = rank == 0;
    if world.size() < 2 {
        if root {
            println!("strided: skipped (needs at least 2 ranks)\n");
        }
        return Ok((Vec::new(), true));
    }
    // Element `k` of the storage holds `k`, exact in f32 (at most 2^24 elements), so the
    // receiver can tell which storage element it got.
    let storage = args.strided_storage / ELEM;
    let threshold = pack_threshold_bytes()?;
    if root {
        print_strided_header(world.size(), args.rounds, storage * ELEM, threshold);
    }
    let all = cases(storage);
    let largest = all.iter().map(Case::len).max().unwrap_or(0);
    let mut bufs = StridedBuffers {
        src: Aligned::new(if root { storage } else { 0 }, 0.0),
        recv: Aligned::new(if rank == 1 { largest } else { 0 }, -1.0),
    };
    if root {
        for (k, x) in bufs.src.raw(storage).iter_mut().enumerate() {
            *x = k as Elem;
        }
    }
    let mut checks = Checks::default();
    let mut rows = Vec::new();
    for case in &all {
        if root {
            let src = std::mem::replace(&mut bufs.src, Aligned::new(0, 0.0));
            bufs.src = src.set_layout_at(&case.shape, Some(&case.strides), case.origin)?;
        }
        // The first message of every path, checked before any timing.
        for p in STRIDED_PATHS {
            strided_once(world, p, case, &mut bufs, 1, &mut checks)?;
        }
        let iters = iters_for(args.iters, case.len() * ELEM);
        let samples = measure_rounds(world, args.rounds, iters, &STRIDED_PATHS, |p, it| {
            strided_once(world, p, case, &mut bufs, it, &mut checks)
        })?;
        let mut samples = samples.into_iter();
        let block_elems = case.block_elems()?;
        let row = StridedRow {
            name: case.name.clone(),
            block_elems,
            auto_packs: Packing::Auto.packs(block_elems * ELEM, threshold),
            bytes: case.len() * ELEM,
            iters,
            paths: std::array::from_fn(|_| samples.next().unwrap_or_default()),
        };
        if root {
            print_strided_row(&row);
        }
        rows.push(row);
    }
    set_packing(Packing::Auto);
    let ok = all_ranks(world, checks.bad == 0);
    // Rank 1's counts, for rank 0's summary.
    let mut counts = [checks.checked, checks.bad];
    world.process_at_rank(1).broadcast_into(&mut counts);
    if root {
        print_strided_summary(&rows, counts[0], counts[1]);
    }
    Ok((rows, ok))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The odometer gives the storage index of every logical element, row-major.
    #[test]
    fn source_indices_walk_row_major() {
        let c = &cases(1 << 15);
        let names: Vec<&str> = c.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names.len(), 17, "{names:?}");
        let idx = |name: &str| -> Vec<usize> {
            let case = c.iter().find(|c| c.name == name).unwrap();
            case.source_indices().take(6).collect()
        };
        assert_eq!(idx("step 2"), [0, 2, 4, 6, 8, 10]);
        assert_eq!(idx("block 2"), [0, 1, 4, 5, 8, 9]);
        // 128 × 128 transpose (2^15 elements: d = 2^7), column order
        assert_eq!(idx("transpose"), [0, 128, 256, 384, 512, 640]);
        // e = 32: strides [1, 1024, 32]
        assert_eq!(idx("permute 3-D"), [0, 32, 64, 96, 128, 160]);
        assert_eq!(idx("reversed"), [32767, 32766, 32765, 32764, 32763, 32762]);
        let t = c.iter().find(|c| c.name == "permute 3-D").unwrap();
        let all: Vec<usize> = t.source_indices().collect();
        assert_eq!(all.len(), 32 * 32 * 32);
        assert_eq!(all[32], 1024, "row 1 of axis 1 starts at stride 1024");
        assert_eq!(all[1024], 1, "axis 0 has stride 1");
    }
}
