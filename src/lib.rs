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
//! - [`mpi_library`]: the MPI library this build was compiled against and the one the
//!   process loaded ([`mpi_library::MpiLibrary::check`]); the operations refuse another
//!   release ([`mpi_library::ensure_matching`], once per process).
//! - [`dtype`]: the DLPack dtype → MPI datatype table and the reductions each allows.
//! - [`layout`]: pure stride arithmetic (contiguity, overlap, spans, ranges).
//! - [`device`]: `DLDevice` → memory kind and routing, and the DLPack stream table.
//! - [`runtime`]: the GPU runtime trait [`runtime::DeviceRuntime`] (consumer streams,
//!   synchronization, pointer checks, pinned buffers, copies), [`runtime::SimulatedRuntime`]
//!   for machines without a GPU, and `runtime::cuda::CudaRuntime` (feature `cuda`, the CUDA
//!   driver through cudarc).
//! - [`dlpack`]: the owning import guard [`dlpack::ManagedTensor`] (legacy and versioned
//!   structs), the non-owning [`dlpack::TensorView`], the [`dlpack::Exporter`] protocol and
//!   built-in exporters (with `CudaExport` for cudarc's `CudaSlice`/`CudaView`, feature
//!   `cuda`).
//! - `python` (feature `python`): acquire tensors from any Python object with `__dlpack__`
//!   (NumPy, ...), and make and read NumPy arrays from Rust.
//! - [`spec`]: `(pointer, count, datatype)` descriptors implementing rsmpi's buffer traits;
//!   [`spec::datatype`] builds and caches the derived datatypes of strided layouts and of
//!   counts beyond MPI's `int`.
//! - `raw` (private): the direct calls of MPI's C API that rsmpi's safe API does not cover.
//! - [`comm`]: [`comm::TensorComm`], checked point-to-point and collective operations on
//!   every rsmpi communicator; [`comm::halfops`], the user-defined MPI reductions for
//!   float16 and bfloat16.
//! - [`checked`]: optional self-describing messages (a dtype/shape header, then the
//!   payload); the receiver validates against the header or allocates from it.
//! - [`transport`]: whether the MPI library is CUDA-aware, and why;
//!   [`transport::DeviceComm`], which routes each tensor directly, through pinned staging
//!   buffers, or as host memory.
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

/// Earlier public paths, each a deprecated item of its own hidden from the docs (Rust
/// ignores `#[deprecated]` on a `pub use`): `fn NAME(ARGS) -> RET` calls the new function,
/// `const NAME: TYPE` and `type NAME` name the new item, with the note `$note`.
macro_rules! old_paths {
    () => {};
    ($note:literal => fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? = $new:path; $($more:tt)*) => {
        #[doc = concat!("Deprecated path of [`", stringify!($new), "`].")]
        ///
        /// # Errors
        /// As the new path's.
        #[deprecated(note = $note)]
        #[doc(hidden)]
        pub fn $name($($arg: $ty),*) $(-> $ret)? {
            $new($($arg),*)
        }
        old_paths!($($more)*);
    };
    ($note:literal => const $name:ident: $ty:ty = $new:path; $($more:tt)*) => {
        #[doc = concat!("Deprecated path of [`", stringify!($new), "`].")]
        #[deprecated(note = $note)]
        #[doc(hidden)]
        pub const $name: $ty = $new;
        old_paths!($($more)*);
    };
    ($note:literal => type $name:ident = $new:path; $($more:tt)*) => {
        #[doc = concat!("Deprecated path of [`", stringify!($new), "`].")]
        #[deprecated(note = $note)]
        #[doc(hidden)]
        pub type $name = $new;
        old_paths!($($more)*);
    };
}

pub mod checked;
pub mod comm;
pub mod device;
pub mod dlpack;
pub mod dtype;
// strum's derives on `Error` (its `kind`) name the deprecated variant `Error::Export`.
#[allow(deprecated)]
pub mod error;
pub mod layout;
mod lifecycle;
pub mod mpi_library;
pub mod prelude;
#[cfg(feature = "python")]
pub mod python;
mod raw;
pub mod runtime;
pub mod settings;
pub mod spec;
pub mod transport;

pub use error::{Error, Result};

// Earlier paths, deprecated and hidden from the docs; each item has one path above. Rust
// ignores `#[deprecated]` on a `pub use`, so each old path is a deprecated item of its own
// (a function calling the new one, a constant, a type alias) that warns where it is used.

/// The earlier path of [`spec::datatype`], deprecated.
#[deprecated(note = "use dlpack_mpi::spec::datatype")]
#[doc(hidden)]
pub mod derived {
    use mpi::ffi::MPI_Datatype;

    use crate::dtype::MpiUnit;
    use crate::error::Result;
    use crate::layout::Axis;

    /// Deprecated path of [`crate::spec::datatype::LARGE_BLOCK_UNITS`].
    #[deprecated(note = "use dlpack_mpi::spec::datatype::LARGE_BLOCK_UNITS")]
    pub const LARGE_BLOCK_UNITS: u64 = crate::spec::datatype::LARGE_BLOCK_UNITS;

    /// Deprecated path of [`crate::spec::datatype::cached_count`].
    #[deprecated(note = "use dlpack_mpi::spec::datatype::cached_count")]
    pub fn cached_count() -> usize {
        crate::spec::datatype::cached_count()
    }

    /// Deprecated path of [`crate::spec::datatype::strided`].
    ///
    /// # Errors
    /// As [`crate::spec::datatype::strided`].
    #[deprecated(note = "use dlpack_mpi::spec::datatype::strided")]
    pub fn strided(unit: MpiUnit, lanes: u16, axes: &[Axis]) -> Result<MPI_Datatype> {
        crate::spec::datatype::strided(unit, lanes, axes)
    }

    /// Deprecated path of [`crate::spec::datatype::large_contiguous`].
    ///
    /// # Errors
    /// As [`crate::spec::datatype::large_contiguous`].
    #[deprecated(note = "use dlpack_mpi::spec::datatype::large_contiguous")]
    pub fn large_contiguous(unit: MpiUnit, units: u64) -> Result<MPI_Datatype> {
        crate::spec::datatype::large_contiguous(unit, units)
    }
}

/// The earlier path of [`comm::halfops`], deprecated.
#[deprecated(note = "use dlpack_mpi::comm::halfops")]
#[doc(hidden)]
pub mod halfops {
    use mpi::ffi::MPI_Op;

    use crate::dtype::{DType, ReduceOp};
    use crate::error::Result;

    /// Deprecated path of [`crate::comm::halfops::is_half`].
    #[deprecated(note = "use dlpack_mpi::comm::halfops::is_half")]
    pub fn is_half(dtype: DType) -> bool {
        crate::comm::halfops::is_half(dtype)
    }

    /// Deprecated path of [`crate::comm::halfops::op`].
    ///
    /// # Errors
    /// As [`crate::comm::halfops::op`].
    #[deprecated(note = "use dlpack_mpi::comm::halfops::op")]
    pub fn op(dtype: DType, op: ReduceOp) -> Result<MPI_Op> {
        crate::comm::halfops::op(dtype, op)
    }
}

/// The earlier path of the CUDA runtime and exporter, deprecated.
#[cfg(feature = "cuda")]
#[deprecated(
    note = "use dlpack_mpi::runtime::cuda::CudaRuntime and dlpack_mpi::dlpack::CudaExport"
)]
#[doc(hidden)]
pub mod cuda;

/// The README's code blocks, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
