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
//! ([`crate::dlpack`]).
//!
//! What the crate knows about each of the 19 `DLDeviceType` codes (its dlpack.h name, its
//! short name, its memory kind, why it is refused where host memory is needed) is one row of
//! one table, which every function here reads.

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
        match super::row(code) {
            Some(row) => Some(row.name),
            None => None,
        }
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

/// One DLPack device type code and everything this crate says about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Row {
    /// The `DLDeviceType` code.
    code: u32,
    /// Its dlpack.h name (`kDLCPU`, ...): [`device_type::name`].
    name: &'static str,
    /// Its short name in [`Device`]'s `Display` (`cpu:0`, ...).
    display: &'static str,
    /// Where its bytes live: [`Device::memory_kind`].
    kind: MemoryKind,
    /// Why [`Device::check_host_accessible`] refuses it; `None`: host memory, accepted.
    refusal: Option<&'static str>,
}

/// The row of a device type with no path to MPI (memory kind `Other`), refused for `reason`.
const fn no_path(
    code: u32,
    name: &'static str,
    display: &'static str,
    reason: &'static str,
) -> Row {
    Row {
        code,
        name,
        display,
        kind: MemoryKind::Other,
        refusal: Some(reason),
    }
}

/// The 19 device type codes of dlpack.h v1.4, in code order: the one table that
/// [`device_type::name`], [`Device::memory_kind`], [`Device::check_host_accessible`] and
/// `Display` read.
const ROWS: [Row; 19] = {
    use device_type as t;
    [
        Row {
            code: t::CPU,
            name: "kDLCPU",
            display: "cpu",
            kind: MemoryKind::Host,
            refusal: None,
        },
        Row {
            code: t::CUDA,
            name: "kDLCUDA",
            display: "cuda",
            kind: MemoryKind::Cuda,
            refusal: Some(CUDA_NOT_HOST),
        },
        Row {
            code: t::CUDA_HOST,
            name: "kDLCUDAHost",
            display: "cuda_host",
            kind: MemoryKind::PinnedHost,
            refusal: None,
        },
        no_path(
            t::OPENCL,
            "kDLOpenCL",
            "opencl",
            "kDLOpenCL memory has no path to MPI",
        ),
        no_path(
            t::VULKAN,
            "kDLVulkan",
            "vulkan",
            "kDLVulkan memory has no path to MPI",
        ),
        no_path(
            t::METAL,
            "kDLMetal",
            "metal",
            "kDLMetal memory has no path to MPI",
        ),
        no_path(t::VPI, "kDLVPI", "vpi", "kDLVPI memory has no path to MPI"),
        Row {
            code: t::ROCM,
            name: "kDLROCM",
            display: "rocm",
            kind: MemoryKind::Rocm,
            refusal: Some("ROCm device memory has no path to MPI in this build"),
        },
        Row {
            code: t::ROCM_HOST,
            name: "kDLROCMHost",
            display: "rocm_host",
            kind: MemoryKind::PinnedHost,
            refusal: None,
        },
        no_path(
            t::EXT_DEV,
            "kDLExtDev",
            "ext_dev",
            "kDLExtDev memory has no path to MPI",
        ),
        Row {
            code: t::CUDA_MANAGED,
            name: "kDLCUDAManaged",
            display: "cuda_managed",
            kind: MemoryKind::CudaManaged,
            refusal: Some(CUDA_NOT_HOST),
        },
        no_path(
            t::ONE_API,
            "kDLOneAPI",
            "oneapi",
            "kDLOneAPI memory has no path to MPI",
        ),
        no_path(
            t::WEBGPU,
            "kDLWebGPU",
            "webgpu",
            "kDLWebGPU memory has no path to MPI",
        ),
        no_path(
            t::HEXAGON,
            "kDLHexagon",
            "hexagon",
            "kDLHexagon memory has no path to MPI",
        ),
        no_path(
            t::MAIA,
            "kDLMAIA",
            "maia",
            "kDLMAIA memory has no path to MPI",
        ),
        no_path(
            t::TRN,
            "kDLTrn",
            "trn",
            "kDLTrn (Trainium) memory has no path to MPI",
        ),
        no_path(
            t::TPU,
            "kDLTPU",
            "tpu",
            "kDLTPU (TPU device) memory has no path to MPI",
        ),
        no_path(
            t::TPU_HOST,
            "kDLTPUHost",
            "tpu_host",
            "kDLTPUHost memory belongs to the TPU runtime and has no path to MPI",
        ),
        no_path(
            t::ASCEND,
            "kDLAscend",
            "ascend",
            "kDLAscend (Ascend NPU) memory has no path to MPI",
        ),
    ]
};

/// Why a code dlpack.h does not define is refused.
const UNKNOWN_REFUSAL: &str = "this device type is not defined by dlpack.h and has no path to MPI";

/// The row of `code`, `None` for a code dlpack.h does not define. A linear scan: host memory
/// (`kDLCPU`) is the first row, the others are at most 19 comparisons.
const fn row(code: u32) -> Option<&'static Row> {
    let mut i = 0;
    while i < ROWS.len() {
        if ROWS[i].code == code {
            return Some(&ROWS[i]);
        }
        i += 1;
    }
    None
}

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
        match row(self.device_type) {
            Some(row) => row.kind,
            None => MemoryKind::Other,
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
        let reason = match row(self.device_type) {
            Some(Row { refusal: None, .. }) => return Ok(()),
            Some(Row {
                refusal: Some(reason),
                ..
            }) => reason,
            None => UNKNOWN_REFUSAL,
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
        match row(self.device_type) {
            Some(row) => write!(f, "{}:{}", row.display, self.device_id),
            None => write!(f, "device{}:{}", self.device_type, self.device_id),
        }
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
    use dlpack_rs::ffi::DLDeviceType as dl;

    /// Every row round-trips: its code finds it, and each function answers from it (name,
    /// memory kind, `Display`, the refusal with its code and id, `DLDevice` and back).
    #[test]
    fn every_row_round_trips() {
        for r in &ROWS {
            let what = r.name;
            assert_eq!(row(r.code), Some(r), "{what}");
            assert_eq!(device_type::name(r.code), Some(r.name), "{what}");
            assert!(device_type::is_known(r.code), "{what}");
            let d = Device::new(r.code, 3);
            assert_eq!(d.memory_kind(), r.kind, "{what}");
            assert_eq!(d.to_string(), format!("{}:3", r.display), "{what}");
            assert_eq!(Device::from(dlpack_rs::ffi::DLDevice::from(d)), d, "{what}");
            let want = r.refusal.map(|reason| Error::UnsupportedDevice {
                device_type: r.code,
                device_id: 3,
                reason,
            });
            assert_eq!(d.check_host_accessible().err(), want, "{what}");
            // Accepted exactly when the host reads the memory directly.
            let host = matches!(r.kind, MemoryKind::Host | MemoryKind::PinnedHost);
            assert_eq!(r.refusal.is_none(), host, "{what}");
            // A type with no path to MPI is refused by its dlpack.h name.
            if r.kind == MemoryKind::Other {
                assert!(r.refusal.is_some_and(|m| m.starts_with(r.name)), "{what}");
            }
        }
    }

    /// The table holds dlpack.h v1.4's codes (1-4, 7-21) once each, in code order, under the
    /// header's names (dlpack-rs's bindings up to 20; `kDLAscend` = 21 is dlpack.h 1.4), and
    /// no two rows share a name or a display name.
    #[test]
    fn table_is_dlpack_1_4_once() {
        let header = [
            (dl::kDLCPU, "kDLCPU"),
            (dl::kDLCUDA, "kDLCUDA"),
            (dl::kDLCUDAHost, "kDLCUDAHost"),
            (dl::kDLOpenCL, "kDLOpenCL"),
            (dl::kDLVulkan, "kDLVulkan"),
            (dl::kDLMetal, "kDLMetal"),
            (dl::kDLVPI, "kDLVPI"),
            (dl::kDLROCM, "kDLROCM"),
            (dl::kDLROCMHost, "kDLROCMHost"),
            (dl::kDLExtDev, "kDLExtDev"),
            (dl::kDLCUDAManaged, "kDLCUDAManaged"),
            (dl::kDLOneAPI, "kDLOneAPI"),
            (dl::kDLWebGPU, "kDLWebGPU"),
            (dl::kDLHexagon, "kDLHexagon"),
            (dl::kDLMAIA, "kDLMAIA"),
            (dl::kDLTrn, "kDLTrn"),
            (dl::kDLTPU, "kDLTPU"),
            (dl::kDLTPUHost, "kDLTPUHost"),
            (21, "kDLAscend"),
        ];
        let rows: Vec<(u32, &str)> = ROWS.iter().map(|r| (r.code, r.name)).collect();
        assert_eq!(rows, header);
        let codes: Vec<u32> = (1..=4).chain(7..=21).collect();
        assert_eq!(rows.iter().map(|r| r.0).collect::<Vec<_>>(), codes);
        let mut displays: Vec<&str> = ROWS.iter().map(|r| r.display).collect();
        displays.sort_unstable();
        displays.dedup();
        assert_eq!(displays.len(), ROWS.len());
    }

    /// A code dlpack.h does not define has no row: no name, memory kind `Other`, refused as
    /// undefined, shown by its number.
    #[test]
    fn undefined_codes_have_no_row() {
        for code in [0, 5, 6, 22, u32::MAX] {
            assert_eq!(row(code), None, "{code}");
            assert!(!device_type::is_known(code), "{code}");
            let d = Device::new(code, 1);
            assert_eq!(d.memory_kind(), MemoryKind::Other, "{code}");
            assert_eq!(d.to_string(), format!("device{code}:1"));
            assert_eq!(
                d.check_host_accessible(),
                Err(Error::UnsupportedDevice {
                    device_type: code,
                    device_id: 1,
                    reason: UNKNOWN_REFUSAL,
                })
            );
        }
    }
}
