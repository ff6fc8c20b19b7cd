//! Hostile inputs for the public pack kernels (`spec::kernels::{pack, unpack}`): every
//! element size 1..=80 (the `Var` copier included), extents across tile edges, strides that
//! trigger tiling on either side, negative and zero strides; reference = one element at a time.

use dlpack_mpi::layout::Axis;
use dlpack_mpi::spec::kernels::{pack, unpack};
use proptest::prelude::*;

const GUARD: usize = 80;

struct T {
    buf: Vec<u8>,
    base: usize,
    axes: Vec<Axis>,
    elem: usize,
}

impl T {
    fn new(axes: &[Axis], elem: usize) -> T {
        let (mut lo, mut hi) = (0i64, 0i64);
        for a in axes {
            let reach = a.stride_elems * (a.extent - 1);
            if reach < 0 {
                lo += reach
            } else {
                hi += reach
            }
        }
        let len = (hi - lo + 1) as usize * elem + 2 * GUARD;
        T {
            buf: (0..len)
                .map(|i| (i.wrapping_mul(131) % 251) as u8)
                .collect(),
            base: GUARD + (-lo) as usize * elem,
            axes: axes.to_vec(),
            elem,
        }
    }
    fn starts(&self) -> Vec<usize> {
        let count: i64 = self.axes.iter().map(|a| a.extent).product();
        let mut index = vec![0i64; self.axes.len()];
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
}

fn axes_strategy() -> impl Strategy<Value = Vec<Axis>> {
    prop::collection::vec(
        (
            prop_oneof![1i64..6, 14i64..40, 127i64..135],
            prop_oneof![-3i64..=3, -70i64..=70, Just(0)],
        ),
        1..=4,
    )
    .prop_filter("not too many elements", |v| {
        v.iter().map(|a| a.0).product::<i64>() <= 40_000
    })
    .prop_map(|v| {
        v.into_iter()
            .map(|(extent, stride_elems)| Axis {
                extent,
                stride_elems,
            })
            .collect()
    })
}

/// A disjoint (permuted, stepped, sign-flipped) view, extents up to 140.
fn disjoint_strategy() -> impl Strategy<Value = Vec<Axis>> {
    prop::collection::vec(
        (
            prop_oneof![1i64..5, 15i64..20, 126i64..140],
            1i64..3,
            any::<bool>(),
            any::<u32>(),
        ),
        1..=3,
    )
    .prop_filter("size", |v| v.iter().map(|a| a.0).product::<i64>() <= 40_000)
    .prop_map(|v| {
        let mut order: Vec<usize> = (0..v.len()).collect();
        order.sort_by_key(|&i| v[i].3);
        let mut strides = vec![0i64; v.len()];
        let mut compact = 1i64;
        for &i in order.iter().rev() {
            strides[i] = compact * v[i].1;
            compact *= v[i].0 * v[i].1;
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
    #![proptest_config(ProptestConfig { cases: 600, failure_persistence: None, .. ProptestConfig::default() })]

    #[test]
    fn pack_any_elem_size(axes in axes_strategy(), elem in 1usize..=80) {
        let t = T::new(&axes, elem);
        let reference: Vec<u8> = t.starts().iter().flat_map(|&p| t.buf[p..p + elem].to_vec()).collect();
        let mut out = vec![0xEEu8; reference.len()];
        // SAFETY: `T::new` sized `buf` so every element of the layout, counted from `base`,
        // lies inside it (guard bytes around).
        let ok = unsafe { pack(t.buf.as_ptr().add(t.base), &axes, elem, &mut out) };
        prop_assert!(ok);
        prop_assert_eq!(out, reference);
    }

    #[test]
    fn unpack_any_elem_size(axes in disjoint_strategy(), elem in 1usize..=80) {
        let mut t = T::new(&axes, elem);
        let before = t.buf.clone();
        let starts = t.starts();
        let data: Vec<u8> = (0..starts.len() * elem).map(|i| (i * 7 + 3) as u8).collect();
        let base = t.base;
        // SAFETY: as in `pack_any_elem_size`; the layout's elements are disjoint and `data`
        // is a separate buffer.
        let ok = unsafe { unpack(&data, t.buf.as_mut_ptr().add(base), &axes, elem) };
        prop_assert!(ok);
        let mut expect = before;
        for (k, &p) in starts.iter().enumerate() {
            expect[p..p + elem].copy_from_slice(&data[k * elem..(k + 1) * elem]);
        }
        prop_assert_eq!(t.buf, expect);
    }
}

#[test]
fn stride_overflow_and_extremes_are_refused_not_ub() {
    let x = [0u8; 64];
    let mut out = [0u8; 16];
    for (axes, elem) in [
        (
            vec![Axis {
                extent: 2,
                stride_elems: i64::MIN,
            }],
            8usize,
        ),
        (
            vec![Axis {
                extent: 2,
                stride_elems: i64::MAX / 4,
            }],
            8,
        ),
        (
            vec![Axis {
                extent: 2,
                stride_elems: -(i64::MAX / 8) - 2,
            }],
            8,
        ),
    ] {
        // SAFETY: must be refused before any access.
        // SAFETY: the kernels refuse this layout (or copy nothing) before touching memory.
        let ok = unsafe { pack(x.as_ptr(), &axes, elem, &mut out) };
        assert!(!ok, "{axes:?} accepted");
    }
    // packed length overflow (extents product × elem wraps usize) must be refused
    let axes = vec![
        Axis {
            extent: i64::MAX,
            stride_elems: 0,
        },
        Axis {
            extent: 4,
            stride_elems: 0,
        },
    ];
    // SAFETY: the kernels refuse this layout (or copy nothing) before touching memory.
    let ok = unsafe { pack(x.as_ptr(), &axes, 8, &mut out) };
    assert!(!ok);
    // elem_bytes 0 with elements and empty out: nothing to copy
    let axes = vec![Axis {
        extent: 3,
        stride_elems: 1,
    }];
    // SAFETY: the kernels refuse this layout (or copy nothing) before touching memory.
    let ok = unsafe { pack(x.as_ptr(), &axes, 0, &mut []) };
    assert!(ok);
    // huge elem size with a wrapped packed size
    let axes = vec![Axis {
        extent: 2,
        stride_elems: 1,
    }];
    // SAFETY: the kernels refuse this layout (or copy nothing) before touching memory.
    let ok = unsafe { pack(x.as_ptr(), &axes, usize::MAX / 2 + 1, &mut []) };
    assert!(!ok);
}
