//! How device memory reaches MPI: whether the MPI library is CUDA-aware and why we think so
//! ([`cuda_awareness`]), which device each rank uses ([`select_device`], in `gpu_select.rs`:
//! the node-local rank modulo the device count, overridable), and [`DeviceComm`], which
//! routes each tensor of an operation directly, through pinned staging buffers, or as host
//! memory, with a GPU runtime of [`crate::runtime`] ([`crate::runtime::DeviceRuntime`];
//! [`crate::runtime::SimulatedRuntime`] on machines without a GPU).
//!
//! The answer comes from, in this order (docs/ARCHITECTURE.md, "Policies", Routing):
//!
//! 1. the override `DLPACK_MPI_CUDA_AWARE=0|1` (also `false|true`, `no|yes`, `off|on`; read at
//!    each call, see [`crate::settings`]);
//! 2. the MPI library's own run-time query, looked up by symbol name so that one binary works
//!    with any library: Open MPI's `MPIX_Query_cuda_support()` (its `cuda` MPI extension,
//!    `mpi-ext.h`), MPICH's `MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &flag)`, or the
//!    MPI-4.1 info key `mpi_memory_alloc_kinds` of `MPI_INFO_ENV` (§11.4.3) containing `cuda`;
//! 3. otherwise: not CUDA-aware (the safe answer: device memory is staged through host
//!    memory, which works with every MPI library).
//!
//! Open MPI answers its query correctly only after `MPI_Init` (and, for the CUDA part, once a
//! CUDA context exists); call [`cuda_awareness`] after initializing MPI.

use crate::error::Result;
use crate::settings;

// The settings' earlier paths here (`DLPACK_MPI_CUDA_AWARE`, `DLPACK_MPI_DEVICE`: they are in
// `crate::settings`), deprecated.
old_paths! {
    "use dlpack_mpi::settings::parse_cuda_aware" => fn parse_override(value: Option<&str>) -> Result<Option<bool>> = settings::parse_cuda_aware;
    "use dlpack_mpi::settings::CUDA_AWARE_ENV" => const CUDA_AWARE_ENV: &str = settings::CUDA_AWARE_ENV;
    "use dlpack_mpi::settings::parse_device_override" => fn parse_device_override(value: Option<&str>) -> Result<Option<i32>> = settings::parse_device_override;
    "use dlpack_mpi::settings::DEVICE_ENV" => const DEVICE_ENV: &str = settings::DEVICE_ENV;
}

mod bucket;
mod device_comm;
mod gpu_select;
mod parted;
pub mod pipeline;
mod pool;
mod route;
mod stage;

pub use device_comm::DeviceComm;
pub use gpu_select::{select_device, select_device_at, DeviceSelection, DeviceSource, NodeLocal};
pub use pipeline::{
    DEFAULT_PIPELINE_CHUNK_BYTES, MAX_PIPELINE_CHUNK_BYTES, MIN_PIPELINE_CHUNK_BYTES,
};
pub use pool::{MAX_POOLED_BYTES, MAX_POOLED_DEVICE_BYTES};
pub use route::{Route, Transport};

// The GPU runtime's items once had paths here; they live in `crate::runtime` (below
// acquisition). The old paths stay for existing users, deprecated and hidden from the docs;
// the trait `DeviceRuntime` cannot stay (Rust ignores `#[deprecated]` on a `pub use` and has
// no trait aliases): import it from `dlpack_mpi::runtime`.

/// Deprecated path of [`crate::runtime::SimulatedRuntime`] (once `transport::SimulatedDevice`).
#[deprecated(note = "use dlpack_mpi::runtime::SimulatedRuntime")]
#[doc(hidden)]
pub type SimulatedDevice = crate::runtime::SimulatedRuntime;

/// Deprecated path of [`crate::runtime::RuntimeCall`].
#[deprecated(note = "use dlpack_mpi::runtime::RuntimeCall")]
#[doc(hidden)]
pub type RuntimeCall = crate::runtime::RuntimeCall;

/// Deprecated path of [`crate::runtime::default_runtime`].
#[deprecated(note = "use dlpack_mpi::runtime::default_runtime")]
#[doc(hidden)]
pub fn default_runtime() -> Option<&'static dyn crate::runtime::DeviceRuntime> {
    crate::runtime::default_runtime()
}

/// Which source decided [`CudaAwareness::aware`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AwarenessSource {
    /// The `DLPACK_MPI_CUDA_AWARE` environment variable.
    Environment,
    /// Open MPI's `MPIX_Query_cuda_support()`.
    OpenMpiQuery,
    /// MPICH's `MPIX_GPU_query_support()`.
    MpichQuery,
    /// The MPI-4.1 info key `mpi_memory_alloc_kinds` of `MPI_INFO_ENV`.
    MemoryAllocKinds,
    /// No source answered; not CUDA-aware is assumed.
    Default,
}

/// Whether the MPI library takes CUDA device pointers, and which source said so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaAwareness {
    /// `true`: device pointers may be handed to MPI directly.
    pub aware: bool,
    /// Who decided.
    pub source: AwarenessSource,
}

impl std::fmt::Display for CudaAwareness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let answer = if self.aware { "yes" } else { "no" };
        let why = match self.source {
            AwarenessSource::Environment => format!("set by {}", settings::CUDA_AWARE_ENV),
            AwarenessSource::OpenMpiQuery => "Open MPI's MPIX_Query_cuda_support()".into(),
            AwarenessSource::MpichQuery => "MPICH's MPIX_GPU_query_support()".into(),
            AwarenessSource::MemoryAllocKinds => {
                "MPI_INFO_ENV key mpi_memory_alloc_kinds (MPI-4.1)".into()
            }
            AwarenessSource::Default => {
                "the MPI library offers no query; assumed not CUDA-aware".into()
            }
        };
        write!(f, "{answer} ({why})")
    }
}

extern "C" {
    fn dlpack_mpi_query_cuda_aware(source: *mut std::ffi::c_int) -> std::ffi::c_int;
}

/// Asks the MPI library itself (step 2 of the module docs), ignoring the override.
pub fn query_library() -> CudaAwareness {
    let mut source: std::ffi::c_int = 0;
    // SAFETY: the shim only writes through `source`, a valid pointer to a local, and calls
    // MPI functions that are safe before and after `MPI_Init` (it checks `MPI_Initialized`
    // before the info query).
    let answer = unsafe { dlpack_mpi_query_cuda_aware(&mut source) };
    let source = match source {
        1 => AwarenessSource::OpenMpiQuery,
        2 => AwarenessSource::MpichQuery,
        3 => AwarenessSource::MemoryAllocKinds,
        _ => AwarenessSource::Default,
    };
    CudaAwareness {
        aware: answer == 1,
        source,
    }
}

/// Whether the MPI library is CUDA-aware: the override first, then the library's query.
///
/// # Errors
/// [`Error::InvalidSetting`](crate::Error::InvalidSetting) when `DLPACK_MPI_CUDA_AWARE`
/// holds an unreadable value (it is not silently ignored: a typo would otherwise send device
/// pointers to a library that cannot read them, or stage needlessly).
pub fn cuda_awareness() -> Result<CudaAwareness> {
    // A value that is not UTF-8 is refused by name too (lossily shown), never read as unset.
    Ok(match crate::settings::cuda_aware_override()? {
        Some(aware) => CudaAwareness {
            aware,
            source: AwarenessSource::Environment,
        },
        None => query_library(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_says_answer_and_source() {
        let env = CudaAwareness {
            aware: true,
            source: AwarenessSource::Environment,
        };
        assert_eq!(env.to_string(), "yes (set by DLPACK_MPI_CUDA_AWARE)");
        let none = CudaAwareness {
            aware: false,
            source: AwarenessSource::Default,
        };
        assert!(none
            .to_string()
            .starts_with("no (the MPI library offers no query"));
    }
}
