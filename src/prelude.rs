//! What a program that moves tensors over MPI needs in scope, in one `use`, as
//! `mpi::traits::*` is for rsmpi (which it re-exports): the operations ([`TensorComm`], its
//! [`Endpoint`], [`TensorRequest`] and [`wait_all`]), the import of a tensor ([`acquire`],
//! [`acquire_all`], [`AcquireOptions`], the guard [`ManagedTensor`] and what it implements,
//! [`Tensor`], [`TensorList`], [`TensorListMut`]), the producers' trait [`Exporter`] (a
//! `Vec<&dyn Exporter>` is a list of mixed dtypes) and the built-in producer [`Owned`], the
//! reduction operators ([`ReduceOp`]) and the crate's [`Error`] and [`Result`].
//!
//! ```no_run
//! use dlpack_mpi::prelude::*;
//!
//! # fn main() -> Result<()> {
//! let universe = mpi::initialize().unwrap();
//! let world = universe.world();
//! let grads = [Owned::new(vec![1.0f32; 8]), Owned::new(vec![2.0f32; 3])];
//! let mut guards = acquire_all(&grads, &AcquireOptions::default())?;
//! world.all_reduce_tensors_in_place(&mut guards, ReduceOp::Sum)?;
//! # Ok(())
//! # }
//! ```

pub use crate::comm::{wait_all, Endpoint, TensorComm, TensorRequest};
pub use crate::dlpack::{
    acquire, acquire_all, AcquireOptions, Exporter, ManagedTensor, Owned, Tensor, TensorList,
    TensorListMut,
};
pub use crate::dtype::ReduceOp;
pub use crate::error::{Error, Result};
pub use mpi::traits::*;
