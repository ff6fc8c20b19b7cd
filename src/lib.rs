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
//! Modules, lowest first; each uses only modules listed before it (docs/ARCHITECTURE.md,
//! dependency order):
//!
//! - [`error`]: the one [`Error`] type.
//! - [`settings`]: every run-time `DLPACK_MPI_*` variable (values, defaults, the function that
//!   reads each and its setter), in one table.
//! - `lifecycle` (private): the one `MPI_Finalize` hook and the registries it empties.
//! - [`dtype`]: the DLPack dtype → MPI datatype table and the reductions each allows.
//! - [`layout`]: pure stride arithmetic (contiguity, overlap, spans, ranges).
//! - [`device`]: `DLDevice` → memory kind and routing, and the DLPack stream table.
//! - [`runtime`]: the GPU runtime trait [`runtime::DeviceRuntime`] (consumer streams,
//!   synchronization, pointer checks, pinned buffers, copies), [`runtime::SimulatedDevice`]
//!   for machines without a GPU, and `runtime::cuda::CudaRuntime` (feature `cuda`, the CUDA
//!   driver through cudarc).
//! - [`dlpack`]: the owning import guard [`dlpack::ManagedTensor`] (legacy and versioned
//!   structs), the non-owning [`dlpack::TensorView`], the [`dlpack::Exporter`] protocol and
//!   built-in exporters (with `CudaExport` for cudarc's `CudaSlice`/`CudaView`, feature
//!   `cuda`).
//! - `python` (feature `python`): acquire tensors from any Python object with `__dlpack__`
//!   (NumPy, ...), and make and read NumPy arrays from Rust.
//! - [`spec`]: `(pointer, count, datatype)` descriptors implementing rsmpi's buffer traits;
//!   [`derived`] builds and caches the derived datatypes of strided layouts and of counts
//!   beyond MPI's `int`.
//! - [`halfops`]: user-defined MPI reductions for float16 and bfloat16.
//! - [`comm`]: [`comm::TensorComm`], checked point-to-point and collective operations on
//!   every rsmpi communicator.
//! - [`checked`]: optional self-describing messages (a dtype/shape header, then the
//!   payload); the receiver validates against the header or allocates from it.
//! - [`transport`]: whether the MPI library is CUDA-aware, and why;
//!   [`transport::DeviceComm`], which routes each tensor directly, through pinned staging
//!   buffers, or as host memory.
//! - `cuda` (feature `cuda`): one path for users to the CUDA runtime and exporter
//!   (`dlpack_mpi::cuda::{CudaRuntime, CudaExport}`), re-exported from `runtime` and
//!   `dlpack`.
//!
//! Every error is an [`Error`] naming the field and value. Argument errors are returned
//! before any MPI call; errors about what arrived or what a peer did ([`Error::Unfit`],
//! [`Error::PeerRefused`], [`Error::SenderAborted`]) after matching a message or agreeing.
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
// The library converts counts between i64 (DLPack shapes, strides and element counts), usize
// (Rust lengths and addresses), u64 (byte spans) and MPI's c_int / MPI_Count / MPI_Aint; an
// `as` cast between them can silently truncate, wrap or drop a sign. These lints (the ones
// rsmpi enables) make every such cast either a checked conversion returning a typed `Error`,
// a lossless `From`, or an `#[allow]` on the smallest item with the proof that it cannot
// truncate. They cover the library only, not the CLI (its own crate root under src/bin).
#![warn(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

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
mod lifecycle;
#[cfg(feature = "python")]
pub mod python;
mod raw;
pub mod runtime;
pub mod settings;
pub mod spec;
pub mod transport;

pub use error::{Error, Result};

/// The README's code blocks, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
