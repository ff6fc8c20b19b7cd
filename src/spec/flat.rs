//! Packing a strided tensor into a contiguous scratch buffer in logical row-major order, and
//! unpacking it back: the `Packing::Copy` path.
//!
//! Used where a derived datatype cannot serve: MPI's predefined reductions are defined on
//! predefined datatypes only (Open MPI refuses them on derived types: "MPI_SUM is not defined
//! for non-intrinsic datatypes"), and user code may prefer a packed copy on stacks where
//! derived datatypes are slow. The element order is the one [`crate::layout::Plan::offsets`]
//! gives, so a packed buffer holds exactly what a derived datatype would send.

use crate::dlpack::Tensor;
use crate::error::Result;
use crate::layout::{self, Plan};

/// Contiguous runs of a plan: `(first element offset, run length)` in elements, in logical
/// order. The innermost axis is one run when its stride is 1 element.
fn runs(plan: &Plan) -> impl Iterator<Item = (i64, i64)> + '_ {
    let inner_run = match plan.axes.last() {
        Some(a) if a.stride_elems == 1 => a.extent,
        _ => 1,
    };
    let runs_total = if plan.len_elems == 0 {
        0
    } else {
        plan.len_elems / inner_run
    };
    let outer = Plan {
        axes: if inner_run > 1 {
            plan.axes[..plan.axes.len() - 1].to_vec()
        } else {
            plan.axes.clone()
        },
        len_elems: runs_total,
        lowest_elem: plan.lowest_elem,
        highest_elem: plan.highest_elem,
    };
    let offsets: Vec<i64> = outer.offsets().collect();
    offsets.into_iter().map(move |o| (o, inner_run))
}

/// Copies the elements of `tensor` into a new buffer, in logical order. The caller has
/// validated the tensor with a send spec (host memory, address range) and passes its
/// element size in bytes.
///
/// # Errors
/// Layout errors of [`layout::plan`] (none for a tensor a spec was built from).
pub(crate) fn pack(tensor: &dyn Tensor, elem: usize) -> Result<Vec<u8>> {
    let plan = layout::plan(tensor.shape(), tensor.strides_elems())?;
    let mut out = vec![0u8; plan.len_elems as usize * elem];
    let base = tensor.first_element_ptr().cast::<u8>().cast_const();
    let mut at = 0usize;
    for (offset, len) in runs(&plan) {
        let bytes = len as usize * elem;
        // SAFETY: the spec checked that every element lies in the address range the
        // producer vouches for (`byte_range`), and `out` has room for all elements.
        unsafe {
            std::ptr::copy_nonoverlapping(
                base.wrapping_offset((offset * elem as i64) as isize),
                out.as_mut_ptr().add(at),
                bytes,
            );
        }
        at += bytes;
    }
    Ok(out)
}

/// Copies `data` (logical order) into the elements of `tensor`. The caller has validated
/// the tensor with a receive spec (writable, elements disjoint) and passes its element size.
///
/// # Errors
/// Layout errors of [`layout::plan`] (none for a tensor a spec was built from).
pub(crate) fn unpack(tensor: &mut dyn Tensor, elem: usize, data: &[u8]) -> Result<()> {
    let plan = layout::plan(tensor.shape(), tensor.strides_elems())?;
    let base = tensor.first_element_ptr().cast::<u8>();
    let mut at = 0usize;
    for (offset, len) in runs(&plan) {
        let bytes = len as usize * elem;
        if at + bytes > data.len() {
            break;
        }
        // SAFETY: as in `pack`; the receive spec proved the tensor writable and its
        // elements disjoint, and `&mut` makes this the only access.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr().add(at),
                base.wrapping_offset((offset * elem as i64) as isize),
                bytes,
            );
        }
        at += bytes;
    }
    Ok(())
}
