//! The earlier path of the CUDA runtime and exporter (feature `cuda`), deprecated: the GPU
//! runtime is [`crate::runtime::cuda::CudaRuntime`] and the exporter of cudarc's slices
//! and views is [`crate::dlpack::CudaExport`]. Nothing is defined here; hidden from the docs.

/// Deprecated path of [`crate::runtime::cuda::CudaRuntime`].
#[deprecated(note = "use dlpack_mpi::runtime::cuda::CudaRuntime")]
pub type CudaRuntime = crate::runtime::cuda::CudaRuntime;

/// Deprecated path of [`crate::dlpack::CudaExport`].
#[deprecated(note = "use dlpack_mpi::dlpack::CudaExport")]
pub type CudaExport<'a, T> = crate::dlpack::CudaExport<'a, T>;
