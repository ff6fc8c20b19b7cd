"""Small Python DLPack producers for tests/mpi/python_cases.rs, and the value formula the
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
    """A TypeError that has nothing to do with the keywords: retried once (legacy form),
    which raises it again."""

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


# ---------------------------------------------------------------------------------------
# Hostile producers: capsules whose DLManagedTensor(Versioned) is built field by field with
# ctypes, so the test controls every field (and counts the deleter's calls).
# ---------------------------------------------------------------------------------------

import ctypes


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", DELETER),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [
        ("dl_tensor", DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", DELETER),
    ]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
# Capsule names must outlive the capsules: module-level bytes.
NAMES = {n: n.encode() for n in [
    "dltensor_versioned", "dltensor", "used_dltensor", "used_dltensor_versioned", "foo"]}


class Crafted:
    """`__dlpack__` returns a capsule (named `name`, or with a NULL name for None) over a
    ctypes-built managed tensor: `fields` set on its DLTensor (`shape`/`strides` as lists or
    None for NULL, `data` "buffer" for an int32 buffer of 8 values, None for NULL, or an int),
    `version` (major, minor) for the versioned struct. `deletes` counts the deleter's
    calls; `device` is what `__dlpack_device__` answers."""

    def __init__(self, name="dltensor_versioned", version=(1, 0), device=(1, 0), **fields):
        self.deletes = 0
        self.calls = 0
        self.device = device
        self.buffer = (ctypes.c_int32 * 8)(*range(8))
        self.keep = []
        legacy = name in ("dltensor", "used_dltensor")

        def deleter(_ptr):
            self.deletes += 1

        self.deleter = DELETER(deleter)
        m = DLManagedTensor() if legacy else DLManagedTensorVersioned()
        if not legacy:
            m.version = DLPackVersion(*version)
        m.deleter = self.deleter
        t = m.dl_tensor
        t.data = ctypes.addressof(self.buffer)
        t.device = DLDevice(1, 0)
        t.ndim = 1
        t.dtype = DLDataType(0, 32, 1)
        shape = [8]
        strides = None
        for k, v in fields.items():
            if k == "shape":
                shape = v
            elif k == "strides":
                strides = v
            elif k == "device_struct":
                t.device = DLDevice(*v)
            elif k == "dtype":
                t.dtype = DLDataType(*v)
            elif k == "data":
                t.data = None if v is None else v
            else:
                setattr(t, k, v)
        for k, arr in (("shape", shape), ("strides", strides)):
            if arr is None:
                setattr(t, k, None)
            else:
                a = (ctypes.c_int64 * max(len(arr), 1))(*arr)
                self.keep.append(a)
                setattr(t, k, ctypes.addressof(a))
        self.managed = m
        self.capsule = _capsule_new(
            ctypes.addressof(m), None if name is None else NAMES[name], None)

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, **kwargs):
        self.calls += 1
        return self.capsule


class Raises:
    """`__dlpack__` raises `exc` (an exception instance or class)."""

    def __init__(self, exc):
        self.exc = exc
        self.calls = 0

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, **kwargs):
        self.calls += 1
        raise self.exc


class CapsuleThenJunk:
    """Rejects the 1.x keywords, and the legacy retry returns a non-capsule."""

    def __init__(self):
        self.calls = 0

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, stream=None):
        self.calls += 1
        return "not a capsule"


class PropertyProducer:
    """`__dlpack__` and `__dlpack_device__` are properties, not methods."""

    def __init__(self, array):
        self.array = array

    @property
    def __dlpack_device__(self):
        return (1, 0)

    @property
    def __dlpack__(self):
        return self.array.__dlpack__()


class VanishingDevice:
    """`__dlpack_device__` is a property raising AttributeError (reads as absent)."""

    def __init__(self, array):
        self.array = array

    @property
    def __dlpack_device__(self):
        raise AttributeError("gone")

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)


class SelfDeleting:
    """Drops the last references to itself (in `holder`) during `__dlpack__`."""

    def __init__(self, array, holder):
        self.array = array
        self.holder = holder

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, **kwargs):
        self.holder.clear()
        return self.array.__dlpack__(**kwargs)


class PredatesDLPack1:
    """A pre-1.0 producer that rejects `max_version` in its own words (no keyword named):
    retried once in the legacy form."""

    def __init__(self, array):
        self.array = array
        self.calls = []

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, **kwargs):
        self.calls.append(dict(kwargs))
        if kwargs:
            raise TypeError("this producer predates DLPack 1.0")
        return self.array.__dlpack__()


# ------------------------------------------------------------------ JAX and PaddlePaddle
# Imported lazily: a missing package makes its cases SKIP (naming it), never fail.

import importlib


def missing(package):
    """The name of `package` if it does not import, else None."""
    try:
        importlib.import_module(package)
        return None
    except Exception:
        return package


def jax_module():
    import jax

    jax.config.update("jax_enable_x64", True)
    return jax


# Every dtype JAX exports through DLPack (int4/uint4 have no DLPack equivalent).
JAX_DTYPES = DTYPES + [
    "bfloat16",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
    "float8_e4m3b11fnuz", "float8_e8m0fnu", "float8_e3m4", "float8_e4m3",
]

# Every dtype Paddle exports (Paddle's "uint16" is its bfloat16; it has no uint16/32/64).
PADDLE_DTYPES = [
    "bool", "int8", "int16", "int32", "int64", "uint8",
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
    "float8_e4m3fn", "float8_e5m2",
]


def ml_make(dtype, shape, rank):
    """`make` for any dtype: the ML dtypes through ml_dtypes (values from float32)."""
    if dtype in DTYPES:
        return make(dtype, shape, rank)
    import ml_dtypes

    return make("float32", shape, rank).astype(getattr(ml_dtypes, dtype))


def jax_make(dtype, shape, rank):
    jax_module()
    import jax.numpy as jnp

    return jnp.asarray(ml_make(dtype, shape, rank))


def paddle_make(dtype, shape, rank):
    import paddle

    values = make("float32" if dtype not in DTYPES else dtype, shape, rank)
    if dtype in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        return paddle.to_tensor(values).astype(dtype)
    return paddle.to_tensor(values)


def paddle_zeros(dtype, shape):
    import paddle

    return paddle.zeros(list(shape), dtype=dtype)


def logical_bytes(x):
    """The elements of a NumPy, JAX or Paddle array in logical row-major order, as bytes."""
    if hasattr(x, "place"):  # Paddle: .numpy() gives bf16/float8 as their bits
        return np.ascontiguousarray(x.numpy()).tobytes()
    return np.ascontiguousarray(np.asarray(x)).tobytes()


def view(x, layout):
    """A view of 2-d `x` ([4, 6]) in `layout`: contiguous, sliced (rows 1:3), transposed
    (non-contiguous), or x itself."""
    if layout == "sliced":
        return x[1:3]
    if layout == "transposed":
        return x.T
    return x
