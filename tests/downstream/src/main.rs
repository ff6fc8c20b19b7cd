//! A user's program built on dlpack-mpi from outside its package (a build script of its own
//! only with feature `rpath`, build.rs): an all-reduce of Rust-made tensors, a Fortran-order
//! (strided) send and receive between ranks 0 and 1, and with feature `python` a NumPy array
//! all-reduced, every result checked. Run at 2 ranks by scripts/downstream-test.sh, and by
//! scripts/wheel-mpi-test.sh against the MPI 5 wheels (without a run path it loads another
//! MPI of the same soname, and its first operation must say so); prints one line per part
//! and exits non-zero on any wrong value or error.

use dlpack_mpi::comm::TensorComm;
use dlpack_mpi::dlpack::{acquire, AcquireOptions, Owned};
use dlpack_mpi::dtype::ReduceOp;
use mpi::traits::*;

type Outcome = Result<(), Box<dyn std::error::Error>>;

fn main() {
    if let Err(e) = run() {
        eprintln!("downstream: error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Outcome {
    let universe = mpi::initialize().ok_or("MPI was already initialized")?;
    let world = universe.world();
    all_reduce(&world)?;
    strided(&world)?;
    #[cfg(feature = "python")]
    numpy(&world)?;
    world.barrier();
    if world.rank() == 0 {
        println!("downstream: all parts passed at {} ranks", world.size());
    }
    Ok(())
}

/// f64 all-reduce (sum): element i on rank r is r + i, so the sum is Σr + size·i.
fn all_reduce(world: &impl Communicator) -> Outcome {
    let (rank, size) = (f64::from(world.rank()), f64::from(world.size()));
    let send = Owned::new((0..8).map(|i| rank + f64::from(i)).collect::<Vec<_>>());
    let recv = Owned::new(vec![f64::NAN; 8]);
    let opts = AcquireOptions::default();
    {
        let (s, mut r) = (acquire(&send, &opts)?, acquire(&recv, &opts)?);
        world.all_reduce_tensor(&s, &mut r, ReduceOp::Sum)?;
    }
    let sum_r = size * (size - 1.0) / 2.0;
    let want: Vec<f64> = (0..8).map(|i| sum_r + size * f64::from(i)).collect();
    check("all-reduce f64", &recv.into_vec(), &want)
}

/// Rank 0 sends a 3 × 4 i32 tensor in Fortran order (strides [1, 3]); rank 1 receives it
/// into a C-order tensor: the wire carries logical row-major order, so element (i, j)
/// arrives at i·4 + j.
fn strided(world: &impl Communicator) -> Outcome {
    if world.size() < 2 {
        return Ok(());
    }
    // Storage of the Fortran-order tensor: column-major, value 10·i + j at (i, j).
    let column_major: Vec<i32> = (0..4)
        .flat_map(|j| (0..3).map(move |i| 10 * i + j))
        .collect();
    let want: Vec<i32> = (0..3)
        .flat_map(|i| (0..4).map(move |j| 10 * i + j))
        .collect();
    let opts = AcquireOptions::default();
    match world.rank() {
        0 => {
            let t = Owned::new(column_major).with_layout(&[3, 4], Some(&[1, 3]), 0)?;
            world.send_tensor(&acquire(&t, &opts)?, 1, 7)?;
        }
        1 => {
            let t = Owned::new(vec![-1i32; 12]).with_shape(&[3, 4])?;
            world.recv_tensor(&mut acquire(&t, &opts)?, 0, 7)?;
            check("Fortran-order send", &t.into_vec(), &want)?;
        }
        _ => {}
    }
    Ok(())
}

/// A NumPy float32 array all-reduced through the embedded interpreter: element i on rank r
/// is r·i; the sum is Σr·i. The libpython check comes first, so a wrong loader path fails
/// with the error that names the fix.
#[cfg(feature = "python")]
fn numpy(world: &impl Communicator) -> Outcome {
    use dlpack_mpi::dtype::{code, DType};
    use dlpack_mpi::python;
    use pyo3::Python;

    Python::initialize();
    Python::attach(|py| -> Outcome {
        python::check_libpython(py)?;
        let rank = world.rank() as f32;
        let bytes: Vec<u8> = (0..6)
            .flat_map(|i| (rank * i as f32).to_ne_bytes())
            .collect();
        let send = python::numpy_array(py, DType::new(code::FLOAT, 32), &[2, 3], &bytes)?;
        let recv = python::numpy_array(py, DType::new(code::FLOAT, 32), &[2, 3], &[0u8; 24])?;
        let opts = AcquireOptions::default();
        {
            let s = python::acquire(&send, &opts)?;
            let mut r = python::acquire(&recv, &opts)?;
            world.all_reduce_tensor(&s, &mut r, ReduceOp::Sum)?;
        }
        let got: Vec<f32> = python::numpy_bytes(&recv)?
            .chunks_exact(4)
            .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let size = world.size() as f32;
        let sum_r = size * (size - 1.0) / 2.0;
        let want: Vec<f32> = (0..6).map(|i| sum_r * i as f32).collect();
        check("NumPy all-reduce f32", &got, &want)
    })
}

fn check<T: PartialEq + std::fmt::Debug>(what: &str, got: &[T], want: &[T]) -> Outcome {
    if got != want {
        return Err(format!("{what}: got {got:?}, want {want:?}").into());
    }
    println!("downstream: {what} ok");
    Ok(())
}
