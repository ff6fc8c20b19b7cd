# Sourced by the scripts (after setup.sh): points pyo3 at the interpreter on PATH, the one
# setup.sh installed NumPy and mpi4py into, and checks that it is usable for embedding.
# pyo3 links libpython by name; build.rs records this interpreter's LIBDIR as the run path
# of the test and example binaries, so they load its libpython (not the system's copy).
PYO3_PYTHON=$(python3 -c 'import sys; print(sys.executable)')
export PYO3_PYTHON
if [[ $("$PYO3_PYTHON" -c 'import sysconfig; print(sysconfig.get_config_var("Py_ENABLE_SHARED") or 0)') != 1 ]]; then
    echo "python-env: $PYO3_PYTHON is not a shared-library build (Py_ENABLE_SHARED=0); pyo3 cannot embed it" >&2
    return 1 2>/dev/null || exit 1
fi
