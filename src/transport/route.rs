//! The route decision: how one tensor of an operation reaches MPI ([`Route`]), from the
//! transport asked for ([`Transport`]) and the tensor's memory, layout and reduction.

use crate::comm::halfops;
use crate::device::{device_type, Device, MemoryKind};
use crate::dtype::DType;
use crate::error::Error;

/// How device memory reaches MPI, as asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// `Direct` when the MPI library is CUDA-aware ([`super::cuda_awareness`]), else `Staged`.
    #[default]
    Auto,
    /// Device pointers go to MPI (a CUDA-aware MPI is required).
    Direct,
    /// Device memory is copied through pinned host buffers.
    Staged,
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Transport::Auto => "auto",
            Transport::Direct => "direct",
            Transport::Staged => "staged",
        })
    }
}

/// How one tensor of an operation reached MPI.
///
/// [`super::DeviceComm`] decides it per tensor:
///
/// | memory | route | what MPI gets |
/// |---|---|---|
/// | `kDLCPU`, `kDLCUDAHost`, `kDLROCMHost` | [`Route::Host`] | the tensor itself |
/// | `kDLCUDAManaged` | [`Route::Managed`] | the managed pointer (host-accessible once the producer is synchronized, which `acquire` did) |
/// | `kDLCUDA`, MPI CUDA-aware, contiguous, no user-defined reduction | [`Route::Direct`] | the device pointer |
/// | `kDLCUDA`, MPI CUDA-aware, strided with a 2-D copy plan, no user-defined reduction | [`Route::Direct`] | a device scratch buffer holding the elements packed |
/// | any other `kDLCUDA` | [`Route::Staged`] | a pinned host copy of the tensor's elements, packed (strided, with a 2-D copy plan), or of its byte span |
/// | `kDLROCM` and the rest | — | [`Error::UnsupportedDevice`] |
///
/// **Strided device tensors** never reach MPI as a derived datatype over device memory
/// (Open MPI's and MPICH's CUDA paths pack those element by element, and are where
/// CUDA-aware stacks have had bugs). Their elements are copied packed
/// ([`crate::runtime::StridedCopy`]: pitched 2-D copies) into a device scratch buffer that
/// goes to MPI contiguous (direct) or into a pinned buffer (staged), and unpacked after a
/// receive; a layout the 2-D copies cannot express within
/// [`MAX_STRIDED_COPIES`](crate::runtime::strided::MAX_STRIDED_COPIES) copies is staged
/// whole span, as a strided host tensor.
///
/// **Direct exceptions.** float16/bfloat16
/// reductions are staged because their MPI operation is a host function (`halfops`) that
/// cannot read device memory.
///
/// The variants are ordered by how telling they are (host < managed < direct < staged), the
/// order [`super::DeviceComm::last_route`] reports the most telling one of an operation in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Route {
    /// Host memory (pageable or pinned): the tensor itself.
    Host = 1,
    /// CUDA managed memory, handed to MPI as host-accessible memory.
    Managed = 2,
    /// A device pointer handed to a CUDA-aware MPI.
    Direct = 3,
    /// Copied through a pinned host buffer.
    Staged = 4,
}

impl Route {
    pub(super) fn from_u8(v: u8) -> Option<Route> {
        Some(match v {
            1 => Route::Host,
            2 => Route::Managed,
            3 => Route::Direct,
            4 => Route::Staged,
            _ => return None,
        })
    }

    /// The route of a CUDA or CUDA-managed tensor (the table above): `direct` says whether
    /// the `DeviceComm` hands device tensors to MPI, `contiguous_or_packed` whether the
    /// tensor is contiguous or packed by a 2-D copy plan, `reduce` is the dtype of the
    /// reduction the tensor takes part in, if any.
    pub(super) fn of_device_tensor(
        kind: MemoryKind,
        direct: bool,
        contiguous_or_packed: bool,
        reduce: Option<DType>,
    ) -> Route {
        let user_op = reduce.is_some_and(halfops::is_half);
        if kind == MemoryKind::CudaManaged {
            Route::Managed
        } else if direct && contiguous_or_packed && !user_op {
            Route::Direct
        } else {
            Route::Staged
        }
    }
}

impl std::fmt::Display for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Route::Host => "host",
            Route::Managed => "managed",
            Route::Direct => "direct",
            Route::Staged => "staged",
        })
    }
}

const NO_RUNTIME: &str =
    "CUDA memory needs a GPU runtime: build with feature `cuda` on a machine with the CUDA driver";

/// The refusal of device memory when the `DeviceComm` has no GPU runtime.
pub(super) fn no_runtime(device: Device) -> Error {
    Error::UnsupportedDevice {
        device_type: device.device_type,
        device_id: device.device_id,
        reason: NO_RUNTIME,
    }
}

/// [`no_runtime`] where no tensor is at hand (CUDA device 0).
pub(super) fn no_runtime_error() -> Error {
    no_runtime(Device::new(device_type::CUDA, 0))
}
