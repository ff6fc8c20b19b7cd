//! What a case runs with and what it gives back: the run's and the case's context (passed
//! explicitly, instead of ambient state), the verdict, and the error convention of the case
//! bodies (a `String`; one that starts with [`SKIP_MARK`] is a skip).

use std::cell::Cell;

use dlpack_mpi::runtime::DeviceRuntime;
use dlpack_mpi::transport::Route;
use dlpack_mpi::Error;

use super::args::Producer;
use super::matrix::{Comm, Layout};
use super::placement::Here;
use crate::launch::Gpu;

/// A case body's result: the error is a failure's message, or a skip's after [`SKIP_MARK`].
pub(super) type Res<T> = Result<T, String>;

/// Prefix of an error string that is a skip (a documented limitation), not a failure.
pub(super) const SKIP_MARK: &str = "SKIP: ";

/// An unexpected library error as a failure's message.
pub(super) fn e(err: Error) -> String {
    format!("unexpected error: {err}")
}

/// The verdict of one case on one rank.
pub(super) enum Verdict {
    Pass,
    /// A combination that MPI or DLPack rules out (a reduction on a transfer-only dtype, a
    /// point-to-point exchange at one rank): nothing to check, counted apart from skips.
    NotApplicable(String),
    /// A float sum whose exact inputs cannot carry every rank's data (more ranks than the
    /// dtype's significand allows nonzero contributions per element, and too few elements;
    /// `super::exact`): the collective ran without error and what it returned matched the
    /// exact sum, but a rank's lost contribution could have gone unseen. Neither a pass
    /// nor a failure; counted apart.
    NotCheckable(String),
    /// A case that could have been checked and was not (a documented limitation of this
    /// library, a pinned producer that lacks the dtype).
    Skip(String),
    /// The MPI library returned a wrong result that matches a known, documented bug of it
    /// (today one: [`SATURATING_SUM_BUG`]).
    KnownBug(String),
    Fail(String),
}

/// Open MPI 4.1's `op/avx` component computes 8-bit integer sums with saturating SIMD adds,
/// so an overflowing sum clamps instead of wrapping as C (and NumPy, PyTorch) do.
pub(super) const SATURATING_SUM_BUG: &str =
    "the MPI library saturates integer sums instead of wrapping \
     (Open MPI op/avx, open-mpi/ompi#8045, closed as wontfix); \
     workaround: export OMPI_MCA_op=^avx";

/// What every case of a run shares.
pub(super) struct RunContext {
    /// The GPU runtime of this run (`None`: host devices only).
    pub runtime: Option<&'static dyn DeviceRuntime>,
    /// Whether `cuda` tensors are real device memory (cudarc) rather than labelled host
    /// memory (`--simulate-device`).
    #[cfg(feature = "cuda")]
    pub real_cuda: bool,
    /// This rank's CUDA device ordinal (`--gpu`, `DLPACK_MPI_DEVICE` or the node-local rank;
    /// 0 without a GPU): the `device_id` of `cuda` tensors.
    pub ordinal: i32,
    /// Who makes the tensors (resolved: `Rust` or `Numpy`).
    pub producer: Producer,
    /// The stream of this rank's device that check's device memory is allocated and read
    /// on, made at its first use.
    #[cfg(feature = "cuda")]
    stream: std::cell::OnceCell<std::sync::Arc<cudarc::driver::CudaStream>>,
}

impl RunContext {
    /// The context of a run with `gpu` (if any) whose tensors `producer` makes.
    pub(super) fn new(gpu: Option<Gpu>, producer: Producer) -> RunContext {
        RunContext {
            runtime: gpu.map(|g| g.runtime),
            ordinal: gpu.map_or(0, |g| g.ordinal()),
            #[cfg(feature = "cuda")]
            real_cuda: gpu.is_some_and(|g| !g.simulated),
            producer,
            #[cfg(feature = "cuda")]
            stream: std::cell::OnceCell::new(),
        }
    }

    /// The stream of this rank's device (made on first use; a failure is retried next time).
    #[cfg(feature = "cuda")]
    pub(super) fn cuda_stream(&self) -> Res<std::sync::Arc<cudarc::driver::CudaStream>> {
        if let Some(stream) = self.stream.get() {
            return Ok(stream.clone());
        }
        // The ordinal is the runtime's selected device, checked against its count.
        let ordinal = usize::try_from(self.ordinal).map_err(|_| "negative CUDA ordinal")?;
        let ctx =
            cudarc::driver::CudaContext::new(ordinal).map_err(|err| format!("CUDA: {err}"))?;
        Ok(self.stream.get_or_init(|| ctx.default_stream()).clone())
    }
}

/// What one case runs with.
pub(super) struct CaseContext<'r> {
    /// The run's shared context.
    pub run: &'r RunContext,
    /// Where this rank's tensors of the case live: the memories of its send and receive
    /// tensors, and the case's offset.
    pub here: Here,
    /// How the case stores its tensors.
    pub layout: Layout,
    /// Set on the last rank for cases matching the hidden `--inject-fault` pattern: the
    /// received values are corrupted at logical index 3 (or the last) before comparison, to
    /// test the failure path (the report, `-x`, the exit status, the JUnit and JSON files).
    pub inject: bool,
    /// The most telling route the case's `DeviceComm` calls took.
    route: Cell<Option<Route>>,
}

impl<'r> CaseContext<'r> {
    pub(super) fn new(run: &'r RunContext, here: Here, layout: Layout, inject: bool) -> Self {
        CaseContext {
            run,
            here,
            layout,
            inject,
            route: Cell::new(None),
        }
    }

    /// Records the route of the communicator's last operation for the case's line.
    pub(super) fn note_route(&self, dc: &Comm<'_>) {
        self.route.set(self.route.get().max(dc.last_route()));
    }

    /// The most telling route of the case so far (`None`: no operation ran).
    pub(super) fn route(&self) -> Option<Route> {
        self.route.get()
    }
}
