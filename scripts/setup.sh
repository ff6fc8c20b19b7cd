#!/usr/bin/env bash
# Installs what dlpack-mpi needs on a fresh Debian machine, and nothing that is already there:
# an MPI library with its compiler wrapper (Open MPI by default; MPICH with
# DLPACK_MPI_IMPL=mpich), libclang (rsmpi's bindgen), pkg-config, python3 and iproute2 (`ip`,
# for the two-host network-namespace test). Rust itself must already be installed (cargo on
# PATH).
#
# Installing a second MPI library does not change which one the scripts use: they name the
# launcher and compiler wrapper explicitly (scripts/mpi-env.sh), whatever Debian's `mpi` and
# `mpirun` alternatives point to.
#
# Usage: scripts/setup.sh            (run by run.sh and test.sh; safe to run again)
set -euo pipefail

missing=()
case "${DLPACK_MPI_IMPL:-openmpi}" in
    openmpi)
        if ! command -v mpirun.openmpi >/dev/null 2>&1 &&
            ! mpirun --version 2>/dev/null | grep -q "Open MPI"; then
            missing+=(openmpi-bin)
        fi
        if ! command -v mpicc.openmpi >/dev/null 2>&1 &&
            ! { mpicc -showme:version 2>/dev/null | grep -q "Open MPI"; }; then
            missing+=(libopenmpi-dev)
        fi
        ;;
    mpich)
        command -v mpiexec.mpich >/dev/null 2>&1 || missing+=(mpich)
        command -v mpicc.mpich >/dev/null 2>&1 || missing+=(libmpich-dev)
        ;;
    *)
        echo "setup: unknown DLPACK_MPI_IMPL '${DLPACK_MPI_IMPL}' (openmpi or mpich)" >&2
        exit 2
        ;;
esac
if ! compgen -G "/usr/lib/llvm-*/lib/libclang*.so*" >/dev/null && ! compgen -G "/usr/lib/x86_64-linux-gnu/libclang*.so*" >/dev/null; then
    missing+=(libclang-dev)
fi
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)

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
