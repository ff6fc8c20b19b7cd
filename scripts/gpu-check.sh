#!/usr/bin/env bash
# The GPU verification of issue 5, as one command for a GPU machine with no package registry
# (the workplace's `device` tool: carry `.gpu`, made by scripts/gpu-pack.sh). Writes
# gpu-check.log (into $OUT when set).
#
# Time: a total budget of GPU_CHECK_BUDGET_S seconds (default 330), so that a command limit
# of about 400 s leaves room for a rerun within the 15 minutes of device time. Every probe
# and step runs under `timeout -k 5`, its limit lowered to what is left of the budget; a step
# with under 10 s left is not run. Step limits: info 45, GPU cases 90, simulated-device
# cases 45, check 150, bench 150, each direct step 90 (the probes 20 each). Expected on an
# H200: about 1.5-4 minutes in all; without a usable driver it stops after info, in seconds.
#
#   1. what was built: .gpu/BUILD (commit, dirty files, date, MPI wheel version, source
#      digest), with a warning when this checkout is not what .gpu was built from;
#   2. the machine: GPUs (compute mode, persistence, MIG), kernel, driver library chosen,
#      LD_LIBRARY_PATH, /dev/shm, locked-memory limit, preset OMPI_/OPAL_/PMIX_/PRTE_/UCX_/
#      CUDA_ variables, and the MPI settings this script chose;
#   3. `dlpack-mpi info`: stops here (exit 3, one line saying why) without a CUDA runtime;
#   4. the GPU cases (the suite gpu of tests/mpi: tests/mpi/gpu.rs) at 2 ranks, with
#      DLPACK_MPI_REQUIRE_GPU=1 (among them strided device tensors packed by
#      cuMemcpy2DAsync, staged and direct): stops here (exit 3) when a rank cannot use the
#      GPU (e.g. an EXCLUSIVE_PROCESS compute mode);
#   5. the simulated-device cases (the suite device_cases) at 2 ranks;
#   6. `dlpack-mpi check` on CUDA tensors at 2 ranks, staged;
#   7. the GPU bench: ping-pong and all-reduce 4 KiB … 256 MiB, staged next to the pinned
#      copy and host MPI, with --iters 2000 --rounds 3 (sizes from 64 MiB up run the
#      minimum 4 iterations either way, so the 64 MiB figures are those of the defaults);
#   8. the direct transport, when the machine has a CUDA-aware Open MPI of its own (run with
#      that MPI's own settings, not the ones chosen for the carried wheel).
#
# The driver library: cudarc opens `libcuda.so` before `libcuda.so.1`, so a CUDA toolkit's
# stubs/libcuda.so on LD_LIBRARY_PATH would win over the driver. This script drops */stubs
# directories from LD_LIBRARY_PATH and puts first a private directory whose libcuda.so and
# libcuda.so.1 link to the driver's libcuda.so.1 (the first of LD_LIBRARY_PATH, ldconfig,
# /usr/local/nvidia/lib64, /usr/lib/x86_64-linux-gnu, /usr/lib64; GPU_CHECK_LIBCUDA=PATH
# overrides).
#
# The carried Open MPI (5.0.x) runs ob1 over self,sm, with libfabric and UCX off
# (mtl=^ofi, osc=^ucx; btl ofi/uct are left out by btl=self,sm), and single copy (smsc) cma
# unless the kernel forbids it (ptrace_scope 2 or 3, or gVisor's kernel 4.4.0: then ^cma;
# GPU_CHECK_SMSC overrides). A pack made with `gpu-pack.sh --local` runs with the MPI of
# scripts/mpi-env.sh (Open MPI 4: the same with btl vader and its single_copy_mechanism).
#
# Exit: 0 every step passed; 1 some step failed; 2 no .gpu; 3 stopped early (no GPU).
# GPU_CHECK_DIR overrides the pack's directory (default .gpu).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
g=${GPU_CHECK_DIR:-$PWD/.gpu}
budget=${GPU_CHECK_BUDGET_S:-330}
log=${OUT:-$PWD}/gpu-check.log
kill_grace=5
# A transfer may drop the execute bits: restore them before deciding the pack is missing.
chmod +x "$g"/bin/* "$g"/ompi/bin/* 2>/dev/null
for exe in dlpack-mpi mpi; do
    [ -f "$g/bin/$exe" ] || {
        echo "gpu-check.sh: no $g/bin/$exe: run scripts/gpu-pack.sh first and carry .gpu" >&2
        exit 2
    }
done
deadline=$((SECONDS + budget))
failed=()
steps=0
tmp=$(mktemp -d)

# `timeout -k` with `limit` lowered to what is left of the budget (at least 1 s).
capped() {
    local limit=$1; shift
    local left=$((deadline - SECONDS - kill_grace))
    ((left < 1)) && left=1
    ((limit > left)) && limit=$left
    timeout -k "$kill_grace" "$limit" "$@"
}

# step NAME LIMIT COMMAND...: runs under the budget; its output is also in $tmp/step.out and
# its exit status in $rc.
step() {
    local name=$1 limit=$2; shift 2
    local left=$((deadline - SECONDS - kill_grace))
    steps=$((steps + 1))
    : >"$tmp/step.out"
    if ((left < 10)); then
        echo "== $name: not run (${left} s of the ${budget} s budget left)"
        failed+=("$name (not run)")
        rc=125
        return
    fi
    ((limit > left)) && limit=$left
    echo "== $name (limit ${limit} s; $((deadline - SECONDS)) s of the budget left)"
    local t0=$SECONDS
    timeout -k "$kill_grace" "$limit" "$@" 2>&1 | tee "$tmp/step.out"
    rc=${PIPESTATUS[0]}
    local how=""
    ((rc == 124 || rc == 137)) && how=" (killed at its limit)"
    echo "== $name: exit $rc after $((SECONDS - t0)) s$how"
    ((rc == 0)) || failed+=("$name")
}

# The one-line end of every run that stops early.
stop() {
    echo "== gpu-check.sh: STOPPED after ${SECONDS} s (budget ${budget} s): $*"
    exit 3
}

# What .gpu was built from, against this checkout.
show_build() {
    echo "== .gpu/BUILD"
    if [ ! -f "$g/BUILD" ]; then
        echo "WARNING: no $g/BUILD (packed by an older gpu-pack.sh): which code this is is unknown"
        return
    fi
    sed 's/^/  /' "$g/BUILD"
    local built head digest
    built=$(sed -n 's/^commit: //p' "$g/BUILD")
    if head=$(git rev-parse HEAD 2>/dev/null); then
        [ "$built" = "$head" ] || echo "WARNING: .gpu was built from $built, this checkout is at $head"
    else
        echo "  (no git here, HEAD unknown: comparing the source digest instead)"
    fi
    digest=$(scripts/gpu-source-digest.sh 2>/dev/null)
    [ "$digest" = "$(sed -n 's/^source digest: //p' "$g/BUILD")" ] ||
        echo "WARNING: the sources here (digest $digest) are not those .gpu was built from: its binaries test other code"
}

# Chooses the driver library (see the header) and sets LD_LIBRARY_PATH; sets $libcuda_said.
choose_driver() {
    local d dirs clean="" lib="${GPU_CHECK_LIBCUDA:-}" dropped=""
    IFS=: read -ra dirs <<<"${LD_LIBRARY_PATH:-}"
    for d in "${dirs[@]}"; do
        case $d in
            "") ;;
            */stubs | */stubs/*) dropped="$dropped $d" ;;
            *)
                clean=${clean:+$clean:}$d
                [ -z "$lib" ] && [ -e "$d/libcuda.so.1" ] && lib=$d/libcuda.so.1
                ;;
        esac
    done
    [ -z "$lib" ] && lib=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 .*x86-64/ { print $NF; exit }')
    for d in /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu /usr/lib64; do
        [ -z "$lib" ] && [ -e "$d/libcuda.so.1" ] && lib=$d/libcuda.so.1
    done
    [ -n "$dropped" ] && echo "LD_LIBRARY_PATH: dropped CUDA stub directories:$dropped"
    if [ -n "$lib" ]; then
        mkdir -p "$tmp/driver"
        ln -s "$(readlink -f "$lib")" "$tmp/driver/libcuda.so"
        ln -s "$(readlink -f "$lib")" "$tmp/driver/libcuda.so.1"
        libcuda_said="$lib -> $(readlink -f "$lib")"
        case $lib in */stubs/*) libcuda_said="$libcuda_said (a CUDA STUB library: no GPU through it)" ;; esac
        clean=$tmp/driver${clean:+:$clean}
    else
        libcuda_said="none found (LD_LIBRARY_PATH, ldconfig, /usr/local/nvidia/lib64, /usr/lib/x86_64-linux-gnu, /usr/lib64)"
    fi
    echo "driver library: $libcuda_said"
    export LD_LIBRARY_PATH=$clean
}

# The MPI settings that match the MPI in use (see the header); saves what the environment
# had for the direct steps: $saved_env (VAR=value) and $saved_unset (-u VAR).
carried_vars=(OMPI_MCA_pml OMPI_MCA_btl OMPI_MCA_mtl OMPI_MCA_osc OMPI_MCA_smsc
    OMPI_MCA_btl_vader_single_copy_mechanism)
choose_mpi_settings() {
    local major=$1 v scope kernel cma=yes why
    saved_env=() saved_unset=()
    for v in "${carried_vars[@]}"; do
        if [ -n "${!v+x}" ]; then saved_env+=("$v=${!v}"); else saved_unset+=(-u "$v"); fi
    done
    scope=$(cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null || echo absent)
    kernel=$(uname -r)
    why="ptrace_scope $scope: Open MPI's cma can attach to its peers"
    if [ "$kernel" = 4.4.0 ]; then
        cma=no why="kernel 4.4.0 (gVisor), which may refuse cross-memory attach"
    elif [ "$scope" = 2 ] || [ "$scope" = 3 ]; then
        cma=no why="ptrace_scope $scope forbids attaching to a sibling process"
    fi
    case ${GPU_CHECK_SMSC:-} in
        cma) cma=yes why="GPU_CHECK_SMSC=cma" ;;
        none) cma=no why="GPU_CHECK_SMSC=none" ;;
    esac
    export OMPI_MCA_pml=ob1 OMPI_MCA_mtl='^ofi' OMPI_MCA_osc='^ucx'
    if ((major >= 5)); then
        export OMPI_MCA_btl=self,sm
        if [ $cma = yes ]; then export OMPI_MCA_smsc=cma; else export OMPI_MCA_smsc='^cma'; fi
        echo "MPI settings: pml=ob1 btl=self,sm mtl=^ofi osc=^ucx smsc=$OMPI_MCA_smsc ($why)"
    else
        export OMPI_MCA_btl=self,vader
        OMPI_MCA_btl_vader_single_copy_mechanism=none
        [ $cma = yes ] && OMPI_MCA_btl_vader_single_copy_mechanism=cma
        export OMPI_MCA_btl_vader_single_copy_mechanism
        echo "MPI settings (Open MPI $major): pml=ob1 btl=self,vader mtl=^ofi osc=^ucx" \
            "btl_vader_single_copy_mechanism=$OMPI_MCA_btl_vader_single_copy_mechanism ($why)"
    fi
}

# The machine, in what explains a failure in the first minute.
show_machine() {
    echo "== machine"
    if command -v nvidia-smi >/dev/null; then
        capped 20 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode,persistence_mode,mig.mode.current --format=csv 2>&1 | head -9
    else
        echo "nvidia-smi: not found"
    fi
    echo "kernel: $(uname -r); ptrace_scope: $(cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null || echo absent); ulimit -l: $(ulimit -l); cores: $(nproc)"
    df -h /dev/shm 2>&1 | tail -1 | awk '{ print "/dev/shm: " $2 " size, " $4 " free" }'
    ldconfig -p 2>/dev/null | grep -E 'libcuda\.so|ptxjitcompiler' | head -6
    echo "preset variables:"
    env | grep -E '^(OMPI|OPAL|PMIX|PRTE|UCX|CUDA)_' | sed 's/^/  /' | head -40
    choose_driver
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
}

# The CUDA-aware Open MPI of this machine, if any (an Open MPI with libmpi.so.40, the soname
# the binaries link, built with CUDA); prints its prefix.
find_cuda_aware_mpi() {
    local oi here
    here=$(readlink -f "$(command -v ompi_info || echo none)")
    for oi in /opt/*/bin/ompi_info /opt/*/*/bin/ompi_info /opt/*/*/*/bin/ompi_info \
        /usr/local/bin/ompi_info /usr/local/*/bin/ompi_info /usr/bin/ompi_info; do
        [ -x "$oi" ] || continue
        [ "$(readlink -f "$oi")" = "$here" ] && continue
        if capped 20 env -u OPAL_PREFIX LD_LIBRARY_PATH="$(dirname "$(dirname "$oi")")/lib:$LD_LIBRARY_PATH" \
            "$oi" --parsable --all 2>/dev/null | grep -q 'built_with_cuda_support:value:true'; then
            dirname "$(dirname "$oi")"
            return
        fi
    done
}

run_direct_steps() {
    local aware
    aware=$(find_cuda_aware_mpi)
    if [ -z "$aware" ]; then
        echo "== direct transport: skipped (no CUDA-aware Open MPI found on this machine)"
        return
    fi
    echo "== CUDA-aware Open MPI found at $aware: run with the environment's own MPI settings"
    local with=(env "${saved_unset[@]}" "${saved_env[@]}" OPAL_PREFIX="$aware" PATH="$aware/bin:$PATH"
        LD_LIBRARY_PATH="$aware/lib:$LD_LIBRARY_PATH")
    step "check on CUDA tensors, direct, 2 ranks ($aware)" 90 "${with[@]}" \
        mpirun --oversubscribe --bind-to none -n 2 "$g/bin/dlpack-mpi" check -q --device cuda --transport direct
    step "GPU cases, direct, 2 ranks ($aware)" 90 "${with[@]}" \
        mpirun --oversubscribe --bind-to none -n 2 "$g/bin/mpi" --suite gpu
}

main() {
    trap 'rm -rf "$tmp"' EXIT
    echo "== gpu-check.sh at $(date -u +%FT%TZ), budget ${budget} s"
    show_build
    if [ -x "$g/ompi/bin/mpirun" ]; then
        export OPAL_PREFIX=$g/ompi PATH=$g/ompi/bin:$PATH LD_LIBRARY_PATH=$g/ompi/lib:${LD_LIBRARY_PATH:-}
        export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PRTE_MCA_prte_allow_run_as_root=1
        launcher=mpirun
    else
        # shellcheck source=scripts/mpi-env.sh disable=SC1091
        source scripts/mpi-env.sh
        launcher=$MPIRUN
    fi
    export RUST_BACKTRACE=1 DLPACK_MPI_REQUIRE_GPU=1
    show_machine
    echo "== MPI"
    local version
    version=$(capped 20 "$launcher" --version 2>&1 | head -1)
    echo "launcher: $launcher: $version; built with CUDA support: $(capped 20 ompi_info --parsable --all 2>/dev/null | grep -m1 'built_with_cuda_support:value' | cut -d: -f7)"
    local major
    major=$(grep -oE '[0-9]+\.[0-9]+\.[0-9]+' <<<"$version" | head -1 | cut -d. -f1)
    choose_mpi_settings "${major:-5}"
    if command -v python3 >/dev/null; then
        capped 20 python3 -c 'from mpi4py import MPI; print("mpi4py at", MPI.__file__, "->", MPI.Get_library_version().splitlines()[0])' 2>&1 | tr -d '\0' | tail -1
    fi
    local mpirun_2=("$launcher" --oversubscribe --bind-to none -n 2)

    step "info" 45 "$g/bin/dlpack-mpi" info
    local gpu_line
    gpu_line=$(grep -m1 '^GPU runtime:' "$tmp/step.out")
    if [[ $gpu_line != "GPU runtime: CUDA driver"* ]]; then
        [ -n "$gpu_line" ] || gpu_line="GPU runtime: unknown: info printed no such line (exit $rc)"
        gpu_line=${gpu_line#GPU runtime: }
        stop "no working CUDA runtime: ${gpu_line#none: }; driver library: $libcuda_said"
    fi
    step "GPU cases (tests/mpi/gpu.rs), 2 ranks" 90 "${mpirun_2[@]}" "$g/bin/mpi" --suite gpu
    if ((rc == 3)); then
        local why
        why=$(grep -m1 -E '^GPU cases: rank [0-9]+: cannot run: ' "$tmp/step.out" || grep -m1 'cannot run:' "$tmp/step.out")
        stop "a rank cannot use the GPU: ${why#GPU cases: }"
    fi
    step "simulated-device cases, 2 ranks" 45 "${mpirun_2[@]}" "$g/bin/mpi" --suite device_cases
    step "check on CUDA tensors, staged, 2 ranks" 150 "${mpirun_2[@]}" "$g/bin/dlpack-mpi" check -q --device cuda --transport staged
    step "GPU bench, 2 ranks" 150 "${mpirun_2[@]}" "$g/bin/dlpack-mpi" bench --device cuda --op all --sizes 4K:256M --iters 2000 --rounds 3
    run_direct_steps
    if ((${#failed[@]} == 0)); then
        echo "== gpu-check.sh: PASSED: $steps step(s) in ${SECONDS} s (budget ${budget} s)"
        exit 0
    fi
    echo "== gpu-check.sh: FAILED: ${#failed[@]} of $steps step(s) in ${SECONDS} s (budget ${budget} s): $(printf '%s; ' "${failed[@]}")"
    exit 1
}

main 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
