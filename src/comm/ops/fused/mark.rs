//! A plan step's identity, carried with its data (issue 32): a few spare elements at the end
//! of the plan's first packed bucket, reduced or broadcast with it by the same MPI call, so
//! that a step that meets another plan's step (or a refused step) is seen at no extra
//! message.
//!
//! What the spare elements hold, and what each rank sees (`ranks` ranks, `f₀ … f₇` the eight
//! 4-bit digits of the plan's identity, each plus one, so `1 ≤ fⱼ ≤ 16`):
//!
//! | bucket | spare elements | a rank sees a mismatch when |
//! | --- | --- | --- |
//! | all-reduce `Sum`, int/uint 8–64 bits or float32/64 | `f₀ … f₇` | some sum is not `ranks × fⱼ` (modulo 2^bits for integers): exact at 2 ranks, every rank sees it |
//! | all-reduce `Max` or `Min`, the same dtypes | `fⱼ, 17 − fⱼ` for each j | some result is not `fⱼ` or `17 − fⱼ`: every rank sees any difference |
//! | broadcast, any dtype | the identity's 8 bytes (padded to whole elements) | the root's bytes differ from this rank's (the root sees nothing) |
//! | other reductions (`Product`, logical, bitwise), half precision, complex, bool, reduce-scatter | none | — |
//!
//! A refused step (its tensors changed, [`crate::Error::PlanChanged`]) writes digits 0 (and
//! 17 for the second of a pair), which no identity has, and a refused root broadcasts zero
//! bytes.

use super::FusedKind;
use crate::dtype::{code, DType, ReduceOp};

/// Digits of the identity carried (4 bits each: the identity's low 32 bits).
const DIGITS: usize = 8;

/// How a bucket carries the identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scheme {
    /// Each digit, summed over the ranks.
    Sum,
    /// Each digit and its complement to 17 (their maximum or minimum over the ranks is
    /// each rank's own only when all are equal).
    Span,
    /// The identity's bytes, the root's broadcast.
    Root,
}

/// The identity carried by a plan's first packed bucket: where, how, and what this step
/// found.
#[derive(Debug, Clone)]
pub(super) struct Mark {
    /// The bucket and the first byte of the spare elements in its buffer.
    pub(super) bucket: usize,
    pub(super) at: usize,
    scheme: Scheme,
    dtype: DType,
    elem_bytes: usize,
    ranks: i32,
    /// A broadcast's root (it receives nothing, so sees nothing).
    root: bool,
    /// The identity written at the last `write`.
    id: u64,
}

/// Whether `dtype` carries digits exactly (integers of 8 to 64 bits, float32 and float64).
fn numeric(dtype: DType) -> bool {
    dtype.lanes == 1
        && match dtype.code {
            code::INT | code::UINT => matches!(dtype.bits, 8 | 16 | 32 | 64),
            code::FLOAT => matches!(dtype.bits, 32 | 64),
            _ => false,
        }
}

/// The bytes of spare elements a bucket of `kind` over `dtype` (elements of `elem_bytes`)
/// carries, and how (`None`: it cannot carry the identity).
fn scheme(kind: FusedKind, dtype: DType, elem_bytes: usize) -> Option<(Scheme, usize)> {
    let elem = elem_bytes.max(1);
    match kind {
        FusedKind::Broadcast(_) => Some((Scheme::Root, 8usize.div_ceil(elem) * elem)),
        FusedKind::AllReduce(ReduceOp::Sum) if numeric(dtype) => Some((Scheme::Sum, DIGITS * elem)),
        FusedKind::AllReduce(ReduceOp::Max | ReduceOp::Min) if numeric(dtype) => {
            Some((Scheme::Span, 2 * DIGITS * elem))
        }
        _ => None,
    }
}

/// Digit `j` of `id`, plus one (1..=16); 0 for a refused step.
fn digit(id: u64, j: usize, refused: bool) -> u64 {
    if refused {
        0
    } else {
        ((id >> (4 * j)) & 15) + 1
    }
}

impl Mark {
    /// The mark of bucket `bucket` of `kind`, whose members take `at` bytes of `dtype`
    /// elements (`elem_bytes` each) among `ranks` ranks (`root`: this rank is a
    /// broadcast's root), and the spare bytes it adds; `None` where the bucket cannot carry
    /// it.
    pub(super) fn new(
        kind: FusedKind,
        (dtype, elem_bytes): (DType, usize),
        (bucket, at): (usize, usize),
        (ranks, root): (i32, bool),
    ) -> Option<(Mark, usize)> {
        let (scheme, bytes) = scheme(kind, dtype, elem_bytes)?;
        let mark = Mark {
            bucket,
            at,
            scheme,
            dtype,
            elem_bytes,
            ranks,
            root,
            id: 0,
        };
        Some((mark, bytes))
    }

    /// What a mismatch of this mark is, in words (for [`crate::comm::Plan::checks`]).
    pub(super) fn words(&self) -> &'static str {
        match self.scheme {
            Scheme::Sum => "the identity summed with the first packed bucket (every rank sees a different plan)",
            Scheme::Span => "the identity and its complement reduced with the first packed bucket (every rank sees a different plan)",
            Scheme::Root => "the root's identity broadcast with the first packed bucket (the other ranks see a different plan; the root sees nothing)",
        }
    }

    /// Writes the identity `id` (or a refusal's digits) into `spare`, the bucket's spare
    /// bytes.
    pub(super) fn write(&mut self, spare: &mut [u8], id: u64, refused: bool) {
        self.id = id;
        match self.scheme {
            Scheme::Root => {
                spare.fill(0);
                if !refused {
                    spare[..8].copy_from_slice(&id.to_ne_bytes());
                }
            }
            Scheme::Sum => {
                for j in 0..DIGITS {
                    self.put(spare, j, digit(id, j, refused));
                }
            }
            Scheme::Span => {
                for j in 0..DIGITS {
                    let f = digit(id, j, refused);
                    self.put(spare, 2 * j, f);
                    self.put(spare, 2 * j + 1, 17 - f);
                }
            }
        }
    }

    /// After the bucket landed: `None` when `spare` holds what every rank running this
    /// plan's step would leave there, else what this rank saw, in words.
    pub(super) fn verify(&self, spare: &[u8]) -> Option<String> {
        let ranks = u64::try_from(self.ranks).unwrap_or(1);
        let mut seen: Option<String> = None;
        let mut check = |k: usize, want: u64| {
            let got = self.get(spare, k);
            if got != Some(want) && seen.is_none() {
                seen = Some(format!(
                    "its identity, {}, came back as {} where the same plan on every rank \
                     leaves {want} (spare element {k})",
                    self.words(),
                    got.map_or_else(|| "a value no rank wrote".to_string(), |g| g.to_string()),
                ));
            }
        };
        match self.scheme {
            Scheme::Root if self.root => return None,
            Scheme::Root => {
                let mut bytes = [0u8; 8];
                bytes.copy_from_slice(&spare[..8]);
                let got = u64::from_ne_bytes(bytes);
                return (got != self.id).then(|| {
                    format!(
                        "the root broadcast plan identity {got:#018x}, this rank's is {:#018x} \
                         (0: the root's step was refused)",
                        self.id
                    )
                });
            }
            Scheme::Sum => {
                for j in 0..DIGITS {
                    check(j, self.wrap(ranks * digit(self.id, j, false)));
                }
            }
            Scheme::Span => {
                for j in 0..DIGITS {
                    let f = digit(self.id, j, false);
                    check(2 * j, f);
                    check(2 * j + 1, 17 - f);
                }
            }
        }
        seen
    }

    /// `v` modulo 2^bits for an integer dtype (MPI's integer sums wrap).
    fn wrap(&self, v: u64) -> u64 {
        match self.dtype.code {
            code::INT | code::UINT if self.dtype.bits < 64 => v & ((1u64 << self.dtype.bits) - 1),
            _ => v,
        }
    }

    /// Writes the small value `v` into spare element `k`.
    fn put(&self, spare: &mut [u8], k: usize, v: u64) {
        let at = k * self.elem_bytes;
        let out = &mut spare[at..at + self.elem_bytes];
        match (self.dtype.code, self.dtype.bits) {
            // v ≤ 17·ranks fits f32's 24-bit significand exactly for any sane rank count;
            // the writes are of digits ≤ 17.
            #[allow(clippy::cast_precision_loss)]
            (code::FLOAT, 32) => out.copy_from_slice(&(v as f32).to_ne_bytes()),
            #[allow(clippy::cast_precision_loss)]
            (code::FLOAT, _) => out.copy_from_slice(&(v as f64).to_ne_bytes()),
            _ => {
                let bytes = v.to_ne_bytes();
                if cfg!(target_endian = "little") {
                    out.copy_from_slice(&bytes[..self.elem_bytes]);
                } else {
                    out.copy_from_slice(&bytes[8 - self.elem_bytes..]);
                }
            }
        }
    }

    /// Spare element `k` as a whole number (`None`: a float that is not one); integers
    /// as their low `bits` bits.
    fn get(&self, spare: &[u8], k: usize) -> Option<u64> {
        let at = k * self.elem_bytes;
        let raw = &spare[at..at + self.elem_bytes];
        let whole = |x: f64| {
            // Checked whole and in range before the cast.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let v = x as u64;
            (x >= 0.0 && x.fract() == 0.0 && x < 1e15).then_some(v)
        };
        match (self.dtype.code, self.dtype.bits) {
            (code::FLOAT, 32) => whole(f64::from(f32::from_ne_bytes(raw.try_into().ok()?))),
            (code::FLOAT, _) => whole(f64::from_ne_bytes(raw.try_into().ok()?)),
            _ => {
                let mut bytes = [0u8; 8];
                if cfg!(target_endian = "little") {
                    bytes[..self.elem_bytes].copy_from_slice(raw);
                } else {
                    bytes[8 - self.elem_bytes..].copy_from_slice(raw);
                }
                Some(self.wrap(u64::from_ne_bytes(bytes)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spare elements of `n` ranks' marks, combined as MPI would (`f`: element-wise).
    fn combine(mark: &Mark, ids: &[(u64, bool)], f: impl Fn(u64, u64) -> u64) -> Vec<u8> {
        let len = match mark.scheme {
            Scheme::Sum => DIGITS,
            Scheme::Span => 2 * DIGITS,
            Scheme::Root => 8usize.div_ceil(mark.elem_bytes),
        } * mark.elem_bytes;
        let mut m = mark.clone();
        let mut out = vec![0u8; len];
        let mut acc: Option<Vec<u64>> = None;
        for &(id, refused) in ids {
            let mut spare = vec![0u8; len];
            m.write(&mut spare, id, refused);
            let vals: Vec<u64> = (0..len / m.elem_bytes)
                .map(|k| m.get(&spare, k).unwrap())
                .collect();
            acc = Some(match acc {
                None => vals,
                Some(a) => a.iter().zip(&vals).map(|(&x, &y)| f(x, y)).collect(),
            });
        }
        for (k, v) in acc.unwrap().into_iter().enumerate() {
            m.put(&mut out, k, v);
        }
        out
    }

    fn mark(kind: FusedKind, dtype: DType, ranks: i32) -> Mark {
        let elem = usize::from(dtype.bits / 8);
        Mark::new(kind, (dtype, elem), (0, 0), (ranks, false))
            .unwrap()
            .0
    }

    /// A sum of equal identities verifies on every rank; one differing digit, or one
    /// refused rank, does not (int8 wraps; float32 is exact).
    #[test]
    fn sums_find_a_different_identity() {
        for dtype in [
            DType::new(code::INT, 8),
            DType::new(code::FLOAT, 32),
            DType::new(code::UINT, 64),
        ] {
            let mut m = mark(FusedKind::AllReduce(ReduceOp::Sum), dtype, 3);
            let id = 0x1234_5678_9abc_def0;
            m.id = id;
            let same = combine(&m, &[(id, false); 3], u64::wrapping_add);
            assert_eq!(m.verify(&same), None, "{dtype:?}");
            let other = combine(
                &m,
                &[(id, false), (id ^ 0x10, false), (id, false)],
                u64::wrapping_add,
            );
            assert!(m.verify(&other).is_some(), "{dtype:?}");
            let refused = combine(
                &m,
                &[(id, false), (id, true), (id, false)],
                u64::wrapping_add,
            );
            assert!(
                m.verify(&refused).unwrap().contains("came back as"),
                "{dtype:?}"
            );
        }
    }

    /// Max and min of a digit and its complement are every rank's own only when all are
    /// equal.
    #[test]
    fn spans_find_any_difference() {
        for (op, f) in [
            (ReduceOp::Max, u64::max as fn(u64, u64) -> u64),
            (ReduceOp::Min, u64::min),
        ] {
            let mut m = mark(FusedKind::AllReduce(op), DType::new(code::INT, 32), 4);
            m.id = 77;
            assert_eq!(m.verify(&combine(&m, &[(77, false); 4], f)), None);
            let ids = [(77, false), (77, false), (78, false), (77, false)];
            assert!(m.verify(&combine(&m, &ids, f)).is_some());
            let ids = [(77, false), (77, true), (77, false), (77, false)];
            assert!(m.verify(&combine(&m, &ids, f)).is_some());
        }
    }

    /// A broadcast's non-root compares the root's bytes with its own; the root sees
    /// nothing; products, bool and half precision carry no mark.
    #[test]
    fn broadcast_compares_the_roots_identity() {
        let dtype = DType::new(code::UINT, 8);
        let (mut m, bytes) =
            Mark::new(FusedKind::Broadcast(0), (dtype, 1), (0, 0), (2, false)).unwrap();
        assert_eq!(bytes, 8);
        let mut spare = vec![0u8; 8];
        m.write(&mut spare, 5, false);
        assert_eq!(m.verify(&spare), None);
        m.write(&mut [0u8; 8], 6, false);
        assert!(m.verify(&spare).unwrap().contains("0x0000000000000005"));
        let half = DType::new(code::FLOAT, 16);
        let bool8 = DType::new(code::BOOL, 8);
        for (kind, dtype) in [
            (
                FusedKind::AllReduce(ReduceOp::Product),
                DType::new(code::INT, 32),
            ),
            (FusedKind::AllReduce(ReduceOp::Sum), half),
            (FusedKind::AllReduce(ReduceOp::Max), bool8),
            (
                FusedKind::ReduceScatter(ReduceOp::Sum, 2),
                DType::new(code::INT, 32),
            ),
        ] {
            assert!(Mark::new(kind, (dtype, 2), (0, 0), (2, false)).is_none());
        }
    }
}
