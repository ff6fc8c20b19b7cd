#!/usr/bin/env bash
# The main job: installs what is missing, builds in release with Python support, and checks
# at 4 ranks that this machine's MPI moves every dtype × operation × layout × length of DLPack
# tensors correctly. Each dtype's tensors come from the first installed producer that makes
# it (NumPy, JAX, Paddle, through `__dlpack__`) and Rust-made tensors for the rest
# (`--producer auto`); `scripts/run.sh --producer rust` uses Rust-made tensors throughout.
# The check prints failures as they happen, then a line per operation, the operation × dtype
# matrix and the closing counts (`-v`: every case); run.sh then ends with one sentence saying
# what this run verified on this machine and what it did not.
#
# Usage: scripts/run.sh [extra `dlpack-mpi check` arguments]
# DLPACK_MPI_IMPL=mpich runs it with MPICH instead of Open MPI (scripts/mpi-env.sh);
# DLPACK_MPI_RANKS=N at N ranks instead of 4.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/setup.sh
# shellcheck source=scripts/mpi-env.sh
source scripts/mpi-env.sh
# shellcheck source=scripts/python-env.sh
source scripts/python-env.sh

cargo build --release --features cli,python --bin dlpack-mpi
ranks=${DLPACK_MPI_RANKS:-4}
[[ $ranks =~ ^[1-9][0-9]*$ ]] || {
    echo "run.sh: DLPACK_MPI_RANKS=$ranks is not a rank count (1, 2, ...)" >&2
    exit 2
}
info=$("$MPIRUN" "${MPIRUN_FLAGS[@]}" -n "$ranks" "$TARGET_DIR"/release/dlpack-mpi info)
printf '%s\n' "$info"

# The check's JSON report tells the closing sentence which devices and producers ran (unless
# the caller asked for a report of their own, or only for the list of cases).
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
report=()
case " $* " in
    *" --json"* | *" --list "*) ;;
    *) report=(--json "$scratch/check.json") ;;
esac
status=0
"$MPIRUN" "${MPIRUN_FLAGS[@]}" -n "$ranks" "$TARGET_DIR"/release/dlpack-mpi check "${report[@]}" "$@" ||
    status=$?

# One sentence: what this run verified here (MPI library, ranks, devices, producers) and what
# it did not (GPU memory, a CUDA-aware MPI, producers not installed, devices not asked for).
# shellcheck disable=SC2016 # Python source, not shell
INFO=$info REPORT=${report[1]:-} STATUS=$status "$PYO3_PYTHON" -c '
import importlib.util, json, os
info = dict(l.split(": ", 1) for l in os.environ["INFO"].splitlines() if ": " in l)
library = info.get("MPI library", "an unnamed MPI library").split(",")[0]
ranks = info.get("ranks", "? ").split(" ")[0]
memory = {"cpu": "host memory (cpu)", "cuda-host": "pinned host memory (cuda-host)",
          "cuda": "CUDA device memory (cuda)", "cuda-managed": "managed memory (cuda-managed)"}
done, missing, devices = [], [], None
path = os.environ["REPORT"]
if path and os.path.exists(path):
    with open(path) as f:
        r = json.load(f)
    devices = sorted({c["device"] for c in r["cases"]})
    made = []
    for c in r["cases"]:
        if c["producer"] not in made:
            made.append(c["producer"])
    counts = (r["passed"], r["failed"], r["skipped"], r["known_bugs"])
    done.append("%d cases passed, %d failed, %d skipped, %d known MPI-library bugs" % counts)
    done.append(", ".join(memory.get(d, d) for d in devices))
    done.append("tensors made by " + ", ".join(made))
    if "cuda-host" not in devices:
        missing.append("pinned host memory (cuda-host: run with --device all)")
else:
    done.append("the cases printed above")
gpu = info.get("GPU runtime", "none")
if gpu.startswith("none"):
    missing.append("GPU memory (GPU runtime: " + gpu + ")")
elif devices is not None and "cuda" not in devices:
    missing.append("GPU memory (not asked for: --device cuda or all)")
aware = info.get("CUDA-aware MPI", "no")
if aware.startswith("no"):
    missing.append("GPU memory passed directly to MPI (CUDA-aware MPI: " + aware + ")")
absent = [m for m in ("numpy", "jax", "paddle") if importlib.util.find_spec(m) is None]
if absent:
    missing.append("tensors from " + ", ".join(absent) + " (not installed)")
verb = "verified" if os.environ["STATUS"] == "0" else "checked, with the failures above,"
print("run.sh: this run %s %s at %s ranks (%s); it did not verify %s." % (
    verb, library, ranks, "; ".join(done), "; ".join(missing) or "anything else it knows of"))
' || true
exit "$status"
