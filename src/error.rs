//! The one error type of the crate.
//!
//! Every variant is a diagnosis: it names the DLPack field or MPI argument at fault and carries
//! the offending values, so that a message such as
//! `tensor is not C-contiguous: axis 1 has stride 3 elements, expected 1` can be acted on
//! without a debugger. Every error is returned *before* any MPI call is made with the
//! offending arguments, and a tensor involved in a failed import is still released exactly
//! once (see [`crate::dlpack::ManagedTensor`]).
//!
//! This module sits at the bottom of the dependency order (docs/ARCHITECTURE.md), yet it
//! names [`DType`] and [`ReduceOp`] from [`crate::dtype`]: a domain reference, not a
//! dependency on behaviour. Errors such as [`Error::UnsupportedReduction`] carry the
//! offending dtype and operation as values so that callers can match on them, and `dtype`
//! in turn returns this module's errors; the two are one layer read together, and nothing
//! else from above is used here.
//!
//! The one MPI object an error can carry, the held message of [`Error::Unfit`]
//! ([`Unreceived`]), is declared here as data only (a handle and a status behind one shared
//! owner); the module makes no MPI call. What a held message does (the probe, the receives,
//! the discard on drop and at `MPI_Finalize`) is in `comm::engine::held`.

use std::sync::{Arc, Mutex};

use mpi::ffi::{MPI_Message, MPI_Status};
use mpi::topology::Rank;
use mpi::Tag;

use crate::dtype::{DType, ReduceOp};

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong between a DLPack producer and an MPI call.
///
/// Cloning an `Error` never copies an MPI resource: the one live resource an error can carry,
/// the held message of [`Error::Unfit`], has a single owner behind an [`Arc`], and a clone
/// shares that owner (the first receive through any clone takes the message, the others get
/// [`Error::AlreadyReceived`]); equality on it is identity.
#[derive(
    Debug, Clone, PartialEq, Eq, thiserror::Error, strum::IntoStaticStr, strum::VariantNames,
)]
#[non_exhaustive]
pub enum Error {
    /// A pointer that DLPack requires to be non-NULL was NULL (`field` names it, e.g.
    /// `"DLManagedTensorVersioned*"` or `"shape"`).
    #[error("DLPack field `{field}` is NULL")]
    NullPointer {
        /// The field or argument that was NULL.
        field: &'static str,
    },

    /// A `DLManagedTensorVersioned` whose major version is not 1 (DLPack header,
    /// `DLPackVersion`: "the consumer must call the deleter ... It is not safe to access any
    /// other fields"). The deleter has been called.
    #[error("unsupported DLPack version {major}.{minor}: this consumer reads major version 1")]
    UnsupportedVersion {
        /// `version.major` as given by the producer.
        major: u32,
        /// `version.minor` as given by the producer.
        minor: u32,
    },

    /// A `DLTensor` field holds a value DLPack does not allow (negative `ndim`, negative
    /// extent, NULL `data` for a non-empty tensor, ...).
    #[error("invalid DLTensor: `{field}` = {value}: {reason}")]
    InvalidTensor {
        /// The field, e.g. `"ndim"`, `"shape[1]"`, `"data"`.
        field: String,
        /// The offending value as given.
        value: i128,
        /// Why it is refused.
        reason: &'static str,
    },

    /// Checked arithmetic on sizes or addresses overflowed (e.g. the element count overflows
    /// `i64`, or `data + byte_offset` overflows the address space).
    #[error("overflow computing {quantity}: {lhs} {operator} {rhs} does not fit")]
    Overflow {
        /// What was being computed, e.g. `"element count"`, `"data + byte_offset"`.
        quantity: &'static str,
        /// Left operand.
        lhs: i128,
        /// `"*"` or `"+"`.
        operator: &'static str,
        /// Right operand.
        rhs: i128,
    },

    /// The tensor is not C-contiguous (row-major compact) on `axis`, where contiguity is
    /// required: reading it as a slice ([`crate::dlpack::Tensor::as_slice`]). Strided
    /// layouts themselves are sent and received through derived datatypes
    /// ([`crate::spec::datatype`]); the specs use this error internally to pick that path.
    #[error(
        "tensor is not C-contiguous: axis {axis} has stride {stride_elems} elements, \
         expected {expected_elems}"
    )]
    NonContiguous {
        /// The first axis (0-based, outermost first) whose stride breaks contiguity.
        axis: usize,
        /// Its stride, in elements.
        stride_elems: i64,
        /// The stride a compact row-major tensor would have there, in elements.
        expected_elems: i64,
    },

    /// A receive buffer whose elements overlap in memory (stride 0 on an axis of extent > 1,
    /// or strides that alias): receiving into it would be undefined (MPI-4.1 §3.2.2: receive
    /// buffers must not overlap).
    #[error(
        "receive buffer elements overlap: axis {axis} (extent {extent}) has stride {stride_elems} \
         elements"
    )]
    Overlap {
        /// The axis whose stride makes elements alias.
        axis: usize,
        /// Its extent.
        extent: i64,
        /// Its stride, in elements.
        stride_elems: i64,
    },

    /// Blocks of a vector (v-variant) receive overlap each other.
    #[error(
        "receive blocks overlap: block {first} covers elements [{first_start}, {first_end}) \
         and block {second} starts at {second_start}"
    )]
    BlocksOverlap {
        /// Index (rank) of the first block.
        first: usize,
        /// First element of the first block.
        first_start: i64,
        /// One past its last element.
        first_end: i64,
        /// Index (rank) of the second block.
        second: usize,
        /// First element of the second block.
        second_start: i64,
    },

    /// The DLPack dtype has no MPI type of exactly its size.
    #[error("unsupported dtype {dtype}: {reason}")]
    UnsupportedDtype {
        /// The dtype as given by the producer.
        dtype: DType,
        /// Why it cannot be sent.
        reason: &'static str,
    },

    /// The reduction is not correct for the dtype (e.g. `sum` on bool, `max` on complex).
    #[error("reduction {op} is not supported for dtype {dtype} (allowed: {allowed})")]
    UnsupportedReduction {
        /// The reduction asked for.
        op: ReduceOp,
        /// The dtype it was asked for.
        dtype: DType,
        /// The reductions this dtype allows, comma separated (may be empty).
        allowed: String,
    },

    /// Two tensors that must have the same dtype do not.
    #[error("dtype mismatch: {what}: {left} vs {right}")]
    DtypeMismatch {
        /// Which pair of arguments, e.g. `"send vs receive"`.
        what: &'static str,
        /// Dtype of the first.
        left: DType,
        /// Dtype of the second.
        right: DType,
    },

    /// A count does not match what the operation requires. All counts are in elements.
    #[error("count mismatch: {what}: expected {expected} elements, got {actual}")]
    CountMismatch {
        /// Which count, e.g. `"incoming message"` or `"receive (= send count × 4 ranks)"`.
        what: String,
        /// The count the operation requires, in elements.
        expected: i64,
        /// The count given or arriving, in elements.
        actual: i64,
    },

    /// The root of a rooted collective was given `None` for a buffer only the root needs
    /// (the receive buffer of reduce, gather and gatherv, the send buffer of scatter and
    /// scatterv: [`crate::comm::TensorComm`]); returned at the root before any MPI call (the
    /// other ranks get [`Error::PeerRefused`] under the default agreement).
    #[error("{what}: none given at the root, which needs it")]
    MissingBuffer {
        /// Which buffer, e.g. `"gather receive buffer"` or `"scatterv send buffer"`.
        what: &'static str,
    },

    /// One member of the list of a fused collective
    /// ([`crate::comm::TensorComm::all_reduce_tensors`] and the others) was refused: `index`
    /// is its place in the list (from 0), `source` why. Returned before any MPI call (the
    /// other ranks get [`Error::PeerRefused`] under the default agreement). Also the error
    /// of [`crate::dlpack::acquire_all`] for the first exporter that refused.
    #[error("member {index} of the tensor list: {source}")]
    Member {
        /// The member's index in the list.
        index: usize,
        /// Why it was refused.
        source: Box<Error>,
    },

    /// The send and receive lists of a fused collective have different lengths.
    #[error("{what} has {actual} members, the receive list {expected}: one send member per receive member")]
    ListLengthMismatch {
        /// Which list, e.g. `"fused all-reduce send list"`.
        what: &'static str,
        /// Members of the receive list.
        expected: usize,
        /// Members of the send list.
        actual: usize,
    },

    /// The members of a fused collective's list are not all in host memory the MPI library
    /// reaches as such: `index` names the first member on `device` (a `Display` of the
    /// DLPack device), where member 0 is on `first`.
    #[error("member {index} of the tensor list is on {device}, member 0 on {first}: a fused list takes one kind of memory")]
    MixedDevices {
        /// The first member whose device differs.
        index: usize,
        /// Its device.
        device: String,
        /// Member 0's device.
        first: String,
    },

    /// A per-rank argument list (counts or displacements) has the wrong length.
    #[error("{what} has {actual} entries, expected one per rank ({expected})")]
    LengthMismatch {
        /// `"counts"` or `"displacements"`.
        what: &'static str,
        /// Communicator size.
        expected: usize,
        /// Entries given.
        actual: usize,
    },

    /// An element range `[displacement, displacement + count)` reaches outside the tensor.
    #[error(
        "{what}: elements [{displacement}, {displacement} + {count}) are outside the tensor of \
         {len} elements"
    )]
    OutOfBounds {
        /// Which range, e.g. `"range"` or `"block 2"`.
        what: String,
        /// First element, in elements.
        displacement: i64,
        /// Number of elements.
        count: i64,
        /// Elements in the tensor.
        len: i64,
    },

    /// A message count does not fit MPI's `int` count (MPI-4.1 §2.5.8; large counts come with
    /// their own support).
    #[error(
        "count {count} (in MPI datatype units) exceeds the MPI int limit {}",
        i32::MAX
    )]
    CountTooLarge {
        /// The count that was needed.
        count: u64,
    },

    /// A host buffer the operation needs (a packed copy of a strided tensor, in bytes) could
    /// not be allocated: the system refused the reservation. Returned before any MPI call;
    /// the tensors are released as usual.
    #[error("could not allocate {bytes} bytes for {purpose}")]
    Allocation {
        /// The bytes asked for.
        bytes: u64,
        /// What the buffer was for.
        purpose: &'static str,
    },

    /// The tensor's memory is `READ_ONLY` (DLPack `DLPACK_FLAG_BITMASK_READ_ONLY`) and cannot
    /// receive data.
    #[error("tensor is READ_ONLY and cannot be used as a receive buffer")]
    ReadOnly,

    /// The tensor comes from a producer whose arrays are immutable (JAX's `jax.Array`), which
    /// exports them in a legacy capsule without DLPack flags: it is read-only, and refused as
    /// a receive buffer by what the consumer knows of the producer (feature `python`).
    #[error(
        "{producer} arrays are immutable: the tensor cannot be used as a receive buffer \
         (the producer's capsule carries no READ_ONLY flag, but the array must never be written)"
    )]
    Immutable {
        /// The producer's array type, e.g. `jax.Array`.
        producer: &'static str,
    },

    /// The tensor is `IS_COPIED` (DLPack `DLPACK_FLAG_BITMASK_IS_COPIED`): data received into
    /// it would land in a copy nobody sees.
    #[error(
        "tensor is IS_COPIED: data received into it would land in a copy the producer never sees"
    )]
    IsCopied,

    /// The device cannot be used on this path (e.g. a GPU tensor in a build without GPU
    /// support).
    #[error("unsupported device (device_type {device_type}, device_id {device_id}): {reason}")]
    UnsupportedDevice {
        /// `DLDevice::device_type`.
        device_type: u32,
        /// `DLDevice::device_id`.
        device_id: i32,
        /// Why.
        reason: &'static str,
    },

    /// The device the producer reported (`dlpack_device`) differs from the device in the
    /// tensor it returned.
    #[error(
        "device mismatch: producer reported ({reported_type}, {reported_id}), tensor is on \
         ({actual_type}, {actual_id})"
    )]
    DeviceMismatch {
        /// `device_type` the exporter reported.
        reported_type: u32,
        /// `device_id` the exporter reported.
        reported_id: i32,
        /// `device_type` of the returned tensor.
        actual_type: u32,
        /// `device_id` of the returned tensor.
        actual_id: i32,
    },

    /// The transport asked for cannot be used with this MPI library or build.
    #[error("transport {transport} is not available: {reason}")]
    TransportUnavailable {
        /// `direct` or `staged`.
        transport: &'static str,
        /// Why (e.g. the CUDA-awareness answer and its source).
        reason: String,
    },

    /// A CUDA driver call failed (feature `cuda`).
    #[error("CUDA driver call {call} failed: {name} ({code})")]
    Cuda {
        /// The driver function, e.g. `cuMemcpyDtoHAsync`.
        call: &'static str,
        /// The `CUresult` value.
        code: u32,
        /// The driver's name for it (`cuGetErrorName`), e.g. `CUDA_ERROR_INVALID_VALUE`.
        name: String,
    },

    /// [`crate::dlpack::DeviceQuery::Required`] was asked for and the exporter does not
    /// implement the device query (`__dlpack_device__` / `Exporter::dlpack_device`).
    #[error("exporter does not implement the device query (`dlpack_device`), which DeviceQuery::Required demands")]
    MissingDeviceQuery,

    /// A rank other than the root passed a send-only buffer
    /// ([`crate::comm::BroadcastBuffer::Send`]) to a broadcast: only the root sends; the
    /// other ranks pass a tensor to receive into.
    #[error(
        "rank {rank} passed a send-only tensor to a broadcast from root {root}: only the root \
         sends; other ranks pass BroadcastBuffer::Recv"
    )]
    BroadcastNotRoot {
        /// This rank.
        rank: i32,
        /// The broadcast's root.
        root: i32,
    },

    /// A rank argument is outside the communicator.
    #[error("rank {rank} is outside the communicator of size {size}")]
    InvalidRank {
        /// The rank given.
        rank: i32,
        /// Communicator size.
        size: i32,
    },

    /// A message tag outside `0..=MPI_TAG_UB` (MPI-4.1 §3.2.3).
    #[error("tag {tag} is outside 0..={tag_ub} (MPI_TAG_UB of this MPI library)")]
    InvalidTag {
        /// The tag given.
        tag: i32,
        /// `MPI_TAG_UB` as this MPI library reports it.
        tag_ub: i32,
    },

    /// The send and receive buffers of one call overlap in memory, which MPI forbids
    /// (MPI-4.1 §2.3; use the in-place variant instead).
    #[error(
        "send buffer [{send_address:#x}, +{send_bytes} bytes) and receive buffer \
         [{recv_address:#x}, +{recv_bytes} bytes) overlap"
    )]
    BuffersAlias {
        /// Address of the send buffer.
        send_address: usize,
        /// Its length in bytes.
        send_bytes: usize,
        /// Address of the receive buffer.
        recv_address: usize,
        /// Its length in bytes.
        recv_bytes: usize,
    },

    /// A collective was called on an inter-communicator; this crate's collectives are
    /// defined for intra-communicators (MPI-4.1 §6.2.2).
    #[error(
        "collective operations here need an intra-communicator; this is an inter-communicator"
    )]
    Intercommunicator,

    /// Another rank of the communicator refused its arguments to a collective of
    /// [`crate::comm::TensorComm`], so no rank entered the data operation (the agreement of
    /// [`crate::settings::Agreement::Collective`]). `rank` is the lowest rank that refused (in
    /// the communicator the collective was called on); `reason` is that rank's own error
    /// message, cut to at most [`crate::comm::AGREEMENT_REASON_BYTES`] bytes.
    #[error(
        "rank {rank} refused its arguments to this collective, so no rank entered it: {reason}"
    )]
    PeerRefused {
        /// The lowest rank whose local checks failed.
        rank: i32,
        /// That rank's error, as its `Display` text (bounded length).
        reason: String,
    },

    /// The ranks' calls to one collective do not match across the communicator (MPI-4.1
    /// §6.1: the same operation, root, reduction operator and type signature on every
    /// rank; §6.12: a blocking and a nonblocking collective never match), each valid on its
    /// own rank; found by the agreement before the data operation, so no rank entered it,
    /// every rank returns this error, and the next matching collective on the communicator
    /// works. Names two ranks that differ (the lowest rank, and the lowest rank whose call
    /// differs from its) and each one's call in words, e.g. `all_reduce float32 × 1000 sum`
    /// and `broadcast float32 × 1000 root 0` (counts in elements; the nonblocking form is
    /// prefixed `immediate_`), and `difference`, the error's text: what differs across all
    /// ranks in words:
    /// which ranks used which form, or for fused lists the first member that differs with
    /// its index, dtype and shape on each rank and which ranks have which length
    /// (`member 57: rank 0 float32 [2048], rank 2 float64 [2048]`).
    #[error(
        "the ranks' calls to this collective do not match (MPI-4.1 §6.1), so no rank \
         entered it: {difference}"
    )]
    CollectiveMismatch {
        /// The lowest rank of the communicator.
        rank: i32,
        /// Its collective and arguments, in words.
        arguments: String,
        /// The lowest rank whose arguments differ from `rank`'s.
        other_rank: i32,
        /// That rank's collective and arguments, in words.
        other_arguments: String,
        /// What differs across the ranks, in words.
        difference: String,
    },

    /// The ranks are out of step on this communicator: one skipped or added a collective
    /// (found by the agreement, which counts each communicator's collectives and, after a
    /// mismatch, compares every rank's last collective with the others' current one), or a
    /// peer that does not take part in dlpack-mpi's agreement answered it. Every rank
    /// returns it where it was found, and every later collective of dlpack-mpi on the
    /// communicator returns it at once, without entering MPI, so that no rank hangs and the
    /// program can end; `first` is that first finding in words (`rank 2 at collective 7,
    /// ranks 0, 1 at 6: …`). [`crate::comm::reset_out_of_step`], called by every rank,
    /// clears it.
    #[error(
        "{first}. dlpack-mpi enters no collective on this communicator until every rank calls \
         comm::reset_out_of_step (every rank must make the same collectives in the same \
         order, MPI-4.1 §6.13)"
    )]
    OutOfStep {
        /// The first finding, in words.
        first: String,
    },

    /// A plan step ([`crate::comm::Plan`]) met another plan's step on some rank, a plan built
    /// in another order, or a refused step: the identity carried with its data differed, so
    /// no member was written from its packed buckets. `seen`: what this rank saw.
    #[error(
        "this plan step did not meet the same plan on every rank: {seen}; nothing was \
         written from the mismatched data. Every rank must run the same plans' and exchanges' \
         steps in the same order (a plan's DLPACK_MPI_PLAN_CHECK=each names it in words)"
    )]
    PlanMismatch {
        /// What this rank saw, in words.
        seen: String,
    },

    /// A plan's member changed since the build (through [`crate::comm::Plan::tensors_mut`]):
    /// its `field` was `planned`, is `now`. The step still takes part on the plan's own
    /// buffers (peers see [`Error::PlanMismatch`] where it can show); every later step fails.
    #[error(
        "plan member {index} changed since the plan was built: its {field} was {planned}, now \
         {now}; this plan's steps take no part of it any more (build a new plan)"
    )]
    PlanChanged {
        /// The member's index in the list.
        index: usize,
        /// `data pointer`, `dtype`, `shape`, `strides`, `device` or `list length`.
        field: &'static str,
        /// Its value at the build.
        planned: String,
        /// Its value now.
        now: String,
    },

    /// The first element is not aligned for the Rust type asked for (DLPack does not promise
    /// alignment: `byte_offset` may be any number of bytes).
    #[error("first element at address {address:#x} is not aligned to {align} bytes")]
    Misaligned {
        /// Address of the first element.
        address: usize,
        /// Alignment the type needs.
        align: usize,
    },

    /// An exporter's layout reaches outside its storage.
    #[error(
        "layout reaches bytes [{first_byte}, {end_byte}) of a storage of {storage_bytes} bytes"
    )]
    LayoutOutsideStorage {
        /// Lowest byte an element touches, relative to the storage start (negative = before).
        first_byte: i128,
        /// One past the highest byte an element touches.
        end_byte: i128,
        /// Size of the storage in bytes.
        storage_bytes: u64,
    },

    /// The process loaded another MPI release than the one this build was compiled against
    /// ([`crate::mpi_library::MpiLibrary::check`]): another implementation, or another
    /// major or minor version. Returned by the first operation that would enter MPI
    /// ([`crate::mpi_library::ensure_matching`]) unless
    /// [`crate::settings::allow_mpi_mismatch`]; a program depending on this crate gets the
    /// built library's run path from a build script reading `DEP_DLPACK_MPI_RPATH` (README,
    /// "Use from another project").
    #[error(
        "this build of dlpack-mpi was compiled against {built} but the process loaded \
         {loaded} from {file}: the loader found that file first (LD_LIBRARY_PATH, LD_PRELOAD \
         or its default directories; a program that depends on dlpack-mpi gets no run path \
         from it). Give the program a run path to the built library's directory (in \
         parentheses above): a build script printing cargo:rustc-link-arg=-Wl,-rpath,DIR \
         for each DIR of DEP_DLPACK_MPI_RPATH (README, \"Use from another project\"), or \
         RUSTFLAGS=\"-C link-arg=-Wl,-rpath,DIR\"; or run with LD_LIBRARY_PATH=DIR (mpirun \
         -x LD_LIBRARY_PATH); or rebuild against the loaded library (MPICC). \
         DLPACK_MPI_ALLOW_MPI_MISMATCH=1 runs it anyway"
    )]
    MpiLibraryMismatch {
        /// The library of the build's `mpi.h`, and the directories it linked (the run path
        /// the program needs): `Open MPI 5.0.11 (in /opt/openmpi/lib)`.
        built: String,
        /// `MPI_Get_library_version`'s first line.
        loaded: String,
        /// The file the loader resolved `MPI_Init` to.
        file: String,
    },

    /// A derived datatype was needed but MPI is not initialized (or already finalized).
    #[error("MPI is not initialized: strided layouts and large counts need MPI to build their datatypes")]
    MpiNotInitialized,

    /// The operation needs a contiguous tensor (element ranges, per-rank blocks).
    #[error("{operation} need a contiguous tensor; this one is strided (send it whole, or pack it first)")]
    StridedNotSupported {
        /// What was asked for.
        operation: &'static str,
    },

    /// An environment setting has a value this crate does not read.
    #[error("environment variable {name}={value:?} is not valid: expected {expected}")]
    InvalidSetting {
        /// The variable, e.g. `DLPACK_MPI_CUDA_AWARE`.
        name: &'static str,
        /// Its value.
        value: String,
        /// What it may be.
        expected: &'static str,
    },

    /// A shape or dtype given to a constructor does not match the data it describes.
    #[error("shape/data mismatch: {what}: shape needs {expected} bytes, data has {actual}")]
    ShapeMismatch {
        /// What was being built.
        what: &'static str,
        /// Bytes the shape and dtype need.
        expected: u64,
        /// Bytes available.
        actual: u64,
    },

    /// A Python object without a `__dlpack__` method was given as a producer (feature
    /// `python`).
    #[error(
        "object of type `{type_name}` has no `__dlpack__` method: it is not a DLPack producer"
    )]
    NotAProducer {
        /// The object's Python type name.
        type_name: String,
    },

    /// `__dlpack_device__` returned something other than a `(device_type, device_id)` tuple
    /// of two ints with a device type dlpack.h defines (feature `python`).
    #[error("`__dlpack_device__` returned {value}: {reason}")]
    InvalidDeviceQuery {
        /// `repr()` of the returned value.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// `__dlpack__` returned (or the caller passed) something that is not a DLPack capsule
    /// named `dltensor_versioned` or `dltensor` (feature `python`).
    #[error("not a DLPack capsule: {what} is {value}")]
    InvalidCapsule {
        /// `"type"` or `"capsule name"`.
        what: &'static str,
        /// The type name, or the capsule name as given.
        value: String,
    },

    /// A producer's DLPack C exchange table (`__dlpack_c_exchange_api__`, dlpack.h v1.3)
    /// cannot be used: missing or malformed where it is required, or one of its functions
    /// broke its contract (feature `python`).
    #[error("`__dlpack_c_exchange_api__` of type `{type_name}` is unusable: {reason}")]
    InvalidExchangeApi {
        /// The producer's Python type name.
        type_name: String,
        /// What is wrong.
        reason: &'static str,
    },

    /// The capsule was already consumed: a consumer renamed it `used_dltensor_versioned` /
    /// `used_dltensor` when it took ownership (array API, `__dlpack__`), so a second
    /// consumption would call the deleter twice (feature `python`).
    #[error("DLPack capsule `{name}` was already consumed; each capsule can be imported once")]
    CapsuleConsumed {
        /// The capsule's name (`used_dltensor_versioned` or `used_dltensor`).
        name: String,
    },

    /// A call of Python's C API failed without setting a Python exception (feature
    /// `python`): `PyCapsule_SetName` when taking ownership of a DLPack capsule (the capsule
    /// keeps its name, and the producer still owns the tensor).
    #[error("Python's `{call}` failed and set no exception")]
    PythonCallFailed {
        /// The C API function.
        call: &'static str,
    },

    /// A Python call of the producer protocol raised (feature `python`).
    #[error("Python `{call}` raised {exception}")]
    Python {
        /// The call, e.g. `"__dlpack__(max_version=(1, 3), copy=False)"`.
        call: String,
        /// The exception, as `Type: message`.
        exception: String,
    },

    /// The program runs on another libpython than the one this crate was built against
    /// (feature `python`): pyo3 links `libpython3.x.so` by name, and the loader took the
    /// first copy on its search path (often the system's), whose packages are not those of
    /// PYO3_PYTHON. Found by `python::check_libpython` (feature `python`).
    #[error(
        "the embedded Python is the one in {loaded} (sys.prefix {prefix}), but dlpack-mpi was built \
         against the libpython in {built} (PYO3_PYTHON {python}); run with \
         LD_LIBRARY_PATH={built}, or link with RUSTFLAGS=\"-C link-arg=-Wl,-rpath,{built}\""
    )]
    PythonLibraryMismatch {
        /// The LIBDIR of the interpreter the crate was built against (build time).
        built: String,
        /// That interpreter's executable (build time).
        python: String,
        /// The LIBDIR of the libpython the program loaded (run time, `sysconfig`).
        loaded: String,
        /// The loaded interpreter's `sys.prefix`.
        prefix: String,
    },

    /// A checked-protocol message ([`crate::checked`]) has a different shape from the
    /// receive tensor (same dtype and element count, e.g. `[2, 3]` vs `[3, 2]`).
    #[error("shape mismatch: {what}: sent {sent:?}, receive tensor has {local:?}")]
    ShapesDiffer {
        /// Which pair, e.g. `"checked message: sent vs receive tensor"`.
        what: &'static str,
        /// The shape the sender's header gave, in elements.
        sent: Vec<i64>,
        /// The receive tensor's shape, in elements.
        local: Vec<i64>,
    },

    /// The message that should be a checked-protocol header ([`crate::checked`]) is not one.
    #[error("bad checked-protocol header: {field} = {value}: {reason}")]
    BadHeader {
        /// The header field at fault: `"length"` (in words, or in bytes for a message left
        /// unreceived), `"magic"`, `"version"`, `"dtype"`, `"ndim"` or `"shape"`.
        field: &'static str,
        /// Its value as received.
        value: u64,
        /// Why it is refused.
        reason: &'static str,
    },

    /// An incoming message, matched by `MPI_Mprobe` (MPI-4.1 §3.8.2), does not fit the
    /// receive tensor ([`crate::comm::TensorComm::recv_tensor`], `sendrecv_tensor`, the
    /// [`crate::checked`] receives): `mismatch` is the diagnosis (e.g. a
    /// [`Error::CountMismatch`] with both element counts), and `message` holds the message,
    /// unreceived and taken by no other receive, to be received into a right-sized tensor
    /// ([`Unreceived::recv_into`]); dropped, it is received and discarded. See
    /// [`Error::mismatch`] to match on the diagnosis alone.
    #[error(
        "{mismatch} (the message, {} bytes from rank {} tag {}, is held unreceived by this \
         error: receive it with Unreceived::recv_into)",
        message.len_bytes(),
        message.source_rank(),
        message.tag()
    )]
    Unfit {
        /// Why the message was not received.
        mismatch: Box<Error>,
        /// The held message.
        message: Unreceived,
    },

    /// A held message ([`Unreceived`]) was already received or discarded (through another
    /// clone of it).
    #[error(
        "the held message from rank {source_rank} tag {tag} was already received or discarded"
    )]
    AlreadyReceived {
        /// The rank it came from.
        source_rank: i32,
        /// Its tag.
        tag: i32,
    },

    /// Deprecated: no exporter of this crate returns it; an exporter of your own returns
    /// [`Error::ExportRefused`], which names the exporter.
    #[deprecated(note = "use Error::ExportRefused { exporter, reason }")]
    #[doc(hidden)]
    #[error("exporter failed: {0}")]
    Export(String),

    /// An exporter outside this crate (an [`crate::dlpack::Exporter`] of your own, a C
    /// library's) refused an export for a reason no other variant names.
    #[error("{exporter} refused the export: {reason}")]
    ExportRefused {
        /// The exporter: its type or library, as its author names it.
        exporter: String,
        /// Why, in its own words.
        reason: String,
    },

    /// A built-in exporter ([`crate::dlpack::Owned`], [`crate::dlpack::SliceMut`], the CUDA
    /// exporter) refused an export because tensors it exported earlier still hold its storage:
    /// any number of read-only exports, or one writable export, may be alive at a time. Drop
    /// the live tensors (or export read-only) and export again. `dtype` and `shape` are the
    /// refused export's (an exporter hands out one layout, so the live tensors have them
    /// too): they say which of many tensors it was.
    #[error(
        "the storage of the {dtype} tensor of shape {shape:?} is already exported ({}); a {} \
         export must wait: drop that tensor first",
        holders(.readers),
        export_kind(.writable)
    )]
    StorageBusy {
        /// The exporter's element type.
        dtype: DType,
        /// The exporter's shape (elements, outermost first).
        shape: Vec<i64>,
        /// Whether the refused export was writable (`false`: read-only).
        writable: bool,
        /// The read-only exports alive, in tensors; `0` means one writable export is alive.
        readers: usize,
    },

    /// The sender of a pipelined device message ([`crate::transport::pipeline`]) stopped
    /// partway and said so with an abort part (its device → host copy of part `part`
    /// failed); the parts before it were received, the receive tensor is incomplete.
    #[error("rank {rank} aborted its pipelined message at part {part} of {parts}: {cause}")]
    SenderAborted {
        /// The sender's rank in the receiving communicator.
        rank: i32,
        /// The part (0-based) that was not sent.
        part: u64,
        /// The parts the message would have had.
        parts: u64,
        /// Why, as the abort part's code says.
        cause: &'static str,
    },

    /// The part header of a pipelined device message ([`crate::transport::pipeline`]) is
    /// not one this receiver can follow; nothing after it was received.
    #[error("bad pipelined-message header from rank {rank}: {field} = {value}: {reason}")]
    BadPartHeader {
        /// The sender's rank in the receiving communicator.
        rank: i32,
        /// The header field at fault: `"version"`, `"element bytes"` or `"part elements"`.
        field: &'static str,
        /// Its value as received.
        value: u64,
        /// Why it is refused.
        reason: &'static str,
    },
}

impl Error {
    /// The variant's name, e.g. `"CollectiveMismatch"` (one of [`Error::KINDS`]): what a
    /// program that cannot match on the enum (a log, the Python module's exception classes)
    /// tells errors apart by.
    pub fn kind(&self) -> &'static str {
        self.into()
    }

    /// Every variant's name ([`Error::kind`]), in declaration order.
    pub const KINDS: &'static [&'static str] = <Error as strum::VariantNames>::VARIANTS;

    /// The diagnosis itself: for [`Error::Unfit`] the mismatch inside it, else `self`. Use
    /// it to match on why a receive failed whether or not a message is held.
    pub fn mismatch(&self) -> &Error {
        match self {
            Error::Unfit { mismatch, .. } => mismatch,
            other => other,
        }
    }

    /// The held message of an [`Error::Unfit`], if this is one.
    pub fn unreceived(&self) -> Option<&Unreceived> {
        match self {
            Error::Unfit { message, .. } => Some(message),
            _ => None,
        }
    }
}

/// An incoming message that a receive matched but did not receive because it does not fit
/// (carried by [`Error::Unfit`]). It is held here, off MPI's queue: no other receive can
/// take it, and it is not lost.
///
/// - Receive it with [`Unreceived::recv_into`] into a tensor of the right size (its
///   element count is [`Unreceived::len_bytes`] over the element size), or, for a payload
///   of the checked protocol, with [`Unreceived::recv_new`] (a new tensor of the sent dtype
///   and shape, [`Unreceived::sent_dtype`], [`Unreceived::sent_shape`]).
/// - A clone (also the clone inside a cloned [`Error`]) is a second handle to the one held
///   message, never a copy of it: the first receive through any handle takes it, later
///   ones get [`Error::AlreadyReceived`].
/// - When the last clone is dropped with the message still held, it is received into
///   scratch memory and discarded (`MPI_Mrecv`, blocking until the sender's data is in),
///   so that ignoring the error never hangs the sender nor panics. Dropped on a thread
///   that may not call MPI (below `MPI_THREAD_MULTIPLE`, not the thread that initialized
///   MPI), it is queued and discarded by the main thread's next discard or at
///   `MPI_Finalize`; one still held at `MPI_Finalize` is discarded there.
///
/// Equality is identity: two values are equal when they hold the same message.
///
/// Declared here, with the two crate-private types inside it, because [`Error::Unfit`]
/// carries it; everything it does (the probe and receives, the discard, the registry of
/// held messages and its `MPI_Finalize` discard) is in `comm::engine::held`, beside the receives
/// that match, and its receives into tensors in `comm::ops::p2p` and `checked`.
#[derive(Clone)]
pub struct Unreceived(pub(crate) Arc<HeldMessage>);

/// The one owner of a held message, shared by every clone of its [`Unreceived`].
pub(crate) struct HeldMessage {
    /// The message until it is received or discarded (then `None`).
    pub(crate) message: Mutex<Option<Matched>>,
    /// Its source rank, tag and length, from its status.
    pub(crate) source_rank: Rank,
    pub(crate) tag: Tag,
    pub(crate) len_bytes: u64,
    /// The dtype and shape the checked protocol's header gave (`None` for a plain message).
    pub(crate) sent: Option<(DType, Vec<i64>)>,
}

/// A message matched by `MPI_Mprobe` and not yet received: the raw handle and its status.
/// Received at most once (a receive consumes it); one dropped unreceived is received into
/// scratch memory and discarded, so that nothing panics and the job goes on (its `Drop`,
/// its `Send` and its MPI calls are in `comm::engine::held`). Not `Clone`: one value per message.
pub(crate) struct Matched {
    /// `MPI_MESSAGE_NULL` once received or discarded.
    pub(crate) handle: MPI_Message,
    pub(crate) status: MPI_Status,
}

/// The live exports of [`Error::StorageBusy`], for its message.
fn holders(readers: &usize) -> String {
    match *readers {
        0 => "writable".to_string(),
        n => format!("{n} read-only"),
    }
}

/// The refused export of [`Error::StorageBusy`], for its message.
fn export_kind(writable: &bool) -> &'static str {
    if *writable {
        "writable"
    } else {
        "read-only"
    }
}
