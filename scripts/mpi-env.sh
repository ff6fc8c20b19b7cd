# Sourced by the scripts: sets MPIRUN_FLAGS for the installed mpirun.
# Open MPI refuses to run as root without an explicit opt-in, and needs --oversubscribe to
# start more ranks than cores (the test suite runs 4 ranks on 2 cores).
MPIRUN_FLAGS=()
if mpirun --version 2>/dev/null | grep -q "Open MPI"; then
    MPIRUN_FLAGS+=(--oversubscribe)
    if [[ $(id -u) -eq 0 ]]; then
        MPIRUN_FLAGS+=(--allow-run-as-root)
        export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    fi
fi
