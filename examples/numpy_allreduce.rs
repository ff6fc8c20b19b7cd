//! All-reduce of NumPy arrays through dlpack-mpi: every rank embeds Python, makes NumPy
//! arrays, acquires them through `__dlpack__` and sums them across ranks; NumPy checks the
//! result. Needs feature `python` and NumPy in the interpreter of PYO3_PYTHON:
//!
//! ```sh
//! PYO3_PYTHON=$(python3 -c 'import sys; print(sys.executable)') \
//!     cargo build --features python --example numpy_allreduce
//! mpirun -n 3 target/debug/examples/numpy_allreduce
//! ```

use dlpack_mpi::comm::TensorComm;
use dlpack_mpi::dlpack::AcquireOptions;
use dlpack_mpi::dtype::ReduceOp;
use dlpack_mpi::python::{self, pyo3};
use mpi::traits::*;
use pyo3::prelude::*;
use pyo3::types::PyDict;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let universe = mpi::initialize().ok_or("MPI was already initialized")?;
    let world = universe.world();
    let (rank, size) = (world.rank(), world.size());
    Python::initialize();
    Python::attach(|py| -> Result<(), Box<dyn std::error::Error>> {
        let np = python::numpy(py)?;
        let g = PyDict::new(py);
        g.set_item("np", &np)?;
        g.set_item("rank", rank)?;
        g.set_item("size", size)?;
        // A float64 vector, and a float32 matrix in Fortran order (sent zero-copy through a
        // derived datatype, reduced through a packed copy).
        py.run(
            c"x = np.arange(1000, dtype=np.float64) * (rank + 1)\n\
              y = np.zeros_like(x)\n\
              m = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4) + rank)\n\
              counts = np.full(5, rank, dtype=np.int32)\n",
            Some(&g),
            None,
        )?;
        let options = AcquireOptions::default();
        {
            let x = python::acquire(&g.get_item("x")?.ok_or("x")?, &options)?;
            let mut y = python::acquire(&g.get_item("y")?.ok_or("y")?, &options)?;
            world.all_reduce_tensor(&x, &mut y, ReduceOp::Sum)?;
            let mut m = python::acquire(&g.get_item("m")?.ok_or("m")?, &options)?;
            world.all_reduce_tensor_in_place(&mut m, ReduceOp::Sum)?;
            let mut counts = python::acquire(&g.get_item("counts")?.ok_or("counts")?, &options)?;
            world.all_reduce_tensor_in_place(&mut counts, ReduceOp::Max)?;
        } // the deleters run here: NumPy gets its arrays back
        let ok: bool = py
            .eval(
                c"np.array_equal(y, np.arange(1000) * size * (size + 1) / 2) and \
                  np.array_equal(m, np.arange(12, dtype=np.float32).reshape(3, 4) * size \
                                    + size * (size - 1) / 2) and \
                  m.flags.f_contiguous and bool((counts == size - 1).all())",
                Some(&g),
                None,
            )?
            .is_truthy()?;
        if !ok {
            return Err(format!(
                "rank {rank}: wrong result: y[:4] = {}, m = {}",
                py.eval(c"y[:4]", Some(&g), None)?,
                py.eval(c"m", Some(&g), None)?
            )
            .into());
        }
        println!(
            "rank {rank}: NumPy {} arrays all-reduced over {size} rank(s): y[999] = {}",
            np.getattr("__version__")?,
            py.eval(c"y[999]", Some(&g), None)?
        );
        Ok(())
    })
}
