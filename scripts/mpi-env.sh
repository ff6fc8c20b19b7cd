# Sourced by the scripts: picks one MPI library and says so explicitly, so that neither the
# build nor the launcher depends on Debian's `mpi`/`mpirun` alternatives (which point to
# whichever library has the higher priority when both are installed).
#
# Input:  DLPACK_MPI_IMPL = openmpi (default) | mpich
# Output (exported): DLPACK_MPI_IMPL; MPIRUN (the launcher of that library, a full command
#   name such as mpirun.openmpi or mpiexec.mpich); MPICC (its compiler wrapper, which
#   build-probe-mpi, and so mpi-sys and build.rs, use to find headers and libraries);
#   CARGO_TARGET_DIR (target for Open MPI, target/mpich for MPICH, so the two builds never
#   mix); TARGET_DIR (the same, for paths in the scripts).
# Output (shell array): MPIRUN_FLAGS, the launcher flags this library needs.
DLPACK_MPI_IMPL=${DLPACK_MPI_IMPL:-openmpi}
export DLPACK_MPI_IMPL
MPIRUN_FLAGS=()
case "$DLPACK_MPI_IMPL" in
    openmpi)
        # Debian's names; fall back to the plain names where only Open MPI is installed
        # without the suffixed links.
        if command -v mpirun.openmpi >/dev/null 2>&1; then MPIRUN=mpirun.openmpi; else MPIRUN=mpirun; fi
        if command -v mpicc.openmpi >/dev/null 2>&1; then MPICC=mpicc.openmpi; else MPICC=mpicc; fi
        TARGET_DIR=${CARGO_TARGET_DIR:-target}
        # Open MPI refuses to run as root without an explicit opt-in, and needs
        # --oversubscribe to start more ranks than cores (the suite runs 4 ranks on 2 cores).
        MPIRUN_FLAGS+=(--oversubscribe)
        if [[ $(id -u) -eq 0 ]]; then
            MPIRUN_FLAGS+=(--allow-run-as-root)
            export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
        fi
        ;;
    mpich)
        # MPICH's hydra launcher runs as root and oversubscribes without flags.
        MPIRUN=mpiexec.mpich
        MPICC=mpicc.mpich
        TARGET_DIR=${CARGO_TARGET_DIR:-target/mpich}
        ;;
    *)
        echo "mpi-env.sh: unknown MPI library '$DLPACK_MPI_IMPL' (openmpi or mpich)" >&2
        return 2 2>/dev/null || exit 2
        ;;
esac
CARGO_TARGET_DIR=$TARGET_DIR
# tests/cli.rs starts its own jobs with this launcher.
DLPACK_MPI_MPIRUN=$MPIRUN
export MPIRUN MPICC CARGO_TARGET_DIR TARGET_DIR DLPACK_MPI_MPIRUN
