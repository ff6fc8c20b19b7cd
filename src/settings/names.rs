//! `DLPACK_MPI_UNKNOWN_NAMES` and the `DLPACK_MPI_*` names the crate and its tools know
//! (see the settings table of [`crate::settings`]): the one warning about an unknown name,
//! and the list a program that reports them itself reads.

use super::*;

/// The environment variable that sets [`UnknownNames`] when [`set_unknown_names`] was not
/// called.
pub const UNKNOWN_NAMES_ENV: &str = "DLPACK_MPI_UNKNOWN_NAMES";

/// What an environment variable named `DLPACK_MPI_*` that this crate does not know gets
/// (see the module docs, "Unknown names").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnknownNames {
    /// One line on standard error, at the first read of any setting, once per process,
    /// naming each unknown variable and the closest known name. The default.
    #[default]
    Warn,
    /// Nothing: the variables are left alone in silence (also by the CLI).
    Ignore,
}

pub(super) static UNKNOWN_NAMES: Setting<UnknownNames> =
    Setting::new(UNKNOWN_NAMES_ENV, "warn or ignore", |v| {
        choice(
            &[
                ("warn", UnknownNames::Warn),
                ("ignore", UnknownNames::Ignore),
            ],
            v,
        )
    });

/// The process-wide [`UnknownNames`]: [`set_unknown_names`], else
/// `DLPACK_MPI_UNKNOWN_NAMES=warn|ignore` (read once), else [`UnknownNames::Warn`].
///
/// # Errors
/// [`Error::InvalidSetting`] when `DLPACK_MPI_UNKNOWN_NAMES` holds another value (the
/// warning is then given).
pub fn unknown_names() -> Result<UnknownNames> {
    // Not through `get_or`: the warning it gives reads this setting.
    UNKNOWN_NAMES.resolve(env_value, UnknownNames::default)
}

/// Sets the process-wide [`UnknownNames`]; to silence the warning, call it before the first
/// read of any setting (the first operation).
pub fn set_unknown_names(policy: UnknownNames) {
    UNKNOWN_NAMES.set(policy);
}

/// Every setting of the table above, by its variable's name.
pub const SETTING_NAMES: [&str; 14] = [
    AGREEMENT_ENV,
    PACKING_ENV,
    PACK_THRESHOLD_ENV,
    BUCKET_ENV,
    FIRST_BUCKET_ENV,
    POOL_CAP_ENV,
    HALF_OPS_ENV,
    PLAN_CHECK_ENV,
    PLAN_MECHANISM_ENV,
    CUDA_AWARE_ENV,
    DEVICE_ENV,
    ALLOW_MPI_MISMATCH_ENV,
    EXCHANGE_API_ENV,
    UNKNOWN_NAMES_ENV,
];

/// The other `DLPACK_MPI_*` names of this project, which are not settings of the library
/// but are known, so never reported as unknown: the build's (cargo also sets these in the
/// environment of the binaries it runs), and those of the project's scripts and tests (a
/// unit test checks that every `DLPACK_MPI_*` name in `scripts/`, `tests/`, `src/`,
/// `benches/`, `examples/`, `.ci/` and `build.rs` is a setting or one of these).
pub const TOOL_NAMES: [&str; 14] = [
    // build.rs, for python::BUILT_PYTHON and BUILT_PYTHON_LIBDIR, and mpi_library.
    "DLPACK_MPI_PYTHON",
    "DLPACK_MPI_PYTHON_LIBDIR",
    "DLPACK_MPI_BUILT_LIBDIRS",
    // scripts/: which MPI (mpi-env.sh), its venv and launcher, run.sh's rank count.
    "DLPACK_MPI_IMPL",
    "DLPACK_MPI_VENV",
    "DLPACK_MPI_MPIRUN",
    "DLPACK_MPI_RANKS",
    // scripts/kill-rank-test.sh.
    "DLPACK_MPI_KILL_STRICT",
    "DLPACK_MPI_KILL_BOUND_S",
    "DLPACK_MPI_FAULT_TOKEN",
    // tests/: gpu-check.sh's, the leak test's cycles, the hostile child.
    "DLPACK_MPI_REQUIRE_GPU",
    "DLPACK_MPI_CASE_TIMEOUT_S",
    "DLPACK_MPI_LEAK_CYCLES",
    "DLPACK_MPI_HOSTILE_CHILD",
];

/// The prefix of the names this crate reads.
pub(super) const PREFIX: &str = "DLPACK_MPI_";

/// An environment variable named `DLPACK_MPI_*` that is neither a setting
/// ([`SETTING_NAMES`]) nor one of [`TOOL_NAMES`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownName {
    /// The variable's name (lossily, if it is not UTF-8).
    pub name: String,
    /// The known name closest to it, when one is close enough to be meant.
    pub closest: Option<&'static str>,
}

impl std::fmt::Display for UnknownName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "environment variable {} is not a dlpack-mpi setting",
            self.name
        )?;
        match self.closest {
            Some(known) => write!(f, " (did you mean {known}?)"),
            None => write!(f, " (the settings are {})", SETTING_NAMES.join(", ")),
        }
    }
}

/// The known name (a setting first, then [`TOOL_NAMES`]) closest to `name`, compared
/// after the prefix and in upper case by the normalized Damerau-Levenshtein similarity
/// (strsim); `None` when none is at least half similar.
fn closest(name: &str) -> Option<&'static str> {
    let tail = |n: &str| n.strip_prefix(PREFIX).unwrap_or(n).to_ascii_uppercase();
    let given = tail(name);
    let mut best: Option<(&'static str, f64)> = None;
    for known in SETTING_NAMES.iter().chain(TOOL_NAMES.iter()) {
        let score = strsim::normalized_damerau_levenshtein(&given, &tail(known));
        if score >= 0.5 && best.map_or(true, |(_, b)| score > b) {
            best = Some((known, score));
        }
    }
    best.map(|(known, _)| known)
}

/// The unknown names among `names`, in their order.
pub(super) fn unknown_among(names: impl IntoIterator<Item = String>) -> Vec<UnknownName> {
    let known = |n: &str| SETTING_NAMES.contains(&n) || TOOL_NAMES.contains(&n);
    names
        .into_iter()
        .filter(|n| n.starts_with(PREFIX) && !known(n))
        .map(|name| UnknownName {
            closest: closest(&name),
            name,
        })
        .collect()
}

/// The unknown `DLPACK_MPI_*` names of the environment now, sorted.
fn unknown_in_env() -> Vec<UnknownName> {
    let mut names: Vec<String> = std::env::vars_os()
        .map(|(k, _)| k.to_string_lossy().into_owned())
        .collect();
    names.sort();
    unknown_among(names)
}

/// The line of the warning about `unknown` (not empty).
pub(super) fn warning(unknown: &[UnknownName]) -> String {
    let each: Vec<String> = unknown.iter().map(ToString::to_string).collect();
    format!(
        "dlpack-mpi: warning: {}: ignored ({UNKNOWN_NAMES_ENV}=ignore silences this warning)",
        each.join("; ")
    )
}

/// Whether the warning was given, or taken over by [`unknown_env_names`].
static WARNED: std::sync::Once = std::sync::Once::new();

/// The warning about unknown names, once per process, unless [`UnknownNames::Ignore`].
pub(super) fn warn_unknown_once() {
    WARNED.call_once(|| {
        if unknown_names() == Ok(UnknownNames::Ignore) {
            return;
        }
        let unknown = unknown_in_env();
        if !unknown.is_empty() {
            use std::io::Write as _;
            // One write, so that the lines of ranks warning at once do not interleave.
            let _ = std::io::stderr().write_all(format!("{}\n", warning(&unknown)).as_bytes());
        }
    });
}

/// The environment's variables named `DLPACK_MPI_*` that are neither settings nor
/// [`TOOL_NAMES`], sorted by name, each with the closest known name; empty under
/// [`UnknownNames::Ignore`]. For a program that reports them itself (the CLI refuses
/// them): after this call the library gives no warning of its own.
pub fn unknown_env_names() -> Vec<UnknownName> {
    WARNED.call_once(|| {});
    if unknown_names() == Ok(UnknownNames::Ignore) {
        return Vec::new();
    }
    unknown_in_env()
}
