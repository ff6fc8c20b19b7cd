//! CUDA through the driver API (cudarc 0.19, feature `cuda`), gathered under one path for
//! users: the GPU runtime [`CudaRuntime`] (defined in [`crate::runtime::cuda`], below
//! acquisition) and [`CudaExport`], the DLPack exporter of cudarc's `CudaSlice<T>`,
//! `CudaView<T>` and `CudaViewMut<T>` (defined with the other producers in
//! [`crate::dlpack`]). Nothing is defined here.

pub use crate::dlpack::CudaExport;
pub use crate::runtime::cuda::CudaRuntime;
