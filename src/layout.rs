//! Pure stride arithmetic: element counts, contiguity, overlap, byte spans and element ranges.
//!
//! No `unsafe`, no pointers, no MPI: every function takes shapes and strides as slices of
//! `i64` **in elements** (DLPack: "strides of the tensor (in number of elements, not bytes)")
//! and returns plain numbers or an [`Error`] that names the axis and values. All arithmetic
//! is checked; an overflow is [`Error::Overflow`], never a wrap or a panic.

use crate::error::{Error, Result};

fn overflow(
    quantity: &'static str,
    lhs: impl Into<i128>,
    op: &'static str,
    rhs: impl Into<i128>,
) -> Error {
    Error::Overflow {
        quantity,
        lhs: lhs.into(),
        operator: op,
        rhs: rhs.into(),
    }
}

/// Number of elements of a tensor of `shape` (1 for a 0-d tensor).
///
/// # Errors
/// [`Error::InvalidTensor`] for a negative extent (field `shape[i]`);
/// [`Error::Overflow`] when the product does not fit `i64`.
#[inline]
pub fn num_elements(shape: &[i64]) -> Result<i64> {
    for (i, &n) in shape.iter().enumerate() {
        if n < 0 {
            return Err(Error::InvalidTensor {
                field: format!("shape[{i}]"),
                value: n.into(),
                reason: "extents must be >= 0",
            });
        }
    }
    // An empty tensor has 0 elements whatever its other extents: check for 0 first so that
    // shape [0, huge, huge] is not an overflow.
    if shape.contains(&0) {
        return Ok(0);
    }
    shape.iter().try_fold(1i64, |acc, &n| {
        acc.checked_mul(n)
            .ok_or_else(|| overflow("element count", acc, "*", n))
    })
}

/// Compact row-major (C-order) strides for `shape`, in elements.
///
/// # Errors
/// [`Error::Overflow`] if a stride does not fit `i64` (only possible for shapes whose element
/// count already overflows).
pub fn compact_strides(shape: &[i64]) -> Result<Vec<i64>> {
    let mut strides = vec![0i64; shape.len()];
    let mut next = 1i64;
    for i in (0..shape.len()).rev() {
        strides[i] = next;
        let extent = shape[i].max(1);
        next = next
            .checked_mul(extent)
            .ok_or_else(|| overflow("compact stride", next, "*", extent))?;
    }
    Ok(strides)
}

/// The strides a layout check has to look at: `None` when there is nothing to check
/// (`strides = None`, compact row-major; or an empty tensor, whatever its strides).
///
/// # Errors
/// [`Error::LengthMismatch`] when `strides` has not one entry per axis.
#[inline]
fn strides_to_check<'s>(shape: &[i64], strides: Option<&'s [i64]>) -> Result<Option<&'s [i64]>> {
    let Some(strides) = strides else {
        return Ok(None);
    };
    check_strides_len(shape, strides)?;
    Ok(Some(strides).filter(|_| !shape.contains(&0)))
}

#[inline]
fn check_strides_len(shape: &[i64], strides: &[i64]) -> Result<()> {
    if shape.len() == strides.len() {
        Ok(())
    } else {
        Err(Error::LengthMismatch {
            what: "strides",
            expected: shape.len(),
            actual: strides.len(),
        })
    }
}

/// Checks that the layout is C-contiguous: the elements, visited in row-major logical order,
/// sit at consecutive element offsets. Axes of extent ≤ 1 are ignored (their stride never
/// moves the address: CASES C20), and an empty tensor is contiguous whatever its strides
/// (C08). `strides = None` means compact row-major (DLPack before v1.2 allowed NULL).
///
/// # Errors
/// [`Error::NonContiguous`] naming the innermost axis whose stride breaks contiguity, its
/// stride and the expected one (elements); [`Error::LengthMismatch`] when `strides` has not
/// one entry per axis.
#[inline]
pub fn check_c_contiguous(shape: &[i64], strides: Option<&[i64]>) -> Result<()> {
    let Some(strides) = strides_to_check(shape, strides)? else {
        return Ok(());
    };
    let mut expected = 1i64;
    for axis in (0..shape.len()).rev() {
        let extent = shape[axis];
        if extent <= 1 {
            continue;
        }
        if strides[axis] != expected {
            return Err(Error::NonContiguous {
                axis,
                stride_elems: strides[axis],
                expected_elems: expected,
            });
        }
        expected = expected
            .checked_mul(extent)
            .ok_or_else(|| overflow("contiguous stride", expected, "*", extent))?;
    }
    Ok(())
}

/// Checks that no two elements of the layout share memory, as a receive buffer requires.
///
/// The test is the classic sufficient condition: with the axes of extent > 1 sorted by
/// `|stride|`, each `|stride|` must exceed the farthest offset the smaller axes reach
/// (`Σ |stride_j| × (extent_j − 1)`). Any layout that fails it is refused, which includes
/// every layout with a stride-0 axis (broadcast, C26) and aliasing strides. C-contiguous and
/// every permutation, step or sign of non-aliasing strides pass.
///
/// # Errors
/// [`Error::Overlap`] naming the axis, extent and stride; [`Error::Overflow`] if the reach
/// does not fit `i64`; [`Error::LengthMismatch`] when `strides` has not one entry per axis.
#[inline]
pub fn check_no_overlap(shape: &[i64], strides: Option<&[i64]>) -> Result<()> {
    let Some(strides) = strides_to_check(shape, strides)? else {
        return Ok(());
    };
    let mut axes: Vec<(usize, i64, i64)> = shape
        .iter()
        .zip(strides)
        .enumerate()
        .filter(|(_, (&n, _))| n > 1)
        .map(|(axis, (&n, &s))| (axis, n, s))
        .collect();
    axes.sort_by_key(|&(_, _, s)| s.unsigned_abs());
    let mut reach: i64 = 0;
    for (axis, extent, stride) in axes {
        let step = i64::try_from(stride.unsigned_abs())
            .map_err(|_| overflow("|stride|", stride, "*", -1))?;
        if step <= reach {
            return Err(Error::Overlap {
                axis,
                extent,
                stride_elems: stride,
            });
        }
        let span = step
            .checked_mul(extent - 1)
            .ok_or_else(|| overflow("stride reach", step, "*", extent - 1))?;
        reach = reach
            .checked_add(span)
            .ok_or_else(|| overflow("stride reach", reach, "+", span))?;
    }
    Ok(())
}

/// Bytes covered by `count_elems` contiguous elements of `elem_size_bytes` each.
///
/// # Errors
/// [`Error::Overflow`] if the product does not fit `usize`.
#[inline]
pub fn byte_span(count_elems: i64, elem_size_bytes: usize) -> Result<usize> {
    usize::try_from(count_elems)
        .ok()
        .and_then(|n| n.checked_mul(elem_size_bytes))
        .ok_or_else(|| overflow("byte span", count_elems, "*", elem_size_bytes as i128))
}

/// Checks an element range `[displacement, displacement + count)` (mpi4py's
/// `(count, displacement)` form) against a tensor of `len` elements.
///
/// # Errors
/// [`Error::OutOfBounds`] naming `what` and the numbers when the range is negative or reaches
/// past `len`.
pub fn check_range(
    what: impl FnOnce() -> String,
    displacement: i64,
    count: i64,
    len: i64,
) -> Result<()> {
    let ok = displacement >= 0
        && count >= 0
        && displacement
            .checked_add(count)
            .is_some_and(|end| end <= len);
    if ok {
        Ok(())
    } else {
        Err(Error::OutOfBounds {
            what: what(),
            displacement,
            count,
            len,
        })
    }
}

/// Checks the blocks of a vector (v-variant) buffer: one `(count, displacement)` per rank,
/// both in elements, each inside a tensor of `len` elements; for a receive buffer
/// (`disjoint = true`) the non-empty blocks must also not overlap (MPI-4.1 §6.5: "the
/// specification of counts, types, and displacements should not cause any location on the
/// root to be written more than once").
///
/// # Errors
/// [`Error::LengthMismatch`] when `counts` or `displacements` does not have `ranks` entries;
/// [`Error::OutOfBounds`] for a block outside the tensor; [`Error::BlocksOverlap`] for two
/// receive blocks that share an element.
pub fn check_blocks(
    counts: &[i64],
    displacements: &[i64],
    ranks: usize,
    len: i64,
    disjoint: bool,
) -> Result<()> {
    if counts.len() != ranks {
        return Err(Error::LengthMismatch {
            what: "counts",
            expected: ranks,
            actual: counts.len(),
        });
    }
    if displacements.len() != ranks {
        return Err(Error::LengthMismatch {
            what: "displacements",
            expected: ranks,
            actual: displacements.len(),
        });
    }
    for (i, (&c, &d)) in counts.iter().zip(displacements).enumerate() {
        check_range(|| format!("block {i}"), d, c, len)?;
    }
    if disjoint {
        let mut blocks: Vec<(i64, i64, usize)> = counts
            .iter()
            .zip(displacements)
            .enumerate()
            .filter(|(_, (&c, _))| c > 0)
            .map(|(i, (&c, &d))| (d, d + c, i))
            .collect();
        blocks.sort_unstable();
        for w in blocks.windows(2) {
            let (s0, e0, i0) = w[0];
            let (s1, _, i1) = w[1];
            if s1 < e0 {
                return Err(Error::BlocksOverlap {
                    first: i0,
                    first_start: s0,
                    first_end: e0,
                    second: i1,
                    second_start: s1,
                });
            }
        }
    }
    Ok(())
}

/// One axis of a [`Plan`]: `extent` elements, `stride_elems` elements apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Axis {
    /// Number of elements along the axis (> 1 in a plan).
    pub extent: i64,
    /// Distance between consecutive elements, in elements (may be 0 or negative).
    pub stride_elems: i64,
}

/// The layout of a tensor reduced to what a derived datatype needs: axes of extent 1
/// dropped, adjacent axes that are contiguous with each other merged (`stride[i] ==
/// stride[i+1] × extent[i+1]`), outermost first. Elements are visited in logical row-major
/// order by iterating the axes as nested loops.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Plan {
    /// Merged axes, outermost first; empty for 0-d, 1-element and empty tensors.
    pub axes: Vec<Axis>,
    /// Number of elements.
    pub len_elems: i64,
    /// Lowest element offset reached, relative to the first element (≤ 0), in elements.
    pub lowest_elem: i64,
    /// Highest element offset reached, relative to the first element (≥ 0), in elements.
    pub highest_elem: i64,
}

impl Plan {
    /// Whether the elements are consecutive in memory in logical order (so `count`
    /// predefined elements describe them).
    pub fn is_contiguous(&self) -> bool {
        match self.axes.as_slice() {
            [] => true,
            [a] => a.stride_elems == 1,
            _ => false,
        }
    }

    /// Element offsets (relative to the first element) in logical row-major order.
    pub fn offsets(&self) -> Offsets<'_> {
        Offsets {
            plan: self,
            index: vec![0; self.axes.len()],
            offset: 0,
            remaining: self.len_elems,
        }
    }
}

/// Iterator over a plan's element offsets, in elements, in logical order.
#[derive(Debug, Clone)]
pub struct Offsets<'p> {
    plan: &'p Plan,
    index: Vec<i64>,
    offset: i64,
    remaining: i64,
}

impl Iterator for Offsets<'_> {
    type Item = i64;

    fn next(&mut self) -> Option<i64> {
        if self.remaining <= 0 {
            return None;
        }
        self.remaining -= 1;
        let current = self.offset;
        if self.remaining == 0 {
            return Some(current);
        }
        // Advance the odometer, innermost axis first. Every offset it lands on is an
        // element's, inside [lowest_elem, highest_elem], and an axis wraps back by its reach
        // `stride × (extent − 1)`: the plan checked both fit i64. (Stepping one stride past
        // the last index first, as this loop once did, overflowed for strides near
        // i64::MAX / extent: found by fuzzing.)
        for (i, axis) in self.plan.axes.iter().enumerate().rev() {
            if self.index[i] + 1 < axis.extent {
                self.index[i] += 1;
                self.offset += axis.stride_elems;
                break;
            }
            self.offset -= axis.stride_elems * (axis.extent - 1);
            self.index[i] = 0;
        }
        Some(current)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = usize::try_from(self.remaining).unwrap_or(0);
        (n, Some(n))
    }
}

/// Reduces `shape`/`strides` (elements; `None` = compact row-major) to a [`Plan`].
///
/// # Errors
/// [`Error::InvalidTensor`] for a negative extent, [`Error::LengthMismatch`] for strides of
/// the wrong length, [`Error::Overflow`] when an extent, a merged extent or the reach of the
/// strides does not fit `i64`.
pub fn plan(shape: &[i64], strides: Option<&[i64]>) -> Result<Plan> {
    let len_elems = num_elements(shape)?;
    let compact;
    let strides = match strides {
        Some(s) => {
            check_strides_len(shape, s)?;
            s
        }
        None => {
            compact = compact_strides(shape)?;
            &compact
        }
    };
    let empty = Plan {
        axes: Vec::new(),
        len_elems,
        lowest_elem: 0,
        highest_elem: 0,
    };
    if len_elems <= 1 {
        return Ok(empty);
    }
    let mut axes: Vec<Axis> = Vec::with_capacity(shape.len());
    // Walk from the innermost axis out, merging an axis into the one inside it when the
    // outer stride equals the inner stride times the inner extent.
    for (&extent, &stride_elems) in shape.iter().zip(strides).rev() {
        if extent == 1 {
            continue;
        }
        if let Some(inner) = axes.last_mut() {
            if inner.stride_elems.checked_mul(inner.extent) == Some(stride_elems) {
                inner.extent = inner
                    .extent
                    .checked_mul(extent)
                    .ok_or_else(|| overflow("merged extent", inner.extent, "*", extent))?;
                continue;
            }
        }
        axes.push(Axis {
            extent,
            stride_elems,
        });
    }
    axes.reverse();
    let (mut lowest, mut highest) = (0i64, 0i64);
    for a in &axes {
        let reach = a
            .stride_elems
            .checked_mul(a.extent - 1)
            .ok_or_else(|| overflow("stride reach", a.stride_elems, "*", a.extent - 1))?;
        let side = if reach < 0 { &mut lowest } else { &mut highest };
        *side = side
            .checked_add(reach)
            .ok_or_else(|| overflow("stride reach", *side, "+", reach))?;
    }
    Ok(Plan {
        axes,
        len_elems,
        lowest_elem: lowest,
        highest_elem: highest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts() {
        assert_eq!(num_elements(&[]), Ok(1));
        assert_eq!(num_elements(&[2, 3, 4]), Ok(24));
        assert_eq!(num_elements(&[0, i64::MAX, i64::MAX]), Ok(0));
        assert!(matches!(
            num_elements(&[i64::MAX, 2]),
            Err(Error::Overflow { .. })
        ));
        assert!(matches!(
            num_elements(&[2, -1]),
            Err(Error::InvalidTensor { .. })
        ));
    }

    #[test]
    fn compact() {
        assert_eq!(compact_strides(&[2, 3, 4]).unwrap(), vec![12, 4, 1]);
        assert_eq!(compact_strides(&[]).unwrap(), Vec::<i64>::new());
        assert_eq!(compact_strides(&[3, 0, 2]).unwrap(), vec![2, 2, 1]);
    }

    #[test]
    fn contiguity() {
        assert_eq!(check_c_contiguous(&[2, 3], Some(&[3, 1])), Ok(()));
        assert_eq!(
            check_c_contiguous(&[2, 3], Some(&[1, 2])),
            Err(Error::NonContiguous {
                axis: 1,
                stride_elems: 2,
                expected_elems: 1
            })
        );
        assert_eq!(check_c_contiguous(&[3, 1], Some(&[1, 7])), Ok(()));
        assert_eq!(check_c_contiguous(&[3, 0], Some(&[5, 7])), Ok(()));
        assert_eq!(check_c_contiguous(&[3], None), Ok(()));
    }

    #[test]
    fn overlap() {
        assert_eq!(check_no_overlap(&[2, 3], Some(&[3, 1])), Ok(()));
        assert_eq!(check_no_overlap(&[2, 3], Some(&[1, 2])), Ok(()));
        assert_eq!(check_no_overlap(&[3], Some(&[-2])), Ok(()));
        assert!(matches!(
            check_no_overlap(&[6], Some(&[0])),
            Err(Error::Overlap {
                axis: 0,
                extent: 6,
                stride_elems: 0
            })
        ));
        assert!(matches!(
            check_no_overlap(&[2, 2], Some(&[1, 1])),
            Err(Error::Overlap { .. })
        ));
        assert_eq!(check_no_overlap(&[1, 4], Some(&[0, 1])), Ok(()));
    }

    #[test]
    fn ranges_and_blocks() {
        assert!(check_range(|| "r".into(), 2, 3, 5).is_ok());
        assert!(check_range(|| "r".into(), 3, 3, 5).is_err());
        assert!(check_range(|| "r".into(), -1, 1, 5).is_err());
        assert!(check_range(|| "r".into(), i64::MAX, 1, 5).is_err());
        assert!(check_blocks(&[1, 2], &[0, 1], 2, 3, true).is_ok());
        assert!(matches!(
            check_blocks(&[2, 2], &[0, 1], 2, 3, true),
            Err(Error::BlocksOverlap { .. })
        ));
        assert!(check_blocks(&[2, 2], &[0, 1], 2, 3, false).is_ok());
        assert!(matches!(
            check_blocks(&[1], &[0, 1], 2, 3, false),
            Err(Error::LengthMismatch { .. })
        ));
        assert!(matches!(
            check_blocks(&[1, 3], &[0, 1], 2, 3, false),
            Err(Error::OutOfBounds { .. })
        ));
    }

    fn offsets(shape: &[i64], strides: &[i64]) -> Vec<i64> {
        plan(shape, Some(strides)).unwrap().offsets().collect()
    }

    #[test]
    fn plans_merge_and_order() {
        let p = plan(&[2, 3, 4], Some(&[12, 4, 1])).unwrap();
        assert_eq!(
            p.axes,
            vec![Axis {
                extent: 24,
                stride_elems: 1
            }]
        );
        assert!(p.is_contiguous());
        let f = plan(&[2, 3], Some(&[1, 2])).unwrap();
        assert_eq!(f.axes.len(), 2);
        assert!(!f.is_contiguous());
        assert_eq!(offsets(&[2, 3], &[1, 2]), vec![0, 2, 4, 1, 3, 5]);
        assert_eq!(offsets(&[3], &[-1]), vec![0, -1, -2]);
        assert_eq!(offsets(&[3], &[0]), vec![0, 0, 0]);
        assert_eq!(offsets(&[2, 1, 2], &[7, 99, 3]), vec![0, 3, 7, 10]);
        let n = plan(&[3, 2], Some(&[-2, 1])).unwrap();
        assert_eq!((n.lowest_elem, n.highest_elem), (-4, 1));
        assert_eq!(plan(&[0, 5], Some(&[9, 9])).unwrap().offsets().count(), 0);
        assert_eq!(
            plan(&[], None).unwrap().offsets().collect::<Vec<_>>(),
            vec![0]
        );
        assert!(plan(&[i64::MAX], Some(&[2])).is_err());
    }

    #[test]
    fn spans() {
        assert_eq!(byte_span(10, 4), Ok(40));
        assert!(byte_span(i64::MAX, 8).is_err());
        assert!(byte_span(-1, 8).is_err());
    }
}
