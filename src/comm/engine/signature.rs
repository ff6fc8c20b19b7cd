//! What MPI requires to match across the ranks of one collective ([`Signature`]), and its
//! fingerprint, which the agreement ([`super::agree`]) compares at no extra message.
//!
//! MPI-4.1 §6.1: "the type signature of the data sent must match the type signature of the
//! data received", the root and the reduction operator must be the same on every rank, and
//! every rank must call the same collectives in the same order; a program that breaks this
//! is erroneous and MPI need not detect it (it hangs, aborts with `MPI_ERR_TRUNCATE`, or
//! returns wrong data). Each collective of [`crate::comm`] declares its signature: the
//! operation, the root, the element type, the element count where the operation requires
//! equal counts, the reduction operator (for float16 and bfloat16 also its form: MPI's own
//! datatype or this crate's operations, by `DLPACK_MPI_HALF_OPS`, since the two are
//! different datatypes on the wire's type signature), and the per-rank counts where every rank passes the
//! same array (all-gatherv's). The agreement's one all-reduce carries its 64-bit
//! fingerprint, so a signature that differs on any rank is an error on every rank
//! ([`crate::Error::CollectiveMismatch`]) before any rank enters the data operation.
//!
//! A collective added later declares its signature the same way in its body (the name,
//! then what must match): a nonblocking form the same signature as its blocking one, a
//! fused form over a list of tensors also the list (member count, each member's dtype and
//! element count, in order), so that lists that differ in length or in one member's shape
//! are a mismatch too.
//!
//! What a fingerprint cannot see: arguments MPI relates across ranks in other ways (the
//! send counts of an all-to-allv against the peers' receive counts, a gatherv's send count
//! or a scatterv's receive count against the root's array, displacements, which are local), two ranks that call the same
//! collective with identical arguments from different places in the program, a collective
//! shared with ranks that do not use dlpack-mpi (they do not join the agreement; where
//! MPI reports the conflict it is [`crate::Error::OutOfStep`]). The form of the call
//! (blocking or nonblocking) and its place in the communicator's order are not part of
//! the signature: the agreement mixes them into the fingerprint it votes on.

use std::fmt::Write as _;
use std::rc::Rc;

use mpi::topology::Rank;

use super::halfops;
use crate::dlpack::Tensor;
use crate::dtype::{code, DType, ReduceOp};

/// What must match across ranks for one collective call (MPI-4.1 §6.1); counts in DLPack
/// elements.
#[derive(Debug, Clone)]
pub(crate) struct Signature<'a> {
    /// The collective, named as [`crate::comm`]'s method without `_tensor`
    /// (`all_reduce`, `broadcast`, …): declared by the operation's body, so that a new
    /// collective needs no entry anywhere else.
    op: &'static str,
    root: Option<Rank>,
    dtype: Option<DType>,
    count: Option<i64>,
    reduce: Option<ReduceOp>,
    counts: Option<&'a [i64]>,
    /// A fused collective's list: its member count and the hash of each member's dtype and
    /// element count, in order.
    members: Option<(usize, u64)>,
    /// The same list in words for the error path: each member's dtype word, rank and shape.
    list: Option<Rc<[i64]>>,
    /// A fused collective's bucket sizes (first, others; bytes): they decide its messages.
    buckets: Option<(usize, usize)>,
    /// The half dtypes among the element types (bit 0 float16, bit 1 bfloat16): a reduction
    /// of them also declares how it reduces them ([`halfops::reduces_natively`]: MPI's own
    /// datatype or this crate's operations on `MPI_UINT16_T`, by `DLPACK_MPI_HALF_OPS`),
    /// since ranks that differ there pass different datatypes (MPICH: `MPI_ERR_TRUNCATE`).
    halves: u8,
    /// A plan's buckets are device buckets (a device list on a `DeviceComm`): they carry no
    /// identity, so their messages differ in size from a host list's.
    device: bool,
    /// A plan's settings that every rank must share (`DLPACK_MPI_PLAN_MECHANISM`, `…_CHECK`),
    /// in words; and a step's plan, by its ordinal among its communicator's plans.
    plan: Option<&'static str>,
    ordinal: Option<u64>,
}

/// The half dtypes a [`Signature`] can carry, with their bit in `halves`.
const HALVES: [(DType, u8); 2] = [
    (DType::new(code::FLOAT, 16), 1),
    (DType::new(code::BFLOAT, 16), 2),
];

/// The bit of `d` in [`Signature`]'s `halves` (0 when it is not half).
fn half_bit(d: DType) -> u8 {
    HALVES
        .iter()
        .find(|(h, _)| *h == d)
        .map_or(0, |&(_, bit)| bit)
}

impl<'a> Signature<'a> {
    /// The signature of the collective `op` (its name) with nothing declared yet.
    pub(crate) fn of(op: &'static str) -> Self {
        Signature {
            op,
            root: None,
            dtype: None,
            count: None,
            reduce: None,
            counts: None,
            members: None,
            list: None,
            buckets: None,
            halves: 0,
            device: false,
            plan: None,
            ordinal: None,
        }
    }

    /// The signature of the collective `op` whose every rank passes `tensor`'s dtype and
    /// element count ([`Signature::dtype`], [`Signature::count`]).
    pub(crate) fn of_tensor(op: &'static str, tensor: &dyn Tensor) -> Self {
        Signature::of(op)
            .dtype(tensor.dtype())
            .count(tensor.num_elements())
    }

    /// The root every rank must name.
    pub(crate) fn root(mut self, root: Rank) -> Self {
        self.root = Some(root);
        self
    }

    /// The element type every rank's buffers must have.
    pub(crate) fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = Some(dtype);
        self.halves |= half_bit(dtype);
        self
    }

    /// The element count every rank must pass (the operation requires equal counts).
    pub(crate) fn count(mut self, count: i64) -> Self {
        self.count = Some(count);
        self
    }

    /// The reduction operator every rank must pass.
    pub(crate) fn reduce(mut self, op: ReduceOp) -> Self {
        self.reduce = Some(op);
        self
    }

    /// The per-rank counts every rank must pass (the same array on each).
    pub(crate) fn counts(mut self, counts: &'a [i64]) -> Self {
        self.counts = Some(counts);
        self
    }

    /// A plan over a device list's buckets (see the field): ranks whose lists differ there
    /// would send messages of different sizes.
    pub(crate) fn device_buckets(mut self, device: bool) -> Self {
        self.device = device;
        self
    }

    /// A plan's settings in words (`mechanism persistent`, `checked at each step`; empty
    /// for the defaults): ranks that differ there would make different MPI calls per step.
    pub(crate) fn plan_settings(mut self, words: &'static str) -> Self {
        self.plan = Some(words);
        self
    }

    /// A step of the plan built `ordinal`-th on its communicator: two plans of the same
    /// lists differ by it ([`crate::settings::PlanCheck::Each`] names a step of one against
    /// a step of the other).
    pub(crate) fn plan_ordinal(mut self, ordinal: u64) -> Self {
        self.ordinal = Some(ordinal);
        self
    }

    /// A fused collective's bucket sizes (bytes): ranks that bucket differently would send
    /// different messages.
    pub(crate) fn buckets(mut self, first: usize, rest: usize) -> Self {
        self.buckets = Some((first, rest));
        self
    }

    /// A fused collective's list of members, `(dtype, shape)` each, in order: lists that
    /// differ in length, order or one member's dtype or element count differ in
    /// fingerprint (the shapes are kept for the words of the error path only).
    pub(crate) fn members<'s>(
        mut self,
        list: impl IntoIterator<Item = (DType, &'s [i64])>,
    ) -> Self {
        let mut h = Fnv::new();
        let mut n = 0usize;
        let mut words = Vec::new();
        for (d, shape) in list {
            let c = shape.iter().product::<i64>();
            h.word(dtype_word(d));
            h.word(bits(c));
            self.halves |= half_bit(d);
            n += 1;
            words.push(i64::from_ne_bytes(dtype_word(d).to_ne_bytes()));
            words.push(i64::try_from(shape.len()).unwrap_or(i64::MAX));
            words.extend_from_slice(shape);
        }
        self.members = Some((n, h.0));
        self.list = Some(words.into());
        self
    }

    /// A fused collective's members, dtype and shape each, in order (`None` for another
    /// collective).
    pub(crate) fn member_list(&self) -> Option<Vec<(DType, Vec<i64>)>> {
        let words = self.list.as_deref()?;
        let mut out = Vec::new();
        let mut i = 0;
        while i + 1 < words.len() {
            let w = u64::from_ne_bytes(words[i].to_ne_bytes());
            let d = DType {
                code: (w & 0xff) as u8,
                bits: (w >> 8 & 0xff) as u8,
                lanes: (w >> 16 & 0xffff) as u16,
            };
            let ndim = usize::try_from(words[i + 1]).unwrap_or(0);
            let end = (i + 2 + ndim).min(words.len());
            out.push((d, words[i + 2..end].to_vec()));
            i = end;
        }
        Some(out)
    }

    /// The half dtypes of a reduction, each with whether it reduces through MPI's own
    /// datatype; empty unless the signature declares a reduction.
    fn half_forms(&self) -> impl Iterator<Item = (DType, bool)> + '_ {
        HALVES.iter().filter_map(move |&(d, bit)| {
            let op = self.reduce.filter(|_| self.halves & bit != 0)?;
            Some((d, halfops::reduces_natively(d, op)))
        })
    }

    /// The 64-bit FNV-1a hash of the signature, as the `i64` the agreement reduces.
    pub(crate) fn fingerprint(&self) -> i64 {
        let mut h = Fnv::new();
        self.op.bytes().for_each(|b| h.word(u64::from(b)));
        h.opt(self.root.map(|r| bits(i64::from(r))));
        h.opt(self.dtype.map(dtype_word));
        h.opt(self.count.map(bits));
        h.opt(self.reduce.map(|r| r as u64));
        match self.counts {
            Some(list) => {
                h.word(1 + list.len() as u64);
                list.iter().for_each(|&c| h.word(bits(c)));
            }
            None => h.word(0),
        }
        h.opt(self.members.map(|(n, list)| list ^ (n as u64)));
        h.opt(
            self.buckets
                .map(|(f, r)| (f as u64).rotate_left(32) ^ r as u64),
        );
        for (d, native) in self.half_forms() {
            h.word(dtype_word(d) << 1 | u64::from(native));
        }
        if self.device {
            h.word(0xde71ce);
        }
        if let Some(words) = self.plan {
            words.bytes().for_each(|b| h.word(u64::from(b)));
        }
        h.opt(self.ordinal);
        i64::from_ne_bytes(h.0.to_ne_bytes())
    }

    /// The signature in words: `all_reduce float32 × 1000 sum`, `broadcast float32 × 1000
    /// root 0`, `all_gatherv float32 counts [2, 1, 3]`.
    pub(crate) fn describe(&self) -> String {
        let mut s = self.op.to_string();
        if let Some(d) = self.dtype {
            let _ = write!(s, " {d}");
        }
        if let Some(c) = self.count {
            let _ = write!(s, " × {c}");
        }
        if let Some(r) = self.reduce {
            let _ = write!(s, " {r}");
        }
        if let Some(r) = self.root {
            let _ = write!(s, " root {r}");
        }
        if let Some(list) = self.counts {
            const SHOWN: usize = 16;
            let head: Vec<String> = list.iter().take(SHOWN).map(i64::to_string).collect();
            let more = if list.len() > SHOWN { ", …" } else { "" };
            let _ = write!(s, " counts [{}{more}]", head.join(", "));
        }
        if let Some((n, _)) = self.members {
            let noun = if n == 1 { "member" } else { "members" };
            let _ = write!(s, " {n} {noun}");
        }
        if let Some((f, r)) = self.buckets {
            let _ = write!(s, " buckets {f}/{r} B");
        }
        if self.device {
            s.push_str(" in device memory");
        }
        if let Some(words) = self.plan.filter(|w| !w.is_empty()) {
            let _ = write!(s, " {words}");
        }
        if let Some(n) = self.ordinal {
            let _ = write!(s, " (the communicator's plan number {n})");
        }
        for (d, native) in self.half_forms() {
            let how = if native {
                "MPI's own datatype"
            } else {
                "dlpack-mpi's operations"
            };
            let _ = write!(s, " ({d} by {how})");
        }
        s
    }
}

/// A dtype as one word.
fn dtype_word(d: DType) -> u64 {
    u64::from(d.code) | u64::from(d.bits) << 8 | u64::from(d.lanes) << 16
}

/// The two's-complement bits of `x`.
fn bits(x: i64) -> u64 {
    u64::from_ne_bytes(x.to_ne_bytes())
}

/// 64-bit FNV-1a over words (little-endian bytes).
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn word(&mut self, w: u64) {
        for b in w.to_le_bytes() {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    /// A field that may be absent, so that "absent" and "0" hash apart.
    fn opt(&mut self, w: Option<u64>) {
        match w {
            Some(w) => {
                self.word(1);
                self.word(w);
            }
            None => self.word(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    #[test]
    fn every_declared_field_changes_the_fingerprint() {
        let f32 = DType::new(2, 32);
        let base = Signature::of("all_reduce")
            .dtype(f32)
            .count(1000)
            .reduce(ReduceOp::Sum);
        let fp = base.fingerprint();
        assert_eq!(fp, base.fingerprint(), "deterministic");
        let others = [
            base.clone().count(1001),
            base.clone().dtype(DType::new(2, 64)),
            base.clone().reduce(ReduceOp::Max),
            base.clone().root(0),
            Signature::of("broadcast")
                .dtype(f32)
                .count(1000)
                .reduce(ReduceOp::Sum),
            Signature::of("all_reduce").dtype(f32).count(1000),
        ];
        for o in others {
            assert_ne!(o.fingerprint(), fp, "{}", o.describe());
        }
        let c1 = [2i64, 1, 3];
        let c2 = [1i64, 2, 3];
        let v = Signature::of("all_gatherv").dtype(f32);
        assert_ne!(
            v.clone().counts(&c1).fingerprint(),
            v.clone().counts(&c2).fingerprint()
        );
        assert_eq!(
            v.clone().counts(&c1).fingerprint(),
            v.counts(&[2, 1, 3]).fingerprint()
        );
        // a root of 0 is not an absent root
        let b = Signature::of("broadcast");
        assert_ne!(b.clone().root(0).fingerprint(), b.fingerprint());
    }

    #[test]
    fn descriptions_name_what_differs() {
        let f32 = DType::new(2, 32);
        let s = Signature::of("all_reduce")
            .dtype(f32)
            .count(1000)
            .reduce(ReduceOp::Sum);
        assert_eq!(s.describe(), "all_reduce float32 × 1000 sum");
        let b = Signature::of("broadcast").dtype(f32).count(1000).root(0);
        assert_eq!(b.describe(), "broadcast float32 × 1000 root 0");
        let v = Signature::of("all_gatherv").dtype(f32).counts(&[2, 1, 3]);
        assert_eq!(v.describe(), "all_gatherv float32 counts [2, 1, 3]");
    }

    #[test]
    fn half_reductions_say_how_they_reduce() {
        let (f16, bf16) = (DType::new(code::FLOAT, 16), DType::new(code::BFLOAT, 16));
        let form = |d: DType, op| {
            if halfops::reduces_natively(d, op) {
                "MPI's own datatype"
            } else {
                "dlpack-mpi's operations"
            }
        };
        let s = Signature::of("all_reduce")
            .dtype(f16)
            .count(8)
            .reduce(ReduceOp::Sum);
        let want = format!(
            "all_reduce float16 × 8 sum (float16 by {})",
            form(f16, ReduceOp::Sum)
        );
        assert_eq!(s.describe(), want);
        // Not a reduction, or not half: nothing to say.
        let b = Signature::of("broadcast").dtype(f16).count(8).root(0);
        assert_eq!(b.describe(), "broadcast float16 × 8 root 0");
        let f = Signature::of("all_reduce")
            .dtype(DType::new(code::FLOAT, 32))
            .reduce(ReduceOp::Max);
        assert_eq!(f.describe(), "all_reduce float32 max");
        // A fused list names each half dtype among its members, in a fixed order.
        let list = Signature::of("fused_all_reduce")
            .members([
                (bf16, &[3][..]),
                (DType::new(code::FLOAT, 32), &[2][..]),
                (f16, &[1][..]),
            ])
            .reduce(ReduceOp::Max);
        assert!(
            list.describe().ends_with(&format!(
                "3 members (float16 by {}) (bfloat16 by {})",
                form(f16, ReduceOp::Max),
                form(bf16, ReduceOp::Max)
            )),
            "{}",
            list.describe()
        );
    }
}
