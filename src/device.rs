//! `DLDevice` → memory kind, and which kinds this build can hand to MPI.
//!
//! DLPack's `DLDeviceType` (dlpack.h) says where the bytes live. For MPI the question is
//! whether the host may read and write them: plain CPU memory and page-locked host memory
//! (`kDLCUDAHost`, `kDLROCMHost`: "pinned CUDA CPU memory by cudaMallocHost") are host
//! memory; device memory (`kDLCUDA`, `kDLROCM`) needs a CUDA-aware MPI or staging; managed
//! memory (`kDLCUDAManaged`) is host-accessible once the producer's work is synchronized.
//!
//! It also holds the DLPack stream table ([`NO_SYNC_STREAM`], [`CUDA_LEGACY_DEFAULT_STREAM`],
//! [`CUDA_PER_THREAD_DEFAULT_STREAM`], [`ROCM_DEFAULT_STREAM`]): stream values are a property
//! of the device kind, read by both the GPU runtime ([`crate::runtime`]) and acquisition
//! ([`crate::dlpack`], which re-exports them).

use std::fmt;

use crate::error::{Error, Result};

/// DLPack device type codes (`DLDeviceType`, dlpack.h v1.3).
pub mod device_type {
    /// `kDLCPU`.
    pub const CPU: u32 = 1;
    /// `kDLCUDA`.
    pub const CUDA: u32 = 2;
    /// `kDLCUDAHost` (pinned host memory).
    pub const CUDA_HOST: u32 = 3;
    /// `kDLOpenCL`.
    pub const OPENCL: u32 = 4;
    /// `kDLVulkan`.
    pub const VULKAN: u32 = 7;
    /// `kDLMetal`.
    pub const METAL: u32 = 8;
    /// `kDLVPI`.
    pub const VPI: u32 = 9;
    /// `kDLROCM`.
    pub const ROCM: u32 = 10;
    /// `kDLROCMHost` (pinned host memory).
    pub const ROCM_HOST: u32 = 11;
    /// `kDLExtDev`.
    pub const EXT_DEV: u32 = 12;
    /// `kDLCUDAManaged` (unified memory).
    pub const CUDA_MANAGED: u32 = 13;
    /// `kDLOneAPI`.
    pub const ONE_API: u32 = 14;
}

/// Why CUDA memory is refused where host memory is needed: it goes through `DeviceComm`,
/// whose GPU runtime this build has (feature `cuda`) or lacks.
const CUDA_NOT_HOST: &str = if cfg!(feature = "cuda") {
    "CUDA memory is not host memory: send it with transport::DeviceComm, not TensorComm"
} else {
    "CUDA memory is not host memory: send it with transport::DeviceComm (with a GPU \
     runtime: feature `cuda`), not TensorComm"
};

/// The DLPack stream table: the values of the `stream` argument of `__dlpack__` (array API,
/// "Data interchange mechanisms"; dlpack.h). Any other CUDA value is a `cudaStream_t`
/// handle; CUDA `0` is disallowed (ambiguous between the legacy and the per-thread stream)
/// and never sent.
///
/// Stream value `-1`: "the consumer does not want the producer to synchronize" (DLPack).
pub const NO_SYNC_STREAM: isize = -1;
/// CUDA stream value `1`: the legacy default stream.
pub const CUDA_LEGACY_DEFAULT_STREAM: isize = 1;
/// CUDA stream value `2`: the per-thread default stream.
pub const CUDA_PER_THREAD_DEFAULT_STREAM: isize = 2;
/// ROCm stream value `0`: the default stream.
pub const ROCM_DEFAULT_STREAM: isize = 0;

/// A DLPack device, `DLDevice { device_type, device_id }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Device {
    /// `DLDevice::device_type` (see [`device_type`]).
    pub device_type: u32,
    /// `DLDevice::device_id`: the ordinal; 0 for CPU, pinned and managed memory.
    pub device_id: i32,
}

impl Device {
    /// The CPU, `(kDLCPU, 0)`.
    pub const CPU: Device = Device {
        device_type: device_type::CPU,
        device_id: 0,
    };

    /// A device from its two DLPack fields.
    pub const fn new(device_type: u32, device_id: i32) -> Self {
        Device {
            device_type,
            device_id,
        }
    }

    /// The memory kind of this device type.
    #[inline]
    pub fn memory_kind(self) -> MemoryKind {
        match self.device_type {
            device_type::CPU => MemoryKind::Host,
            device_type::CUDA_HOST | device_type::ROCM_HOST => MemoryKind::PinnedHost,
            device_type::CUDA => MemoryKind::Cuda,
            device_type::CUDA_MANAGED => MemoryKind::CudaManaged,
            device_type::ROCM => MemoryKind::Rocm,
            _ => MemoryKind::Other,
        }
    }

    /// Whether the host may read and write this memory directly, as `TensorComm`, the specs
    /// and [`crate::dlpack::Tensor::as_slice`] need: host and pinned host memory pass;
    /// everything else is refused. CUDA device and managed memory reach MPI through
    /// `transport::DeviceComm` instead, which routes it directly or stages it with a GPU
    /// runtime ([`crate::runtime`]).
    ///
    /// # Errors
    /// [`Error::UnsupportedDevice`] naming the device type and id, and for CUDA memory the
    /// type that takes it.
    #[inline]
    pub fn check_host_accessible(self) -> Result<()> {
        let reason = match self.memory_kind() {
            MemoryKind::Host | MemoryKind::PinnedHost => return Ok(()),
            MemoryKind::Cuda | MemoryKind::CudaManaged => CUDA_NOT_HOST,
            MemoryKind::Rocm => "ROCm device memory has no path to MPI in this build",
            MemoryKind::Other => "this device type has no path to MPI",
        };
        Err(Error::UnsupportedDevice {
            device_type: self.device_type,
            device_id: self.device_id,
            reason,
        })
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.device_type {
            device_type::CPU => "cpu",
            device_type::CUDA => "cuda",
            device_type::CUDA_HOST => "cuda_host",
            device_type::OPENCL => "opencl",
            device_type::VULKAN => "vulkan",
            device_type::METAL => "metal",
            device_type::VPI => "vpi",
            device_type::ROCM => "rocm",
            device_type::ROCM_HOST => "rocm_host",
            device_type::EXT_DEV => "ext_dev",
            device_type::CUDA_MANAGED => "cuda_managed",
            device_type::ONE_API => "oneapi",
            _ => return write!(f, "device{}:{}", self.device_type, self.device_id),
        };
        write!(f, "{name}:{}", self.device_id)
    }
}

impl From<dlpack_rs::ffi::DLDevice> for Device {
    #[inline]
    fn from(d: dlpack_rs::ffi::DLDevice) -> Self {
        Device::new(d.device_type, d.device_id)
    }
}

impl From<Device> for dlpack_rs::ffi::DLDevice {
    fn from(d: Device) -> Self {
        dlpack_rs::ffi::DLDevice {
            device_type: d.device_type,
            device_id: d.device_id,
        }
    }
}

/// Where a tensor's bytes live, as far as MPI is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemoryKind {
    /// Pageable host memory (`kDLCPU`).
    Host,
    /// Page-locked host memory (`kDLCUDAHost`, `kDLROCMHost`): host memory for MPI.
    PinnedHost,
    /// CUDA device memory (`kDLCUDA`).
    Cuda,
    /// CUDA managed memory (`kDLCUDAManaged`).
    CudaManaged,
    /// ROCm device memory (`kDLROCM`).
    Rocm,
    /// Any other device type: no path to MPI.
    Other,
}

impl MemoryKind {
    /// Whether the DLPack stream protocol applies (CUDA and ROCm device/managed memory):
    /// the consumer passes a stream to `__dlpack__` and orders its work after the producer's.
    #[inline]
    pub fn uses_streams(self) -> bool {
        matches!(
            self,
            MemoryKind::Cuda | MemoryKind::CudaManaged | MemoryKind::Rocm
        )
    }
}
