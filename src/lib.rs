//! # dlpack-mpi
//!
//! Any DLPack tensor, from any producer, becomes a correct MPI message: zero-copy where the
//! hardware allows, with the producer's memory provably alive until MPI is done with it.
//!
//! Data flows one way:
//!
//! ```text
//! producer ──► acquire ──► describe ──► place ──► spec ──► rsmpi call ──► release
//! (Exporter)   (dlpack)    (dtype,      (device)  (spec)   (comm, or any   (deleter, once,
//!                          layout)                          rsmpi op)       on drop)
//! ```
//!
//! - [`dlpack`]: the owning import guard [`dlpack::ManagedTensor`] (legacy and versioned
//!   structs), the non-owning [`dlpack::TensorView`], the [`dlpack::Exporter`] protocol and
//!   built-in exporters.
//! - [`dtype`]: the DLPack dtype → MPI datatype table and the reductions each allows.
//! - [`layout`]: pure stride arithmetic (contiguity, overlap, spans, ranges).
//! - [`device`]: `DLDevice` → memory kind and routing.
//! - [`spec`]: `(pointer, count, datatype)` descriptors implementing rsmpi's buffer traits.
//! - [`transport`]: whether the MPI library is CUDA-aware, and why; the GPU runtime trait
//!   (with a simulated device for machines without a GPU); [`transport::DeviceComm`], which
//!   routes each tensor directly, through pinned staging buffers, or as host memory.
//! - `cuda` (feature `cuda`): the CUDA driver runtime (cudarc) and an exporter for cudarc's
//!   `CudaSlice`/`CudaView`.
//! - [`comm`]: [`comm::TensorComm`], checked point-to-point and collective operations on
//!   every rsmpi communicator.
//! - `python` (feature `python`): acquire tensors from any Python object with `__dlpack__`
//!   (NumPy, ...), and make and read NumPy arrays from Rust.
//! - [`checked`]: optional self-describing messages (a dtype/shape header, then the
//!   payload); the receiver validates against the header or allocates from it.
//!
//! Every error is an [`Error`] naming the field and value, returned before any MPI call.
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod checked;
pub mod comm;
#[cfg(feature = "cuda")]
pub mod cuda;
/// Committed MPI derived datatypes for strided layouts and for counts beyond MPI's `int`
/// (defined in `spec/datatype.rs`, which documents the type maps; this path stays for
/// existing users).
pub mod derived {
    pub use crate::spec::datatype::{cached_count, large_contiguous, strided, LARGE_BLOCK_UNITS};
}
pub mod device;
pub mod dlpack;
pub mod dtype;
pub mod error;
pub use comm::reduce::halfops;
pub mod layout;
#[cfg(feature = "python")]
pub mod python;
mod raw;
pub mod spec;
pub mod transport;

pub use error::{Error, Result};

/// The README's code blocks, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
