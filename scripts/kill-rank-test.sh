#!/usr/bin/env bash
# A rank lost in the middle of a job: starts `dlpack-mpi check -v` (release build, Rust-made
# tensors) at each rank count given (default: 2 4), waits until rank 0 has reported 20 cases
# (the run is under way, all ranks inside MPI), kills one non-root rank with SIGKILL (rank 1
# at 2 ranks, rank 2 at 4), and asserts that
#   - the job (the launcher and every rank) ends within BOUND seconds of the kill
#     (DLPACK_MPI_KILL_BOUND_S, default 30; Open MPI takes under a second here),
#   - with a non-zero status,
#   - and its output names the lost rank: "rank N" (case-insensitive), as Open MPI's mpirun
#     prints it ("process rank 1 with PID ... exited on signal 9"), and when that line also
#     gives a PID, the PID of the process killed (a launcher naming another process fails;
#     PID 0, which Open MPI 4.1.4 prints here, means it did not know it);
#     MPICH's hydra (4.0) names only the PID ("BAD TERMINATION ... PID 1234 RUNNING AT
#     host"), so under MPICH the message must name the PID of the lost rank, which this
#     script maps to the rank (a message naming another PID fails, and says which).
# A job still running after the bound is killed (the launcher, then each rank by PID) and the
# case fails. Uses the launcher of scripts/mpi-env.sh: Open MPI, or MPICH with
# DLPACK_MPI_IMPL=mpich (then the binary of target/mpich). Prints one line per rank count.
#
# Usage: scripts/kill-rank-test.sh [N...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/mpi-env.sh
source scripts/mpi-env.sh

BOUND=${DLPACK_MPI_KILL_BOUND_S:-30}
BIN=$TARGET_DIR/release/dlpack-mpi
if [[ ! -x $BIN ]]; then
    echo "kill-rank-test: $BIN is missing (cargo build --release --features cli,python --bin dlpack-mpi)" >&2
    exit 1
fi

# PIDs of this job's rank processes (their environment carries $1), one per line; with $2,
# only the process of world rank $2 (Open MPI: OMPI_COMM_WORLD_RANK, MPICH: PMI_RANK).
job_pids() {
    local token=$1 rank=${2:-} env pid
    for env in /proc/[0-9]*/environ; do
        pid=${env#/proc/}
        pid=${pid%/environ}
        [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == */dlpack-mpi ]] || continue
        env=$(tr '\0' '\n' <"$env" 2>/dev/null) || continue
        grep -qx "DLPACK_MPI_FAULT_TOKEN=$token" <<<"$env" || continue
        if [[ -z $rank ]] || grep -qxE "(OMPI_COMM_WORLD_RANK|PMI_RANK)=$rank" <<<"$env"; then
            echo "$pid"
        fi
    done
}

# Kills the launcher $1 and every rank of job $2 (a job over its bound).
end_job() {
    local pid
    kill -KILL "$1" 2>/dev/null || true
    for pid in $(job_pids "$2"); do
        kill -KILL "$pid" 2>/dev/null || true
    done
}

# One case: $1 ranks, kill rank $2. Returns non-zero on any failed assertion.
kill_one() {
    local n=$1 victim=$2 token log job pid t0 elapsed rc=0 deadline
    token="$$-$n-$RANDOM"
    log=$(mktemp)
    DLPACK_MPI_FAULT_TOKEN=$token "$MPIRUN" "${MPIRUN_FLAGS[@]}" -n "$n" "$BIN" check \
        --producer rust -v >"$log" 2>&1 &
    job=$!
    # Under way: 20 PASS lines from rank 0 (at most 300 s to get there on a loaded machine).
    deadline=$((SECONDS + 300))
    while (($(grep -c '^PASS' "$log" || true) < 20)); do
        if ! kill -0 "$job" 2>/dev/null || ((SECONDS > deadline)); then
            echo "kill-rank-test: $n ranks: the check run ended or stalled before 20 cases" >&2
            tail -n 20 "$log" >&2
            end_job "$job" "$token"
            wait "$job" || true
            rm -f "$log"
            return 1
        fi
        sleep 0.2
    done
    pid=$(job_pids "$token" "$victim" | head -n 1)
    if [[ -z $pid ]]; then
        echo "kill-rank-test: $n ranks: no process found for rank $victim" >&2
        end_job "$job" "$token"
        wait "$job" || true
        rm -f "$log"
        return 1
    fi
    t0=$(date +%s.%N)
    kill -KILL "$pid"
    deadline=$(date -d "@$(awk -v t="$t0" -v b="$BOUND" 'BEGIN { printf "%.3f", t + b }')" +%s.%N)
    while kill -0 "$job" 2>/dev/null && [[ $(date +%s.%N) < $deadline ]]; do
        sleep 0.1
    done
    elapsed=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    if kill -0 "$job" 2>/dev/null; then
        echo "kill-rank-test: $n ranks: the job still runs ${BOUND} s after rank $victim was killed" >&2
        end_job "$job" "$token"
        rc=1
    fi
    local status=0
    wait "$job" || status=$?
    if [[ -n $(job_pids "$token") ]]; then
        echo "kill-rank-test: $n ranks: rank processes outlived the launcher: $(job_pids "$token" | tr '\n' ' ')" >&2
        end_job "$job" "$token"
        rc=1
    fi
    if ((status == 0)); then
        echo "kill-rank-test: $n ranks: the job exited with status 0 after losing rank $victim" >&2
        rc=1
    fi
    local named
    named=$(grep -iE "rank $victim([^0-9]|$)" "$log" | grep -viE '^(PASS|SKIP|FAIL) ' | head -n 1 || true)
    if [[ -z $named && $DLPACK_MPI_IMPL == mpich ]]; then
        # MPICH's hydra (4.0 here) names the process by PID only.
        named=$(grep -E "PID $pid([^0-9]|$)" "$log" | head -n 1 || true)
        [[ -z $named ]] || named="$named (PID $pid is rank $victim)"
    fi
    if [[ -z $named ]]; then
        # Say which process the launcher did name, if any (hydra's PID is not always the
        # killed one).
        local other
        other=$(grep -oE "PID [0-9]+" "$log" | head -n 1 || true)
        echo "kill-rank-test: $n ranks: no message names rank $victim (PID $pid)${other:+; the launcher names $other}; the output ends:" >&2
        tail -n 20 "$log" >&2
        rc=1
    elif [[ $named =~ PID[[:space:]]+([0-9]+) && ${BASH_REMATCH[1]} != "$pid" &&
        ${BASH_REMATCH[1]} != 0 ]]; then
        # A launcher that names the rank must name its process too (Open MPI: "process
        # rank N with PID P"): a message naming the right rank with another PID is wrong.
        # PID 0 is a launcher that does not report it (Open MPI 4.1.4 prints "with PID 0"
        # here for every killed rank), not a wrong one.
        echo "kill-rank-test: $n ranks: the launcher names rank $victim as PID ${BASH_REMATCH[1]}, but the killed process was PID $pid: $named" >&2
        rc=1
    fi
    if ((rc == 0)); then
        echo "kill-rank-test: $n ranks ($DLPACK_MPI_IMPL): rank $victim (PID $pid) killed after $(grep -c '^PASS' "$log") cases; job ended in $elapsed s (bound $BOUND s), status $status: $named"
    fi
    rm -f "$log"
    return "$rc"
}

failed=0
for n in "${@:-2 4}"; do
    for m in $n; do
        victim=$((m == 2 ? 1 : 2))
        kill_one "$m" "$victim" || failed=1
    done
done
exit "$failed"
