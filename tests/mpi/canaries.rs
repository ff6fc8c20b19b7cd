//! Bounds proof by canaries: every operation of `TensorComm`, over every layout, writes only
//! the elements of its receive tensor and never writes a send tensor.
//!
//! Each tensor lives inside a larger allocation: 64 guard bytes before and after its
//! storage, and for strided layouts the storage itself has holes (bytes of no element).
//! Every byte starts with a position-dependent pattern. After each operation (and after
//! each refused one) the test checks, byte by byte:
//! - a receive tensor: its elements hold exactly the expected values, and every other byte
//!   of the allocation (guards, holes, v-variant gaps) still holds its pattern;
//! - a send tensor (always exported `READ_ONLY`): the whole allocation is bit-identical;
//! - the tensor's deleter ran exactly once.
//!
//! The expected values are computed here, from the test's own layout arithmetic (not the
//! library's). CASES entries that involve a receive buffer run again at the end, under the
//! same guards.
//!
//! The suite `canaries` of tests/mpi (main.rs): `cargo test` runs it at 1 rank,
//! scripts/test.sh under `mpirun -n 2` and `-n 3`.

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::harness;
use dlpack_mpi::comm::{Blocks, BroadcastBuffer, TensorComm};
use dlpack_mpi::dlpack::{
    DLDataType, DLDevice, DLManagedTensorVersioned, DLPackVersion, DLTensor, ManagedTensor,
    FLAG_IS_COPIED, FLAG_READ_ONLY,
};
use dlpack_mpi::dtype::ReduceOp;
use dlpack_mpi::settings::Packing;
use dlpack_mpi::spec::{RecvSpec, SendSpec};
use dlpack_mpi::Error;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

type Outcome = Result<(), String>;

/// Turns a library error into the case's failure message, naming the call.
macro_rules! call {
    ($e:expr) => {
        $e.map_err(|e| format!("{} failed: {e}", stringify!($e)))?
    };
}

const GUARD_BYTES: usize = 64;

/// A DLPack dtype and how a logical integer value is encoded in it.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Dt {
    code: u8,
    bits: u8,
    lanes: u16,
}

const I32: Dt = Dt {
    code: 0,
    bits: 32,
    lanes: 1,
};
const U8: Dt = Dt {
    code: 1,
    bits: 8,
    lanes: 1,
};
const F64: Dt = Dt {
    code: 2,
    bits: 64,
    lanes: 1,
};
const BOOL: Dt = Dt {
    code: 6,
    bits: 8,
    lanes: 1,
};
const F16: Dt = Dt {
    code: 2,
    bits: 16,
    lanes: 1,
};
const BF16: Dt = Dt {
    code: 4,
    bits: 16,
    lanes: 1,
};
const C64: Dt = Dt {
    code: 5,
    bits: 64,
    lanes: 1,
};
const F32X4: Dt = Dt {
    code: 2,
    bits: 32,
    lanes: 4,
};

impl Dt {
    fn elem_bytes(self) -> usize {
        usize::from(self.bits / 8) * usize::from(self.lanes)
    }

    /// The bytes of one element holding logical value `v` (lane `k` holds `v·lanes + k`).
    fn encode(self, v: i64) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.elem_bytes());
        for k in 0..i64::from(self.lanes) {
            let s = v * i64::from(self.lanes) + k;
            match (self.code, self.bits) {
                (0 | 1, 8) => out.push(s as u8),
                (0 | 1, 16) | (2 | 4, 16) => out.extend((s as u16).to_le_bytes()),
                (0 | 1, 32) => out.extend((s as u32).to_le_bytes()),
                (0 | 1, 64) => out.extend((s as u64).to_le_bytes()),
                (2, 32) => out.extend((s as f32).to_le_bytes()),
                (2, 64) => out.extend((s as f64).to_le_bytes()),
                (5, 64) => {
                    out.extend((s as f32).to_le_bytes());
                    out.extend(0f32.to_le_bytes());
                }
                (6, 8) => out.push((s & 1) as u8),
                _ => panic!("no encoding for {self:?}"),
            }
        }
        out
    }
}

/// The layouts every operation runs over.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    /// `[n]`, stride 1.
    Contiguous,
    /// `[2, n/2]` in column-major order (strides `[1, 2]`).
    Fortran,
    /// `[2, n/4, 2]` with the first two axes of a C-order `(n/4, 2, 2)` swapped.
    Transposed,
    /// `[n]`, stride 2 (every other element).
    Step,
    /// `[n]`, stride −1 (first element at the end of the storage).
    Negative,
    /// `[2, n/2]`, strides `[-n, 2]`: rows backwards, columns every other element.
    NegativeStep2d,
    /// `[0, 3]`.
    ZeroSize,
    /// `[]` (one element).
    ZeroD,
}

const KINDS: [Kind; 8] = [
    Kind::Contiguous,
    Kind::Fortran,
    Kind::Transposed,
    Kind::Step,
    Kind::Negative,
    Kind::NegativeStep2d,
    Kind::ZeroSize,
    Kind::ZeroD,
];

impl Kind {
    /// The element count an operation uses per block for this layout (so that the layout
    /// applies to `size × block` elements too).
    fn block(self) -> usize {
        match self {
            Kind::Transposed => 8,
            Kind::Fortran | Kind::NegativeStep2d => 4,
            Kind::Step | Kind::Negative => 3,
            Kind::Contiguous => 2,
            Kind::ZeroSize => 0,
            Kind::ZeroD => 1,
        }
    }
}

/// Shape, strides (elements) and where each logical element sits in the storage.
#[derive(Clone, Debug)]
struct Layout {
    shape: Vec<i64>,
    strides: Vec<i64>,
    /// Storage elements (the span of the layout, holes included).
    storage: usize,
    /// Storage index of the first element (`byte_offset` points here).
    first: usize,
    /// Storage index of each logical element, in row-major logical order.
    index: Vec<usize>,
}

/// The layout of `kind` for `n` elements; a kind that cannot hold `n` elements (0-d needs
/// 1, zero-size needs 0, 2-d kinds need even counts) falls back to contiguous.
fn layout(kind: Kind, n: usize) -> Layout {
    let ni = n as i64;
    let (shape, strides): (Vec<i64>, Vec<i64>) = match kind {
        Kind::Fortran if n >= 4 && n % 2 == 0 => (vec![2, ni / 2], vec![1, 2]),
        Kind::Transposed if n >= 8 && n % 4 == 0 => (vec![2, ni / 4, 2], vec![2, 4, 1]),
        Kind::Step if n >= 2 => (vec![ni], vec![2]),
        Kind::Negative if n >= 2 => (vec![ni], vec![-1]),
        Kind::NegativeStep2d if n >= 4 && n % 2 == 0 => (vec![2, ni / 2], vec![-ni, 2]),
        Kind::ZeroSize if n == 0 => (vec![0, 3], vec![3, 1]),
        Kind::ZeroD if n == 1 => (vec![], vec![]),
        _ => (vec![ni], vec![1]),
    };
    // Naive nested loops: offsets relative to the first element.
    let mut offsets = Vec::with_capacity(n);
    let count: i64 = shape.iter().product();
    let mut idx = vec![0i64; shape.len()];
    for _ in 0..count {
        offsets.push(idx.iter().zip(&strides).map(|(i, s)| i * s).sum::<i64>());
        for axis in (0..shape.len()).rev() {
            idx[axis] += 1;
            if idx[axis] < shape[axis] {
                break;
            }
            idx[axis] = 0;
        }
    }
    let lo = offsets.iter().copied().min().unwrap_or(0).min(0);
    let hi = offsets.iter().copied().max().unwrap_or(0).max(0);
    Layout {
        shape,
        strides,
        storage: if count == 0 {
            0
        } else {
            (hi - lo + 1) as usize
        },
        first: (-lo) as usize,
        index: offsets.iter().map(|o| (o - lo) as usize).collect(),
    }
}

/// The byte pattern a canary byte starts with.
fn pattern(i: usize) -> u8 {
    (i as u8).wrapping_mul(151) ^ 0xC3
}

/// A tensor's storage inside a guarded allocation.
struct Canary {
    words: Vec<u64>,
    dt: Dt,
    layout: Layout,
    /// The allocation's bytes right after construction.
    initial: Vec<u8>,
    deletes: Arc<AtomicUsize>,
    what: String,
}

struct Ctx {
    deletes: Arc<AtomicUsize>,
    _shape: Vec<i64>,
    _strides: Vec<i64>,
}

unsafe extern "C" fn delete_canary(p: *mut DLManagedTensorVersioned) {
    // SAFETY: built by `Canary::tensor` from a Box; the guard calls this once.
    let m = unsafe { Box::from_raw(p) };
    // SAFETY: manager_ctx is the Box<Ctx> leaked by `Canary::tensor`.
    let ctx = unsafe { Box::from_raw(m.manager_ctx.cast::<Ctx>()) };
    ctx.deletes.fetch_add(1, Ordering::SeqCst);
}

impl Canary {
    /// `n` elements of `dt` in layout `kind`, logical element `i` holding `init(i)`.
    fn new(dt: Dt, kind: Kind, n: usize, init: impl Fn(usize) -> i64) -> Self {
        Self::with_layout(dt, layout(kind, n), init)
    }

    fn with_layout(dt: Dt, layout: Layout, init: impl Fn(usize) -> i64) -> Self {
        let e = dt.elem_bytes();
        let bytes = 2 * GUARD_BYTES + layout.storage * e;
        let mut words = vec![0u64; bytes.div_ceil(8)];
        let mut c = Canary {
            initial: Vec::new(),
            dt,
            deletes: Arc::default(),
            what: format!("{dt:?} {:?}/{:?}", layout.shape, layout.strides),
            layout,
            words: Vec::new(),
        };
        {
            let all = as_bytes_mut(&mut words);
            for (i, b) in all.iter_mut().enumerate() {
                *b = pattern(i);
            }
            for (i, &at) in c.layout.index.iter().enumerate() {
                let start = GUARD_BYTES + at * e;
                all[start..start + e].copy_from_slice(&dt.encode(init(i)));
            }
        }
        c.words = words;
        c.initial = c.bytes().to_vec();
        c
    }

    fn len(&self) -> usize {
        self.layout.index.len()
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: plain bytes of a Vec<u64>.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast(), self.words.len() * 8) }
    }

    /// The tensor over this canary's storage: `data` is the allocation's start and
    /// `byte_offset` reaches the first element, so the library must apply both.
    fn tensor(&mut self, flags: u64) -> ManagedTensor<'_> {
        let mut shape = self.layout.shape.clone();
        let mut strides = self.layout.strides.clone();
        let ndim = shape.len() as i32;
        let dl_tensor = DLTensor {
            data: self.words.as_mut_ptr().cast::<c_void>(),
            device: DLDevice {
                device_type: 1,
                device_id: 0,
            },
            ndim,
            dtype: DLDataType {
                code: self.dt.code,
                bits: self.dt.bits,
                lanes: self.dt.lanes,
            },
            shape: if ndim == 0 {
                std::ptr::null_mut()
            } else {
                shape.as_mut_ptr()
            },
            strides: if ndim == 0 {
                std::ptr::null_mut()
            } else {
                strides.as_mut_ptr()
            },
            byte_offset: (GUARD_BYTES + self.layout.first * self.dt.elem_bytes()) as u64,
        };
        let ctx = Box::new(Ctx {
            deletes: self.deletes.clone(),
            _shape: shape,
            _strides: strides,
        });
        let m = Box::into_raw(Box::new(DLManagedTensorVersioned {
            version: DLPackVersion { major: 1, minor: 3 },
            manager_ctx: Box::into_raw(ctx).cast(),
            deleter: Some(delete_canary),
            flags,
            dl_tensor,
        }));
        // SAFETY: a struct built just now; its arrays live in the context the deleter
        // frees; the storage is this canary, exclusively borrowed while the tensor lives.
        unsafe { ManagedTensor::from_raw_versioned(m) }.expect("canary tensors are valid")
    }

    /// After the tensor is gone: the allocation is bit-identical, deleted once.
    fn untouched(&self) -> Outcome {
        self.released(1)?;
        if let Some(i) = (0..self.initial.len()).find(|&i| self.bytes()[i] != self.initial[i]) {
            return Err(format!(
                "{}: byte {i} of the allocation changed ({:#04x} -> {:#04x}; guard {GUARD_BYTES} bytes, {} elements)",
                self.what,
                self.initial[i],
                self.bytes()[i],
                self.len()
            ));
        }
        Ok(())
    }

    /// After the tensor is gone: element `i` holds `expected(i)`, every other byte (guards,
    /// holes) is unchanged, deleted once.
    fn received(&self, expected: impl Fn(usize) -> i64) -> Outcome {
        self.released(1)?;
        let e = self.dt.elem_bytes();
        let mut want = self.initial.clone();
        for (i, &at) in self.layout.index.iter().enumerate() {
            let start = GUARD_BYTES + at * e;
            want[start..start + e].copy_from_slice(&self.dt.encode(expected(i)));
        }
        let got = self.bytes();
        if let Some(b) = (0..want.len()).find(|&b| got[b] != want[b]) {
            let element =
                self.layout.index.iter().position(|&at| {
                    (GUARD_BYTES + at * e..GUARD_BYTES + (at + 1) * e).contains(&b)
                });
            return Err(format!(
                "{}: byte {b} is {:#04x}, expected {:#04x} ({}; guard {GUARD_BYTES} bytes, storage {} elements)",
                self.what,
                got[b],
                want[b],
                match element {
                    Some(i) => format!("element {i}"),
                    None => "outside every element".to_string(),
                },
                self.layout.storage
            ));
        }
        Ok(())
    }

    fn released(&self, times: usize) -> Outcome {
        let n = self.deletes.load(Ordering::SeqCst);
        ensure!(n == times, "{}: deleter ran {n} times", self.what);
        Ok(())
    }
}

fn as_bytes_mut(words: &mut [u64]) -> &mut [u8] {
    // SAFETY: plain bytes of a &mut [u64].
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast(), words.len() * 8) }
}

/// What rank `r` sends as logical element `i`.
fn value(r: i32, i: usize) -> i64 {
    i64::from(r) * 100 + i as i64 + 1
}

/// What receive canaries hold before an operation (must be overwritten where received,
/// and left alone in v-variant gaps).
const STALE: i64 = -7;

fn ring(w: &SimpleCommunicator) -> (i32, i32) {
    let (r, p) = (w.rank(), w.size());
    ((r + 1) % p, (r + p - 1) % p)
}

// ---------------------------------------------------------------------------------------
// Operations × layouts
// ---------------------------------------------------------------------------------------

fn sendrecv_ring(w: &SimpleCommunicator, dt: Dt, kind: Kind) -> Outcome {
    let (next, prev) = ring(w);
    let n = kind.block();
    let me = w.rank();
    let mut s = Canary::new(dt, kind, n, |i| value(me, i));
    let mut r = Canary::new(dt, kind, n, |_| STALE);
    {
        let st = s.tensor(FLAG_READ_ONLY);
        let mut rt = r.tensor(0);
        call!(w.sendrecv_tensor(&st, next, 11, &mut rt, prev, 11));
    }
    s.untouched()?;
    r.received(|i| value(prev, i))
}

fn blocking_pair(w: &SimpleCommunicator, kind: Kind) -> Outcome {
    let n = kind.block();
    if w.size() < 2 || w.rank() > 1 {
        return Ok(());
    }
    if w.rank() == 0 {
        let mut s = Canary::new(I32, kind, n, |i| value(0, i));
        call!(w.send_tensor(&s.tensor(FLAG_READ_ONLY), 1, 12));
        s.untouched()
    } else {
        let mut r = Canary::new(I32, kind, n, |_| STALE);
        call!(w.recv_tensor(&mut r.tensor(0), 0, 12));
        r.received(|i| value(0, i))
    }
}

fn nonblocking_ring(w: &SimpleCommunicator, kind: Kind) -> Outcome {
    let (next, prev) = ring(w);
    let n = kind.block();
    let me = w.rank();
    let mut s = Canary::new(I32, kind, n, |i| value(me, i));
    let mut r = Canary::new(I32, kind, n, |_| STALE);
    {
        let st = s.tensor(FLAG_READ_ONLY);
        let mut rt = r.tensor(0);
        let ss = call!(SendSpec::new(&st));
        let mut rs = call!(RecvSpec::new(&mut rt));
        mpi::request::scope(|scope| -> Outcome {
            let rreq = call!(w.immediate_recv_spec(scope, &mut rs, prev, 13));
            let sreq = call!(w.immediate_send_spec(scope, &ss, next, 13));
            rreq.wait();
            sreq.wait();
            Ok(())
        })?;
    }
    s.untouched()?;
    r.received(|i| value(prev, i))
}

/// The tensor-taking nonblocking forms: packed per policy, the request owns the copy and
/// unpacks at completion; the guards show nothing is written outside the elements.
fn nonblocking_tensor_ring(w: &SimpleCommunicator, kind: Kind) -> Outcome {
    let (next, prev) = ring(w);
    let n = kind.block();
    let me = w.rank();
    let mut s = Canary::new(I32, kind, n, |i| value(me, i));
    let mut r = Canary::new(I32, kind, n, |_| STALE);
    {
        let st = s.tensor(FLAG_READ_ONLY);
        let mut rt = r.tensor(0);
        mpi::request::scope(|scope| -> Outcome {
            let rreq = call!(w.immediate_recv_tensor(scope, &mut rt, prev, 14));
            let sreq = call!(w.immediate_send_tensor(scope, &st, next, 14));
            call!(rreq.wait());
            call!(sreq.wait());
            Ok(())
        })?;
    }
    s.untouched()?;
    r.received(|i| value(prev, i))
}

/// `broadcast_tensor_from` with the root's tensor passed shared (`BroadcastBuffer::Send`).
fn broadcast_from_shared(w: &SimpleCommunicator, kind: Kind) -> Outcome {
    let n = kind.block();
    let root = w.size() - 1;
    if w.rank() == root {
        let mut c = Canary::new(I32, kind, n, |i| value(root, i));
        let t = c.tensor(FLAG_READ_ONLY);
        call!(w.broadcast_tensor_from(BroadcastBuffer::Send(&t), root));
        drop(t);
        c.untouched()
    } else {
        let mut c = Canary::new(I32, kind, n, |_| STALE);
        call!(w.broadcast_tensor_from(BroadcastBuffer::Recv(&mut c.tensor(0)), root));
        c.received(|i| value(root, i))
    }
}

fn broadcast(w: &SimpleCommunicator, dt: Dt, kind: Kind) -> Outcome {
    let n = kind.block();
    for root in [0, w.size() - 1] {
        if w.rank() == root {
            let mut c = Canary::new(dt, kind, n, |i| value(root, i));
            call!(w.broadcast_tensor(&mut c.tensor(FLAG_READ_ONLY), root));
            c.untouched()?;
        } else {
            let mut c = Canary::new(dt, kind, n, |_| STALE);
            call!(w.broadcast_tensor(&mut c.tensor(0), root));
            c.received(|i| value(root, i))?;
        }
    }
    Ok(())
}

fn sum_over_ranks(w: &SimpleCommunicator, i: usize) -> i64 {
    (0..w.size()).map(|r| value(r, i)).sum()
}

fn reduce(w: &SimpleCommunicator, dt: Dt, kind: Kind) -> Outcome {
    let n = kind.block();
    let me = w.rank();
    let mut s = Canary::new(dt, kind, n, |i| value(me, i));
    let mut r = Canary::new(dt, kind, n, |_| STALE);
    {
        let st = s.tensor(FLAG_READ_ONLY);
        if me == 0 {
            let mut rt = r.tensor(0);
            call!(w.reduce_tensor(&st, Some(&mut rt), ReduceOp::Sum, 0));
        } else {
            call!(w.reduce_tensor(&st, None, ReduceOp::Sum, 0));
        }
    }
    s.untouched()?;
    if me == 0 {
        r.received(|i| sum_over_ranks(w, i))
    } else {
        r.released(0)?;
        r.untouched_bytes()
    }
}

impl Canary {
    /// The bytes are unchanged (for a canary no tensor was made from).
    fn untouched_bytes(&self) -> Outcome {
        ensure!(self.bytes() == self.initial, "{}: changed", self.what);
        Ok(())
    }
}

fn all_reduce(w: &SimpleCommunicator, dt: Dt, kind: Kind) -> Outcome {
    let n = kind.block();
    let me = w.rank();
    let mut s = Canary::new(dt, kind, n, |i| value(me, i));
    let mut r = Canary::new(dt, kind, n, |_| STALE);
    call!(w.all_reduce_tensor(&s.tensor(FLAG_READ_ONLY), &mut r.tensor(0), ReduceOp::Sum));
    s.untouched()?;
    r.received(|i| sum_over_ranks(w, i))
}

fn all_reduce_in_place(w: &SimpleCommunicator, dt: Dt, kind: Kind) -> Outcome {
    let n = kind.block();
    let me = w.rank();
    let mut c = Canary::new(dt, kind, n, |i| value(me, i));
    call!(w.all_reduce_tensor_in_place(&mut c.tensor(0), ReduceOp::Sum));
    c.received(|i| sum_over_ranks(w, i))
}

fn gather(w: &SimpleCommunicator, kind: Kind) -> Outcome {
    let (me, p) = (w.rank(), w.size() as usize);
    let b = kind.block();
    let mut s = Canary::new(I32, kind, b, |i| value(me, i));
    let mut r = Canary::new(I32, kind, b * p, |_| STALE);
    {
        let st = s.tensor(FLAG_READ_ONLY);
        if me == 0 {
            call!(w.gather_tensor(&st, Some(&mut r.tensor(0)), 0));
        } else {
            call!(w.gather_tensor(&st, None, 0));
        }
    }
    s.untouched()?;
    if me == 0 {
        r.received(|i| value((i / b) as i32, i % b))
    } else {
        r.untouched_bytes()
    }
}

/// Per-rank blocks of `b + j` elements (rank `j`), one element of gap after each: the
/// receive tensor has `Σ (b + j + 1)` elements and the gaps must keep their values.
fn gapped(p: usize, b: usize) -> (Vec<i64>, Vec<i64>, usize) {
    let counts: Vec<i64> = (0..p).map(|j| (b + j) as i64).collect();
    let mut displs = Vec::with_capacity(p);
    let mut at = 0i64;
    for &c in &counts {
        displs.push(at);
        at += c + 1;
    }
    (counts, displs, at as usize)
}

/// Which rank's block (and which element of it) element `i` of a gapped tensor is.
fn in_block(counts: &[i64], displs: &[i64], i: usize) -> Option<(usize, usize)> {
    let i = i as i64;
    (0..counts.len())
        .find(|&j| i >= displs[j] && i < displs[j] + counts[j])
        .map(|j| (j, (i - displs[j]) as usize))
}

fn gatherv(w: &SimpleCommunicator, kind: Kind) -> Outcome {
    let (me, p) = (w.rank(), w.size() as usize);
    let b = kind.block();
    let (counts, displs, total) = gapped(p, b);
    let mut s = Canary::new(I32, kind, counts[me as usize] as usize, |i| value(me, i));
    let mut r = Canary::new(I32, kind, total, |_| STALE);
    {
        let st = s.tensor(FLAG_READ_ONLY);
        if me == 0 {
            let mut rt = r.tensor(0);
            call!(w.gatherv_tensor(
                &st,
                Some((&mut rt, Blocks::new(&counts[..], &displs[..]))),
                0
            ));
        } else {
            call!(w.gatherv_tensor(&st, None, 0));
        }
    }
    s.untouched()?;
    if me == 0 {
        r.received(|i| match in_block(&counts, &displs, i) {
            Some((j, k)) => value(j as i32, k),
            None => STALE,
        })
    } else {
        r.untouched_bytes()
    }
}

fn scatter(w: &SimpleCommunicator, kind: Kind) -> Outcome {
    let (me, p) = (w.rank(), w.size() as usize);
    let b = kind.block();
    let mut s = Canary::new(I32, kind, b * p, |i| value(0, i));
    let mut r = Canary::new(I32, kind, b, |_| STALE);
    {
        let mut rt = r.tensor(0);
        if me == 0 {
            call!(w.scatter_tensor(Some(&s.tensor(FLAG_READ_ONLY)), &mut rt, 0));
        } else {
            call!(w.scatter_tensor(None, &mut rt, 0));
        }
    }
    if me == 0 {
        s.untouched()?;
    }
    r.received(|i| value(0, me as usize * b + i))
}

fn scatterv(w: &SimpleCommunicator, kind: Kind) -> Outcome {
    let (me, p) = (w.rank(), w.size() as usize);
    let b = kind.block();
    let (counts, displs, total) = gapped(p, b);
    let mut s = Canary::new(I32, kind, total, |i| value(0, i));
    let mine = counts[me as usize] as usize;
    let mut r = Canary::new(I32, kind, mine, |_| STALE);
    {
        let mut rt = r.tensor(0);
        if me == 0 {
            let st = s.tensor(FLAG_READ_ONLY);
            call!(w.scatterv_tensor(
                Some((&st, Blocks::new(&counts[..], &displs[..]))),
                &mut rt,
                0
            ));
        } else {
            call!(w.scatterv_tensor(None, &mut rt, 0));
        }
    }
    if me == 0 {
        s.untouched()?;
    }
    let d = displs[me as usize] as usize;
    r.received(|i| value(0, d + i))
}

fn all_gather(w: &SimpleCommunicator, kind: Kind) -> Outcome {
    let (me, p) = (w.rank(), w.size() as usize);
    let b = kind.block();
    let mut s = Canary::new(I32, kind, b, |i| value(me, i));
    let mut r = Canary::new(I32, kind, b * p, |_| STALE);
    call!(w.all_gather_tensor(&s.tensor(FLAG_READ_ONLY), &mut r.tensor(0)));
    s.untouched()?;
    r.received(|i| value((i / b) as i32, i % b))
}

fn all_gatherv(w: &SimpleCommunicator, kind: Kind) -> Outcome {
    let (me, p) = (w.rank(), w.size() as usize);
    let b = kind.block();
    let (counts, displs, total) = gapped(p, b);
    let mut s = Canary::new(I32, kind, counts[me as usize] as usize, |i| value(me, i));
    let mut r = Canary::new(I32, kind, total, |_| STALE);
    call!(w.all_gatherv_tensor(
        &s.tensor(FLAG_READ_ONLY),
        &mut r.tensor(0),
        Blocks::new(&counts, &displs)
    ));
    s.untouched()?;
    r.received(|i| match in_block(&counts, &displs, i) {
        Some((j, k)) => value(j as i32, k),
        None => STALE,
    })
}

fn all_to_all(w: &SimpleCommunicator, kind: Kind) -> Outcome {
    let (me, p) = (w.rank(), w.size() as usize);
    let b = kind.block();
    let mut s = Canary::new(I32, kind, b * p, |i| value(me, i));
    let mut r = Canary::new(I32, kind, b * p, |_| STALE);
    call!(w.all_to_all_tensor(&s.tensor(FLAG_READ_ONLY), &mut r.tensor(0)));
    s.untouched()?;
    // Block j of this rank's receive is block `me` of rank j's send.
    r.received(|i| value((i / b) as i32, me as usize * b + i % b))
}

fn all_to_allv(w: &SimpleCommunicator, kind: Kind) -> Outcome {
    let (me, p) = (w.rank(), w.size() as usize);
    let b = kind.block();
    let me_u = me as usize;
    // Rank r sends b + (r + j) % 2 elements to rank j (symmetric, so receive counts match).
    let amount = |r: usize, j: usize| b + (r + j) % 2;
    let send_counts: Vec<i64> = (0..p).map(|j| amount(me_u, j) as i64).collect();
    let send_displs: Vec<i64> = send_counts
        .iter()
        .scan(0i64, |at, &c| {
            let d = *at;
            *at += c;
            Some(d)
        })
        .collect();
    let send_total = send_counts.iter().sum::<i64>() as usize;
    let recv_counts: Vec<i64> = (0..p).map(|j| amount(j, me_u) as i64).collect();
    let mut recv_displs = Vec::with_capacity(p);
    let mut at = 0i64;
    for &c in &recv_counts {
        recv_displs.push(at);
        at += c + 1; // one element of gap after each block
    }
    let recv_total = at as usize;
    let mut s = Canary::new(I32, kind, send_total, |i| value(me, i));
    let mut r = Canary::new(I32, kind, recv_total, |_| STALE);
    call!(w.all_to_allv_tensor(
        &s.tensor(FLAG_READ_ONLY),
        Blocks::new(&send_counts, &send_displs),
        &mut r.tensor(0),
        Blocks::new(&recv_counts, &recv_displs)
    ));
    s.untouched()?;
    // Rank j's send displacement for rank `me`: Σ_{k < me} amount(j, k).
    let their_displ = |j: usize| (0..me_u).map(|k| amount(j, k)).sum::<usize>();
    r.received(|i| match in_block(&recv_counts, &recv_displs, i) {
        Some((j, k)) => value(j as i32, their_displ(j) + k),
        None => STALE,
    })
}

fn reduce_scatter_block(w: &SimpleCommunicator, kind: Kind) -> Outcome {
    let (me, p) = (w.rank(), w.size() as usize);
    let b = kind.block();
    let mut s = Canary::new(I32, kind, b * p, |i| value(me, i));
    let mut r = Canary::new(I32, kind, b, |_| STALE);
    call!(w.reduce_scatter_block_tensor(
        &s.tensor(FLAG_READ_ONLY),
        &mut r.tensor(0),
        ReduceOp::Sum
    ));
    s.untouched()?;
    r.received(|i| sum_over_ranks(w, me as usize * b + i))
}

/// A strided send into a contiguous receive and the reverse (mixed layouts).
fn mixed_layouts(w: &SimpleCommunicator, kind: Kind) -> Outcome {
    let (next, prev) = ring(w);
    let me = w.rank();
    let n = kind.block();
    for (sk, rk) in [(kind, Kind::Contiguous), (Kind::Contiguous, kind)] {
        let mut s = Canary::new(I32, sk, n, |i| value(me, i));
        let mut r = Canary::new(I32, rk, n, |_| STALE);
        call!(w.sendrecv_tensor(
            &s.tensor(FLAG_READ_ONLY),
            next,
            14,
            &mut r.tensor(0),
            prev,
            14
        ));
        s.untouched()?;
        r.received(|i| value(prev, i))?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// CASES with a receive buffer, under the guards
// ---------------------------------------------------------------------------------------

fn c02_v0_and_v1_deliver(w: &SimpleCommunicator) -> Outcome {
    // The canary builds versioned tensors; the legacy path is the same storage through
    // DLManagedTensor, covered by mpi_cases. Here: v1 int64 [1,2,3,4] into a guarded recv.
    let dt = Dt {
        code: 0,
        bits: 64,
        lanes: 1,
    };
    let (next, prev) = ring(w);
    let mut s = Canary::new(dt, Kind::Contiguous, 4, |i| i as i64 + 1);
    let mut r = Canary::new(dt, Kind::Contiguous, 4, |_| STALE);
    call!(w.sendrecv_tensor(
        &s.tensor(FLAG_READ_ONLY),
        next,
        2,
        &mut r.tensor(0),
        prev,
        2
    ));
    s.untouched()?;
    r.received(|i| i as i64 + 1)
}

fn c06_zero_d(w: &SimpleCommunicator) -> Outcome {
    let (next, prev) = ring(w);
    let me = w.rank();
    let mut s = Canary::new(F64, Kind::ZeroD, 1, |_| 3);
    let mut r = Canary::new(F64, Kind::ZeroD, 1, |_| STALE);
    call!(w.sendrecv_tensor(
        &s.tensor(FLAG_READ_ONLY),
        next,
        6,
        &mut r.tensor(0),
        prev,
        6
    ));
    s.untouched()?;
    r.received(|_| 3)?;
    let mut s = Canary::new(F64, Kind::ZeroD, 1, |_| i64::from(me) + 1);
    let mut r = Canary::new(F64, Kind::ZeroD, 1, |_| STALE);
    call!(w.all_reduce_tensor(&s.tensor(FLAG_READ_ONLY), &mut r.tensor(0), ReduceOp::Sum));
    s.untouched()?;
    let p = i64::from(w.size());
    r.received(|_| p * (p + 1) / 2)
}

fn c07_zero_size(w: &SimpleCommunicator) -> Outcome {
    let (next, prev) = ring(w);
    let mut s = Canary::new(I32, Kind::ZeroSize, 0, |_| 0);
    let mut r = Canary::new(I32, Kind::ZeroSize, 0, |_| 0);
    {
        let st = s.tensor(FLAG_READ_ONLY);
        let mut rt = r.tensor(0);
        call!(w.sendrecv_tensor(&st, next, 7, &mut rt, prev, 7));
        call!(w.all_reduce_tensor(&st, &mut rt, ReduceOp::Sum));
        call!(w.all_gather_tensor(&st, &mut rt));
        call!(w.all_to_all_tensor(&st, &mut rt));
        call!(w.broadcast_tensor(&mut rt, 0));
    }
    s.untouched()?;
    r.untouched()
}

fn c21_to_c25_strided_sends_into_guarded_receives(w: &SimpleCommunicator) -> Outcome {
    let (next, prev) = ring(w);
    let me = w.rank();
    let f32 = Dt {
        code: 2,
        bits: 32,
        lanes: 1,
    };
    // (shape, strides) of the CASES: F order, permuted, step, negative, broadcast.
    let layouts: [(&[i64], &[i64]); 6] = [
        (&[2, 2, 2], &[1, 2, 4]),
        (&[2, 2, 2], &[4, 1, 2]),
        (&[2, 2, 2], &[2, 4, 1]),
        (&[3], &[2]),
        (&[3], &[-1]),
        (&[6], &[0]),
    ];
    for (shape, strides) in layouts {
        let l = custom_layout(shape, strides);
        let n = l.index.len();
        // Logical element i holds the value at its storage index (so a broadcast repeats).
        let storage_value = |at: usize| i64::from(me) * 100 + at as i64;
        let idx = l.index.clone();
        let mut s = Canary::with_layout(f32, l, |i| storage_value(idx[i]));
        let mut r = Canary::new(f32, Kind::Contiguous, n, |_| STALE);
        call!(w.sendrecv_tensor(
            &s.tensor(FLAG_READ_ONLY),
            next,
            21,
            &mut r.tensor(0),
            prev,
            21
        ));
        s.untouched()?;
        let sent = custom_layout(shape, strides).index;
        r.received(|i| i64::from(prev) * 100 + sent[i] as i64)?;
    }
    Ok(())
}

fn custom_layout(shape: &[i64], strides: &[i64]) -> Layout {
    let mut l = layout(Kind::Contiguous, 0);
    let count: i64 = shape.iter().product();
    let mut offsets = Vec::new();
    let mut idx = vec![0i64; shape.len()];
    for _ in 0..count {
        offsets.push(idx.iter().zip(strides).map(|(i, s)| i * s).sum::<i64>());
        for axis in (0..shape.len()).rev() {
            idx[axis] += 1;
            if idx[axis] < shape[axis] {
                break;
            }
            idx[axis] = 0;
        }
    }
    let lo = offsets.iter().copied().min().unwrap_or(0).min(0);
    let hi = offsets.iter().copied().max().unwrap_or(0).max(0);
    l.shape = shape.to_vec();
    l.strides = strides.to_vec();
    l.storage = (hi - lo + 1) as usize;
    l.first = (-lo) as usize;
    l.index = offsets.iter().map(|o| (o - lo) as usize).collect();
    l
}

fn c26_broadcast_receive_refused_untouched(_w: &SimpleCommunicator) -> Outcome {
    let f32 = Dt {
        code: 2,
        bits: 32,
        lanes: 1,
    };
    let mut l = custom_layout(&[6], &[0]);
    // Stride 0: every logical element is storage element 0.
    l.index = vec![0; 6];
    let mut r = Canary::with_layout(f32, l, |_| 2);
    {
        let mut t = r.tensor(0);
        let e = RecvSpec::new(&mut t).err();
        ensure!(
            matches!(e, Some(Error::Overlap { .. })),
            "stride-0 receive: {e:?}"
        );
    }
    r.untouched()
}

fn c27_byte_offset(w: &SimpleCommunicator) -> Outcome {
    // Every canary tensor has data at the allocation start and a byte offset past the
    // guard; this case adds an element of offset inside the storage as in CASES (data +
    // 4 bytes), by a layout whose first element is storage element 1.
    let (next, prev) = ring(w);
    let mut l = layout(Kind::Contiguous, 9);
    l.first = 1;
    l.index = (1..9).collect();
    l.shape = vec![8];
    let mut s = Canary::with_layout(I32, l.clone(), |i| i as i64 + 1);
    let mut r = Canary::with_layout(I32, l, |_| STALE);
    call!(w.sendrecv_tensor(
        &s.tensor(FLAG_READ_ONLY),
        next,
        27,
        &mut r.tensor(0),
        prev,
        27
    ));
    s.untouched()?;
    r.received(|i| i as i64 + 1)
}

fn c30_bool(w: &SimpleCommunicator) -> Outcome {
    let (next, prev) = ring(w);
    let bits = [1, 0, 1];
    let mut s = Canary::new(BOOL, Kind::Contiguous, 3, |i| bits[i]);
    let mut r = Canary::new(BOOL, Kind::Step, 3, |_| 0);
    call!(w.sendrecv_tensor(
        &s.tensor(FLAG_READ_ONLY),
        next,
        30,
        &mut r.tensor(0),
        prev,
        30
    ));
    s.untouched()?;
    r.received(|i| bits[i])?;
    let mut s = Canary::new(BOOL, Kind::Negative, 3, |i| bits[i]);
    let mut r = Canary::new(BOOL, Kind::Negative, 3, |_| 0);
    call!(w.all_reduce_tensor(
        &s.tensor(FLAG_READ_ONLY),
        &mut r.tensor(0),
        ReduceOp::LogicalOr
    ));
    s.untouched()?;
    r.received(|i| bits[i])?;
    let mut s = Canary::new(BOOL, Kind::Contiguous, 3, |i| bits[i]);
    let mut r = Canary::new(BOOL, Kind::Contiguous, 3, |_| 0);
    let e = w
        .all_reduce_tensor(&s.tensor(FLAG_READ_ONLY), &mut r.tensor(0), ReduceOp::Sum)
        .err();
    ensure!(
        matches!(e, Some(Error::UnsupportedReduction { .. })),
        "bool sum: {e:?}"
    );
    s.untouched()?;
    r.untouched()
}

fn c31_half_bits(w: &SimpleCommunicator) -> Outcome {
    let (next, prev) = ring(w);
    for dt in [F16, BF16] {
        // Arbitrary bit patterns (NaNs included) must arrive identical.
        let bits = [0x7e01i64, 0xfc00, 0x0001, 0x3c00];
        let mut s = Canary::new(dt, Kind::Negative, 4, |i| bits[i]);
        let mut r = Canary::new(dt, Kind::Fortran, 4, |_| STALE);
        call!(w.sendrecv_tensor(
            &s.tensor(FLAG_READ_ONLY),
            next,
            31,
            &mut r.tensor(0),
            prev,
            31
        ));
        s.untouched()?;
        r.received(|i| bits[i])?;
    }
    Ok(())
}

fn c32_complex64(w: &SimpleCommunicator) -> Outcome {
    let me = w.rank();
    let mut s = Canary::new(C64, Kind::Step, 4, |i| value(me, i));
    let mut r = Canary::new(C64, Kind::NegativeStep2d, 4, |_| STALE);
    call!(w.all_reduce_tensor(&s.tensor(FLAG_READ_ONLY), &mut r.tensor(0), ReduceOp::Sum));
    s.untouched()?;
    r.received(|i| sum_over_ranks(w, i))
}

fn c33_lanes(w: &SimpleCommunicator) -> Outcome {
    let (next, prev) = ring(w);
    let me = w.rank();
    let mut s = Canary::new(F32X4, Kind::Negative, 3, |i| value(me, i));
    let mut r = Canary::new(F32X4, Kind::Step, 3, |_| STALE);
    call!(w.sendrecv_tensor(
        &s.tensor(FLAG_READ_ONLY),
        next,
        33,
        &mut r.tensor(0),
        prev,
        33
    ));
    s.untouched()?;
    r.received(|i| value(prev, i))
}

fn c40_read_only_send(w: &SimpleCommunicator) -> Outcome {
    // Every send above is READ_ONLY and checked bit-identical; here also as a broadcast
    // root and a reduce input at every rank.
    let dt = Dt {
        code: 0,
        bits: 64,
        lanes: 1,
    };
    let mut s = Canary::new(dt, Kind::Contiguous, 10, |i| i as i64);
    let mut r = Canary::new(dt, Kind::Contiguous, 10, |_| STALE);
    call!(w.all_reduce_tensor(&s.tensor(FLAG_READ_ONLY), &mut r.tensor(0), ReduceOp::Max));
    s.untouched()?;
    r.received(|i| i as i64)
}

fn c41_c42_refused_receives_untouched(w: &SimpleCommunicator) -> Outcome {
    let (next, prev) = ring(w);
    for (flags, what) in [(FLAG_READ_ONLY, "read-only"), (FLAG_IS_COPIED, "copied")] {
        let mut s = Canary::new(I32, Kind::Contiguous, 4, |i| i as i64);
        let mut r = Canary::new(I32, Kind::Contiguous, 4, |_| STALE);
        {
            let st = s.tensor(FLAG_READ_ONLY);
            let mut rt = r.tensor(flags);
            let errs = [
                w.sendrecv_tensor(&st, next, 41, &mut rt, prev, 41).err(),
                w.all_reduce_tensor(&st, &mut rt, ReduceOp::Sum).err(),
                w.all_reduce_tensor_in_place(&mut rt, ReduceOp::Sum).err(),
                w.all_gather_tensor(&st, &mut rt).err(),
            ];
            let want = if flags == FLAG_READ_ONLY {
                Error::ReadOnly
            } else {
                Error::IsCopied
            };
            for e in errs {
                ensure!(e.as_ref() == Some(&want), "{what} receive: {e:?}");
            }
        }
        s.untouched()?;
        r.untouched()?;
    }
    Ok(())
}

fn c43_size_mismatch(w: &SimpleCommunicator) -> Outcome {
    let (next, prev) = ring(w);
    let me = w.rank();
    let mut s = Canary::new(I32, Kind::Contiguous, 6, |i| value(me, i));
    let mut small = Canary::new(I32, Kind::Step, 4, |_| STALE);
    let mut fits = Canary::new(I32, Kind::Negative, 6, |_| STALE);
    {
        let st = s.tensor(FLAG_READ_ONLY);
        let spec = call!(SendSpec::new(&st));
        let res = mpi::request::scope(|scope| -> Outcome {
            let req = call!(w.immediate_send_spec(scope, &spec, next, 43));
            let e = w.recv_tensor(&mut small.tensor(0), prev, 43).err();
            // The matched message is held by the error: the fitting tensor receives it.
            let got = match e.as_ref().and_then(Error::unreceived) {
                Some(held) => held
                    .recv_into(&mut fits.tensor(0))
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
                None => Err("no held message".to_string()),
            };
            req.wait();
            ensure!(
                matches!(
                    e.as_ref().map(Error::mismatch),
                    Some(Error::CountMismatch {
                        expected: 4,
                        actual: 6,
                        ..
                    })
                ),
                "4-element receive of 6: {e:?}"
            );
            got
        });
        res?;
    }
    s.untouched()?;
    small.untouched()?;
    fits.received(|i| value(prev, i))
}

fn c44_allgatherv_zero_count(w: &SimpleCommunicator) -> Outcome {
    let (me, p) = (w.rank(), w.size() as usize);
    let counts: Vec<i64> = (0..p as i64).collect();
    let displs: Vec<i64> = (0..p as i64).map(|j| j * (j - 1) / 2 + j).collect();
    let total = (displs[p - 1] + counts[p - 1] + 1) as usize;
    let mut s = Canary::new(I32, Kind::Step, me as usize, |i| value(me, i));
    let mut r = Canary::new(I32, Kind::Negative, total, |_| STALE);
    call!(w.all_gatherv_tensor(
        &s.tensor(FLAG_READ_ONLY),
        &mut r.tensor(0),
        Blocks::new(&counts, &displs)
    ));
    s.untouched()?;
    r.received(|i| match in_block(&counts, &displs, i) {
        Some((j, k)) => value(j as i32, k),
        None => STALE,
    })
}

fn c45_blocks_past_the_tensor(w: &SimpleCommunicator) -> Outcome {
    let p = w.size() as usize;
    let mut s = Canary::new(I32, Kind::Contiguous, 2, |i| i as i64);
    let mut r = Canary::new(I32, Kind::Contiguous, 2 * p, |_| STALE);
    {
        let st = s.tensor(FLAG_READ_ONLY);
        let mut rt = r.tensor(0);
        let counts = vec![2i64; p];
        let mut displs: Vec<i64> = (0..p as i64).map(|j| 2 * j).collect();
        displs[p - 1] += 1; // the last block reaches one element past the tensor
        let e = w
            .all_gatherv_tensor(&st, &mut rt, Blocks::new(&counts, &displs))
            .err();
        ensure!(
            matches!(e, Some(Error::OutOfBounds { .. })),
            "block past the end: {e:?}"
        );
    }
    s.untouched()?;
    r.untouched()
}

// ---------------------------------------------------------------------------------------

type Case = Box<dyn Fn(&SimpleCommunicator) -> Outcome>;

#[path = "canaries/nonblocking.rs"]
mod nonblocking;
/// An operation over one layout kind.
type KindOp = fn(&SimpleCommunicator, Kind) -> Outcome;
/// A named case.
type Named = fn(&SimpleCommunicator) -> Outcome;

fn cases() -> Vec<(String, Case)> {
    let mut v: Vec<(String, Case)> = Vec::new();
    for kind in KINDS {
        for dt in [I32, U8, F64] {
            v.push((
                format!("sendrecv {dt:?} {kind:?}"),
                Box::new(move |w| sendrecv_ring(w, dt, kind)),
            ));
            v.push((
                format!("broadcast {dt:?} {kind:?}"),
                Box::new(move |w| broadcast(w, dt, kind)),
            ));
        }
        for dt in [I32, F64] {
            v.push((
                format!("reduce {dt:?} {kind:?}"),
                Box::new(move |w| reduce(w, dt, kind)),
            ));
            v.push((
                format!("all_reduce {dt:?} {kind:?}"),
                Box::new(move |w| all_reduce(w, dt, kind)),
            ));
            v.push((
                format!("all_reduce_in_place {dt:?} {kind:?}"),
                Box::new(move |w| all_reduce_in_place(w, dt, kind)),
            ));
        }
        let ops: [(&str, KindOp); 14] = [
            ("send/recv", blocking_pair),
            ("nonblocking", nonblocking_ring),
            ("nonblocking tensors", nonblocking_tensor_ring),
            ("broadcast_tensor_from", broadcast_from_shared),
            ("gather", gather),
            ("gatherv", gatherv),
            ("scatter", scatter),
            ("scatterv", scatterv),
            ("all_gather", all_gather),
            ("all_gatherv", all_gatherv),
            ("all_to_all", all_to_all),
            ("all_to_allv", all_to_allv),
            ("reduce_scatter_block", reduce_scatter_block),
            ("mixed layouts", mixed_layouts),
        ];
        for (name, f) in ops {
            v.push((format!("{name} {kind:?}"), Box::new(move |w| f(w, kind))));
        }
        v.extend(nonblocking::cases(kind));
    }
    let named: [(&str, Named); 17] = [
        ("c02_v0_and_v1_deliver", c02_v0_and_v1_deliver),
        ("c06_zero_d", c06_zero_d),
        ("c07_zero_size", c07_zero_size),
        (
            "c21_to_c25_strided_sends_into_guarded_receives",
            c21_to_c25_strided_sends_into_guarded_receives,
        ),
        (
            "c26_broadcast_receive_refused_untouched",
            c26_broadcast_receive_refused_untouched,
        ),
        ("c27_byte_offset", c27_byte_offset),
        ("c30_bool", c30_bool),
        ("c31_half_bits", c31_half_bits),
        ("c32_complex64", c32_complex64),
        ("c33_lanes", c33_lanes),
        ("c40_read_only_send", c40_read_only_send),
        (
            "c41_c42_refused_receives_untouched",
            c41_c42_refused_receives_untouched,
        ),
        ("c43_size_mismatch", c43_size_mismatch),
        ("c44_allgatherv_zero_count", c44_allgatherv_zero_count),
        ("c45_blocks_past_the_tensor", c45_blocks_past_the_tensor),
        ("layouts_have_holes", layouts_have_holes),
        ("guards_catch_stray_writes", guards_catch_stray_writes),
    ];
    for (name, f) in named {
        v.push((name.to_string(), Box::new(f)));
    }
    v
}

/// The harness itself: strided layouts really leave holes for the guards to watch, and
/// each kind is what it says.
fn layouts_have_holes(_w: &SimpleCommunicator) -> Outcome {
    let step = layout(Kind::Step, 3);
    ensure!(
        step.storage == 5 && step.index == [0, 2, 4],
        "step: {step:?}"
    );
    let neg = layout(Kind::Negative, 3);
    ensure!(
        neg.first == 2 && neg.index == [2, 1, 0],
        "negative: {neg:?}"
    );
    let f = layout(Kind::Fortran, 6);
    ensure!(f.index == [0, 2, 4, 1, 3, 5], "fortran: {f:?}");
    let t = layout(Kind::Transposed, 8);
    ensure!(t.index == [0, 1, 4, 5, 2, 3, 6, 7], "transposed: {t:?}");
    let ns = layout(Kind::NegativeStep2d, 4);
    ensure!(
        ns.storage == 7 && ns.index == [4, 6, 0, 2],
        "negative step: {ns:?}"
    );
    ensure!(layout(Kind::ZeroD, 1).shape.is_empty(), "0-d");
    ensure!(layout(Kind::ZeroSize, 0).storage == 0, "zero-size");
    Ok(())
}

/// The checks themselves: a write one byte before the storage, into a hole of a strided
/// layout, or one element too many is caught; a correct receive passes.
fn guards_catch_stray_writes(_w: &SimpleCommunicator) -> Outcome {
    let e = I32.elem_bytes();
    // (byte to corrupt, relative to the storage start) for a step layout of 3 elements.
    for (at, what) in [(-1isize, "guard before"), (4, "hole"), (20, "guard after")] {
        let mut c = Canary::new(I32, Kind::Step, 3, |_| STALE);
        drop(c.tensor(0));
        let b = (GUARD_BYTES as isize + at) as usize;
        as_bytes_mut(&mut c.words)[b] ^= 0xff;
        ensure!(c.untouched().is_err(), "{what}: untouched() missed it");
        ensure!(
            c.received(|_| STALE).is_err(),
            "{what}: received() missed it"
        );
    }
    let mut c = Canary::new(I32, Kind::Negative, 3, |i| i as i64);
    drop(c.tensor(0));
    let b = GUARD_BYTES + 2 * e;
    as_bytes_mut(&mut c.words)[b..b + e].copy_from_slice(&I32.encode(9));
    ensure!(
        c.received(|i| if i == 0 { 9 } else { i as i64 }).is_ok(),
        "first element of a negative layout is the last storage element"
    );
    ensure!(c.untouched().is_err(), "changed element not seen");
    Ok(())
}

/// The suite `canaries` (see the binary's `main`).
pub fn run(w: &SimpleCommunicator, filter: &[String]) -> harness::End {
    if w.rank() == 0 {
        println!("running canary cases at {} rank(s)", w.size());
    }
    // Every case under each packing policy (or only the one DLPACK_MPI_PACKING names).
    let policies = match dlpack_mpi::settings::parse_packing(
        std::env::var(dlpack_mpi::settings::PACKING_ENV)
            .ok()
            .as_deref(),
    ) {
        Ok(Some(p)) => vec![p],
        _ => vec![Packing::Auto, Packing::DerivedDatatype, Packing::Copy],
    };
    let (mut passed, mut failed) = (0, 0);
    for policy in policies {
        dlpack_mpi::settings::set_packing(policy);
        if w.rank() == 0 {
            println!("packing policy {policy:?}");
        }
        let (p, f) = harness::run_cases(w, cases(), filter, |case| case(w));
        (passed, failed) = (passed + p, failed + f);
    }
    harness::report(w, passed, failed);
    harness::End::Ran { passed, failed }
}
