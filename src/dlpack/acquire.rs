//! The producer protocol: [`Exporter`] and the consumer's [`acquire`].
//!
//! This mirrors the Python array API's `__dlpack__` / `__dlpack_device__` pair
//! (array-api, "Data interchange mechanisms"): the consumer may ask the producer for its
//! device, then requests the tensor with a stream argument chosen from that device, and the
//! producer orders its pending work before that stream.
//!
//! Decided policies (docs/ARCHITECTURE.md):
//! - **Device query** ([`DeviceQuery`]). By default a missing device query is allowed: the
//!   tensor is requested *without* a stream and the device in the returned `DLTensor`
//!   decides the routing (CASES C53). `DeviceQuery::Required` makes it an error (C54).
//! - **Streams** ([`StreamPolicy`]). Host devices get no stream (C50). For CUDA and ROCm the
//!   default `Synchronize` hands the producer the consumer's stream, which the consumer
//!   synchronizes before MPI reads the pointer; `Unsynchronized` passes `-1` (the caller
//!   promises the data is ready). Values follow the DLPack stream table
//!   ([`crate::device::NO_SYNC_STREAM`] and its neighbours): CUDA `1` = legacy default
//!   stream, `2` = per-thread default stream, `0` is disallowed (ambiguous) and never sent
//!   (C51); ROCm `0` = default stream, `1` and `2` never sent (C52).
//!
//! The GPU work (consumer streams, synchronization) goes through [`crate::runtime`], which
//! sits below this module.

use super::{ManagedTensor, Tensor, MAJOR_VERSION, MINOR_VERSION};
use crate::device::{
    Device, MemoryKind, CUDA_LEGACY_DEFAULT_STREAM, NO_SYNC_STREAM, ROCM_DEFAULT_STREAM,
};
use crate::error::{Error, Result};
use crate::runtime::{default_runtime, DeviceRuntime};

/// What the consumer asks the producer for: the arguments of `__dlpack__`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportRequest {
    /// `stream`: `None` for host devices and when the device is unknown; otherwise a stream
    /// value from the DLPack table (see the module docs) that the producer must order its
    /// work before.
    pub stream: Option<isize>,
    /// `max_version`: the highest DLPack version the consumer reads, `(1, minor)`.
    pub max_version: (u32, u32),
    /// `copy`: `Some(false)` — this consumer never asks for a copy (a copy received into
    /// would be lost).
    pub copy: Option<bool>,
    /// `dl_device`: the device the consumer wants the tensor on; `None` = where it is.
    pub dl_device: Option<Device>,
}

impl Default for ExportRequest {
    fn default() -> Self {
        ExportRequest {
            stream: None,
            max_version: (MAJOR_VERSION, MINOR_VERSION),
            copy: Some(false),
            dl_device: None,
        }
    }
}

/// A DLPack producer: the Rust form of `__dlpack__` and `__dlpack_device__`.
///
/// Exported tensors borrow the exporter (`ManagedTensor<'_>`), so the exporter outlives
/// every tensor it hands out. Like `__dlpack__`, one exporter may hand out several tensors
/// that view the same memory; the consumer must not receive into two of them at once.
pub trait Exporter {
    /// `__dlpack_device__`: the device of the tensor that [`Exporter::dlpack`] would return,
    /// or `None` when the exporter does not implement the query.
    fn dlpack_device(&self) -> Option<Device> {
        None
    }

    /// `__dlpack__`: hands out a managed tensor honouring `request`.
    ///
    /// # Errors
    /// Whatever the producer refuses: the variant that names the refusal where one fits
    /// ([`Error::UnsupportedDevice`], [`Error::Allocation`], …; the built-in exporters:
    /// [`Error::StorageBusy`] while earlier exports hold the storage), else
    /// [`Error::ExportRefused`] naming the exporter and why.
    fn dlpack(&self, request: &ExportRequest) -> Result<ManagedTensor<'_>>;
}

/// Whether the consumer requires the producer to answer the device query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceQuery {
    /// A missing query is allowed: the tensor is requested without a stream and the device
    /// in the returned tensor decides routing (mpi4py's reading).
    #[default]
    Optional,
    /// A missing query is [`Error::MissingDeviceQuery`] (the strict reading of the array
    /// API, where `__dlpack__` and `__dlpack_device__` come in pairs).
    Required,
}

/// How the producer's pending work is ordered before MPI reads the pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamPolicy {
    /// Pass a consumer stream to the producer and synchronize it before MPI touches the
    /// pointer (correct by default). `stream: None` uses the consumer's own stream; in a
    /// build without GPU support that is the device's default stream (CUDA legacy default
    /// `1`, ROCm `0`).
    Synchronize {
        /// A stream value from the DLPack table (never `0` for CUDA).
        stream: Option<isize>,
    },
    /// Pass `-1`: the caller promises the data is ready.
    Unsynchronized,
}

impl Default for StreamPolicy {
    fn default() -> Self {
        StreamPolicy::Synchronize { stream: None }
    }
}

/// Options of [`acquire`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AcquireOptions {
    /// Device-query policy.
    pub device_query: DeviceQuery,
    /// Stream policy.
    pub stream: StreamPolicy,
}

impl AcquireOptions {
    /// The stream value to request for a tensor on `device` (`None` when the device is
    /// unknown or host memory).
    ///
    /// # Errors
    /// [`Error::UnsupportedDevice`] when a user-given CUDA stream is `0` (disallowed by the
    /// DLPack stream table: it is ambiguous between the legacy and per-thread streams).
    pub fn stream_for(&self, device: Option<Device>) -> Result<Option<isize>> {
        let Some(device) = device else {
            return Ok(None);
        };
        let kind = device.memory_kind();
        if !kind.uses_streams() {
            return Ok(None);
        }
        let is_rocm = kind == MemoryKind::Rocm;
        match self.stream {
            StreamPolicy::Unsynchronized => Ok(Some(NO_SYNC_STREAM)),
            StreamPolicy::Synchronize { stream: Some(0) } if !is_rocm => {
                Err(Error::UnsupportedDevice {
                    device_type: device.device_type,
                    device_id: device.device_id,
                    reason: "CUDA stream 0 is disallowed by DLPack (ambiguous); use 1 or 2",
                })
            }
            StreamPolicy::Synchronize { stream: Some(s) } => Ok(Some(s)),
            StreamPolicy::Synchronize { stream: None } => Ok(Some(if is_rocm {
                ROCM_DEFAULT_STREAM
            } else {
                CUDA_LEGACY_DEFAULT_STREAM
            })),
        }
    }
}

impl AcquireOptions {
    /// [`AcquireOptions::stream_for`], with `runtime` owning the consumer stream of CUDA
    /// devices under `Synchronize { stream: None }`.
    ///
    /// # Errors
    /// As [`AcquireOptions::stream_for`]; [`Error::Cuda`] when the runtime cannot make its
    /// stream.
    pub fn stream_with_runtime(
        &self,
        device: Option<Device>,
        runtime: Option<&dyn DeviceRuntime>,
    ) -> Result<Option<isize>> {
        match (device, runtime, self.stream) {
            (Some(d), Some(rt), StreamPolicy::Synchronize { stream: None })
                if matches!(d.memory_kind(), MemoryKind::Cuda | MemoryKind::CudaManaged) =>
            {
                rt.consumer_stream(d).map(Some)
            }
            _ => self.stream_for(device),
        }
    }
}

/// The consumer side of the protocol: query the device (if the exporter answers), request
/// the tensor with the stream the policy picks, check the returned device, and order the
/// producer's work before MPI.
///
/// # Errors
/// [`Error::MissingDeviceQuery`] under [`DeviceQuery::Required`] when the exporter has no
/// device query; [`Error::DeviceMismatch`] when the tensor is not on the device the exporter
/// reported; [`Error::UnsupportedDevice`] for a device-memory tensor under
/// [`StreamPolicy::Synchronize`] in a build that cannot synchronize it; the exporter's own
/// errors. In every case a tensor that was handed out has been released.
///
/// # Examples
/// ```
/// use dlpack_mpi::dlpack::{acquire, AcquireOptions, Tensor};
/// let data = [1.5f64, 2.5];
/// let t = acquire(&data[..], &AcquireOptions::default())?;
/// assert!(t.is_read_only()); // exported from a shared borrow
/// # Ok::<(), dlpack_mpi::Error>(())
/// ```
pub fn acquire<'e, E: Exporter + ?Sized>(
    exporter: &'e E,
    options: &AcquireOptions,
) -> Result<ManagedTensor<'e>> {
    acquire_with_runtime(exporter, options, default_runtime())
}

/// [`acquire`] of every exporter of `exporters`, in order: the list of guards a fused
/// collective takes as it is ([`crate::dlpack::TensorListMut`]). Exporters of different types
/// (and dtypes) go as `&dyn Exporter`: pass a `Vec<&dyn Exporter>` by value, or
/// `list.iter().copied()`.
///
/// ```
/// use dlpack_mpi::dlpack::{acquire_all, AcquireOptions, Exporter, Owned, Tensor};
/// use half::bf16;
/// let (w, b) = (Owned::new(vec![0.5f32; 6]), Owned::new(vec![bf16::ZERO; 3]));
/// let mixed: Vec<&dyn Exporter> = vec![&w, &b];
/// let guards = acquire_all(mixed, &AcquireOptions::default())?;
/// assert_eq!(guards[1].num_elements(), 3);
/// # Ok::<(), dlpack_mpi::Error>(())
/// ```
///
/// # Errors
/// [`Error::Member`] around the first exporter's refusal (what [`acquire`] returns), naming
/// its index; the guards acquired before it are released.
pub fn acquire_all<'e, E: Exporter + ?Sized + 'e>(
    exporters: impl IntoIterator<Item = &'e E>,
    options: &AcquireOptions,
) -> Result<Vec<ManagedTensor<'e>>> {
    let member = |index| {
        move |e| Error::Member {
            index,
            source: Box::new(e),
        }
    };
    (exporters.into_iter().enumerate())
        .map(|(i, e)| acquire(e, options).map_err(member(i)))
        .collect()
}

/// [`acquire`] with an explicit GPU runtime (`None`: device tensors under
/// `Synchronize` are refused). Under [`StreamPolicy::Synchronize`] `{ stream: None }` the
/// producer of a CUDA tensor is handed the runtime's own consumer stream
/// ([`DeviceRuntime::consumer_stream`], CASES C51), which is synchronized after the export
/// and before the tensor is returned (C61). A tensor requested without a stream (no device
/// query, C53) that turns out to be CUDA memory is ordered by synchronizing the legacy
/// default stream, which the array API says the producer assumes when given no stream.
///
/// # Errors
/// As [`acquire`]; [`Error::Cuda`] when the synchronization fails.
pub fn acquire_with_runtime<'e, E: Exporter + ?Sized>(
    exporter: &'e E,
    options: &AcquireOptions,
    runtime: Option<&dyn DeviceRuntime>,
) -> Result<ManagedTensor<'e>> {
    acquire_from(exporter.dlpack_device(), options, runtime, |request| {
        exporter.dlpack(request)
    })
}

/// The steps of [`acquire_with_runtime`] after the device query, for a producer whose
/// tensors do not borrow an [`Exporter`] (the Python consumer's are `'static`): refuse a
/// missing query under [`DeviceQuery::Required`], pick the stream for the `reported`
/// device, call `export` with the request, then [`check_acquired`].
///
/// # Errors
/// As [`acquire_with_runtime`], and whatever `export` returns.
pub(crate) fn acquire_from<'t>(
    reported: Option<Device>,
    options: &AcquireOptions,
    runtime: Option<&dyn DeviceRuntime>,
    export: impl FnOnce(&ExportRequest) -> Result<ManagedTensor<'t>>,
) -> Result<ManagedTensor<'t>> {
    if reported.is_none() && options.device_query == DeviceQuery::Required {
        return Err(Error::MissingDeviceQuery);
    }
    let request = ExportRequest {
        stream: options.stream_with_runtime(reported, runtime)?,
        ..ExportRequest::default()
    };
    let tensor = export(&request)?;
    check_acquired(tensor, reported, options, request.stream, runtime)
}

/// The consumer's checks after the export: the tensor is
/// on the device the producer reported, and device memory can be ordered before MPI.
///
/// # Errors
/// [`Error::DeviceMismatch`]; [`Error::UnsupportedDevice`] (see [`acquire`]). The tensor is
/// released on error.
pub(crate) fn check_acquired<'e>(
    tensor: ManagedTensor<'e>,
    reported: Option<Device>,
    options: &AcquireOptions,
    requested_stream: Option<isize>,
    runtime: Option<&dyn DeviceRuntime>,
) -> Result<ManagedTensor<'e>> {
    let actual = tensor.device();
    if let Some(r) = reported {
        if r != actual {
            return Err(Error::DeviceMismatch {
                reported_type: r.device_type,
                reported_id: r.device_id,
                actual_type: actual.device_type,
                actual_id: actual.device_id,
            });
        }
    }
    let synchronize = matches!(options.stream, StreamPolicy::Synchronize { .. });
    if actual.memory_kind().uses_streams() && synchronize {
        let cuda = matches!(
            actual.memory_kind(),
            MemoryKind::Cuda | MemoryKind::CudaManaged
        );
        let Some(runtime) = runtime.filter(|_| cuda) else {
            // No runtime for this device: the consumer stream cannot be synchronized, so
            // the pointer can never be handed to MPI safely.
            return Err(Error::UnsupportedDevice {
                device_type: actual.device_type,
                device_id: actual.device_id,
                reason: if cuda {
                    "cannot synchronize the consumer stream: no CUDA runtime (build with \
                     feature `cuda` on a machine with the CUDA driver)"
                } else {
                    "cannot synchronize the consumer stream: ROCm has no runtime in this build"
                },
            });
        };
        // A tensor requested without a stream: the producer assumed the legacy default one.
        let stream = requested_stream.unwrap_or(CUDA_LEGACY_DEFAULT_STREAM);
        runtime.synchronize(actual, stream)?;
    }
    Ok(tensor)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::device_type;

    #[test]
    fn stream_table() {
        let sync = AcquireOptions::default();
        let unsync = AcquireOptions {
            stream: StreamPolicy::Unsynchronized,
            ..Default::default()
        };
        let cuda = Some(Device::new(device_type::CUDA, 0));
        let rocm = Some(Device::new(device_type::ROCM, 0));
        assert_eq!(sync.stream_for(Some(Device::CPU)), Ok(None));
        assert_eq!(
            sync.stream_for(Some(Device::new(device_type::CUDA_HOST, 0))),
            Ok(None)
        );
        assert_eq!(sync.stream_for(None), Ok(None));
        assert_eq!(sync.stream_for(cuda), Ok(Some(1)));
        assert_eq!(unsync.stream_for(cuda), Ok(Some(-1)));
        assert_eq!(sync.stream_for(rocm), Ok(Some(0)));
        assert_eq!(unsync.stream_for(rocm), Ok(Some(-1)));
        let zero = AcquireOptions {
            stream: StreamPolicy::Synchronize { stream: Some(0) },
            ..Default::default()
        };
        assert!(zero.stream_for(cuda).is_err());
        assert_eq!(zero.stream_for(rocm), Ok(Some(0)));
    }
}
