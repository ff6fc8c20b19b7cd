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

/// DLPack device type codes (`DLDeviceType`, dlpack.h v1.4: 1–4 and 7–21; 5 and 6 were
/// never assigned). Every code has a name ([`name`](device_type::name)), so a valid code never
/// reads as unknown; only host memory (and CUDA memory through `DeviceComm`) reaches MPI,
/// the others are refused naming their device type.
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
    /// `kDLWebGPU`.
    pub const WEBGPU: u32 = 15;
    /// `kDLHexagon` (Qualcomm Hexagon DSP).
    pub const HEXAGON: u32 = 16;
    /// `kDLMAIA` (Microsoft MAIA).
    pub const MAIA: u32 = 17;
    /// `kDLTrn` (AWS Trainium).
    pub const TRN: u32 = 18;
    /// `kDLTPU` (Google TPU device memory; dlpack.h 1.3).
    pub const TPU: u32 = 19;
    /// `kDLTPUHost` (TPU host memory, owned by the TPU runtime; dlpack.h 1.3).
    pub const TPU_HOST: u32 = 20;
    /// `kDLAscend` (Huawei Ascend NPU; dlpack.h 1.4).
    pub const ASCEND: u32 = 21;

    /// The dlpack.h name of a device type code (`"kDLCPU"`, ...), `None` for a code dlpack.h
    /// does not define.
    pub const fn name(code: u32) -> Option<&'static str> {
        Some(match code {
            CPU => "kDLCPU",
            CUDA => "kDLCUDA",
            CUDA_HOST => "kDLCUDAHost",
            OPENCL => "kDLOpenCL",
            VULKAN => "kDLVulkan",
            METAL => "kDLMetal",
            VPI => "kDLVPI",
            ROCM => "kDLROCM",
            ROCM_HOST => "kDLROCMHost",
            EXT_DEV => "kDLExtDev",
            CUDA_MANAGED => "kDLCUDAManaged",
            ONE_API => "kDLOneAPI",
            WEBGPU => "kDLWebGPU",
            HEXAGON => "kDLHexagon",
            MAIA => "kDLMAIA",
            TRN => "kDLTrn",
            TPU => "kDLTPU",
            TPU_HOST => "kDLTPUHost",
            ASCEND => "kDLAscend",
            _ => return None,
        })
    }

    /// Whether dlpack.h (v1.4) defines `code`.
    pub const fn is_known(code: u32) -> bool {
        name(code).is_some()
    }
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
            MemoryKind::Other => other_refusal(self.device_type),
        };
        Err(Error::UnsupportedDevice {
            device_type: self.device_type,
            device_id: self.device_id,
            reason,
        })
    }
}

/// Why a device type with no path to MPI is refused, naming it (a `'static` reason for
/// [`Error::UnsupportedDevice`]).
fn other_refusal(code: u32) -> &'static str {
    match code {
        device_type::OPENCL => "kDLOpenCL memory has no path to MPI",
        device_type::VULKAN => "kDLVulkan memory has no path to MPI",
        device_type::METAL => "kDLMetal memory has no path to MPI",
        device_type::VPI => "kDLVPI memory has no path to MPI",
        device_type::EXT_DEV => "kDLExtDev memory has no path to MPI",
        device_type::ONE_API => "kDLOneAPI memory has no path to MPI",
        device_type::WEBGPU => "kDLWebGPU memory has no path to MPI",
        device_type::HEXAGON => "kDLHexagon memory has no path to MPI",
        device_type::MAIA => "kDLMAIA memory has no path to MPI",
        device_type::TRN => "kDLTrn (Trainium) memory has no path to MPI",
        device_type::TPU => "kDLTPU (TPU device) memory has no path to MPI",
        device_type::TPU_HOST => {
            "kDLTPUHost memory belongs to the TPU runtime and has no path to MPI"
        }
        device_type::ASCEND => "kDLAscend (Ascend NPU) memory has no path to MPI",
        _ => "this device type is not defined by dlpack.h and has no path to MPI",
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
            device_type::WEBGPU => "webgpu",
            device_type::HEXAGON => "hexagon",
            device_type::MAIA => "maia",
            device_type::TRN => "trn",
            device_type::TPU => "tpu",
            device_type::TPU_HOST => "tpu_host",
            device_type::ASCEND => "ascend",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dlpack_1_4_code_is_named_and_refused_by_name() {
        for code in (1..=4).chain(7..=21) {
            let name = device_type::name(code).unwrap_or_else(|| panic!("{code} unnamed"));
            let d = Device::new(code, 0);
            assert!(!d.to_string().starts_with("device"), "{code}: {d}");
            if d.memory_kind() == MemoryKind::Other {
                let err = d.check_host_accessible().unwrap_err().to_string();
                assert!(err.contains(name), "{code}: {err}");
            }
        }
        for code in [0, 5, 6, 22, u32::MAX] {
            assert!(!device_type::is_known(code), "{code}");
        }
        assert_eq!(device_type::name(19), Some("kDLTPU"));
        assert_eq!(device_type::name(20), Some("kDLTPUHost"));
        assert_eq!(device_type::name(21), Some("kDLAscend"));
    }
}
