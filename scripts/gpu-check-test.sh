#!/usr/bin/env bash
# Runs scripts/gpu-check.sh end to end on a machine without a GPU, against fake CUDA driver
# libraries (tests/fixtures/fake_libcuda.c, built here with cc) and a cheap local pack
# (`scripts/gpu-pack.sh --local`: the debug binaries of features `cli,cuda`), and checks that
# every run ends within its budget with the right one-line reason:
#
#   none        no libcuda at all           -> STOPPED: no working CUDA runtime (no library)
#   stub        cuInit = STUB_LIBRARY (34)  -> STOPPED: no working CUDA runtime (... (34))
#   excl        rank 1 gets no context      -> STOPPED: a rank cannot use the GPU: rank 1 ...
#   stubs dir   a toolkit's stubs/libcuda.so first on LD_LIBRARY_PATH, the excl driver after
#               it                          -> the excl reason: the stub never wins
#   budget      rank 0's copy never returns inside a pipelined send (a stuck device),
#               budget 25 s                 -> FAILED within the budget, later steps "not run"
#
# and runs the GPU cases (the suite gpu of the test binary tests/mpi) directly at 2 ranks
# with a fake where only rank 1's allocations fail (every case fails on both ranks at once,
# nothing waits), with a fake
# whose device copy fails inside a pipelined send (the sender aborts the message and the
# receiver returns SenderAborted naming it: the job ends, no watchdog needed), with the stuck
# copy under a 5 s case watchdog (the job is aborted, nothing hangs), and the strided device
# case (2-D copies) alone against the failing-copy fake, where it passes.
# About a minute on 2 cores once the debug `cuda` build exists (scripts/test.sh builds it).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/mpi-env.sh disable=SC1091
source scripts/mpi-env.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

for mode in stub excl alloc1 copy0 hang0; do
    mkdir -p "$work/$mode"
    cc -shared -fPIC -O1 -Wall -Wextra -Werror -DFAKE_MODE="FAKE_${mode^^}" \
        -o "$work/$mode/libcuda.so.1" tests/fixtures/fake_libcuda.c
done
# A toolkit's stub is named libcuda.so (no .so.1) and lives in .../stubs.
mkdir -p "$work/cuda/lib64/stubs"
cp "$work/stub/libcuda.so.1" "$work/cuda/lib64/stubs/libcuda.so"
scripts/gpu-pack.sh --local "$work/pack" >"$work/pack.log" 2>&1 || {
    cat "$work/pack.log"
    exit 1
}

# check NAME BUDGET_S WANT_RC WANT_LAST_LINE_REGEX LD_LIBRARY_PATH [ENV...]
check() {
    local name=$1 budget=$2 want_rc=$3 want=$4 path=$5; shift 5
    local t0=$SECONDS rc=0
    mkdir -p "$work/out-$name"
    env LD_LIBRARY_PATH="$path" GPU_CHECK_DIR="$work/pack" GPU_CHECK_BUDGET_S="$budget" \
        OUT="$work/out-$name" "$@" scripts/gpu-check.sh >"$work/$name.txt" 2>&1 || rc=$?
    local took=$((SECONDS - t0)) last
    last=$(grep '^== gpu-check.sh: ' "$work/$name.txt" | tail -1)
    echo "$name: exit $rc after $took s: $last"
    ((rc == want_rc)) || fail "$name: exit $rc, want $want_rc"
    ((took <= budget + 3)) || fail "$name: took $took s, budget $budget s"
    [[ $last =~ $want ]] || fail "$name: last line does not match /$want/"
    cmp -s "$work/$name.txt" "$work/out-$name/gpu-check.log" || fail "$name: gpu-check.log differs from the output"
    # A killed job's ranks may take a moment to exit; none may outlive that.
    local waits=0
    while ((waits++ < 10)); do
        pgrep -f "$work/pack/bin/" >/dev/null || break
        sleep 0.5
    done
    if pgrep -af "$work/pack/bin/"; then
        fail "$name: processes of the pack still running 5 s after gpu-check.sh ended"
    fi
    ((fails == 0)) || tail -40 "$work/$name.txt"
}

if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
    echo "none: skipped (this machine has a CUDA driver library)"
else
    check none 60 3 'STOPPED .*no working CUDA runtime: .*no CUDA driver library.*driver library: none found' ""
fi
check stub 60 3 'STOPPED .*no working CUDA runtime: .*cuInit failed: CUDA_ERROR_STUB_LIBRARY \(34\)\); driver library: .*/stub/libcuda\.so\.1' \
    "$work/stub"
excl='STOPPED .*a rank cannot use the GPU: rank 1: cannot run: .*cuDevicePrimaryCtxRetain failed: CUDA_ERROR_DEVICES_UNAVAILABLE \(46\)$'
check excl 60 3 "$excl" "$work/excl"
check stubs-dir 60 3 "$excl" "$work/cuda/lib64/stubs:$work/excl"
grep -q 'dropped CUDA stub directories: .*/stubs' "$work/stubs-dir.txt" || fail "stubs-dir: the log does not say the stub directory was dropped"
check budget 25 1 'FAILED: .*GPU cases.*\(not run\)' "$work/hang0"
grep -q 'GPU cases (tests/mpi/gpu.rs), 2 ranks: exit 124 .*(killed at its limit)' "$work/budget.txt" ||
    fail "budget: the GPU cases step was not killed at its capped limit"

# The GPU cases themselves, at 2 ranks.
gpu_at_2() {
    local name=$1 path=$2; shift 2
    local t0=$SECONDS rc=0
    env LD_LIBRARY_PATH="$path" "$@" timeout -k 5 60 "$MPIRUN" "${MPIRUN_FLAGS[@]}" -n 2 \
        "$work/pack/bin/mpi" --suite gpu >"$work/$name.txt" 2>&1 || rc=$?
    echo "$name: exit $rc after $((SECONDS - t0)) s"
    gpu_rc=$rc gpu_took=$((SECONDS - t0))
}
gpu_at_2 alloc1 "$work/alloc1"
((gpu_rc == 1 && gpu_took < 30)) || fail "alloc1: exit $gpu_rc after $gpu_took s, want 1 within 30 s"
grep -q 'rank 1: c61_real_kernel_staged: .*CUDA_ERROR_OUT_OF_MEMORY' "$work/alloc1.txt" || fail "alloc1: rank 1's reason missing"
grep -q 'rank 0: c61_real_kernel_staged: rank 1 failed at this step' "$work/alloc1.txt" || fail "alloc1: rank 0 did not agree"
# A device copy that fails inside a pipelined send: the sender aborts the message, the
# receiver returns SenderAborted naming it, and the job ends without a watchdog.
gpu_at_2 abort "$work/copy0"
((gpu_rc == 1 && gpu_took < 30)) || fail "abort: exit $gpu_rc after $gpu_took s, want 1 within 30 s"
grep -q 'SenderAborted { rank: 0, part: ' "$work/abort.txt" || fail "abort: the receiver did not name the aborting sender"
# A device copy that never returns: the case watchdog ends the job.
gpu_at_2 watchdog "$work/hang0" DLPACK_MPI_CASE_TIMEOUT_S=5
((gpu_rc != 0 && gpu_rc != 124 && gpu_took < 30)) || fail "watchdog: exit $gpu_rc after $gpu_took s, want an abort within 30 s"
grep -q 'c64_c65_ring_pipeline_empty_staged: still running after 5 s' "$work/watchdog.txt" || fail "watchdog: no watchdog message"
# The strided case alone against the copy0 fake (its failing copy is never reached there):
# the CUDA runtime's cuMemcpy2DAsync parameters (memory types, pitches) as the fake checks them.
rc=0
LD_LIBRARY_PATH="$work/copy0" timeout -k 5 60 "$MPIRUN" "${MPIRUN_FLAGS[@]}" -n 2 \
    "$work/pack/bin/mpi" --suite gpu strided_2d_copies >"$work/strided.txt" 2>&1 || rc=$?
echo "strided: exit $rc"
((rc == 0)) || fail "strided: exit $rc, want 0"
grep -q 'strided_2d_copies_staged \.\.\. ok' "$work/strided.txt" || fail "strided: the case did not pass"
((fails == 0)) || { for f in alloc1 abort watchdog strided; do tail -20 "$work/$f.txt"; done; }

if ((fails > 0)); then
    echo "gpu-check-test.sh: $fails failure(s)"
    exit 1
fi
echo "gpu-check-test.sh: all runs ended within their budgets with the right reason"
