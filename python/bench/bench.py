"""dlpack_mpi (``import dlpack_mpi``) beside mpi4py, on the same NumPy buffers, in one run.

Run with exactly two ranks::

    mpirun --allow-run-as-root -n 2 python3 python/bench/bench.py [--json out.json] [--quick]

Cases (issue 33, item 5):

a) 8-byte ping-pong (one float64) between ranks 0 and 1, µs per message (half a round trip,
   timed on rank 0): ``dlpack_mpi.Comm.send/recv`` of the NumPy arrays; mpi4py's buffer
   path (``MPI.COMM_WORLD.Send/Recv`` of the same arrays, PEP 3118); mpi4py's DLPack path
   (``Send/Recv`` of wrappers that expose only ``__dlpack__``/``__dlpack_device__``: mpi4py
   4.1's ``PyMPI_GetBuffer`` tries the buffer protocol first, and on its failure imports the
   object through DLPack); and, as a diagnostic, mpi4py's buffer path received the way
   dlpack_mpi receives (``Mprobe`` then ``Message.Recv``: ``MPI_Mprobe`` + ``MPI_Mrecv``).
   The per-message overhead of each path is its median minus mpi4py's buffer path's (the
   cheapest way from Python to ``MPI_Send``/``MPI_Recv``: the C-level cost reference).
b) 8-byte all-reduce (sum, one float64, in place), the slowest rank's time per call:
   ``dlpack_mpi`` ``allreduce(x)`` with the default agreement (a vote before every
   collective) and with ``configure(agreement="local")``; mpi4py ``Allreduce(MPI.IN_PLACE,
   x)`` and the same through its DLPack path.
c) a transposed 4096 x 4096 float32 view (``a.T`` of a C-contiguous array, 64 MiB) sent from
   rank 0 to rank 1 and received into a C-contiguous (4096, 4096) array, one-way with a
   1-byte ack (mpi4py's buffer path for every path), timed on rank 0 from the start of the
   send to the ack: ``dlpack_mpi`` ``send(a.T)`` / ``recv(r)`` (one message, the library
   packs or uses a derived datatype) against mpi4py ``Send(np.ascontiguousarray(a.T))`` /
   ``Recv(r)``; for reference, mpi4py with a copy into a buffer allocated once
   (``np.copyto(tmp, a.T)``), and ``Send(a)`` of the contiguous array (the lower bound).
   Every path's received values are checked once, before the timing.
d) the ResNet-50 gradient list (benches/data/gradients-resnet50.txt: 161 float32 arrays,
   25 557 032 elements), all-reduced (sum) in place, the slowest rank's time per call:
   ``dlpack_mpi`` ``allreduce(list)`` (fused in buckets) against mpi4py's two ways, the same
   as ``dlpack-mpi bench --op fused`` (src/bin/dlpack-mpi/bench/fused_mpi4py.rs): a Python
   loop of ``Allreduce(MPI.IN_PLACE, g)``, and ``np.concatenate`` -> one ``Allreduce`` ->
   ``np.copyto`` back into every array. Every path's result is checked once (rank r holds
   ``k % 4096 + 4096 r`` at element k of the list), then the arrays are zeroed for the timing.

Method (the same as the Rust bench's ``sampled.rs``): a warm-up of every path, then rounds in
which every path runs once, in an order rotated from round to round, after a barrier; within
a round a path runs a few batches of iterations, each batch timed with
``time.perf_counter()``; a sample is the mean of one batch (8-byte cases: 2000 iterations;
64 MiB cases: one message). Reported: the median, p10 and p90 of the samples. For the
collectives every rank times, and a sample is the slowest rank's. Also measured, on rank 0
alone while rank 1 sleeps (no polling peer): the pieces of a call from Python
(``__dlpack__``, ``__dlpack_device__``, mpi4py's imports, a method call into each
extension) and whole calls whose MPI work is the same on every path (an 8-byte message to
oneself and a one-rank all-reduce, on ``MPI.COMM_SELF``): ns per call, the best of 9 loops
interleaved with each other.

``OPENBLAS_NUM_THREADS`` defaults to 1 and ``NUMPY_MADVISE_HUGEPAGE`` to 0, as in the Rust
bench (the latter keeps NumPy's arrays of 4 MiB and more on 4 KiB pages like the library's
own buffers; ``--hugepages`` leaves NumPy's default). ``--quick``: a smoke test (a few
seconds). ``--only abcd``: a subset of the cases.
"""

import argparse
import json
import os
import platform
import sys
import time

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--json", metavar="PATH", help="also write the results as JSON (rank 0)")
parser.add_argument("--quick", action="store_true", help="few iterations: a smoke test")
parser.add_argument("--rounds", type=int, help="rounds (default 11, --quick 2)")
parser.add_argument("--only", default="abcd", help="the cases to run (letters a-d)")
parser.add_argument("--hugepages", action="store_true",
                    help="leave NumPy's transparent huge pages on (its default)")
args = parser.parse_args()

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
if not args.hugepages:
    os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402
import mpi4py  # noqa: E402
import dlpack_mpi  # noqa: E402

if not args.hugepages and os.environ.get("NUMPY_MADVISE_HUGEPAGE") == "0":
    try:  # in case NumPy read the variable before (it is read at import)
        np._core.multiarray._set_madvise_hugepage(False)
    except Exception:
        pass

perf_counter = time.perf_counter
MPI_LIBRARY = MPI.Get_library_version().replace("\0", "").splitlines()[0].strip()
world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
if size != 2:
    if rank == 0:
        print(f"bench.py needs exactly 2 ranks, not {size}", file=sys.stderr)
    sys.exit(2)
comm = dlpack_mpi.Comm()          # MPI.COMM_WORLD itself (dup=False)
peer = 1 - rank
loadavg_start = os.getloadavg()

QUICK = args.quick
ROUNDS = args.rounds or (2 if QUICK else 11)
SMALL_BATCH = 200 if QUICK else 2000        # 8-byte iterations per sample
SMALL_BATCHES = 2 if QUICK else 5           # samples per path per round
BIG_BATCHES = 1 if QUICK else 3             # 64 MiB / ResNet-50 messages per path per round
BIG_ROUNDS = min(ROUNDS, 2 if QUICK else 7)


def say(*a):
    if rank == 0:
        print(*a, flush=True)


class DLPackOnly:
    """No buffer protocol: mpi4py takes its DLPack path. The array's own bound methods are
    the attributes (mpi4py reads ``obj.__dlpack__``), so the wrapper adds no Python frame:
    what is measured is mpi4py's import, not the wrapper's."""

    def __init__(self, array):
        self.__dlpack__ = array.__dlpack__
        self.__dlpack_device__ = array.__dlpack_device__


# --------------------------------------------------------------------------------------
# Measurement
# --------------------------------------------------------------------------------------

def stats(samples):
    s = np.asarray(samples, dtype=np.float64) * 1e6
    return {
        "median_us": float(np.median(s)),
        "p10_us": float(np.percentile(s, 10)),
        "p90_us": float(np.percentile(s, 90)),
        "mean_us": float(s.mean()),
        "min_us": float(s.min()),
        "samples": int(s.size),
    }


def measure(paths, rounds, batches, batch, scale=1.0, slowest=False, warm=None):
    """paths: [(name, run(n), enter, leave)]: ``run(n)`` does n iterations of this rank's
    side; ``enter``/``leave`` (or None) run untimed around each path's turn. Returns
    {name: stats} on rank 0 (seconds per iteration × ``scale``), the slowest rank's sample
    when ``slowest``, else rank 0's."""
    warm = batch if warm is None else warm
    for name, run, enter, leave in paths:
        if enter:
            enter()
        world.Barrier()
        run(warm)
        if leave:
            leave()
    samples = {name: [] for name, *_ in paths}
    for r in range(rounds):
        k = r % len(paths)
        for name, run, enter, leave in paths[k:] + paths[:k]:
            if enter:
                enter()
            out = samples[name]
            world.Barrier()
            for _ in range(batches):
                t = perf_counter()
                run(batch)
                out.append((perf_counter() - t) / batch * scale)
            if leave:
                leave()
    if slowest:
        everyone = world.gather(samples, root=0)
        if rank == 0:
            samples = {n: np.max([e[n] for e in everyone], axis=0) for n in samples}
    return {n: stats(s) for n, s in samples.items()} if rank == 0 else None


def all_ok(ok, what):
    """Every rank's verdict; rank 0 prints it. Returns the combined verdict."""
    oks = world.allgather((bool(ok), what if not ok else ""))
    good = all(o for o, _ in oks)
    if not good:
        say("  CHECK FAILED: " + "; ".join(f"rank {r}: {w}" for r, (o, w) in enumerate(oks) if not o))
    return good


results = {}
checks = {}

# --------------------------------------------------------------------------------------
# Pieces: rank 0 alone (rank 1 sleeps), no peer
# --------------------------------------------------------------------------------------

def pieces():
    """ns per call of each piece on rank 0 alone (rank 1 sleeps): rounds in which every piece runs one
    loop, the best loop of each kept (includes the loop's and the call's own cost)."""
    a = np.zeros(1)
    b = np.zeros(1)
    wa, wb = DLPackOnly(a), DLPackOnly(b)
    buffer = MPI.buffer
    dl = a.__dlpack__
    dev = a.__dlpack_device__
    v = (1, 3)
    n = 10000 if QUICK else 100000     # iterations of a piece's loop
    m = n * 3 // 10                    # of a whole call's

    def empty():
        pass

    # Whole calls on MPI.COMM_SELF: a message to oneself (8 B, eager: the send completes at
    # once, the receive finds it waiting) and a one-rank all-reduce. The MPI work is the
    # same on every path and no peer polls meanwhile: the differences are software costs.
    me = MPI.COMM_SELF
    own = dlpack_mpi.Comm(me)
    S, R, Mp, A, IP = me.Send, me.Recv, me.Mprobe, me.Allreduce, MPI.IN_PLACE
    s, r, ar = own.send, own.recv, own.allreduce
    todo = [
        ("empty Python call f() (included in every row)", empty, n),
        ("a.__dlpack_device__()", dev, n),
        ("a.__dlpack__() + capsule freed", dl, n),
        ("a.__dlpack__(max_version=(1,3), copy=False) + freed (dlpack_mpi's call)",
         lambda: dl(max_version=v, copy=False), n),
        ("mpi4py MPI.buffer(ndarray) (buffer protocol)", lambda: buffer(a), n),
        ("mpi4py MPI.buffer(__dlpack__-only wrapper) (its DLPack path)", lambda: buffer(wa), n),
        ("dlpack_mpi Comm.rank (a call into the extension)", lambda: comm.rank, n),
        ("mpi4py Comm.Get_rank()", world.Get_rank, n),
        ("self send+recv pair: dlpack_mpi send/recv", lambda: (s(a, 0), r(b, 0)), m),
        ("self send+recv pair: mpi4py Send/Recv (buffer protocol)", lambda: (S(a, 0), R(b, 0)), m),
        ("self send+recv pair: mpi4py Send/Recv (DLPack path)", lambda: (S(wa, 0), R(wb, 0)), m),
        ("self send+recv pair: mpi4py Send/Mprobe+Recv (buffer protocol)",
         lambda: (S(a, 0), Mp(0).Recv(b)), m),
        ("one-rank all-reduce: dlpack_mpi allreduce(x)", lambda: ar(a), m),
        ("one-rank all-reduce: mpi4py Allreduce(IN_PLACE, x) (buffer protocol)", lambda: A(IP, a), m),
        ("one-rank all-reduce: mpi4py Allreduce(IN_PLACE, x) (DLPack path)", lambda: A(IP, wa), m),
    ]
    out = {}
    for _ in range(3 if QUICK else 9):
        for name, f, k in todo:
            t = perf_counter()
            for _ in range(k):
                f()
            dt = (perf_counter() - t) / k * 1e9
            out[name] = min(out.get(name, dt), dt)
    return out


# --------------------------------------------------------------------------------------
# a) 8-byte ping-pong
# --------------------------------------------------------------------------------------

def case_a():
    a = np.array([rank + 1.0])
    b = np.zeros(1)
    wa, wb = DLPackOnly(a), DLPackOnly(b)
    Send, Recv, Mprobe = world.Send, world.Recv, world.Mprobe
    send, recv = comm.send, comm.recv

    # check once: rank 0's value makes the round trip on every path
    ok = True
    for s, r in ((lambda x: send(x, peer), lambda x: recv(x, peer)),
                 (lambda x: Send(x, peer), lambda x: Recv(x, peer)),
                 (lambda x: Send(DLPackOnly(x), peer), lambda x: Recv(DLPackOnly(x), peer))):
        b[0] = -1.0
        if rank == 0:
            s(a)
            r(b)
            ok &= b[0] == 1.0
        else:
            r(b)
            s(b)
    ok = all_ok(ok, "8-byte ping-pong returned a wrong value")

    if rank == 0:
        def ours(n):
            for _ in range(n):
                send(a, 1)
                recv(b, 1)

        def buf(n):
            for _ in range(n):
                Send(a, 1)
                Recv(b, 1)

        def dlp(n):
            for _ in range(n):
                Send(wa, 1)
                Recv(wb, 1)

        def mprobe(n):
            for _ in range(n):
                Send(a, 1)
                Mprobe(1).Recv(b)
    else:
        def ours(n):
            for _ in range(n):
                recv(b, 0)
                send(b, 0)

        def buf(n):
            for _ in range(n):
                Recv(b, 0)
                Send(b, 0)

        def dlp(n):
            for _ in range(n):
                Recv(wb, 0)
                Send(wb, 0)

        def mprobe(n):
            for _ in range(n):
                Mprobe(0).Recv(b)
                Send(b, 0)

    paths = [
        ("a: dlpack_mpi send/recv", ours, None, None),
        ("a: mpi4py Send/Recv (buffer protocol)", buf, None, None),
        ("a: mpi4py Send/Recv (DLPack path)", dlp, None, None),
        ("a: mpi4py Send/Mprobe+Recv (buffer protocol)", mprobe, None, None),
    ]
    # half a round trip: seconds per round trip / 2
    return measure(paths, ROUNDS, SMALL_BATCHES, SMALL_BATCH, scale=0.5), ok


# --------------------------------------------------------------------------------------
# b) 8-byte all-reduce
# --------------------------------------------------------------------------------------

def case_b():
    x = np.array([rank + 1.0])
    wx = DLPackOnly(x)
    Allreduce, IN_PLACE = world.Allreduce, MPI.IN_PLACE
    allreduce = comm.allreduce

    ok = True
    for f in (lambda: allreduce(x), lambda: Allreduce(IN_PLACE, x), lambda: Allreduce(IN_PLACE, wx)):
        x[0] = rank + 1.0
        f()
        ok &= x[0] == 3.0
    ok = all_ok(ok, "8-byte all-reduce gave a wrong sum")
    x[0] = 0.0

    def ours(n):
        for _ in range(n):
            allreduce(x)

    def buf(n):
        for _ in range(n):
            Allreduce(IN_PLACE, x)

    def dlp(n):
        for _ in range(n):
            Allreduce(IN_PLACE, wx)

    def local():
        dlpack_mpi.configure(agreement="local")

    def collective():
        dlpack_mpi.configure(agreement="collective")

    paths = [
        ("b: dlpack_mpi allreduce(x) (agreement collective)", ours, None, None),
        ("b: dlpack_mpi allreduce(x) (agreement local)", ours, local, collective),
        ("b: mpi4py Allreduce(IN_PLACE, x) (buffer protocol)", buf, None, None),
        ("b: mpi4py Allreduce(IN_PLACE, x) (DLPack path)", dlp, None, None),
    ]
    return measure(paths, ROUNDS, SMALL_BATCHES, SMALL_BATCH, slowest=True), ok


# --------------------------------------------------------------------------------------
# c) transposed 4096² float32 view, rank 0 -> rank 1
# --------------------------------------------------------------------------------------

def case_c():
    n = 4096
    ack = np.zeros(1, np.uint8)
    Send, Recv = world.Send, world.Recv
    send, recv = comm.send, comm.recv
    if rank == 0:
        src = np.arange(n * n, dtype=np.float32).reshape(n, n)   # exact: n² = 2^24
        view = src.T
        tmp = np.empty((n, n), np.float32)
        tmp.fill(0)  # touched: no page faults in the timing
        r = None
    else:
        r = np.empty((n, n), np.float32)
        r.fill(0)

    if rank == 0:
        def ours(k):
            for _ in range(k):
                send(view, 1)
                Recv(ack, 1)

        def contig_copy(k):
            for _ in range(k):
                Send(np.ascontiguousarray(view), 1)
                Recv(ack, 1)

        def prealloc(k):
            for _ in range(k):
                np.copyto(tmp, view)
                Send(tmp, 1)
                Recv(ack, 1)

        def contig(k):
            for _ in range(k):
                Send(src, 1)
                Recv(ack, 1)
    else:
        def ours(k):
            for _ in range(k):
                recv(r, 0)
                Send(ack, 0)

        def contig_copy(k):
            for _ in range(k):
                Recv(r, 0)
                Send(ack, 0)
        prealloc = contig = contig_copy

    # check once: every path, rank 1's receive array filled with -1 first
    ok, what = True, ""
    if rank == 1:
        want_t = np.arange(n * n, dtype=np.float32).reshape(n, n).T
    for name, f, transposed in (("dlpack_mpi send(a.T)", ours, True),
                                ("mpi4py ascontiguousarray", contig_copy, True),
                                ("mpi4py copyto", prealloc, True),
                                ("mpi4py contiguous", contig, False)):
        if rank == 1:
            r.fill(-1)
        world.Barrier()
        f(1)
        if rank == 1:
            good = np.array_equal(r, want_t) if transposed else np.array_equal(r.reshape(-1), want_t.T.reshape(-1))
            if not good:
                bad = np.argwhere(r != (want_t if transposed else want_t.T))[0]
                ok, what = False, f"{name}: first wrong element {tuple(bad)} = {r[tuple(bad)]}"
    if rank == 1:
        del want_t
    ok = all_ok(ok, what)

    paths = [
        ("c: dlpack_mpi send(a.T)", ours, None, None),
        ("c: mpi4py Send(np.ascontiguousarray(a.T))", contig_copy, None, None),
        ("c: mpi4py copyto(preallocated, a.T) + Send", prealloc, None, None),
        ("c: mpi4py Send(a) contiguous (lower bound)", contig, None, None),
    ]
    return measure(paths, BIG_ROUNDS, BIG_BATCHES, 1, warm=1), ok


# --------------------------------------------------------------------------------------
# d) ResNet-50 gradients, fused all-reduce
# --------------------------------------------------------------------------------------

PERIOD = 4096


def resnet_shapes():
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "..", "benches", "data", "gradients-resnet50.txt")
    shapes = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, *dims = line.split()
            shapes.append(tuple(int(d) for d in dims))
    return shapes


def fill(xs, r):
    base = 0
    for g in xs:
        k = g.size
        g.reshape(-1)[:] = np.arange(base, base + k) % PERIOD + PERIOD * r
        base += k


def check_sum(xs, ranks):
    base = 0
    for g in xs:
        k = g.size
        want = ranks * (np.arange(base, base + k) % PERIOD) + PERIOD * (ranks * (ranks - 1) // 2)
        got = g.reshape(-1)
        bad = np.flatnonzero(got != want)
        if bad.size:
            return f"element {base + int(bad[0])} of the list is {float(got[bad[0]])}"
        base += k
    return None


def case_d():
    shapes = resnet_shapes()
    grads = [np.zeros(s, np.float32) for s in shapes]
    nelem = sum(g.size for g in grads)
    Allreduce, IN_PLACE = world.Allreduce, MPI.IN_PLACE
    allreduce = comm.allreduce

    def ours(k):
        for _ in range(k):
            allreduce(grads)

    def loop(k):
        for _ in range(k):
            for g in grads:
                Allreduce(IN_PLACE, g)

    def concat(k):
        for _ in range(k):
            flat = np.concatenate([g.ravel() for g in grads])
            Allreduce(IN_PLACE, flat)
            off = 0
            for g in grads:
                np.copyto(g, flat[off:off + g.size].reshape(g.shape))
                off += g.size

    ok, what = True, ""
    for name, f in (("dlpack_mpi", ours), ("mpi4py loop", loop), ("mpi4py concat", concat)):
        fill(grads, rank)
        world.Barrier()
        f(1)
        bad = check_sum(grads, size)
        if bad:
            ok, what = False, f"{name}: {bad}"
    ok = all_ok(ok, what)
    for g in grads:
        g.fill(0)   # the timing reduces zeros (no growth to inf, no subnormals)

    paths = [
        ("d: dlpack_mpi allreduce(list)", ours, None, None),
        ("d: mpi4py loop of Allreduce(IN_PLACE, g)", loop, None, None),
        ("d: mpi4py concatenate + Allreduce + copy back", concat, None, None),
    ]
    return measure(paths, BIG_ROUNDS, BIG_BATCHES, 1, slowest=True, warm=1), ok, (len(shapes), nelem)


# --------------------------------------------------------------------------------------
# Run and report
# --------------------------------------------------------------------------------------

def sleeping_barrier():
    """A barrier whose waiting rank sleeps instead of polling (MPI's waits spin on a core)."""
    req = world.Ibarrier()
    while not req.Test():
        time.sleep(0.002)


t_start = perf_counter()
world.Barrier()
piece_res = pieces() if rank == 0 else None    # rank 1 sleeps meanwhile: rank 0 alone
sleeping_barrier()
meta_extra = {}
if "a" in args.only:
    res, checks["a"] = case_a()
    results.update(res or {})
if "b" in args.only:
    res, checks["b"] = case_b()
    results.update(res or {})
if "c" in args.only:
    res, checks["c"] = case_c()
    results.update(res or {})
if "d" in args.only:
    res, checks["d"], (ntensors, nelem) = case_d()
    results.update(res or {})
    meta_extra["resnet50"] = {"tensors": ntensors, "elements": nelem, "bytes": 4 * nelem}
elapsed = perf_counter() - t_start
loadavg_end = os.getloadavg()

if rank != 0:
    sys.exit(0)


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def module_build():
    """The extension's file: its modification time and the start of its SHA-256 (another
    build of the module may be installed between runs)."""
    import hashlib
    path = dlpack_mpi.dlpack_mpi.__file__
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:12]
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(os.path.getmtime(path)))
    return f"{os.path.basename(path)} built {stamp} UTC, sha256 {digest}"


def med(name):
    return results[name]["median_us"]


def fmt(name, digits):
    s = results[name]
    return f"{s['median_us']:.{digits}f} [{s['p10_us']:.{digits}f}, {s['p90_us']:.{digits}f}]"


# (case, ours, reference, digits)
rows = [
    ("8 B ping-pong, µs/message", "a: dlpack_mpi send/recv", "a: mpi4py Send/Recv (buffer protocol)", 3),
    ("8 B ping-pong, µs/message", "a: mpi4py Send/Recv (DLPack path)", "a: mpi4py Send/Recv (buffer protocol)", 3),
    ("8 B ping-pong, µs/message", "a: mpi4py Send/Mprobe+Recv (buffer protocol)", "a: mpi4py Send/Recv (buffer protocol)", 3),
    ("8 B ping-pong, µs/message", "a: dlpack_mpi send/recv", "a: mpi4py Send/Recv (DLPack path)", 3),
    ("8 B all-reduce, µs", "b: dlpack_mpi allreduce(x) (agreement collective)", "b: mpi4py Allreduce(IN_PLACE, x) (buffer protocol)", 3),
    ("8 B all-reduce, µs", "b: dlpack_mpi allreduce(x) (agreement local)", "b: mpi4py Allreduce(IN_PLACE, x) (buffer protocol)", 3),
    ("8 B all-reduce, µs", "b: mpi4py Allreduce(IN_PLACE, x) (DLPack path)", "b: mpi4py Allreduce(IN_PLACE, x) (buffer protocol)", 3),
    ("8 B all-reduce, µs", "b: dlpack_mpi allreduce(x) (agreement local)", "b: mpi4py Allreduce(IN_PLACE, x) (DLPack path)", 3),
    ("4096² f32 transposed, ms", "c: dlpack_mpi send(a.T)", "c: mpi4py Send(np.ascontiguousarray(a.T))", 2),
    ("4096² f32 transposed, ms", "c: mpi4py copyto(preallocated, a.T) + Send", "c: mpi4py Send(np.ascontiguousarray(a.T))", 2),
    ("4096² f32 transposed, ms", "c: dlpack_mpi send(a.T)", "c: mpi4py Send(a) contiguous (lower bound)", 2),
    ("ResNet-50 all-reduce, ms", "d: dlpack_mpi allreduce(list)", "d: mpi4py loop of Allreduce(IN_PLACE, g)", 2),
    ("ResNet-50 all-reduce, ms", "d: dlpack_mpi allreduce(list)", "d: mpi4py concatenate + Allreduce + copy back", 2),
]

ms_cases = ("c:", "d:")
if any(k.startswith(ms_cases) for k in results):
    for k in results:
        if k.startswith(ms_cases):
            results[k]["unit"] = "ms"
            for f in ("median_us", "p10_us", "p90_us", "mean_us", "min_us"):
                results[k][f.replace("_us", "_ms")] = results[k][f] / 1000.0


def fmtd(name, digits):
    s = results[name]
    d = 1000.0 if name.startswith(ms_cases) else 1.0
    return f"{s['median_us'] / d:.{digits}f} [{s['p10_us'] / d:.{digits}f}, {s['p90_us'] / d:.{digits}f}]"


say(f"\ndlpack_mpi {dlpack_mpi.__version__}, mpi4py {mpi4py.__version__}, NumPy {np.__version__}, "
    f"Python {platform.python_version()}; {MPI_LIBRARY}; "
    f"thread level {MPI.Query_thread()}; 2 ranks on {os.cpu_count()} CPUs ({cpu_model()}); settings {dlpack_mpi.settings()}")
say(f"module {module_build()}")
say(f"load average {loadavg_start[0]:.2f} at the start, {loadavg_end[0]:.2f} at the end; {elapsed:.1f} s; "
    f"rounds {ROUNDS} (8 B: {SMALL_BATCHES} samples of {SMALL_BATCH} per round), "
    f"{BIG_ROUNDS} (64 MiB / ResNet-50: {BIG_BATCHES} messages per round)"
    f"{'; --quick' if QUICK else ''}{'; NumPy huge pages on' if args.hugepages else ''}")
say("\nmedian [p10, p90]")
say(f"| case | ours | median [p10, p90] | reference | median [p10, p90] | ratio |")
say("|---|---|---:|---|---:|---:|")
table = []
for case, ours, ref, digits in rows:
    if ours in results and ref in results:
        ratio = med(ours) / med(ref)
        table.append({"case": case, "ours": ours, "reference": ref, "ratio": ratio})
        say(f"| {case} | {ours[3:]} | {fmtd(ours, digits)} | {ref[3:]} | {fmtd(ref, digits)} | {ratio:.2f} |")

say("\nchecks: " + ", ".join(f"{k} {'passed' if v else 'FAILED'}" for k, v in checks.items()))

targets = {}
A_OURS, A_BUF, A_DL = ("a: dlpack_mpi send/recv", "a: mpi4py Send/Recv (buffer protocol)",
                       "a: mpi4py Send/Recv (DLPack path)")
if A_OURS in results:
    o_ours = med(A_OURS) - med(A_BUF)
    o_dl = med(A_DL) - med(A_BUF)
    o_mp = med("a: mpi4py Send/Mprobe+Recv (buffer protocol)") - med(A_BUF)
    say(f"\n8 B ping-pong, per-message overhead over mpi4py's buffer path: dlpack_mpi {o_ours:+.3f} µs, "
        f"mpi4py DLPack path {o_dl:+.3f} µs (Mprobe+Mrecv instead of Recv alone: {o_mp:+.3f} µs)")
    targets["8 B overhead <= half of mpi4py DLPack path's"] = {
        "ours_us": o_ours, "mpi4py_dlpack_us": o_dl, "ratio": o_ours / o_dl if o_dl else None,
        "met": o_ours <= 0.5 * o_dl}
B_OURS, B_LOC, B_BUF, B_DL = ("b: dlpack_mpi allreduce(x) (agreement collective)",
                              "b: dlpack_mpi allreduce(x) (agreement local)",
                              "b: mpi4py Allreduce(IN_PLACE, x) (buffer protocol)",
                              "b: mpi4py Allreduce(IN_PLACE, x) (DLPack path)")
if B_OURS in results:
    say(f"8 B all-reduce, overhead over mpi4py's buffer path: dlpack_mpi collective "
        f"{med(B_OURS) - med(B_BUF):+.3f} µs, local {med(B_LOC) - med(B_BUF):+.3f} µs, "
        f"mpi4py DLPack path {med(B_DL) - med(B_BUF):+.3f} µs")
if "c: dlpack_mpi send(a.T)" in results:
    o, r = med("c: dlpack_mpi send(a.T)"), med("c: mpi4py Send(np.ascontiguousarray(a.T))")
    targets["transposed 4096² send <= mpi4py ascontiguousarray+Send"] = {
        "ours_ms": o / 1e3, "mpi4py_ms": r / 1e3, "ratio": o / r, "met": o <= r}
if "d: dlpack_mpi allreduce(list)" in results:
    o = med("d: dlpack_mpi allreduce(list)")
    ways = {k: med(k) for k in results if k.startswith("d: mpi4py")}
    best = min(ways, key=ways.get)
    targets["fused ResNet-50 <= mpi4py's faster way"] = {
        "ours_ms": o / 1e3, "mpi4py_ms": ways[best] / 1e3, "mpi4py_way": best[3:],
        "ratio": o / ways[best], "met": o <= ways[best]}
say("\ntargets:")
for k, v in targets.items():
    say(f"  {k}: {'MET' if v['met'] else 'MISSED'} (ratio {v['ratio']:.2f})")

say(f"\npieces, ns per call on rank 0 alone, rank 1 sleeping (the best of {3 if QUICK else 9} loops, each piece's loops"
    " interleaved with the others'; includes the loop's and the call's own cost):")
for k, v in piece_res.items():
    say(f"  {v:8.1f}  {k}")

if args.json:
    out = {
        "meta": {
            "command": "mpirun -n 2 python3 " + " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:]),
            "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
            "host": platform.node(), "cpus": os.cpu_count(), "cpu_model": cpu_model(),
            "python": platform.python_version(), "numpy": np.__version__,
            "mpi4py": mpi4py.__version__, "dlpack_mpi": dlpack_mpi.__version__,
            "dlpack_mpi_build": module_build(),
            "mpi_library": MPI_LIBRARY,
            "thread_level": MPI.Query_thread(), "settings": dlpack_mpi.settings(),
            "loadavg_start": loadavg_start, "loadavg_end": loadavg_end, "seconds": elapsed,
            "quick": QUICK, "rounds": ROUNDS, "big_rounds": BIG_ROUNDS,
            "small_batch": SMALL_BATCH, "small_batches_per_round": SMALL_BATCHES,
            "big_batches_per_round": BIG_BATCHES,
            "numpy_madvise_hugepage": os.environ.get("NUMPY_MADVISE_HUGEPAGE"),
            **meta_extra,
        },
        "results": results, "table": table, "checks": checks, "targets": targets,
        "pieces_ns": piece_res,
    }
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    say(f"\nwrote {args.json}")
