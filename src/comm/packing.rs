//! The packing policy: whether [`super::TensorComm`] hands MPI a strided tensor as one
//! derived datatype (zero-copy) or as a packed copy made by the host pack kernels
//! (`spec/kernels.rs`). Process-wide, set by [`set_packing`] or the
//! `DLPACK_MPI_PACKING` environment variable; only `comm` consults it.
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

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use crate::dlpack::Tensor;
use crate::error::{Error, Result};
use crate::layout;

/// How strided (non-contiguous) tensors reach MPI in [`super::TensorComm`]'s operations.
///
/// Every policy puts the same bytes on the wire (the elements in logical row-major order),
/// so the ranks of a job may choose differently. Reductions and the per-rank blocks of
/// gathers, scatters and all-to-alls always use packed copies (MPI's predefined reductions
/// take predefined datatypes only; blocks must split into equal units). The nonblocking
/// `immediate_*_tensor` operations follow the policy too (the request owns the packed
/// copy); `immediate_send_spec`/`immediate_recv_spec` take a spec the caller built and use
/// it as given (a derived datatype for a strided tensor), without consulting the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Packing {
    /// Per tensor: pack short inner blocks, derived datatype for long ones (the default; see
    /// the module docs for the rule and [`pack_threshold_bytes`] for the threshold).
    #[default]
    Auto,
    /// Zero-copy: one derived datatype describes the elements in place.
    DerivedDatatype,
    /// Always pack into a contiguous scratch buffer before sending and unpack after a
    /// receive completes.
    Copy,
}

impl Packing {
    /// Whether this policy packs a strided tensor whose contiguous inner block is
    /// `inner_block_bytes` long, with the pack threshold `threshold_bytes`.
    pub fn packs(self, inner_block_bytes: usize, threshold_bytes: usize) -> bool {
        match self {
            Packing::Auto => inner_block_bytes < threshold_bytes,
            Packing::DerivedDatatype => false,
            Packing::Copy => true,
        }
    }
}

static PACKING: AtomicU8 = AtomicU8::new(u8::MAX);

/// The environment variable that sets the packing policy when [`set_packing`] was not called.
pub const PACKING_ENV: &str = "DLPACK_MPI_PACKING";

/// The environment variable that sets [`pack_threshold_bytes`] when
/// [`set_pack_threshold_bytes`] was not called (a byte count).
pub const PACK_THRESHOLD_ENV: &str = "DLPACK_MPI_PACK_THRESHOLD_BYTES";

/// The default threshold of [`Packing::Auto`] under every MPI library but MPICH (Open MPI
/// among them): inner blocks shorter than 16 bytes are packed (measured under Open MPI 4.1;
/// see the module docs).
pub const DEFAULT_PACK_THRESHOLD_BYTES: usize = 16;

/// The default threshold of [`Packing::Auto`] under MPICH (and libraries whose version
/// string names it): inner blocks shorter than 64 bytes are packed (measured under MPICH
/// 4.0.2, where packing beat the derived datatype up to 32-byte blocks; see the module
/// docs).
pub const MPICH_PACK_THRESHOLD_BYTES: usize = 64;

/// The default threshold for the MPI library whose `MPI_Get_library_version` string is
/// `library`: [`MPICH_PACK_THRESHOLD_BYTES`] when it contains `MPICH` (any case), else
/// [`DEFAULT_PACK_THRESHOLD_BYTES`].
pub fn default_pack_threshold_for(library: &str) -> usize {
    if library.to_ascii_uppercase().contains("MPICH") {
        MPICH_PACK_THRESHOLD_BYTES
    } else {
        DEFAULT_PACK_THRESHOLD_BYTES
    }
}

/// The default threshold for the MPI library in use ([`default_pack_threshold_for`] of
/// `MPI_Get_library_version`, which MPI allows before `MPI_Init`);
/// [`DEFAULT_PACK_THRESHOLD_BYTES`] when the version cannot be read.
fn default_pack_threshold_bytes() -> usize {
    mpi::environment::library_version()
        .map(|v| default_pack_threshold_for(&v))
        .unwrap_or(DEFAULT_PACK_THRESHOLD_BYTES)
}

/// `usize::MAX`: not set yet.
static THRESHOLD_BYTES: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Reads a `DLPACK_MPI_PACKING` value: `auto` → [`Packing::Auto`], `copy` →
/// [`Packing::Copy`], `derived` → [`Packing::DerivedDatatype`] (any case), unset or empty →
/// `None`.
///
/// # Errors
/// [`Error::InvalidSetting`] naming any other value (a typo is not read as the default, as
/// `DLPACK_MPI_CUDA_AWARE` is not).
pub fn parse_packing(value: Option<&str>) -> Result<Option<Packing>> {
    match value.map(str::trim).filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(v) if v.eq_ignore_ascii_case("auto") => Ok(Some(Packing::Auto)),
        Some(v) if v.eq_ignore_ascii_case("copy") => Ok(Some(Packing::Copy)),
        Some(v) if v.eq_ignore_ascii_case("derived") => Ok(Some(Packing::DerivedDatatype)),
        Some(v) => Err(Error::InvalidSetting {
            name: PACKING_ENV,
            value: v.to_string(),
            expected: "auto, copy or derived",
        }),
    }
}

/// The process-wide packing policy: [`set_packing`], else `DLPACK_MPI_PACKING=auto|copy|
/// derived` in the environment, else [`Packing::Auto`].
///
/// # Errors
/// [`Error::InvalidSetting`] when `DLPACK_MPI_PACKING` holds another value (also a value
/// that is not UTF-8); the operations that consult the policy (those with a strided side)
/// return it before any MPI call.
pub fn packing() -> Result<Packing> {
    match PACKING.load(Ordering::Relaxed) {
        0 => Ok(Packing::DerivedDatatype),
        1 => Ok(Packing::Copy),
        2 => Ok(Packing::Auto),
        _ => {
            let value = std::env::var_os(PACKING_ENV).map(|v| v.to_string_lossy().into_owned());
            let from_env = parse_packing(value.as_deref())?.unwrap_or_default();
            set_packing(from_env);
            Ok(from_env)
        }
    }
}

/// Sets the process-wide packing policy (see [`packing`]). Every rank of a job may choose
/// independently: all policies put the same bytes on the wire.
pub fn set_packing(policy: Packing) {
    let v = match policy {
        Packing::DerivedDatatype => 0,
        Packing::Copy => 1,
        Packing::Auto => 2,
    };
    PACKING.store(v, Ordering::Relaxed);
}

/// Reads a `DLPACK_MPI_PACK_THRESHOLD_BYTES` value: a byte count; unset or empty → `None`.
///
/// # Errors
/// [`Error::InvalidSetting`] naming any other value.
pub fn parse_pack_threshold(value: Option<&str>) -> Result<Option<usize>> {
    crate::spec::scratch::parse_byte_count(PACK_THRESHOLD_ENV, value)
}

/// The threshold of [`Packing::Auto`], in bytes of contiguous inner block: blocks shorter
/// than this are packed. [`set_pack_threshold_bytes`], else
/// `DLPACK_MPI_PACK_THRESHOLD_BYTES`, else the MPI library's default
/// ([`MPICH_PACK_THRESHOLD_BYTES`] under MPICH, [`DEFAULT_PACK_THRESHOLD_BYTES`] otherwise).
///
/// # Errors
/// [`Error::InvalidSetting`] when `DLPACK_MPI_PACK_THRESHOLD_BYTES` is not a byte count.
pub fn pack_threshold_bytes() -> Result<usize> {
    match THRESHOLD_BYTES.load(Ordering::Relaxed) {
        usize::MAX => {
            let value =
                std::env::var_os(PACK_THRESHOLD_ENV).map(|v| v.to_string_lossy().into_owned());
            let t = match parse_pack_threshold(value.as_deref())? {
                Some(t) => t,
                None => default_pack_threshold_bytes(),
            };
            set_pack_threshold_bytes(t);
            Ok(t)
        }
        t => Ok(t),
    }
}

/// Sets the threshold of [`Packing::Auto`] (see [`pack_threshold_bytes`]); `usize::MAX` is
/// read as `usize::MAX - 1` (every strided tensor is packed).
pub fn set_pack_threshold_bytes(bytes: usize) {
    THRESHOLD_BYTES.store(bytes.min(usize::MAX - 1), Ordering::Relaxed);
}

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

/// The contiguous inner run of `tensor` in elements, for [`packs_run`]: read before a
/// receive spec borrows the tensor. 0 when the tensor is C-contiguous or the policy does
/// not look at runs (then nothing is computed), 1 for a layout [`layout::plan`] refuses
/// (its spec fails anyway).
pub(crate) fn inner_run_elems(tensor: &dyn Tensor) -> usize {
    let (shape, strides) = (tensor.shape(), tensor.strides_elems());
    if layout::check_c_contiguous(shape, strides).is_ok() || !matches!(packing(), Ok(Packing::Auto))
    {
        return 0;
    }
    inner_block_bytes(shape, strides, 1).unwrap_or(1)
}

/// Whether the policy packs one side of an operation: `contiguous` (its spec is one run;
/// never packed), `run_elems` ([`inner_run_elems`] of its tensor), `elem_bytes` (its element
/// size).
///
/// # Errors
/// As [`packing`] and [`pack_threshold_bytes`].
pub(crate) fn packs_run(contiguous: bool, run_elems: usize, elem_bytes: usize) -> Result<bool> {
    if contiguous {
        return Ok(false);
    }
    let policy = packing()?;
    let threshold = match policy {
        Packing::Auto => pack_threshold_bytes()?,
        _ => 0,
    };
    Ok(policy.packs(run_elems.saturating_mul(elem_bytes), threshold))
}

/// [`packs_run`] for a tensor that no spec borrows mutably.
///
/// # Errors
/// As [`packs_run`].
pub(crate) fn packs(tensor: &dyn Tensor, contiguous: bool, elem_bytes: usize) -> Result<bool> {
    if contiguous {
        return Ok(false);
    }
    packs_run(contiguous, inner_run_elems(tensor), elem_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_values() {
        assert_eq!(parse_packing(None).unwrap(), None);
        assert_eq!(parse_packing(Some(" ")).unwrap(), None);
        assert_eq!(parse_packing(Some("copy")).unwrap(), Some(Packing::Copy));
        assert_eq!(
            parse_packing(Some("Derived")).unwrap(),
            Some(Packing::DerivedDatatype)
        );
        assert_eq!(parse_packing(Some("AUTO")).unwrap(), Some(Packing::Auto));
        assert_eq!(Packing::default(), Packing::Auto);
        match parse_packing(Some("cpoy")) {
            Err(Error::InvalidSetting { name, value, .. }) => {
                assert_eq!((name, value.as_str()), (PACKING_ENV, "cpoy"));
            }
            other => panic!("expected InvalidSetting, got {other:?}"),
        }
    }

    #[test]
    fn threshold_values() {
        assert_eq!(parse_pack_threshold(None).unwrap(), None);
        assert_eq!(parse_pack_threshold(Some("8192")).unwrap(), Some(8192));
        assert!(matches!(
            parse_pack_threshold(Some("-1")),
            Err(Error::InvalidSetting { name, .. }) if name == PACK_THRESHOLD_ENV
        ));
    }

    #[test]
    fn default_threshold_per_library() {
        let mpich = "MPICH Version:\t4.0.2\nMPICH Release date: Thu Apr  7 12:34:45 CDT 2022";
        assert_eq!(default_pack_threshold_for(mpich), 64);
        let ompi = "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4";
        assert_eq!(default_pack_threshold_for(ompi), 16);
        assert_eq!(default_pack_threshold_for(""), DEFAULT_PACK_THRESHOLD_BYTES);
    }

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
