//! With feature `rpath`, the build script README's "Use from another project" gives a
//! program that depends on dlpack-mpi: the run paths dlpack-mpi's own binaries have (the
//! MPI library it was built against; libpython with its feature `python`), which a
//! dependency's build script cannot give its dependents' binaries, read from the metadata
//! dlpack-mpi's build script exports (`DEP_DLPACK_MPI_RPATH`). Without the feature the
//! program has no run path of dlpack-mpi's, as a program without this script:
//! scripts/wheel-mpi-test.sh runs it both ways against the Open MPI 5 wheel.

fn main() {
    if std::env::var_os("CARGO_FEATURE_RPATH").is_none() {
        return;
    }
    // The README's two lines:
    let dirs = std::env::var_os("DEP_DLPACK_MPI_RPATH").unwrap_or_default();
    for dir in std::env::split_paths(&dirs).filter(|d| !d.as_os_str().is_empty()) {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    }
}
