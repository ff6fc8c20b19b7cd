"""Small Python DLPack producers for tests/python_cases.rs, and the value formula the
multi-rank cases (and the mpi4py peer) share.

Every producer wraps a NumPy array, so the capsules and deleters are NumPy's own; only the
protocol around them (device query, keywords, capsule reuse) is what the test controls.
"""

import numpy as np

# Every dtype NumPy exports through DLPack.
DTYPES = [
    "bool",
    "int8", "int16", "int32", "int64",
    "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64",
    "complex64", "complex128",
]


def make(dtype, shape, rank, order="C"):
    """Values that depend on the rank, exact in every dtype, and small enough that a sum over
    four ranks fits int8 (avoids Open MPI's saturating op/avx path too)."""
    n = int(np.prod(shape, dtype=np.int64))
    base = (np.arange(n, dtype=np.int64) * 3 + rank * 5) % 29
    if dtype == "bool":
        values = ((base + rank) % 2).astype(bool)
    elif dtype.startswith("complex"):
        values = base.astype(dtype) + 1j * (base + 1).astype(dtype)
        values = values.astype(dtype)
    else:
        values = base.astype(dtype)
    return np.array(values.reshape(shape), order=order)


def expected_sum(dtype, shape, nranks):
    total = make(dtype, shape, 0)
    for r in range(1, nranks):
        total = (total + make(dtype, shape, r)).astype(dtype)
    return total


class Recorder:
    """Records the keyword arguments of every `__dlpack__` call and reports `device`."""

    def __init__(self, array, device=(1, 0)):
        self.array = array
        self.device = device
        self.calls = []

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, **kwargs):
        self.calls.append(dict(kwargs))
        # NumPy only takes stream=None; the stream is what the test looks at.
        kwargs.pop("stream", None)
        return self.array.__dlpack__(**kwargs)


class NoDeviceQuery:
    """A producer without `__dlpack_device__`."""

    def __init__(self, array):
        self.array = array
        self.calls = []

    def __dlpack__(self, **kwargs):
        self.calls.append(dict(kwargs))
        kwargs.pop("stream", None)
        return self.array.__dlpack__(**kwargs)


class Legacy:
    """A producer written before DLPack 1.0: `__dlpack__` knows only `stream`, so the
    interpreter rejects `max_version` with a TypeError before the body runs."""

    def __init__(self, array):
        self.array = array
        self.calls = 0

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, stream=None):
        self.calls += 1
        return self.array.__dlpack__()


class RaisesTypeError:
    """A TypeError that has nothing to do with the keywords: not retried."""

    def __init__(self):
        self.calls = 0

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, **kwargs):
        self.calls += 1
        raise TypeError("cannot export this dtype")


class SameCapsule:
    """Hands out the same capsule on every call (a buggy producer)."""

    def __init__(self, array):
        self.capsule = array.__dlpack__(max_version=(1, 0))

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, **kwargs):
        return self.capsule


class BadDevice:
    """`__dlpack_device__` returns whatever the test puts in `value`."""

    def __init__(self, array, value):
        self.array = array
        self.value = value
        self.calls = 0

    def __dlpack_device__(self):
        return self.value

    def __dlpack__(self, **kwargs):
        self.calls += 1
        return self.array.__dlpack__(**kwargs)


class NotACapsule:
    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, **kwargs):
        return 42
