//! Every run-time setting of the crate in one place: the `DLPACK_MPI_*` environment variables,
//! their values and defaults, the functions that read them and the setters that override
//! them (after mpi4py's `mpi4py.rc`, one documented object for every option).
//!
//! | variable | values | default (unset or empty) | meaning | read by | set in code by |
//! | --- | --- | --- | --- | --- | --- |
//! | `DLPACK_MPI_AGREEMENT` ([`AGREEMENT_ENV`]) | `collective`, `local` | `collective` | whether the collectives of [`TensorComm`](crate::comm::TensorComm) agree across ranks before moving data ([`Agreement`]); every rank must use the same | [`agreement`], once | [`set_agreement`] |
//! | `DLPACK_MPI_PACKING` ([`PACKING_ENV`]) | `auto`, `copy`, `derived` | `auto` | how a strided tensor reaches MPI: packed copy or derived datatype ([`Packing`]) | [`packing`], once | [`set_packing`] |
//! | `DLPACK_MPI_PACK_THRESHOLD_BYTES` ([`PACK_THRESHOLD_ENV`]) | a byte count | 16 ([`DEFAULT_PACK_THRESHOLD_BYTES`]); 64 under MPICH ([`MPICH_PACK_THRESHOLD_BYTES`], [`default_pack_threshold_for`]) | [`Packing::Auto`] packs a strided tensor whose contiguous inner block is shorter than this | [`pack_threshold_bytes`], once | [`set_pack_threshold_bytes`] |
//! | `DLPACK_MPI_BUCKET_BYTES` ([`BUCKET_ENV`]) | a byte count ≥ 1 | 25 MiB ([`DEFAULT_BUCKET_BYTES`], PyTorch DDP's `bucket_cap_mb`) | the most bytes of one bucket of a fused collective over a list of tensors (a larger member has a bucket of its own) | [`bucket_bytes`], once | [`set_bucket_bytes`] |
//! | `DLPACK_MPI_FIRST_BUCKET_BYTES` ([`FIRST_BUCKET_ENV`]) | a byte count ≥ 1 | 1 MiB ([`DEFAULT_FIRST_BUCKET_BYTES`], DDP's first bucket) | the same for the first bucket of each dtype, so that communication starts early | [`first_bucket_bytes`], once | [`set_first_bucket_bytes`] |
//! | `DLPACK_MPI_PACK_POOL_BYTES` ([`POOL_CAP_ENV`]) | a byte count; `0` turns the pool off | 256 MiB ([`DEFAULT_POOL_CAP_BYTES`]) | the most idle bytes the scratch pool of packed copies keeps ([`crate::spec::scratch`]) | [`pool_cap_bytes`], once | [`set_pool_cap_bytes`](crate::spec::scratch::set_pool_cap_bytes) (it also trims the pool, so it lives beside it) |
//! | `DLPACK_MPI_HALF_OPS` ([`HALF_OPS_ENV`]) | `auto`, `library`, `mpi` | `auto` | how float16 and bfloat16 reduce ([`HalfOps`]): `auto` with MPI's own datatypes and operations only where the MPI library has them (MPICH ≥ 5: `MPIX_C_FLOAT16`, `MPIX_BFLOAT16`) and a rounding probe, run once per process and purely local (every rank of a job loads the same MPI library, so every rank decides alike), finds them to round as this crate's operations (correctly, to nearest even), else with this crate's user-defined operations ([`crate::comm::halfops::choice`] says which and why); `library` this crate's throughout; `mpi` MPI's own wherever it has them, not guaranteed correctly rounded (MPICH 5.0.2's bfloat16 sums are not); every rank must use the same | [`half_ops`], once | [`set_half_ops`] |
//! | `DLPACK_MPI_PLAN_CHECK` ([`PLAN_CHECK_ENV`]) | `identity`, `each` | `identity` | what each step of a plan ([`crate::comm::Plan`]) checks across the ranks ([`PlanCheck`]): its identity carried in spare elements of its data, or a full agreement before each step (for debugging); every rank must use the same | [`plan_check`], once | [`set_plan_check`] |
//! | `DLPACK_MPI_PLAN_MECHANISM` ([`PLAN_MECHANISM_ENV`]) | `auto`, `blocking`, `persistent` | `auto` | which MPI calls a plan's steps make ([`PlanMechanism`]): `auto` the nonblocking collectives waited for (the same call for `run` and `start` on every rank); `persistent` the MPI-4 persistent ones where the MPI has them; `blocking` the blocking ones in `run`, under a contract; every rank must use the same (the build's signature carries it) | [`plan_mechanism`], once (at each plan's build) | [`set_plan_mechanism`] |
//! | `DLPACK_MPI_CUDA_AWARE` ([`CUDA_AWARE_ENV`]) | `0`, `1` (also `false`/`true`, `no`/`yes`, `off`/`on`) | the MPI library's own query ([`crate::transport::query_library`]) | whether MPI takes CUDA device pointers ([`parse_cuda_aware`]) | [`crate::transport::cuda_awareness`], at each call (each `DeviceComm::new` with `Transport::Auto` or `Direct`) | — |
//! | `DLPACK_MPI_DEVICE` ([`DEVICE_ENV`]) | a device ordinal: `0`, `1`, … | the node-local rank modulo the device count | the GPU this rank uses ([`parse_device_override`]) | [`crate::transport::select_device`], at each call | its `flag` argument (the CLI's `--gpu N`) wins |
//! | `DLPACK_MPI_ALLOW_MPI_MISMATCH` ([`ALLOW_MPI_MISMATCH_ENV`]) | `0`, `1` (also `false`/`true`, `no`/`yes`, `off`/`on`) | `0` | whether the crate runs on an MPI library of another release than the one it was built against ([`crate::mpi_library::ensure_matching`]: the first operation that would enter MPI returns [`Error::MpiLibraryMismatch`] unless this is set; the CLI refuses to start unless it is `1`) | [`allow_mpi_mismatch`], once, and only when the libraries differ | [`set_allow_mpi_mismatch`] |
//! | `DLPACK_MPI_EXCHANGE_API` ([`EXCHANGE_API_ENV`]; feature `python`) | `prefer`, `never`, `require` | `prefer` | whether Python objects are acquired through their DLPack C exchange table (`ExchangeApi`) | `ExchangeApi::from_env`, once (by `python::acquire`) | per call: `python::acquire_with` |
//! | `DLPACK_MPI_UNKNOWN_NAMES` ([`UNKNOWN_NAMES_ENV`]) | `warn`, `ignore` | `warn` | what an environment variable named `DLPACK_MPI_*` that is none of these (nor one of [`TOOL_NAMES`]) gets: one warning on standard error at the first read of any setting, naming the closest known name ([`UnknownNames`]) | [`unknown_names`], once | [`set_unknown_names`] (before the first read of a setting) |
//!
//! **Common rules.** A value is read in any case with surrounding blanks ignored; unset and
//! empty mean the default. Any other value, also one that is not UTF-8 (shown lossily), is
//! [`Error::InvalidSetting`] naming the variable and the value, returned by the function that
//! reads it: a typo is never read as the default. "Once" means on the first call of the
//! reading function: later changes of the environment are not seen, while a setter wins at
//! any time, before or after. "At each call" reads the environment anew (these are read
//! once per communicator or per process anyway). The operations of the crate call the
//! readers; their errors are the operations' errors (before any MPI call; for
//! `DLPACK_MPI_AGREEMENT` see [`agreement`]). [`check_all`] reads every one at once, for a
//! program that refuses a typo at start (the CLI's `check` and `bench` do).
//!
//! **Unknown names.** A variable whose name starts with `DLPACK_MPI_` and is none of the
//! table's, nor one of the names the project's own tools read ([`TOOL_NAMES`]: the
//! scripts' `DLPACK_MPI_IMPL` and `DLPACK_MPI_MPIRUN`, the build's `DLPACK_MPI_PYTHON`, …),
//! is most likely a misspelling that would otherwise be ignored in
//! silence (`DLPACK_MPI_BUCKET_SIZE` for `DLPACK_MPI_BUCKET_BYTES`). The first read of any
//! setting (the first operation that consults one, or [`check_all`]) therefore writes one
//! line to standard error, once per process, naming each such variable and the closest known
//! name:
//!
//! ```text
//! dlpack-mpi: warning: environment variable DLPACK_MPI_BUCKET_SIZE is not a dlpack-mpi setting (did you mean DLPACK_MPI_BUCKET_BYTES?): ignored (DLPACK_MPI_UNKNOWN_NAMES=ignore silences this warning)
//! ```
//!
//! To silence it, set `DLPACK_MPI_UNKNOWN_NAMES=ignore`, or call
//! [`set_unknown_names`]`(`[`UnknownNames::Ignore`]`)` before the first operation; a program
//! that reports the names itself calls [`unknown_env_names`] (the CLI does: its `check` and
//! `bench` refuse such a name, exit status 2, unless `DLPACK_MPI_UNKNOWN_NAMES=ignore`).
//!
//! Build-time variables (`DLPACK_MPI_PYTHON`, `DLPACK_MPI_PYTHON_LIBDIR`, set by build.rs
//! for `python::BUILT_PYTHON`/`BUILT_PYTHON_LIBDIR`) are not settings and are not read here
//! (they are known names: cargo also sets them when it runs a binary).
//!
//! The value types ([`Agreement`], [`Packing`], `ExchangeApi`) are defined here, below every
//! module that reads them. Their old paths (`comm::Agreement`, `comm::Packing`,
//! `python::ExchangeApi`, and the functions and constants at `comm`, `spec::scratch` and
//! `transport`) are deprecated items hidden from the docs (CHANGELOG.md lists them). This module uses only [`crate::error`] (and
//! `MPI_Get_library_version`, which MPI allows at any time, for the pack threshold's default).

use std::sync::{Mutex, MutexGuard};

use crate::error::{Error, Result};

// ---------------------------------------------------------------------------------------
// The shared mechanism
// ---------------------------------------------------------------------------------------

/// One setting: an environment variable read strictly ([`Setting::parse`]), once
/// ([`Setting::get_or`]) or at each call ([`Setting::env_now`]), and overridden by
/// [`Setting::set`], which always wins.
pub(crate) struct Setting<T> {
    /// The environment variable.
    name: &'static str,
    /// What a value may be (the `expected` of [`Error::InvalidSetting`]).
    expected: &'static str,
    /// Reads a trimmed, non-empty value; `None` refuses it.
    read: fn(&str) -> Option<T>,
    /// What [`Setting::get_or`] decided, or what [`Setting::set`] stored.
    state: Mutex<State<T>>,
}

/// The state of a [`Setting`].
enum State<T> {
    /// Neither read nor set yet.
    Unread,
    /// Set, read from the environment, or defaulted.
    Value(T),
    /// The environment held this value, which [`Setting::parse`] refuses (kept, so that
    /// every read returns the same error until a setter replaces it).
    Invalid(String),
}

impl<T: Copy> Setting<T> {
    /// A setting of the variable `name`, whose values `read` reads (given trimmed and
    /// non-empty; `None` refuses a value) and `expected` describes.
    pub(crate) const fn new(
        name: &'static str,
        expected: &'static str,
        read: fn(&str) -> Option<T>,
    ) -> Setting<T> {
        Setting {
            name,
            expected,
            read,
            state: Mutex::new(State::Unread),
        }
    }

    /// Reads one value of the variable: surrounding blanks are ignored; unset (`None`) or
    /// empty → `Ok(None)`.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] naming the variable and the (trimmed) value when `read`
    /// refuses it.
    pub(crate) fn parse(&self, value: Option<&str>) -> Result<Option<T>> {
        self.read_value(value)
            .map_err(|refused| self.invalid(&refused))
    }

    /// [`Setting::parse`], with a refused value (trimmed) as the error.
    fn read_value(&self, value: Option<&str>) -> std::result::Result<Option<T>, String> {
        match value.map(str::trim).filter(|v| !v.is_empty()) {
            None => Ok(None),
            Some(v) => (self.read)(v).map(Some).ok_or_else(|| v.to_string()),
        }
    }

    /// The environment's value now ([`Setting::parse`] of it), ignoring any setter: for the
    /// settings read at each call.
    ///
    /// # Errors
    /// As [`Setting::parse`].
    pub(crate) fn env_now(&self) -> Result<Option<T>> {
        warn_unknown_once();
        self.parse(env_value(self.name).as_deref())
    }

    /// The setting: the last [`Setting::set`]; else the environment's value, read on the
    /// first call; else `default()` (called once, then kept).
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] when the environment held a value [`Setting::parse`]
    /// refuses: at every call, until a setter replaces it.
    pub(crate) fn get_or(&self, default: impl FnOnce() -> T) -> Result<T> {
        warn_unknown_once();
        self.resolve(env_value, default)
    }

    /// [`Setting::get_or`] with the environment read by `env` (the tests' fake one).
    fn resolve(
        &self,
        env: impl FnOnce(&'static str) -> Option<String>,
        default: impl FnOnce() -> T,
    ) -> Result<T> {
        if let Some(decided) = self.answer(&self.lock()) {
            return decided;
        }
        // Read outside the lock: `default` may call MPI, and a setter may come meanwhile.
        let read = self
            .read_value(env(self.name).as_deref())
            .map(|v| v.unwrap_or_else(default));
        let mut state = self.lock();
        // A setter (or another thread's read) that came meanwhile stands.
        if let Some(decided) = self.answer(&state) {
            return decided;
        }
        let (decided, answer) = match read {
            Ok(v) => (State::Value(v), Ok(v)),
            Err(value) => {
                let e = self.invalid(&value);
                (State::Invalid(value), Err(e))
            }
        };
        *state = decided;
        answer
    }

    /// What `state` answers, unless it is [`State::Unread`].
    fn answer(&self, state: &State<T>) -> Option<Result<T>> {
        match state {
            State::Unread => None,
            State::Value(v) => Some(Ok(*v)),
            State::Invalid(value) => Some(Err(self.invalid(value))),
        }
    }

    /// Sets the value: it wins over the environment from now on.
    pub(crate) fn set(&self, value: T) {
        *self.lock() = State::Value(value);
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn invalid(&self, value: &str) -> Error {
        Error::InvalidSetting {
            name: self.name,
            value: value.to_string(),
            expected: self.expected,
        }
    }
}

/// The value of the environment variable `name`; one that is not UTF-8 is shown lossily
/// (so that it is refused by name, never read as unset).
fn env_value(name: &str) -> Option<String> {
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

/// The value of `table` whose name is `value` (any case).
fn choice<T: Copy>(table: &[(&str, T)], value: &str) -> Option<T> {
    table
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(value))
        .map(|&(_, v)| v)
}

/// A byte count: decimal digits only (no sign: `+5` is refused, as `-5` is).
fn byte_count(value: &str) -> Option<usize> {
    if !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse::<usize>().ok()
}

// ---------------------------------------------------------------------------------------
// DLPACK_MPI_AGREEMENT
// ---------------------------------------------------------------------------------------

/// Whether the collectives of [`crate::comm::TensorComm`] agree across ranks before moving
/// data (see the module docs of `comm` and [`set_agreement`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Agreement {
    /// Every rank runs its local checks, then the ranks agree (one all-reduce of three `int64_t`)
    /// and either all enter the data operation or all return an error: the ranks that
    /// refused their own diagnosis, the others [`Error::PeerRefused`]. The default.
    #[default]
    Collective,
    /// No agreement: a rank whose checks fail returns its error at once while its peers
    /// enter the collective and can **hang** there. For callers that validate every rank's
    /// arguments themselves and cannot spare one small all-reduce per collective.
    Local,
}

/// The environment variable that sets the agreement when [`set_agreement`] was not called.
pub const AGREEMENT_ENV: &str = "DLPACK_MPI_AGREEMENT";

static AGREEMENT: Setting<Agreement> = Setting::new(AGREEMENT_ENV, "collective or local", |v| {
    choice(
        &[
            ("collective", Agreement::Collective),
            ("local", Agreement::Local),
        ],
        v,
    )
});

/// Reads a `DLPACK_MPI_AGREEMENT` value: `collective` → [`Agreement::Collective`], `local`
/// → [`Agreement::Local`] (any case), unset or empty → `None`.
///
/// # Errors
/// [`Error::InvalidSetting`] naming any other value (a typo is not read as the default).
pub fn parse_agreement(value: Option<&str>) -> Result<Option<Agreement>> {
    AGREEMENT.parse(value)
}

/// The process-wide agreement: [`set_agreement`], else `DLPACK_MPI_AGREEMENT=collective|
/// local` in the environment (read once), else [`Agreement::Collective`].
///
/// # Errors
/// [`Error::InvalidSetting`] when `DLPACK_MPI_AGREEMENT` holds another value (also one that
/// is not UTF-8). A collective then agrees (the safe choice) and returns this error on the
/// rank that read it, [`Error::PeerRefused`] on the others.
pub fn agreement() -> Result<Agreement> {
    AGREEMENT.get_or(Agreement::default)
}

/// Sets the process-wide agreement (see [`agreement`]). Every rank of a communicator must
/// use the same setting: see [`Agreement`].
pub fn set_agreement(agreement: Agreement) {
    AGREEMENT.set(agreement);
}

// ---------------------------------------------------------------------------------------
// DLPACK_MPI_HALF_OPS
// ---------------------------------------------------------------------------------------

/// How float16 and bfloat16 reduce ([`crate::comm::halfops`]): with MPI's own
/// half-precision datatypes and predefined operations, or with this crate's user-defined
/// operations on `MPI_UINT16_T` units (each step widened to `f32` and rounded once: the
/// correctly rounded result, to nearest even). The operands travel the same, two bytes an
/// element. Every rank of a reduction must use the same (a reduction takes one datatype and
/// one operation on every rank; the agreement refuses ranks that differ).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HalfOps {
    /// MPI's own datatype and operation where this build's MPI has them (MPICH ≥ 5:
    /// `MPIX_C_FLOAT16`, `MPIX_BFLOAT16`; the datatypes mpi4py's `FLOAT16_T`/`BFLOAT16_T` map
    /// to) *and* the rounding probe ([`crate::comm::halfops::probe`]: `MPI_Reduce_local`
    /// on ties and other hard cases, once per process, purely local: every rank of a job
    /// loads the same MPI library, so every rank decides alike) finds them to give this
    /// crate's results bit for bit; else this crate's operations. So the results are the correctly
    /// rounded ones under every MPI (under MPICH 5.0.2: float16 sums and products by MPICH's;
    /// bfloat16 sums by this crate's, since MPICH rounds their ties away from zero, and
    /// float16 min and max, since MPICH's return a NaN operand where this crate returns the
    /// other one). The default.
    #[default]
    Auto,
    /// This crate's user-defined operations on `MPI_UINT16_T` units, whatever the MPI.
    Library,
    /// MPI's own datatype and predefined operation wherever this build's MPI has them,
    /// whatever the probe finds: **not guaranteed correctly rounded** (MPICH 5.0.2's
    /// bfloat16 sums round ties away from zero). For reductions shared with ranks that use
    /// those datatypes (mpi4py's `BFLOAT16_T`). Operations MPI's own aborts on (MPICH
    /// 5.0.2: bfloat16 product, min, max) stay on this crate's; without the datatypes
    /// (Open MPI, MPICH 4) this is [`HalfOps::Library`].
    Mpi,
}

/// The environment variable that sets [`HalfOps`] when [`set_half_ops`] was not called.
pub const HALF_OPS_ENV: &str = "DLPACK_MPI_HALF_OPS";

static HALF_OPS: Setting<HalfOps> = Setting::new(HALF_OPS_ENV, "auto, library or mpi", |v| {
    choice(
        &[
            ("auto", HalfOps::Auto),
            ("library", HalfOps::Library),
            ("mpi", HalfOps::Mpi),
        ],
        v,
    )
});

/// The process-wide [`HalfOps`]: [`set_half_ops`], else
/// `DLPACK_MPI_HALF_OPS=auto|library|mpi` (read once), else [`HalfOps::Auto`].
///
/// # Errors
/// [`Error::InvalidSetting`] when `DLPACK_MPI_HALF_OPS` holds another value.
pub fn half_ops() -> Result<HalfOps> {
    HALF_OPS.get_or(HalfOps::default)
}

/// Sets the process-wide [`HalfOps`] (see [`half_ops`]); every rank must set the same.
pub fn set_half_ops(ops: HalfOps) {
    HALF_OPS.set(ops);
}

// ---------------------------------------------------------------------------------------
// DLPACK_MPI_PACKING and DLPACK_MPI_PACK_THRESHOLD_BYTES
// ---------------------------------------------------------------------------------------

/// How strided (non-contiguous) tensors reach MPI in [`crate::comm::TensorComm`]'s
/// operations.
///
/// The rule of [`Packing::Auto`]: a strided tensor is packed when its contiguous inner block
/// ([`crate::comm::inner_block_bytes`]: the innermost run after axes are merged) is shorter
/// than [`pack_threshold_bytes`], and goes as a derived datatype otherwise (derived
/// datatypes copy block by block inside MPI, slow for short blocks; the measurements behind
/// the defaults are in docs/PERFORMANCE.md).
///
/// Every policy puts the same bytes on the wire (the elements in logical row-major order),
/// so the ranks of a job may choose differently. Reductions and the per-rank blocks of
/// gathers, scatters and all-to-alls always use packed copies (MPI's predefined reductions
/// take predefined datatypes only; blocks must split into equal units). The nonblocking
/// `immediate_*_tensor` operations follow the policy too (the request owns the packed
/// copy); `immediate_send_spec`/`immediate_recv_spec` take a spec the caller built and use
/// it as given (a derived datatype for a strided tensor), without consulting the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Packing {
    /// Per tensor: pack short inner blocks, derived datatype for long ones (the default;
    /// [`pack_threshold_bytes`] is the threshold).
    #[default]
    Auto,
    /// Zero-copy: one derived datatype describes the elements in place.
    DerivedDatatype,
    /// Always pack into a contiguous scratch buffer before sending and unpack after a
    /// receive completes.
    Copy,
}

impl Packing {
    /// Whether this policy packs a strided tensor whose contiguous inner block is
    /// `inner_block_bytes` long, with the pack threshold `threshold_bytes`.
    pub fn packs(self, inner_block_bytes: usize, threshold_bytes: usize) -> bool {
        match self {
            Packing::Auto => inner_block_bytes < threshold_bytes,
            Packing::DerivedDatatype => false,
            Packing::Copy => true,
        }
    }
}

/// The environment variable that sets the packing policy when [`set_packing`] was not called.
pub const PACKING_ENV: &str = "DLPACK_MPI_PACKING";

/// The environment variable that sets [`pack_threshold_bytes`] when
/// [`set_pack_threshold_bytes`] was not called (a byte count).
pub const PACK_THRESHOLD_ENV: &str = "DLPACK_MPI_PACK_THRESHOLD_BYTES";

/// The default threshold of [`Packing::Auto`] under every MPI library but MPICH (Open MPI
/// among them): inner blocks shorter than 16 bytes are packed (measured under Open MPI 4.1;
/// see `comm`'s packing docs and docs/PERFORMANCE.md).
pub const DEFAULT_PACK_THRESHOLD_BYTES: usize = 16;

/// The default threshold of [`Packing::Auto`] under MPICH (and libraries whose version
/// string names it): inner blocks shorter than 64 bytes are packed (measured under MPICH
/// 4.0.2, where packing beat the derived datatype up to 32-byte blocks).
pub const MPICH_PACK_THRESHOLD_BYTES: usize = 64;

static PACKING: Setting<Packing> = Setting::new(PACKING_ENV, "auto, copy or derived", |v| {
    choice(
        &[
            ("auto", Packing::Auto),
            ("copy", Packing::Copy),
            ("derived", Packing::DerivedDatatype),
        ],
        v,
    )
});

static PACK_THRESHOLD: Setting<usize> =
    Setting::new(PACK_THRESHOLD_ENV, "a byte count", byte_count);

/// Reads a `DLPACK_MPI_PACKING` value: `auto` → [`Packing::Auto`], `copy` →
/// [`Packing::Copy`], `derived` → [`Packing::DerivedDatatype`] (any case), unset or empty →
/// `None`.
///
/// # Errors
/// [`Error::InvalidSetting`] naming any other value (a typo is not read as the default).
pub fn parse_packing(value: Option<&str>) -> Result<Option<Packing>> {
    PACKING.parse(value)
}

/// The process-wide packing policy: [`set_packing`], else `DLPACK_MPI_PACKING=auto|copy|
/// derived` in the environment (read once), else [`Packing::Auto`].
///
/// # Errors
/// [`Error::InvalidSetting`] when `DLPACK_MPI_PACKING` holds another value (also a value
/// that is not UTF-8); the operations that consult the policy (those with a strided side)
/// return it before any MPI call.
pub fn packing() -> Result<Packing> {
    PACKING.get_or(Packing::default)
}

/// Sets the process-wide packing policy (see [`packing`]). Every rank of a job may choose
/// independently: all policies put the same bytes on the wire.
pub fn set_packing(policy: Packing) {
    PACKING.set(policy);
}

/// Reads a `DLPACK_MPI_PACK_THRESHOLD_BYTES` value: a byte count (decimal); unset or empty
/// → `None`.
///
/// # Errors
/// [`Error::InvalidSetting`] naming any other value.
pub fn parse_pack_threshold(value: Option<&str>) -> Result<Option<usize>> {
    PACK_THRESHOLD.parse(value)
}

/// The default threshold for the MPI library whose `MPI_Get_library_version` string is
/// `library`: [`MPICH_PACK_THRESHOLD_BYTES`] when it contains `MPICH` (any case), else
/// [`DEFAULT_PACK_THRESHOLD_BYTES`].
pub fn default_pack_threshold_for(library: &str) -> usize {
    if library.to_ascii_uppercase().contains("MPICH") {
        MPICH_PACK_THRESHOLD_BYTES
    } else {
        DEFAULT_PACK_THRESHOLD_BYTES
    }
}

/// The default threshold for the MPI library in use ([`default_pack_threshold_for`] of
/// `MPI_Get_library_version`, which MPI allows before `MPI_Init`);
/// [`DEFAULT_PACK_THRESHOLD_BYTES`] when the version cannot be read.
fn default_pack_threshold_bytes() -> usize {
    mpi::environment::library_version()
        .map(|v| default_pack_threshold_for(&v))
        .unwrap_or(DEFAULT_PACK_THRESHOLD_BYTES)
}

/// The threshold of [`Packing::Auto`], in bytes of contiguous inner block: blocks shorter
/// than this are packed. [`set_pack_threshold_bytes`], else
/// `DLPACK_MPI_PACK_THRESHOLD_BYTES` (read once), else the MPI library's default
/// ([`MPICH_PACK_THRESHOLD_BYTES`] under MPICH, [`DEFAULT_PACK_THRESHOLD_BYTES`] otherwise).
///
/// # Errors
/// [`Error::InvalidSetting`] when `DLPACK_MPI_PACK_THRESHOLD_BYTES` is not a byte count.
pub fn pack_threshold_bytes() -> Result<usize> {
    PACK_THRESHOLD.get_or(default_pack_threshold_bytes)
}

/// Sets the threshold of [`Packing::Auto`] (see [`pack_threshold_bytes`]); `usize::MAX`
/// packs every strided tensor whose inner block is shorter than that (all of them).
pub fn set_pack_threshold_bytes(bytes: usize) {
    PACK_THRESHOLD.set(bytes);
}

// ---------------------------------------------------------------------------------------
// DLPACK_MPI_PACK_POOL_BYTES
// ---------------------------------------------------------------------------------------

/// The environment variable that sets the scratch pool's cap (bytes) when
/// `spec::scratch::set_pool_cap_bytes` was not called.
pub const POOL_CAP_ENV: &str = "DLPACK_MPI_PACK_POOL_BYTES";

/// The default cap of idle pooled bytes: 256 MiB.
pub const DEFAULT_POOL_CAP_BYTES: usize = 256 << 20;

static POOL_CAP: Setting<usize> = Setting::new(POOL_CAP_ENV, "a byte count", byte_count);

/// Reads a `DLPACK_MPI_PACK_POOL_BYTES` value: a byte count (decimal); unset or empty →
/// `None`.
///
/// # Errors
/// [`Error::InvalidSetting`] naming any other value.
pub fn parse_pool_cap(value: Option<&str>) -> Result<Option<usize>> {
    POOL_CAP.parse(value)
}

/// The cap of idle pooled bytes of [`crate::spec::scratch`]:
/// [`set_pool_cap_bytes`](crate::spec::scratch::set_pool_cap_bytes), else
/// `DLPACK_MPI_PACK_POOL_BYTES` (read once), else [`DEFAULT_POOL_CAP_BYTES`].
///
/// # Errors
/// [`Error::InvalidSetting`] when `DLPACK_MPI_PACK_POOL_BYTES` is not a byte count.
pub fn pool_cap_bytes() -> Result<usize> {
    POOL_CAP.get_or(|| DEFAULT_POOL_CAP_BYTES)
}

/// Stores the cap; `spec::scratch::set_pool_cap_bytes` calls it and then trims the pool.
pub(crate) fn store_pool_cap_bytes(cap: usize) {
    POOL_CAP.set(cap);
}

// ---------------------------------------------------------------------------------------
// DLPACK_MPI_BUCKET_BYTES, DLPACK_MPI_FIRST_BUCKET_BYTES
// ---------------------------------------------------------------------------------------

/// The environment variable of the bucket size of the fused collectives (bytes).
pub const BUCKET_ENV: &str = "DLPACK_MPI_BUCKET_BYTES";

/// The environment variable of the first bucket's size of the fused collectives (bytes).
pub const FIRST_BUCKET_ENV: &str = "DLPACK_MPI_FIRST_BUCKET_BYTES";

/// The default bucket size: 25 MiB (PyTorch DDP's `bucket_cap_mb = 25`).
pub const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

/// The default size of the first bucket: 1 MiB (DDP's first bucket).
pub const DEFAULT_FIRST_BUCKET_BYTES: usize = 1 << 20;

/// A byte count of at least 1.
fn positive_bytes(v: &str) -> Option<usize> {
    byte_count(v).filter(|&n| n > 0)
}

static BUCKET: Setting<usize> =
    Setting::new(BUCKET_ENV, "a byte count of at least 1", positive_bytes);
static FIRST_BUCKET: Setting<usize> = Setting::new(
    FIRST_BUCKET_ENV,
    "a byte count of at least 1",
    positive_bytes,
);

/// The most bytes of one bucket of a fused collective: [`set_bucket_bytes`], else
/// `DLPACK_MPI_BUCKET_BYTES` (read once), else [`DEFAULT_BUCKET_BYTES`].
///
/// # Errors
/// [`Error::InvalidSetting`] when `DLPACK_MPI_BUCKET_BYTES` is not a byte count ≥ 1.
pub fn bucket_bytes() -> Result<usize> {
    BUCKET.get_or(|| DEFAULT_BUCKET_BYTES)
}

/// Sets the bucket size of the fused collectives (bytes; 0 is taken as 1). Every rank must
/// use the same: the buckets are the messages.
pub fn set_bucket_bytes(bytes: usize) {
    BUCKET.set(bytes.max(1));
}

/// The most bytes of the first bucket of each dtype of a fused collective:
/// [`set_first_bucket_bytes`], else `DLPACK_MPI_FIRST_BUCKET_BYTES` (read once), else
/// [`DEFAULT_FIRST_BUCKET_BYTES`].
///
/// # Errors
/// [`Error::InvalidSetting`] when `DLPACK_MPI_FIRST_BUCKET_BYTES` is not a byte count ≥ 1.
pub fn first_bucket_bytes() -> Result<usize> {
    FIRST_BUCKET.get_or(|| DEFAULT_FIRST_BUCKET_BYTES)
}

/// Sets the first bucket's size (bytes; 0 is taken as 1). Every rank must use the same.
pub fn set_first_bucket_bytes(bytes: usize) {
    FIRST_BUCKET.set(bytes.max(1));
}

// ---------------------------------------------------------------------------------------
// DLPACK_MPI_CUDA_AWARE
// ---------------------------------------------------------------------------------------

/// The environment variable that overrides the MPI library's own answer to "is it
/// CUDA-aware?" ([`crate::transport::cuda_awareness`]).
pub const CUDA_AWARE_ENV: &str = "DLPACK_MPI_CUDA_AWARE";

/// What a yes-or-no setting may be (the `expected` of [`Error::InvalidSetting`]).
const YES_OR_NO: &str = "0 or 1 (also false/true, no/yes, off/on)";

/// A yes-or-no value: `1 true yes on` or `0 false no off` (any case).
fn yes_or_no(value: &str) -> Option<bool> {
    choice(
        &[
            ("1", true),
            ("true", true),
            ("yes", true),
            ("on", true),
            ("0", false),
            ("false", false),
            ("no", false),
            ("off", false),
        ],
        value,
    )
}

static CUDA_AWARE: Setting<bool> = Setting::new(CUDA_AWARE_ENV, YES_OR_NO, yes_or_no);

/// Reads a `DLPACK_MPI_CUDA_AWARE` value: `None` when unset or empty (at
/// its deprecated path `transport::parse_override` too).
///
/// # Errors
/// [`Error::InvalidSetting`] naming the value when it is not one of `0 1 false true no yes
/// off on` (any case).
pub fn parse_cuda_aware(value: Option<&str>) -> Result<Option<bool>> {
    CUDA_AWARE.parse(value)
}

/// `DLPACK_MPI_CUDA_AWARE` now (read at each call): `None` when unset or empty.
///
/// # Errors
/// As [`parse_cuda_aware`].
pub fn cuda_aware_override() -> Result<Option<bool>> {
    CUDA_AWARE.env_now()
}

// ---------------------------------------------------------------------------------------
// DLPACK_MPI_ALLOW_MPI_MISMATCH
// ---------------------------------------------------------------------------------------

/// The environment variable that lets the crate run on another MPI release than the one it
/// was built against ([`crate::mpi_library::ensure_matching`]); the CLI reads it too.
pub const ALLOW_MPI_MISMATCH_ENV: &str = "DLPACK_MPI_ALLOW_MPI_MISMATCH";

static ALLOW_MPI_MISMATCH: Setting<bool> =
    Setting::new(ALLOW_MPI_MISMATCH_ENV, YES_OR_NO, yes_or_no);

/// Whether the crate runs on an MPI library of another release than the one it was built
/// against: [`set_allow_mpi_mismatch`], else `DLPACK_MPI_ALLOW_MPI_MISMATCH` (read once),
/// else `false` ([`crate::mpi_library::ensure_matching`] then refuses with
/// [`Error::MpiLibraryMismatch`]). Consulted only when the libraries differ.
///
/// # Errors
/// [`Error::InvalidSetting`] when `DLPACK_MPI_ALLOW_MPI_MISMATCH` is not one of `0 1 false
/// true no yes off on` (any case).
pub fn allow_mpi_mismatch() -> Result<bool> {
    ALLOW_MPI_MISMATCH.get_or(|| false)
}

/// Sets whether the crate runs on another MPI release than the one it was built against
/// (see [`allow_mpi_mismatch`]); wins over the environment, before or after the first
/// operation.
pub fn set_allow_mpi_mismatch(allow: bool) {
    ALLOW_MPI_MISMATCH.set(allow);
}

// ---------------------------------------------------------------------------------------
// DLPACK_MPI_DEVICE
// ---------------------------------------------------------------------------------------

/// The environment variable that picks the device ordinal for every rank it is set for
/// ([`crate::transport::select_device`]).
pub const DEVICE_ENV: &str = "DLPACK_MPI_DEVICE";

static DEVICE: Setting<i32> = Setting::new(DEVICE_ENV, "a device ordinal: 0, 1, 2, ...", |v| {
    // Digits only: no sign, no name, no list.
    v.bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| v.parse::<i32>().ok())
        .flatten()
});

/// Reads a `DLPACK_MPI_DEVICE` value: `None` when unset or empty, else a device ordinal
/// (decimal digits, surrounding blanks ignored).
///
/// # Errors
/// [`Error::InvalidSetting`] naming the value when it is anything else (a sign, a name, a
/// list, a number beyond `i32`).
pub fn parse_device_override(value: Option<&str>) -> Result<Option<i32>> {
    DEVICE.parse(value)
}

/// `DLPACK_MPI_DEVICE` now (read at each call): `None` when unset or empty.
///
/// # Errors
/// As [`parse_device_override`].
pub fn device_override() -> Result<Option<i32>> {
    DEVICE.env_now()
}

// ---------------------------------------------------------------------------------------
// DLPACK_MPI_EXCHANGE_API
// ---------------------------------------------------------------------------------------

/// The environment variable read by `ExchangeApi::from_env` (feature `python`).
pub const EXCHANGE_API_ENV: &str = "DLPACK_MPI_EXCHANGE_API";

/// Whether `python::acquire` goes through a producer's DLPack C exchange table (see
/// `python::exchange`).
#[cfg(feature = "python")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExchangeApi {
    /// Use a usable table; ignore an unusable one and take the capsule path.
    #[default]
    Prefer,
    /// Always take the capsule path (`__dlpack_device__` and `__dlpack__`).
    Never,
    /// Use the table; a missing or unusable one is [`Error::InvalidExchangeApi`].
    Require,
}

#[cfg(feature = "python")]
static EXCHANGE_API: Setting<ExchangeApi> =
    Setting::new(EXCHANGE_API_ENV, "prefer, never or require", |v| {
        choice(
            &[
                ("prefer", ExchangeApi::Prefer),
                ("never", ExchangeApi::Never),
                ("require", ExchangeApi::Require),
            ],
            v,
        )
    });

#[cfg(feature = "python")]
impl ExchangeApi {
    /// The environment variable read by [`ExchangeApi::from_env`] ([`EXCHANGE_API_ENV`]).
    pub const ENV: &'static str = EXCHANGE_API_ENV;

    /// The process default: `DLPACK_MPI_EXCHANGE_API` (`prefer`, `never` or `require`, any
    /// case), [`ExchangeApi::Prefer`] when unset or empty; read once.
    ///
    /// # Errors
    /// [`Error::InvalidSetting`] for another value (also one that is not UTF-8).
    pub fn from_env() -> Result<ExchangeApi> {
        EXCHANGE_API.get_or(ExchangeApi::default)
    }
}

// ---------------------------------------------------------------------------------------
// DLPACK_MPI_UNKNOWN_NAMES, and the names known: settings/names.rs
// ---------------------------------------------------------------------------------------

mod names;
mod plans;
use names::warn_unknown_once;
pub use names::{
    set_unknown_names, unknown_env_names, unknown_names, UnknownName, UnknownNames, SETTING_NAMES,
    TOOL_NAMES, UNKNOWN_NAMES_ENV,
};
#[cfg(test)]
use names::{unknown_among, warning, PREFIX, UNKNOWN_NAMES};
pub use plans::{
    plan_check, plan_mechanism, set_plan_check, set_plan_mechanism, PlanCheck, PlanMechanism,
    PLAN_CHECK_ENV, PLAN_MECHANISM_ENV,
};

// ---------------------------------------------------------------------------------------
// All of them
// ---------------------------------------------------------------------------------------

/// Reads every setting of the table above now, as the operations would (the "once" ones
/// through their readers, so that the value is also decided; the "at each call" ones from
/// the environment): the [`Error::InvalidSetting`] of each that holds a value it refuses, in
/// the table's order; empty when every one is valid. For programs that want a typo refused
/// at start rather than by the first operation that reads it (the CLI calls it on every
/// rank before any case). The pack threshold's default asks `MPI_Get_library_version`,
/// which MPI allows before `MPI_Init`.
pub fn check_all() -> Vec<Error> {
    let mut errors = Vec::new();
    let mut keep = |r: Result<()>| {
        if let Err(e) = r {
            errors.push(e);
        }
    };
    keep(agreement().map(drop));
    keep(packing().map(drop));
    keep(pack_threshold_bytes().map(drop));
    keep(bucket_bytes().map(drop));
    keep(first_bucket_bytes().map(drop));
    keep(pool_cap_bytes().map(drop));
    keep(half_ops().map(drop));
    keep(plan_check().map(drop));
    keep(plan_mechanism().map(drop));
    keep(cuda_aware_override().map(drop));
    keep(device_override().map(drop));
    keep(allow_mpi_mismatch().map(drop));
    #[cfg(feature = "python")]
    keep(ExchangeApi::from_env().map(drop));
    keep(unknown_names().map(drop));
    errors
}

#[cfg(test)]
#[path = "settings_tests.rs"]
mod tests;
