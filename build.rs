//! Compiles the small C shim (`src/shim.c`) that exposes MPI constants rsmpi does not bind
//! (`MPI_IN_PLACE`), against the same MPI library that rsmpi's `mpi-sys` finds.

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
}
