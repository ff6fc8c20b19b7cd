#!/usr/bin/env bash
# Two hosts on one machine: makes two network namespaces joined by a veth pair (10.77.0.1/24
# and 10.77.0.2/24, addresses that exist inside the namespaces only), each with its own
# hostname (a UTS namespace), and runs one MPI job across them over TCP with one rank per
# "host": the multi-rank cases and the checked protocol (the suites mpi_cases and checked of
# the test binary tests/mpi) and
# the check matrix (`dlpack-mpi check -q`, at lengths 0 and 7 by default, see
# NETNS_CHECK_ARGS below), all at 2 ranks.
#
# Open MPI: mpirun starts inside namespace A with a hostfile of the two addresses; its rsh
# launcher reaches B through a small agent script (`ip netns exec B ...`, in place of ssh);
# TCP only (`btl tcp,self`), and both the BTL and the runtime's OOB channel are restricted
# to the veth subnet. MPICH: mpiexec.mpich (hydra) the same way, with the agent as its ssh
# launcher and UCX's TCP transport on the veth interface.
#
# Skipped (exit 0, with a line saying why) where namespaces cannot be made: not root, no
# `ip`, no `unshare`, or the kernel refuses. The namespaces are removed on exit.
#
# Usage: scripts/netns-test.sh (after a build; scripts/test.sh runs it as a stage)
# Environment: DLPACK_MPI_IMPL (openmpi | mpich, see scripts/mpi-env.sh); MPI_BIN, the test
# binary `mpi` (default: the newest in the target directory); NETNS_CHECK_ARGS
# (default "--len 0,7"; "all" = the whole matrix); NETNS_ONLY_CHECK=1 (the matrix only).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/mpi-env.sh
source scripts/mpi-env.sh

skip() {
    echo "netns-test: SKIP: $*"
    exit 0
}
[[ $(id -u) -eq 0 ]] || skip "needs root to make network namespaces (running as uid $(id -u))"
command -v ip >/dev/null 2>&1 || skip "no \`ip\` command (install iproute2)"
command -v unshare >/dev/null 2>&1 || skip "no \`unshare\` command (util-linux)"

newest() { # the newest executable among the files matching $1 (a glob)
    local f best=""
    for f in $1; do
        [[ -x $f && ! -d $f ]] || continue
        [[ -z $best || $f -nt $best ]] && best=$f
    done
    echo "$best"
}
cli=$TARGET_DIR/release/dlpack-mpi
mpi=${MPI_BIN:-$(newest "$TARGET_DIR/debug/deps/mpi-*")}
for f in "$cli" "$mpi"; do
    [[ -n $f && -x $f ]] || { echo "netns-test: missing binary '$f' (build first: scripts/test.sh does)" >&2; exit 1; }
done

# Unique names: several checkouts may run this at once on one machine.
id=dlpm$$
ns_a=${id}a ns_b=${id}b
if_a=${id}a0 if_b=${id}b0 # ≤ 15 characters
addr_a=10.77.0.1 addr_b=10.77.0.2 subnet=10.77.0.0/24
work=$(mktemp -d)
cleanup() {
    ip netns del "$ns_a" 2>/dev/null || true
    ip netns del "$ns_b" 2>/dev/null || true
    ip link del "${id}a0" 2>/dev/null || true # only if it was never moved
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' INT TERM # so that a timeout or Ctrl-C still runs the cleanup

ip netns add "$ns_a" 2>"$work/err" || skip "cannot make a network namespace: $(cat "$work/err")"
ip netns add "$ns_b" 2>"$work/err" || skip "cannot make a network namespace: $(cat "$work/err")"
ip link add "$if_a" type veth peer name "$if_b" 2>"$work/err" || skip "cannot make a veth pair: $(cat "$work/err")"
ip link set "$if_a" netns "$ns_a"
ip link set "$if_b" netns "$ns_b"
# Inside its namespace each end is called `veth0`: one interface name for both hosts (what
# UCX_NET_DEVICES, which hydra passes to every rank, needs).
ip -n "$ns_a" link set "$if_a" name veth0
ip -n "$ns_b" link set "$if_b" name veth0
if_a=veth0 if_b=veth0
ip -n "$ns_a" addr add "$addr_a/24" dev "$if_a"
ip -n "$ns_b" addr add "$addr_b/24" dev "$if_b"
for ns in "$ns_a" "$ns_b"; do
    ip -n "$ns" link set lo up
done
ip -n "$ns_a" link set "$if_a" up
ip -n "$ns_b" link set "$if_b" up
ip netns exec "$ns_a" unshare --uts true 2>"$work/err" || skip "cannot make a UTS namespace: $(cat "$work/err")"
echo "netns-test: hosts $ns_a ($addr_a, $if_a) and $ns_b ($addr_b, $if_b), $DLPACK_MPI_IMPL"

# The launcher agent, used in place of ssh: `agent [ssh options] HOST COMMAND...` runs
# COMMAND through sh inside HOST's namespace, with HOST's own hostname.
cat >"$work/agent" <<EOF
#!/bin/sh
while [ \$# -gt 0 ]; do
    case "\$1" in
        -*) shift ;;
        *) break ;;
    esac
done
host=\$1
shift
case "\$host" in
    $addr_a) ns=$ns_a; name=${id}-host-a ;;
    $addr_b) ns=$ns_b; name=${id}-host-b ;;
    *) echo "netns agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" unshare --uts sh -c "hostname \$name; \$*"
EOF
chmod +x "$work/agent"

case "$DLPACK_MPI_IMPL" in
    openmpi)
        printf '%s slots=1\n%s slots=1\n' "$addr_a" "$addr_b" >"$work/hosts"
        launch=("$MPIRUN" "${MPIRUN_FLAGS[@]}" -n 2 --hostfile "$work/hosts" --map-by node
            --mca plm_rsh_agent "$work/agent"
            --mca btl tcp,self --mca btl_tcp_if_include "$subnet" --mca oob_tcp_if_include "$subnet")
        ;;
    mpich)
        printf '%s:1\n%s:1\n' "$addr_a" "$addr_b" >"$work/hosts"
        launch=("$MPIRUN" -n 2 -f "$work/hosts" -launcher ssh -launcher-exec "$work/agent"
            -iface veth0 -genv UCX_TLS tcp,self -genv UCX_NET_DEVICES veth0)
        ;;
esac

# mpirun itself runs on host A (so that its own address is 10.77.0.1, local to it), under
# a time limit of NETNS_TIMEOUT seconds per job (default 300).
export NETNS_TIMEOUT=${NETNS_TIMEOUT:-300}
on_a() {
    ip netns exec "$ns_a" unshare --uts sh -c 'hostname "$0"-host-a; exec timeout "$NETNS_TIMEOUT" "$@"' \
        "$id" "$@"
}

status=0
run() {
    local name=$1
    shift
    echo "-- $name"
    local rc=0
    "$@" || rc=$?
    if ((rc == 0)); then
        echo "-- PASS $name"
    else
        echo "-- FAIL $name (exit $rc)"
        status=1
    fi
}
veth_bytes() { # bytes sent + received on host A's end of the veth pair
    ip netns exec "$ns_a" sh -c "echo \$((\$(cat /sys/class/net/$if_a/statistics/tx_bytes) + \$(cat /sys/class/net/$if_a/statistics/rx_bytes)))"
}
# Both ranks report their host, so the log shows that the job really spans the two.
# NETNS_ONLY_CHECK=1 runs the check matrix only.
[[ -n ${NETNS_ONLY_CHECK:-} ]] || {
run "hostnames" on_a "${launch[@]}" hostname
run "multi-rank cases at 2 ranks on 2 hosts" on_a "${launch[@]}" "$mpi" --suite mpi_cases
run "checked protocol at 2 ranks on 2 hosts" on_a "${launch[@]}" "$mpi" --suite checked
}
# Over the veth pair Open MPI needs 4 to 20 ms per check case, depending on what else the
# machine runs (latency-bound: the ranks mostly wait), so by default the matrix runs every
# operation × dtype × layout at lengths 0 and 7 only, the plans left out (they run on one
# host in the matrix's other stages) (about 20 s on a quiet machine, 100 s on a busy one;
# MPICH: seconds); NETNS_CHECK_ARGS=all runs all lengths (minutes; raise
# NETNS_TIMEOUT), other values are passed on to `dlpack-mpi check`.
check_args_text=${NETNS_CHECK_ARGS:---len 0,7 -e plan-}
[[ $check_args_text == all ]] && check_args_text=""
read -r -a check_args <<<"$check_args_text"
run "dlpack-mpi check ${check_args[*]} at 2 ranks on 2 hosts" on_a "${launch[@]}" "$cli" check -q "${check_args[@]}"
# The job's traffic went over the veth pair (the multi-rank cases alone move over 300 kB).
bytes=$(veth_bytes)
echo "netns-test: $bytes bytes crossed the veth pair"
if ((bytes < 100000)); then
    echo "netns-test: FAIL: under 100 kB crossed the veth pair; the ranks did not talk over TCP between the hosts"
    status=1
fi
exit $status
