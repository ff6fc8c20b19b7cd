//! Property tests of the host pack kernels (`super`): pack then unpack is the identity,
//! and pack equals a reference pack, on random layouts and element sizes.

// Test layouts are small (extents ≤ 9, strides within ±20, sizes ≤ 4096²): the casts of
// indices and strides between the integer types cannot wrap.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss
)]

use super::*;
use proptest::prelude::*;

/// A test tensor: `buf` holds every element, the first element at byte `base`.
struct Tensor {
    buf: Vec<u8>,
    base: usize,
    axes: Vec<Axis>,
    elem: usize,
}

/// Bytes of guard kept before and after the elements.
const GUARD: usize = 64;

impl Tensor {
    /// A tensor over `axes` with every byte of its span (and guards) set by `fill`.
    fn new(axes: &[Axis], elem: usize, fill: impl Fn(usize) -> u8) -> Tensor {
        Tensor::at(axes, elem, fill, 0)
    }

    /// As [`Tensor::new`], with every element `shift` bytes further into `buf` (at any byte
    /// address, whatever the element size: DLPack's `byte_offset` and `data` may be).
    fn at(axes: &[Axis], elem: usize, fill: impl Fn(usize) -> u8, shift: usize) -> Tensor {
        let (mut lo, mut hi) = (0i64, 0i64);
        for a in axes {
            let reach = a.stride_elems * (a.extent - 1);
            if reach < 0 {
                lo += reach
            } else {
                hi += reach
            }
        }
        let len = (hi - lo + 1) as usize * elem + 2 * GUARD + shift;
        Tensor {
            buf: (0..len).map(fill).collect(),
            base: GUARD + shift + (-lo) as usize * elem,
            axes: axes.to_vec(),
            elem,
        }
    }

    /// Byte positions in `buf` of every element, in logical row-major order.
    fn element_starts(&self) -> Vec<usize> {
        let mut index = vec![0i64; self.axes.len()];
        let count: i64 = self.axes.iter().map(|a| a.extent).product();
        let mut out = Vec::new();
        for _ in 0..count {
            let off: i64 = index
                .iter()
                .zip(&self.axes)
                .map(|(i, a)| i * a.stride_elems)
                .sum();
            out.push((self.base as i64 + off * self.elem as i64) as usize);
            for k in (0..index.len()).rev() {
                index[k] += 1;
                if index[k] < self.axes[k].extent {
                    break;
                }
                index[k] = 0;
            }
        }
        out
    }

    /// The reference pack: one element at a time over the multi-index.
    fn reference_pack(&self) -> Vec<u8> {
        let e = self.elem;
        self.element_starts()
            .iter()
            .flat_map(|&p| self.buf[p..p + e].to_vec())
            .collect()
    }

    fn pack(&self) -> Option<Vec<u8>> {
        let n: i64 = self.axes.iter().map(|a| a.extent).product();
        let mut out = vec![0u8; n as usize * self.elem];
        // SAFETY: `buf` covers every element (built from the axes' reach).
        let ok = unsafe {
            pack(
                self.buf.as_ptr().add(self.base),
                &self.axes,
                self.elem,
                &mut out,
            )
        };
        ok.then_some(out)
    }

    fn unpack(&mut self, data: &[u8]) -> bool {
        // SAFETY: as in `pack`, for writes.
        unsafe {
            unpack(
                data,
                self.buf.as_mut_ptr().add(self.base),
                &self.axes,
                self.elem,
            )
        }
    }
}

const ELEMS: [usize; 9] = [1, 2, 3, 4, 6, 8, 12, 16, 32];

fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(131) % 251) as u8
}

/// Any axes: extents 1–9, strides −20..=20 elements (zero included).
/// The largest extent of a generated axis, plus one: under Miri, which interprets every
/// byte copied, layouts stay small (at most 3^4 elements a view; natively up to 9^4).
const EXTENT_END: i64 = if cfg!(miri) { 4 } else { 10 };

fn any_axes() -> impl Strategy<Value = Vec<Axis>> {
    prop::collection::vec((1i64..EXTENT_END, -20i64..=20), 1..=4).prop_map(|v| {
        v.into_iter()
            .map(|(extent, stride_elems)| Axis {
                extent,
                stride_elems,
            })
            .collect()
    })
}

/// Disjoint axes: a step view of a compact array laid out in a permuted axis order, with
/// signs flipped per axis.
fn disjoint_axes() -> impl Strategy<Value = Vec<Axis>> {
    prop::collection::vec(
        (1i64..EXTENT_END, 1i64..4, any::<bool>(), any::<u32>()),
        1..=4,
    )
    .prop_map(|v| {
        let mut order: Vec<usize> = (0..v.len()).collect();
        order.sort_by_key(|&i| v[i].3);
        let mut strides = vec![0i64; v.len()];
        let mut compact = 1i64;
        for &i in order.iter().rev() {
            let (extent, step, _, _) = v[i];
            strides[i] = compact * step;
            compact *= extent * step;
        }
        v.iter()
            .zip(strides)
            .map(|(&(extent, _, neg, _), s)| Axis {
                extent,
                stride_elems: if neg { -s } else { s },
            })
            .collect()
    })
}

proptest! {
    // Miri (scripts/miri.sh) interprets every step: a few layouts there check the
    // kernels' pointer arithmetic and provenance; 2000 natively check the values.
    // Under Miri, no failure file either (it would need `getcwd`, which isolation forbids),
    // and small layouts ([`EXTENT_END`]): random layouts of up to half a million elements
    // made one run of scripts/miri.sh take 446 s instead of 115 s.
    #![proptest_config(if cfg!(miri) {
        ProptestConfig { cases: 6, failure_persistence: None, ..ProptestConfig::default() }
    } else {
        ProptestConfig::with_cases(2000)
    })]

    #[test]
    fn pack_equals_reference(axes in any_axes(), e in 0..ELEMS.len()) {
        let t = Tensor::new(&axes, ELEMS[e], pattern);
        prop_assert_eq!(t.pack(), Some(t.reference_pack()));
    }

    #[test]
    fn disjoint_pack_equals_reference(axes in disjoint_axes(), e in 0..ELEMS.len()) {
        let t = Tensor::new(&axes, ELEMS[e], pattern);
        prop_assert_eq!(t.pack(), Some(t.reference_pack()));
    }

    #[test]
    fn unpack_then_pack_is_identity(axes in disjoint_axes(), e in 0..ELEMS.len()) {
        let x = Tensor::new(&axes, ELEMS[e], pattern);
        let packed = x.pack().unwrap();
        let mut y = Tensor::new(&axes, ELEMS[e], |_| 0);
        prop_assert!(y.unpack(&packed));
        prop_assert_eq!(y.pack(), Some(packed));
    }

    #[test]
    fn unpack_writes_only_elements(axes in disjoint_axes(), e in 0..ELEMS.len()) {
        let elem = ELEMS[e];
        let mut y = Tensor::new(&axes, elem, |_| 0xAA);
        let mut expected = y.buf.clone();
        let starts = y.element_starts();
        let data: Vec<u8> = (0..starts.len() * elem).map(pattern).collect();
        for (k, &p) in starts.iter().enumerate() {
            expected[p..p + elem].copy_from_slice(&data[k * elem..(k + 1) * elem]);
        }
        prop_assert!(y.unpack(&data));
        prop_assert_eq!(y.buf, expected);
    }

    /// Elements at every byte address (`shift` 1-7 past an 8-aligned one, for element sizes
    /// of 2 to 32 bytes): the kernels move bytes (unaligned loads and stores), so under Miri
    /// a typed access at a misaligned address would be undefined behaviour reported here.
    #[test]
    fn pack_and_unpack_at_any_address(
        axes in disjoint_axes(), e in 0..ELEMS.len(), shift in 0usize..8,
    ) {
        let elem = ELEMS[e];
        let x = Tensor::at(&axes, elem, pattern, shift);
        let reference = x.reference_pack();
        let packed = x.pack();
        prop_assert_eq!(&packed, &Some(reference.clone()));
        let mut y = Tensor::at(&axes, elem, |_| 0xAA, shift);
        let mut expected = y.buf.clone();
        for (k, &p) in y.element_starts().iter().enumerate() {
            expected[p..p + elem].copy_from_slice(&reference[k * elem..(k + 1) * elem]);
        }
        prop_assert!(y.unpack(&packed.unwrap_or_default()));
        prop_assert_eq!(y.buf, expected);
    }

    #[test]
    fn wrong_length_is_refused(axes in any_axes(), e in 0..ELEMS.len(), extra in 1usize..40, shorter: bool) {
        let elem = ELEMS[e];
        let mut t = Tensor::new(&axes, elem, pattern);
        let n: i64 = axes.iter().map(|a| a.extent).product();
        let right = n as usize * elem;
        let len = if shorter { right.saturating_sub(extra) } else { right + extra };
        prop_assume!(len != right);
        let mut out = vec![7u8; len];
        let before = t.buf.clone();
        // SAFETY: `buf` covers every element.
        let ok = unsafe { pack(t.buf.as_ptr().add(t.base), &axes, elem, &mut out) };
        prop_assert!(!ok);
        prop_assert!(out.iter().all(|&b| b == 7));
        prop_assert!(!t.unpack(&out));
        prop_assert_eq!(t.buf, before);
    }
}

/// Row-major `[rows, cols]` f32 read as its transpose `[cols, rows]`, strides `[1, cols]`.
fn transpose_case(rows: i64, cols: i64) {
    let axes = [
        Axis {
            extent: cols,
            stride_elems: 1,
        },
        Axis {
            extent: rows,
            stride_elems: cols,
        },
    ];
    let src: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
    let mut out = vec![0u8; src.len() * 4];
    // SAFETY: `src` holds every element of the view.
    assert!(unsafe { pack(src.as_ptr().cast(), &axes, 4, &mut out) });
    let got: Vec<f32> = out
        .chunks_exact(4)
        .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
        .collect();
    for j in 0..cols {
        for i in 0..rows {
            assert_eq!(
                got[(j * rows + i) as usize],
                (i * cols + j) as f32,
                "at [{j}, {i}]"
            );
        }
    }
    let mut back = vec![0f32; src.len()];
    // SAFETY: `back` has the same extent as `src`.
    assert!(unsafe { unpack(&out, back.as_mut_ptr().cast(), &axes, 4) });
    assert_eq!(back, src);
}

#[test]
fn transpose_with_tile_edges() {
    if cfg!(miri) {
        // Crosses one 128-row tile edge and a partial 4 x 4 block, in seconds under Miri.
        transpose_case(133, 6);
        return;
    }
    transpose_case(300, 500);
    transpose_case(7, 1000);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "64 MiB under Miri takes hours; transpose_with_tile_edges covers the tiles"
)]
fn transpose_4096_f32() {
    transpose_case(4096, 4096);
}

#[test]
fn step_two_view() {
    // Smaller under Miri, which interprets every element copy.
    let n: u32 = if cfg!(miri) { 1_001 } else { 100_001 };
    let src: Vec<u32> = (0..n).collect();
    let axes = [Axis {
        extent: i64::from(n / 2 + 1),
        stride_elems: 2,
    }];
    let mut out = vec![0u8; (n as usize / 2 + 1) * 4];
    // SAFETY: the view's last element is `src[n - 1]`.
    assert!(unsafe { pack(src.as_ptr().cast(), &axes, 4, &mut out) });
    let got: Vec<u32> = out
        .chunks_exact(4)
        .map(|c| u32::from_ne_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(got, (0..n).step_by(2).collect::<Vec<u32>>());
}

/// The 16-byte paths for 4-byte elements (step 2, reversed) on every line length around
/// their group of four, each from a buffer that ends at the last element's last byte (Miri
/// flags a read past it), in one row and in rows with the step-2 lines side by side.
#[test]
fn step_two_and_reversed_lines_of_every_length() {
    for n in 0..=13i64 {
        for (stride, rows) in [(2i64, 1i64), (-1, 1), (2, 3), (-1, 3)] {
            let row_pitch = if stride == 2 { 2 * n } else { n };
            let span = if n == 0 {
                0
            } else {
                (rows - 1) * row_pitch + (n - 1) * stride.abs() + 1
            };
            let src: Vec<u32> = (0..span as u32).collect();
            let first = if stride < 0 { (n - 1).max(0) } else { 0 };
            let axes = [
                Axis {
                    extent: rows,
                    stride_elems: row_pitch,
                },
                Axis {
                    extent: n,
                    stride_elems: stride,
                },
            ];
            let expect: Vec<u32> = (0..rows)
                .flat_map(|r| (0..n).map(move |j| (r * row_pitch + first + j * stride) as u32))
                .collect();
            let mut out = vec![0u8; expect.len() * 4];
            // SAFETY: every element lies in `src` (its last byte is the buffer's last).
            let ok = unsafe {
                pack(
                    src.as_ptr().cast::<u8>().wrapping_add(4 * first as usize),
                    &axes,
                    4,
                    &mut out,
                )
            };
            assert!(ok, "n {n}, stride {stride}, rows {rows}");
            let got: Vec<u32> = out
                .chunks_exact(4)
                .map(|c| u32::from_ne_bytes(c.try_into().unwrap()))
                .collect();
            assert_eq!(got, expect, "n {n}, stride {stride}, rows {rows}");
        }
    }
}

#[test]
fn empty_and_scalar() {
    let x = [1u8, 2, 3, 4];
    let mut none: [u8; 0] = [];
    // SAFETY: nothing is read for an empty tensor; one 4-byte element otherwise.
    unsafe {
        assert!(pack(x.as_ptr(), &[], 4, &mut none));
        assert!(pack(
            x.as_ptr(),
            &[Axis {
                extent: 0,
                stride_elems: 5
            }],
            4,
            &mut none
        ));
        let mut one = [0u8; 4];
        assert!(pack(x.as_ptr(), &[], 4, &mut one));
        assert_eq!(one, x);
        assert!(!pack(
            x.as_ptr(),
            &[Axis {
                extent: -1,
                stride_elems: 1
            }],
            4,
            &mut none
        ));
        assert!(!pack(
            x.as_ptr(),
            &[Axis {
                extent: 2,
                stride_elems: i64::MAX
            }],
            4,
            &mut [0; 8]
        ));
    }
}

#[test]
fn tiles_pair_the_smallest_stride() {
    // [2, 3, 4] with strides making axis 0 the unit one: axis 0 joins the innermost.
    let dims = vec![
        Dim {
            n: 2,
            src: 4,
            dst: 48,
        },
        Dim {
            n: 3,
            src: 8,
            dst: 16,
        },
        Dim {
            n: 4,
            src: 256,
            dst: 4,
        },
    ];
    let (dims, tiled) = pair_for_tiles(dims);
    assert!(tiled);
    assert_eq!(
        dims[1],
        Dim {
            n: 2,
            src: 4,
            dst: 48
        }
    );
}
