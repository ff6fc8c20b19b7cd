#!/usr/bin/env bash
# The GPU verification of issue 5, as one command for a GPU machine with no package registry
# (the workplace's `device` tool: carry `.gpu`, made by scripts/gpu-pack.sh). Well inside 10
# minutes: every step has its own timeout. Writes gpu-check.log (into $OUT when set).
#
#   1. what the machine is: GPUs, driver;
#   2. which MPI libraries are there and whether any is CUDA-aware (the carried Open MPI
#      wheel is not; mpi4py's, if the machine has one, is asked too);
#   3. `dlpack-mpi info`;
#   4. the simulated-device cases and the GPU cases (tests/gpu.rs) at 2 ranks;
#   5. `dlpack-mpi check` on CUDA tensors at 2 ranks, staged, and direct when MPI is
#      CUDA-aware;
#   6. the GPU bench: ping-pong and all-reduce 4 KiB … 256 MiB, staged next to the pinned
#      copy and host MPI.
set -uo pipefail
cd "$(dirname "$0")/.."
g=$PWD/.gpu
log=${OUT:-$PWD}/gpu-check.log
[ -x "$g/bin/dlpack-mpi" ] || { echo "gpu-check.sh: no .gpu/bin: run scripts/gpu-pack.sh first and carry .gpu" >&2; exit 2; }
export OPAL_PREFIX=$g/ompi PATH=$g/ompi/bin:$PATH LD_LIBRARY_PATH=$g/ompi/lib:${LD_LIBRARY_PATH:-}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PRTE_MCA_prte_allow_run_as_root=1
# Sandboxed machines (gVisor) may refuse cross-memory attach: use copy-in/copy-out.
export OMPI_MCA_btl_sm_single_copy_mechanism=none
mpirun_2=(mpirun --oversubscribe -n 2)
failed=0
step() {
    local name=$1 limit=$2; shift 2
    echo "== $name"
    local t0=$SECONDS
    timeout "$limit" "$@"; local rc=$?
    echo "== $name: exit $rc after $((SECONDS - t0)) s"
    [ $rc -eq 0 ] || failed=$((failed + 1))
}
exec > >(tee "$log") 2>&1
{
    echo "== gpu-check.sh at $(date -u +%FT%TZ)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | head -5
    echo "== MPI libraries"
    echo "carried: $(mpirun --version 2>&1 | head -1); built with CUDA support: $(ompi_info --parsable --all 2>/dev/null | grep -m1 'opal_built_with_cuda_support:value' | cut -d: -f7)"
    for py in python3 /opt/torch/.venv/bin/python3; do
        command -v "$py" >/dev/null || continue
        timeout 30 "$py" -c 'from mpi4py import MPI; print("mpi4py at", MPI.__file__, "->", MPI.Get_library_version().splitlines()[0])' 2>&1 | head -2
    done
    ls /usr/lib/x86_64-linux-gnu/libmpi.so* /opt/*/lib/libmpi.so* 2>/dev/null | head -5
    step "info" 60 "$g/bin/dlpack-mpi" info
    step "simulated-device cases, 2 ranks" 120 "${mpirun_2[@]}" "$g/bin/device_cases"
    step "GPU cases (tests/gpu.rs), 2 ranks" 180 "${mpirun_2[@]}" "$g/bin/gpu"
    step "check on CUDA tensors, staged, 2 ranks" 180 "${mpirun_2[@]}" "$g/bin/dlpack-mpi" check -q --device cuda --transport staged
    # The direct transport needs a CUDA-aware MPI: the carried one is not. Look for an Open
    # MPI of the machine's own (libmpi.so.40, the soname the binaries link) built with CUDA.
    aware=""
    for oi in /opt/*/bin/ompi_info /opt/*/*/bin/ompi_info /opt/*/*/*/bin/ompi_info \
        /usr/local/bin/ompi_info /usr/local/*/bin/ompi_info /usr/bin/ompi_info; do
        [ -x "$oi" ] || continue
        if env -u OPAL_PREFIX LD_LIBRARY_PATH= timeout 30 "$oi" --parsable --all 2>/dev/null |
            grep -q 'built_with_cuda_support:value:true'; then
            aware=$(dirname "$(dirname "$oi")")
            break
        fi
    done
    if [ -n "$aware" ]; then
        echo "== CUDA-aware Open MPI found at $aware"
        step "check on CUDA tensors, direct, 2 ranks ($aware)" 180 env OPAL_PREFIX="$aware" \
            PATH="$aware/bin:$PATH" LD_LIBRARY_PATH="$aware/lib:${LD_LIBRARY_PATH#*:}" \
            mpirun --oversubscribe -n 2 "$g/bin/dlpack-mpi" check -q --device cuda --transport direct
        step "GPU cases, direct, 2 ranks ($aware)" 180 env OPAL_PREFIX="$aware" \
            PATH="$aware/bin:$PATH" LD_LIBRARY_PATH="$aware/lib:${LD_LIBRARY_PATH#*:}" \
            mpirun --oversubscribe -n 2 "$g/bin/gpu"
    else
        echo "== direct transport: skipped (no CUDA-aware Open MPI found on this machine)"
    fi
    step "GPU bench, 2 ranks" 150 "${mpirun_2[@]}" "$g/bin/dlpack-mpi" bench --device cuda --op all --sizes 4K:256M
    echo "== gpu-check.sh: $failed step(s) failed"
}
exit $((failed > 0))
