#!/usr/bin/env bash
# A rank lost in the middle of a job: starts `dlpack-mpi check -v` (release build, Rust-made
# tensors) at each rank count given (default: 2 4), waits until rank 0 has reported 20 cases
# (the run is under way, all ranks inside MPI), records every rank's PID (and host: this
# one), kills one non-root rank with SIGKILL (rank 1 at 2 ranks, rank 2 at 4), and asserts
#   - the job (the launcher and every rank) ends within BOUND seconds of the kill
#     (DLPACK_MPI_KILL_BOUND_S, default 30; Open MPI takes about 1 s here, MPICH 0.1 s),
#   - with a non-zero status,
#   - the launcher names the killed process, by what that launcher reports:
#       Open MPI (mpirun): "process rank R with PID P on node H exited on signal 9" (or a
#         "Process name: [[J,V],R]" block): R must be the killed rank, H this host, and P
#         its PID; P = 0, which Open MPI 4.1 prints here for every killed rank
#         (open-mpi/ompi#9389), names no process and is reported as "PID not reported";
#       MPICH (hydra, run with -print-all-exitcodes): the "BAD TERMINATION ... [RANK R]
#         PID P RUNNING AT H ... EXIT CODE: 9 | KILLED BY SIGNAL: 9" block: P must be a
#         rank process of this job (mapped to its rank by the PIDs recorded), on this host,
#         killed by signal 9, and the "Exit codes:" list must give 9 for the killed rank;
#       a launcher line naming another rank, PID or host fails the case, and says which;
#   - and any line of dlpack-mpi check's own that names a lost peer after the kill ("no
#     word from rank N") names the killed rank only (none does here: both launchers end
#     the surviving ranks first).
# KNOWN-BUG (MPICH 4.0.x's hydra): the block names the first process of the node whose
# recorded status is a signal, and hydra's own cleanup (SIGKILL to the surviving ranks)
# sometimes records 9 for a survivor too, so at 4 ranks it often names rank 0 or 1 instead
# of rank 2 (docs/CLI.md, "A rank killed"). A case where hydra 4.0.x names another rank of
# this job whose exit code it also recorded as 9 is printed as KNOWN-BUG, with the PIDs and
# the exit codes, and does not fail the run unless DLPACK_MPI_KILL_STRICT=1; every other
# assertion still holds, and the same misnaming under another hydra version, or under
# Open MPI, fails.
# A job still running after the bound is killed (the launcher, then each rank by PID) and the
# case fails. Uses the launcher of scripts/mpi-env.sh: Open MPI, or MPICH with
# DLPACK_MPI_IMPL=mpich (then the binary of target/mpich). Prints one line per rank count,
# then the counts.
#
# Usage: scripts/kill-rank-test.sh [N...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/mpi-env.sh
source scripts/mpi-env.sh

BOUND=${DLPACK_MPI_KILL_BOUND_S:-30}
STRICT=${DLPACK_MPI_KILL_STRICT:-0}
BIN=$TARGET_DIR/release/dlpack-mpi
if [[ ! -x $BIN ]]; then
    echo "kill-rank-test: $BIN is missing (cargo build --release --features cli,python --bin dlpack-mpi)" >&2
    exit 1
fi
# The ranks run here (a single-host job), so each one's host is this one.
HOST=$(hostname)
LAUNCH_FLAGS=("${MPIRUN_FLAGS[@]}")
HYDRA_VERSION=""
if [[ $DLPACK_MPI_IMPL == mpich ]]; then
    # Hydra's exit code of every process, in rank order per host: the evidence for (or
    # against) the process its BAD TERMINATION block names.
    LAUNCH_FLAGS+=(-print-all-exitcodes)
    HYDRA_VERSION=$("$MPIRUN" --version 2>/dev/null | awk '$1 == "Version:" { print $2; exit }')
fi

# "RANK PID" for each rank process of this job (its environment carries
# DLPACK_MPI_FAULT_TOKEN=$1; the rank is Open MPI's OMPI_COMM_WORLD_RANK or MPICH's
# PMI_RANK), one per line, by rank.
job_ranks() {
    local token=$1 env pid rank
    for env in /proc/[0-9]*/environ; do
        pid=${env#/proc/}
        pid=${pid%/environ}
        [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == */dlpack-mpi ]] || continue
        env=$(tr '\0' '\n' <"$env" 2>/dev/null) || continue
        grep -qx "DLPACK_MPI_FAULT_TOKEN=$token" <<<"$env" || continue
        rank=$(sed -nE 's/^(OMPI_COMM_WORLD_RANK|PMI_RANK)=([0-9]+)$/\2/p' <<<"$env" | head -n 1)
        echo "${rank:--} $pid"
    done | sort -n
}

# Kills the launcher $1 and every rank of job $2 (a job over its bound, or a failed start).
end_job() {
    local pid
    kill -KILL "$1" 2>/dev/null || true
    for pid in $(job_ranks "$2" | awk '{ print $2 }'); do
        kill -KILL "$pid" 2>/dev/null || true
    done
}

# Whether hosts $1 and $2 are one (a short name matches its fully qualified one).
same_host() {
    [[ ${1%%.*} == "${2%%.*}" ]]
}

# The rank of PID $1 in the "RANK PID" lines $2 (empty when no rank has it).
rank_of() {
    awk -v p="$1" '$2 == p { print $1; exit }' <<<"$2"
}

# What the launcher's output $1 (a file) says about the lost process, against the killed
# rank $2 (PID $3) and the ranks' "RANK PID" lines $4. Sets `named` (what the launcher
# said, for the report), `why` (empty when it names the killed process; else what is
# wrong) and `known` (1 when the wrong naming is hydra 4.0.x's known bug).
judge_launcher() {
    local log=$1 victim=$2 vpid=$3 ranks=$4 line r p h s n=0 codes slot other
    named="" why="" known=0
    if [[ $DLPACK_MPI_IMPL == openmpi ]]; then
        # "mpirun noticed that process rank R with PID P on node H exited on signal S (…)."
        while IFS= read -r line; do
            [[ $line =~ process\ rank\ ([0-9]+)\ with\ PID\ ([0-9]+)\ on\ node\ ([^ ]+)\ exited\ on\ signal\ ([0-9]+) ]] ||
                continue
            n=$((n + 1))
            r=${BASH_REMATCH[1]} p=${BASH_REMATCH[2]} h=${BASH_REMATCH[3]} s=${BASH_REMATCH[4]}
            named=${named:+$named; }$line
            if ((r != victim)); then
                why+="; it names rank $r (PID $p on $h), but rank $victim was killed"
            elif ! same_host "$h" "$HOST"; then
                why+="; it puts rank $r on node $h, but it ran on $HOST"
            elif ((p != 0 && p != vpid)); then
                other=$(rank_of "$p" "$ranks")
                why+="; it names rank $victim as PID $p${other:+ (rank $other)}, but the killed process was PID $vpid"
            elif ((s != 9)); then
                why+="; it says signal $s, but the rank was killed with signal 9"
            elif ((p == 0)); then
                named+=" [PID not reported: 0, open-mpi/ompi#9389]"
            fi
        done < <(grep -E 'process rank [0-9]+ with PID [0-9]+ on node ' "$log" || true)
        # Other Open MPI messages name a process as "Process name: [[JOB,VPID],RANK]".
        while IFS= read -r r; do
            n=$((n + 1))
            named="${named:+$named; }Process name: [[J,V],$r]"
            ((r == victim)) || why+="; a \"Process name\" block names rank $r, but rank $victim was killed"
        done < <(sed -nE 's/.*Process name: \[\[[0-9]+,[0-9]+\],([0-9]+)\].*/\1/p' "$log")
        ((n > 0)) || why="; mpirun names no process (no \"process rank N with PID P on node H\" line)"
    else
        # Hydra: "=   [RANK R ]PID P RUNNING AT H", then "=   EXIT CODE: C" or
        # "=   KILLED BY SIGNAL: S (…)"; with -print-all-exitcodes, "Exit codes: [H] c0,c1,…".
        while IFS= read -r line; do
            [[ $line =~ ^=\ +(RANK\ ([0-9]+)\ +)?PID\ ([0-9]+)\ RUNNING\ AT\ ([^ ]+) ]] || continue
            n=$((n + 1))
            r=${BASH_REMATCH[2]} p=${BASH_REMATCH[3]} h=${BASH_REMATCH[4]}
            # The status line after this one (hydra prints one block, for one process).
            s=$(grep -A1 -F -x "$line" "$log" | sed -nE 's/^= +(EXIT CODE|KILLED BY SIGNAL): ([0-9]+).*/\2/p' | head -n 1)
            other=$(rank_of "$p" "$ranks")
            named=${named:+$named; }${line#=   }${s:+, exit code $s}
            if [[ -z $other ]]; then
                why+="; it names PID $p, which is no rank process of this job (rank $victim was PID $vpid)"
            elif [[ -n $r && $r != "$other" ]]; then
                why+="; it names rank $r with PID $p, but PID $p was rank $other"
            elif ! same_host "$h" "$HOST"; then
                why+="; it puts PID $p on $h, but it ran on $HOST"
            elif [[ $s != 9 ]]; then
                why+="; it gives PID $p status ${s:-none}, not signal 9"
            elif ((p != vpid)); then
                why+="; it names PID $p (rank $other), but the killed process was PID $vpid (rank $victim)"
                codes=$(sed -nE "s/.*Exit codes: \[${HOST%%.*}[^]]*\] ([0-9,]+).*/\1/p" "$log" | head -n 1)
                slot=$(cut -d, -f"$((other + 1))" <<<"$codes")
                # Hydra 4.0.x: a survivor its cleanup killed, recorded with signal 9.
                if [[ $HYDRA_VERSION == 4.0.* && $slot == 9 ]]; then
                    known=1
                fi
            fi
        done < <(grep -E '^= +(RANK [0-9]+ +)?PID [0-9]+ RUNNING AT ' "$log" || true)
        ((n > 0)) || why="; hydra names no process (no \"BAD TERMINATION ... PID P RUNNING AT H\" block)"
        # The exit code hydra recorded for the killed rank must be its signal.
        codes=$(sed -nE "s/.*Exit codes: \[${HOST%%.*}[^]]*\] ([0-9,]+).*/\1/p" "$log" | head -n 1)
        if [[ -z $codes ]]; then
            why+="; hydra printed no \"Exit codes: [$HOST] ...\" line"
            known=0
        else
            slot=$(cut -d, -f"$((victim + 1))" <<<"$codes")
            named+=" (exit codes by rank: $codes)"
            if [[ $slot != 9 ]]; then
                why+="; hydra's exit code for the killed rank $victim is ${slot:-missing}, not 9 (exit codes by rank: $codes)"
                known=0
            fi
        fi
        # Only the one known misnaming, and nothing else wrong, is the known bug.
        if ((known)) && [[ $why == *"; "*"; "* ]]; then
            known=0
        fi
    fi
    why=${why#; }
}

passed=0 known_bugs=0 failed=0

# One case: $1 ranks, kill rank $2. Returns non-zero on any failed assertion; counts a
# known bug in known_bugs.
kill_one() {
    local n=$1 victim=$2 token log job pid ranks count t0 elapsed rc=0 deadline at
    token="$$-$n-$RANDOM"
    log=$(mktemp)
    DLPACK_MPI_FAULT_TOKEN=$token "$MPIRUN" "${LAUNCH_FLAGS[@]}" -n "$n" "$BIN" check \
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
    ranks=$(job_ranks "$token")
    count=$(grep -c . <<<"$ranks" || true)
    pid=$(awk -v r="$victim" '$1 == r { print $2; exit }' <<<"$ranks")
    if ((count != n)) || [[ -z $pid ]]; then
        echo "kill-rank-test: $n ranks: found $count rank processes (rank PID: $(tr '\n' ' ' <<<"$ranks")), no rank $victim among them" >&2
        end_job "$job" "$token"
        wait "$job" || true
        rm -f "$log"
        return 1
    fi
    at=$(wc -l <"$log")
    t0=$(date +%s.%N)
    kill -KILL "$pid"
    deadline=$(date -d "@$(awk -v t="$t0" -v b="$BOUND" 'BEGIN { printf "%.3f", t + b }')" +%s.%N)
    while kill -0 "$job" 2>/dev/null && [[ $(date +%s.%N) < $deadline ]]; do
        sleep 0.1
    done
    elapsed=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    local what="$n ranks ($DLPACK_MPI_IMPL${HYDRA_VERSION:+ hydra $HYDRA_VERSION}): killed rank $victim (PID $pid on $HOST; PIDs by rank: $(awk '{ printf "%s%s=%s", (NR > 1 ? ", " : ""), $1, $2 }' <<<"$ranks"))"
    if kill -0 "$job" 2>/dev/null; then
        echo "kill-rank-test: $what: the job still runs ${BOUND} s after the kill" >&2
        end_job "$job" "$token"
        rc=1
    fi
    local status=0
    wait "$job" || status=$?
    if [[ -n $(job_ranks "$token") ]]; then
        echo "kill-rank-test: $what: rank processes outlived the launcher: $(job_ranks "$token" | tr '\n' ' ')" >&2
        end_job "$job" "$token"
        rc=1
    fi
    if ((status == 0)); then
        echo "kill-rank-test: $what: the job exited with status 0" >&2
        rc=1
    fi
    local named why known
    judge_launcher "$log" "$victim" "$pid" "$ranks"
    # dlpack-mpi check's own word on a lost peer, after the kill (the watchdog's "no word
    # from rank N"): it must name the killed rank only.
    local ours peers
    ours=$(tail -n "+$((at + 1))" "$log" | grep -E '^dlpack-mpi check.*no word from ranks? [0-9]' || true)
    peers=$(grep -oE 'no word from ranks? [0-9][0-9, and]*' <<<"$ours" | grep -oE '[0-9]+' | sort -u | tr '\n' ' ' || true)
    if [[ -n $peers && $peers != "$victim " ]]; then
        echo "kill-rank-test: $what: dlpack-mpi check names rank(s) ${peers% } as lost: $ours" >&2
        rc=1
    fi
    ours=${peers:+dlpack-mpi check names rank ${peers% } as lost}
    ours=${ours:-dlpack-mpi check names no lost peer}
    if [[ -n $why ]]; then
        if ((known && rc == 0)); then
            echo "kill-rank-test: $what: KNOWN-BUG (MPICH hydra 4.0.x names a process its own cleanup killed, docs/CLI.md): $why; the launcher printed: $named; job ended in $elapsed s (bound $BOUND s), status $status; $ours"
            known_bugs=$((known_bugs + 1))
            rm -f "$log"
            ((STRICT == 0)) || return 1
            return 0
        fi
        echo "kill-rank-test: $what: the launcher does not name the killed process: $why; the launcher printed: ${named:-nothing}; the output ends:" >&2
        tail -n 20 "$log" >&2
        rc=1
    fi
    if ((rc == 0)); then
        echo "kill-rank-test: $what after $(grep -c '^PASS' "$log") cases; job ended in $elapsed s (bound $BOUND s), status $status; the launcher names it: $named; $ours"
        passed=$((passed + 1))
    fi
    rm -f "$log"
    return "$rc"
}

for n in "${@:-2 4}"; do
    for m in $n; do
        victim=$((m == 2 ? 1 : 2))
        kill_one "$m" "$victim" || failed=$((failed + 1))
    done
done
strict=""
((STRICT == 0)) || strict=" (DLPACK_MPI_KILL_STRICT=1: counted as failed too)"
echo "kill-rank-test: $passed passed, $known_bugs known bugs$strict, $failed failed"
# A known bug fails the run only under DLPACK_MPI_KILL_STRICT=1 (counted in failed then).
((failed == 0))
