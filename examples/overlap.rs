//! Communication overlapped with computation: every rank posts a nonblocking all-reduce
//! (sum) of a 4 MiB `f32` gradient with [`TensorComm::immediate_all_reduce_tensor`], works
//! on something else while calling [`TensorRequest::test`] between chunks of the work, posts
//! a nonblocking broadcast ([`TensorComm::immediate_broadcast_tensor`]) before the
//! all-reduce is waited on, and completes both with [`wait_all`].
//!
//! The gradient is a transposed view (a row-major `ROWS × COLS` matrix exported as its
//! `COLS × ROWS` transpose, strides `[1, COLS]`), so the post packs it, in logical
//! row-major order, into a copy the request owns until it completes (reductions always
//! pack). The post also checks both tensors and posts the small agreement; a `test` (or
//! `wait`) that finds the agreement complete posts the data operation, and later tests
//! let MPI progress it. Both collectives are posted in the same order on every rank
//! (MPI-4.1 §6.12), however their tests go.
//!
//! Every value and partial sum is a multiple of 1/4 below 2^13, which `f32` holds exactly,
//! so the sums are exact in any order at 1–4 ranks. A rank that finds a wrong value says
//! which element, and every rank then exits non-zero.
//!
//! ```text
//! cargo build --examples
//! mpirun -n 4 target/debug/examples/overlap
//! ```

use dlpack_mpi::comm::{wait_all, TensorComm, TensorRequest};
use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned};
use dlpack_mpi::dtype::ReduceOp;
use mpi::collective::SystemOperation;
use mpi::request::Scope;
use mpi::traits::*;

/// The gradient's storage is a row-major `ROWS × COLS` matrix; its tensor is the
/// `COLS × ROWS` transpose: 1 Mi `f32`, 4 MiB.
const ROWS: usize = 512;
const COLS: usize = 2048;
/// The local work is done in this many chunks, with a `test` after each.
const CHUNKS: usize = 64;
/// Elements of the broadcast parameters.
const PARAMS: usize = 1000;
const ROOT: i32 = 0;

/// Rank `r`'s gradient element at storage index `s` (multiples of 1/4, at most 1023 + r).
fn grad(r: i32, s: usize) -> f32 {
    (s % 4093) as f32 / 4.0 + r as f32
}

/// The root's parameter `i`.
fn param(i: usize) -> f32 {
    1.0 + i as f32 / 8.0
}

/// One chunk of the local work, a stand-in for the rest of a backward pass: the expected
/// all-reduce result for rows `[first, end)` of the `COLS × ROWS` view (its element
/// `(i, j)` is storage index `i + j·COLS`), summed over `size` ranks.
fn expected_rows(size: i32, first: usize, end: usize, out: &mut Vec<f32>) {
    let rank_sum = (0..size).map(|r| r as f32).sum::<f32>();
    for i in first..end {
        out.extend((0..ROWS).map(|j| size as f32 * grad(0, i + j * COLS) + rank_sum));
    }
}

/// Does the work in `chunks`, testing `request` after each chunk (`is_complete`, which does
/// not consume it) until it completes, noting the chunk after which it did in `done_at`;
/// returns the number of tests.
fn work_while_testing<'a, Sc: Scope<'a>>(
    chunks: std::ops::Range<usize>,
    (size, want): (i32, &mut Vec<f32>),
    request: &mut TensorRequest<'a, Sc>,
    done_at: &mut Option<usize>,
) -> dlpack_mpi::Result<usize> {
    let mut tests = 0;
    for chunk in chunks {
        let rows = COLS / CHUNKS;
        expected_rows(size, chunk * rows, (chunk + 1) * rows, want);
        if done_at.is_none() {
            tests += 1;
            if request.is_complete()? {
                *done_at = Some(chunk);
            }
        }
    }
    Ok(tests)
}

/// The first element of `got` that differs from `want`, in words.
fn first_difference(what: &str, got: &[f32], want: &[f32]) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!(
            "{what}: {} elements, expected {}",
            got.len(),
            want.len()
        ));
    }
    let i = got.iter().zip(want).position(|(g, w)| g != w)?;
    Some(format!(
        "{what}: first difference at element {i}: expected {}, got {}",
        want[i], got[i]
    ))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let universe = mpi::initialize().ok_or("MPI was already initialized")?;
    let world = universe.world();
    let (rank, size) = (world.rank(), world.size());

    // Producers: the gradient, row-major storage exported transposed; the result; the
    // parameters, which only the root holds before the broadcast.
    let storage: Vec<f32> = (0..ROWS * COLS).map(|s| grad(rank, s)).collect();
    let gradient =
        Owned::new(storage).with_layout(&[COLS as i64, ROWS as i64], Some(&[1, COLS as i64]), 0)?;
    let sum = Owned::new(vec![f32::NAN; ROWS * COLS]).with_shape(&[COLS as i64, ROWS as i64])?;
    let params = Owned::new(if rank == ROOT {
        (0..PARAMS).map(param).collect()
    } else {
        vec![f32::NAN; PARAMS]
    });

    let mut want = Vec::with_capacity(ROWS * COLS);
    let (tests, done_at, packed) = {
        let opts = AcquireOptions::default();
        let g = acquire(&gradient, &opts)?;
        let mut s = acquire(&sum, &opts)?;
        let mut p = acquire(&params, &opts)?;
        mpi::request::scope(|scope| -> dlpack_mpi::Result<_> {
            // Post: checks both sides, packs the transposed gradient, posts the agreement.
            let mut all_reduce =
                world.immediate_all_reduce_tensor(scope, &g, &mut s, ReduceOp::Sum)?;
            let packed = all_reduce.is_packed();
            let mut done_at = None;
            let work = (size, &mut want);
            let t1 = work_while_testing(0..CHUNKS / 2, work, &mut all_reduce, &mut done_at)?;
            // A second collective, posted while the all-reduce may still be pending: every
            // rank posts it second, so MPI matches it second.
            let broadcast = world.immediate_broadcast_tensor(scope, &mut p, ROOT)?;
            let work = (size, &mut want);
            let t2 = work_while_testing(CHUNKS / 2..CHUNKS, work, &mut all_reduce, &mut done_at)?;
            // Both requests: the all-reduce (its outcome kept if a test completed it) and
            // the broadcast.
            for outcome in wait_all([all_reduce, broadcast]) {
                outcome?;
            }
            Ok((t1 + t2, done_at, packed))
        })?
    }; // The guards drop here, after both requests completed: the deleters run now.

    let wrong = [
        first_difference("all-reduce", sum.into_vec().as_slice(), &want),
        first_difference(
            "broadcast",
            params.into_vec().as_slice(),
            &(0..PARAMS).map(param).collect::<Vec<_>>(),
        ),
        (!packed).then(|| "the transposed gradient was not packed".to_string()),
    ];
    for w in wrong.iter().flatten() {
        eprintln!("overlap: rank {rank}: {w}");
    }
    // Every rank learns whether any rank saw a wrong value, so all exit non-zero together.
    let mine = i32::from(wrong.iter().any(Option::is_some));
    let mut anywhere = 0i32;
    world.all_reduce_into(&mine, &mut anywhere, SystemOperation::max());
    if anywhere != 0 {
        return Err(format!("rank {rank}: a rank saw a wrong result (messages above)").into());
    }

    if rank == 0 {
        let when = match done_at {
            Some(chunk) => format!(
                "completed by the test after chunk {} of {CHUNKS}",
                chunk + 1
            ),
            None => "completed by wait_all".to_string(),
        };
        println!(
            "overlap: OK on {size} ranks (4 MiB all-reduce {when}, {tests} test(s); broadcast)"
        );
    }
    Ok(())
}
