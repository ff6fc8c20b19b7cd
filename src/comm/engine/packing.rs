//! The packing policy: whether [`crate::comm`] hands MPI a strided tensor as one
//! derived datatype (zero-copy) or as a packed copy made by the host pack kernels
//! (`spec/kernels.rs`). Process-wide, set by [`set_packing`] or the
//! `DLPACK_MPI_PACKING` environment variable (both in [`crate::settings`], with every other
//! setting); only `comm` consults it.
//!
//! **The rule of [`Packing::Auto`]** (the default): a strided tensor is packed when its
//! contiguous inner block ([`inner_block_bytes`]: the bytes of the innermost run after axes
//! are merged, i.e. the innermost axis's extent × element size when that axis has stride 1,
//! else one element) is below [`pack_threshold_bytes`], and goes as a derived datatype when
//! the block is at least that long. Derived datatypes copy block by block inside MPI, which
//! is slow for short blocks; long blocks are copied at memory speed by either path, and the
//! derived path saves the pack buffer and one pass over memory.
//!
//! **The threshold** ([`pack_threshold_bytes`]; settable by [`set_pack_threshold_bytes`] or
//! `DLPACK_MPI_PACK_THRESHOLD_BYTES`) has a default per MPI library, read at run time from
//! `MPI_Get_library_version` (MPI-4.1 §9.1.1) by [`default_pack_threshold_for`]:
//! [`MPICH_PACK_THRESHOLD_BYTES`] (64 bytes) when the version string names MPICH, else
//! [`DEFAULT_PACK_THRESHOLD_BYTES`] (16 bytes). Measured on a quiet machine (load average
//! below 2) with `dlpack-mpi bench --op strided` (2 ranks, one host, shared memory;
//! `[N / block, block]` f32 views with a gap of one block, blocks of 1 … 4096 elements,
//! 32 MiB packed; tables and commands in `docs/PERFORMANCE.md`, "Four paths per case"):
//!
//! - **Open MPI 4.1.4**: packing won only for one-element blocks (4 bytes: 22 ms against
//!   31 ms); from 2 elements (8 bytes) the derived datatype was faster (1.2× at 8 bytes,
//!   1.6–2.9× from 16 bytes), and from 64 elements it even beat the contiguous send (the two
//!   ranks copy in parallel). The switch is set at 16 bytes rather than 8, so that every
//!   single element of up to 8 bytes (an f64 transpose) is packed: a transpose as a derived
//!   datatype was 4.3× slower than packing (no cache blocking), and 8-byte blocks cost
//!   packing 19 % there.
//! - **MPICH 4.0.2**: packing won up to 8 elements (32 bytes; 0.92× of derived at 32 bytes,
//!   0.12–0.57× below), the derived datatype from 16 elements (64 bytes; 1.1× faster, 1.3–2.2×
//!   from 128 bytes). The switch is at 64 bytes.
//!
//! Under heavy load (other processes on the same cores) the derived path loses much more
//! (its two-process pipeline starves); the loaded runs are in `docs/PERFORMANCE.md` too.

use crate::error::Result;
use crate::layout;
// The settings (`DLPACK_MPI_PACKING`, `DLPACK_MPI_PACK_THRESHOLD_BYTES`, their setters and
// defaults) and `Packing` are in `crate::settings`.
use crate::settings::{pack_threshold_bytes, packing, Packing};

/// The contiguous inner block of a layout (`strides_elems`: `None` for C order, as in
/// DLPack), in bytes: after merging axes
/// ([`layout::plan`]), the innermost axis's extent × `elem_bytes` when its stride is one
/// element, else `elem_bytes` (one element).
///
/// # Errors
/// Layout errors of [`layout::plan`].
pub fn inner_block_bytes(
    shape: &[i64],
    strides_elems: Option<&[i64]>,
    elem_bytes: usize,
) -> Result<usize> {
    let plan = layout::plan(shape, strides_elems)?;
    let run = match plan.axes.last() {
        Some(a) if a.stride_elems == 1 => usize::try_from(a.extent).unwrap_or(usize::MAX),
        _ => 1,
    };
    Ok(run.saturating_mul(elem_bytes))
}

/// Whether the policy packs a strided operand whose contiguous inner block is
/// `block_bytes` (see [`inner_block_bytes`]): the question [`crate::spec`]'s encoding asks.
///
/// # Errors
/// As [`packing`] and [`pack_threshold_bytes`].
pub(crate) fn packs_block(block_bytes: usize) -> Result<bool> {
    let policy = packing()?;
    let threshold = match policy {
        Packing::Auto => pack_threshold_bytes()?,
        _ => 0,
    };
    Ok(policy.packs(block_bytes, threshold))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::{DEFAULT_PACK_THRESHOLD_BYTES, MPICH_PACK_THRESHOLD_BYTES};

    /// Auto's decision on representative layouts, with the default threshold (16 bytes).
    #[test]
    fn auto_decides_by_inner_block() {
        let t = DEFAULT_PACK_THRESHOLD_BYTES;
        let block = |shape: &[i64], strides: &[i64], elem| {
            inner_block_bytes(shape, Some(strides), elem).unwrap()
        };
        // step 2 of f32: one element per block → pack
        assert_eq!(block(&[1024], &[2], 4), 4);
        assert!(Packing::Auto.packs(block(&[1024], &[2], 4), t));
        // transpose of 4096 × 4096 f32 (inner stride 4096) → pack
        assert!(Packing::Auto.packs(block(&[4096, 4096], &[1, 4096], 4), t));
        // Fortran order of 64 × 64 f64 → pack
        assert!(Packing::Auto.packs(block(&[64, 64], &[1, 64], 8), t));
        // rows of 4 f32 with a gap of one row: 16-byte blocks → derived
        assert_eq!(block(&[16, 4], &[8, 1], 4), 16);
        assert!(!Packing::Auto.packs(block(&[16, 4], &[8, 1], 4), t));
        // rows of 3 f32: just below → pack
        assert!(Packing::Auto.packs(block(&[16, 3], &[6, 1], 4), t));
        // under MPICH's default, 32-byte blocks are packed too, 64-byte ones are not
        assert!(Packing::Auto.packs(block(&[16, 8], &[16, 1], 4), MPICH_PACK_THRESHOLD_BYTES));
        assert!(!Packing::Auto.packs(block(&[16, 16], &[32, 1], 4), MPICH_PACK_THRESHOLD_BYTES));
        // merged axes: [4, 8, 512] with the two inner axes contiguous = 4096-element runs
        assert_eq!(block(&[4, 8, 512], &[8192, 512, 1], 4), 16384);
        // the other policies ignore the block
        assert!(Packing::Copy.packs(1 << 30, t));
        assert!(!Packing::DerivedDatatype.packs(4, t));
    }
}
