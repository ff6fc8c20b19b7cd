#!/usr/bin/env bash
# Installs what dlpack-mpi needs on a fresh Debian machine, and nothing that is already there:
# an MPI library with its compiler wrapper (Open MPI by default) and libclang (rsmpi's
# bindgen). Rust itself must already be installed (cargo on PATH).
#
# Usage: scripts/setup.sh            (sourced by run.sh and test.sh; safe to run again)
set -euo pipefail

missing=()
command -v mpirun >/dev/null 2>&1 || missing+=(openmpi-bin)
command -v mpicc >/dev/null 2>&1 || missing+=(libopenmpi-dev)
if ! compgen -G "/usr/lib/llvm-*/lib/libclang*.so*" >/dev/null && ! compgen -G "/usr/lib/x86_64-linux-gnu/libclang*.so*" >/dev/null; then
    missing+=(libclang-dev)
fi
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
command -v python3 >/dev/null 2>&1 || missing+=(python3)

if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    sudo=()
    if [[ $(id -u) -ne 0 ]]; then
        sudo=(sudo)
    fi
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: cargo is not on PATH; install Rust (rustup) first" >&2
    exit 1
fi
