//! `dlpack-mpi check`: every operation × every transferable dtype × several lengths.
//!
//! Each case makes its tensors through the public producer path (`Owned` exporter →
//! `acquire`, NumPy's `__dlpack__`, or cudarc device memory through `CudaExport`), runs one
//! operation through `DeviceComm` (which routes each tensor: host memory straight to
//! `TensorComm`, CUDA memory direct or staged through pinned buffers), and compares what arrived with the
//! values computed here independently of MPI (closed forms over rank and index, reductions
//! folded in the element type's own arithmetic). Verdicts are combined across ranks; rank 0
//! prints one line per case, `PASS`/`FAIL`/`SKIP` with the reason, and closes with
//! `N passed, N failed, N skipped`. A failure names the first differing index, the expected
//! and arrived values, and the rank that saw it.

use std::fmt::Debug;
use std::io::Write;
use std::process::ExitCode;

use dlpack_mpi::comm::TensorComm;
use dlpack_mpi::device::{device_type, Device};
use dlpack_mpi::dlpack::{acquire_with_runtime, AcquireOptions, Owned, Tensor};
use dlpack_mpi::dtype::{code, AnyBits, DType, ReduceOp};
use dlpack_mpi::spec::{RecvSpec, SendSpec};
use dlpack_mpi::transport::{DeviceComm, DeviceRuntime, Route};
use dlpack_mpi::Error;
use mpi::collective::SystemOperation;
use mpi::datatype::PartitionMut;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use num_complex::{Complex32, Complex64};

/// Options of `check`.
#[derive(Debug, Clone, clap::Args)]
pub struct CheckArgs {
    /// Only cases whose name matches PATTERN (repeatable; a case runs if it matches any).
    /// Names read `op/dtype/layout/device/transport/len`; a PATTERN with `*`, `?` or `[`
    /// is a glob over the whole name, any other is a substring (`-k allreduce/float`).
    #[arg(short = 'k', long = "include", value_name = "PATTERN")]
    pub include: Vec<String>,
    /// Leave out cases whose name matches PATTERN (repeatable; same rules as `-k`).
    #[arg(short = 'e', long = "exclude", value_name = "PATTERN")]
    pub exclude: Vec<String>,
    /// Only these operations (repeatable or comma separated); see `--list`.
    #[arg(long, value_delimiter = ',')]
    pub op: Vec<String>,
    /// Only these dtypes (repeatable or comma separated), e.g. `float32,int8`.
    #[arg(long, value_delimiter = ',')]
    pub dtype: Vec<String>,
    /// Only these layouts (repeatable or comma separated): contiguous, fortran, transposed,
    /// step, negative, broadcast (send side), scalar (0-d, length 1).
    #[arg(long, value_delimiter = ',')]
    pub layout: Vec<String>,
    /// Tensor lengths in elements.
    #[arg(long, value_delimiter = ',', default_values_t = [0i64, 1, 7, 1000, 65_536])]
    pub len: Vec<i64>,
    /// Where the tensors live: `cpu`; `cuda-host` (pinned host memory, `kDLCUDAHost`: host
    /// memory, no device path); `cuda` (device memory through cudarc: feature `cuda` and a
    /// CUDA driver); `cuda-managed` (needs --simulate-device for now); `all` = every device
    /// available here. Device names appear in case names (`-k /cuda/`).
    #[arg(long, value_enum, default_value_t = crate::DeviceArg::Cpu)]
    pub device: crate::DeviceArg,
    /// Testing without a GPU: CUDA tensors are host memory labelled `kDLCUDA` /
    /// `kDLCUDAManaged` and the GPU runtime is simulated, so staging, routing and stream
    /// synchronization run as on a GPU.
    #[arg(long, hide = true)]
    pub simulate_device: bool,
    /// Who makes the tensors: `numpy` = NumPy arrays through `__dlpack__` (feature
    /// `python`); `rust` = dlpack-mpi's own `Owned` exporter; `auto` = NumPy when this build
    /// has Python support and NumPy imports, else Rust. Applies to `cpu` cases; other
    /// devices' tensors are always made by Rust (`Owned`, or cudarc for `cuda`).
    #[arg(long, value_enum, default_value_t = Producer::Auto)]
    pub producer: Producer,
    /// How CUDA device memory reaches MPI: `auto` = direct when the MPI library is
    /// CUDA-aware, else staged; `direct` = device pointers to a CUDA-aware MPI (refused when
    /// it is not); `staged` = through pinned host memory. Host tensors (`cpu`, `cuda-host`)
    /// always go directly (transport `host` in case names), managed memory as `managed`;
    /// `direct`/`staged` are refused when no CUDA device is selected. Strided or
    /// float16/bfloat16-reduced tensors are staged even under `direct` (the line's `[…]`
    /// says the route taken).
    #[arg(long, value_enum, default_value_t = Transport::Auto)]
    pub transport: Transport,
    /// Stop at the first failure.
    #[arg(short = 'x', long)]
    pub failfast: bool,
    /// Print only failures and the summary.
    #[arg(short, long, conflicts_with = "verbose")]
    pub quiet: bool,
    /// Also print the full MPI library version and each case's time.
    #[arg(short, long)]
    pub verbose: bool,
    /// List the case names and exit.
    #[arg(long)]
    pub list: bool,
    /// Write a JUnit XML report to FILE (rank 0).
    #[arg(long, value_name = "FILE")]
    pub junit: Option<std::path::PathBuf>,
    /// Write a JSON report to FILE (rank 0).
    #[arg(long, value_name = "FILE")]
    pub json: Option<std::path::PathBuf>,
    /// Testing the runner itself: corrupt what the last rank received in cases matching
    /// PATTERN (operations that receive into a fresh tensor), so that they fail.
    #[arg(long, value_name = "PATTERN", hide = true)]
    pub inject_fault: Option<String>,
}

/// Who makes the tensors of a check run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Producer {
    /// NumPy when the build has Python support and NumPy imports, else Rust.
    Auto,
    /// dlpack-mpi's own `Owned` exporter (a Rust `Vec` with a DLPack view).
    Rust,
    /// NumPy arrays through `__dlpack__` (needs the `python` feature).
    Numpy,
}

/// How device memory reaches MPI.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    /// Direct when the MPI library is CUDA-aware, else staged.
    Auto,
    /// Device pointers passed to a CUDA-aware MPI.
    Direct,
    /// Copies through pinned host buffers around each MPI call.
    Staged,
}

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Transport::Auto => "auto",
            Transport::Direct => "direct",
            Transport::Staged => "staged",
        }
    }

    fn library(self) -> dlpack_mpi::transport::Transport {
        match self {
            Transport::Auto => dlpack_mpi::transport::Transport::Auto,
            Transport::Direct => dlpack_mpi::transport::Transport::Direct,
            Transport::Staged => dlpack_mpi::transport::Transport::Staged,
        }
    }
}

/// The communicator every case goes through.
type Comm<'c> = DeviceComm<'c, SimpleCommunicator>;

/// Where a case's tensors live (case names' `device` part).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dev {
    /// Host memory.
    Cpu,
    /// Pinned host memory (`kDLCUDAHost`): host memory for MPI.
    CudaHost,
    /// CUDA device memory (`kDLCUDA`, ordinal 0).
    Cuda,
    /// CUDA managed memory (`kDLCUDAManaged`).
    CudaManaged,
}

const DEVS: [Dev; 4] = [Dev::Cpu, Dev::CudaHost, Dev::Cuda, Dev::CudaManaged];

impl Dev {
    fn name(self) -> &'static str {
        match self {
            Dev::Cpu => "cpu",
            Dev::CudaHost => "cuda-host",
            Dev::Cuda => "cuda",
            Dev::CudaManaged => "cuda-managed",
        }
    }

    /// The DLPack device the tensors are labelled with.
    fn label(self) -> Device {
        match self {
            Dev::Cpu => Device::CPU,
            Dev::CudaHost => Device::new(device_type::CUDA_HOST, 0),
            Dev::Cuda => Device::new(device_type::CUDA, 0),
            Dev::CudaManaged => Device::new(device_type::CUDA_MANAGED, 0),
        }
    }

    /// Whether the tensors need a GPU runtime (streams, copies).
    fn needs_runtime(self) -> bool {
        matches!(self, Dev::Cuda | Dev::CudaManaged)
    }

    /// The transport part of case names: `host` for host memory, `managed` for managed
    /// memory, the communicator's mode (`direct` or `staged`) for device memory.
    fn transport(self, dc: &Comm<'_>) -> &'static str {
        match self {
            Dev::Cpu | Dev::CudaHost => "host",
            Dev::CudaManaged => "managed",
            Dev::Cuda if dc.is_direct() => "direct",
            Dev::Cuda => "staged",
        }
    }

    /// `cuda:0`-style, for the `[device route]` of a line.
    fn short(self) -> String {
        let d = self.label();
        let kind = match self {
            Dev::Cpu => "cpu",
            Dev::CudaHost => "cuda-host",
            Dev::Cuda => "cuda",
            Dev::CudaManaged => "cuda-managed",
        };
        format!("{kind}:{}", d.device_id)
    }
}

thread_local! {
    /// The device of the case being run.
    static DEVICE: std::cell::Cell<Dev> = const { std::cell::Cell::new(Dev::Cpu) };
    /// The GPU runtime of this run (`None`: host devices only).
    static RUNTIME: std::cell::Cell<Option<&'static dyn DeviceRuntime>> =
        const { std::cell::Cell::new(None) };
    /// Whether `cuda` tensors are real device memory (cudarc) rather than labelled host
    /// memory (`--simulate-device`).
    static REAL_CUDA: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The most telling route the DeviceComm calls of the current case took.
    static ROUTE: std::cell::Cell<Option<Route>> = const { std::cell::Cell::new(None) };
}

fn device() -> Dev {
    DEVICE.with(|d| d.get())
}

fn runtime() -> Option<&'static dyn DeviceRuntime> {
    RUNTIME.with(|r| r.get())
}

/// Records the route of the communicator's last operation for the case's line.
fn note_route(dc: &Comm<'_>) {
    let last = dc.last_route();
    ROUTE.with(|r| r.set(r.get().max(last)));
}

/// Operations the check runs, by name.
const OPS: &[&str] = &[
    "send-recv",
    "sendrecv",
    "isend-irecv",
    "bcast",
    "reduce",
    "allreduce",
    "allreduce-inplace",
    "gather",
    "gatherv",
    "scatter",
    "scatterv",
    "allgather",
    "allgatherv",
    "alltoall",
    "alltoallv",
    "reduce-scatter-block",
];

/// How a case stores its logical vector of `n` elements (case names' `layout` part).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// 1-d, C-contiguous.
    Contiguous,
    /// 3-d `[a, b, c]` (`a·b·c = n`) in Fortran order: strides `[1, a, a·b]`.
    Fortran,
    /// 2-d `[a, b]` transposed: strides `[1, a]`.
    Transposed,
    /// Every other element of `2n`: stride 2.
    Step,
    /// Reversed: stride −1 from the last element.
    Negative,
    /// Stride 0 over one element (send side only; receives are contiguous).
    Broadcast,
    /// 0-d (`ndim = 0`, one element; only for length 1).
    Scalar,
}

const LAYOUTS: [Layout; 7] = [
    Layout::Contiguous,
    Layout::Fortran,
    Layout::Transposed,
    Layout::Step,
    Layout::Negative,
    Layout::Broadcast,
    Layout::Scalar,
];

impl Layout {
    fn name(self) -> &'static str {
        match self {
            Layout::Contiguous => "contiguous",
            Layout::Fortran => "fortran",
            Layout::Transposed => "transposed",
            Layout::Step => "step",
            Layout::Negative => "negative",
            Layout::Broadcast => "broadcast",
            Layout::Scalar => "scalar",
        }
    }

    /// Shape, strides (elements), storage elements, and the storage position of each
    /// logical element, for `n` logical elements; `recv` = the receive side (broadcast
    /// receives are contiguous).
    fn place(self, n: i64, recv: bool) -> (Vec<i64>, Vec<i64>, usize, Vec<usize>) {
        let nu = n as usize;
        // Buffers of another length in a scalar case (a gather's P elements, a v-variant's
        // empty block) are contiguous: a 0-d tensor holds exactly one element.
        let this = if self == Layout::Scalar && n != 1 {
            Layout::Contiguous
        } else {
            self
        };
        let largest_divisor_at_most = |m: i64, limit: f64| -> i64 {
            (1..=m.max(1))
                .rev()
                .find(|d| m % d == 0 && (*d as f64) <= limit)
                .unwrap_or(1)
        };
        match this {
            Layout::Contiguous => (vec![n], vec![1], nu, (0..nu).collect()),
            Layout::Broadcast if recv => (vec![n], vec![1], nu, (0..nu).collect()),
            Layout::Broadcast => (vec![n], vec![0], nu.min(1), vec![0; nu]),
            Layout::Scalar => (vec![], vec![], nu, (0..nu).collect()),
            Layout::Step => (vec![n], vec![2], 2 * nu, (0..nu).map(|l| 2 * l).collect()),
            Layout::Negative => (vec![n], vec![-1], nu, (0..nu).map(|l| nu - 1 - l).collect()),
            Layout::Transposed => {
                let a = largest_divisor_at_most(n, (n as f64).sqrt());
                let b = if n == 0 { 0 } else { n / a };
                let pos = (0..nu)
                    .map(|l| {
                        let (i, j) = (l as i64 / b.max(1), l as i64 % b.max(1));
                        (i + a * j) as usize
                    })
                    .collect();
                (vec![a, b], vec![1, a], nu, pos)
            }
            Layout::Fortran => {
                let a = largest_divisor_at_most(n, (n as f64).cbrt());
                let rest = if n == 0 { 0 } else { n / a };
                let b = largest_divisor_at_most(rest, (rest as f64).sqrt());
                let c = if rest == 0 { 0 } else { rest / b };
                let pos = (0..nu)
                    .map(|l| {
                        let l = l as i64;
                        let (i, j, k) =
                            (l / (b * c).max(1), (l / c.max(1)) % b.max(1), l % c.max(1));
                        (i + a * j + a * b * k) as usize
                    })
                    .collect();
                (vec![a, b, c], vec![1, a, a * b], nu, pos)
            }
        }
    }
}

thread_local! {
    /// The layout of the case being run (the check runs cases one at a time).
    static LAYOUT: std::cell::Cell<Layout> = const { std::cell::Cell::new(Layout::Contiguous) };
}

thread_local! {
    /// Set on the last rank for cases matching the hidden `--inject-fault` pattern: the
    /// received values are corrupted at logical index 3 (or the last) before comparison, to
    /// test the failure path (the report, `-x`, the exit status, the JUnit and JSON files).
    static INJECT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn layout() -> Layout {
    LAYOUT.with(|l| l.get())
}

thread_local! {
    /// Who makes the tensors of this run (resolved: `Rust` or `Numpy`).
    static PRODUCER: std::cell::Cell<Producer> = const { std::cell::Cell::new(Producer::Rust) };
}

fn producer() -> Producer {
    PRODUCER.with(|p| p.get())
}

/// A case's tensor storage, made by the run's producer.
enum Store<S: AnyBits> {
    /// dlpack-mpi's `Owned` exporter over a `Vec`.
    Rust(Owned<S>),
    /// A NumPy array: `base` holds the storage (1-d, C order), `view` is the strided view
    /// of it (`numpy.lib.stride_tricks.as_strided`) that is exported through `__dlpack__`.
    #[cfg(feature = "python")]
    Numpy {
        base: pyo3::Py<pyo3::PyAny>,
        view: pyo3::Py<pyo3::PyAny>,
        _elem: std::marker::PhantomData<S>,
    },
    /// CUDA device memory (cudarc) holding the storage's bytes, exported through
    /// `CudaExport` as the case's dtype and layout.
    #[cfg(feature = "cuda")]
    Cuda {
        slice: std::cell::RefCell<cudarc::driver::CudaSlice<u8>>,
        /// The storage as made on the host (its length and element type, for reading back).
        template: Vec<S>,
        dtype: DType,
        shape: Vec<i64>,
        strides: Vec<i64>,
        byte_offset: u64,
    },
}

/// The bytes of `storage` (through a `uint8` view of an `Owned`, so no `unsafe` here).
#[cfg(feature = "cuda")]
fn storage_bytes<S: AnyBits>(storage: Vec<S>) -> Res<Vec<u8>> {
    let o = Owned::new(storage)
        .with_dtype(DType::new(code::UINT, 8))
        .map_err(e)?;
    let t = acquire_with_runtime(&o, &AcquireOptions::default(), None).map_err(e)?;
    t.as_slice::<u8>().map(<[u8]>::to_vec).map_err(e)
}

/// The stream of device 0 that check's device memory is allocated and read on.
#[cfg(feature = "cuda")]
fn cuda_stream() -> Res<std::sync::Arc<cudarc::driver::CudaStream>> {
    thread_local! {
        static STREAM: std::cell::RefCell<Option<std::sync::Arc<cudarc::driver::CudaStream>>> =
            const { std::cell::RefCell::new(None) };
    }
    STREAM.with(|s| {
        if let Some(stream) = s.borrow().as_ref() {
            return Ok(stream.clone());
        }
        let ctx = cudarc::driver::CudaContext::new(0).map_err(|err| format!("CUDA: {err}"))?;
        let stream = ctx.default_stream();
        *s.borrow_mut() = Some(stream.clone());
        Ok(stream)
    })
}

impl<S: AnyBits> Store<S> {
    /// Runs `f` on the tensor, acquired through the producer's own path (`acquire` of the
    /// exporter with the run's GPU runtime, `__dlpack__` of the NumPy view, or a
    /// `CudaExport` of the device memory).
    fn with_tensor<R>(&self, f: impl FnOnce(&mut dyn Tensor) -> Res<R>) -> Res<R> {
        let options = AcquireOptions::default();
        match self {
            Store::Rust(o) => {
                let mut t = acquire_with_runtime(o, &options, runtime()).map_err(e)?;
                f(&mut t)
            }
            #[cfg(feature = "python")]
            Store::Numpy { view, .. } => {
                let mut t =
                    pyo3::Python::attach(|py| dlpack_mpi::python::acquire(view.bind(py), &options))
                        .map_err(e)?;
                f(&mut t)
            }
            #[cfg(feature = "cuda")]
            Store::Cuda {
                slice,
                dtype,
                shape,
                strides,
                byte_offset,
                ..
            } => {
                let mut slice = slice.borrow_mut();
                let export = dlpack_mpi::cuda::CudaExport::new_mut(&mut *slice)
                    .with_dtype(*dtype)
                    .and_then(|x| x.with_layout(shape, Some(strides), *byte_offset))
                    .map_err(e)?;
                let mut t = acquire_with_runtime(&export, &options, runtime()).map_err(e)?;
                f(&mut t)
            }
        }
    }

    /// Copies `storage` to new device memory, to be exported with `shape`, `strides`
    /// (elements) from `byte_offset`.
    #[cfg(feature = "cuda")]
    fn cuda(
        dtype: DType,
        storage: Vec<S>,
        shape: &[i64],
        strides: &[i64],
        byte_offset: u64,
    ) -> Res<Store<S>> {
        let mut bytes = storage_bytes(storage.clone())?;
        // cudarc allocates at least one byte (an empty tensor still has a pointer).
        if bytes.is_empty() {
            bytes.push(0);
        }
        let slice = cuda_stream()?
            .clone_htod(&bytes)
            .map_err(|err| format!("CUDA: {err}"))?;
        Ok(Store::Cuda {
            slice: std::cell::RefCell::new(slice),
            template: storage,
            dtype,
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            byte_offset,
        })
    }

    /// The storage, in storage order.
    fn into_vec(self) -> Res<Vec<S>> {
        match self {
            Store::Rust(o) => Ok(o.into_vec()),
            #[cfg(feature = "cuda")]
            Store::Cuda {
                slice, template, ..
            } => {
                let bytes = cuda_stream()?
                    .clone_dtoh(&slice.into_inner())
                    .map_err(|err| format!("CUDA: {err}"))?;
                let o = Owned::new(template)
                    .with_dtype(DType::new(code::UINT, 8))
                    .map_err(e)?;
                {
                    let mut t =
                        acquire_with_runtime(&o, &AcquireOptions::default(), None).map_err(e)?;
                    let dst = t.as_mut_slice::<u8>().map_err(e)?;
                    let n = dst.len();
                    dst.copy_from_slice(&bytes[..n]);
                }
                Ok(o.into_vec())
            }
            #[cfg(feature = "python")]
            Store::Numpy { base, .. } => pyo3::Python::attach(|py| {
                let t = dlpack_mpi::python::acquire(base.bind(py), &AcquireOptions::default())?;
                t.as_slice::<S>().map(<[S]>::to_vec)
            })
            .map_err(e),
        }
    }

    /// A NumPy array of `storage` (which it copies) viewed with `shape`, `strides`
    /// (elements) from storage element `first`.
    #[cfg(feature = "python")]
    fn numpy(
        dtype: DType,
        storage: Vec<S>,
        shape: &[i64],
        strides: &[i64],
        first: usize,
    ) -> Res<Store<S>> {
        use pyo3::types::PyAnyMethods;
        let Some(name) = dlpack_mpi::python::numpy_dtype_name(dtype) else {
            return Err(format!("{SKIP_MARK}NumPy has no dtype {dtype}"));
        };
        let esize = dtype.size_bytes().unwrap_or(0) as i64;
        pyo3::Python::attach(|py| -> Result<Store<S>, String> {
            let py_err = |what: &str, err: pyo3::PyErr| format!("NumPy: {what}: {err}");
            let np = dlpack_mpi::python::numpy(py).map_err(e)?;
            let base = np
                .call_method1("zeros", (storage.len(), name))
                .map_err(|err| py_err("zeros", err))?;
            {
                let mut t =
                    dlpack_mpi::python::acquire(&base, &AcquireOptions::default()).map_err(e)?;
                t.as_mut_slice::<S>().map_err(e)?.copy_from_slice(&storage);
            }
            let from = base
                .get_item(pyo3::types::PySlice::new(py, first as isize, isize::MAX, 1))
                .map_err(|err| py_err("slice", err))?;
            let byte_strides: Vec<i64> = strides.iter().map(|s| s * esize).collect();
            let kwargs = pyo3::types::PyDict::new(py);
            kwargs
                .set_item("shape", shape.to_vec())
                .and_then(|()| kwargs.set_item("strides", byte_strides))
                .map_err(|err| py_err("kwargs", err))?;
            let view = np
                .getattr("lib")
                .and_then(|l| l.getattr("stride_tricks"))
                .and_then(|st| st.call_method("as_strided", (from,), Some(&kwargs)))
                .map_err(|err| py_err("as_strided", err))?;
            Ok(Store::Numpy {
                base: base.unbind(),
                view: view.unbind(),
                _elem: std::marker::PhantomData,
            })
        })
    }

    #[cfg(not(feature = "python"))]
    fn numpy(_: DType, _: Vec<S>, _: &[i64], _: &[i64], _: usize) -> Res<Store<S>> {
        Err("this build has no Python support (feature `python`)".into())
    }
}

/// The verdict of one case on one rank.
enum Verdict {
    Pass,
    Skip(String),
    /// The MPI library returned a wrong result that matches a known, documented bug of it
    /// (today one: [`SATURATING_SUM_BUG`]).
    KnownBug(String),
    Fail(String),
}

/// Open MPI 4.1's `op/avx` component computes 8-bit integer sums with saturating SIMD adds,
/// so an overflowing sum clamps instead of wrapping as C (and NumPy, PyTorch) do.
const SATURATING_SUM_BUG: &str = "the MPI library saturates integer sums instead of wrapping \
     (Open MPI op/avx, open-mpi/ompi#8045, closed as wontfix); \
     workaround: export OMPI_MCA_op=^avx";

/// A binary fold of two elements.
type Fold<S> = fn(S, S) -> S;

/// A test on one element.
type Test<S> = fn(&S) -> bool;

/// One dtype: how to make its values and, if it reduces, how to fold them.
struct Kind<S> {
    name: &'static str,
    dtype: DType,
    /// Storage elements per DLPack element (lanes).
    per_elem: usize,
    value: fn(i64, i32) -> S,
    reduce: Option<(ReduceOp, Fold<S>)>,
    /// The saturating form of the reduction and a test for the type's bounds, to recognise
    /// [`SATURATING_SUM_BUG`]: an element whose saturating fold reaches a bound overflowed
    /// on the way, and there the library's answer depends on where it saturated.
    saturating: Option<(Fold<S>, Test<S>)>,
}

/// Runs cases for one dtype, whatever its storage type.
trait Runner {
    fn name(&self) -> &'static str;
    fn run(&self, dc: &Comm<'_>, op: &str, layout: Layout, len: i64) -> Verdict;
}

type Res<T> = Result<T, String>;

/// Prefix of an error string that is a skip (a documented limitation), not a failure.
const SKIP_MARK: &str = "SKIP: ";

fn e(err: Error) -> String {
    format!("unexpected error: {err}")
}

impl<S: AnyBits + PartialEq + Debug> Kind<S> {
    /// Values of rank `r`, `n` DLPack elements, element index offset `from`.
    fn values(&self, r: i32, n: i64, from: i64) -> Vec<S> {
        let k = self.per_elem as i64;
        // A broadcast (stride-0) send repeats one element: every logical element is
        // element 0's value.
        let bcast = layout() == Layout::Broadcast;
        (from * k..(from + n) * k)
            .map(|i| (self.value)(if bcast { i % k } else { i }, r))
            .collect()
    }

    /// A tensor holding the logical vector `data` in the current layout (receive side).
    fn owned(&self, data: Vec<S>) -> Res<Store<S>> {
        self.placed(data, true)
    }

    /// The send-side tensor of `data` (a broadcast layout stores one element).
    fn owned_send(&self, data: Vec<S>) -> Res<Store<S>> {
        self.placed(data, false)
    }

    fn placed(&self, data: Vec<S>, recv: bool) -> Res<Store<S>> {
        let k = self.per_elem;
        let n = (data.len() / k) as i64;
        let (shape, strides, storage, pos) = layout().place(n, recv);
        let fill = (self.value)(-1, -1);
        let mut store = vec![fill; storage * k];
        for (l, &p) in pos.iter().enumerate() {
            store[p * k..(p + 1) * k].copy_from_slice(&data[l * k..(l + 1) * k]);
        }
        let first = pos.first().copied().unwrap_or(0);
        let dev = device();
        if dev == Dev::Cpu && producer() == Producer::Numpy {
            return Store::numpy(self.dtype, store, &shape, &strides, first);
        }
        let esize = self.dtype.size_bytes().unwrap_or(0) as u64;
        #[cfg(feature = "cuda")]
        if dev == Dev::Cuda && REAL_CUDA.with(|r| r.get()) {
            return Store::cuda(self.dtype, store, &shape, &strides, first as u64 * esize);
        }
        Owned::new(store)
            .with_dtype(self.dtype)
            .and_then(|o| o.with_layout(&shape, Some(&strides), first as u64 * esize))
            .map(|o| o.labelled(dev.label()))
            .map(Store::Rust)
            .map_err(e)
    }

    /// The logical vector of `n_storage` storage items held by `owned` (receive side).
    fn read(&self, owned: Store<S>, n_storage: usize) -> Res<Vec<S>> {
        let k = self.per_elem;
        let (_, _, _, pos) = layout().place((n_storage / k) as i64, true);
        let store = owned.into_vec()?;
        Ok(pos
            .iter()
            .flat_map(|&p| store[p * k..(p + 1) * k].iter().copied())
            .collect())
    }

    fn fold(&self, n: i64, p: i32) -> Option<(ReduceOp, Vec<S>)> {
        let (op, f) = self.reduce?;
        Some((op, self.fold_with(f, n, p)))
    }

    fn fold_with(&self, f: Fold<S>, n: i64, p: i32) -> Vec<S> {
        let mut acc = self.values(0, n, 0);
        for r in 1..p {
            for (a, b) in acc.iter_mut().zip(self.values(r, n, 0)) {
                *a = f(*a, b);
            }
        }
        acc
    }

    /// Compares a reduction result; a mismatch that equals the saturating fold is the known
    /// Open MPI bug, reported as such. `part` selects this rank's slice of the full result.
    fn compare_reduced(
        &self,
        r: i32,
        expect: &[S],
        got: &[S],
        full_len: i64,
        part: std::ops::Range<usize>,
        p: i32,
    ) -> Res<Verdict> {
        let what = self.reduce.map_or("reduced", |(op, _)| op.name());
        match self.compare(r, what, expect, got) {
            Ok(()) => Ok(Verdict::Pass),
            Err(msg) => {
                if let Some((sat, at_bound)) = self.saturating {
                    // A vectorized kernel saturates the SIMD-sized part and wraps the scalar
                    // tail, and a collective adds partial sums in its own order, so a wrong
                    // element is explained only by its sum having overflowed somewhere.
                    let saturated = self.fold_with(sat, full_len, p);
                    let explained = saturated.get(part).is_some_and(|sat| {
                        sat.len() == got.len()
                            && got
                                .iter()
                                .zip(expect)
                                .zip(sat)
                                .all(|((g, e), s)| g == e || at_bound(s))
                    });
                    if explained {
                        return Ok(Verdict::KnownBug(msg));
                    }
                }
                Err(msg)
            }
        }
    }

    fn compare(&self, rank: i32, what: &str, expected: &[S], got: &[S]) -> Res<()> {
        if expected.len() != got.len() {
            return Err(format!(
                "rank {rank}: {what}: expected {} values, got {}",
                expected.len(),
                got.len()
            ));
        }
        match expected.iter().zip(got).position(|(a, b)| a != b) {
            None => Ok(()),
            Some(i) => Err(format!(
                "rank {rank}: {what}: first difference at index {i}: expected {:?}, got {:?}",
                expected[i], got[i]
            )),
        }
    }

    /// Runs `f` with a send tensor of `send` and a receive tensor of `recv_len` storage
    /// elements, returning the received values.
    fn with_pair(
        &self,
        dc: &Comm<'_>,
        send: Vec<S>,
        recv_len: usize,
        f: impl FnOnce(&dyn Tensor, &mut dyn Tensor) -> Result<(), Error>,
    ) -> Res<Vec<S>> {
        let fill = (self.value)(-1, -1);
        let src = self.owned_send(send)?;
        let dst = self.owned(vec![fill; recv_len])?;
        src.with_tensor(|s| {
            dst.with_tensor(|d| {
                let done = f(&*s, d).map_err(|err| match err {
                    // A documented limitation (per-rank blocks need contiguous tensors), not
                    // a wrong result: reported as a skip.
                    Error::StridedNotSupported { .. } => format!("{SKIP_MARK}{err}"),
                    other => e(other),
                });
                note_route(dc);
                done
            })
        })?;
        let mut got = self.read(dst, recv_len)?;
        if INJECT.with(|i| i.get()) && !got.is_empty() {
            let at = 3.min(got.len() - 1);
            got[at] = fill;
        }
        Ok(got)
    }

    fn case(&self, dc: &Comm<'_>, op: &str, n: i64) -> Res<Verdict> {
        let w = dc.comm();
        let (r, p) = (w.rank(), w.size());
        let (next, prev) = ((r + 1) % p, (r + p - 1) % p);
        let k = self.per_elem;
        let nk = n as usize * k;
        let pn = i64::from(p) * n;
        let counts_v: Vec<i64> = (0..i64::from(p)).map(|i| (i + n) % (n + 1)).collect();
        let displs_v: Vec<i64> = counts_v
            .iter()
            .scan(0, |acc, &c| {
                let d = *acc;
                *acc += c;
                Some(d)
            })
            .collect();
        let total_v: i64 = counts_v.iter().sum();
        match op {
            "send-recv" => {
                if p < 2 {
                    return Ok(Verdict::Skip("needs 2 ranks".into()));
                }
                let got = self.with_pair(dc, self.values(r, n, 0), nk, |s, d| {
                    if r % 2 == 0 {
                        dc.send_tensor(s, next, 11)?;
                        dc.recv_tensor(d, prev, 11).map(drop)
                    } else {
                        dc.recv_tensor(d, prev, 11)?;
                        dc.send_tensor(s, next, 11)
                    }
                })?;
                self.compare(r, "from previous rank", &self.values(prev, n, 0), &got)?;
            }
            "sendrecv" => {
                let got = self.with_pair(dc, self.values(r, n, 0), nk, |s, d| {
                    dc.sendrecv_tensor(s, next, 12, d, prev, 12).map(drop)
                })?;
                self.compare(r, "from previous rank", &self.values(prev, n, 0), &got)?;
            }
            "isend-irecv" => {
                if device().needs_runtime() {
                    return Ok(Verdict::Skip(
                        "DeviceComm has no nonblocking operations (GPU tensors go through the \
                         blocking ones)"
                            .into(),
                    ));
                }
                let got = self.with_pair(dc, self.values(r, n, 0), nk, |s, d| {
                    let send = SendSpec::new(s)?;
                    let mut recv = RecvSpec::new(d)?;
                    mpi::request::scope(|scope| -> Result<(), Error> {
                        let rr = w.immediate_recv_tensor(scope, &mut recv, prev, 13)?;
                        let sr = w.immediate_send_tensor(scope, &send, next, 13)?;
                        sr.wait();
                        rr.wait();
                        Ok(())
                    })
                })?;
                self.compare(r, "from previous rank", &self.values(prev, n, 0), &got)?;
            }
            "bcast" => {
                let root = p - 1;
                let fill = (self.value)(-1, -1);
                let init = if r == root {
                    self.values(root, n, 0)
                } else {
                    vec![fill; nk]
                };
                let buf = self.owned(init)?;
                buf.with_tensor(|t| {
                    let done = dc.broadcast_tensor(t, root).map_err(e);
                    note_route(dc);
                    done
                })?;
                let got = self.read(buf, nk)?;
                self.compare(r, "broadcast", &self.values(root, n, 0), &got)?;
            }
            "reduce" | "allreduce" | "allreduce-inplace" | "reduce-scatter-block" => {
                let Some((rop, _)) = self.reduce else {
                    return Ok(Verdict::Skip(format!("{} has no MPI reduction", self.name)));
                };
                match op {
                    "reduce" => {
                        let (_, expect) = self.fold(n, p).unwrap_or((rop, vec![]));
                        let got = self.with_pair(dc, self.values(r, n, 0), nk, |s, d| {
                            let recv: Option<&mut dyn Tensor> = if r == 0 { Some(d) } else { None };
                            dc.reduce_tensor(s, recv, rop, 0)
                        })?;
                        if r == 0 {
                            return self.compare_reduced(r, &expect, &got, n, 0..nk, p);
                        }
                    }
                    "allreduce" => {
                        let (_, expect) = self.fold(n, p).unwrap_or((rop, vec![]));
                        let got = self.with_pair(dc, self.values(r, n, 0), nk, |s, d| {
                            dc.all_reduce_tensor(s, d, rop)
                        })?;
                        return self.compare_reduced(r, &expect, &got, n, 0..nk, p);
                    }
                    "allreduce-inplace" => {
                        let (_, expect) = self.fold(n, p).unwrap_or((rop, vec![]));
                        let buf = self.owned(self.values(r, n, 0))?;
                        buf.with_tensor(|t| {
                            let done = dc.all_reduce_tensor_in_place(t, rop).map_err(e);
                            note_route(dc);
                            done
                        })?;
                        let got = self.read(buf, nk)?;
                        return self.compare_reduced(r, &expect, &got, n, 0..nk, p);
                    }
                    _ => {
                        let (_, full) = self.fold(pn, p).unwrap_or((rop, vec![]));
                        let got = self.with_pair(dc, self.values(r, pn, 0), nk, |s, d| {
                            dc.reduce_scatter_block_tensor(s, d, rop)
                        })?;
                        let part = r as usize * nk..(r as usize + 1) * nk;
                        let mine = &full[part.clone()];
                        return self.compare_reduced(r, mine, &got, pn, part, p);
                    }
                }
            }
            "gather" => {
                let got = self.with_pair(dc, self.values(r, n, 0), p as usize * nk, |s, d| {
                    let recv: Option<&mut dyn Tensor> = if r == 0 { Some(d) } else { None };
                    dc.gather_tensor(s, recv, 0)
                })?;
                if r == 0 {
                    let expect: Vec<S> = (0..p).flat_map(|i| self.values(i, n, 0)).collect();
                    self.compare(r, "gathered", &expect, &got)?;
                }
            }
            "gatherv" => {
                let mine = counts_v[r as usize];
                let got =
                    self.with_pair(dc, self.values(r, mine, 0), total_v as usize * k, |s, d| {
                        let recv = if r == 0 {
                            Some((d, &counts_v[..], &displs_v[..]))
                        } else {
                            None
                        };
                        dc.gatherv_tensor(s, recv, 0)
                    })?;
                if r == 0 {
                    let expect: Vec<S> = (0..p)
                        .flat_map(|i| self.values(i, counts_v[i as usize], 0))
                        .collect();
                    self.compare(r, "gathered", &expect, &got)?;
                }
            }
            "scatter" => {
                let got = self.with_pair(dc, self.values(0, pn, 0), nk, |s, d| {
                    let send: Option<&dyn Tensor> = if r == 0 { Some(s) } else { None };
                    dc.scatter_tensor(send, d, 0)
                })?;
                self.compare(r, "scattered", &self.values(0, n, i64::from(r) * n), &got)?;
            }
            "scatterv" => {
                let mine = counts_v[r as usize];
                let got =
                    self.with_pair(dc, self.values(0, total_v, 0), mine as usize * k, |s, d| {
                        let send = if r == 0 {
                            Some((s, &counts_v[..], &displs_v[..]))
                        } else {
                            None
                        };
                        dc.scatterv_tensor(send, d, 0)
                    })?;
                let expect = self.values(0, mine, displs_v[r as usize]);
                self.compare(r, "scattered", &expect, &got)?;
            }
            "allgather" => {
                let got = self.with_pair(dc, self.values(r, n, 0), p as usize * nk, |s, d| {
                    dc.all_gather_tensor(s, d)
                })?;
                let expect: Vec<S> = (0..p).flat_map(|i| self.values(i, n, 0)).collect();
                self.compare(r, "gathered", &expect, &got)?;
            }
            "allgatherv" => {
                let mine = counts_v[r as usize];
                let got =
                    self.with_pair(dc, self.values(r, mine, 0), total_v as usize * k, |s, d| {
                        dc.all_gatherv_tensor(s, d, &counts_v, &displs_v)
                    })?;
                let expect: Vec<S> = (0..p)
                    .flat_map(|i| self.values(i, counts_v[i as usize], 0))
                    .collect();
                self.compare(r, "gathered", &expect, &got)?;
            }
            "alltoall" => {
                // Rank r's block j holds values(r, n, j n).
                let got = self.with_pair(dc, self.values(r, pn, 0), p as usize * nk, |s, d| {
                    dc.all_to_all_tensor(s, d)
                })?;
                let expect: Vec<S> = (0..p)
                    .flat_map(|i| self.values(i, n, i64::from(r) * n))
                    .collect();
                self.compare(r, "exchanged", &expect, &got)?;
            }
            "alltoallv" => {
                // Rank i sends counts_v[j] elements to rank j, taken from values(i, ·, displs_v[j]).
                let recv_counts = vec![counts_v[r as usize]; p as usize];
                let recv_displs: Vec<i64> = (0..i64::from(p))
                    .map(|i| i * counts_v[r as usize])
                    .collect();
                let got = self.with_pair(
                    dc,
                    self.values(r, total_v, 0),
                    (counts_v[r as usize] * i64::from(p)) as usize * k,
                    |s, d| {
                        dc.all_to_allv_tensor(
                            s,
                            &counts_v,
                            &displs_v,
                            d,
                            &recv_counts,
                            &recv_displs,
                        )
                    },
                )?;
                let expect: Vec<S> = (0..p)
                    .flat_map(|i| self.values(i, counts_v[r as usize], displs_v[r as usize]))
                    .collect();
                self.compare(r, "exchanged", &expect, &got)?;
            }
            other => return Ok(Verdict::Skip(format!("unknown operation {other}"))),
        }
        Ok(Verdict::Pass)
    }
}

impl<S: AnyBits + PartialEq + Debug> Runner for Kind<S> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn run(&self, dc: &Comm<'_>, op: &str, layout: Layout, len: i64) -> Verdict {
        LAYOUT.with(|l| l.set(layout));
        match self.case(dc, op, len) {
            Ok(v) => v,
            Err(msg) => match msg.strip_prefix(SKIP_MARK) {
                Some(why) => Verdict::Skip(why.to_string()),
                None => Verdict::Fail(msg),
            },
        }
    }
}

fn wrap_int<S>(v: i64) -> S
where
    S: TryFrom<i64> + Default,
{
    S::try_from(v).unwrap_or_default()
}

macro_rules! int_kind {
    ($name:literal, $t:ty, $code:expr, $bits:expr) => {
        Box::new(Kind::<$t> {
            name: $name,
            dtype: DType::new($code, $bits),
            per_elem: 1,
            value: |i, r| wrap_int::<$t>((i * 7 + i64::from(r) * 3).rem_euclid(101)),
            reduce: Some((ReduceOp::Sum, |a, b| a.wrapping_add(b))),
            saturating: Some((
                |a, b| a.saturating_add(b),
                |v| *v == <$t>::MAX || *v == <$t>::MIN,
            )),
        }) as Box<dyn Runner>
    };
}

fn float_value(i: i64, r: i32) -> f64 {
    // Small integers and halves: exact in every float width, so sums are exact.
    ((i * 5 + i64::from(r) * 11).rem_euclid(257) - 128) as f64 * 0.5
}

fn byte_value(i: i64, r: i32) -> u8 {
    (i * 31 + i64::from(r) * 17 + 3).rem_euclid(256) as u8
}

fn kinds() -> Vec<Box<dyn Runner>> {
    let transfer_u8 = |name: &'static str, c: u8| -> Box<dyn Runner> {
        Box::new(Kind::<u8> {
            name,
            dtype: DType::new(c, 8),
            per_elem: 1,
            value: byte_value,
            reduce: None,
            saturating: None,
        })
    };
    let transfer_u32 = |name: &'static str, c: u8| -> Box<dyn Runner> {
        Box::new(Kind::<u32> {
            name,
            dtype: DType::new(c, 32),
            per_elem: 1,
            value: |i, r| (i as u32).wrapping_mul(2_654_435_761) ^ (r as u32).wrapping_mul(40_503),
            reduce: None,
            saturating: None,
        })
    };
    vec![
        Box::new(Kind::<u8> {
            name: "bool",
            dtype: DType::new(code::BOOL, 8),
            per_elem: 1,
            value: |i, r| u8::from((i + i64::from(r)) % 3 == 0),
            reduce: Some((ReduceOp::LogicalOr, |a, b| u8::from(a != 0 || b != 0))),
            saturating: None,
        }),
        int_kind!("int8", i8, code::INT, 8),
        int_kind!("int16", i16, code::INT, 16),
        int_kind!("int32", i32, code::INT, 32),
        int_kind!("int64", i64, code::INT, 64),
        int_kind!("uint8", u8, code::UINT, 8),
        int_kind!("uint16", u16, code::UINT, 16),
        int_kind!("uint32", u32, code::UINT, 32),
        int_kind!("uint64", u64, code::UINT, 64),
        // Half sums go through dlpack-mpi's user-defined operations; the values keep every
        // partial sum exact in the format (float16: halves up to ±64; bfloat16: integers up
        // to ±8), so the expected fold does not depend on MPI's order.
        Box::new(Kind::<half::f16> {
            name: "float16",
            dtype: DType::new(code::FLOAT, 16),
            per_elem: 1,
            value: |i, r| half::f16::from_f64(float_value(i, r)),
            reduce: Some((ReduceOp::Sum, |a, b| {
                half::f16::from_f32(a.to_f32() + b.to_f32())
            })),
            saturating: None,
        }),
        Box::new(Kind::<half::bf16> {
            name: "bfloat16",
            dtype: DType::new(code::BFLOAT, 16),
            per_elem: 1,
            value: |i, r| {
                half::bf16::from_f64(((i * 5 + i64::from(r) * 11).rem_euclid(17) - 8) as f64)
            },
            reduce: Some((ReduceOp::Sum, |a, b| {
                half::bf16::from_f32(a.to_f32() + b.to_f32())
            })),
            saturating: None,
        }),
        Box::new(Kind::<f32> {
            name: "float32",
            dtype: DType::new(code::FLOAT, 32),
            per_elem: 1,
            value: |i, r| float_value(i, r) as f32,
            reduce: Some((ReduceOp::Sum, |a, b| a + b)),
            saturating: None,
        }),
        Box::new(Kind::<f64> {
            name: "float64",
            dtype: DType::new(code::FLOAT, 64),
            per_elem: 1,
            value: float_value,
            reduce: Some((ReduceOp::Sum, |a, b| a + b)),
            saturating: None,
        }),
        Box::new(Kind::<f32> {
            name: "float32x4",
            dtype: DType::new(code::FLOAT, 32).with_lanes(4),
            per_elem: 4,
            value: |i, r| float_value(i, r) as f32,
            reduce: Some((ReduceOp::Sum, |a, b| a + b)),
            saturating: None,
        }),
        transfer_u32("complex32", code::COMPLEX),
        Box::new(Kind::<Complex32> {
            name: "complex64",
            dtype: DType::new(code::COMPLEX, 64),
            per_elem: 1,
            value: |i, r| Complex32::new(float_value(i, r) as f32, float_value(i + 3, -r) as f32),
            reduce: Some((ReduceOp::Sum, |a, b| a + b)),
            saturating: None,
        }),
        Box::new(Kind::<Complex64> {
            name: "complex128",
            dtype: DType::new(code::COMPLEX, 128),
            per_elem: 1,
            value: |i, r| Complex64::new(float_value(i, r), float_value(i + 3, -r)),
            reduce: Some((ReduceOp::Sum, |a, b| a + b)),
            saturating: None,
        }),
        transfer_u8("float8_e3m4", 7),
        transfer_u8("float8_e4m3", 8),
        transfer_u8("float8_e4m3b11fnuz", 9),
        transfer_u8("float8_e4m3fn", 10),
        transfer_u8("float8_e4m3fnuz", 11),
        transfer_u8("float8_e5m2", 12),
        transfer_u8("float8_e5m2fnuz", 13),
        transfer_u8("float8_e8m0fnu", 14),
        transfer_u32("bcomplex32", code::BCOMPLEX),
    ]
}

/// One case of the matrix.
struct Case<'k> {
    op: &'static str,
    kind: &'k dyn Runner,
    layout: Layout,
    len: i64,
    dev: Dev,
    /// The transport part of the name (`host`, `managed`, `direct`, `staged`).
    transport: &'static str,
}

impl Case<'_> {
    fn name(&self) -> String {
        case_name(
            self.op,
            self.kind.name(),
            self.layout,
            self.dev.name(),
            self.transport,
            self.len,
        )
    }
}

/// Combines the verdicts of all ranks at rank 0: fail if any rank failed (with every failing
/// rank's message), else skip if any skipped, else pass.
fn agree(w: &SimpleCommunicator, v: Verdict) -> Option<Verdict> {
    let (level, msg) = match v {
        Verdict::Pass => (0i32, String::new()),
        Verdict::Skip(m) => (1, m),
        Verdict::KnownBug(m) => (2, m),
        Verdict::Fail(m) => (3, m),
    };
    let mut worst = 0i32;
    w.all_reduce_into(&level, &mut worst, SystemOperation::max());
    // Every contribution is at least one byte (a trailing newline): an empty Rust slice has
    // the dangling address 0x1, which Open MPI reads as MPI_IN_PLACE.
    let mut mine: Vec<u8> = if level == worst {
        msg.into_bytes()
    } else {
        Vec::new()
    };
    mine.push(b'\n');
    let root = w.process_at_rank(0);
    let len = mine.len() as i32;
    if w.rank() != 0 {
        root.gather_into(&len);
        root.gather_varcount_into(&mine[..]);
        return None;
    }
    let mut lens = vec![0i32; w.size() as usize];
    root.gather_into_root(&len, &mut lens[..]);
    let displs: Vec<i32> = lens
        .iter()
        .scan(0, |acc, &l| {
            let d = *acc;
            *acc += l;
            Some(d)
        })
        .collect();
    let mut all = vec![0u8; lens.iter().sum::<i32>() as usize];
    {
        let mut part = PartitionMut::new(&mut all[..], &lens[..], &displs[..]);
        root.gather_varcount_into_root(&mine[..], &mut part);
    }
    // Group identical diagnoses: "rank 2: x" and "rank 3: x" become "ranks 2, 3: x".
    let mut messages: Vec<(Vec<String>, String)> = Vec::new();
    for (l, d) in lens.iter().zip(&displs) {
        let s = String::from_utf8_lossy(&all[*d as usize..(*d + *l - 1) as usize]).into_owned();
        if s.is_empty() {
            continue;
        }
        // A message without a "rank N: " prefix is the same on every rank: keep it once.
        let (who, what) = match s.strip_prefix("rank ").and_then(|t| t.split_once(": ")) {
            Some((r, rest)) => (Some(r.to_string()), rest.to_string()),
            None => (None, s),
        };
        match messages.iter_mut().find(|(_, m)| *m == what) {
            Some((ranks, _)) => ranks.extend(who),
            None => messages.push((who.into_iter().collect(), what)),
        }
    }
    let messages: Vec<String> = messages
        .into_iter()
        .map(|(ranks, what)| match ranks.as_slice() {
            [] => what,
            [r] => format!("rank {r}: {what}"),
            _ => format!("ranks {}: {what}", ranks.join(", ")),
        })
        .collect();
    let text = messages.join("; ");
    Some(match worst {
        0 => Verdict::Pass,
        1 => Verdict::Skip(text),
        2 => Verdict::KnownBug(text),
        _ => Verdict::Fail(text),
    })
}

/// How a pattern of `-k`/`-e` matches a case name.
enum Pattern {
    /// A plain string: matches names that contain it.
    Substring(String),
    /// A pattern with `*`, `?` or `[`: matches whole names as a glob.
    Glob(glob::Pattern),
}

impl Pattern {
    fn new(text: &str) -> Result<Pattern, String> {
        if text.contains(['*', '?', '[']) {
            glob::Pattern::new(text)
                .map(Pattern::Glob)
                .map_err(|err| format!("pattern `{text}` is not a valid glob: {err}"))
        } else {
            Ok(Pattern::Substring(text.to_string()))
        }
    }

    fn matches(&self, name: &str) -> bool {
        match self {
            Pattern::Substring(s) => name.contains(s.as_str()),
            Pattern::Glob(g) => g.matches(name),
        }
    }
}

/// A case as indices into `OPS`, the dtype list, `LAYOUTS`, its length, and an index into
/// `DEVS`: what rank 0 broadcasts so that every rank runs the same list.
type CaseIndex = [i64; 5];

/// Rank 0's choice of cases from the options and the devices every rank can use (with the
/// transport part of their names), or the one-line reason it refuses them.
fn select(
    kinds: &[Box<dyn Runner>],
    args: &CheckArgs,
    devices: &[(Dev, &'static str)],
) -> Result<Vec<CaseIndex>, String> {
    let kind_names: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
    let layout_names: Vec<&str> = LAYOUTS.iter().map(|l| l.name()).collect();
    for (what, given, known) in [
        ("operation", &args.op, OPS),
        ("dtype", &args.dtype, &kind_names[..]),
        ("layout", &args.layout, &layout_names[..]),
    ] {
        if let Some(bad) = given.iter().find(|g| !known.contains(&g.as_str())) {
            return Err(format!(
                "unknown {what} `{bad}` (known: {})",
                known.join(", ")
            ));
        }
    }
    if let Some(bad) = args.len.iter().find(|&&l| !(0..=1 << 24).contains(&l)) {
        return Err(format!("length {bad} is outside 0..=16777216 elements"));
    }
    let compile = |flag: &str, texts: &[String]| -> Result<Vec<(String, Pattern)>, String> {
        texts
            .iter()
            .map(|t| {
                if t.is_empty() {
                    // A substring of every name: it would select (or exclude) every case.
                    return Err(format!("{flag} `` is empty (give a part of a case name)"));
                }
                Pattern::new(t).map(|p| (t.clone(), p))
            })
            .collect()
    };
    let include = compile("-k", &args.include)?;
    let exclude = compile("-e", &args.exclude)?;
    let mut used_include = vec![false; include.len()];
    let mut used_exclude = vec![false; exclude.len()];
    let wanted = |given: &[String], name: &str| given.is_empty() || given.iter().any(|g| g == name);
    let mut cases = Vec::new();
    for &(dev, transport) in devices {
        let d = DEVS.iter().position(|x| *x == dev).unwrap_or(0) as i64;
        for (o, op) in OPS.iter().enumerate() {
            for (k, kind) in kinds.iter().enumerate() {
                for (l, layout) in LAYOUTS.iter().enumerate() {
                    for &len in &args.len {
                        // A 0-d tensor has exactly one element.
                        if *layout == Layout::Scalar && len != 1 {
                            continue;
                        }
                        if !wanted(&args.op, op)
                            || !wanted(&args.dtype, kind.name())
                            || !wanted(&args.layout, layout.name())
                        {
                            continue;
                        }
                        let name = case_name(op, kind.name(), *layout, dev.name(), transport, len);
                        let mut included = include.is_empty();
                        for (i, (_, p)) in include.iter().enumerate() {
                            if p.matches(&name) {
                                used_include[i] = true;
                                included = true;
                            }
                        }
                        if !included {
                            continue;
                        }
                        let mut excluded = false;
                        for (i, (_, p)) in exclude.iter().enumerate() {
                            if p.matches(&name) {
                                used_exclude[i] = true;
                                excluded = true;
                            }
                        }
                        if !excluded {
                            cases.push([o as i64, k as i64, l as i64, len, d]);
                        }
                    }
                }
            }
        }
    }
    for ((flag, patterns), used) in [("-k", &include), ("-e", &exclude)]
        .into_iter()
        .zip([used_include, used_exclude])
    {
        if let Some(((text, _), _)) = patterns.iter().zip(&used).find(|(_, u)| !**u) {
            return Err(format!(
                "{flag} `{text}` matches no case (names read op/dtype/layout/device/transport/len; \
                 see --list)"
            ));
        }
    }
    if cases.is_empty() {
        return Err(
            "no case left to run: the options select no case, or -e excludes every \
                    case they select (see --list)"
                .into(),
        );
    }
    Ok(cases)
}

/// Rank 0's [`select`] on every rank: rank 0 decides and broadcasts the case list (or that
/// it refused the options, after printing why), so all ranks run the same cases even when
/// their command lines differ.
fn agree_on_cases(
    w: &SimpleCommunicator,
    kinds: &[Box<dyn Runner>],
    args: &CheckArgs,
    devices: &[(Dev, &'static str)],
) -> Option<(Producer, Vec<CaseIndex>)> {
    let root = w.process_at_rank(0);
    let mut chosen = Vec::new();
    let mut count: i64 = -1;
    let mut made_by = 0i32;
    if w.rank() == 0 {
        match resolve_producer(args.producer).and_then(|p| Ok((p, select(kinds, args, devices)?))) {
            Ok((p, cases)) => {
                made_by = i32::from(p == Producer::Numpy);
                count = cases.len() as i64;
                chosen = cases.into_iter().flatten().collect();
            }
            Err(why) => eprintln!("dlpack-mpi check: {why}"),
        }
    }
    root.broadcast_into(&mut count);
    root.broadcast_into(&mut made_by);
    if count < 0 {
        return None;
    }
    chosen.resize(count as usize * 5, 0);
    if count > 0 {
        root.broadcast_into(&mut chosen[..]);
    }
    let producer = if made_by == 1 {
        Producer::Numpy
    } else {
        Producer::Rust
    };
    Some((
        producer,
        chosen
            .chunks_exact(5)
            .map(|c| [c[0], c[1], c[2], c[3], c[4]])
            .collect(),
    ))
}

/// `Auto` made concrete, and `Numpy` checked: Python support built and NumPy importable.
fn resolve_producer(requested: Producer) -> Result<Producer, String> {
    match requested {
        Producer::Rust => Ok(Producer::Rust),
        Producer::Numpy | Producer::Auto => match numpy_version() {
            Ok(_) => Ok(Producer::Numpy),
            Err(_) if requested == Producer::Auto => Ok(Producer::Rust),
            Err(why) => Err(why),
        },
    }
}

/// NumPy's version in the embedded interpreter (started here if needed).
#[cfg(feature = "python")]
fn numpy_version() -> Result<String, String> {
    use pyo3::types::PyAnyMethods;
    pyo3::Python::initialize();
    pyo3::Python::attach(|py| {
        let np = dlpack_mpi::python::numpy(py).map_err(|err| format!("producer `numpy`: {err}"))?;
        np.getattr("__version__")
            .map(|v| v.to_string())
            .map_err(|err| format!("producer `numpy`: {err}"))
    })
}

#[cfg(not(feature = "python"))]
fn numpy_version() -> Result<String, String> {
    Err(
        "producer `numpy` needs Python support, which this build does not have \
         (feature `python`)"
            .into(),
    )
}

/// One finished case, as the JSON and JUnit reports hold it.
#[derive(Debug, serde::Serialize)]
struct Record {
    name: String,
    op: &'static str,
    dtype: &'static str,
    layout: &'static str,
    device: &'static str,
    /// The transport part of the name: `host`, `managed`, `direct` or `staged`.
    transport: &'static str,
    /// The route the tensors took (`host`, `managed`, `direct`, `staged`; rank 0's, the
    /// most telling of the case's operations); absent when no operation ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    route: Option<String>,
    /// Logical elements per tensor.
    len: i64,
    /// `pass`, `fail`, `skip` or `known-bug`.
    status: &'static str,
    /// Why it failed, was skipped or hit a known bug.
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    /// Wall time of the case on rank 0, including the agreement of the verdicts.
    seconds: f64,
}

/// The JSON report.
#[derive(Debug, serde::Serialize)]
struct Report<'r> {
    tool: String,
    mpi_library: String,
    ranks: i32,
    passed: u32,
    failed: u32,
    skipped: u32,
    known_bugs: u32,
    cases: &'r [Record],
}

fn write_junit(path: &std::path::Path, records: &[Record], seconds: f64) -> Result<(), String> {
    use quick_junit::{NonSuccessKind, TestCase, TestCaseStatus, TestSuite};
    let mut suite = TestSuite::new("dlpack-mpi check");
    for r in records {
        let mut status = match r.status {
            "pass" => TestCaseStatus::success(),
            "fail" => TestCaseStatus::non_success(NonSuccessKind::Failure),
            // A known MPI-library bug: a wrong result the runner recognised; reported with
            // its own type so that CI shows it without failing the run.
            _ => TestCaseStatus::skipped(),
        };
        if let Some(m) = &r.message {
            status.set_message(m.as_str());
        }
        if r.status == "known-bug" {
            status.set_type("known-mpi-library-bug");
        }
        let mut case = TestCase::new(r.name.as_str(), status);
        case.set_classname(format!("dlpack-mpi.check.{}", r.op));
        case.set_time(std::time::Duration::from_secs_f64(r.seconds));
        suite.add_test_case(case);
    }
    suite.set_time(std::time::Duration::from_secs_f64(seconds));
    let mut report = quick_junit::Report::new("dlpack-mpi");
    report.add_test_suite(suite);
    let file = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    report
        .serialize(std::io::BufWriter::new(file))
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn write_json(path: &std::path::Path, report: &Report<'_>) -> Result<(), String> {
    let file = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    serde_json::to_writer_pretty(&mut out, report)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    writeln!(out).map_err(|e| format!("{}: {e}", path.display()))
}

fn case_name(
    op: &str,
    dtype: &str,
    layout: Layout,
    device: &str,
    transport: &str,
    len: i64,
) -> String {
    format!("{op}/{dtype}/{}/{device}/{transport}/{len}", layout.name())
}

/// The MPI library's version string (`-v`, reports); the header shows its first line up to
/// the first comma.
fn library_name() -> String {
    mpi::environment::library_version()
        .unwrap_or_default()
        .trim_end_matches(['\0', '\n'])
        .trim()
        .to_string()
}

/// What every rank needs before the cases: the communicator the cases go through, the
/// devices of the run with the transport part of their names, and the GPU runtime.
struct Setup<'c> {
    dc: Comm<'c>,
    devices: Vec<(Dev, &'static str)>,
    gpu: Option<crate::Gpu>,
}

/// Rank 0's `--device`, `--transport` and `--simulate-device`, made every rank's, then the GPU
/// runtime and the communicator, agreed by all ranks (one rank without a runtime, or whose
/// MPI refuses `direct`, refuses the run for all).
fn setup<'c>(w: &'c SimpleCommunicator, args: &CheckArgs) -> Result<Setup<'c>, String> {
    use crate::DeviceArg as A;
    const ARGS: [A; 5] = [A::Cpu, A::CudaHost, A::Cuda, A::CudaManaged, A::All];
    const TRANSPORTS: [Transport; 3] = [Transport::Auto, Transport::Direct, Transport::Staged];
    let mut chosen = [
        ARGS.iter().position(|a| *a == args.device).unwrap_or(0) as i32,
        TRANSPORTS
            .iter()
            .position(|t| *t == args.transport)
            .unwrap_or(0) as i32,
        i32::from(args.simulate_device),
    ];
    w.process_at_rank(0).broadcast_into(&mut chosen[..]);
    let (device, transport, simulate) = (
        ARGS[chosen[0] as usize],
        TRANSPORTS[chosen[1] as usize],
        chosen[2] != 0,
    );
    let mut devs = match device {
        A::Cpu => vec![Dev::Cpu],
        A::CudaHost => vec![Dev::CudaHost],
        A::Cuda => vec![Dev::Cuda],
        A::CudaManaged => vec![Dev::CudaManaged],
        A::All => DEVS.to_vec(),
    };
    let gpu = if devs.iter().any(|d| d.needs_runtime()) {
        match crate::agreed(w, crate::gpu_runtime(simulate)) {
            Ok(g) => Some(g),
            // `all`: the GPU devices are left out.
            Err(_) if device == A::All => None,
            Err(_) if device == A::CudaManaged && !simulate => {
                return Err(
                    "device `cuda-managed` runs only with simulated memory for now \
                     (no managed-memory producer yet; add --simulate-device, or use \
                     `--device cuda`)"
                        .into(),
                )
            }
            Err(why) => {
                return Err(format!(
                    "device `{}` needs a GPU runtime: {why}",
                    device.name()
                ))
            }
        }
    } else {
        None
    };
    match gpu {
        None => devs.retain(|d| !d.needs_runtime()),
        // Real managed memory has no producer here yet (CudaExport labels kDLCUDA).
        Some(g) if !g.simulated => {
            if device == A::CudaManaged {
                return Err(
                    "device `cuda-managed` runs only with simulated memory for now \
                     (no managed-memory producer yet); use `--device cuda`"
                        .into(),
                );
            }
            devs.retain(|d| *d != Dev::CudaManaged);
        }
        Some(_) => {}
    }
    let gpu_selected = devs.iter().any(|d| d.needs_runtime());
    if transport != Transport::Auto && !gpu_selected {
        return Err(format!(
            "transport `{}` applies to CUDA device memory, and no CUDA device is selected \
             (host tensors always go to MPI directly)",
            transport.name()
        ));
    }
    let dc = match gpu.filter(|_| gpu_selected) {
        Some(g) => crate::agreed(
            w,
            DeviceComm::new(w, Some(g.runtime), transport.library()).map_err(|err| err.to_string()),
        )?,
        // Host memory only: no runtime, no CUDA-awareness query; tensors pass through.
        None => DeviceComm::new(w, None, dlpack_mpi::transport::Transport::Staged)
            .map_err(|err| err.to_string())?,
    };
    let devices = devs.iter().map(|d| (*d, d.transport(&dc))).collect();
    Ok(Setup { dc, devices, gpu })
}

/// Runs the check matrix. Exit status: 0 when no case failed, 1 when one did, 2 when the
/// options were refused (one line on standard error) or a report could not be written.
pub fn run(w: &SimpleCommunicator, args: &CheckArgs) -> ExitCode {
    let kinds = kinds();
    let setup = match setup(w, args) {
        Ok(s) => s,
        Err(why) => {
            if w.rank() == 0 {
                eprintln!("dlpack-mpi check: {why}");
            }
            return ExitCode::from(2);
        }
    };
    let dc = &setup.dc;
    RUNTIME.with(|r| r.set(setup.gpu.map(|g| g.runtime)));
    REAL_CUDA.with(|r| r.set(setup.gpu.is_some_and(|g| !g.simulated)));
    let Some((made_by, indices)) = agree_on_cases(w, &kinds, args, &setup.devices) else {
        return ExitCode::from(2);
    };
    PRODUCER.with(|p| p.set(made_by));
    let producer_line = match made_by {
        Producer::Numpy => match numpy_version() {
            Ok(v) => format!("NumPy {v} arrays"),
            Err(why) => {
                eprintln!("dlpack-mpi check: rank {}: {why}", w.rank());
                w.abort(2)
            }
        },
        _ => "Rust-made tensors".to_string(),
    };
    let cases: Vec<Case> = indices
        .iter()
        .map(|&[o, k, l, len, d]| {
            let dev = DEVS[d as usize];
            Case {
                op: OPS[o as usize],
                kind: kinds[k as usize].as_ref(),
                layout: LAYOUTS[l as usize],
                len,
                dev,
                transport: dev.transport(dc),
            }
        })
        .collect();
    let root = w.rank() == 0;
    if args.list {
        if root {
            // A closed pipe (`--list | head`) ends the listing quietly.
            let mut out = std::io::stdout().lock();
            for c in &cases {
                if writeln!(out, "{}", c.name()).is_err() {
                    break;
                }
            }
        }
        return ExitCode::SUCCESS;
    }
    let library = library_name();
    if root && !args.quiet {
        let mut devices: Vec<&str> = Vec::new();
        for c in &cases {
            if !devices.contains(&c.dev.name()) {
                devices.push(c.dev.name());
            }
        }
        let gpu = match setup.gpu {
            Some(g) if cases.iter().any(|c| c.dev.needs_runtime()) => format!(
                " (GPU runtime: {}; CUDA tensors {})",
                g.runtime.describe(),
                if dc.is_direct() {
                    "direct to a CUDA-aware MPI"
                } else {
                    "staged through pinned host buffers"
                }
            ),
            _ => String::new(),
        };
        println!(
            "dlpack-mpi check: {} case{} at {} rank(s), device {}{gpu}, {producer_line}, {}",
            cases.len(),
            if cases.len() == 1 { "" } else { "s" },
            w.size(),
            devices.join(", "),
            library
                .lines()
                .next()
                .and_then(|l| l.split(',').next())
                .unwrap_or("")
        );
        if args.verbose {
            println!("MPI library: {library}");
        }
    }
    // On a terminal, a progress bar on standard error; elsewhere (pipes, files, mpirun's
    // forwarding) indicatif hides it and only the lines are printed.
    let bar = if root {
        let bar = indicatif::ProgressBar::new(cases.len() as u64);
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} {elapsed_precise} {wide_msg}",
        ) {
            bar.set_style(style);
        }
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    let inject = match args.inject_fault.as_deref().map(Pattern::new).transpose() {
        Ok(p) => p,
        Err(why) => {
            if root {
                eprintln!("dlpack-mpi check: --inject-fault: {why}");
            }
            return ExitCode::from(2);
        }
    };
    let started = std::time::Instant::now();
    let mut records = Vec::new();
    let (mut passed, mut failed, mut skipped, mut known) = (0u32, 0u32, 0u32, 0u32);
    for case in &cases {
        let t0 = std::time::Instant::now();
        let corrupt =
            w.rank() == w.size() - 1 && inject.as_ref().is_some_and(|p| p.matches(&case.name()));
        INJECT.with(|i| i.set(corrupt));
        DEVICE.with(|d| d.set(case.dev));
        ROUTE.with(|r| r.set(None));
        let verdict = case.kind.run(dc, case.op, case.layout, case.len);
        let route = ROUTE.with(|r| r.get());
        let agreed = agree(w, verdict);
        let seconds = t0.elapsed().as_secs_f64();
        let mut stop = false;
        if let Some(v) = agreed {
            let name = match case.dev {
                // Host memory: the name says it all (`cpu/host`).
                Dev::Cpu => case.name(),
                dev => format!(
                    "{} [{} {}]",
                    case.name(),
                    dev.short(),
                    route.map_or_else(|| case.transport.to_string(), |r| r.to_string())
                ),
            };
            let took = if args.verbose {
                format!(" [{:.2} ms]", seconds * 1e3)
            } else {
                String::new()
            };
            let (status, message, line) = match v {
                Verdict::Pass => {
                    passed += 1;
                    (
                        "pass",
                        None,
                        (!args.quiet).then(|| format!("PASS {name}{took}")),
                    )
                }
                Verdict::Skip(why) => {
                    skipped += 1;
                    let line = (!args.quiet).then(|| format!("SKIP {name} ({why}){took}"));
                    ("skip", Some(why), line)
                }
                Verdict::KnownBug(why) => {
                    known += 1;
                    let why = format!("{why}; {SATURATING_SUM_BUG}");
                    let line = Some(format!("KNOWN-BUG {name}: {why}{took}"));
                    ("known-bug", Some(why), line)
                }
                Verdict::Fail(why) => {
                    failed += 1;
                    stop = args.failfast;
                    let line = Some(format!("FAIL {name}: {why}{took}"));
                    ("fail", Some(why), line)
                }
            };
            if let Some(line) = line {
                bar.suspend(|| println!("{line}"));
            }
            bar.inc(1);
            records.push(Record {
                name: case.name(),
                op: case.op,
                dtype: case.kind.name(),
                layout: case.layout.name(),
                device: case.dev.name(),
                transport: case.transport,
                route: route.map(|r| r.to_string()),
                len: case.len,
                status,
                message,
                seconds,
            });
        }
        // Rank 0 decides whether to stop; everyone follows.
        let mut stop_flag = i32::from(stop);
        w.process_at_rank(0).broadcast_into(&mut stop_flag);
        if stop_flag != 0 {
            break;
        }
    }
    bar.finish_and_clear();
    let mut status = i32::from(failed > 0);
    if root {
        if known > 0 {
            println!(
                "{known} case{} hit known MPI-library bugs (KNOWN-BUG lines above; counted as neither \
                 passed, failed nor skipped): the library \
                 computed a wrong result; see the workaround given there",
                if known == 1 { "" } else { "s" }
            );
        }
        println!("{passed} passed, {failed} failed, {skipped} skipped");
        let total = started.elapsed().as_secs_f64();
        let mut written = Ok(());
        if let Some(path) = &args.junit {
            written = written.and_then(|()| write_junit(path, &records, total));
        }
        if let Some(path) = &args.json {
            let report = Report {
                tool: format!("dlpack-mpi {}", env!("CARGO_PKG_VERSION")),
                mpi_library: library,
                ranks: w.size(),
                passed,
                failed,
                skipped,
                known_bugs: known,
                cases: &records,
            };
            written = written.and_then(|()| write_json(path, &report));
        }
        if let Err(why) = written {
            eprintln!("dlpack-mpi check: cannot write the report: {why}");
            status = 2;
        }
    }
    w.process_at_rank(0).broadcast_into(&mut status);
    match status {
        0 => ExitCode::SUCCESS,
        1 => ExitCode::FAILURE,
        _ => ExitCode::from(2),
    }
}
