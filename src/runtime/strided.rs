//! Packed copies of strided device tensors: only the tensor's elements are copied, in logical
//! row-major order, between device memory and a contiguous buffer (host or device), as a
//! batch of pitched 2-D copies ([`Copy2d`], CUDA's `cuMemcpy2DAsync`).
//!
//! **The plan** ([`StridedCopy::plan`]) starts from a `layout::Plan`'s merged axes (the same
//! merging the host pack kernels start from, `spec/kernels.rs`):
//!
//! 1. *Row width.* When the innermost axis has stride 1, its elements are one run of
//!    `extent × element` bytes: the row width, and the axis is used up. Otherwise the row is
//!    one element.
//! 2. *Rows axis.* Of the remaining axes, the one with the most elements whose pitch on the
//!    tensor side (`stride × element` bytes) is at least the row width and at most
//!    [`MAX_PITCH_BYTES`] gives the rows of each 2-D copy (the packed side's pitch is its
//!    compact row-major stride, always at least the width). A zero or negative stride cannot
//!    be a pitch (`CUDA_MEMCPY2D`'s pitches are unsigned and rows may not overlap); when no axis
//!    qualifies, each 2-D copy is one row (**per-row copies**).
//! 3. *Outer axes.* Every other axis is walked on the host, by an odometer over byte offsets
//!    (zero and negative strides are fine there): one 2-D copy per index.
//!
//! A plan needing more than [`MAX_STRIDED_COPIES`] 2-D copies is refused (`None`): the
//! transport then copies the tensor's **whole byte span** as before (a reversed 1-D tensor of
//! more than 4096 elements, for example: one row per element). The copies of one plan are
//! submitted together and synchronized once.
//!
//! Narrow rows (one 4-byte element per row, as in a step-2 view or a transpose) are copied
//! correctly but are not fast on a GPU's copy engines; a gather kernel would be (issue 13,
//! item 4 allows one; not written yet).

use std::ffi::c_void;

use super::DeviceRuntime;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::layout::Axis;

/// Most 2-D copies one packed copy may take; beyond, the whole span is copied instead.
pub const MAX_STRIDED_COPIES: usize = 4096;

/// Largest pitch (bytes) used for a 2-D copy: CUDA's `CU_DEVICE_ATTRIBUTE_MAX_PITCH` is
/// 2^31 − 1 on every device to date.
pub const MAX_PITCH_BYTES: usize = i32::MAX as usize;

/// Which memories a [`Copy2d`] goes between (the device is the one named with the call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyKind {
    /// Device memory to host memory.
    DeviceToHost,
    /// Host memory to device memory.
    HostToDevice,
    /// Device memory to device memory (the direct route's scratch buffers).
    DeviceToDevice,
}

/// One pitched 2-D copy (`CUDA_MEMCPY2D`): `height` rows of `width_bytes` bytes; row `r`
/// is read at `src + r × src_pitch` and written at `dst + r × dst_pitch` (bytes). Both
/// pitches are at least `width_bytes` (rows do not overlap), at most [`MAX_PITCH_BYTES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Copy2d {
    /// First byte written.
    pub dst: *mut c_void,
    /// Bytes between the starts of consecutive destination rows.
    pub dst_pitch: usize,
    /// First byte read.
    pub src: *const c_void,
    /// Bytes between the starts of consecutive source rows.
    pub src_pitch: usize,
    /// Bytes per row.
    pub width_bytes: usize,
    /// Number of rows.
    pub height: usize,
}

impl Copy2d {
    /// Bytes this copy moves (`width_bytes × height`).
    pub fn bytes(&self) -> usize {
        self.width_bytes.saturating_mul(self.height)
    }

    /// Where each row is read and written, `(src, dst)`, in order (addresses computed with
    /// `wrapping_add`: nothing is read).
    fn rows(&self) -> impl Iterator<Item = (*const u8, *mut u8)> + '_ {
        (0..self.height).map(|r| {
            (
                self.src.cast::<u8>().wrapping_add(r * self.src_pitch),
                self.dst.cast::<u8>().wrapping_add(r * self.dst_pitch),
            )
        })
    }

    /// Copies every row with `memcpy`, for memory the host addresses (the simulated
    /// runtime's "device" memory is host memory).
    ///
    /// # Safety
    /// Each source row is readable host memory, each destination row writable; sources and
    /// destinations do not overlap, and nobody else writes them meanwhile.
    pub(super) unsafe fn copy_on_host(&self) {
        for (src, dst) in self.rows() {
            // SAFETY: one row of a copy the caller vouches for.
            unsafe { std::ptr::copy_nonoverlapping(src, dst, self.width_bytes) };
        }
    }
}

/// An axis walked on the host: `extent` indices, `tensor` and `packed` bytes apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Outer {
    extent: usize,
    tensor: isize,
    packed: isize,
}

/// How the elements of one strided tensor are copied packed: `copies()` 2-D copies of
/// `height` rows of `width_bytes` bytes (module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StridedCopy {
    width_bytes: usize,
    height: usize,
    tensor_pitch: usize,
    packed_pitch: usize,
    outer: Vec<Outer>,
    copies: usize,
    packed_bytes: usize,
}

/// Which side of a packed copy is the strided tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Read the tensor's elements into the packed buffer (a gather: before a send).
    Pack,
    /// Write the packed buffer into the tensor's elements (a scatter: after a receive).
    Unpack,
}

impl StridedCopy {
    /// The plan for a tensor whose merged axes are `axes` (outermost first, extents and
    /// strides in elements, as `layout::plan` gives them) and whose elements are
    /// `elem_bytes` bytes. `None` when the plan would need more than [`MAX_STRIDED_COPIES`]
    /// copies, when there is nothing to copy (no axes), or when a byte count or stride does
    /// not fit the address space.
    pub fn plan(axes: &[Axis], elem_bytes: usize) -> Option<StridedCopy> {
        if axes.is_empty() || (axes.len() == 1 && axes[0].stride_elems == 1) {
            // Nothing, one element, or one run: a contiguous tensor needs no plan.
            return None;
        }
        let e = isize::try_from(elem_bytes).ok().filter(|&e| e > 0)?;
        // (extent, tensor stride, packed stride), bytes.
        let mut dims = Vec::with_capacity(axes.len());
        let mut packed = e;
        for a in axes.iter().rev() {
            let extent = usize::try_from(a.extent).ok().filter(|&n| n > 0)?;
            let stride = isize::try_from(a.stride_elems).ok()?.checked_mul(e)?;
            dims.push((extent, stride, packed));
            packed = packed.checked_mul(isize::try_from(extent).ok()?)?;
        }
        dims.reverse();
        let packed_bytes = usize::try_from(packed).ok()?;
        let mut width = elem_bytes;
        if let Some(&(n, _, _)) = dims.last().filter(|d| d.1 == e) {
            width = n.checked_mul(elem_bytes)?;
            dims.pop();
        }
        // A row wider than any pitch CUDA takes cannot be one 2-D copy: the whole span is
        // staged instead (the caller's fallback), as for any layout without a plan.
        if width > MAX_PITCH_BYTES {
            return None;
        }
        let fits = |p: isize| usize::try_from(p).is_ok_and(|p| p >= width && p <= MAX_PITCH_BYTES);
        let rows = dims
            .iter()
            .enumerate()
            .filter(|(_, d)| fits(d.1) && fits(d.2))
            .max_by_key(|(i, d)| (d.0, *i))
            .map(|(i, _)| i);
        let (height, tensor_pitch, packed_pitch) = match rows {
            Some(i) => {
                let (n, t, p) = dims.remove(i);
                (n, t.unsigned_abs(), p.unsigned_abs())
            }
            None => (1, width, width),
        };
        let outer: Vec<Outer> = dims
            .into_iter()
            .map(|(extent, tensor, packed)| Outer {
                extent,
                tensor,
                packed,
            })
            .collect();
        let copies = outer
            .iter()
            .try_fold(1usize, |acc, o| acc.checked_mul(o.extent))?;
        (copies <= MAX_STRIDED_COPIES).then_some(StridedCopy {
            width_bytes: width,
            height,
            tensor_pitch,
            packed_pitch,
            outer,
            copies,
            packed_bytes,
        })
    }

    /// Number of 2-D copies.
    pub fn copies(&self) -> usize {
        self.copies
    }

    /// Bytes copied: the tensor's elements, packed (elements × element bytes).
    pub fn packed_bytes(&self) -> usize {
        self.packed_bytes
    }

    /// Bytes per row of each 2-D copy.
    pub fn width_bytes(&self) -> usize {
        self.width_bytes
    }

    /// Rows of each 2-D copy.
    pub fn height(&self) -> usize {
        self.height
    }

    /// The 2-D copies between the tensor whose first element is at `first` and the packed
    /// buffer at `packed`, in `direction`. Addresses are computed with wrapping arithmetic;
    /// [`StridedCopy::run`] states what makes them valid.
    pub fn copies_at(
        &self,
        first: *const c_void,
        packed: *const c_void,
        direction: Direction,
    ) -> Vec<Copy2d> {
        let mut out = Vec::with_capacity(self.copies);
        let mut index = vec![0usize; self.outer.len()];
        let (mut t_off, mut p_off) = (0isize, 0isize);
        for _ in 0..self.copies {
            let t = first.cast::<u8>().wrapping_offset(t_off).cast::<c_void>();
            let p = packed.cast::<u8>().wrapping_offset(p_off).cast::<c_void>();
            let (src, src_pitch, dst, dst_pitch) = match direction {
                Direction::Pack => (t, self.tensor_pitch, p, self.packed_pitch),
                Direction::Unpack => (p, self.packed_pitch, t, self.tensor_pitch),
            };
            out.push(Copy2d {
                dst: dst.cast_mut(),
                dst_pitch,
                src,
                src_pitch,
                width_bytes: self.width_bytes,
                height: self.height,
            });
            // The odometer, innermost outer axis first.
            for (i, o) in self.outer.iter().enumerate().rev() {
                if index[i] + 1 < o.extent {
                    index[i] += 1;
                    t_off = t_off.wrapping_add(o.tensor);
                    p_off = p_off.wrapping_add(o.packed);
                    break;
                }
                // `index[i] < extent ≤ isize::MAX`: the rewind fits (plan checked strides).
                #[allow(clippy::cast_possible_wrap)]
                let back = index[i] as isize;
                t_off = t_off.wrapping_sub(o.tensor.wrapping_mul(back));
                p_off = p_off.wrapping_sub(o.packed.wrapping_mul(back));
                index[i] = 0;
            }
        }
        out
    }

    /// Copies the elements of the strided tensor on `device` whose first element is at
    /// `first` to or from the packed buffer `packed` (`packed_bytes()` bytes), with one
    /// [`DeviceRuntime::copy_2d`] call of `kind` (`DeviceToHost` or `DeviceToDevice` to
    /// pack, `HostToDevice` or `DeviceToDevice` to unpack). Complete on return.
    ///
    /// # Safety
    /// The plan was made from the tensor's own merged axes and element size; every element
    /// (`first` + its byte offset) is memory of `device`, readable for `Pack` and writable
    /// for `Unpack`; `packed` holds `packed_bytes()` bytes of the other memory; the two do not
    /// overlap, and nobody else writes either meanwhile.
    ///
    /// # Errors
    /// [`Error::Cuda`] from the runtime.
    pub unsafe fn run(
        &self,
        runtime: &dyn DeviceRuntime,
        device: Device,
        kind: CopyKind,
        first: *const c_void,
        packed: *const c_void,
        direction: Direction,
    ) -> Result<()> {
        let copies = self.copies_at(first, packed, direction);
        // SAFETY: each copy reads and writes rows of the tensor's elements and of the packed
        // buffer (the plan's arithmetic), valid by the caller's contract.
        unsafe { runtime.copy_2d(device, kind, &copies) }
    }
}

/// What [`DeviceRuntime::copy_2d`] does for a runtime that has no 2-D copy of its own: one
/// 1-D copy per row, through `copy_to_host`/`copy_to_device`.
///
/// # Safety
/// As [`DeviceRuntime::copy_2d`].
///
/// # Errors
/// [`Error::UnsupportedDevice`] for `DeviceToDevice` (no 1-D device copy to build it from);
/// the runtime's errors otherwise.
pub(super) unsafe fn copy_2d_by_rows(
    runtime: &(impl DeviceRuntime + ?Sized),
    device: Device,
    kind: CopyKind,
    copies: &[Copy2d],
) -> Result<()> {
    for c in copies {
        for (src, dst) in c.rows() {
            // SAFETY: one row of a copy the caller vouches for.
            unsafe {
                match kind {
                    CopyKind::DeviceToHost => {
                        runtime.copy_to_host(device, dst, src.cast(), c.width_bytes)?;
                    }
                    CopyKind::HostToDevice => {
                        runtime.copy_to_device(device, dst.cast(), src, c.width_bytes)?;
                    }
                    CopyKind::DeviceToDevice => {
                        return Err(Error::UnsupportedDevice {
                            device_type: device.device_type,
                            device_id: device.device_id,
                            reason: "this GPU runtime has no device-to-device copy",
                        })
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
// Test data: small indices and extents.
#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]
mod tests {
    use super::*;
    use crate::layout::plan;

    fn strided(shape: &[i64], strides: &[i64], e: usize) -> Option<StridedCopy> {
        StridedCopy::plan(&plan(shape, Some(strides)).unwrap().axes, e)
    }

    /// Runs a plan on host memory and returns the packed elements (f32 values).
    fn pack(shape: &[i64], strides: &[i64], src: &[f32], first: usize) -> Vec<f32> {
        let p = strided(shape, strides, 4).expect("a plan");
        let mut out = vec![0f32; p.packed_bytes() / 4];
        let base = src[first..].as_ptr().cast::<c_void>();
        for c in p.copies_at(base, out.as_mut_ptr().cast(), Direction::Pack) {
            // SAFETY: inside `src` and `out` by the plan's arithmetic.
            unsafe { c.copy_on_host() };
        }
        out
    }

    fn reference(shape: &[i64], strides: &[i64], src: &[f32], first: usize) -> Vec<f32> {
        plan(shape, Some(strides))
            .unwrap()
            .offsets()
            .map(|o| src[(first as i64 + o) as usize])
            .collect()
    }

    #[test]
    fn plans_use_the_widest_rows_and_fewest_copies() {
        // Step 2: one copy of 8 rows of one element, pitch 8 bytes.
        let s = strided(&[8], &[2], 4).unwrap();
        assert_eq!((s.copies(), s.height(), s.width_bytes()), (1, 8, 4));
        assert_eq!(s.packed_bytes(), 32);
        // Rows of a 2-D slice: 3 rows of 4 elements in one copy.
        let r = strided(&[3, 4], &[10, 1], 4).unwrap();
        assert_eq!((r.copies(), r.height(), r.width_bytes()), (1, 3, 16));
        // Transposed 5 × 3: one-element rows down the longer axis, 3 copies.
        let t = strided(&[3, 5], &[1, 3], 4).unwrap();
        assert_eq!((t.copies(), t.height(), t.width_bytes()), (3, 5, 4));
        // Contiguous: no plan.
        assert!(strided(&[3, 4], &[4, 1], 4).is_none());
        // Reversed: per-element copies while few, none beyond the limit.
        let rev = strided(&[6], &[-1], 4).unwrap();
        assert_eq!((rev.copies(), rev.height()), (6, 1));
        assert!(strided(&[MAX_STRIDED_COPIES as i64 + 1], &[-1], 4).is_none());
        // Rows of 2 GiB (f32 [2, 2^29] strides [2^30, 1]): wider than any CUDA pitch, so
        // no 2-D plan (the whole span is staged).
        assert!(strided(&[2, 1 << 29], &[1 << 30, 1], 4).is_none());
    }

    #[test]
    fn packed_copies_equal_the_reference_gather() {
        let src: Vec<f32> = (0..400).map(|i| i as f32).collect();
        for (shape, strides, first) in [
            (vec![8i64], vec![2i64], 0usize),
            (vec![4, 5], vec![1, 4], 0),
            (vec![3, 4, 5], vec![1, 3, 12], 0),
            (vec![3, 4, 5], vec![20, 1, 4], 0),
            (vec![2, 3, 4], vec![24, 8, 2], 0),
            (vec![6], vec![-1], 5),
            (vec![3, 4], vec![-4, 1], 8),
            (vec![3, 4], vec![0, 1], 0),
            (vec![4, 3], vec![1, -4], 8),
            (vec![2, 3, 2], vec![-30, 10, -1], 100),
        ] {
            assert_eq!(
                pack(&shape, &strides, &src, first),
                reference(&shape, &strides, &src, first),
                "shape {shape:?} strides {strides:?}"
            );
        }
    }
}
